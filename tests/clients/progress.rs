//! What the server tells a client while it works: progress notifications during the waits of a
//! call that carried a progress token, and the server's notable events as log messages at the
//! level the client set (a session's `logging/setLevel`, a 2026-07-28 request's `_meta`).

#![allow(deprecated)]

use crate::common::clients::{HttpServer, env_object, run_node, run_python};

use crate::common::fake_serve::{FakeServe, default_exec, exec_response};
use crate::common::mcp::config;
use crate::common::stdio::{SERVER, server_env, spawn_speaking};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, LoggingLevel,
    LoggingMessageNotificationParam, ProgressNotificationParam, ServerResult,
    SetLevelRequestParams,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::{ClientHandler, RoleClient};
use serde_json::{Value, json};
use smol_mcp::process::ephemeral::Entry;
use smol_mcp::process::events::ServerEvent;
use smol_mcp::protocol::Protocol;
use smol_mcp::protocol::server::SmolMcp;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufReader};

/// A pid no process has (above the kernel's pid_max): the owner of an orphan.
const DEAD_PID: u32 = 4_194_303;

/// A client that keeps every progress and log notification it receives.
#[derive(Clone, Default)]
struct Recorder {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    logs: Arc<Mutex<Vec<LoggingMessageNotificationParam>>>,
    arrived: Arc<tokio::sync::Notify>,
}

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params);
        self.arrived.notify_waiters();
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.logs.lock().unwrap().push(params);
        self.arrived.notify_waiters();
    }
}

impl Recorder {
    fn logs(&self) -> Vec<LoggingMessageNotificationParam> {
        self.logs.lock().unwrap().clone()
    }

    /// Waits until a log message whose `data.event` is `event` arrived.
    async fn log_with_event(&self, event: &str) -> LoggingMessageNotificationParam {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let arrived = self.arrived.notified();
            if let Some(found) = self.logs().into_iter().find(|l| l.data["event"] == event) {
                return found;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                tokio::time::timeout(left, arrived).await.is_ok(),
                "no {event} log message arrived; got {:?}",
                self.logs()
            );
        }
    }
}

struct Session {
    client: RunningService<RoleClient, Recorder>,
    recorder: Recorder,
    protocol: Arc<Protocol>,
    _runtime: tempfile::TempDir,
}

async fn session(fake: &FakeServe) -> Session {
    let runtime = tempfile::tempdir().unwrap();
    let env = [
        ("SMOL_LOCAL_URL", fake.url()),
        ("SMOL_MCP_READY_TIMEOUT_SECS", "30".into()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let protocol = Protocol::start(config(&env, &runtime.path().join("rt"))).unwrap();
    let server = SmolMcp::new(protocol.clone(), "progress-test");
    let recorder = Recorder::default();
    let client = crate::common::mcp::connect(server, recorder.clone()).await;
    Session {
        client,
        recorder,
        protocol,
        _runtime: runtime,
    }
}

/// Readiness probes fail until `ready_after` has passed since this is called: a machine that
/// takes that long to boot.
fn slow_readiness(fake: &FakeServe, ready_after: Duration) {
    // Counted from the first readiness probe, not from now: a client slow to start (a Python
    // interpreter under CI's load took over a second) found the machine ready after one
    // progress notification where the test waits for two.
    let first_probe = std::sync::OnceLock::new();
    fake.set_exec(move |request| {
        let probe = request["command"][1]
            .as_str()
            .is_some_and(|a| a.starts_with("ready-"));
        if probe && first_probe.get_or_init(Instant::now).elapsed() < ready_after {
            // The guest agent is not up yet: the engine answers the exec, and no nonce comes back.
            exec_response(1, b"", b"agent not ready")
        } else {
            default_exec(request)
        }
    });
}

fn create_params(name: &str) -> CallToolRequestParams {
    CallToolRequestParams::new("create-machine").with_arguments(
        json!({"image": "alpine", "name": name})
            .as_object()
            .unwrap()
            .clone(),
    )
}

#[tokio::test]
async fn progress_comes_while_a_machine_gets_ready_when_the_request_carries_a_token() {
    let fake = FakeServe::start().await;
    let s = session(&fake).await;
    slow_readiness(&fake, Duration::from_secs(4));
    // rmcp's client gives every request a progress token of its own.
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(create_params("prog-1")));
    let handle = s
        .client
        .send_request_with_option(request, PeerRequestOptions::no_options())
        .await
        .unwrap();
    let token = handle.progress_token.clone();
    let result = handle.await_response().await.unwrap();
    assert!(
        matches!(&result, ServerResult::CallToolResult(r) if r.is_error != Some(true)),
        "{result:?}"
    );
    let progress = s.recorder.progress.lock().unwrap().clone();
    assert!(
        progress.len() >= 2,
        "a 4 s wait sends a notification about once a second: {progress:?}"
    );
    for p in &progress {
        assert_eq!(p.progress_token, token);
        let message = p.message.as_deref().unwrap_or_default();
        assert!(
            message.starts_with("waiting for machine prog-1 to run commands (")
                && message.ends_with(" of 30 s)"),
            "says what it waits for and the limit: {message}"
        );
        let total = p.total.expect("the readiness wait has a limit");
        assert!(total >= p.progress && total >= 30.0, "{p:?}");
    }
    assert!(
        progress.windows(2).all(|w| w[1].progress > w[0].progress),
        "values increase: {progress:?}"
    );
    assert!(
        progress
            .windows(2)
            .all(|w| w[1].progress - w[0].progress >= 0.9),
        "at most about one a second (progress counts the call's seconds): {progress:?}"
    );
}

#[tokio::test]
async fn no_progress_is_sent_without_a_token() {
    // Raw JSON-RPC, as rmcp's own client always sends a token.
    let fake = FakeServe::start().await;
    let mut server = Raw::spawn(&fake);
    server.initialize().await;
    slow_readiness(&fake, Duration::from_secs(3));
    let (before, answer) = server
        .request(
            1,
            "tools/call",
            json!({"name": "create-machine", "arguments": {"image": "alpine", "name": "prog-2"}}),
        )
        .await;
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    // Whatever the call sent came before its result.
    assert!(
        of_method(&before, "notifications/progress").is_empty(),
        "{before:?}"
    );
    // The same wait with a token does report: the knob above made it long enough.
    slow_readiness(&fake, Duration::from_secs(3));
    let (before, answer) = server
        .request(
            2,
            "tools/call",
            json!({"name": "create-machine", "arguments": {"image": "alpine", "name": "prog-3"},
                   "_meta": {"progressToken": "t"}}),
        )
        .await;
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    assert!(
        !of_method(&before, "notifications/progress").is_empty(),
        "{before:?}"
    );
}

async fn list_machines(s: &Session) {
    let result = s
        .client
        .call_tool(
            CallToolRequestParams::new("list-machines").with_arguments(serde_json::Map::new()),
        )
        .await
        .unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
}

#[tokio::test]
async fn the_local_serve_in_use_reaches_a_session_at_info_by_default() {
    let fake = FakeServe::start().await;
    let s = session(&fake).await;
    list_machines(&s).await;
    let message = s.recorder.log_with_event("localServe").await;
    assert_eq!(message.level, LoggingLevel::Info);
    assert_eq!(message.logger.as_deref(), Some("smol-mcp"));
    assert_eq!(message.data["version"], "1.32.2");
    assert_eq!(message.data["started"], false);
    let listen = message.data["listen"].as_str().unwrap();
    assert!(
        listen.ends_with("api.sock") && message.data["message"].as_str().unwrap().contains(listen),
        "{message:?}"
    );
}

#[tokio::test]
async fn set_level_info_receives_the_events_and_warning_hides_them() {
    let fake = FakeServe::start().await;
    let info = session(&fake).await;
    info.client
        .set_level(SetLevelRequestParams::new(LoggingLevel::Info))
        .await
        .unwrap();
    list_machines(&info).await;
    info.recorder.log_with_event("localServe").await;

    let warning = session(&fake).await;
    warning
        .client
        .set_level(SetLevelRequestParams::new(LoggingLevel::Warning))
        .await
        .unwrap();
    list_machines(&warning).await;
    // Events reach a session in the order they were published: once a later warning arrived,
    // the info event before it has been passed over.
    warning
        .protocol
        .process()
        .events
        .publish(ServerEvent::warning("marker", "a later warning"));
    warning.recorder.log_with_event("marker").await;
    let events: Vec<Value> = warning
        .recorder
        .logs()
        .iter()
        .map(|l| l.data["event"].clone())
        .collect();
    assert_eq!(events, [json!("marker")], "the info event was not sent");
}

#[tokio::test]
async fn machines_a_dead_process_left_are_reported_when_the_first_local_call_deletes_them() {
    let fake = FakeServe::start().await;
    let s = session(&fake).await;
    fake.add_machine("smol-orphan", "stopped");
    s.protocol
        .process()
        .record
        .add_new(
            // As the record file has it: what it does not name is unset.
            serde_json::from_value::<Entry>(json!({"fleet": "local", "name": "smol-orphan",
                "id": "smol-orphan", "ownerPid": DEAD_PID, "session": "gone"}))
            .unwrap(),
        )
        .await
        .unwrap();
    list_machines(&s).await;
    let message = s.recorder.log_with_event("orphansDeleted").await;
    assert_eq!(message.level, LoggingLevel::Info);
    assert_eq!(message.data["machines"], json!(["smol-orphan"]));
    assert_eq!(message.data["fleet"], "local");
    assert!(!fake.has_machine("smol-orphan"));
}

/// The stdio binary spoken to with raw JSON-RPC lines, keeping what comes before each answer.
struct Raw {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    /// The runtime directory of its own that [`Raw::spawn`] made, kept while it runs.
    _runtime: Option<tempfile::TempDir>,
}

impl Raw {
    /// A fresh process on the fake, in a runtime directory of its own.
    fn spawn(fake: &FakeServe) -> Raw {
        let runtime = tempfile::tempdir().unwrap();
        let mut raw = Raw::spawn_with(server_env(
            runtime.path(),
            &[
                ("SMOL_LOCAL_URL", &fake.url()),
                ("SMOL_MCP_READY_TIMEOUT_SECS", "30"),
            ],
        ));
        raw._runtime = Some(runtime);
        raw
    }

    fn spawn_with(env: Vec<(String, String)>) -> Raw {
        let (child, stdin, lines) = spawn_speaking(
            tokio::process::Command::new(SERVER).env_clear().envs(env),
            Stdio::inherit(),
        );
        Raw {
            child,
            stdin,
            lines,
            _runtime: None,
        }
    }

    async fn send(&mut self, message: Value) {
        self.stdin
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// The 2025-11-25 handshake: a session.
    async fn initialize(&mut self) {
        let (_, init) = self
            .request(
                0,
                "initialize",
                json!({
                    "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "0"}
                }),
            )
            .await;
        assert!(
            init["result"]["capabilities"]["logging"].is_object(),
            "{init}"
        );
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
    }

    /// Sends a request; answers the messages written before its answer, and the answer.
    async fn request(&mut self, id: u64, method: &str, params: Value) -> (Vec<Value>, Value) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let mut before = Vec::new();
        loop {
            let line = tokio::time::timeout(Duration::from_secs(30), self.lines.next_line())
                .await
                .expect("no answer in time")
                .unwrap()
                .expect("the server closed stdout");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == json!(id) {
                return (before, message);
            }
            before.push(message);
        }
    }

    /// A 2026-07-28 tool call: no session, the client's context in every request's `_meta`.
    async fn call(&mut self, id: u64, tool: &str, args: Value, meta: Value) -> (Vec<Value>, Value) {
        let mut meta = meta;
        meta["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
        meta["io.modelcontextprotocol/clientInfo"] = json!({"name": "raw", "version": "0"});
        meta["io.modelcontextprotocol/clientCapabilities"] = json!({});
        self.request(
            id,
            "tools/call",
            json!({"name": tool, "arguments": args, "_meta": meta}),
        )
        .await
    }
}

fn of_method<'a>(messages: &'a [Value], method: &str) -> Vec<&'a Value> {
    messages.iter().filter(|m| m["method"] == method).collect()
}

#[tokio::test]
async fn a_2026_07_28_request_gets_the_events_of_its_own_call_at_its_own_level() {
    let fake = FakeServe::start().await;
    let mut server = Raw::spawn(&fake);
    let (before, result) = server
        .call(
            1,
            "list-machines",
            json!({}),
            json!({"io.modelcontextprotocol/logLevel": "info"}),
        )
        .await;
    assert_eq!(result["result"]["isError"], false, "{result}");
    let logs = of_method(&before, "notifications/message");
    assert_eq!(logs.len(), 1, "{before:?}");
    assert_eq!(logs[0]["params"]["level"], "info");
    assert_eq!(logs[0]["params"]["logger"], "smol-mcp");
    assert_eq!(logs[0]["params"]["data"]["event"], "localServe");
    server.child.start_kill().unwrap();

    // A request that asks for warnings and above, in a fresh process (the serve is found again
    // at its first local call): the info event is not sent.
    let mut server = Raw::spawn(&fake);
    let (before, result) = server
        .call(
            1,
            "list-machines",
            json!({}),
            json!({"io.modelcontextprotocol/logLevel": "warning"}),
        )
        .await;
    assert_eq!(result["result"]["isError"], false, "{result}");
    assert!(
        of_method(&before, "notifications/message").is_empty(),
        "{before:?}"
    );
    server.child.start_kill().unwrap();

    // And without a level, nothing.
    let mut server = Raw::spawn(&fake);
    let (before, _) = server.call(1, "list-machines", json!({}), json!({})).await;
    assert!(
        of_method(&before, "notifications/message").is_empty(),
        "{before:?}"
    );
}

#[tokio::test]
async fn a_2026_07_28_request_gets_progress_on_its_own_reply() {
    let fake = FakeServe::start().await;
    let mut server = Raw::spawn(&fake);
    slow_readiness(&fake, Duration::from_secs(3));
    let (before, result) = server
        .call(
            7,
            "create-machine",
            json!({"image": "alpine", "name": "prog-stateless"}),
            json!({"progressToken": 42}),
        )
        .await;
    assert_eq!(result["result"]["isError"], false, "{result}");
    let progress = of_method(&before, "notifications/progress");
    assert!(!progress.is_empty(), "{before:?}");
    for p in &progress {
        assert_eq!(p["params"]["progressToken"], 42);
        assert!(
            p["params"]["message"]
                .as_str()
                .unwrap()
                .starts_with("waiting for machine prog-stateless to run commands"),
            "{p}"
        );
    }
}

#[tokio::test]
async fn the_typescript_sdk_gets_progress_through_onprogress() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let env = server_env(
        rt.path(),
        &[
            ("SMOL_LOCAL_URL", &fake.url()),
            ("SMOL_MCP_READY_TIMEOUT_SECS", "30"),
        ],
    );
    let env = env_object(env);
    slow_readiness(&fake, Duration::from_secs(4));
    let plan = json!({"server": SERVER, "env": env, "name": "prog-ts"});
    let report = run_node("ts_progress.mjs", &plan).await;
    assert_eq!(report["result"]["isError"], false, "{report}");
    let progress = report["progress"].as_array().unwrap();
    assert!(progress.len() >= 2, "{report}");
    assert!(
        progress.iter().all(|p| p["message"]
            .as_str()
            .unwrap()
            .starts_with("waiting for machine prog-ts to run commands")),
        "{report}"
    );
    let values: Vec<f64> = progress
        .iter()
        .map(|p| p["progress"].as_f64().unwrap())
        .collect();
    assert!(values.windows(2).all(|w| w[1] > w[0]), "{values:?}");
    // No setLevel: the session gets info and above, the local serve in use among them.
    let logs = report["logs"].as_array().unwrap();
    assert!(
        logs.iter()
            .any(|l| l["data"]["event"] == "localServe" && l["logger"] == "smol-mcp"),
        "{report}"
    );
}

/// The HTTP server binary on a free port, with its bearer token.
async fn http_server(fake: &FakeServe, rt: &std::path::Path) -> (tokio::process::Child, String) {
    let server = HttpServer::spawn(
        rt,
        HTTP_TOKEN,
        &[
            ("SMOL_LOCAL_URL", &fake.url()),
            ("SMOL_MCP_READY_TIMEOUT_SECS", "30"),
        ],
    )
    .await;
    (server.child, server.url)
}

const HTTP_TOKEN: &str = "test-progress-token";

async fn python_progress(url: &str, mode: &str, name: &str, log_level: &str) -> Value {
    let plan =
        json!({"url": url, "token": HTTP_TOKEN, "mode": mode, "name": name, "logLevel": log_level});
    run_python("progress_http.py", &plan).await
}

fn assert_readiness_progress(report: &Value, name: &str) {
    assert_eq!(report["result"]["isError"], false, "{report}");
    let progress = report["progress"].as_array().unwrap();
    assert!(progress.len() >= 2, "{report}");
    let prefix = format!("waiting for machine {name} to run commands");
    assert!(
        progress
            .iter()
            .all(|p| p["message"].as_str().unwrap().starts_with(&prefix)),
        "{report}"
    );
}

#[tokio::test]
async fn the_python_client_gets_progress_and_log_messages_over_http_on_both_lifecycles() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let (_server, url) = http_server(&fake, rt.path()).await;

    // 2026-07-28: stateless, so progress and the request's log messages travel on that
    // request's own reply; the first local call of the process finds the serve.
    slow_readiness(&fake, Duration::from_secs(3));
    let modern = python_progress(&url, "auto", "prog-py-modern", "info").await;
    assert_eq!(modern["protocolVersion"], "2026-07-28", "{modern}");
    assert_readiness_progress(&modern, "prog-py-modern");
    let logs = modern["logs"].as_array().unwrap();
    assert!(
        logs.iter()
            .any(|l| l["data"]["event"] == "localServe" && l["level"] == "info"),
        "{modern}"
    );

    // A session: progress on the request's stream, routed by its token.
    slow_readiness(&fake, Duration::from_secs(3));
    let session = python_progress(&url, "legacy", "prog-py-session", "info").await;
    assert_eq!(session["protocolVersion"], "2025-11-25", "{session}");
    assert_readiness_progress(&session, "prog-py-session");
}

#[tokio::test]
async fn the_local_serve_start_up_is_reported_while_it_is_waited_for() {
    // An engine that takes 3 s to give up without ever answering /health: the first local call
    // waits for it, and a request with a token hears about the wait.
    let rt = tempfile::tempdir().unwrap();
    let engine = rt.path().join("slow-smolvm");
    std::fs::write(&engine, "#!/bin/sh\nsleep 3\nexit 1\n").unwrap();
    std::fs::set_permissions(&engine, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let env = server_env(
        rt.path(),
        &[
            ("SMOLVM", &engine.display().to_string()),
            ("SMOL_MCP_SERVE_START_TIMEOUT_SECS", "20"),
        ],
    );
    let mut server = Raw::spawn_with(env);
    server.initialize().await;
    let (before, answer) = server
        .request(
            1,
            "tools/call",
            json!({"name": "list-machines", "arguments": {}, "_meta": {"progressToken": "serve"}}),
        )
        .await;
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let progress = of_method(&before, "notifications/progress");
    assert!(progress.len() >= 2, "{before:?}");
    for p in progress {
        let message = p["params"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("waiting for the local engine (smolvm serve) to start (")
                && message.ends_with(" of 20 s)"),
            "{message}"
        );
    }
}

#[tokio::test]
async fn a_pull_is_reported_while_it_is_waited_for() {
    let fake = FakeServe::start().await;
    let s = session(&fake).await;
    fake.add_machine("puller", "running");
    fake.state.lock().unwrap().pull_delay = Some(Duration::from_secs(3));
    let result = s
        .client
        .call_tool(
            CallToolRequestParams::new("pull-image").with_arguments(
                json!({"name": "puller", "image": "alpine:3.20"})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
        )
        .await
        .unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    let progress = s.recorder.progress.lock().unwrap().clone();
    assert!(progress.len() >= 2, "{progress:?}");
    for p in &progress {
        let message = p.message.as_deref().unwrap_or_default();
        assert!(
            message.starts_with("waiting for alpine:3.20 to be pulled into machine puller (")
                && message.ends_with(" s)")
                && !message.contains(" of "),
            "a pull has no known end: {message}"
        );
        assert_eq!(p.total, None, "{p:?}");
    }
}
