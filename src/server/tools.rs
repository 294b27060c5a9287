//! The tools themselves: argument checks, then the fleet calls, readiness, output shaping and
//! clean-up that make one tool call behave the same whichever fleet answers it.

use super::args::{self, Encoding, Network};
use super::backend::Backend;
use super::catalog::Mode;
use super::output::{head_tail, utf8_prefix_len};
use super::results::{self, Overflow};
use super::{ToolError, ToolOutput};
use crate::config::NetworkDefault;
use crate::error::ErrorKind;
use crate::fleet::{
    Command, CreateSpec, Egress, ExecSpec, Fleet, FleetKind, Machine, Mount, PortMapping,
};
use base64::Engine as _;
use serde::Serialize;
use serde_json::Value;
use std::future::Future;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The workload of a local machine this server creates: images whose own command exits at once
/// (alpine's shell, most language images) would otherwise stop the machine before any exec.
const KEEPALIVE: &[&str] = &["sh", "-c", "while true; do sleep 3600; done"];
const READY_PROBE_TIMEOUT_SECS: u64 = 10;
const CLEANUP_DEADLINE: Duration = Duration::from_secs(120);
/// How long the pages of one read-file may come from the copy its first page fetched.
const PAGE_CACHE_SECS: u64 = 30;
/// Files larger than this are fetched again for every page rather than kept in memory.
const PAGE_CACHE_MAX_BYTES: usize = 256 * 1024 * 1024;

pub(super) struct Tools<'a> {
    pub backend: &'a Backend,
    pub session: &'a str,
    pub ct: CancellationToken,
    /// The fleet this call went to, once chosen.
    pub used: std::sync::OnceLock<FleetKind>,
}

fn out<T: Serialize>(value: T) -> Result<ToolOutput, ToolError> {
    serde_json::to_value(value)
        .map(|structured| ToolOutput {
            structured,
            extra: Vec::new(),
        })
        .map_err(|e| ToolError::new("INTERNAL", e.to_string()))
}

fn random_hex() -> String {
    format!("{:08x}", rand::random::<u32>())
}

fn egress(
    network: Option<Network>,
    hosts: Option<Vec<String>>,
    cidrs: Option<Vec<String>>,
    default: NetworkDefault,
) -> Result<Egress, ToolError> {
    let hosts = hosts.unwrap_or_default();
    let cidrs = cidrs.unwrap_or_default();
    args::hosts("allowHosts", &hosts)?;
    args::cidrs("allowCidrs", &cidrs)?;
    if !hosts.is_empty() || !cidrs.is_empty() {
        return Ok(Egress::Allow { hosts, cidrs });
    }
    Ok(match network {
        Some(Network::Open) => Egress::Open,
        Some(Network::Blocked) => Egress::Blocked,
        None => match default {
            NetworkDefault::Open => Egress::Open,
            NetworkDefault::Blocked => Egress::Blocked,
        },
    })
}

/// smolvm 1.32.2 accepts a create with no egress and fails the start when the image has to come
/// from a registry; say which argument grants the pull.
fn with_egress_hint(mut e: ToolError, egress: &Egress) -> ToolError {
    let lower = e.message.to_lowercase();
    let about_pull = ["registry", "pull", "manifest"]
        .iter()
        .any(|w| lower.contains(w));
    if about_pull && *egress != Egress::Open {
        e.message.push_str(
            "\nThe machine has no egress to the image's registry (network is blocked or an allow-list \
             without it), and the image is pulled from there. Pass network: \"open\" to create-machine, \
             or allowHosts naming the registry (Docker Hub: registry-1.docker.io, auth.docker.io, \
             production.cloudflare.docker.com).",
        );
    }
    e
}

impl Tools<'_> {
    pub async fn call(&self, name: &str, args: Value) -> Result<ToolOutput, ToolError> {
        if !matches!(
            name,
            "read-file" | "list-machines" | "get-machine" | "machine-logs"
        ) {
            // Anything else may change a machine's files: later pages must not come from a copy.
            self.backend.forget_cached_file();
        }
        let result = self.dispatch(name, args).await;
        if let Err(e) = &result
            && e.code == "TRANSPORT"
            && self.used.get() == Some(&FleetKind::Local)
        {
            self.backend.reset_local().await;
        }
        result
    }

    async fn dispatch(&self, name: &str, args: Value) -> Result<ToolOutput, ToolError> {
        match name {
            "list-machines" => self.list_machines(args).await,
            "get-machine" => self.get_machine(args).await,
            "create-machine" => self.create_machine(args).await,
            "start-machine" => self.start_machine(args).await,
            "stop-machine" => self.stop_machine(args).await,
            "delete-machine" => self.delete_machine(args).await,
            "run-command" => self.run_command(args).await,
            "run-once" => self.run_once(args).await,
            "read-file" => self.read_file(args).await,
            "write-file" => self.write_file(args).await,
            "branch-machine" => self.branch_machine(args).await,
            "machine-logs" => self.machine_logs(args).await,
            "pull-image" => self.pull_image(args).await,
            other => Err(ToolError::new(
                "UNKNOWN_TOOL",
                format!("no tool named {other}"),
            )),
        }
    }

    /// The fleet a call goes to: its `target` when both fleets are served, else the one fleet.
    async fn fleet(&self, target: Option<FleetKind>) -> Result<Fleet, ToolError> {
        let kind = match (self.backend.mode, target) {
            (Mode::Both, Some(kind)) => kind,
            (Mode::Both, None) => {
                return Err(ToolError::new(
                    "INVALID_ARGUMENT",
                    "target: required: this server reaches both fleets, so every call names local or cloud",
                ));
            }
            (Mode::Single(kind), None) => kind,
            (Mode::Single(kind), Some(_)) => {
                return Err(ToolError::new(
                    "INVALID_ARGUMENT",
                    format!(
                        "target: not an argument on this server, which serves only the {} fleet",
                        kind.as_str()
                    ),
                ));
            }
        };
        let _ = self.used.set(kind);
        self.backend.fleet(kind).await
    }

    /// Runs `work` unless the client cancels first; dropping `work` cancels its HTTP request.
    async fn cancellable<T>(
        &self,
        work: impl Future<Output = Result<T, ToolError>>,
    ) -> Result<T, ToolError> {
        tokio::select! {
            result = work => result,
            _ = self.ct.cancelled() => Err(ToolError::cancelled()),
        }
    }

    /// Waits until a command runs in the machine: an `echo` of a nonce, once a second, until the
    /// nonce comes back, the machine is gone, the deadline passes, or the client cancels.
    async fn wait_ready(&self, fleet: &Fleet, machine: &str) -> Result<(), ToolError> {
        let nonce = format!("ready-{}", random_hex());
        let limit = self.backend.config.ready_timeout_secs;
        let deadline = Instant::now() + Duration::from_secs(limit);
        let mut probe = ExecSpec::new(Command::Argv(vec!["echo".into(), nonce.clone()]));
        probe.timeout_secs = Some(READY_PROBE_TIMEOUT_SECS);
        let mut last;
        loop {
            match self
                .cancellable(async { Ok(fleet.exec(machine, &probe).await) })
                .await?
            {
                Ok(out) if String::from_utf8_lossy(&out.stdout).contains(&nonce) => return Ok(()),
                Ok(out) => {
                    last = format!(
                        "exit {}, stderr {:?}",
                        out.exit_code,
                        String::from_utf8_lossy(&out.stderr).trim()
                    )
                }
                Err(e) if e.kind == ErrorKind::NotFound => return Err(e.into()),
                Err(e) => last = e.to_string(),
            }
            if Instant::now() >= deadline {
                return Err(ToolError::new(
                    "NOT_READY",
                    format!(
                        "machine {machine} did not run a command within {limit} s (last attempt: {last})"
                    ),
                ));
            }
            self.cancellable(async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok(())
            })
            .await?;
        }
    }

    /// Deletes a machine whatever the client does meanwhile (clean-up is not cancellable).
    async fn delete_quietly(
        &self,
        fleet: &Fleet,
        kind: FleetKind,
        name: &str,
        id: &str,
    ) -> Result<(), ToolError> {
        let result = tokio::time::timeout(CLEANUP_DEADLINE, fleet.delete(id)).await;
        match result {
            Ok(Ok(_)) => {
                self.backend.forget(kind, name);
                Ok(())
            }
            Ok(Err(e)) if e.kind == ErrorKind::NotFound => {
                self.backend.forget(kind, name);
                Ok(())
            }
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(ToolError::new(
                "TIMEOUT",
                format!(
                    "deleting {name} took longer than {} s",
                    CLEANUP_DEADLINE.as_secs()
                ),
            )),
        }
    }

    async fn list_machines(&self, args: Value) -> Result<ToolOutput, ToolError> {
        let a: args::TargetOnly = args::parse(args)?;
        let fleet = self.fleet(a.target).await?;
        let machines = self.cancellable(async { Ok(fleet.list().await?) }).await?;
        out(results::MachineList { machines })
    }

    async fn get_machine(&self, args: Value) -> Result<ToolOutput, ToolError> {
        let a: args::MachineArgs = args::parse(args)?;
        args::machine_ref("name", &a.name)?;
        let fleet = self.fleet(a.target).await?;
        let machine = self
            .cancellable(async { Ok(fleet.get(&a.name).await?) })
            .await?;
        out(machine)
    }

    /// Name, image, size and egress: what create-machine and run-once share.
    fn base_spec(
        &self,
        name: String,
        image: &str,
        (cpus, memory_mb): (Option<u32>, Option<u32>),
        (network, hosts, cidrs): (Option<Network>, &Option<Vec<String>>, &Option<Vec<String>>),
        default_network: NetworkDefault,
    ) -> Result<CreateSpec, ToolError> {
        let config = &self.backend.config;
        let mut spec = CreateSpec::new(name, image);
        spec.cpus = cpus.unwrap_or(config.cpus);
        args::range("cpus", u64::from(spec.cpus), 1, 64)?;
        spec.memory_mb = memory_mb.unwrap_or(config.memory_mb);
        args::range("memoryMb", u64::from(spec.memory_mb), 128, 262_144)?;
        spec.egress = egress(network, hosts.clone(), cidrs.clone(), default_network)?;
        Ok(spec)
    }

    fn create_spec(
        &self,
        a: &args::CreateArgs,
        name: String,
        kind: FleetKind,
    ) -> Result<CreateSpec, ToolError> {
        args::image("image", &a.image)?;
        let mut spec = self.base_spec(
            name,
            &a.image,
            (a.cpus, a.memory_mb),
            (a.network, &a.allow_hosts, &a.allow_cidrs),
            self.backend.config.network_default,
        )?;
        let ports = a.ports.clone().unwrap_or_default();
        args::range("ports", ports.len() as u64, 0, 16)?;
        for (i, p) in ports.iter().enumerate() {
            let guest = args::port(&format!("ports[{i}].guest"), p.guest)?;
            let host = match p.host {
                Some(h) => Some(args::port(&format!("ports[{i}].host"), h)?),
                None => None,
            };
            spec.ports.push(PortMapping { guest, host });
        }
        let mounts = a.mounts.clone().unwrap_or_default();
        args::range("mounts", mounts.len() as u64, 0, 16)?;
        for (i, m) in mounts.iter().enumerate() {
            args::absolute_path(&format!("mounts[{i}].source"), &m.source)?;
            args::absolute_path(&format!("mounts[{i}].target"), &m.target)?;
            spec.mounts.push(Mount {
                source: m.source.clone(),
                target: m.target.clone(),
                readonly: m.readonly,
            });
        }
        if let Some(gb) = a.storage_gb {
            args::range("storageGb", u64::from(gb), 1, 16_384)?;
        }
        if let Some(gb) = a.overlay_gb {
            args::range("overlayGb", u64::from(gb), 1, 16_384)?;
        }
        spec.storage_gb = a.storage_gb;
        spec.overlay_gb = a.overlay_gb;
        if let Some(env) = &a.env {
            args::env("env", env)?;
            spec.env = env.clone();
        }
        spec.branchable = a.branchable;
        if kind == FleetKind::Local {
            spec.cmd = Some(KEEPALIVE.iter().map(|s| s.to_string()).collect());
        }
        Ok(spec)
    }

    async fn create_machine(&self, args: Value) -> Result<ToolOutput, ToolError> {
        let a: args::CreateArgs = args::parse(args)?;
        if let Some(name) = &a.name {
            args::machine_name("name", name)?;
        }
        let prefix = self.backend.config.machine_prefix.clone();
        let named_by_caller = a.name.is_some();
        let name = a
            .name
            .clone()
            .unwrap_or_else(|| format!("{prefix}{}", random_hex()));
        let ephemeral = name.starts_with(&prefix);
        // The fleet is chosen (and the local serve started) only once the arguments are known good.
        let kind_hint = a.target.unwrap_or(match self.backend.mode {
            Mode::Single(k) => k,
            Mode::Both => FleetKind::Local,
        });
        if a.start == Some(false) && a.branchable && kind_hint == FleetKind::Local {
            return Err(ToolError::new(
                "INVALID_ARGUMENT",
                "branchable: on the local fleet a machine becomes branchable when it starts; with \
                 start false, pass branchable to start-machine instead",
            ));
        }
        let mut spec = self.create_spec(&a, name.clone(), kind_hint)?;
        let fleet = self.fleet(a.target).await?;
        let kind = fleet.kind();
        if kind == FleetKind::Cloud {
            // The control plane's backstop for a session that dies without cleaning up.
            if ephemeral {
                spec.ttl_seconds = Some(self.backend.config.ephemeral_ttl_secs);
                spec.auto_stop_seconds = Some(self.backend.config.ephemeral_auto_stop_secs);
            }
            self.cancellable(self.backend.check_cloud_account()).await?;
        }
        if ephemeral {
            // Recorded before the create, so a crash between the two cannot leak the machine.
            self.backend.remember(kind, &name, self.session)?;
        }
        let created = self
            .cancellable(async { Ok(fleet.create(&spec).await?) })
            .await
            .map_err(|e| with_egress_hint(e, &spec.egress));
        let machine = match created {
            Ok(m) => m,
            Err(e) => {
                // A create that failed or was cancelled may still have made the machine.
                if ephemeral && e.code != "CONFLICT" {
                    let _ = self.delete_quietly(&fleet, kind, &name, &name).await;
                    self.backend.forget(kind, &name);
                }
                return Err(e);
            }
        };
        if ephemeral {
            self.backend.remember_id(kind, &name, &machine.id);
        }
        if !a.start.unwrap_or(true) {
            return out(results::Created {
                machine,
                ephemeral,
                ready: false,
            });
        }
        let started = async {
            let m = self
                .cancellable(async { Ok(fleet.start(&machine.id, a.branchable).await?) })
                .await?;
            self.wait_ready(&fleet, &m.id).await?;
            Ok::<Machine, ToolError>(m)
        }
        .await;
        match started {
            Ok(m) => out(results::Created {
                machine: m,
                ephemeral,
                ready: true,
            }),
            Err(e) => {
                let mut e = with_egress_hint(e, &spec.egress);
                if named_by_caller {
                    e.message.push_str(&format!(
                        "\n{name} was created and is left as it is for you to inspect: start-machine \
                         tries again, delete-machine removes it{}.",
                        if ephemeral { ", and it is deleted when this session ends" } else { "" }
                    ));
                } else {
                    match self.delete_quietly(&fleet, kind, &name, &machine.id).await {
                        Ok(()) => e.message.push_str(&format!("\n{name} was deleted again.")),
                        Err(d) => e.message.push_str(&format!(
                            "\n{name} could not be deleted ({}); it stays recorded and is deleted when this session ends.",
                            d.message
                        )),
                    }
                }
                Err(e)
            }
        }
    }

    async fn start_machine(&self, args: Value) -> Result<ToolOutput, ToolError> {
        let a: args::StartArgs = args::parse(args)?;
        args::machine_ref("name", &a.name)?;
        let fleet = self.fleet(a.target).await?;
        let machine = self
            .cancellable(async {
                // Locally, branchability is chosen at each start: what the call asks, else what
                // the machine had. On cloud it was fixed at create.
                let branchable = match &fleet {
                    Fleet::Local(_) => match a.branchable {
                        Some(b) => b,
                        None => fleet.get(&a.name).await?.branchable,
                    },
                    Fleet::Cloud(_) => {
                        if a.branchable == Some(true) && !fleet.get(&a.name).await?.branchable {
                            return Err(ToolError::new(
                                "CONFLICT",
                                "branchable: a cloud machine is branchable only if it was created \
                                 with branchable true; create a new one for that",
                            ));
                        }
                        false
                    }
                };
                Ok(fleet.start(&a.name, branchable).await?)
            })
            .await?;
        let wait = a.wait.unwrap_or(true);
        if wait {
            self.wait_ready(&fleet, &machine.id).await?;
        }
        out(results::Started {
            machine,
            ready: wait,
        })
    }

    async fn stop_machine(&self, args: Value) -> Result<ToolOutput, ToolError> {
        let a: args::MachineArgs = args::parse(args)?;
        args::machine_ref("name", &a.name)?;
        let fleet = self.fleet(a.target).await?;
        let machine = self
            .cancellable(async { Ok(fleet.stop(&a.name).await?) })
            .await?;
        out(results::Stopped { machine })
    }

    async fn delete_machine(&self, args: Value) -> Result<ToolOutput, ToolError> {
        let a: args::MachineArgs = args::parse(args)?;
        args::machine_ref("name", &a.name)?;
        let fleet = self.fleet(a.target).await?;
        let deleted = self
            .cancellable(async { Ok(fleet.delete(&a.name).await?) })
            .await?;
        // Only prefixed names are ever recorded (a cloud id may stand for one).
        if a.name.starts_with(&self.backend.config.machine_prefix)
            || fleet.kind() == FleetKind::Cloud
        {
            self.backend.forget(fleet.kind(), &a.name);
        }
        out(deleted)
    }

    fn timeout(&self, arg: Option<u64>) -> Result<u64, ToolError> {
        let config = &self.backend.config;
        let secs = arg.unwrap_or(config.exec_timeout_secs);
        if secs == 0 || secs > config.max_exec_timeout_secs {
            return Err(ToolError::new(
                "INVALID_ARGUMENT",
                format!(
                    "timeoutSecs: {secs} is not accepted: give 1 to {} (this server's ceiling, maxExecTimeoutSecs)",
                    config.max_exec_timeout_secs
                ),
            ));
        }
        Ok(secs)
    }

    fn exec_spec(
        &self,
        command: &args::CommandArg,
        workdir: &Option<String>,
        env: &Option<std::collections::BTreeMap<String, String>>,
        stdin: &Option<String>,
        timeout: Option<u64>,
    ) -> Result<ExecSpec, ToolError> {
        let mut spec = ExecSpec::new(args::command("command", command)?);
        if let Some(w) = workdir {
            args::absolute_path("workdir", w)?;
        }
        spec.workdir = workdir.clone();
        if let Some(env) = env {
            args::env("env", env)?;
            spec.env = env.clone();
        }
        spec.stdin = stdin.clone();
        spec.timeout_secs = Some(self.timeout(timeout)?);
        Ok(spec)
    }

    /// Whether the machine is stopped (so the next operation starts it).
    async fn is_stopped(&self, fleet: &Fleet, machine: &str) -> Result<bool, ToolError> {
        let m = self
            .cancellable(async { Ok(fleet.get(machine).await?) })
            .await?;
        Ok(!m.is_running())
    }

    async fn run_command(&self, args: Value) -> Result<ToolOutput, ToolError> {
        let a: args::RunCommandArgs = args::parse(args)?;
        args::machine_ref("name", &a.name)?;
        let spec = self.exec_spec(&a.command, &a.workdir, &a.env, &a.stdin, a.timeout_secs)?;
        let fleet = self.fleet(a.target).await?;
        let started_machine = self.is_stopped(&fleet, &a.name).await?;
        let output = self
            .cancellable(async { Ok(fleet.exec(&a.name, &spec).await?) })
            .await?;
        let budget = self.backend.config.max_output_bytes;
        let mut stdout = head_tail(&output.stdout, budget);
        let mut stderr = head_tail(&output.stderr, budget);
        let truncated = stdout.dropped > 0
            || stderr.dropped > 0
            || output.stdout_cut_upstream
            || output.stderr_cut_upstream;
        let mut overflow = Vec::new();
        if stdout.dropped > 0 || stderr.dropped > 0 {
            let stamp = random_hex();
            for (stream, bytes, shaped) in [
                ("stdout", &output.stdout, &mut stdout),
                ("stderr", &output.stderr, &mut stderr),
            ] {
                if shaped.dropped == 0 {
                    continue;
                }
                let path = format!("/tmp/smol-mcp-{stamp}.{stream}");
                let written = self
                    .cancellable(async {
                        Ok(fleet.write_file(&a.name, &path, bytes.clone()).await?)
                    })
                    .await;
                match written {
                    Ok(_) => {
                        shaped.text.push_str(&format!(
                            "\n[the whole {stream}, {} bytes, is in the machine at {path}]",
                            bytes.len()
                        ));
                        overflow.push(Overflow {
                            stream: stream.into(),
                            path,
                            bytes: bytes.len() as u64,
                        });
                    }
                    Err(e) => {
                        tracing::warn!(%path, error = %e.message, "could not write the whole stream into the machine")
                    }
                }
            }
        }
        out(results::CommandRun {
            stdout: stdout.text,
            stderr: stderr.text,
            exit_code: output.exit_code,
            timed_out: output.timed_out(),
            truncated,
            overflow,
            started_machine,
        })
    }

    async fn run_once(&self, args: Value) -> Result<ToolOutput, ToolError> {
        let a: args::RunOnceArgs = args::parse(args)?;
        args::image("image", &a.image)?;
        let exec = self.exec_spec(&a.command, &a.workdir, &a.env, &a.stdin, a.timeout_secs)?;
        let config = &self.backend.config;
        let name = format!("{}once-{}", config.machine_prefix, random_hex());
        let mut spec = self.base_spec(
            name.clone(),
            &a.image,
            (a.cpus, a.memory_mb),
            (a.network, &a.allow_hosts, &a.allow_cidrs),
            config.run_once_network,
        )?;
        let fleet = self.fleet(a.target).await?;
        let kind = fleet.kind();
        match kind {
            FleetKind::Local => spec.cmd = Some(KEEPALIVE.iter().map(|s| s.to_string()).collect()),
            FleetKind::Cloud => {
                spec.ttl_seconds = Some(config.ephemeral_ttl_secs);
                spec.auto_stop_seconds = Some(config.ephemeral_auto_stop_secs);
                self.cancellable(self.backend.check_cloud_account()).await?;
            }
        }
        self.backend.remember(kind, &name, self.session)?;
        let mut id = name.clone();
        let body = async {
            let created = self
                .cancellable(async { Ok(fleet.create(&spec).await?) })
                .await
                .map_err(|e| with_egress_hint(e, &spec.egress))?;
            id = created.id.clone();
            self.backend.remember_id(kind, &name, &id);
            self.cancellable(async { Ok(fleet.start(&id, false).await?) })
                .await
                .map_err(|e| with_egress_hint(e, &spec.egress))?;
            self.wait_ready(&fleet, &id).await?;
            self.cancellable(async { Ok(fleet.exec(&id, &exec).await?) })
                .await
        };
        let result = body.await;
        // Whatever happened, the machine goes (a cancelled call included).
        let deleted = self.delete_quietly(&fleet, kind, &name, &id).await;
        let output = result?;
        if let Err(e) = deleted {
            tracing::warn!(machine = %name, error = %e.message, "run-once could not delete its machine; it stays recorded for the session's clean-up");
        }
        let budget = config.max_output_bytes;
        let stdout = head_tail(&output.stdout, budget);
        let stderr = head_tail(&output.stderr, budget);
        out(results::RunOnce {
            truncated: stdout.dropped > 0
                || stderr.dropped > 0
                || output.stdout_cut_upstream
                || output.stderr_cut_upstream,
            timed_out: output.timed_out(),
            stdout: stdout.text,
            stderr: stderr.text,
            exit_code: output.exit_code,
            machine: name,
        })
    }

    async fn read_file(&self, args: Value) -> Result<ToolOutput, ToolError> {
        let a: args::ReadFileArgs = args::parse(args)?;
        args::machine_ref("name", &a.name)?;
        args::absolute_path("path", &a.path)?;
        if a.length == Some(0) {
            return Err(ToolError::new(
                "INVALID_ARGUMENT",
                "length: give at least 1, or leave it out to read to the end",
            ));
        }
        let fleet = self.fleet(a.target).await?;
        let started_machine = self.is_stopped(&fleet, &a.name).await?;
        if started_machine {
            self.wait_ready(&fleet, &a.name).await?;
        }
        let bytes = self
            .file_bytes(&fleet, &a.name, &a.path, a.offset.unwrap_or(0) > 0)
            .await?;
        let size = bytes.len() as u64;
        let offset = a.offset.unwrap_or(0).min(size);
        let rest = &bytes[offset as usize..];
        let budget = self.backend.config.max_output_bytes;
        // Base64 grows by a third: a page's encoded content stays within the budget.
        let default_len = match a.encoding {
            Encoding::Utf8 => budget,
            Encoding::Base64 => budget / 4 * 3,
        };
        let mut len = a
            .length
            .map_or(default_len, |l| usize::try_from(l).unwrap_or(usize::MAX))
            .min(rest.len());
        if a.encoding == Encoding::Utf8 && len < rest.len() {
            // Never split a character across pages; the next page starts where this one ends.
            len = utf8_prefix_len(rest, len).max(1.min(len));
        }
        let page = &rest[..len];
        let content = match a.encoding {
            Encoding::Utf8 => String::from_utf8_lossy(page).into_owned(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(page),
        };
        out(results::FileRead {
            path: a.path,
            content,
            encoding: match a.encoding {
                Encoding::Utf8 => "utf8".into(),
                Encoding::Base64 => "base64".into(),
            },
            size,
            offset,
            bytes: len as u64,
            eof: offset + len as u64 >= size,
            started_machine,
        })
    }

    /// The whole file (neither API reads a range). A read that continues at an offset reuses
    /// the copy the same read fetched, for up to `PAGE_CACHE_SECS`, unless a call that can change
    /// a machine came in between; a read from offset 0 always fetches afresh.
    async fn file_bytes(
        &self,
        fleet: &Fleet,
        machine: &str,
        path: &str,
        continuing: bool,
    ) -> Result<std::sync::Arc<Vec<u8>>, ToolError> {
        let kind = fleet.kind();
        if continuing
            && let Ok(cache) = self.backend.file_cache.lock()
            && let Some(c) = cache.as_ref()
            && c.kind == kind
            && c.machine == machine
            && c.path == path
            && c.fetched.elapsed() < Duration::from_secs(PAGE_CACHE_SECS)
        {
            return Ok(c.bytes.clone());
        }
        let bytes = std::sync::Arc::new(
            self.cancellable(async { Ok(fleet.read_file(machine, path).await?) })
                .await?,
        );
        if bytes.len() <= PAGE_CACHE_MAX_BYTES
            && let Ok(mut cache) = self.backend.file_cache.lock()
        {
            *cache = Some(super::backend::CachedFile {
                kind,
                machine: machine.to_owned(),
                path: path.to_owned(),
                bytes: bytes.clone(),
                fetched: Instant::now(),
            });
        }
        Ok(bytes)
    }

    async fn write_file(&self, args: Value) -> Result<ToolOutput, ToolError> {
        let a: args::WriteFileArgs = args::parse(args)?;
        args::machine_ref("name", &a.name)?;
        args::absolute_path("path", &a.path)?;
        let bytes = match a.encoding {
            Encoding::Utf8 => a.content.into_bytes(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(a.content.trim())
                .map_err(|e| {
                    ToolError::new(
                        "INVALID_ARGUMENT",
                        format!("content: not valid base64 ({e})"),
                    )
                })?,
        };
        let fleet = self.fleet(a.target).await?;
        let started_machine = self.is_stopped(&fleet, &a.name).await?;
        // A file written before the workload's container is up lands under a mount that then
        // hides it; a command that has run means the container is up.
        self.wait_ready(&fleet, &a.name).await?;
        let size = self
            .cancellable(async { Ok(fleet.write_file(&a.name, &a.path, bytes).await?) })
            .await?;
        out(results::FileWritten {
            path: a.path,
            size,
            started_machine,
        })
    }

    async fn branch_machine(&self, args: Value) -> Result<ToolOutput, ToolError> {
        let a: args::BranchArgs = args::parse(args)?;
        args::machine_ref("name", &a.name)?;
        args::machine_name("childName", &a.child_name)?;
        let fleet = self.fleet(a.target).await?;
        let kind = fleet.kind();
        let ephemeral = a
            .child_name
            .starts_with(&self.backend.config.machine_prefix);
        if ephemeral {
            self.backend.remember(kind, &a.child_name, self.session)?;
        }
        let child = self
            .cancellable(async { Ok(fleet.branch(&a.name, &a.child_name, a.branchable).await?) })
            .await;
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                if ephemeral && e.code != "CONFLICT" {
                    let _ = self
                        .delete_quietly(&fleet, kind, &a.child_name, &a.child_name)
                        .await;
                }
                if ephemeral {
                    self.backend.forget(kind, &a.child_name);
                }
                return Err(e);
            }
        };
        if ephemeral {
            self.backend.remember_id(kind, &a.child_name, &child.id);
        }
        let wait = a.wait.unwrap_or(true);
        if wait {
            self.wait_ready(&fleet, &child.id).await.map_err(|mut e| {
                e.message.push_str(&format!(
                    "\nThe child {} exists; delete-machine removes it.",
                    a.child_name
                ));
                e
            })?;
        }
        out(results::Branched {
            machine: child,
            ready: wait,
            ephemeral,
        })
    }

    async fn machine_logs(&self, args: Value) -> Result<ToolOutput, ToolError> {
        let a: args::LogsArgs = args::parse(args)?;
        args::machine_ref("name", &a.name)?;
        let tail = a.tail.unwrap_or(self.backend.config.logs_tail as u64);
        args::range("tail", tail, 1, 10_000)?;
        let fleet = self.fleet(a.target).await?;
        let page = self
            .cancellable(async {
                Ok(fleet
                    .logs(&a.name, tail as usize, a.cursor.as_deref())
                    .await?)
            })
            .await?;
        // Keep the newest lines that fit the budget.
        let budget = self.backend.config.max_output_bytes;
        let mut used = 0;
        let mut keep = 0;
        for line in page.lines.iter().rev() {
            if used + line.len() + 1 > budget {
                break;
            }
            used += line.len() + 1;
            keep += 1;
        }
        let truncated = keep < page.lines.len();
        let lines = page.lines[page.lines.len() - keep..].to_vec();
        out(results::Logs {
            lines,
            cursor: page.cursor,
            truncated,
        })
    }

    async fn pull_image(&self, args: Value) -> Result<ToolOutput, ToolError> {
        let a: args::PullArgs = args::parse(args)?;
        args::machine_ref("name", &a.name)?;
        args::image("image", &a.image)?;
        let fleet = self.fleet(a.target).await?;
        let image = self
            .cancellable(async { Ok(fleet.pull_image(&a.name, &a.image).await?) })
            .await?;
        out(image)
    }
}
