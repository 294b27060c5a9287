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

mod store;

use crate::backend::events::{Events, ServerEvent};
use crate::config::Config;
use crate::fleet::{Command, ExecOutput, ExecSpec, FleetKind};
use crate::tools::{ToolError, ToolErrorKind};
use serde_json::{Value, json};
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
/// What is kept of each stream: its first and its last bytes.
pub const STREAM_HEAD_BYTES: usize = 2048;
pub const STREAM_TAIL_BYTES: usize = 2048;
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
/// Runs a `smol://runs` page lists when the URI does not say, and at most.
pub const PAGE_DEFAULT: usize = 50;
pub const PAGE_MAX: usize = 500;

/// One stream as the ledger keeps it: its size, and its head and tail as text (cut on character
/// boundaries; the tail is empty when the head holds it all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamRecord {
    pub bytes: i64,
    /// Bytes between the head and the tail, kept by neither.
    pub dropped: i64,
    pub head: String,
    pub tail: String,
}

impl StreamRecord {
    /// The head and tail of a whole stream.
    pub fn of(bytes: &[u8]) -> StreamRecord {
        let head_end = crate::tools::output::utf8_prefix_len(bytes, STREAM_HEAD_BYTES);
        let rest = &bytes[head_end..];
        let mut tail_start = rest.len().saturating_sub(STREAM_TAIL_BYTES);
        while tail_start < rest.len() && rest[tail_start] & 0b1100_0000 == 0b1000_0000 {
            tail_start += 1;
        }
        StreamRecord::from_parts(bytes.len() as u64, &bytes[..head_end], &rest[tail_start..])
    }

    /// For output kept as it arrived (a job's head and tail): the total and the two ends.
    pub fn from_parts(total: u64, head: &[u8], tail: &[u8]) -> StreamRecord {
        let kept = (head.len() + tail.len()) as u64;
        StreamRecord {
            bytes: i64::try_from(total).unwrap_or(i64::MAX),
            dropped: i64::try_from(total.saturating_sub(kept)).unwrap_or(i64::MAX),
            head: String::from_utf8_lossy(head).into_owned(),
            tail: String::from_utf8_lossy(tail).into_owned(),
        }
    }
}

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

struct Begun {
    id: i64,
    pid: u32,
    tool: &'static str,
    fleet: &'static str,
    machine: String,
    command_kind: &'static str,
    command: String,
    workdir: Option<String>,
    env_names: String,
    started_ms: i64,
}

struct Ended {
    id: i64,
    ended_ms: i64,
    outcome: &'static str,
    exit_code: Option<i32>,
    timed_out: Option<bool>,
    error: Option<String>,
    stdout: Option<StreamRecord>,
    stderr: Option<StreamRecord>,
}

enum Op {
    Begin(Box<Begun>),
    End(Box<Ended>),
    /// Answered once everything queued before it is committed.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// A run as `smol://runs` lists it.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub id: i64,
    pub tool: String,
    pub fleet: String,
    pub machine: String,
    pub command_kind: String,
    pub command: String,
    pub started_ms: i64,
    pub ended_ms: Option<i64>,
    pub outcome: String,
    pub exit_code: Option<i32>,
    pub timed_out: Option<bool>,
    pub stdout_bytes: Option<i64>,
    pub stderr_bytes: Option<i64>,
}

/// One run with everything kept of it.
#[derive(Debug, Clone)]
pub struct RunDetail {
    pub summary: RunSummary,
    pub workdir: Option<String>,
    pub env_names: String,
    pub error: Option<String>,
    pub stdout: Option<StreamRecord>,
    pub stderr: Option<StreamRecord>,
}

/// Why the ledger cannot answer a read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error(
        "the run ledger is off (ledgerMaxRuns is 0); set SMOL_MCP_LEDGER_MAX_RUNS above 0 to keep one"
    )]
    Off,
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
    on: bool,
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
    /// and opens and prunes the file off the caller's path. Off when `ledgerMaxRuns` is 0: no
    /// file is opened and nothing is recorded.
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
            last_id: AtomicI64::new(0),
            reader: Mutex::new(None),
        });
        Ledger {
            on: shared.max_runs > 0,
            shared,
            queue: Arc::new(OnceLock::new()),
        }
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

    pub fn is_on(&self) -> bool {
        self.on
    }

    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Records dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    fn send(&self, op: Op) -> bool {
        let Some(queue) = self.started() else {
            return false;
        };
        match queue.try_send(op) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                let dropped = self.shared.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                // The first, and then ever more rarely: a slow disk must not flood the log.
                if dropped.is_power_of_two() {
                    tracing::warn!(
                        dropped,
                        "the run ledger's writer is behind (a slow disk?); records dropped so far"
                    );
                }
                false
            }
            // Only a test's queue without a writer gets here.
            Err(TrySendError::Disconnected(_)) => false,
        }
    }

    /// Records that a run starts now; the returned [`Run`] records how it ends.
    pub fn begin(&self, start: RunStart) -> Run {
        let mut run = Run {
            ledger: None,
            id: 0,
            env_values: Vec::new(),
        };
        if !self.on {
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
            run.env_values = start
                .env
                .into_iter()
                .filter(|(_, v)| v.len() >= REDACT_MIN_BYTES)
                .map(|(name, value)| (value, format!("[${name}]")))
                .collect();
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
            return Err(LedgerError::Off);
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
        self.read(move |conn| store::page(conn, before, limit))
            .await
    }

    pub async fn run(&self, id: i64) -> Result<Option<RunDetail>, LedgerError> {
        self.read(move |conn| store::one(conn, id)).await
    }
}

/// A run that has begun; record how it ended with one of its methods. Dropped without one (the
/// call's future dropped mid-run), it is recorded as abandoned.
pub struct Run {
    ledger: Option<Ledger>,
    id: i64,
    /// (value, what replaces it) for each environment value worth looking for.
    env_values: Vec<(String, String)>,
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
        let (stdout, stderr) = (self.redact_stream(stdout), self.redact_stream(stderr));
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
        redact_end(text, &self.env_values)
    }

    /// A tail is cut at its start too, maybe inside a value.
    fn redact_stream(&self, stream: StreamRecord) -> StreamRecord {
        StreamRecord {
            bytes: stream.bytes,
            dropped: stream.dropped,
            head: self.redact(stream.head),
            tail: redact_start(self.redact(stream.tail), &self.env_values),
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

/// Replaces a value's first bytes left at the end of `text` by the value's name. Any piece
/// counts, one byte included: what is lost is less than a value's length, and no text the
/// ledger keeps can then be joined to the one stored after it into a whole value.
fn redact_end(mut text: String, env_values: &[(String, String)]) -> String {
    let mut longest: Option<(usize, &str)> = None;
    for (value, name) in env_values {
        let v = value.as_bytes();
        let piece = (1..v.len()).rev().find(|&k| {
            k > longest.map_or(0, |(k, _)| k)
                && value.is_char_boundary(k)
                && text.as_bytes().ends_with(&v[..k])
                && text.is_char_boundary(text.len() - k)
        });
        if let Some(k) = piece {
            longest = Some((k, name));
        }
    }
    if let Some((k, name)) = longest {
        text.truncate(text.len() - k);
        text.push_str(name);
    }
    text
}

/// Replaces a value's last bytes at the start of `text` (a tail cut inside a value) by the
/// value's name.
fn redact_start(mut text: String, env_values: &[(String, String)]) -> String {
    let mut longest: Option<(usize, &str)> = None;
    for (value, name) in env_values {
        let v = value.as_bytes();
        let piece = (1..v.len()).rev().find(|&k| {
            k > longest.map_or(0, |(k, _)| k)
                && value.is_char_boundary(v.len() - k)
                && text.as_bytes().starts_with(&v[v.len() - k..])
                && text.is_char_boundary(k)
        });
        if let Some(k) = piece {
            longest = Some((k, name));
        }
    }
    if let Some((k, name)) = longest {
        text.replace_range(..k, name);
    }
    text
}

/// `text` cut to at most `max` bytes on a character boundary, marked when cut.
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let end = crate::tools::output::utf8_prefix_len(text.as_bytes(), max);
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
                    Op::End(_) => {}
                    Op::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
            return;
        }
    };
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
        let mut flushed = Vec::new();
        let written = write_batch(&mut conn, batch, &mut flushed);
        if let Err(e) = written {
            let failures = shared.write_failures.fetch_add(1, Ordering::Relaxed) + 1;
            if failures.is_power_of_two() {
                tracing::warn!(error = %e, failures, path = %shared.path.display(), "could not write to the run ledger; records lost");
            }
        }
        for done in flushed {
            let _ = done.send(());
        }
    }
}

fn open_and_prune(shared: &Shared) -> Result<rusqlite::Connection, String> {
    let conn = store::open_for_writing(&shared.path)?;
    let prune_and_seed = || -> rusqlite::Result<usize> {
        let pruned = store::prune(
            &conn,
            shared.max_runs,
            shared.max_days,
            now_ms(),
            crate::backend::ephemeral::process_alive,
        )?;
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

fn write_batch(
    conn: &mut rusqlite::Connection,
    batch: Vec<Op>,
    flushed: &mut Vec<tokio::sync::oneshot::Sender<()>>,
) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    let mut first_error = None;
    for op in batch {
        let written = match op {
            Op::Begin(run) => store::insert(&tx, &run),
            Op::End(end) => store::update(&tx, &end),
            Op::Flush(done) => {
                flushed.push(done);
                Ok(())
            }
        };
        if let Err(e) = written {
            first_error.get_or_insert(e);
        }
    }
    tx.commit()?;
    first_error.map_or(Ok(()), Err)
}

/// A run's start or end as RFC 3339 text.
fn time(ms: i64) -> Value {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| Value::from(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)))
        .unwrap_or(Value::Null)
}

impl RunSummary {
    fn command_json(&self) -> Value {
        if self.command_kind == "argv" {
            serde_json::from_str(&self.command)
                .unwrap_or_else(|_| Value::from(self.command.clone()))
        } else {
            Value::from(self.command.clone())
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id.to_string(),
            "uri": format!("smol://runs/{}", self.id),
            "tool": self.tool,
            "fleet": self.fleet,
            "machine": self.machine,
            "command": self.command_json(),
            "startedAt": time(self.started_ms),
            "endedAt": self.ended_ms.map_or(Value::Null, time),
            "durationMs": self.ended_ms.map(|end| end - self.started_ms),
            "outcome": self.outcome,
            "exitCode": self.exit_code,
            "timedOut": self.timed_out,
            "stdoutBytes": self.stdout_bytes,
            "stderrBytes": self.stderr_bytes,
        })
    }
}

impl RunDetail {
    pub fn to_json(&self) -> Value {
        let mut value = self.summary.to_json();
        let stream = |s: &Option<StreamRecord>| {
            s.as_ref().map_or(Value::Null, |s| {
                json!({
                    "bytes": s.bytes,
                    "head": s.head,
                    "tail": s.tail,
                    "droppedBytes": s.dropped,
                })
            })
        };
        if let Value::Object(map) = &mut value {
            map.insert("workdir".into(), json!(self.workdir));
            map.insert(
                "envNames".into(),
                serde_json::from_str(&self.env_names).unwrap_or(Value::Array(vec![])),
            );
            map.insert("error".into(), json!(self.error));
            map.insert("stdout".into(), stream(&self.stdout));
            map.insert("stderr".into(), stream(&self.stderr));
        }
        value
    }
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

    #[test]
    fn a_full_queue_drops_records_instead_of_waiting() {
        // A writer stuck on a slow disk: nothing reads the queue.
        let (queue, _stuck_writer) = std::sync::mpsc::sync_channel(2);
        let ledger = Ledger {
            shared: Arc::new(shared()),
            on: true,
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
        assert_eq!(redact_end("aaahunter2".to_owned(), &values), "aaa[$SECRET]");
        assert_eq!(redact_end("aaah".to_owned(), &values), "aaa[$SECRET]");
        assert_eq!(redact_start("xyzbbb".to_owned(), &values), "[$SECRET]bbb");
        assert_eq!(redact_start("zbbb".to_owned(), &values), "[$SECRET]bbb");
        // Nothing of a value at the edges: untouched, its inner pieces too.
        assert_eq!(redact_end("aaahunterb".to_owned(), &values), "aaahunterb");
        assert_eq!(redact_start("bxyz".to_owned(), &values), "bxyz");
        // Whole values go before the cut.
        assert_eq!(
            redact_bytes(b"1hunter2xyz2hunter2xyz", &values),
            b"1[$SECRET]2[$SECRET]"
        );
        // A character cut in two is not split further.
        let wide = vec![("ééé-secret".to_owned(), "[$W]".to_owned())];
        assert_eq!(redact_end("aé".to_owned(), &wide), "a[$W]");
    }

    #[test]
    fn a_run_dropped_unfinished_is_recorded_abandoned() {
        let (queue, written) = std::sync::mpsc::sync_channel(8);
        let ledger = Ledger {
            shared: Arc::new(shared()),
            on: true,
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
