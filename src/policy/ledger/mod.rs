//! The run ledger: every command a tool runs, recorded in SQLite (WAL mode) in the runtime
//! directory, read back as the `smol://runs` resources.
//!
//! A tool call never waits on the disk: [`Ledger::begin`] and [`Run`]'s endings put a record on
//! a bounded queue (`try_send`) and go on; one writer thread commits what is queued in a
//! transaction. A full queue drops the record, counted and logged. A ledger that cannot be
//! opened (a corrupt file, a directory in its place, a disk that refuses writes) is reported
//! once, in the log when found and to the clients at the first run it misses, and the tools go
//! on without it.
//!
//! What is kept of a run: who ran it (tool, fleet, machine), what (argv or shell text, working
//! directory, the NAMES of the environment variables), when, how it ended, the byte count of
//! each stream and its head and tail. Never an environment variable's value: not as a field, and
//! not inside the kept output or error either, where every value the run was given is replaced
//! by its name.

mod rows;
mod store;

use rows::{Begun, Ended, JobEnd};
pub use rows::{
    JobRecord, KeyRecord, RunDetail, RunSummary, STREAM_HEAD_BYTES, STREAM_TAIL_BYTES,
    StreamRecord, TaskRecord,
};
pub use store::{KEY_ANSWERS_MAX_BYTES, KeyClaim};

use crate::fleet::{Command, ExecOutput, ExecSpec, FleetKind};
use crate::policy::error::{ToolError, ToolErrorKind};
use crate::process::config::Config;
use crate::process::events::{Events, ServerEvent};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The ledger's file in the runtime directory (with its `-wal` and `-shm` companions).
pub const FILE_NAME: &str = "runs.sqlite";
/// Records waiting for the writer; beyond this a record is dropped rather than a call held up.
const QUEUE: usize = 1024;
/// A command (shell text or argv) is kept up to this many bytes.
const COMMAND_MAX_BYTES: usize = 16 * 1024;
/// Environment values shorter than this are not looked for in the output: "1" or "on" would
/// blank every digit and word of it, and such values are not secrets.
const REDACT_MIN_BYTES: usize = 4;
/// How long a read waits for the records queued before it to be written.
const FLUSH_WAIT: Duration = Duration::from_secs(2);
/// The most records committed in one transaction.
const BATCH: usize = 256;
/// How long the writer waits for more records before it commits what it has.
const LINGER: Duration = Duration::from_millis(5);
/// A process that lives on prunes again after this many records added (runs, jobs, tasks,
/// grants, keys), so that its retention bounds hold while it runs, not only at its start: an
/// HTTP server up for weeks would otherwise keep every run and key it ever saw.
const PRUNE_EVERY: u64 = 256;
/// Runs a `smol://runs` page lists when the URI does not say, and at most.
pub const PAGE_DEFAULT: usize = 50;
pub const PAGE_MAX: usize = 500;

/// What is known of a run when it starts.
#[derive(Debug, Clone)]
pub struct RunStart {
    /// The tool that ran it (`run-command`, `run-once`, a job).
    pub tool: &'static str,
    pub fleet: FleetKind,
    pub machine: String,
    pub command: Command,
    pub workdir: Option<String>,
    /// Names and values: the names are recorded, the values only looked for (and replaced by
    /// their names) in what is kept of the output. Nothing of them is written.
    pub env: BTreeMap<String, String>,
}

impl RunStart {
    pub fn new(tool: &'static str, fleet: FleetKind, machine: &str, spec: &ExecSpec) -> RunStart {
        RunStart {
            tool,
            fleet,
            machine: machine.to_owned(),
            command: spec.command.clone(),
            workdir: spec.workdir.clone(),
            env: spec.env.clone(),
        }
    }
}

enum Op {
    Begin(Box<Begun>),
    End(Box<Ended>),
    JobStarted(Box<JobRecord>),
    JobEnded(Box<JobEnd>),
    LetGoOfJob(String),
    /// Answered with the jobs taken over, once written.
    ClaimJobs(
        Vec<(FleetKind, String)>,
        tokio::sync::oneshot::Sender<Vec<JobRecord>>,
    ),
    TaskCreated(Box<TaskRecord>),
    TaskEnded(String, &'static str),
    /// (fleet, engine, machine, destinations) the user allowed.
    EgressAllowed(Box<(&'static str, String, String, Vec<String>)>),
    /// (run id, what it cost as JSON)
    Usage(Box<(i64, String)>),
    /// (UTC day, the account's period cost now): answered with the day's first reading once
    /// written, or why it could not be.
    DayMark(Box<(String, i64)>, Answer<i64>),
    /// Answered once written (or found taken), or why it could not be.
    ClaimKey(Box<KeyRecord>, Answer<KeyClaim>),
    /// (key, answer as JSON)
    KeyAnswered(Box<(String, String)>),
    KeyReleased(String),
    /// Answered once everything queued before it is committed.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// Where the writer answers a record that a limit depends on.
type Answer<T> = tokio::sync::oneshot::Sender<Result<T, StoreUnavailable>>;

/// Why the store could not answer what a limit depends on (a day's spend mark, an idempotency
/// key's claim). Each such limit refuses its call with this rather than let it through
/// unchecked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreUnavailable {
    /// A policy built without a store (`Ledger::off`).
    #[error("this server runs without a store")]
    Off,
    /// The writer is behind: the record would have been dropped.
    #[error(
        "the store's writer is behind ({QUEUE} records wait to be written; a slow or full disk?)"
    )]
    QueueFull,
    #[error("the store at {path} cannot be used: {reason}")]
    Broken { path: String, reason: String },
}

/// Why the ledger cannot answer a read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error(
        "the run ledger is off (ledgerMaxRuns is 0); set SMOL_MCP_LEDGER_MAX_RUNS above 0 to keep one"
    )]
    Off,
    #[error("this server runs without a store")]
    NoStore,
    #[error("the run ledger at {path} is not available: {reason}")]
    Unavailable { path: String, reason: String },
}

struct Shared {
    path: PathBuf,
    max_runs: u64,
    max_days: u64,
    events: Events,
    /// Set once, when the ledger turns out unusable; reads answer with it.
    broken: OnceLock<String>,
    /// Whether the clients were told (at the first run after `broken`).
    announced: AtomicBool,
    dropped: AtomicU64,
    write_failures: AtomicU64,
    /// Credential values, which no record may hold whatever command printed them.
    credentials: OnceLock<Arc<crate::process::credentials::Supplier>>,
    /// The last id given; ids are microseconds since the epoch, made unique and increasing.
    last_id: AtomicI64,
    /// A connection for reads, opened on the first.
    reader: Mutex<Option<rusqlite::Connection>>,
}

impl Shared {
    fn report_broken(&self, reason: String) {
        if self.broken.set(reason.clone()).is_ok() {
            tracing::warn!(
                path = %self.path.display(),
                %reason,
                "the run ledger cannot be used; commands run on unrecorded (delete the file to \
                 start a new ledger)"
            );
        }
    }

    /// Tells the clients, once, that a run goes unrecorded and why.
    fn announce_if_broken(&self) {
        if let Some(reason) = self.broken.get()
            && !self.announced.swap(true, Ordering::Relaxed)
        {
            self.events.publish(
                ServerEvent::warning(
                    "ledgerUnavailable",
                    format!(
                        "the run ledger at {} cannot be used, so runs are not recorded (the \
                         tools work as before): {reason}",
                        self.path.display()
                    ),
                )
                .with("path", self.path.display().to_string())
                .with("reason", reason.clone()),
            );
        }
    }

    fn next_id(&self) -> i64 {
        let now = now_micros();
        let previous = self
            .last_id
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
                Some(now.max(last + 1))
            })
            .unwrap_or(now);
        now.max(previous + 1)
    }
}

/// The process's ledger; cheap to clone.
#[derive(Clone)]
pub struct Ledger {
    shared: Arc<Shared>,
    /// Whether there is a store at all (`Ledger::off` has none).
    on: bool,
    /// Whether runs are kept (`ledgerMaxRuns` above 0); the other records are kept regardless.
    keeps_runs: bool,
    /// The writer's queue, made with the writer at the first run or read: SQLite and its thread
    /// cost about 2 MiB, which a session that never runs a command should not pay at start.
    /// `None` inside when the thread could not be started.
    queue: Arc<OnceLock<Option<SyncSender<Op>>>>,
}

fn now_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Ledger {
    /// The process's ledger. Nothing is opened yet: the writer starts at the first run or read,
    /// and opens and prunes the file off the caller's path. `ledgerMaxRuns` 0 keeps no runs;
    /// jobs, tasks, grants, spend marks and idempotency keys are kept all the same, since the
    /// limits that read them must not fail open.
    pub fn open(config: &Config, events: Events) -> Ledger {
        let shared = Arc::new(Shared {
            path: config.runtime_dir.join(FILE_NAME),
            max_runs: config.ledger_max_runs,
            max_days: config.ledger_max_days,
            events,
            broken: OnceLock::new(),
            announced: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
            write_failures: AtomicU64::new(0),
            credentials: OnceLock::new(),
            last_id: AtomicI64::new(0),
            reader: Mutex::new(None),
        });
        Ledger {
            on: true,
            keeps_runs: shared.max_runs > 0,
            shared,
            queue: Arc::new(OnceLock::new()),
        }
    }

    /// A ledger that records nothing and opens no file.
    pub fn off() -> Ledger {
        let shared = Arc::new(Shared {
            path: PathBuf::new(),
            max_runs: 0,
            max_days: 0,
            events: Events::default(),
            broken: OnceLock::new(),
            announced: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
            write_failures: AtomicU64::new(0),
            credentials: OnceLock::new(),
            last_id: AtomicI64::new(0),
            reader: Mutex::new(None),
        });
        Ledger {
            on: false,
            keeps_runs: false,
            shared,
            queue: Arc::new(OnceLock::new()),
        }
    }

    /// Credential values are replaced wherever a run's record would hold them, as the run's own
    /// environment values are.
    pub fn redacting(&self, credentials: Arc<crate::process::credentials::Supplier>) {
        let _ = self.shared.credentials.set(credentials);
    }

    /// The writer's queue, starting the writer on first use; `None` when the ledger is off or
    /// its writer could not be started.
    fn started(&self) -> Option<&SyncSender<Op>> {
        if !self.on {
            return None;
        }
        self.queue
            .get_or_init(|| {
                let (queue, receiver) = std::sync::mpsc::sync_channel(QUEUE);
                let writer_shared = self.shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("smol-mcp-ledger".into())
                    .spawn(move || write_loop(&writer_shared, receiver));
                match spawned {
                    Ok(_) => Some(queue),
                    Err(e) => {
                        self.shared
                            .report_broken(format!("could not start its writer thread: {e}"));
                        None
                    }
                }
            })
            .as_ref()
    }

    /// Whether runs are recorded (`ledgerMaxRuns` above 0).
    pub fn keeps_runs(&self) -> bool {
        self.keeps_runs
    }

    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Records dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    fn send(&self, op: Op) -> bool {
        self.try_send(op).is_ok()
    }

    /// Queues `op`, or says why it was not.
    fn try_send(&self, op: Op) -> Result<(), StoreUnavailable> {
        let Some(queue) = self.started() else {
            return Err(match self.shared.broken.get() {
                Some(reason) if self.on => self.broken(reason.clone()),
                _ => StoreUnavailable::Off,
            });
        };
        match queue.try_send(op) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                let dropped = self.shared.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                // The first, and then ever more rarely: a slow disk must not flood the log.
                if dropped.is_power_of_two() {
                    tracing::warn!(
                        dropped,
                        "the run ledger's writer is behind (a slow disk?); records dropped so far"
                    );
                }
                Err(StoreUnavailable::QueueFull)
            }
            // Only a test's queue without a writer gets here.
            Err(TrySendError::Disconnected(_)) => {
                Err(self.broken("its writer has ended".to_owned()))
            }
        }
    }

    fn broken(&self, reason: String) -> StoreUnavailable {
        StoreUnavailable::Broken {
            path: self.shared.path.display().to_string(),
            reason,
        }
    }

    /// Queues `op` made with an answer channel and waits for the writer's answer.
    async fn ask<T>(&self, op: impl FnOnce(Answer<T>) -> Op) -> Result<T, StoreUnavailable> {
        let (done, answer) = tokio::sync::oneshot::channel();
        self.try_send(op(done))?;
        match answer.await {
            Ok(answered) => answered,
            // The writer dropped the question: it found the file unusable.
            Err(_) => Err(self.broken(
                self.shared
                    .broken
                    .get()
                    .cloned()
                    .unwrap_or_else(|| "its writer has ended".to_owned()),
            )),
        }
    }

    /// Records that a run starts now; the returned [`Run`] records how it ends.
    pub fn begin(&self, start: RunStart) -> Run {
        let mut run = Run {
            ledger: None,
            id: 0,
            env_values: Vec::new(),
            keeps_output: true,
        };
        if !self.keeps_runs {
            return run;
        }
        if self.started().is_none() || self.shared.broken.get().is_some() {
            self.shared.announce_if_broken();
            return run;
        }
        let (command_kind, command) = match &start.command {
            Command::Shell(text) => ("shell", text.clone()),
            Command::Argv(argv) => ("argv", Value::from(argv.clone()).to_string()),
        };
        // A command naming a value outright (an environment value spelled out, a credential)
        // is kept without it too.
        let mut secrets: Vec<(String, String)> = start
            .env
            .iter()
            .filter(|(_, v)| v.len() >= REDACT_MIN_BYTES)
            .map(|(name, value)| (value.clone(), format!("[${name}]")))
            .collect();
        if let Some(credentials) = self.shared.credentials.get() {
            secrets.extend(credentials.values_to_redact());
        }
        secrets.sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
        let command = secrets.iter().fold(command, |text, (value, name)| {
            text.replace(value.as_str(), name)
        });
        let id = self.shared.next_id();
        let begun = Begun {
            id,
            pid: std::process::id(),
            tool: start.tool,
            fleet: start.fleet.as_str(),
            machine: start.machine,
            command_kind,
            command: cut(command, COMMAND_MAX_BYTES),
            workdir: start.workdir,
            env_names: Value::from(start.env.keys().cloned().collect::<Vec<_>>()).to_string(),
            started_ms: now_ms(),
        };
        if self.send(Op::Begin(Box::new(begun))) {
            run.ledger = Some(self.clone());
            run.id = id;
            run.env_values = secrets;
            // The longest first, so that a value inside another is not replaced half-way.
            run.env_values
                .sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
        }
        run
    }

    /// Waits (a bounded time) until what was queued before is written; at once when nothing
    /// was (the writer is not started for this).
    pub async fn flush(&self) {
        if self.queue.get().is_none() {
            return;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.send(Op::Flush(tx)) {
            let _ = tokio::time::timeout(FLUSH_WAIT, rx).await;
        }
    }

    /// Records a background job that has started, so that a later process can take it over.
    pub fn job_started(&self, job: JobRecord) {
        if self.on {
            self.send(Op::JobStarted(Box::new(job)));
        }
    }

    /// Records how a job ended: `state` is the word list-jobs shows.
    pub fn job_ended(
        &self,
        id: &str,
        state: &'static str,
        exit_code: Option<i32>,
        reason: Option<String>,
    ) {
        if self.on && self.queue.get().is_some() {
            self.send(Op::JobEnded(Box::new(JobEnd {
                id: id.to_owned(),
                state,
                exit_code,
                reason,
                ended_ms: now_ms(),
            })));
        }
    }

    /// Gives back a job taken over that this process cannot watch.
    pub fn let_go_of_job(&self, id: &str) {
        if self.on {
            self.send(Op::LetGoOfJob(id.to_owned()));
        }
    }

    /// Takes over the running jobs of processes that have ended, on the engines this process
    /// serves (`(fleet, engine)`, as the ephemeral record names engines).
    pub async fn claim_jobs(&self, served: Vec<(FleetKind, String)>) -> Vec<JobRecord> {
        if !self.on {
            return Vec::new();
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        if !self.send(Op::ClaimJobs(served, tx)) {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }

    /// The run of a job taken over from a process that ended: its end is recorded without the
    /// text of its output (the values to redact from it were that process's).
    pub fn resume(&self, run_id: Option<i64>) -> Run {
        Run {
            ledger: run_id.filter(|_| self.keeps_runs).map(|_| self.clone()),
            id: run_id.unwrap_or(0),
            env_values: Vec::new(),
            keeps_output: false,
        }
    }

    /// Records what the user allowed a machine to reach, for a later machine's list.
    pub fn egress_allowed(
        &self,
        fleet: FleetKind,
        engine: &str,
        machine: &str,
        destinations: &[String],
    ) {
        if self.on && !destinations.is_empty() {
            self.send(Op::EgressAllowed(Box::new((
                fleet.as_str(),
                engine.to_owned(),
                machine.to_owned(),
                destinations.to_vec(),
            ))));
        }
    }

    /// Everything the user allowed `machine` on `fleet`, by any process, oldest first.
    pub async fn egress_allowed_for(
        &self,
        fleet: FleetKind,
        machine: &str,
    ) -> Result<Vec<String>, LedgerError> {
        let machine = machine.to_owned();
        self.read(move |conn| store::grants(conn, fleet.as_str(), &machine))
            .await
    }

    /// What run `id` cost its machine (a JSON object), measured after it ended.
    pub fn run_usage(&self, id: Option<i64>, usage: &impl serde::Serialize) {
        if let (true, Some(id), Ok(usage)) = (self.keeps_runs, id, serde_json::to_string(usage)) {
            self.send(Op::Usage(Box::new((id, usage))));
        }
    }

    /// The cloud account's period cost at the first reading of UTC day `day` (`total` when
    /// this is it), shared by every process on this store; or why it cannot be known.
    pub async fn day_mark(&self, day: &str, total: i64) -> Result<i64, StoreUnavailable> {
        let reading = Box::new((day.to_owned(), total));
        self.ask(|done| Op::DayMark(reading, done)).await
    }

    /// Claims an idempotency key for a call (see `crate::policy::idempotency`): `Claimed`, or
    /// the call of the last day that holds it; or why the store could not say.
    pub async fn claim_key(&self, claim: KeyRecord) -> Result<KeyClaim, StoreUnavailable> {
        let claim = Box::new(claim);
        self.ask(|done| Op::ClaimKey(claim, done)).await
    }

    /// The call that claimed `key` succeeded; a repeat within a day gets `answer`.
    pub fn key_answered(&self, key: &str, answer: String) {
        if self.on {
            self.send(Op::KeyAnswered(Box::new((key.to_owned(), answer))));
        }
    }

    /// The call that claimed `key` failed: a retry with it runs again.
    pub fn key_released(&self, key: &str) {
        if self.on {
            self.send(Op::KeyReleased(key.to_owned()));
        }
    }

    /// A key's record as written, by any process.
    pub async fn key(&self, key: &str) -> Result<Option<KeyRecord>, LedgerError> {
        let key = key.to_owned();
        self.read(move |conn| store::key(conn, &key)).await
    }

    /// Records an MCP task, so that a process after this one can say what became of it.
    pub fn task_created(&self, task: TaskRecord) {
        if self.on {
            self.send(Op::TaskCreated(Box::new(task)));
        }
    }

    pub fn task_ended(&self, id: &str, outcome: &'static str) {
        if self.on && self.queue.get().is_some() {
            self.send(Op::TaskEnded(id.to_owned(), outcome));
        }
    }

    /// A task as recorded, by any process.
    pub async fn task(&self, id: &str) -> Result<Option<TaskRecord>, LedgerError> {
        let id = id.to_owned();
        self.read(move |conn| store::task(conn, &id)).await
    }

    fn unavailable(&self, reason: String) -> LedgerError {
        LedgerError::Unavailable {
            path: self.shared.path.display().to_string(),
            reason,
        }
    }

    /// Runs `read` on the ledger's read connection, off the async threads, after the records
    /// queued so far are written.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, LedgerError> {
        if !self.on {
            return Err(LedgerError::NoStore);
        }
        // A read is a first use too: the writer opens (and prunes) the file, then the flush
        // waits for that and for what was queued before.
        self.started();
        self.flush().await;
        if let Some(reason) = self.shared.broken.get() {
            return Err(self.unavailable(reason.clone()));
        }
        let shared = self.shared.clone();
        let answer = tokio::task::spawn_blocking(move || {
            let mut reader = shared
                .reader
                .lock()
                .map_err(|_| "its reader was poisoned".to_owned())?;
            if reader.is_none() {
                *reader = Some(store::open_for_reading(&shared.path).map_err(|e| e.to_string())?);
            }
            match reader.as_ref() {
                Some(conn) => read(conn).map_err(|e| e.to_string()),
                None => Err("no reader".to_owned()),
            }
        })
        .await;
        match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(reason)) => Err(self.unavailable(reason)),
            Err(e) => Err(self.unavailable(e.to_string())),
        }
    }

    /// A page of runs, newest first: those before `before` (all when `None`), and whether older
    /// ones remain.
    pub async fn page(
        &self,
        before: Option<i64>,
        limit: usize,
    ) -> Result<(Vec<RunSummary>, bool), LedgerError> {
        self.runs_kept()?;
        self.read(move |conn| store::page(conn, before, limit))
            .await
    }

    pub async fn run(&self, id: i64) -> Result<Option<RunDetail>, LedgerError> {
        self.runs_kept()?;
        self.read(move |conn| store::one(conn, id)).await
    }

    fn runs_kept(&self) -> Result<(), LedgerError> {
        match (self.on, self.keeps_runs) {
            (false, _) => Err(LedgerError::NoStore),
            (true, false) => Err(LedgerError::Off),
            (true, true) => Ok(()),
        }
    }
}

/// A run that has begun; record how it ended with one of its methods. Dropped without one (the
/// call's future dropped mid-run), it is recorded as abandoned.
pub struct Run {
    ledger: Option<Ledger>,
    id: i64,
    /// (value, what replaces it) for each environment value worth looking for.
    env_values: Vec<(String, String)>,
    /// Whether the ends of its output may be kept. A run taken over from a process that ended
    /// may not: the values to redact were that process's, and are written nowhere.
    keeps_output: bool,
}

impl Run {
    /// The run's id in the ledger (`smol://runs/{id}`), when it is recorded.
    pub fn id(&self) -> Option<i64> {
        self.ledger.as_ref().map(|_| self.id)
    }

    /// The command exited (or timed out) with this output.
    pub fn exited(self, output: &ExecOutput, timed_out: bool) {
        if self.ledger.is_none() {
            return;
        }
        // Redacted whole before the cut: a value across the head's edge would otherwise be
        // cut in two, neither half matching, and the halves stored side by side.
        let (stdout, stderr) = (
            self.stream_of(&output.stdout),
            self.stream_of(&output.stderr),
        );
        self.ended(output.exit_code, timed_out, stdout, stderr);
    }

    /// The head and tail of a whole stream with every value replaced first; the sizes are the
    /// stream's own.
    fn stream_of(&self, bytes: &[u8]) -> StreamRecord {
        let redacted = redact_bytes(bytes, &self.env_values);
        let mut kept = StreamRecord::of(&redacted);
        kept.bytes = i64::try_from(bytes.len()).unwrap_or(i64::MAX);
        kept
    }

    /// The command exited; its streams as kept by the caller (a job keeps only the two ends).
    pub fn ended(
        mut self,
        exit_code: i32,
        timed_out: bool,
        stdout: StreamRecord,
        stderr: StreamRecord,
    ) {
        let (stdout, stderr) = if self.keeps_output {
            (self.redact_stream(stdout), self.redact_stream(stderr))
        } else {
            (sizes_only(stdout), sizes_only(stderr))
        };
        self.finish(
            "exited",
            Some(exit_code),
            Some(timed_out),
            None,
            Some(stdout),
            Some(stderr),
        );
    }

    /// The run gave no exit code: the call was cancelled, or the fleet failed it.
    pub fn failed(mut self, error: &ToolError) {
        let outcome = if error.kind == ToolErrorKind::Cancelled {
            "cancelled"
        } else {
            "error"
        };
        let message = self.redact(error.to_string());
        self.finish(outcome, None, None, Some(message), None, None);
    }

    /// Every value in `text` replaced by its name, and so is a value's first piece at its end:
    /// the texts the ledger keeps are stored next to each other (a stream's head and tail are
    /// adjacent in the row), so a head ending with a value's start and a tail starting with
    /// its rest would hold it whole in the file.
    fn redact(&self, mut text: String) -> String {
        for (value, name) in &self.env_values {
            if text.contains(value.as_str()) {
                text = text.replace(value.as_str(), name);
            }
        }
        redact_edge(text, &self.env_values, Edge::End)
    }

    /// A tail is cut at its start too, maybe inside a value.
    fn redact_stream(&self, stream: StreamRecord) -> StreamRecord {
        StreamRecord {
            bytes: stream.bytes,
            dropped: stream.dropped,
            head: self.redact(stream.head),
            tail: redact_edge(self.redact(stream.tail), &self.env_values, Edge::Start),
        }
    }

    fn finish(
        &mut self,
        outcome: &'static str,
        exit_code: Option<i32>,
        timed_out: Option<bool>,
        error: Option<String>,
        stdout: Option<StreamRecord>,
        stderr: Option<StreamRecord>,
    ) {
        if let Some(ledger) = self.ledger.take() {
            ledger.send(Op::End(Box::new(Ended {
                id: self.id,
                ended_ms: now_ms(),
                outcome,
                exit_code,
                timed_out,
                error,
                stdout,
                stderr,
            })));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.finish("abandoned", None, None, None, None, None);
    }
}

/// A stream's size with nothing of its text: a run taken over from another process.
fn sizes_only(stream: StreamRecord) -> StreamRecord {
    StreamRecord {
        bytes: stream.bytes,
        dropped: stream.bytes,
        head: String::new(),
        tail: String::new(),
    }
}

/// `bytes` with every occurrence of each value replaced by its name (longest values first, as
/// `env_values` is sorted).
fn redact_bytes(bytes: &[u8], env_values: &[(String, String)]) -> Vec<u8> {
    let mut text = bytes.to_vec();
    for (value, name) in env_values {
        let finder = memchr::memmem::Finder::new(value.as_bytes());
        if finder.find(&text).is_none() {
            continue;
        }
        let mut out = Vec::with_capacity(text.len());
        let mut at = 0;
        for found in finder.find_iter(&text) {
            // find_iter gives non-overlapping matches, left to right.
            out.extend_from_slice(&text[at..found]);
            out.extend_from_slice(name.as_bytes());
            at = found + value.len();
        }
        out.extend_from_slice(&text[at..]);
        text = out;
    }
    text
}

/// Which edge of a kept text may hold a piece of a value: the end of a head (or of any text
/// stored before another), cut inside a value, or the start of a tail.
#[derive(Clone, Copy)]
enum Edge {
    Start,
    End,
}

/// Replaces the longest piece of a value at `edge` of `text` (its first bytes at the end, its
/// last bytes at the start) by the value's name. Any piece counts, one byte included: what is
/// lost is less than a value's length, and no text the ledger keeps can then be joined to the
/// one stored beside it into a whole value.
fn redact_edge(mut text: String, env_values: &[(String, String)], edge: Edge) -> String {
    let mut longest: Option<(usize, &str)> = None;
    for (value, name) in env_values {
        let v = value.as_bytes();
        let piece = (1..v.len()).rev().find(|&k| {
            k > longest.map_or(0, |(k, _)| k)
                && match edge {
                    Edge::End => {
                        value.is_char_boundary(k)
                            && text.as_bytes().ends_with(&v[..k])
                            && text.is_char_boundary(text.len() - k)
                    }
                    Edge::Start => {
                        value.is_char_boundary(v.len() - k)
                            && text.as_bytes().starts_with(&v[v.len() - k..])
                            && text.is_char_boundary(k)
                    }
                }
        });
        if let Some(k) = piece {
            longest = Some((k, name));
        }
    }
    if let Some((k, name)) = longest {
        match edge {
            Edge::End => {
                text.truncate(text.len() - k);
                text.push_str(name);
            }
            Edge::Start => text.replace_range(..k, name),
        }
    }
    text
}

/// `text` cut to at most `max` bytes on a character boundary, marked when cut.
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let end = crate::policy::output::utf8_prefix_len(text.as_bytes(), max);
        text.truncate(end);
        text.push_str("[...]");
    }
    text
}

fn write_loop(shared: &Shared, receiver: Receiver<Op>) {
    let mut conn = match open_and_prune(shared) {
        Ok(conn) => conn,
        Err(e) => {
            shared.report_broken(e);
            // Still read the queue: a run recorded while the file was being opened goes
            // unrecorded too, and the clients hear of it at the first such run; reads waiting on
            // a flush are answered at once.
            for op in receiver {
                match op {
                    Op::Begin(_) => shared.announce_if_broken(),
                    Op::Flush(done) => {
                        let _ = done.send(());
                    }
                    Op::ClaimJobs(_, done) => {
                        let _ = done.send(Vec::new());
                    }
                    Op::ClaimKey(_, done) => drop(done),
                    Op::DayMark(_, done) => drop(done),
                    Op::KeyAnswered(_) | Op::KeyReleased(_) | Op::Usage(_) => {}
                    Op::End(_)
                    | Op::JobStarted(_)
                    | Op::JobEnded(_)
                    | Op::LetGoOfJob(_)
                    | Op::TaskCreated(_)
                    | Op::TaskEnded(..)
                    | Op::EgressAllowed(_) => {}
                }
            }
            return;
        }
    };
    let mut added_since_prune: u64 = 0;
    while let Ok(first) = receiver.recv() {
        // Records that arrive within LINGER go in the same transaction: a short command's
        // start and end (and a busy client's next runs) then cost one commit, not one each,
        // which keeps the writer's CPU off the two cores the calls run on. A read's flush is
        // written at once.
        let until = std::time::Instant::now() + LINGER;
        let mut flush_asked = matches!(first, Op::Flush(_));
        let mut batch = vec![first];
        while batch.len() < BATCH && !flush_asked {
            let left = until.saturating_duration_since(std::time::Instant::now());
            match receiver.recv_timeout(left) {
                Ok(op) => {
                    flush_asked = matches!(op, Op::Flush(_));
                    batch.push(op);
                }
                Err(_) => break,
            }
        }
        added_since_prune += batch.iter().filter(|op| op.adds_a_record()).count() as u64;
        let mut flushed = Vec::new();
        let mut claims = Vec::new();
        let mut key_claims = Vec::new();
        let mut day_marks = Vec::new();
        let written = write_batch(
            &mut conn,
            batch,
            &mut flushed,
            &mut claims,
            &mut key_claims,
            &mut day_marks,
        );
        // What failed to be written: a record (the rest of its batch committed) or the commit.
        let failed = match &written {
            Ok(None) => None,
            Ok(Some(e)) | Err(e) => Some(e),
        };
        if let Some(e) = failed {
            let failures = shared.write_failures.fetch_add(1, Ordering::Relaxed) + 1;
            if failures.is_power_of_two() {
                tracing::warn!(error = %e, failures, path = %shared.path.display(), "could not write to the run ledger; records lost");
            }
        }
        for done in flushed {
            let _ = done.send(());
        }
        // Answered after the commit: a job is taken over only once its claim is written.
        for (jobs, done) in claims {
            let _ = done.send(jobs);
        }
        // A mark or a claim not committed was not made: its call is refused, saying why.
        for (mark, done) in day_marks {
            let _ = done.send(committed(shared, mark, &written));
        }
        for (claim, done) in key_claims {
            let _ = done.send(committed(shared, claim, &written));
        }
        if added_since_prune >= PRUNE_EVERY {
            added_since_prune = 0;
            match prune(shared, &conn) {
                Ok(0) => {}
                Ok(pruned) => tracing::debug!(pruned, "pruned the run ledger"),
                Err(e) => tracing::warn!(error = %e, "could not prune the run ledger"),
            }
        }
    }
}

/// A record's answer once its batch's commit is known: the answer only if both it and the
/// commit were written.
fn committed<T>(
    shared: &Shared,
    answer: Result<T, String>,
    commit: &rusqlite::Result<Option<rusqlite::Error>>,
) -> Result<T, StoreUnavailable> {
    let failed = match (answer, commit) {
        (Ok(value), Ok(_)) => return Ok(value),
        (Err(reason), _) => reason,
        (Ok(_), Err(e)) => e.to_string(),
    };
    Err(StoreUnavailable::Broken {
        path: shared.path.display().to_string(),
        reason: format!("could not write to it: {failed}"),
    })
}

impl Op {
    /// Whether writing it adds a row that only pruning takes away.
    fn adds_a_record(&self) -> bool {
        matches!(
            self,
            Op::Begin(_)
                | Op::JobStarted(_)
                | Op::TaskCreated(_)
                | Op::EgressAllowed(_)
                | Op::ClaimKey(..)
        )
    }
}

/// The ledger's retention: runs past `max_runs` or `max_days`, and keys past theirs.
fn prune(shared: &Shared, conn: &rusqlite::Connection) -> rusqlite::Result<usize> {
    store::prune(
        conn,
        shared.max_runs,
        shared.max_days,
        now_ms(),
        crate::process::ephemeral::process_alive,
    )
}

fn open_and_prune(shared: &Shared) -> Result<rusqlite::Connection, String> {
    let conn = store::open_for_writing(&shared.path)?;
    let prune_and_seed = || -> rusqlite::Result<usize> {
        let pruned = prune(shared, &conn)?;
        shared
            .last_id
            .fetch_max(store::newest_id(&conn)?, Ordering::Relaxed);
        Ok(pruned)
    };
    let pruned = prune_and_seed().map_err(|e| e.to_string())?;
    if pruned > 0 {
        tracing::info!(pruned, "pruned the run ledger");
    }
    Ok(conn)
}

/// A claim's answer, sent once its batch is committed.
type Claimed = (Vec<JobRecord>, tokio::sync::oneshot::Sender<Vec<JobRecord>>);

/// Keeps a written record's answer (or why it failed) to send once the batch is committed.
fn answered<T>(
    written: rusqlite::Result<T>,
    done: Answer<T>,
    answers: &mut Vec<(Result<T, String>, Answer<T>)>,
) -> rusqlite::Result<()> {
    match written {
        Ok(value) => {
            answers.push((Ok(value), done));
            Ok(())
        }
        Err(e) => {
            answers.push((Err(e.to_string()), done));
            Err(e)
        }
    }
}

fn write_batch(
    conn: &mut rusqlite::Connection,
    batch: Vec<Op>,
    flushed: &mut Vec<tokio::sync::oneshot::Sender<()>>,
    claims: &mut Vec<Claimed>,
    key_claims: &mut Vec<(Result<KeyClaim, String>, Answer<KeyClaim>)>,
    day_marks: &mut Vec<(Result<i64, String>, Answer<i64>)>,
) -> rusqlite::Result<Option<rusqlite::Error>> {
    let tx = conn.transaction()?;
    let mut first_error = None;
    for op in batch {
        let written = match op {
            Op::Begin(run) => store::insert(&tx, &run),
            Op::End(end) => store::update(&tx, &end),
            Op::JobStarted(job) => store::insert_job(&tx, &job),
            Op::JobEnded(end) => store::end_job(&tx, &end),
            Op::LetGoOfJob(id) => store::let_go_of_job(&tx, &id),
            Op::ClaimJobs(served, done) => {
                store::claim_jobs(&tx, &served, crate::process::ephemeral::process_alive).map(
                    |jobs| {
                        claims.push((jobs, done));
                    },
                )
            }
            Op::TaskCreated(task) => store::insert_task(&tx, &task),
            Op::TaskEnded(id, outcome) => store::end_task(&tx, &id, outcome),
            Op::EgressAllowed(grant) => {
                let (fleet, engine, machine, destinations) = *grant;
                store::insert_grants(&tx, fleet, &engine, &machine, &destinations, now_ms())
            }
            Op::ClaimKey(claim, done) => {
                answered(store::claim_key(&tx, &claim, now_ms()), done, key_claims)
            }
            Op::Usage(usage) => store::set_usage(&tx, usage.0, &usage.1),
            Op::DayMark(reading, done) => {
                answered(store::day_mark(&tx, &reading.0, reading.1), done, day_marks)
            }
            Op::KeyAnswered(answered) => store::answer_key(&tx, &answered.0, &answered.1),
            Op::KeyReleased(key) => store::release_key(&tx, &key),
            Op::Flush(done) => {
                flushed.push(done);
                Ok(())
            }
        };
        if let Err(e) = written {
            first_error.get_or_insert(e);
        }
    }
    if let Err(e) = tx.commit() {
        // Nothing of the batch was written, the claims included.
        for (jobs, _) in claims.iter_mut() {
            jobs.clear();
        }
        return Err(e);
    }
    // Committed; a record that failed is lost, the others written.
    Ok(first_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_keeps_its_ends_whole_characters_only() {
        let mut bytes = "é".repeat(STREAM_HEAD_BYTES).into_bytes();
        bytes.extend(b"middle");
        bytes.extend("ü".repeat(STREAM_TAIL_BYTES).into_bytes());
        let kept = StreamRecord::of(&bytes);
        assert_eq!(kept.bytes, bytes.len() as i64);
        assert_eq!(
            kept.dropped as usize,
            bytes.len() - kept.head.len() - kept.tail.len()
        );
        assert!(kept.head.len() <= STREAM_HEAD_BYTES && kept.head.chars().all(|c| c == 'é'));
        assert!(kept.tail.len() <= STREAM_TAIL_BYTES && kept.tail.chars().all(|c| c == 'ü'));
        assert!(!kept.tail.is_empty());

        let short = StreamRecord::of(b"all of it");
        assert_eq!(
            (short.head.as_str(), short.tail.as_str()),
            ("all of it", "")
        );
    }

    fn shared() -> Shared {
        Shared {
            path: PathBuf::new(),
            max_runs: 1,
            max_days: 1,
            events: Events::default(),
            broken: OnceLock::new(),
            announced: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
            write_failures: AtomicU64::new(0),
            credentials: OnceLock::new(),
            last_id: AtomicI64::new(0),
            reader: Mutex::new(None),
        }
    }

    fn start(env: &[(&str, &str)]) -> RunStart {
        RunStart {
            tool: "run-command",
            fleet: FleetKind::Local,
            machine: "box".into(),
            command: Command::Shell("env".into()),
            workdir: None,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn opened_in(runtime: &Path, extra: &[(&str, &str)]) -> Ledger {
        let mut vars: BTreeMap<String, String> = extra
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        vars.insert("SMOL_MCP_RUNTIME_DIR".into(), runtime.display().to_string());
        let config = Config::from_sources(&vars, Path::new("/nonexistent")).unwrap();
        Ledger::open(&config, Events::default())
    }

    fn key_claim(key: &str) -> KeyRecord {
        KeyRecord {
            key: key.into(),
            pid: std::process::id(),
            tool: "create-machine".into(),
            fingerprint: "f".into(),
            arguments: "{}".into(),
            started_ms: now_ms(),
            answer: None,
            answer_dropped: false,
        }
    }

    // The three ways the store can fail a limit that reads it; each is an error, never an
    // answer that lets the call through unchecked.

    #[tokio::test]
    async fn without_a_store_a_spend_mark_and_a_key_claim_are_errors() {
        let ledger = Ledger::off();
        assert_eq!(
            ledger.day_mark("2026-12-04", 10).await,
            Err(StoreUnavailable::Off)
        );
        assert_eq!(
            ledger.claim_key(key_claim("k")).await,
            Err(StoreUnavailable::Off)
        );
    }

    #[tokio::test]
    async fn with_the_writer_behind_a_spend_mark_and_a_key_claim_are_errors() {
        let (queue, _stuck_writer) = std::sync::mpsc::sync_channel(1);
        let ledger = Ledger {
            shared: Arc::new(shared()),
            on: true,
            keeps_runs: true,
            queue: Arc::new(OnceLock::from(Some(queue))),
        };
        ledger.begin(start(&[]));
        assert_eq!(
            ledger.day_mark("2026-12-04", 10).await,
            Err(StoreUnavailable::QueueFull)
        );
        assert_eq!(
            ledger.claim_key(key_claim("k")).await,
            Err(StoreUnavailable::QueueFull)
        );
    }

    #[tokio::test]
    async fn with_the_file_unusable_a_spend_mark_and_a_key_claim_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(FILE_NAME).join("in-the-way")).unwrap();
        let ledger = opened_in(dir.path(), &[]);
        for refused in [
            ledger.day_mark("2026-12-04", 10).await.map(|_| ()),
            ledger.claim_key(key_claim("k")).await.map(|_| ()),
        ] {
            match refused {
                Err(StoreUnavailable::Broken { path, reason }) => {
                    assert!(path.ends_with(FILE_NAME), "{path}");
                    assert!(reason.contains("unable to open database file"), "{reason}");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    /// `ledgerMaxRuns` 0 keeps no runs, and only runs: the spend marks and keys are kept.
    #[tokio::test]
    async fn no_runs_kept_still_keeps_spend_marks_and_keys() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = opened_in(dir.path(), &[("SMOL_MCP_LEDGER_MAX_RUNS", "0")]);
        assert_eq!(ledger.begin(start(&[])).id(), None);
        assert_eq!(ledger.day_mark("2026-12-04", 10).await, Ok(10));
        assert_eq!(ledger.day_mark("2026-12-04", 25).await, Ok(10));
        assert_eq!(
            ledger.claim_key(key_claim("k")).await,
            Ok(KeyClaim::Claimed)
        );
        assert!(matches!(
            ledger.claim_key(key_claim("k")).await,
            Ok(KeyClaim::Taken(_))
        ));
        assert_eq!(ledger.page(None, 10).await.err(), Some(LedgerError::Off));
    }

    #[test]
    fn a_full_queue_drops_records_instead_of_waiting() {
        // A writer stuck on a slow disk: nothing reads the queue.
        let (queue, _stuck_writer) = std::sync::mpsc::sync_channel(2);
        let ledger = Ledger {
            shared: Arc::new(shared()),
            on: true,
            keeps_runs: true,
            queue: Arc::new(OnceLock::from(Some(queue))),
        };
        let runs: Vec<Run> = (0..10).map(|_| ledger.begin(start(&[]))).collect();
        assert_eq!(ledger.dropped(), 8);
        assert_eq!(runs.iter().filter(|r| r.id().is_some()).count(), 2);
    }

    #[test]
    fn kept_output_and_errors_name_environment_values_instead_of_holding_them() {
        let (queue, written) = std::sync::mpsc::sync_channel(8);
        let ledger = Ledger {
            shared: Arc::new(shared()),
            on: true,
            keeps_runs: true,
            queue: Arc::new(OnceLock::from(Some(queue))),
        };
        let env = [
            ("TOKEN", "s3cr3t-token"),
            ("TOKEN_PART", "s3cr3t"),
            ("ON", "1"),
        ];
        let output = ExecOutput {
            exit_code: 0,
            stdout: b"s3cr3t-token and s3cr3t and 1".to_vec(),
            stderr: b"s3cr3t".to_vec(),
            stdout_cut_upstream: false,
            stderr_cut_upstream: false,
        };
        ledger.begin(start(&env)).exited(&output, false);
        ledger.begin(start(&env)).failed(&ToolError::new(
            ToolErrorKind::Internal,
            "the engine said: bad value s3cr3t-token",
        ));
        let ops: Vec<Op> = written.try_iter().collect();
        let ends: Vec<&Ended> = ops
            .iter()
            .filter_map(|op| match op {
                Op::End(end) => Some(&**end),
                _ => None,
            })
            .collect();
        let stdout = ends[0].stdout.as_ref().unwrap();
        assert_eq!(stdout.head, "[$TOKEN] and [$TOKEN_PART] and 1");
        assert_eq!(stdout.bytes, output.stdout.len() as i64);
        assert_eq!(ends[0].stderr.as_ref().unwrap().head, "[$TOKEN_PART]");
        assert_eq!(ends[1].outcome, "error");
        assert!(
            ends[1]
                .error
                .as_deref()
                .unwrap()
                .ends_with("bad value [$TOKEN]"),
            "{:?}",
            ends[1].error
        );
    }

    #[test]
    fn a_piece_of_a_value_at_a_cut_edge_is_named_too() {
        let values = vec![("hunter2xyz".to_owned(), "[$SECRET]".to_owned())];
        // A value's start at a text's end, its rest at the next text's start.
        assert_eq!(
            redact_edge("aaahunter2".to_owned(), &values, Edge::End),
            "aaa[$SECRET]"
        );
        assert_eq!(
            redact_edge("aaah".to_owned(), &values, Edge::End),
            "aaa[$SECRET]"
        );
        assert_eq!(
            redact_edge("xyzbbb".to_owned(), &values, Edge::Start),
            "[$SECRET]bbb"
        );
        assert_eq!(
            redact_edge("zbbb".to_owned(), &values, Edge::Start),
            "[$SECRET]bbb"
        );
        // Nothing of a value at the edges: untouched, its inner pieces too.
        assert_eq!(
            redact_edge("aaahunterb".to_owned(), &values, Edge::End),
            "aaahunterb"
        );
        assert_eq!(redact_edge("bxyz".to_owned(), &values, Edge::Start), "bxyz");
        // Whole values go before the cut.
        assert_eq!(
            redact_bytes(b"1hunter2xyz2hunter2xyz", &values),
            b"1[$SECRET]2[$SECRET]"
        );
        // A character cut in two is not split further.
        let wide = vec![("ééé-secret".to_owned(), "[$W]".to_owned())];
        assert_eq!(redact_edge("aé".to_owned(), &wide, Edge::End), "a[$W]");
    }

    #[test]
    fn a_run_dropped_unfinished_is_recorded_abandoned() {
        let (queue, written) = std::sync::mpsc::sync_channel(8);
        let ledger = Ledger {
            shared: Arc::new(shared()),
            on: true,
            keeps_runs: true,
            queue: Arc::new(OnceLock::from(Some(queue))),
        };
        drop(ledger.begin(start(&[])));
        let outcomes: Vec<&str> = written
            .try_iter()
            .filter_map(|op| match op {
                Op::End(end) => Some(end.outcome),
                _ => None,
            })
            .collect();
        assert_eq!(outcomes, ["abandoned"]);
    }

    #[test]
    fn ids_increase_even_within_one_microsecond() {
        let shared = shared();
        shared.last_id.store(i64::MAX / 2, Ordering::Relaxed);
        let first = shared.next_id();
        let second = shared.next_id();
        assert_eq!(first, i64::MAX / 2 + 1);
        assert_eq!(second, first + 1);
    }
}
