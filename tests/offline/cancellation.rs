//! notifications/cancelled ends a readiness wait or a command wait at once, and what the call
//! created is still cleaned up.

use crate::common::fake_serve::{FakeServe, exec_response};
use crate::common::mcp::Harness;
use crate::common::until;
use serde_json::json;
use std::time::Duration;

async fn call_then_cancel(h: &Harness, tool: &str, args: serde_json::Value, after: Duration) {
    let handle = h.start_call(tool, args).await;
    tokio::time::sleep(after).await;
    handle.cancel(Some("test".into())).await.unwrap();
}

#[tokio::test]
async fn cancelling_a_readiness_wait_ends_it_and_deletes_the_unnamed_machine() {
    let fake = FakeServe::start().await;
    let h = Harness::on_fake(&fake, &[("SMOL_MCP_READY_TIMEOUT_SECS", "120")]).await;
    // The machine never becomes ready.
    fake.set_exec(|_| exec_response(1, b"", b"still booting"));
    call_then_cancel(
        &h,
        "create-machine",
        json!({"image": "alpine"}),
        Duration::from_millis(600),
    )
    .await;
    assert_eq!(
        fake.state.lock().unwrap().machines.len(),
        1,
        "created before the cancel"
    );
    let took = until(
        "deleting the machine after the cancel",
        Duration::from_secs(3),
        || fake.has_no_machines(),
    )
    .await;
    assert!(
        took < Duration::from_secs(2),
        "the wait ended at once ({took:?}), not at its 120 s deadline"
    );
}

#[tokio::test]
async fn cancelling_a_command_ends_run_once_and_its_machine_goes() {
    let fake = FakeServe::start().await;
    let h = Harness::on_fake(&fake, &[]).await;
    fake.state.lock().unwrap().exec_delay = Some(Duration::from_secs(60));
    call_then_cancel(
        &h,
        "run-once",
        json!({"image": "alpine", "command": "sleep 60"}),
        Duration::from_millis(600),
    )
    .await;
    until(
        "run-once's machine to be deleted after the cancel",
        Duration::from_secs(3),
        || fake.has_no_machines(),
    )
    .await;
    let record = std::fs::read_to_string(h.record_path()).unwrap();
    assert!(!record.contains("mcp-once-"), "{record}");
}

/// Neither engine cancels an exec: a cancelled run-command kills its command in the guest by a
/// second exec that finds the processes carrying the call's marker (the first exec's env).
#[tokio::test]
async fn a_cancelled_command_is_killed_in_the_guest() {
    let fake = FakeServe::start().await;
    fake.add_machine("m", "running");
    let h = Harness::on_fake(&fake, &[]).await;
    // An ordinary command first: every run-command carries a marker of its own.
    h.ok("run-command", json!({"name": "m", "command": ["true"]}))
        .await;
    let marker_of = |request: &serde_json::Value| {
        request["body"]["env"]
            .as_array()
            .and_then(|env| env.iter().find(|v| v["name"] == "SMOL_MCP_RUN"))
            .and_then(|v| v["value"].as_str().map(str::to_owned))
    };
    // rmcp's client sends a progress token, so the command went through the output stream.
    let first = fake
        .take_requests()
        .into_iter()
        .filter(|r| r["path"].as_str().unwrap().ends_with("/exec/stream"))
        .find_map(|r| marker_of(&r));
    assert!(first.is_some(), "the command carried a marker");

    call_then_cancel(
        &h,
        "run-command",
        json!({"name": "m", "command": "sleep 60", "timeoutSecs": 120}),
        Duration::from_millis(400),
    )
    .await;
    let mut kill_script = None;
    until(
        "a kill exec after the cancel",
        Duration::from_secs(5),
        || {
            kill_script = fake.kill_script();
            kill_script.is_some()
        },
    )
    .await;
    let script = kill_script.unwrap();
    assert!(script.contains("kill -9"), "{script}");
    assert_ne!(
        Some(
            script
                .split("SMOL_MCP_RUN=")
                .nth(1)
                .unwrap()
                .split('\'')
                .next()
                .unwrap()
        ),
        first.as_deref(),
        "the kill names the cancelled call's own marker, not another's"
    );
}
