//! The run ledger: every command a tool runs, recorded in the store's runs
//! (`crate::store::RunRepository`), read back as the `smol://runs` resources. What a run's
//! record may hold is decided here: who ran it (tool, fleet, machine), what (argv or shell
//! text, working directory, the NAMES of the environment variables), when, how it ended, the
//! byte count of each stream and its head and tail. Never an environment variable's value: not
//! as a field, and not inside the kept output or error either, where every value the run was
//! given is replaced by its name. `ledgerMaxRuns` 0 keeps no runs, and only runs.
//!
//! A tool call never waits on the disk: a run's start and end are queued by the store.

use crate::fleet::{Command, ExecOutput, ExecSpec, FleetKind};
use crate::policy::error::{ToolError, ToolErrorKind};
use crate::process::config::Config;
use crate::process::credentials::Supplier;
use crate::process::events::Events;
use crate::process::redaction::Redactor;
pub use crate::store::KEY_ANSWERS_MAX_BYTES;
pub use crate::store::sqlite::FILE_NAME;
use crate::store::{NewRun, RunCommand, RunEnd, RunOutcome, Store};
pub use crate::store::{RunDetail, RunPage, RunSummary, StoreUnavailable, StreamRecord};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

/// How much of each end of a stream a run's record keeps.
pub const STREAM_HEAD_BYTES: usize = 2048;
pub const STREAM_TAIL_BYTES: usize = 2048;
/// A command (shell text or argv) is kept up to this many bytes,
const COMMAND_MAX_BYTES: usize = 4 * 1024;
/// the names of its environment variables up to this many (then how many more there were),
const ENV_NAMES_MAX_BYTES: usize = 1024;
/// and an error's text up to this many: with the working directory (at most 4 KiB, as the
/// arguments allow) and the two ends of each stream, a run's record holds at most about 20 KiB.
const ERROR_MAX_BYTES: usize = 2 * 1024;
/// Environment values shorter than this are not looked for in the output: "1" or "on" would
/// blank every digit and word of it, and such values are not secrets.
const REDACT_MIN_BYTES: usize = 4;
/// Runs a `smol://runs` page lists when the URI does not say, and at most.
pub const PAGE_DEFAULT: usize = 50;
pub const PAGE_MAX: usize = 500;

/// Why the ledger cannot answer a read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error(
        "the run ledger is off (ledgerMaxRuns is 0); set SMOL_MCP_LEDGER_MAX_RUNS above 0 to keep one"
    )]
    Off,
    #[error("the run ledger at {path} is not available: {reason}")]
    Unavailable { path: String, reason: String },
    /// The store works but cannot take the read now; asking again later may succeed.
    #[error("the run ledger cannot answer now: {0}")]
    Busy(StoreUnavailable),
}

impl From<StoreUnavailable> for LedgerError {
    fn from(e: StoreUnavailable) -> LedgerError {
        match e {
            StoreUnavailable::Broken { path, reason } => LedgerError::Unavailable { path, reason },
            queue @ StoreUnavailable::QueueFull { .. } => LedgerError::Busy(queue),
        }
    }
}

/// The head and tail of a whole stream, cut on character boundaries.
pub fn stream_record(bytes: &[u8]) -> StreamRecord {
    let head_end = crate::policy::output::utf8_prefix_len(bytes, STREAM_HEAD_BYTES);
    let rest = &bytes[head_end..];
    let mut tail_start = rest.len().saturating_sub(STREAM_TAIL_BYTES);
    while tail_start < rest.len() && rest[tail_start] & 0b1100_0000 == 0b1000_0000 {
        tail_start += 1;
    }
    stream_from_parts(bytes.len() as u64, &bytes[..head_end], &rest[tail_start..])
}

/// For output kept as it arrived (a job's head and tail): the total and the two ends.
pub fn stream_from_parts(total: u64, head: &[u8], tail: &[u8]) -> StreamRecord {
    let kept = (head.len() + tail.len()) as u64;
    StreamRecord {
        bytes: i64::try_from(total).unwrap_or(i64::MAX),
        dropped: i64::try_from(total.saturating_sub(kept)).unwrap_or(i64::MAX),
        head: String::from_utf8_lossy(head).into_owned(),
        tail: String::from_utf8_lossy(tail).into_owned(),
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
    /// Who ran it: only they see its record.
    pub user: String,
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
            user: String::new(),
        }
    }

    /// Run for `user` (the operator's otherwise).
    pub fn by(mut self, user: &crate::policy::user::User) -> RunStart {
        self.user = user.id().to_owned();
        self
    }
}

/// The process's run ledger over its store; cheap to clone.
#[derive(Clone)]
pub struct Ledger {
    store: Arc<dyn Store>,
    /// Whether runs are kept (`ledgerMaxRuns` above 0).
    keeps_runs: bool,
    /// Credential values, which no record may hold whatever command printed them.
    credentials: Arc<OnceLock<Arc<Supplier>>>,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Ledger {
    pub fn new(store: Arc<dyn Store>, keeps_runs: bool) -> Ledger {
        Ledger {
            store,
            keeps_runs,
            credentials: Arc::new(OnceLock::new()),
        }
    }

    /// The process's store, by its settings, and the runs kept in it as `ledgerMaxRuns` says.
    pub fn open(config: &Config, events: Events) -> Ledger {
        Ledger::new(
            crate::store::open(config, events),
            config.ledger_max_runs > 0,
        )
    }

    /// The store the runs are kept in, which keeps the other records too.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Credential values are replaced wherever a run's record would hold them, as the run's own
    /// environment values are.
    pub fn redacting(&self, credentials: Arc<Supplier>) {
        let _ = self.credentials.set(credentials);
    }

    /// Whether runs are recorded (`ledgerMaxRuns` above 0).
    pub fn keeps_runs(&self) -> bool {
        self.keeps_runs
    }

    /// Records dropped because the store's writer was behind.
    pub fn dropped(&self) -> u64 {
        self.store.dropped()
    }

    /// Waits (a bounded time) until what was queued before is written.
    pub async fn flush(&self) {
        self.store.flush().await;
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
        // A command naming a value outright (an environment value spelled out, a credential)
        // is kept without it too.
        let mut secrets: Vec<(String, String)> = start
            .env
            .iter()
            .filter(|(_, v)| v.len() >= REDACT_MIN_BYTES)
            .map(|(name, value)| (value.clone(), format!("[${name}]")))
            .collect();
        if let Some(credentials) = self.credentials.get() {
            secrets.extend(credentials.values_to_redact());
        }
        // The longest first, so that a value inside another is not replaced half-way.
        secrets.sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
        let redacted = |text: String| {
            let text = secrets.iter().fold(text, |text, (value, name)| {
                text.replace(value.as_str(), name)
            });
            cut(text, COMMAND_MAX_BYTES)
        };
        let command = match &start.command {
            Command::Shell(text) => RunCommand::Shell(redacted(text.clone())),
            Command::Argv(argv) => {
                RunCommand::Argv(redacted(Value::from(argv.clone()).to_string()))
            }
        };
        let begun = self.store.runs().begin(NewRun {
            pid: std::process::id(),
            user: start.user,
            tool: start.tool,
            fleet: start.fleet,
            machine: start.machine,
            command,
            workdir: start.workdir,
            env_names: kept_env_names(start.env.keys()),
            started_ms: now_ms(),
        });
        if let Ok(id) = begun {
            run.ledger = Some(self.clone());
            run.id = id;
            run.env_values = secrets;
        }
        run
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

    /// What run `id` cost its machine (a JSON object), measured after it ended.
    pub fn run_usage(&self, id: Option<i64>, usage: &impl serde::Serialize) {
        if let (true, Some(id), Ok(usage)) = (self.keeps_runs, id, serde_json::to_string(usage)) {
            self.store.runs().cost(id, usage);
        }
    }

    /// A page of runs, newest first: those before `before` (all when `None`), and whether older
    /// ones remain.
    /// `user`'s runs only.
    pub async fn page(
        &self,
        before: Option<i64>,
        limit: usize,
        user: &crate::policy::user::User,
    ) -> Result<RunPage, LedgerError> {
        self.runs_kept()?;
        Ok(self.store.runs().page(before, limit, user.id()).await?)
    }

    /// Run `id`, if it is `user`'s.
    pub async fn run(
        &self,
        id: i64,
        user: &crate::policy::user::User,
    ) -> Result<Option<RunDetail>, LedgerError> {
        self.runs_kept()?;
        Ok(self.store.runs().get(id, user.id()).await?)
    }

    fn runs_kept(&self) -> Result<(), LedgerError> {
        if self.keeps_runs {
            Ok(())
        } else {
            Err(LedgerError::Off)
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

    /// The credential values this process has read by now, added to the run's own: a value
    /// first read during the run (a file's credential read at a boot) is kept out of its record
    /// too, not only those known at its start.
    fn with_values_known_now(&mut self) {
        let Some(credentials) = self.ledger.as_ref().and_then(|l| l.credentials.get()) else {
            return;
        };
        let mut added = false;
        for (value, name) in credentials.values_to_redact() {
            if !self.env_values.iter().any(|(v, _)| *v == value) {
                self.env_values.push((value, name));
                added = true;
            }
        }
        if added {
            self.env_values
                .sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
        }
    }

    /// The command exited (or timed out) with this output.
    pub fn exited(mut self, output: &ExecOutput, timed_out: bool) {
        if self.ledger.is_none() {
            return;
        }
        self.with_values_known_now();
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
        let mut kept = stream_record(&redacted);
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
        self.with_values_known_now();
        let (stdout, stderr) = if self.keeps_output {
            (self.redact_stream(stdout), self.redact_stream(stderr))
        } else {
            (sizes_only(stdout), sizes_only(stderr))
        };
        self.finish(
            RunOutcome::Exited,
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
            RunOutcome::Cancelled
        } else {
            RunOutcome::Error
        };
        self.with_values_known_now();
        let message = cut(self.redact(error.to_string()), ERROR_MAX_BYTES);
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
        outcome: RunOutcome,
        exit_code: Option<i32>,
        timed_out: Option<bool>,
        error: Option<String>,
        stdout: Option<StreamRecord>,
        stderr: Option<StreamRecord>,
    ) {
        if let Some(ledger) = self.ledger.take() {
            ledger.store.runs().end(RunEnd {
                id: self.id,
                ended_ms: now_ms(),
                outcome,
                exit_code,
                timed_out,
                error,
                stdout,
                stderr,
            });
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.finish(RunOutcome::Abandoned, None, None, None, None, None);
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

/// `bytes` with every occurrence of each value replaced by its name, longest first: the search
/// the server's own output cuts use ([`Redactor`]).
fn redact_bytes(bytes: &[u8], env_values: &[(String, String)]) -> Vec<u8> {
    Redactor::new(
        env_values
            .iter()
            .map(|(value, name)| (value.as_bytes().to_vec(), name.clone())),
    )
    .bytes(bytes)
    .unwrap_or_else(|| bytes.to_vec())
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
/// The names of a run's environment, as many as fit in `ENV_NAMES_MAX_BYTES`, then a note of
/// how many more there were (no variable name has a parenthesis or a space).
fn kept_env_names<'a>(names: impl ExactSizeIterator<Item = &'a String>) -> Vec<String> {
    let total = names.len();
    let mut kept = Vec::new();
    let mut bytes = 0;
    for name in names {
        if bytes + name.len() > ENV_NAMES_MAX_BYTES {
            break;
        }
        bytes += name.len();
        kept.push(name.clone());
    }
    if kept.len() < total {
        kept.push(format!("(and {} more)", total - kept.len()));
    }
    kept
}

fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let end = crate::policy::output::utf8_prefix_len(text.as_bytes(), max);
        text.truncate(end);
        text.push_str("[...]");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;
    use crate::store::{KeyClaim, KeyRecord, RunRetention, SpendReading};

    #[test]
    fn a_stream_keeps_its_ends_whole_characters_only() {
        let mut bytes = "é".repeat(STREAM_HEAD_BYTES).into_bytes();
        bytes.extend(b"middle");
        bytes.extend("ü".repeat(STREAM_TAIL_BYTES).into_bytes());
        let kept = stream_record(&bytes);
        assert_eq!(kept.bytes, bytes.len() as i64);
        assert_eq!(
            kept.dropped as usize,
            bytes.len() - kept.head.len() - kept.tail.len()
        );
        assert!(kept.head.len() <= STREAM_HEAD_BYTES && kept.head.chars().all(|c| c == 'é'));
        assert!(kept.tail.len() <= STREAM_TAIL_BYTES && kept.tail.chars().all(|c| c == 'ü'));
        assert!(!kept.tail.is_empty());

        let short = stream_record(b"all of it");
        assert_eq!(
            (short.head.as_str(), short.tail.as_str()),
            ("all of it", "")
        );
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
            user: String::new(),
        }
    }

    fn ledger_in(dir: &std::path::Path, max_runs: u64) -> Ledger {
        let store = SqliteStore::new(
            dir.join(FILE_NAME),
            RunRetention {
                max_runs,
                max_days: 30,
            },
            crate::process::events::Events::default(),
        );
        Ledger::new(Arc::new(store), max_runs > 0)
    }

    async fn kept(ledger: &Ledger, run: Option<i64>) -> RunDetail {
        ledger
            .run(run.unwrap(), &crate::policy::user::User::operator())
            .await
            .unwrap()
            .unwrap()
    }

    /// `ledgerMaxRuns` 0 keeps no runs, and only runs: the spend marks and keys are kept.
    #[tokio::test]
    async fn no_runs_kept_still_keeps_spend_marks_and_keys() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ledger_in(dir.path(), 0);
        assert_eq!(ledger.begin(start(&[])).id(), None);
        let reading = |total| SpendReading {
            day: "2026-12-04".into(),
            period_total_micros: total,
        };
        let spend = ledger.store().spend();
        assert_eq!(spend.day_mark(reading(10)).await, Ok(10));
        assert_eq!(spend.day_mark(reading(25)).await, Ok(10));
        let claim = KeyRecord::test_claim("k");
        let keys = ledger.store().keys();
        assert_eq!(keys.claim(claim.clone()).await, Ok(KeyClaim::Claimed));
        assert!(matches!(keys.claim(claim).await, Ok(KeyClaim::Taken(_))));
        assert_eq!(
            ledger
                .page(None, 10, &crate::policy::user::User::operator())
                .await
                .err(),
            Some(LedgerError::Off)
        );
    }

    #[tokio::test]
    async fn kept_output_and_errors_name_environment_values_instead_of_holding_them() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ledger_in(dir.path(), 10);
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
        let mut spelled_out = start(&env);
        spelled_out.command = Command::Shell("echo s3cr3t-token".into());
        let exited = ledger.begin(spelled_out);
        let exited_id = exited.id();
        exited.exited(&output, false);
        let failed = ledger.begin(start(&env));
        let failed_id = failed.id();
        failed.failed(&ToolError::new(
            ToolErrorKind::Internal,
            "the engine said: bad value s3cr3t-token",
        ));
        let exited = kept(&ledger, exited_id).await;
        assert_eq!(exited.summary.command, "echo [$TOKEN]");
        let stdout = exited.stdout.unwrap();
        assert_eq!(stdout.head, "[$TOKEN] and [$TOKEN_PART] and 1");
        assert_eq!(stdout.bytes, output.stdout.len() as i64);
        assert_eq!(exited.stderr.unwrap().head, "[$TOKEN_PART]");
        assert_eq!(exited.env_names, r#"["ON","TOKEN","TOKEN_PART"]"#);
        let failed = kept(&ledger, failed_id).await;
        assert_eq!(failed.summary.outcome, "error");
        assert!(
            failed
                .error
                .as_deref()
                .unwrap()
                .ends_with("bad value [$TOKEN]"),
            "{:?}",
            failed.error
        );
        // The file and its write-ahead log: a record is in the one or the other.
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let path = entry.unwrap().path();
            let file = std::fs::read(&path).unwrap();
            assert!(
                memchr::memmem::find(&file, b"s3cr3t").is_none(),
                "a value reached {}",
                path.display()
            );
        }
    }

    /// A credential value this process first reads while a run is under way (a file's value,
    /// read at a boot) is kept out of that run's record as well.
    #[tokio::test]
    async fn a_credential_read_during_a_run_is_kept_out_of_its_record() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ledger_in(dir.path(), 10);
        let secret = dir.path().join("token");
        std::fs::write(&secret, "file-held-value-9").unwrap();
        let bindings = crate::process::credentials::parse(
            serde_json::json!([{"name": "gh", "env": "GH_TOKEN", "hosts": ["api.github.com"],
                                "fromFile": secret.display().to_string()}]),
            &std::collections::BTreeMap::new(),
        )
        .unwrap();
        let supplier = Arc::new(Supplier::new(bindings, dir.path()));
        ledger.redacting(supplier.clone());
        let run = ledger.begin(start(&[]));
        let id = run.id();
        supplier.check_value(&supplier.bindings()[0]).unwrap();
        run.exited(
            &ExecOutput {
                exit_code: 0,
                stdout: b"echoed: file-held-value-9".to_vec(),
                stderr: Vec::new(),
                stdout_cut_upstream: false,
                stderr_cut_upstream: false,
            },
            false,
        );
        let kept = kept(&ledger, id).await;
        assert_eq!(kept.stdout.unwrap().head, "echoed: [credential gh]");
    }

    #[test]
    fn a_runs_environment_names_are_kept_to_their_bound() {
        let names: Vec<String> = (0..300)
            .map(|i| format!("VARIABLE_NUMBER_{i:03}"))
            .collect();
        let kept = kept_env_names(names.iter());
        assert!(kept.iter().map(String::len).sum::<usize>() <= ENV_NAMES_MAX_BYTES + 20);
        assert_eq!(kept.len(), 54);
        assert_eq!(kept.last().unwrap(), "(and 247 more)");
        let few = ["A".to_owned(), "B".to_owned()];
        assert_eq!(kept_env_names(few.iter()), few);
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

    #[tokio::test]
    async fn a_run_dropped_unfinished_is_recorded_abandoned() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ledger_in(dir.path(), 10);
        let run = ledger.begin(start(&[]));
        let id = run.id();
        drop(run);
        assert_eq!(kept(&ledger, id).await.summary.outcome, "abandoned");
    }
}
