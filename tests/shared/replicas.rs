//! Server processes given one database (`storeUrl`) answer as one, each with a runtime
//! directory of its own (nothing shared but the database): a keyed call answered by one is
//! replayed by another without reaching the engine again, and a run made through one is listed
//! by another. A server refuses to start on a database whose schema is newer than it knows.

use super::database::TestDatabase;
use crate::common::clients::{HTTP_SERVER, HttpServer, stateless_request};
use crate::common::fake_serve::FakeServe;
use crate::common::stdio::server_env;
use serde_json::{Value, json};
use std::time::Duration;

const TOKEN: &str = "replicas-token";

fn creates(fake: &FakeServe) -> usize {
    fake.take_requests()
        .iter()
        .filter(|r| r["method"] == "POST" && r["path"] == "/api/v1/machines")
        .count()
}

async fn call(server: &HttpServer, tool: &str, args: Value) -> Value {
    let answer = stateless_request(
        server,
        TOKEN,
        "tools/call",
        json!({}),
        json!({"name": tool, "arguments": args}),
    )
    .await;
    answer["result"].clone()
}

#[tokio::test]
async fn a_key_answered_through_one_process_replays_through_another() {
    let db = TestDatabase::new().await;
    let fake = FakeServe::start_guest_shell().await;
    let (rt_a, rt_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = [
        ("SMOL_LOCAL_URL", fake.url()),
        ("SMOL_MCP_STORE_URL", db.url.clone()),
    ];
    let vars: Vec<(&str, &str)> = store.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = HttpServer::spawn(rt_a.path(), TOKEN, &vars).await;
    let b = HttpServer::spawn(rt_b.path(), TOKEN, &vars).await;

    let create = json!({"name": "shared-box", "image": "alpine", "idempotencyKey": "make-1"});
    let first = call(&a, "create-machine", create.clone()).await;
    assert_eq!(first["isError"], false, "{first}");
    assert_eq!(creates(&fake), 1);
    let again = call(&b, "create-machine", create).await;
    assert_eq!(again["isError"], false, "{again}");
    assert_eq!(
        again["structuredContent"]["machine"]["name"], "shared-box",
        "{again}"
    );
    assert_eq!(
        creates(&fake),
        0,
        "the repeat through b did nothing: {again}"
    );
    // The same key with other arguments, through b, is refused as another call.
    let other = call(
        &b,
        "create-machine",
        json!({"name": "other-box", "image": "alpine", "idempotencyKey": "make-1"}),
    )
    .await;
    assert_eq!(other["isError"], true, "{other}");
    assert_eq!(creates(&fake), 0);

    let ran = call(
        &a,
        "run-command",
        json!({"name": "shared-box", "command": "echo through-a"}),
    )
    .await;
    assert_eq!(ran["isError"], false, "{ran}");
    let runs = stateless_request(
        &b,
        TOKEN,
        "resources/read",
        json!({}),
        json!({"uri": "smol://runs"}),
    )
    .await;
    let text = runs["result"]["contents"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("through-a"), "b lists a's run: {runs}");
}

#[tokio::test]
async fn a_server_refuses_to_start_on_a_newer_schema() {
    let db = TestDatabase::new().await;
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE smol_mcp_schema (version INTEGER PRIMARY KEY, applied_ms BIGINT NOT NULL); \
             INSERT INTO smol_mcp_schema VALUES (1, 0), (2, 0), (3, 0), (42, 0);",
        )
        .await
        .unwrap();
    let rt = tempfile::tempdir().unwrap();
    let port = crate::common::real_serve::free_port().to_string();
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(HTTP_SERVER)
            .env_clear()
            .envs(server_env(
                rt.path(),
                &[
                    ("SMOL_MCP_AUTH_TOKEN", TOKEN),
                    ("SMOL_MCP_HTTP_PORT", port.as_str()),
                    ("SMOL_MCP_STORE_URL", db.url.as_str()),
                ],
            ))
            .output(),
    )
    .await
    .expect("the server stops at once")
    .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("storeUrl") && stderr.contains("version 42, newer than this server knows"),
        "{stderr}"
    );
    let password = super::database::server_url();
    let password = password
        .split_once(':')
        .and_then(|(_, rest)| rest.split_once(':'))
        .and_then(|(_, rest)| rest.split_once('@'))
        .map(|(p, _)| p.to_owned())
        .unwrap();
    assert!(
        !stderr.contains(&password),
        "the password is in the log: {stderr}"
    );
}
