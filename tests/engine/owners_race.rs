//! The fifth hardening round's race, witnessed by the real engine: a signed-in user sends
//! create-machine with the name of the operator's machine again and again while firing every
//! machine-naming tool at it. The real `smolvm serve` 1.32.2, logging each request it serves
//! (`RUST_LOG=debug`), shows the racer's creates answered 409 and not one request on the
//! operator's machine in all that while. Nothing here boots a guest.

use crate::common::mcp::{call_as, config, naming};
use crate::common::real_serve::RealServe;
use serde_json::json;
use smol_mcp::policy::tools::Tool;
use smol_mcp::protocol::Protocol;

/// The request lines of the serve's log (`method=... path="..."` and the status it answered).
fn served(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("finished processing request"))
        .map(|l| {
            let plain: String = strip_ansi(l);
            let method = field(&plain, "method=");
            let path = field(&plain, "path=").trim_matches('"').to_owned();
            let status = field(&plain, "status=");
            format!("{method} {path} {status}")
        })
        .collect()
}

fn field(line: &str, key: &str) -> String {
    line.split(key)
        .nth(1)
        .and_then(|rest| rest.split(['}', ' ', ':']).next())
        .unwrap_or("")
        .to_owned()
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_engine_sees_no_request_on_the_operators_machine_from_a_racing_create() {
    let serve = RealServe::start_logging_requests().await;
    let runtime = tempfile::tempdir().unwrap();
    let url = format!("unix://{}", serve.socket().display());
    let protocol = Protocol::start(config(
        &[
            ("SMOL_LOCAL_URL", url.as_str()),
            ("SMOL_MCP_AUTH_ISSUER", "https://id.example"),
        ],
        &runtime.path().join("rt"),
    ))
    .unwrap();
    let policy = protocol.policy.clone();
    call_as(
        &policy,
        "",
        Tool::CreateMachine,
        json!({"name": "op-box", "start": false}),
    )
    .await
    .unwrap();
    let before = served(&serve.log()).len();
    let mut refused = 0;
    for _ in 0..40 {
        let racer = {
            let policy = policy.clone();
            tokio::spawn(async move {
                call_as(
                    &policy,
                    "bob",
                    Tool::CreateMachine,
                    json!({"name": "op-box", "start": false}),
                )
                .await
            })
        };
        let calls = Tool::ALL
            .iter()
            .copied()
            .filter(|t| *t != Tool::CreateMachine)
            .filter_map(|tool| naming(tool, "op-box").map(|args| (tool, args)))
            .map(|(tool, args)| {
                let policy = policy.clone();
                tokio::spawn(async move { (tool, call_as(&policy, "bob", tool, args).await) })
            })
            .collect::<Vec<_>>();
        for call in calls {
            let (tool, answer) = call.await.unwrap();
            let text = answer.expect_err("let through");
            assert!(text.starts_with("NOT_FOUND"), "{}: {text}", tool.name());
            refused += 1;
        }
        let created = racer.await.unwrap().unwrap_err();
        assert!(created.contains("already exists"), "{created}");
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let log = serve.log();
    let during: Vec<String> = served(&log).split_off(before);
    let on_op_box: Vec<&String> = during
        .iter()
        .filter(|l| l.contains("/api/v1/machines/op-box"))
        .collect();
    let creates_refused = during
        .iter()
        .filter(|l| l.starts_with("POST /api/v1/machines ") && l.ends_with(" 409"))
        .count();
    println!(
        "the engine's log while bob raced: {} requests, {creates_refused} creates answered 409, \
         {} on /api/v1/machines/op-box; {refused} calls refused as NOT_FOUND",
        during.len(),
        on_op_box.len()
    );
    assert_eq!(creates_refused, 40, "{during:#?}");
    assert!(
        on_op_box.is_empty(),
        "bob reached the operator's machine: {on_op_box:#?}"
    );
    // The operator's machine is still theirs.
    call_as(&policy, "", Tool::ListMachines, json!({"name": "op-box"}))
        .await
        .unwrap();
}
