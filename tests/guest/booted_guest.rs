//! The tools on real booted guests: the pinned smolvm 1.32.2 engine nested in a QEMU TCG machine
//! (`scripts/nested-engine.sh`, brought up by scripts/test.sh), reached as `SMOL_LOCAL_URL`.
//! Every guest-side promise the README and docs/tools.md make is checked here against the engine itself: exec,
//! files, the output cap on both exec paths, timeouts, logs, streaming, jobs, branch, run-once,
//! cancellation, the egress report, starts, the deadlines past 300 s, and one whole session under
//! each real client (Python `mcp`, the TypeScript SDK) over stdio and HTTP. What the fakes claim
//! of the engine is compared with its answers in `tests/guest/fake_vs_engine.rs`.
//!
//! Boots take seconds here (4 to 20 s) and are serialised (`nested::serial`); machines are made
//! without an image (the engine's bundled Alpine, no registry) unless the test is about images,
//! which use the busybox archive the script builds from packages.

use crate::common::mcp::Harness;
use crate::common::nested::{json_answer, nested, serial};
use rmcp::model::{CallToolRequestParams, ProgressNotificationParam};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use smol_mcp::protocol::Protocol;
use smol_mcp::protocol::server::SmolMcp;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) const READY_SECS: &str = "180";

async fn harness(extra: &[(&str, &str)]) -> Harness {
    let url = nested().url;
    let mut env = vec![
        ("SMOL_LOCAL_URL", url.as_str()),
        ("SMOL_MCP_READY_TIMEOUT_SECS", READY_SECS),
        ("SMOL_MCP_MAX_OUTPUT_BYTES", "4096"),
    ];
    env.extend_from_slice(extra);
    Harness::start(&env).await
}

/// How the engine says a boot died under TCG: it gave up waiting ("no boot progress": a starved
/// guest can miss its 30 s cut), or the new VM exited before its agent answered.
const BOOT_FAILED: [&str; 3] = [
    "no boot progress",
    "before the agent was ready",
    "io operation failed: connection closed",
];

/// create-machine, tried once more when the engine gave up on the boot ("no boot progress":
/// under TCG a starved guest can miss the engine's 30 s cut), saying so in the output.
async fn create(h: &Harness, args: Value) -> Value {
    let first = h.call("create-machine", args.clone()).await;
    if !first.is_error {
        return first.structured;
    }
    let boot_failed = BOOT_FAILED.iter().any(|why| first.text.contains(why));
    assert!(boot_failed, "create-machine failed: {}", first.text);
    eprintln!(
        "booted_guest: a boot failed under TCG; creating once more: {}",
        first.text
    );
    h.ok("create-machine", args).await
}

/// [`create`], answering the machine's name.
async fn created_name(h: &Harness, args: Value) -> String {
    let created = create(h, args).await;
    created["machine"]["name"].as_str().unwrap().to_owned()
}

async fn cleanup(h: &Harness) {
    let cleanup = h.protocol.process().cleanup_session(&h.session).await;
    assert_eq!(cleanup.failed.len(), 0, "{:?}", cleanup.failed);
}

/// The engine's own listing of its machines.
async fn engine_listing() -> Value {
    engine_listing_at(&nested().url).await
}

async fn engine_listing_at(url: &str) -> Value {
    json_answer(crate::common::nested::rest().get(format!("{url}/api/v1/machines"))).await
}

/// One machine's entry in the engine's own listing (its state, process and memory figures).
async fn engine_entry(name: &str) -> Value {
    engine_listing().await["machines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("the engine does not list {name}"))
}

/// The machines the engine itself lists, by name.
async fn engine_machines() -> Vec<String> {
    let list = engine_listing().await;
    list["machines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .collect()
}

/// An MCP client that keeps every progress notification, with when it arrived.
#[derive(Clone, Default)]
struct Recorder {
    progress: Arc<Mutex<Vec<(Instant, ProgressNotificationParam)>>>,
}

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push((Instant::now(), params));
    }
}

/// The server in process with a [`Recorder`] as its client.
async fn recorded(
    extra: &[(&str, &str)],
) -> (
    Recorder,
    RunningService<RoleClient, Recorder>,
    Arc<Protocol>,
) {
    let url = nested().url;
    let runtime = tempfile::tempdir().unwrap().keep();
    let mut env = vec![
        ("SMOL_LOCAL_URL", url.as_str()),
        ("SMOL_MCP_READY_TIMEOUT_SECS", READY_SECS),
    ];
    env.extend_from_slice(extra);
    let protocol = Protocol::start(crate::common::mcp::config(&env, &runtime.join("rt"))).unwrap();
    let server = SmolMcp::new(protocol.clone(), "booted-recorded".to_owned());
    let recorder = Recorder::default();
    let client = crate::common::mcp::connect(server, recorder.clone()).await;
    (recorder, client, protocol)
}

/// A tool call (rmcp's client gives every request a progress token of its own); the structured
/// result, or the error text.
async fn call_with_progress(
    client: &RunningService<RoleClient, Recorder>,
    tool: &str,
    args: Value,
) -> Result<Value, String> {
    let Value::Object(map) = args else {
        panic!("arguments must be an object")
    };
    let result = client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(map))
        .await
        .unwrap();
    let text: Vec<String> = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    if result.is_error == Some(true) {
        Err(text.join("\n"))
    } else {
        Ok(result.structured_content.unwrap_or(Value::Null))
    }
}

/// A command longer than the engine's 300 s request deadline, on both exec routes: 1.32.2 does
/// not bound exec or exec/stream (seen: 321 s and 331 s execs answered whole), so the server no
/// longer refuses a timeout over 290 s. It holds the serial lock throughout, like the others:
/// while its guest ran its 5 minutes beside them, every other guest's boot in that time tripped
/// the engine's 30 s boot-progress cutoff (CI on 2026-12-04: nine boots between 20:26 and 20:31,
/// three tests failed twice and ran again on a fresh engine; none failed after it ended).
#[tokio::test]
async fn a_305_s_command_past_the_engines_300_s_request_deadline_answers_whole() {
    let _one_at_a_time = serial().await;
    let h = harness(&[]).await;
    let name = created_name(&h, json!({"cpus": 1, "memoryMb": 256})).await;
    let plain = h.call(
        "run-command",
        json!({"name": name, "command": "sleep 305; echo plain done", "timeoutSecs": 330, "stdin": ""}),
    );
    let (_recorder, client, protocol) = recorded(&[]).await;
    let streamed = call_with_progress(
        &client,
        "run-command",
        json!({"name": name, "command": "echo begun; sleep 305; echo streamed done", "timeoutSecs": 330}),
    );
    let (plain, streamed) = tokio::join!(plain, streamed);
    assert!(!plain.is_error, "{}", plain.text);
    assert_eq!(plain.structured["stdout"], "plain done\n");
    let streamed = streamed.unwrap();
    assert_eq!(streamed["stdout"], "begun\nstreamed done\n", "{streamed}");
    drop(protocol);
    cleanup(&h).await;
}

/// A machine without an image (the engine's bundled Alpine, no pull): commands, stdin, env and
/// workdir, files, the spill of long output, timeouts in the VM path's form, the VM path's
/// 500 past the 11 MiB cap, a directory and a missing file, both logs, and run-once.
#[tokio::test]
async fn a_bare_machine_runs_commands_files_logs_and_run_once() {
    let _one_at_a_time = serial().await;
    let h = harness(&[]).await;
    let created = create(&h, json!({"cpus": 1, "memoryMb": 512})).await;
    assert_eq!(created["ready"], true, "{created}");
    assert_eq!(created["machine"]["image"], Value::Null, "{created}");
    let name = created["machine"]["name"].as_str().unwrap().to_owned();

    let r = h
        .ok(
            "run-command",
            json!({"name": name, "command": "cat /etc/alpine-release >/dev/null && echo out; echo err >&2; exit 42"}),
        )
        .await;
    assert_eq!(
        (
            r["exitCode"].as_i64(),
            r["stdout"].as_str(),
            r["stderr"].as_str()
        ),
        (Some(42), Some("out\n"), Some("err\n"))
    );
    let r = h
        .ok(
            "run-command",
            json!({"name": name, "command": ["cat"], "stdin": "piped"}),
        )
        .await;
    assert_eq!(r["stdout"], "piped");
    let r = h
        .ok(
            "run-command",
            json!({"name": name, "command": "echo $GREETING; pwd", "env": {"GREETING": "hi"}, "workdir": "/tmp"}),
        )
        .await;
    assert_eq!(r["stdout"], "hi\n/tmp\n");

    h.ok(
        "write-file",
        json!({"name": name, "path": "/root/a.bin", "content": "AAEC/w==", "encoding": "base64"}),
    )
    .await;
    let (_, back) = h
        .read(json!({"name": name, "path": "/root/a.bin", "encoding": "base64"}))
        .await;
    assert_eq!(back, "AAEC/w==");

    let big = h
        .ok(
            "run-command",
            json!({"name": name, "command": "yes a | head -c 20000"}),
        )
        .await;
    assert_eq!(big["truncated"], true);
    let spilled = big["overflow"][0]["path"].as_str().unwrap();
    let whole = h
        .ok(
            "read-file",
            json!({"name": name, "path": spilled, "length": 100}),
        )
        .await;
    assert_eq!(whole["size"], 20000);

    let timed = h
        .ok(
            "run-command",
            json!({"name": name, "command": "sleep 30", "timeoutSecs": 1}),
        )
        .await;
    assert_eq!(
        (timed["exitCode"].as_i64(), timed["timedOut"].as_bool()),
        (Some(124), Some(true)),
        "{timed}"
    );
    let own = h
        .ok(
            "run-command",
            json!({"name": name, "command": "exit 124", "timeoutSecs": 30}),
        )
        .await;
    assert_eq!(own["timedOut"], false, "{own}");

    // The VM path past the cap: the plain exec (stdin given) answers the agent's 500 with none
    // of the output, an error saying where to put it. (The streamed exec past the cap is left to
    // the fake: on the nested engine it took the serve down mid-stream once in four runs.)
    let twelve_mib = "head -c 12582912 /dev/zero | tr '\\0' x";
    let over = h
        .call(
            "run-command",
            json!({"name": name, "command": twelve_mib, "timeoutSecs": 120, "stdin": ""}),
        )
        .await;
    assert!(over.is_error, "{}", &over.text[..over.text.len().min(300)]);
    assert!(
        over.text.contains("cap of 11 MiB per stream"),
        "{}",
        over.text
    );

    let directory = h
        .err("read-file", json!({"name": name, "path": "/etc"}))
        .await;
    assert!(directory.contains("is a directory"), "{directory}");
    let missing = h
        .err("read-file", json!({"name": name, "path": "/no/such/file"}))
        .await;
    assert!(missing.starts_with("NOT_FOUND"), "{missing}");

    // Logs: a bare machine has no workload, which the answer says; the engine's log has this
    // test's commands and none of the server's own (its readiness probes ran at create).
    let workload = h.ok("machine-logs", json!({"name": name})).await;
    assert_eq!(workload["lines"], json!([]), "{workload}");
    assert!(
        workload["note"]
            .as_str()
            .unwrap()
            .contains("printed nothing"),
        "{workload}"
    );
    let engine = h
        .ok(
            "machine-logs",
            json!({"name": name, "source": "engine", "tail": 10000}),
        )
        .await;
    let lines = crate::common::strings(&engine["lines"]);
    assert!(
        lines.iter().any(|l| l.contains("head -c 12582912")),
        "the agent's own commands are in the engine's log: {lines:?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("smol-mcp-internal") || l.contains("ready-")),
        "none of the server's probes: {lines:?}"
    );
    let after = h
        .ok(
            "machine-logs",
            json!({"name": name, "source": "engine", "cursor": engine["cursor"]}),
        )
        .await;
    for line in after["lines"].as_array().unwrap() {
        assert!(
            !lines.contains(&line.as_str().unwrap()) || after["gap"] == true,
            "{line} came twice"
        );
    }

    let once = h
        .ok(
            "run-once",
            json!({"command": ["echo", "hello"], "cpus": 1, "memoryMb": 256}),
        )
        .await;
    assert_eq!(once["stdout"], "hello\n");
    assert!(
        !engine_machines()
            .await
            .contains(&once["machine"].as_str().unwrap().to_owned())
    );
    cleanup(&h).await;
    assert!(
        !engine_machines().await.contains(&name),
        "the session's machine is gone"
    );
}

/// A machine from an image runs execs in a container: there the agent stops reading at the cap
/// and the engine answers 200 with about 11 MiB and exit 141 (SIGPIPE), which the server
/// refuses; and a pull into such a machine answers success for any reference without pulling
/// (`digest: packed`, `size: 0`), which the server refuses too.
#[tokio::test]
async fn an_image_machine_s_cut_output_and_fake_pulls_are_errors() {
    let _one_at_a_time = serial().await;
    let h = harness(&[]).await;
    let image = nested().busybox_image;
    let name = created_name(&h, json!({"image": image, "cpus": 1, "memoryMb": 512})).await;
    let r = h
        .ok(
            "run-command",
            json!({"name": name, "command": "echo in busybox"}),
        )
        .await;
    assert_eq!(r["stdout"], "in busybox\n");
    // The plain exec (stdin given): the container path's 200 with exit 141.
    let over = h
        .call(
            "run-command",
            json!({"name": name, "command": "head -c 12582912 /dev/zero | tr '\\0' x", "timeoutSecs": 120, "stdin": ""}),
        )
        .await;
    assert!(
        over.is_error,
        "an ordinary result: {}",
        &over.text[..over.text.len().min(300)]
    );
    assert!(
        over.text.contains("SIGPIPE") && over.text.contains("read-file"),
        "{}",
        over.text
    );
    let pulled = h
        .err(
            "pull-image",
            json!({"name": name, "image": "doesnotexist.invalid/foo/bar:1"}),
        )
        .await;
    assert!(
        pulled.starts_with("UNSUPPORTED") && pulled.contains("pulled nothing"),
        "{pulled}"
    );
    cleanup(&h).await;
}

/// A stopped machine: run-command starts it first and reports the boot as progress; then
/// start-machine with wait false answers while it boots (state starting), and it comes up.
#[tokio::test]
async fn a_stopped_machine_reports_its_boot_and_starts_without_waiting() {
    let _one_at_a_time = serial().await;
    let (recorder, client, protocol) = recorded(&[]).await;
    let created = call_with_progress(
        &client,
        "create-machine",
        json!({"cpus": 1, "memoryMb": 256}),
    )
    .await
    .unwrap();
    let name = created["machine"]["name"].as_str().unwrap().to_owned();
    call_with_progress(&client, "stop-machine", json!({"name": name}))
        .await
        .unwrap();
    recorder.progress.lock().unwrap().clear();
    let mut began = Instant::now();
    let run = json!({"name": name, "command": "echo up"});
    let r = match call_with_progress(&client, "run-command", run.clone()).await {
        Ok(r) => r,
        // The boot the exec started died under TCG (seen once in CI: the new VM exited at once
        // and the engine answered "connection closed"); as create does, once more, saying so.
        Err(e) if BOOT_FAILED.iter().any(|why| e.contains(why)) => {
            eprintln!("booted_guest: a boot failed under TCG; running once more: {e}");
            recorder.progress.lock().unwrap().clear();
            began = Instant::now();
            call_with_progress(&client, "run-command", run)
                .await
                .unwrap()
        }
        Err(e) => panic!("run-command on the stopped machine: {e}"),
    };
    assert_eq!(
        (r["stdout"].as_str(), r["startedMachine"].as_bool()),
        (Some("up\n"), Some(true)),
        "{r}"
    );
    let progress = recorder.progress.lock().unwrap().clone();
    let booting: Vec<_> = progress
        .iter()
        .filter(|(_, p)| {
            p.message
                .as_deref()
                .is_some_and(|m| m.contains(&format!("machine {name} to start")))
        })
        .collect();
    assert!(
        !booting.is_empty(),
        "progress while it booted ({:?} in all): {progress:?}",
        began.elapsed()
    );

    call_with_progress(&client, "stop-machine", json!({"name": name}))
        .await
        .unwrap();
    let asked = Instant::now();
    let started = call_with_progress(
        &client,
        "start-machine",
        json!({"name": name, "wait": false}),
    )
    .await
    .unwrap();
    let answered = asked.elapsed();
    assert_eq!(started["ready"], false, "{started}");
    assert_eq!(
        started["machine"]["state"], "starting",
        "answered before the boot: {started}"
    );
    let got = call_with_progress(&client, "list-machines", json!({"name": name}))
        .await
        .unwrap()["machines"][0]
        .clone();
    assert_ne!(got["state"], "stopped", "{got}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let m = call_with_progress(&client, "list-machines", json!({"name": name}))
            .await
            .unwrap()["machines"][0]
            .clone();
        if m["state"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "never came up: {m}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let booted = asked.elapsed();
    assert!(
        answered < booted,
        "answered in {answered:?}, booted in {booted:?}"
    );
    call_with_progress(&client, "delete-machine", json!({"name": name}))
        .await
        .unwrap();
    drop(protocol);
}

/// Jobs in the guest's busybox: one read by cursor to its exit status, one cancelled with its
/// child (none left), and the job's ledger row without the server's own marker among its
/// environment names and without the value of the one the agent set.
#[tokio::test]
async fn background_jobs_run_are_read_cancelled_and_recorded() {
    let _one_at_a_time = serial().await;
    let h = harness(&[]).await;
    let name = created_name(&h, json!({"cpus": 1, "memoryMb": 256})).await;
    let started = h
        .ok(
            "run-command",
            json!({"name": name, "background": true, "env": {"TOKEN": "s3cr3t-value-xyz"},
                   "command": "for i in 1 2 3; do echo \"line $i é\"; sleep 1; done; exit 4"}),
        )
        .await;
    let job = started["job"].as_str().unwrap().to_owned();
    let mut cursor = "0:0".to_owned();
    let mut stdout = String::new();
    let last = loop {
        let r = h
            .ok(
                "job-output",
                json!({"job": job, "cursor": cursor, "waitSecs": 5}),
            )
            .await;
        stdout.push_str(r["stdout"].as_str().unwrap());
        cursor = r["cursor"].as_str().unwrap().to_owned();
        if r["state"] != "running" && r["more"] == false {
            break r;
        }
    };
    assert_eq!(stdout, "line 1 é\nline 2 é\nline 3 é\n", "{last}");
    assert_eq!(
        (last["state"].as_str(), last["exitCode"].as_i64()),
        (Some("exited"), Some(4))
    );

    let sleeper = h
        .ok(
            "run-command",
            json!({"name": name, "background": true, "command": "sleep 300 & sleep 301"}),
        )
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cancelled = h.ok("cancel-job", json!({"job": sleeper["job"]})).await;
    assert_eq!(cancelled["state"], "cancelled");
    let ps = h
        .ok(
            "run-command",
            json!({"name": name, "command": "ps -o args | grep -c '^sleep 30[01]' || true"}),
        )
        .await;
    assert_eq!(ps["stdout"].as_str().unwrap().trim(), "0", "{ps}");

    h.protocol.policy.ledger.flush().await;
    let runs = h.resource("smol://runs").await;
    // The runs list writes ids as strings; the job's answer, as the number or the string.
    let run_id = started["run"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| started["run"].to_string());
    let row = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"].as_str() == Some(run_id.as_str()))
        .unwrap_or_else(|| panic!("no row for the job: {runs}"))
        .clone();
    let detail = h
        .resource(&format!("smol://runs/{}", row["id"].as_str().unwrap()))
        .await;
    assert_eq!(detail["envNames"], json!(["TOKEN"]), "{detail}");
    let db = std::fs::read_dir(h.runtime.path().join("rt")).unwrap();
    for file in db {
        let bytes = std::fs::read(file.unwrap().path()).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains("s3cr3t-value-xyz"),
            "the value is in the runtime dir"
        );
    }
    cleanup(&h).await;
}

/// The egress report on an allow-listed machine: a refused connect, and a name outside
/// allowHosts refused at lookup (`resolve`), each in the report of the command that made it
/// even when the two commands run back to back in the same second.
#[tokio::test]
async fn refused_egress_is_reported_to_the_command_that_made_it() {
    let _one_at_a_time = serial().await;
    let h = harness(&[]).await;
    let created = create(
        &h,
        json!({"cpus": 1, "memoryMb": 256, "allowHosts": ["example.org"]}),
    )
    .await;
    let name = created["machine"]["name"].as_str().unwrap().to_owned();
    let refused = h
        .ok(
            "run-command",
            json!({"name": name, "command": "wget -q -T 3 -O /dev/null http://1.1.1.1/"}),
        )
        .await;
    assert_ne!(refused["exitCode"], 0, "{refused}");
    assert_eq!(
        refused["blockedEgress"],
        json!([{"host": "1.1.1.1", "port": 80, "operation": "connect", "count": 1}]),
        "{refused}"
    );
    let unresolved = h
        .ok(
            "run-command",
            json!({"name": name, "command": "wget -q -T 3 -O /dev/null http://example.com/"}),
        )
        .await;
    assert_ne!(unresolved["exitCode"], 0, "{unresolved}");
    let report = unresolved["blockedEgress"].as_array().unwrap();
    assert!(
        report
            .iter()
            .all(|b| b["host"] == "example.com" && b["operation"] == "resolve"),
        "only its own refusals, none of the previous command's: {unresolved}"
    );
    cleanup(&h).await;
}

/// Branch a running machine: the child has the source's disk, /tmp and running processes; the
/// source of a live child refuses delete; the session's end deletes both.
#[tokio::test]
async fn a_branch_copies_disk_and_processes_and_the_session_end_deletes_both() {
    let _one_at_a_time = serial().await;
    let h = harness(&[]).await;
    let name = created_name(&h, json!({"cpus": 1, "memoryMb": 256, "branchable": true})).await;
    h.ok(
        "run-command",
        json!({"name": name, "command": "echo state > /root/s; echo tmp > /tmp/t"}),
    )
    .await;
    h.ok(
        "run-command",
        json!({"name": name, "background": true, "command": "sleep 999"}),
    )
    .await;
    let child_name = format!("mcp-child-{}", &name[4..]);
    let child = h
        .ok(
            "branch-machine",
            json!({"name": name, "childName": child_name}),
        )
        .await;
    assert_eq!(child["ready"], true, "{child}");
    let r = h
        .ok(
            "run-command",
            json!({"name": child_name, "command": "cat /root/s /tmp/t; ps -o args | grep -c '^sleep 999'"}),
        )
        .await;
    assert_eq!(r["stdout"], "state\ntmp\n1\n", "{r}");
    let refused = crate::common::nested::rest()
        .delete(format!("{}/api/v1/machines/{name}", nested().url))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 409, "a live child's source");
    cleanup(&h).await;
    let left = engine_machines().await;
    assert!(
        !left.contains(&name) && !left.contains(&child_name),
        "{left:?}"
    );
}

/// One WebSocket session (RFC 6455) as `nc -lk -e` runs it, stdin and stdout the connection:
/// the handshake answered with the accept computed from the client's key, a text frame
/// "hello", then the client's first frame (10 bytes: "ping", masked) kept for the test.
const WEBSOCKET_SERVICE: &str = r#"#!/bin/sh
key=
while IFS= read -r line; do
  line=$(printf '%s' "$line" | tr -d '\r')
  [ -z "$line" ] && break
  case "$line" in
    [Ss]ec-[Ww]eb[Ss]ocket-[Kk]ey:*) key=$(printf '%s' "${line#*:}" | tr -d ' ') ;;
  esac
done
accept=$(printf '%s258EAFA5-E914-47DA-95CA-C5AB0DC85B11' "$key" | sha1sum | cut -d' ' -f1 | sed 's/../\\x&/g')
accept=$(printf "$accept" | base64)
printf 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n' "$accept"
printf '\201\005hello'
head -c 10 > /tmp/ws-received
"#;

/// The opening of a WebSocket from this host through `port`, as a browser's would be: the
/// upgrade with a fresh key, the server's accept checked against it, a text frame read, and a
/// masked one sent. Answers the first frame's payload.
async fn open_websocket(port: u16) -> Result<String, String> {
    use base64::Engine as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = b64.encode(rand::random::<[u8; 16]>());
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let upgrade = format!(
        "GET /socket HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    stream
        .write_all(upgrade.as_bytes())
        .await
        .map_err(|e| format!("upgrade: {e}"))?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let read = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut byte))
            .await
            .map_err(|_| format!("no answer to the upgrade within 20 s: {head:?}"))?
            .map_err(|e| format!("read: {e}"))?;
        if read == 0 {
            return Err(format!(
                "closed during the handshake: {:?}",
                String::from_utf8_lossy(&head)
            ));
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let digest = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes(),
    );
    let accept = b64.encode(digest.as_ref());
    if !head.starts_with("HTTP/1.1 101")
        || !head.contains(&format!("Sec-WebSocket-Accept: {accept}\r\n"))
    {
        return Err(format!("not the upgrade for key {key}: {head:?}"));
    }
    let mut frame = [0u8; 7];
    tokio::time::timeout(Duration::from_secs(20), stream.read_exact(&mut frame))
        .await
        .map_err(|_| "no frame within 20 s".to_owned())?
        .map_err(|e| format!("frame: {e}"))?;
    if frame[..2] != [0x81, 0x05] {
        return Err(format!("not a 5-byte text frame: {frame:?}"));
    }
    let mask: [u8; 4] = rand::random();
    let mut ping = vec![0x81, 0x84];
    ping.extend_from_slice(&mask);
    ping.extend(b"ping".iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
    stream
        .write_all(&ping)
        .await
        .map_err(|e| format!("send: {e}"))?;
    Ok(String::from_utf8_lossy(&frame[2..]).into_owned())
}

/// publish-port on the real guest: a WebSocket service started in the machine is found
/// listening, opened from this host through the URL the tool answers (the handshake, a frame
/// each way), listed by list-machines, and gone with the machine. Plain HTTP through a published
/// port is each client session's `publish` step.
#[tokio::test]
async fn a_published_port_carries_a_websocket_from_this_host() {
    use base64::Engine as _;
    let _one_at_a_time = serial().await;
    let port = nested().publish_ports[1];
    let range = format!("{port}-{port}");
    let h = harness(&[("SMOL_MCP_PUBLISH_PORTS", range.as_str())]).await;
    let name = created_name(&h, json!({"cpus": 1, "memoryMb": 256})).await;
    h.ok(
        "write-file",
        json!({"name": name, "path": "/tmp/ws.sh", "content": WEBSOCKET_SERVICE}),
    )
    .await;
    // Nothing listens yet: published all the same, and said so.
    let early = h
        .ok(
            "publish-port",
            json!({"name": name, "port": 8001, "waitSecs": 2}),
        )
        .await;
    assert_eq!(early["listening"], false, "{early}");
    assert_eq!(early["hostPort"], port, "{early}");
    assert_eq!(early["url"], format!("http://127.0.0.1:{port}"));
    h.ok(
        "run-command",
        json!({"name": name, "command": "chmod +x /tmp/ws.sh; nohup nc -lk -p 8001 -e /tmp/ws.sh >/dev/null 2>&1 </dev/null &"}),
    )
    .await;
    let published = h
        .ok(
            "publish-port",
            json!({"name": name, "port": 8001, "waitSecs": 60}),
        )
        .await;
    assert_eq!(published["listening"], true, "{published}");
    assert_eq!(
        published["url"], early["url"],
        "the same port, answered again"
    );
    let hello = open_websocket(port).await;
    assert_eq!(hello.as_deref(), Ok("hello"), "{hello:?}");
    let mut received = Vec::new();
    for _ in 0..20 {
        let (page, content) = h
            .read(json!({"name": name, "path": "/tmp/ws-received", "encoding": "base64"}))
            .await;
        received = base64::engine::general_purpose::STANDARD
            .decode(content)
            .unwrap();
        if page["size"] == 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(received.len(), 10, "{received:?}");
    assert_eq!(
        received[..2],
        [0x81, 0x84],
        "a masked text frame of 4 bytes"
    );
    let unmasked: Vec<u8> = received[6..]
        .iter()
        .zip(received[2..6].iter().cycle())
        .map(|(b, m)| b ^ m)
        .collect();
    assert_eq!(unmasked, b"ping");
    let record = h.ok("list-machines", json!({"name": name})).await["machines"][0].clone();
    assert_eq!(record["ports"], json!([{"guest": 8001, "host": port}]));
    h.ok("delete-machine", json!({"name": name})).await;
    let after = open_websocket(port).await;
    assert!(after.is_err(), "the port went with its machine: {after:?}");
    cleanup(&h).await;
}

/// The screen as a terminal emulator's model has it, on the real guest: busybox vi opened on a
/// file shows the file's lines and its status line, busybox top its header row, a line
/// redrawn many times its last state, and a resize the new number of rows.
#[tokio::test]
async fn a_terminal_answers_the_screen_vi_and_top_painted_on_the_real_guest() {
    let _one_at_a_time = serial().await;
    let h = harness(&[]).await;
    let name = created_name(&h, json!({"cpus": 1, "memoryMb": 256})).await;
    h.ok(
        "write-file",
        json!({"name": name, "path": "/root/plan.txt", "content": "first step\nsecond step\nthird step\n"}),
    )
    .await;
    let vi = h
        .ok(
            "terminal",
            json!({"name": name, "command": ["vi", "/root/plan.txt"], "waitMs": 10000, "screen": true}),
        )
        .await;
    let screen = &vi["screen"];
    eprintln!(
        "booted_guest: vi's screen as the agent receives it:\n{}",
        serde_json::to_string_pretty(screen).unwrap()
    );
    let rows = crate::common::strings(&screen["rows"]);
    assert_eq!(rows.len(), 24, "{screen}");
    assert_eq!(
        &rows[..3],
        ["first step", "second step", "third step"],
        "{screen}"
    );
    assert!(
        rows[23].contains("plan.txt"),
        "vi's status line names the file: {screen}"
    );
    assert_eq!(screen["cursor"], json!([0, 0]), "{screen}");
    let vi_id = vi["terminal"].as_str().unwrap().to_owned();
    let moved = type_into(&h, &name, &vi_id, json!({"input": "jjx", "screen": true})).await;
    assert_eq!(
        moved["screen"]["rows"][2], "hird step",
        "x deleted the character under the cursor, two lines down: {moved}"
    );
    assert_eq!(moved["screen"]["cursor"], json!([2, 0]), "{moved}");
    type_into(
        &h,
        &name,
        &vi_id,
        json!({"input": ":q!", "keys": ["enter"]}),
    )
    .await;

    let top = h
        .ok(
            "terminal",
            json!({"name": name, "command": ["top"], "waitMs": 5000, "screen": true}),
        )
        .await;
    let header = top["screen"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .find(|r| r.contains("PID") && r.contains("COMMAND"));
    assert!(header.is_some(), "top's header row: {top}");
    let top_id = top["terminal"].as_str().unwrap().to_owned();
    type_into(&h, &name, &top_id, json!({"input": "q"})).await;

    let counter = h
        .ok(
            "terminal",
            json!({"name": name, "command": "i=0; while [ $i -lt 200 ]; do i=$((i+1)); printf '\\rstep %d of 200' $i; done; sleep 30",
                   "waitMs": 8000, "screen": true}),
        )
        .await;
    let counter_id = counter["terminal"].as_str().unwrap().to_owned();
    // Under emulation the loop may pause longer than a call's quiet time: read again until
    // it has printed its last.
    let mut painted = counter["screen"].clone();
    for _ in 0..10 {
        if painted["rows"][0] == "step 200 of 200" {
            break;
        }
        painted = type_into(
            &h,
            &name,
            &counter_id,
            json!({"waitMs": 2000, "screen": true}),
        )
        .await["screen"]
            .clone();
    }
    assert_eq!(
        (&painted["rows"][0], &painted["rows"][1]),
        (&json!("step 200 of 200"), &json!("")),
        "the line's last state, not its 200 drawings: {painted}"
    );
    let resized = type_into(
        &h,
        &name,
        &counter_id,
        json!({"cols": 60, "rows": 10, "waitMs": 500, "screen": true}),
    )
    .await;
    assert_eq!(
        resized["screen"]["rows"].as_array().unwrap().len(),
        10,
        "{resized}"
    );
    type_into(&h, &name, &counter_id, json!({"close": true, "waitMs": 0})).await;
    cleanup(&h).await;
}

/// A terminal tool call on `terminal` in `machine`, waiting up to `wait_ms` for the output.
async fn type_into(h: &Harness, machine: &str, terminal: &str, args: Value) -> Value {
    let mut call = json!({"name": machine, "terminal": terminal, "waitMs": 5000});
    for (k, v) in args.as_object().unwrap() {
        call[k] = v.clone();
    }
    h.ok("terminal", call).await
}

/// The terminal on the real guest, through the engine's PTY: a script that prompts twice and
/// reads each answer with `read`, busybox `vi` writing a file, and a shell's size after a
/// resize and its prompt back after ctrl-c, each driven to its end.
#[tokio::test]
async fn a_terminal_drives_prompts_and_vi_on_the_real_guest() {
    let _one_at_a_time = serial().await;
    let h = harness(&[]).await;
    let name = created_name(&h, json!({"cpus": 1, "memoryMb": 256})).await;
    h.ok(
        "write-file",
        json!({"name": name, "path": "/root/ask.sh", "content":
            "printf 'name? '; read name; printf 'colour? '; read colour\n\
             echo \"$name likes $colour\" > /root/answers; echo done\n"}),
    )
    .await;
    let asked = h
        .ok(
            "terminal",
            json!({"name": name, "command": ["sh", "/root/ask.sh"], "waitMs": 10000}),
        )
        .await;
    assert!(
        asked["output"].as_str().unwrap().ends_with("name? "),
        "{asked}"
    );
    let id = asked["terminal"].as_str().unwrap().to_owned();
    let second = type_into(&h, &name, &id, json!({"input": "Ada", "keys": ["enter"]})).await;
    assert_eq!(second["output"], "Ada\ncolour? ", "{second}");
    let last = type_into(&h, &name, &id, json!({"input": "green", "keys": ["enter"]})).await;
    assert_eq!(last["output"], "green\ndone\n", "{last}");
    assert_eq!(last["ended"], "exited 0", "{last}");
    let (_, answers) = h.read(json!({"name": name, "path": "/root/answers"})).await;
    assert_eq!(answers, "Ada likes green\n");

    let vi = h
        .ok(
            "terminal",
            json!({"name": name, "command": ["vi", "/root/note.txt"], "waitMs": 10000}),
        )
        .await;
    let vi_id = vi["terminal"].as_str().unwrap().to_owned();
    type_into(
        &h,
        &name,
        &vi_id,
        json!({"input": "ihello from vi", "keys": ["escape"]}),
    )
    .await;
    let saved = type_into(
        &h,
        &name,
        &vi_id,
        json!({"input": ":wq", "keys": ["enter"]}),
    )
    .await;
    assert_eq!(saved["ended"], "exited 0", "{saved}");
    let (_, note) = h
        .read(json!({"name": name, "path": "/root/note.txt"}))
        .await;
    assert_eq!(note, "hello from vi\n");

    let shell = h
        .ok("terminal", json!({"name": name, "waitMs": 10000}))
        .await;
    let sh = shell["terminal"].as_str().unwrap().to_owned();
    let size = type_into(
        &h,
        &name,
        &sh,
        json!({"input": "stty size", "keys": ["enter"]}),
    )
    .await;
    assert!(size["output"].as_str().unwrap().contains("24 80"), "{size}");
    type_into(
        &h,
        &name,
        &sh,
        json!({"cols": 100, "rows": 30, "waitMs": 500}),
    )
    .await;
    let resized = type_into(
        &h,
        &name,
        &sh,
        json!({"input": "stty size", "keys": ["enter"]}),
    )
    .await;
    assert!(
        resized["output"].as_str().unwrap().contains("30 100"),
        "{resized}"
    );
    type_into(
        &h,
        &name,
        &sh,
        json!({"input": "sleep 300", "keys": ["enter"], "waitMs": 1000}),
    )
    .await;
    let interrupted = type_into(
        &h,
        &name,
        &sh,
        json!({"keys": ["ctrl-c"], "input": "", "waitMs": 5000}),
    )
    .await;
    let after = type_into(
        &h,
        &name,
        &sh,
        json!({"input": "echo back", "keys": ["enter"]}),
    )
    .await;
    assert!(
        after["output"].as_str().unwrap().contains("back\n"),
        "{interrupted} then {after}"
    );
    assert!(after.get("ended").is_none(), "{after}");
    let raw = h
        .ok(
            "terminal",
            json!({"name": name, "terminal": sh, "cursor": 0, "raw": true, "waitMs": 0}),
        )
        .await;
    assert!(
        raw["output"].as_str().unwrap().contains("\r\n"),
        "raw keeps the PTY's line ends: {raw}"
    );
    let closed = h
        .ok(
            "terminal",
            json!({"name": name, "terminal": sh, "close": true}),
        )
        .await;
    assert_eq!(closed["ended"], "closed: closed by the agent", "{closed}");
    cleanup(&h).await;
}

/// The counter `/tmp/count` in `name`, and whether the command brought the machine up. The
/// counting loops write a new file and rename it over the old: `echo $i > /tmp/count` empties
/// the file before it writes, and a read between the two came back empty once in CI.
async fn count_in(h: &Harness, name: &str) -> (u64, bool) {
    let r = h
        .ok(
            "run-command",
            json!({"name": name, "command": "cat /tmp/count"}),
        )
        .await;
    let n: u64 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
    (n, r["startedMachine"] == true)
}

/// stop-machine with pause on the real guest: a counting loop started in the machine, the
/// machine paused (the engine saves it whole; minutes under TCG, past its own 300 s request
/// deadline), then a command resumes it and says so, and the loop has gone on from where it
/// stood, /tmp (RAM) kept. Prints the figures docs/benchmarks.md quotes.
///
/// The save keeps the engine's one emulated CPU busy for 11 to 16 minutes (docs/benchmarks.md):
/// scripts/test.sh gives this test a nested engine of its own (`SMOL_NESTED_PAUSE_URL`), where
/// it runs beside the other guest tests instead of holding them up. Without one it takes the
/// first engine, in turn with the others.
#[tokio::test]
async fn a_paused_machine_keeps_its_processes_and_the_next_command_resumes_it() {
    let own_engine = std::env::var("SMOL_NESTED_PAUSE_URL")
        .ok()
        .filter(|u| !u.is_empty());
    let _one_at_a_time = match own_engine {
        Some(_) => None,
        None => Some(serial().await),
    };
    let url = own_engine.unwrap_or_else(|| nested().url);
    let h = harness(&[("SMOL_LOCAL_URL", url.as_str())]).await;
    let port = crate::common::real_serve::free_port();
    let host = HostServer::start(port, None).await;
    // The smallest memory the server allows: the save is the guest's RAM. One allowed address,
    // to see the egress policy come back with the machine.
    let created = create(
        &h,
        json!({"cpus": 1, "memoryMb": 128, "branchable": true, "allowCidrs": ["10.0.2.2/32"]}),
    )
    .await;
    let name = created["machine"]["name"].as_str().unwrap().to_owned();
    h.ok(
        "run-command",
        json!({"name": name, "command": "nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 1; done' >/dev/null 2>&1 </dev/null &"}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (before, _) = count_in(&h, &name).await;
    assert!(before >= 1, "the loop counts: {before}");
    let began = Instant::now();
    // Bounded below the server's own 30 minutes, so that a hung outer VM fails the run in time
    // for scripts/test.sh to bring a fresh one up and try again.
    let paused = tokio::time::timeout(
        Duration::from_secs(25 * 60),
        h.ok("stop-machine", json!({"name": name, "pause": true})),
    )
    .await
    .expect("the pause answered within 25 minutes");
    let pause_secs = began.elapsed().as_secs_f64();
    assert_eq!(paused["machine"]["state"], "paused", "{paused}");
    let listed = engine_listing_at(&url).await;
    let state = listed["machines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name.as_str())
        .map(|m| m["state"].clone());
    assert_eq!(state, Some(json!("paused")), "the engine's own record");
    let began = Instant::now();
    let (resumed_at, started) = count_in(&h, &name).await;
    let resume_secs = began.elapsed().as_secs_f64();
    assert!(started, "the command says it brought the machine up");
    assert!(
        resumed_at >= before,
        "the loop's count survived the pause: {before} then {resumed_at}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (later, started) = count_in(&h, &name).await;
    assert!(!started);
    assert!(
        later > resumed_at,
        "still counting: {resumed_at} then {later}"
    );
    // A resumed machine keeps its egress policy: its address reached, another refused by it.
    let reached = h
        .ok(
            "run-command",
            json!({"name": name, "command": format!("wget -q -T 10 -O- http://10.0.2.2:{port}/after-resume")}),
        )
        .await;
    assert_eq!(reached["stdout"], "hello from the host\n", "{reached}");
    assert!(host.events().iter().any(|e| e["path"] == "/after-resume"));
    let refused = h
        .ok(
            "run-command",
            json!({"name": name, "command": "wget -q -T 3 -O /dev/null http://1.1.1.1/"}),
        )
        .await;
    assert_eq!(
        refused["blockedEgress"],
        json!([{"host": "1.1.1.1", "port": 80, "operation": "connect", "count": 1}]),
        "{refused}"
    );
    eprintln!(
        "booted_guest: figure: pause of a 128 MiB machine {pause_secs:.1} s; a command on it \
         (resume included) {resume_secs:.1} s"
    );
    cleanup(&h).await;
}

/// A cancelled run-command's command, and what it started, is killed in the guest.
#[tokio::test]
async fn a_cancelled_command_is_killed_in_the_guest() {
    let _one_at_a_time = serial().await;
    let h = harness(&[]).await;
    let name = created_name(&h, json!({"cpus": 1, "memoryMb": 256})).await;
    let args = json!({"name": name, "command": "sleep 271 & sleep 272", "timeoutSecs": 280});
    let handle = h.start_call("run-command", args).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    handle.cancel(Some("test".into())).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ps = h
            .ok(
                "run-command",
                json!({"name": name, "command": "ps -o args"}),
            )
            .await;
        let listing = ps["stdout"].as_str().unwrap().to_owned();
        if !listing.contains("sleep 271") && !listing.contains("sleep 272") {
            break;
        }
        assert!(Instant::now() < deadline, "still running: {listing}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    cleanup(&h).await;
}

/// The engine's exec/stream is live: the first line arrives seconds before the end, and a CR
/// comes back as it was.
#[tokio::test]
async fn the_engines_exec_stream_is_live() {
    use smol_mcp::fleet::transport::LocalEndpoint;
    use smol_mcp::fleet::{Command, ExecSpec, FleetApi, LocalFleet};
    let _one_at_a_time = serial().await;
    let h = harness(&[]).await;
    let name = created_name(&h, json!({"cpus": 1, "memoryMb": 256})).await;
    let fleet = LocalFleet::new(LocalEndpoint::parse(&nested().url).unwrap()).unwrap();
    let (sender, mut pieces) = tokio::sync::mpsc::unbounded_channel();
    let spec = ExecSpec::new(Command::Shell(
        "echo first; sleep 3; printf 'a\\r\\nb'".into(),
    ));
    let began = Instant::now();
    let machine = name.clone();
    let run = tokio::spawn(async move { fleet.exec_streamed(&machine, &spec, &sender).await });
    let first = pieces.recv().await.unwrap();
    let first_at = began.elapsed();
    let out = run.await.unwrap().unwrap();
    let ended_at = began.elapsed();
    assert_eq!(first.text, "first\n");
    assert!(
        ended_at - first_at > Duration::from_secs(2),
        "first {first_at:?}, end {ended_at:?}"
    );
    assert_eq!(out.stdout, b"first\na\r\nb");
    cleanup(&h).await;
}

/// With a serve at `localUrl`, smol://targets and doctor report that serve's own facts (its
/// health answer), not this host's KVM or engine binary; and doctor boots a guest there.
#[tokio::test]
async fn targets_and_doctor_describe_the_named_serve() {
    // doctor boots a machine of its own on the engine.
    let _one_at_a_time = serial().await;
    let h = harness(&[]).await;
    let t = h.resource("smol://targets").await;
    let local = &t["fleets"][0];
    assert_eq!(local["serve"]["named"], true, "{local}");
    assert_eq!(local["serve"]["answering"], true, "{local}");
    assert_eq!(local["engine"]["version"], "1.32.2", "{local}");
    assert_eq!(local["hypervisor"], Value::Null, "not this host's: {local}");
    assert_eq!(local["usable"], true, "{local}");
    let rt = tempfile::tempdir().unwrap();
    let url = nested().url;
    let env = crate::common::stdio::server_env(
        rt.path(),
        &[
            ("SMOL_LOCAL_URL", url.as_str()),
            ("SMOL_MCP_READY_TIMEOUT_SECS", READY_SECS),
        ],
    );
    let out = std::process::Command::new(crate::common::stdio::SERVER)
        .arg("doctor")
        .env_clear()
        .envs(env)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("answering at") && text.contains("SMOL_LOCAL_URL"),
        "{text}"
    );
    assert!(!text.contains("/dev/kvm"), "{text}");
    // A real boot on the real engine: the bundled Alpine, one command, the time it took.
    assert!(
        text.contains("booted the engine's bundled Alpine and ran `uname -sr` (Linux"),
        "{text}"
    );
}

/// One whole session under each real client, over each transport, on the real guest.
async fn client_session(program: &str, script: &str, transport: &str) {
    let _one_at_a_time = serial().await;
    let rt = tempfile::tempdir().unwrap();
    let url = nested().url;
    let publish_port = nested().publish_ports[1];
    let range = format!("{publish_port}-{publish_port}");
    // Small machines: the nested engine's guests share its 8 GiB, and a session holds three.
    let vars = [
        ("SMOL_LOCAL_URL", url.as_str()),
        ("SMOL_MCP_PUBLISH_PORTS", range.as_str()),
        ("SMOL_MCP_READY_TIMEOUT_SECS", READY_SECS),
        ("SMOL_MCP_MACHINE_LEASE_SECS", "20"),
        ("SMOL_MCP_CPUS", "1"),
        ("SMOL_MCP_MEMORY_MB", "512"),
    ];
    let mut server = None;
    let plan = if transport == "stdio" {
        let env = crate::common::stdio::server_env(rt.path(), &vars);
        json!({"transport": "stdio", "server": crate::common::stdio::SERVER,
               "env": crate::common::clients::env_object(env), "engineUrl": url, "mode": "legacy"})
    } else {
        let token = "booted-session-token";
        let http = crate::common::clients::HttpServer::spawn(rt.path(), token, &vars).await;
        let plan = json!({"transport": "http", "url": http.url, "token": token,
                          "engineUrl": url, "mode": "legacy"});
        server = Some(http);
        plan
    };
    let mut report =
        crate::common::clients::run_client_for(program, script, &plan, Duration::from_secs(420))
            .await;
    // An engine fault under TCG (a boot that exits before its agent is ready, a fork whose
    // agent connection closes: each seen once in a few dozen sessions here) is the engine's,
    // not the server's: the session is run once more, and the output says so.
    let engine_fault = |report: &Value| {
        report["steps"].as_object().is_some_and(|steps| {
            steps.values().any(|s| {
                s["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("HTTP 500") && e.contains("agent"))
            })
        })
    };
    if engine_fault(&report) {
        eprintln!(
            "booted_guest: an engine fault in the {script} session over {transport}; running it once more: {report}"
        );
        report = crate::common::clients::run_client_for(
            program,
            script,
            &plan,
            Duration::from_secs(420),
        )
        .await;
    }
    if let Some(mut http) = server {
        http.child.start_kill().unwrap();
        http.child.wait().await.unwrap();
    }
    let steps = &report["steps"];
    for step in [
        "initialize",
        "tools",
        "create",
        "progress",
        "job",
        "files",
        "logs",
        "branch",
        "publish",
        "terminal",
        "runOnce",
        "end",
    ] {
        assert_eq!(
            steps[step]["ok"], true,
            "{script} over {transport}, step {step}: {}",
            steps[step]
        );
    }
    assert_eq!(
        steps["job"]["stdout"], "job 1\njob 2\njob 3\n",
        "{}",
        steps["job"]
    );
    assert_eq!(steps["job"]["exitCode"], 3, "{}", steps["job"]);
    // The PNG a command wrote came back as one image block the client decoded as such.
    assert_eq!(
        steps["files"]["image"],
        json!({"encoding": "image", "types": ["image/png"]}),
        "{}",
        steps["files"]
    );
    // The guest's service, fetched from this host through the URL publish-port answered.
    assert_eq!(
        (
            steps["publish"]["body"].clone(),
            steps["publish"]["url"].clone()
        ),
        (
            json!("hello from the guest\n"),
            json!(format!("http://127.0.0.1:{publish_port}"))
        ),
        "{}",
        steps["publish"]
    );
    assert_eq!(steps["end"]["remaining"], json!([]), "{}", steps["end"]);
    assert_eq!(report["ok"], true, "{report}");
}

#[tokio::test]
async fn a_session_under_the_python_client_over_stdio() {
    client_session("python", "booted_session.py", "stdio").await;
}

#[tokio::test]
async fn a_session_under_the_python_client_over_http() {
    client_session("python", "booted_session.py", "http").await;
}

#[tokio::test]
async fn a_session_under_the_typescript_sdk_over_stdio() {
    client_session("node", "booted_session.mjs", "stdio").await;
}

#[tokio::test]
async fn a_session_under_the_typescript_sdk_over_http() {
    client_session("node", "booted_session.mjs", "http").await;
}

/// A server of this host that the nested guests reach as 10.0.2.2 (QEMU's user network), run by
/// `tests/clients/host_server.py`, with the events it recorded: requests, and for TLS each
/// handshake's server name.
pub(crate) struct HostServer {
    child: tokio::process::Child,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl HostServer {
    pub(crate) async fn start(port: u16, tls_names: Option<&[&str]>) -> HostServer {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("events.jsonl");
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/host_server.py");
        let mut command = tokio::process::Command::new("python3");
        command.arg(&script).arg(port.to_string()).arg(&log);
        if let Some(names) = tls_names {
            let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
            let san: Vec<String> = names.iter().map(|n| format!("DNS:{n}")).collect();
            let made = std::process::Command::new("openssl")
                .args([
                    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                ])
                .arg(format!("/CN={}", names[0]))
                .arg("-addext")
                .arg(format!("subjectAltName={}", san.join(",")))
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&cert)
                .output()
                .unwrap();
            assert!(made.status.success(), "openssl: {made:?}");
            command.arg(&cert).arg(&key);
        }
        let child = command.kill_on_drop(true).spawn().unwrap();
        let server = HostServer {
            child,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !server.events().iter().any(|e| e["event"] == "listening") {
            assert!(
                Instant::now() < deadline,
                "the host server did not listen on port {port} (443 needs root)"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        server
    }

    pub(crate) fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for HostServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Credential bindings on the real 1.32.2 guest. The workload holds only the placeholder (in
/// its variable; the value is in none of its files). A request to the binding's host on 443 is
/// taken by the engine's interceptor, which goes upstream only with a value to put in it: the
/// host server sees a TLS handshake for that name (the engine's outbound path then refuses the
/// test server's self-signed certificate, and 1.32.2 has no way to make it accept one, so the
/// request itself is not seen in clear); a machine the engine has no value for makes no such
/// handshake. A request to any other host carries the placeholder, not the value.
#[tokio::test]
async fn credentials_reach_only_their_hosts_on_the_real_guest() {
    const VALUE: &str = "booted-secret-4d1f9a77c0";
    let _one_at_a_time = serial().await;
    let server = HostServer::start(443, Some(&["creds.smol.test", "other.smol.test"])).await;
    let bindings = json!([{"name": "tok", "env": "TOK", "hosts": ["creds.smol.test"], "fromEnv": "SMOL_BOOTED_TOKEN"}])
        .to_string();
    let h = harness(&[
        ("SMOL_MCP_CREDENTIALS", &bindings),
        ("SMOL_BOOTED_TOKEN", VALUE),
    ])
    .await;
    let created = create(
        &h,
        json!({"cpus": 1, "memoryMb": 256, "allowCidrs": ["10.0.2.2/32"], "credentials": ["tok"], "branchable": true}),
    )
    .await;
    let name = created["machine"]["name"].as_str().unwrap().to_owned();
    let hosts = "echo '10.0.2.2 creds.smol.test other.smol.test' >> /etc/hosts";
    // The workload: the placeholder in its variable, the value nowhere in its files (the
    // server would show a value it printed as the binding's name).
    let seen = h
        .ok(
            "run-command",
            json!({"name": name, "command": format!("{hosts}; echo \"$TOK\"; grep -rlF '{VALUE}' /etc /root /tmp /run /var 2>/dev/null; true")}),
        )
        .await;
    let stdout = seen["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("SMOL_PLACEHOLDER_TOK_"), "{seen}");
    assert_eq!(stdout.lines().count(), 1, "a file holds the value: {seen}");
    let placeholder = stdout.trim().to_owned();

    let request = |host: &str, path: &str| {
        format!(
            "wget -S -q -T 20 -O- --no-check-certificate --header \"Authorization: Bearer $TOK\" https://{host}/{path} 2>&1; true"
        )
    };
    let bound = h
        .ok(
            "run-command",
            json!({"name": name, "command": request("creds.smol.test", "bound")}),
        )
        .await;
    assert!(bound["stdout"].as_str().unwrap().contains("502"), "{bound}");
    let other = h
        .ok(
            "run-command",
            json!({"name": name, "command": request("other.smol.test", "other")}),
        )
        .await;
    assert!(
        other["stdout"]
            .as_str()
            .unwrap()
            .contains("hello from the host"),
        "{other}"
    );
    let events = server.events();
    let handshakes: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "handshake" && e["sni"] == "creds.smol.test")
        .collect();
    assert!(
        !handshakes.is_empty(),
        "the engine went upstream for the bound host: {events:?}"
    );
    assert!(
        !events.iter().any(|e| e["path"] == "/bound"),
        "the bound request was not seen in clear: {events:?}"
    );
    let to_other: Vec<&Value> = events.iter().filter(|e| e["path"] == "/other").collect();
    assert_eq!(to_other.len(), 1, "{events:?}");
    assert_eq!(to_other[0]["auth"], format!("Bearer {placeholder}"));
    assert!(!serde_json::to_string(&events).unwrap().contains(VALUE));

    // A branch child has the source's binding and its value from the branch on (1.32.2 gives
    // it the source's; the server records the child's bindings for its later boots).
    let child = "mcp-cred-child";
    h.ok("branch-machine", json!({"name": name, "childName": child}))
        .await;
    goes_upstream(&h, &server, child, request("creds.smol.test", "child")).await;
    assert_eq!(
        h.protocol.process().credentials.bound_to(child).await,
        ["tok"]
    );

    // Made a base, the machine's child (create-machine base) holds the binding its user gave
    // the source, its value going upstream, and no other placeholder.
    h.ok(
        "branch-machine",
        json!({"name": name, "childName": "mcp-cred-freeze", "freezeSource": true}),
    )
    .await;
    let base_child = "mcp-cred-base-child";
    h.ok("create-machine", json!({"base": name, "name": base_child}))
        .await;
    let placeholders = h
        .ok(
            "run-command",
            json!({"name": base_child, "command": "env | grep -c SMOL_PLACEHOLDER_; env | grep -o '^[A-Z_]*=SMOL_PLACEHOLDER_' "}),
        )
        .await;
    assert_eq!(
        placeholders["stdout"], "1\nTOK=SMOL_PLACEHOLDER_\n",
        "{placeholders}"
    );
    goes_upstream(
        &h,
        &server,
        base_child,
        request("creds.smol.test", "base-child"),
    )
    .await;
    assert_eq!(
        h.protocol.process().credentials.bound_to(base_child).await,
        ["tok"]
    );

    // The contrast: the same binding on a machine the engine has no value for (made through
    // its own API, no values supplied) goes nowhere upstream.
    let url = nested().url;
    let rest = crate::common::nested::rest();
    let bare = "creds-novalue";
    let made = rest
        .post(format!("{url}/api/v1/machines"))
        .json(&json!({"name": bare, "cpus": 1, "memoryMb": 256, "network": false,
                      "allowedHosts": ["creds.smol.test"], "allowedCidrs": ["10.0.2.2/32"],
                      "credentials": {"credentials": [{"name": "tok", "environment_variable": "TOK", "allowed_hosts": ["creds.smol.test"]}]}}))
        .send()
        .await
        .unwrap();
    assert!(made.status().is_success(), "{made:?}");
    let started = rest
        .post(format!("{url}/api/v1/machines/{bare}/start"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert!(started.status().is_success(), "{started:?}");
    let before = server.events().len();
    let answer = json_answer(
        rest.post(format!("{url}/api/v1/machines/{bare}/exec"))
            .json(&json!({"command": ["sh", "-c", format!("{hosts}; {}", request("creds.smol.test", "novalue"))], "timeoutSecs": 60})),
    )
    .await;
    assert!(
        answer["stdout"].as_str().unwrap().contains("502"),
        "{answer}"
    );
    let after: Vec<Value> = server.events().split_off(before);
    assert!(
        !after.iter().any(|e| e["event"] == "handshake"),
        "no value, no upstream: {after:?}"
    );
    let _ = rest
        .delete(format!("{url}/api/v1/machines/{bare}"))
        .send()
        .await;
    // The session's end leaves the base; it goes by a delete once its children are gone.
    cleanup(&h).await;
    h.ok("delete-machine", json!({"name": name})).await;
}

/// `request` (to the bound host) from `machine`: the engine's interceptor went upstream with the
/// value (a TLS handshake for that name at the test host's server) and, refusing the test
/// server's certificate, answered 502.
async fn goes_upstream(h: &Harness, server: &HostServer, machine: &str, request: String) {
    let before = server.events().len();
    let answered = h
        .ok("run-command", json!({"name": machine, "command": request}))
        .await;
    assert!(
        answered["stdout"].as_str().unwrap().contains("502"),
        "{machine}: {answered}"
    );
    let after: Vec<Value> = server.events().split_off(before);
    assert!(
        after
            .iter()
            .any(|e| e["event"] == "handshake" && e["sni"] == "creds.smol.test"),
        "{machine}'s request went upstream with the value: {after:?}"
    );
}

/// A network "ask" machine on the real guest: a command refused two addresses; the user allows
/// one and declines the other; the allowed one is reached on the retry (the engine took the
/// addition on the running machine), the declined one stays refused and is not asked again.
#[tokio::test]
async fn the_user_widens_an_ask_machine_live_on_the_real_guest() {
    let _one_at_a_time = serial().await;
    let port = crate::common::real_serve::free_port();
    let server = HostServer::start(port, None).await;
    let url = nested().url;
    let runtime = tempfile::tempdir().unwrap();
    let protocol = Protocol::start(crate::common::mcp::config(
        &[
            ("SMOL_LOCAL_URL", url.as_str()),
            ("SMOL_MCP_READY_TIMEOUT_SECS", READY_SECS),
        ],
        &runtime.path().join("rt"),
    ))
    .unwrap();
    let server_side = SmolMcp::new(protocol.clone(), "booted-ask".to_owned());
    let client_io = crate::common::mcp::serve_in_memory(server_side, 1 << 20);
    let user = crate::common::asker::User::new(true, vec!["10.0.2.2"]);
    let questions = user.questions.clone();
    let client = user.serve(client_io).await.unwrap();
    let call = |tool: &'static str, args: Value| {
        let client = &client;
        async move {
            let result = client
                .call_tool(
                    CallToolRequestParams::new(tool)
                        .with_arguments(args.as_object().unwrap().clone()),
                )
                .await
                .unwrap();
            assert_ne!(result.is_error, Some(true), "{tool}: {result:?}");
            result.structured_content.unwrap()
        }
    };
    let created = call(
        "create-machine",
        json!({"cpus": 1, "memoryMb": 256, "network": "ask"}),
    )
    .await;
    let name = created["machine"]["name"].as_str().unwrap().to_owned();
    let first = call(
        "run-command",
        json!({"name": name, "command": format!("wget -q -T 5 -O- http://10.0.2.2:{port}/first; r=$?; wget -q -T 5 -O- http://10.0.2.3:8080/; exit $r")}),
    )
    .await;
    assert_ne!(first["exitCode"], 0, "{first}");
    assert_eq!(
        first["egressAnswer"],
        json!({"allowed": ["10.0.2.2"], "declined": ["10.0.2.3"]}),
        "{first}"
    );
    assert_eq!(questions.lock().unwrap().len(), 1);
    let again = call(
        "run-command",
        json!({"name": name, "command": format!("wget -q -T 10 -O- http://10.0.2.2:{port}/second")}),
    )
    .await;
    assert_eq!(again["exitCode"], 0, "{again}");
    assert_eq!(again["stdout"], "hello from the host\n");
    assert!(server.events().iter().any(|e| e["path"] == "/second"));
    let still = call(
        "run-command",
        json!({"name": name, "command": "wget -q -T 5 -O- http://10.0.2.3:8080/"}),
    )
    .await;
    assert_ne!(still["exitCode"], 0, "{still}");
    assert_eq!(
        still["egressAnswer"]["declined"],
        json!(["10.0.2.3"]),
        "{still}"
    );
    assert_eq!(questions.lock().unwrap().len(), 1, "not asked again");
    // A name a command looks up is put to the user too: the engine filters the lookups of a
    // machine whose list is in force (sent with an empty host list) and records the name.
    let named = call(
        "run-command",
        json!({"name": name, "command": "wget -q -T 5 -O /dev/null http://pypi.org/"}),
    )
    .await;
    assert_ne!(named["exitCode"], 0, "{named}");
    assert_eq!(
        named["egressAnswer"],
        json!({"allowed": [], "declined": ["pypi.org"]}),
        "{named}"
    );
    assert_eq!(questions.lock().unwrap().len(), 2, "asked about the name");
    let machine = call("list-machines", json!({"name": name})).await["machines"][0].clone();
    assert_eq!(machine["network"], "allow(10.0.2.2/32)", "{machine}");
    let cleanup = protocol.process().cleanup_session("booted-ask").await;
    assert!(cleanup.failed.is_empty(), "{cleanup:?}");
}

/// The engine's view of a pool (`None` once deleted).
async fn engine_pool(name: &str) -> Option<Value> {
    let answer = crate::common::nested::rest()
        .get(format!("{}/api/v1/pools/{name}", nested().url))
        .send()
        .await
        .unwrap();
    if answer.status() == 404 {
        return None;
    }
    Some(answer.json().await.unwrap())
}

async fn until_pool_ready(name: &str, ready: i64, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let pool = engine_pool(name).await;
        if pool
            .as_ref()
            .is_some_and(|p| p["ready"].as_i64() >= Some(ready))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "pool {name} not ready with {ready} within {limit:?}: {pool:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Warm machines on the real engine: the server sets the operator's pool up at its first local
/// call (a source booted branchable, its branchpoint declared, the engine's fork pool over it),
/// an unnamed create-machine and a run-once of the pool's shape lease a ready clone (the
/// answer says so), the lease's env reaches later commands, a machine of another shape is made
/// cold, delete-machine completes the lease (the engine deletes the clone and refills), and the
/// pool and its source go at the process's end. Neither the source nor a ready clone is listed.
#[tokio::test]
async fn warm_machines_come_from_the_pool_and_go_back() {
    let _one_at_a_time = serial().await;
    let pools = r#"[{"name": "bt", "size": 2, "cpus": 1, "memoryMb": 256}]"#;
    let h = harness(&[("SMOL_MCP_POOLS", pools)]).await;
    h.ok("list-machines", json!({})).await;
    until_pool_ready("smolmcp-bt", 2, Duration::from_secs(300)).await;
    let listed = h.ok("list-machines", json!({})).await;
    assert!(
        !listed.to_string().contains("smolmcp-"),
        "the source and ready clones are not the agent's: {listed}"
    );
    // Nor can a tool reach them by name: the engine says which clone a pool still holds.
    let machines = engine_listing().await;
    let ready_clone = machines["machines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| {
            m["forkpointHeld"] == true
                && m["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("pool-smolmcp-bt-"))
        })
        .and_then(|m| m["name"].as_str())
        .unwrap_or_else(|| panic!("no ready clone among {machines}"))
        .to_owned();
    for name in ["smolmcp-pool-bt", ready_clone.as_str()] {
        let text = h
            .err(
                "run-command",
                json!({"name": name, "command": "touch /tmp/left-by-an-agent"}),
            )
            .await;
        assert!(text.starts_with("INVALID_ARGUMENT: name: "), "{text}");
    }

    let warm = h
        .ok(
            "create-machine",
            json!({"cpus": 1, "memoryMb": 256, "env": {"JOB": "42"}}),
        )
        .await;
    assert_eq!(warm["pool"], "bt", "{warm}");
    assert_eq!(warm["ready"], true, "{warm}");
    let name = warm["machine"]["name"].as_str().unwrap().to_owned();
    assert!(name.starts_with("pool-smolmcp-bt-"), "{name}");
    let r = h
        .ok(
            "run-command",
            json!({"name": name, "command": "echo job=$JOB", "usage": true}),
        )
        .await;
    assert_eq!(r["stdout"], "job=42\n", "{r}");
    assert!(r["usage"]["cpuMillis"].is_i64(), "the run's cost: {r}");

    let once = h
        .ok(
            "run-once",
            json!({"cpus": 1, "memoryMb": 256, "command": "echo once"}),
        )
        .await;
    assert_eq!(
        (once["stdout"].as_str(), once["pool"].as_str()),
        (Some("once\n"), Some("bt")),
        "{once}"
    );

    let cold = create(&h, json!({"cpus": 1, "memoryMb": 384})).await;
    assert!(
        cold.get("pool").is_none(),
        "another shape is made cold: {cold}"
    );

    h.ok("delete-machine", json!({"name": name})).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while engine_machines().await.contains(&name) {
        assert!(
            Instant::now() < deadline,
            "the completed lease's clone stayed"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    until_pool_ready("smolmcp-bt", 2, Duration::from_secs(120)).await;

    cleanup(&h).await;
    h.tear_down_local_pools().await;
    assert!(engine_pool("smolmcp-bt").await.is_none());
    assert!(
        !engine_machines()
            .await
            .iter()
            .any(|m| m.contains("smolmcp-")),
        "the source and clones went with the pool"
    );
}

/// A user's repository in `dir/app` whose test passes once `src/retry.sh` asks for three
/// retries or more (it asks for one), committed: its path and commit.
fn retry_project(dir: &std::path::Path) -> (std::path::PathBuf, String) {
    let repo = dir.join("app");
    std::fs::create_dir_all(repo.join("src")).unwrap();
    let git = |args: &[&str]| crate::common::git(&repo, args);
    git(&["init", "--quiet", "--initial-branch", "main"]);
    std::fs::write(repo.join("src/retry.sh"), "retries=1\n").unwrap();
    std::fs::write(
        repo.join("test.sh"),
        "#!/bin/sh\n. ./src/retry.sh\n[ \"$retries\" -ge 3 ] && echo passed || { echo failed; exit 1; }\n",
    )
    .unwrap();
    git(&["add", "."]);
    git(&["commit", "--quiet", "-m", "one retry"]);
    let head = git(&["rev-parse", "HEAD"]);
    (repo, head)
}

/// A git repository of this host's as a machine's workspace on the real guest, through the
/// guest's own busybox `tar`: the commit in, a change made by a command, the diff seen, the
/// change kept as a branch and checked out on the host; then three children of one base, each
/// told apart by its own variable and editing at once, one kept and its siblings deleted.
#[tokio::test]
async fn a_workspace_goes_in_and_the_best_of_three_tries_comes_back_as_a_branch() {
    let _one_at_a_time = serial().await;
    let tmp = tempfile::tempdir().unwrap();
    let (repo, head) = retry_project(tmp.path());
    let git = |args: &[&str]| crate::common::git(&repo, args);
    let allow = tmp.path().display().to_string();
    let store = tmp.path().join("copies").display().to_string();
    let h = harness(&[
        ("SMOL_MCP_MOUNT_ALLOW", allow.as_str()),
        ("SMOL_MCP_WORKSPACE_DIR", store.as_str()),
    ])
    .await;
    let created = create(
        &h,
        json!({"cpus": 1, "memoryMb": 256, "branchable": true,
               "workspace": repo.display().to_string()}),
    )
    .await;
    let name = created["machine"]["name"].as_str().unwrap().to_owned();
    assert_eq!(created["workspace"]["base"], head.as_str(), "{created}");
    let failing = h
        .ok(
            "run-command",
            json!({"name": name, "command": "cd /workspace && sh test.sh"}),
        )
        .await;
    assert_eq!(failing["stdout"], "failed\n", "the commit is in: {failing}");

    // One try in the machine itself: changed, seen, kept, checked out here.
    h.ok(
        "run-command",
        json!({"name": name, "command": "cd /workspace && echo retries=3 > src/retry.sh && sh test.sh"}),
    )
    .await;
    let changes = h
        .call(
            "read-file",
            json!({"name": name, "path": "/workspace", "changes": true}),
        )
        .await;
    assert!(!changes.is_error, "{}", changes.text);
    assert_eq!(
        changes.structured["changes"]["files"],
        json!([{"path": "src/retry.sh", "change": "modified", "bytes": 10, "binary": false}]),
        "{}",
        changes.text
    );
    assert!(
        changes.blocks[1].contains("-retries=1\n+retries=3"),
        "{}",
        changes.blocks[1]
    );
    let kept = h
        .ok(
            "keep-changes",
            json!({"name": name, "message": "Retry three times", "branch": "try/own"}),
        )
        .await;
    assert_eq!(kept["branch"], "try/own");
    git(&["worktree", "add", "--quiet", "../checked-out", "try/own"]);
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("checked-out/src/retry.sh")).unwrap(),
        "retries=3\n"
    );
    assert_eq!(
        git(&["rev-parse", "HEAD"]),
        head,
        "the user's checkout did not move"
    );

    // Three tries at once from the machine as it stands.
    let base = format!("{name}-try");
    let branched = h
        .ok(
            "branch-machine",
            json!({"name": name, "childName": base, "count": 3,
                   "env": [{"N": "2"}, {"N": "5"}, {"N": "9"}]}),
        )
        .await;
    let children: Vec<String> = serde_json::from_value(branched["children"].clone()).unwrap();
    assert_eq!(children.len(), 3, "{branched}");
    let runs = children.iter().map(|child| {
        h.call(
            "run-command",
            json!({"name": child, "command":
                ". /etc/smol/branch-env && cd /workspace && echo retries=$N > src/retry.sh && sh test.sh"}),
        )
    });
    let answers = futures::future::join_all(runs).await;
    let outputs: Vec<String> = answers
        .iter()
        .map(|a| {
            a.structured["stdout"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(outputs, ["failed\n", "passed\n", "passed\n"], "{answers:?}");
    for (child, n) in children.iter().zip(["2", "5", "9"]) {
        let changes = h
            .call(
                "read-file",
                json!({"name": child, "path": "/workspace", "changes": true}),
            )
            .await;
        assert!(!changes.is_error, "{}", changes.text);
        assert!(
            changes.blocks[1].contains(&format!("+retries={n}")),
            "{child}: {}",
            changes.blocks[1]
        );
        assert_eq!(changes.structured["changes"]["base"], head.as_str());
    }
    let kept = h
        .ok(
            "keep-changes",
            json!({"name": children[1], "message": "Retry five times",
                   "deleteSiblings": true}),
        )
        .await;
    let mut deleted: Vec<String> = serde_json::from_value(kept["deleted"].clone()).unwrap();
    deleted.sort();
    assert_eq!(deleted, vec![children[0].clone(), children[2].clone()]);
    let branch = kept["branch"].as_str().unwrap();
    assert_eq!(
        git(&["show", &format!("{branch}:src/retry.sh")]),
        "retries=5"
    );
    let left = engine_machines().await;
    assert!(
        !left.contains(&children[0]) && !left.contains(&children[2]),
        "{left:?}"
    );
    assert!(left.contains(&children[1]), "{left:?}");
    for machine in [&children[1], &name] {
        h.ok("delete-machine", json!({"name": machine})).await;
    }
    cleanup(&h).await;
}

/// One client's session on another process sharing `runtime`'s machine record: the base is
/// listed as one, a child of it made and run, the child deleted. `transport` stdio runs the
/// Python client, http the TypeScript SDK.
async fn client_makes_a_child_of(runtime: &std::path::Path, base: &str, transport: &str) {
    let url = nested().url;
    let child = format!("mcp-{transport}-child");
    let vars = [
        ("SMOL_LOCAL_URL", url.as_str()),
        ("SMOL_MCP_READY_TIMEOUT_SECS", READY_SECS),
    ];
    let calls = json!([
        {"tool": "list-machines", "args": {"name": base}},
        {"tool": "branch-machine", "args": {"name": base, "childName": child}},
        {"tool": "run-command", "args": {"name": child, "command": "cat /root/prepared"}},
        {"tool": "delete-machine", "args": {"name": child}},
    ]);
    let report = if transport == "stdio" {
        let env = crate::common::stdio::server_env(runtime, &vars);
        let plan = json!({"server": crate::common::stdio::SERVER, "mode": "legacy",
                          "env": crate::common::clients::env_object(env), "calls": calls});
        crate::common::clients::run_client_for(
            "python",
            "tool_plan.py",
            &plan,
            Duration::from_secs(300),
        )
        .await
    } else {
        let token = "base-child-token";
        let mut http = crate::common::clients::HttpServer::spawn(runtime, token, &vars).await;
        let plan = json!({"url": http.url, "token": token, "calls": calls});
        let report = crate::common::clients::run_client_for(
            "node",
            "ts_plan.mjs",
            &plan,
            Duration::from_secs(300),
        )
        .await;
        http.terminate().await;
        report
    };
    let answers = report["calls"].as_array().unwrap();
    for answer in answers {
        assert_eq!(answer["isError"], false, "{transport}: {report}");
    }
    assert!(
        answers[0]["structured"]["machines"][0]["base"]["madeFrom"].is_string(),
        "{transport}: {report}"
    );
    assert_eq!(
        answers[2]["structured"]["stdout"], "prepared\n",
        "{transport}: {report}"
    );
}

/// Set up once, fork many, on the real guest: a machine gets a workspace, a file its setup
/// wrote and a process its setup started, then becomes a base (branch-machine freezeSource); its
/// session ends and a later server process makes three children of it in one call, each with
/// the file, the process going on and the base's egress policy (its one allowed address reached,
/// another refused by the engine's policy), each running the project's test on its own try; one
/// child's changes are kept as a branch of the user's repository. The Python client and the
/// TypeScript SDK each make a child of it; the base goes once its children have.
#[tokio::test]
async fn a_base_outlives_its_session_and_server_and_its_children_start_where_setup_ended() {
    let _one_at_a_time = serial().await;
    let port = crate::common::real_serve::free_port();
    let host = HostServer::start(port, None).await;
    let tmp = tempfile::tempdir().unwrap();
    let (repo, head) = retry_project(tmp.path());
    let git = |args: &[&str]| crate::common::git(&repo, args);
    let allow = tmp.path().display().to_string();
    let store = tmp.path().join("copies").display().to_string();
    let url = nested().url;
    let env = [
        ("SMOL_LOCAL_URL", url.as_str()),
        ("SMOL_MCP_READY_TIMEOUT_SECS", READY_SECS),
        ("SMOL_MCP_MOUNT_ALLOW", allow.as_str()),
        ("SMOL_MCP_WORKSPACE_DIR", store.as_str()),
    ];
    let first = Harness::start(&env).await;
    let created = create(
        &first,
        json!({"cpus": 1, "memoryMb": 256, "branchable": true, "allowCidrs": ["10.0.2.2/32"],
               "workspace": repo.display().to_string()}),
    )
    .await;
    let base = created["machine"]["name"].as_str().unwrap().to_owned();
    let setup = first
        .ok(
            "run-command",
            json!({"name": base, "command": "echo prepared > /root/prepared && \
                nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 1; done' \
                >/dev/null 2>&1 </dev/null & sleep 2; cat /tmp/count"}),
        )
        .await;
    assert_eq!(setup["exitCode"], 0, "{setup}");
    first
        .ok(
            "branch-machine",
            json!({"name": base, "childName": "mcp-while-freezing", "freezeSource": true}),
        )
        .await;
    let listed = first.ok("list-machines", json!({"name": base})).await["machines"][0].clone();
    assert_eq!(listed["state"], "frozen", "{listed}");
    assert!(
        listed["base"]["madeFrom"]
            .as_str()
            .is_some_and(|from| from.contains(head.as_str())),
        "made from the workspace's commit: {listed}"
    );
    let began = Instant::now();
    let refused = first
        .err("run-command", json!({"name": base, "command": "true"}))
        .await;
    assert!(refused.contains("is a base"), "{refused}");
    assert!(began.elapsed() < Duration::from_secs(10), "refused at once");
    // Its session ends (its process with it): the child goes, the base stays.
    let ended = first.protocol.policy.shutdown(&first.session).await;
    assert_eq!(
        ended.deleted,
        vec!["mcp-while-freezing".to_owned()],
        "{ended:?}"
    );
    assert!(engine_machines().await.contains(&base));

    let second = first.next_process(&env).await;
    let branched = second
        .ok(
            "branch-machine",
            json!({"name": base, "childName": format!("{base}-kid"), "count": 3,
                   "env": [{"N": "2"}, {"N": "5"}, {"N": "9"}]}),
        )
        .await;
    let children: Vec<String> = serde_json::from_value(branched["children"].clone()).unwrap();
    assert_eq!(children.len(), 3, "{branched}");
    let looks = children.iter().map(|child| {
        second.call(
            "run-command",
            json!({"name": child, "command": "cat /root/prepared; a=$(cat /tmp/count); sleep 2; \
                b=$(cat /tmp/count); [ \"$b\" -gt \"$a\" ] && echo counting"}),
        )
    });
    for (answer, child) in futures::future::join_all(looks).await.iter().zip(&children) {
        assert_eq!(
            answer.structured["stdout"], "prepared\ncounting\n",
            "{child}: the file and the process of the setup: {}",
            answer.text
        );
    }
    let tries = children.iter().map(|child| {
        second.call(
            "run-command",
            json!({"name": child, "command":
                ". /etc/smol/branch-env && cd /workspace && echo retries=$N > src/retry.sh && sh test.sh"}),
        )
    });
    let outputs: Vec<String> = futures::future::join_all(tries)
        .await
        .iter()
        .map(|a| {
            a.structured["stdout"]
                .as_str()
                .unwrap_or(&a.text)
                .to_owned()
        })
        .collect();
    assert_eq!(outputs, ["failed\n", "passed\n", "passed\n"]);
    // The base's egress policy holds in its child: its one address is reached, another is
    // refused by the engine's policy (reported as such, not a mere failed connection).
    let reached = second
        .ok(
            "run-command",
            json!({"name": children[0], "command": format!("wget -q -T 10 -O- http://10.0.2.2:{port}/from-a-child")}),
        )
        .await;
    assert_eq!(reached["stdout"], "hello from the host\n", "{reached}");
    assert!(host.events().iter().any(|e| e["path"] == "/from-a-child"));
    let other = second
        .ok(
            "run-command",
            json!({"name": children[0], "command": "wget -q -T 3 -O /dev/null http://1.1.1.1/"}),
        )
        .await;
    assert_ne!(other["exitCode"], 0, "{other}");
    assert_eq!(
        other["blockedEgress"],
        json!([{"host": "1.1.1.1", "port": 80, "operation": "connect", "count": 1}]),
        "{other}"
    );
    for child in &children {
        let changes = second
            .call(
                "read-file",
                json!({"name": child, "path": "/workspace", "changes": true}),
            )
            .await;
        assert!(!changes.is_error, "{}", changes.text);
        assert_eq!(changes.structured["changes"]["base"], head.as_str());
    }
    let kept = second
        .ok(
            "keep-changes",
            json!({"name": children[1], "message": "Retry five times", "deleteSiblings": true}),
        )
        .await;
    let branch = kept["branch"].as_str().unwrap();
    assert_eq!(
        git(&["show", &format!("{branch}:src/retry.sh")]),
        "retries=5"
    );
    assert_eq!(
        git(&["rev-parse", "HEAD"]),
        head,
        "the user's checkout did not move"
    );

    client_makes_a_child_of(second.runtime.path(), &base, "stdio").await;
    client_makes_a_child_of(second.runtime.path(), &base, "http").await;

    // A warm pool whose source is the base: a create of its shape is a clone of it, leased.
    let pools = format!(r#"[{{"name": "from-base", "size": 1, "source": "{base}"}}]"#);
    let mut pooled_env = env.to_vec();
    pooled_env.push(("SMOL_MCP_POOLS", pools.as_str()));
    let third = second.next_process(&pooled_env).await;
    third.ok("list-machines", json!({})).await;
    until_pool_ready("smolmcp-from-base", 1, Duration::from_secs(300)).await;
    let began = Instant::now();
    let leased = third
        .ok(
            "create-machine",
            json!({"cpus": 1, "memoryMb": 256, "allowCidrs": ["10.0.2.2/32"]}),
        )
        .await;
    assert_eq!(leased["pool"], "from-base", "{leased}");
    assert_eq!(
        leased["machine"]["network"], "allow(10.0.2.2/32)",
        "the base's egress: {leased}"
    );
    let clone = leased["machine"]["name"].as_str().unwrap().to_owned();
    let prepared = third
        .ok(
            "run-command",
            json!({"name": clone, "command": "cat /root/prepared"}),
        )
        .await;
    assert_eq!(prepared["stdout"], "prepared\n", "{prepared}");
    eprintln!(
        "booted_guest: a lease of the pool over the base to its first output in {:?}",
        began.elapsed()
    );
    let ended = third.protocol.policy.shutdown(&third.session).await;
    assert!(ended.failed.is_empty(), "{ended:?}");
    // What the process's end does with the pools it set up; the base, the operator's named
    // source, stays.
    third.tear_down_local_pools().await;
    // The engine retires a pool's workers before the pool goes.
    let deadline = Instant::now() + Duration::from_secs(120);
    while engine_pool("smolmcp-from-base").await.is_some() {
        assert!(Instant::now() < deadline, "the pool never went");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(engine_machines().await.contains(&base));

    let err = second.err("delete-machine", json!({"name": base})).await;
    assert!(
        err.contains(children[1].as_str()),
        "a child depends on it: {err}"
    );
    second
        .ok("delete-machine", json!({"name": children[1]}))
        .await;
    second.ok("delete-machine", json!({"name": base})).await;
    let left = engine_machines().await;
    assert!(
        !left.contains(&base) && !left.iter().any(|m| children.contains(m)),
        "{left:?}"
    );
    cleanup(&second).await;
}

/// The host memory the nested engine reports available, in MiB.
async fn host_memory_available_mb() -> f64 {
    let mb = crate::common::nested::host_memory_available_mb(&nested().url).await;
    assert!(
        mb.is_finite(),
        "the engine's /capacity says no available memory"
    );
    mb
}

/// `parkIdleSecs` on the real guest: a machine no call named for that long and that runs
/// nothing is stopped (it was not started branchable, so it cannot be paused), its memory goes
/// back to the host, and the next command starts it with its disk as it was, saying so; a
/// machine running a job is left running.
#[tokio::test]
async fn an_idle_machine_is_parked_and_the_next_command_starts_it_on_the_real_guest() {
    let _one_at_a_time = serial().await;
    let h = harness(&[("SMOL_MCP_PARK_IDLE_SECS", "3")]).await;
    let made = |v: Value| v["machine"]["name"].as_str().unwrap().to_owned();
    let idle = made(create(&h, json!({"cpus": 1, "memoryMb": 256})).await);
    let working = made(create(&h, json!({"cpus": 1, "memoryMb": 256})).await);
    h.ok(
        "run-command",
        json!({"name": idle, "command": "echo set-up > /root/kept"}),
    )
    .await;
    h.ok(
        "run-command",
        json!({"name": working, "command": "sleep 600", "background": true}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let held_before = engine_entry(&idle).await;
    eprintln!("booted_guest: the idle machine before parking: {held_before}");
    assert!(
        held_before["pid"].as_i64().is_some() && held_before["rssMb"].as_i64() > Some(0),
        "a running machine should show its process and memory: {held_before}"
    );
    let before = host_memory_available_mb().await;
    let parked = h.protocol.policy.park_idle_once().await;
    let parked: Vec<(String, String)> = parked
        .into_iter()
        .map(|(name, how)| (name, format!("{how:?}")))
        .collect();
    assert_eq!(parked, vec![(idle.clone(), "Stopped".to_owned())]);
    let states: Vec<(String, String)> = engine_listing().await["machines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_owned(),
                m["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        states.contains(&(idle.clone(), "stopped".to_owned()))
            && states.contains(&(working.clone(), "running".to_owned())),
        "{states:?}"
    );
    // What parking promises is that the machine's VM process is gone and holds no memory:
    // the engine's own per-machine figures say so. The host-wide `/capacity` delta is only
    // printed: other work on the host (CI runs install checks beside these tests) moves it by
    // tens of MiB either way, so it cannot be a bound.
    let held_after = engine_entry(&idle).await;
    eprintln!("booted_guest: the idle machine after parking: {held_after}");
    assert!(
        held_after["pid"].as_i64().is_none() && held_after["rssMb"].as_i64().unwrap_or(0) == 0,
        "a parked machine should hold no process and no memory: {held_after}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let freed = host_memory_available_mb().await - before;
    eprintln!(
        "booted_guest: parking a 256 MiB machine (RSS {} MiB) moved the host's available memory by {freed:.0} MiB",
        held_before["rssMb"]
    );

    let back = h
        .ok(
            "run-command",
            json!({"name": idle, "command": "cat /root/kept"}),
        )
        .await;
    assert_eq!(
        (back["startedMachine"].as_bool(), back["stdout"].as_str()),
        (Some(true), Some("set-up\n")),
        "{back}"
    );
    cleanup(&h).await;
}
