//! A running command's output as progress notifications: run-command and run-once on both
//! fleets stream it when the request carries a progress token, in order, marked by stream,
//! batched, whole characters, all before the result; without a token the plain exec is used;
//! a cancelled call ends the stream and the command at once.

use crate::common::clients::{env_object, run_node};
use crate::common::fake_cloud::{FakeCloud, TOKEN};
use crate::common::fake_serve::FakeServe;
use crate::common::fake_stream::{StreamCounts, StreamStep};
use crate::common::mcp::config;
use crate::common::stdio::{StdioServer, server_env};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, ProgressNotificationParam, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestHandle, RunningService};
use rmcp::{ClientHandler, RoleClient};
use serde_json::{Value, json};
use smol_mcp::protocol::Protocol;
use smol_mcp::protocol::server::SmolMcp;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A client that keeps every progress notification and when it arrived.
#[derive(Clone, Default)]
struct Recorder {
    progress: Arc<Mutex<Vec<(Instant, ProgressNotificationParam)>>>,
    arrived: Arc<tokio::sync::Notify>,
}

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        mut params: ProgressNotificationParam,
        context: NotificationContext<RoleClient>,
    ) {
        // rmcp 3.11's client moves a notification's `_meta` into the context's extensions
        // (it swaps the extensions out before reading the meta from them).
        if params.meta.is_none() {
            params.meta = context
                .extensions
                .get::<rmcp::model::NotificationMetaObject>()
                .cloned();
        }
        self.progress.lock().unwrap().push((Instant::now(), params));
        self.arrived.notify_waiters();
    }
}

impl Recorder {
    fn all(&self) -> Vec<(Instant, ProgressNotificationParam)> {
        self.progress.lock().unwrap().clone()
    }

    /// Waits until some notification's message contains `text`.
    async fn until_message_has(&self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let arrived = self.arrived.notified();
            if self
                .all()
                .iter()
                .any(|(_, p)| p.message.as_deref().unwrap_or_default().contains(text))
            {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                tokio::time::timeout(left, arrived).await.is_ok(),
                "no notification with {text:?}; got {:?}",
                self.all()
            );
        }
    }
}

/// The output pieces of every notification, in order, as (stream, text), from `_meta`.
fn pieces(notes: &[(Instant, ProgressNotificationParam)]) -> Vec<(String, String)> {
    notes
        .iter()
        .filter_map(|(_, p)| p.meta.as_ref())
        .flat_map(|m| {
            m.0.0["smol-mcp/output"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|p| {
            (
                p["stream"].as_str().unwrap().to_owned(),
                p["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn text_of(pieces: &[(String, String)], stream: &str) -> String {
    pieces
        .iter()
        .filter(|(s, _)| s == stream)
        .map(|(_, t)| t.as_str())
        .collect()
}

struct Session {
    client: RunningService<RoleClient, Recorder>,
    recorder: Recorder,
    _runtime: tempfile::TempDir,
}

async fn session(env: &[(&str, &str)]) -> Session {
    let runtime = tempfile::tempdir().unwrap();
    let protocol = Protocol::start(config(env, &runtime.path().join("rt"))).unwrap();
    let server = SmolMcp::new(protocol, "streaming-test");
    let recorder = Recorder::default();
    let client = crate::common::mcp::connect(server, recorder.clone()).await;
    Session {
        client,
        recorder,
        _runtime: runtime,
    }
}

/// What a fake's streamed exec sends, from the request.
type Script = Box<dyn Fn(&Value) -> Vec<StreamStep> + Send + Sync>;

/// A fleet under test: a fake that streams over time, and a session on it.
struct Fleet {
    name: &'static str,
    session: Session,
    streams: Arc<StreamCounts>,
    /// The machine run-command runs in.
    machine: String,
    requests: Box<dyn Fn() -> Vec<Value>>,
    set_stream: Box<dyn Fn(Script)>,
    set_gap: Box<dyn Fn(Option<Duration>)>,
    /// Machines the fake holds now.
    machine_count: Box<dyn Fn() -> usize>,
}

async fn local() -> Fleet {
    let fake = FakeServe::start().await;
    fake.add_machine("m", "running");
    let url = fake.url();
    let session = session(&[("SMOL_LOCAL_URL", url.as_str())]).await;
    let (f1, f2, f3, f4) = (fake.clone(), fake.clone(), fake.clone(), fake.clone());
    Fleet {
        name: "local",
        session,
        streams: fake.streams(),
        machine: "m".into(),
        requests: Box::new(move || f1.take_requests()),
        set_stream: Box::new(move |hook| f2.set_stream(hook)),
        set_gap: Box::new(move |gap| f3.state.lock().unwrap().stream_gap = gap),
        machine_count: Box::new(move || f4.state.lock().unwrap().machines.len()),
    }
}

async fn cloud() -> Fleet {
    let fake = FakeCloud::start_streaming().await;
    fake.add_machine("w", "started");
    let url = fake.url();
    let session = session(&[
        ("SMOL_CLOUD_URL", url.as_str()),
        ("SMOL_CLOUD_TOKEN", TOKEN),
        ("SMOL_MCP_TARGETS", "cloud"),
    ])
    .await;
    let (f1, f2, f3, f4) = (fake.clone(), fake.clone(), fake.clone(), fake.clone());
    Fleet {
        name: "cloud",
        session,
        streams: fake.streams(),
        machine: "w".into(),
        requests: Box::new(move || f1.take_requests()),
        set_stream: Box::new(move |hook| f2.set_stream(hook)),
        set_gap: Box::new(move |gap| f3.state.lock().unwrap().stream_gap = gap),
        machine_count: Box::new(move || f4.state.lock().unwrap().machines.len()),
    }
}

async fn both() -> [Fleet; 2] {
    [local().await, cloud().await]
}

/// Sends a tool call; rmcp's client gives every request a progress token of its own.
async fn send(fleet: &Fleet, tool: &str, args: Value) -> RequestHandle<RoleClient> {
    let Value::Object(map) = args else { panic!() };
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(
        CallToolRequestParams::new(tool.to_owned()).with_arguments(map),
    ));
    fleet
        .session
        .client
        .send_request_with_option(request, PeerRequestOptions::no_options())
        .await
        .unwrap()
}

async fn result_of(handle: RequestHandle<RoleClient>) -> Value {
    match handle.await_response().await.unwrap() {
        ServerResult::CallToolResult(r) => {
            assert_ne!(r.is_error, Some(true), "{r:?}");
            r.structured_content.unwrap()
        }
        other => panic!("{other:?}"),
    }
}

async fn until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn output_arrives_in_order_and_marked_while_the_command_runs() {
    for fleet in both().await {
        (fleet.set_stream)(Box::new(|_| {
            vec![
                StreamStep::stdout("compiling\n"),
                StreamStep::stderr("warning: unused\n"),
                StreamStep::stdout("linking\n"),
                StreamStep::exit(0),
            ]
        }));
        (fleet.set_gap)(Some(Duration::from_millis(400)));
        let machine = fleet.machine.clone();
        let handle = send(
            &fleet,
            "run-command",
            json!({"name": machine, "command": "make"}),
        )
        .await;
        let token = handle.progress_token.clone();
        let call = tokio::spawn(result_of(handle));
        // The first line is at the client while the command still runs.
        fleet
            .session
            .recorder
            .until_message_has("[stdout] compiling")
            .await;
        assert_eq!(
            fleet.streams.finished(),
            0,
            "{}: the first line came before the stream ended",
            fleet.name
        );
        assert!(!call.is_finished(), "{}: and before the result", fleet.name);
        let result = call.await.unwrap();
        let ended = Instant::now();
        // The result is what it always was.
        assert_eq!(result["stdout"], "compiling\nlinking\n", "{}", fleet.name);
        assert_eq!(result["stderr"], "warning: unused\n", "{}", fleet.name);
        assert_eq!(result["exitCode"], 0);
        assert_eq!(result["timedOut"], false);
        let notes = fleet.session.recorder.all();
        assert!(notes.iter().all(|(at, _)| *at <= ended));
        assert!(notes.iter().all(|(_, p)| p.progress_token == token));
        assert!(
            notes.windows(2).all(|w| w[0].1.progress < w[1].1.progress),
            "progress increases: {notes:?}"
        );
        assert_eq!(
            pieces(&notes),
            [
                ("stdout".to_owned(), "compiling\n".to_owned()),
                ("stderr".to_owned(), "warning: unused\n".to_owned()),
                ("stdout".to_owned(), "linking\n".to_owned()),
            ],
            "{}",
            fleet.name
        );
        let messages: String = notes
            .iter()
            .map(|(_, p)| p.message.clone().unwrap())
            .collect();
        assert_eq!(
            messages, "[stdout] compiling\n[stderr] warning: unused\n[stdout] linking\n",
            "{}",
            fleet.name
        );
        let requests = (fleet.requests)();
        assert!(
            requests
                .iter()
                .any(|r| r["path"].as_str().unwrap().ends_with("/exec/stream")),
            "{}: {requests:?}",
            fleet.name
        );
    }
}

#[tokio::test]
async fn a_chatty_command_gives_a_handful_of_notifications_with_all_its_output() {
    for fleet in both().await {
        (fleet.set_stream)(Box::new(|_| {
            let mut steps: Vec<StreamStep> = (0..1000)
                .map(|i| StreamStep::stdout(&format!("line {i}\n")))
                .collect();
            steps.push(StreamStep::exit(0));
            steps
        }));
        let machine = fleet.machine.clone();
        let began = Instant::now();
        let handle = send(
            &fleet,
            "run-command",
            json!({"name": machine, "command": "seq 1000"}),
        )
        .await;
        result_of(handle).await;
        let took = began.elapsed();
        let notes = fleet.session.recorder.all();
        let expected: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        assert_eq!(
            text_of(&pieces(&notes), "stdout"),
            expected,
            "{}",
            fleet.name
        );
        // One at once, then at most one every 250 ms, and the last before the result.
        let most = 2 + (took.as_millis() / 250) as usize;
        assert!(
            notes.len() <= most && notes.len() < 20,
            "{}: {} notifications in {took:?}",
            fleet.name,
            notes.len()
        );
    }
}

#[tokio::test]
async fn a_character_split_across_two_reads_arrives_whole() {
    for fleet in both().await {
        let text = "h\u{e9}llo \u{1f600}\n";
        (fleet.set_stream)(Box::new(move |_| {
            // Cut inside the é, the second half sent 100 ms later.
            let at = "event: stdout\ndata: h".len() + 1;
            vec![
                StreamStep::Split("stdout".into(), text.into(), at, Duration::from_millis(100)),
                StreamStep::Split(
                    "stdout".into(),
                    "\u{1f600}\n".into(),
                    "event: stdout\ndata: ".len() + 2,
                    Duration::from_millis(100),
                ),
                StreamStep::exit(0),
            ]
        }));
        let machine = fleet.machine.clone();
        let handle = send(
            &fleet,
            "run-command",
            json!({"name": machine, "command": "greet"}),
        )
        .await;
        let result = result_of(handle).await;
        let notes = fleet.session.recorder.all();
        let streamed = text_of(&pieces(&notes), "stdout");
        assert_eq!(streamed, format!("{text}\u{1f600}\n"), "{}", fleet.name);
        assert!(!streamed.contains('\u{fffd}'));
        assert_eq!(result["stdout"], streamed);
    }
}

#[tokio::test]
async fn carriage_returns_come_back_as_they_were() {
    let fleet = local().await;
    (fleet.set_stream)(Box::new(|_| {
        vec![
            StreamStep::stdout("10%\r50%\r100%\r\n"),
            StreamStep::stdout("done\r\n"),
            StreamStep::exit(0),
        ]
    }));
    let handle = send(
        &fleet,
        "run-command",
        json!({"name": "m", "command": "pip install x"}),
    )
    .await;
    let result = result_of(handle).await;
    assert_eq!(result["stdout"], "10%\r50%\r100%\r\ndone\r\n");
}

/// A request without a progress token (raw JSON-RPC; rmcp's client always sends one) uses the
/// plain exec on both fleets: the fakes see no stream request.
#[tokio::test]
async fn without_a_progress_token_the_plain_exec_runs() {
    let serve = FakeServe::start().await;
    serve.add_machine("m", "running");
    let cloud = FakeCloud::start_streaming().await;
    let id = cloud.add_machine("w", "started");
    let runtime = tempfile::tempdir().unwrap();
    let (local_url, cloud_url) = (serve.url(), cloud.url());
    let mut server = StdioServer::spawn(server_env(
        runtime.path(),
        &[
            ("SMOL_LOCAL_URL", local_url.as_str()),
            ("SMOL_CLOUD_URL", cloud_url.as_str()),
            ("SMOL_CLOUD_TOKEN", TOKEN),
            ("SMOL_MCP_TARGETS", "both"),
        ],
    ))
    .await;
    let local = server
        .tool(
            1,
            "run-command",
            json!({"name": "m", "command": ["echo", "hi"], "target": "local"}),
        )
        .await;
    assert_eq!(local["stdout"], "hi\n");
    let remote = server
        .tool(
            2,
            "run-command",
            json!({"name": id, "command": ["echo", "hi"], "target": "cloud"}),
        )
        .await;
    assert_eq!(remote["stdout"], "hi\n");
    for (fleet, requests) in [
        ("local", serve.take_requests()),
        ("cloud", cloud.take_requests()),
    ] {
        let paths: Vec<&str> = requests
            .iter()
            .map(|r| r["path"].as_str().unwrap())
            .collect();
        assert!(
            paths.iter().any(|p| p.ends_with("/exec")),
            "{fleet}: {paths:?}"
        );
        assert!(
            !paths.iter().any(|p| p.ends_with("/exec/stream")),
            "{fleet}: {paths:?}"
        );
    }
    assert_eq!(serve.streams().begun() + cloud.streams().begun(), 0);
}

fn marker_of(request: &Value) -> Option<String> {
    match &request["body"]["env"] {
        // Local: [{name, value}]; cloud: {name: value}.
        Value::Array(env) => env
            .iter()
            .find(|v| v["name"] == "SMOL_MCP_RUN")
            .and_then(|v| v["value"].as_str().map(str::to_owned)),
        env => env["SMOL_MCP_RUN"].as_str().map(str::to_owned),
    }
}

fn long_stream(_: &Value) -> Vec<StreamStep> {
    let mut steps: Vec<StreamStep> = (0..600)
        .map(|i| StreamStep::stdout(&format!("tick {i}\n")))
        .collect();
    steps.push(StreamStep::exit(0));
    steps
}

#[tokio::test]
async fn a_cancelled_run_command_ends_its_stream_and_kills_its_command() {
    for fleet in both().await {
        (fleet.set_stream)(Box::new(long_stream));
        (fleet.set_gap)(Some(Duration::from_millis(100)));
        let machine = fleet.machine.clone();
        let handle = send(
            &fleet,
            "run-command",
            json!({"name": machine, "command": "tail -f log"}),
        )
        .await;
        fleet.session.recorder.until_message_has("tick 2").await;
        let cancelled = Instant::now();
        handle.cancel(Some("test".into())).await.unwrap();
        until(
            &format!("{}: the stream closed after the cancel", fleet.name),
            Duration::from_secs(2),
            || fleet.streams.closed_early() == 1,
        )
        .await;
        assert!(
            cancelled.elapsed() < Duration::from_secs(1),
            "{}",
            fleet.name
        );
        // The engine does not end a command whose stream is closed: the marked command is
        // killed by a second exec.
        let mut seen = Vec::new();
        until(
            &format!("{}: the kill of the marked command", fleet.name),
            Duration::from_secs(3),
            || {
                seen.extend((fleet.requests)());
                let marker = seen
                    .iter()
                    .find(|r| r["path"].as_str().unwrap().ends_with("/exec/stream"))
                    .and_then(marker_of);
                marker.is_some_and(|m| {
                    seen.iter().any(|r| {
                        r["path"].as_str().unwrap().ends_with("/exec")
                            && r["body"]["command"][2]
                                .as_str()
                                .is_some_and(|s| s.contains(&m))
                    })
                })
            },
        )
        .await;
        assert_eq!(fleet.streams.finished(), 0, "{}", fleet.name);
    }
}

#[tokio::test]
async fn a_cancelled_run_once_ends_its_stream_and_deletes_its_machine() {
    for fleet in both().await {
        (fleet.set_stream)(Box::new(long_stream));
        (fleet.set_gap)(Some(Duration::from_millis(100)));
        let before = (fleet.machine_count)();
        let handle = send(
            &fleet,
            "run-once",
            json!({"image": "alpine", "command": "tail -f log"}),
        )
        .await;
        fleet.session.recorder.until_message_has("tick 2").await;
        assert_eq!((fleet.machine_count)(), before + 1, "{}", fleet.name);
        handle.cancel(Some("test".into())).await.unwrap();
        until(
            &format!("{}: the stream closed and the machine deleted", fleet.name),
            Duration::from_secs(3),
            || fleet.streams.closed_early() == 1 && (fleet.machine_count)() == before,
        )
        .await;
    }
}

/// The TypeScript SDK with a 2 s request timeout and `resetTimeoutOnProgress`, on a command
/// printing every 0.5 s for 5 s: the output notifications keep the call alive and it completes.
#[tokio::test]
async fn the_typescript_sdk_outlasts_its_request_timeout_on_output() {
    let fake = FakeServe::start().await;
    fake.add_machine("m", "running");
    fake.set_stream(|_| {
        let mut steps: Vec<StreamStep> = (0..10)
            .map(|i| StreamStep::stdout(&format!("step {i}\n")))
            .collect();
        steps.push(StreamStep::exit(0));
        steps
    });
    fake.state.lock().unwrap().stream_gap = Some(Duration::from_millis(500));
    let rt = tempfile::tempdir().unwrap();
    let env = env_object(server_env(rt.path(), &[("SMOL_LOCAL_URL", &fake.url())]));
    let plan =
        json!({"server": crate::common::stdio::SERVER, "env": env, "name": "m", "timeoutMs": 2000});
    let report = run_node("ts_stream.mjs", &plan).await;
    assert_eq!(report["result"]["isError"], false, "{report}");
    let expected: String = (0..10).map(|i| format!("step {i}\n")).collect();
    assert_eq!(
        report["result"]["structured"]["stdout"], expected,
        "{report}"
    );
    assert!(
        report["elapsedMs"].as_u64().unwrap() > 4000,
        "the command outlasted the 2 s timeout: {report}"
    );
    let messages: String = report["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p["message"]
                .as_str()
                .unwrap()
                .trim_start_matches("[stdout] ")
        })
        .collect();
    assert_eq!(messages, expected, "{report}");
}
