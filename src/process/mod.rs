//! What one server process owns, whatever its sessions do: its settings and mode, the fleets
//! (the local serve found or started on first use, the cloud client built on first use), the
//! crash-proof record of its ephemeral machines and their leases, the clean-up when a session
//! or the process ends, and the events it publishes. Nothing here knows of tools or of MCP.

pub mod bases;
pub mod config;
pub mod credentials;
pub mod ephemeral;
pub mod events;
pub mod keep;
pub mod lease;
pub mod local_serve;
pub mod made;
pub mod pools;
pub mod redaction;
pub mod shared_file;
pub mod sweep;
pub mod targets;
pub mod workspaces;

pub use sweep::Cleanup;

use crate::fleet::{
    Backstop, Capabilities, CloudFleet, ErrorKind, Fleet, FleetApi, FleetError, FleetKind,
    FleetResult,
};
use crate::process::config::{Config, SessionEnd, TargetsSetting};
use ephemeral::{Entry, Record, RecordError, ensure_runtime_dir};
use events::{Events, ServerEvent};
use local_serve::LocalServe;
use std::sync::Arc;
use std::time::Duration;
use sweep::{publish_orphan_sweep, sweep};
use tracing::Instrument as _;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// Which fleets this process serves, decided once at startup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    Single(FleetKind),
    Both,
}

pub struct Process {
    pub config: Arc<Config>,
    pub mode: Mode,
    pub record: Record,
    local: tokio::sync::Mutex<Option<LocalServe>>,
    /// Built on first use: its HTTPS client loads the platform's root certificates, which a
    /// session that never touches the cloud should not pay for at start-up.
    cloud: std::sync::OnceLock<Result<Arc<CloudFleet>, FleetError>>,
    /// Machines this process holds under a lease, and the names tool calls are using.
    pub leases: lease::Leases,
    /// Notable events, for the sessions to pass on to their clients.
    pub events: Events,
    /// The credential bindings, the machines made with them, and the values they are supplied.
    pub credentials: Arc<credentials::Supplier>,
    /// The machines each session made (what the limits per session count).
    pub made: made::MadeBySession,
    /// Stops `reap` when the process's own clean-up begins.
    reaping: tokio_util::sync::CancellationToken,
    /// The operator's warm pools, set up at the first local call.
    pub pools: Arc<pools::WarmPools>,
    /// Which local engine this process uses, found on first need (`engine`).
    local_engine: std::sync::OnceLock<String>,
    /// A fleet given in place of what a kind would reach (`use_fleet`).
    given: std::sync::OnceLock<Fleet>,
    /// Which machines have a workspace, and the server's copies of them.
    pub workspaces: Arc<workspaces::Workspaces>,
}

pub fn resolve_mode(config: &Config) -> Mode {
    match config.targets {
        TargetsSetting::Local => Mode::Single(FleetKind::Local),
        TargetsSetting::Cloud => Mode::Single(FleetKind::Cloud),
        TargetsSetting::Both => Mode::Both,
        TargetsSetting::Auto if config.cloud_token.is_empty() => Mode::Single(FleetKind::Local),
        TargetsSetting::Auto => Mode::Both,
    }
}

/// What a process keeps where every process sharing a store (on any host) sees it, rather
/// than in its runtime directory's files.
pub struct Shared {
    /// The record of ephemeral machines and their leases.
    pub machines: Arc<dyn ephemeral::RecordBook>,
    /// Which machines were made with which credential bindings and egress asks.
    pub machine_setups: Arc<dyn shared_file::SharedDocument>,
}

impl Process {
    pub fn new(config: Config) -> Result<Process, StartupError> {
        Process::with_record(config, Events::default(), None)
    }

    /// A process whose events are `events` and whose machine record is kept in `book` (a
    /// shared store's), else in the runtime directory's file.
    pub fn with_record(
        config: Config,
        events: Events,
        shared: Option<Shared>,
    ) -> Result<Process, StartupError> {
        ensure_runtime_dir(&config.runtime_dir)?;
        let mut credentials =
            credentials::Supplier::new(config.credentials.clone(), &config.runtime_dir);
        let record = match shared {
            Some(shared) => {
                credentials = credentials.shared_in(shared.machine_setups);
                Record::in_book(shared.machines)
            }
            None => Record::new(&config.runtime_dir),
        };
        let credentials = Arc::new(credentials);
        let pool_defaults = pools::PoolDefaults {
            cpus: config.cpus,
            memory_mb: config.memory_mb,
            egress: match config.network_default {
                config::NetworkDefault::Open => crate::fleet::Egress::Open,
                config::NetworkDefault::Blocked => crate::fleet::Egress::Blocked,
            },
        };
        Ok(Process {
            workspaces: Arc::new(workspaces::Workspaces::new(
                config.workspace_dir.clone(),
                config.workspace_total_max_bytes,
            )),
            credentials,
            made: made::MadeBySession::default(),
            reaping: tokio_util::sync::CancellationToken::new(),
            pools: Arc::new(pools::WarmPools::new(config.pools.clone(), pool_defaults)),
            leases: lease::Leases::new(
                record.clone(),
                config.machine_lease_secs,
                config.park_idle_secs > 0,
            ),
            record,
            mode: resolve_mode(&config),
            config: Arc::new(config),
            local: tokio::sync::Mutex::new(None),
            cloud: std::sync::OnceLock::new(),
            events,
            local_engine: std::sync::OnceLock::new(),
            given: std::sync::OnceLock::new(),
        })
    }

    /// The cloud fleet, when a token is configured.
    pub fn cloud(&self) -> Option<Result<Arc<CloudFleet>, FleetError>> {
        if self.config.cloud_token.is_empty() {
            return None;
        }
        Some(
            self.cloud
                .get_or_init(|| {
                    let backstop = Backstop {
                        ttl_secs: self.config.ephemeral_ttl_secs,
                        auto_stop_secs: self.config.ephemeral_auto_stop_secs,
                    };
                    CloudFleet::new(
                        &self.config.cloud_url,
                        self.config.cloud_token.expose(),
                        backstop,
                    )
                    .map(Arc::new)
                })
                .clone(),
        )
    }

    /// Makes `fleet` this process's cloud fleet, unless one was built already; answers whether it
    /// was taken. Tests give one with short deadlines, to watch a call outlast them.
    pub fn use_cloud_fleet(&self, fleet: CloudFleet) -> bool {
        self.cloud.set(Ok(Arc::new(fleet))).is_ok()
    }

    /// Makes `fleet`, whatever implements it, the one that answers for `kind` in this process,
    /// unless one was given already; answers whether it was taken. How a fleet of another
    /// make is tested against the whole tool table.
    pub fn use_fleet(&self, kind: FleetKind, fleet: Arc<dyn FleetApi>) -> bool {
        self.given.set(Fleet::new(kind, fleet)).is_ok()
    }

    fn given(&self, kind: FleetKind) -> Option<&Fleet> {
        self.given.get().filter(|given| given.kind() == kind)
    }

    /// What the fleet that answers for `kind` can do, known without reaching it.
    pub fn capabilities(&self, kind: FleetKind) -> &'static Capabilities {
        match (self.given(kind), kind) {
            (Some(fleet), _) => fleet.capabilities(),
            (None, FleetKind::Local) => &crate::fleet::local::CAPABILITIES,
            (None, FleetKind::Cloud) => &crate::fleet::cloud::CAPABILITIES,
        }
    }

    /// What reaching the fleet for `kind` may wait for, when that can take long enough to tell
    /// the client (the first local call starts the engine), with its bound.
    pub fn reaching_waits_for(&self, kind: FleetKind) -> Option<(&'static str, Duration)> {
        (kind == FleetKind::Local && self.given(kind).is_none()).then(|| {
            (
                "waiting for the local engine (smolvm serve) to start",
                Duration::from_secs(self.config.serve_start_timeout_secs),
            )
        })
    }

    /// A call to `kind`'s fleet failed in transport: a local serve that stopped answering is
    /// looked for again at the next call.
    pub async fn lost_touch(&self, kind: FleetKind) {
        if kind == FleetKind::Local {
            self.reset_local().await;
        }
    }

    pub fn serves(&self, kind: FleetKind) -> bool {
        match self.mode {
            Mode::Both => true,
            Mode::Single(k) => k == kind,
        }
    }

    /// Which engine the machines of `kind` are made on, as the record keys them: the named serve,
    /// else the engine binary this process starts (a runtime directory may be used with
    /// several in turn); on cloud, the service's URL.
    pub fn engine(&self, kind: FleetKind) -> String {
        match kind {
            FleetKind::Cloud => format!("cloud {}", self.config.cloud_url),
            FleetKind::Local => self
                .local_engine
                .get_or_init(|| {
                    if self.config.local_url.is_empty() {
                        format!(
                            "smolvm {}",
                            local_serve::locate_engine(&self.config.smolvm)
                                .path
                                .display()
                        )
                    } else {
                        format!("serve {}", self.config.local_url)
                    }
                })
                .clone(),
        }
    }

    /// The fleet of `kind` if this process has reached it already (never starting a serve).
    pub async fn reached_fleet(&self, kind: FleetKind) -> Option<Fleet> {
        if let Some(fleet) = self.given(kind) {
            return Some(fleet.clone());
        }
        match kind {
            FleetKind::Cloud => match self.cloud.get() {
                Some(Ok(cloud)) => Some(Fleet::new(kind, cloud.clone())),
                _ => None,
            },
            FleetKind::Local => {
                let mut local = self.local.lock().await;
                let serve = local.as_mut()?;
                (!serve.exited()).then(|| Fleet::new(kind, serve.fleet.clone()))
            }
        }
    }

    /// The fleet for a call. The local serve is found or started here, on first use.
    pub async fn fleet(&self, kind: FleetKind) -> FleetResult<Fleet> {
        if let Some(fleet) = self.given(kind) {
            return Ok(fleet.clone());
        }
        match kind {
            FleetKind::Cloud => match self.cloud() {
                Some(cloud) => Ok(Fleet::new(kind, cloud?)),
                None => Err(FleetError::new(
                    ErrorKind::Unsupported,
                    "cloud fleet",
                    "the cloud fleet is not configured: set SMOL_CLOUD_TOKEN (and SMOL_CLOUD_URL if it is not the default)",
                )),
            },
            FleetKind::Local => {
                let mut local = self.local.lock().await;
                if let Some(serve) = local.as_mut() {
                    if !serve.exited() {
                        return Ok(Fleet::new(kind, serve.fleet.clone()));
                    }
                    // Noticed before any request is sent, so this call goes to the new serve
                    // instead of failing on the dead one's socket.
                    tracing::warn!(
                        listen = %serve.listen,
                        "the smolvm serve this process ran has exited; starting another"
                    );
                    if let Some(dead) = local.take() {
                        dead.stop().await;
                    }
                }
                self.credentials.set_engine(self.engine(FleetKind::Local));
                // Boxed: finding or starting a serve is a large future, and held inline it made
                // every call's future that large, copied on each move (memcpy was 5% of a
                // call's time under wrk).
                let serve =
                    Box::pin(LocalServe::acquire(&self.config, self.credentials.clone())).await?;
                self.events.publish(serve_event(&serve));
                let fleet = Fleet::new(kind, serve.fleet.clone());
                *local = Some(serve);
                drop(local);
                // A first local call is also when a crashed predecessor's machines can be
                // reached; deleting them must not hold up this call.
                let record = self.record.clone();
                let orphan_fleet = fleet.clone();
                let events = self.events.clone();
                let workspaces = self.workspaces.clone();
                let engine = self.engine(FleetKind::Local);
                if !self.pools.is_empty() {
                    let (pools, pool_fleet) = (self.pools.clone(), fleet.clone());
                    tokio::spawn(async move { pools.set_up(&pool_fleet).await }.in_current_span());
                }
                // In the span of the call that reached the serve first: its requests are the
                // call's doing, and `SMOL_MCP_LOG=debug` shows them under it.
                tokio::spawn(
                    async move {
                        let cleanup = sweep(&record, &orphan_fleet, &engine, None).await;
                        workspaces.forget_all(FleetKind::Local, &cleanup.deleted);
                        publish_orphan_sweep(&events, FleetKind::Local, &cleanup);
                    }
                    .in_current_span(),
                );
                Ok(fleet)
            }
        }
    }

    /// Records an ephemeral machine before its create is sent, with the machine a branch child
    /// is made from. Answers whether the record already had a machine of that name (which is
    /// then left as it was).
    pub async fn remember(
        &self,
        fleet: FleetKind,
        name: &str,
        session: &str,
        parent: Option<&str>,
    ) -> Result<bool, RecordError> {
        self.record
            .add_new(Entry {
                fleet,
                name: name.to_owned(),
                id: name.to_owned(),
                owner_pid: std::process::id(),
                owner: None,
                session: session.to_owned(),
                parent: parent.map(str::to_owned),
                recorded_at: ephemeral::now_secs(),
                lease: self.leases.lease_for(session),
                engine: Some(self.engine(fleet)),
                kept_until: None,
                base: None,
            })
            .await
    }

    /// The session name under which this process's leased machines are recorded.
    pub fn lease_session(&self) -> &str {
        self.leases.session()
    }

    /// The lease session of `user`'s machines (an id; the operator's is empty).
    pub fn lease_session_of(&self, user: &str) -> String {
        self.leases.session_of(user)
    }

    /// Whether `session` is one of this process's lease sessions, whoever's.
    pub fn is_lease_session(&self, session: &str) -> bool {
        self.leases.is_lease_session(session)
    }

    /// A tool call begins to use `names`: their leases are renewed, and the reaper leaves them
    /// alone until `release`.
    pub async fn hold(&self, names: &[String]) {
        self.leases.hold(names).await;
    }

    /// The call is over with `names`.
    pub fn release(&self, names: &[String]) {
        self.leases.release(names);
    }

    /// At start, over HTTP: a dead server's unexpired leased machines become this process's.
    pub async fn adopt_leased_machines(&self) -> Vec<String> {
        self.leases.adopt().await
    }

    /// The fleet of `kind` for a clean-up of `what`, or `None` (logged) when it cannot be reached.
    async fn reach(&self, kind: FleetKind, what: &str) -> Option<Fleet> {
        match self.fleet(kind).await {
            Ok(fleet) => Some(fleet),
            Err(e) => {
                tracing::warn!(fleet = kind.as_str(), error = %e, "cannot reach the fleet of {what}");
                None
            }
        }
    }

    /// Deletes this process's leased machines whose lease has run out and that no call uses.
    pub async fn reap_expired_leases(&self) -> Cleanup {
        let mut total = Cleanup::default();
        for kind in [FleetKind::Local, FleetKind::Cloud] {
            let Some(idle) = self.leases.idle_expired(kind).await else {
                return total;
            };
            if idle.is_empty() {
                continue;
            }
            let Some(fleet) = self.reach(kind, "expired leased machines").await else {
                continue;
            };
            if self.config.session_end != SessionEnd::Delete {
                // A lease running out is a sessionless client's session end: kept alike.
                let names: Vec<&str> = idle.iter().map(|e| e.name.as_str()).collect();
                let kept = self
                    .keep(&fleet, |e| {
                        names.contains(&e.name.as_str()) && !self.leases.busy(e)
                    })
                    .await;
                total.kept.extend(kept);
                continue;
            }
            let c = sweep::delete_all(&self.record, &fleet, idle, |e| !self.leases.busy(e)).await;
            self.workspaces.forget_all(kind, &c.deleted);
            if !c.deleted.is_empty() {
                tracing::info!(fleet = kind.as_str(), deleted = ?c.deleted, "deleted leased machines nobody used for {} s", self.config.machine_lease_secs);
            }
            total.add(c);
        }
        total
    }

    /// Reaps expired leases, and kept machines whose time is up, until the process's clean-up
    /// at exit begins (it cancels `reaping` first).
    pub async fn reap(self: Arc<Self>) {
        let stop = self.reaping.clone();
        // Kept machines and bases are reaped alike, at the pace of the shorter of their times.
        let base_idle = Some(self.config.base_idle_secs).filter(|secs| *secs > 0);
        let kept_interval =
            lease::reap_interval(base_idle.map_or(self.config.kept_machine_secs, |idle| {
                idle.min(self.config.kept_machine_secs)
            }));
        let mut last = tokio::time::Instant::now();
        loop {
            // The interval is read again each second: leases adopted after the start (the HTTP
            // server adopts once it serves) shorten it at once, not after the first long wait.
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            }
            if last.elapsed() < self.leases.reap_interval().min(kept_interval) {
                continue;
            }
            last = tokio::time::Instant::now();
            self.reap_expired_leases().await;
            self.reap_expired_kept().await;
        }
    }

    /// Reaches every fleet where this process holds a leased machine, so that the clean-up at
    /// exit finds them.
    async fn reach_leased_fleets(&self) {
        for kind in self.leases.fleets_held().await {
            if let Err(e) = self.fleet(kind).await {
                tracing::warn!(fleet = kind.as_str(), error = %e, "cannot reach the fleet of leased machines at exit");
            }
        }
    }

    /// Once create has answered: the machine's id, and this session as its owner.
    pub async fn remember_created(&self, fleet: FleetKind, name: &str, id: &str, session: &str) {
        let created = Entry {
            fleet,
            name: name.to_owned(),
            id: id.to_owned(),
            owner_pid: std::process::id(),
            owner: None,
            session: session.to_owned(),
            parent: None,
            recorded_at: ephemeral::now_secs(),
            lease: self.leases.lease_for(session),
            engine: Some(self.engine(fleet)),
            kept_until: None,
            base: None,
        };
        if let Err(e) = self.record.set_created(&created).await {
            tracing::warn!(error = %e, "could not record the id of {name}");
        }
    }

    pub async fn forget(&self, fleet: FleetKind, name_or_id: &str) {
        if let Err(e) = self.record.remove(fleet, name_or_id).await {
            tracing::warn!(error = %e, "could not update the ephemeral record for {name_or_id}");
        }
    }

    /// At startup: delete what a dead process left, wherever that needs no new serve. Cloud
    /// orphans always; local ones if a serve already answers (otherwise the first local call does it).
    pub async fn sweep_orphans_at_start(self: &Arc<Self>) {
        let workspaces = self.workspaces.clone();
        let swept = tokio::task::spawn_blocking(move || {
            let hour = std::time::Duration::from_secs(3600);
            workspaces.sweep_scratch(hour);
            workspaces.prune_seeds(hour);
        })
        .await;
        if let Err(e) = swept {
            tracing::warn!(error = %e, "sweeping the workspace copies failed");
        }
        self.sweep_orphans().await;
    }

    /// Whether this process's clean-up has begun (its exit): a watch of its siblings stops.
    pub fn stopping(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.reaping.cancelled()
    }

    /// Deletes what dead processes left (each machine claimed first, so that processes
    /// sweeping at once delete it once), wherever that needs no new serve.
    /// The fleets that answer now without this process starting anything: the cloud when it
    /// is configured, the local engine only when a serve is up. For work in the background,
    /// which must never be the reason an engine starts.
    pub async fn answering_fleets(&self) -> Vec<Fleet> {
        let mut fleets = Vec::new();
        if let Some(Ok(cloud)) = self.cloud() {
            fleets.push(Fleet::new(FleetKind::Cloud, cloud));
        }
        if let Ok(fleet) =
            local_serve::local_endpoint(&self.config).and_then(crate::fleet::LocalFleet::new)
            && fleet.health().await.is_ok()
        {
            fleets.push(Fleet::new(FleetKind::Local, Arc::new(fleet)));
        }
        fleets
    }

    pub async fn sweep_orphans(self: &Arc<Self>) {
        let cloud_engine = self.engine(FleetKind::Cloud);
        let has_cloud_orphans = self
            .record
            .orphaned(FleetKind::Cloud, &cloud_engine)
            .await
            .is_ok_and(|o| !o.is_empty());
        if has_cloud_orphans && let Some(Ok(cloud)) = self.cloud() {
            let cloud = Fleet::new(FleetKind::Cloud, cloud);
            let cleanup = sweep(&self.record, &cloud, &cloud_engine, None).await;
            self.workspaces
                .forget_all(FleetKind::Cloud, &cleanup.deleted);
            publish_orphan_sweep(&self.events, FleetKind::Cloud, &cleanup);
        }
        let local_engine = self.engine(FleetKind::Local);
        let has_local_orphans = self
            .record
            .orphaned(FleetKind::Local, &local_engine)
            .await
            .is_ok_and(|o| !o.is_empty());
        if has_local_orphans
            && let Ok(fleet) =
                local_serve::local_endpoint(&self.config).and_then(crate::fleet::LocalFleet::new)
            && fleet.health().await.is_ok()
        {
            let cleanup = sweep(
                &self.record,
                &Fleet::new(FleetKind::Local, Arc::new(fleet)),
                &local_engine,
                None,
            )
            .await;
            self.workspaces
                .forget_all(FleetKind::Local, &cleanup.deleted);
            publish_orphan_sweep(&self.events, FleetKind::Local, &cleanup);
        }
    }

    /// Deletes this session's ephemeral machines (and any a dead process left) on every fleet
    /// that was used, or under `sessionEnd` stop or pause keeps the session's own (stopped or
    /// paused) for a later session to take back. Never fails; what could not be deleted is
    /// reported and stays recorded.
    pub async fn cleanup_session(&self, session: &str) -> Cleanup {
        self.made.forget(session);
        let mut fleets: Vec<Fleet> = Vec::with_capacity(2);
        // Only a fleet that was used has machines of this session.
        if let Some(Ok(cloud)) = self.cloud.get() {
            fleets.push(Fleet::new(FleetKind::Cloud, cloud.clone()));
        }
        if let Some(serve) = self.local.lock().await.as_ref() {
            fleets.push(Fleet::new(FleetKind::Local, serve.fleet.clone()));
        }
        let mut total = Cleanup::default();
        for fleet in fleets {
            if self.config.session_end != SessionEnd::Delete {
                total.kept.extend(self.keep_session(session, &fleet).await);
            }
            let engine = self.engine(fleet.kind());
            let c = sweep(&self.record, &fleet, &engine, Some(session)).await;
            self.workspaces.forget_all(fleet.kind(), &c.deleted);
            total.add(c);
        }
        total
    }

    /// The session's machines on `fleet` recorded as kept, then stopped or paused.
    async fn keep_session(&self, session: &str, fleet: &Fleet) -> Vec<(String, keep::PutAway)> {
        self.keep(fleet, |e| e.session == session).await
    }

    /// The machines on `fleet` that `which` picks recorded as kept, then stopped or paused.
    async fn keep(
        &self,
        fleet: &Fleet,
        which: impl Fn(&Entry) -> bool + Send + Sync,
    ) -> Vec<(String, keep::PutAway)> {
        let now = ephemeral::now_secs();
        let (keep_secs, ttl) = (
            self.config.kept_machine_secs,
            self.config.ephemeral_ttl_secs,
        );
        let kept = match self
            .record
            .keep(fleet.kind(), which, |e| {
                keep::kept_until(e, now, keep_secs, ttl)
            })
            .await
        {
            Ok(kept) => kept,
            Err(e) => {
                tracing::error!(error = %e, "cannot write the machine record; machines are deleted instead of kept");
                return Vec::new();
            }
        };
        keep::put_away(&self.record, fleet, kept, self.config.session_end).await
    }

    /// A call of `session` names `name`: a machine kept from an earlier session becomes this
    /// session's own (it goes when this session ends, or is kept again). Answers whether it was
    /// taken. Only names with the temporary prefix are looked up.
    pub async fn take_back(&self, name: &str, session: &str) -> bool {
        if !name.starts_with(&self.config.machine_prefix) {
            return false;
        }
        let now = ephemeral::now_secs();
        // A read first: most calls name a machine nobody kept, and need no write lock.
        let kept_on = self
            .record
            .entries_named(name)
            .await
            .ok()
            .and_then(|entries| {
                entries
                    .iter()
                    .find(|e| {
                        (e.name == name || e.id == name) && e.kept_at(now) && e.base.is_none()
                    })
                    .map(|e| e.fleet)
            });
        let Some(fleet) = kept_on else {
            return false;
        };
        let lease = self.leases.lease_for(session);
        match self
            .record
            .take_back(name, std::process::id(), session, lease, now)
            .await
        {
            Ok(taken) if !taken.is_empty() => {
                tracing::info!(machine = name, %session, "a session took back a kept machine");
                self.events.publish(
                    ServerEvent::info(
                        "keptMachineTaken",
                        format!("{name}, kept from an earlier session, now belongs to this one"),
                    )
                    .with("fleet", fleet.as_str())
                    .with("machine", name.to_owned()),
                );
                true
            }
            Ok(_) => false,
            Err(e) => {
                tracing::warn!(error = %e, "cannot write the machine record; {name} stays kept");
                false
            }
        }
    }

    /// Deletes kept machines whose time is up, on each fleet that has some (reaching it: a
    /// local one may need the serve started).
    pub async fn reap_expired_kept(&self) -> Cleanup {
        let now = ephemeral::now_secs();
        let Ok(kept) = self.record.kept().await else {
            return Cleanup::default();
        };
        let mut total = Cleanup::default();
        for kind in [FleetKind::Local, FleetKind::Cloud] {
            let engine = self.engine(kind);
            if !kept
                .iter()
                .any(|e| e.fleet == kind && !e.kept_at(now) && e.made_on(&engine))
            {
                continue;
            }
            let Some(fleet) = self.reach(kind, "kept machines whose time is up").await else {
                continue;
            };
            let c = sweep(&self.record, &fleet, &engine, None).await;
            self.workspaces.forget_all(fleet.kind(), &c.deleted);
            if !c.deleted.is_empty() {
                tracing::info!(fleet = kind.as_str(), deleted = ?c.deleted, "deleted kept machines whose time was up (keptMachineSecs {})", self.config.kept_machine_secs);
            }
            total.add(c);
        }
        total
    }

    /// Forgets the local serve after a call could not reach it (another process stopped the
    /// serve this one adopted, say), so that the next local call finds or starts one again.
    pub async fn reset_local(&self) {
        if let Some(serve) = self.local.lock().await.take() {
            tracing::warn!(
                "the local serve stopped answering; the next local call looks for one again"
            );
            serve.stop().await;
        }
    }

    /// At the exit of a process that served several sessions: every machine it recorded.
    pub async fn shutdown_process(&self) -> Cleanup {
        self.reaping.cancel();
        self.reach_leased_fleets().await;
        let sessions: std::collections::BTreeSet<String> = self
            .record
            .entries()
            .await
            .map(|e| {
                e.into_iter()
                    .filter(|e| self.record.is_mine(e))
                    .map(|e| e.session)
                    .collect()
            })
            .unwrap_or_default();
        let mut total = Cleanup::default();
        for session in sessions {
            let c = self.cleanup_session(&session).await;
            total.deleted.extend(c.deleted);
            total.failed.extend(c.failed);
        }
        self.stop_local().await;
        total
    }

    /// The warm pools this process set up go (a serve it did not start outlives it), then the
    /// serve it started stops.
    async fn stop_local(&self) {
        if let Some(serve) = self.local.lock().await.take() {
            if !self.pools.is_empty() {
                let fleet = Fleet::new(FleetKind::Local, serve.fleet.clone());
                self.pools.tear_down(&fleet).await;
            }
            serve.stop().await;
        }
    }

    /// At process exit: the session's machines, then the serve if this process started it.
    pub async fn shutdown(&self, session: &str) -> Cleanup {
        self.reaping.cancel();
        let cleanup = self.cleanup_session(session).await;
        self.stop_local().await;
        cleanup
    }
}

/// Which local serve this process uses: one it started, or one that already answered.
fn serve_event(serve: &LocalServe) -> ServerEvent {
    let message = if serve.started_here() {
        format!("started smolvm serve {} on {}", serve.version, serve.listen)
    } else {
        format!(
            "using the smolvm serve {} already running at {}",
            serve.version, serve.listen
        )
    };
    ServerEvent::info("localServe", message)
        .with("version", serve.version.clone())
        .with("listen", serve.listen.clone())
        .with("started", serve.started_here())
}
