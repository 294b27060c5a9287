//! The cloud fleet: the smol cloud REST API, through the generated smolcloud client, plus the
//! one route progenitor cannot express (files; see `file_url`).

use super::FleetApi;
use super::api::{BranchableAt, Capabilities, Feature, HostPorts, PortAddress};
use super::error::{ErrorKind, FleetError, FleetResult};
use super::file_stream::FileStream;
use super::model::{
    Account, BranchSpec, CreateSpec, Deleted, Egress, ExecOutput, ExecSpec, LogPage, LogSource,
    Machine, MachineNetwork, PortMapping, PublishedPort, Usage,
};
use super::upstream::{from_response, map_error, retry_read, send, snippet, transport, within};
use crate::generated::smolcloud::{self, types};
use base64::Engine as _;
use progenitor_client::Error as ClientError;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

/// RFC 5737 TEST-NET-1: unroutable. "No egress" goes out as an allow-list of it, because the
/// service refuses an empty allow-list (400) and its `blocked` mode has not been verified end to
/// end the way this form has.
pub const DENY_CIDR: &str = "192.0.2.0/24";
/// The largest file the cloud's file routes take.
pub const MAX_FILE_BYTES: u64 = 100 * 1024 * 1024;

/// What the fallback's own exec may take (its `timeoutSeconds`), on top of the exec deadline.
const FILES: Duration = Duration::from_secs(120);
const EXEC_DEFAULT_SECS: u64 = 120;

/// How long this client waits for each kind of call before it gives up on the answer (the
/// service may still carry the work out). `Default` is what the server uses; tests shorten them
/// to watch a call outlast its deadline against a fake that takes its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    pub read: Duration,
    pub create: Duration,
    /// A start waits its turn in a per-source queue and may pull the image cold: minutes (the
    /// SDK allows 30 min for start; facts 2 "client timeouts", 3.4).
    pub start: Duration,
    pub stop: Duration,
    pub delete: Duration,
    /// A branch waits in its source's queue: clients allow 5 to 30 min (facts 3.9).
    pub branch: Duration,
    pub files: Duration,
    /// Beyond the command's own timeout, which the service enforces itself (exit 124).
    pub exec_slack: Duration,
    /// An exec (or file transfer) on a stopped machine boots it inside the call, so its deadline
    /// is boot plus command (facts 3.7 "size the HTTP timeout for boot + command").
    pub boot: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            read: Duration::from_secs(30),
            create: Duration::from_secs(180),
            start: Duration::from_secs(600),
            stop: Duration::from_secs(180),
            delete: Duration::from_secs(120),
            branch: Duration::from_secs(900),
            files: FILES,
            exec_slack: Duration::from_secs(30),
            // An auto-start is a start: the same allowance.
            boot: Duration::from_secs(600),
        }
    }
}

/// What the cloud fleet can do, and why not the rest, in its own words.
pub static CAPABILITIES: Capabilities = Capabilities {
    lacks: &[
        (
            Feature::HostMounts,
            "mounts are local only: a cloud machine has no host file system to mount from",
        ),
        (
            Feature::Credentials,
            "credentials are local only: the smol cloud API as this server speaks it (its \
             published spec) has no credential bindings, so a cloud machine cannot be given a \
             secret without the workload seeing it. Use the local fleet for work that needs one",
        ),
        (
            Feature::EgressReport,
            "only the local engine reports the egress it denied",
        ),
        (
            Feature::EgressWidening,
            "ask is local only: the cloud fleet cannot change a machine's egress once it is \
             created; name the hosts in allowHosts instead",
        ),
        (Feature::WarmPools, "only the local engine keeps warm pools"),
        (
            Feature::LogSources,
            "is local only: a cloud machine has one log, its control plane's event log; leave \
             source out",
        ),
        (
            Feature::ImagePull,
            "pull-image is local only: the cloud control plane pulls the image itself at create",
        ),
        (
            Feature::Pause,
            "pause is local only: the cloud's generated spec lists pause and resume, which this \
             server has not verified against the service. On cloud, stop-machine keeps the disk \
             (billed for disk only) and start-machine boots it again: memory and processes \
             start anew",
        ),
        (
            Feature::Terminal,
            "a terminal is local only: the cloud lists an interactive exec in its generated spec, \
             but this server has not verified it against the service. Use the local fleet, or \
             run-command with stdin for a program that reads its input",
        ),
    ],
    needs_image: Some(
        "is required on the cloud fleet (only the local engine boots a machine without one, \
         from its bundled Alpine): give an OCI reference, like alpine:3.20",
    ),
    branchable_at: BranchableAt::Create,
    metered: true,
    exec_boots_silently: false,
    ids_apart_from_names: true,
    arrives_late: true,
    host_ports: HostPorts::Fleet,
    kept_name_prefixes: &[],
    // The published spec documents no frozen state (a base made of a cloud machine is one the
    // record names).
    shows_frozen: false,
};

/// What opening a cloud machine's published port takes: its ingress and the connect bridge
/// both answer 401 without the account's key, unless the machine was created public (which
/// this server never asks for), and pass the caller's `authorization` on to the service.
const INGRESS_NEEDS: &str = "the smol cloud account's key as `Authorization: Bearer <key>` (the      operator's SMOL_CLOUD_TOKEN; the ingress passes the header on to the service)";

const ROUTE_UNKNOWN: u8 = 0;
const ROUTE_PRESENT: u8 = 1;
const ROUTE_ABSENT: u8 = 2;

/// The control plane's own clean-up of an ephemeral machine whose session died without deleting
/// it: deleted after `ttl_secs`, stopped after `auto_stop_secs` idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backstop {
    pub ttl_secs: u64,
    pub auto_stop_secs: u64,
}

#[derive(Debug)]
pub struct CloudFleet {
    client: smolcloud::Client,
    http: reqwest::Client,
    base_url: reqwest::Url,
    backstop: Backstop,
    deadlines: Deadlines,
    /// Whether this control plane serves the files route, learned on first use. Until a 2xx has
    /// been seen from it, a 404/405/501 may mean the route is missing, and the transfer goes
    /// through exec instead; once the exec path has worked, the route is not tried again.
    files_route: AtomicU8,
    /// Checked once, before the first create: the account must be able to pay for a machine.
    account_active: tokio::sync::OnceCell<()>,
}

impl CloudFleet {
    pub fn new(base_url: &str, token: &str, backstop: Backstop) -> FleetResult<Self> {
        let base = reqwest::Url::parse(base_url.trim_end_matches('/')).map_err(|e| {
            FleetError::new(
                ErrorKind::Refused,
                "cloud URL",
                format!(
                    "{base_url} is not a URL ({e}); give one like https://api.smolmachines.com"
                ),
            )
        })?;
        let http = super::transport::cloud_http_client(token)?;
        Ok(CloudFleet {
            client: smolcloud::Client::new_with_client(
                base.as_str().trim_end_matches('/'),
                http.clone(),
            ),
            http,
            base_url: base,
            backstop,
            deadlines: Deadlines::default(),
            files_route: AtomicU8::new(ROUTE_UNKNOWN),
            account_active: tokio::sync::OnceCell::new(),
        })
    }

    /// The same fleet with other deadlines (tests use short ones against a slow fake).
    pub fn with_deadlines(mut self, deadlines: Deadlines) -> Self {
        self.deadlines = deadlines;
        self
    }

    pub fn deadlines(&self) -> Deadlines {
        self.deadlines
    }

    /// Every per-machine route takes the `mach-` id; a name costs one list call.
    pub async fn resolve(&self, machine: &str) -> FleetResult<String> {
        if machine.starts_with("mach-") {
            return Ok(machine.to_owned());
        }
        self.list()
            .await?
            .into_iter()
            .find(|m| m.name == machine)
            .map(|m| m.id)
            .ok_or_else(|| {
                FleetError::new(
                    ErrorKind::NotFound,
                    format!("get machine {machine}"),
                    format!("machine '{machine}' not found on the cloud fleet"),
                )
            })
    }

    async fn get_by_id(&self, label: &str, id: &str) -> FleetResult<Machine> {
        let ctx = format!("get machine {label}");
        let info = retry_read(|| {
            send(
                &ctx,
                self.deadlines.read,
                self.client.machine_get().id(id).send(),
            )
        })
        .await?;
        Ok(view(info))
    }

    async fn exec_by_id(&self, label: &str, id: &str, spec: &ExecSpec) -> FleetResult<ExecOutput> {
        let ctx = format!("exec in {label}");
        // The machine may be stopped (an auto-stop sweep, say): the exec then boots it first.
        let limit = self.exec_limit(spec);
        let request = self
            .client
            .machine_exec()
            .id(id)
            // Both families: the text is capped at 1 MiB, the base64 twin is byte-exact.
            .output(types::MachineExecOutput::Both)
            .body(command_request(spec));
        let out = send(&ctx, limit, request.send()).await?;
        let (stdout, stdout_cut) =
            exact_or_text(out.stdout_b64.as_deref(), out.stdout, out.stdout_truncated);
        let (stderr, stderr_cut) =
            exact_or_text(out.stderr_b64.as_deref(), out.stderr, out.stderr_truncated);
        Ok(ExecOutput {
            exit_code: out.exit_code,
            stdout,
            stderr,
            stdout_cut_upstream: stdout_cut,
            stderr_cut_upstream: stderr_cut,
        })
    }

    fn exec_limit(&self, spec: &ExecSpec) -> Duration {
        Duration::from_secs(spec.timeout_secs.unwrap_or(EXEC_DEFAULT_SECS))
            + self.deadlines.exec_slack
            + self.deadlines.boot
    }

    /// The files route is `/v1/machines/{id}/files/{path suffix}` with the suffix's slashes kept
    /// (override cloud-files-route). progenitor percent-encodes `/` in path parameters, so this
    /// one route is called with the same HTTP client but a URL built here.
    fn file_url(&self, id: &str, path: &str) -> FleetResult<reqwest::Url> {
        let names: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let unusable = || {
            FleetError::new(
                ErrorKind::Invalid,
                format!("file {path}"),
                "the path names no file (it is empty or only slashes)",
            )
        };
        if names.is_empty() {
            return Err(unusable());
        }
        // Every byte but the unreserved ones is escaped (`'` included, which `Url`'s own segment
        // encoding would leave bare), so a name reads the same through any proxy.
        let encode = |s: &str| percent_encoding::utf8_percent_encode(s, SEGMENT).to_string();
        let suffix: Vec<String> = names.into_iter().map(encode).collect();
        let mut url = self.base_url.clone();
        let base_path = url.path().trim_end_matches('/').to_owned();
        url.set_path(&format!(
            "{base_path}/v1/machines/{}/files/{}",
            encode(id),
            suffix.join("/")
        ));
        Ok(url)
    }

    /// Sends `request` to the files route unless this control plane is known to lack it.
    /// `Some`: the route answered 2xx. `None`: the route is missing here, so the caller goes
    /// through exec. An error: the route answered about the file or the machine.
    async fn via_files_route(
        &self,
        ctx: &str,
        limit: Duration,
        request: reqwest::RequestBuilder,
    ) -> FleetResult<Option<reqwest::Response>> {
        if self.files_route.load(Ordering::Relaxed) == ROUTE_ABSENT {
            return Ok(None);
        }
        let response = within(ctx, limit, async {
            super::hooks::send_traced("files_route", "cloud", request)
                .await
                .map_err(|e| transport(ctx, &e))
        })
        .await?;
        let status = response.status();
        if status.is_success() {
            self.files_route.store(ROUTE_PRESENT, Ordering::Relaxed);
            return Ok(Some(response));
        }
        let err = from_response(ctx, response).await;
        if self.route_may_be_missing(status.as_u16(), &err) {
            Ok(None)
        } else {
            Err(err)
        }
    }

    fn route_may_be_missing(&self, status: u16, err: &FleetError) -> bool {
        // "file not found: <path>" is the route itself answering about the file.
        let about_the_file = err.message.starts_with("file not found");
        matches!(status, 404 | 405 | 501)
            && !about_the_file
            && self.files_route.load(Ordering::Relaxed) != ROUTE_PRESENT
    }

    async fn fallback_exec(
        &self,
        machine: &str,
        id: &str,
        ctx: &str,
        script: String,
        stdin: Option<String>,
    ) -> FleetResult<ExecOutput> {
        let mut spec = ExecSpec::new(super::model::Command::Argv(vec![
            "sh".into(),
            "-c".into(),
            script,
        ]));
        spec.stdin = stdin;
        spec.timeout_secs = Some(FILES.as_secs());
        let out = self.exec_by_id(machine, id, &spec).await?;
        if out.exit_code != 0 {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let kind = if stderr.contains("No such file") {
                ErrorKind::NotFound
            } else {
                ErrorKind::Upstream
            };
            return Err(FleetError::new(
                kind,
                ctx,
                format!("exit {}: {}", out.exit_code, snippet(&stderr, 200)),
            ));
        }
        self.files_route.store(ROUTE_ABSENT, Ordering::Relaxed);
        Ok(out)
    }

    pub async fn usage(&self, machine: &str) -> FleetResult<Usage> {
        let id = self.resolve(machine).await?;
        let ctx = format!("usage of {machine}");
        let u = retry_read(|| {
            send(
                &ctx,
                self.deadlines.read,
                self.client.machine_usage().id(&id).send(),
            )
        })
        .await?;
        Ok(Usage {
            machine_id: u.machine_id.unwrap_or(id),
            uptime_seconds: u.usage.and_then(|u| u.total_uptime_seconds),
            total_micros: u.cost.as_ref().map(|c| c.total_micros),
            amount_due_micros: u.cost.and_then(|c| c.amount_due_micros),
        })
    }

    async fn read_account(&self) -> FleetResult<Account> {
        let ctx = "account";
        let a =
            retry_read(|| send(ctx, self.deadlines.read, self.client.account_get().send())).await?;
        Ok(Account {
            tenant_id: a.tenant_id,
            status: a.status,
            period_uptime_seconds: a.period_usage.total_uptime_seconds,
            period_total_micros: Some(a.period_cost.total_micros),
            period_amount_due_micros: a.period_cost.amount_due_micros,
            plan: a.plan.and_then(|p| p.name),
        })
    }

    /// Before the first create of this process: an account that cannot pay gets a clear answer
    /// instead of a machine stuck in the control plane's billing checks.
    async fn ensure_account_active(&self) -> FleetResult<()> {
        self.account_active
            .get_or_try_init(|| async {
                let account = self.read_account().await?;
                if account.status != "active" {
                    return Err(FleetError::new(
                        ErrorKind::AccountNotActive,
                        "cloud account",
                        format!(
                            "the cloud account {} is {}, not active, so it cannot create machines",
                            account.tenant_id, account.status
                        ),
                    ));
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }
}

#[async_trait::async_trait]
impl FleetApi for CloudFleet {
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }

    /// The service deletes a machine on its own once its ttlSeconds have passed (facts 3.3),
    /// mid-session included: the agent did not delete it and should know why.
    fn explain(&self, kind: ErrorKind, message: &mut String) {
        let machine_missing = message.contains("machine not found")
            || message.contains("not found on the cloud fleet");
        if kind == ErrorKind::NotFound && machine_missing {
            message.push_str(&format!(
                "\nThe machine is gone. The service also deletes a machine itself once the \
                 ttlSeconds it was created with have passed (this server gives its ephemeral \
                 machines {} s), whatever the session is doing.",
                self.backstop.ttl_secs
            ));
        }
    }

    async fn account(&self) -> FleetResult<Account> {
        self.read_account().await
    }

    /// The cloud reports what a machine cost, not its counters (its machine record has none).
    async fn consumption(&self, machine: &str) -> FleetResult<super::model::Consumption> {
        let usage = self.usage(machine).await?;
        Ok(super::model::Consumption {
            cost_micros: usage.total_micros,
            ..Default::default()
        })
    }

    async fn list(&self) -> FleetResult<Vec<Machine>> {
        let ctx = "list machines";
        let list = retry_read(|| send(ctx, self.deadlines.read, self.client.machine_list().send()))
            .await?;
        Ok(list.into_iter().map(view).collect())
    }

    async fn get(&self, machine: &str) -> FleetResult<Machine> {
        let id = self.resolve(machine).await?;
        self.get_by_id(machine, &id).await
    }

    /// Creates a machine, which the service leaves stopped.
    async fn create(&self, spec: &CreateSpec) -> FleetResult<Machine> {
        let ctx = format!("create machine {}", spec.name);
        let body = create_body(spec, self.backstop)
            .map_err(|(kind, why)| FleetError::new(kind, &ctx, why))?;
        self.ensure_account_active().await?;
        // Never retried: a create that failed late may still have made the machine.
        let request = self.client.machine_create().body(body);
        Ok(view(
            send(&ctx, self.deadlines.create, request.send()).await?,
        ))
    }

    /// Starts a machine and reads it back (the start answer may be an empty 202; override
    /// cloud-start-stop-bodies-ignored). Branchability is fixed at create on cloud, so asking
    /// for it on a machine created without it is refused rather than silently ignored.
    async fn start(&self, machine: &str, branchable: Option<bool>) -> FleetResult<Machine> {
        let id = self.resolve(machine).await?;
        let ctx = format!("start machine {machine}");
        if branchable == Some(true) && !self.get_by_id(machine, &id).await?.branchable {
            return Err(FleetError::new(
                ErrorKind::Conflict,
                ctx,
                "branchable: a cloud machine is branchable only if it was created with \
                 branchable true; create a new one for that",
            ));
        }
        send(
            &ctx,
            self.deadlines.start,
            self.client.machine_start().id(&id).send(),
        )
        .await?;
        self.get_by_id(machine, &id).await
    }

    async fn stop(&self, machine: &str) -> FleetResult<Machine> {
        let id = self.resolve(machine).await?;
        let ctx = format!("stop machine {machine}");
        send(
            &ctx,
            self.deadlines.stop,
            self.client.machine_stop().id(&id).send(),
        )
        .await?;
        self.get_by_id(machine, &id).await
    }

    /// Deletes a machine and returns the settled bill (override cloud-delete-include-usage).
    async fn delete(&self, machine: &str) -> FleetResult<Deleted> {
        let id = self.resolve(machine).await?;
        let ctx = format!("delete machine {machine}");
        let settled = within(&ctx, self.deadlines.delete, async {
            let request = self.client.machine_delete().id(&id).include_usage(true);
            match request.send().await {
                Ok(r) => Ok(find_total_micros(&serde_json::Value::Object(
                    r.into_inner(),
                ))),
                // A control plane that ignores includeUsage answers the plain 204.
                Err(ClientError::UnexpectedResponse(r)) if r.status().is_success() => Ok(None),
                Err(e) => Err(map_error(&ctx, e).await),
            }
        })
        .await?;
        let usage_micros = match settled {
            Some(micros) => Some(micros),
            // The usage route keeps answering for 30 days after a delete.
            None => self.usage(&id).await.ok().and_then(|u| u.total_micros),
        };
        Ok(Deleted {
            deleted: machine.to_owned(),
            usage_micros,
        })
    }

    async fn exec(&self, machine: &str, spec: &ExecSpec) -> FleetResult<ExecOutput> {
        let id = self.resolve(machine).await?;
        self.exec_by_id(machine, &id, spec).await
    }

    /// `exec/stream` (override cloud-exec-stream-route): the output as it comes, untruncated.
    async fn exec_streamed(
        &self,
        machine: &str,
        spec: &ExecSpec,
        output: &super::OutputSender,
    ) -> FleetResult<ExecOutput> {
        let id = self.resolve(machine).await?;
        let ctx = format!("exec in {machine}");
        // A stopped machine is booted by the call first, as with the plain exec.
        let limit = self.exec_limit(spec);
        // Built here rather than by the generated builder, to send the `accept:
        // text/event-stream` the SDK and the Rust client send (facts 3.7).
        let mut url = self.base_url.clone();
        let base_path = url.path().trim_end_matches('/').to_owned();
        url.set_path(&format!(
            "{base_path}/v1/machines/{}/exec/stream",
            percent_encoding::utf8_percent_encode(&id, SEGMENT)
        ));
        let request = self
            .http
            .post(url)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .json(&command_request(spec));
        within(&ctx, limit, async {
            let response = super::hooks::send_traced("exec_stream", "cloud", request)
                .await
                .map_err(|e| transport(&ctx, &e))?;
            if !response.status().is_success() {
                return Err(from_response(&ctx, response).await);
            }
            super::exec_stream::read_exec_stream(&ctx, response.bytes_stream(), output, |e| {
                transport(&ctx, e)
            })
            .await
        })
        .await
    }

    async fn read_file(&self, machine: &str, path: &str) -> FleetResult<FileStream> {
        let id = self.resolve(machine).await?;
        let ctx = format!("read {path} in {machine}");
        let request = self.http.get(self.file_url(&id, path)?);
        if let Some(response) = self
            .via_files_route(&ctx, self.deadlines.files + self.deadlines.boot, request)
            .await?
        {
            return Ok(FileStream::from_response(ctx, response));
        }
        let script = format!("base64 < {}", shell_quote(path));
        let out = self.fallback_exec(machine, &id, &ctx, script, None).await?;
        if out.stdout_cut_upstream {
            return Err(FleetError::new(
                ErrorKind::Unsupported,
                ctx,
                "the file is larger than one exec answer carries, and this control plane has no \
                 files route to read it whole",
            ));
        }
        let text: String = String::from_utf8_lossy(&out.stdout)
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        // An old control plane without the files route: the file comes whole, in one exec.
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map(FileStream::whole)
            .map_err(|e| FleetError::new(ErrorKind::BadResponse, ctx, format!("base64: {e}")))
    }

    async fn write_file(&self, machine: &str, path: &str, bytes: Vec<u8>) -> FleetResult<u64> {
        let len = bytes.len() as u64;
        let ctx = format!("write {path} in {machine}");
        if len > MAX_FILE_BYTES {
            return Err(FleetError::new(
                ErrorKind::Invalid,
                ctx,
                format!(
                    "{len} bytes is more than the {MAX_FILE_BYTES} bytes a cloud file may hold"
                ),
            ));
        }
        let id = self.resolve(machine).await?;
        let request = self
            .http
            .put(self.file_url(&id, path)?)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(bytes.clone());
        // A transfer on a stopped machine starts it first (facts 3.8).
        let limit =
            self.deadlines.files + self.deadlines.boot + super::upstream::transfer_time(len);
        if self.via_files_route(&ctx, limit, request).await?.is_some() {
            return Ok(len);
        }
        let quoted = shell_quote(path);
        let script = format!("mkdir -p \"$(dirname {quoted})\" && base64 -d > {quoted}");
        let stdin = base64::engine::general_purpose::STANDARD.encode(&bytes);
        self.fallback_exec(machine, &id, &ctx, script, Some(stdin))
            .await?;
        Ok(len)
    }

    /// Branches a running branchable machine. Control planes from before the branch vocabulary
    /// only have `/fork` (same body), so a 404 on `/branches` is retried there.
    async fn branch(&self, spec: BranchSpec<'_>) -> FleetResult<Machine> {
        let id = self.resolve(spec.source).await?;
        let ctx = format!("branch machine {} into {}", spec.source, spec.child);
        let body = types::BranchRequest {
            branchable: spec.branchable.then_some(true),
            freeze_source: spec.freeze_source.then_some(true),
            labels: None,
            name: spec.child.to_owned(),
            ports: Vec::new(),
        };
        let limit = self.deadlines.branch;
        within(&ctx, limit, async {
            let branches = self.client.machine_branch().id(&id).body(body.clone());
            match send(&ctx, limit, branches.send()).await {
                Err(e) if e.is_not_found() => {}
                other => return other.map(view),
            }
            let fork = self.client.machine_fork().id(&id).body(body);
            send(&ctx, limit, fork.send()).await.map(view)
        })
        .await
    }

    /// The guest ports only (override cloud-ports-route): the service allocates the outside
    /// side, so a host port the caller names is not sent.
    async fn set_ports(&self, machine: &str, ports: &[PortMapping]) -> FleetResult<Machine> {
        let id = self.resolve(machine).await?;
        let ctx = format!("publish ports of {machine}");
        let body = types::SetPortsRequest {
            ports: ports
                .iter()
                .filter_map(|p| {
                    Some(types::PortRequest {
                        port: NonZeroU32::new(u32::from(p.guest))?,
                    })
                })
                .collect(),
        };
        let request = self.client.machine_set_ports().id(&id).body(body);
        send(&ctx, self.deadlines.read, request.send())
            .await
            .map(view)
    }

    /// The record's `url` is the ingress of the first published port only, and appears only
    /// once something accepts on it (facts 3.13); any published port is reached through the
    /// connect bridge, which the same key opens.
    fn port_address(&self, machine: &Machine, guest: u16) -> Option<PortAddress> {
        let published = machine.ports.iter().position(|p| p.guest == guest)?;
        let url = match (&machine.url, published) {
            (Some(ingress), 0) => ingress.clone(),
            _ => {
                let mut bridge = self.base_url.clone();
                let base_path = bridge.path().trim_end_matches('/').to_owned();
                // No trailing slash: `connect/8080/` is a 404 (facts 3.13).
                bridge.set_path(&format!(
                    "{base_path}/v1/machines/{}/connect/{guest}",
                    machine.id
                ));
                bridge.to_string()
            }
        };
        Some(PortAddress {
            url,
            needs: Some(INGRESS_NEEDS),
        })
    }

    /// The control plane's event log (what happened to the machine, not what ran in it). The
    /// route has no tail or since parameter, so the whole log is read and paged here.
    async fn logs(
        &self,
        machine: &str,
        tail: usize,
        cursor: Option<&str>,
        _source: LogSource,
    ) -> FleetResult<LogPage> {
        let ctx = format!("events of {machine}");
        // An empty one is what an empty log gave.
        if let Some(given) = cursor.filter(|c| !c.is_empty() && !c.starts_with("e:")) {
            return Err(FleetError::new(
                ErrorKind::Invalid,
                ctx,
                format!(
                    "cursor: {:?} is not a cursor machine-logs gave for a cloud machine (they \
                     look like e:<event id>); pass back the one from the previous call, or leave \
                     it out for the last events",
                    snippet(given, 40)
                ),
            ));
        }
        let id = self.resolve(machine).await?;
        let events = retry_read(|| {
            send(
                &ctx,
                self.deadlines.read,
                self.client.machine_events().id(&id).send(),
            )
        })
        .await?;
        Ok(page_by_event_id(events, tail, cursor))
    }
}

fn create_body(
    spec: &CreateSpec,
    backstop: Backstop,
) -> Result<types::CreateMachineRequest, (ErrorKind, String)> {
    if !spec.mounts.is_empty() {
        return Err((
            ErrorKind::Unsupported,
            "mounts are local only: a cloud machine has no host file system to mount from".into(),
        ));
    }
    let Some(image) = &spec.image else {
        return Err((
            ErrorKind::Unsupported,
            "image is required on the cloud fleet: it has no bundled root file system (only \
             the local engine boots one without an image); give one, like alpine:3.20"
                .into(),
        ));
    };
    if spec.overlay_gb.is_some() {
        return Err((
            ErrorKind::Unsupported,
            "overlayGb is local only: a cloud machine has one disk, sized with storageGb".into(),
        ));
    }
    if !spec.ports.is_empty() && spec.egress == Egress::Blocked {
        return Err((
            ErrorKind::Refused,
            format!(
                "refusing to create {} on cloud with a published port and blocked egress: \
                 create it with network open, with allowHosts/allowCidrs naming what it needs, \
                 or without ports",
                spec.name
            ),
        ));
    }
    let network = match &spec.egress {
        Egress::Open => types::MachineNetwork::Open,
        Egress::Blocked => types::MachineNetwork::AllowCidrs {
            cidrs: vec![DENY_CIDR.to_owned()],
            hosts: Vec::new(),
        },
        Egress::Allow { hosts, cidrs } => types::MachineNetwork::AllowCidrs {
            cidrs: cidrs.clone(),
            hosts: hosts.clone(),
        },
    };
    let mut ports = Vec::new();
    for p in &spec.ports {
        let port = NonZeroU32::new(u32::from(p.guest))
            .ok_or((ErrorKind::Invalid, "port 0 cannot be published".to_owned()))?;
        ports.push(types::PortRequest { port });
    }
    Ok(types::CreateMachineRequest {
        name: Some(spec.name.clone()),
        source: types::MachineSource::Image(image.clone()),
        resources: Some(types::MachineResources {
            cpus: Some(i32::try_from(spec.cpus).unwrap_or(i32::MAX)),
            memory_mb: Some(i32::try_from(spec.memory_mb).unwrap_or(i32::MAX)),
            disk_gb: spec.storage_gb.map(i64::from),
        }),
        network: Some(network),
        ports,
        branchable: spec.branchable.then_some(true),
        env: spec.env.clone(),
        labels: Default::default(),
        // The control plane's backstop for a session that dies without cleaning up.
        ttl_seconds: spec
            .ephemeral
            .then(|| i64::try_from(backstop.ttl_secs).unwrap_or(i64::MAX)),
        auto_stop_seconds: spec
            .ephemeral
            .then(|| i64::try_from(backstop.auto_stop_secs).unwrap_or(i64::MAX)),
        // `ephemeral` deletes a machine once it stops, and a cloud machine is created stopped:
        // the sweep removed it before the start (observed 404). TTL and auto-stop replace it.
        ephemeral: None,
        mounts: Vec::new(),
        workdir: None,
    })
}

fn view(info: types::MachineInfo) -> Machine {
    let network = match info.network {
        Some(n) => describe_network(&n),
        None => MachineNetwork::Other("unknown".into()),
    };
    Machine {
        name: info.name.clone().unwrap_or_else(|| info.id.clone()),
        id: info.id,
        state: info.state.into(),
        cpus: info
            .resources
            .as_ref()
            .and_then(|r| r.cpus)
            .and_then(|c| u32::try_from(c).ok()),
        memory_mb: info
            .resources
            .as_ref()
            .and_then(|r| r.memory_mb)
            .and_then(|m| u32::try_from(m).ok()),
        network,
        image: info.source.and_then(|s| s.reference),
        url: info.url,
        pid: None,
        created_at: info.created_at,
        branchable: info.branchable.or(info.forkable).unwrap_or(false),
        ports: info
            .ports
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| {
                Some(PublishedPort {
                    guest: u16::try_from(p.port).ok()?,
                    host: p
                        .host_port
                        .and_then(|h| u16::try_from(h).ok())
                        .filter(|h| *h != 0),
                })
            })
            .collect(),
        upstream_ready: info.ready,
        consumption: super::model::Consumption::default(),
    }
}

/// Reads the record's network the way it was asked for: the deny list reads as `blocked`.
fn describe_network(n: &types::MachineNetworkRecord) -> MachineNetwork {
    let cidrs = n.cidrs.clone().unwrap_or_default();
    let hosts = n.hosts.clone().unwrap_or_default();
    match n.mode.as_deref() {
        Some("open") => Egress::Open.into(),
        Some("blocked") => Egress::Blocked.into(),
        Some("allowCidrs") if hosts.is_empty() && (cidrs.is_empty() || cidrs == [DENY_CIDR]) => {
            // The record's echo of the list is unreliable ([] seen for a deny list).
            Egress::Blocked.into()
        }
        Some("allowCidrs") => Egress::Allow { hosts, cidrs }.into(),
        Some(other) => MachineNetwork::Other(other.to_owned()),
        None => MachineNetwork::Other("unknown".into()),
    }
}

/// The body of both exec routes (`exec` and `exec/stream` take the same `MachineCommandRequest`).
fn command_request(spec: &ExecSpec) -> types::MachineCommandRequest {
    types::MachineCommandRequest {
        // Sent only when set (an override adds it: absent from the published spec), so every
        // foreground body stays as it was.
        background: spec.background.then_some(true),
        command: types::CommandSpec::Array(spec.command.argv()),
        cwd: spec.workdir.clone(),
        env: spec.env.clone(),
        stdin: spec.stdin.clone(),
        stream: None,
        timeout_seconds: spec
            .timeout_secs
            .map(|s| i64::try_from(s).unwrap_or(i64::MAX)),
    }
}

fn exact_or_text(b64: Option<&str>, text: String, cut: Option<bool>) -> (Vec<u8>, bool) {
    if let Some(b64) = b64.filter(|b| !b.is_empty())
        && let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(b64)
    {
        return (bytes, false);
    }
    (text.into_bytes(), cut.unwrap_or(false))
}

/// The settled bill's nesting has moved between releases; take the first numeric `totalMicros`.
pub(crate) fn find_total_micros(v: &serde_json::Value) -> Option<i64> {
    match v {
        serde_json::Value::Object(map) => map
            .get("totalMicros")
            .and_then(serde_json::Value::as_i64)
            .or_else(|| map.values().find_map(find_total_micros)),
        serde_json::Value::Array(items) => items.iter().find_map(find_total_micros),
        _ => None,
    }
}

pub(crate) fn page_by_event_id(
    events: Vec<types::EventInfo>,
    tail: usize,
    cursor: Option<&str>,
) -> LogPage {
    let after = cursor
        .and_then(|c| c.strip_prefix("e:"))
        .and_then(|id| events.iter().position(|e| e.id == id));
    let start = match after {
        Some(i) => i + 1,
        // No cursor, a foreign one, or an id that has rolled out of the log: the tail.
        None => events.len().saturating_sub(tail),
    };
    let next = match events.last() {
        Some(last) => format!("e:{}", last.id),
        None => cursor.unwrap_or_default().to_owned(),
    };
    LogPage {
        lines: events[start.min(events.len())..]
            .iter()
            .map(|e| format!("{} {} {}", e.created_at, e.level.to_uppercase(), e.message))
            .collect(),
        cursor: next,
        note: None,
        gap: false,
    }
}

/// RFC 3986's unreserved characters stay; everything else is escaped.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Single-quotes a word for `sh`.
pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(id: &str) -> types::EventInfo {
        types::EventInfo {
            created_at: "2026-09-08T14:47:37Z".into(),
            id: id.into(),
            level: "info".into(),
            message: format!("event {id}"),
        }
    }

    #[test]
    fn events_page_by_id() {
        let log = || vec![event("ev-1"), event("ev-2"), event("ev-3")];
        let page = page_by_event_id(log(), 2, None);
        assert_eq!(
            page.lines,
            [
                "2026-09-08T14:47:37Z INFO event ev-2",
                "2026-09-08T14:47:37Z INFO event ev-3"
            ]
        );
        assert_eq!(page.cursor, "e:ev-3");
        assert_eq!(page_by_event_id(log(), 2, Some("e:ev-1")).lines.len(), 2);
        assert!(page_by_event_id(log(), 2, Some("e:ev-3")).lines.is_empty());
        assert_eq!(page_by_event_id(log(), 1, Some("e:gone")).lines.len(), 1);
        assert_eq!(page_by_event_id(vec![], 5, Some("e:x")).cursor, "e:x");
    }

    #[test]
    fn total_micros_is_found_at_any_depth() {
        assert_eq!(
            find_total_micros(
                &json!({"machineId": "m", "cost": {"cpuMicros": 3, "totalMicros": 1879}})
            ),
            Some(1879)
        );
        assert_eq!(find_total_micros(&json!({})), None);
    }

    #[test]
    fn file_urls_and_quoting() {
        let backstop = Backstop {
            ttl_secs: 1,
            auto_stop_secs: 1,
        };
        let fleet = CloudFleet::new("https://api.example/base/", "t", backstop).unwrap();
        let url = |path| fleet.file_url("mach-1", path).unwrap().to_string();
        assert_eq!(
            url("/workspace/a b.txt"),
            "https://api.example/base/v1/machines/mach-1/files/workspace/a%20b.txt"
        );
        assert_eq!(
            url("//x//y?#%"),
            "https://api.example/base/v1/machines/mach-1/files/x/y%3F%23%25"
        );
        assert!(fleet.file_url("mach-1", "///").is_err());
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn the_deny_list_reads_as_blocked() {
        let rec = |cidrs: Vec<&str>| types::MachineNetworkRecord {
            mode: Some("allowCidrs".into()),
            cidrs: Some(cidrs.into_iter().map(String::from).collect()),
            hosts: None,
        };
        assert_eq!(
            describe_network(&rec(vec![DENY_CIDR])).to_string(),
            "blocked"
        );
        assert_eq!(describe_network(&rec(vec![])).to_string(), "blocked");
        assert_eq!(
            describe_network(&rec(vec!["10.0.0.0/8"])).to_string(),
            "allow(10.0.0.0/8)"
        );
    }
}
