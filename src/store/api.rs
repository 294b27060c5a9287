//! The seam: what any backend of the store answers, one repository trait per kind of record.

use super::records::{
    EgressGrant, Holding, JobEnd, JobRecord, KeyClaim, KeyRecord, MachineClaim, NewRun, RunDetail,
    RunEnd, RunPage, ServedEngine, SpendReading, StoredJob, TaskRecord,
};
use crate::fleet::FleetKind;
use crate::process::ephemeral::RecordBook;
use crate::process::shared_file::SharedDocument;
use futures::future::BoxFuture;
use std::sync::Arc;

/// What the kept answers of idempotency keys may take in all, in any backend. A run-command's
/// answer holds its output (up to twice `maxOutputBytes`), so a client making keyed calls all
/// day could otherwise grow the store without end.
pub const KEY_ANSWERS_MAX_BYTES: i64 = 64 * 1024 * 1024;

/// The most `requestState`s taken within their lifetime among the processes sharing a store;
/// a signed-in user takes at most half, so that no one user's answers fill it for all. Past it
/// a state is not taken (its call is asked again) until one ages out.
pub const REQUEST_STATES_MAX: i64 = 4096;

/// What a store call answers: its value, or why the store could not answer.
pub type StoreResult<T> = Result<T, StoreUnavailable>;

/// Why the store could not answer: a write or claim a limit depends on, or a read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreUnavailable {
    /// The writer is behind: the record would have been dropped.
    #[error(
        "the store's writer is behind ({queue} records wait to be written; a slow or full disk?)"
    )]
    QueueFull { queue: usize },
    #[error("the store at {path} cannot be used: {reason}")]
    Broken { path: String, reason: String },
}

/// What the server processes sharing a store share beyond its records. Each backend says
/// which: nothing here is left to a default.
pub enum Sharing {
    /// The processes of one host, through its runtime directory: the machine record and the
    /// machines' setups are its files, and a process lives while its pid does.
    OneHost,
    /// Processes on any host, through the database: the machine record and the machines'
    /// setups are kept there too, so that every process sees (and sweeps) what any other made.
    Hosts {
        machine_record: Arc<dyn RecordBook>,
        machine_setups: Arc<dyn SharedDocument>,
    },
}

/// How a store opens, flushes and is shared: what every backend says for itself.
pub trait Lifecycle: Send + Sync {
    /// Records dropped so far because the writer was behind.
    fn dropped(&self) -> u64;
    /// Waits (a bounded time) until what was queued before is written.
    fn flush(&self) -> BoxFuture<'_, ()>;
    /// Opens the backend now and says whether it can be used: a shared database is reached,
    /// its schema brought up to date (or found newer than this server knows) before a server
    /// answers its first call. The SQLite file answers at once: it opens at its first use
    /// (SQLite and its writer cost about 2 MiB that a session running no command should not
    /// pay), and a file that cannot be used is said then, the tools going on without it.
    fn ready(&self) -> BoxFuture<'_, StoreResult<()>>;
    /// Whether server processes on other hosts share this store, and so answer as one
    /// server: what one started, another may read and end.
    fn is_shared(&self) -> bool;
    /// What the processes sharing the store share beyond its records.
    fn sharing(&self) -> Sharing;
    /// The key the processes sharing the store seal MCP `requestState`s with: the database's,
    /// read once ready, for every process sharing it (an input-required answer given through
    /// one completes through another); the file's, a key random to the process, never
    /// written down (a question outlives no process there).
    fn sealing_key(&self) -> StoreResult<Vec<u8>>;
}

/// The process's store as its users see it: one repository per kind of record, and its
/// [`Lifecycle`]. Every backend gets it from [`Backend`], so the accessors are written once.
pub trait Store: Lifecycle {
    fn runs(&self) -> &dyn RunRepository;
    fn jobs(&self) -> &dyn JobRepository;
    fn tasks(&self) -> &dyn TaskRepository;
    fn egress_grants(&self) -> &dyn EgressGrantRepository;
    fn spend(&self) -> &dyn SpendRepository;
    fn keys(&self) -> &dyn KeyRepository;
    fn owners(&self) -> &dyn OwnerRepository;
    fn request_states(&self) -> &dyn RequestStateRepository;
}

/// What a backend implements: every repository, and its [`Lifecycle`]. [`Store`] follows.
pub trait Backend:
    RunRepository
    + JobRepository
    + TaskRepository
    + EgressGrantRepository
    + SpendRepository
    + KeyRepository
    + OwnerRepository
    + RequestStateRepository
    + Lifecycle
{
}

impl<B: Backend> Store for B {
    fn runs(&self) -> &dyn RunRepository {
        self
    }
    fn jobs(&self) -> &dyn JobRepository {
        self
    }
    fn tasks(&self) -> &dyn TaskRepository {
        self
    }
    fn egress_grants(&self) -> &dyn EgressGrantRepository {
        self
    }
    fn spend(&self) -> &dyn SpendRepository {
        self
    }
    fn keys(&self) -> &dyn KeyRepository {
        self
    }
    fn owners(&self) -> &dyn OwnerRepository {
        self
    }
    fn request_states(&self) -> &dyn RequestStateRepository {
        self
    }
}

/// Every command a tool ran: its start, its end and what it cost, read back as `smol://runs`.
#[async_trait::async_trait]
pub trait RunRepository: Send + Sync {
    /// Queues a run's start and gives its id (increasing, unique among the processes sharing
    /// the store); or why it will not be recorded, told to the clients once by the backend.
    fn begin(&self, run: NewRun) -> StoreResult<i64>;
    fn end(&self, end: RunEnd);
    /// What run `id` cost its machine (a JSON object), measured after it ended.
    fn cost(&self, id: i64, usage_json: String);
    /// Up to `limit` runs older than `before` (all when `None`), newest first.
    /// `user`'s runs only (the empty id: the operator's).
    async fn page(&self, before: Option<i64>, limit: usize, user: &str) -> StoreResult<RunPage>;
    /// Run `id` if it is `user`'s.
    async fn get(&self, id: i64, user: &str) -> StoreResult<Option<RunDetail>>;
}

/// Background jobs while they run, so that a later process can take them over.
#[async_trait::async_trait]
pub trait JobRepository: Send + Sync {
    fn started(&self, job: JobRecord);
    fn ended(&self, end: JobEnd);
    /// Gives back a job taken over that this process cannot watch.
    fn let_go(&self, id: &str);
    /// Takes over the running jobs of processes that have ended, on the engines this process
    /// serves; none when the store cannot say.
    async fn take_over(&self, served: Vec<ServedEngine>) -> Vec<JobRecord>;
    /// Job `id` as its watcher (any process sharing the store) last wrote it.
    async fn get(&self, id: &str) -> StoreResult<Option<StoredJob>>;
    /// The jobs of the last day that another process than this one started or watches,
    /// newest first, at most `limit`.
    async fn others(&self, limit: usize) -> StoreResult<Vec<StoredJob>>;
}

/// MCP tasks, so that a process after this one can say what became of one.
#[async_trait::async_trait]
pub trait TaskRepository: Send + Sync {
    fn created(&self, task: TaskRecord);
    fn ended(&self, id: &str, outcome: &'static str);
    async fn get(&self, id: &str) -> StoreResult<Option<TaskRecord>>;
    /// The task as `tasks/get` answers it now in its process (see [`TaskRecord::detail`]).
    fn answered_as(&self, id: &str, detail: String);
    /// tasks/cancel reached another process than the one running the task: it is asked to.
    fn cancel_asked(&self, id: &str);
    /// Whether another process asked for the task's cancellation (no when the store cannot
    /// say: the task runs on, bounded by its own deadline).
    async fn cancel_wanted(&self, id: &str) -> bool;
    /// Whether the process running `task` is this one or still lives.
    async fn holder_alive(&self, task: &TaskRecord) -> bool;
}

/// What the user allowed a machine to reach, for a later machine's list.
#[async_trait::async_trait]
pub trait EgressGrantRepository: Send + Sync {
    fn add(&self, grant: EgressGrant);
    /// Everything the holder allowed the machine, by any process, oldest first, each once.
    async fn for_machine(&self, hold: Hold) -> StoreResult<Vec<String>>;
}

/// The cloud spend's day marks, shared by every process on the store.
#[async_trait::async_trait]
pub trait SpendRepository: Send + Sync {
    /// The account's period cost at the first reading of the reading's UTC day (this reading's
    /// when it is the first), written before it answers.
    async fn day_mark(&self, reading: SpendReading) -> StoreResult<i64>;
}

/// Idempotency keys: which call holds a key, and its answer once it succeeded.
#[async_trait::async_trait]
pub trait KeyRepository: Send + Sync {
    /// Claims `claim.key` unless a call of the last day holds it; written before it answers,
    /// so that two processes sharing the store never both claim a key.
    async fn claim(&self, claim: KeyRecord) -> StoreResult<KeyClaim>;
    /// The call holding `key` in this process succeeded; a repeat within a day gets `answer`.
    fn answered(&self, key: &str, answer: String);
    /// The call holding `key` in this process failed: a retry with it runs again.
    fn released(&self, key: &str);
    async fn get(&self, key: &str) -> StoreResult<Option<KeyRecord>>;
    /// Whether the process holding `record`'s key is this one or still lives: a holder that
    /// ended before it answered cut its call off. On one host a pid and its start time tell;
    /// a store shared by hosts asks whom it has heard from.
    async fn holder_alive(&self, record: &KeyRecord) -> bool;
}

/// The machine `name` (its name, or on cloud its id) on `fleet` as `user` holds it: the key of
/// an owner's row and whose it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub fleet: FleetKind,
    pub name: String,
    pub user: String,
}

impl Hold {
    pub fn new(fleet: FleetKind, name: impl Into<String>, user: impl Into<String>) -> Hold {
        Hold {
            fleet,
            name: name.into(),
            user: user.into(),
        }
    }
}

/// Which signed-in user holds which machine (each fleet's names are one namespace), and what a
/// user's deleted cloud machines cost by UTC day. A machine no row names is the operator's.
///
/// A name is claimed before its machine is made and held as *made* once the fleet has made it:
/// a claim in the making takes the name from other users' creates but gives no one the
/// machine, so a create racing for a name that exists (the operator's, say) never opens that
/// machine to the claimer's other calls while the fleet answers "already exists".
#[async_trait::async_trait]
pub trait OwnerRepository: Send + Sync {
    /// Claims `name` for `user`, in the making, unless someone holds it; answers whether this
    /// claim took it (with all the user held on the fleet then: names made, and those in the
    /// making claimed since `pending_after_ms`) or who held it. One user's claims are taken
    /// one at a time among all processes, and two users racing for a name never both get it.
    async fn claim(&self, hold: Hold, pending_after_ms: i64) -> StoreResult<MachineClaim>;
    /// The fleet made `name` for `user`: held as made from now on (the claim is taken over if
    /// it was let go meanwhile, the fleet having made it for this user all the same).
    async fn made(&self, hold: Hold) -> StoreResult<()>;
    /// The held machine answers to `id` as well (a cloud machine's own id).
    async fn alias(&self, id: &str, hold: Hold) -> StoreResult<()>;
    /// Who holds the machine `name` (its name, or on cloud its id) names, once made: a name
    /// in the making is held by no one yet.
    async fn holder(&self, fleet: FleetKind, name: &str) -> StoreResult<Option<String>>;
    /// Every machine of `fleet` made for a user, by its name: (name, user).
    async fn held(&self, fleet: FleetKind) -> StoreResult<Vec<(String, String)>>;
    /// `user` no longer holds the machine `name` (its name or its id) names: deleted, or its
    /// create failed.
    async fn release(&self, hold: Hold) -> StoreResult<()>;
    /// Every held machine of `fleet` (made or in the making) with when it was first held,
    /// whoever holds it: for [`OwnerRepository::forget`] to find the ones deleted behind the
    /// holder's back, and claims a process that died left in the making.
    async fn held_since(&self, fleet: FleetKind) -> StoreResult<Vec<Holding>>;
    /// No one holds `machine` any more (it is gone from its fleet), under any of its words.
    async fn forget(&self, fleet: FleetKind, machine: &str) -> StoreResult<()>;
    /// Adds what a deleted machine of `user`'s cost to `day`'s total.
    async fn settle(&self, user: &str, day: &str, micros: i64) -> StoreResult<()>;
    async fn settled(&self, user: &str, day: &str) -> StoreResult<i64>;
}

/// How long the store keeps what it keeps, from the settings: these govern runs only; the
/// other records keep their own bounds, set where their tables are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunRetention {
    /// The newest this many runs are kept (`ledgerMaxRuns`; 0 keeps none).
    pub max_runs: u64,
    /// Runs older than this many days go (`ledgerMaxDays`).
    pub max_days: u64,
}

/// Sealed `requestState`s already answered, among the processes sharing the store: a state is
/// taken once, so a replayed answer (a "yes" after a "no") is refused by every process.
#[async_trait::async_trait]
pub trait RequestStateRepository: Send + Sync {
    /// Takes `nonce` (hex) for good for `user` (an id; the operator's is empty): `Now` the
    /// first time any process takes it. Nonces go after `lifetime_ms` (a state older than that
    /// no longer opens). Bounded by [`REQUEST_STATES_MAX`].
    async fn take(&self, nonce: &str, lifetime_ms: i64, user: &str) -> StoreResult<Taken>;
}

/// What taking a state's nonce found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// Taken now, for good.
    Now,
    /// Taken before: its answer has been applied once.
    Before,
    /// [`REQUEST_STATES_MAX`] states (or half of them, for one signed-in user) were taken
    /// within their lifetime.
    Full,
}
