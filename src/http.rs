//! The Streamable HTTP transport: one MCP session per client, behind a bearer token. The token
//! is checked before anything else (so an unauthenticated caller learns nothing, not even where
//! the endpoint is), then the path; Host and Origin checks (DNS-rebinding protection) are rmcp's.

use crate::backend::Backend;
use crate::config::Config;
use crate::server::SmolMcp;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
struct Guard {
    token: Arc<str>,
    path: Arc<str>,
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

fn presented_token(headers: &HeaderMap) -> String {
    if let Some(t) = headers
        .get("x-smol-mcp-token")
        .and_then(|v| v.to_str().ok())
        .filter(|t| !t.is_empty())
    {
        return t.to_owned();
    }
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.get(..7)
                .filter(|p| p.eq_ignore_ascii_case("bearer "))
                .map(|_| v[7..].trim())
        })
        .unwrap_or_default()
        .to_owned()
}

async fn guard(State(g): State<Guard>, request: Request, next: Next) -> Response {
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
    next.run(request).await
}

/// The names a client may use in `Host`: the configured list, else the loopback names when the
/// listener is on loopback, else none (and then the token is the only gate).
pub fn allowed_hosts(config: &Config) -> Vec<String> {
    if !config.http_allowed_hosts.is_empty() {
        return config.http_allowed_hosts.clone();
    }
    if matches!(
        config.http_host.as_str(),
        "127.0.0.1" | "localhost" | "::1" | "[::1]"
    ) {
        return vec!["127.0.0.1".into(), "localhost".into(), "::1".into()];
    }
    Vec::new()
}

/// The whole HTTP application: the guard around the MCP service.
pub fn app(config: &Config, backend: Arc<Backend>, shutdown: CancellationToken) -> axum::Router {
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(Duration::from_secs(config.http_session_idle_secs));
    let mut mcp_config = StreamableHttpServerConfig::default()
        .with_cancellation_token(shutdown.child_token())
        .with_allowed_origins(config.http_allowed_origins.clone());
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
        Arc::new(sessions),
        mcp_config,
    );
    let guard_state = Guard {
        token: Arc::from(config.auth_token.expose()),
        path: Arc::from(config.http_path.as_str()),
    };
    axum::Router::new()
        .route_service(&config.http_path, service)
        .fallback(|| async { StatusCode::NOT_FOUND })
        .layer(axum::middleware::from_fn_with_state(guard_state, guard))
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
