//! The records the store keeps, one named struct for each thing written or read back: a run's
//! start and end, a job, a task, an egress grant, a day's spend mark, an idempotency key.

use crate::fleet::FleetKind;

/// One stream as a run's record keeps it: its size, and its head and tail as text (cut on
/// character boundaries by the policy; the tail is empty when the head holds it all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamRecord {
    pub bytes: i64,
    /// Bytes between the head and the tail, kept by neither.
    pub dropped: i64,
    pub head: String,
    pub tail: String,
}

/// A run's start, as written. The store gives it its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRun {
    pub pid: u32,
    /// Who ran it (`crate::policy::user::User`'s id; empty: the operator).
    pub user: String,
    pub tool: &'static str,
    pub fleet: FleetKind,
    pub machine: String,
    pub command: RunCommand,
    pub workdir: Option<String>,
    /// The names of the environment variables it was given (never their values).
    pub env_names: Vec<String>,
    pub started_ms: i64,
}

/// A run's command as kept: shell text, or an argv (each already redacted and cut).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunCommand {
    Shell(String),
    /// The argv as a JSON array.
    Argv(String),
}

impl RunCommand {
    pub fn kind(&self) -> &'static str {
        match self {
            RunCommand::Shell(_) => "shell",
            RunCommand::Argv(_) => "argv",
        }
    }

    pub fn text(&self) -> &str {
        match self {
            RunCommand::Shell(text) | RunCommand::Argv(text) => text,
        }
    }
}

/// How a run ended, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEnd {
    pub id: i64,
    pub ended_ms: i64,
    pub outcome: RunOutcome,
    pub exit_code: Option<i32>,
    pub timed_out: Option<bool>,
    pub error: Option<String>,
    pub stdout: Option<StreamRecord>,
    pub stderr: Option<StreamRecord>,
}

/// How a run ended, in the words `smol://runs` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    Exited,
    Cancelled,
    Error,
    /// Dropped unfinished (the call's future dropped mid-run).
    Abandoned,
}

impl RunOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Exited => "exited",
            RunOutcome::Cancelled => "cancelled",
            RunOutcome::Error => "error",
            RunOutcome::Abandoned => "abandoned",
        }
    }
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
    /// What the run cost its machine (JSON), when it was measured.
    pub usage: Option<String>,
}

/// A page of runs, newest first.
#[derive(Debug, Clone)]
pub struct RunPage {
    pub runs: Vec<RunSummary>,
    /// Whether older runs remain.
    pub more: bool,
}

/// A background job as the store keeps it while it runs: enough for a later process to find
/// it in its machine and take it over (its marker is its id; its files start at `base`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    pub id: String,
    /// Who started it (empty: the operator).
    pub user: String,
    /// Its run's record, when the run was recorded.
    pub run_id: Option<i64>,
    pub fleet: FleetKind,
    /// The engine it runs on, as the ephemeral record names engines (a named serve, the
    /// engine binary a process starts, the cloud's URL): a process on another engine leaves
    /// it alone.
    pub engine: String,
    pub machine: String,
    /// The command as job-output's list shows it.
    pub command: String,
    pub base: String,
    pub started_ms: i64,
    pub timeout_secs: u64,
}

/// A job as the store keeps it, for a process other than its watcher: what it is, and how it
/// stands as its watcher last wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredJob {
    pub record: JobRecord,
    pub state: JobState,
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
}

/// How a job stands, as the store keeps it: running, or how it ended. Written as the word
/// job-output's list shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Running,
    Exited,
    TimedOut,
    Cancelled,
    Lost,
}

impl JobState {
    const ALL: [JobState; 5] = [
        JobState::Running,
        JobState::Exited,
        JobState::TimedOut,
        JobState::Cancelled,
        JobState::Lost,
    ];

    pub fn word(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Exited => "exited",
            JobState::TimedOut => "timedOut",
            JobState::Cancelled => "cancelled",
            JobState::Lost => "lost",
        }
    }

    pub fn parse(word: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|state| state.word() == word)
    }
}

/// The state a stored job's row names, which [`JobState::word`] wrote; a word this server
/// does not know is refused (the row is not read, and the log says so), never taken for a
/// state it may not be.
pub(crate) fn known_job_state(id: &str, word: &str) -> Option<JobState> {
    let state = JobState::parse(word);
    if state.is_none() {
        tracing::warn!(job = %id, state = %word, "a stored job is in a state this server does not know; it is left unread");
    }
    state
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEnd {
    pub id: String,
    pub state: JobState,
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
    pub ended_ms: i64,
}

/// An engine a process serves, as the ephemeral record names engines: the jobs it may take
/// over run there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedEngine {
    pub fleet: FleetKind,
    pub engine: String,
}

/// An MCP task as the store keeps it: enough to tell a client polling it after the process
/// that ran it has gone that it is gone, for as long as its TTL would have kept it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRecord {
    pub id: String,
    pub pid: u32,
    /// The process running it as a shared store registers it (its instance id); `None` in the
    /// SQLite file, and filled in by the store.
    pub holder: Option<String>,
    /// Who may see it: the session that made it, or all sessionless requests (the protocol's
    /// owner of the task); another client is told it does not exist.
    pub client: String,
    pub tool: String,
    pub created_ms: i64,
    pub ttl_ms: i64,
    /// How it ended in its process (`completed`, `failed`, `cancelled`), if it did.
    pub outcome: Option<String>,
    /// The task as `tasks/get` last answered it in its process (MCP's DetailedTask, JSON),
    /// written while a store several processes share keeps tasks: another process answers
    /// with it, the result of a completed one included.
    pub detail: Option<String>,
}

/// Destinations the user allowed a machine to reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressGrant {
    /// Who allowed it: only they may carry it to a later machine (`allowHostsFrom`).
    pub user: String,
    pub fleet: FleetKind,
    pub engine: String,
    pub machine: String,
    pub destinations: Vec<String>,
    pub granted_ms: i64,
}

/// A reading of the cloud account's period cost, the first of its UTC day kept as the day's
/// mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendReading {
    /// The UTC day, `YYYY-MM-DD`.
    pub day: String,
    pub period_total_micros: i64,
}

/// An idempotency key as the store keeps it: the call it names (tool and a fingerprint of its
/// arguments, with the arguments as shown in a refusal), who runs it, and once it succeeded its
/// answer, which a repeat of the call receives instead of running it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub key: String,
    pub pid: u32,
    /// The holding process as a shared store registers it (its instance id), when the store
    /// is shared by hosts on which `pid` names nothing; `None` in the SQLite file, filled in by
    /// the store at the claim.
    pub holder: Option<String>,
    /// When the holding process started (clock ticks after boot): a pid reused by a later
    /// process is not the holder. `None` in a record of an earlier release.
    pub pid_started: Option<u64>,
    pub tool: String,
    pub fingerprint: String,
    /// The arguments as a refusal names them (values an agent should not see again hidden).
    pub arguments: String,
    pub started_ms: i64,
    /// The answer, as JSON, once the call succeeded; `None` while it runs, or once dropped.
    pub answer: Option<String>,
    /// The call succeeded, but its answer was dropped to keep the store within its bound
    /// (`KEY_ANSWERS_MAX_BYTES`): a repeat is told so rather than run again.
    pub answer_dropped: bool,
}

impl KeyRecord {
    /// A claim of `key` by this process, now, for tests of what the store does with claims.
    #[cfg(test)]
    pub(crate) fn test_claim(key: &str) -> KeyRecord {
        KeyRecord {
            key: key.into(),
            pid: std::process::id(),
            holder: None,
            pid_started: crate::process::ephemeral::process_started(std::process::id()),
            tool: "create-machine".into(),
            fingerprint: "f".into(),
            arguments: "{}".into(),
            started_ms: chrono::Utc::now().timestamp_millis(),
            answer: None,
            answer_dropped: false,
        }
    }
}

/// What a claim of a machine's name found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineClaim {
    /// No one held it: it is now the claiming user's, in the making, which no call sees until
    /// the machine is made ([`crate::store::OwnerRepository::made`]). With it, every name the
    /// user held on the fleet at that moment, this one included: the claims of one user are
    /// taken one at a time, so each sees all those before it (what a per-user limit counts).
    Claimed { theirs: Vec<HeldName> },
    /// Someone held it already (the claiming user, or another; made or in the making): who.
    Held(String),
}

/// A name a user holds: a machine made for them, or one being made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldName {
    pub name: String,
    pub made: bool,
}

/// A held machine as the sweep of gone machines reads it: when it was first held, and whether
/// it was ever made (a claim left in the making by a process that died mid-create).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub machine: String,
    pub since_ms: i64,
    pub made: bool,
}

/// What a claim of an idempotency key found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyClaim {
    /// The key was free (or its call older than a day, or one that failed): it is now this
    /// call's.
    Claimed,
    /// Another call holds it: its record, running or answered.
    Taken(KeyRecord),
}

/// Run ids are microseconds with a slot of the process in their lowest bits, so that the
/// processes sharing a store never make the same id while ids still grow with time: 64 slots,
/// and the ids stay below 2^53, exact in a JavaScript client.
pub(crate) const RUN_ID_SLOTS: i64 = 64;

/// The next run id of the process in `slot`: above `last_id` (and now), in its slot.
pub(crate) fn next_run_id(last_id: &std::sync::atomic::AtomicI64, slot: i64) -> i64 {
    use std::sync::atomic::Ordering;
    let now = chrono::Utc::now().timestamp_micros();
    let place = |at_least: i64| {
        let base = at_least - at_least.rem_euclid(RUN_ID_SLOTS) + slot;
        if base < at_least {
            base + RUN_ID_SLOTS
        } else {
            base
        }
    };
    let mut last = last_id.load(Ordering::Relaxed);
    loop {
        let id = place(now.max(last + 1));
        match last_id.compare_exchange(last, id, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return id,
            Err(seen) => last = seen,
        }
    }
}
