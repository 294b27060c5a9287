//! State that outlives the server process, over the binaries: a background job started by one
//! stdio process is read to its end, and another cancelled, by the next process on the same
//! runtime directory; a job whose machine went while no process watched ends as lost, with
//! why; a job of a process still running is left to it; and an MCP task whose HTTP server was
//! killed answers tasks/get, from the next server, as failed with a message saying so.
//!
//! The fakes' exec runs commands as host processes (`guest_shell`), and the fakes live in the
//! test process, so the "machines" and their jobs outlive each server process as they would
//! outlive it in a real engine.

use crate::common::clients::HttpServer;
use crate::common::fake_serve::FakeServe;
use crate::common::stdio::{StdioServer, server_env};
use crate::common::until;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

fn env(runtime: &Path, fake: &FakeServe) -> Vec<(String, String)> {
    server_env(
        runtime,
        &[
            ("SMOL_LOCAL_URL", fake.url().as_str()),
            ("SMOL_MCP_JOB_POLL_MILLIS", "100"),
        ],
    )
}

/// Starts a background job; answers its id and ledger row.
async fn start_job(
    server: &mut StdioServer,
    id: u64,
    machine: &str,
    script: &str,
) -> (String, i64) {
    let started = server
        .tool(
            id,
            "run-command",
            json!({"name": machine, "command": script, "background": true}),
        )
        .await;
    assert_eq!(started["state"], "running", "{started}");
    (
        started["job"].as_str().unwrap().to_owned(),
        started["run"].as_i64().expect("a ledger row"),
    )
}

/// The ledger row of `run` once it has ended, read through `smol://runs`.
async fn ended_row(server: &mut StdioServer, id: u64, run: i64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let read = server
            .request(
                id,
                "resources/read",
                json!({"uri": format!("smol://runs/{run}")}),
            )
            .await;
        let detail: Value =
            serde_json::from_str(read["result"]["contents"][0]["text"].as_str().unwrap()).unwrap();
        if detail["outcome"] != "running" {
            return detail;
        }
        assert!(Instant::now() < deadline, "never recorded: {detail}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn job_in<'a>(list: &'a Value, job: &str) -> &'a Value {
    list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"] == job)
        .unwrap_or_else(|| panic!("{job} is not listed: {list}"))
}

/// A server process on `runtime` with the machine `name` made (as request 1).
async fn with_machine(fake: &FakeServe, runtime: &Path, name: &str) -> StdioServer {
    let mut server = StdioServer::spawn(env(runtime, fake)).await;
    server
        .tool(
            1,
            "create-machine",
            json!({"name": name, "image": "alpine"}),
        )
        .await;
    server
}

#[tokio::test]
async fn a_job_started_by_one_process_is_read_to_its_end_and_another_cancelled_by_the_next() {
    let fake = FakeServe::start_guest_shell().await;
    let runtime = tempfile::tempdir().unwrap();

    let mut first = with_machine(&fake, runtime.path(), "kept").await;
    let (finite, finite_run) = start_job(
        &mut first,
        2,
        "kept",
        "for i in 1 2 3 4 5 6; do echo \"line $i\"; sleep 0.5; done; echo bye >&2; exit 4",
    )
    .await;
    let (endless, endless_run) =
        start_job(&mut first, 3, "kept", "while true; do sleep 1; done").await;
    let first_pid = first.child.id().unwrap();
    // The first process goes away as a client's server does: its stdin closed. A named machine
    // is not its to delete, so the machine and both jobs stay.
    first.close_stdin();
    tokio::time::timeout(Duration::from_secs(20), first.child.wait())
        .await
        .expect("the first server did not exit")
        .unwrap();
    assert_eq!(fake.guest_processes("kept").len(), 2, "both jobs still run");

    let mut next = StdioServer::spawn(env(runtime.path(), &fake)).await;
    assert_ne!(next.child.id().unwrap(), first_pid);
    let listed = next.tool(10, "job-output", json!({})).await;
    assert_eq!(job_in(&listed, &finite)["state"], "running", "{listed}");
    assert_eq!(job_in(&listed, &endless)["state"], "running", "{listed}");

    // Read to its end by cursor, as the agent would have in the first process.
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let mut cursor = "0:0".to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    let last = loop {
        let report = next
            .tool(
                11,
                "job-output",
                json!({"job": finite, "cursor": cursor, "waitSecs": 2}),
            )
            .await;
        stdout.push_str(report["stdout"].as_str().unwrap());
        stderr.push_str(report["stderr"].as_str().unwrap());
        cursor = report["cursor"].as_str().unwrap().to_owned();
        if report["state"] != "running" && report["more"] == false {
            break report;
        }
        assert!(Instant::now() < deadline, "never ended: {report}");
    };
    assert_eq!(stdout, "line 1\nline 2\nline 3\nline 4\nline 5\nline 6\n");
    assert_eq!(stderr, "bye\n");
    assert_eq!(last["state"], "exited", "{last}");
    assert_eq!(last["exitCode"], 4, "{last}");

    // The other one is cancelled by this process: its command is killed in the machine.
    let cancelled = next.tool(12, "cancel-job", json!({"job": endless})).await;
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    until(
        "the cancelled job's command to go",
        Duration::from_secs(10),
        || fake.guest_processes("kept").is_empty(),
    )
    .await;

    // The ledger row the first process began is ended by the second, without the output's text
    // (the first process's environment values, which it would redact, are written nowhere).
    let detail = ended_row(&mut next, 13, finite_run).await;
    assert_eq!(detail["tool"], "job", "{detail}");
    assert_eq!(detail["outcome"], "exited", "{detail}");
    assert_eq!(detail["exitCode"], 4, "{detail}");
    assert_eq!(detail["stdout"]["bytes"], stdout.len(), "{detail}");
    assert_eq!(detail["stdout"]["head"], "", "{detail}");
    // And the cancelled one's, before this process goes: the cancel is recorded by the job's
    // watcher after a look at the machine, which a process ending at once would not wait for.
    let cancelled_row = ended_row(&mut next, 14, endless_run).await;
    assert_eq!(cancelled_row["outcome"], "cancelled", "{cancelled_row}");

    // A third process finds nothing left to take over: both jobs have ended.
    next.close_stdin();
    tokio::time::timeout(Duration::from_secs(20), next.child.wait())
        .await
        .unwrap()
        .unwrap();
    let mut third = StdioServer::spawn(env(runtime.path(), &fake)).await;
    let listed = third.tool(20, "job-output", json!({})).await;
    assert_eq!(listed["jobs"], json!([]), "{listed}");
}

#[tokio::test]
async fn a_job_whose_machine_went_meanwhile_is_lost_with_why_and_a_live_process_keeps_its_own() {
    let fake = FakeServe::start_guest_shell().await;
    let runtime = tempfile::tempdir().unwrap();

    let mut first = with_machine(&fake, runtime.path(), "gone").await;
    let (job, _) = start_job(&mut first, 2, "gone", "sleep 600").await;

    // While the first process lives, another one leaves its job alone.
    let mut other = StdioServer::spawn(env(runtime.path(), &fake)).await;
    let listed = other.tool(10, "job-output", json!({})).await;
    assert_eq!(listed["jobs"], json!([]), "{listed}");

    // The first process is killed outright (no clean-up of any kind), and the machine is
    // deleted behind every server's back.
    first.child.start_kill().unwrap();
    first.child.wait().await.unwrap();
    let endpoint = fake.endpoint();
    let deleted = endpoint
        .http_client()
        .unwrap()
        .delete(format!("{}/api/v1/machines/gone", endpoint.base_url()))
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{deleted:?}");

    let mut next = StdioServer::spawn(env(runtime.path(), &fake)).await;
    let listed = next.tool(20, "job-output", json!({})).await;
    let found = job_in(&listed, &job);
    assert_eq!(found["state"], "lost", "{listed}");
    assert!(
        found["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("deleted while no server process watched"),
        "{listed}"
    );
    // The other process, still alive, never took it over either.
    let listed = other.tool(11, "job-output", json!({})).await;
    assert_eq!(listed["jobs"], json!([]), "{listed}");
}

const TOKEN: &str = "restart-token";

/// A 2026-07-28 request to `server`, declaring the tasks extension.
async fn request(server: &HttpServer, method: &str, params: Value) -> Value {
    crate::common::clients::task_request(server, TOKEN, method, params).await
}

#[tokio::test]
async fn a_task_whose_server_was_killed_answers_failed_from_the_next_server() {
    let fake = FakeServe::start_guest_shell().await;
    fake.add_machine("m", "running");
    let runtime = tempfile::tempdir().unwrap();
    let url = fake.url();
    let vars = [
        ("SMOL_LOCAL_URL", url.as_str()),
        ("SMOL_MCP_TASK_AFTER_MILLIS", "300"),
    ];
    let mut first = HttpServer::spawn(runtime.path(), TOKEN, &vars).await;
    let answer = request(
        &first,
        "tools/call",
        json!({"name": "run-command", "arguments": {"name": "m", "command": "sleep 30"}}),
    )
    .await;
    let task = answer["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("not a task: {answer}"))
        .to_owned();
    let polled = request(&first, "tasks/get", json!({"taskId": task})).await;
    assert_eq!(polled["result"]["status"], "working", "{polled}");
    // The task's record reaches the ledger off the call's path; then the server dies.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let first_pid = first.child.id().unwrap();
    first.child.start_kill().unwrap();
    first.child.wait().await.unwrap();

    let next = HttpServer::spawn(runtime.path(), TOKEN, &vars).await;
    let polled = request(&next, "tasks/get", json!({"taskId": task})).await;
    let result = &polled["result"];
    assert_eq!(result["status"], "failed", "{polled}");
    assert_eq!(result["taskId"], task.as_str(), "{polled}");
    let message = result["statusMessage"].as_str().unwrap();
    assert!(
        message.contains(&format!("(pid {first_pid}) has ended")) && message.contains("again"),
        "{message}"
    );
    assert!(result["ttlMs"].as_u64().unwrap() > 30_000, "{polled}");
    // An id no server made is still unknown.
    let unknown = request(&next, "tasks/get", json!({"taskId": "no-such-task"})).await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
}
