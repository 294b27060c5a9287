//! An in-process stand-in for `smolvm serve` on a Unix socket: it follows the 1.32.2 spec's
//! shapes (every response carries the schema's required fields), keeps a little state so flows
//! make sense, and records every request for snapshot tests.

use super::fake_stream::{
    StreamCounts, StreamHook, StreamStep, live_sse_response, sse_response, steps_from_answer,
};
use super::guest_shell::{GuestCommand, GuestShell, KillOnDrop, stream_events};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub type ExecHook = Arc<dyn Fn(&Value) -> Value + Send + Sync>;

#[derive(Default)]
pub struct FakeState {
    pub requests: Vec<Value>,
    /// What happened on the interactive exec's sockets, in order: `open <machine> <argv...>
    /// <cols>x<rows>`, `resize <cols>x<rows>`, `exit <code>`, `closed <machine>` (the client
    /// went away, which ends the program as the engine's close does).
    pub terminal_log: Vec<String>,
    /// Every pause and resume the engine did, in order: `pause <machine>`, `resume <machine>`.
    pub pauses: Vec<String>,
    /// Saves that outlast the engine's request deadline, as on the nested engine (TCG), by
    /// machine: such a machine's pause is answered 408 at the deadline, and each later GET of
    /// it reads the next of its states here (the last one stays). The engine reads `running`, then
    /// `unreachable` while the save has stopped the guest's agent ("marked machine Unreachable:
    /// PID alive but agent not responding", `strings smol-vmm`; seen in CI), then `pausing`,
    /// then `paused`.
    pub pause_save: BTreeMap<String, Vec<String>>,
    /// The states still to come of each machine whose save is going on (see `pause_save`).
    pub saving: BTreeMap<String, std::collections::VecDeque<String>>,
    pub machines: BTreeMap<String, Value>,
    /// With [`FakeServe::start_guest_root`]: each machine's disk as a host directory
    /// (`<root>/<machine>`), which the files routes and the guest shell both use, so that a
    /// file written is what a command reads (see [`guest_root_argv`]).
    pub guest_root: Option<std::path::PathBuf>,
    pub files: BTreeMap<(String, String), Vec<u8>>,
    /// Files generated as they are sent (`a` to `z` repeated), of this many bytes: large
    /// files the fake never holds. Like the engine, the answer declares its length.
    pub generated_files: BTreeMap<(String, String), u64>,
    /// Each machine's workload log (`source=workload`, what machine-logs reads by default).
    pub logs: BTreeMap<String, Vec<String>>,
    /// Each machine's engine log (`source=console`, the engine's default: the kernel and the
    /// guest agent's JSON records, one "running command" a command).
    pub engine_logs: BTreeMap<String, Vec<String>>,
    /// Each machine's egress refusals, oldest first, as `GET .../egress-events` answers them.
    pub egress_events: BTreeMap<String, Vec<Value>>,
    /// Refusals (operation, dest) recorded, stamped now, each time a command other than a
    /// readiness probe runs on the machine (`*`: any machine): what the engine logs when the
    /// command tries them.
    pub denials_on_exec: BTreeMap<String, Vec<(String, String)>>,
    /// The egress-events route answers 500.
    pub egress_events_fail: bool,
    /// How far the engine's clock is behind ours: its refusals' stamps and its `Date` header
    /// (a serve elsewhere, or the nested engine's QEMU guest, runs on its own clock).
    pub engine_clock_behind: std::time::Duration,
    pub exec_hook: Option<ExecHook>,
    /// Every start fails with this message, as the engine's 500: what a host that cannot boot
    /// guests answers (`vm failed: no boot progress after 30s`, seen on a paravirtual KVM).
    pub start_failure: Option<String>,
    /// Every create fails with this message, as the engine's 500 (a full disk, say).
    pub create_failure: Option<String>,
    /// How long an exec that is not a readiness probe (`echo`) takes to answer.
    pub exec_delay: Option<std::time::Duration>,
    /// How long an image pull takes: the engine answers `POST .../images/pull` only once the
    /// guest agent's pull has returned (smolvm src/api/handlers/images.rs `pull_image`).
    pub pull_delay: Option<std::time::Duration>,
    /// How long a file read or write takes to answer.
    pub file_delay: Option<std::time::Duration>,
    /// How long `POST /api/v1/machines` (a create) takes to answer.
    pub create_delay: Option<std::time::Duration>,
    /// The engine's request deadline on the machine routes its `TimeoutLayer` wraps
    /// (`API_REQUEST_TIMEOUT_SECS` = 300, answering 408 with an empty body; see [`bounded`]);
    /// `None` is the engine's 300 s, a test sets a second or so.
    pub request_deadline: Option<std::time::Duration>,
    /// How a command that runs past its `timeoutSecs` is reported (see [`TimeoutForm`]).
    pub timeout_form: TimeoutForm,
    /// Directories (machine, path) and their entries, answered as the engine lists one.
    pub directories: BTreeMap<(String, String), Vec<Value>>,
    /// Answer a missing file 404 (1.32.2's spec) instead of the source's 500.
    pub missing_file_404: bool,
    /// Scripts what `POST .../exec/stream` sends; without it, the exec answer (hook or
    /// default) is streamed one line an event (see `fake_stream`).
    pub stream_hook: Option<StreamHook>,
    /// The pause between every two frames of a streamed command.
    pub stream_gap: Option<std::time::Duration>,
    pub streams: Arc<StreamCounts>,
    /// Exec really runs the command on the host ([`FakeServe::start_guest_shell`]); the exec
    /// hook, `exec_delay` and the scripted `sleep` do not apply then.
    pub guest_shell: Option<Arc<GuestShell>>,
    /// Each machine's credential bindings as created: (binding, variable, placeholder). The
    /// placeholder is in the environment of every command, as 1.32.2 puts it there
    /// (`SMOL_PLACEHOLDER_<NAME>_<32 hex>`); the record never shows it.
    pub credentials: BTreeMap<String, Vec<(String, String, String)>>,
    /// Values supplied with `PUT .../credential-values`, held until the machine's next boot.
    pub credential_values: BTreeMap<String, BTreeMap<String, String>>,
    /// The values each machine's latest boot was given.
    pub booted_values: BTreeMap<String, BTreeMap<String, String>>,
    /// smolvm 1.32.2's fork pools by name (`/api/v1/pools`; see [`FakePool`]).
    pub pools: BTreeMap<String, FakePool>,
    /// Every pool's leases by id, ended ones too, until their pool is deleted.
    pub leases: BTreeMap<String, FakeLease>,
    /// The `env` (`K=V`) a lease gave its worker, by machine: later execs on it see these
    /// variables (1.32.2 merges them into the machine's env), before the request's own.
    pub lease_env: BTreeMap<String, Vec<String>>,
    /// How long a pool worker takes to become ready after the pool's creation (a refill after
    /// an acquire, a resize up, a replacement); `None`: at once. The create's own fill is
    /// always at once. Made lazily: each request makes the workers that are due.
    pub pool_fill_delay: Option<std::time::Duration>,
    /// Machines that ran `smolvm-branch-ready` (the 1.32.2 agent's helper, which parks the
    /// machine at a branchpoint): a pool over a frozen source leases only if its source ran it
    /// before it was frozen (seen on the nested engine: a lease is otherwise 500 "... is not
    /// parked at a forkpoint").
    pub at_branchpoint: std::collections::BTreeSet<String>,
    /// Sources a branch froze (`freezeSource`) that had not run it: their pools never lease.
    pub frozen_off_branchpoint: std::collections::BTreeSet<String>,
}

/// A fork pool as 1.32.2's controller keeps it: `ready == desiredReady` held workers, whatever
/// the leases; a worker is a fork of the source (`pool-<pool>-<8 hex>`), made only while the
/// source is running (or frozen) and was started forkable, else the pool just shows fewer ready
/// workers (`provisioning`) with no error (the pools findings, a, b, d, h1, h7).
#[derive(Debug, Clone)]
pub struct FakePool {
    /// ForkPoolInfo's settled fields (name, source, golden, desiredReady, freezeSource,
    /// leaseTtlSecs, autoAdmission, shareWeights, createdAt, maxActive if set); the counts are
    /// worked out on each answer ([`pool_info`]).
    pub info: Value,
    /// The held workers, oldest first: the next acquire takes the first.
    pub ready: Vec<String>,
    /// Workers being made, each by when it is ready.
    pub pending: Vec<std::time::Instant>,
    /// Acquires by idempotencyKey: what the body asked (env, files, TTL) and the lease id.
    /// Never freed while the pool exists.
    pub keys: BTreeMap<String, (Value, String)>,
}

/// A lease: its ForkLeaseInfo and its TTL (what a heartbeat extends by).
#[derive(Debug, Clone)]
pub struct FakeLease {
    pub info: Value,
    pub ttl_secs: u64,
}

/// The three ways the engine reports a command ended at its timeout, all exit 124 (the guest
/// agent of smolvm 1.32.2, `strings usr/local/bin/smolvm-agent` in `agent-rootfs.tar.zst`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TimeoutForm {
    /// The normal path: "command timed out after Nms" on stderr.
    #[default]
    Command,
    /// The fresh-container path: "container timed out after Ns".
    Container,
    /// Exec directly in the VM: exit 124 and no text.
    Bare,
}

/// The engine's request deadline when a test sets none.
pub const ENGINE_REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);
/// The guest agent's cap on each exec stream (11 MiB, observed on the 1.32.2 engine), and its
/// answer past it on the VM path: a 500 whose message is pieced from the
/// 1.32.2 agent's strings ("command output exceeded " / " bytes and was truncated. Use
/// streaming exec (exec_stream / execStream) for large output.").
pub const ENGINE_OUTPUT_CAP: usize = 11 * 1024 * 1024;
/// `MAX_FILE_UPLOAD_BYTES` (smolvm src/api/handlers/files.rs).
pub const ENGINE_UPLOAD_LIMIT: u64 = 100 * 1024 * 1024;

#[derive(Clone)]
pub struct FakeServe {
    pub state: Arc<Mutex<FakeState>>,
    pub socket: PathBuf,
    _dir: Arc<tempfile::TempDir>,
    /// Kills the guest shell's processes when the last handle goes.
    _guest_shell: Option<Arc<KillOnDrop>>,
}

/// A MachineInfo with every field the spec requires.
pub fn machine_info(name: &str, state: &str) -> Value {
    json!({
        "name": name, "state": state, "cpus": 2, "memoryMb": 2048, "mounts": [], "ports": [],
        "network": false, "gpu": false, "cuda": false, "blockIo": "sync", "diskDurability": "full",
        "branchable": false, "forkable": false, "branchpointHeld": false, "forkpointHeld": false,
        "createdAt": 1_788_878_857, "image": "alpine", "storageGb": 20, "overlayGb": 10,
        "cpuMillis": 0, "rssMb": 0, "diskUsedMb": 0
    })
}

fn api_error(status: StatusCode, code: &str, message: String) -> Response {
    (status, axum::Json(json!({"error": message, "code": code}))).into_response()
}

/// axum's own rejections (a body that is not the request type, 422; a body over the limit, 413)
/// are plain text, not the engine's `{error, code}` (observed on the real serve:
/// `tests/engine/fake_fidelity.rs`).
fn plain_text(status: StatusCode, message: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message,
    )
        .into_response()
}

/// The 422 the engine answers, before it looks for the machine, for a body with a field its
/// request type does not have (serde's `deny_unknown_fields` through axum's `Json`: plain text,
/// observed on the real serve, `tests/engine/fake_fidelity.rs`). The fields are the schema's in the
/// vendored 1.32.2 spec; the real message adds serde's position, left out here.
fn unknown_field(schema: &str, body: &Value) -> Option<Response> {
    // Parsed once per test process: every exec asks.
    static SPEC: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    let spec = SPEC.get_or_init(|| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("specs")
            .join("smolvm-1.32.2.openapi.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    });
    let fields: Vec<&String> = spec["components"]["schemas"][schema]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    let unknown = body.as_object()?.keys().find(|k| !fields.contains(k))?;
    let expected: Vec<String> = fields.iter().map(|f| format!("`{f}`")).collect();
    Some(plain_text(
        StatusCode::UNPROCESSABLE_ENTITY,
        format!(
            "Failed to deserialize the JSON body into the target type: {unknown}: unknown field `{unknown}`, expected one of {}",
            expected.join(", ")
        ),
    ))
}

/// The bindings of a create body: `credentials.credentials[]` with snake_case fields (a
/// camelCase key refused 422 as the engine refuses it), each given a placeholder.
fn create_credentials(body: &Value) -> Result<Vec<(String, String, String)>, Box<Response>> {
    let Some(list) = body["credentials"]
        .get("credentials")
        .and_then(Value::as_array)
    else {
        return Ok(Vec::new());
    };
    let fields = [
        "name",
        "environment_variable",
        "allowed_hosts",
        "injection_location",
        "methods",
        "set_header",
    ];
    let mut bindings = Vec::new();
    for (i, binding) in list.iter().enumerate() {
        if let Some(unknown) = binding
            .as_object()
            .and_then(|o| o.keys().find(|k| !fields.contains(&k.as_str())))
        {
            return Err(Box::new(plain_text(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "Failed to deserialize the JSON body into the target type: credentials.credentials[{i}].{unknown}: unknown field `{unknown}`"
                ),
            )));
        }
        let name = binding["name"].as_str().unwrap_or_default().to_owned();
        let var = binding["environment_variable"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let tag: String = name
            .to_uppercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let placeholder = format!("SMOL_PLACEHOLDER_{tag}_{:032X}", rand::random::<u128>());
        bindings.push((name, var, placeholder));
    }
    Ok(bindings)
}

/// The engine's machine-name rule and its words for each refusal (observed on the real serve
/// for each case, `tests/engine/fake_fidelity.rs` and `tests/engine/real_serve.rs`).
fn name_refusal(name: &str) -> Option<String> {
    let first = name.chars().next()?;
    if name.chars().count() > 128 {
        return Some(format!(
            "machine name too long: {} characters (max 128)",
            name.chars().count()
        ));
    }
    if !first.is_ascii_alphanumeric() {
        return Some(format!(
            "machine name must start with a letter or digit (got: {name:?})"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Some(format!("machine name contains invalid character: '{c}'"));
    }
    if name.ends_with('-') {
        return Some(format!(
            "machine name cannot end with a hyphen (got: {name:?})"
        ));
    }
    if name.contains("--") {
        return Some("machine name cannot contain consecutive hyphens".to_owned());
    }
    None
}

fn envelope(method: &Method, uri: &axum::http::Uri, headers: &HeaderMap, body: &[u8]) -> Value {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let content_type = header("content-type");
    let body = if body.is_empty() {
        Value::Null
    } else if content_type.as_deref() == Some("application/json") {
        serde_json::from_slice(body)
            .unwrap_or_else(|_| json!({"invalidJson": String::from_utf8_lossy(body)}))
    } else {
        json!({"octets": body.len(), "utf8": String::from_utf8_lossy(body)})
    };
    json!({
        "method": method.as_str(),
        "path": uri.path(),
        "query": uri.query(),
        "headers": {
            "content-type": content_type,
            "accept": header("accept"),
            "api-version": header("api-version"),
        },
        "body": body,
    })
}

impl FakeServe {
    pub async fn start() -> FakeServe {
        let dir = tempfile::Builder::new()
            .prefix("fake-serve-")
            .tempdir()
            .unwrap();
        let socket = dir.path().join("api.sock");
        let state = Arc::new(Mutex::new(FakeState::default()));
        let app = Router::new().fallback(handle).with_state(state.clone());
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeServe {
            state,
            socket,
            _dir: Arc::new(dir),
            _guest_shell: None,
        }
    }

    /// The fake with its guest shell: `POST .../exec` and `.../exec/stream` really run the
    /// argv as a host process, as the engine runs it in the guest (see `guest_shell`), with
    /// the request's `env`, `workdir` (a host path here), `stdin` and `timeoutSecs`;
    /// `background: true` detaches it and answers `pid=<n>` at once. Stopping or deleting the
    /// machine kills what it started, and so does dropping the last handle of the fake.
    pub async fn start_guest_shell() -> FakeServe {
        let mut fake = FakeServe::start().await;
        let shell = GuestShell::new();
        fake.state.lock().unwrap().guest_shell = Some(shell.clone());
        fake._guest_shell = Some(Arc::new(KillOnDrop(shell)));
        fake
    }

    /// The fake with its guest shell and a disk per machine: the files routes read and write
    /// `<root>/<machine>/<path>`, and a command's argv and workdir see the guest paths
    /// `/workspace` and `/var/tmp` as that machine's (the rewrite of [`guest_root_argv`]), so
    /// that files sent in are what the machine's commands work on and what comes back. A
    /// branch copies its source's disk; a delete removes it.
    pub async fn start_guest_root() -> FakeServe {
        let fake = FakeServe::start_guest_shell().await;
        let root = fake._dir.path().join("disks");
        std::fs::create_dir_all(&root).unwrap();
        fake.state.lock().unwrap().guest_root = Some(root);
        fake
    }

    /// A machine's disk (with [`FakeServe::start_guest_root`]).
    pub fn disk(&self, name: &str) -> std::path::PathBuf {
        self.state
            .lock()
            .unwrap()
            .guest_root
            .clone()
            .unwrap()
            .join(name)
    }

    /// The pids (each leading its process group) of the commands the guest shell still runs
    /// on a machine, foreground and background.
    pub fn guest_processes(&self, name: &str) -> Vec<u32> {
        let shell = self.state.lock().unwrap().guest_shell.clone();
        shell.map(|s| s.processes(name)).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn endpoint(&self) -> smol_mcp::fleet::transport::LocalEndpoint {
        smol_mcp::fleet::transport::LocalEndpoint::Unix(self.socket.clone())
    }

    /// The requests recorded so far, emptying the record.
    pub fn take_requests(&self) -> Vec<Value> {
        std::mem::take(&mut self.state.lock().unwrap().requests)
    }

    /// The names of the machines the fake holds now.
    pub fn machine_names(&self) -> Vec<String> {
        self.state
            .lock()
            .unwrap()
            .machines
            .keys()
            .cloned()
            .collect()
    }

    /// The paths of the DELETE requests it has recorded (and not yet taken), in order.
    pub fn deleted_paths(&self) -> Vec<String> {
        self.state
            .lock()
            .unwrap()
            .requests
            .iter()
            .filter(|r| r["method"] == "DELETE")
            .map(|r| r["path"].as_str().unwrap().to_owned())
            .collect()
    }

    /// The script of the exec that kills a run (run-command's marker kill), once one was sent.
    pub fn kill_script(&self) -> Option<String> {
        self.state
            .lock()
            .unwrap()
            .requests
            .iter()
            .filter(|r| r["path"].as_str().unwrap().ends_with("/exec"))
            .filter_map(|r| r["body"]["command"][2].as_str().map(str::to_owned))
            .find(|script| script.contains("SMOL_MCP_RUN="))
    }

    /// The state of the machine of this name, if the fake holds one.
    pub fn machine_state(&self, name: &str) -> Option<String> {
        self.state
            .lock()
            .unwrap()
            .machines
            .get(name)
            .map(|m| m["state"].as_str().unwrap_or_default().to_owned())
    }

    /// Whether the fake holds no machine at all now.
    pub fn has_no_machines(&self) -> bool {
        self.state.lock().unwrap().machines.is_empty()
    }

    /// Whether the fake holds a machine of this name now.
    pub fn has_machine(&self, name: &str) -> bool {
        self.state.lock().unwrap().machines.contains_key(name)
    }

    /// How many requests of `method` it has recorded (and not yet taken).
    pub fn requests_of(&self, method: &str) -> usize {
        let state = self.state.lock().unwrap();
        state
            .requests
            .iter()
            .filter(|r| r["method"] == method)
            .count()
    }

    pub fn add_machine(&self, name: &str, state: &str) {
        self.state
            .lock()
            .unwrap()
            .machines
            .insert(name.to_owned(), machine_info(name, state));
    }

    /// A running machine started forkable, as a pool's source must be.
    pub fn add_forkable(&self, name: &str) {
        let mut info = machine_info(name, "running");
        info["forkable"] = json!(true);
        info["branchable"] = json!(true);
        self.state
            .lock()
            .unwrap()
            .machines
            .insert(name.to_owned(), info);
    }

    /// The pool's ForkPoolInfo, as `GET /api/v1/pools/{name}` answers it now.
    pub fn pool(&self, name: &str) -> Option<Value> {
        let mut st = self.state.lock().unwrap();
        pools_tick(&mut st);
        st.pools.contains_key(name).then(|| pool_info(&st, name))
    }

    /// A lease's ForkLeaseInfo.
    pub fn lease(&self, id: &str) -> Option<Value> {
        let mut st = self.state.lock().unwrap();
        pools_tick(&mut st);
        st.leases.get(id).map(|l| l.info.clone())
    }

    pub fn set_exec(&self, hook: impl Fn(&Value) -> Value + Send + Sync + 'static) {
        self.state.lock().unwrap().exec_hook = Some(Arc::new(hook));
    }

    /// Records an egress refusal on a machine with the given timestamp (RFC 3339, or empty).
    pub fn push_egress_denial(&self, name: &str, timestamp: &str, operation: &str, dest: &str) {
        self.state
            .lock()
            .unwrap()
            .egress_events
            .entry(name.to_owned())
            .or_default()
            .push(json!({"timestamp": timestamp, "operation": operation, "dest": dest}));
    }

    /// Makes every later command on the machine (`*`: on any machine; not a readiness probe)
    /// record this refusal.
    pub fn deny_on_exec(&self, name: &str, operation: &str, dest: &str) {
        self.state
            .lock()
            .unwrap()
            .denials_on_exec
            .entry(name.to_owned())
            .or_default()
            .push((operation.to_owned(), dest.to_owned()));
    }

    /// Scripts the frames of `POST .../exec/stream` from the request body.
    pub fn set_stream(&self, hook: impl Fn(&Value) -> Vec<StreamStep> + Send + Sync + 'static) {
        self.state.lock().unwrap().stream_hook = Some(Arc::new(hook));
    }

    /// The streams served so far (begun, closed early by the client, sent to the end).
    pub fn streams(&self) -> Arc<StreamCounts> {
        self.state.lock().unwrap().streams.clone()
    }

    /// Appends a line to a machine's workload log, as its workload prints: the next
    /// `GET /api/v1/machines/{id}/logs` shows it (`stream_logs` in the vendored 1.32.2 spec,
    /// `text/event-stream`, one unnamed `data: <line>` frame a line as the real 1.32.2 serve
    /// sends them: tests/guest/fake_vs_engine.rs), so a followed log's next poll reports it.
    pub fn push_log(&self, name: &str, line: &str) {
        self.state
            .lock()
            .unwrap()
            .logs
            .entry(name.to_owned())
            .or_default()
            .push(line.to_owned());
    }
}

/// What exec answers by default: `echo` echoes, `sh -c "exit N"` exits N, anything else prints ok;
/// a `background` command is detached and answered at once with its pid (see
/// [`background_answer`]).
pub fn default_exec(request: &Value) -> Value {
    if request["background"] == json!(true) {
        return background_answer(FAKE_BACKGROUND_PID);
    }
    let argv: Vec<&str> = request["command"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let (code, stdout) = match argv.as_slice() {
        ["echo", rest @ ..] => (0, format!("{}\n", rest.join(" "))),
        ["sh", "-c", script] if script.starts_with("exit ") => {
            (script[5..].trim().parse().unwrap_or(1), String::new())
        }
        _ => (0, "ok\n".to_owned()),
    };
    exec_response(code, stdout.as_bytes(), b"")
}

/// The pid the fake reports for a background command it does not really run.
pub const FAKE_BACKGROUND_PID: u32 = 4242;

/// What 1.32.2 answers a `background: true` exec as soon as the command is spawned: exit 0,
/// stdout `pid=<n>\n`, no stderr (smolvm src/api/handlers/exec.rs `exec_command`, its
/// `req.background` branch, search-index id 70216742866).
pub fn background_answer(pid: u32) -> Value {
    exec_response(0, format!("pid={pid}\n").as_bytes(), b"")
}

pub fn exec_response(code: i32, stdout: &[u8], stderr: &[u8]) -> Value {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    json!({
        "exitCode": code,
        "stdout": String::from_utf8_lossy(stdout), "stderr": String::from_utf8_lossy(stderr),
        "stdoutB64": b64(stdout), "stderrB64": b64(stderr)
    })
}

/// The value of `key` in a query string, undecoded (the fake's keys and values are plain).
fn query_param<'q>(query: Option<&'q str>, key: &str) -> Option<&'q str> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
}

/// The bytes `a` to `z` repeated, `size` of them, produced in 64 KiB chunks as the client reads.
fn generated_file(size: u64) -> Response {
    const CHUNK: u64 = 64 * 1024;
    let chunks = futures::stream::unfold(0u64, move |sent| async move {
        (sent < size).then(|| {
            let n = CHUNK.min(size - sent);
            let chunk: Vec<u8> = (sent..sent + n).map(|i| b'a' + (i % 26) as u8).collect();
            (Ok::<_, std::io::Error>(Bytes::from(chunk)), sent + n)
        })
    });
    (
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, size.to_string()),
        ],
        Body::from_stream(chunks),
    )
        .into_response()
}

/// Whether the engine's request deadline bounds a request. In 1.32.2 its `TimeoutLayer` wraps
/// list, get, fork and branches, stop, delete, files, the image list and the egress routes; not
/// create, start, exec, exec/stream, run, images/pull (taken out of it since 1.9: the 300 s
/// constant's place in the 1.32.2 router, and each route held open 330 s against the real
/// serve), nor logs and `/health`.
pub fn bounded(method: &Method, path: &str) -> bool {
    let unbounded = ["/start", "/exec", "/exec/stream", "/run", "/images/pull"];
    let outside_the_layer = path.ends_with("/logs")
        || (method == Method::POST
            && (path == "/api/v1/machines" || unbounded.iter().any(|end| path.ends_with(end))));
    path.starts_with("/api/v1/machines") && !outside_the_layer
}

/// Every request, bounded as the engine bounds it (see [`bounded`]): past the deadline a
/// bounded route answers 408 with an empty body.
async fn handle(state: State<Arc<Mutex<FakeState>>>, request: Request) -> Response {
    if request.method() == Method::GET && request.uri().path().ends_with("/exec/interactive") {
        return interactive(state, request).await;
    }
    let bounded = bounded(request.method(), request.uri().path());
    let deadline = state
        .lock()
        .unwrap()
        .request_deadline
        .unwrap_or(ENGINE_REQUEST_DEADLINE);
    if !bounded {
        return answer(state, request).await;
    }
    match tokio::time::timeout(deadline, answer(state, request)).await {
        Ok(response) => response,
        Err(_) => StatusCode::REQUEST_TIMEOUT.into_response(),
    }
}

/// The engine's interactive exec (a WebSocket, 1.32.2 `serve --help`; frames as seen on the
/// nested engine: binary output and input, a text `resize`, a text `exit` before the close),
/// answered by a line program rather than a PTY: it prompts `$ `, echoes what is typed, answers
/// a line with `you said: <line>`, a resize with its size in colour, ctrl-c with `^C`, and
/// `exit N` with the exit frame. An unknown machine is the engine's 404, a stopped one its 409.
async fn interactive(State(state): State<Arc<Mutex<FakeState>>>, request: Request) -> Response {
    use axum::extract::FromRequest;
    use axum::extract::ws::WebSocketUpgrade;
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or_default().to_owned();
    let name = path
        .trim_start_matches("/api/v1/machines/")
        .trim_end_matches("/exec/interactive")
        .to_owned();
    let pairs: Vec<(String, String)> = reqwest::Url::parse(&format!("http://fake/?{query}"))
        .unwrap()
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let get = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    let mut argv = vec![get("cmd").unwrap_or_else(|| "/bin/sh".into())];
    argv.extend(
        pairs
            .iter()
            .filter(|(k, _)| k == "arg")
            .map(|(_, v)| v.clone()),
    );
    let size = format!(
        "{}x{}",
        get("cols").unwrap_or_else(|| "80".into()),
        get("rows").unwrap_or_else(|| "24".into())
    );
    {
        let mut st = state.lock().unwrap();
        st.requests
            .push(json!({"method": "GET", "path": path, "query": query, "body": null}));
        let Some(machine) = st.machines.get(&name) else {
            return api_error(
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
                format!("machine '{name}' not found"),
            );
        };
        if machine["state"] != "running" {
            return api_error(
                StatusCode::CONFLICT,
                "CONFLICT",
                format!("machine '{name}' is not running"),
            );
        }
        st.terminal_log
            .push(format!("open {name} {} {size}", argv.join(" ")));
    }
    match WebSocketUpgrade::from_request(request, &()).await {
        Ok(upgrade) => upgrade.on_upgrade(move |socket| line_program(socket, state, name)),
        Err(rejection) => rejection.into_response(),
    }
}

async fn line_program(
    mut socket: axum::extract::ws::WebSocket,
    state: Arc<Mutex<FakeState>>,
    name: String,
) {
    use axum::extract::ws::Message;
    let log = |entry: String| state.lock().unwrap().terminal_log.push(entry);
    let out = |text: &str| Message::Binary(Bytes::copy_from_slice(text.as_bytes()));
    if socket.send(out("$ ")).await.is_err() {
        return;
    }
    let mut line: Vec<u8> = Vec::new();
    while let Some(Ok(message)) = socket.recv().await {
        match message {
            Message::Binary(bytes) => {
                for byte in bytes.iter().copied() {
                    let reply = match byte {
                        b'\r' | b'\n' => {
                            let text = String::from_utf8_lossy(&line).into_owned();
                            line.clear();
                            if let Some(code) = text.strip_prefix("exit ") {
                                let code: i64 = code.trim().parse().unwrap_or(1);
                                log(format!("exit {code}"));
                                let exit = json!({"type": "exit", "code": code}).to_string();
                                let _ = socket.send(out("\r\n")).await;
                                let _ = socket.send(Message::Text(exit.into())).await;
                                let _ = socket.send(Message::Close(None)).await;
                                return;
                            }
                            format!("\r\nyou said: {text}\r\n$ ")
                        }
                        3 => {
                            line.clear();
                            "^C\r\n$ ".to_owned()
                        }
                        // Echoed as typed, byte for byte (a character may span frames).
                        _ => {
                            line.push(byte);
                            let echo = Message::Binary(Bytes::copy_from_slice(&[byte]));
                            if socket.send(echo).await.is_err() {
                                return;
                            }
                            continue;
                        }
                    };
                    if socket.send(out(&reply)).await.is_err() {
                        return;
                    }
                }
            }
            Message::Text(text) => {
                let resize: Value = serde_json::from_str(text.as_str()).unwrap_or_default();
                if resize["type"] == "resize" {
                    let size = format!("{}x{}", resize["cols"], resize["rows"]);
                    log(format!("resize {size}"));
                    let shown = format!("\x1b[1;32m[{size}]\x1b[0m\r\n$ ");
                    if socket.send(out(&shown)).await.is_err() {
                        return;
                    }
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    log(format!("closed {name}"));
}

/// What `exec/stream` sends for a command: the test's script, or what the plain exec would
/// answer, streamed as 1.32.2 streams it. The plain exec's timing holds (`exec_delay`, `sleep N`
/// up to its `timeoutSecs`, then exit 124 with the agent's words), and output past the agent's
/// cap on a streamed exec ends in its error frame with no exit (`MAX_STREAMING_EXEC_OUTPUT`,
/// 11 MiB in all, smolvm src/agent/client.rs; its message is in the 1.32.2 binary).
fn stream_steps(st: &FakeState, request: &Value) -> Vec<StreamStep> {
    if let Some(script) = &st.stream_hook {
        return script(request);
    }
    let mut steps = Vec::new();
    let readiness_probe = request["command"][0] == "echo"
        && request["command"][1]
            .as_str()
            .is_some_and(|a| a.starts_with("ready-"));
    if let (false, Some(delay)) = (readiness_probe, st.exec_delay) {
        steps.push(StreamStep::Pause(delay));
    }
    if let Some(secs) = sleep_secs(request) {
        let limit = request["timeoutSecs"].as_f64().filter(|&l| l < secs);
        steps.push(StreamStep::Pause(std::time::Duration::from_secs_f64(
            limit.unwrap_or(secs),
        )));
        if let Some(limit) = limit {
            let stderr = match st.timeout_form {
                TimeoutForm::Command => format!("\ncommand timed out after {}ms", limit * 1000.0),
                TimeoutForm::Container => format!("container timed out after {limit}s"),
                TimeoutForm::Bare => String::new(),
            };
            steps.extend(steps_from_answer(&exec_response(
                124,
                b"",
                stderr.as_bytes(),
            )));
            return steps;
        }
    }
    let answer = match &st.exec_hook {
        Some(exec) => exec(request),
        None => default_exec(request),
    };
    let b64_len = |key: &str| {
        answer[key]
            .as_str()
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .map_or(0, |bytes| bytes.len())
    };
    if b64_len("stdoutB64") + b64_len("stderrB64") > ENGINE_OUTPUT_CAP {
        steps.push(StreamStep::stdout(&"x".repeat(64 * 1024)));
        steps.push(StreamStep::engine_error(&format!(
            "streaming output exceeded {ENGINE_OUTPUT_CAP} byte cap; exec terminated (output truncated)"
        )));
        return steps;
    }
    steps.extend(steps_from_answer(&answer));
    steps
}

/// A command the fake "runs" for a while: `sleep N` (alone, or as the script of `sh -c`).
fn sleep_secs(request: &Value) -> Option<f64> {
    let argv: Vec<&str> = request["command"]
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let script = match argv.as_slice() {
        ["sleep", n] => return n.parse().ok(),
        ["sh", "-c", script] => *script,
        _ => return None,
    };
    script.strip_prefix("sleep ")?.trim().parse().ok()
}

async fn answer(State(state): State<Arc<Mutex<FakeState>>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    // 1.32.2 finds the machine before it looks at an upload's size (an unknown machine with an
    // oversized Content-Length is a 404 on the real serve: `tests/engine/fake_fidelity.rs`), then
    // refuses a body over its limit as plain text (smolvm src/api/handlers/files.rs
    // `upload_file`), without reading it.
    if parts.method == Method::PUT && parts.uri.path().contains("/files/") {
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let name = parts.uri.path().split('/').nth(4).unwrap_or_default();
        let known = state.lock().unwrap().machines.contains_key(name);
        if !known {
            return api_error(
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
                format!("machine '{name}' not found"),
            );
        }
        if declared.is_some_and(|len| len > ENGINE_UPLOAD_LIMIT) {
            // Recorded without its body, which is never read: the request did reach the engine.
            state.lock().unwrap().requests.push(envelope(
                &parts.method,
                &parts.uri,
                &parts.headers,
                &[],
            ));
            return plain_text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "file exceeds the {} MiB upload limit",
                    ENGINE_UPLOAD_LIMIT >> 20
                ),
            );
        }
    }
    let bytes: Bytes = axum::body::to_bytes(body, 256 * 1024 * 1024)
        .await
        .unwrap_or_default();
    let json_body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let path = parts.uri.path();
    let is_exec = path.ends_with("/exec") || path.ends_with("/exec/stream");
    let readiness_probe = json_body["command"][0] == "echo"
        && json_body["command"][1]
            .as_str()
            .is_some_and(|a| a.starts_with("ready-"));
    if parts.method == Method::POST
        && is_exec
        && !readiness_probe
        && state
            .lock()
            .unwrap()
            .machines
            .contains_key(path.split('/').nth(4).unwrap_or(""))
    {
        tokio::time::sleep(COMMAND_RUNS).await;
        count_consumption(&mut state.lock().unwrap(), path);
    }
    if parts.method == Method::POST && parts.uri.path().ends_with("/pause") {
        let saving = {
            let mut st = state.lock().unwrap();
            let name = parts.uri.path().split('/').nth(4).unwrap_or("").to_owned();
            let saves = st.machines.get(&name).is_some_and(|m| {
                m["state"] == json!("running")
                    && m["forkable"] == json!(true)
                    && m["mounts"].as_array().is_none_or(|m| m.is_empty())
            });
            let script = st.pause_save.get(&name).filter(|_| saves).cloned();
            let armed = script.is_some();
            if let Some(script) = script {
                st.saving.insert(name.clone(), script.into());
                st.pauses.push(format!("pause {name}"));
                st.requests
                    .push(envelope(&parts.method, &parts.uri, &parts.headers, &bytes));
            }
            armed
        };
        if saving {
            // Answered by the deadline's 408 (`handle`), as the engine answers it.
            std::future::pending::<()>().await;
        }
    }
    if parts.method == Method::POST && parts.uri.path() == "/api/v1/machines" {
        let delay = state.lock().unwrap().create_delay;
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
    }
    let guest_shell = state.lock().unwrap().guest_shell.clone();
    if let Some(shell) = guest_shell
        && let Some(response) = guest_exec(&state, &shell, &parts, &bytes, &json_body).await
    {
        return response;
    }
    if parts.method == Method::POST && parts.uri.path().ends_with("/exec") {
        let readiness_probe = json_body["command"][0] == "echo"
            && json_body["command"][1]
                .as_str()
                .is_some_and(|a| a.starts_with("ready-"));
        // Read in a statement of its own: the state lock is not held while the exec "runs".
        let delay = state.lock().unwrap().exec_delay;
        if let (false, Some(delay)) = (readiness_probe, delay) {
            tokio::time::sleep(delay).await;
        }
        if !readiness_probe {
            record_denials_on_exec(&mut state.lock().unwrap(), parts.uri.path());
        }
        // `sleep N` sleeps N seconds, or until its `timeoutSecs`, where the engine ends it and
        // answers exit 124 in the form the test chose.
        if let Some(secs) =
            sleep_secs(&json_body).filter(|_| json_body["background"] != json!(true))
        {
            let limit = json_body["timeoutSecs"].as_f64();
            match limit.filter(|&l| l < secs) {
                Some(limit) => {
                    tokio::time::sleep(std::time::Duration::from_secs_f64(limit)).await;
                    let mut st = state.lock().unwrap();
                    st.requests
                        .push(envelope(&parts.method, &parts.uri, &parts.headers, &bytes));
                    let stderr = match st.timeout_form {
                        TimeoutForm::Command => {
                            format!("\ncommand timed out after {}ms", limit * 1000.0)
                        }
                        TimeoutForm::Container => format!("container timed out after {limit}s"),
                        TimeoutForm::Bare => String::new(),
                    };
                    return axum::Json(exec_response(124, b"", stderr.as_bytes())).into_response();
                }
                None => tokio::time::sleep(std::time::Duration::from_secs_f64(secs)).await,
            }
        }
    }
    if parts.uri.path().contains("/files/") {
        let delay = state.lock().unwrap().file_delay;
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
    }
    if parts.method == Method::POST && parts.uri.path().ends_with("/images/pull") {
        let delay = state.lock().unwrap().pull_delay;
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
    }
    wait_for_worker(&state, &parts, &json_body).await;
    let mut st = state.lock().unwrap();
    pools_tick(&mut st);
    st.requests
        .push(envelope(&parts.method, &parts.uri, &parts.headers, &bytes));
    let path = parts.uri.path().to_owned();
    let segments: Vec<String> = path
        .trim_start_matches('/')
        .splitn(5, '/')
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    let seg: Vec<&str> = segments.iter().map(String::as_str).collect();
    let not_found = |name: &str| {
        api_error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("machine '{name}' not found"),
        )
    };
    match (parts.method.as_str(), seg.as_slice()) {
        ("GET", ["health"]) => axum::Json(json!({
            "status": "ok", "version": "1.32.2", "nested_virt": false,
            "machines": {"total": st.machines.len(), "running": 0}, "uptime_seconds": 1
        }))
        .into_response(),
        ("GET", ["api", "v1", "machines"]) => {
            let machines: Vec<Value> = st.machines.values().cloned().collect();
            axum::Json(json!({ "machines": machines })).into_response()
        }
        ("POST", ["api", "v1", "machines"]) => {
            if let Some(refusal) = unknown_field("CreateMachineRequest", &json_body) {
                return refusal;
            }
            if let Some(message) = st.create_failure.clone() {
                return api_error(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL_ERROR", message);
            }
            if let Some(name) = json_body["name"].as_str() {
                let refusal = if name.is_empty() {
                    Some("machine name cannot be empty".to_owned())
                } else {
                    name_refusal(name)
                };
                if let Some(message) = refusal {
                    return api_error(StatusCode::BAD_REQUEST, "BAD_REQUEST", message);
                }
            }
            let name = json_body["name"].as_str().unwrap_or("generated").to_owned();
            if st.machines.contains_key(&name) {
                return api_error(
                    StatusCode::CONFLICT,
                    "CONFLICT",
                    format!("machine '{name}' already exists"),
                );
            }
            let bindings = match create_credentials(&json_body) {
                Ok(bindings) => bindings,
                Err(refusal) => return *refusal,
            };
            if !bindings.is_empty() {
                st.credentials.insert(name.clone(), bindings);
            }
            let mut info = machine_info(&name, "created");
            for key in [
                "image",
                "cpus",
                "memoryMb",
                "network",
                "allowedHosts",
                "allowedCidrs",
                "ports",
                "storageGb",
                "overlayGb",
            ] {
                if let Some(v) = json_body.get(key) {
                    info[key] = v.clone();
                }
            }
            // A bare machine (the engine's own Alpine root file system) has no image.
            if json_body.get("image").is_none() {
                info["image"] = Value::Null;
            }
            // Mounts as MountInfo answers them: a tag each, read-only unless said otherwise.
            if let Some(mounts) = json_body["mounts"].as_array() {
                info["mounts"] = mounts
                    .iter()
                    .enumerate()
                    .map(|(i, m)| {
                        json!({
                            "source": m["source"], "target": m["target"], "tag": format!("smol{i}"),
                            "readonly": m["readonly"].as_bool().unwrap_or(true), "staged": false,
                        })
                    })
                    .collect();
            }
            st.machines.insert(name, info.clone());
            axum::Json(info).into_response()
        }
        // The body is checked before the machine is looked for: its type by axum's `Json`, then
        // the command (smolvm src/api/handlers/exec.rs `exec_command`, `validate_command`).
        // `exec/stream` takes the same `ExecRequest` (1.32.2 spec) through the same checks.
        ("POST", ["api", "v1", "machines", _, "exec" | "exec/stream"])
            if unknown_field("ExecRequest", &json_body).is_some() =>
        {
            unknown_field("ExecRequest", &json_body).unwrap()
        }
        ("POST", ["api", "v1", "machines", _, "exec" | "exec/stream"])
            if json_body["command"].as_array().is_some_and(Vec::is_empty) =>
        {
            api_error(
                StatusCode::BAD_REQUEST,
                "BAD_REQUEST",
                "command cannot be empty".to_owned(),
            )
        }
        ("GET", ["api", "v1", "pools"]) => {
            let pools: Vec<Value> = st.pools.keys().map(|p| pool_info(&st, p)).collect();
            axum::Json(json!({ "pools": pools })).into_response()
        }
        ("POST", ["api", "v1", "pools"]) => create_pool(&mut st, &bytes, &json_body),
        (method, ["api", "v1", "pools", pool, rest @ ..]) => {
            let rest: Vec<&str> = rest
                .first()
                .map(|r| r.split('/').collect())
                .unwrap_or_default();
            pool_route(
                &mut st,
                method,
                pool,
                &rest,
                parts.uri.query(),
                &bytes,
                &json_body,
            )
        }
        (method, ["api", "v1", "machines", name, rest @ ..]) => {
            let name = name.to_string();
            let Some(info) = st.machines.get(&name).cloned() else {
                // Fork looks the machine up another way and words it so (observed on the
                // real serve: `tests/engine/fake_fidelity.rs`).
                if matches!(rest.first().copied(), Some("fork" | "branches")) {
                    return api_error(
                        StatusCode::NOT_FOUND,
                        "NOT_FOUND",
                        format!("vm not found: {name}"),
                    );
                }
                return not_found(&name);
            };
            let rest: Vec<&str> = rest
                .first()
                .map(|r| r.splitn(2, '/').collect())
                .unwrap_or_default();
            match (method, rest.as_slice()) {
                ("GET", []) => {
                    let Some(script) = st.saving.get_mut(&name) else {
                        return axum::Json(info).into_response();
                    };
                    let next = script.pop_front();
                    if script.is_empty() {
                        st.saving.remove(&name);
                    }
                    let machine = st.machines.get_mut(&name).expect("looked up above");
                    if let Some(next) = next {
                        machine["state"] = json!(next);
                    }
                    axum::Json(machine.clone()).into_response()
                }
                // A fork base with live clones (stopped ones count too) is refused unless
                // `cascade=true`, which deletes the clones first (smolvm
                // src/api/handlers/machines.rs `delete_machine`; the message's pieces are in
                // the 1.32.2 binary).
                ("DELETE", []) => {
                    let clones = clones_of(&st, &name);
                    if !clones.is_empty() {
                        if query_param(parts.uri.query(), "cascade") != Some("true") {
                            return api_error(
                                StatusCode::CONFLICT,
                                "CONFLICT",
                                format!(
                                    "machine '{name}' is the fork base of {} live clone(s) ({}); their disks are backed by its disks — delete the clones first",
                                    clones.len(),
                                    clones.join(", ")
                                ),
                            );
                        }
                        for clone in &clones {
                            st.machines.remove(clone);
                            if let Some(shell) = &st.guest_shell {
                                shell.kill_machine(clone);
                            }
                        }
                    }
                    st.machines.remove(&name);
                    if let Some(root) = &st.guest_root {
                        let _ = std::fs::remove_dir_all(root.join(&name));
                    }
                    // The machine's processes end with its VM.
                    if let Some(shell) = &st.guest_shell {
                        shell.kill_machine(&name);
                    }
                    // A pool worker's lease fails; its pool replaces a ready one.
                    for gone in clones.iter().chain([&name]) {
                        worker_gone(&mut st, gone);
                    }
                    axum::Json(json!({ "deleted": name })).into_response()
                }
                // A start of a running machine answers its record unchanged: it does not
                // become branchable (observed on the 1.32.2 engine; not yet driven on the
                // nested guest).
                // 1.32.2's pause and resume, as the nested engine answered them: a pause of a
                // machine that is not running is 409 "must be running"; the record then reads
                // `paused`; start and stop are refused while it is; resume continues it. (The
                // engine saves only a machine started forkable; the fake records the flag.)
                ("POST", ["pause"]) if info["state"] != json!("running") => api_error(
                    StatusCode::CONFLICT,
                    "CONFLICT",
                    format!("machine '{name}' must be running"),
                ),
                // 1.32.2 refuses to capture what it cannot carry, "host mounts" first among them
                // (its checkpoint code's list, `strings smol-vmm`; the sentence around it is
                // this fake's).
                ("POST", ["pause"]) if info["mounts"].as_array().is_some_and(|m| !m.is_empty()) => {
                    api_error(
                        StatusCode::CONFLICT,
                        "CONFLICT",
                        format!("machine '{name}' cannot be checkpointed: it has host mounts"),
                    )
                }
                ("POST", ["pause"]) if info["forkable"] != json!(true) => api_error(
                    StatusCode::CONFLICT,
                    "CONFLICT",
                    format!("machine '{name}' was not started forkable"),
                ),
                ("POST", ["pause"]) | ("POST", ["resume"]) => {
                    let to = if rest[0] == "pause" {
                        "paused"
                    } else {
                        "running"
                    };
                    // The engine answers a frozen base's resume 200 with its record
                    // unchanged (nested 1.32.2, docs/bases-engine.md).
                    if rest[0] == "resume" && info["state"] == json!("frozen") {
                        return axum::Json(info).into_response();
                    }
                    if rest[0] == "resume" && info["state"] != json!("paused") {
                        return api_error(
                            StatusCode::CONFLICT,
                            "CONFLICT",
                            format!("machine '{name}' is not paused"),
                        );
                    }
                    st.pauses.push(format!("{} {name}", rest[0]));
                    let machine = st.machines.get_mut(&name).expect("looked up above");
                    machine["state"] = json!(to);
                    axum::Json(machine.clone()).into_response()
                }
                // A frozen base: start refused always, stop while clones live on it (the
                // nested 1.32.2 engine's words, docs/bases-engine.md).
                ("POST", ["start"]) | ("POST", ["stop"]) if info["state"] == json!("frozen") => {
                    let clones = clones_of(&st, &name);
                    let refusal = match (rest[0], clones.is_empty()) {
                        ("start", true) => format!(
                            "machine '{name}' is frozen because it retains a reusable fork checkpoint; stop it before restarting, or fork it again"
                        ),
                        ("start", false) => format!(
                            "machine '{name}' is frozen because it is the fork base for {} dependent clone(s) ({}); delete the clones first",
                            clones.len(),
                            clones.join(", ")
                        ),
                        (_, false) => format!(
                            "machine '{name}' is the fork base of {} dependent clone(s) ({}); they CoW-map its memory and disks — delete those clones first",
                            clones.len(),
                            clones.join(", ")
                        ),
                        (_, true) => {
                            let machine = st.machines.get_mut(&name).expect("looked up above");
                            machine["state"] = json!("stopped");
                            return axum::Json(machine.clone()).into_response();
                        }
                    };
                    api_error(StatusCode::CONFLICT, "CONFLICT", refusal)
                }
                // A frozen base's agent never answers: its file routes are 409 after the
                // engine's probe, in the default exec's misleading words.
                (_, ["files", _]) if info["state"] == json!("frozen") => api_error(
                    StatusCode::CONFLICT,
                    "CONFLICT",
                    "machine is running but its agent is not answering yet; retry".to_owned(),
                ),
                // The 1.32.2 binary's words (reference/engine-next-features.md section 2).
                ("POST", ["start"]) | ("POST", ["stop"]) if info["state"] == json!("paused") => {
                    let refusal = if rest[0] == "start" {
                        "start: machine has saved execution; use resume"
                    } else {
                        "stop: machine has saved execution; use resume or delete"
                    };
                    api_error(StatusCode::CONFLICT, "CONFLICT", refusal.to_owned())
                }
                ("POST", ["start"]) if info["state"] == json!("running") => {
                    axum::Json(info).into_response()
                }
                ("POST", ["start"]) if st.start_failure.is_some() => api_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "INTERNAL_ERROR",
                    st.start_failure.clone().unwrap_or_default(),
                ),
                // A stop of a machine that never started leaves it `created` (observed on the
                // real serve, `tests/engine/fake_fidelity.rs`).
                ("POST", ["stop"]) if info["state"] == json!("created") => {
                    axum::Json(info).into_response()
                }
                // 1.32.2: values held in the serve's memory, applied at the next boot; keyed by
                // binding name, an unknown one refused whole (observed on the engine; facts in
                // the credential bindings' research).
                ("PUT", ["credential-values"]) => {
                    let values: BTreeMap<String, String> = json_body["values"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                                .collect()
                        })
                        .unwrap_or_default();
                    let bound = st.credentials.get(&name).cloned().unwrap_or_default();
                    if let Some(unknown) = values
                        .keys()
                        .find(|k| !bound.iter().any(|(b, _, _)| b == *k))
                    {
                        return api_error(
                            StatusCode::BAD_REQUEST,
                            "BAD_REQUEST",
                            format!("machine '{name}' has no credential binding '{unknown}'"),
                        );
                    }
                    st.credential_values.insert(name, values);
                    StatusCode::NO_CONTENT.into_response()
                }
                // The whole set replaced, live on a running machine, answered with the whole
                // record (1.32.2, seen on the nested engine: tests/guest/fake_vs_engine.rs): a
                // mapping without a host is axum's 422, a port of 0 the engine's 400, a host
                // port another machine holds (or this host cannot bind) 409 PORT_IN_USE with
                // the set left as it was; a TCP mapping is recorded without its protocol.
                ("PUT", ["ports"]) => {
                    let asked = json_body["ports"].as_array().cloned().unwrap_or_default();
                    let mut set = Vec::new();
                    for (i, port) in asked.iter().enumerate() {
                        let field = |f: &str| port[f].as_u64();
                        let (Some(host), Some(guest)) = (field("host"), field("guest")) else {
                            let missing = if field("host").is_none() {
                                "host"
                            } else {
                                "guest"
                            };
                            return (
                                StatusCode::UNPROCESSABLE_ENTITY,
                                format!(
                                    "Failed to deserialize the JSON body into the target type: ports[{i}]: missing field `{missing}`"
                                ),
                            )
                                .into_response();
                        };
                        if host == 0 || guest == 0 || host > 65_535 || guest > 65_535 {
                            return api_error(
                                StatusCode::BAD_REQUEST,
                                "BAD_REQUEST",
                                format!(
                                    "config operation failed: published ports: could not change machine '{name}''s published ports while it runs: invalid port mapping '{host}:{guest}'"
                                ),
                            );
                        }
                        let held_elsewhere = st.machines.iter().any(|(other, m)| {
                            *other != name
                                && m["ports"]
                                    .as_array()
                                    .is_some_and(|ps| ps.iter().any(|p| p["host"] == json!(host)))
                        });
                        let free_here = u16::try_from(host)
                            .is_ok_and(|h| std::net::TcpListener::bind(("127.0.0.1", h)).is_ok());
                        if held_elsewhere || !free_here {
                            return api_error(
                                StatusCode::CONFLICT,
                                "PORT_IN_USE",
                                format!(
                                    "config operation failed: published ports: could not change machine '{name}''s published ports while it runs: host port {host}: Address already in use (os error 98)"
                                ),
                            );
                        }
                        set.push(json!({"host": host, "guest": guest}));
                    }
                    let machine = st.machines.get_mut(&name).expect("looked up above");
                    machine["ports"] = json!(set);
                    axum::Json(machine.clone()).into_response()
                }
                // Merged into the list in force (1.32.2 `update_machine_egress`), answered with
                // the whole record; a running machine without a list cannot take one live.
                ("POST", ["egress"]) => {
                    let hosts = json_body["allowHosts"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    let cidrs = json_body["allowCidrs"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    if hosts.is_empty() && cidrs.is_empty() {
                        return api_error(
                            StatusCode::BAD_REQUEST,
                            "BAD_REQUEST",
                            "request contains no egress changes".to_owned(),
                        );
                    }
                    let has_list =
                        info["allowedHosts"].is_array() || info["allowedCidrs"].is_array();
                    if info["state"] == json!("running")
                        && info["network"] == json!(true)
                        && !has_list
                    {
                        return api_error(
                            StatusCode::CONFLICT,
                            "CONFLICT",
                            format!(
                                "machine '{name}' is running without an allow list, so its egress can only change while it is stopped"
                            ),
                        );
                    }
                    let mut info = info;
                    for (key, add) in [("allowedHosts", hosts), ("allowedCidrs", cidrs)] {
                        if add.is_empty() {
                            continue;
                        }
                        let mut list = info[key].as_array().cloned().unwrap_or_default();
                        for item in add {
                            if !list.contains(&item) {
                                list.push(item);
                            }
                        }
                        info[key] = Value::Array(list);
                    }
                    info["network"] = json!(true);
                    st.machines.insert(name, info.clone());
                    axum::Json(info).into_response()
                }
                ("POST", ["start"]) | ("POST", ["stop"]) => {
                    if rest[0] == "start" {
                        let values = st.credential_values.get(&name).cloned().unwrap_or_default();
                        st.booted_values.insert(name.clone(), values);
                    }
                    let mut info = info;
                    info["state"] = json!(if rest[0] == "start" {
                        "running"
                    } else {
                        "stopped"
                    });
                    if rest[0] == "start"
                        && parts
                            .uri
                            .query()
                            .is_some_and(|q| q.contains("forkable=true"))
                    {
                        info["branchable"] = json!(true);
                        info["forkable"] = json!(true);
                    }
                    if rest[0] == "stop"
                        && let Some(shell) = &st.guest_shell
                    {
                        shell.kill_machine(&name);
                    }
                    st.machines.insert(name.clone(), info.clone());
                    // A stopped leased worker fails its lease and the controller deletes it.
                    if rest[0] == "stop" && leased(&st, &name) {
                        worker_gone(&mut st, &name);
                        st.machines.remove(&name);
                    }
                    axum::Json(info).into_response()
                }
                // `/fork` is the older name of the same route (both in the 1.32.2 spec; the real
                // serve answers both alike, `tests/engine/fake_fidelity.rs`).
                ("POST", ["branches"]) | ("POST", ["fork"]) => {
                    // A running machine not started branchable, in 1.32.2's words (compared
                    // with the real guest in tests/guest/fake_vs_engine.rs); one not running, in the
                    // older source's.
                    if info["state"] == json!("running") && info["branchable"] != json!(true) {
                        return api_error(
                            StatusCode::CONFLICT,
                            "CONFLICT",
                            format!(
                                "agent operation failed: fork: machine '{name}' was not started as branchable, so it has no copy-on-write memory to branch from. Restart it with `smolvm machine start --name {name} --branchable`; branchability is decided at start time and cannot be turned on for an already-running machine."
                            ),
                        );
                    }
                    // A frozen source branches again and again, each child from the instant
                    // it was frozen.
                    if info["branchable"] != json!(true)
                        || !matches!(info["state"].as_str(), Some("running" | "frozen"))
                    {
                        return api_error(
                            StatusCode::CONFLICT,
                            "CONFLICT",
                            format!(
                                "agent operation failed: fork: golden '{name}' is not running forkable; start it with `machine start --forkable --name {name}`"
                            ),
                        );
                    }
                    let child = json_body["name"].as_str().unwrap_or("child").to_owned();
                    if st.machines.contains_key(&child) {
                        return api_error(
                            StatusCode::CONFLICT,
                            "CONFLICT",
                            format!("machine '{child}' already exists"),
                        );
                    }
                    if let Some(root) = &st.guest_root {
                        copy_disk(root, &name, &child);
                    }
                    let mut info = machine_info(&child, "running");
                    // A clone has its source's shape and egress policy (the booted test of a
                    // base's child checks the policy on the nested engine).
                    for key in CLONED_FIELDS {
                        if let Some(v) = st.machines[&name].get(key) {
                            info[key] = v.clone();
                        }
                    }
                    info["parentMachine"] = json!(name);
                    // Its credential bindings too (the same placeholders in its environment);
                    // the values are resolved under its own name at its boots.
                    if let Some(bindings) = st.credentials.get(&name).cloned() {
                        st.credentials.insert(child.clone(), bindings);
                    }
                    // `freezeSource`: the source is listed `frozen`, the base of later
                    // branches, and runs nothing more (driven on the nested 1.32.2 engine:
                    // docs/bases-engine.md).
                    if json_body["freezeSource"] == json!(true)
                        && let Some(source) = st.machines.get_mut(&name)
                    {
                        source["state"] = json!("frozen");
                        if !st.at_branchpoint.contains(&name) {
                            st.frozen_off_branchpoint.insert(name.clone());
                        }
                    }
                    st.machines.insert(child, info.clone());
                    axum::Json(info).into_response()
                }
                // Answered at once and sent as the command runs (see `fake_stream`); the
                // engine's request deadline bounds only the answer, not its body.
                ("POST", ["exec", "stream"]) => {
                    if let Some(refused) = require_running(&mut st, &name, &json_body) {
                        return refused;
                    }
                    // A streamed command is refused egress as a plain one is, from its start.
                    let readiness_probe = json_body["command"][0] == "echo"
                        && json_body["command"][1]
                            .as_str()
                            .is_some_and(|a| a.starts_with("ready-"));
                    if !readiness_probe {
                        record_denials_on_exec(&mut st, parts.uri.path());
                    }
                    let steps = stream_steps(&st, &with_lease_env(&st, &name, &json_body));
                    sse_response(steps, st.stream_gap, st.streams.clone())
                }
                ("POST", ["exec"]) => {
                    if let Some(refused) = require_running(&mut st, &name, &json_body) {
                        return refused;
                    }
                    if json_body["command"].as_array().is_some_and(|argv| {
                        argv.iter().any(|a| {
                            a.as_str()
                                .is_some_and(|a| a.contains("smolvm-branch-ready"))
                        })
                    }) {
                        st.at_branchpoint.insert(name.clone());
                    }
                    let hook = st.exec_hook.clone();
                    let request = with_lease_env(&st, &name, &json_body);
                    let answer = match hook {
                        Some(h) => h(&request),
                        None => default_exec(&request),
                    };
                    let over_cap = ["stdoutB64", "stderrB64"].iter().any(|k| {
                        answer[k].as_str().is_some_and(|b| {
                            base64::engine::general_purpose::STANDARD
                                .decode(b)
                                .is_ok_and(|bytes| bytes.len() > ENGINE_OUTPUT_CAP)
                        })
                    });
                    if over_cap {
                        return api_error(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "INTERNAL_ERROR",
                            format!(
                                "command output exceeded {ENGINE_OUTPUT_CAP} bytes and was truncated. Use streaming exec (exec_stream / execStream) for large output."
                            ),
                        );
                    }
                    axum::Json(answer).into_response()
                }
                // A directory answers 200 JSON `{"entries": [...]}` (smolvm
                // src/api/handlers/files.rs `download_file`; 1.32.2's spec says the same).
                ("GET", ["files", file])
                    if st
                        .directories
                        .contains_key(&(name.clone(), file.to_string())) =>
                {
                    let entries = st.directories[&(name.clone(), file.to_string())].clone();
                    axum::Json(json!({ "entries": entries })).into_response()
                }
                ("GET", ["files", file])
                    if st
                        .generated_files
                        .contains_key(&(name.clone(), file.to_string())) =>
                {
                    let size = st.generated_files[&(name.clone(), file.to_string())];
                    generated_file(size)
                }
                ("GET", ["files", file]) if st.guest_root.is_some() => {
                    let disk = st.guest_root.clone().unwrap().join(&name);
                    match std::fs::read(disk.join(file.trim_start_matches('/'))) {
                        Ok(bytes) => (
                            [(header::CONTENT_TYPE, "application/octet-stream")],
                            Body::from(bytes),
                        )
                            .into_response(),
                        Err(_) => api_error(
                            StatusCode::NOT_FOUND,
                            "NOT_FOUND",
                            format!("file not found: /{file}"),
                        ),
                    }
                }
                ("GET", ["files", file]) => match st.files.get(&(name.clone(), file.to_string())) {
                    Some(bytes) => (
                        [(header::CONTENT_TYPE, "application/octet-stream")],
                        Body::from(bytes.clone()),
                    )
                        .into_response(),
                    // A missing path: the source passes the agent's error on as a 500; 1.32.2's
                    // spec documents a 404 (smolvm src/api/handlers/files.rs).
                    None if st.missing_file_404 => api_error(
                        StatusCode::NOT_FOUND,
                        "NOT_FOUND",
                        format!("file not found: /{file}"),
                    ),
                    None => api_error(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "INTERNAL_ERROR",
                        format!(
                            "agent operation failed: read file: {file}: No such file or directory"
                        ),
                    ),
                },
                ("PUT", ["files", file]) if st.guest_root.is_some() => {
                    let at = st
                        .guest_root
                        .clone()
                        .unwrap()
                        .join(&name)
                        .join(file.trim_start_matches('/'));
                    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
                    std::fs::write(&at, &bytes).unwrap();
                    axum::Json(json!({"path": file, "size": bytes.len()})).into_response()
                }
                ("PUT", ["files", file]) => {
                    let size = bytes.len();
                    st.files.insert((name, file.to_string()), bytes.to_vec());
                    axum::Json(json!({"path": file, "size": size})).into_response()
                }
                ("GET", ["logs"]) => {
                    let logs = match query_param(parts.uri.query(), "source") {
                        None | Some("console") => &st.engine_logs,
                        Some("workload") => &st.logs,
                        Some(other) => {
                            return api_error(
                                StatusCode::BAD_REQUEST,
                                "BAD_REQUEST",
                                format!(
                                    "unknown log source '{other}': use \"console\" or \"workload\""
                                ),
                            );
                        }
                    };
                    // A machine that has booted and whose log is empty (a bare machine's
                    // workload) answers an empty stream; only one never started has no log
                    // (both seen on the real 1.32.2 guest, tests/guest/fake_vs_engine.rs).
                    let empty = Vec::new();
                    let lines = match logs.get(&name) {
                        Some(lines) => lines,
                        None if info["state"] != json!("created") => &empty,
                        None => {
                            return api_error(
                                StatusCode::NOT_FOUND,
                                "NOT_FOUND",
                                format!(
                                    "machine '{name}' has no logs yet — it may not have been started"
                                ),
                            );
                        }
                    };
                    // `tail` as the engine reads it (smolvm 1.32.2, src/api/handlers/machines.rs,
                    // and observed on it): like `tail -n`, 0 is no line at all; over
                    // 10000 is a 400 ("tail value N exceeds maximum of 10000", pieced from
                    // `strings` on the pinned binary), asked after the no-logs 404 as the real
                    // serve does for a never-started machine (tests/engine/real_serve.rs); without
                    // `tail` and without follow, only the first 64 KiB of the log (cut here at
                    // a line end).
                    let tail = query_param(parts.uri.query(), "tail");
                    let lines: Vec<&String> = match tail.map(|t| t.parse::<u64>()) {
                        Some(Ok(n)) if n > 10_000 => {
                            return api_error(
                                StatusCode::BAD_REQUEST,
                                "BAD_REQUEST",
                                format!("tail value {n} exceeds maximum of 10000"),
                            );
                        }
                        Some(Ok(n)) => {
                            let n = usize::try_from(n).unwrap_or(usize::MAX);
                            lines.iter().skip(lines.len().saturating_sub(n)).collect()
                        }
                        Some(Err(_)) => {
                            return api_error(
                                StatusCode::BAD_REQUEST,
                                "BAD_REQUEST",
                                "Failed to deserialize query string".to_owned(),
                            );
                        }
                        None => {
                            let mut used = 0;
                            lines
                                .iter()
                                .take_while(|l| {
                                    used += l.len() + 1;
                                    used <= 64 * 1024
                                })
                                .collect()
                        }
                    };
                    let body: String = lines.iter().map(|l| format!("data: {l}\n\n")).collect();
                    ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
                }
                // smolvm 1.32.2 `get_machine_egress_events` (vendored spec; the handler is not
                // in the searched sources): the newest `limit` (default 200) refusals, oldest
                // first; a `limit` that is not a whole number is axum's plain-text 400 (both
                // observed on the real serve, tests/clients/egress.rs).
                ("GET", ["egress-events"]) => {
                    if st.egress_events_fail {
                        return api_error(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "INTERNAL_ERROR",
                            "reading the egress log failed".to_owned(),
                        );
                    }
                    let limit = match query_param(parts.uri.query(), "limit").map(str::parse) {
                        None => 200,
                        Some(Ok(n)) => n,
                        Some(Err(_)) => {
                            return plain_text(
                                StatusCode::BAD_REQUEST,
                                "Failed to deserialize query string: limit: invalid digit found in string".to_owned(),
                            );
                        }
                    };
                    let events = st.egress_events.get(&name).cloned().unwrap_or_default();
                    let newest = events.len().saturating_sub(limit);
                    let date = chrono::DateTime::<chrono::Utc>::from(engine_now(&st))
                        .format("%a, %d %b %Y %H:%M:%S GMT")
                        .to_string();
                    (
                        [(header::DATE, date)],
                        axum::Json(json!({"events": events[newest..]})),
                    )
                        .into_response()
                }
                ("POST", ["images", "pull"]) => axum::Json(json!({"image": {
                    "reference": json_body["image"], "digest": "sha256:0123", "size": 3_500_000,
                    "architecture": "amd64", "os": "linux", "layerCount": 1
                }}))
                .into_response(),
                _ => api_error(
                    StatusCode::NOT_FOUND,
                    "NOT_FOUND",
                    format!("no route {method} {path}"),
                ),
            }
        }
        _ => api_error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("no route {path}"),
        ),
    }
}

/// Both exec routes: `autoStart` (default true) starts a machine whose VM is not there
/// (created, stopped, failed) for the command; without it such a machine is refused, in the
/// engine's words (the exec handler's `require_running`; both routes answered so on the real
/// 1.32.2 serve, compared in tests/guest/fake_vs_engine.rs). A suspended or unreachable machine's VM
/// is still there: the command goes to it.
/// The machines branched from `name` that still exist.
fn clones_of(st: &FakeState, name: &str) -> Vec<String> {
    st.machines
        .iter()
        .filter(|(_, m)| m["parentMachine"] == json!(name))
        .map(|(n, _)| n.clone())
        .collect()
}

/// What a branch child has of its source's record: its shape and egress policy.
const CLONED_FIELDS: [&str; 6] = [
    "image",
    "cpus",
    "memoryMb",
    "network",
    "allowedHosts",
    "allowedCidrs",
];

fn require_running(st: &mut FakeState, name: &str, body: &Value) -> Option<Response> {
    let machine = st.machines.get_mut(name)?;
    // A frozen base: the engine probes its agent (3 s), then refuses, in either text.
    if machine["state"] == json!("frozen") {
        let message = if body["autoStart"] == json!(false) {
            "machine is not running and autoStart is false"
        } else {
            "machine is running but its agent is not answering yet; retry"
        };
        return Some(api_error(
            StatusCode::CONFLICT,
            "CONFLICT",
            message.to_owned(),
        ));
    }
    // A paused machine's VM is gone (its memory saved): nothing runs the command.
    if machine["state"] == json!("paused") {
        // Both texts as the nested 1.32.2 engine answered them.
        let message = if body["autoStart"] == json!(false) {
            "machine is not running and autoStart is false"
        } else {
            "machine has saved execution; use resume"
        };
        let message = message.to_owned();
        return Some(api_error(StatusCode::CONFLICT, "CONFLICT", message));
    }
    if !matches!(
        machine["state"].as_str(),
        Some("created" | "stopped" | "failed")
    ) {
        return None;
    }
    if body["autoStart"] == json!(false) {
        return Some(api_error(
            StatusCode::CONFLICT,
            "CONFLICT",
            "machine is not running and autoStart is false".to_owned(),
        ));
    }
    machine["state"] = json!("running");
    // A boot: the values supplied so far are what it gets.
    let values = st.credential_values.get(name).cloned().unwrap_or_default();
    st.booted_values.insert(name.to_owned(), values);
    None
}

/// Now on the engine's clock.
fn engine_now(st: &FakeState) -> std::time::SystemTime {
    std::time::SystemTime::now() - st.engine_clock_behind
}

/// The refusals a command on the machine of `exec_path` (`/api/v1/machines/{name}/exec`) makes,
/// stamped now with microseconds, as the engine's log stamps them (the spec's example).
/// Each command counts in its machine's figures as the engine's MachineInfo reports them:
/// `cpuMillis` and `egressBytes` grow (counters since boot; egress only on a machine with a
/// network, as 1.32.2 reports it), `diskUsedMb` grows, `rssMb` is what it holds. The steps are
/// [`CONSUMPTION_STEP`]. Counted when the command has run (its answer is sent), as a real
/// command uses them while it runs, not when its request arrives.
fn count_consumption(st: &mut FakeState, exec_path: &str) {
    let Some(name) = exec_path.split('/').nth(4) else {
        return;
    };
    if let Some(Value::Object(info)) = st.machines.get_mut(name) {
        let networked = info.get("network") == Some(&json!(true))
            || info.get("allowedHosts").is_some_and(|h| !h.is_null())
            || info.get("allowedCidrs").is_some_and(|c| !c.is_null());
        for (field, step) in CONSUMPTION_STEP {
            if *field == "egressBytes" && !networked {
                continue;
            }
            let now = info.get(*field).and_then(Value::as_i64).unwrap_or(0);
            let next = if *field == "rssMb" { *step } else { now + step };
            info.insert((*field).to_owned(), json!(next));
        }
    }
}

/// How long a command "runs" before it counts in its machine's figures: a reading sent beside
/// the exec (as the server sends one) is answered first, as the engine answers it before the
/// command reaches the guest.
const COMMAND_RUNS: std::time::Duration = std::time::Duration::from_millis(20);

/// What one command adds to its machine's figures in the fake (`count_consumption`).
pub const CONSUMPTION_STEP: &[(&str, i64)] = &[
    ("cpuMillis", 40),
    ("rssMb", 96),
    ("diskUsedMb", 2),
    ("egressBytes", 1500),
];

fn record_denials_on_exec(st: &mut FakeState, exec_path: &str) {
    let Some(name) = exec_path.split('/').nth(4) else {
        return;
    };
    let mut denials = st.denials_on_exec.get(name).cloned().unwrap_or_default();
    denials.extend(st.denials_on_exec.get("*").cloned().unwrap_or_default());
    // Whole seconds, cut down, as the engine's virtio-net writer stamps them
    // (`format_rfc3339_seconds`; `2026-12-01T20:32:34Z` from the real 1.32.2 guest).
    let now = chrono::DateTime::<chrono::Utc>::from(engine_now(st))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let events = st.egress_events.entry(name.to_owned()).or_default();
    for (operation, dest) in denials {
        events.push(json!({"timestamp": now, "operation": operation, "dest": dest}));
    }
}

/// `POST .../exec` and `.../exec/stream` in guest-shell mode: the command really runs (see
/// `guest_shell`). `None` for any other request, and for a body or machine the engine refuses
/// before running anything, which the plain path answers as the engine does.
/// The guest paths a machine's disk holds in guest-root mode, as the host paths under `disk`:
/// the only guest paths the workspace's commands and the tests' use. (A guest has them at
/// these absolute paths; the fake's commands run on the host.)
pub fn guest_root_argv(disk: &std::path::Path, arg: &str) -> String {
    let _ = std::fs::create_dir_all(disk.join("var/tmp"));
    let _ = std::fs::create_dir_all(disk.join("workspace"));
    arg.replace("/var/tmp", &format!("{}/var/tmp", disk.display()))
        .replace("/workspace", &format!("{}/workspace", disk.display()))
        .replace("/etc/smol/", &format!("{}/etc/smol/", disk.display()))
}

/// A branch child's disk in guest-root mode: its source's, copied as it is.
pub fn copy_disk(root: &std::path::Path, source: &str, child: &str) {
    let (from, to) = (root.join(source), root.join(child));
    std::fs::create_dir_all(&from).unwrap();
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&from)
        .arg(&to)
        .status()
        .unwrap();
    assert!(copied.success(), "copying {source}'s disk");
}

async fn guest_exec(
    state: &Arc<Mutex<FakeState>>,
    shell: &Arc<GuestShell>,
    parts: &axum::http::request::Parts,
    bytes: &[u8],
    body: &Value,
) -> Option<Response> {
    if parts.method != Method::POST {
        return None;
    }
    let segments: Vec<String> = parts
        .uri
        .path()
        .trim_start_matches('/')
        .splitn(5, '/')
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    let seg: Vec<&str> = segments.iter().map(String::as_str).collect();
    let (name, streamed) = match seg.as_slice() {
        ["api", "v1", "machines", name, "exec"] => (name.to_string(), false),
        ["api", "v1", "machines", name, "exec/stream"] => (name.to_string(), true),
        _ => return None,
    };
    let argv: Vec<String> = body["command"]
        .as_array()?
        .iter()
        .map(|a| a.as_str().map(str::to_owned))
        .collect::<Option<_>>()?;
    if argv.is_empty() || unknown_field("ExecRequest", body).is_some() {
        return None;
    }
    {
        let mut st = state.lock().unwrap();
        st.machines.get(&name)?;
        st.requests
            .push(envelope(&parts.method, &parts.uri, &parts.headers, bytes));
        // `autoStart` (default true) starts a stopped machine for the command; without it a
        // machine that is not running is refused (the live exec handler's `require_running`
        // in smolvm 1.32.2's exec.rs).
        if let Some(refused) = require_running(&mut st, &name, body) {
            return Some(refused);
        }
        let readiness_probe =
            argv[0] == "echo" && argv.get(1).is_some_and(|a| a.starts_with("ready-"));
        if !readiness_probe {
            record_denials_on_exec(&mut st, parts.uri.path());
        }
    }
    let body_env = with_lease_env(&state.lock().unwrap(), &name, body);
    let env = body_env["env"]
        .as_array()
        .map(|vars| {
            vars.iter()
                .filter_map(|v| {
                    Some((
                        v["name"].as_str()?.to_owned(),
                        v["value"].as_str()?.to_owned(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut env: Vec<(String, String)> = env;
    if let Some(bindings) = state.lock().unwrap().credentials.get(&name) {
        for (_, var, placeholder) in bindings {
            if !var.is_empty() {
                env.push((var.clone(), placeholder.clone()));
            }
        }
    }
    let disk = state
        .lock()
        .unwrap()
        .guest_root
        .clone()
        .map(|r| r.join(&name));
    let argv = match &disk {
        Some(disk) => argv.iter().map(|a| guest_root_argv(disk, a)).collect(),
        None => argv,
    };
    let workdir = body["workdir"].as_str().map(|w| match &disk {
        Some(disk) => guest_root_argv(disk, w),
        None => w.to_owned(),
    });
    let mut command = GuestCommand {
        argv,
        env,
        workdir,
        stdin: body["stdin"].as_str().map(|s| s.as_bytes().to_vec()),
        timeout: body["timeoutSecs"]
            .as_u64()
            .map(std::time::Duration::from_secs),
    };
    if streamed {
        // The stream handler reads neither `stdin` nor `background` (smolvm 1.32.2 exec.rs
        // `exec_stream`).
        command.stdin = None;
        let streams = state.lock().unwrap().streams.clone();
        return Some(live_sse_response(
            stream_events(shell, &name, command),
            streams,
        ));
    }
    if body["background"] == json!(true) {
        return Some(match shell.spawn_background(&name, &command) {
            Ok(pid) => axum::Json(background_answer(pid)).into_response(),
            Err(e) => api_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "INTERNAL_ERROR",
                format!("agent operation failed: background exec: {e}"),
            ),
        });
    }
    let outcome = shell.run(&name, command, None).await;
    if outcome.stdout.len().max(outcome.stderr.len()) > ENGINE_OUTPUT_CAP {
        return Some(api_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL_ERROR",
            format!(
                "command output exceeded {ENGINE_OUTPUT_CAP} bytes and was truncated. Use streaming exec (exec_stream / execStream) for large output."
            ),
        ));
    }
    Some(
        axum::Json(exec_response(
            outcome.exit_code,
            &outcome.stdout,
            &outcome.stderr,
        ))
        .into_response(),
    )
}

// smolvm 1.32.2's fork pools and leases (facts: /work/notes/pools-findings.md, sections a–h,
// observed on the real engine; the messages are its words where the findings quote them).

fn now_secs(st: &FakeState) -> u64 {
    engine_now(st)
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The controller can fork the source: it is there, running (or frozen by its pool) and was
/// started forkable. A pool over any other source just does not fill (h1, h7).
fn source_usable(st: &FakeState, source: &str) -> bool {
    st.machines.get(source).is_some_and(|m| {
        matches!(m["state"].as_str(), Some("running" | "frozen")) && m["forkable"] == json!(true)
    })
}

/// The controller's reconcile, run before each request: due workers are made while their
/// source can be forked, and an active lease past its `expiresAt` expires and its worker goes.
pub fn pools_tick(st: &mut FakeState) {
    let now = std::time::Instant::now();
    let pools: Vec<String> = st.pools.keys().cloned().collect();
    for pool in pools {
        let source = st.pools[&pool].info["source"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if !source_usable(st, &source) {
            continue;
        }
        let p = st.pools.get_mut(&pool).unwrap();
        let due = p.pending.iter().filter(|t| **t <= now).count();
        p.pending.retain(|t| *t > now);
        for _ in 0..due {
            let worker = new_worker(st, &pool, &source);
            st.pools.get_mut(&pool).unwrap().ready.push(worker);
        }
    }
    let secs = now_secs(st);
    let expired: Vec<(String, String)> = st
        .leases
        .iter()
        .filter(|(_, l)| l.info["state"] == "active" && l.info["expiresAt"].as_u64() < Some(secs))
        .map(|(id, l)| (id.clone(), l.info["machine"].as_str().unwrap().to_owned()))
        .collect();
    for (id, machine) in expired {
        st.leases.get_mut(&id).unwrap().info["state"] = json!("expired");
        remove_worker(st, &machine);
    }
}

/// A fork of the source, parked held: `pool-<pool>-<8 hex>`, the pool's name cut to keep the
/// machine name within 128 characters (b).
fn new_worker(st: &mut FakeState, pool: &str, source: &str) -> String {
    let cut: String = pool.chars().take(128 - 14).collect();
    let name = format!("pool-{cut}-{:08x}", rand::random::<u32>());
    let mut info = machine_info(&name, "running");
    if let Some(src) = st.machines.get(source) {
        for key in [
            "image",
            "cpus",
            "memoryMb",
            "network",
            "storageGb",
            "overlayGb",
        ] {
            if let Some(v) = src.get(key) {
                info[key] = v.clone();
            }
        }
    }
    info["parentMachine"] = json!(source);
    info["forkpointHeld"] = json!(true);
    info["branchpointHeld"] = json!(true);
    st.machines.insert(name.clone(), info);
    name
}

/// Deletes a worker (its lease ended, its pool shrank or went).
fn remove_worker(st: &mut FakeState, machine: &str) {
    st.machines.remove(machine);
    if let Some(shell) = &st.guest_shell {
        shell.kill_machine(machine);
    }
    st.lease_env.remove(machine);
    for p in st.pools.values_mut() {
        p.ready.retain(|w| w != machine);
    }
}

fn leased(st: &FakeState, machine: &str) -> bool {
    st.leases
        .values()
        .any(|l| l.info["machine"] == machine && l.info["state"] == "active")
}

/// A machine went behind the pool's back (deleted, or a leased worker stopped; the caller
/// removes it): its lease fails with the engine's words (d, h8), and a pool that held it ready
/// makes a replacement.
fn worker_gone(st: &mut FakeState, machine: &str) {
    for lease in st.leases.values_mut() {
        if lease.info["machine"] == machine && lease.info["state"] == "active" {
            lease.info["state"] = json!("failed");
            lease.info["error"] = json!("leased worker process exited");
        }
    }
    let held: Vec<String> = st
        .pools
        .iter()
        .filter(|(_, p)| p.ready.iter().any(|w| w == machine))
        .map(|(n, _)| n.clone())
        .collect();
    st.lease_env.remove(machine);
    for pool in held {
        let p = st.pools.get_mut(&pool).unwrap();
        p.ready.retain(|w| w != machine);
        top_up(st, &pool, true);
    }
}

/// Orders workers until ready plus pending reach desiredReady: due at once, or after
/// `pool_fill_delay` when `delayed`.
fn top_up(st: &mut FakeState, pool: &str, delayed: bool) {
    let delay = if delayed {
        st.pool_fill_delay.unwrap_or_default()
    } else {
        std::time::Duration::ZERO
    };
    let at = std::time::Instant::now() + delay;
    let p = st.pools.get_mut(pool).unwrap();
    let desired = p.info["desiredReady"].as_u64().unwrap_or(0);
    while ((p.ready.len() + p.pending.len()) as u64) < desired {
        p.pending.push(at);
    }
    pools_tick(st);
}

/// ForkPoolInfo with every field the spec requires.
pub fn pool_info(st: &FakeState, pool: &str) -> Value {
    let p = &st.pools[pool];
    let active = st
        .leases
        .values()
        .filter(|l| l.info["pool"] == pool && l.info["state"] == "active")
        .count();
    let mut info = p.info.clone();
    info["ready"] = json!(p.ready.len());
    info["provisioning"] = json!(p.pending.len());
    info["active"] = json!(active);
    info["activating"] = json!(0);
    info["retiring"] = json!(0);
    info["deleting"] = json!(false);
    info
}

/// axum's `Json` rejection: plain-text 422 (h2).
fn rejected(detail: &str) -> Response {
    plain_text(
        StatusCode::UNPROCESSABLE_ENTITY,
        format!("Failed to deserialize the JSON body into the target type: {detail}"),
    )
}

fn bad_request(message: String) -> Response {
    api_error(StatusCode::BAD_REQUEST, "BAD_REQUEST", message)
}

fn conflict(message: String) -> Response {
    api_error(StatusCode::CONFLICT, "CONFLICT", message)
}

/// A body that is not a JSON object: axum's 422.
fn not_an_object(bytes: &[u8], body: &Value) -> Option<Response> {
    (!body.is_object()).then(|| {
        plain_text(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "Failed to parse the request body as JSON: {}",
                String::from_utf8_lossy(bytes)
            ),
        )
    })
}

/// An optional whole-number field: absent or null is `None`; anything else not a u64 is 422.
fn whole(body: &Value, key: &str) -> Result<Option<u64>, Box<Response>> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| Box::new(rejected(&format!("{key}: invalid type: {v}")))),
    }
}

/// `POST /api/v1/pools` (a).
fn create_pool(st: &mut FakeState, bytes: &[u8], body: &Value) -> Response {
    if let Some(refused) = not_an_object(bytes, body) {
        return refused;
    }
    // `golden` is an alias of `source` the spec does not list (h3).
    let mut body = body.clone();
    if let Some(golden) = body.as_object_mut().unwrap().remove("golden") {
        if body.get("source").is_some() {
            return rejected("duplicate field `source`");
        }
        body["source"] = golden;
    }
    if let Some(refused) = unknown_field("CreateForkPoolRequest", &body) {
        return refused;
    }
    if let Some(missing) = ["name", "source", "desiredReady"]
        .into_iter()
        .find(|k| body.get(*k).is_none())
    {
        return rejected(&format!("missing field `{missing}`"));
    }
    let (Some(name), Some(source)) = (body["name"].as_str(), body["source"].as_str()) else {
        return rejected("name, source: invalid type, expected a string");
    };
    let numbers = [
        "desiredReady",
        "leaseTtlSecs",
        "readyTimeoutSecs",
        "maxActive",
    ]
    .map(|k| whole(&body, k));
    let [desired, ttl, ready_timeout, max_active] = match numbers {
        [Ok(a), Ok(b), Ok(c), Ok(d)] => [a, b, c, d],
        _ => {
            return *numbers.into_iter().find_map(Result::err).unwrap();
        }
    };
    let refusal = if name.is_empty() {
        Some("pool name cannot be empty".to_owned())
    } else {
        name_refusal(name).map(|m| m.replace("machine name", "pool name"))
    };
    if let Some(message) = refusal {
        return bad_request(message);
    }
    let desired = desired.unwrap_or(0);
    if !(1..=256).contains(&desired) {
        return bad_request("desiredReady must be between 1 and 256".to_owned());
    }
    if ttl.is_some_and(|t| !(30..=86_400).contains(&t)) {
        return bad_request("lease TTL must be between 30 and 86400 seconds".to_owned());
    }
    if ready_timeout.is_some_and(|t| !(1..=3600).contains(&t)) {
        return bad_request("readyTimeoutSecs must be between 1 and 3600".to_owned());
    }
    if max_active == Some(0) {
        return bad_request("maxActive must be at least 1".to_owned());
    }
    let share_weights = body["shareWeights"] == json!(true);
    if body["autoAdmission"] == json!(true) && !share_weights {
        return bad_request("autoAdmission requires shareWeights".to_owned());
    }
    if st.pools.contains_key(name) {
        return conflict(format!("fork pool '{name}' already exists"));
    }
    let Some(src) = st.machines.get(source) else {
        return api_error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("machine '{source}' not found"),
        );
    };
    if src["parentMachine"].is_string() {
        return conflict("a fork clone cannot be used as a pool golden".to_owned());
    }
    // A frozen source is taken (nested 1.32.2), whether or not it can lease (see `acquire`).
    if src["state"] != "running" && src["state"] != "frozen" {
        return conflict(format!("golden machine '{source}' is not running"));
    }
    if share_weights && src["cuda"] != json!(true) {
        return conflict(format!(
            "golden machine '{source}' does not have CUDA enabled"
        ));
    }
    let freeze = body["freezeSource"] == json!(true);
    if freeze {
        st.machines.get_mut(source).unwrap()["state"] = json!("frozen");
    }
    let mut info = json!({
        "name": name, "source": source, "golden": source, "desiredReady": desired,
        "freezeSource": freeze, "leaseTtlSecs": ttl.unwrap_or(300),
        "autoAdmission": false, "shareWeights": share_weights, "createdAt": now_secs(st),
    });
    if let Some(max) = max_active {
        info["maxActive"] = json!(max);
    }
    st.pools.insert(
        name.to_owned(),
        FakePool {
            info,
            ready: Vec::new(),
            pending: Vec::new(),
            keys: BTreeMap::new(),
        },
    );
    top_up(st, name, false);
    axum::Json(pool_info(st, name)).into_response()
}

/// Everything under `/api/v1/pools/{pool}` (c, d, e).
fn pool_route(
    st: &mut FakeState,
    method: &str,
    pool: &str,
    rest: &[&str],
    query: Option<&str>,
    bytes: &[u8],
    body: &Value,
) -> Response {
    // The body is read before the pool is looked for.
    if method == "POST" && rest == ["leases"] {
        if let Some(refused) = not_an_object(bytes, body) {
            return refused;
        }
        if let Err(refused) = check_acquire(body) {
            return *refused;
        }
    }
    if method == "PUT" && rest == ["size"] {
        if let Some(refused) =
            not_an_object(bytes, body).or_else(|| unknown_field("ResizeForkPoolRequest", body))
        {
            return refused;
        }
        match whole(body, "desiredReady") {
            Ok(Some(n)) if n > 256 => {
                return bad_request("desiredReady must be at most 256".to_owned());
            }
            Ok(Some(_)) => {}
            Ok(None) => return rejected("missing field `desiredReady`"),
            Err(refused) => return *refused,
        }
    }
    if !st.pools.contains_key(pool) {
        return api_error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("fork pool '{pool}' not found"),
        );
    }
    let lease_of = |st: &FakeState, id: &str| {
        st.leases
            .get(id)
            .filter(|l| l.info["pool"] == pool)
            .map(|l| l.info.clone())
            .ok_or(id.to_owned())
    };
    let no_lease = |id: String| {
        api_error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("fork lease '{id}' not found"),
        )
    };
    match (method, rest) {
        ("GET", []) => axum::Json(pool_info(st, pool)).into_response(),
        ("DELETE", []) => {
            let active = pool_info(st, pool)["active"] != 0;
            if active && query_param(query, "force") != Some("true") {
                return conflict(format!(
                    "fork pool '{pool}' has active leases; complete them or use force=true"
                ));
            }
            let ids: Vec<String> = st
                .leases
                .iter()
                .filter(|(_, l)| l.info["pool"] == pool)
                .map(|(id, _)| id.clone())
                .collect();
            for id in ids {
                let lease = st.leases.remove(&id).unwrap();
                if lease.info["state"] == "active" {
                    remove_worker(st, lease.info["machine"].as_str().unwrap());
                }
            }
            for worker in st.pools.remove(pool).unwrap().ready {
                remove_worker(st, &worker);
            }
            axum::Json(json!({ "deleted": pool })).into_response()
        }
        ("PUT", ["size"]) => {
            let desired = body["desiredReady"].as_u64().unwrap();
            let p = st.pools.get_mut(pool).unwrap();
            p.info["desiredReady"] = json!(desired);
            let desired = usize::try_from(desired).unwrap();
            p.pending.truncate(desired.saturating_sub(p.ready.len()));
            let surplus: Vec<String> = p.ready.iter().skip(desired).cloned().collect();
            for worker in surplus {
                remove_worker(st, &worker);
            }
            top_up(st, pool, true);
            axum::Json(pool_info(st, pool)).into_response()
        }
        ("POST", ["leases"]) => acquire(st, pool, body),
        ("GET", ["leases", id]) => match lease_of(st, id) {
            Ok(info) => axum::Json(info).into_response(),
            Err(id) => no_lease(id),
        },
        ("POST", ["leases", id, "heartbeat"]) => {
            if let Err(id) = lease_of(st, id) {
                return no_lease(id);
            }
            let now = now_secs(st);
            let lease = st.leases.get_mut(*id).unwrap();
            if lease.info["state"] != "active" {
                return conflict(format!("fork lease '{id}' is no longer active"));
            }
            lease.info["expiresAt"] = json!(now + lease.ttl_secs);
            axum::Json(lease.info.clone()).into_response()
        }
        ("POST", ["leases", id, "complete"]) => {
            let info = match lease_of(st, id) {
                Ok(info) => info,
                Err(id) => return no_lease(id),
            };
            match info["state"].as_str().unwrap() {
                "completed" => axum::Json(info).into_response(),
                "active" => {
                    let lease = st.leases.get_mut(*id).unwrap();
                    lease.info["state"] = json!("completed");
                    let info = lease.info.clone();
                    remove_worker(st, info["machine"].as_str().unwrap());
                    axum::Json(info).into_response()
                }
                other => conflict(format!("fork lease '{id}' is '{other}', not active")),
            }
        }
        _ => api_error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("no route {method} /api/v1/pools/{pool}/{}", rest.join("/")),
        ),
    }
}

/// An acquire's body as the engine checks it before looking at the pool (c): unknown fields
/// are ignored.
fn check_acquire(body: &Value) -> Result<(), Box<Response>> {
    let key = match body.get("idempotencyKey") {
        None => return Err(Box::new(rejected("missing field `idempotencyKey`"))),
        Some(Value::String(key)) => key,
        Some(_) => {
            return Err(Box::new(rejected(
                "idempotencyKey: invalid type, expected a string",
            )));
        }
    };
    if key.is_empty() || key.len() > 256 || key.chars().any(char::is_control) {
        return Err(Box::new(bad_request(
            "idempotencyKey must be 1 to 256 bytes without control characters".to_owned(),
        )));
    }
    if whole(body, "ttlSecs")?.is_some_and(|t| !(30..=86_400).contains(&t)) {
        return Err(Box::new(bad_request(
            "lease TTL must be between 30 and 86400 seconds".to_owned(),
        )));
    }
    whole(body, "waitSecs")?;
    for var in body["env"].as_array().into_iter().flatten() {
        let var = var.as_str().unwrap_or_default();
        let (key, value) = var.split_once('=').unwrap_or((var, ""));
        let good_key = key
            .chars()
            .enumerate()
            .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()))
            && !key.is_empty();
        if !good_key || !var.contains('=') || value.contains('\n') {
            return Err(Box::new(bad_request(format!(
                "config operation failed: fork env: invalid key '{key}'"
            ))));
        }
    }
    let files = body["files"].as_array().cloned().unwrap_or_default();
    let mut total = 0;
    for file in &files {
        let path = file["path"].as_str().unwrap_or_default();
        let data = file["dataBase64"]
            .as_str()
            .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok());
        let bad_path = path.is_empty()
            || path.starts_with('/')
            || path.split('/').any(|c| c == ".." || c.is_empty());
        let Some(data) = data.filter(|_| !bad_path) else {
            return Err(Box::new(bad_request(format!(
                "invalid fork lease file '{path}'"
            ))));
        };
        total += data.len();
    }
    if files.len() > 32 || total > 1024 * 1024 {
        return Err(Box::new(bad_request(
            "fork lease files exceed 32 files or 1 MiB".to_owned(),
        )));
    }
    Ok(())
}

/// `POST /api/v1/pools/{pool}/leases`, the body already checked (c).
fn acquire(st: &mut FakeState, pool: &str, body: &Value) -> Response {
    let key = body["idempotencyKey"].as_str().unwrap().to_owned();
    let ttl = body["ttlSecs"]
        .as_u64()
        .or_else(|| st.pools[pool].info["leaseTtlSecs"].as_u64())
        .unwrap_or(300);
    let env: Vec<String> = body["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    let asked = json!({"env": env, "files": body["files"].as_array().cloned().unwrap_or_default(), "ttlSecs": ttl});
    // A key is replayed whatever its lease's state now (h5).
    if let Some((was, id)) = st.pools[pool].keys.get(&key) {
        if *was != asked {
            return conflict(
                "idempotencyKey was already used with a different assignment, payload, or TTL"
                    .to_owned(),
            );
        }
        return axum::Json(st.leases[id].info.clone()).into_response();
    }
    let info = pool_info(st, pool);
    if let Some(max) = info["maxActive"].as_u64()
        && info["active"].as_u64() >= Some(max)
    {
        return conflict(format!(
            "fork pool '{pool}' reached active lease limit ({max})"
        ));
    }
    let p = st.pools.get_mut(pool).unwrap();
    if p.ready.is_empty() {
        return api_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            format!("fork pool '{pool}' has no clean worker ready"),
        );
    }
    let worker = p.ready.remove(0);
    let golden = p.info["golden"].as_str().unwrap_or_default().to_owned();
    if st.frozen_off_branchpoint.contains(&golden) {
        // The worker is consumed and replaced, as the nested engine did.
        st.machines.remove(&worker);
        st.pools
            .get_mut(pool)
            .unwrap()
            .pending
            .push(std::time::Instant::now());
        return api_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL_ERROR",
            format!(
                "pool worker was consumed and will be replaced after activation failed: agent operation failed: activate held fork: clone '{worker}' is not parked at a forkpoint"
            ),
        );
    }
    let p = st.pools.get_mut(pool).unwrap();
    let id = format!("lease-{:016x}", rand::random::<u64>());
    p.keys.insert(key, (asked, id.clone()));
    let machine = st.machines.get_mut(&worker).unwrap();
    machine["forkpointHeld"] = json!(false);
    machine["branchpointHeld"] = json!(false);
    if !env.is_empty() {
        st.lease_env.insert(worker.clone(), env);
    }
    // Files land under `/workspace` (`/storage/workspace` in the guest).
    for file in body["files"].as_array().into_iter().flatten() {
        let data = base64::engine::general_purpose::STANDARD
            .decode(file["dataBase64"].as_str().unwrap())
            .unwrap();
        let path = format!("workspace/{}", file["path"].as_str().unwrap());
        st.files.insert((worker.clone(), path), data);
    }
    let now = now_secs(st);
    let info = json!({
        "id": id, "pool": pool, "machine": worker, "state": "active",
        "createdAt": now, "expiresAt": now + ttl,
    });
    st.leases.insert(
        id,
        FakeLease {
            info: info.clone(),
            ttl_secs: ttl,
        },
    );
    // Each acquire orders one replacement at once (d).
    top_up(st, pool, true);
    axum::Json(info).into_response()
}

/// An acquire with `waitSecs` blocks until the pool has a ready worker (or the key is a
/// replay, or the pool is at its active limit, or gone), for up to that long (c); the lock is
/// not held meanwhile.
async fn wait_for_worker(
    state: &Arc<Mutex<FakeState>>,
    parts: &axum::http::request::Parts,
    body: &Value,
) {
    let path = parts.uri.path();
    let Some(pool) = path
        .strip_prefix("/api/v1/pools/")
        .and_then(|p| p.strip_suffix("/leases"))
    else {
        return;
    };
    let Some(wait) = body["waitSecs"].as_u64().filter(|w| *w > 0) else {
        return;
    };
    if parts.method != Method::POST {
        return;
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(wait);
    loop {
        let done = {
            let mut st = state.lock().unwrap();
            pools_tick(&mut st);
            match st.pools.get(pool) {
                None => true,
                Some(p) => {
                    let info = pool_info(&st, pool);
                    let full = info["maxActive"]
                        .as_u64()
                        .is_some_and(|m| info["active"].as_u64() >= Some(m));
                    !p.ready.is_empty()
                        || full
                        || body["idempotencyKey"]
                            .as_str()
                            .is_some_and(|k| p.keys.contains_key(k))
                }
            }
        };
        if done || tokio::time::Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// An exec body with the lease's env in front of the request's own (`ExecRequest.env` is
/// `[{name, value}]`), as a leased worker's later execs see it (c).
fn with_lease_env(st: &FakeState, machine: &str, body: &Value) -> Value {
    let Some(vars) = st.lease_env.get(machine) else {
        return body.clone();
    };
    let mut env: Vec<Value> = vars
        .iter()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some(json!({"name": k, "value": v}))
        })
        .collect();
    env.extend(body["env"].as_array().cloned().unwrap_or_default());
    let mut body = body.clone();
    body["env"] = Value::Array(env);
    body
}
