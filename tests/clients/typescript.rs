//! The server under the other real MCP clients, pinned in tests/clients/package.json: the
//! official TypeScript SDK (which validates every structured result against the tool's output
//! schema) over stdio and over HTTP, and the Inspector CLI's strict schema lint.

use crate::common::clients::{HttpServer, clients_dir, env_object, run_node};
use crate::common::fake_serve::FakeServe;
use crate::common::stdio::{SERVER, server_env};
use serde_json::{Value, json};

async fn ts_plan(plan: Value) -> Value {
    run_node("ts_plan.mjs", &plan).await
}

fn worked_flow() -> Value {
    json!([
        {"tool": "create-machine", "args": {"image": "alpine", "name": "mcp-ts"}},
        {"tool": "list-machines", "args": {"name": "mcp-ts"}},
        {"tool": "run-command", "args": {"name": "mcp-ts", "command": "exit 5"}},
        {"tool": "write-file", "args": {"name": "mcp-ts", "path": "/a.txt", "content": "hello"}},
        {"tool": "read-file", "args": {"name": "mcp-ts", "path": "/a.txt", "offset": 1, "length": 3}},
        {"tool": "pull-image", "args": {"name": "mcp-ts", "image": "alpine:3.20"}},
        {"tool": "stop-machine", "args": {"name": "mcp-ts"}},
        {"tool": "delete-machine", "args": {"name": "mcp-ts"}},
        {"tool": "list-machines", "args": {"name": "mcp-ts"}}
    ])
}

fn check_worked_flow(report: &Value) {
    assert_eq!(report["server"], "smol-mcp");
    assert_eq!(
        report["tools"].as_array().unwrap().len(),
        crate::common::offered_without_settings()
    );
    let c = report["calls"].as_array().unwrap();
    // Every structured result passed the SDK's output-schema validation, or it would be an error.
    for (i, call) in c[..8].iter().enumerate() {
        assert_eq!(call["isError"], false, "call {i}: {}", call["text"]);
    }
    assert_eq!(
        c[1]["structured"]["machines"][0]["url"],
        Value::Null,
        "nullable fields validate as null"
    );
    assert_eq!(c[2]["structured"]["exitCode"], 5);
    assert_eq!(
        c[4]["text"].as_str().unwrap().split_once('\n').unwrap().1,
        "ell",
        "the page is the second block"
    );
    assert!(c[4]["structured"].get("content").is_none());
    assert!(c[8]["text"].as_str().unwrap().starts_with("NOT_FOUND"));
}

#[tokio::test]
async fn typescript_sdk_over_stdio() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let env = server_env(rt.path(), &[("SMOL_LOCAL_URL", &fake.url())]);
    let report =
        ts_plan(json!({"server": SERVER, "env": env_object(env), "calls": worked_flow()})).await;
    check_worked_flow(&report);
}

#[tokio::test]
async fn typescript_sdk_over_http() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let token = "ts-http-token";
    let mut server = HttpServer::spawn(rt.path(), token, &[("SMOL_LOCAL_URL", &fake.url())]).await;
    let report = ts_plan(json!({"url": server.url, "token": token, "calls": worked_flow()})).await;
    check_worked_flow(&report);
    server.child.start_kill().unwrap();
    server.child.wait().await.unwrap();
}

#[tokio::test]
async fn the_inspector_cli_finds_the_schemas_portable() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let dir = clients_dir();
    let mut command = tokio::process::Command::new(dir.join("node_modules/.bin/mcp-inspector"));
    command.arg("--cli").arg(SERVER);
    for (k, v) in server_env(rt.path(), &[("SMOL_LOCAL_URL", &fake.url())]) {
        command.arg("-e").arg(format!("{k}={v}"));
    }
    // The Inspector keeps its own files under HOME.
    let out = command
        .args(["--method", "tools/list", "--strict"])
        .env("HOME", rt.path())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the strict lint failed: {stderr}");
    assert!(
        !stderr.contains("Warning:") && !stderr.contains("Error:"),
        "{stderr}"
    );
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        listed["tools"].as_array().unwrap().len(),
        crate::common::offered_without_settings()
    );

    let mut command = tokio::process::Command::new(dir.join("node_modules/.bin/mcp-inspector"));
    command.arg("--cli").arg(SERVER);
    for (k, v) in server_env(rt.path(), &[("SMOL_LOCAL_URL", &fake.url())]) {
        command.arg("-e").arg(format!("{k}={v}"));
    }
    let out = command
        .args([
            "--method",
            "tools/call",
            "--tool-name",
            "run-once",
            "--tool-arg",
            "image=alpine",
            "--tool-arg",
            "command=echo inspected",
        ])
        .env("HOME", rt.path())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let called: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(called["structuredContent"]["exitCode"], 0, "{called}");
    assert!(fake.has_no_machines(), "run-once left nothing");
}
