//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned with the
//! Node 22 it needs in tests/conformance/package.json) against `smol-mcp-http` on the local
//! fleet (the fake serve), for both protocol lifecycles: `--spec-version 2025-11-25` (sessions)
//! and `2026-07-28` (stateless).
//!
//! The suite cannot send a bearer token, and the server has no unauthenticated mode, so the
//! suite talks to a loopback proxy (tests/common/conformance.rs) that adds `Authorization: Bearer <token>` and
//! forwards everything else as it came (Host, Origin, header case, bodies and event streams
//! unbuffered). The scenarios that need the suite's reference-server fixtures (its `test_*`
//! tools, prompts and resources) are in tests/conformance/expected-failures-<version>.yaml,
//! each with its reason; the suite fails the run on a failure not listed there and on a listed
//! one that now passes (a stale entry), and so does this test.

use crate::common::conformance::{
    MUST_PASS_2025_11_25, MUST_PASS_2026_07_28, TOKEN, run_suite, token_proxy,
};
use crate::common::fake_serve::FakeServe;
use crate::common::real_serve::free_port;
use crate::common::stdio::server_env;
use serde_json::Value;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;

const HTTP_SERVER: &str = env!("CARGO_BIN_EXE_smol-mcp-http");

/// smol-mcp-http on the fake serve, and the token proxy in front of it.
struct Proxied {
    server: tokio::process::Child,
    server_port: u16,
    proxy_port: u16,
    _fake: FakeServe,
    _runtime_dir: tempfile::TempDir,
}

impl Proxied {
    async fn start() -> Proxied {
        let fake = FakeServe::start().await;
        let rt = tempfile::tempdir().unwrap();
        let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_port = proxy.local_addr().unwrap().port();
        let server_port = free_port();
        // Behind a proxy the origin a browser would send is the proxy's, so that is the one
        // allowed (the server's default allows its own port only); any other still gets 403.
        let origins = format!("http://127.0.0.1:{proxy_port},http://localhost:{proxy_port}");
        let mut server = Command::new(HTTP_SERVER)
            .env_clear()
            .envs(server_env(
                rt.path(),
                &[
                    ("SMOL_LOCAL_URL", &fake.url()),
                    ("SMOL_MCP_AUTH_TOKEN", TOKEN),
                    ("SMOL_MCP_HTTP_PORT", &server_port.to_string()),
                    ("SMOL_MCP_HTTP_ALLOWED_ORIGINS", &origins),
                    // The suite provokes a warning a scenario (unknown tools, refused origins).
                    ("SMOL_MCP_LOG", "error"),
                ],
            ))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let upstream = SocketAddr::from(([127, 0, 0, 1], server_port));
        let start = Instant::now();
        while TcpStream::connect(upstream).await.is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the HTTP server did not listen"
            );
            assert!(server.try_wait().unwrap().is_none(), "the server exited");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        token_proxy(proxy, upstream);
        Proxied {
            server,
            server_port,
            proxy_port,
            _fake: fake,
            _runtime_dir: rt,
        }
    }

    async fn stop(mut self) {
        self.server.start_kill().unwrap();
        self.server.wait().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_suite_on_the_session_lifecycle() {
    let behind = Proxied::start().await;
    run_suite("2025-11-25", MUST_PASS_2025_11_25, behind.proxy_port).await;
    behind.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_suite_on_the_stateless_lifecycle() {
    let behind = Proxied::start().await;
    run_suite("2026-07-28", MUST_PASS_2026_07_28, behind.proxy_port).await;
    behind.stop().await;
}

/// A JSON-RPC answer from its HTTP body: plain JSON, or the event stream's message that
/// carries the id.
fn answer(body: &str) -> Value {
    if let Ok(value) = serde_json::from_str(body) {
        return value;
    }
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|message| message.get("id").is_some())
        .unwrap_or_else(|| panic!("no JSON-RPC answer in {body}"))
}

fn stateless_meta() -> Value {
    serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "conformance-rs", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

/// What the suite sees through the proxy is what a client that sends the token sees: the proxy
/// adds the token and nothing else, so a foreign Host or Origin is still refused.
#[tokio::test]
async fn the_proxy_adds_the_token_and_nothing_else() {
    let behind = Proxied::start().await;
    let http = reqwest::Client::new();
    let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "0"}}});
    let post = |port: u16| {
        http.post(format!("http://127.0.0.1:{port}/mcp"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .json(&initialize)
    };
    let direct = post(behind.server_port).send().await.unwrap();
    assert_eq!(direct.status(), 401, "the server itself wants the token");
    let proxied = post(behind.proxy_port).send().await.unwrap();
    assert_eq!(proxied.status(), 200);
    assert!(proxied.headers().contains_key("mcp-session-id"));
    let host = post(behind.proxy_port)
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(
        host.status(),
        403,
        "the Host header is forwarded as it came"
    );
    let origin = post(behind.proxy_port)
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(
        origin.status(),
        403,
        "the Origin header is forwarded as it came"
    );
    behind.stop().await;
}

/// prompts/list: declared and empty on both lifecycles, and on 2026-07-28 with the caching
/// hints SEP-2549 requires of a cacheable result.
#[tokio::test]
async fn prompts_are_declared_empty_and_cacheable() {
    let behind = Proxied::start().await;
    let url = format!("http://127.0.0.1:{}/mcp", behind.proxy_port);
    let http = reqwest::Client::new();
    let stateless = |method: &str| {
        http.post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", method)
            .json(
                &serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": method,
                "params": {"_meta": stateless_meta()}}),
            )
            .send()
    };
    let discover = answer(
        &stateless("server/discover")
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    assert!(
        discover["result"]["capabilities"]["prompts"].is_object(),
        "{discover}"
    );
    let listed = answer(
        &stateless("prompts/list")
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    let result = &listed["result"];
    assert_eq!(result["prompts"], serde_json::json!([]), "{listed}");
    assert!(result["ttlMs"].is_u64(), "{listed}");
    assert!(
        ["public", "private"].contains(&result["cacheScope"].as_str().unwrap_or_default()),
        "{listed}"
    );

    let init = http
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .json(
            &serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "raw", "version": "0"}}}),
        )
        .send()
        .await
        .unwrap();
    let session = crate::common::session_id(&init);
    let init = answer(&init.text().await.unwrap());
    assert!(
        init["result"]["capabilities"]["prompts"].is_object(),
        "{init}"
    );
    let in_session = |body: Value| {
        http.post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .json(&body)
            .send()
    };
    in_session(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await
        .unwrap();
    let listed = answer(
        &in_session(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "prompts/list"}))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(
        listed["result"]["prompts"],
        serde_json::json!([]),
        "{listed}"
    );
    behind.stop().await;
}

/// An unknown resource (SEP-2164): on 2026-07-28 -32602 (rmcp maps "resource not found" to it)
/// and on a session -32002, each with the URI in the error's data.
#[tokio::test]
async fn an_unknown_resource_names_its_uri() {
    let behind = Proxied::start().await;
    let url = format!("http://127.0.0.1:{}/mcp", behind.proxy_port);
    let missing = "test://nonexistent";
    let http = reqwest::Client::new();
    let stateless = http
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "resources/read")
        .header("mcp-name", missing)
        .json(
            &serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "resources/read",
            "params": {"uri": missing, "_meta": stateless_meta()}}),
        )
        .send()
        .await
        .unwrap();
    let stateless = answer(&stateless.text().await.unwrap());
    assert_eq!(stateless["error"]["code"], -32602, "{stateless}");
    assert_eq!(stateless["error"]["data"]["uri"], missing, "{stateless}");

    let init = http
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .json(
            &serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "raw", "version": "0"}}}),
        )
        .send()
        .await
        .unwrap();
    let session = crate::common::opened_session(init).await;
    let in_session = |body: Value| {
        http.post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .json(&body)
            .send()
    };
    in_session(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await
        .unwrap();
    let read = answer(
        &in_session(
            serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "resources/read",
            "params": {"uri": missing}}),
        )
        .await
        .unwrap()
        .text()
        .await
        .unwrap(),
    );
    assert_eq!(read["error"]["code"], -32002, "{read}");
    assert_eq!(read["error"]["data"]["uri"], missing, "{read}");
    behind.stop().await;
}
