//! The local fleet: `smolvm serve` on this host, through the generated smolvm client.

use super::FleetApi;
use super::api::{BranchableAt, Capabilities, HostPorts, PortAddress};
use super::error::{ErrorKind, FleetError, FleetResult};
use super::file_stream::FileStream;
use super::model::{
    BranchSpec, CreateSpec, Deleted, Egress, EgressDenial, ExecOutput, ExecSpec, LogPage,
    LogSource, Machine, MachineNetwork, MachineState, PortMapping, PublishedPort, PulledImage,
    epoch_to_rfc3339,
};
use super::model::{PoolLease, PoolSetup, PoolStatus};
use super::transport::LocalEndpoint;
use super::upstream::{send, send_raw, within};
use crate::generated::smolvm::{self, types};
use base64::Engine as _;
use futures::{StreamExt, TryStreamExt};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::Instrument as _;

/// The engine ends a request on most machine routes (list, get, fork and branches, stop, delete,
/// files, the image list, egress events) after 300 s with a 408 and an empty body, whatever is
/// still going on behind it (its `TimeoutLayer`, `API_REQUEST_TIMEOUT_SECS`). 1.32.2 took create,
/// start, exec, exec/stream, run and images/pull out of that layer (the 300 s constant's place in
/// the 1.32.2 router; each route held open 330 s against the real serve; plain execs of 321 s and
/// 331 s answered 200 with all their output on the real guest), and logs were never in it.
pub const ENGINE_REQUEST_DEADLINE: Duration = Duration::from_secs(300);
/// Waiting this much past the engine's deadline lets its 408, which says what happened, arrive
/// before this server's own deadline would.
const PAST_ENGINE_DEADLINE: Duration = Duration::from_secs(10);
/// The largest upload the engine takes (smolvm src/api/handlers/files.rs `upload_file`,
/// `MAX_FILE_UPLOAD_BYTES`; "MiB upload limit" in the 1.32.2 binary): over it, a 413 in plain
/// text "file exceeds the 100 MiB upload limit".
pub const MAX_UPLOAD_BYTES: u64 = 100 * 1024 * 1024;

/// Everything the fleet vocabulary has, the engine does; it boots a machine without an image
/// (its bundled Alpine) and makes one branchable at a start.
pub static CAPABILITIES: Capabilities = Capabilities {
    lacks: &[],
    needs_image: None,
    branchable_at: BranchableAt::Start,
    metered: false,
    // Seen on the real 1.32.2 guest: the engine's exec boots a stopped machine itself, saying
    // nothing for the 20 s or so that takes.
    exec_boots_silently: true,
    ids_apart_from_names: false,
    arrives_late: false,
    host_ports: HostPorts::Caller,
    kept_name_prefixes: &[POOL_SOURCE_PREFIX, POOL_WORKER_PREFIX],
    // A frozen source is `frozen` in the engine's listing (docs/bases-engine.md).
    shows_frozen: true,
};
/// The engine's pause refusals, with what the agent can do instead. 1.32.2 refuses a capture
/// that would carry "host mounts" (staged ones too), and "cannot pause a machine while branches
/// depend on its live state" (the words of its checkpoint code, `strings smol-vmm`).
fn pause_refused(mut e: FleetError) -> FleetError {
    if e.message.contains("mount") {
        e.message.push_str(
            "\nA machine with host mounts cannot be paused: stop-machine keeps its disk, or \
             create one without mounts (copy files in with write-file).",
        );
    } else if e.message.contains("branch") || e.message.contains("fork") {
        e.message.push_str(
            "\nA branch source with live children cannot be paused: delete its children \
             first.",
        );
    }
    e
}

/// Each stream of an exec is capped at this many bytes in the guest agent: past it the VM path
/// answers 500 "command output exceeded ..." ("command output exceeded " / " bytes and was
/// truncated. Use streaming exec (exec_stream / execStream) for large output." in the 1.32.2
/// agent, `strings usr/local/bin/smolvm-agent`), and the container path stops reading.
pub const ENGINE_OUTPUT_CAP_BYTES: u64 = 11 * 1024 * 1024;

// Deadlines per call, fitted to what the engine allows each route. Those the engine bounds end
// just past its deadline, so that its 408 arrives first and says what happened.
const DEFAULT: Duration = Duration::from_secs(60);
/// A create of a new local image archive stages it first (about a minute under TCG).
const CREATE: Duration = Duration::from_secs(300);
/// A start waits for the boot (the engine gives up after 30 s without boot progress), then a
/// cold pull of the image (which the engine does not bound), then the workload's launch.
const START: Duration = Duration::from_secs(900);
/// A branch waits for the child's boot, under the engine's request deadline.
const BRANCH: Duration = ENGINE_REQUEST_DEADLINE.saturating_add(PAST_ENGINE_DEADLINE);
const STOP_DELETE: Duration = Duration::from_secs(120);
/// A pause saves the guest's whole memory. On the nested engine (TCG) a 128 MiB machine's took
/// over 11 minutes, the engine answering 408 at its 300 s request deadline while the save went
/// on: the wait follows the machine's state to the end, bounded by this.
const PAUSE: Duration = Duration::from_secs(30 * 60);
/// How often a pause the engine stopped answering for is looked at.
const PAUSE_POLL: Duration = Duration::from_secs(5);
/// A file transfer boots a stopped machine first, all under the engine's request deadline.
const FILES: Duration = ENGINE_REQUEST_DEADLINE.saturating_add(PAST_ENGINE_DEADLINE);
const LOGS: Duration = Duration::from_secs(15);
/// The guest agent gives up on a pull after 600 s without progress; the route has no deadline.
const PULL: Duration = Duration::from_secs(900);
const HEALTH: Duration = Duration::from_secs(2);
/// The engine reads egress events from a local file: an answer slower than this is not worth
/// holding a command's result for.
const EGRESS_EVENTS: Duration = Duration::from_secs(5);
/// An exec that ended this recently may have left refusals that fall in the next command's
/// window: the engine's stamps are whole seconds, cut down, placed on this host's clock within
/// about a second, and the window has a second of slack on each side.
const RECENT_EXEC: Duration = Duration::from_secs(4);
/// Values supplied this recently are not sent again for the same machine (the engine holds
/// them until its own restart; a start and its readiness probe would otherwise send them twice).
const SUPPLIED_FRESH: Duration = Duration::from_secs(5);
/// How long a start not waited for is given to fail at once (a missing machine, a conflict).
const BEGIN_START_WATCH: Duration = Duration::from_secs(1);
/// What an empty workload log means, and where else to look.
const NO_WORKLOAD_LOG: &str = "the machine's workload has printed nothing: a machine without an \
     image has no workload, and one this server made from an image runs the image's own command \
     only if it stays up. A command's output comes back in its result (or job-output for a \
     background job); machine-logs with source engine shows the boot and the guest agent's log";
/// The digest the engine reports for a pull into a machine made from a local image archive.
const PACKED_DIGEST: &str = "packed";
/// What an exec without its own timeout may take, and the slack added to one that has one (the
/// agent's own socket wait is the timeout plus 5 s).
const EXEC_DEFAULT_SECS: u64 = 120;
const EXEC_SLACK: Duration = Duration::from_secs(30);
/// What an exec allowed to start a stopped machine adds for that boot.
const EXEC_BOOT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone)]
pub struct LocalFleet {
    client: smolvm::Client,
    endpoint: LocalEndpoint,
    /// The machines whose start goes on without a caller waiting for it ([`FleetApi::begin_start`]):
    /// one such start per machine, however often it is asked for.
    starting: Arc<Mutex<HashSet<String>>>,
    /// When each machine's latest exec ended, for [`FleetApi::egress_baseline`]; entries older
    /// than [`RECENT_EXEC`] are dropped as others are added.
    recent_execs: Arc<Mutex<HashMap<String, Instant>>>,
    /// Each machine's network as the engine last answered it ([`FleetApi::known_network`]),
    /// so that a command can run without asking for its machine first; forgotten at delete
    /// and replaced whole at each list.
    networks: Arc<Mutex<HashMap<String, MachineNetwork>>>,
    /// The values to supply before a machine with credential bindings boots: the engine holds
    /// them in memory only and applies them at a boot, so every start this fleet sends (and
    /// every exec allowed to boot a stopped machine) is preceded by them.
    credentials: Option<Arc<dyn crate::fleet::CredentialValues>>,
    /// When each machine's values were last supplied, and a digest of them: a start's
    /// readiness probe (an exec that may boot) need not send the same values again.
    supplied: Arc<Mutex<HashMap<String, (Instant, u64)>>>,
    /// The pool leases this fleet holds, by machine: each is heartbeated while it is here,
    /// and a delete of its machine completes it instead (the engine then deletes the
    /// machine; a DELETE would fail the lease: "leased worker process exited").
    leases: Arc<Mutex<HashMap<String, PoolLease>>>,
    /// The host as a published port's address names it: where the engine binds published
    /// ports (loopback unless the operator's publishAddress says otherwise).
    publish_host: String,
}

/// A lease asked for lives this long unheartbeated; the engine deletes its machine past it.
const LEASE_TTL_SECS: u64 = 300;
/// How often a held lease is heartbeated: three times within its TTL, so one lost heartbeat
/// (a busy engine) does not cost the agent its machine.
const LEASE_HEARTBEAT: Duration = Duration::from_secs(LEASE_TTL_SECS / 3);
/// A pool's source machine's name starts with this; the server keeps it out of list-machines.
pub const POOL_SOURCE_PREFIX: &str = "smolmcp-pool-";
/// The engine names a pool's workers `pool-<pool>-<8 hex>`; the server's pools are named
/// `smolmcp-<name>`.
const POOL_WORKER_PREFIX: &str = "pool-smolmcp-";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub status: String,
    /// The release (`1.32.2`), unlike the spec's `info.version`.
    pub version: String,
    /// The serve runs inside a virtual machine with nested virtualization (its own reading).
    pub nested_virt: bool,
    pub uptime_secs: Option<i64>,
    /// Its machines: all of them, and those running.
    pub machines: Option<(u64, u64)>,
}

impl LocalFleet {
    pub fn new(endpoint: LocalEndpoint) -> FleetResult<Self> {
        let client = smolvm::Client::new_with_client(&endpoint.base_url(), endpoint.http_client()?);
        Ok(LocalFleet {
            client,
            endpoint,
            starting: Arc::default(),
            recent_execs: Arc::default(),
            networks: Arc::default(),
            credentials: None,
            supplied: Arc::default(),
            leases: Arc::default(),
            publish_host: "127.0.0.1".to_owned(),
        })
    }

    /// This fleet with the host its published ports' addresses name (an IP address, a
    /// bracketed IPv6 one, or a host name).
    pub fn with_publish_host(mut self, host: impl Into<String>) -> Self {
        self.publish_host = host.into();
        self
    }

    /// This fleet with the source of the credential values it supplies before a boot.
    pub fn with_credentials(mut self, values: Arc<dyn crate::fleet::CredentialValues>) -> Self {
        self.credentials = Some(values);
        self
    }

    /// Supplies `machine`'s credential values, if it has bindings, before something boots it.
    /// A machine the engine says has none of them (made elsewhere under a recorded name) is
    /// forgotten, and the boot goes on without values.
    async fn supply_credentials(&self, machine: &str) -> FleetResult<()> {
        let Some(source) = &self.credentials else {
            return Ok(());
        };
        let values = match source.values_for(machine).await {
            None => return Ok(()),
            Some(values) => values?,
        };
        let digest = {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            for (name, value) in &values {
                name.hash(&mut hasher);
                value.expose().hash(&mut hasher);
            }
            hasher.finish()
        };
        let fresh = self.supplied.lock().is_ok_and(|supplied| {
            supplied
                .get(machine)
                .is_some_and(|(at, d)| *d == digest && at.elapsed() < SUPPLIED_FRESH)
        });
        if fresh {
            return Ok(());
        }
        let ctx = format!("credential values of {machine}");
        let body = types::CredentialValuesRequest {
            values: values
                .iter()
                .map(|(name, value)| (name.clone(), value.expose().to_owned()))
                .collect(),
        };
        let request = self.client.put_credential_values().name(machine).body(body);
        match send(&ctx, DEFAULT, request.send()).await {
            Ok(_) => {
                if let Ok(mut supplied) = self.supplied.lock() {
                    supplied.insert(machine.to_owned(), (Instant::now(), digest));
                }
                Ok(())
            }
            Err(e)
                if e.kind == ErrorKind::Invalid
                    && e.message.contains("has no credential binding") =>
            {
                tracing::warn!(%machine, "the engine says this machine has no credential bindings; forgetting the ones recorded for it");
                source.forget(machine).await;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Remembers the network of a machine the engine just answered.
    fn seen(&self, machine: Machine) -> Machine {
        if let Ok(mut networks) = self.networks.lock() {
            networks.insert(machine.name.clone(), machine.network.clone());
        }
        machine
    }

    /// A machine the engine no longer has (deleted elsewhere) is forgotten, so the next
    /// command asks for it again.
    fn gone_if_not_found(&self, name: &str, e: &FleetError) {
        if e.is_not_found() {
            self.forget(name);
        }
    }

    /// Heartbeats `lease` while this fleet holds it; a lease the engine says has ended is
    /// let go of.
    fn keep_alive(&self, lease: PoolLease) {
        let (client, leases) = (self.client.clone(), self.leases.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LEASE_HEARTBEAT).await;
                let held = leases
                    .lock()
                    .map(|l| l.get(&lease.machine).is_some_and(|h| h.id == lease.id))
                    .unwrap_or(false);
                if !held {
                    return;
                }
                let ctx = format!("heartbeat the lease of {}", lease.machine);
                let request = client.heartbeat_lease().name(&lease.pool).lease(&lease.id);
                match send(&ctx, DEFAULT, request.send()).await {
                    Ok(_) => {}
                    Err(e) if matches!(e.kind, ErrorKind::NotFound | ErrorKind::Conflict) => {
                        tracing::warn!(machine = %lease.machine, error = %e, "a pool lease ended under its holder");
                        if let Ok(mut leases) = leases.lock() {
                            leases.remove(&lease.machine);
                        }
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(machine = %lease.machine, error = %e, "could not heartbeat a pool lease; trying again")
                    }
                }
            }
        }.in_current_span());
    }

    fn forget(&self, name: &str) {
        if let Ok(mut networks) = self.networks.lock() {
            networks.remove(name);
        }
    }

    pub fn endpoint(&self) -> &LocalEndpoint {
        &self.endpoint
    }

    fn exec_ended(&self, machine: &str) {
        if let Ok(mut recent) = self.recent_execs.lock() {
            let now = Instant::now();
            recent.retain(|_, ended| now.duration_since(*ended) < RECENT_EXEC);
            recent.insert(machine.to_owned(), now);
        }
    }

    pub async fn health(&self) -> FleetResult<Health> {
        let h = send("health", HEALTH, self.client.health().send()).await?;
        Ok(Health {
            status: h.status,
            version: h.version,
            nested_virt: h.nested_virt,
            uptime_secs: h.uptime_seconds,
            machines: h.machines.map(|m| (m.total, m.running)),
        })
    }
}

#[async_trait::async_trait]
impl FleetApi for LocalFleet {
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }

    fn upload_refusal(&self, len: u64) -> Option<String> {
        (len > MAX_UPLOAD_BYTES).then(|| upload_refusal(len))
    }

    async fn list(&self) -> FleetResult<Vec<Machine>> {
        let list = send("list machines", DEFAULT, self.client.list_machines().send()).await?;
        // A pool's source and its ready (unleased) workers are the server's, not the agent's:
        // a command run in a ready worker would be in the machine the next lease hands out.
        let machines: Vec<Machine> = list
            .machines
            .into_iter()
            .filter(|m| !pool_internal(m))
            .map(view)
            .collect();
        if let Ok(mut networks) = self.networks.lock() {
            *networks = machines
                .iter()
                .map(|m| (m.name.clone(), m.network.clone()))
                .collect();
        }
        Ok(machines)
    }

    fn known_network(&self, name: &str) -> Option<MachineNetwork> {
        self.networks.lock().ok()?.get(name).cloned()
    }

    /// The engine's 409 for an exec with `autoStart: false` on a machine that is not running,
    /// in its own words (`machine is not running and autoStart is false`, on both exec routes
    /// of the real 1.32.2 serve; compared against the fake in tests/guest/fake_vs_engine.rs).
    fn is_not_running(&self, e: &FleetError) -> bool {
        e.kind == ErrorKind::Conflict && e.message.contains("is not running")
    }

    async fn kept(&self, name: &str) -> FleetResult<Option<String>> {
        if name.starts_with(POOL_SOURCE_PREFIX) {
            return Ok(Some(format!(
                "{name} is the source of one of the operator's warm pools, which this server \
                 keeps to clone from: no tool may use it or take its name"
            )));
        }
        let leased_here = self.leases.lock().is_ok_and(|l| l.contains_key(name));
        if !name.starts_with(POOL_WORKER_PREFIX) || leased_here {
            return Ok(None);
        }
        // Leased by another server on this engine, or a machine that only looks like a clone:
        // the engine says whether a pool still holds it ready.
        let ctx = format!("get machine {name}");
        match send(&ctx, DEFAULT, self.client.get_machine().name(name).send()).await {
            Ok(info) if pool_internal(&info) => Ok(Some(format!(
                "{name} is a ready machine of one of the operator's warm pools, leased to no \
                 one: the next create-machine of its pool's shape hands it out as it is, so \
                 nothing may run in it or change it before. create-machine without a name \
                 leases one"
            ))),
            Ok(_) => Ok(None),
            Err(e) if e.kind == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn get(&self, name: &str) -> FleetResult<Machine> {
        let ctx = format!("get machine {name}");
        let info = send(&ctx, DEFAULT, self.client.get_machine().name(name).send())
            .await
            .inspect_err(|e| self.gone_if_not_found(name, e))?;
        let mut machine = self.seen(view(info));
        // The engine has no `starting` state: a machine reads as before until its boot is done.
        let starting = self
            .starting
            .lock()
            .map(|s| s.contains(name))
            .unwrap_or(false);
        if starting && !machine.is_running() {
            machine.state = MachineState::Starting;
        }
        Ok(machine)
    }

    async fn create(&self, spec: &CreateSpec) -> FleetResult<Machine> {
        let ctx = format!("create machine {}", spec.name);
        let request = self.client.create_machine().body(create_body(spec));
        Ok(self.seen(view(send(&ctx, CREATE, request.send()).await?)))
    }

    /// Locally, branchability is chosen at each start: a machine started without it cannot be
    /// branched until it is stopped and started again with it. `None` keeps what it had.
    ///
    /// The engine answers a start of a running machine with its record unchanged, branchable
    /// or not (observed on the 1.32.2 engine; not yet driven on the nested guest), so asking a running machine to become branchable is
    /// refused before the engine is asked: otherwise the start looks done and the branch after
    /// it fails. Not stopped and started here: a stop loses the guest's memory and processes,
    /// which the caller should choose.
    async fn start(&self, name: &str, branchable: Option<bool>) -> FleetResult<Machine> {
        let branchable = match branchable {
            Some(false) => false,
            wanted => {
                let machine = self.get(name).await?;
                // The engine refuses to start a paused machine ("start: machine has saved
                // execution; use resume"): starting it means continuing it.
                if machine.phase() == super::model::Phase::Paused {
                    return self.resume(name).await;
                }
                // A frozen branch source is 409 to a start ("is frozen because ..."): refused
                // here in the same word, without the request.
                if machine.phase() == super::model::Phase::Frozen {
                    return Err(FleetError::new(
                        ErrorKind::Conflict,
                        format!("start machine {name}"),
                        format!(
                            "{name} is frozen as a branch base: it runs nothing more; branch it, \
                             or delete it once its children are gone"
                        ),
                    ));
                }
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
        self.supply_credentials(name).await?;
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
        let answer = match send(&ctx, START, request.send()).await {
            Err(e) if e.message.contains("saved execution") => return self.resume(name).await,
            other => other,
        };
        Ok(self.seen(view(answer.map_err(|e| {
            deadline_passed(
                e,
                "the machine may still be starting: list-machines with its name shows its state",
            )
        })?)))
    }

    /// The engine's start answers only once the guest has booted (about 17 s on the nested real
    /// 1.32.2 guest) and has no field to answer sooner; the machine reads `created` or
    /// `stopped` until then. So the start is sent from a task of its own, and this answers after
    /// [`BEGIN_START_WATCH`] with the machine `starting` (as list-machines reads it until the
    /// start ends). A start refused at once (a conflict, a missing machine) is still this call's
    /// error; one that fails later is logged, and list-machines shows the machine as it is.
    async fn begin_start(&self, name: &str, branchable: Option<bool>) -> FleetResult<Machine> {
        let ctx = format!("start machine {name}");
        let before = self.get(name).await?;
        if before.is_running() && branchable != Some(true) {
            return Ok(before);
        }
        let claimed = self
            .starting
            .lock()
            .map(|mut starting| starting.insert(name.to_owned()))
            .unwrap_or(false);
        if !claimed {
            // Already being started for an earlier call: that start goes on.
            return Ok(before);
        }
        let fleet = self.clone();
        let owned = name.to_owned();
        let mut start = tokio::spawn(
            async move {
                let answer = fleet.start(&owned, branchable).await;
                if let Ok(mut starting) = fleet.starting.lock() {
                    starting.remove(&owned);
                }
                answer
            }
            .in_current_span(),
        );
        tokio::select! {
            done = &mut start => {
                return done.map_err(|e| FleetError::new(ErrorKind::Upstream, ctx, e.to_string()))?;
            }
            _ = tokio::time::sleep(BEGIN_START_WATCH) => {}
        }
        let machine = name.to_owned();
        tokio::spawn(async move {
            match start.await {
                Ok(Ok(_)) => tracing::info!(%machine, "a start not waited for is done"),
                Ok(Err(e)) => {
                    tracing::warn!(%machine, error = %e.message, "a start not waited for failed")
                }
                Err(e) => tracing::warn!(%machine, error = %e, "a start not waited for ended"),
            }
        }.in_current_span());
        self.get(name).await
    }

    async fn stop(&self, name: &str) -> FleetResult<Machine> {
        let ctx = format!("stop machine {name}");
        let request = self.client.stop_machine().name(name);
        Ok(self.seen(view(send(&ctx, STOP_DELETE, request.send()).await?)))
    }

    async fn pause(&self, name: &str) -> FleetResult<Machine> {
        let ctx = format!("pause machine {name}");
        let mut last_seen = None;
        let paused = within(&ctx, PAUSE, async {
            let request = self.client.pause_machine().name(name);
            match send(&ctx, ENGINE_REQUEST_DEADLINE.saturating_add(PAST_ENGINE_DEADLINE), request.send()).await {
                Ok(info) => return Ok(self.seen(view(info))),
                // The engine's request deadline passed, not the pause: it goes on (seen on the
                // nested engine), and the machine's state says when it is done.
                Err(e) if e.status == Some(408) || e.kind == ErrorKind::Timeout => {
                    tracing::info!(machine = %name, "the pause outlasted the engine's request deadline; following the machine's state");
                }
                Err(e) => return Err(pause_refused(e)),
            }
            loop {
                tokio::time::sleep(PAUSE_POLL).await;
                let machine = self.get(name).await?;
                last_seen = Some(machine.state.clone());
                match &machine.state {
                    MachineState::Paused => return Ok(machine),
                    // Still saving: `running` until the save begins, then `pausing`. The save
                    // stops the guest, whose agent then cannot answer the engine's health
                    // check, so the engine may mark the machine `unreachable` meanwhile ("PID
                    // alive but agent not responding"; seen on the nested engine in CI, the
                    // save going on). The deadline above bounds a save that never ends.
                    MachineState::Running | MachineState::Pausing | MachineState::Unreachable => {}
                    other => {
                        return Err(FleetError::new(
                            ErrorKind::Conflict,
                            &ctx,
                            format!("the pause did not finish: the machine is {other}"),
                        ));
                    }
                }
            }
        })
        .await;
        paused.map_err(|mut e| {
            if let (ErrorKind::Timeout, Some(state)) = (e.kind, &last_seen) {
                e.message.push_str(&format!(
                    "; the machine was last {state}: list-machines shows when the save ends"
                ));
            }
            e
        })
    }

    async fn resume(&self, name: &str) -> FleetResult<Machine> {
        let ctx = format!("resume machine {name}");
        let request = self.client.resume_machine().name(name);
        Ok(self.seen(view(send(&ctx, START, request.send()).await?)))
    }

    async fn pool(&self, pool: &str) -> FleetResult<Option<PoolStatus>> {
        let ctx = format!("get pool {pool}");
        match send(&ctx, DEFAULT, self.client.get_pool().name(pool).send()).await {
            Ok(info) => Ok(Some(pool_status(info))),
            Err(e) if e.kind == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn create_pool(&self, setup: &PoolSetup) -> FleetResult<PoolStatus> {
        let ctx = format!("create pool {}", setup.pool);
        let body = types::CreateForkPoolRequest {
            name: setup.pool.clone(),
            source: setup.source.clone(),
            desired_ready: i32::try_from(setup.ready).unwrap_or(1),
            // A frozen source holds its memory and no CPU; the pool refills from the
            // checkpoint it took (pools-findings: a frozen source's cpuMillis stops).
            freeze_source: Some(setup.freeze_source),
            lease_ttl_secs: i64::try_from(setup.lease_ttl_secs).ok(),
            auto_admission: None,
            max_active: None,
            ready_timeout_secs: None,
            share_weights: None,
        };
        let info = send(&ctx, CREATE, self.client.create_pool().body(body).send()).await?;
        Ok(pool_status(info))
    }

    async fn lease(
        &self,
        pool: &str,
        env: &std::collections::BTreeMap<String, String>,
    ) -> FleetResult<PoolLease> {
        let ctx = format!("lease a machine of pool {pool}");
        let body = types::AcquireForkLeaseRequest {
            // The engine replays a key's lease whatever became of it: each lease its own key.
            idempotency_key: format!("smolmcp-{:016x}", rand::random::<u64>()),
            env: env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            ttl_secs: i64::try_from(LEASE_TTL_SECS).ok(),
            wait_secs: None,
            await_worker_ready: None,
            files: Vec::new(),
            rollout_access: None,
            worker_ready_timeout_secs: None,
        };
        let request = self.client.acquire_lease().name(pool).body(body);
        let info = send(&ctx, DEFAULT, request.send()).await?;
        let lease = PoolLease {
            pool: info.pool,
            id: info.id,
            machine: info.machine,
            state: info.state,
        };
        if lease.state != "active" {
            return Err(FleetError::new(
                ErrorKind::Conflict,
                ctx,
                format!("the lease is {}, not active", lease.state),
            ));
        }
        if let Ok(mut leases) = self.leases.lock() {
            leases.insert(lease.machine.clone(), lease.clone());
        }
        self.keep_alive(lease.clone());
        Ok(lease)
    }

    async fn delete_pool(&self, pool: &str) -> FleetResult<()> {
        let ctx = format!("delete pool {pool}");
        let request = self.client.delete_pool().name(pool).force(true);
        send(&ctx, STOP_DELETE, request.send()).await?;
        if let Ok(mut leases) = self.leases.lock() {
            leases.retain(|_, l| l.pool != pool);
        }
        Ok(())
    }

    async fn delete(&self, name: &str) -> FleetResult<Deleted> {
        let leased = self.leases.lock().ok().and_then(|l| l.get(name).cloned());
        if let Some(lease) = leased {
            let ctx = format!("complete the lease of {name}");
            let request = self
                .client
                .complete_lease()
                .name(&lease.pool)
                .lease(&lease.id);
            let completed = send(&ctx, DEFAULT, request.send()).await;
            if let Ok(mut leases) = self.leases.lock() {
                leases.remove(name);
            }
            match completed {
                Ok(_) => {
                    self.forget(name);
                    return Ok(Deleted {
                        deleted: name.to_owned(),
                        usage_micros: None,
                    });
                }
                // An ended lease (expired, failed): its machine may be gone or going; the
                // delete below says which.
                Err(e) => {
                    tracing::info!(machine = %name, error = %e, "the lease had ended; deleting the machine")
                }
            }
        }
        let ctx = format!("delete machine {name}");
        let request = self.client.delete_machine().name(name);
        let answer = send(&ctx, STOP_DELETE, request.send()).await?;
        self.forget(name);
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
        // Its clones go too; the next list or get learns which are left.
        if let Ok(mut networks) = self.networks.lock() {
            networks.clear();
        }
        Ok(Deleted {
            deleted: answer.deleted,
            usage_micros: None,
        })
    }

    async fn exec(&self, name: &str, spec: &ExecSpec) -> FleetResult<ExecOutput> {
        if spec.start_if_stopped {
            // It may boot the machine.
            self.supply_credentials(name).await?;
        }
        let ctx = format!("exec in {name}");
        let limit = exec_limit(spec);
        let request = self.client.exec_command().id(name).body(exec_body(spec));
        let out = send(&ctx, limit, request.send()).await.map_err(|e| {
            self.gone_if_not_found(name, &e);
            output_over_cap(deadline_passed(
                e,
                "the command may still be running in the guest",
            ))
        })?;
        self.exec_ended(name);
        let output = ExecOutput {
            exit_code: out.exit_code,
            stdout: exact_bytes(&out.stdout_b64, out.stdout),
            stderr: exact_bytes(&out.stderr_b64, out.stderr),
            stdout_cut_upstream: false,
            stderr_cut_upstream: false,
        };
        whole_output(&ctx, output)
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
        if spec.start_if_stopped {
            self.supply_credentials(name).await?;
        }
        let ctx = format!("exec in {name}");
        let limit = exec_limit(spec);
        let request = self.client.exec_stream().id(name).body(exec_body(spec));
        let output = within(&ctx, limit, async {
            let body = send(&ctx, limit, request.send()).await?;
            super::exec_stream::read_exec_stream(&ctx, body.into_inner(), output, |e| {
                super::upstream::transport(&ctx, e)
            })
            .await
        })
        .await
        .map_err(|e| {
            self.gone_if_not_found(name, &e);
            deadline_passed(e, "the command may still be running in the guest")
        })?;
        self.exec_ended(name);
        whole_output(&ctx, output)
    }

    async fn read_file(&self, name: &str, path: &str) -> FleetResult<FileStream> {
        let ctx = format!("read {path} in {name}");
        let request = self.client.download_file().id(name).path(path).send();
        let response = send_raw(&ctx, FILES, request).await.map_err(|e| {
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
        let answer = send(&ctx, FILES, request.send())
            .await
            .map_err(|e| deadline_passed(e, "the write may still be going on in the guest"))?;
        Ok(u64::try_from(answer.size).unwrap_or(len))
    }

    async fn branch(&self, spec: BranchSpec<'_>) -> FleetResult<Machine> {
        let BranchSpec {
            source,
            child,
            branchable,
            freeze_source,
        } = spec;
        let ctx = format!("branch machine {source} into {child}");
        let body = types::ForkRequest {
            branchable: branchable.then_some(true),
            env: Vec::new(),
            freeze_source: freeze_source.then_some(true),
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
        let answer = send(&ctx, BRANCH, request.send()).await;
        Ok(self.seen(view(answer.map_err(|e| {
            deadline_passed(
                e,
                "the branch may still be made: list-machines shows it if it was",
            )
        })?)))
    }

    /// The guest console. Without a usable cursor: the last `tail` lines. With one: what
    /// arrived after the cursor's last lines, found by content in the newest lines the engine
    /// gives (see [`page_after_anchor`]).
    /// `source=workload` is what the workload printed (`workload.log`, kept across restarts);
    /// `source=console`, the engine's default, is the kernel and the guest agent's JSON log,
    /// truncated at each boot, with a "running command" record of every exec, this server's
    /// own probes and job scripts among them. Those are left out here: they are not the agent's
    /// commands.
    async fn logs(
        &self,
        name: &str,
        tail: usize,
        cursor: Option<&str>,
        source: LogSource,
    ) -> FleetResult<LogPage> {
        let ctx = format!("logs of {name}");
        let anchor = cursor.and_then(Anchor::parse);
        if let (Some(given), None) = (cursor, &anchor) {
            // A cursor this server did not give would read as "none" and return every line
            // as new, with no gap said.
            return Err(FleetError::new(
                ErrorKind::Invalid,
                ctx,
                format!(
                    "cursor: {:?} is not a cursor machine-logs gave for a local machine (they \
                     look like c:<lines>:<hash>); pass back the one from the previous call, or \
                     leave it out for the last lines",
                    super::upstream::snippet(given, 40)
                ),
            ));
        }
        // The engine reads `tail` like `tail -n` (0 is no line at all) and refuses more than
        // 10000; without `tail` and without follow it sends only the first 64 KiB of the log
        // (smolvm 1.32.2, src/api/handlers/machines.rs; "tail value .. exceeds maximum of" in
        // the binary). So ask for exactly the lines wanted, and with a cursor for the most the
        // engine gives.
        let want = match anchor {
            Some(_) => ENGINE_MAX_TAIL,
            None => tail.clamp(1, ENGINE_MAX_TAIL),
        };
        let read = within(&ctx, LOGS, async {
            let request = self
                .client
                .stream_logs()
                .id(name)
                .follow(false)
                .source(match source {
                    LogSource::Workload => "workload",
                    LogSource::Engine => "console",
                })
                .tail(want as u64);
            let stream = send(&ctx, LOGS, request.send()).await?;
            let bytes = collect(&ctx, stream).await?;
            Ok(sse_data_lines(&String::from_utf8_lossy(&bytes)))
        })
        .await;
        let lines = match read {
            Ok(lines) if source == LogSource::Engine => lines
                .into_iter()
                .filter(|line| !crate::fleet::internal::is_internal_record(line))
                .collect(),
            Ok(lines) => lines,
            // A machine whose workload has not written (or never started) has no log file:
            // "machine 'x' has no logs yet — it may not have been started".
            Err(e) if source == LogSource::Workload && e.status == Some(404) => {
                self.get(name).await?;
                let mut page = tail_page(Vec::new(), tail);
                page.note = Some(NO_WORKLOAD_LOG.to_owned());
                return Ok(page);
            }
            Err(e) => return Err(e),
        };
        let mut page = match anchor {
            Some(anchor) => page_after_anchor(lines, &anchor),
            None => tail_page(lines, tail),
        };
        if source == LogSource::Workload && page.lines.is_empty() && cursor.is_none() {
            page.note = Some(NO_WORKLOAD_LOG.to_owned());
        }
        Ok(page)
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
        // A machine made from a local image archive answers every pull 200 with this digest
        // and size 0, whatever the reference (even one that cannot resolve), having fetched
        // nothing (seen on the real 1.32.2 guest): not a pull, so not reported as one.
        if i.digest == PACKED_DIGEST && i.size == 0 {
            return Err(FleetError::new(
                ErrorKind::Unsupported,
                ctx,
                format!(
                    "the engine pulled nothing: {name} was made from a local image archive, \
                     and such a machine answers every pull as done without fetching {image}. \
                     Pull into a machine made from a registry image, or create a machine \
                     with image {image} instead"
                ),
            ));
        }
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
    /// empty when the line had none (observed on the real 1.32.2 serve: tests/engine/real_serve.rs).
    async fn egress_baseline(&self, name: &str, limit: u32) -> Vec<EgressDenial> {
        let recent = self
            .recent_execs
            .lock()
            .map(|r| {
                r.get(name)
                    .is_some_and(|ended| ended.elapsed() < RECENT_EXEC)
            })
            .unwrap_or(false);
        if !recent {
            return Vec::new();
        }
        self.egress_denials(name, limit).await.unwrap_or_else(|e| {
            tracing::debug!(machine = %name, error = %e.message, "no egress baseline; the report may count an earlier command's refusals");
            Vec::new()
        })
    }

    async fn allow_egress(
        &self,
        name: &str,
        hosts: &[String],
        cidrs: &[String],
    ) -> FleetResult<Machine> {
        let ctx = format!("allow egress of {name}");
        // Added to the list in force, live on a running machine (1.32.2 answers 409 only for
        // a change that would lift the list, which adding never does).
        let body = types::UpdateEgressRequest {
            allow_hosts: hosts.to_vec(),
            allow_cidrs: cidrs.to_vec(),
            ..Default::default()
        };
        let request = self.client.update_machine_egress().name(name).body(body);
        Ok(self.seen(view(send(&ctx, DEFAULT, request.send()).await?)))
    }

    async fn set_ports(&self, name: &str, ports: &[PortMapping]) -> FleetResult<Machine> {
        let ctx = format!("publish ports of {name}");
        // The whole set, TCP: a running machine takes TCP changes live, UDP only at its next
        // boot (1.32.2's SetPortsRequest).
        let body = types::SetPortsRequest {
            ports: ports.iter().map(port_spec).collect(),
        };
        let request = self.client.set_machine_ports().name(name).body(body);
        Ok(self.seen(view(send(&ctx, DEFAULT, request.send()).await?)))
    }

    fn is_port_in_use(&self, e: &FleetError) -> bool {
        e.upstream_code.as_deref() == Some("PORT_IN_USE")
    }

    fn port_address(&self, machine: &Machine, guest: u16) -> Option<PortAddress> {
        let host = machine.ports.iter().find(|p| p.guest == guest)?.host?;
        Some(PortAddress {
            url: format!("http://{}:{host}", self.publish_host),
            needs: None,
        })
    }

    async fn open_terminal(
        &self,
        name: &str,
        spec: &super::terminal::TerminalSpec,
    ) -> FleetResult<super::terminal::TerminalLink> {
        within(
            &format!("open a terminal in {name}"),
            DEFAULT,
            super::terminal::open_local(&self.endpoint, name, spec),
        )
        .await
    }

    async fn egress_denials(&self, name: &str, limit: u32) -> FleetResult<Vec<EgressDenial>> {
        let ctx = format!("egress events of {name}");
        let request = self
            .client
            .get_machine_egress_events()
            .name(name)
            .limit(u64::from(limit));
        let sent = std::time::SystemTime::now();
        let answer = send_raw(&ctx, EGRESS_EVENTS, request.send()).await?;
        let answered = std::time::SystemTime::now();
        let engine_said = answer
            .headers()
            .get(reqwest::header::DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| chrono::DateTime::parse_from_rfc2822(v).ok())
            .map(std::time::SystemTime::from);
        let to_this_host = clock_mapping(engine_said, sent, answered);
        Ok(answer
            .into_inner()
            .events
            .into_iter()
            .map(|e| {
                let at = chrono::DateTime::parse_from_rfc3339(&e.timestamp)
                    .ok()
                    .map(std::time::SystemTime::from);
                EgressDenial {
                    at,
                    on_this_host: at.and_then(&to_this_host),
                    operation: e.operation,
                    dest: e.dest,
                }
            })
            .collect())
    }
}

/// Moves an engine stamp (whole seconds, cut down) onto this host's clock: to the middle of the
/// second it names, shifted by the difference between the engine's `Date` (cut down the same
/// way) and the middle of our request, so the two halves cancel. Without a `Date`, the same
/// clock is assumed.
fn clock_mapping(
    engine_said: Option<std::time::SystemTime>,
    sent: std::time::SystemTime,
    answered: std::time::SystemTime,
) -> impl Fn(std::time::SystemTime) -> Option<std::time::SystemTime> {
    let half_second = Duration::from_millis(500);
    let ours = sent + answered.duration_since(sent).unwrap_or_default() / 2;
    move |stamp| match engine_said {
        None => stamp.checked_add(half_second),
        Some(theirs) => match stamp.duration_since(theirs) {
            Ok(after) => ours.checked_add(after),
            Err(before) => ours.checked_sub(before.duration()),
        },
    }
}

/// How long an exec may take in all: its own timeout (which the agent enforces, answering exit
/// 124 with the output so far), some slack, and a boot when it may start the machine. The
/// engine puts no deadline of its own on the route.
fn exec_limit(spec: &ExecSpec) -> Duration {
    let boot = if !spec.start_if_stopped {
        Duration::ZERO
    } else {
        EXEC_BOOT
    };
    Duration::from_secs(spec.timeout_secs.unwrap_or(EXEC_DEFAULT_SECS))
        .saturating_add(EXEC_SLACK)
        .saturating_add(boot)
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

/// A machine made from an image runs an exec in its container, where the agent stops reading a
/// stream at its cap: the command dies of SIGPIPE (exit 141) and the engine answers 200 with
/// the part that arrived, as if nothing had happened (12 MiB on stdout gave 200, about 11.0 MiB
/// and exit 141 on the real 1.32.2 guest). That answer is not the command's output: which
/// stream reached the cap, if one did. The margin covers what the pipe held when reading
/// stopped.
pub(crate) fn cut_at_cap(output: &ExecOutput) -> Option<&'static str> {
    const MARGIN: u64 = 1024 * 1024;
    if output.exit_code != SIGPIPE_EXIT {
        return None;
    }
    let near_cap = |bytes: &[u8]| bytes.len() as u64 + MARGIN >= ENGINE_OUTPUT_CAP_BYTES;
    if near_cap(&output.stdout) {
        Some("stdout")
    } else if near_cap(&output.stderr) {
        Some("stderr")
    } else {
        None
    }
}

/// An exec's answer, unless it is one cut at the cap ([`cut_at_cap`]), which is refused.
fn whole_output(ctx: &str, output: ExecOutput) -> FleetResult<ExecOutput> {
    match cut_at_cap(&output) {
        Some(stream) => Err(FleetError::new(
            ErrorKind::Upstream,
            ctx,
            cut_at_cap_message(stream, &output),
        )),
        None => Ok(output),
    }
}

/// The exit status of a process killed by SIGPIPE, as a shell reports it.
const SIGPIPE_EXIT: i32 = 141;

pub(crate) fn cut_at_cap_message(stream: &str, output: &ExecOutput) -> String {
    let got = if stream == "stdout" {
        output.stdout.len()
    } else {
        output.stderr.len()
    };
    format!(
        "the command's {stream} passed the engine's cap of {} MiB per stream: the engine stopped \
         reading it after {got} bytes and the command was killed by SIGPIPE (exit 141), so what \
         came back is neither its whole output nor its real exit status. Send the output to a \
         file in the machine (`... > /tmp/out.txt 2>&1`) and page through it with read-file, \
         or run it with background: true and read it with job-output",
        ENGINE_OUTPUT_CAP_BYTES >> 20
    )
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

/// A host name that never resolves (RFC 6761's `.invalid`), put first in the host list of a
/// machine that must have its names filtered and none is allowed yet (a network "ask"
/// machine): 1.32.2 filters and records lookups only while a machine's host list is not empty.
/// An empty list given at create does turn the filter on, but a later addition of addresses
/// alone drops it and every name resolves again (both seen on the nested 1.32.2 engine); a
/// list holding this name keeps it through every addition. Left out of every machine's view.
pub const NAME_FILTER_HOST: &str = "smol-mcp-ask.invalid";

pub(crate) fn create_body(spec: &CreateSpec) -> types::CreateMachineRequest {
    let (network, hosts, cidrs) = match &spec.egress {
        Egress::Open => (true, None, None),
        Egress::Blocked => (false, None, None),
        // A list allowing nothing yet is sent as empty host and CIDR lists: in force ("empty
        // list denies all egress", 1.32.2's spec of allowedCidrs), and the host list empty
        // rather than left out, because only a host list turns the engine's DNS filter on.
        // Without one the guest resolves every name and egress-events never records a name
        // (seen on the nested 1.32.2 engine), so a network "ask" machine could never ask
        // about the first host a command looks up (pip's, git's).
        Egress::Allow { hosts, cidrs } if hosts.is_empty() && cidrs.is_empty() => {
            (false, Some(Vec::new()), Some(Vec::new()))
        }
        Egress::Allow { hosts, cidrs } => (
            false,
            (!hosts.is_empty()).then(|| hosts.clone()),
            (!cidrs.is_empty()).then(|| cidrs.clone()),
        ),
    };
    types::CreateMachineRequest {
        name: Some(spec.name.clone()),
        image: spec.image.clone(),
        cpus: Some(clamp_i32(spec.cpus)),
        memory_mb: Some(clamp_i32(spec.memory_mb)),
        network: Some(network),
        allowed_hosts: hosts,
        allowed_cidrs: cidrs,
        // No `cmd`: the image's own command is the machine's workload, its output what
        // machine-logs shows. One that exits at once (a shell) does not stop the machine: 1.32.2
        // keeps a main container of its own for the execs (seen on the real guest with
        // busybox's `/bin/sh`), and a bare machine has no workload at all.
        cmd: Vec::new(),
        env: env_list(&spec.env),
        ports: spec.ports.iter().map(port_spec).collect(),
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
        credentials: credentials_body(&spec.credentials),
        ..Default::default()
    }
}

/// The engine's `credentials` at create: `{"credentials": [{name, environment_variable,
/// allowed_hosts, set_header?}]}`, snake_case inside (1.32.2's `CredentialPolicy`, which the
/// spec leaves as an open object; a camelCase key is refused 422). `None` without bindings.
/// A mapping as the engine takes it: the host port defaults to the guest's.
fn port_spec(p: &PortMapping) -> types::PortSpec {
    types::PortSpec {
        guest: i32::from(p.guest),
        host: i32::from(p.host.unwrap_or(p.guest)),
        protocol: None,
    }
}

fn credentials_body(
    bindings: &[crate::fleet::CredentialBindingSpec],
) -> Option<serde_json::Map<String, serde_json::Value>> {
    if bindings.is_empty() {
        return None;
    }
    let list: Vec<serde_json::Value> = bindings
        .iter()
        .map(|b| {
            let mut binding = serde_json::json!({
                "name": b.name,
                "environment_variable": b.env.clone().unwrap_or_default(),
                "allowed_hosts": b.hosts,
            });
            if let Some(header) = &b.header {
                binding["set_header"] = serde_json::Value::from(header.clone());
            }
            binding
        })
        .collect();
    let mut policy = serde_json::Map::new();
    policy.insert("credentials".into(), serde_json::Value::Array(list));
    Some(policy)
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

/// A pool's source, or a clone of it no lease holds yet.
fn pool_internal(m: &types::MachineInfo) -> bool {
    let ready_clone = m.forkpoint_held && m.name.starts_with(POOL_WORKER_PREFIX);
    m.name.starts_with(POOL_SOURCE_PREFIX) || ready_clone
}

fn pool_status(info: types::ForkPoolInfo) -> PoolStatus {
    PoolStatus {
        source: info.source,
        desired: u32::try_from(info.desired_ready).unwrap_or(0),
        ready: u32::try_from(info.ready).unwrap_or(0),
    }
}

fn view(info: types::MachineInfo) -> Machine {
    let listed = info.allowed_hosts.is_some() || info.allowed_cidrs.is_some();
    let mut hosts = info.allowed_hosts.unwrap_or_default();
    hosts.retain(|host| host != NAME_FILTER_HOST);
    let cidrs = info.allowed_cidrs.unwrap_or_default();
    let network = if listed {
        Egress::Allow { hosts, cidrs }
    } else if info.network {
        Egress::Open
    } else {
        Egress::Blocked
    };
    Machine {
        id: info.name.clone(),
        name: info.name,
        state: info.state.into(),
        cpus: u32::try_from(info.cpus).ok(),
        memory_mb: u32::try_from(info.memory_mb).ok(),
        network: network.into(),
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
        consumption: super::model::Consumption {
            cpu_millis: info
                .cpu_millis
                .or(info.cpu_seconds.map(|s| s.saturating_mul(1000))),
            rss_mb: info.rss_mb,
            disk_used_mb: info.disk_used_mb,
            egress_bytes: info.egress_bytes,
            cost_micros: None,
        },
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
        note: None,
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
    LogPage {
        lines,
        note: None,
        cursor,
        gap,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_stamp_is_placed_on_this_hosts_clock_by_the_answers_date() {
        let t =
            |millis: u64| std::time::UNIX_EPOCH + Duration::from_millis(1_800_000_000_000 + millis);
        // The engine's clock 0.9 s behind ours. A refusal at our 100.55 is its 99.65, stamped
        // 99; asked at our 100.5-100.7, it says 99 (its 99.7). Read as our clock, the stamp
        // falls before a command begun at 100.5 with a second's slack; placed, it is within
        // a second of the truth.
        let place = clock_mapping(Some(t(99_000)), t(100_500), t(100_700));
        let placed = place(t(99_000)).unwrap();
        let truth = t(100_550);
        let off = placed
            .duration_since(truth)
            .or_else(|e| Ok::<_, ()>(e.duration()))
            .unwrap();
        assert!(off < Duration::from_secs(1), "{off:?}");
        assert!(t(99_000) < t(100_500) - Duration::from_secs(1));
        // The same clocks: a stamp moves to the middle of its second.
        let same = clock_mapping(None, t(0), t(0));
        assert_eq!(same(t(5_000)), Some(t(5_500)));
        // An engine ahead of us, and a stamp after its Date.
        let ahead = clock_mapping(Some(t(12_000)), t(10_000), t(10_000));
        assert_eq!(ahead(t(13_000)), Some(t(11_000)));
    }

    #[test]
    fn deadlines_fit_what_the_engine_allows_each_route() {
        // Where the engine's 300 s layer holds, its 408 arrives first, and not long before
        // this server would give up.
        for bounded in [BRANCH, FILES] {
            assert!(bounded > ENGINE_REQUEST_DEADLINE, "{bounded:?}");
            assert!(bounded <= ENGINE_REQUEST_DEADLINE + Duration::from_secs(30));
        }
        // Where it does not, a start or a pull may run past it (a cold pull of a large image).
        assert!(START > ENGINE_REQUEST_DEADLINE && PULL > ENGINE_REQUEST_DEADLINE);
        // An exec is bounded by its own timeout, past 300 s too, plus a boot when it may start
        // the machine.
        let mut spec = ExecSpec::new(super::super::Command::Shell("sleep 600".into()));
        spec.timeout_secs = Some(600);
        assert_eq!(exec_limit(&spec), Duration::from_secs(600 + 30 + 120));
        spec.start_if_stopped = false;
        assert_eq!(exec_limit(&spec), Duration::from_secs(600 + 30));
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
