//! Never twice: a client whose request times out retries it with the same `idempotencyKey`, and
//! the server makes one machine and runs the command once (the official Python client, over
//! stdio and over HTTP, tests/clients/retry_py.py); the answer of a keyed call is kept in the
//! ledger, so the next server process answers a repeat without doing anything; the same key
//! with other arguments is refused naming both calls; a keyed call that failed frees its key.

use crate::common::clients::{HttpServer, env_object, run_python};
use crate::common::fake_serve::FakeServe;
use crate::common::mcp::Harness;
use crate::common::stdio::{SERVER, server_env};
use serde_json::{Value, json};
use std::time::Duration;

const TOKEN: &str = "idempotency-token";
/// The client's request timeout, shorter than the create and the command.
const CLIENT_TIMEOUT_SECS: f64 = 1.0;
const MARKER: &str = "ran-once-marker";

fn creates(fake: &FakeServe) -> usize {
    fake.take_requests()
        .iter()
        .filter(|r| r["method"] == "POST" && r["path"] == "/api/v1/machines")
        .count()
}

fn plan(machine: &str) -> Value {
    json!({
        "calls": [
            {"tool": "create-machine", "timeout": CLIENT_TIMEOUT_SECS, "tries": 10,
             "args": {"name": machine, "image": "alpine", "idempotencyKey": "create-1"}},
            {"tool": "run-command", "timeout": CLIENT_TIMEOUT_SECS, "tries": 10,
             "args": {"name": machine, "command": format!("sleep 2.5; echo {MARKER}"),
                      "idempotencyKey": "run-1"}},
            {"tool": "create-machine", "timeout": 30, "tries": 1,
             "args": {"name": format!("{machine}-other"), "image": "alpine",
                      "idempotencyKey": "create-1"}},
        ],
        "reads": ["smol://runs"],
    })
}

/// What the client saw: each keyed call timed out at least once, was retried, and answered;
/// one machine (plus none from the refused call) and one run of the command.
fn check(report: &Value, machine: &str) {
    for call in &report["calls"].as_array().unwrap()[..2] {
        let attempts = call["attempts"].as_array().unwrap();
        assert!(
            attempts.len() >= 2 && attempts[0]["timedOut"] == true,
            "the first attempt timed out and was retried: {call}"
        );
        assert_eq!(call["answer"]["isError"], false, "{call}");
    }
    let run = &report["calls"][1]["answer"]["structured"];
    assert_eq!(run["exitCode"], 0, "{run}");
    assert_eq!(run["stdout"], format!("{MARKER}\n"), "{run}");
    assert_eq!(report["machines"], json!([machine]), "{report}");
    let runs: Vec<&Value> = report["reads"]["smol://runs"]["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["command"].to_string().contains(MARKER))
        .collect();
    assert_eq!(runs.len(), 1, "one run of the command: {report}");
    let refused = &report["calls"][2]["answer"];
    assert_eq!(refused["isError"], true, "{refused}");
    let text = refused["text"].as_str().unwrap();
    assert!(
        text.contains("idempotencyKey") && text.contains("already names another call"),
        "{text}"
    );
    // What differs, by argument name; no value of either call (issue 32: a key reused with
    // other arguments showed the first call's command and stdin to whoever reused it).
    assert!(
        text.contains("of create-machine") && text.contains("differs from it in name."),
        "the refusal names what differs: {text}"
    );
    assert!(
        !text.contains(machine),
        "no argument's value in the refusal: {text}"
    );
}

async fn slow_fake() -> FakeServe {
    let fake = FakeServe::start_guest_shell().await;
    fake.state.lock().unwrap().create_delay = Some(Duration::from_millis(2500));
    fake
}

#[tokio::test]
async fn a_python_client_retrying_after_its_timeout_makes_one_machine_and_one_run_over_stdio() {
    let fake = slow_fake().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let env = server_env(rt.path(), &[("SMOL_LOCAL_URL", url.as_str())]);
    let mut plan = plan("kept-box");
    plan["server"] = json!(SERVER);
    plan["env"] = env_object(env.clone());
    let report = run_python("retry_py.py", &plan).await;
    check(&report, "kept-box");
    assert_eq!(creates(&fake), 1, "one create reached the engine");

    // The next process on the same runtime directory answers the repeat from the ledger.
    let mut again = json!({"calls": [
        {"tool": "create-machine", "timeout": 30, "tries": 1,
         "args": {"name": "kept-box", "image": "alpine", "idempotencyKey": "create-1"}},
    ]});
    again["server"] = json!(SERVER);
    again["env"] = env_object(env);
    let report = run_python("retry_py.py", &again).await;
    let answer = &report["calls"][0]["answer"];
    assert_eq!(answer["isError"], false, "{report}");
    assert_eq!(
        answer["structured"]["machine"]["name"], "kept-box",
        "{report}"
    );
    assert_eq!(creates(&fake), 0, "the repeat did nothing: {report}");
}

#[tokio::test]
async fn a_python_client_retrying_after_its_timeout_makes_one_machine_and_one_run_over_http() {
    let fake = slow_fake().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let server = HttpServer::spawn(rt.path(), TOKEN, &[("SMOL_LOCAL_URL", url.as_str())]).await;
    let mut plan = plan("kept-http");
    plan["url"] = json!(server.url);
    plan["token"] = json!(TOKEN);
    let report = run_python("retry_py.py", &plan).await;
    check(&report, "kept-http");
    assert_eq!(creates(&fake), 1, "one create reached the engine");
}

/// A failed keyed call does not keep its key: the retry runs again (and here succeeds).
#[tokio::test]
async fn a_keyed_call_that_failed_runs_again_when_retried() {
    let fake = FakeServe::start().await;
    let h = Harness::on_fake(&fake, &[]).await;
    let args = json!({"name": "later", "path": "/tmp/x", "content": "hi", "idempotencyKey": "w-1"});
    let first = h.err("write-file", args.clone()).await;
    assert!(first.contains("NOT_FOUND"), "{first}");
    fake.add_machine("later", "running");
    h.ok("write-file", args.clone()).await;
    let writes = || {
        fake.take_requests()
            .iter()
            .filter(|r| r["method"] != "GET" && r["path"].as_str().unwrap().contains("/files/"))
            .count()
    };
    assert_eq!(writes(), 1);
    h.ok("write-file", args).await;
    assert_eq!(writes(), 0, "the succeeded call is not made again");
}

/// A bad key is refused before anything is done, naming the argument and what is accepted; a
/// read-only tool has no key at all.
#[tokio::test]
async fn a_bad_key_is_refused_naming_the_argument() {
    let fake = FakeServe::start().await;
    let h = Harness::on_fake(&fake, &[]).await;
    let text = h
        .err("create-machine", json!({"idempotencyKey": "two words"}))
        .await;
    assert!(
        text.contains("idempotencyKey: ") && text.contains("printable ASCII"),
        "{text}"
    );
    assert_eq!(creates(&fake), 0);
    let text = h.err("list-machines", json!({"idempotencyKey": "k"})).await;
    assert!(text.contains("idempotencyKey"), "{text}");
}
