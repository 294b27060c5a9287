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
pub mod progress;
pub mod reads;
pub mod terminals;
pub mod tools;

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
    /// Keyed calls running in this process (`idempotency`).
    pub keys: Arc<idempotency::Keys>,
    /// Programs behind a PTY that agents drive (the terminal tool).
    pub terminals: terminals::Terminals,
}

impl Policy {
    pub fn new(process: Arc<Process>) -> Policy {
        let config = &process.config;
        let ledger = ledger::Ledger::open(config, process.events.clone());
        ledger.redacting(process.credentials.clone());
        Policy {
            store: ledger.store().clone(),
            ledger,
            jobs: jobs::Jobs::new(config.max_running_jobs),
            reads: reads::ParkedReads::new(config.max_parked_reads),
            questions: consent::Questions::default(),
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
    pub fn start(config: Config) -> Result<Arc<Policy>, StartupError> {
        Ok(Arc::new(Policy::new(Arc::new(Process::new(config)?))))
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
