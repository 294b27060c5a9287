//! Machines owned by the process under a lease. A 2026-07-28 request over HTTP has no session:
//! rmcp builds a handler for that one request and drops it with the answer, so an ephemeral
//! machine the request creates cannot belong to the handler. It belongs to the process instead,
//! and lives as long as tool calls keep naming it: each renews its lease, and a reaper deletes
//! one unused for `machineLeaseSecs`, never while a call on it is in flight.

use crate::fleet::FleetKind;
use crate::process::ephemeral::{Entry, LEASE_USER_MARK as USER_MARK, Lease, Record, now_secs};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tracing::Instrument as _;

/// Which machine names tool calls are using right now, with how many calls use each.
#[derive(Debug)]
pub struct InUse {
    calls: Mutex<HashMap<String, usize>>,
    /// When a call last held or let go each machine name, kept only when `parkIdleSecs` is set
    /// (nothing else reads it) and pruned to the record's machines at each parking pass.
    named: Mutex<HashMap<String, std::time::Instant>>,
    tracks_naming: AtomicBool,
    /// Whether this process holds any leased machine: until then a call needs no record write.
    leasing: AtomicBool,
    /// The shortest idle period of a lease held here (an adopted lease keeps the one it was
    /// taken with), which sets how often the reaper looks.
    shortest_secs: AtomicU64,
}

impl Default for InUse {
    fn default() -> Self {
        InUse {
            calls: Mutex::default(),
            named: Mutex::default(),
            tracks_naming: AtomicBool::new(false),
            leasing: AtomicBool::new(false),
            shortest_secs: AtomicU64::new(u64::MAX),
        }
    }
}

impl InUse {
    /// A call is over with `names`: no longer counted in use by it.
    fn let_go(&self, names: &[String]) {
        if let Ok(mut calls) = self.calls.lock() {
            for name in names {
                if let Some(count) = calls.get_mut(name) {
                    *count -= 1;
                    if *count == 0 {
                        calls.remove(name);
                    }
                }
            }
        }
    }

    fn start_leasing(&self, secs: u64) {
        self.leasing.store(true, Ordering::Relaxed);
        self.shortest_secs.fetch_min(secs, Ordering::Relaxed);
    }

    fn leasing(&self) -> bool {
        self.leasing.load(Ordering::Relaxed)
    }

    fn busy(&self, name: &str, id: &str) -> bool {
        self.calls
            .lock()
            .is_ok_and(|calls| calls.contains_key(name) || calls.contains_key(id))
    }

    fn named_now(&self, names: &[String]) {
        if !self.tracks_naming.load(Ordering::Relaxed) {
            return;
        }
        if let Ok(mut named) = self.named.lock() {
            let now = std::time::Instant::now();
            for name in names {
                named.insert(name.clone(), now);
            }
        }
    }
}

/// The leases of one process: which machines it holds under a lease, and which names calls
/// are using now.
#[derive(Debug)]
pub struct Leases {
    record: Record,
    in_use: Arc<InUse>,
    /// The session name under which this process's leased machines are recorded.
    session: String,
    /// How long a lease taken here lasts without use (`machineLeaseSecs`).
    secs: u64,
}

impl Leases {
    /// `track_naming`: keep when each machine was last named (`parkIdleSecs` set).
    pub fn new(record: Record, secs: u64, track_naming: bool) -> Leases {
        // In a shared record the pid alone could be another host's process's too.
        let session = match record.me() {
            Some(instance) => format!("leased-{instance}"),
            None => format!("leased-{}", std::process::id()),
        };
        let in_use = Arc::new(InUse::default());
        in_use.tracks_naming.store(track_naming, Ordering::Relaxed);
        Leases {
            record,
            in_use,
            session,
            secs,
        }
    }

    /// Forgets when machines no longer in the record were last named, so the map holds no more
    /// names than the record holds machines.
    pub fn forget_naming_except(&self, entries: &[Entry]) {
        if let Ok(mut named) = self.in_use.named.lock() {
            named.retain(|name, _| {
                entries
                    .iter()
                    .any(|e| e.name == name.as_str() || e.id == name.as_str())
            });
        }
    }

    /// How many machine names the naming map holds (for its bound's test).
    pub fn naming_len(&self) -> usize {
        self.in_use.named.lock().map_or(0, |named| named.len())
    }

    pub fn session(&self) -> &str {
        &self.session
    }

    /// The lease session of `user`'s machines (an id; the operator's is empty): the process's
    /// own for the operator, one of the user's beside it for a signed-in user, so that one
    /// user's leased machines and terminals never count in another's per-session limits.
    pub fn session_of(&self, user: &str) -> String {
        if user.is_empty() {
            self.session.clone()
        } else {
            format!("{}{USER_MARK}{user}", self.session)
        }
    }

    /// Whether `session` is one of this process's lease sessions (any user's).
    pub fn is_lease_session(&self, session: &str) -> bool {
        session
            .strip_prefix(self.session.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(USER_MARK))
    }

    /// The lease of a machine recorded for `session`: one when it is one of this process's
    /// lease sessions, none otherwise.
    pub fn lease_for(&self, session: &str) -> Option<Lease> {
        self.is_lease_session(session).then(|| {
            self.in_use.start_leasing(self.secs);
            Lease {
                last_used: now_secs(),
                secs: self.secs,
            }
        })
    }

    /// A tool call begins to use `names`: their leases are renewed, and the reaper leaves them
    /// alone until `release`.
    pub async fn hold(&self, names: &[String]) {
        if names.is_empty() {
            return;
        }
        if let Ok(mut calls) = self.in_use.calls.lock() {
            for name in names {
                *calls.entry(name.clone()).or_default() += 1;
            }
        }
        self.in_use.named_now(names);
        self.renew(names).await;
    }

    /// The call is over: renewed once more (a long call must not end on an expired lease),
    /// then no longer in use.
    pub fn release(&self, names: &[String]) {
        if names.is_empty() {
            return;
        }
        self.in_use.named_now(names);
        // A call ends in its Drop, which cannot wait on the record: the renewal goes on in a
        // task of its own, and the names stay in use (the reaper leaves them) until it is made.
        if self.in_use.leasing()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let (record, in_use, names) =
                (self.record.clone(), self.in_use.clone(), names.to_vec());
            runtime.spawn(
                async move {
                    if let Err(e) = record.renew(&names, now_secs()).await {
                        tracing::warn!(error = %e, "could not renew the lease of {names:?}");
                    }
                    in_use.let_go(&names);
                }
                .in_current_span(),
            );
            return;
        }
        self.in_use.let_go(names);
    }

    async fn renew(&self, names: &[String]) {
        if !self.in_use.leasing() {
            return;
        }
        if let Err(e) = self.record.renew(names, now_secs()).await {
            tracing::warn!(error = %e, "could not renew the lease of {names:?}");
        }
    }

    /// Whether a call is using the machine now.
    pub fn busy(&self, entry: &Entry) -> bool {
        self.in_use.busy(&entry.name, &entry.id)
    }

    /// How long no call of this process has named `entry`'s machine (by name or id), its lease's
    /// last use counting too (a call of another process renews it); `None` while a call uses
    /// it, or when no call of this process named it and it has no lease.
    pub fn idle_for(&self, entry: &Entry) -> Option<std::time::Duration> {
        if self.busy(entry) {
            return None;
        }
        let here = self.in_use.named.lock().ok().and_then(|named| {
            [&entry.name, &entry.id]
                .into_iter()
                .filter_map(|n| named.get(n.as_str()))
                .max()
                .map(|at| at.elapsed())
        });
        let leased = entry
            .lease
            .map(|l| std::time::Duration::from_secs(now_secs().saturating_sub(l.last_used)));
        match (here, leased) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// At start: leased machines of a dead server whose lease has not run out become this
    /// process's, since a sessionless client may still hold their names; the expired ones are
    /// orphans, which the start-up sweep deletes.
    pub async fn adopt(&self) -> Vec<String> {
        match self
            .record
            .adopt_leased(std::process::id(), &self.session, now_secs())
            .await
        {
            Ok(adopted) => {
                for lease in adopted.iter().filter_map(|e| e.lease) {
                    self.in_use.start_leasing(lease.secs);
                }
                if !adopted.is_empty() {
                    tracing::info!(machines = ?adopted.iter().map(|e| &e.name).collect::<Vec<_>>(), "adopted leased machines of a previous server");
                }
                adopted.into_iter().map(|e| e.name).collect()
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the ephemeral record; no leased machine adopted");
                Vec::new()
            }
        }
    }

    /// This process's leased machines on `kind` whose lease has run out and that no call
    /// uses: what the reaper deletes. `None` while this process holds no lease at all.
    pub async fn idle_expired(&self, kind: FleetKind) -> Option<Vec<Entry>> {
        if !self.in_use.leasing() {
            return None;
        }
        match self
            .record
            .expired_leases(std::process::id(), kind, now_secs())
            .await
        {
            Ok(expired) => Some(expired.into_iter().filter(|e| !self.busy(e)).collect()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the ephemeral record; nothing reaped");
                None
            }
        }
    }

    /// The fleets where this process holds a leased machine, which the clean-up at exit must
    /// reach: an adopted lease may be on a fleet no call of this process has used.
    pub async fn fleets_held(&self) -> Vec<FleetKind> {
        let Ok(entries) = self.record.entries().await else {
            return Vec::new();
        };
        [FleetKind::Local, FleetKind::Cloud]
            .into_iter()
            .filter(|kind| {
                entries
                    .iter()
                    .any(|e| e.fleet == *kind && self.record.is_mine(e) && e.lease.is_some())
            })
            .collect()
    }

    /// How often the reaper looks: often enough that a machine outlives its lease by at most a
    /// quarter of it (and 30 s), rarely enough to cost nothing.
    pub fn reap_interval(&self) -> Duration {
        let shortest = self.in_use.shortest_secs.load(Ordering::Relaxed);
        reap_interval(shortest.min(self.secs))
    }
}

/// How often the reaper looks for leases of `lease_secs`.
pub fn reap_interval(lease_secs: u64) -> Duration {
    Duration::from_secs((lease_secs / 4).clamp(1, 30))
}
