//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned with the
//! Node 22 it needs in tests/conformance/package.json) against `smol-mcp-http` on the local
//! fleet (the fake serve), for both protocol lifecycles: `--spec-version 2025-11-25` (sessions)
//! and `2026-07-28` (stateless).
//!
//! The suite cannot send a bearer token, and the server has no unauthenticated mode, so the
//! suite talks to a loopback proxy in this file that adds `Authorization: Bearer <token>` and
//! forwards everything else as it came (Host, Origin, header case, bodies and event streams
//! unbuffered). The scenarios that need the suite's reference-server fixtures (its `test_*`
//! tools, prompts and resources) are in tests/conformance/expected-failures-<version>.yaml,
//! each with its reason; the suite fails the run on a failure not listed there and on a listed
//! one that now passes (a stale entry), and so does this test.

use crate::common::fake_serve::FakeServe;
use crate::common::real_serve::free_port;
use crate::common::stdio::server_env;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;
use tokio::sync::Mutex;

const HTTP_SERVER: &str = env!("CARGO_BIN_EXE_smol-mcp-http");
const TOKEN: &str = "conformance-token";
const BEARER: &str = "Bearer conformance-token";

/// The fixture-free scenarios: each must run and pass in full. One may stand
/// in the baseline only with a reason that starts `awaiting-merge:` (a capability not merged
/// yet); the suite reports it stale once it passes, which fails this
/// test until the entry is removed.
const MUST_PASS_2025_11_25: &[&str] = &[
    "server-initialize",
    "server-session-lifecycle",
    "ping",
    "logging-set-level",
    "tools-list",
    "resources-list",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
];
const MUST_PASS_2026_07_28: &[&str] = &[
    "tools-list",
    "resources-list",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
    "caching",
    "http-header-validation",
];

/// The upstream connection of one client connection: HTTP/1.1 answers requests on a connection
/// in order, so one upstream connection per client connection keeps that order.
async fn forward(
    upstream: SocketAddr,
    connection: &Mutex<Option<SendRequest<Incoming>>>,
    mut request: Request<Incoming>,
) -> std::io::Result<Response<Incoming>> {
    request.headers_mut().insert(
        hyper::header::AUTHORIZATION,
        hyper::header::HeaderValue::from_static(BEARER),
    );
    let mut slot = connection.lock().await;
    if slot.as_ref().is_none_or(SendRequest::is_closed) {
        let stream = TcpStream::connect(upstream).await?;
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .preserve_header_case(true)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        *slot = Some(sender);
    }
    let sender = slot
        .as_mut()
        .ok_or_else(|| std::io::Error::other("no upstream connection"))?;
    sender.ready().await.map_err(std::io::Error::other)?;
    // The response future owns what it needs: the lock is let go before the answer, whose body
    // streams through as the server writes it (an event stream stays open).
    let response = sender.send_request(request);
    drop(slot);
    response.await.map_err(std::io::Error::other)
}

/// A loopback proxy that adds the bearer token to every request and changes nothing else.
fn token_proxy(listener: TcpListener, upstream: SocketAddr) {
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                let connection = Arc::new(Mutex::new(None));
                let service = hyper::service::service_fn(move |request| {
                    let connection = connection.clone();
                    async move { forward(upstream, &connection, request).await }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .preserve_header_case(true)
                    .serve_connection(TokioIo::new(inbound), service)
                    .await;
            });
        }
    });
}

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

fn conformance_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
    assert!(
        dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js")
            .exists()
            && dir.join("node_modules/.bin/node").exists(),
        "the conformance suite is not installed: run scripts/test.sh"
    );
    dir
}

/// The baseline's entries and the reason written above each (the comment lines directly
/// before it). The suite reads the same file; it ignores comments.
fn baseline(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut entries = BTreeMap::new();
    let mut reason = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(comment) = line.strip_prefix('#') {
            reason.push(comment.trim().to_owned());
        } else if let Some(entry) = line.strip_prefix("- ") {
            let reason = std::mem::take(&mut reason).join(" ");
            assert!(
                !reason.is_empty(),
                "{}: the entry {entry} has no reason: write it as a comment above the entry",
                path.display()
            );
            entries.insert(entry.trim().to_owned(), reason);
        } else {
            reason.clear();
        }
    }
    entries
}

/// The baseline's entries for a scenario: the whole scenario, or one check of it
/// (`<scenario>:<check-id>`).
fn entries_of<'a>(
    expected: &'a BTreeMap<String, String>,
    scenario: &'a str,
) -> impl Iterator<Item = (&'a String, &'a String)> {
    expected.iter().filter(move |(entry, _)| {
        entry.split_once(':').map_or(entry.as_str(), |(s, _)| s) == scenario
    })
}

/// Each scenario's checks as the suite wrote them with `-o`:
/// `<dir>/server-<scenario>-<time>/checks.json`.
fn results(dir: &Path) -> BTreeMap<String, Vec<Value>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let checks = path.join("checks.json");
        if !checks.exists() {
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // The suite appends `-<ISO time with dashes>Z` to the scenario's name.
        let is_time = |rest: &[u8]| {
            rest.len() > 11
                && rest[1..5].iter().all(u8::is_ascii_digit)
                && rest[5] == b'-'
                && rest[11] == b'T'
        };
        let end = (0..name.len())
            .find(|&i| name.as_bytes()[i] == b'-' && is_time(&name.as_bytes()[i..]))
            .unwrap_or(name.len());
        let scenario = &name[..end];
        let scenario = scenario
            .strip_prefix("server-")
            .unwrap_or(scenario)
            .to_owned();
        let checks: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(checks).unwrap()).unwrap();
        out.insert(scenario, checks);
    }
    out
}

fn count(checks: &[Value], status: &str) -> usize {
    checks.iter().filter(|c| c["status"] == status).count()
}

async fn run_suite(spec_version: &str, must_pass: &[&str]) {
    let dir = conformance_dir();
    let baseline_path = dir.join(format!("expected-failures-{spec_version}.yaml"));
    let expected = baseline(&baseline_path);
    for scenario in must_pass {
        for (entry, reason) in entries_of(&expected, scenario) {
            assert!(
                reason.starts_with("awaiting-merge:"),
                "{scenario} needs no fixture and must pass, but the baseline expects {entry} to fail: {reason}"
            );
        }
    }

    let behind = Proxied::start().await;
    let proxy_port = behind.proxy_port;

    let out_dir = tempfile::tempdir().unwrap();
    let suite = Command::new(dir.join("node_modules/.bin/node"))
        .arg(dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js"))
        .args(["server", "--url"])
        .arg(format!("http://127.0.0.1:{proxy_port}/mcp"))
        // All the scenarios of the version, not only the default "active" set, which leaves
        // out the pending ones (caching, http-header-validation, server-sse-polling among them).
        .args(["--suite", "all", "--spec-version", spec_version])
        .arg("--expected-failures")
        .arg(&baseline_path)
        .arg("-o")
        .arg(out_dir.path())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let suite = tokio::time::timeout(Duration::from_secs(900), suite)
        .await
        .expect("the conformance suite did not finish in 15 minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&suite.stdout);
    let results = results(out_dir.path());

    // The table: every scenario the suite ran, whether it passed, and whether the baseline
    // expects it to fail.
    let mut table = format!("conformance, --spec-version {spec_version}:\n");
    for (scenario, checks) in &results {
        let clean = count(checks, "FAILURE") == 0 && count(checks, "WARNING") == 0;
        table.push_str(&format!(
            "  {} {scenario}: {} passed, {} failed, {} warnings{}\n",
            if clean { "pass" } else { "FAIL" },
            count(checks, "SUCCESS"),
            count(checks, "FAILURE"),
            count(checks, "WARNING"),
            if entries_of(&expected, scenario).next().is_some() {
                " (expected: in the baseline)"
            } else {
                ""
            }
        ));
        for check in checks
            .iter()
            .filter(|c| c["status"] == "FAILURE" || c["status"] == "WARNING")
        {
            let message = check["errorMessage"].as_str().unwrap_or_default();
            let message: String = message.chars().take(300).collect();
            table.push_str(&format!(
                "      {}: {message}\n",
                check["id"].as_str().unwrap_or("?")
            ));
        }
    }
    eprintln!("{table}");
    // The suite's verdict: stale entries and unexpected failures, after the expected ones.
    let verdict = [
        "Stale baseline entries",
        "Unexpected failures",
        "Expected failures",
    ]
    .iter()
    .find_map(|heading| stdout.find(heading))
    .map_or(stdout.as_ref(), |at| &stdout[at..]);
    assert!(
        suite.status.success(),
        "the conformance suite failed against its baseline {} (a new failure, or a stale entry \
         that now passes and must be removed):\n{verdict}\n{}",
        baseline_path.display(),
        String::from_utf8_lossy(&suite.stderr)
    );
    for scenario in must_pass {
        let checks = results
            .get(*scenario)
            .unwrap_or_else(|| panic!("the suite did not run {scenario}:\n{table}"));
        // An awaiting-merge entry is the only excuse, and the suite holds it to what it names.
        if entries_of(&expected, scenario).next().is_some() {
            continue;
        }
        assert!(
            count(checks, "SUCCESS") > 0
                && count(checks, "FAILURE") == 0
                && count(checks, "WARNING") == 0,
            "{scenario} must pass in full: {checks:#?}"
        );
    }
    for entry in expected.keys() {
        let (scenario, check) = entry.split_once(':').unwrap_or((entry, ""));
        let checks = results.get(scenario).unwrap_or_else(|| {
            panic!(
                "the baseline names {scenario}, which the suite no longer runs for {spec_version}"
            )
        });
        assert!(
            check.is_empty() || checks.iter().any(|c| c["id"] == check),
            "the baseline names {entry}, a check {scenario} no longer makes"
        );
    }
    behind.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_suite_on_the_session_lifecycle() {
    run_suite("2025-11-25", MUST_PASS_2025_11_25).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_suite_on_the_stateless_lifecycle() {
    run_suite("2026-07-28", MUST_PASS_2026_07_28).await;
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
    let session = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
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
    let session = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    init.text().await.unwrap();
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
