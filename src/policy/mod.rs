//! What a tool call does, whichever protocol asked for it: the tool table and its handlers
//! (`tools`), commands left running in a machine (`jobs`), the record of every command run
//! (`ledger`), and what they share: the error a call answers with (`error`), the shaping of
//! output (`output`), the progress a call reports (`progress`), paused downloads (`reads`),
//! terminals agents drive (`terminals`).
//! `operations` ties each upstream operation to the tools that use it.
//!
//! Within the floor the order is `error`, `output`, `progress`, `reads`, `cost`, `terminals` <
//! `ledger` <
//! `idempotency`, `jobs` <
//! [`Policy`] (this file) < `tools` < `operations`.

pub mod consent;
pub mod cost;
pub mod error;
pub mod idempotency;
pub mod jobs;
pub mod ledger;
pub mod operations;
pub mod output;
pub mod parking;
pub mod progress;
pub mod reads;
pub mod screen;
pub mod shares;
pub mod terminals;
pub mod tools;
pub mod user;

use crate::process::config::Config;
use crate::process::{Cleanup, Process, StartupError};
use crate::store::Store;
use std::sync::Arc;

/// What the policy holds for a process, beside the process itself: the ledger, the jobs and
/// the paused downloads, shared by every session.
pub struct Policy {
    pub process: Arc<Process>,
    /// What outlives a call (runs, jobs, tasks, grants, spend marks, keys), written off the
    /// calls' path.
    pub store: Arc<dyn Store>,
    /// Every command run, recorded in the store.
    pub ledger: ledger::Ledger,
    /// Commands started with `background: true`, and their watchers.
    pub jobs: jobs::Jobs,
    /// read-file downloads paused between pages.
    pub reads: reads::ParkedReads,
    /// The user's answers about egress, the questions open and each session's rate.
    pub questions: consent::Questions,
    /// The questions put to a view for its person to answer (clients that show views, not forms).
    pub board: consent::Board,
    /// Keyed calls running in this process (`idempotency`).
    pub keys: Arc<idempotency::Keys>,
    /// Programs behind a PTY that agents drive (the terminal tool).
    pub terminals: terminals::Terminals,
}

/// How often a process sharing its store looks for what a dead sibling left: as often as the
/// store hears from each process.
const SIBLING_WATCH: std::time::Duration = std::time::Duration::from_secs(5);

/// How often a server with sign-in forgets who held the machines gone from their fleet
/// (deleted by a session's end, a lease's, an orphan sweep, or behind the server's back): the
/// holdings stay bounded by the machines that exist.
const OWNERS_PRUNE: std::time::Duration = std::time::Duration::from_secs(600);
/// A machine first held this recently may be a create still under way: never forgotten yet.
/// A claim older than this and still in the making is one a process left when it died (or
/// could not let go of): it no longer counts against its user's limit, and the sweep forgets it.
pub(crate) const HELD_AT_LEAST_MS: i64 = 3_600_000;

impl Policy {
    pub fn new(process: Arc<Process>) -> Policy {
        let store = crate::store::open(&process.config, process.events.clone());
        Policy::with_store(process, store)
    }

    /// A policy over `process` keeping what outlives a call in `store`.
    pub fn with_store(process: Arc<Process>, store: Arc<dyn crate::store::Store>) -> Policy {
        let config = &process.config;
        let ledger = ledger::Ledger::new(store, config.ledger_max_runs > 0);
        ledger.redacting(process.credentials.clone());
        Policy {
            store: ledger.store().clone(),
            ledger,
            jobs: jobs::Jobs::new(config.max_running_jobs, config.user_share_percent),
            reads: reads::ParkedReads::new(config.max_parked_reads),
            questions: consent::Questions::default(),
            board: consent::Board::default(),
            keys: Arc::default(),
            terminals: terminals::Terminals::default(),
            process,
        }
    }

    /// Takes over the jobs processes that ended left running (once; later calls wait for the
    /// first). See [`jobs::Jobs::adopt`].
    pub async fn adopt_jobs(&self) -> usize {
        self.jobs.adopt(&self.process, &self.ledger).await
    }

    /// A process and its policy, from the settings.
    /// With a store other server processes share (`storeUrl`): every few seconds, what a
    /// sibling that died left is taken over, as a process started after it would at its start:
    /// its leased machines a sessionless client may still name (adopted), its orphans (swept,
    /// each claimed once), its running jobs (watched from here, job-output and cancel-job
    /// answered here). Ends with this process's clean-up.
    pub async fn watch_siblings(self: Arc<Self>) {
        if !self.store.is_shared() {
            return;
        }
        let mut tick = tokio::time::interval(SIBLING_WATCH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.process.stopping() => return,
                _ = tick.tick() => {}
            }
            let adopted = self.process.leases.adopt().await;
            self.process.sweep_orphans().await;
            let jobs = self.jobs.take_over(&self.process, &self.ledger).await;
            if !adopted.is_empty() || jobs > 0 {
                tracing::info!(machines = ?adopted, jobs, "took over what a server process that ended left");
            }
        }
    }

    /// With sign-in, every [`OWNERS_PRUNE`]: who held the machines that are gone is forgotten.
    pub async fn forget_gone_owners(self: Arc<Self>) {
        if self.process.config.auth_issuer.is_empty() {
            return;
        }
        let mut tick = tokio::time::interval(OWNERS_PRUNE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.process.stopping() => return,
                _ = tick.tick() => {}
            }
            let forgotten = self
                .forget_gone_owners_once(chrono::Utc::now().timestamp_millis())
                .await;
            if forgotten > 0 {
                tracing::info!(forgotten, "forgot who held machines that are gone");
            }
        }
    }

    /// Forgets who held each machine of an answering fleet that its listing no longer shows
    /// (by name or id) and that was first held over an hour before `now_ms`. Answers how many.
    pub async fn forget_gone_owners_once(&self, now_ms: i64) -> usize {
        let mut forgotten = 0;
        for fleet in self.process.answering_fleets().await {
            let Ok(machines) = fleet.list().await else {
                continue;
            };
            let present: std::collections::HashSet<&str> = machines
                .iter()
                .flat_map(|m| [m.name.as_str(), m.id.as_str()])
                .collect();
            let owners = self.store.owners();
            let Ok(held) = owners.held_since(fleet.kind()).await else {
                continue;
            };
            for holding in held {
                let fresh = now_ms - holding.since_ms < HELD_AT_LEAST_MS;
                // A claim never made is forgotten even if a machine has its name: that machine
                // is not the claimer's (a create that lost the race for the name).
                if fresh || (holding.made && present.contains(holding.machine.as_str())) {
                    continue;
                }
                if owners.forget(fleet.kind(), &holding.machine).await.is_ok() {
                    forgotten += 1;
                }
            }
        }
        forgotten
    }

    /// A shared store keeps the machine record too, so that every process sharing it sees
    /// (and sweeps) the machines of any that died.
    pub fn start(config: Config) -> Result<Arc<Policy>, StartupError> {
        let events = crate::process::events::Events::default();
        let store = crate::store::open(&config, events.clone());
        let shared = match store.sharing() {
            crate::store::Sharing::OneHost => None,
            crate::store::Sharing::Hosts {
                machine_record,
                machine_setups,
            } => Some(crate::process::Shared {
                machines: machine_record,
                machine_setups,
            }),
        };
        let process = Process::with_record(config, events, shared)?;
        Ok(Arc::new(Policy::with_store(Arc::new(process), store)))
    }

    /// At the exit of a single-session process: the ledger written out, the session's
    /// machines deleted, the serve stopped if this process started it.
    pub async fn shutdown(&self, session: &str) -> Cleanup {
        self.terminals.close_session(session);
        self.ledger.flush().await;
        let cleanup = self.process.shutdown(session).await;
        self.jobs.machines_deleted(&cleanup.deleted, &self.ledger);
        self.ledger.flush().await;
        cleanup
    }

    /// At the exit of a process that served several sessions: every machine it recorded.
    pub async fn shutdown_process(&self) -> Cleanup {
        self.terminals.close_all();
        self.ledger.flush().await;
        let cleanup = self.process.shutdown_process().await;
        self.jobs.machines_deleted(&cleanup.deleted, &self.ledger);
        self.ledger.flush().await;
        cleanup
    }
}
