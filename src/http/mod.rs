//! The Streamable HTTP transport: one MCP session per client, behind a bearer token. The token
//! is checked before anything else (so an unauthenticated caller learns nothing, not even where
//! the endpoint is), then the path, then `Origin`; the Host check (DNS-rebinding protection) is
//! rmcp's. The accept loop (`listener`) bounds connections and header time; the idle rule for
//! sessions (`sessions`) is this server's, not rmcp's.

mod listener;
mod sessions;

use crate::backend::Backend;
use crate::config::Config;
use crate::server::SmolMcp;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sessions::Sessions;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const SESSION_HEADER: &str = "mcp-session-id";

struct Guard {
    token: Arc<str>,
    path: Arc<str>,
    origins: Vec<Origin>,
    sessions: Arc<Sessions>,
    manager: Arc<LocalSessionManager>,
}

fn json_rpc_error(status: StatusCode, code: i32, message: &str) -> Response {
    let body = serde_json::json!({"jsonrpc": "2.0", "error": {"code": code, "message": message}, "id": null});
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

/// Equal-length comparison that does not stop at the first difference.
fn same_secret(presented: &[u8], expected: &[u8]) -> bool {
    let mut diff = presented.len() ^ expected.len();
    for (i, e) in expected.iter().enumerate() {
        diff |= usize::from(presented.get(i).copied().unwrap_or(0) ^ e);
    }
    diff == 0
}

fn presented_token(headers: &HeaderMap) -> &str {
    if let Some(t) = headers
        .get("x-smol-mcp-token")
        .and_then(|v| v.to_str().ok())
        .filter(|t| !t.is_empty())
    {
        return t;
    }
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.get(..7)
                .filter(|p| p.eq_ignore_ascii_case("bearer "))
                .and_then(|_| v.get(7..))
                .map(str::trim)
        })
        .unwrap_or_default()
}

/// An origin as RFC 6454 compares them: scheme, host and port, the port filled in from the
/// scheme when omitted, case folded.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    scheme: String,
    host: String,
    port: Option<u16>,
}

impl Origin {
    fn parse(text: &str) -> Option<Origin> {
        let text = text.trim().trim_end_matches('/').to_ascii_lowercase();
        let (scheme, rest) = text.split_once("://")?;
        if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
            return None;
        }
        let (host, port) = match rest.rfind(':') {
            // `[::1]` alone has colons but no port.
            Some(i) if !rest[i..].contains(']') => {
                (&rest[..i], Some(rest[i + 1..].parse::<u16>().ok()?))
            }
            _ => (rest, None),
        };
        let port = port.or(match scheme {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        });
        Some(Origin {
            scheme: scheme.to_owned(),
            host: host.to_owned(),
            port,
        })
    }
}

/// The origins a request may carry: the configured list (an empty one allows none), else the
/// listener's own loopback origins when it is on loopback, else none. A request without
/// `Origin` (every non-browser client) is not affected.
fn allowed_origins(config: &Config) -> Vec<Origin> {
    let listed: Vec<String> = match &config.http_allowed_origins {
        Some(list) => list.clone(),
        None if is_loopback(&config.http_host) => ["127.0.0.1", "localhost", "[::1]"]
            .iter()
            .map(|h| format!("http://{h}:{}", config.http_port))
            .collect(),
        None => Vec::new(),
    };
    listed
        .iter()
        .filter_map(|o| {
            let parsed = Origin::parse(o);
            if parsed.is_none() {
                tracing::warn!(origin = %o, "ignoring an allowed origin that is not scheme://host[:port]");
            }
            parsed
        })
        .collect()
}

fn is_loopback(host: &str) -> bool {
    matches!(host, "127.0.0.1" | "localhost" | "::1" | "[::1]")
}

/// Keeps the session busy until the response body is sent or dropped: a tool call's answer is
/// an event stream that ends only once the call does.
fn holding(response: Response, in_flight: sessions::InFlight) -> Response {
    let (parts, body) = response.into_parts();
    let stream = body.into_data_stream().map(move |chunk| {
        let _ = &in_flight;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

async fn guard(State(g): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    if !same_secret(
        presented_token(request.headers()).as_bytes(),
        g.token.as_bytes(),
    ) {
        return json_rpc_error(
            StatusCode::UNAUTHORIZED,
            -32001,
            "unauthorized: send the bearer token in authorization or x-smol-mcp-token",
        );
    }
    if request.uri().path() != &*g.path {
        return json_rpc_error(
            StatusCode::NOT_FOUND,
            -32004,
            &format!(
                "no MCP endpoint at {}; it is at {}",
                request.uri().path(),
                g.path
            ),
        );
    }
    // The transport spec: a present Origin that is not allowed MUST get 403, so that a web
    // page the user visits cannot drive the server through the browser.
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let allowed = origin
            .to_str()
            .ok()
            .and_then(Origin::parse)
            .is_some_and(|o| g.origins.contains(&o));
        if !allowed {
            tracing::warn!(?origin, "refused a request from an origin not allowed");
            return json_rpc_error(
                StatusCode::FORBIDDEN,
                -32003,
                "forbidden: this Origin is not allowed (httpAllowedOrigins)",
            );
        }
    }
    let session = header_text(request.headers(), SESSION_HEADER).map(str::to_owned);
    match (request.method().clone(), session) {
        (Method::DELETE, session) => delete(&g, session, request, next).await,
        (Method::POST, None) => {
            let response = next.run(request).await;
            // An initialize answer carries the new session's id: from now on it is tracked.
            if let Some(id) = header_text(response.headers(), SESSION_HEADER) {
                g.sessions.opened(id);
            }
            response
        }
        (Method::POST, Some(id)) => match g.sessions.enter(&id) {
            Some(in_flight) => {
                let mut request = request;
                request.extensions_mut().insert(g.sessions.job_hold(&id));
                holding(next.run(request).await, in_flight)
            }
            None => next.run(request).await,
        },
        (_, session) => {
            if let Some(id) = session {
                g.sessions.touch(&id);
            }
            next.run(request).await
        }
    }
}

/// rmcp answers DELETE 202 whatever the id, even none; clients expect 200 or 204 for a session
/// ended (the Python SDK logs "Session termination failed: 202"), and 404 for one it does not
/// know, as for any other request of an unknown session.
async fn delete(g: &Guard, session: Option<String>, request: Request, next: Next) -> Response {
    let known = match &session {
        Some(id) => g
            .manager
            .has_session(&Arc::from(id.as_str()))
            .await
            .unwrap_or(false),
        None => false,
    };
    let Some(id) = session.filter(|_| known) else {
        return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
    };
    let mut response = next.run(request).await;
    if response.status().is_success() {
        // rmcp closed the session (its handler is dropped, which deletes its machines).
        g.sessions.forget(&id);
        *response.status_mut() = StatusCode::OK;
    }
    response
}

/// The names a client may use in `Host`: the configured list, else the loopback names when the
/// listener is on loopback, else none (and then the token is the only gate).
pub fn allowed_hosts(config: &Config) -> Vec<String> {
    if !config.http_allowed_hosts.is_empty() {
        return config.http_allowed_hosts.clone();
    }
    if is_loopback(&config.http_host) {
        return vec!["127.0.0.1".into(), "localhost".into(), "::1".into()];
    }
    Vec::new()
}

/// The whole HTTP application: the guard around the MCP service, and what the idle reaper
/// needs.
struct App {
    router: axum::Router,
    sessions: Arc<Sessions>,
    manager: Arc<LocalSessionManager>,
}

fn app(config: &Config, backend: Arc<Backend>, shutdown: &CancellationToken) -> App {
    let mut manager = LocalSessionManager::default();
    // rmcp's keep_alive counts only session events, not a tool call still running, so it
    // would close a session under a long call; `sessions::reap` applies the idle rule instead.
    manager.session_config.keep_alive = None;
    let manager = Arc::new(manager);
    let mut mcp_config = StreamableHttpServerConfig::default()
        .with_cancellation_token(shutdown.child_token())
        // Checked in `guard`, with a JSON-RPC body and the listener's port in the default.
        .disable_allowed_origins();
    let hosts = allowed_hosts(config);
    mcp_config = if hosts.is_empty() {
        mcp_config.disable_allowed_hosts()
    } else {
        mcp_config.with_allowed_hosts(hosts)
    };
    let service = StreamableHttpService::new(
        move || {
            let session = format!("http-{}-{:016x}", std::process::id(), rand::random::<u64>());
            Ok(SmolMcp::new(backend.clone(), session).cleaning_up_on_drop())
        },
        manager.clone(),
        mcp_config,
    );
    let sessions = Arc::new(Sessions::default());
    let guard_state = Arc::new(Guard {
        token: Arc::from(config.auth_token.expose()),
        path: Arc::from(config.http_path.as_str()),
        origins: allowed_origins(config),
        sessions: sessions.clone(),
        manager: manager.clone(),
    });
    let router = axum::Router::new()
        .route_service(&config.http_path, service)
        .fallback(|| async { StatusCode::NOT_FOUND })
        .layer(axum::middleware::from_fn_with_state(guard_state, guard));
    App {
        router,
        sessions,
        manager,
    }
}

/// Serves MCP on `listener` until `shutdown` is cancelled; then stops accepting and waits for
/// open connections (the caller bounds the wait, then cleans up the machines). The future owns
/// what it needs of `config`, so that it can be spawned.
pub fn serve(
    listener: TcpListener,
    config: &Config,
    backend: Arc<Backend>,
    shutdown: CancellationToken,
) -> impl Future<Output = ()> + Send + 'static {
    let app = app(config, backend.clone(), &shutdown);
    let idle = Duration::from_secs(config.http_session_idle_secs);
    let limits = listener::Limits {
        max_connections: config.http_max_connections,
        header_timeout: Duration::from_secs(config.http_header_timeout_secs),
    };
    // Before the orphan sweep can find them: a previous server's leased machines that a
    // sessionless client may still use.
    backend.adopt_leased_machines();
    let leases = crate::backend::lease::reap(backend.clone(), shutdown.clone());
    async move {
        tokio::spawn(leases);
        tokio::spawn(sessions::reap(
            app.sessions,
            app.manager,
            idle,
            shutdown.clone(),
        ));
        listener::accept_loop(listener, app.router, limits, shutdown).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abd", b"abc"));
        assert!(!same_secret(b"ab", b"abc"));
        assert!(!same_secret(b"abcd", b"abc"));
        assert!(!same_secret(b"", b"abc"));
    }

    #[test]
    fn origins_compare_as_tuples() {
        let o = |t: &str| Origin::parse(t);
        assert_eq!(o("http://LOCALHOST:80/"), o("http://localhost"));
        assert_eq!(o("https://b.example"), o("https://b.example:443"));
        assert_ne!(o("http://127.0.0.1:8080"), o("http://127.0.0.1:8081"));
        assert_eq!(o("http://[::1]:9").map(|o| o.host), Some("[::1]".into()));
        assert_eq!(o("http://[::1]").map(|o| o.port), Some(Some(80)));
        assert_eq!(o("null"), None);
        assert_eq!(o("http://a.example/path"), None);
        let mut config = crate::config::Config::from_sources(
            &std::collections::BTreeMap::new(),
            std::path::Path::new("/nonexistent"),
        )
        .unwrap();
        config.http_port = 7;
        assert_eq!(allowed_origins(&config).len(), 3);
        assert!(allowed_origins(&config).contains(&Origin::parse("http://localhost:7").unwrap()));
        config.http_allowed_origins = Some(vec![]);
        assert!(
            allowed_origins(&config).is_empty(),
            "an empty list allows none"
        );
        config.http_allowed_origins = None;
        config.http_host = "0.0.0.0".into();
        assert!(allowed_origins(&config).is_empty());
    }

    #[test]
    fn tokens_from_either_header() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "bearer  t1 ".parse().unwrap());
        assert_eq!(presented_token(&h), "t1");
        h.insert("x-smol-mcp-token", "t2".parse().unwrap());
        assert_eq!(
            presented_token(&h),
            "t2",
            "the server token header wins over an account key"
        );
        assert_eq!(presented_token(&HeaderMap::new()), "");
    }
}
