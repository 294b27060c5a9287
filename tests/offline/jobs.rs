//! Background jobs through an MCP client, on both fleets, against fakes whose exec really runs
//! the command as a host process the way the engines run it in the guest (`guest_shell`: a
//! `background: true` exec answers `pid=N` at once, its output goes nowhere, the machine's
//! stop or delete kills it). The job's files are real files, its kill is a real kill.

use crate::common::fake_cloud::{FakeCloud, TOKEN};
use crate::common::fake_serve::FakeServe;
use crate::common::mcp::Harness;
use crate::common::until;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

enum Fake {
    Local(FakeServe),
    Cloud(FakeCloud),
}

impl Fake {
    /// The pids the fake still runs for `machine` (a name locally, an id on cloud).
    fn processes(&self, machine: &str) -> Vec<u32> {
        match self {
            Fake::Local(f) => f.guest_processes(machine),
            Fake::Cloud(f) => f.guest_processes(machine),
        }
    }
}

async fn setup(cloud: bool, extra: &[(&str, &str)]) -> (Fake, Harness) {
    if cloud {
        let fake = FakeCloud::start_guest_shell().await;
        let url = fake.url();
        let mut env = vec![
            ("SMOL_CLOUD_URL", url.as_str()),
            ("SMOL_CLOUD_TOKEN", TOKEN),
            ("SMOL_MCP_TARGETS", "cloud"),
            ("SMOL_MCP_JOB_POLL_MILLIS", "100"),
        ];
        env.extend_from_slice(extra);
        let h = Harness::start(&env).await;
        (Fake::Cloud(fake), h)
    } else {
        let fake = FakeServe::start_guest_shell().await;
        let url = fake.url();
        let mut env = vec![
            ("SMOL_LOCAL_URL", url.as_str()),
            ("SMOL_MCP_JOB_POLL_MILLIS", "100"),
        ];
        env.extend_from_slice(extra);
        let h = Harness::start(&env).await;
        (Fake::Local(fake), h)
    }
}

/// A running machine named `name`; answers what the fake keys it by.
async fn machine(h: &Harness, name: &str) -> String {
    let created = h
        .ok("create-machine", json!({"name": name, "image": "alpine"}))
        .await;
    created["machine"]["id"]
        .as_str()
        .or(created["machine"]["name"].as_str())
        .unwrap()
        .to_owned()
}

async fn start_job(h: &Harness, name: &str, script: &str, extra: Value) -> Value {
    let mut args = json!({"name": name, "command": script, "background": true});
    if let Value::Object(more) = extra {
        args.as_object_mut().unwrap().extend(more);
    }
    let started = h.ok("run-command", args).await;
    assert_eq!(started["state"], "running", "{started}");
    assert!(started["job"].as_str().unwrap().starts_with("job-"));
    started
}

/// Reads the job to its end by cursor, `wait` seconds a call; answers the whole stdout and
/// stderr, the last report and how many calls it took.
async fn read_to_end(h: &Harness, job: &str, wait: u64) -> (String, String, Value, usize) {
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let mut cursor = "0:0".to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    for calls in 1.. {
        let report = h
            .ok(
                "job-output",
                json!({"job": job, "cursor": cursor, "waitSecs": wait}),
            )
            .await;
        stdout.push_str(report["stdout"].as_str().unwrap());
        stderr.push_str(report["stderr"].as_str().unwrap());
        cursor = report["cursor"].as_str().unwrap().to_owned();
        if report["state"] != "running" && report["more"] == false {
            return (stdout, stderr, report, calls);
        }
        assert!(Instant::now() < deadline, "never ended: {report}");
    }
    unreachable!()
}

/// The job's ledger row once its end is recorded.
async fn ledger_end(h: &Harness, run: i64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let detail = h.resource(&format!("smol://runs/{run}")).await;
        if detail["outcome"] != "running" {
            return detail;
        }
        assert!(
            Instant::now() < deadline,
            "the job's end never reached the ledger"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn a_job_is_read_by_cursor_to_its_end(cloud: bool) {
    let (_fake, h) = setup(cloud, &[]).await;
    machine(&h, "box").await;
    let script =
        "for i in 1 2 3 4 5; do echo \"out $i\"; echo \"err $i\" >&2; sleep 0.2; done; exit 3";
    let began = Instant::now();
    let started = start_job(&h, "box", script, json!({})).await;
    assert!(
        began.elapsed() < Duration::from_millis(900),
        "run-command answers at once, not after the command"
    );
    assert_eq!(started["cursor"], "0:0");
    let job = started["job"].as_str().unwrap();
    let (stdout, stderr, last, calls) = read_to_end(&h, job, 0).await;
    assert_eq!(stdout, "out 1\nout 2\nout 3\nout 4\nout 5\n");
    assert_eq!(stderr, "err 1\nerr 2\nerr 3\nerr 4\nerr 5\n");
    assert!(calls > 1, "read in pieces while it ran ({calls} calls)");
    assert_eq!(last["state"], "exited", "{last}");
    assert_eq!(last["exitCode"], 3);
    assert_eq!(last["stdoutBytes"], 30);
    assert_eq!(last["cursor"], "30:30");
    // Reading again from the end gives nothing new; from the start, everything again.
    let again = h
        .ok("job-output", json!({"job": job, "cursor": "30:30"}))
        .await;
    assert_eq!(
        (again["stdout"].as_str(), again["more"].as_bool()),
        (Some(""), Some(false))
    );
    let whole = h.ok("job-output", json!({"job": job})).await;
    assert_eq!(whole["stdout"], stdout);
    // The ledger row is the job's.
    // The watcher records the end in the ledger once it has read the streams' ends.
    let run = started["run"].as_i64().expect("a ledger row");
    let detail = ledger_end(&h, run).await;
    assert_eq!(detail["tool"], "job", "{detail}");
    assert_eq!(detail["outcome"], "exited", "{detail}");
    assert_eq!(detail["exitCode"], 3, "{detail}");
    assert!(
        detail["stdout"]["head"]
            .as_str()
            .unwrap()
            .starts_with("out 1"),
        "{detail}"
    );
}

#[tokio::test]
async fn a_local_job_is_read_by_cursor_to_its_end() {
    a_job_is_read_by_cursor_to_its_end(false).await;
}

#[tokio::test]
async fn a_cloud_job_is_read_by_cursor_to_its_end() {
    a_job_is_read_by_cursor_to_its_end(true).await;
}

#[tokio::test]
async fn wait_secs_answers_when_the_job_ends_not_when_the_wait_does() {
    let (_fake, h) = setup(false, &[]).await;
    machine(&h, "box").await;
    let started = start_job(&h, "box", "sleep 1; echo done", json!({})).await;
    let job = started["job"].as_str().unwrap();
    let began = Instant::now();
    let report = h
        .ok("job-output", json!({"job": job, "waitSecs": 30}))
        .await;
    let waited = began.elapsed();
    assert_eq!(report["state"], "exited", "{report}");
    assert_eq!(report["stdout"], "done\n");
    assert!(
        waited >= Duration::from_millis(700) && waited < Duration::from_secs(5),
        "waited {waited:?} for a 1 s job"
    );
    // Without waitSecs it answers at once, while the job runs.
    let long = start_job(&h, "box", "sleep 30", json!({})).await;
    let began = Instant::now();
    let report = h.ok("job-output", json!({"job": long["job"]})).await;
    assert_eq!(report["state"], "running");
    assert!(began.elapsed() < Duration::from_secs(2));
    h.ok("cancel-job", json!({"job": long["job"]})).await;
}

#[tokio::test]
async fn small_reads_never_split_a_character() {
    let (_fake, h) = setup(false, &[("SMOL_MCP_MAX_OUTPUT_BYTES", "5")]).await;
    machine(&h, "box").await;
    let text = "héllo wörld € 😀 ok\n";
    let started = start_job(&h, "box", &format!("printf '{text}'"), json!({})).await;
    let job = started["job"].as_str().unwrap();
    let (stdout, _, last, calls) = read_to_end(&h, job, 1).await;
    assert_eq!(stdout, text, "joined pieces are the output exactly");
    assert!(!stdout.contains('\u{FFFD}'));
    assert!(calls >= text.len() / 5, "{calls} reads of at most 5 bytes");
    assert_eq!(last["exitCode"], 0);
}

/// How many `sleep 60` and `sleep 61` processes run with `job`'s marker in their environment.
/// Only the job's own: the other tests of this process, and other test processes on the host,
/// run such sleeps too, so a host-wide count (pgrep) would wait on theirs.
fn sleeps_of(job: &str) -> usize {
    let marker = format!("{}={job}", smol_mcp::policy::jobs::guest::RUN_MARKER);
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|entry| {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
            matches!(cmdline.trim_end(), "sleep 60" | "sleep 61")
                && environ
                    .split(|b| *b == 0)
                    .any(|var| var == marker.as_bytes())
        })
        .count()
}

async fn cancel_job_kills_the_command_and_its_children(cloud: bool) {
    let (fake, h) = setup(cloud, &[]).await;
    let key = machine(&h, "box").await;
    let started = start_job(
        &h,
        "box",
        "echo begun; sleep 60 & sh -c 'sleep 61'; echo never",
        json!({}),
    )
    .await;
    let job = started["job"].as_str().unwrap();
    let report = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = h.ok("job-output", json!({"job": job})).await;
            if r["stdout"] == "begun\n" {
                break r;
            }
            assert!(Instant::now() < deadline, "{r}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert_eq!(report["state"], "running");
    let sleeping = || sleeps_of(job);
    until("the job's two sleeps run", Duration::from_secs(10), || {
        sleeping() == 2
    })
    .await;
    let cancelled = h.ok("cancel-job", json!({"job": job})).await;
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["exitCode"], 137);
    // Answered once the end is recorded: the ledger shows it at once, no waiting.
    let row = h
        .resource(&format!("smol://runs/{}", started["run"].as_i64().unwrap()))
        .await;
    assert_eq!(row["outcome"], "cancelled", "{row}");
    until(
        "the job's processes are gone",
        Duration::from_secs(10),
        || fake.processes(&key).is_empty() && sleeping() == 0,
    )
    .await;
    // The output so far stays readable; a second cancel changes nothing.
    let after = h.ok("job-output", json!({"job": job})).await;
    assert_eq!(after["stdout"], "begun\n");
    assert_eq!(after["state"], "cancelled");
    let again = h.ok("cancel-job", json!({"job": job})).await;
    assert_eq!(again["state"], "cancelled");
    let listed = h.ok("job-output", json!({})).await;
    assert_eq!(listed["jobs"][0]["job"], job);
    assert_eq!(listed["jobs"][0]["state"], "cancelled");
}

#[tokio::test]
async fn cancel_job_kills_a_local_command_and_its_children() {
    cancel_job_kills_the_command_and_its_children(false).await;
}

#[tokio::test]
async fn cancel_job_kills_a_cloud_command_and_its_children() {
    cancel_job_kills_the_command_and_its_children(true).await;
}

#[tokio::test]
async fn a_job_is_killed_at_its_timeout() {
    let (fake, h) = setup(false, &[]).await;
    machine(&h, "box").await;
    let started = start_job(&h, "box", "echo up; sleep 30", json!({"timeoutSecs": 1})).await;
    assert_eq!(started["timeoutSecs"], 1);
    let job = started["job"].as_str().unwrap();
    let began = Instant::now();
    let report = h
        .ok("job-output", json!({"job": job, "waitSecs": 20}))
        .await;
    assert_eq!(report["state"], "timedOut", "{report}");
    assert_eq!(report["exitCode"], 124);
    assert_eq!(report["stdout"], "up\n");
    assert!(began.elapsed() < Duration::from_secs(5));
    until("killed", Duration::from_secs(10), || {
        fake.processes("box").is_empty()
    })
    .await;
}

async fn a_job_ends_with_its_machine(cloud: bool) {
    let (_fake, h) = setup(cloud, &[]).await;
    machine(&h, "gone").await;
    machine(&h, "halted").await;
    let deleted = start_job(&h, "gone", "sleep 30", json!({})).await;
    let stopped = start_job(&h, "halted", "sleep 30", json!({})).await;
    h.ok("delete-machine", json!({"name": "gone"})).await;
    h.ok("stop-machine", json!({"name": "halted"})).await;
    for (job, word) in [(&deleted, "deleted"), (&stopped, "stopped")] {
        let report = h
            .ok("job-output", json!({"job": job["job"], "waitSecs": 10}))
            .await;
        assert_eq!(report["state"], "lost", "{report}");
        assert!(
            report["reason"].as_str().unwrap().contains(word),
            "{report}"
        );
        assert_eq!(report["exitCode"], Value::Null);
    }
    // The stopped machine was not started again by the watcher or the read.
    let halted = h.ok("list-machines", json!({"name": "halted"})).await["machines"][0].clone();
    assert_eq!(halted["state"], "stopped", "{halted}");
}

#[tokio::test]
async fn a_local_job_ends_with_its_machine() {
    a_job_ends_with_its_machine(false).await;
}

#[tokio::test]
async fn a_cloud_job_ends_with_its_machine() {
    a_job_ends_with_its_machine(true).await;
}

#[tokio::test]
async fn no_more_than_max_running_jobs_run_even_when_started_at_once() {
    let (_fake, h) = setup(false, &[("SMOL_MCP_MAX_RUNNING_JOBS", "3")]).await;
    machine(&h, "box").await;
    let calls = (0..10).map(|_| {
        h.call(
            "run-command",
            json!({"name": "box", "command": "sleep 30", "background": true}),
        )
    });
    let answers = futures::future::join_all(calls).await;
    let started: Vec<&Value> = answers
        .iter()
        .filter(|a| !a.is_error)
        .map(|a| &a.structured)
        .collect();
    assert_eq!(started.len(), 3, "{answers:?}");
    for refused in answers.iter().filter(|a| a.is_error) {
        // Each refused start says the same.
        insta::allow_duplicates! {
            insta::assert_snapshot!(refused.text, @"RATE_LIMITED: 3 jobs are running already (maxRunningJobs): wait for one to end, or cancel one with cancel-job");
        }
    }
    assert_eq!(
        h.ok("job-output", json!({})).await["jobs"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    // A slot frees when a job ends.
    h.ok("cancel-job", json!({"job": started[0]["job"]})).await;
    let next = h
        .call(
            "run-command",
            json!({"name": "box", "command": "true", "background": true}),
        )
        .await;
    assert!(!next.is_error, "{}", next.text);
    for job in &started[1..] {
        h.ok("cancel-job", json!({"job": job["job"]})).await;
    }
}

#[tokio::test]
async fn bad_job_arguments_are_refused_naming_the_argument() {
    let (fake, h) = setup(false, &[("SMOL_MCP_MAX_JOB_SECS", "600")]).await;
    machine(&h, "box").await;
    let before = fake.processes("box").len();
    let err = h
        .err(
            "run-command",
            json!({"name": "box", "command": "cat", "stdin": "x", "background": true}),
        )
        .await;
    assert!(err.contains("stdin") && err.contains("write-file"), "{err}");
    let err = h
        .err(
            "run-command",
            json!({"name": "box", "command": "true", "background": true, "timeoutSecs": 601}),
        )
        .await;
    insta::assert_snapshot!(err, @"INVALID_ARGUMENT: timeoutSecs: 601 is not accepted: give 1 to 600 (this server's ceiling, maxJobSecs)");
    // A foreground command keeps its own ceiling.
    let err = h
        .err(
            "run-command",
            json!({"name": "box", "command": "true", "timeoutSecs": 1000}),
        )
        .await;
    insta::assert_snapshot!(err, @"INVALID_ARGUMENT: timeoutSecs: 1000 is not accepted: give 1 to 900 (this server's ceiling, maxExecTimeoutSecs)");
    let err = h
        .err(
            "run-command",
            json!({"name": "nope", "command": "true", "background": true}),
        )
        .await;
    assert!(err.starts_with("NOT_FOUND"), "{err}");
    assert!(
        h.ok("job-output", json!({})).await["jobs"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let started = start_job(&h, "box", "sleep 5", json!({})).await;
    let job = started["job"].as_str().unwrap();
    for cursor in ["", "12", "a:b", "-1:0"] {
        let err = h
            .err("job-output", json!({"job": job, "cursor": cursor}))
            .await;
        assert!(err.contains("cursor") && err.contains("1024:0"), "{err}");
    }
    let err = h
        .err("job-output", json!({"job": job, "waitSecs": 301}))
        .await;
    assert!(err.contains("waitSecs"), "{err}");
    for tool in ["job-output", "cancel-job"] {
        let err = h.err(tool, json!({"job": "job-0000"})).await;
        assert!(
            err.starts_with("NOT_FOUND") && err.contains("job-output without a job"),
            "{err}"
        );
    }
    h.ok("cancel-job", json!({"job": job})).await;
    until("nothing left running", Duration::from_secs(10), || {
        fake.processes("box").len() <= before
    })
    .await;
}

impl Fake {
    fn take_requests(&self) -> Vec<Value> {
        match self {
            Fake::Local(f) => f.take_requests(),
            Fake::Cloud(f) => f.take_requests(),
        }
    }
}

/// Every distinct exec body a job's life sends (start, the watcher's look, a read, the ends
/// for the ledger, a cancel's kill), the job's id and the cloud's machine id masked, pinned by
/// snapshot. Distinct and sorted: how many looks a job gets depends on the clock.
async fn the_exec_bodies_of_a_job(cloud: bool) -> Vec<Value> {
    let (fake, h) = setup(cloud, &[]).await;
    let key = machine(&h, "box").await;
    let done = start_job(
        &h,
        "box",
        "echo hi",
        json!({"env": {"A": "1"}, "workdir": "/tmp"}),
    )
    .await;
    h.ok("job-output", json!({"job": done["job"], "waitSecs": 10}))
        .await;
    let killed = start_job(&h, "box", "sleep 30", json!({"timeoutSecs": 60})).await;
    h.ok("cancel-job", json!({"job": killed["job"]})).await;
    // The first job's ends are read by its watcher for the ledger before it records the end.
    ledger_end(&h, done["run"].as_i64().unwrap()).await;
    let mut bodies: Vec<Value> = fake
        .take_requests()
        .into_iter()
        .filter(|r| r["method"] == "POST" && r["path"].as_str().unwrap().ends_with("/exec"))
        .map(|r| {
            let text = r["body"].to_string();
            let text = [done["job"].as_str().unwrap(), killed["job"].as_str().unwrap(), &key]
                .iter()
                .zip(["job-DONE", "job-KILLED", "MACHINE"])
                .fold(text, |t, (from, to)| t.replace(from, to));
            json!({"path": r["path"].as_str().unwrap().replace(&key, "MACHINE"), "body": serde_json::from_str::<Value>(&text).unwrap()})
        })
        // The readiness probes of the create are not the job's; whether the cancelled job was
        // looked at before its cancel depends on the clock.
        .filter(|r| r["body"]["command"][0] != "echo")
        .filter(|r| {
            !(r["body"]["command"][2].as_str().unwrap().starts_with("for s in")
                && r["body"]["command"][3] == "/tmp/smol-mcp-job-KILLED")
        })
        .collect();
    bodies.sort_by_key(|b| b.to_string());
    bodies.dedup();
    bodies
}

#[tokio::test]
async fn the_exec_bodies_of_a_local_job() {
    insta::assert_json_snapshot!(
        "jobs_local_exec_bodies",
        the_exec_bodies_of_a_job(false).await
    );
}

#[tokio::test]
async fn the_exec_bodies_of_a_cloud_job() {
    insta::assert_json_snapshot!(
        "jobs_cloud_exec_bodies",
        the_exec_bodies_of_a_job(true).await
    );
}

/// A job-output that waits, with a progress token, tells the client what it waits for about
/// once a second (so a client that resets its timeout on progress can wait longer than it).
#[tokio::test]
async fn a_waiting_job_output_reports_progress() {
    use crate::common::stdio::{StdioServer, server_env};
    let fake = FakeServe::start_guest_shell().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let mut server = StdioServer::spawn(server_env(
        rt.path(),
        &[
            ("SMOL_LOCAL_URL", &url),
            ("SMOL_MCP_JOB_POLL_MILLIS", "100"),
        ],
    ))
    .await;
    server
        .tool(
            2,
            "create-machine",
            json!({"name": "box", "image": "alpine"}),
        )
        .await;
    let started = server
        .tool(
            3,
            "run-command",
            json!({"name": "box", "command": "sleep 3; echo done", "background": true}),
        )
        .await;
    server
        .send_raw(
            format!(
                "{}\n",
                json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
                    "name": "job-output",
                    "arguments": {"job": started["job"], "waitSecs": 20},
                    "_meta": {"progressToken": "wait-1"}}})
            )
            .as_bytes(),
        )
        .await;
    let mut progress = Vec::new();
    let answer = loop {
        let message = server.next_message(Duration::from_secs(20)).await;
        if message["id"] == 4 {
            break message;
        }
        if message["method"] == "notifications/progress" {
            progress.push(message["params"].clone());
        }
    };
    assert_eq!(
        answer["result"]["structuredContent"]["state"], "exited",
        "{answer}"
    );
    assert!(progress.len() >= 2, "{progress:?}");
    for p in &progress {
        assert_eq!(p["progressToken"], "wait-1");
        assert!(
            p["message"]
                .as_str()
                .unwrap()
                .contains(started["job"].as_str().unwrap()),
            "{p}"
        );
    }
}

/// A pause keeps a job's processes (the engine saves the guest whole): the watcher waits for
/// the resume instead of calling the job lost, and the job is read to its end after it.
#[tokio::test]
async fn a_job_outlives_a_pause_of_its_machine() {
    let (_fake, h) = setup(false, &[]).await;
    h.ok(
        "create-machine",
        json!({"name": "held", "image": "alpine", "branchable": true}),
    )
    .await;
    let job = start_job(&h, "held", "sleep 2; echo done", json!({})).await;
    let paused = h
        .ok("stop-machine", json!({"name": "held", "pause": true}))
        .await;
    assert_eq!(paused["machine"]["state"], "paused", "{paused}");
    // Ten of the watcher's looks at the paused machine.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = h
        .ok("job-output", json!({"job": job["job"], "waitSecs": 0}))
        .await;
    assert_eq!(report["state"], "running", "{report}");
    h.ok("start-machine", json!({"name": "held"})).await;
    let (stdout, _, last, _) = read_to_end(&h, job["job"].as_str().unwrap(), 10).await;
    assert_eq!(stdout, "done\n");
    assert_eq!(last["state"], "exited", "{last}");
}
