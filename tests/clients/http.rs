//! The Streamable HTTP server as a process: the token and path guard, Host validation, and the
//! official Python MCP client over HTTP, whose session end deletes the session's machines.

use crate::common::clients::{HTTP_SERVER, HttpServer, run_python};
use crate::common::fake_serve::FakeServe;
use crate::common::real_serve::free_port;
use crate::common::stdio::server_env;
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::Command;

const TOKEN: &str = "test-http-token";

async fn spawn(rt: &std::path::Path, local_url: &str) -> HttpServer {
    HttpServer::spawn(rt, TOKEN, &[("SMOL_LOCAL_URL", local_url)]).await
}

async fn python_http(url: &str, mode: &str, calls: Value) -> Value {
    let plan = json!({"url": url, "token": TOKEN, "mode": mode, "calls": calls});
    run_python("tool_plan.py", &plan).await
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn flags_take_either_form() {
    let rt = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = Command::new(HTTP_SERVER)
        .args([format!("--port={port}").as_str(), "--path", "/elsewhere"])
        .env_clear()
        .envs(server_env(rt.path(), &[("SMOL_MCP_AUTH_TOKEN", TOKEN)]))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let start = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(start.elapsed() < Duration::from_secs(10), "not listening");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/mcp"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert!(r.text().await.unwrap().contains("it is at /elsewhere"));
    child.start_kill().unwrap();
    child.wait().await.unwrap();

    for (args, message) in [
        (
            ["--port", "0"],
            "--port must be a port from 1 to 65535, got 0",
        ),
        (["--path", "mcp"], "--path must start with a slash, got mcp"),
    ] {
        let out = Command::new(HTTP_SERVER)
            .args(args)
            .env_clear()
            .envs(server_env(rt.path(), &[("SMOL_MCP_AUTH_TOKEN", TOKEN)]))
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains(message));
    }
    let out = Command::new(HTTP_SERVER)
        .arg("--help")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--port <PORT>"), "{help}");
    assert!(
        help.contains("SMOLVM_VM_UID_DROP=off") && help.contains("else smolvm on PATH"),
        "{help}"
    );
}

#[tokio::test]
async fn refuses_to_start_without_a_token() {
    let rt = tempfile::tempdir().unwrap();
    let out = Command::new(HTTP_SERVER)
        .env_clear()
        .envs(server_env(rt.path(), &[]))
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    insta::assert_snapshot!(String::from_utf8_lossy(&out.stderr), @"smol-mcp-http: the HTTP transport requires SMOL_MCP_AUTH_TOKEN or SMOL_MCP_AUTH_ISSUER: these tools create and run virtual machines, so an unauthenticated listener is a remote shell");
    // A sign-in setting that cannot work is refused at start, naming it, not at the first user.
    let out = Command::new(HTTP_SERVER)
        .env_clear()
        .envs(server_env(
            rt.path(),
            &[("SMOL_MCP_AUTH_ISSUER", "http://id.example")],
        ))
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    insta::assert_snapshot!(String::from_utf8_lossy(&out.stderr), @r#"smol-mcp-http: authIssuer: "http://id.example": an https URL without query or fragment (http only on loopback)"#);
}

#[tokio::test]
async fn the_guard_answers_before_anything_else() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let server = spawn(rt.path(), &fake.url()).await;
    let http = reqwest::Client::new();
    let post = |url: String| {
        http.post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body("{}")
    };
    let r = post(server.url.clone()).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let r = post(server.url.replace("/mcp", "/elsewhere"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        401,
        "without the token even the path is not revealed"
    );
    let r = post(server.url.clone())
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = post(server.url.replace("/mcp", "/elsewhere"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.text().await.unwrap().contains("it is at /mcp"));
    let r = post(server.url.clone())
        .bearer_auth(TOKEN)
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "DNS-rebinding protection");
    let r = post(server.url.clone())
        .header("x-smol-mcp-token", TOKEN)
        .bearer_auth("smk_account_key")
        .send()
        .await
        .unwrap();
    assert_ne!(
        r.status(),
        401,
        "x-smol-mcp-token is accepted beside another authorization"
    );
}

#[tokio::test]
async fn python_client_sessions_over_http_clean_up_when_they_end() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let mut server = spawn(rt.path(), &fake.url()).await;
    for mode in ["legacy", "auto"] {
        let report = python_http(
            &server.url,
            mode,
            json!([
                {"tool": "create-machine", "args": {"image": "alpine", "name": format!("mcp-{mode}")}},
                {"tool": "create-machine", "args": {"image": "alpine", "name": format!("kept-{mode}")}},
                {"tool": "run-command", "args": {"name": format!("mcp-{mode}"), "command": ["echo", mode]}},
                {"tool": "list-machines"}
            ]),
        )
        .await;
        assert_eq!(
            report["tools"].as_array().unwrap().len(),
            crate::common::offered_without_settings()
        );
        let calls = report["calls"].as_array().unwrap();
        assert!(
            calls.iter().all(|c| c["isError"] == false),
            "{mode}: {calls:?}"
        );
        assert_eq!(
            calls[2]["structured"]["stdout"],
            format!("{mode}\n"),
            "the machine outlived the call that made it"
        );
        if mode == "legacy" {
            until(
                &format!("{mode}: the ended session's machine is deleted"),
                || {
                    !fake
                        .state
                        .lock()
                        .unwrap()
                        .machines
                        .contains_key(&format!("mcp-{mode}"))
                },
            )
            .await;
        } else {
            // auto settles on 2026-07-28, which has no session: the machine belongs to the
            // server under a lease (lifecycles.rs covers its expiry), so the client leaving
            // does not delete it; stopping the server does, below.
            let record = std::fs::read_to_string(rt.path().join("rt/ephemeral.json")).unwrap();
            let record: Value = serde_json::from_str(&record).unwrap();
            let entry = &record["machines"].as_array().unwrap()[0];
            assert_eq!(entry["name"], "mcp-auto");
            assert!(entry["lease"]["lastUsed"].is_u64(), "{entry}");
        }
        assert!(
            fake.state
                .lock()
                .unwrap()
                .machines
                .contains_key(&format!("kept-{mode}"))
        );
    }

    // A session still open when the server is stopped is cleaned up by the stop: opened by
    // hand, never closed.
    let http = reqwest::Client::new();
    let rpc = |session: Option<String>, body: Value| {
        let mut r = http
            .post(&server.url)
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(s) = session {
            r = r
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", "2025-06-18");
        }
        r.send()
    };
    let init = rpc(None, json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}))
        .await
        .unwrap();
    let session = crate::common::opened_session(init).await;
    rpc(
        Some(session.clone()),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await
    .unwrap();
    let created = rpc(
        Some(session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "create-machine", "arguments": {"image": "alpine", "name": "mcp-open"}}}),
    )
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(created.contains("\"ready\":true"), "{created}");
    assert!(fake.has_machine("mcp-open"));
    let pid = nix::unistd::Pid::from_raw(server.child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(15), server.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0), "a clean stop exits 0");
    let left: Vec<String> = fake.machine_names();
    assert_eq!(
        left,
        ["kept-auto", "kept-legacy"],
        "the stop deleted the open session's machine and the leased one"
    );
}

/// SIGHUP (a closed terminal, a supervisor's reload) stops the HTTP server as SIGTERM does: the
/// open session's ephemeral machine is deleted and the process exits 0.
#[tokio::test]
async fn sighup_stops_the_server_cleanly_deleting_the_sessions_machines() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let mut server = spawn(rt.path(), &fake.url()).await;
    let http = reqwest::Client::new();
    let post = |session: Option<&str>, body: Value| {
        let mut r = http
            .post(&server.url)
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(s) = session {
            r = r
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", "2025-06-18");
        }
        r.send()
    };
    let init = post(None, json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}))
        .await
        .unwrap();
    let session = crate::common::opened_session(init).await;
    post(
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await
    .unwrap();
    let created = post(
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "create-machine", "arguments": {"image": "alpine", "name": "mcp-hup"}}}),
    )
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(created.contains("\"ready\":true"), "{created}");
    let pid = nix::unistd::Pid::from_raw(server.child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(15), server.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0), "{status}");
    assert!(
        !fake.has_machine("mcp-hup"),
        "the session's machine is deleted"
    );
}
