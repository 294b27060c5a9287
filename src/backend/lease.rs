//! Machines owned by the process under a lease. A 2026-07-28 request over HTTP has no session:
//! rmcp builds a handler for that one request and drops it with the answer, so an ephemeral
//! machine the request creates cannot belong to the handler. It belongs to the process instead,
//! and lives as long as tool calls keep naming it: each renews its lease, and a reaper deletes
//! one unused for `machineLeaseSecs`, never while a call on it is in flight.

use super::{Backend, Cleanup, delete_all};
use crate::backend::ephemeral::now_secs;
use crate::fleet::FleetKind;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Which machine names tool calls are using right now, with how many calls use each.
#[derive(Debug)]
pub struct InUse {
    calls: Mutex<HashMap<String, usize>>,
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
            leasing: AtomicBool::new(false),
            shortest_secs: AtomicU64::new(u64::MAX),
        }
    }
}

impl InUse {
    pub(super) fn start_leasing(&self, secs: u64) {
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
}

impl Backend {
    /// The session name under which this process's leased machines are recorded.
    pub fn lease_session(&self) -> &str {
        &self.lease_session
    }

    /// A tool call begins to use `names`: their leases are renewed, and the reaper leaves them
    /// alone until `release`.
    pub fn hold(&self, names: &[String]) {
        if names.is_empty() {
            return;
        }
        if let Ok(mut calls) = self.in_use.calls.lock() {
            for name in names {
                *calls.entry(name.clone()).or_default() += 1;
            }
        }
        self.renew(names);
    }

    /// The call is over: renewed once more (a long call must not end on an expired lease),
    /// then no longer in use.
    pub fn release(&self, names: &[String]) {
        if names.is_empty() {
            return;
        }
        self.renew(names);
        if let Ok(mut calls) = self.in_use.calls.lock() {
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

    fn renew(&self, names: &[String]) {
        if !self.in_use.leasing() {
            return;
        }
        if let Err(e) = self.record.renew(names, now_secs()) {
            tracing::warn!(error = %e, "could not renew the lease of {names:?}");
        }
    }

    /// At start: leased machines of a dead server whose lease has not run out become this
    /// process's, since a sessionless client may still hold their names; the expired ones are
    /// orphans, which the start-up sweep deletes.
    pub fn adopt_leased_machines(&self) -> Vec<String> {
        match self
            .record
            .adopt_leased(std::process::id(), &self.lease_session, now_secs())
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

    /// Deletes this process's leased machines whose lease has run out and that no call uses.
    pub async fn reap_expired_leases(&self) -> Cleanup {
        let mut total = Cleanup::default();
        if !self.in_use.leasing() {
            return total;
        }
        for kind in [FleetKind::Local, FleetKind::Cloud] {
            let expired = match self
                .record
                .expired_leases(std::process::id(), kind, now_secs())
            {
                Ok(expired) => expired,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the ephemeral record; nothing reaped");
                    return total;
                }
            };
            let idle: Vec<_> = expired
                .into_iter()
                .filter(|e| !self.in_use.busy(&e.name, &e.id))
                .collect();
            if idle.is_empty() {
                continue;
            }
            let fleet = match self.fleet(kind).await {
                Ok(fleet) => fleet,
                Err(e) => {
                    tracing::warn!(fleet = kind.as_str(), error = %e, "cannot reach the fleet of expired leased machines");
                    continue;
                }
            };
            let c = delete_all(&self.record, &fleet, idle, |e| {
                !self.in_use.busy(&e.name, &e.id)
            })
            .await;
            if !c.deleted.is_empty() {
                tracing::info!(fleet = kind.as_str(), deleted = ?c.deleted, "deleted leased machines nobody used for {} s", self.config.machine_lease_secs);
            }
            total.deleted.extend(c.deleted);
            total.failed.extend(c.failed);
        }
        total
    }
}

impl Backend {
    /// Reaches every fleet where this process holds a leased machine, so that the clean-up at
    /// exit finds them: an adopted lease may be on a fleet no call of this process has used.
    pub(super) async fn reach_leased_fleets(&self) {
        let me = std::process::id();
        let Ok(entries) = self.record.entries() else {
            return;
        };
        for kind in [FleetKind::Local, FleetKind::Cloud] {
            let leased = entries
                .iter()
                .any(|e| e.fleet == kind && e.owner_pid == me && e.lease.is_some());
            if leased && let Err(e) = self.fleet(kind).await {
                tracing::warn!(fleet = kind.as_str(), error = %e, "cannot reach the fleet of leased machines at exit");
            }
        }
    }
}

/// How often the reaper looks: often enough that a machine outlives its lease by at most a
/// quarter of it (and 30 s), rarely enough to cost nothing.
pub fn reap_interval(lease_secs: u64) -> Duration {
    Duration::from_secs((lease_secs / 4).clamp(1, 30))
}

/// Reaps expired leases until `stop` is cancelled.
pub async fn reap(backend: std::sync::Arc<Backend>, stop: CancellationToken) {
    loop {
        let shortest = backend.in_use.shortest_secs.load(Ordering::Relaxed);
        let interval = reap_interval(shortest.min(backend.config.machine_lease_secs));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        backend.reap_expired_leases().await;
    }
}
