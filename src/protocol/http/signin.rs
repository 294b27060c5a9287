//! OAuth 2.1 sign-in: the HTTP server as a resource server (the MCP authorization spec). It
//! publishes its protected resource metadata (RFC 9728) naming the operator's issuer, answers
//! a request without a usable access token 401 with `WWW-Authenticate` pointing there, and
//! takes a token only when the issuer signed it for this server (RFC 8707 audience), unexpired
//! and with the scopes required. The token is never passed on: the engine and the cloud see
//! this server's own credentials, never a client's.
//!
//! The issuer's keys are found from its metadata (RFC 8414, then OpenID discovery), fetched
//! once at start and kept; a token signed by a key not in the set makes one fetch again (a key
//! rotation), at most every [`REFETCH_AFTER`], so that tokens with made-up key ids cannot make
//! the server hammer the issuer.

use super::jwt::{self, Expected, KeySet, TokenError};
use crate::policy::user::User;
use crate::process::config::Config;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// The shortest time between two fetches of the issuer's keys.
const REFETCH_AFTER: Duration = Duration::from_secs(10);
/// Keys older than this are fetched again before use, so that a key the issuer withdrew
/// stops working within the hour.
const KEYS_KEPT: Duration = Duration::from_secs(3600);
/// The largest metadata or key set document read from the issuer.
const MAX_DOCUMENT_BYTES: usize = 256 * 1024;
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// A sign-in setting that cannot work, named with what would.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: {problem}")]
pub struct SettingError {
    setting: &'static str,
    problem: String,
}

fn setting_error(setting: &'static str, problem: impl Into<String>) -> SettingError {
    SettingError {
        setting,
        problem: problem.into(),
    }
}

/// Why a request is not let in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No token at all: the client is told where to sign in.
    Missing,
    Invalid(TokenError),
    /// Signed in, without these scopes.
    Scope(Vec<String>),
    /// The issuer's keys cannot be had just now; the token may be good.
    Unavailable(String),
}

/// The issuer's keys as every request reads them, and when they were fetched.
#[derive(Default)]
struct Loaded {
    keys: Arc<KeySet>,
    fetched: Option<Instant>,
}

/// What only the fetch itself needs (one fetch at a time): when it last tried, and the
/// `jwks_uri` discovery found.
#[derive(Default)]
struct Fetching {
    last_attempt: Option<Instant>,
    jwks_url: Option<String>,
}

pub(crate) struct SignIn {
    expected: Expected,
    scopes: Vec<String>,
    metadata: serde_json::Value,
    /// Where clients find the metadata: the path under `/.well-known/oauth-protected-resource`
    /// that RFC 9728 derives from the resource, then the bare one older clients ask for.
    pub(crate) metadata_paths: [String; 2],
    metadata_url: String,
    jwks_url: Option<String>,
    client: reqwest::Client,
    loaded: RwLock<Loaded>,
    fetching: tokio::sync::Mutex<Fetching>,
    checked: Mutex<CheckedTokens>,
}

/// How many tokens checked before are remembered. A client sends its token with every call,
/// and the signature check is the costliest part of a signed-in call (ES256: about a twentieth
/// of the server's CPU for a create or delete on the scaling bench).
const TOKENS_KEPT: usize = 1024;

/// Tokens whose signature and claims were checked, by their SHA-256, with the key set that
/// checked them: a token is taken again without its signature checked only while that same
/// set is in use (a rotation checks it anew) and it has not expired.
#[derive(Default)]
struct CheckedTokens {
    by_digest: HashMap<[u8; 32], (Arc<KeySet>, jwt::Verified)>,
}

impl CheckedTokens {
    fn get(&self, digest: &[u8; 32], keys: &Arc<KeySet>, now: i64) -> Option<jwt::Verified> {
        let (checked_by, verified) = self.by_digest.get(digest)?;
        (Arc::ptr_eq(checked_by, keys) && verified.unexpired_at(now)).then(|| verified.clone())
    }

    /// Kept within [`TOKENS_KEPT`]: the expired go first, then, should that not be enough,
    /// all that were kept (each checks its signature once more).
    fn keep(&mut self, digest: [u8; 32], keys: Arc<KeySet>, verified: jwt::Verified, now: i64) {
        if self.by_digest.len() >= TOKENS_KEPT {
            self.by_digest.retain(|_, (_, v)| v.unexpired_at(now));
            if self.by_digest.len() >= TOKENS_KEPT {
                self.by_digest.clear();
            }
        }
        self.by_digest.insert(digest, (keys, verified));
    }
}

fn digest(token: &str) -> [u8; 32] {
    let mut out = [0; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
    out
}

fn is_loopback_host(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether a URL's scheme and host keep what is fetched from it from being changed on the
/// way: https, or http to this machine only.
fn transport_ok(url: &reqwest::Url) -> bool {
    url.scheme() == "https" || (url.scheme() == "http" && is_loopback_host(url))
}

fn secure_url(setting: &'static str, text: &str) -> Result<reqwest::Url, SettingError> {
    let url = reqwest::Url::parse(text).map_err(|e| {
        setting_error(
            setting,
            format!("{text:?} is not a URL ({e}); give https://host/..."),
        )
    })?;
    if !transport_ok(&url) || url.query().is_some() || url.fragment().is_some() {
        return Err(setting_error(
            setting,
            format!("{text:?}: an https URL without query or fragment (http only on loopback)"),
        ));
    }
    Ok(url)
}

/// A key set's URL, the operator's `authJwksUrl` or the `jwks_uri` the issuer's metadata
/// names, held to `authIssuer`'s rule: keys fetched over plain http from another machine
/// could be swapped on the way, and every token checked against them. A query is allowed
/// (Azure AD B2C's carries the policy, `?p=...`); the issuer's own URL has none because
/// RFC 8414 section 2 forbids it in an issuer identifier, not in a document's address.
fn key_set_url(text: &str) -> Result<reqwest::Url, String> {
    let url = reqwest::Url::parse(text).map_err(|e| format!("is not a URL ({e})"))?;
    if !transport_ok(&url) || url.fragment().is_some() {
        return Err("is not an https URL without fragment (http only on loopback)".to_owned());
    }
    Ok(url)
}

impl SignIn {
    /// Sign-in as the settings ask for it, or `None` when `authIssuer` is empty.
    pub(crate) fn from_config(config: &Config) -> Result<Option<SignIn>, SettingError> {
        if config.auth_issuer.is_empty() {
            return Ok(None);
        }
        secure_url("authIssuer", &config.auth_issuer)?;
        let loopback_listener = matches!(
            config.http_host.trim_matches(['[', ']']),
            "127.0.0.1" | "localhost" | "::1"
        );
        if config.auth_resource.is_empty() && !loopback_listener {
            return Err(setting_error(
                "authResource",
                format!(
                    "required when the listener is not on loopback (httpHost {}): give the URL \
                     clients dial, https://host/mcp, which tokens must name as their audience",
                    config.http_host
                ),
            ));
        }
        let resource = if config.auth_resource.is_empty() {
            let host = if config.http_host.contains(':') {
                format!("[{}]", config.http_host.trim_matches(['[', ']']))
            } else {
                config.http_host.clone()
            };
            format!("http://{host}:{}{}", config.http_port, config.http_path)
        } else {
            config.auth_resource.clone()
        };
        let resource_url = reqwest::Url::parse(&resource).map_err(|e| {
            setting_error(
                "authResource",
                format!(
                    "{resource:?} is not a URL ({e}); give the URL clients dial, https://host/mcp"
                ),
            )
        })?;
        if resource_url.fragment().is_some() || !matches!(resource_url.scheme(), "http" | "https") {
            return Err(setting_error(
                "authResource",
                format!("{resource:?}: an http(s) URL without a fragment"),
            ));
        }
        let jwks_url = if config.auth_jwks_url.is_empty() {
            None
        } else {
            let text = &config.auth_jwks_url;
            let url = key_set_url(text)
                .map_err(|problem| setting_error("authJwksUrl", format!("{text:?} {problem}")))?;
            Some(url.to_string())
        };
        let resource_path = resource_url.path().trim_end_matches('/');
        let well_known = "/.well-known/oauth-protected-resource";
        let metadata_paths = [
            format!("{well_known}{resource_path}"),
            well_known.to_owned(),
        ];
        let mut metadata_url = resource_url.clone();
        metadata_url.set_path(&metadata_paths[0]);
        metadata_url.set_query(None);
        let mut metadata = serde_json::json!({
            "resource": resource,
            "authorization_servers": [config.auth_issuer],
            "bearer_methods_supported": ["header"],
            "resource_name": "smol-mcp",
        });
        if !config.auth_scopes.is_empty() {
            metadata["scopes_supported"] = serde_json::json!(config.auth_scopes);
        }
        crate::fleet::transport::install_tls_provider();
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .user_agent(concat!("smol-mcp/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| setting_error("authIssuer", format!("an HTTP client for it: {e}")))?;
        Ok(Some(SignIn {
            expected: Expected {
                issuer: config.auth_issuer.clone(),
                audience: resource,
                user_claim: config.auth_user_claim.clone(),
            },
            scopes: config.auth_scopes.clone(),
            metadata,
            metadata_paths,
            metadata_url: metadata_url.to_string(),
            jwks_url,
            client,
            loaded: RwLock::default(),
            fetching: tokio::sync::Mutex::default(),
            checked: Mutex::default(),
        }))
    }

    pub(crate) fn metadata(&self) -> &serde_json::Value {
        &self.metadata
    }

    /// The first fetch of the issuer's keys, at start-up: a mistake in the settings shows in
    /// the log before the first user tries. Not fatal: the issuer may be down for a moment,
    /// and the next token fetches again.
    pub(crate) async fn warm(&self) {
        match self.refresh(true).await {
            Ok(count) => tracing::info!(
                issuer = %self.expected.issuer,
                keys = count,
                "sign-in: the issuer's keys fetched"
            ),
            // The error quotes what the issuer's documents say: Debug escapes it.
            Err(e) => tracing::error!(
                issuer = %self.expected.issuer,
                error = ?e,
                "sign-in: the issuer's keys could not be fetched; tokens are refused 503 until they can"
            ),
        }
    }

    /// The user an access token signs in, or why not.
    pub(crate) async fn check(&self, token: &str) -> Result<User, Refusal> {
        self.check_at(token, chrono::Utc::now().timestamp()).await
    }

    async fn check_at(&self, token: &str, now: i64) -> Result<User, Refusal> {
        let kid = jwt::key_id(token).map_err(Refusal::Invalid)?;
        let (keys, fetched) = self.current_keys();
        let stale = fetched.is_some_and(|t| t.elapsed() > KEYS_KEPT);
        let keys = if keys.len() == 0 || !keys.has(kid.as_deref()) || stale {
            match self.refresh(false).await {
                Ok(_) => self.current_keys().0,
                Err(e) if keys.len() == 0 => return Err(Refusal::Unavailable(e)),
                Err(_) => keys,
            }
        } else {
            keys
        };
        let digest = digest(token);
        let kept = self.checked_tokens().get(&digest, &keys, now);
        let verified = match kept {
            Some(verified) => verified,
            None => {
                let verified =
                    jwt::verify(token, &keys, &self.expected, now).map_err(Refusal::Invalid)?;
                self.checked_tokens()
                    .keep(digest, keys, verified.clone(), now);
                verified
            }
        };
        let missing: Vec<String> = self
            .scopes
            .iter()
            .filter(|s| !verified.scopes.contains(s))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(Refusal::Scope(missing));
        }
        Ok(User::signed_in(&verified.user))
    }

    fn checked_tokens(&self) -> std::sync::MutexGuard<'_, CheckedTokens> {
        self.checked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn current_keys(&self) -> (Arc<KeySet>, Option<Instant>) {
        let loaded = self.loaded.read().unwrap_or_else(PoisonError::into_inner);
        (loaded.keys.clone(), loaded.fetched)
    }

    /// Fetches the key set again unless another request just did (or, `forced`, regardless).
    async fn refresh(&self, forced: bool) -> Result<usize, String> {
        let mut fetching = self.fetching.lock().await;
        if !forced
            && fetching
                .last_attempt
                .is_some_and(|t| t.elapsed() < REFETCH_AFTER)
        {
            let held = self.current_keys().0.len();
            return if held > 0 {
                Ok(held)
            } else {
                Err("the issuer's keys could not be fetched a moment ago".to_owned())
            };
        }
        fetching.last_attempt = Some(Instant::now());
        let url = match self.jwks_url.clone().or_else(|| fetching.jwks_url.clone()) {
            Some(url) => url,
            None => {
                let url = self.discover_jwks_url().await?;
                fetching.jwks_url = Some(url.clone());
                url
            }
        };
        let document = self.get_bounded(&url).await?;
        let keys = KeySet::parse(&document).map_err(|e| format!("{url}: {e}"))?;
        let count = keys.len();
        *self.loaded.write().unwrap_or_else(PoisonError::into_inner) = Loaded {
            keys: Arc::new(keys),
            fetched: Some(Instant::now()),
        };
        Ok(count)
    }

    /// The issuer's `jwks_uri`, from its RFC 8414 metadata (the well-known path inserted
    /// before the issuer's own path), else its OpenID configuration (appended to it). Metadata
    /// naming another issuer is refused (RFC 8414 section 3.3).
    async fn discover_jwks_url(&self) -> Result<String, String> {
        let issuer = self.expected.issuer.trim_end_matches('/');
        let parsed = reqwest::Url::parse(issuer).map_err(|e| e.to_string())?;
        let path = parsed.path().trim_end_matches('/');
        let mut oauth = parsed.clone();
        oauth.set_path(&format!("/.well-known/oauth-authorization-server{path}"));
        let openid = format!("{issuer}/.well-known/openid-configuration");
        let mut problems = Vec::new();
        for url in [oauth.to_string(), openid] {
            let document = match self.get_bounded(&url).await {
                Ok(d) => d,
                Err(e) => {
                    problems.push(e);
                    continue;
                }
            };
            #[derive(serde::Deserialize)]
            struct Metadata {
                issuer: String,
                jwks_uri: Option<String>,
            }
            match serde_json::from_slice::<Metadata>(&document) {
                Ok(m) if m.issuer.trim_end_matches('/') != issuer => {
                    problems.push(format!("{url} names another issuer"));
                }
                // A jwks_uri that fails the rule is not passed over for the next document:
                // the issuer says where its keys are, and that is an error to show.
                Ok(Metadata {
                    jwks_uri: Some(jwks),
                    ..
                }) => {
                    return key_set_url(&jwks)
                        .map(|u| u.to_string())
                        .map_err(|problem| {
                            format!("the jwks_uri {jwks:?} in {url} {problem}; or set authJwksUrl")
                        });
                }
                Ok(_) => problems.push(format!("{url} has no jwks_uri")),
                Err(e) => problems.push(format!("{url}: not metadata ({e})")),
            }
        }
        Err(format!(
            "no usable issuer metadata ({}); set authJwksUrl",
            problems.join("; ")
        ))
    }

    async fn get_bounded(&self, url: &str) -> Result<Vec<u8>, String> {
        let mut response = self
            .client
            .get(url)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("{url}: HTTP {}", response.status().as_u16()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| format!("{url}: {e}"))? {
            if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
                return Err(format!("{url}: longer than {MAX_DOCUMENT_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// The `WWW-Authenticate` value for a refusal (RFC 6750 section 3, RFC 9728 section 5.1).
    pub(crate) fn challenge(&self, refusal: &Refusal) -> String {
        let quoted = |s: &str| s.replace(['"', '\\'], "'");
        let mut parts = Vec::new();
        match refusal {
            Refusal::Missing | Refusal::Unavailable(_) => {}
            Refusal::Invalid(e) => {
                parts.push("error=\"invalid_token\"".to_owned());
                parts.push(format!("error_description=\"{}\"", quoted(&e.to_string())));
            }
            Refusal::Scope(missing) => {
                parts.push("error=\"insufficient_scope\"".to_owned());
                parts.push(format!(
                    "error_description=\"the access token lacks the scope {}\"",
                    quoted(&missing.join(" "))
                ));
            }
        }
        if !self.scopes.is_empty() {
            parts.push(format!("scope=\"{}\"", quoted(&self.scopes.join(" "))));
        }
        parts.push(format!(
            "resource_metadata=\"{}\"",
            quoted(&self.metadata_url)
        ));
        format!("Bearer {}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::http::jwt::tests::TestIssuer;
    use std::collections::BTreeMap;

    fn config(pairs: &[(&str, &str)]) -> Config {
        let env: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Config::from_sources(&env, std::path::Path::new("/nonexistent")).unwrap()
    }

    #[test]
    fn the_metadata_names_the_issuer_and_the_resource() {
        let c = config(&[
            ("SMOL_MCP_AUTH_ISSUER", "https://id.example"),
            ("SMOL_MCP_AUTH_SCOPES", "machines"),
            ("SMOL_MCP_HTTP_PORT", "9000"),
        ]);
        let s = SignIn::from_config(&c).unwrap().unwrap();
        assert_eq!(s.metadata()["resource"], "http://127.0.0.1:9000/mcp");
        assert_eq!(
            s.metadata()["authorization_servers"][0],
            "https://id.example"
        );
        assert_eq!(s.metadata()["scopes_supported"][0], "machines");
        assert_eq!(
            s.metadata_url,
            "http://127.0.0.1:9000/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            s.challenge(&Refusal::Missing),
            "Bearer scope=\"machines\", resource_metadata=\"http://127.0.0.1:9000/.well-known/oauth-protected-resource/mcp\""
        );
        assert!(
            s.challenge(&Refusal::Scope(vec!["machines".into()]))
                .starts_with("Bearer error=\"insufficient_scope\"")
        );
        let behind = config(&[
            ("SMOL_MCP_AUTH_ISSUER", "https://id.example"),
            ("SMOL_MCP_AUTH_RESOURCE", "https://smol.example/team/mcp"),
        ]);
        let s = SignIn::from_config(&behind).unwrap().unwrap();
        assert_eq!(
            s.metadata_paths,
            [
                "/.well-known/oauth-protected-resource/team/mcp".to_owned(),
                "/.well-known/oauth-protected-resource".to_owned()
            ]
        );
        assert!(SignIn::from_config(&config(&[])).unwrap().is_none());
    }

    #[test]
    fn off_loopback_the_resource_must_be_given() {
        let e = SignIn::from_config(&config(&[
            ("SMOL_MCP_AUTH_ISSUER", "https://id.example"),
            ("SMOL_MCP_HTTP_HOST", "0.0.0.0"),
        ]))
        .err()
        .unwrap()
        .to_string();
        assert!(e.starts_with("authResource: required"), "{e}");
        assert!(
            SignIn::from_config(&config(&[
                ("SMOL_MCP_AUTH_ISSUER", "https://id.example"),
                ("SMOL_MCP_HTTP_HOST", "0.0.0.0"),
                ("SMOL_MCP_AUTH_RESOURCE", "https://smol.example/mcp"),
            ]))
            .is_ok()
        );
    }

    #[test]
    fn an_issuer_must_be_https_or_loopback() {
        for bad in [
            "http://id.example",
            "ftp://id.example",
            "id.example",
            "https://id.example/?x=1",
        ] {
            let e = SignIn::from_config(&config(&[("SMOL_MCP_AUTH_ISSUER", bad)]))
                .err()
                .unwrap()
                .to_string();
            assert!(e.starts_with("authIssuer: "), "{e}");
        }
        assert!(
            SignIn::from_config(&config(&[(
                "SMOL_MCP_AUTH_ISSUER",
                "http://127.0.0.1:4000"
            )]))
            .is_ok()
        );
        let e = SignIn::from_config(&config(&[
            ("SMOL_MCP_AUTH_ISSUER", "https://id.example"),
            ("SMOL_MCP_AUTH_JWKS_URL", "http://keys.example/jwks"),
        ]))
        .err()
        .unwrap()
        .to_string();
        assert!(e.starts_with("authJwksUrl: "), "{e}");
    }

    /// An issuer on a listener bound to `bind`, named by its loopback URL (answered): its
    /// OpenID metadata names the `jwks_uri` made of that URL and the port, and each fetch of
    /// `/jwks` answers `keys()`.
    async fn serve_issuer(
        bind: &str,
        jwks_uri: impl FnOnce(&str, u16) -> String,
        keys: impl Fn() -> serde_json::Value + Clone + Send + Sync + 'static,
    ) -> String {
        let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let issuer = format!("http://127.0.0.1:{port}");
        let metadata = serde_json::json!({"issuer": issuer, "jwks_uri": jwks_uri(&issuer, port)});
        let router = axum::Router::new()
            .route(
                "/.well-known/openid-configuration",
                axum::routing::get(move || {
                    let m = metadata.clone();
                    async move { axum::Json(m) }
                }),
            )
            .route(
                "/jwks",
                axum::routing::get(move || {
                    let k = keys();
                    async move { axum::Json(k) }
                }),
            );
        tokio::spawn(async move { axum::serve(listener, router).await });
        issuer
    }

    /// A token checked once is taken again without its signature checked, but only while it
    /// is unexpired and the same key set is in use: after a rotation drops its key it is
    /// refused. Scopes are asked of a remembered token too, and what is remembered is bounded.
    #[tokio::test]
    async fn a_checked_token_is_taken_again_only_unexpired_and_under_its_keys() {
        let first = TestIssuer::new("k1");
        let served = Arc::new(std::sync::Mutex::new(first.jwks()));
        let issuer = {
            let served = served.clone();
            serve_issuer(
                "127.0.0.1:0",
                |issuer, _| format!("{issuer}/jwks"),
                move || served.lock().unwrap().clone(),
            )
            .await
        };
        let c = config(&[
            ("SMOL_MCP_AUTH_ISSUER", &issuer),
            ("SMOL_MCP_AUTH_SCOPES", "machines"),
        ]);
        let s = SignIn::from_config(&c).unwrap().unwrap();
        let now = chrono::Utc::now().timestamp();
        let claims = |scope: &str, sub: &str| {
            serde_json::json!({
                "iss": issuer, "aud": "http://127.0.0.1:8080/mcp", "sub": sub,
                "exp": now + 300, "scope": scope,
            })
        };
        let token = first.sign(&claims("machines", "alice"));
        assert_eq!(s.check_at(&token, now).await, Ok(User::signed_in("alice")));
        assert_eq!(s.checked_tokens().by_digest.len(), 1, "remembered");
        // A token of the same key with its signature spoilt is no token remembered.
        let at = token.len() - 10;
        let spoilt = if &token[at..=at] == "A" { "B" } else { "A" };
        let forged = format!("{}{spoilt}{}", &token[..at], &token[at + 1..]);
        assert!(s.check_at(&forged, now).await.is_err());
        assert_eq!(
            s.check_at(&token, now + 10).await,
            Ok(User::signed_in("alice"))
        );
        assert_eq!(
            s.check_at(&token, now + 300 + 61).await,
            Err(Refusal::Invalid(TokenError::Expired)),
            "past its expiry, remembered or not"
        );
        let narrow = first.sign(&claims("openid", "alice"));
        for _ in 0..2 {
            assert_eq!(
                s.check_at(&narrow, now).await,
                Err(Refusal::Scope(vec!["machines".into()]))
            );
        }
        // The issuer rotates: k1 is gone. A token of k2 fetches the new set; alice's token,
        // remembered under the old set, is checked again and refused.
        let second = TestIssuer::new("k2");
        *served.lock().unwrap() = second.jwks();
        s.fetching.lock().await.last_attempt = Some(Instant::now() - REFETCH_AFTER);
        assert_eq!(
            s.check_at(&second.sign(&claims("machines", "bob")), now)
                .await,
            Ok(User::signed_in("bob"))
        );
        assert_eq!(
            s.check_at(&token, now).await,
            Err(Refusal::Invalid(TokenError::UnknownKey))
        );
        // Bounded: more tokens than are kept leave at most the bound.
        for i in 0..TOKENS_KEPT + 5 {
            let user = format!("user{i}");
            let t = second.sign(&claims("machines", &user));
            assert_eq!(s.check_at(&t, now).await, Ok(User::signed_in(&user)));
        }
        assert!(s.checked_tokens().by_digest.len() <= TOKENS_KEPT);
    }

    /// A key set served by a local listener: the first token fetches it, a token of an unknown
    /// key fetches again only after the pause, and the scopes are checked.
    #[tokio::test]
    async fn keys_are_fetched_once_and_again_for_a_new_key() {
        let first = TestIssuer::new("k1");
        let served = Arc::new(std::sync::Mutex::new(first.jwks()));
        let fetches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let issuer = {
            let (served, fetches) = (served.clone(), fetches.clone());
            serve_issuer(
                "127.0.0.1:0",
                |issuer, _| format!("{issuer}/jwks"),
                move || {
                    fetches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    served.lock().unwrap().clone()
                },
            )
            .await
        };
        let c = config(&[
            ("SMOL_MCP_AUTH_ISSUER", &issuer),
            ("SMOL_MCP_AUTH_SCOPES", "machines"),
        ]);
        let s = SignIn::from_config(&c).unwrap().unwrap();
        let claims = |scope: &str| {
            serde_json::json!({
                "iss": issuer, "aud": "http://127.0.0.1:8080/mcp", "sub": "alice",
                "exp": chrono::Utc::now().timestamp() + 300, "scope": scope,
            })
        };
        assert_eq!(
            s.check(&first.sign(&claims("machines"))).await,
            Ok(User::signed_in("alice"))
        );
        assert_eq!(
            s.check(&first.sign(&claims("openid"))).await,
            Err(Refusal::Scope(vec!["machines".into()]))
        );
        assert_eq!(fetches.load(std::sync::atomic::Ordering::SeqCst), 1);
        // The issuer rotates to a second key: the first token of it fetches again, but only
        // once the pause has passed.
        let second = TestIssuer::new("k2");
        *served.lock().unwrap() = second.jwks();
        assert_eq!(
            s.check(&second.sign(&claims("machines"))).await,
            Err(Refusal::Invalid(TokenError::UnknownKey))
        );
        assert_eq!(fetches.load(std::sync::atomic::Ordering::SeqCst), 1);
        s.fetching.lock().await.last_attempt = Some(Instant::now() - REFETCH_AFTER);
        assert_eq!(
            s.check(&second.sign(&claims("machines"))).await,
            Ok(User::signed_in("alice"))
        );
        assert_eq!(fetches.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(
            s.check("not a token").await,
            Err(Refusal::Invalid(TokenError::Malformed))
        );
    }

    #[test]
    fn a_refusal_challenge_stays_one_header_line() {
        let c = config(&[("SMOL_MCP_AUTH_ISSUER", "https://id.example")]);
        let s = SignIn::from_config(&c).unwrap().unwrap();
        let issuer = TestIssuer::new("k1");
        for header in [
            serde_json::json!({"alg": "RS256\nINFO forged", "kid": "k1"}),
            serde_json::json!({"alg": "ES256", "kid": "k1", "typ": "x\r\nSet-Cookie: a=b"}),
        ] {
            let token = issuer.sign_with_header(&header, &serde_json::json!({"sub": "a"}));
            let e = jwt::verify(&token, &KeySet::default(), &s.expected, 0).unwrap_err();
            let challenge = s.challenge(&Refusal::Invalid(e));
            assert!(
                axum::http::HeaderValue::from_str(&challenge).is_ok(),
                "{challenge:?}"
            );
        }
    }

    /// The `jwks_uri` an issuer's metadata names is held to the rule `authIssuer` is: a key
    /// set fetched over plain http from another machine could be swapped on the way.
    #[tokio::test]
    async fn a_discovered_jwks_uri_must_be_https_or_loopback() {
        let issuer_key = TestIssuer::new("k1");
        let jwks = issuer_key.jwks();
        // 0.0.0.0 reaches this machine, but it is not a loopback address: it stands for a
        // jwks_uri on another host.
        let issuer = serve_issuer(
            "0.0.0.0:0",
            |_, port| format!("http://0.0.0.0:{port}/jwks"),
            move || jwks.clone(),
        )
        .await;
        let s = SignIn::from_config(&config(&[("SMOL_MCP_AUTH_ISSUER", &issuer)]))
            .unwrap()
            .unwrap();
        let token = issuer_key.sign(&serde_json::json!({
            "iss": issuer, "aud": "http://127.0.0.1:8080/mcp", "sub": "alice",
            "exp": chrono::Utc::now().timestamp() + 300,
        }));
        let Err(Refusal::Unavailable(e)) = s.check(&token).await else {
            panic!("a key set from a plain-http jwks_uri off loopback was used");
        };
        assert!(
            e.contains("jwks_uri")
                && e.contains("/.well-known/openid-configuration")
                && e.contains("https"),
            "{e}"
        );
        // The operator's key set URL is held to the same rule, and may carry a query as a
        // discovered one may.
        let with_jwks = |url: &str| {
            SignIn::from_config(&config(&[
                ("SMOL_MCP_AUTH_ISSUER", "https://id.example"),
                ("SMOL_MCP_AUTH_JWKS_URL", url),
            ]))
        };
        assert!(with_jwks("https://id.example/keys?p=b2c_1_signin").is_ok());
        assert!(with_jwks("http://[::1]:4000/keys").is_ok());
        for bad in ["http://0.0.0.0:4000/keys", "https://id.example/keys#k"] {
            let e = with_jwks(bad).err().unwrap().to_string();
            assert!(e.starts_with("authJwksUrl: ") && e.contains("https"), "{e}");
        }
    }

    #[tokio::test]
    async fn an_issuer_that_cannot_be_reached_makes_503_not_401() {
        let c = config(&[("SMOL_MCP_AUTH_ISSUER", "http://127.0.0.1:9")]);
        let s = SignIn::from_config(&c).unwrap().unwrap();
        let token = TestIssuer::new("k1").sign(&serde_json::json!({"sub": "a"}));
        assert!(matches!(
            s.check(&token).await,
            Err(Refusal::Unavailable(_))
        ));
    }
}
