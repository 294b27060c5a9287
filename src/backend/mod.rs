//! What a server process holds for its sessions: the mode, the fleets (the local one started on
//! first use), the ephemeral record, and the clean-up when a session or the process ends.

pub mod ephemeral;
pub mod events;
pub mod lease;
pub mod local_serve;

use crate::config::{Config, TargetsSetting};
use crate::fleet::{Backstop, CloudFleet, ErrorKind, Fleet, FleetError, FleetKind, FleetResult};
use ephemeral::{Entry, Lease, Record, RecordError, ensure_runtime_dir};
use events::{Events, ServerEvent};
use local_serve::LocalServe;
use std::sync::Arc;

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

pub struct Backend {
    pub config: Arc<Config>,
    pub mode: Mode,
    pub record: Record,
    local: tokio::sync::Mutex<Option<LocalServe>>,
    /// Built on first use: its HTTPS client loads the platform's root certificates, which a
    /// session that never touches the cloud should not pay for at start-up.
    cloud: std::sync::OnceLock<Result<Arc<CloudFleet>, FleetError>>,
    /// Downloads read-file paused at the end of a page, so that the next page of the same read
    /// continues the same download (neither API reads a byte range).
    parked_reads: std::sync::Mutex<Vec<ParkedRead>>,
    /// The machine names tool calls are using, which the lease reaper leaves alone.
    in_use: lease::InUse,
    /// The owner recorded for machines this process holds under a lease (`lease`).
    lease_session: String,
    /// Notable events, for the sessions to pass on to their clients.
    pub events: Events,
    /// The logs clients follow, one poller each, shared by every session of the process.
    pub follow: crate::resources::follow::LogFollowers,
    /// Every command run, recorded off the calls' path (`crate::ledger`).
    pub ledger: crate::ledger::Ledger,
    /// Long calls carried on as MCP tasks; here because they outlive the handler of their
    /// request (`crate::server::tasks`).
    pub tasks: crate::server::tasks::Tasks,
    /// Commands started with `background: true`, and their watchers (`crate::jobs`).
    pub jobs: crate::jobs::Jobs,
    /// Which local engine this process uses, found on first need (`engine`).
    local_engine: std::sync::OnceLock<String>,
}

/// A read-file download paused between pages: where it is, and the stream to go on with.
#[derive(Debug)]
pub struct ParkedRead {
    pub kind: FleetKind,
    pub machine: String,
    pub path: String,
    /// Where the next page starts.
    pub offset: u64,
    /// Shared with the task that reads ahead while the last page travels to the client.
    pub reader: Arc<tokio::sync::Mutex<crate::fleet::FileReader>>,
    pub parked_at: std::time::Instant,
}

/// How long a paused download waits for its next page (each holds an open request to the
/// engine, which holds the file; how many may wait at once is `maxParkedReads`).
const PARKED_READ_SECS: u64 = 30;

/// What ended up deleted, and what could not be.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Cleanup {
    pub deleted: Vec<String>,
    pub failed: Vec<(String, String)>,
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

impl Backend {
    pub fn new(config: Config) -> Result<Backend, StartupError> {
        ensure_runtime_dir(&config.runtime_dir)?;
        let mode = resolve_mode(&config);
        let events = Events::default();
        let ledger = crate::ledger::Ledger::open(&config, events.clone());
        let config_max_running_jobs = config.max_running_jobs;
        let max_subscriptions = config.max_subscriptions;
        let max_tasks = config.max_tasks;
        Ok(Backend {
            record: Record::new(&config.runtime_dir),
            config: Arc::new(config),
            mode,
            local: tokio::sync::Mutex::new(None),
            cloud: std::sync::OnceLock::new(),
            parked_reads: std::sync::Mutex::new(Vec::new()),
            in_use: lease::InUse::default(),
            lease_session: format!("leased-{}", std::process::id()),
            events,
            follow: crate::resources::follow::LogFollowers::new(max_subscriptions),
            ledger,
            tasks: crate::server::tasks::Tasks::new(max_tasks),
            jobs: crate::jobs::Jobs::new(config_max_running_jobs),
            local_engine: std::sync::OnceLock::new(),
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

    /// Drops every paused read-file download: after a call that may change a machine, a page
    /// must not come from a download begun before it.
    pub fn forget_parked_reads(&self) {
        if let Ok(mut parked) = self.parked_reads.lock() {
            parked.clear();
        }
    }

    /// The paused download of `path` on `machine` that stopped exactly at `offset`, if one is
    /// still fresh.
    pub fn unpark_read(
        &self,
        kind: FleetKind,
        machine: &str,
        path: &str,
        offset: u64,
    ) -> Option<Arc<tokio::sync::Mutex<crate::fleet::FileReader>>> {
        let mut parked = self.parked_reads.lock().ok()?;
        let fresh = std::time::Duration::from_secs(PARKED_READ_SECS);
        parked.retain(|p| p.parked_at.elapsed() < fresh);
        let at = parked.iter().position(|p| {
            p.kind == kind && p.machine == machine && p.path == path && p.offset == offset
        })?;
        Some(parked.swap_remove(at).reader)
    }

    pub fn park_read(&self, read: ParkedRead) {
        if let Ok(mut parked) = self.parked_reads.lock() {
            if parked.len() >= self.config.max_parked_reads
                && let Some(oldest) = (0..parked.len()).min_by_key(|&i| parked[i].parked_at)
            {
                parked.swap_remove(oldest);
            }
            parked.push(read);
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

    /// The fleet for a call. The local serve is found or started here, on first use.
    pub async fn fleet(&self, kind: FleetKind) -> FleetResult<Fleet> {
        match kind {
            FleetKind::Cloud => match self.cloud() {
                Some(cloud) => Ok(cloud? as Fleet),
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
                        return Ok(serve.fleet.clone() as Fleet);
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
                let serve = LocalServe::acquire(&self.config).await?;
                self.events.publish(serve_event(&serve));
                let fleet: Fleet = serve.fleet.clone();
                *local = Some(serve);
                drop(local);
                // A first local call is also when a crashed predecessor's machines can be
                // reached; deleting them must not hold up this call.
                let record = self.record.clone();
                let orphan_fleet = fleet.clone();
                let events = self.events.clone();
                let engine = self.engine(FleetKind::Local);
                tokio::spawn(async move {
                    let cleanup = sweep(&record, &orphan_fleet, &engine, None).await;
                    publish_orphan_sweep(&events, FleetKind::Local, &cleanup);
                });
                Ok(fleet)
            }
        }
    }

    /// Records an ephemeral machine before its create is sent, with the machine a branch child
    /// is made from. Answers whether the record already had a machine of that name (which is
    /// then left as it was).
    pub fn remember(
        &self,
        fleet: FleetKind,
        name: &str,
        session: &str,
        parent: Option<&str>,
    ) -> Result<bool, RecordError> {
        self.record.add_new(Entry {
            fleet,
            name: name.to_owned(),
            id: name.to_owned(),
            owner_pid: std::process::id(),
            session: session.to_owned(),
            parent: parent.map(str::to_owned),
            recorded_at: ephemeral::now_secs(),
            lease: self.lease_for(session),
            engine: Some(self.engine(fleet)),
        })
    }

    /// A machine recorded for the lease session is held under a lease from now on.
    fn lease_for(&self, session: &str) -> Option<Lease> {
        (session == self.lease_session).then(|| {
            self.in_use.start_leasing(self.config.machine_lease_secs);
            Lease {
                last_used: ephemeral::now_secs(),
                secs: self.config.machine_lease_secs,
            }
        })
    }

    /// Once create has answered: the machine's id, and this session as its owner.
    pub fn remember_created(&self, fleet: FleetKind, name: &str, id: &str, session: &str) {
        let created = Entry {
            fleet,
            name: name.to_owned(),
            id: id.to_owned(),
            owner_pid: std::process::id(),
            session: session.to_owned(),
            parent: None,
            recorded_at: ephemeral::now_secs(),
            lease: self.lease_for(session),
            engine: Some(self.engine(fleet)),
        };
        if let Err(e) = self.record.set_created(&created) {
            tracing::warn!(error = %e, "could not record the id of {name}");
        }
    }

    pub fn forget(&self, fleet: FleetKind, name_or_id: &str) {
        if let Err(e) = self.record.remove(fleet, name_or_id) {
            tracing::warn!(error = %e, "could not update the ephemeral record for {name_or_id}");
        }
    }

    /// At startup: delete what a dead process left, wherever that needs no new serve. Cloud
    /// orphans always; local ones if a serve already answers (otherwise the first local call does it).
    pub async fn sweep_orphans_at_start(self: &Arc<Self>) {
        let cloud_engine = self.engine(FleetKind::Cloud);
        let has_cloud_orphans = self
            .record
            .orphaned(FleetKind::Cloud, &cloud_engine)
            .is_ok_and(|o| !o.is_empty());
        if has_cloud_orphans && let Some(Ok(cloud)) = self.cloud() {
            let cleanup = sweep(&self.record, &(cloud as Fleet), &cloud_engine, None).await;
            publish_orphan_sweep(&self.events, FleetKind::Cloud, &cleanup);
        }
        let local_engine = self.engine(FleetKind::Local);
        let has_local_orphans = self
            .record
            .orphaned(FleetKind::Local, &local_engine)
            .is_ok_and(|o| !o.is_empty());
        if has_local_orphans
            && let Ok(fleet) =
                local_serve::local_endpoint(&self.config).and_then(crate::fleet::LocalFleet::new)
            && fleet.health().await.is_ok()
        {
            let cleanup = sweep(
                &self.record,
                &(Arc::new(fleet) as Fleet),
                &local_engine,
                None,
            )
            .await;
            publish_orphan_sweep(&self.events, FleetKind::Local, &cleanup);
        }
    }

    /// Deletes this session's ephemeral machines (and any a dead process left) on every fleet
    /// that was used. Never fails; what could not be deleted is reported and stays recorded.
    pub async fn cleanup_session(&self, session: &str) -> Cleanup {
        let mut total = Cleanup::default();
        // Only a cloud fleet that was used has machines of this session.
        if let Some(Ok(cloud)) = self.cloud.get() {
            let engine = self.engine(FleetKind::Cloud);
            let c = sweep(
                &self.record,
                &(cloud.clone() as Fleet),
                &engine,
                Some(session),
            )
            .await;
            total.deleted.extend(c.deleted);
            total.failed.extend(c.failed);
        }
        let local = self.local.lock().await;
        if let Some(serve) = local.as_ref() {
            let fleet: Fleet = serve.fleet.clone();
            drop(local);
            let engine = self.engine(FleetKind::Local);
            let c = sweep(&self.record, &fleet, &engine, Some(session)).await;
            total.deleted.extend(c.deleted);
            total.failed.extend(c.failed);
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
        self.reach_leased_fleets().await;
        let me = std::process::id();
        let sessions: std::collections::BTreeSet<String> = self
            .record
            .entries()
            .map(|e| {
                e.into_iter()
                    .filter(|e| e.owner_pid == me)
                    .map(|e| e.session)
                    .collect()
            })
            .unwrap_or_default();
        self.ledger.flush().await;
        let mut total = Cleanup::default();
        for session in sessions {
            let c = self.cleanup_session(&session).await;
            total.deleted.extend(c.deleted);
            total.failed.extend(c.failed);
        }
        if let Some(serve) = self.local.lock().await.take() {
            serve.stop().await;
        }
        total
    }

    /// At process exit: the session's machines, then the serve if this process started it.
    pub async fn shutdown(&self, session: &str) -> Cleanup {
        self.ledger.flush().await;
        let cleanup = self.cleanup_session(session).await;
        if let Some(serve) = self.local.lock().await.take() {
            serve.stop().await;
        }
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

/// What a sweep of machines left by a process that ended did, for the clients to see: those
/// machines were someone's, and their going is news.
fn publish_orphan_sweep(events: &Events, kind: FleetKind, cleanup: &Cleanup) {
    if !cleanup.deleted.is_empty() {
        events.publish(
            ServerEvent::info(
                "orphansDeleted",
                format!(
                    "deleted {} machine(s) on the {} fleet that a server process which ended had \
                     left: {}",
                    cleanup.deleted.len(),
                    kind.as_str(),
                    cleanup.deleted.join(", ")
                ),
            )
            .with("fleet", kind.as_str())
            .with("machines", cleanup.deleted.clone()),
        );
    }
    for (name, why) in &cleanup.failed {
        events.publish(
            ServerEvent::warning(
                "orphanNotDeleted",
                format!(
                    "could not delete {name} on the {} fleet, left by a server process that \
                     ended: {why}",
                    kind.as_str()
                ),
            )
            .with("fleet", kind.as_str())
            .with("machine", name.clone()),
        );
    }
}

/// The entries ordered so that no machine comes before a recorded child of it (a child may
/// itself be a source when it was branched branchable).
fn children_first(mut pending: Vec<Entry>) -> Vec<Entry> {
    let mut ordered = Vec::with_capacity(pending.len());
    while !pending.is_empty() {
        let is_parent = |e: &Entry, of: &[Entry]| {
            of.iter().any(|c| {
                c.parent
                    .as_deref()
                    .is_some_and(|p| p == e.name || p == e.id)
            })
        };
        let (leaves, rest): (Vec<Entry>, Vec<Entry>) = pending
            .iter()
            .cloned()
            .partition(|e| !is_parent(e, &pending));
        if leaves.is_empty() {
            // A cycle can only come from a hand-edited record: take the rest as it is.
            ordered.extend(rest);
            break;
        }
        ordered.extend(leaves);
        pending = rest;
    }
    ordered
}

/// Deletes one recorded machine and forgets it; answers the error when it stays. A 409 naming
/// live clones that are all machines of this same sweep (so the session owns them, or a dead
/// process left them) is retried with the engine's `cascade`, which deletes them with it;
/// clones it does not own are never deleted this way.
/// How long a cloud machine whose create or branch never answered stays recorded while it is
/// not found.
const PENDING_SECS: u64 = 24 * 3600;

async fn delete_one(
    record: &Record,
    fleet: &Fleet,
    entry: &Entry,
    ours: &std::collections::BTreeSet<String>,
    cleanup: &mut Cleanup,
) -> Option<FleetError> {
    let kind = fleet.kind();
    let mut answer = fleet.delete(&entry.id).await;
    if let Err(e) = &answer
        && e.kind == ErrorKind::Conflict
        && let Some(clones) = live_clones(&e.message)
        && clones.iter().all(|c| ours.contains(c))
    {
        answer = fleet.delete_with_clones(&entry.id).await;
        if answer.is_ok() {
            for clone in &clones {
                let _ = record.remove(kind, clone);
                cleanup.deleted.push(clone.clone());
            }
        }
    }
    match answer {
        Ok(_) => {
            let _ = record.remove(kind, &entry.name);
            cleanup.deleted.push(entry.name.clone());
            None
        }
        // Not there yet: a cloud create or branch that never answered with an id (its call
        // gave up on the deadline) may still come out of the service's per-source queue (facts
        // 3.9), and a branch child has no TTL of its own. Kept, for a later sweep (the next start
        // deletes what a dead process left), until it is a day old.
        Err(e)
            if e.kind == ErrorKind::NotFound
                && kind == FleetKind::Cloud
                && entry.id == entry.name
                && ephemeral::now_secs().saturating_sub(entry.recorded_at) < PENDING_SECS =>
        {
            Some(FleetError::new(
                ErrorKind::NotFound,
                format!("delete machine {}", entry.name),
                "not there yet: its create or branch never answered and may still finish; it \
                 stays recorded, and a later clean-up deletes it",
            ))
        }
        // Already gone: on cloud the TTL sweep deletes an ephemeral machine whatever the
        // session is doing (facts 3.3 ttlSeconds, 3.6 "404 when already gone"). Done all the
        // same, once (a cascade earlier in this sweep may have taken it already).
        Err(e) if e.kind == ErrorKind::NotFound => {
            let _ = record.remove(kind, &entry.name);
            if !cleanup.deleted.contains(&entry.name) {
                cleanup.deleted.push(entry.name.clone());
            }
            None
        }
        Err(e) => Some(e),
    }
}

/// The clones the engine names in its refusal to delete a fork base: "machine 'x' is the fork
/// base of 2 live clone(s) (a, b); ..." (smolvm src/api/handlers/machines.rs; the same words
/// are in the 1.32.2 binary). `None` when the message is not that refusal.
pub(crate) fn live_clones(message: &str) -> Option<Vec<String>> {
    let (_, rest) = message.split_once("live clone(s) (")?;
    let (names, _) = rest.split_once(')')?;
    let names: Vec<String> = names
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    (!names.is_empty()).then_some(names)
}

/// Deletes the recorded machines of `session` (or only orphans when `None`) made on `engine`,
/// on one fleet. Orphans of other engines stay recorded, and the log says so: this engine
/// would answer 404 for them, which is no delete.
async fn sweep(record: &Record, fleet: &Fleet, engine: &str, session: Option<&str>) -> Cleanup {
    let kind = fleet.kind();
    if let Ok(elsewhere) = record.orphaned_elsewhere(kind, engine)
        && !elsewhere.is_empty()
    {
        let engines: std::collections::BTreeSet<&str> = elsewhere
            .iter()
            .filter_map(|e| e.engine.as_deref())
            .collect();
        let names: Vec<&str> = elsewhere.iter().map(|e| e.name.as_str()).collect();
        tracing::info!(
            fleet = kind.as_str(),
            this_engine = engine,
            their_engines = ?engines,
            machines = ?names,
            "orphaned machines made on another engine are left recorded; a start on their engine deletes them"
        );
    }
    let entries = match session {
        Some(s) => record.owned_or_orphaned(s, kind, engine),
        None => record.orphaned(kind, engine),
    };
    let entries = match entries {
        Ok(entries) => entries,
        Err(e) => {
            tracing::error!(error = %e, "cannot read the ephemeral record; nothing deleted");
            return Cleanup {
                deleted: vec![],
                failed: vec![("(the machine record)".into(), e.to_string())],
            };
        }
    };
    delete_all(record, fleet, entries, |_| true).await
}

/// Deletes `entries` on one fleet, children before their sources, each only if `still` says so
/// right before its delete is sent.
async fn delete_all(
    record: &Record,
    fleet: &Fleet,
    entries: Vec<Entry>,
    still: impl Fn(&Entry) -> bool,
) -> Cleanup {
    let kind = fleet.kind();
    let mut cleanup = Cleanup::default();
    // Children before their source: the local engine refuses to delete a machine that is the
    // fork base of live clones (409 "is the fork base of N live clone(s) (..)", smolvm
    // src/api/handlers/machines.rs `delete_machine`).
    let ours: std::collections::BTreeSet<String> = entries
        .iter()
        .flat_map(|e| [e.name.clone(), e.id.clone()])
        .collect();
    let mut refused = Vec::new();
    for entry in children_first(entries) {
        if !still(&entry) {
            continue;
        }
        match delete_one(record, fleet, &entry, &ours, &mut cleanup).await {
            Some(e) if e.kind == ErrorKind::Conflict => refused.push((entry, e)),
            Some(e) => cleanup.failed.push((entry.name, e.to_string())),
            None => {}
        }
    }
    // A source refused because of a child deleted after it (a record written before parents
    // were recorded, or a child another call of this session branched by id): once more, now
    // that this sweep's other machines are gone.
    for (entry, first) in refused {
        if let Some(e) = delete_one(record, fleet, &entry, &ours, &mut cleanup).await {
            tracing::debug!(first = %first, "delete refused twice");
            cleanup.failed.push((entry.name, e.to_string()));
        }
    }
    if !cleanup.deleted.is_empty() {
        tracing::info!(fleet = kind.as_str(), deleted = ?cleanup.deleted, "deleted ephemeral machines");
    }
    for (name, why) in &cleanup.failed {
        tracing::warn!(fleet = kind.as_str(), %name, %why, "could not delete an ephemeral machine");
    }
    cleanup
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, parent: Option<&str>) -> Entry {
        Entry {
            fleet: FleetKind::Local,
            name: name.into(),
            id: name.into(),
            owner_pid: 1,
            session: "s".into(),
            parent: parent.map(Into::into),
            recorded_at: 0,
            lease: None,
            engine: None,
        }
    }

    #[test]
    fn children_come_before_their_sources_at_every_depth() {
        let order: Vec<String> = children_first(vec![
            entry("root", None),
            entry("mid", Some("root")),
            entry("other", None),
            entry("leaf", Some("mid")),
        ])
        .into_iter()
        .map(|e| e.name)
        .collect();
        assert_eq!(order, ["other", "leaf", "mid", "root"]);
    }

    #[test]
    fn the_clones_the_engine_names() {
        assert_eq!(
            live_clones(
                "machine 'src' is the fork base of 2 live clone(s) (a, b-2); their disks are \
                 backed by its disks — delete the clones first"
            ),
            Some(vec!["a".to_owned(), "b-2".to_owned()])
        );
        assert_eq!(live_clones("machine 'x' already exists"), None);
    }
}
