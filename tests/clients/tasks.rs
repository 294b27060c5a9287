//! MCP tasks (SEP-2663) on the 2026-07-28 lifecycle: a run-command or run-once from a client
//! that declares the `io.modelcontextprotocol/tasks` extension becomes a task when it runs
//! longer than `taskAfterMillis`; tasks/get polls it to the result the call would have
//! answered, tasks/cancel ends its command. Raw JSON-RPC over HTTP against `smol-mcp-http`
//! and the fake serve, then the official Python client through its extension hook.

use crate::common::clients::{HttpServer, env_object, run_python};
use crate::common::fake_serve::{FakeServe, exec_response};
use crate::common::fake_stream::StreamStep;
use crate::common::stdio::{SERVER, server_env};
use crate::common::until;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const TOKEN: &str = "tasks-token";
const TASKS: &str = "io.modelcontextprotocol/tasks";

/// A 2026-07-28 client over HTTP speaking raw JSON-RPC, with or without the tasks extension.
struct Client {
    http: reqwest::Client,
    url: String,
    tasks: bool,
    next_id: u64,
}

impl Client {
    /// `timeout`: each request's, as a client's tool-call timeout.
    fn new(server: &HttpServer, tasks: bool, timeout: Duration) -> Client {
        Client {
            http: reqwest::Client::builder().timeout(timeout).build().unwrap(),
            url: server.url.clone(),
            tasks,
            next_id: 1,
        }
    }

    fn meta(&self) -> Value {
        let capabilities = if self.tasks {
            json!({"extensions": {TASKS: {}}})
        } else {
            json!({})
        };
        json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": capabilities,
            "io.modelcontextprotocol/clientInfo": {"name": "raw-tasks", "version": "0"},
        })
    }

    /// Sends one request and answers its JSON-RPC response (result or error), or the HTTP
    /// client's error (a timeout).
    async fn request(
        &mut self,
        method: &str,
        name: &str,
        mut params: Value,
    ) -> Result<Value, reqwest::Error> {
        let mut meta = self.meta();
        if let Some(Value::Object(extra)) = params.get("_meta") {
            meta.as_object_mut().unwrap().extend(extra.clone());
        }
        params["_meta"] = meta;
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let text = self
            .http
            .post(&self.url)
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", method)
            .header("mcp-name", name)
            .json(&body)
            .send()
            .await?
            .text()
            .await?;
        Ok(answer(&text, id))
    }

    async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.request(
            "tools/call",
            tool,
            json!({"name": tool, "arguments": arguments}),
        )
        .await
        .unwrap()
    }

    /// A tools/call whose request asks for progress (so the command goes through the
    /// engine's output stream).
    async fn call_with_progress(&mut self, tool: &str, arguments: Value) -> Value {
        let params =
            json!({"name": tool, "arguments": arguments, "_meta": {"progressToken": "p1"}});
        self.request("tools/call", tool, params).await.unwrap()
    }

    async fn get(&mut self, task_id: &str) -> Value {
        self.request("tasks/get", task_id, json!({"taskId": task_id}))
            .await
            .unwrap()
    }

    async fn cancel(&mut self, task_id: &str) -> Value {
        self.request("tasks/cancel", task_id, json!({"taskId": task_id}))
            .await
            .unwrap()
    }

    /// Polls tasks/get until the task is no longer working; answers every poll's result.
    async fn poll_until_done(&mut self, task_id: &str, limit: Duration) -> Vec<Value> {
        let start = Instant::now();
        let mut polls = Vec::new();
        loop {
            let got = self.get(task_id).await;
            let result = got["result"].clone();
            assert!(result.is_object(), "tasks/get answered {got}");
            let working = result["status"] == "working";
            polls.push(result);
            if !working {
                return polls;
            }
            assert!(start.elapsed() < limit, "the task still works: {polls:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The JSON-RPC answer with `id` in a body that is JSON or an SSE stream.
fn answer(body: &str, id: u64) -> Value {
    if let Ok(value) = serde_json::from_str::<Value>(body) {
        return value;
    }
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|message| message["id"] == id)
        .unwrap_or_else(|| panic!("no answer to {id} in {body}"))
}

/// The fake serve with machine `m` running, and `smol-mcp-http` in front of it answering a
/// call as a task after 300 ms.
async fn setup() -> (FakeServe, HttpServer, tempfile::TempDir) {
    let fake = FakeServe::start().await;
    fake.add_machine("m", "running");
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let server = HttpServer::spawn(
        rt.path(),
        TOKEN,
        &[
            ("SMOL_LOCAL_URL", &url),
            ("SMOL_MCP_TASK_AFTER_MILLIS", "300"),
        ],
    )
    .await;
    (fake, server, rt)
}

fn sorted_keys(value: &Value) -> Vec<String> {
    let mut keys: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn the_server_declares_the_tasks_extension() {
    let (_fake, server, _rt) = setup().await;
    let mut client = Client::new(&server, false, Duration::from_secs(10));
    let discover = client
        .request("server/discover", "", json!({}))
        .await
        .unwrap();
    assert_eq!(
        discover["result"]["capabilities"]["extensions"][TASKS],
        json!({}),
        "{discover}"
    );
}

/// The whole point: a command longer than the client's request timeout (1 s here, 60 s in
/// many clients) completes, through a task the client polls with requests as short.
#[tokio::test]
async fn a_long_command_becomes_a_task_that_outlives_the_request_timeout() {
    let (_fake, server, _rt) = setup().await;
    let mut client = Client::new(&server, true, Duration::from_secs(1));
    let began = Instant::now();
    let created = client
        .call(
            "run-command",
            json!({"name": "m", "command": "sleep 3", "timeoutSecs": 290}),
        )
        .await;
    let task = &created["result"];
    assert_eq!(task["resultType"], "task", "{created}");
    assert_eq!(task["status"], "working", "{created}");
    assert!(
        began.elapsed() < Duration::from_secs(1),
        "answered at the threshold"
    );
    // rmcp fails a task at its TTL and aborts its call: the TTL covers the longest the call
    // can take by its bounds, the command's timeout and the waits before it (the test's
    // serveStartTimeoutSecs 60 and readyTimeoutSecs 5), more than rmcp's default 300 s here.
    assert!(
        task["ttlMs"].as_u64().unwrap() >= (290 + 60 + 5) * 1000,
        "the TTL covers the call: {task}"
    );
    assert!(task["pollIntervalMs"].is_u64(), "{task}");
    let task_id = task["taskId"].as_str().unwrap().to_owned();

    let polls = client
        .poll_until_done(&task_id, Duration::from_secs(10))
        .await;
    let working = &polls[0];
    assert!(
        working["statusMessage"]
            .as_str()
            .unwrap()
            .starts_with("run-command running for "),
        "{working}"
    );
    let done = polls.last().unwrap();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["resultType"], "complete", "{done}");
    assert!(
        began.elapsed() >= Duration::from_secs(3),
        "completed when the command ended"
    );
    let result = &done["result"];
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(result["structuredContent"]["exitCode"], 0, "{result}");
    assert_eq!(result["structuredContent"]["stdout"], "ok\n", "{result}");

    // The same shape as the answer without a task.
    let mut plain = Client::new(&server, false, Duration::from_secs(10));
    let direct = plain
        .call("run-command", json!({"name": "m", "command": "sleep 1"}))
        .await;
    let direct = &direct["result"];
    assert_eq!(
        sorted_keys(&result["structuredContent"]),
        sorted_keys(&direct["structuredContent"])
    );
    assert_eq!(result["content"], direct["content"], "same text block");
}

#[tokio::test]
async fn a_short_command_answers_as_usual() {
    let (_fake, server, _rt) = setup().await;
    let mut client = Client::new(&server, true, Duration::from_secs(10));
    let answered = client
        .call("run-command", json!({"name": "m", "command": ["true"]}))
        .await;
    let result = &answered["result"];
    assert_ne!(result["resultType"], "task", "{answered}");
    assert!(result.get("taskId").is_none(), "{answered}");
    assert_eq!(result["structuredContent"]["exitCode"], 0, "{answered}");
}

#[tokio::test]
async fn without_the_extension_a_long_command_answers_when_it_ends() {
    let (_fake, server, _rt) = setup().await;
    let mut client = Client::new(&server, false, Duration::from_secs(10));
    let began = Instant::now();
    let answered = client
        .call("run-command", json!({"name": "m", "command": "sleep 2"}))
        .await;
    let result = &answered["result"];
    assert!(result.get("taskId").is_none(), "{answered}");
    assert_eq!(result["structuredContent"]["exitCode"], 0, "{answered}");
    assert!(began.elapsed() >= Duration::from_secs(2));
    // And its tasks/get is refused: it never declared the extension (rmcp's -32021).
    let refused = client.get("any").await;
    assert_eq!(refused["error"]["code"], -32021, "{refused}");
}

#[tokio::test]
async fn an_unknown_task_id_is_an_invalid_params_error() {
    let (_fake, server, _rt) = setup().await;
    let mut client = Client::new(&server, true, Duration::from_secs(10));
    let update = json!({"taskId": "no-such-task", "inputResponses": {}});
    for answered in [
        client.get("no-such-task").await,
        client.cancel("no-such-task").await,
        client
            .request("tasks/update", "no-such-task", update)
            .await
            .unwrap(),
    ] {
        crate::common::assert_invalid_params(&answered, "no-such-task");
    }
}

/// tasks/cancel ends the command in the guest by the call's own cancellation path (the marker
/// kill), and the task ends cancelled.
#[tokio::test]
async fn cancelling_a_task_kills_its_command() {
    let (fake, server, _rt) = setup().await;
    let mut client = Client::new(&server, true, Duration::from_secs(5));
    let created = client
        .call(
            "run-command",
            json!({"name": "m", "command": "sleep 60", "timeoutSecs": 120}),
        )
        .await;
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    assert!(
        fake.kill_script().is_none(),
        "nothing killed before the cancel"
    );
    // No task of this server asks for input: tasks/update is acknowledged and changes nothing.
    let update = json!({"taskId": task_id, "inputResponses": {"k": {"action": "accept"}}});
    let updated = client
        .request("tasks/update", &task_id, update)
        .await
        .unwrap();
    assert_eq!(updated["result"]["resultType"], "complete", "{updated}");
    assert_eq!(client.get(&task_id).await["result"]["status"], "working");
    let acked = client.cancel(&task_id).await;
    // An empty ack (SEP-2663): the status is for tasks/get to tell.
    assert_eq!(acked["result"]["resultType"], "complete", "{acked}");
    assert!(acked["result"].get("status").is_none(), "{acked}");
    until("the marker kill exec", Duration::from_secs(5), || {
        fake.kill_script().is_some()
    })
    .await;
    assert!(fake.kill_script().unwrap().contains("kill -9"));
    let polls = client
        .poll_until_done(&task_id, Duration::from_secs(5))
        .await;
    let done = polls.last().unwrap();
    assert_eq!(done["status"], "cancelled", "{done}");
    assert!(done.get("result").is_none(), "{done}");
}

/// A command with an idempotency key, cancelled through tasks/cancel, stops as one without a key
/// does (before, the task said cancelled while the keyed work ran on to its end), and its key
/// is freed: the same call made again runs again.
#[tokio::test]
async fn cancelling_a_keyed_task_kills_its_command_and_frees_the_key() {
    let (fake, server, _rt) = setup().await;
    let mut client = Client::new(&server, true, Duration::from_secs(5));
    let args = json!({"name": "m", "command": "sleep 60", "timeoutSecs": 120,
                      "idempotencyKey": "keyed-cancel-3c1f"});
    let created = client.call("run-command", args.clone()).await;
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    client.cancel(&task_id).await;
    until("the marker kill exec", Duration::from_secs(5), || {
        fake.kill_script().is_some()
    })
    .await;
    let polls = client
        .poll_until_done(&task_id, Duration::from_secs(5))
        .await;
    assert_eq!(polls.last().unwrap()["status"], "cancelled");
    let again = client.call("run-command", args).await;
    assert_eq!(again["result"]["resultType"], "task", "{again}");
    let second = again["result"]["taskId"].as_str().unwrap();
    assert_ne!(second, task_id, "a new run, not the first one's answer");
    client.cancel(second).await;
}

/// run-once's cancellation path deletes the machine it created.
#[tokio::test]
async fn cancelling_a_run_once_task_deletes_its_machine() {
    let (fake, server, _rt) = setup().await;
    let mut client = Client::new(&server, true, Duration::from_secs(5));
    let created = client
        .call(
            "run-once",
            json!({"image": "alpine", "command": "sleep 60", "timeoutSecs": 120}),
        )
        .await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    let once = |fake: &FakeServe| {
        fake.state
            .lock()
            .unwrap()
            .machines
            .keys()
            .any(|name| name.starts_with("mcp-once-"))
    };
    assert!(once(&fake), "run-once made its machine");
    client.cancel(&task_id).await;
    until("run-once's machine deleted", Duration::from_secs(5), || {
        !once(&fake)
    })
    .await;
    let polls = client
        .poll_until_done(&task_id, Duration::from_secs(5))
        .await;
    assert_eq!(polls.last().unwrap()["status"], "cancelled");
}

/// A tool error in a task is the result the call would have answered (isError), in a
/// completed task: a failed task is for errors of the protocol.
#[tokio::test]
async fn a_tool_error_in_a_task_is_a_completed_task_with_is_error() {
    let (fake, server, _rt) = setup().await;
    // A command whose output passed the engine's cap in an image machine's container: the
    // engine answers 200, exit 141 and about 11 MiB, which the tool refuses (as the real 1.32.2
    // guest answers 12 MiB on stdout); it answers after 3 s, so as a task.
    fake.state.lock().unwrap().exec_delay = Some(Duration::from_secs(3));
    fake.set_exec(|_| exec_response(141, &vec![b'x'; 11 * 1024 * 1024], b""));
    let mut client = Client::new(&server, true, Duration::from_secs(5));
    let created = client
        .call("run-command", json!({"name": "m", "command": "yes x"}))
        .await;
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    let polls = client
        .poll_until_done(&task_id, Duration::from_secs(10))
        .await;
    let done = polls.last().unwrap();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["isError"], true, "{done}");
    let text = done["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("SIGPIPE"), "{done}");

    // An unknown machine fails at once: answered as usual, not as a task.
    let at_once = client
        .call(
            "run-command",
            json!({"name": "no-such-machine", "command": "sleep 2"}),
        )
        .await;
    assert_eq!(at_once["result"]["isError"], true, "{at_once}");
    assert!(at_once["result"].get("taskId").is_none(), "{at_once}");
}

/// A task's status message says how long it has run and, when the request asked for
/// progress, the latest line of output.
#[tokio::test]
async fn a_task_status_message_shows_the_latest_output_line() {
    let (fake, server, _rt) = setup().await;
    fake.set_stream(|_| {
        let mut steps = Vec::new();
        for i in 1..=4 {
            steps.push(StreamStep::stdout(&format!("compiling part {i}\n")));
            steps.push(StreamStep::Pause(Duration::from_millis(400)));
        }
        steps.push(StreamStep::Pause(Duration::from_secs(2)));
        steps.push(StreamStep::exit(0));
        steps
    });
    let mut client = Client::new(&server, true, Duration::from_secs(5));
    let created = client
        .call_with_progress("run-command", json!({"name": "m", "command": "make"}))
        .await;
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    let polls = client
        .poll_until_done(&task_id, Duration::from_secs(10))
        .await;
    let messages: Vec<&str> = polls
        .iter()
        .filter(|p| p["status"] == "working")
        .filter_map(|p| p["statusMessage"].as_str())
        .collect();
    assert!(
        messages
            .iter()
            .any(|m| m.ends_with(": [stdout] compiling part 4")),
        "{messages:?}"
    );
    let done = polls.last().unwrap();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["structuredContent"]["stdout"],
        "compiling part 1\ncompiling part 2\ncompiling part 3\ncompiling part 4\n",
        "{done}"
    );
}

// ---- The official Python client (mcp 2.3.0), through its extension hook -------------------

/// A command of 4 s under a 1.5 s request timeout becomes a task the client polls to the
/// command's result; a short one is answered as usual.
fn check_python(report: &Value) {
    assert_eq!(report["protocol"], "2026-07-28", "{report}");
    let long = &report["calls"][0];
    let task = &long["task"];
    assert!(task.is_object(), "the long call became a task: {report}");
    assert_eq!(task["status"], "completed", "{report}");
    assert!(task["polls"].as_u64().unwrap() >= 2, "{report}");
    assert!(
        task["messages"][0]
            .as_str()
            .unwrap()
            .starts_with("run-command running for"),
        "{report}"
    );
    assert_eq!(long["isError"], false, "{report}");
    assert_eq!(long["structured"]["exitCode"], 0, "{report}");
    assert_eq!(long["structured"]["stdout"], "ok\n", "{report}");
    assert!(long["seconds"].as_f64().unwrap() >= 4.0, "{report}");
    let short = &report["calls"][1];
    assert!(short["task"].is_null(), "{report}");
    assert_eq!(short["structured"]["exitCode"], 0, "{report}");
}

fn python_calls() -> Value {
    json!([
        {"tool": "run-command", "args": {"name": "m", "command": "sleep 4", "timeoutSecs": 30}},
        {"tool": "run-command", "args": {"name": "m", "command": ["true"]}},
    ])
}

#[tokio::test]
async fn the_python_client_polls_a_task_past_its_request_timeout_over_http() {
    let (_fake, server, _rt) = setup().await;
    let plan = json!({"url": server.url, "token": TOKEN, "timeout": 1.5, "calls": python_calls()});
    check_python(&run_python("tasks.py", &plan).await);
}

#[tokio::test]
async fn the_python_client_polls_a_task_past_its_request_timeout_over_stdio() {
    let fake = FakeServe::start().await;
    fake.add_machine("m", "running");
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let env = server_env(
        rt.path(),
        &[
            ("SMOL_LOCAL_URL", &url),
            ("SMOL_MCP_TASK_AFTER_MILLIS", "300"),
        ],
    );
    let plan =
        json!({"server": SERVER, "env": env_object(env), "timeout": 1.5, "calls": python_calls()});
    check_python(&run_python("tasks.py", &plan).await);
}

// ---- Session clients (initialize) ----------------------------------------------------------

/// A raw session client over HTTP: initialize (declaring the tasks extension or not), then
/// requests carrying the session id.
struct SessionClient {
    http: reqwest::Client,
    url: String,
    session: String,
    next_id: u64,
}

impl SessionClient {
    async fn open(server: &HttpServer, tasks: bool) -> SessionClient {
        let http = reqwest::Client::new();
        let capabilities = if tasks {
            json!({"extensions": {TASKS: {}}})
        } else {
            json!({})
        };
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": capabilities,
            "clientInfo": {"name": "raw-session", "version": "0"}}});
        let response = http
            .post(&server.url)
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .json(&init)
            .send()
            .await
            .unwrap();
        let session = crate::common::session_id(&response);
        let initialized = answer(&response.text().await.unwrap(), 0);
        assert!(initialized["result"].is_object(), "{initialized}");
        let client = SessionClient {
            http,
            url: server.url.clone(),
            session,
            next_id: 1,
        };
        client
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        client
    }

    async fn post(&self, body: Value) -> String {
        crate::common::text_answer(
            self.http
                .post(&self.url)
                .bearer_auth(TOKEN)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-session-id", &self.session)
                .header("mcp-protocol-version", "2025-11-25")
                .json(&body),
        )
        .await
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        answer(&self.post(body).await, id)
    }
}

#[tokio::test]
async fn a_session_client_that_declares_the_extension_gets_a_task_too() {
    let (_fake, server, _rt) = setup().await;
    let mut client = SessionClient::open(&server, true).await;
    let call = json!({"name": "run-command", "arguments": {"name": "m", "command": "sleep 2"}});
    let created = client.request("tools/call", call.clone()).await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    let start = Instant::now();
    let done = loop {
        let got = client
            .request("tasks/get", json!({"taskId": task_id}))
            .await;
        if got["result"]["status"] != "working" {
            break got;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(done["result"]["result"]["structuredContent"]["exitCode"], 0);

    let mut plain = SessionClient::open(&server, false).await;
    let answered = plain.request("tools/call", call).await;
    assert!(answered["result"].get("taskId").is_none(), "{answered}");
    assert_eq!(answered["result"]["structuredContent"]["exitCode"], 0);
}

/// A task belongs to the session that started it: another session, and a sessionless
/// (2026-07-28) request, find no such task and cannot cancel it; its own session can.
#[tokio::test]
async fn a_task_is_read_and_cancelled_only_by_the_session_that_started_it() {
    let (_fake, server, _rt) = setup().await;
    let mut owner = SessionClient::open(&server, true).await;
    let created = owner
        .request(
            "tools/call",
            json!({"name": "run-command", "arguments": {"name": "m", "command": "sleep 4"}}),
        )
        .await;
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    let mut other = SessionClient::open(&server, true).await;
    for method in ["tasks/get", "tasks/cancel"] {
        let refused = other.request(method, json!({"taskId": task_id})).await;
        assert_eq!(refused["error"]["code"], -32602, "{method}: {refused}");
    }
    let mut stateless = Client::new(&server, true, Duration::from_secs(5));
    let refused = stateless.get(&task_id).await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let mine = owner.request("tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(
        mine["result"]["status"], "working",
        "not cancelled by the others: {mine}"
    );
    let cancelled = owner
        .request("tasks/cancel", json!({"taskId": task_id}))
        .await;
    assert!(cancelled.get("error").is_none(), "{cancelled}");
}

/// Once a call is a task its request is over: its progress token is spent, so the output
/// goes on in the status message and no longer as notifications/progress (seen over stdio,
/// where the connection outlives the request).
#[tokio::test]
async fn a_task_sends_no_progress_after_its_request_is_answered() {
    let fake = FakeServe::start().await;
    fake.add_machine("m", "running");
    fake.set_stream(|_| {
        let mut steps = Vec::new();
        for i in 1..=24 {
            steps.push(StreamStep::stdout(&format!("line {i}\n")));
            steps.push(StreamStep::Pause(Duration::from_millis(150)));
        }
        steps.push(StreamStep::exit(0));
        steps
    });
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let mut server = crate::common::stdio::StdioServer::spawn_uninitialized(server_env(
        rt.path(),
        &[
            ("SMOL_LOCAL_URL", &url),
            ("SMOL_MCP_TASK_AFTER_MILLIS", "500"),
        ],
    ))
    .await;
    let meta = json!({
        "progressToken": "tok",
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "raw-stdio", "version": "0"},
    });
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "run-command", "arguments": {"name": "m", "command": "make"}, "_meta": meta}});
    server.send_raw(format!("{call}\n").as_bytes()).await;
    let mut progress_before = 0;
    let created = loop {
        let message = server.next_message(Duration::from_secs(10)).await;
        if message["id"] == 1 {
            break message;
        }
        if message["method"] == "notifications/progress" {
            progress_before += 1;
        }
    };
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    assert!(
        progress_before > 0,
        "the output came as progress until then"
    );
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    // The command prints for 3 s more: nothing of the next 1.5 s comes as progress.
    let quiet_until = Instant::now() + Duration::from_millis(1500);
    while let Some(message) = server
        .maybe_message(quiet_until.saturating_duration_since(Instant::now()))
        .await
    {
        assert_ne!(
            message["method"], "notifications/progress",
            "progress after the task was answered: {message}"
        );
    }
    let get = json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/get",
        "params": {"taskId": task_id, "_meta": meta}});
    server.send_raw(format!("{get}\n").as_bytes()).await;
    let got = server.next_message(Duration::from_secs(5)).await;
    assert!(
        got["result"]["statusMessage"]
            .as_str()
            .is_some_and(|m| m.contains("[stdout] line ")),
        "{got}"
    );
}

/// The cloud fleet: a long command (through the service's output stream, the request asking
/// for progress) becomes a task like a local one, with its output in the status message.
#[tokio::test]
async fn a_long_cloud_command_becomes_a_task_too() {
    let cloud = crate::common::fake_cloud::FakeCloud::start_streaming().await;
    cloud.add_machine("w", "started");
    cloud.set_stream(|_| {
        let mut steps = Vec::new();
        for i in 1..=4 {
            steps.push(StreamStep::stdout(&format!("step {i}\n")));
            steps.push(StreamStep::Pause(Duration::from_millis(400)));
        }
        steps.push(StreamStep::exit(0));
        steps
    });
    let rt = tempfile::tempdir().unwrap();
    let server = HttpServer::on_fake_cloud(
        rt.path(),
        TOKEN,
        &cloud,
        &[("SMOL_MCP_TASK_AFTER_MILLIS", "300")],
    )
    .await;
    let mut client = Client::new(&server, true, Duration::from_secs(1));
    let created = client
        .call_with_progress("run-command", json!({"name": "w", "command": "make"}))
        .await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    let polls = client
        .poll_until_done(&task_id, Duration::from_secs(10))
        .await;
    assert!(
        polls
            .iter()
            .filter_map(|p| p["statusMessage"].as_str())
            .any(|m| m.contains(": [stdout] step ")),
        "{polls:?}"
    );
    let done = polls.last().unwrap();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["structuredContent"]["stdout"], "step 1\nstep 2\nstep 3\nstep 4\n",
        "{done}"
    );
}

/// The same for the server's log messages: a task's request got the events raised during its
/// call (its `_meta` log level), but once it is answered, an event another call raises (here
/// the local serve found by a first local call) is not sent again on the task's account.
#[tokio::test]
async fn a_task_forwards_no_log_messages_after_its_request_is_answered() {
    let fake = FakeServe::start().await;
    fake.add_machine("m", "running");
    let cloud = crate::common::fake_cloud::FakeCloud::start_streaming().await;
    cloud.add_machine("w", "started");
    cloud.set_stream(|_| {
        vec![
            StreamStep::stdout("working\n"),
            StreamStep::Pause(Duration::from_secs(4)),
            StreamStep::exit(0),
        ]
    });
    let rt = tempfile::tempdir().unwrap();
    let (local_url, cloud_url) = (fake.url(), cloud.url());
    let mut server = crate::common::stdio::StdioServer::spawn_uninitialized(server_env(
        rt.path(),
        &[
            ("SMOL_LOCAL_URL", &local_url),
            ("SMOL_CLOUD_URL", &cloud_url),
            ("SMOL_CLOUD_TOKEN", crate::common::fake_cloud::TOKEN),
            ("SMOL_MCP_TARGETS", "both"),
            ("SMOL_MCP_TASK_AFTER_MILLIS", "300"),
        ],
    ))
    .await;
    let meta = |log_level: Option<&str>| {
        let mut meta = json!({
            "progressToken": "tok",
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}},
            "io.modelcontextprotocol/clientInfo": {"name": "raw-stdio", "version": "0"},
        });
        if let Some(level) = log_level {
            meta["io.modelcontextprotocol/logLevel"] = json!(level);
        }
        meta
    };
    let on_cloud = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "run-command", "_meta": meta(Some("info")),
        "arguments": {"name": "w", "command": "make", "target": "cloud"}}});
    server.send_raw(format!("{on_cloud}\n").as_bytes()).await;
    let created = loop {
        let message = server.next_message(Duration::from_secs(10)).await;
        if message["id"] == 1 {
            break message;
        }
    };
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    // A first local call, asking for no log messages: it finds the local serve (an event).
    let on_local = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "run-command", "_meta": meta(None),
        "arguments": {"name": "m", "command": ["true"], "target": "local"}}});
    server.send_raw(format!("{on_local}\n").as_bytes()).await;
    let mut log_messages = Vec::new();
    let quiet_until = Instant::now() + Duration::from_secs(1);
    while let Some(message) = server
        .maybe_message(quiet_until.saturating_duration_since(Instant::now()))
        .await
    {
        if message["method"] == "notifications/message" {
            log_messages.push(message);
        }
    }
    assert!(log_messages.is_empty(), "{log_messages:?}");
}
