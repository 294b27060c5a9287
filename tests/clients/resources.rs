//! Resources and log following under the real MCP clients: the TypeScript SDK on the session
//! lifecycle (resources/subscribe, unsubscribe) and the Python client in its default mode
//! (2026-07-28, subscriptions/listen), each over stdio and over HTTP, against the fake serve.
//! The scripts (tests/clients/resources_ts.mjs, resources_py.py) print one JSON line a step and
//! wait for "pushed" after the test wrote a log line.

use crate::common::clients::{HttpServer, clients_dir, env_object, python};
use crate::common::fake_serve::FakeServe;
use crate::common::stdio::{SERVER, server_env, spawn_speaking};
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

const URI: &str = "smol://machine/local/box/logs";

fn log_polls(fake: &FakeServe) -> usize {
    fake.take_requests()
        .iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.ends_with("/logs")))
        .count()
}

/// Waits until the fake has seen no log poll for longer than the server's poll interval (1 s),
/// and answers how long that took; fails if polling never stops.
async fn polling_stops(fake: &FakeServe) -> Duration {
    let start = Instant::now();
    let mut quiet_since = Instant::now();
    log_polls(fake);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if log_polls(fake) > 0 {
            quiet_since = Instant::now();
        }
        if quiet_since.elapsed() > Duration::from_millis(1600) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the server never stopped polling the log"
        );
    }
}

/// A server over HTTP on a free port, with the fake serve as its local fleet.
struct Served {
    server: HttpServer,
    token: &'static str,
    _rt: tempfile::TempDir,
}

async fn http_server(fake: &FakeServe) -> Served {
    let rt = tempfile::tempdir().unwrap();
    let token = "resources-token";
    let server = HttpServer::spawn(rt.path(), token, &[("SMOL_LOCAL_URL", &fake.url())]).await;
    Served {
        server,
        token,
        _rt: rt,
    }
}

/// Runs one client script through its steps: subscribe, a new line, the update, unsubscribe
/// (or the end of the listen), polling stopped, another line, no update. Answers the steps.
async fn follow_with(mut command: tokio::process::Command, fake: &FakeServe) -> Vec<Value> {
    fake.add_machine("box", "running");
    fake.push_log("box", "before the subscription");
    let (mut child, mut stdin, mut lines) = spawn_speaking(&mut command, Stdio::inherit());
    let mut steps = Vec::new();
    let mut next = async || -> Value {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the client answers within 30 s")
            .unwrap()
            .expect("the client ended early");
        serde_json::from_str(&line).unwrap()
    };
    let targets = next().await;
    assert_eq!(targets["step"], "targets", "{targets}");
    steps.push(targets);
    let subscribed = next().await;
    assert_eq!(subscribed["step"], "subscribed", "{subscribed}");
    steps.push(subscribed);
    // rmcp acknowledges a listen before the handler runs, so the server's first poll (what
    // is already in the log) can come after the acknowledgment: a line written in between
    // would count as old. Two polls mean the first one has answered.
    let mut polls = 0;
    let start = Instant::now();
    while polls < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the server never polled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        polls += log_polls(fake);
    }
    fake.push_log("box", "a new line");
    stdin.write_all(b"pushed\n").await.unwrap();
    let updated = next().await;
    assert_eq!(updated["step"], "updated", "{updated}");
    steps.push(updated);
    let unsubscribed = next().await;
    assert_eq!(unsubscribed["step"], "unsubscribed", "{unsubscribed}");
    steps.push(unsubscribed);
    polling_stops(fake).await;
    fake.push_log("box", "a line nobody follows");
    stdin.write_all(b"pushed\n").await.unwrap();
    let after = next().await;
    assert_eq!(after["step"], "after", "{after}");
    steps.push(after);
    assert_eq!(log_polls(fake), 0, "no polling once nobody is subscribed");
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("the client exits")
        .unwrap();
    assert!(status.success(), "the client failed: {status}");
    steps
}

fn check(steps: &[Value]) {
    let targets = &steps[0]["targets"];
    assert_eq!(targets["mode"], "local", "{targets}");
    assert_eq!(
        targets["fleets"][0]["serve"]["answering"], true,
        "{targets}"
    );
    assert_eq!(
        steps[2]["updates"],
        json!([URI]),
        "one update for the new line"
    );
    assert_eq!(steps[4]["updates"], json!([]), "none once unsubscribed");
}

fn ts(plan: Value) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("node");
    command
        .arg(clients_dir().join("resources_ts.mjs"))
        .arg(plan.to_string());
    command
}

fn py(plan: Value) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(python());
    command
        .arg(clients_dir().join("resources_py.py"))
        .arg(plan.to_string());
    command
}

#[tokio::test]
async fn typescript_sdk_follows_a_log_over_stdio() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let env = server_env(rt.path(), &[("SMOL_LOCAL_URL", &fake.url())]);
    let plan = json!({"server": SERVER, "env": env_object(env), "uri": URI});
    check(&follow_with(ts(plan), &fake).await);
}

#[tokio::test]
async fn typescript_sdk_follows_a_log_over_http() {
    let fake = FakeServe::start().await;
    let mut served = http_server(&fake).await;
    let plan = json!({"url": served.server.url, "token": served.token, "uri": URI});
    check(&follow_with(ts(plan), &fake).await);
    served.server.child.start_kill().unwrap();
    served.server.child.wait().await.unwrap();
}

#[tokio::test]
async fn typescript_sdk_ending_its_http_session_stops_the_polling() {
    let fake = FakeServe::start().await;
    let mut served = http_server(&fake).await;
    let plan =
        json!({"url": served.server.url, "token": served.token, "uri": URI, "endSession": true});
    check(&follow_with(ts(plan), &fake).await);
    served.server.child.start_kill().unwrap();
    served.server.child.wait().await.unwrap();
}

#[tokio::test]
async fn python_client_listens_to_a_log_over_stdio() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let env = server_env(rt.path(), &[("SMOL_LOCAL_URL", &fake.url())]);
    let plan = json!({"server": SERVER, "env": env_object(env), "uri": URI});
    let steps = follow_with(py(plan), &fake).await;
    assert_eq!(steps[0]["protocol"], "2026-07-28", "the default mode");
    assert_eq!(steps[1]["honored"], json!([URI]));
    check(&steps);
}

#[tokio::test]
async fn python_client_listens_to_a_log_over_http() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let token = "resources-token";
    // The log as an operator sees it: the default filter, not the tests' SMOL_MCP_LOG.
    let mut server = HttpServer::spawn_with(
        rt.path(),
        token,
        &[("SMOL_LOCAL_URL", &fake.url())],
        |command| {
            command.env_remove("SMOL_MCP_LOG").stderr(Stdio::piped());
        },
    )
    .await;
    let plan = json!({"url": server.url, "token": token, "uri": URI});
    let steps = follow_with(py(plan), &fake).await;
    assert_eq!(steps[0]["protocol"], "2026-07-28", "the default mode");
    check(&steps);
    server.child.start_kill().unwrap();
    let log = server.child.wait_with_output().await.unwrap().stderr;
    let log = String::from_utf8_lossy(&log);
    assert!(
        log.contains("listening for MCP over HTTP"),
        "the server's log was read: {log}"
    );
    // rmcp's "failed to send pending response during drain", a dozen times a session.
    assert!(
        !log.lines()
            .any(|l| l.contains("ERROR") && l.contains("during drain")),
        "a client ending its listen is no error: {log}"
    );
}
