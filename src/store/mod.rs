//! What the server keeps beyond a call: runs, background jobs, MCP tasks, egress grants, the
//! cloud spend's day marks and idempotency keys. [`Store`] is the seam: a repository per kind
//! of record, each a trait, so that nothing above names a backend. [`open`] picks it for a
//! process: [`sqlite`], a file in the runtime directory written by one thread off the calls'
//! path, or with `storeUrl` [`postgres`], a database server processes on any host share,
//! which also keeps what those processes must agree on to answer as one server (the machine
//! record, the requestState key, the tasks as they stand).
//!
//! Writes that nothing waits on (a run's start and end, a job's, a task's, a grant) never hold
//! a call up: a backend queues them and may drop them when behind, counting what it dropped.
//! What a limit depends on (a day's spend mark, a key's claim) is asked and awaited, and
//! answers why it could not be known rather than nothing: the limits built on it fail closed.

mod api;
pub mod postgres;
mod records;
pub mod sqlite;

pub use api::{
    Backend, EgressGrantRepository, Hold, JobRepository, KEY_ANSWERS_MAX_BYTES, KeyRepository,
    Lifecycle, OwnerRepository, REQUEST_STATES_MAX, RequestStateRepository, RunRepository,
    RunRetention, Sharing, SpendRepository, Store, StoreResult, StoreUnavailable, Taken,
    TaskRepository,
};
pub use records::{
    EgressGrant, HeldName, Holding, JobEnd, JobRecord, JobState, KeyClaim, KeyRecord, MachineClaim,
    NewRun, RunCommand, RunDetail, RunEnd, RunOutcome, RunPage, RunSummary, ServedEngine,
    SpendReading, StoredJob, StreamRecord, TaskRecord,
};

use crate::process::config::Config;
use crate::process::events::Events;
use std::sync::Arc;

/// The process's store, by its settings: the database at `storeUrl` when one is named (shared
/// by every process given it), else the SQLite file in the runtime directory. Nothing is
/// opened yet: the file opens at first use, the database at [`Store::ready`].
pub fn open(config: &Config, events: Events) -> Arc<dyn Store> {
    let retention = RunRetention {
        max_runs: config.ledger_max_runs,
        max_days: config.ledger_max_days,
    };
    if !config.store_url.is_empty() {
        return Arc::new(postgres::PgStore::new(&config.store_url, retention, events));
    }
    Arc::new(sqlite::SqliteStore::new(
        config.runtime_dir.join(sqlite::FILE_NAME),
        retention,
        events,
    ))
}
