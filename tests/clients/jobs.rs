//! Background jobs under the real MCP clients and over HTTP when it gets hostile: the Python
//! client (`mcp` 2.3.0, its default 2026-07-28 mode) and the TypeScript SDK (1.32.2, sessions),
//! each over stdio and over HTTP, follow a command longer than their own request timeout with
//! job-output (tests/clients/job_py.py, job_ts.mjs), and the same command without `background`
//! fails in that client with its timeout; an HTTP session idle longer than its limit and a
//! stateless machine past its lease are kept while a job runs on them and let go after; twenty
//! waiting job-output calls from three sessions all answer. The fakes' guest shell really runs
//! the commands (a `background: true` exec answers `pid=N` and keeps its output nowhere, as the
//! engines do: facts sheet 3.7, smolvm's exec handler).

use crate::common::clients::{HttpServer, env_object, run_node, run_python};
use crate::common::fake_cloud::FakeCloud;
use crate::common::fake_serve::FakeServe;
use crate::common::stdio::{SERVER, server_env};
use crate::common::until;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const TOKEN: &str = "job-clients-token";

/// Each client's request timeout, shorter than the command.
const CLIENT_TIMEOUT_SECS: f64 = 2.0;

/// About 5 s of output on both streams, then exit 3.
const LONG_COMMAND: &str = "i=0; while [ $i -lt 25 ]; do i=$((i+1)); echo line-$i; \
                            echo err-$i >&2; sleep 0.2; done; exit 3";

/// JSON-RPC's request timeout code in both SDKs (`REQUEST_TIMEOUT`, `ErrorCode.RequestTimeout`).
const REQUEST_TIMEOUT: i64 = -32001;

fn expected(prefix: &str) -> String {
    (1..=25).map(|i| format!("{prefix}-{i}\n")).collect()
}

/// What the client plans share: the long command, run first in the foreground (expecting the
/// client's timeout), then as a job read `waitSecs` 1 at a time.
fn plan(machine: &str) -> Value {
    json!({"timeout": CLIENT_TIMEOUT_SECS, "machine": machine, "command": LONG_COMMAND,
        "waitSecs": 1, "foreground": true})
}

fn stdio_plan(env: &[(&str, &str)], rt: &std::path::Path, machine: &str) -> Value {
    let mut plan = plan(machine);
    plan["server"] = json!(SERVER);
    plan["env"] = env_object(server_env(rt, env));
    plan
}

fn http_plan(server: &HttpServer, machine: &str) -> Value {
    let mut plan = plan(machine);
    plan["url"] = json!(server.url);
    plan["token"] = json!(TOKEN);
    plan
}

/// The client's report: the foreground run failed with the client's own timeout, the job was
/// followed across several calls each shorter than that timeout, and every byte arrived in
/// order with the exit code.
fn check_followed(report: &Value) {
    let foreground = &report["foreground"];
    assert_eq!(foreground["answered"], false, "{report}");
    assert_eq!(foreground["code"], REQUEST_TIMEOUT, "{report}");
    assert!(
        foreground["seconds"].as_f64().unwrap() < 4.5,
        "the foreground call failed at the client's timeout, before the command's end: {report}"
    );
    assert_eq!(report["started"]["state"], "running", "{report}");
    assert!(report["startSeconds"].as_f64().unwrap() < CLIENT_TIMEOUT_SECS);
    let reads = report["reads"].as_array().unwrap();
    assert!(
        reads.len() >= 3,
        "followed over several calls (the command runs past two 1 s waits): {report}"
    );
    for read in reads {
        assert!(
            read["seconds"].as_f64().unwrap() < CLIENT_TIMEOUT_SECS,
            "each job-output answered within the client's timeout: {read}"
        );
    }
    assert!(
        reads[..reads.len() - 1]
            .iter()
            .any(|r| r["state"] == "running" && r["stdoutBytes"].as_u64().unwrap() > 0),
        "some output came while the job still ran: {report}"
    );
    assert_eq!(report["stdout"], expected("line"), "{report}");
    assert_eq!(report["stderr"], expected("err"), "{report}");
    let last = &report["last"];
    assert_eq!(last["state"], "exited", "{report}");
    assert_eq!(last["exitCode"], 3, "{report}");
    let total = expected("line").len() + expected("err").len();
    let cursor = format!("{}:{}", expected("line").len(), expected("err").len());
    assert_eq!(last["cursor"], cursor, "the cursor counts {total} bytes");
}

fn local_env(url: &str) -> Vec<(&str, &str)> {
    vec![("SMOL_LOCAL_URL", url), ("SMOL_MCP_JOB_POLL_MILLIS", "100")]
}

#[tokio::test]
async fn the_python_client_follows_a_job_past_its_request_timeout_over_stdio() {
    let fake = FakeServe::start_guest_shell().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let report = run_python("job_py.py", &stdio_plan(&local_env(&url), rt.path(), "py")).await;
    assert_eq!(report["protocol"], "2026-07-28", "{report}");
    check_followed(&report);
}

#[tokio::test]
async fn the_python_client_follows_a_job_past_its_request_timeout_over_http() {
    let fake = FakeServe::start_guest_shell().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let server = HttpServer::spawn(rt.path(), TOKEN, &local_env(&url)).await;
    let report = run_python("job_py.py", &http_plan(&server, "py")).await;
    assert_eq!(report["protocol"], "2026-07-28", "{report}");
    check_followed(&report);
}

#[tokio::test]
async fn the_typescript_client_follows_a_job_past_its_request_timeout_over_stdio() {
    let fake = FakeServe::start_guest_shell().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let report = run_node("job_ts.mjs", &stdio_plan(&local_env(&url), rt.path(), "ts")).await;
    check_followed(&report);
}

#[tokio::test]
async fn the_typescript_client_follows_a_job_past_its_request_timeout_over_http() {
    let fake = FakeServe::start_guest_shell().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let server = HttpServer::spawn(rt.path(), TOKEN, &local_env(&url)).await;
    let report = run_node("job_ts.mjs", &http_plan(&server, "ts")).await;
    check_followed(&report);
}

#[tokio::test]
async fn the_python_client_follows_a_cloud_job_past_its_request_timeout_over_http() {
    let cloud = FakeCloud::start_guest_shell().await;
    let rt = tempfile::tempdir().unwrap();
    let server = HttpServer::on_fake_cloud(
        rt.path(),
        TOKEN,
        &cloud,
        &[("SMOL_MCP_JOB_POLL_MILLIS", "100")],
    )
    .await;
    let report = run_python("job_py.py", &http_plan(&server, "cloudy")).await;
    check_followed(&report);
}

static NEXT_ID: AtomicU64 = AtomicU64::new(10);

/// A raw HTTP client of the session lifecycle (2025-06-18), one session per value.
#[derive(Clone)]
struct Session {
    http: reqwest::Client,
    url: String,
    id: String,
}

/// The JSON-RPC answer in a reply, whether it came as JSON or as an event stream.
fn answer(text: &str) -> Value {
    crate::common::sessionless::answer_in(text)
        .unwrap_or_else(|| panic!("no JSON-RPC answer in {text:?}"))
}

impl Session {
    async fn open(server: &HttpServer) -> Session {
        let http = reqwest::Client::new();
        let init = http
            .post(&server.url)
            .bearer_auth(TOKEN)
            .header("accept", "application/json, text/event-stream")
            .json(
                &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "raw-jobs", "version": "0"}}}),
            )
            .send()
            .await
            .unwrap();
        let id = crate::common::opened_session(init).await;
        let session = Session {
            http,
            url: server.url.clone(),
            id,
        };
        let r = session
            .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert!(r.status().is_success());
        session
    }

    async fn post(&self, body: &Value) -> reqwest::Response {
        self.http
            .post(&self.url)
            .bearer_auth(TOKEN)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", "2025-06-18")
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// Calls a tool and answers its structured result, failing on a tool error.
    async fn ok(&self, tool: &str, args: Value) -> Value {
        // Ids unique within the session: concurrent calls with one id would be one request.
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let r = self
            .post(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": tool, "arguments": args}}))
            .await;
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, 200, "{tool}: {text}");
        let message = answer(&text);
        assert_eq!(message["result"]["isError"], false, "{tool}: {message}");
        message["result"]["structuredContent"].clone()
    }
}

/// Watches `machine` while its job runs: it must stay, undeleted, until the guest shell no
/// longer runs the job. Answers how long the job ran.
async fn kept_while_the_job_runs(fake: &FakeServe, machine: &str) -> Duration {
    let start = Instant::now();
    loop {
        // The deletion is looked at before the job's processes: deleting the machine kills them.
        assert!(
            !fake.deleted_paths().iter().any(|p| p.ends_with(machine)),
            "{machine} deleted under its job after {:?}",
            start.elapsed()
        );
        assert!(fake.has_machine(machine));
        if fake.guest_processes(machine).is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the job never ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

/// A session idle past its limit (2 s) while a 6 s job runs on its unnamed machine is not
/// closed, so the machine is not deleted; once the job has ended and the idle time has passed
/// again, the session is closed and its machine deleted (src/protocol/http/sessions.rs `job_hold`).
#[tokio::test]
async fn an_idle_session_is_kept_while_its_job_runs_and_closed_after() {
    let fake = FakeServe::start_guest_shell().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let mut env = local_env(&url);
    env.push(("SMOL_MCP_HTTP_SESSION_IDLE_SECS", "2"));
    let server = HttpServer::spawn(rt.path(), TOKEN, &env).await;
    let session = Session::open(&server).await;
    let created = session
        .ok("create-machine", json!({"image": "alpine"}))
        .await;
    let machine = created["machine"]["name"].as_str().unwrap().to_owned();
    let started = session
        .ok(
            "run-command",
            json!({"name": machine, "command": "sleep 6; echo done", "background": true}),
        )
        .await;
    assert_eq!(started["state"], "running", "{started}");
    // The client sends nothing from here on.
    let ran = kept_while_the_job_runs(&fake, &machine).await;
    assert!(
        ran >= Duration::from_secs(5),
        "the job ran its 6 s, past the idle limit twice over, not ended early with its machine ({ran:?})"
    );
    let ended = Instant::now();
    until(
        "the session closed and its machine deleted after the job",
        Duration::from_secs(10),
        || fake.deleted_paths().iter().any(|p| p.ends_with(&machine)),
    )
    .await;
    assert!(
        ended.elapsed() >= Duration::from_millis(1500),
        "closed only once idle again for the limit, not at the job's end ({:?})",
        ended.elapsed()
    );
    assert!(!fake.has_machine(&machine));
    let r = session
        .post(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}))
        .await;
    assert_eq!(r.status(), 404, "the session is gone");
}

/// A raw 2026-07-28 (sessionless) tools/call over HTTP; answers the structured result.
async fn stateless_call(http: &reqwest::Client, url: &str, tool: &str, args: Value) -> Value {
    use crate::common::sessionless;
    let body = sessionless::body(1, tool, args, "raw-jobs");
    let reply = sessionless::post(http, url, TOKEN, tool, &body)
        .send()
        .await;
    let message = answer(&reply.unwrap().text().await.unwrap());
    assert_eq!(message["result"]["isError"], false, "{tool}: {message}");
    message["result"]["structuredContent"].clone()
}

/// A stateless client's unnamed machine, on a 2 s lease, is not reaped while a 6 s job runs on
/// it though the client names it no more; it is reaped once the job has ended and the lease run
/// out (`Process::hold` in `Jobs::start`).
#[tokio::test]
async fn a_leased_machine_is_kept_while_its_job_runs_and_reaped_after() {
    let fake = FakeServe::start_guest_shell().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let mut env = local_env(&url);
    env.push(("SMOL_MCP_MACHINE_LEASE_SECS", "2"));
    let server = HttpServer::spawn(rt.path(), TOKEN, &env).await;
    let http = reqwest::Client::new();
    let created = stateless_call(
        &http,
        &server.url,
        "create-machine",
        json!({"image": "alpine"}),
    )
    .await;
    let machine = created["machine"]["name"].as_str().unwrap().to_owned();
    let started = stateless_call(
        &http,
        &server.url,
        "run-command",
        json!({"name": machine, "command": "sleep 6; echo done", "background": true}),
    )
    .await;
    assert_eq!(started["state"], "running", "{started}");
    let ran = kept_while_the_job_runs(&fake, &machine).await;
    assert!(
        ran >= Duration::from_secs(5),
        "the job ran its 6 s, past the lease, not ended early with its machine ({ran:?})"
    );
    until(
        "the leased machine reaped after its job",
        Duration::from_secs(10),
        || !fake.has_machine(&machine),
    )
    .await;
    assert!(fake.deleted_paths().iter().any(|p| p.ends_with(&machine)));
}

/// Twenty job-output calls at once, each waiting for its job's end, on four jobs started by
/// three sessions and read from sessions that did not start them: every call answers with its
/// job's whole output and exit code.
#[tokio::test]
async fn twenty_waiting_reads_from_three_sessions_all_answer() {
    let fake = FakeServe::start_guest_shell().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let server = HttpServer::spawn(rt.path(), TOKEN, &local_env(&url)).await;
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(Session::open(&server).await);
    }
    let mut jobs = Vec::new();
    for k in 0..4usize {
        let session = &sessions[k % 3];
        let machine = format!("many-{k}");
        session
            .ok(
                "create-machine",
                json!({"name": machine, "image": "alpine"}),
            )
            .await;
        let started = session
            .ok(
                "run-command",
                json!({"name": machine, "background": true,
                    "command": format!("sleep 3; echo job-{k}-done; exit {}", k + 1)}),
            )
            .await;
        jobs.push((k, started["job"].as_str().unwrap().to_owned()));
    }
    let began = Instant::now();
    let reads: Vec<_> = (0..20)
        .map(|i| {
            // Read from another session than the one that started the job.
            let (k, job) = jobs[i % 4].clone();
            let session = sessions[(k + 1 + i % 2) % 3].clone();
            tokio::spawn(async move {
                let report = session
                    .ok(
                        "job-output",
                        json!({"job": job, "cursor": "0:0", "waitSecs": 20}),
                    )
                    .await;
                (k, report)
            })
        })
        .collect();
    for read in reads {
        let (k, report) = tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("a waiting job-output never answered")
            .unwrap();
        assert_eq!(report["state"], "exited", "waited for the end: {report}");
        assert_eq!(report["exitCode"], k as u64 + 1, "{report}");
        assert_eq!(report["stdout"], format!("job-{k}-done\n"), "{report}");
    }
    assert!(
        began.elapsed() < Duration::from_secs(15),
        "the waits ran side by side, not one after another ({:?})",
        began.elapsed()
    );
}
