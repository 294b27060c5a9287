//! The local fleet: `smolvm serve` on this host, through the generated smolvm client.

use super::FleetApi;
use super::error::{ErrorKind, FleetError, FleetResult};
use super::file_stream::FileStream;
use super::model::{
    CreateSpec, Deleted, Egress, EgressDenial, ExecOutput, ExecSpec, FleetKind, LogPage, Machine,
    PublishedPort, PulledImage, epoch_to_rfc3339,
};
use super::transport::LocalEndpoint;
use super::upstream::{send, send_raw, within};
use crate::generated::smolvm::{self, types};
use base64::Engine as _;
use futures::{StreamExt, TryStreamExt};
use std::time::Duration;

/// The engine ends every request on its machine routes (create, list, get, start, fork, stop,
/// delete, exec, files, images) after 300 s with a 408 and an empty body, whatever is still going
/// on behind it: a guest command keeps running (smolvm src/api/mod.rs, `API_REQUEST_TIMEOUT_SECS`
/// and its `TimeoutLayer`). Logs are outside it.
pub const ENGINE_REQUEST_DEADLINE: Duration = Duration::from_secs(300);
/// Waiting this much past the engine's deadline lets its 408, which says what happened, arrive
/// before this server's own deadline would.
const PAST_ENGINE_DEADLINE: Duration = Duration::from_secs(10);
/// The longest command timeout a local exec accepts: the engine's deadline less the time it needs
/// to reach the guest and answer (an auto-start boot takes more, and then the engine's own
/// timeout, which keeps the output, may lose to its request deadline, which keeps nothing).
/// Longer commands are to go through a long-work route (a later issue); until then, refused.
pub const MAX_EXEC_TIMEOUT_SECS: u64 = 290;
/// The largest upload the engine takes (smolvm src/api/handlers/files.rs `upload_file`,
/// `MAX_FILE_UPLOAD_BYTES`; "MiB upload limit" in the 1.32.2 binary): over it, a 413 in plain
/// text "file exceeds the 100 MiB upload limit".
pub const MAX_UPLOAD_BYTES: u64 = 100 * 1024 * 1024;
/// Each stream of an exec is capped at this many bytes in the guest agent: past it the VM path
/// answers 500 "command output exceeded ..." ("command output exceeded " / " bytes and was
/// truncated. Use streaming exec (exec_stream / execStream) for large output." in the 1.32.2
/// agent, `strings usr/local/bin/smolvm-agent`), and the container path stops reading.
pub const ENGINE_OUTPUT_CAP_BYTES: u64 = 11 * 1024 * 1024;

// Deadlines per call. Start and branch may pull and boot; exec adds its own timeout. Those the
// engine bounds end just past its deadline.
const DEFAULT: Duration = Duration::from_secs(60);
const START: Duration = ENGINE_REQUEST_DEADLINE.saturating_add(PAST_ENGINE_DEADLINE);
const STOP_DELETE: Duration = Duration::from_secs(120);
const LOGS: Duration = Duration::from_secs(15);
const PULL: Duration = START;
const HEALTH: Duration = Duration::from_secs(2);
/// The engine reads egress events from a local file: an answer slower than this is not worth
/// holding a command's result for.
const EGRESS_EVENTS: Duration = Duration::from_secs(5);
/// The workload of a machine created with `keep_running`: images whose own command exits at
/// once (alpine's shell, most language images) would otherwise stop the machine before any exec.
const KEEPALIVE: &[&str] = &["sh", "-c", "while true; do sleep 3600; done"];
/// What an exec without its own timeout may take, and the slack added to one that has one.
const EXEC_DEFAULT_SECS: u64 = 120;
const EXEC_SLACK: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct LocalFleet {
    client: smolvm::Client,
    endpoint: LocalEndpoint,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub status: String,
    /// The release (`1.32.2`), unlike the spec's `info.version`.
    pub version: String,
}

impl LocalFleet {
    pub fn new(endpoint: LocalEndpoint) -> FleetResult<Self> {
        let client = smolvm::Client::new_with_client(&endpoint.base_url(), endpoint.http_client()?);
        Ok(LocalFleet { client, endpoint })
    }

    pub fn endpoint(&self) -> &LocalEndpoint {
        &self.endpoint
    }

    pub async fn health(&self) -> FleetResult<Health> {
        let h = send("health", HEALTH, self.client.health().send()).await?;
        Ok(Health {
            status: h.status,
            version: h.version,
        })
    }
}

#[async_trait::async_trait]
impl FleetApi for LocalFleet {
    fn kind(&self) -> FleetKind {
        FleetKind::Local
    }

    async fn list(&self) -> FleetResult<Vec<Machine>> {
        let list = send("list machines", DEFAULT, self.client.list_machines().send()).await?;
        Ok(list.machines.into_iter().map(view).collect())
    }

    async fn get(&self, name: &str) -> FleetResult<Machine> {
        let ctx = format!("get machine {name}");
        let info = send(&ctx, DEFAULT, self.client.get_machine().name(name).send()).await?;
        Ok(view(info))
    }

    async fn create(&self, spec: &CreateSpec) -> FleetResult<Machine> {
        let ctx = format!("create machine {}", spec.name);
        let request = self.client.create_machine().body(create_body(spec));
        Ok(view(send(&ctx, DEFAULT, request.send()).await?))
    }

    /// Locally, branchability is chosen at each start: a machine started without it cannot be
    /// branched until it is stopped and started again with it. `None` keeps what it had.
    ///
    /// The engine answers a start of a running machine with its record unchanged, branchable
    /// or not (observed on 1.32.2, the issue "Fakes that behave like the engine"; guests cannot
    /// boot here to check it again), so asking a running machine to become branchable is
    /// refused before the engine is asked: otherwise the start looks done and the branch after
    /// it fails. Not stopped and started here: a stop loses the guest's memory and processes,
    /// which the caller should choose.
    async fn start(&self, name: &str, branchable: Option<bool>) -> FleetResult<Machine> {
        let branchable = match branchable {
            Some(false) => false,
            wanted => {
                let machine = self.get(name).await?;
                if wanted == Some(true) && machine.is_running() && !machine.branchable {
                    return Err(FleetError::new(
                        ErrorKind::Conflict,
                        format!("start machine {name}"),
                        format!(
                            "branchable: {name} is running and was not started branchable, and \
                             a running machine cannot become branchable; stop-machine, then \
                             start-machine with branchable true"
                        ),
                    ));
                }
                wanted.unwrap_or(machine.branchable)
            }
        };
        let ctx = format!("start machine {name}");
        let body = types::StartMachineRequest {
            branchable: branchable.then_some(true),
            ..Default::default()
        };
        let mut request = self.client.start_machine().name(name).body(body);
        if branchable {
            // 1.32.2 documents `branchable` in the body; the `forkable` query is what the
            // engine's own refusal names ("start it with --forkable") and what earlier
            // releases read. Both ask for the same thing.
            request = request.forkable(true);
        }
        let answer = send(&ctx, START, request.send()).await;
        Ok(view(answer.map_err(|e| {
            deadline_passed(
                e,
                "the machine may still be starting: get-machine shows its state",
            )
        })?))
    }

    async fn stop(&self, name: &str) -> FleetResult<Machine> {
        let ctx = format!("stop machine {name}");
        let request = self.client.stop_machine().name(name);
        Ok(view(send(&ctx, STOP_DELETE, request.send()).await?))
    }

    async fn delete(&self, name: &str) -> FleetResult<Deleted> {
        let ctx = format!("delete machine {name}");
        let request = self.client.delete_machine().name(name);
        let answer = send(&ctx, STOP_DELETE, request.send()).await?;
        Ok(Deleted {
            deleted: answer.deleted,
            usage_micros: None,
        })
    }

    /// `cascade=true`: the engine deletes the clones forked from the machine first (smolvm
    /// src/api/handlers/machines.rs `delete_machine`, and `DeleteQuery.cascade` in the 1.32.2
    /// spec).
    async fn delete_with_clones(&self, name: &str) -> FleetResult<Deleted> {
        let ctx = format!("delete machine {name} and its clones");
        let request = self.client.delete_machine().name(name).cascade(true);
        let answer = send(&ctx, STOP_DELETE, request.send()).await?;
        Ok(Deleted {
            deleted: answer.deleted,
            usage_micros: None,
        })
    }

    async fn exec(&self, name: &str, spec: &ExecSpec) -> FleetResult<ExecOutput> {
        let ctx = format!("exec in {name}");
        let limit = exec_limit(&ctx, spec)?;
        let request = self.client.exec_command().id(name).body(exec_body(spec));
        let out = send(&ctx, limit, request.send()).await.map_err(|e| {
            output_over_cap(deadline_passed(
                e,
                "the command may still be running in the guest",
            ))
        })?;
        Ok(ExecOutput {
            exit_code: out.exit_code,
            stdout: exact_bytes(&out.stdout_b64, out.stdout),
            stderr: exact_bytes(&out.stderr_b64, out.stderr),
            stdout_cut_upstream: false,
            stderr_cut_upstream: false,
        })
    }

    /// `exec/stream` answers while the command runs: 1.32.2 forwards each event of the guest
    /// agent as it comes (smolvm src/api/handlers/exec.rs `exec_stream`, an unbounded channel
    /// drained by `async_stream`; the version that collected every event first predates
    /// 1.32.2's `autoStart` and `stdoutB64`). The handler reads neither `stdin` nor
    /// `background`, so a command with stdin goes through the plain exec.
    async fn exec_streamed(
        &self,
        name: &str,
        spec: &ExecSpec,
        output: &super::OutputSender,
    ) -> FleetResult<ExecOutput> {
        if spec.stdin.is_some() {
            return self.exec(name, spec).await;
        }
        let ctx = format!("exec in {name}");
        let limit = exec_limit(&ctx, spec)?;
        let request = self.client.exec_stream().id(name).body(exec_body(spec));
        within(&ctx, limit, async {
            let body = send(&ctx, limit, request.send()).await?;
            super::exec_stream::read_exec_stream(&ctx, body.into_inner(), output, |e| {
                super::upstream::transport(&ctx, e)
            })
            .await
        })
        .await
        .map_err(|e| deadline_passed(e, "the command may still be running in the guest"))
    }

    async fn read_file(&self, name: &str, path: &str) -> FleetResult<FileStream> {
        let ctx = format!("read {path} in {name}");
        let request = self.client.download_file().id(name).path(path).send();
        let response = send_raw(&ctx, DEFAULT, request).await.map_err(|e| {
            missing_file(
                deadline_passed(e, "the read may still be going on in the guest"),
                path,
            )
        })?;
        // A directory answers a JSON listing under the same 200 (override
        // local-download-returns-bytes); a file is octet-stream.
        let header = |name| {
            response
                .headers()
                .get(name)
                .and_then(|v: &reqwest::header::HeaderValue| v.to_str().ok())
        };
        if header(reqwest::header::CONTENT_TYPE).is_some_and(|v| v.starts_with("application/json"))
        {
            return Err(FleetError::new(
                ErrorKind::Invalid,
                ctx,
                format!("{path} is a directory; read-file reads files"),
            ));
        }
        let size = header(reqwest::header::CONTENT_LENGTH).and_then(|v| v.parse().ok());
        let chunks = response
            .into_inner()
            .into_inner()
            .map(move |chunk| chunk.map_err(|e| super::upstream::transport(&ctx, &e)))
            .boxed();
        Ok(FileStream { size, chunks })
    }

    async fn write_file(&self, name: &str, path: &str, bytes: Vec<u8>) -> FleetResult<u64> {
        let ctx = format!("write {path} in {name}");
        let len = bytes.len() as u64;
        check_upload_size(&ctx, len)?;
        let request = self.client.upload_file().id(name).path(path).body(bytes);
        let answer = send(&ctx, DEFAULT + transfer_time(len), request.send())
            .await
            .map_err(|e| deadline_passed(e, "the write may still be going on in the guest"))?;
        Ok(u64::try_from(answer.size).unwrap_or(len))
    }

    async fn branch(&self, source: &str, child: &str, branchable: bool) -> FleetResult<Machine> {
        let ctx = format!("branch machine {source} into {child}");
        let body = types::ForkRequest {
            branchable: branchable.then_some(true),
            env: Vec::new(),
            freeze_source: None,
            hold: None,
            labels: Default::default(),
            name: child.to_owned(),
            ports: Vec::new(),
            ready_timeout_secs: None,
            secrets: Default::default(),
            share_weights: None,
            wait_ready: None,
        };
        let request = self.client.branch_machine().name(source).body(body);
        let answer = send(&ctx, START, request.send()).await;
        Ok(view(answer.map_err(|e| {
            deadline_passed(
                e,
                "the branch may still be made: list-machines shows it if it was",
            )
        })?))
    }

    /// The guest console. Without a usable cursor: the last `tail` lines. With one: what
    /// arrived after the cursor's last lines, found by content in the newest lines the engine
    /// gives (see [`page_after_anchor`]).
    async fn logs(&self, name: &str, tail: usize, cursor: Option<&str>) -> FleetResult<LogPage> {
        let ctx = format!("logs of {name}");
        let anchor = cursor.and_then(Anchor::parse);
        // The engine reads `tail` like `tail -n` (0 is no line at all) and refuses more than
        // 10000; without `tail` and without follow it sends only the first 64 KiB of the log
        // (smolvm 1.32.2, src/api/handlers/machines.rs; "tail value .. exceeds maximum of" in
        // the binary). So ask for exactly the lines wanted, and with a cursor for the most the
        // engine gives.
        let want = match anchor {
            Some(_) => ENGINE_MAX_TAIL,
            None => tail.clamp(1, ENGINE_MAX_TAIL),
        };
        let lines = within(&ctx, LOGS, async {
            let request = self
                .client
                .stream_logs()
                .id(name)
                .follow(false)
                .tail(want as u64);
            let stream = send(&ctx, LOGS, request.send()).await?;
            let bytes = collect(&ctx, stream).await?;
            Ok(sse_data_lines(&String::from_utf8_lossy(&bytes)))
        })
        .await?;
        Ok(match anchor {
            Some(anchor) => page_after_anchor(lines, &anchor),
            None => tail_page(lines, tail),
        })
    }

    async fn pull_image(&self, name: &str, image: &str) -> FleetResult<PulledImage> {
        let ctx = format!("pull {image} into {name}");
        let body = types::PullImageRequest {
            image: image.to_owned(),
            no_proxy: None,
            oci_platform: None,
            proxy: None,
        };
        let request = self.client.pull_image().id(name).body(body);
        let i = send(&ctx, PULL, request.send())
            .await
            .map_err(|e| deadline_passed(e, "the pull may still be going on in the machine"))?
            .image;
        Ok(PulledImage {
            reference: i.reference,
            digest: Some(i.digest),
            size: Some(i.size),
            architecture: Some(i.architecture),
            os: Some(i.os),
            layer_count: i64::try_from(i.layer_count).ok(),
        })
    }

    /// `GET .../egress-events`: the engine reads the refusals from the machine's VMM log
    /// (`egress-denials.log` in its state directory), where libkrun writes `egress policy denied
    /// connect to <addr>` / `... sendto <addr>` with the address as `ip:port` (smol-machines/libkrun
    /// src/devices/src/virtio/vsock/muxer.rs). Oldest first, the newest `limit` kept; empty for a
    /// machine with no policy or one that never booted. A timestamp is RFC 3339 as logged, or
    /// empty when the line had none (observed on the real 1.32.2 serve: tests/real_serve.rs).
    async fn egress_denials(&self, name: &str, limit: u32) -> FleetResult<Vec<EgressDenial>> {
        let ctx = format!("egress events of {name}");
        let request = self
            .client
            .get_machine_egress_events()
            .name(name)
            .limit(u64::from(limit));
        let answer = send(&ctx, EGRESS_EVENTS, request.send()).await?;
        Ok(answer
            .events
            .into_iter()
            .map(|e| EgressDenial {
                at: chrono::DateTime::parse_from_rfc3339(&e.timestamp)
                    .ok()
                    .map(std::time::SystemTime::from),
                operation: e.operation,
                dest: e.dest,
            })
            .collect())
    }
}

/// How long an exec may take in all: its own timeout and some slack, within the engine's
/// request deadline.
fn exec_limit(ctx: &str, spec: &ExecSpec) -> FleetResult<Duration> {
    // The tools refuse this first, naming the argument; this keeps any other caller from
    // sending a command the engine's request deadline would cut off without its output.
    if let Some(secs) = spec.timeout_secs.filter(|&s| s > MAX_EXEC_TIMEOUT_SECS) {
        return Err(FleetError::new(
            ErrorKind::Refused,
            ctx,
            exec_timeout_refusal(secs),
        ));
    }
    Ok(
        (Duration::from_secs(spec.timeout_secs.unwrap_or(EXEC_DEFAULT_SECS)) + EXEC_SLACK)
            .min(START),
    )
}

/// The body of both exec routes (`exec` and `exec/stream` take the same `ExecRequest`).
fn exec_body(spec: &ExecSpec) -> types::ExecRequest {
    types::ExecRequest {
        // 1.32.2 starts a stopped machine for the command, as the cloud does, unless told not to.
        auto_start: spec.start_if_stopped,
        // Sent only when set, so every foreground body stays as it was.
        background: spec.background.then_some(true),
        command: spec.command.argv(),
        env: env_list(&spec.env),
        secrets: Default::default(),
        stdin: spec.stdin.clone(),
        timeout_secs: spec.timeout_secs.map(clamp_i64),
        user: None,
        workdir: spec.workdir.clone(),
    }
}

/// Why a command timeout is too long for the local engine, and what to do instead.
pub fn exec_timeout_refusal(secs: u64) -> String {
    format!(
        "{secs} s is longer than the local engine allows: it ends every request after {} s \
         (its request deadline), and a command needs some of that to start and answer, so give \
         at most {MAX_EXEC_TIMEOUT_SECS}. Start longer work as a background job (run-command with background: true) \
         and follow it with job-output",
        ENGINE_REQUEST_DEADLINE.as_secs()
    )
}

/// Refuses an upload the engine would refuse (see [`MAX_UPLOAD_BYTES`]) before it is sent.
pub fn check_upload_size(ctx: &str, len: u64) -> FleetResult<()> {
    if len > MAX_UPLOAD_BYTES {
        return Err(FleetError::new(
            ErrorKind::Invalid,
            ctx,
            upload_refusal(len),
        ));
    }
    Ok(())
}

/// Why an upload is too large for the local engine, and what to do instead.
pub fn upload_refusal(len: u64) -> String {
    format!(
        "{len} bytes is over the local engine's {} MiB upload limit; write it in parts under the \
         limit and join them with run-command (`cat /tmp/part.* > /path/file`)",
        MAX_UPLOAD_BYTES >> 20
    )
}

/// The engine's 408: its request deadline passed (see [`ENGINE_REQUEST_DEADLINE`]). It answers
/// with an empty body, which alone reads as "empty answer"; `meanwhile` says what may still be
/// going on behind it.
fn deadline_passed(mut e: FleetError, meanwhile: &str) -> FleetError {
    if e.status == Some(408) {
        e.kind = ErrorKind::Timeout;
        e.message = format!(
            "the engine's request deadline ({} s) passed before it answered; {meanwhile}",
            ENGINE_REQUEST_DEADLINE.as_secs()
        );
    }
    e
}

/// The engine's 500 for an exec whose output passed its cap (see [`ENGINE_OUTPUT_CAP_BYTES`]):
/// none of the output comes back, so say how to get it.
fn output_over_cap(mut e: FleetError) -> FleetError {
    if e.status == Some(500) && e.message.contains("command output exceeded") {
        e.message = format!(
            "the command's output passed the engine's cap of {} MiB per stream, so none of it \
             came back (the engine: {}). Send the output to a file in the machine \
             (`... > /tmp/out.txt 2>&1`) and page through it with read-file",
            ENGINE_OUTPUT_CAP_BYTES >> 20,
            e.message
        );
    }
    e
}

/// A read of a path that does not exist: a 500 "No such file or directory" in the engine's
/// source (src/api/handlers/files.rs passes the agent's error on), a 404 in 1.32.2's spec. Both
/// become NOT_FOUND naming the path; a 404 for the machine itself keeps the engine's words.
fn missing_file(mut e: FleetError, path: &str) -> FleetError {
    let no_such_file = e.message.contains("No such file or directory")
        || e.message.contains("os error 2")
        || (e.status == Some(404) && !e.message.contains("machine '"));
    if no_such_file && matches!(e.status, Some(404 | 500)) {
        e.kind = ErrorKind::NotFound;
        e.message = format!("{path} does not exist in the machine ({})", e.message);
    }
    e
}

fn clamp_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn clamp_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Time allowed to move `len` bytes, on top of the base deadline (at least 1 MiB/s).
pub(crate) fn transfer_time(len: u64) -> Duration {
    Duration::from_secs(len / (1024 * 1024))
}

pub(crate) fn create_body(spec: &CreateSpec) -> types::CreateMachineRequest {
    let (network, hosts, cidrs) = match &spec.egress {
        Egress::Open => (true, None, None),
        Egress::Blocked => (false, None, None),
        Egress::Allow { hosts, cidrs } => (
            false,
            (!hosts.is_empty()).then(|| hosts.clone()),
            (!cidrs.is_empty()).then(|| cidrs.clone()),
        ),
    };
    types::CreateMachineRequest {
        name: Some(spec.name.clone()),
        image: Some(spec.image.clone()),
        cpus: Some(clamp_i32(spec.cpus)),
        memory_mb: Some(clamp_i32(spec.memory_mb)),
        network: Some(network),
        allowed_hosts: hosts,
        allowed_cidrs: cidrs,
        cmd: if spec.keep_running {
            KEEPALIVE.iter().map(|s| s.to_string()).collect()
        } else {
            Vec::new()
        },
        env: env_list(&spec.env),
        ports: spec
            .ports
            .iter()
            .map(|p| types::PortSpec {
                guest: i32::from(p.guest),
                host: i32::from(p.host.unwrap_or(p.guest)),
                protocol: None,
            })
            .collect(),
        mounts: spec
            .mounts
            .iter()
            .map(|m| types::MountSpec {
                source: m.source.clone(),
                target: m.target.clone(),
                readonly: m.readonly.then_some(true),
                staged: None,
            })
            .collect(),
        storage_gb: spec.storage_gb.map(i64::from),
        overlay_gb: spec.overlay_gb.map(i64::from),
        ..Default::default()
    }
}

/// The engine takes env as a list of pairs; the shared vocabulary keeps a map.
fn env_list(env: &std::collections::BTreeMap<String, String>) -> Vec<types::EnvVar> {
    env.iter()
        .map(|(name, value)| types::EnvVar {
            name: name.clone(),
            value: value.clone(),
        })
        .collect()
}

fn view(info: types::MachineInfo) -> Machine {
    let hosts = info.allowed_hosts.unwrap_or_default();
    let cidrs = info.allowed_cidrs.unwrap_or_default();
    let network = if !hosts.is_empty() || !cidrs.is_empty() {
        Egress::Allow { hosts, cidrs }
    } else if info.network {
        Egress::Open
    } else {
        Egress::Blocked
    };
    Machine {
        id: info.name.clone(),
        name: info.name,
        state: info.state,
        cpus: u32::try_from(info.cpus).ok(),
        memory_mb: u32::try_from(info.memory_mb).ok(),
        network: network.describe(),
        image: info.image,
        url: None,
        pid: info.pid.map(i64::from),
        created_at: epoch_to_rfc3339(info.created_at),
        branchable: info.branchable || info.forkable,
        ports: info
            .ports
            .into_iter()
            .filter_map(|p| {
                Some(PublishedPort {
                    guest: u16::try_from(p.guest).ok()?,
                    host: u16::try_from(p.host).ok(),
                })
            })
            .collect(),
        upstream_ready: None,
    }
}

/// The b64 twin is byte-exact; the text field is a lossy UTF-8 rendering.
fn exact_bytes(b64: &str, text: String) -> Vec<u8> {
    match base64::engine::general_purpose::STANDARD.decode(b64) {
        Ok(bytes) if !bytes.is_empty() || text.is_empty() => bytes,
        _ => text.into_bytes(),
    }
}

async fn collect(ctx: &str, stream: progenitor_client::ByteStream) -> FleetResult<Vec<u8>> {
    let mut out = Vec::new();
    let mut inner = stream.into_inner();
    while let Some(chunk) = inner
        .try_next()
        .await
        .map_err(|e| super::upstream::transport(ctx, &e))?
    {
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// The `data:` lines of a server-sent-event body, each without its prefix and one leading space.
pub(crate) fn sse_data_lines(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|data| data.strip_prefix(' ').unwrap_or(data).to_owned())
        .collect()
}

/// The most lines the engine's log route returns (`tail` over it is a 400).
const ENGINE_MAX_TAIL: usize = 10_000;
/// How many of a page's last lines its cursor remembers: enough that a line the guest repeats
/// (a prompt, a heartbeat) rarely makes two places look alike.
const ANCHOR_LINES: usize = 4;

/// Where a cursor left off, by content: the hash of the last `count` lines it saw. A line count
/// from the start of the log would not do: the engine gives at most its newest 10000 lines, so
/// a position counted in one window means nothing in the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Anchor {
    count: usize,
    hash: u64,
}

impl Anchor {
    fn of(lines: &[String]) -> Anchor {
        let seen = &lines[lines.len().saturating_sub(ANCHOR_LINES)..];
        Anchor {
            count: seen.len(),
            hash: fnv1a(seen),
        }
    }

    /// `c:<count>:<hash>`; anything else (the line-count cursors of earlier releases, a cloud
    /// cursor) is no cursor.
    pub(crate) fn parse(cursor: &str) -> Option<Anchor> {
        let (count, hash) = cursor.strip_prefix("c:")?.split_once(':')?;
        let count = count.parse().ok().filter(|&c| c <= ANCHOR_LINES)?;
        let hash = u64::from_str_radix(hash, 16).ok()?;
        Some(Anchor { count, hash })
    }

    fn cursor(&self) -> String {
        format!("c:{}:{:016x}", self.count, self.hash)
    }
}

/// FNV-1a over the lines, each ended by a newline: stable across releases and processes, which
/// a cursor handed to a client needs (std's hasher is neither).
fn fnv1a(lines: &[String]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in lines
        .iter()
        .flat_map(|l| l.bytes().chain(std::iter::once(b'\n')))
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// The last `tail` lines, with a cursor at their end.
pub(crate) fn tail_page(lines: Vec<String>, tail: usize) -> LogPage {
    let lines: Vec<String> = lines
        .into_iter()
        .rev()
        .take(tail)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    LogPage {
        cursor: Anchor::of(&lines).cursor(),
        lines,
        gap: false,
    }
}

/// The lines after the newest place in `window` whose lines hash to the anchor. An anchor of no
/// line (a first page of an empty log) takes the whole window. An anchor not found (its lines
/// rolled out of the engine's newest 10000, or the log was rotated) takes the whole window too,
/// and says there may be a gap.
pub(crate) fn page_after_anchor(window: Vec<String>, anchor: &Anchor) -> LogPage {
    let start = if anchor.count == 0 {
        Some(0)
    } else {
        (anchor.count..=window.len())
            .rev()
            .find(|&end| fnv1a(&window[end - anchor.count..end]) == anchor.hash)
    };
    let gap = start.is_none();
    let lines: Vec<String> = window[start.unwrap_or(0)..].to_vec();
    // The next cursor remembers the newest lines of the window, not only of this page: a page
    // that is shorter than the anchor keeps the older lines that make it unique.
    let cursor = if window.is_empty() {
        anchor.cursor()
    } else {
        Anchor::of(&window).cursor()
    };
    LogPage { lines, cursor, gap }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_fit_the_engines_request_deadline() {
        // The engine's 408 arrives before this server gives up on start, fork and pull...
        assert!(START > ENGINE_REQUEST_DEADLINE && PULL > ENGINE_REQUEST_DEADLINE);
        // ...and not long after it: a pull no longer waits 600 s for an answer that ended at 300.
        assert!(START <= ENGINE_REQUEST_DEADLINE + Duration::from_secs(30));
        assert!(PULL <= ENGINE_REQUEST_DEADLINE + Duration::from_secs(30));
        // The longest command and the engine's time to answer it fit in the deadline.
        assert!(Duration::from_secs(MAX_EXEC_TIMEOUT_SECS) < ENGINE_REQUEST_DEADLINE);
    }

    #[test]
    fn the_engines_refusals_read_as_what_they_mean() {
        let mut e = FleetError::new(ErrorKind::Timeout, "exec in m", "empty answer");
        e.status = Some(408);
        let e = deadline_passed(e, "the command may still be running in the guest");
        assert_eq!(e.kind, ErrorKind::Timeout);
        assert!(e.message.contains("request deadline (300 s)"), "{e}");
        assert!(e.message.contains("may still be running"), "{e}");

        let mut e = FleetError::new(
            ErrorKind::Upstream,
            "read /nope in m",
            "agent operation failed: read file: /nope: No such file or directory",
        );
        e.status = Some(500);
        let e = missing_file(e, "/nope");
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(e.message.starts_with("/nope does not exist"), "{e}");
        let mut machine =
            FleetError::new(ErrorKind::NotFound, "read /a in m", "machine 'm' not found");
        machine.status = Some(404);
        assert_eq!(missing_file(machine.clone(), "/a"), machine);

        let too_big = check_upload_size("write /big in m", MAX_UPLOAD_BYTES + 1).unwrap_err();
        assert_eq!(too_big.kind, ErrorKind::Invalid);
        assert!(
            too_big.message.contains("100 MiB upload limit"),
            "{too_big}"
        );
        assert!(check_upload_size("write /ok in m", MAX_UPLOAD_BYTES).is_ok());
    }

    fn numbered(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("line {i}")).collect()
    }

    /// Lines `from..=to`, as the engine's window of its newest lines would hold them.
    fn window(from: usize, to: usize) -> Vec<String> {
        (from..=to).map(|i| format!("line {i}")).collect()
    }

    #[test]
    fn a_tailed_page_then_its_cursor_never_repeats_lines() {
        let first = tail_page(numbered(10), 3);
        assert_eq!(first.lines, ["line 8", "line 9", "line 10"]);
        let anchor = Anchor::parse(&first.cursor).unwrap();
        let next = page_after_anchor(numbered(12), &anchor);
        assert_eq!(next.lines, ["line 11", "line 12"]);
        assert!(!next.gap);
        let idle = page_after_anchor(numbered(12), &Anchor::parse(&next.cursor).unwrap());
        assert!(idle.lines.is_empty() && !idle.gap);
        assert_eq!(idle.cursor, next.cursor);
    }

    /// The engine gives at most its newest 10000 lines: a cursor must find its place in a
    /// window that has moved, which a count of lines from the start cannot.
    #[test]
    fn the_cursor_finds_its_place_in_a_moved_window() {
        let first = tail_page(window(1, 10_000), 5);
        let anchor = Anchor::parse(&first.cursor).unwrap();
        let moved = page_after_anchor(window(31, 10_030), &anchor);
        assert_eq!(moved.lines, window(10_001, 10_030));
        assert!(!moved.gap);
    }

    #[test]
    fn an_anchor_rolled_out_of_the_window_returns_the_window_and_says_so() {
        let first = tail_page(window(1, 20), 2);
        let anchor = Anchor::parse(&first.cursor).unwrap();
        let rolled = page_after_anchor(window(30, 40), &anchor);
        assert_eq!(rolled.lines, window(30, 40));
        assert!(rolled.gap);
    }

    #[test]
    fn repeated_lines_resume_after_the_newest_match() {
        let log = |n: usize| -> Vec<String> { (0..n).map(|_| "tick".to_owned()).collect() };
        let mut seen = log(6);
        seen.push("boot done".into());
        seen.extend(log(3));
        let first = tail_page(seen.clone(), 1);
        seen.extend(["new".to_owned()]);
        let next = page_after_anchor(seen, &Anchor::parse(&first.cursor).unwrap());
        assert_eq!(next.lines, ["new"]);
    }

    #[test]
    fn an_empty_first_page_then_everything_and_foreign_cursors() {
        let empty = tail_page(Vec::new(), 5);
        assert!(empty.lines.is_empty());
        let next = page_after_anchor(numbered(2), &Anchor::parse(&empty.cursor).unwrap());
        assert_eq!(next.lines, ["line 1", "line 2"]);
        assert!(!next.gap);
        for foreign in ["n:9", "e:ev-1", "c:9:00", "c:1:zz", ""] {
            assert_eq!(Anchor::parse(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn sse_data_lines_lose_one_space() {
        assert_eq!(
            sse_data_lines("event: log\ndata: boot\ndata:  two spaces\n: comment\n\ndata:x\n"),
            ["boot", " two spaces", "x"]
        );
    }
}
