//! The HTTP clients under the generated code. They are built here rather than by the generated
//! `Client::new`, whose 15 s total timeout would cut off any long command; deadlines are set per
//! call by the fleet instead.

use super::error::{ErrorKind, FleetError, FleetResult};
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use std::path::PathBuf;
use std::time::Duration;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the local `smolvm serve` listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalEndpoint {
    /// `unix:///abs/path.sock`: the default, reachable only through the file system.
    Unix(PathBuf),
    /// `http://127.0.0.1:PORT` (or localhost, or [::1]): for a serve that listens on loopback TCP.
    Loopback { authority: String },
}

impl LocalEndpoint {
    /// Parses a local URL. A non-loopback address is refused: the local API has no
    /// authentication, so anything that can reach it can create machines on this host.
    pub fn parse(url: &str) -> FleetResult<Self> {
        let refuse = |why: String| FleetError::new(ErrorKind::Refused, "local endpoint", why);
        let forms = "accepted forms are unix:///abs/path.sock and http://127.0.0.1:PORT";
        let parsed =
            reqwest::Url::parse(url).map_err(|e| refuse(format!("{url}: {e}; {forms}")))?;
        match parsed.scheme() {
            "unix" => {
                // `unix://relative.sock` parses with `relative.sock` as the host.
                if parsed.host().is_some() || !parsed.path().starts_with('/') {
                    return Err(refuse(format!(
                        "{url}: a unix:// URL needs an absolute socket path, like unix:///run/smolvm.sock"
                    )));
                }
                Ok(LocalEndpoint::Unix(PathBuf::from(parsed.path())))
            }
            "http" => {
                // The parser normalises IP literals (127.1 reads as 127.0.0.1), so a string
                // comparison of the normalised host is exact.
                let host = parsed.host_str().unwrap_or_default();
                if !matches!(host, "127.0.0.1" | "localhost" | "[::1]") {
                    return Err(refuse(format!(
                        "refusing the non-loopback address {url}: the local smolvm API has no \
                         authentication, so it must only listen on 127.0.0.1, localhost, [::1] or a Unix socket"
                    )));
                }
                let authority = match parsed.port_or_known_default() {
                    Some(port) => format!("{host}:{port}"),
                    None => host.to_owned(),
                };
                Ok(LocalEndpoint::Loopback { authority })
            }
            _ => Err(refuse(format!("{url}: {forms}"))),
        }
    }

    /// The form `smolvm serve start --listen` takes.
    pub fn listen_arg(&self) -> String {
        match self {
            LocalEndpoint::Unix(path) => format!("unix://{}", path.display()),
            LocalEndpoint::Loopback { authority } => authority.clone(),
        }
    }

    /// The base URL the generated client is given. Over a socket the host only fills `Host`.
    pub fn base_url(&self) -> String {
        match self {
            LocalEndpoint::Unix(_) => "http://smolvm.local".to_owned(),
            LocalEndpoint::Loopback { authority } => format!("http://{authority}"),
        }
    }

    pub fn http_client(&self) -> FleetResult<reqwest::Client> {
        install_tls_provider();
        let builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("smol-mcp/", env!("CARGO_PKG_VERSION")))
            .no_proxy()
            // The local API is plain HTTP; loading the platform's root certificates would only
            // cost start-up time (milliseconds, on every first local call).
            .tls_certs_only(std::iter::empty());
        let builder = match self {
            LocalEndpoint::Unix(path) => builder.unix_socket(path.clone()),
            LocalEndpoint::Loopback { .. } => builder,
        };
        builder
            .build()
            .map_err(|e| FleetError::new(ErrorKind::Transport, "local HTTP client", e.to_string()))
    }
}

/// reqwest is built without a crypto provider of its own (see Cargo.toml: ring instead of
/// aws-lc-rs); every client it builds needs the process's default one installed first.
pub fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err only when a provider is already installed, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The HTTPS client for the cloud, carrying the bearer token on every request. The header is
/// marked sensitive so that it never appears in debug output.
pub fn cloud_http_client(token: &str) -> FleetResult<reqwest::Client> {
    let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
        FleetError::new(
            ErrorKind::Refused,
            "cloud token",
            "SMOL_CLOUD_TOKEN holds characters that cannot go in an HTTP header",
        )
    })?;
    value.set_sensitive(true);
    install_tls_provider();
    let mut headers = HeaderMap::new();
    headers.insert(AUTHORIZATION, value);
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .user_agent(concat!("smol-mcp/", env!("CARGO_PKG_VERSION")))
        .default_headers(headers)
        .build()
        .map_err(|e| FleetError::new(ErrorKind::Transport, "cloud HTTP client", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_sockets_are_accepted() {
        assert_eq!(
            LocalEndpoint::parse("unix:///tmp/a.sock").unwrap(),
            LocalEndpoint::Unix("/tmp/a.sock".into())
        );
        for url in [
            "http://127.0.0.1:8080",
            "http://localhost:1/",
            "http://[::1]:9",
        ] {
            assert!(LocalEndpoint::parse(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn other_addresses_are_refused_with_the_reason() {
        for url in [
            "http://0.0.0.0:8080",
            "http://10.0.0.1:80",
            "http://127.0.0.1.evil.example:80",
            "https://127.0.0.1:80",
            "unix://relative.sock",
        ] {
            let err = LocalEndpoint::parse(url).unwrap_err();
            assert_eq!(err.kind, ErrorKind::Refused, "{url}");
        }
        let err = LocalEndpoint::parse("http://192.168.1.5:10080").unwrap_err();
        assert!(err.to_string().contains("no authentication"), "{err}");
    }
}
