//! A stand-in for the smol cloud control plane on wiremock: one stateful responder that follows
//! the service as it really behaves (reference/cloud-api-facts.md), quirks included: machines are
//! created stopped, start may answer an empty 202, error bodies are plain text, the record
//! rewrites the image reference, exec answers 200 whatever the exit code and starts a stopped
//! machine, files live under a path suffix. It records every request for snapshot tests.
//!
//! Time is modelled too, each behaviour switched on per test (off by default, so the other tests
//! stay instant): an exec or file transfer on a stopped machine boots it inside the call
//! (`boot_delay`), a start or branch waits its turn in a per-source queue (`start_delay`,
//! `branch_delay`), and the auto-stop and TTL sweeps stop or delete machines created with those
//! timers (`auto_stop_after`, `ttl_after`). Sweeps and queued work are applied lazily, before every
//! request and every `with`, so a test watches them happen by waiting and looking.

use super::fake_stream::{
    StreamCounts, StreamHook, StreamStep, live_sse_response, sse_response, steps_from_answer,
    whole_body,
};
use super::guest_shell::{GuestCommand, GuestShell, KillOnDrop, stream_events};
use base64::Engine as _;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

pub const TOKEN: &str = "smk_test_token";

pub type CloudExecHook = Arc<dyn Fn(&Value) -> Value + Send + Sync>;

/// A server's settings with the fake cloud at `url` (with [`TOKEN`]) its one fleet, then
/// `extra`.
pub fn only_fleet<'a>(url: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("SMOL_CLOUD_URL", url),
        ("SMOL_CLOUD_TOKEN", TOKEN),
        ("SMOL_MCP_TARGETS", "cloud"),
    ];
    env.extend_from_slice(extra);
    env
}

/// The server's cloud deadlines cut short enough to watch a call outlast them against this fake
/// when it takes its time (a boot, a queue): 0.5 s for a start or a branch, boot allowance 3 s.
pub fn short_deadlines() -> smol_mcp::fleet::Deadlines {
    let ms = Duration::from_millis;
    smol_mcp::fleet::Deadlines {
        read: ms(2000),
        create: ms(2000),
        start: ms(500),
        stop: ms(2000),
        delete: ms(2000),
        branch: ms(500),
        files: ms(1000),
        exec_slack: ms(500),
        boot: ms(3000),
    }
}

/// Exec's text output is capped at 1 MiB; the base64 twin is byte-exact (facts 3.7).
pub const TEXT_CAP: usize = 1024 * 1024;

/// Work the service finishes later than it answers, or that a queue holds back.
enum Scheduled {
    /// A branch child comes out of its source's queue (facts 3.9).
    Appear(String, Value),
    /// A boot ends: the agent answers, so the record turns ready (facts 3.4, 4.3).
    Ready(String),
    /// A queued start is done: the record flips to `started` (facts 3.4).
    Started(String),
}

#[derive(Default)]
pub struct CloudState {
    pub requests: Vec<Value>,
    pub machines: BTreeMap<String, Value>,
    /// With [`FakeCloud::start_guest_root`]: each machine's disk (by id) as a host directory
    /// the files route and the guest shell share (see `fake_serve::guest_root_argv`).
    pub guest_root: Option<std::path::PathBuf>,
    pub files: BTreeMap<(String, String), Vec<u8>>,
    pub events: BTreeMap<String, Vec<Value>>,
    pub exec_hook: Option<CloudExecHook>,
    pub deleted: Vec<String>,
    next_id: u64,
    next_request: u64,
    /// Quirks of older or other control planes, switched on per test.
    pub files_route_missing: bool,
    pub branches_route_missing: bool,
    pub delete_ignores_include_usage: bool,
    /// The account's status (`active` when unset).
    pub account_status: Option<String>,
    /// The account's period cost (`periodCost.totalMicros`; 1810 when unset).
    pub period_total_micros: Option<i64>,
    /// Newer control planes answer every 4xx/5xx as RFC 9457 problem+json (facts 5, shape 3)
    /// instead of plain text.
    pub problem_json: bool,
    /// How long an exec or file transfer on a stopped machine spends booting it before the
    /// command runs (facts 3.7 "auto-start ... size the HTTP timeout for boot + command").
    pub boot_delay: Duration,
    /// How long each start waits in the machine's queue before the record flips to `started`
    /// and the call answers (facts 2 client timeouts: start 30 min; 3.4).
    pub start_delay: Duration,
    /// How long each branch takes in its source's queue; branches of one source wait for each
    /// other, and the child exists only once its turn is done (facts 3.9 "per-source branch queue").
    pub branch_delay: Duration,
    /// The auto-stop sweep: a machine created with `autoStopSeconds` is stopped once idle this
    /// long (activity: exec, file transfers; an exec in flight keeps it awake) (facts 3.3).
    pub auto_stop_after: Option<Duration>,
    /// The TTL sweep: a machine created with `ttlSeconds` is deleted this long after its create,
    /// whatever it is doing (facts 3.3).
    pub ttl_after: Option<Duration>,
    /// Scripts what `POST .../exec/stream` sends; without it, the exec answer (hook or
    /// default) is streamed one line an event (see `fake_stream`).
    pub stream_hook: Option<StreamHook>,
    /// The pause between every two frames, on the streaming front only
    /// ([`FakeCloud::start_streaming`]); wiremock sends the body whole.
    pub stream_gap: Option<Duration>,
    pub streams: Arc<StreamCounts>,
    /// Exec really runs the command on the host ([`FakeCloud::start_guest_shell`]); the exec
    /// and stream hooks do not apply then.
    pub guest_shell: Option<Arc<GuestShell>>,
    created_at: BTreeMap<String, Instant>,
    active_until: BTreeMap<String, Instant>,
    booted_at: BTreeMap<String, Instant>,
    queue_free_at: BTreeMap<String, Instant>,
    scheduled: Vec<(Instant, Scheduled)>,
}

#[derive(Clone)]
pub struct FakeCloud {
    pub server: Arc<MockServer>,
    pub state: Arc<Mutex<CloudState>>,
    /// The streaming front's address, when there is one (see [`FakeCloud::start_streaming`]).
    front: Option<String>,
    /// Kills the guest shell's processes when the last handle goes.
    _guest_shell: Option<Arc<KillOnDrop>>,
    /// The machines' disks in guest-root mode, removed with the last handle.
    _disks: Option<Arc<tempfile::TempDir>>,
}

struct Responder(Arc<Mutex<CloudState>>);

pub fn record(id: &str, name: &str, state: &str) -> Value {
    json!({
        "id": id, "name": name, "state": state,
        "source": {"type": "image", "reference": "alpine:3.20"},
        "resources": {"cpus": 2, "memoryMb": 2048, "diskGb": null},
        "network": {"mode": "allowCidrs", "cidrs": ["192.0.2.0/24"]},
        "env": {}, "ephemeral": false, "ports": [], "url": null,
        "ready": state == "started", "branchable": false,
        "createdAt": "2026-09-08T14:47:37Z", "updatedAt": "2026-09-08T14:47:37Z"
    })
}

impl FakeCloud {
    pub async fn start() -> FakeCloud {
        let server = MockServer::start().await;
        let state = Arc::new(Mutex::new(CloudState::default()));
        Mock::given(any())
            .respond_with(Responder(state.clone()))
            .mount(&server)
            .await;
        FakeCloud {
            server: Arc::new(server),
            state,
            front: None,
            _guest_shell: None,
            _disks: None,
        }
    }

    /// The fake behind a small axum front that serves `POST /v1/machines/{id}/exec/stream`
    /// itself, frame by frame over time as the service does (wiremock can only answer a body
    /// whole), and passes every other request on to the wiremock fake unchanged.
    pub async fn start_streaming() -> FakeCloud {
        let mut fake = FakeCloud::start().await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .fallback(front_handle)
            .with_state((fake.state.clone(), fake.server.uri()));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        fake.front = Some(front);
        fake
    }

    /// The fake with its guest shell, behind the streaming front (which runs each command as
    /// it comes, where wiremock could only answer whole): `POST /v1/machines/{id}/exec` (and
    /// `.../exec/stream`, and `stream: true` on `/exec`) really run the command as a host
    /// process, as the service runs it in the guest (see `guest_shell`): a string `command`
    /// through `sh -c`, an array as argv, with `cwd` (a host path here), `env`, `stdin` and
    /// `timeoutSeconds`; `background: true` detaches it and answers `pid=<n>` at once. Stopping
    /// or deleting the machine (by hand or by its sweeps) kills what it started, and so does
    /// dropping the last handle of the fake. Machines are keyed by id.
    pub async fn start_guest_shell() -> FakeCloud {
        let mut fake = FakeCloud::start_streaming().await;
        let shell = GuestShell::new();
        fake.state.lock().unwrap().guest_shell = Some(shell.clone());
        fake._guest_shell = Some(Arc::new(KillOnDrop(shell)));
        fake
    }

    /// The guest shell with a disk per machine (by id), as `FakeServe::start_guest_root`: the
    /// files route reads and writes `<root>/<id>/<path>`, a command's argv and `cwd` see
    /// `/workspace`, `/var/tmp` and `/etc/smol/` as that machine's, a branch copies its source's
    /// disk and a delete removes it.
    pub async fn start_guest_root() -> FakeCloud {
        let mut fake = FakeCloud::start_guest_shell().await;
        let disks = tempfile::tempdir().unwrap();
        fake.state.lock().unwrap().guest_root = Some(disks.path().to_path_buf());
        fake._disks = Some(Arc::new(disks));
        fake
    }

    /// A machine's disk (with [`FakeCloud::start_guest_root`]).
    pub fn disk(&self, id: &str) -> std::path::PathBuf {
        self.state
            .lock()
            .unwrap()
            .guest_root
            .clone()
            .unwrap()
            .join(id)
    }

    /// The pids (each leading its process group) of the commands the guest shell still runs
    /// on a machine (by id), foreground and background.
    pub fn guest_processes(&self, id: &str) -> Vec<u32> {
        let shell = self.state.lock().unwrap().guest_shell.clone();
        shell.map(|s| s.processes(id)).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        self.front.clone().unwrap_or_else(|| self.server.uri())
    }

    /// Scripts the frames of `POST .../exec/stream` from the request body.
    pub fn set_stream(&self, hook: impl Fn(&Value) -> Vec<StreamStep> + Send + Sync + 'static) {
        self.state.lock().unwrap().stream_hook = Some(Arc::new(hook));
    }

    /// The streams served so far (begun, closed early by the client, sent to the end).
    pub fn streams(&self) -> Arc<StreamCounts> {
        self.state.lock().unwrap().streams.clone()
    }

    pub fn take_requests(&self) -> Vec<Value> {
        std::mem::take(&mut self.state.lock().unwrap().requests)
    }

    /// Runs `f` on the state once the sweeps and queues have caught up with the clock.
    pub fn with<R>(&self, f: impl FnOnce(&mut CloudState) -> R) -> R {
        let mut st = self.state.lock().unwrap();
        st.tick();
        f(&mut st)
    }

    /// Adds a machine record and returns its id.
    pub fn add_machine(&self, name: &str, state: &str) -> String {
        self.with(|st| {
            let id = st.new_id();
            st.machines.insert(id.clone(), record(&id, name, state));
            st.created_at.insert(id.clone(), Instant::now());
            id
        })
    }
}

impl CloudState {
    fn new_id(&mut self) -> String {
        self.next_id += 1;
        format!("mach-{:032x}", 0xabc0_0000_u64 + self.next_id)
    }

    /// Applies what the clock says has happened since the last request: queued work done, boots
    /// finished, and the sweeps.
    fn tick(&mut self) {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.scheduled)
            .into_iter()
            .partition(|(at, _)| *at <= now);
        self.scheduled = later;
        for (_, work) in due {
            match work {
                Scheduled::Appear(id, rec) => {
                    self.created_at.insert(id.clone(), now);
                    self.machines.insert(id.clone(), rec);
                    self.event(&id, "machine branched");
                }
                Scheduled::Started(id) => {
                    if let Some(m) = self.machines.get_mut(&id) {
                        m["state"] = json!("started");
                        m["ready"] = json!(true);
                        self.active_until.insert(id.clone(), now);
                        self.event(&id, "machine started");
                    }
                }
                Scheduled::Ready(id) => {
                    if let Some(m) = self.machines.get_mut(&id)
                        && m["state"] == json!("started")
                    {
                        m["ready"] = json!(true);
                    }
                }
            }
        }
        // The TTL sweep deletes regardless of activity (facts 3.3 ttlSeconds).
        if let Some(ttl) = self.ttl_after {
            let expired: Vec<String> = self
                .machines
                .iter()
                .filter(|(id, m)| {
                    m["ttlSeconds"].is_number()
                        && self.created_at.get(*id).is_some_and(|t| *t + ttl <= now)
                })
                .map(|(id, _)| id.clone())
                .collect();
            for id in expired {
                self.machines.remove(&id);
                self.end_processes(&id);
                self.deleted.push(id);
            }
        }
        // The auto-stop sweep stops a running machine idle for its time (facts 3.3
        // autoStopSeconds; an in-flight exec counts as activity until it answers).
        if let Some(idle) = self.auto_stop_after {
            let idle_ones: Vec<String> = self
                .machines
                .iter()
                .filter(|(id, m)| {
                    m["autoStopSeconds"].is_number()
                        && m["state"] == json!("started")
                        && self
                            .active_until
                            .get(*id)
                            .or(self.created_at.get(*id))
                            .is_some_and(|t| *t + idle <= now)
                })
                .map(|(id, _)| id.clone())
                .collect();
            for id in idle_ones {
                if let Some(m) = self.machines.get_mut(&id) {
                    m["state"] = json!("stopped");
                    m["ready"] = json!(false);
                }
                self.end_processes(&id);
                self.event(&id, "auto-stopped after idle timeout");
            }
        }
    }

    /// Boots a stopped machine for an operation that auto-starts it (exec, files: facts 3.7,
    /// 3.8) and answers how long the operation waits for the boot; an operation arriving while
    /// an earlier one's boot is under way waits for the same boot.
    fn boot_for_operation(&mut self, id: &str) -> Duration {
        let now = Instant::now();
        let stopped = self
            .machines
            .get(id)
            .is_some_and(|m| m["state"] != json!("started"));
        if stopped {
            let at = now + self.boot_delay;
            if let Some(m) = self.machines.get_mut(id) {
                m["state"] = json!("started");
                m["ready"] = json!(self.boot_delay.is_zero());
            }
            self.booted_at.insert(id.to_owned(), at);
            self.scheduled.push((at, Scheduled::Ready(id.to_owned())));
            self.event(id, "auto-started for exec");
        }
        let wait = self
            .booted_at
            .get(id)
            .map_or(Duration::ZERO, |at| at.saturating_duration_since(now));
        // Activity lasts until the operation answers.
        self.active_until.insert(id.to_owned(), now + wait);
        wait
    }

    /// When a queued job of `source` that takes `delay` is done (facts 3.9: one queue per source).
    fn queue(&mut self, source: &str, delay: Duration) -> Instant {
        let now = Instant::now();
        let free = self
            .queue_free_at
            .get(source)
            .copied()
            .filter(|t| *t > now)
            .unwrap_or(now);
        let done = free + delay;
        self.queue_free_at.insert(source.to_owned(), done);
        done
    }

    /// An error answer in the shape this control plane uses: plain text on API 0.1.0,
    /// RFC 9457 problem+json on newer ones (facts 5).
    fn fail(&self, status: u16, message: &str) -> ResponseTemplate {
        if !self.problem_json {
            return text(status, message);
        }
        problem(status, message, problem_code(status))
    }

    /// A machine stopped or went away: what its guest shell ran ends with it.
    fn end_processes(&self, id: &str) {
        if let Some(shell) = &self.guest_shell {
            shell.kill_machine(id);
        }
    }

    fn event(&mut self, id: &str, message: &str) {
        let list = self.events.entry(id.to_owned()).or_default();
        let n = list.len() + 1;
        list.push(json!({
            "id": format!("ev-{n}"), "level": "info", "message": message,
            "createdAt": format!("2026-09-08T14:47:{:02}Z", 37 + n)
        }));
    }
}

fn text(status: u16, body: &str) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .insert_header("content-type", "text/plain; charset=utf-8")
        .set_body_string(body)
}

/// The machine-readable code a problem+json body carries for a status (facts 5 "codes seen").
fn problem_code(status: u16) -> &'static str {
    match status {
        401 => "unknown_key",
        402 => "payment_required",
        404 => "not_found",
        409 => "conflict",
        429 => "too_many_requests",
        400 | 422 => "invalid_request",
        _ => "internal",
    }
}

fn problem(status: u16, detail: &str, code: &str) -> ResponseTemplate {
    let title = reqwest::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    ResponseTemplate::new(status)
        .insert_header("content-type", "application/problem+json")
        .set_body_string(
            json!({"type": "about:blank", "title": title, "status": status,
                   "detail": detail, "code": code})
            .to_string(),
        )
}

/// The front of [`FakeCloud::start_streaming`].
async fn front_handle(
    axum::extract::State((state, upstream)): axum::extract::State<(Arc<Mutex<CloudState>>, String)>,
    request: axum::extract::Request,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let path = parts.uri.path().to_owned();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let guest_shell = state.lock().unwrap().guest_shell.clone();
    if let Some(shell) = guest_shell
        && let Some(response) = guest_exec(&state, &shell, &parts, &bytes).await
    {
        return response;
    }
    if let ("POST", ["v1", "machines", id, "exec", "stream"]) =
        (parts.method.as_str(), segments.as_slice())
    {
        let authorized = parts
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            == Some(&format!("Bearer {TOKEN}"));
        let mut st = state.lock().unwrap();
        st.tick();
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        st.requests.push(json!({
            "method": "POST", "path": path, "query": parts.uri.query(),
            "headers": {"authorization": header("authorization"), "content-type": header("content-type"), "accept": header("accept")},
            "body": serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null),
        }));
        if !authorized {
            return axum::http::StatusCode::UNAUTHORIZED.into_response();
        }
        if !st.machines.contains_key(*id) {
            return (axum::http::StatusCode::NOT_FOUND, "machine not found").into_response();
        }
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let steps = stream_steps(&mut st, id, &body);
        return sse_response(steps, st.stream_gap, st.streams.clone());
    }
    let url = format!(
        "{upstream}{}",
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    );
    let mut forward = reqwest::Client::new().request(parts.method.clone(), url);
    for (name, value) in &parts.headers {
        if name != axum::http::header::HOST {
            forward = forward.header(name, value);
        }
    }
    let answer = forward.body(bytes).send().await.unwrap();
    let mut response = axum::response::Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        response = response.header(name, value);
    }
    let body = answer.bytes().await.unwrap();
    response.body(axum::body::Body::from(body)).unwrap()
}

/// `POST /v1/machines/{id}/exec` and `.../exec/stream` in guest-shell mode: the command really
/// runs (see `guest_shell`). `None` for any other request.
async fn guest_exec(
    state: &Arc<Mutex<CloudState>>,
    shell: &Arc<GuestShell>,
    parts: &axum::http::request::Parts,
    bytes: &[u8],
) -> Option<axum::response::Response> {
    use axum::response::IntoResponse;
    let path = parts.uri.path();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let body: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
    let (id, streamed) = match (parts.method.as_str(), segments.as_slice()) {
        ("POST", ["v1", "machines", id, "exec"]) => (id.to_string(), body["stream"] == json!(true)),
        ("POST", ["v1", "machines", id, "exec", "stream"]) => (id.to_string(), true),
        _ => return None,
    };
    // A string is run through a shell, an array is the argv (facts 3.7 `command`); anything
    // else is left to the plain fake.
    let argv: Vec<String> = match &body["command"] {
        Value::String(script) => vec!["sh".into(), "-c".into(), script.clone()],
        Value::Array(argv) => argv
            .iter()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect(),
        _ => vec![],
    };
    if argv.is_empty() {
        return None;
    }
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let query = parts.uri.query().unwrap_or_default().to_owned();
    let boot = {
        let mut st = state.lock().unwrap();
        st.tick();
        st.requests.push(json!({
            "method": "POST", "path": path, "query": parts.uri.query(),
            "headers": {"authorization": header("authorization"), "content-type": header("content-type"), "accept": header("accept")},
            "body": body.clone(),
        }));
        st.next_request += 1;
        if header("authorization") != Some(format!("Bearer {TOKEN}")) {
            return Some(axum::http::StatusCode::UNAUTHORIZED.into_response());
        }
        if !st.machines.contains_key(&id) {
            return Some((axum::http::StatusCode::NOT_FOUND, "machine not found").into_response());
        }
        // Exec on a stopped machine boots it inside the call (facts 3.7 auto-start).
        st.boot_for_operation(&id)
    };
    tokio::time::sleep(boot).await;
    let disk = state
        .lock()
        .unwrap()
        .guest_root
        .clone()
        .map(|r| r.join(&id));
    let (argv, cwd) = match &disk {
        Some(disk) => (
            argv.iter()
                .map(|a| super::fake_serve::guest_root_argv(disk, a))
                .collect(),
            body["cwd"]
                .as_str()
                .map(|w| super::fake_serve::guest_root_argv(disk, w)),
        ),
        None => (argv, body["cwd"].as_str().map(str::to_owned)),
    };
    let command = GuestCommand {
        argv,
        env: body["env"]
            .as_object()
            .map(|vars| {
                vars.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default(),
        workdir: cwd,
        stdin: body["stdin"].as_str().map(|s| s.as_bytes().to_vec()),
        timeout: body["timeoutSeconds"].as_u64().map(Duration::from_secs),
    };
    if streamed {
        let streams = state.lock().unwrap().streams.clone();
        return Some(live_sse_response(
            stream_events(shell, &id, command),
            streams,
        ));
    }
    let started = Instant::now();
    let mut answer = if body["background"] == json!(true) {
        match shell.spawn_background(&id, &command) {
            Ok(pid) => background_answer(pid),
            Err(e) => {
                return Some(
                    (
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        format!("background exec failed: {e}"),
                    )
                        .into_response(),
                );
            }
        }
    } else {
        let outcome = shell.run(&id, command, None).await;
        exec_answer(outcome.exit_code, &outcome.stdout, &outcome.stderr)
    };
    answer["machineId"] = json!(id);
    answer["durationMs"] = json!(started.elapsed().as_millis() as u64);
    if query.contains("output=text")
        && let Some(obj) = answer.as_object_mut()
    {
        obj.remove("stdoutB64");
        obj.remove("stderrB64");
    }
    Some(axum::Json(answer).into_response())
}

/// What a streamed exec sends: the test's script, or the exec answer one line an event.
fn stream_steps(st: &mut CloudState, id: &str, body: &Value) -> Vec<StreamStep> {
    st.boot_for_operation(id);
    match (st.stream_hook.clone(), st.exec_hook.clone()) {
        (Some(stream), _) => stream(body),
        (None, Some(exec)) => steps_from_answer(&exec(body)),
        (None, None) => steps_from_answer(&default_exec(st, id, body)),
    }
}

fn json_answer(status: u16, body: Value) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(body)
}

fn envelope(request: &Request) -> Value {
    let header = |name: &str| {
        request
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let content_type = header("content-type");
    let body = if request.body.is_empty() {
        Value::Null
    } else if content_type.as_deref() == Some("application/json") {
        serde_json::from_slice(&request.body).unwrap_or(Value::Null)
    } else {
        json!({"octets": request.body.len(), "utf8": String::from_utf8_lossy(&request.body)})
    };
    json!({
        "method": request.method.as_str(),
        "path": request.url.path(),
        "query": request.url.query(),
        "headers": {
            "authorization": header("authorization"),
            "content-type": content_type,
            "accept": header("accept"),
        },
        "body": body,
    })
}

/// What exec answers by default: `echo` echoes; `sh -c 'exit N'` exits N; `base64 < 'p'` and
/// `... base64 -d > 'p'` read and write the fake's files, as the fallback file path does.
fn default_exec(st: &mut CloudState, id: &str, body: &Value) -> Value {
    // Detached at once, its pid on stdout (facts 3.7 `background` [SDK]).
    if body["background"] == json!(true) {
        return background_answer(FAKE_BACKGROUND_PID);
    }
    let argv: Vec<String> = match &body["command"] {
        Value::Array(a) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        Value::String(s) => vec!["sh".into(), "-c".into(), s.clone()],
        _ => vec![],
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let unquote = |s: &str| s.trim().trim_matches('\'').to_owned();
    let (code, stdout, stderr): (i32, Vec<u8>, Vec<u8>) = match argv
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["echo", rest @ ..] => (0, format!("{}\n", rest.join(" ")).into_bytes(), vec![]),
        ["sh", "-c", script] if script.starts_with("exit ") => {
            (script[5..].trim().parse().unwrap_or(1), vec![], vec![])
        }
        ["sh", "-c", script] if script.starts_with("base64 < ") => {
            let path = unquote(&script["base64 < ".len()..]);
            match st
                .files
                .get(&(id.to_owned(), path.trim_start_matches('/').to_owned()))
            {
                Some(bytes) => (0, b64.encode(bytes).into_bytes(), vec![]),
                None => (
                    1,
                    vec![],
                    format!("sh: can't open {path}: No such file or directory\n").into_bytes(),
                ),
            }
        }
        ["sh", "-c", script] if script.contains("base64 -d > ") => {
            let path = unquote(script.rsplit("base64 -d > ").next().unwrap_or_default());
            let data = b64
                .decode(body["stdin"].as_str().unwrap_or_default())
                .unwrap_or_default();
            st.files.insert(
                (id.to_owned(), path.trim_start_matches('/').to_owned()),
                data,
            );
            (0, vec![], vec![])
        }
        _ => (0, b"ok\n".to_vec(), vec![]),
    };
    exec_answer(code, &stdout, &stderr)
}

/// The pid the fake reports for a background command it does not really run.
pub const FAKE_BACKGROUND_PID: u32 = 4242;

/// What the service answers a `background: true` exec at once: exit 0, stdout `pid=<n>\n`
/// (facts 3.7 [SDK]; the same answer as the local engine's, smolvm src/api/handlers/exec.rs).
pub fn background_answer(pid: u32) -> Value {
    exec_answer(0, format!("pid={pid}\n").as_bytes(), b"")
}

/// An exec answer as the service gives it (facts 3.7): the text fields lossy UTF-8 cut at
/// 1 MiB with their `...Truncated` flags, the base64 twins whole.
pub fn exec_answer(code: i32, stdout: &[u8], stderr: &[u8]) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD;
    let capped =
        |bytes: &[u8]| String::from_utf8_lossy(&bytes[..bytes.len().min(TEXT_CAP)]).into_owned();
    json!({
        "stdout": capped(stdout), "stderr": capped(stderr),
        "exitCode": code, "durationMs": 12, "machineId": "",
        "stdoutTruncated": stdout.len() > TEXT_CAP, "stderrTruncated": stderr.len() > TEXT_CAP,
        "stdoutB64": b64.encode(stdout), "stderrB64": b64.encode(stderr)
    })
}

impl Respond for Responder {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let mut st = self.0.lock().unwrap();
        st.tick();
        st.requests.push(envelope(request));
        st.next_request += 1;
        let request_id = format!("req-{:04}", st.next_request);
        let answer = route(&mut st, request);
        answer.insert_header("x-request-id", request_id.as_str())
    }
}

fn route(st: &mut CloudState, request: &Request) -> ResponseTemplate {
    // Any path, existing or not, answers 401 with an empty body without a key (facts 2, 5
    // shape 1); a key it does not know gets the JSON `{code, error}` of API 0.1.0 (facts 5 shape
    // 2), or problem+json on a newer control plane (shape 3).
    let auth = request
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    match auth {
        None => return ResponseTemplate::new(401),
        Some(a) if a != format!("Bearer {TOKEN}") => {
            return if st.problem_json {
                problem(401, "unknown API key", "unknown_key")
            } else {
                json_answer(
                    401,
                    json!({"code": "unknown_key", "error": "unknown API key"}),
                )
            };
        }
        Some(_) => {}
    }
    let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    let path = request.url.path().to_owned();
    let query = request.url.query().unwrap_or_default().to_owned();
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(4, '/').collect();
    match (request.method.as_str(), parts.as_slice()) {
        ("GET", ["v1", "account"]) => json_answer(
            200,
            json!({
                "tenantId": "tenant-test", "status": st.account_status.clone().unwrap_or("active".into()), "effectiveMaxCpus": 16,
                "effectiveMaxMemoryMb": 65536, "effectiveMaxMachines": 20,
                "periodUsage": {"tenantId": "tenant-test", "from": "2026-11-01T00:00:00Z", "to": "2026-11-29T00:00:00Z",
                                "totalUptimeSeconds": 157, "cpuHours": 0.08, "memoryGbHours": 0.09, "machineCount": 90},
                "periodCost": {"cpuMicros": 10, "memoryMicros": 20, "execMicros": 0, "totalMicros": st.period_total_micros.unwrap_or(1810), "amountDueMicros": 0},
                "plan": {"name": "Standard", "rateBaseHourMicros": 40000}
            }),
        ),
        ("GET", ["v1", "machines"]) => {
            json_answer(200, Value::Array(st.machines.values().cloned().collect()))
        }
        ("POST", ["v1", "machines"]) => {
            let Some(source) = body.get("source") else {
                return st.fail(
                    422,
                    "Failed to deserialize the JSON body into the target type: missing field `source`",
                );
            };
            let name = body["name"].as_str().unwrap_or("generated-name").to_owned();
            if st.machines.values().any(|m| m["name"] == json!(name)) {
                return st.fail(409, &format!("machine name '{name}' already exists"));
            }
            if body["network"]["mode"] == json!("allowCidrs")
                && body["network"]["cidrs"]
                    .as_array()
                    .is_none_or(Vec::is_empty)
                && body["network"]["hosts"]
                    .as_array()
                    .is_none_or(Vec::is_empty)
            {
                return st.fail(
                    400,
                    "allowCidrs network mode requires at least one CIDR or host",
                );
            }
            let id = st.new_id();
            let mut rec = record(&id, &name, "stopped");
            let reference = source["reference"].as_str().unwrap_or_default();
            // The service resolves the reference itself and records what it resolved to.
            rec["source"] = json!({"type": "smolmachine", "reference": format!("registry.smolmachines.com/library/{reference}"), "arch": "amd64"});
            for (key, target) in [
                ("network", "network"),
                ("env", "env"),
                ("ttlSeconds", "ttlSeconds"),
                ("autoStopSeconds", "autoStopSeconds"),
                ("branchable", "branchable"),
                ("labels", "labels"),
            ] {
                if let Some(v) = body.get(key) {
                    rec[target] = v.clone();
                }
            }
            if let Some(r) = body.get("resources") {
                rec["resources"] = r.clone();
            }
            if let Some(ports) = body["ports"].as_array() {
                rec["ports"] = Value::Array(
                    ports
                        .iter()
                        .map(|p| json!({"port": p["port"], "hostPort": null}))
                        .collect(),
                );
            }
            st.machines.insert(id.clone(), rec.clone());
            st.created_at.insert(id.clone(), Instant::now());
            st.event(&id, "machine created");
            json_answer(201, rec)
        }
        (method, ["v1", "machines", id, rest @ ..]) => {
            let id = id.to_string();
            let rest = rest.first().copied().unwrap_or_default().to_owned();
            // Usage keeps answering for 30 days after a delete.
            let usage_of_deleted = method == "GET" && rest == "usage" && st.deleted.contains(&id);
            if !st.machines.contains_key(&id) && !usage_of_deleted {
                return st.fail(404, "machine not found");
            }
            machine_route(st, method, &id, &rest, &query, &body, request)
        }
        _ => st.fail(404, "not found"),
    }
}

fn machine_route(
    st: &mut CloudState,
    method: &str,
    id: &str,
    rest: &str,
    query: &str,
    body: &Value,
    request: &Request,
) -> ResponseTemplate {
    let rec = st.machines.get(id).cloned().unwrap_or(Value::Null);
    let set_state = |st: &mut CloudState, state: &str| {
        let m = st.machines.get_mut(id).unwrap();
        m["state"] = json!(state);
        m["ready"] = json!(state == "started");
    };
    match (method, rest) {
        ("GET", "") => json_answer(200, rec),
        ("DELETE", "") => {
            st.machines.remove(id);
            if let Some(root) = &st.guest_root {
                let _ = std::fs::remove_dir_all(root.join(id));
            }
            st.end_processes(id);
            st.deleted.push(id.to_owned());
            if query.contains("includeUsage=true") && !st.delete_ignores_include_usage {
                json_answer(
                    200,
                    json!({
                        "machineId": id, "from": "2026-11-01T00:00:00Z", "to": "2026-11-29T00:00:00Z",
                        "usage": {"totalUptimeSeconds": 157, "cpuHours": 0.08, "memoryGbHours": 0.09},
                        "cost": {"cpuMicros": 30, "memoryMicros": 36, "execMicros": 0, "baseMicros": 1744, "totalMicros": 1810}
                    }),
                )
            } else {
                ResponseTemplate::new(204)
            }
        }
        ("GET", "usage") => json_answer(
            200,
            json!({
                "machineId": id, "usage": {"totalUptimeSeconds": 160},
                "cost": {"cpuMicros": 30, "memoryMicros": 36, "execMicros": 0, "totalMicros": 1812}
            }),
        ),
        ("POST", "start") => {
            // A start waits its turn and answers when the record flips to `started`
            // (facts 3.4); the detached form: accepted, empty body.
            if st.start_delay.is_zero() {
                set_state(st, "started");
                st.event(id, "machine started");
            } else {
                let done = st.queue(id, st.start_delay);
                st.scheduled.push((done, Scheduled::Started(id.to_owned())));
                return ResponseTemplate::new(202)
                    .set_delay(done.saturating_duration_since(Instant::now()));
            }
            ResponseTemplate::new(202)
        }
        // The whole set of guest ports (SDK only, facts 3.13): the service allocates each
        // outside port, and the record's url is the ingress of the first one. The real url
        // appears only once something accepts there; the fake has no guest sockets, so it
        // names one as soon as the machine runs.
        ("PUT", "ports") => {
            let Some(asked) = body["ports"].as_array() else {
                return st.fail(422, "ports: missing field `ports`");
            };
            if asked.len() > 16 {
                return st.fail(422, "ports: at most 16 published ports");
            }
            let mut set = Vec::new();
            for p in asked {
                let Some(port) = p["port"].as_u64().filter(|p| (1..=65_535).contains(p)) else {
                    return st.fail(422, "ports[].port: expected a port from 1 to 65535");
                };
                set.push(json!({"port": port, "hostPort": 30_000 + port % 30_000}));
            }
            let m = st.machines.get_mut(id).unwrap();
            let running = m["state"] == json!("started") || m["state"] == json!("running");
            m["url"] = match (running, set.is_empty()) {
                (true, false) => json!(format!(
                    "https://{}-7f3a.apps.smol.test",
                    m["name"].as_str().unwrap_or(id)
                )),
                _ => Value::Null,
            };
            m["ports"] = Value::Array(set);
            json_answer(200, m.clone())
        }
        ("POST", "stop") => {
            st.booted_at.remove(id);
            st.end_processes(id);
            set_state(st, "stopped");
            st.event(id, "machine stopped");
            json_answer(200, st.machines[id].clone())
        }
        ("POST", "exec") => {
            // Exec on a stopped machine boots it inside the call and leaves it running
            // (facts 3.7 auto-start); the command runs once the boot is done.
            let boot = st.boot_for_operation(id);
            let mut answer = match st.exec_hook.clone() {
                Some(hook) => hook(body),
                None => default_exec(st, id, body),
            };
            answer["machineId"] = json!(id);
            if query.contains("output=text") {
                let obj = answer.as_object_mut().unwrap();
                obj.remove("stdoutB64");
                obj.remove("stderrB64");
            }
            json_answer(200, answer).set_delay(boot)
        }
        // Wiremock answers the stream whole; `FakeCloud::start_streaming` sends it over time.
        ("POST", "exec/stream") => {
            let steps = stream_steps(st, id, body);
            ResponseTemplate::new(200)
                .insert_header("content-type", "text/event-stream")
                .set_body_raw(whole_body(&steps), "text/event-stream")
        }
        ("GET", "events") => json_answer(
            200,
            Value::Array(st.events.get(id).cloned().unwrap_or_default()),
        ),
        ("POST", "branches") if st.branches_route_missing => st.fail(404, "not found"),
        ("POST", "branches") | ("POST", "fork") => {
            if rec["branchable"] != json!(true) || rec["state"] != json!("started") {
                let name = rec["name"].as_str().unwrap_or(id);
                return st.fail(
                    409,
                    &format!(
                        "machine '{name}' is not branchable, recreate it with `branchable: true`, start it, and branch the new machine"
                    ),
                );
            }
            let child_id = st.new_id();
            let child_name = body["name"].as_str().unwrap_or("child");
            // `freezeSource` keeps the source as a reusable base that can no longer exec
            // (cloud facts 3.9; the SDK's field, not the published spec's): its record says so
            // in `branchState` (facts 4.1). Its further branches are taken.
            if body["freezeSource"] == json!(true)
                && let Some(source) = st.machines.get_mut(id)
            {
                source["branchState"] = json!("frozen");
            }
            if let Some(root) = &st.guest_root {
                super::fake_serve::copy_disk(root, id, &child_id);
            }
            let mut child = record(&child_id, child_name, "started");
            child["branchable"] = body.get("branchable").cloned().unwrap_or(json!(false));
            if st.branch_delay.is_zero() {
                st.created_at.insert(child_id.clone(), Instant::now());
                st.machines.insert(child_id, child.clone());
                return json_answer(201, child);
            }
            // The child exists once its turn in the source's queue is done (facts 3.9); the
            // answer comes then, so a client that gives up earlier sees no child yet.
            let done = st.queue(id, st.branch_delay);
            st.scheduled
                .push((done, Scheduled::Appear(child_id, child.clone())));
            json_answer(201, child).set_delay(done.saturating_duration_since(Instant::now()))
        }
        (method, files) if files.starts_with("files/") => {
            if st.files_route_missing {
                return ResponseTemplate::new(404);
            }
            let suffix = percent_encoding::percent_decode_str(&files["files/".len()..])
                .decode_utf8_lossy()
                .into_owned();
            // A transfer on a stopped machine starts it (facts 3.8) and counts as activity.
            let boot = st.boot_for_operation(id);
            let disk = st.guest_root.as_ref().map(|r| r.join(id).join(&suffix));
            let answer = match (method, disk) {
                ("PUT", Some(at)) => {
                    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
                    std::fs::write(&at, &request.body).unwrap();
                    ResponseTemplate::new(204)
                }
                ("GET", Some(at)) => match std::fs::read(&at) {
                    Ok(bytes) => ResponseTemplate::new(200)
                        .insert_header("content-type", "application/octet-stream")
                        .set_body_bytes(bytes),
                    Err(_) => st.fail(404, &format!("file not found: {suffix}")),
                },
                ("PUT", None) => {
                    st.files
                        .insert((id.to_owned(), suffix), request.body.clone());
                    ResponseTemplate::new(204)
                }
                ("GET", None) => match st.files.get(&(id.to_owned(), suffix.clone())) {
                    Some(bytes) => ResponseTemplate::new(200)
                        .insert_header("content-type", "application/octet-stream")
                        .set_body_bytes(bytes.clone()),
                    None => st.fail(404, &format!("file not found: {suffix}")),
                },
                _ => st.fail(405, "method not allowed"),
            };
            answer.set_delay(boot)
        }
        _ => st.fail(404, "not found"),
    }
}
