//! The HTTP transport's hardening, against `smol-mcp-http` as a process and the fake serve: the
//! idle rule (a call in flight keeps its session), the Origin rule, the connection limits, the
//! reply latency on a keep-alive connection, and DELETE's answers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::clients::HttpServer;
use common::fake_serve::FakeServe;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "test-http-token";

async fn spawn(rt: &std::path::Path, fake: &FakeServe, extra: &[(&str, &str)]) -> HttpServer {
    let local_url = fake.url();
    let mut env = vec![("SMOL_LOCAL_URL", local_url.as_str())];
    env.extend_from_slice(extra);
    HttpServer::spawn(rt, TOKEN, &env).await
}

fn post(
    http: &reqwest::Client,
    url: &str,
    session: Option<&str>,
    body: &Value,
) -> reqwest::RequestBuilder {
    let mut r = http
        .post(url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .json(body);
    if let Some(s) = session {
        r = r
            .header("mcp-session-id", s)
            .header("mcp-protocol-version", "2025-06-18");
    }
    r
}

/// The JSON-RPC answer in a reply, whether it came as JSON or as an event stream.
fn answer(text: &str) -> Value {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return v;
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("id").is_some())
        .unwrap_or_else(|| panic!("no JSON-RPC answer in {text:?}"))
}

async fn open_session(http: &reqwest::Client, url: &str) -> String {
    let init = post(http, url, None, &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(init.status(), 200);
    let session = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    init.text().await.unwrap();
    let r = post(
        http,
        url,
        Some(&session),
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .send()
    .await
    .unwrap();
    assert!(r.status().is_success());
    session
}

async fn call(http: &reqwest::Client, url: &str, session: &str, tool: &str, args: Value) -> Value {
    let r = post(
        http,
        url,
        Some(session),
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": tool, "arguments": args}}),
    )
    .send()
    .await
    .unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(status, 200, "{tool}: {text}");
    answer(&text)
}

fn deletes(fake: &FakeServe) -> Vec<String> {
    fake.state
        .lock()
        .unwrap()
        .requests
        .iter()
        .filter(|r| r["method"] == "DELETE")
        .map(|r| r["path"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_call_in_flight_keeps_its_session_and_idle_sessions_are_reaped() {
    let fake = FakeServe::start().await;
    fake.add_machine("kept-a", "running");
    let rt = tempfile::tempdir().unwrap();
    let server = spawn(
        rt.path(),
        &fake,
        &[("SMOL_MCP_HTTP_SESSION_IDLE_SECS", "2")],
    )
    .await;
    let http = reqwest::Client::new();

    let b = open_session(&http, &server.url).await;
    let created = call(
        &http,
        &server.url,
        &b,
        "create-machine",
        json!({"image": "alpine"}),
    )
    .await;
    let ephemeral = created["result"]["structuredContent"]["machine"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();

    fake.state.lock().unwrap().exec_delay = Some(Duration::from_secs(6));
    let a = open_session(&http, &server.url).await;
    let started = Instant::now();
    let long = {
        let (http, url, a) = (http.clone(), server.url.clone(), a.clone());
        tokio::spawn(async move {
            call(
                &http,
                &url,
                &a,
                "run-command",
                json!({"name": "kept-a", "command": ["sleep", "6"]}),
            )
            .await
        })
    };
    // B sends nothing more: it is reaped, and its machine deleted, while A's call runs.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !deletes(&fake).iter().any(|p| p.ends_with(&ephemeral)) {
        assert!(
            Instant::now() < deadline,
            "the idle session B was not reaped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!fake.state.lock().unwrap().machines.contains_key(&ephemeral));
    let result = long.await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(6));
    assert_eq!(result["result"]["isError"], false, "{result}");
    assert_eq!(
        result["result"]["structuredContent"]["stdout"], "ok\n",
        "{result}"
    );
    // A was not closed under its call: it still answers.
    let listed = call(&http, &server.url, &a, "list-machines", json!({})).await;
    assert_eq!(listed["result"]["isError"], false, "{listed}");
    let r = post(
        &http,
        &server.url,
        Some(&b),
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 404, "B is gone");
}

#[tokio::test]
async fn a_present_origin_must_be_allowed() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let server = spawn(rt.path(), &fake, &[]).await;
    let http = reqwest::Client::new();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}});
    let r = post(&http, &server.url, None, &init)
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["jsonrpc"], "2.0");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Origin")
    );
    let r = http
        .post(&server.url)
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "the token is checked first");
    let r = post(&http, &server.url, None, &init).send().await.unwrap();
    assert_eq!(r.status(), 200, "no Origin: a non-browser client");
    for own in ["http://127.0.0.1", "http://localhost", "http://[::1]"] {
        let r = post(&http, &server.url, None, &init)
            .header("origin", format!("{own}:{}", server.port))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{own}: the listener's own origin");
    }
    let r = post(&http, &server.url, None, &init)
        .header("origin", "http://127.0.0.1:1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "another port is another origin");

    for (list, origin, status) in [
        ("", format!("http://127.0.0.1:{}", 0), 403),
        ("https://app.example", "https://app.example".to_owned(), 200),
        ("https://app.example", "http://app.example".to_owned(), 403),
    ] {
        let rt = tempfile::tempdir().unwrap();
        let server = spawn(rt.path(), &fake, &[("SMOL_MCP_HTTP_ALLOWED_ORIGINS", list)]).await;
        let origin = origin.replace(":0", &format!(":{}", server.port));
        let r = post(&http, &server.url, None, &init)
            .header("origin", &origin)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "list {list:?}, origin {origin}");
    }
}

async fn read_all(stream: &mut TcpStream, within: Duration) -> Option<String> {
    let mut buf = Vec::new();
    tokio::time::timeout(within, stream.read_to_end(&mut buf))
        .await
        .ok()
        .map(|_| String::from_utf8_lossy(&buf).into_owned())
}

#[tokio::test]
async fn connections_are_bounded_and_timed_out() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let server = spawn(
        rt.path(),
        &fake,
        &[
            ("SMOL_MCP_HTTP_MAX_CONNECTIONS", "8"),
            ("SMOL_MCP_HTTP_HEADER_TIMEOUT_SECS", "2"),
        ],
    )
    .await;
    // A half-sent request is closed after the header timeout.
    let mut half = TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    half.write_all(b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let closed = read_all(&mut half, Duration::from_secs(6)).await;
    assert!(closed.is_some(), "a half-sent request was not closed");
    assert!(started.elapsed() >= Duration::from_millis(1500));
    drop(half);
    tokio::time::sleep(Duration::from_millis(100)).await;

    // The limit's worth of idle connections, then one more: 503 at once.
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(
            TcpStream::connect(("127.0.0.1", server.port))
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut extra = TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    extra
        .write_all(b"GET /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let refused = read_all(&mut extra, Duration::from_secs(1))
        .await
        .expect("no answer past the limit");
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.to_ascii_lowercase().contains("retry-after: 1"),
        "{refused}"
    );
    assert!(refused.contains("too many connections"), "{refused}");

    // Released, a valid request works again.
    drop(idle);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let http = reqwest::Client::new();
    open_session(&http, &server.url).await;
}

#[tokio::test]
async fn replies_on_a_keep_alive_connection_do_not_wait_for_nagle() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let server = spawn(rt.path(), &fake, &[]).await;
    let http = reqwest::Client::new();
    let session = open_session(&http, &server.url).await;
    let list = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"});
    // One warm-up, then the measure.
    post(&http, &server.url, Some(&session), &list)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut times = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let r = post(&http, &server.url, Some(&session), &list)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        times.push(started.elapsed());
        assert!(answer(&text)["result"]["tools"].is_array());
    }
    times.sort();
    let median = times[times.len() / 2];
    assert!(
        median < Duration::from_millis(15),
        "median {median:?} of {times:?}"
    );
}

#[tokio::test]
async fn delete_answers_404_for_unknown_sessions_and_200_for_a_good_one() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let server = spawn(rt.path(), &fake, &[]).await;
    let http = reqwest::Client::new();
    let delete = |session: Option<&str>| {
        let mut r = http
            .delete(&server.url)
            .bearer_auth(TOKEN)
            .header("mcp-protocol-version", "2025-06-18");
        if let Some(s) = session {
            r = r.header("mcp-session-id", s);
        }
        r.send()
    };
    assert_eq!(delete(None).await.unwrap().status(), 404, "no session id");
    assert_eq!(delete(Some("no-such-session")).await.unwrap().status(), 404);

    let session = open_session(&http, &server.url).await;
    let created = call(
        &http,
        &server.url,
        &session,
        "create-machine",
        json!({"image": "alpine"}),
    )
    .await;
    let ephemeral = created["result"]["structuredContent"]["machine"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    let r = delete(Some(&session)).await.unwrap();
    assert_eq!(r.status(), 200, "what the Python client expects");
    let deadline = Instant::now() + Duration::from_secs(10);
    while fake.state.lock().unwrap().machines.contains_key(&ephemeral) {
        assert!(
            Instant::now() < deadline,
            "the ended session's machine was not deleted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        delete(Some(&session)).await.unwrap().status(),
        404,
        "already ended"
    );
}
