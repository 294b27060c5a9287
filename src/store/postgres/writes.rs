//! What the writer applies, in the order the calls made them: records nothing waits on,
//! batched into one transaction, and the asks a limit waits on (a key's claim, a day's spend
//! mark, the take-over of a dead process's jobs), each its own statement after the records
//! queued before it, answered once committed.

use super::connection::Prepared;
use super::schema::NOW_MS;
use crate::store::{
    EgressGrant, JobEnd, JobRecord, KeyClaim, KeyRecord, NewRun, RunEnd, ServedEngine,
    SpendReading, TaskRecord,
};
use tokio::sync::oneshot;
use tokio_postgres::{GenericClient, Row};

/// How long a key names its call: a repeat after this runs as a new call (as in the file).
const KEY_LIFETIME_MS: i64 = 24 * 3_600_000;

/// One thing for the writer to do.
pub(super) enum Write {
    RunStart(i64, Box<NewRun>),
    RunEnd(Box<RunEnd>),
    RunCost(i64, String),
    JobStarted(Box<JobRecord>),
    JobEnded(JobEnd),
    JobLetGo(String),
    TaskCreated(TaskRecord),
    TaskEnded(String, &'static str),
    TaskAnswered(String, String),
    TaskCancelAsked(String),
    Grant(EgressGrant),
    KeyAnswered(String, String),
    KeyReleased(String),
    /// Answered once everything queued before it is written.
    Flush(oneshot::Sender<()>),
    ClaimKey(Box<KeyRecord>, Answer<KeyClaim>),
    DayMark(SpendReading, Answer<i64>),
    TakeOver(Vec<ServedEngine>, Answer<Vec<JobRecord>>),
}

pub(super) type Answer<T> = oneshot::Sender<Result<T, String>>;

impl Write {
    /// Whether this is a record that can share the batch's transaction.
    pub(super) fn is_record(&self) -> bool {
        !matches!(
            self,
            Write::Flush(_) | Write::ClaimKey(..) | Write::DayMark(..) | Write::TakeOver(..)
        )
    }
}

/// Who writes: this process as the database knows it.
pub(super) struct Writer<'a> {
    pub instance: &'a str,
    pub pid: i64,
}

impl Writer<'_> {
    /// Applies one record inside the batch's transaction.
    pub(super) async fn record(
        &self,
        db: &Prepared<'_, impl GenericClient + Sync>,
        write: &Write,
    ) -> Result<(), tokio_postgres::Error> {
        match write {
            Write::RunStart(id, run) => {
                let env_names = serde_json::Value::from(run.env_names.clone()).to_string();
                db.execute(
                    "INSERT INTO runs (id, owner, pid, tool, fleet, machine, command_kind, \
                     command, workdir, env_names, started_ms, outcome, user_id) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'running', $12) \
                     ON CONFLICT (id) DO NOTHING",
                    &[
                        id,
                        &self.instance,
                        &i64::from(run.pid),
                        &run.tool,
                        &run.fleet.as_str(),
                        &run.machine,
                        &run.command.kind(),
                        &run.command.text(),
                        &run.workdir,
                        &env_names,
                        &run.started_ms,
                        &run.user,
                    ],
                )
                .await?;
            }
            Write::RunEnd(end) => {
                let (out, err) = (end.stdout.as_ref(), end.stderr.as_ref());
                db.execute(
                    "UPDATE runs SET ended_ms = $2, outcome = $3, exit_code = $4, \
                     timed_out = $5, error = $6, stdout_bytes = $7, stdout_head = $8, \
                     stdout_tail = $9, stderr_bytes = $10, stderr_head = $11, \
                     stderr_tail = $12, stdout_dropped = $13, stderr_dropped = $14 \
                     WHERE id = $1 AND owner = $15",
                    &[
                        &end.id,
                        &end.ended_ms,
                        &end.outcome.as_str(),
                        &end.exit_code,
                        &end.timed_out,
                        &end.error,
                        &out.map(|s| s.bytes),
                        &out.map(|s| s.head.as_str()),
                        &out.map(|s| s.tail.as_str()),
                        &err.map(|s| s.bytes),
                        &err.map(|s| s.head.as_str()),
                        &err.map(|s| s.tail.as_str()),
                        &out.map(|s| s.dropped),
                        &err.map(|s| s.dropped),
                        &self.instance,
                    ],
                )
                .await?;
            }
            // A run's end and cost are its owner's to write (the id and the instance): a process
            // whose slot another took after it fell silent cannot write onto that one's run.
            Write::RunCost(id, usage) => {
                db.execute(
                    "UPDATE runs SET usage = $2 WHERE id = $1 AND owner = $3",
                    &[id, usage, &self.instance],
                )
                .await?;
            }
            Write::JobStarted(job) => {
                let timeout = i64::try_from(job.timeout_secs).unwrap_or(i64::MAX);
                db.execute(
                    "INSERT INTO jobs (id, run_id, owner, pid, fleet, engine, machine, command, \
                     base, started_ms, timeout_secs, state, user_id) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'running', $12) \
                     ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner, pid = EXCLUDED.pid, \
                     state = 'running'",
                    &[
                        &job.id,
                        &job.run_id,
                        &self.instance,
                        &self.pid,
                        &job.fleet.as_str(),
                        &job.engine,
                        &job.machine,
                        &job.command,
                        &job.base,
                        &job.started_ms,
                        &timeout,
                        &job.user,
                    ],
                )
                .await?;
            }
            Write::JobEnded(end) => {
                db.execute(
                    "UPDATE jobs SET state = $2, exit_code = $3, reason = $4, ended_ms = $5 \
                     WHERE id = $1",
                    &[
                        &end.id,
                        &end.state.word(),
                        &end.exit_code,
                        &end.reason,
                        &end.ended_ms,
                    ],
                )
                .await?;
            }
            Write::JobLetGo(id) => {
                // No instance is named '': the job is anyone's to take, as if its owner died.
                db.execute(
                    "UPDATE jobs SET owner = '' WHERE id = $1 AND owner = $2",
                    &[id, &self.instance],
                )
                .await?;
            }
            Write::TaskCreated(task) => {
                db.execute(
                    "INSERT INTO tasks (id, owner, pid, tool, created_ms, ttl_ms, outcome, \
                     client, detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
                     ON CONFLICT (id) DO UPDATE SET outcome = EXCLUDED.outcome",
                    &[
                        &task.id,
                        &self.instance,
                        &i64::from(task.pid),
                        &task.tool,
                        &task.created_ms,
                        &task.ttl_ms,
                        &task.outcome,
                        &task.client,
                        &task.detail,
                    ],
                )
                .await?;
            }
            Write::TaskAnswered(id, detail) => {
                db.execute("UPDATE tasks SET detail = $2 WHERE id = $1", &[id, detail])
                    .await?;
            }
            Write::TaskCancelAsked(id) => {
                db.execute("UPDATE tasks SET cancel_asked = true WHERE id = $1", &[id])
                    .await?;
            }
            Write::TaskEnded(id, outcome) => {
                db.execute(
                    "UPDATE tasks SET outcome = $2 WHERE id = $1",
                    &[id, outcome],
                )
                .await?;
            }
            Write::Grant(grant) => {
                for destination in &grant.destinations {
                    db.execute(
                        "INSERT INTO egress_grants (machine, fleet, engine, destination, \
                         granted_ms, user_id) VALUES ($1, $2, $3, $4, $5, $6)",
                        &[
                            &grant.machine,
                            &grant.fleet.as_str(),
                            &grant.engine,
                            destination,
                            &grant.granted_ms,
                            &grant.user,
                        ],
                    )
                    .await?;
                }
            }
            Write::KeyAnswered(key, answer) => {
                db.execute(
                    "UPDATE idempotency_keys SET answer = $2 WHERE key = $1 AND owner = $3",
                    &[key, answer, &self.instance],
                )
                .await?;
            }
            Write::KeyReleased(key) => {
                db.execute(
                    "DELETE FROM idempotency_keys WHERE key = $1 AND owner = $2 \
                     AND answer IS NULL",
                    &[key, &self.instance],
                )
                .await?;
            }
            Write::Flush(_) | Write::ClaimKey(..) | Write::DayMark(..) | Write::TakeOver(..) => {}
        }
        Ok(())
    }

    /// Claims `claim.key` unless a call of the last day holds it. The insert decides: of two
    /// processes inserting one key at once, the second waits for the first's commit and then
    /// inserts nothing, so exactly one is told `Claimed`.
    pub(super) async fn claim_key(
        &self,
        db: &Prepared<'_, impl GenericClient + Sync>,
        claim: &KeyRecord,
    ) -> Result<KeyClaim, tokio_postgres::Error> {
        db.execute(
            &format!("DELETE FROM idempotency_keys WHERE key = $1 AND started_ms < {NOW_MS} - $2"),
            &[&claim.key, &KEY_LIFETIME_MS],
        )
        .await?;
        // The holder's row may go between a failed insert and the read (its call failed and
        // released it): then the key is free again, and the insert is tried once more.
        for _ in 0..3 {
            let pid_started = claim.pid_started.and_then(|t| i64::try_from(t).ok());
            let inserted = db
                .execute(
                    "INSERT INTO idempotency_keys (key, owner, pid, pid_started, tool, \
                     fingerprint, arguments, started_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                     ON CONFLICT (key) DO NOTHING",
                    &[
                        &claim.key,
                        &self.instance,
                        &i64::from(claim.pid),
                        &pid_started,
                        &claim.tool,
                        &claim.fingerprint,
                        &claim.arguments,
                        &claim.started_ms,
                    ],
                )
                .await?;
            if inserted == 1 {
                return Ok(KeyClaim::Claimed);
            }
            if let Some(held) = key(db, &claim.key).await? {
                return Ok(KeyClaim::Taken(held));
            }
        }
        // Freed and taken three times over while this call looked: someone else's now.
        Ok(key(db, &claim.key)
            .await?
            .map_or(KeyClaim::Claimed, KeyClaim::Taken))
    }

    /// The day's spend mark: the first reading of the day by any process. The read after a
    /// failed insert is its own statement, so that it sees the row the winner committed.
    pub(super) async fn day_mark(
        &self,
        db: &Prepared<'_, impl GenericClient + Sync>,
        reading: &SpendReading,
    ) -> Result<i64, tokio_postgres::Error> {
        db.execute("DELETE FROM spend_days WHERE day < $1", &[&reading.day])
            .await?;
        db.execute(
            "INSERT INTO spend_days (day, period_total_micros) VALUES ($1, $2) \
             ON CONFLICT (day) DO NOTHING",
            &[&reading.day, &reading.period_total_micros],
        )
        .await?;
        Ok(db
            .query_one(
                "SELECT period_total_micros FROM spend_days WHERE day = $1",
                &[&reading.day],
            )
            .await?
            .get(0))
    }

    /// Takes over the running jobs whose owner is `dead` (or names no instance at all), on an
    /// engine of `served`. One statement per job set: a row another process claims first is
    /// re-read by PostgreSQL after its commit, finds a live owner and is left alone, so a job
    /// is taken once however many processes look.
    pub(super) async fn take_over(
        &self,
        db: &Prepared<'_, impl GenericClient + Sync>,
        served: &[ServedEngine],
        dead: &[String],
    ) -> Result<Vec<JobRecord>, tokio_postgres::Error> {
        let engines: Vec<String> = served
            .iter()
            .map(|s| format!("{}\n{}", s.fleet.as_str(), s.engine))
            .collect();
        let rows = db
            .query(
                "UPDATE jobs SET owner = $1, pid = $2 WHERE state = 'running' AND owner <> $1 \
                 AND (owner = ANY($3) OR NOT EXISTS \
                    (SELECT 1 FROM instances WHERE instances.id = jobs.owner)) \
                 AND fleet || E'\\n' || engine = ANY($4) \
                 RETURNING id, run_id, fleet, engine, machine, command, base, started_ms, \
                 timeout_secs, user_id",
                &[&self.instance, &self.pid, &dead, &engines],
            )
            .await?;
        let jobs: Vec<JobRecord> = rows.iter().filter_map(|row| job(row, 9)).collect();
        let runs: Vec<i64> = jobs.iter().filter_map(|j| j.run_id).collect();
        if !runs.is_empty() {
            db.execute(
                "UPDATE runs SET owner = $1, pid = $2 WHERE id = ANY($3)",
                &[&self.instance, &self.pid, &runs],
            )
            .await?;
        }
        let mut jobs = jobs;
        jobs.sort_by_key(|j| j.started_ms);
        Ok(jobs)
    }
}

/// A job as the columns `id, run_id, fleet, engine, machine, command, base, started_ms,
/// timeout_secs`, then (at `user_at`) `user_id` give it.
/// `None`, said in the log, for a row naming no fleet this server knows (`as_str` wrote every
/// one) or a negative timeout: such a row is refused, never taken for what it may not be.
pub(super) fn job(row: &Row, user_at: usize) -> Option<JobRecord> {
    let fleet: String = row.get(2);
    let timeout: i64 = row.get(8);
    let id: String = row.get(0);
    let Some(fleet) = crate::fleet::FleetKind::parse(&fleet) else {
        tracing::warn!(job = %id, %fleet, "a stored job names no fleet this server knows; it is left unread");
        return None;
    };
    let Ok(timeout_secs) = u64::try_from(timeout) else {
        tracing::warn!(job = %id, timeout, "a stored job's timeout is negative; it is left unread");
        return None;
    };
    Some(JobRecord {
        id,
        user: row.get(user_at),
        run_id: row.get(1),
        fleet,
        engine: row.get(3),
        machine: row.get(4),
        command: row.get(5),
        base: row.get(6),
        started_ms: row.get(7),
        timeout_secs,
    })
}

/// A key's record as the database keeps it.
pub(super) async fn key(
    db: &Prepared<'_, impl GenericClient + Sync>,
    key: &str,
) -> Result<Option<KeyRecord>, tokio_postgres::Error> {
    let row = db
        .query_opt(
            "SELECT key, owner, pid, pid_started, tool, fingerprint, arguments, started_ms, \
             answer, answer_dropped FROM idempotency_keys WHERE key = $1",
            &[&key],
        )
        .await?;
    Ok(row.map(|row| {
        let pid: i64 = row.get(2);
        let pid_started: Option<i64> = row.get(3);
        KeyRecord {
            key: row.get(0),
            holder: Some(row.get(1)),
            pid: u32::try_from(pid).unwrap_or(0),
            pid_started: pid_started.and_then(|t| u64::try_from(t).ok()),
            tool: row.get(4),
            fingerprint: row.get(5),
            arguments: row.get(6),
            started_ms: row.get(7),
            answer: row.get(8),
            answer_dropped: row.get(9),
        }
    }))
}
