//! The Streamable HTTP transport: one MCP session per client, behind a bearer token. The token
//! is checked before anything else (so an unauthenticated caller learns nothing, not even where
//! the endpoint is), then the path, then `Host` (DNS-rebinding protection; rmcp checks it too,
//! but takes `evil.example@127.0.0.1` for 127.0.0.1 and reads only the first of two), then
//! `Origin`, then the body must arrive within its deadline. The accept loop (`listener`) bounds
//! connections and header time; the idle rule and the bound for sessions (`sessions`) are this
//! server's, not rmcp's.

mod jwt;
mod listener;
mod sessions;
mod signin;

use crate::policy::user::User;
use crate::process::config::Config;
use crate::protocol::Protocol;
use crate::protocol::server::SmolMcp;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt as _;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sessions::{NoPlace, Sessions};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const SESSION_HEADER: &str = "mcp-session-id";

/// The largest request body, rmcp's own default, set on rmcp too so that both agree.
const MAX_BODY: usize = 4 * 1024 * 1024;

/// What a client is told to wait before another initialize at the session bound: sessions end
/// by DELETE or by going idle, neither of which a retry within the second would likely see.
const SESSION_RETRY_AFTER_SECS: u32 = 5;

/// How a request proves who it is for: the static token (one user, the operator), an access
/// token of the operator's issuer (each user their own), or either.
pub struct Access {
    token: Option<Arc<str>>,
    sign_in: Option<signin::SignIn>,
}

pub use signin::SettingError;

impl Access {
    /// The access the settings ask for; refused when there is none (these tools create and run
    /// virtual machines: an open listener would be a remote shell) or a sign-in setting is
    /// wrong.
    pub fn from_config(config: &Config) -> Result<Access, AccessError> {
        let sign_in = signin::SignIn::from_config(config)?;
        let token = (!config.auth_token.is_empty()).then(|| Arc::from(config.auth_token.expose()));
        if token.is_none() && sign_in.is_none() {
            return Err(AccessError::None);
        }
        Ok(Access { token, sign_in })
    }

    /// With sign-in, the first fetch of the issuer's keys (logged, never fatal), beside the
    /// listener rather than before it: an issuer slow to answer does not hold up the start.
    async fn warm(&self) {
        if let Some(sign_in) = &self.sign_in {
            sign_in.warm().await;
        }
    }

    /// The user a request is for, or the answer refusing it.
    async fn user_of(&self, headers: &HeaderMap) -> Result<User, Response> {
        let presented = presented_token(headers);
        if let Some(token) = &self.token
            && same_secret(presented.as_bytes(), token.as_bytes())
        {
            return Ok(User::operator());
        }
        let Some(sign_in) = &self.sign_in else {
            return Err(json_rpc_error(
                StatusCode::UNAUTHORIZED,
                -32001,
                "unauthorized: send the bearer token in authorization or x-smol-mcp-token",
            ));
        };
        let refusal = if presented.is_empty() {
            signin::Refusal::Missing
        } else {
            match sign_in.check(presented).await {
                Ok(user) => return Ok(user),
                Err(refusal) => refusal,
            }
        };
        let (status, message) = match &refusal {
            signin::Refusal::Missing => (
                StatusCode::UNAUTHORIZED,
                "unauthorized: sign in; the protected resource metadata names the issuer"
                    .to_owned(),
            ),
            signin::Refusal::Invalid(e) => {
                tracing::info!(reason = %e, "refused an access token");
                (StatusCode::UNAUTHORIZED, format!("unauthorized: {e}"))
            }
            signin::Refusal::Scope(missing) => (
                StatusCode::FORBIDDEN,
                format!(
                    "forbidden: the access token lacks the scope {}",
                    missing.join(" ")
                ),
            ),
            signin::Refusal::Unavailable(e) => {
                tracing::warn!(error = ?e, "cannot check an access token: the issuer's keys are not to be had");
                let mut response = json_rpc_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    -32000,
                    "the issuer's signing keys cannot be fetched just now; retry shortly",
                );
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from(10u32));
                return Err(response);
            }
        };
        let mut response = json_rpc_error(status, -32001, &message);
        if let Ok(value) = header::HeaderValue::from_str(&sign_in.challenge(&refusal)) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, value);
        }
        Err(response)
    }

    /// The protected resource metadata, when `path` is one of its addresses and sign-in is on.
    /// Public, and readable from a browser page (an in-browser client discovers it).
    fn metadata_at(&self, path: &str) -> Option<Response> {
        let sign_in = self.sign_in.as_ref()?;
        if !sign_in.metadata_paths.iter().any(|p| p == path) {
            return None;
        }
        Some(
            (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, "application/json"),
                    (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
                    (header::CACHE_CONTROL, "max-age=300"),
                ],
                sign_in.metadata().to_string(),
            )
                .into_response(),
        )
    }
}

/// Why the HTTP server cannot start with the settings given.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error(
        "the HTTP transport requires SMOL_MCP_AUTH_TOKEN or SMOL_MCP_AUTH_ISSUER: these tools \
         create and run virtual machines, so an unauthenticated listener is a remote shell"
    )]
    None,
    #[error(transparent)]
    SignIn(#[from] SettingError),
}

struct Guard {
    access: Access,
    path: Arc<str>,
    hosts: Vec<Authority>,
    origins: Vec<Origin>,
    body_timeout: Duration,
    max_sessions: usize,
    /// The sessions one signed-in user may hold (`userSharePercent` of `httpMaxSessions`).
    user_sessions: usize,
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

/// A `Host` value as RFC 9110 has it, `uri-host[:port]` and nothing else: no userinfo, path,
/// spaces or empty port. The host is case-folded and an IPv6 literal kept without brackets.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Authority {
    host: String,
    port: Option<u16>,
}

impl Authority {
    fn parse(text: &str) -> Option<Authority> {
        let (host, port) = match text.strip_prefix('[') {
            Some(rest) => {
                let (inner, after) = rest.split_once(']')?;
                let ip = inner.parse::<std::net::Ipv6Addr>().ok()?;
                let port = match after {
                    "" => None,
                    after => Some(after.strip_prefix(':')?),
                };
                (ip.to_string(), port)
            }
            None => {
                let (host, port) = match text.split_once(':') {
                    Some((host, port)) => (host, Some(port)),
                    None => (text, None),
                };
                let name_byte =
                    |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_');
                if host.is_empty() || !host.bytes().all(name_byte) {
                    return None;
                }
                (host.to_ascii_lowercase(), port)
            }
        };
        let port = match port {
            None => None,
            Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
                Some(p.parse::<u16>().ok()?)
            }
            Some(_) => return None,
        };
        Some(Authority { host, port })
    }

    /// An allowed-hosts entry: `name`, `name:port`, or a bare IPv6 literal (`::1`).
    fn parse_allowed(text: &str) -> Option<Authority> {
        let text = text.trim();
        if let Ok(ip) = text.parse::<std::net::Ipv6Addr>() {
            return Some(Authority {
                host: ip.to_string(),
                port: None,
            });
        }
        Authority::parse(text)
    }

    /// An entry without a port allows every port, as rmcp's list does.
    fn allows(&self, presented: &Authority) -> bool {
        self.host == presented.host && self.port.is_none_or(|p| Some(p) == presented.port)
    }
}

/// Why a request's `Host` is refused, if it is.
fn host_refusal(headers: &HeaderMap, allowed: &[Authority]) -> Option<Response> {
    let mut values = headers.get_all(header::HOST).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Some(json_rpc_error(
            StatusCode::BAD_REQUEST,
            -32600,
            "bad request: a request carries exactly one Host header",
        ));
    };
    let Some(presented) = value.to_str().ok().and_then(Authority::parse) else {
        tracing::warn!(host = ?value, "refused a malformed Host header");
        return Some(json_rpc_error(
            StatusCode::BAD_REQUEST,
            -32600,
            "bad request: the Host header must be host[:port], without userinfo or a path",
        ));
    };
    if !allowed.is_empty() && !allowed.iter().any(|a| a.allows(&presented)) {
        tracing::warn!(host = ?value, "refused a Host not allowed (possible DNS rebinding)");
        return Some(json_rpc_error(
            StatusCode::FORBIDDEN,
            -32003,
            "forbidden: this Host is not allowed (httpAllowedHosts)",
        ));
    }
    None
}

/// Why a request's `Origin` is refused, if it is. A request without one is let through.
fn origin_refusal(headers: &HeaderMap, allowed: &[Origin]) -> Option<Response> {
    let mut values = headers.get_all(header::ORIGIN).iter();
    let origin = values.next()?;
    if values.next().is_some() {
        tracing::warn!("refused a request with more than one Origin header");
        return Some(json_rpc_error(
            StatusCode::BAD_REQUEST,
            -32600,
            "bad request: a request carries at most one Origin header",
        ));
    }
    // The transport spec: a present Origin that is not allowed MUST get 403, so that a web
    // page the user visits cannot drive the server through the browser.
    let ok = origin
        .to_str()
        .ok()
        .and_then(Origin::parse)
        .is_some_and(|o| allowed.contains(&o));
    if ok {
        return None;
    }
    tracing::warn!(?origin, "refused a request from an origin not allowed");
    Some(json_rpc_error(
        StatusCode::FORBIDDEN,
        -32003,
        "forbidden: this Origin is not allowed (httpAllowedOrigins)",
    ))
}

enum BodyError {
    Late,
    TooLarge,
    Broken(axum::Error),
}

/// The whole body, within `within` of its headers: hyper bounds only the time to the headers,
/// so without this a client holding a valid token could keep a connection by sending its body
/// a byte at a time, or never.
async fn read_body(body: Body, within: Duration) -> Result<Bytes, BodyError> {
    let collect = async {
        let mut stream = body.into_data_stream();
        let mut whole = bytes::BytesMut::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(BodyError::Broken)?;
            if whole.len() + chunk.len() > MAX_BODY {
                return Err(BodyError::TooLarge);
            }
            whole.extend_from_slice(&chunk);
        }
        Ok(whole.freeze())
    };
    tokio::time::timeout(within, collect)
        .await
        .unwrap_or(Err(BodyError::Late))
}

/// A refusal after which the connection is closed: what is left of the body is not read.
fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}

fn body_refusal(error: BodyError, within: Duration) -> Response {
    match error {
        BodyError::Late => {
            tracing::warn!(
                ?within,
                "closed a connection whose request body did not arrive in time"
            );
            closing(json_rpc_error(
                StatusCode::REQUEST_TIMEOUT,
                -32000,
                &format!(
                    "request timeout: the body did not arrive within {} s (httpBodyTimeoutSecs)",
                    within.as_secs()
                ),
            ))
        }
        BodyError::TooLarge => closing(json_rpc_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            -32600,
            &format!("payload too large: a request body is at most {MAX_BODY} bytes"),
        )),
        BodyError::Broken(e) => {
            tracing::debug!(error = %e, "a request body broke off");
            closing(json_rpc_error(
                StatusCode::BAD_REQUEST,
                -32600,
                "bad request: the request body broke off",
            ))
        }
    }
}

/// Whether a body is an `initialize` request (a batch is not: rmcp refuses those). A body in
/// which neither the word nor an escape (`\u0069nitialize` is the same JSON string) appears
/// is none, without parsing it: every sessionless call comes this way.
fn is_initialize(body: &[u8]) -> bool {
    let may_be = |needle: &[u8]| memchr::memmem::find(body, needle).is_some();
    if !may_be(b"initialize") && !may_be(b"\\u") {
        return false;
    }
    #[derive(serde::Deserialize)]
    struct Method<'a> {
        #[serde(borrow)]
        method: Option<std::borrow::Cow<'a, str>>,
    }
    serde_json::from_slice::<Method<'_>>(body)
        .is_ok_and(|m| m.method.as_deref() == Some("initialize"))
}

fn too_many_sessions(max: usize) -> Response {
    let mut response = json_rpc_error(
        StatusCode::SERVICE_UNAVAILABLE,
        -32000,
        &format!(
            "too many sessions: this server holds at most {max} at once (httpMaxSessions); end one with DELETE or retry later"
        ),
    );
    response.headers_mut().insert(
        header::RETRY_AFTER,
        header::HeaderValue::from(SESSION_RETRY_AFTER_SECS),
    );
    response
}

fn too_many_sessions_of(share: usize) -> Response {
    let mut response = json_rpc_error(
        StatusCode::SERVICE_UNAVAILABLE,
        -32000,
        &format!(
            "too many sessions of yours: you hold {share}, your share of this server's \
             (userSharePercent of httpMaxSessions); end one with DELETE first"
        ),
    );
    response.headers_mut().insert(
        header::RETRY_AFTER,
        header::HeaderValue::from(SESSION_RETRY_AFTER_SECS),
    );
    response
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

/// Keeps `held` (a session's or a connection's busy mark) until the response body is sent or
/// dropped: a tool call's answer is an event stream that ends only once the call does.
fn holding<T: Send + 'static>(response: Response, held: T) -> Response {
    let (parts, body) = response.into_parts();
    let stream = body.into_data_stream().map(move |chunk| {
        let _ = &held;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

async fn guard(State(g): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    if request.method() == Method::GET
        && let Some(metadata) = g.access.metadata_at(request.uri().path())
    {
        return metadata;
    }
    let user = match g.access.user_of(request.headers()).await {
        Ok(user) => user,
        Err(refused) => return refused,
    };
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
    if let Some(refused) = host_refusal(request.headers(), &g.hosts) {
        return refused;
    }
    if let Some(refused) = origin_refusal(request.headers(), &g.origins) {
        return refused;
    }
    let (mut parts, body) = request.into_parts();
    parts.extensions.insert(user);
    let body = match read_body(body, g.body_timeout).await {
        Ok(body) => body,
        Err(e) => return body_refusal(e, g.body_timeout),
    };
    // From here the connection serves a request: no new connection may take its slot.
    let serving = parts
        .extensions
        .get::<listener::Connection>()
        .map(listener::Connection::serving);
    // Only a POST without a session can open one, and only one within a session has its
    // params checked here (`route` answers no other with it); the others are not parsed twice.
    let in_session = parts.headers.contains_key(SESSION_HEADER);
    let initialize = parts.method == Method::POST && !in_session && is_initialize(&body);
    let params_refusal = if parts.method == Method::POST && in_session {
        invalid_params(&body)
    } else {
        None
    };
    let sent = body.clone();
    let request = Request::from_parts(parts, Body::from(body));
    let response = as_json_rpc_error(
        route(&g, request, initialize, params_refusal, next).await,
        &sent,
    )
    .await;
    match serving {
        Some(serving) => holding(response, serving),
        None => response,
    }
}

/// What rmcp answers a POST whose body it cannot read as JSON-RPC: 415 with a line of text,
/// which a client reads as a content type it got wrong.
const RMCP_UNREADABLE: &str = "fail to deserialize request body";

/// rmcp's answer to a body that is not JSON-RPC, as JSON-RPC says: 400 with the parse error
/// -32700 for a body that is not JSON, the invalid request -32600 for JSON that is no message.
/// Looked at only on a 415 (after rmcp parsed the body, so a good call pays nothing).
async fn as_json_rpc_error(response: Response, sent: &[u8]) -> Response {
    if response.status() != StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return response;
    }
    let (parts, body) = response.into_parts();
    let Ok(text) = axum::body::to_bytes(body, 4096).await else {
        return json_rpc_error(StatusCode::BAD_REQUEST, -32700, "Parse error");
    };
    let Some(why) = std::str::from_utf8(&text)
        .ok()
        .and_then(|t| t.strip_prefix(RMCP_UNREADABLE))
    else {
        return Response::from_parts(parts, Body::from(text));
    };
    let (code, what) = if serde_json::from_slice::<serde::de::IgnoredAny>(sent).is_ok() {
        (
            -32600,
            "Invalid Request: the body is JSON but no JSON-RPC message",
        )
    } else {
        (-32700, "Parse error: the request body is not JSON")
    };
    json_rpc_error(
        StatusCode::BAD_REQUEST,
        code,
        &format!("{what} ({})", why.trim()),
    )
}

/// The largest body whose params are checked before rmcp reads it (see [`invalid_params`]);
/// past it (a write-file's content) the body goes to rmcp as it is.
const PARAMS_CHECKED_BELOW: usize = 64 * 1024;

/// The answer to a request of a served method whose params rmcp cannot read: rmcp takes it
/// for an unknown method and answers -32601, where the params are what is wrong (-32602), as
/// the stdio server answers it (`crate::protocol::server::stdio::check_line`, shared). Only
/// within a session: on the sessionless 2026-07-28 lifecycle several of these methods do not
/// exist, and "method not found" (HTTP 404) is the answer the conformance suite checks.
fn invalid_params(body: &[u8]) -> Option<serde_json::Value> {
    if body.len() >= PARAMS_CHECKED_BELOW {
        return None;
    }
    match crate::protocol::server::stdio::check_line(body) {
        crate::protocol::server::stdio::Verdict::Reply(answer)
            if answer["error"]["code"] == crate::protocol::server::stdio::INVALID_PARAMS =>
        {
            Some(answer)
        }
        _ => None,
    }
}

fn json_answer(answer: &serde_json::Value) -> Response {
    (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        answer.to_string(),
    )
        .into_response()
}

async fn route(
    g: &Guard,
    request: Request,
    initialize: bool,
    params_refusal: Option<serde_json::Value>,
    next: Next,
) -> Response {
    let session = header_text(request.headers(), SESSION_HEADER).map(str::to_owned);
    let user = request
        .extensions()
        .get::<User>()
        .cloned()
        .unwrap_or_default();
    if let Some(id) = &session
        && !g.sessions.belongs_to(id, &user)
    {
        // As for a session that does not exist: a session id is not a credential.
        tracing::warn!(%user, session = ?id, "refused a request on another user's session");
        return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
    }
    match (request.method().clone(), session) {
        (Method::DELETE, session) => delete(g, session, request, next).await,
        (Method::POST, None) if initialize => {
            let share = (!user.is_operator()).then_some(g.user_sessions);
            let opening = match g.sessions.reserve(g.max_sessions, &user, share) {
                Ok(opening) => opening,
                Err(NoPlace::UserShare) => {
                    tracing::warn!(%user, share = g.user_sessions, "refused an initialize past the user's share of sessions");
                    return too_many_sessions_of(g.user_sessions);
                }
                Err(NoPlace::Bound) => {
                    tracing::warn!(
                        max = g.max_sessions,
                        "refused an initialize at the session bound"
                    );
                    return too_many_sessions(g.max_sessions);
                }
            };
            let response = next.run(request).await;
            // An initialize answer carries the new session's id: from now on it is tracked.
            if let Some(id) = header_text(response.headers(), SESSION_HEADER) {
                opening.opened(id);
            }
            response
        }
        (Method::POST, Some(id)) => match g.sessions.enter(&id) {
            Some(_in_flight) if params_refusal.is_some() => {
                json_answer(&params_refusal.unwrap_or_default())
            }
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
    guard: Arc<Guard>,
}

fn app(
    config: &Config,
    access: Access,
    protocol: Arc<Protocol>,
    shutdown: &CancellationToken,
) -> App {
    let mut manager = LocalSessionManager::default();
    // rmcp's keep_alive counts only session events, not a tool call still running, so it
    // would close a session under a long call; `sessions::reap` applies the idle rule instead.
    manager.session_config.keep_alive = None;
    let manager = Arc::new(manager);
    let mut mcp_config = StreamableHttpServerConfig::default()
        .with_cancellation_token(shutdown.child_token())
        .with_max_request_body_bytes(MAX_BODY)
        // A sessionless call whose first message is its answer gets it as one JSON body; one
        // that reports progress first still gets an event stream (rmcp falls back to it).
        // The stream's machinery (its keep-alive timer, its cancel-on-drop wrapper, the
        // framing) was spent on every call that sends nothing but its answer.
        .with_json_response(true)
        // Checked in `guard`, with a JSON-RPC body and the listener's port in the default.
        .disable_allowed_origins();
    // Kept on in rmcp behind the guard's own check, which is stricter (see the module's doc).
    let hosts = allowed_hosts(config);
    mcp_config = if hosts.is_empty() {
        mcp_config.disable_allowed_hosts()
    } else {
        mcp_config.with_allowed_hosts(hosts.clone())
    };
    let parsed_hosts = hosts
        .iter()
        .filter_map(|h| {
            let parsed = Authority::parse_allowed(h);
            if parsed.is_none() {
                tracing::warn!(host = %h, "ignoring an allowed host that is not host[:port]");
            }
            parsed
        })
        .collect();
    let service = StreamableHttpService::new(
        move || {
            let session = format!("http-{}-{:016x}", std::process::id(), rand::random::<u64>());
            Ok(SmolMcp::new(protocol.clone(), session).cleaning_up_on_drop())
        },
        manager.clone(),
        mcp_config,
    );
    let sessions = Arc::new(Sessions::default());
    let guard_state = Arc::new(Guard {
        access,
        path: Arc::from(config.http_path.as_str()),
        hosts: parsed_hosts,
        origins: allowed_origins(config),
        body_timeout: Duration::from_secs(config.http_body_timeout_secs),
        max_sessions: config.http_max_sessions,
        user_sessions: (config
            .http_max_sessions
            .saturating_mul(usize::try_from(config.user_share_percent).unwrap_or(100))
            / 100)
            .max(1),
        sessions: sessions.clone(),
        manager: manager.clone(),
    });
    let router = axum::Router::new()
        .route_service(&config.http_path, service)
        .fallback(|| async { StatusCode::NOT_FOUND })
        .layer(axum::middleware::from_fn_with_state(
            guard_state.clone(),
            guard,
        ));
    App {
        router,
        sessions,
        manager,
        guard: guard_state,
    }
}

/// Serves MCP on `listener` until `shutdown` is cancelled; then stops accepting and waits for
/// open connections (the caller bounds the wait, then cleans up the machines). The future owns
/// what it needs of `config`, so that it can be spawned.
pub fn serve(
    listener: TcpListener,
    config: &Config,
    access: Access,
    protocol: Arc<Protocol>,
    shutdown: CancellationToken,
) -> impl Future<Output = ()> + Send + 'static {
    let app = app(config, access, protocol.clone(), &shutdown);
    let idle = Duration::from_secs(config.http_session_idle_secs);
    let limits = listener::Limits {
        max_connections: config.http_max_connections,
        header_timeout: Duration::from_secs(config.http_header_timeout_secs),
    };
    async move {
        let guard = app.guard;
        tokio::spawn(async move { guard.access.warm().await });
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

    /// The word's pre-check must not let an initialize through uncounted: one whose method is
    /// spelled with an escape is still one (and so still held to the session bound).
    #[test]
    fn an_initialize_is_seen_however_its_method_is_spelled() {
        let initialize = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#;
        let escaped = br#"{"jsonrpc":"2.0","id":1,"method":"\u0069nitialize","params":{}}"#;
        let all_escaped =
            br#"{"jsonrpc":"2.0","id":1,"method":"\u0069\u006eitialize","params":{}}"#;
        assert!(is_initialize(initialize));
        assert!(is_initialize(escaped));
        assert!(is_initialize(all_escaped));
        let call =
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list-machines"}}"#;
        let naming_it = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run-command","arguments":{"command":"initialize \u0041"}}}"#;
        assert!(!is_initialize(call));
        assert!(!is_initialize(naming_it));
        assert!(!is_initialize(b"not json initialize"));
    }

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
        let mut config = crate::process::config::Config::from_sources(
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
    fn hosts_are_host_and_port_only() {
        let a = |t: &str| Authority::parse(t);
        let ok = |h: &str, p: Option<u16>| {
            Some(Authority {
                host: h.into(),
                port: p,
            })
        };
        assert_eq!(a("LocalHost:8080"), ok("localhost", Some(8080)));
        assert_eq!(a("127.0.0.1"), ok("127.0.0.1", None));
        assert_eq!(a("[::1]:9"), ok("::1", Some(9)));
        assert_eq!(a("[0:0:0:0:0:0:0:1]"), ok("::1", None));
        for bad in [
            "evil.example@127.0.0.1",
            "u:p@localhost:80",
            "127.0.0.1:80/mcp",
            "127.0.0.1:",
            "127.0.0.1:65536",
            "127.0.0.1:80:80",
            "[::1",
            "[::1]x",
            "[evil]",
            "",
            "a b",
        ] {
            assert_eq!(a(bad), None, "{bad}");
        }
        let allowed = Authority::parse_allowed("::1").unwrap();
        assert!(
            allowed.allows(&a("[::1]:8080").unwrap()),
            "no port: any port"
        );
        let allowed = Authority::parse_allowed("b.example:443").unwrap();
        assert!(allowed.allows(&a("B.example:443").unwrap()));
        assert!(!allowed.allows(&a("b.example:444").unwrap()));
        assert!(!allowed.allows(&a("b.example").unwrap()));
    }

    #[test]
    fn initialize_is_told_apart() {
        assert!(is_initialize(
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#
        ));
        assert!(!is_initialize(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#
        ));
        assert!(!is_initialize(br#"[{"method":"initialize"}]"#), "a batch");
        assert!(!is_initialize(b"not json"));
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
