//! Background jobs: commands that outlive the tool call that started them (run-command with
//! `background: true`). A job runs detached in its machine with its streams in files there
//! (`guest`); a watcher task here looks at those files every `jobPollMillis`, enforces the
//! job's timeout, notices when its machine stops or goes, and records the end in the run
//! ledger. Output is never held here: a reader asks for the bytes after its cursor and they are
//! read from the machine, so a job that prints for hours costs this process nothing more than
//! one that prints a line. A job ends with its machine: a stopped or deleted machine ends it as
//! `lost`. While it runs its machine counts as in use, so a leased ephemeral machine is not
//! reaped under it.

pub mod guest;

use crate::fleet::{ErrorKind, ExecSpec, Fleet, FleetError, FleetKind, Phase as MachinePhase};
use crate::policy::error::{ToolError, ToolErrorKind};
use crate::policy::ledger::{Ledger, Run, RunStart, stream_from_parts};
use crate::process::Process;
use crate::process::redaction::{Ending, Redactor};
use crate::store::{JobEnd, JobRecord, JobState, ServedEngine, StoredJob};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

/// Ended jobs kept for job-output (and its list) after their end; older ones are forgotten
/// (their ledger rows stay).
const ENDED_KEPT: usize = 100;

/// A probe that finds no files this long after the start means the wrapper never ran (no
/// `sh` in the image, an unwritable /tmp); before that they may simply not be created yet.
const FILES_GRACE: Duration = Duration::from_secs(15);

/// Probes failing in a row before the job is given up as lost.
const PROBE_FAILURES_MAX: u32 = 30;

/// How each end of a stream is kept in the ledger when the job ends.
const LEDGER_END_BYTES: usize = 2048;

/// Keeps the session that started a job from being closed as idle while the job runs (an
/// HTTP session is idle when no request of it is in flight; its end deletes its ephemeral
/// machines, which would end the job). What `hold` answers is held until the job ends.
pub trait SessionHold: Send + Sync {
    fn hold(&self) -> Option<Box<dyn Send + Sync>>;
}

/// How a request carries its session's [`SessionHold`] (the HTTP layer puts it among the
/// request's extensions).
#[derive(Clone)]
pub struct SessionHoldRef(pub Arc<dyn SessionHold>);

/// How a job stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    Running,
    Exited(i32),
    /// Killed by this server at its timeout.
    TimedOut,
    /// Killed by cancel-job.
    Cancelled,
    /// Its machine stopped or went, or its files did: the reason says which.
    Lost(String),
}

impl Phase {
    pub fn word(&self) -> &'static str {
        self.stored().word()
    }

    /// The phase as the store keeps it.
    pub fn stored(&self) -> JobState {
        match self {
            Phase::Running => JobState::Running,
            Phase::Exited(_) => JobState::Exited,
            Phase::TimedOut => JobState::TimedOut,
            Phase::Cancelled => JobState::Cancelled,
            Phase::Lost(_) => JobState::Lost,
        }
    }

    /// The status the command ended with: its own, or 124 for a timeout (as a foreground
    /// command's), or 137 for one killed by cancel-job (SIGKILL).
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            Phase::Exited(code) => Some(*code),
            Phase::TimedOut => Some(124),
            Phase::Cancelled => Some(137),
            Phase::Running | Phase::Lost(_) => None,
        }
    }
}

/// What the watcher last saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub phase: Phase,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub ended: Option<SystemTime>,
}

impl State {
    /// A job as it starts (or is taken over): running, nothing read yet.
    fn running() -> watch::Sender<State> {
        watch::Sender::new(State {
            phase: Phase::Running,
            stdout_bytes: 0,
            stderr_bytes: 0,
            ended: None,
        })
    }
}

/// One background job.
pub struct Job {
    pub id: String,
    /// Who started it: only they see it (`crate::policy::user::User`'s id).
    pub user: String,
    pub fleet: Fleet,
    pub machine: String,
    /// The command as given (argv joined by spaces, or the shell text), for listing.
    pub command: String,
    /// The path its files start with in the machine (`.stdout`, `.stderr`, `.exit`).
    pub base: String,
    pub started: SystemTime,
    pub timeout: Duration,
    /// Its row in the run ledger (`smol://runs/{id}`), when the ledger is on.
    pub run_id: Option<i64>,
    started_at: Instant,
    state: watch::Sender<State>,
    /// Tells the watcher that cancel-job has ended the job.
    stop_watching: CancellationToken,
    /// Set once the job's end is in the ledger and the job store, so that cancel-job answers
    /// after a read of `smol://runs` would show it ended.
    recorded: watch::Sender<bool>,
    /// Held by the watcher through each look (the machine's state, then the probe), so that
    /// a stop can wait until no look is under way before the machine stops.
    looking: tokio::sync::Mutex<()>,
    /// The starting session's hold, let go when the job ends.
    session_hold: Mutex<Option<Box<dyn Send + Sync>>>,
    /// Its `maxRunningJobs` slot (and its starter's share of it), given back the moment the
    /// job ends (not once its watcher has written the ledger row), so that a start right after
    /// a cancel-job finds it free.
    slot: Mutex<
        Option<(
            OwnedSemaphorePermit,
            Option<crate::policy::shares::ShareHeld>,
        )>,
    >,
    /// The machine's consumption just before the job was sent (`None` for a job taken over
    /// from a process that ended: its reading went with it).
    consumption_before: Option<crate::fleet::Consumption>,
    /// The machine's consumption once the job ended, read once, by whichever asks first (its
    /// first ended report or its ledger record).
    consumption_after: tokio::sync::OnceCell<Option<crate::fleet::Consumption>>,
    /// Watched by this process. A job another live process watches (one sharing the store)
    /// is only looked at from here when asked about: its end is that process's to record.
    watched: bool,
}

impl std::fmt::Debug for SessionHoldRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionHoldRef")
    }
}

/// A position in a job's two streams, as job-output hands it out: `<stdout>:<stderr>` bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    pub stdout: u64,
    pub stderr: u64,
}

impl Cursor {
    pub fn parse(text: &str) -> Option<Cursor> {
        let (stdout, stderr) = text.split_once(':')?;
        Some(Cursor {
            stdout: stdout.parse().ok()?,
            stderr: stderr.parse().ok()?,
        })
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.stdout, self.stderr)
    }
}

/// Output read after a cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub next: Cursor,
    /// Output remains after `next` (call again).
    pub more: bool,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("id", &self.id)
            .field("machine", &self.machine)
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

impl Job {
    /// What the job cost its machine, once it ended: the change in the fleet's figures from
    /// just before its start to when its end was seen (a poll later at most, so the machine's
    /// idle use of that moment counts too). `None` while it runs, and when either reading is
    /// missing (a job taken over, a machine gone).
    pub async fn cost(&self) -> Option<crate::policy::cost::RunCost> {
        if self.state().phase == Phase::Running {
            return None;
        }
        let before = self.consumption_before?;
        let after = self
            .consumption_after
            .get_or_init(|| crate::policy::cost::reading(&self.fleet, &self.machine))
            .await;
        crate::policy::cost::RunCost::between(Some(&before), after.as_ref())
    }

    /// A job started by a process that has ended, as the ledger kept it: its clock runs from
    /// its real start, and it takes a `maxRunningJobs` slot if one is free (it runs anyway).
    fn taken_over(record: &JobRecord, fleet: Fleet, slots: Arc<Semaphore>) -> Job {
        let started = SystemTime::UNIX_EPOCH
            + Duration::from_millis(u64::try_from(record.started_ms).unwrap_or(0));
        let age = SystemTime::now()
            .duration_since(started)
            .unwrap_or_default();
        let now = Instant::now();
        Job {
            id: record.id.clone(),
            user: record.user.clone(),
            fleet,
            machine: record.machine.clone(),
            command: record.command.clone(),
            base: record.base.clone(),
            started,
            timeout: Duration::from_secs(record.timeout_secs),
            run_id: record.run_id,
            started_at: now.checked_sub(age).unwrap_or(now),
            state: State::running(),
            stop_watching: CancellationToken::new(),
            recorded: watch::Sender::new(false),
            looking: tokio::sync::Mutex::new(()),
            session_hold: Mutex::new(None),
            slot: Mutex::new(slots.try_acquire_owned().ok().map(|permit| (permit, None))),
            consumption_before: None,
            consumption_after: tokio::sync::OnceCell::new(),
            watched: true,
        }
    }

    /// A job another process watches, as the store has it: read from its machine and looked
    /// at from here, never watched, ended in the store or the ledger from here.
    fn viewed(stored: &StoredJob, fleet: Fleet) -> Job {
        let mut job = Job::taken_over(&stored.record, fleet, Arc::new(Semaphore::new(0)));
        job.watched = false;
        let phase = match stored.state {
            JobState::Running => Phase::Running,
            JobState::Exited => Phase::Exited(stored.exit_code.unwrap_or(0)),
            JobState::TimedOut => Phase::TimedOut,
            JobState::Cancelled => Phase::Cancelled,
            JobState::Lost => Phase::Lost(
                stored
                    .reason
                    .clone()
                    .unwrap_or_else(|| "the process that watched it recorded it lost".to_owned()),
            ),
        };
        if phase != Phase::Running {
            job.end(phase);
        }
        job
    }

    /// Whether another process watches this job (see [`Job::viewed`]).
    pub fn is_view(&self) -> bool {
        !self.watched
    }

    /// Looks at a viewed job now: its files' sizes, and its end once its status (or why it was
    /// killed) is in the machine, or its machine has gone.
    pub async fn look_now(&self) {
        if self.watched || self.state().phase != Phase::Running {
            return;
        }
        if let Ok(Seen::Ended(phase)) = look(self).await {
            self.end(phase);
        }
    }

    /// Waits until a viewed job has ended, looking every `every`, or `limit` has passed.
    pub async fn wait_end_looking(&self, limit: Duration, every: Duration) {
        let deadline = Instant::now() + limit;
        while self.state().phase == Phase::Running && Instant::now() < deadline {
            tokio::time::sleep(every.min(deadline.saturating_duration_since(Instant::now()))).await;
            self.look_now().await;
        }
    }

    pub fn kind(&self) -> FleetKind {
        self.fleet.kind()
    }

    pub fn state(&self) -> State {
        self.state.borrow().clone()
    }

    pub fn elapsed(&self) -> Duration {
        match self.state.borrow().ended {
            Some(ended) => ended.duration_since(self.started).unwrap_or_default(),
            None => self.started_at.elapsed(),
        }
    }

    pub fn path(&self, stream: &str) -> String {
        format!("{}.{stream}", self.base)
    }

    /// Ends the job with `phase` unless it has already ended; answers whether this did.
    fn end(&self, phase: Phase) -> bool {
        let ended = self.state.send_if_modified(|state| {
            if state.phase != Phase::Running {
                return false;
            }
            state.phase = phase;
            state.ended = Some(SystemTime::now());
            true
        });
        if let Ok(mut slot) = self.slot.lock() {
            slot.take();
        }
        ended
    }

    /// Waits until the job's end is recorded or `limit` has passed, whichever comes first.
    pub async fn wait_recorded(&self, limit: Duration) {
        let mut seen = self.recorded.subscribe();
        let _ = tokio::time::timeout(limit, seen.wait_for(|recorded| *recorded)).await;
    }

    /// Waits until the job has ended or `limit` has passed, whichever comes first.
    pub async fn wait_end(&self, limit: Duration) {
        let mut seen = self.state.subscribe();
        let ended = seen.wait_for(|state| state.phase != Phase::Running);
        let _ = tokio::time::timeout(limit, ended).await;
    }

    /// Up to `limit` bytes of each stream after `from`, read from the machine. A character cut
    /// by the end of what was read is left for the next read, unless the job has ended and
    /// nothing follows it. Every value `redactor` knows is replaced, and no page's edge goes
    /// through one: each stream is read with a value's length less one on both sides of the
    /// page, a page ending inside a value ends after it, and one starting inside a value
    /// starts with its label.
    pub async fn read(
        &self,
        from: Cursor,
        limit: usize,
        redactor: &Redactor,
    ) -> Result<Chunk, FleetError> {
        let limit = limit.max(4);
        let reach = redactor.longest().saturating_sub(1);
        let ended_before = self.state().phase != Phase::Running;
        let behind = |at: u64| usize::try_from(at.min(reach as u64)).unwrap_or(0);
        let (stdout_behind, stderr_behind) = (behind(from.stdout), behind(from.stderr));
        let asked = reach + limit + reach;
        let mut read = ExecSpec::new(guest::read(
            &self.base,
            from.stdout - stdout_behind as u64,
            from.stderr - stderr_behind as u64,
            asked,
        ));
        read.timeout_secs = Some(60);
        read.start_if_stopped = false;
        let out = self.fleet.exec(&self.machine, &read).await?;
        let page = |around: &[u8], behind: usize| -> (usize, Vec<u8>) {
            let start = behind.min(around.len());
            let mut stop = (behind + limit).min(around.len());
            // Fewer bytes than asked for: the stream's file ends within them.
            let at_end = around.len() < asked;
            if !(ended_before && at_end && stop == around.len()) {
                stop = start + guest::complete_utf8_len(&around[start..stop]);
            }
            if redactor.is_empty() {
                return (stop - start, around[start..stop].to_vec());
            }
            let ending = if ended_before && at_end {
                Ending::Final
            } else {
                Ending::Continues
            };
            let window = redactor.window(around, start..stop, ending);
            (window.end.saturating_sub(start), window.bytes)
        };
        let (stdout_read, stdout) = page(&out.stdout, stdout_behind);
        let (stderr_read, stderr) = page(&out.stderr, stderr_behind);
        let next = Cursor {
            stdout: from.stdout + stdout_read as u64,
            stderr: from.stderr + stderr_read as u64,
        };
        let state = self.state();
        let more = stdout_read + 4 > limit
            || stderr_read + 4 > limit
            || next.stdout < state.stdout_bytes
            || next.stderr < state.stderr_bytes;
        Ok(Chunk {
            stdout,
            stderr,
            next,
            more,
        })
    }

    /// Kills the job's command and everything it started (cancel-job). Answers false when it
    /// had already ended.
    pub async fn cancel(&self) -> Result<bool, FleetError> {
        self.kill(Phase::Cancelled).await
    }

    async fn kill(&self, phase: Phase) -> Result<bool, FleetError> {
        if self.state().phase != Phase::Running {
            return Ok(false);
        }
        // The job's id is the marker in its environment; why it was killed goes beside its
        // files, for whichever process watches it.
        let mut kill = ExecSpec::new(guest::kill_job(&self.base, &self.id, phase.word()));
        kill.timeout_secs = Some(60);
        kill.start_if_stopped = false;
        let out = self.fleet.exec(&self.machine, &kill).await?;
        if out.exit_code != 0 {
            return Err(FleetError::new(
                ErrorKind::Upstream,
                "cancel-job",
                format!(
                    "the kill exited {}: {}",
                    out.exit_code,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            ));
        }
        let ended = self.end(phase);
        self.stop_watching.cancel();
        Ok(ended)
    }
}

/// Every job of this process.
#[derive(Debug)]
pub struct Jobs {
    jobs: Mutex<Vec<Arc<Job>>>,
    /// One permit per running job (`maxRunningJobs`).
    slots: Arc<Semaphore>,
    max_running: usize,
    /// Each signed-in user's share of them (`userSharePercent`).
    shares: Arc<crate::policy::shares::UserShares>,
    /// Set once the jobs of processes that ended have been taken over (`adopt`).
    adopted: tokio::sync::OnceCell<usize>,
}

/// What a job is started with.
pub struct Start<'a> {
    /// Who starts it.
    pub user: &'a crate::policy::user::User,
    pub fleet: Fleet,
    pub machine: &'a str,
    pub spec: ExecSpec,
    pub timeout: Duration,
    /// The starting request's session, kept busy while the job runs.
    pub session: Option<SessionHoldRef>,
    /// The machine's consumption as read just before the start.
    pub consumption_before: Option<crate::fleet::Consumption>,
}

/// Why a job did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "{0} jobs are running already (maxRunningJobs): wait for one to end, or cancel one with cancel-job"
    )]
    Full(usize),
    #[error(
        "you have {0} jobs running, your share of this server's (userSharePercent of \
         maxRunningJobs): wait for one to end, or cancel one with cancel-job"
    )]
    UserFull(usize),
    #[error("the machine did not start the job: {0}")]
    Refused(String),
    #[error(transparent)]
    Fleet(#[from] FleetError),
}

impl Jobs {
    pub fn new(max_running: usize, user_share_percent: u64) -> Jobs {
        Jobs {
            jobs: Mutex::new(Vec::new()),
            slots: Arc::new(Semaphore::new(max_running)),
            max_running,
            shares: crate::policy::shares::UserShares::new(max_running, user_share_percent),
            adopted: tokio::sync::OnceCell::new(),
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<Job>> {
        self.jobs
            .lock()
            .ok()?
            .iter()
            .find(|job| job.id == id)
            .cloned()
    }

    /// Newest first.
    pub fn list(&self) -> Vec<Arc<Job>> {
        let mut jobs = self.jobs.lock().map(|j| j.clone()).unwrap_or_default();
        jobs.reverse();
        jobs
    }

    /// `machine` is about to be stopped by stop-machine: its running jobs end now, each once
    /// its watcher's look in progress is done, so that no look follows the stop (on cloud an
    /// exec starts a stopped machine again, and bills it).
    pub async fn machine_stopping(&self, kind: FleetKind, machine: &str) {
        let running: Vec<Arc<Job>> = self
            .list()
            .into_iter()
            .filter(|job| {
                job.kind() == kind && job.machine == machine && job.state().phase == Phase::Running
            })
            .collect();
        for job in running {
            let _looking = job.looking.lock().await;
            job.end(Phase::Lost(
                "its machine was stopped (stop-machine): a job ends with its machine".into(),
            ));
            job.stop_watching.cancel();
        }
    }

    /// The clean-up at a session's or the process's end deleted `machines`: their jobs end
    /// now, and the ledger says so, so that no later process takes them over or calls them
    /// lost for want of a watcher.
    pub fn machines_deleted(&self, machines: &[String], ledger: &Ledger) {
        for job in self.list() {
            if job.state().phase == Phase::Running && machines.contains(&job.machine) {
                let reason = "its machine was deleted when the session that made it ended";
                job.end(Phase::Lost(reason.into()));
                job.stop_watching.cancel();
                ledger.store().jobs().ended(job_end(
                    &job.id,
                    JobState::Lost,
                    None,
                    Some(reason.into()),
                ));
            }
        }
    }

    fn remember(&self, job: Arc<Job>) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.push(job);
            let ended = jobs
                .iter()
                .filter(|job| job.state().phase != Phase::Running)
                .count();
            if ended > ENDED_KEPT {
                let mut excess = ended - ENDED_KEPT;
                jobs.retain(|job| {
                    if excess > 0 && job.state().phase != Phase::Running {
                        excess -= 1;
                        false
                    } else {
                        true
                    }
                });
            }
        }
    }

    /// Starts `start.spec` detached in its machine and a watcher for it. The ledger row is
    /// begun here and ended by the watcher.
    pub async fn start(
        &self,
        process: &Arc<Process>,
        ledger: &Ledger,
        start: Start<'_>,
    ) -> Result<Arc<Job>, StartError> {
        let permit = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| StartError::Full(self.max_running))?;
        let share = self
            .shares
            .take(start.user)
            .ok_or(StartError::UserFull(self.shares.share()))?;
        let id = format!("job-{:016x}", rand::random::<u64>());
        let base = guest::base_path(&id);
        let mut spec = start.spec;
        // The row is begun before the marker joins the environment: the marker is the
        // server's own, not a variable the agent set, so it is no name in `envNames`.
        let run = ledger
            .begin(RunStart::new("job", start.fleet.kind(), start.machine, &spec).by(start.user));
        spec.env.insert(guest::RUN_MARKER.to_owned(), id.clone());
        let command = match &spec.command {
            crate::fleet::Command::Argv(argv) => argv.join(" "),
            crate::fleet::Command::Shell(text) => text.clone(),
        };
        let mut detached = spec.clone();
        detached.command = guest::wrapper(&base, &spec.command);
        detached.background = true;
        detached.stdin = None;
        // The engines ignore a detached command's timeout; the watcher enforces it.
        detached.timeout_secs = None;
        let answer = match start.fleet.exec(start.machine, &detached).await {
            Ok(answer) => answer,
            Err(e) => {
                run.failed(&e.clone().into());
                return Err(e.into());
            }
        };
        let said = String::from_utf8_lossy(&answer.stdout);
        if answer.exit_code != 0 || !said.trim_start().starts_with("pid=") {
            let why = format!(
                "exit {}, {}{}",
                answer.exit_code,
                said.trim(),
                String::from_utf8_lossy(&answer.stderr).trim()
            );
            run.failed(&ToolError::new(ToolErrorKind::Internal, why.clone()));
            return Err(StartError::Refused(why));
        }
        let job = Arc::new(Job {
            run_id: run.id(),
            id,
            user: start.user.id().to_owned(),
            fleet: start.fleet,
            machine: start.machine.to_owned(),
            command,
            base,
            started: SystemTime::now(),
            started_at: Instant::now(),
            timeout: start.timeout,
            state: State::running(),
            stop_watching: CancellationToken::new(),
            recorded: watch::Sender::new(false),
            looking: tokio::sync::Mutex::new(()),
            session_hold: Mutex::new(start.session.and_then(|s| s.0.hold())),
            slot: Mutex::new(Some((permit, Some(share)))),
            consumption_before: start.consumption_before,
            consumption_after: tokio::sync::OnceCell::new(),
            watched: true,
        });
        ledger.store().jobs().started(JobRecord {
            id: job.id.clone(),
            user: job.user.clone(),
            run_id: job.run_id,
            fleet: job.kind(),
            engine: process.engine(job.kind()),
            machine: job.machine.clone(),
            command: job.command.clone(),
            base: job.base.clone(),
            started_ms: millis_since_epoch(job.started),
            timeout_secs: job.timeout.as_secs(),
        });
        // Written before the start is answered: a process killed right after must leave a
        // record its siblings (or its successor) can take the job over from.
        ledger.store().flush().await;
        self.remember(job.clone());
        process.hold(std::slice::from_ref(&job.machine)).await;
        tokio::spawn(
            watch_job(process.clone(), ledger.clone(), job.clone(), run).in_current_span(),
        );
        Ok(job)
    }

    /// Job `id` as another process sharing the store has it (started there, or watched there
    /// now), looked at now when it runs; `None` when the store has no such job.
    pub async fn of_another(
        &self,
        process: &Arc<Process>,
        ledger: &Ledger,
        id: &str,
    ) -> Result<Option<Arc<Job>>, ToolError> {
        // Server processes of one host that do not share a database serve separate clients:
        // each answers for its own jobs only.
        if !ledger.store().is_shared() {
            return Ok(None);
        }
        let Ok(Some(stored)) = ledger.store().jobs().get(id).await else {
            return Ok(None);
        };
        let fleet = process.fleet(stored.record.fleet).await?;
        let job = Arc::new(Job::viewed(&stored, fleet));
        job.look_now().await;
        Ok(Some(job))
    }

    /// The jobs other processes sharing the store started or watch (the last day's), as the
    /// store has them: listed beside this process's own, not looked at.
    pub async fn of_others(&self, process: &Arc<Process>, ledger: &Ledger) -> Vec<Arc<Job>> {
        if !ledger.store().is_shared() {
            return Vec::new();
        }
        let Ok(stored) = ledger.store().jobs().others(ENDED_KEPT).await else {
            return Vec::new();
        };
        let mut jobs = Vec::new();
        for stored in stored {
            if self.get(&stored.record.id).is_some() {
                continue;
            }
            if let Ok(fleet) = process.fleet(stored.record.fleet).await {
                jobs.push(Arc::new(Job::viewed(&stored, fleet)));
            }
        }
        jobs
    }

    /// Takes over, once per process, the jobs that processes which have ended left running on
    /// the engines this one serves: each whose machine still runs is watched from here on as
    /// if started here (job-output, its list and cancel-job work on it, its timeout still
    /// counts from its start); the others end as lost, with why. Answers how many were taken.
    /// A job whose fleet does not answer now is left for a later process.
    pub async fn adopt(&self, process: &Arc<Process>, ledger: &Ledger) -> usize {
        *self
            .adopted
            // Boxed: the take-over's future (a fleet reached, machines looked up) would
            // otherwise sit inside every job tool's future, on the stack of whoever polls it.
            .get_or_init(|| Box::pin(self.take_over(process, ledger)))
            .await
    }

    /// Takes over now what [`Jobs::adopt`] took at the first use: the jobs of processes that
    /// have ended since (a sibling sharing the store). A job this process owns already is not
    /// taken again (the store hands out only a dead owner's).
    pub(crate) async fn take_over(&self, process: &Arc<Process>, ledger: &Ledger) -> usize {
        let served: Vec<ServedEngine> = FleetKind::ALL
            .into_iter()
            .filter(|kind| process.serves(*kind))
            .map(|fleet| ServedEngine {
                fleet,
                engine: process.engine(fleet),
            })
            .collect();
        let mut taken = 0;
        for record in ledger.store().jobs().take_over(served).await {
            let fleet = match process.fleet(record.fleet).await {
                Ok(fleet) => fleet,
                Err(e) => {
                    tracing::warn!(job = %record.id, error = %e, "cannot reach the fleet of a job left by a process that ended; left for a later one");
                    ledger.store().jobs().let_go(&record.id);
                    continue;
                }
            };
            let gone = match fleet.get(&record.machine).await {
                Ok(machine) if machine.is_running() => None,
                Ok(machine) => Some(format!(
                    "its machine was {} when this server process took the job over from one \
                     that had ended: a job ends with its machine",
                    machine.state
                )),
                Err(e) if e.kind == ErrorKind::NotFound => Some(
                    "its machine was deleted while no server process watched the job".to_owned(),
                ),
                Err(e) => {
                    tracing::warn!(job = %record.id, error = %e, "cannot look at the machine of a job left by a process that ended; left for a later one");
                    ledger.store().jobs().let_go(&record.id);
                    continue;
                }
            };
            let job = Arc::new(Job::taken_over(&record, fleet, self.slots.clone()));
            let run = ledger.resume(record.run_id);
            self.remember(job.clone());
            if let Some(reason) = gone {
                job.end(Phase::Lost(reason));
                let job = job.clone();
                let ledger = ledger.clone();
                tokio::spawn(async move { record_end(&job, run, &ledger).await });
                continue;
            }
            tracing::info!(job = %job.id, machine = %job.machine, "took over a job left running by a server process that ended");
            process.hold(std::slice::from_ref(&job.machine)).await;
            tokio::spawn(watch_job(process.clone(), ledger.clone(), job, run));
            taken += 1;
        }
        taken
    }
}

fn millis_since_epoch(time: SystemTime) -> i64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Looks at the job until it ends, then records its end and lets its machine go.
async fn watch_job(process: Arc<Process>, ledger: Ledger, job: Arc<Job>, run: Run) {
    let poll = Duration::from_millis(process.config.job_poll_millis);
    let mut failures = 0u32;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(poll) => {}
            _ = job.stop_watching.cancelled() => break,
        }
        if job.state().phase != Phase::Running {
            break;
        }
        if job.started_at.elapsed() >= job.timeout {
            match job.kill(Phase::TimedOut).await {
                Ok(_) => {}
                Err(e) => {
                    job.end(Phase::Lost(format!(
                        "its timeout passed and it could not be killed: {}",
                        e.message
                    )));
                }
            }
            break;
        }
        let looking = job.looking.lock().await;
        if job.state().phase != Phase::Running {
            break;
        }
        let seen = look(&job).await;
        drop(looking);
        match seen {
            Ok(Seen::Running) => failures = 0,
            Ok(Seen::Ended(phase)) => {
                job.end(phase);
                break;
            }
            Err(e) => {
                failures += 1;
                if failures >= PROBE_FAILURES_MAX {
                    job.end(Phase::Lost(format!(
                        "its machine did not answer {failures} looks in a row: {e}"
                    )));
                    break;
                }
            }
        }
    }
    record_end(&job, run, &ledger).await;
    process.release(std::slice::from_ref(&job.machine));
    if let Ok(mut hold) = job.session_hold.lock() {
        hold.take();
    }
    tracing::info!(job = %job.id, machine = %job.machine, phase = job.state().phase.word(), "job ended");
}

enum Seen {
    Running,
    Ended(Phase),
}

/// One look at the job: its machine first, since an exec would start a stopped machine again.
async fn look(job: &Job) -> Result<Seen, FleetError> {
    match job.fleet.get(&job.machine).await {
        // A pause keeps the job's processes (1.32.2 saves the guest whole and resumes the same
        // processes): it is running, only not looked at until its machine is resumed.
        Ok(machine)
            if matches!(
                machine.phase(),
                MachinePhase::Paused | MachinePhase::Suspended
            ) =>
        {
            return Ok(Seen::Running);
        }
        Ok(machine) if !machine.is_running() => {
            return Ok(Seen::Ended(Phase::Lost(format!(
                "its machine is {}: a job ends with its machine",
                machine.state
            ))));
        }
        Ok(_) => {}
        Err(e) if e.kind == ErrorKind::NotFound => {
            return Ok(Seen::Ended(Phase::Lost(
                "its machine was deleted: a job ends with its machine".into(),
            )));
        }
        Err(e) => return Err(e),
    }
    let mut probe = ExecSpec::new(guest::probe(&job.base));
    probe.timeout_secs = Some(30);
    probe.start_if_stopped = false;
    let out = job.fleet.exec(&job.machine, &probe).await?;
    let Some(seen) = guest::Probed::parse(&out) else {
        return Err(FleetError::new(
            ErrorKind::Upstream,
            "job probe",
            format!(
                "unexpected answer (exit {}): {}",
                out.exit_code,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    };
    job.state.send_if_modified(|state| {
        let (stdout, stderr) = (
            seen.stdout_bytes.unwrap_or(state.stdout_bytes),
            seen.stderr_bytes.unwrap_or(state.stderr_bytes),
        );
        let changed = (stdout, stderr) != (state.stdout_bytes, state.stderr_bytes);
        state.stdout_bytes = stdout;
        state.stderr_bytes = stderr;
        changed
    });
    if let Some(code) = seen.exit_code {
        return Ok(Seen::Ended(Phase::Exited(code)));
    }
    // Killed by another process sharing the store (cancel-job through it): ended as it says.
    match seen.killed.as_deref() {
        Some("timedOut") => return Ok(Seen::Ended(Phase::TimedOut)),
        Some(_) => return Ok(Seen::Ended(Phase::Cancelled)),
        None => {}
    }
    if seen.stdout_bytes.is_none() && job.started_at.elapsed() > FILES_GRACE {
        return Ok(Seen::Ended(Phase::Lost(format!(
            "its output files ({}.*) are not in the machine: it has no sh, /tmp is not writable, \
             or the machine was restarted",
            job.base
        ))));
    }
    Ok(Seen::Running)
}

/// How job `id` ended, now: `state` is the word job-output's list shows.
fn job_end(id: &str, state: JobState, exit_code: Option<i32>, reason: Option<String>) -> JobEnd {
    JobEnd {
        id: id.to_owned(),
        state,
        exit_code,
        reason,
        ended_ms: chrono::Utc::now().timestamp_millis(),
    }
}

/// The ledger row gets the job's end with the two ends of each stream, read from the machine
/// while it is still there.
async fn record_end(job: &Job, run: Run, ledger: &Ledger) {
    write_end(job, run, ledger).await;
    job.recorded.send_replace(true);
}

async fn write_end(job: &Job, run: Run, ledger: &Ledger) {
    if !matches!(job.state().phase, Phase::Lost(_))
        && let Some(cost) = job.cost().await
    {
        ledger.run_usage(job.run_id, &cost);
    }
    let state = job.state();
    let reason = match &state.phase {
        Phase::Lost(reason) => Some(reason.clone()),
        _ => None,
    };
    ledger.store().jobs().ended(job_end(
        &job.id,
        state.phase.stored(),
        state.phase.exit_code(),
        reason,
    ));
    let code = match &state.phase {
        Phase::Lost(reason) => {
            run.failed(&ToolError::new(
                ToolErrorKind::Fleet(ErrorKind::NotFound),
                format!("job lost: {reason}"),
            ));
            return;
        }
        Phase::Cancelled => {
            run.failed(&ToolError::cancelled());
            return;
        }
        phase => phase.exit_code().unwrap_or(-1),
    };
    let mut streams = Vec::new();
    for (stream, total) in [
        ("stdout", state.stdout_bytes),
        ("stderr", state.stderr_bytes),
    ] {
        let mut ends = ExecSpec::new(guest::ends(&job.base, stream, LEDGER_END_BYTES));
        ends.timeout_secs = Some(30);
        ends.start_if_stopped = false;
        let record = match job.fleet.exec(&job.machine, &ends).await {
            Ok(out) => stream_from_parts(total, &out.stdout, &out.stderr),
            Err(_) => stream_from_parts(total, b"", b""),
        };
        streams.push(record);
    }
    let stderr = streams.pop().unwrap_or_default();
    let stdout = streams.pop().unwrap_or_default();
    run.ended(code, state.phase == Phase::TimedOut, stdout, stderr);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_what_it_wrote() {
        let c = Cursor {
            stdout: 1024,
            stderr: 7,
        };
        assert_eq!(Cursor::parse(&c.to_string()), Some(c));
        assert_eq!(Cursor::parse("0:0"), Some(Cursor::default()));
        for bad in ["", "1", "a:b", "-1:0", "1:2:3", " 1:2"] {
            assert_eq!(Cursor::parse(bad), None, "{bad}");
        }
    }
}
