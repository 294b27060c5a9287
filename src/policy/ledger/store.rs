//! The ledger's SQLite file: opening it (WAL), pruning it at start, writing batches of records
//! and reading pages of runs. Everything here blocks; it runs on the writer thread, or in
//! `spawn_blocking` for reads.

use super::rows::{
    Begun, Ended, JobEnd, JobRecord, KeyRecord, RunDetail, RunSummary, StreamRecord, TaskRecord,
};
use crate::fleet::FleetKind;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use std::path::Path;
use std::time::Duration;

/// How long a write waits for another process that holds the file's write lock (two servers of
/// one user share the runtime directory). It blocks only the writer thread, never a tool call.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    pid INTEGER NOT NULL,
    tool TEXT NOT NULL,
    fleet TEXT NOT NULL,
    machine TEXT NOT NULL,
    command_kind TEXT NOT NULL,
    command TEXT NOT NULL,
    workdir TEXT,
    env_names TEXT NOT NULL,
    started_ms INTEGER NOT NULL,
    ended_ms INTEGER,
    outcome TEXT NOT NULL,
    exit_code INTEGER,
    timed_out INTEGER,
    error TEXT,
    stdout_bytes INTEGER,
    stdout_dropped INTEGER,
    stdout_head TEXT,
    stdout_tail TEXT,
    stderr_bytes INTEGER,
    stderr_dropped INTEGER,
    stderr_head TEXT,
    stderr_tail TEXT,
    usage TEXT
);
CREATE INDEX IF NOT EXISTS runs_started ON runs (started_ms);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    run_id INTEGER,
    pid INTEGER NOT NULL,
    fleet TEXT NOT NULL,
    engine TEXT NOT NULL,
    machine TEXT NOT NULL,
    command TEXT NOT NULL,
    base TEXT NOT NULL,
    started_ms INTEGER NOT NULL,
    timeout_secs INTEGER NOT NULL,
    state TEXT NOT NULL,
    exit_code INTEGER,
    reason TEXT,
    ended_ms INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state);
CREATE TABLE IF NOT EXISTS egress_grants (
    machine TEXT NOT NULL,
    fleet TEXT NOT NULL,
    engine TEXT NOT NULL,
    destination TEXT NOT NULL,
    granted_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS egress_grants_machine ON egress_grants (machine);
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    tool TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    ttl_ms INTEGER NOT NULL,
    outcome TEXT
);
CREATE TABLE IF NOT EXISTS spend_days (
    day TEXT PRIMARY KEY,
    period_total_micros INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    tool TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    arguments TEXT NOT NULL,
    started_ms INTEGER NOT NULL,
    answer TEXT,
    answer_dropped INTEGER NOT NULL DEFAULT 0
);
";

/// Opens (creating) the ledger for writing, in WAL mode, with its table.
pub(super) fn open_for_writing(path: &Path) -> Result<Connection, String> {
    open_wal(path).map_err(|e| e.to_string())?.map_err(|mode| {
        format!("the file stays in journal mode {mode}: SQLite could not switch it to WAL")
    })
}

/// The connection, or the journal mode SQLite kept when it would not switch to WAL.
fn open_wal(path: &Path) -> rusqlite::Result<Result<Connection, String>> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // journal_mode answers with a row, so it needs the checking form; SQLite keeps the old mode
    // (and says so in that row) when it cannot switch.
    let mode: String =
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Ok(Err(mode));
    }
    // In WAL mode NORMAL loses at most the last commits on a power cut, never the file.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.execute_batch(SCHEMA)?;
    // A ledger written before runs kept their cost, or before a key's answer could be dropped.
    add_column_once(&conn, "runs", "usage", "TEXT")?;
    add_column_once(
        &conn,
        "idempotency_keys",
        "answer_dropped",
        "INTEGER NOT NULL DEFAULT 0",
    )?;
    Ok(Ok(conn))
}

/// Adds `column` to a table an older version of this server created without it.
fn add_column_once(
    conn: &Connection,
    table: &str,
    column: &str,
    declared: &str,
) -> rusqlite::Result<()> {
    let has_it = conn
        .prepare("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")?
        .exists([table, column])?;
    if !has_it {
        conn.execute_batch(&format!(
            "ALTER TABLE {table} ADD COLUMN {column} {declared}"
        ))?;
    }
    Ok(())
}

/// What a run cost its machine (JSON), once known.
pub(super) fn set_usage(conn: &Connection, id: i64, usage: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE runs SET usage = ?2 WHERE id = ?1")?
        .execute(params![id, usage])?;
    Ok(())
}

pub(super) fn open_for_reading(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(conn)
}

/// The newest id recorded, so that this process's ids come after it.
pub(super) fn newest_id(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("SELECT COALESCE(MAX(id), 0) FROM runs", [], |r| r.get(0))
}

/// At start: runs older than `max_days`, and all but the newest `max_runs`, go; runs a process
/// that has ended left open are marked interrupted. Answers how many runs were deleted.
pub(super) fn prune(
    conn: &Connection,
    max_runs: u64,
    max_days: u64,
    now_ms: i64,
    alive: impl Fn(u32) -> bool,
) -> rusqlite::Result<usize> {
    let days_ms = i64::try_from(max_days.saturating_mul(86_400_000)).unwrap_or(i64::MAX);
    let cutoff = now_ms.saturating_sub(days_ms);
    let keep = i64::try_from(max_runs).unwrap_or(i64::MAX);
    let mut deleted = conn.execute("DELETE FROM runs WHERE started_ms < ?1", [cutoff])?;
    deleted += conn.execute(
        "DELETE FROM runs WHERE id NOT IN (SELECT id FROM runs ORDER BY id DESC LIMIT ?1)",
        [keep],
    )?;
    let open_pids: Vec<i64> = conn
        .prepare("SELECT DISTINCT pid FROM runs WHERE outcome = 'running'")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for pid in open_pids {
        if !u32::try_from(pid).is_ok_and(&alive) {
            // A job's run goes on in its machine after its process: a later process may take
            // the job over (`claim_jobs`), so its row stays open.
            conn.execute(
                "UPDATE runs SET outcome = 'interrupted', ended_ms = ?1 \
                 WHERE outcome = 'running' AND pid = ?2 AND id NOT IN \
                 (SELECT run_id FROM jobs WHERE state = 'running' AND run_id IS NOT NULL)",
                params![now_ms, pid],
            )?;
        }
    }
    conn.execute("DELETE FROM jobs WHERE started_ms < ?1", [cutoff])?;
    conn.execute("DELETE FROM egress_grants WHERE granted_ms < ?1", [cutoff])?;
    conn.execute("DELETE FROM tasks WHERE created_ms + ttl_ms < ?1", [now_ms])?;
    prune_keys(conn, now_ms, KEY_ANSWERS_MAX_BYTES, MAX_KEYS)?;
    Ok(deleted)
}

/// What the kept answers of idempotency keys may take in all. A run-command's answer holds its
/// output (up to twice `maxOutputBytes`), so a client making keyed calls all day could
/// otherwise grow the ledger without end.
pub const KEY_ANSWERS_MAX_BYTES: i64 = 64 * 1024 * 1024;
/// How many keys are kept at most (each a few hundred bytes once its answer is dropped).
pub(super) const MAX_KEYS: i64 = 100_000;

/// Keys of calls older than a day go; past `answers_max_bytes` of answers (newest first) the
/// older answers are dropped, their keys kept as answered; past `max_keys` the oldest keys go.
pub(super) fn prune_keys(
    conn: &Connection,
    now_ms: i64,
    answers_max_bytes: i64,
    max_keys: i64,
) -> rusqlite::Result<()> {
    conn.execute(
        "DELETE FROM idempotency_keys WHERE started_ms < ?1",
        [now_ms.saturating_sub(KEY_LIFETIME_MS)],
    )?;
    conn.execute(
        "UPDATE idempotency_keys SET answer = NULL, answer_dropped = 1 WHERE key IN \
         (SELECT key FROM (SELECT key, SUM(LENGTH(CAST(answer AS BLOB))) \
            OVER (ORDER BY started_ms DESC, key) AS newer_bytes \
          FROM idempotency_keys WHERE answer IS NOT NULL) WHERE newer_bytes > ?1)",
        [answers_max_bytes],
    )?;
    conn.execute(
        "DELETE FROM idempotency_keys WHERE key NOT IN \
         (SELECT key FROM idempotency_keys ORDER BY started_ms DESC, key LIMIT ?1)",
        [max_keys],
    )?;
    Ok(())
}

pub(super) fn insert(conn: &Connection, run: &Begun) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO runs (id, pid, tool, fleet, machine, command_kind, command, workdir, \
         env_names, started_ms, outcome) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'running')",
    )?
    .execute(params![
        run.id,
        run.pid,
        run.tool,
        run.fleet,
        run.machine,
        run.command_kind,
        run.command,
        run.workdir,
        run.env_names,
        run.started_ms,
    ])?;
    Ok(())
}

pub(super) fn update(conn: &Connection, end: &Ended) -> rusqlite::Result<()> {
    let (out, err) = (&end.stdout, &end.stderr);
    conn.prepare_cached(
        "UPDATE runs SET ended_ms = ?2, outcome = ?3, exit_code = ?4, timed_out = ?5, \
         error = ?6, stdout_bytes = ?7, stdout_head = ?8, stdout_tail = ?9, stderr_bytes = ?10, \
         stderr_head = ?11, stderr_tail = ?12, stdout_dropped = ?13, stderr_dropped = ?14 \
         WHERE id = ?1",
    )?
    .execute(params![
        end.id,
        end.ended_ms,
        end.outcome,
        end.exit_code,
        end.timed_out,
        end.error,
        out.as_ref().map(|s| s.bytes),
        out.as_ref().map(|s| s.head.as_str()),
        out.as_ref().map(|s| s.tail.as_str()),
        err.as_ref().map(|s| s.bytes),
        err.as_ref().map(|s| s.head.as_str()),
        err.as_ref().map(|s| s.tail.as_str()),
        out.as_ref().map(|s| s.dropped),
        err.as_ref().map(|s| s.dropped),
    ])?;
    Ok(())
}

pub(super) fn insert_job(conn: &Connection, job: &JobRecord) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO jobs (id, run_id, pid, fleet, engine, machine, command, base, \
         started_ms, timeout_secs, state) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'running')",
    )?
    .execute(params![
        job.id,
        job.run_id,
        std::process::id(),
        job.fleet.as_str(),
        job.engine,
        job.machine,
        job.command,
        job.base,
        job.started_ms,
        i64::try_from(job.timeout_secs).unwrap_or(i64::MAX),
    ])?;
    Ok(())
}

pub(super) fn end_job(conn: &Connection, end: &JobEnd) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE jobs SET state = ?2, exit_code = ?3, reason = ?4, ended_ms = ?5 WHERE id = ?1",
    )?
    .execute(params![
        end.id,
        end.state,
        end.exit_code,
        end.reason,
        end.ended_ms
    ])?;
    Ok(())
}

/// A job this process took over but cannot watch (its fleet would not answer): left for the
/// next process that tries, as if its owner had just died.
pub(super) fn let_go_of_job(conn: &Connection, id: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE jobs SET pid = 0 WHERE id = ?1 AND pid = ?2")?
        .execute(params![id, std::process::id()])?;
    Ok(())
}

/// Takes over the running jobs whose process has ended and whose engine is one of `served`:
/// each is claimed by this process (only if its owner is still the dead one, so two processes
/// starting at once never both take a job), its run row with it.
pub(super) fn claim_jobs(
    conn: &Connection,
    served: &[(FleetKind, String)],
    alive: impl Fn(u32) -> bool,
) -> rusqlite::Result<Vec<JobRecord>> {
    let me = std::process::id();
    let candidates: Vec<(JobRecord, i64)> = conn
        .prepare_cached(
            "SELECT id, run_id, pid, fleet, engine, machine, command, base, started_ms, \
             timeout_secs FROM jobs WHERE state = 'running' ORDER BY started_ms",
        )?
        .query_map([], |row| {
            let fleet: String = row.get(3)?;
            let timeout: i64 = row.get(9)?;
            Ok((
                JobRecord {
                    id: row.get(0)?,
                    run_id: row.get(1)?,
                    // Written by `as_str`; a word no fleet has is an old local row.
                    fleet: FleetKind::parse(&fleet).unwrap_or(FleetKind::Local),
                    engine: row.get(4)?,
                    machine: row.get(5)?,
                    command: row.get(6)?,
                    base: row.get(7)?,
                    started_ms: row.get(8)?,
                    timeout_secs: u64::try_from(timeout).unwrap_or(0),
                },
                row.get::<_, i64>(2)?,
            ))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut claimed = Vec::new();
    for (job, pid) in candidates {
        let owner_gone = u32::try_from(pid).map_or(true, |p| p != me && !alive(p));
        let ours_to_serve = served
            .iter()
            .any(|(fleet, engine)| *fleet == job.fleet && *engine == job.engine);
        if !owner_gone || !ours_to_serve {
            continue;
        }
        let taken = conn
            .prepare_cached("UPDATE jobs SET pid = ?1 WHERE id = ?2 AND pid = ?3")?
            .execute(params![me, job.id, pid])?;
        if taken == 1 {
            if let Some(run) = job.run_id {
                conn.prepare_cached("UPDATE runs SET pid = ?1 WHERE id = ?2")?
                    .execute(params![me, run])?;
            }
            claimed.push(job);
        }
    }
    Ok(claimed)
}

pub(super) fn insert_grants(
    conn: &Connection,
    fleet: &str,
    engine: &str,
    machine: &str,
    destinations: &[String],
    now_ms: i64,
) -> rusqlite::Result<()> {
    let mut insert = conn.prepare_cached(
        "INSERT INTO egress_grants (machine, fleet, engine, destination, granted_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for destination in destinations {
        insert.execute(params![machine, fleet, engine, destination, now_ms])?;
    }
    Ok(())
}

/// What the user allowed `machine` (on `fleet`), oldest first, each once.
pub(super) fn grants(
    conn: &Connection,
    fleet: &str,
    machine: &str,
) -> rusqlite::Result<Vec<String>> {
    conn.prepare_cached(
        "SELECT destination FROM egress_grants WHERE machine = ?1 AND fleet = ?2 \
         GROUP BY destination ORDER BY MIN(granted_ms)",
    )?
    .query_map(params![machine, fleet], |row| row.get(0))?
    .collect()
}

pub(super) fn insert_task(conn: &Connection, task: &TaskRecord) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO tasks (id, pid, tool, created_ms, ttl_ms, outcome) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        task.id,
        task.pid,
        task.tool,
        task.created_ms,
        task.ttl_ms,
        task.outcome
    ])?;
    Ok(())
}

pub(super) fn end_task(conn: &Connection, id: &str, outcome: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE tasks SET outcome = ?2 WHERE id = ?1")?
        .execute(params![id, outcome])?;
    Ok(())
}

pub(super) fn task(conn: &Connection, id: &str) -> rusqlite::Result<Option<TaskRecord>> {
    conn.prepare_cached(
        "SELECT id, pid, tool, created_ms, ttl_ms, outcome FROM tasks WHERE id = ?1",
    )?
    .query_row([id], |row| {
        Ok(TaskRecord {
            id: row.get(0)?,
            pid: row.get(1)?,
            tool: row.get(2)?,
            created_ms: row.get(3)?,
            ttl_ms: row.get(4)?,
            outcome: row.get(5)?,
        })
    })
    .optional()
}

/// How long a key names its call: a repeat after this runs as a new call.
pub(super) const KEY_LIFETIME_MS: i64 = 24 * 3_600_000;

/// What a claim of an idempotency key found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyClaim {
    /// The key was free (or its call older than a day, or one that failed): it is now this
    /// call's.
    Claimed,
    /// Another call holds it: its record, running or answered.
    Taken(KeyRecord),
}

/// Claims `claim.key` for `claim`'s call unless a call of the last day holds it. One statement
/// decides, in the writer's transaction, so two processes sharing the file never both claim it.
pub(super) fn claim_key(
    conn: &Connection,
    claim: &KeyRecord,
    now_ms: i64,
) -> rusqlite::Result<KeyClaim> {
    conn.prepare_cached("DELETE FROM idempotency_keys WHERE key = ?1 AND started_ms < ?2")?
        .execute(params![claim.key, now_ms.saturating_sub(KEY_LIFETIME_MS)])?;
    let inserted = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO idempotency_keys (key, pid, tool, fingerprint, arguments, \
             started_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![
            claim.key,
            claim.pid,
            claim.tool,
            claim.fingerprint,
            claim.arguments,
            claim.started_ms
        ])?;
    if inserted == 1 {
        return Ok(KeyClaim::Claimed);
    }
    Ok(key(conn, &claim.key)?.map_or(KeyClaim::Claimed, KeyClaim::Taken))
}

pub(super) fn key(conn: &Connection, key: &str) -> rusqlite::Result<Option<KeyRecord>> {
    conn.prepare_cached(
        "SELECT key, pid, tool, fingerprint, arguments, started_ms, answer, answer_dropped \
         FROM idempotency_keys WHERE key = ?1",
    )?
    .query_row([key], |row| {
        Ok(KeyRecord {
            key: row.get(0)?,
            pid: row.get(1)?,
            tool: row.get(2)?,
            fingerprint: row.get(3)?,
            arguments: row.get(4)?,
            started_ms: row.get(5)?,
            answer: row.get(6)?,
            answer_dropped: row.get(7)?,
        })
    })
    .optional()
}

/// The cloud account's period cost at the first reading of UTC day `day` by any process: this
/// reading's `total` if it is the first.
pub(super) fn day_mark(conn: &Connection, day: &str, total: i64) -> rusqlite::Result<i64> {
    conn.prepare_cached("DELETE FROM spend_days WHERE day < ?1")?
        .execute([day])?;
    conn.prepare_cached(
        "INSERT OR IGNORE INTO spend_days (day, period_total_micros) VALUES (?1, ?2)",
    )?
    .execute(params![day, total])?;
    conn.prepare_cached("SELECT period_total_micros FROM spend_days WHERE day = ?1")?
        .query_row([day], |row| row.get(0))
}

/// The call holding `key` in this process succeeded with `answer`.
pub(super) fn answer_key(conn: &Connection, key: &str, answer: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE idempotency_keys SET answer = ?2 WHERE key = ?1 AND pid = ?3")?
        .execute(params![key, answer, std::process::id()])?;
    Ok(())
}

/// The call holding `key` in this process failed: the key is free for a retry.
pub(super) fn release_key(conn: &Connection, key: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "DELETE FROM idempotency_keys WHERE key = ?1 AND pid = ?2 AND answer IS NULL",
    )?
    .execute(params![key, std::process::id()])?;
    Ok(())
}

const SUMMARY_COLUMNS: &str = "id, tool, fleet, machine, command_kind, command, started_ms, \
     ended_ms, outcome, exit_code, timed_out, stdout_bytes, stderr_bytes";

fn summary(row: &rusqlite::Row<'_>) -> rusqlite::Result<RunSummary> {
    Ok(RunSummary {
        id: row.get(0)?,
        tool: row.get(1)?,
        fleet: row.get(2)?,
        machine: row.get(3)?,
        command_kind: row.get(4)?,
        command: row.get(5)?,
        started_ms: row.get(6)?,
        ended_ms: row.get(7)?,
        outcome: row.get(8)?,
        exit_code: row.get(9)?,
        timed_out: row.get(10)?,
        stdout_bytes: row.get(11)?,
        stderr_bytes: row.get(12)?,
    })
}

/// Up to `limit` runs older than `before` (all when `None`), newest first, and whether older
/// ones remain.
pub(super) fn page(
    conn: &Connection,
    before: Option<i64>,
    limit: usize,
) -> rusqlite::Result<(Vec<RunSummary>, bool)> {
    let fetch = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
    let mut runs: Vec<RunSummary> = conn
        .prepare_cached(&format!(
            "SELECT {SUMMARY_COLUMNS} FROM runs WHERE id < ?1 ORDER BY id DESC LIMIT ?2"
        ))?
        .query_map(params![before.unwrap_or(i64::MAX), fetch], summary)?
        .collect::<rusqlite::Result<_>>()?;
    let more = runs.len() > limit;
    runs.truncate(limit);
    Ok((runs, more))
}

pub(super) fn one(conn: &Connection, id: i64) -> rusqlite::Result<Option<RunDetail>> {
    conn.prepare_cached(&format!(
        "SELECT {SUMMARY_COLUMNS}, workdir, env_names, error, stdout_head, stdout_tail, \
         stderr_head, stderr_tail, stdout_dropped, stderr_dropped, usage FROM runs WHERE id = ?1"
    ))?
    .query_row([id], |row| {
        let stream = |bytes: Option<i64>,
                      head: Option<String>,
                      tail: Option<String>,
                      dropped: Option<i64>| {
            bytes.map(|bytes| StreamRecord {
                bytes,
                dropped: dropped.unwrap_or(0),
                head: head.unwrap_or_default(),
                tail: tail.unwrap_or_default(),
            })
        };
        let summary = summary(row)?;
        let stdout = stream(
            summary.stdout_bytes,
            row.get(16)?,
            row.get(17)?,
            row.get(20)?,
        );
        let stderr = stream(
            summary.stderr_bytes,
            row.get(18)?,
            row.get(19)?,
            row.get(21)?,
        );
        Ok(RunDetail {
            usage: row.get(22)?,
            workdir: row.get(13)?,
            env_names: row.get(14)?,
            error: row.get(15)?,
            stdout,
            stderr,
            summary,
        })
    })
    .optional()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_record(key: &str, started_ms: i64) -> KeyRecord {
        KeyRecord {
            key: key.to_owned(),
            pid: std::process::id(),
            tool: "run-command".to_owned(),
            fingerprint: "f".to_owned(),
            arguments: "{}".to_owned(),
            started_ms,
            answer: None,
            answer_dropped: false,
        }
    }

    #[test]
    fn keys_keep_to_a_day_a_byte_budget_of_answers_and_a_count() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_for_writing(&dir.path().join("runs.sqlite")).unwrap();
        let now = 10 * KEY_LIFETIME_MS;
        // Oldest first: one of more than a day ago, then four answered (10 bytes each), and one
        // still running.
        let keys = [
            ("stale", now - KEY_LIFETIME_MS - 1),
            ("a", now - 50),
            ("b", now - 40),
            ("c", now - 30),
            ("d", now - 20),
            ("running", now - 10),
        ];
        for (key, started) in keys {
            assert_eq!(
                claim_key(&conn, &key_record(key, started), started).unwrap(),
                KeyClaim::Claimed
            );
            if key != "running" {
                answer_key(&conn, key, &format!("\"answer-{key}\"")).unwrap();
            }
        }
        // 25 bytes keep the two newest answers (d, c); b and a are dropped, their keys kept.
        prune_keys(&conn, now, 25, 100).unwrap();
        let found = |k: &str| key(&conn, k).unwrap();
        assert_eq!(found("stale"), None);
        for k in ["d", "c"] {
            let kept = found(k).unwrap();
            assert_eq!(
                kept.answer.as_deref(),
                Some(format!("\"answer-{k}\"").as_str())
            );
            assert!(!kept.answer_dropped);
        }
        for k in ["b", "a"] {
            let dropped = found(k).unwrap();
            assert_eq!(dropped.answer, None);
            assert!(dropped.answer_dropped, "{k}");
        }
        let running = found("running").unwrap();
        assert!(running.answer.is_none() && !running.answer_dropped);
        // Three keys at most: the oldest go.
        prune_keys(&conn, now, 25, 3).unwrap();
        assert_eq!(found("a"), None);
        assert_eq!(found("b"), None);
        assert!(found("c").is_some() && found("d").is_some() && found("running").is_some());
    }

    #[test]
    fn a_ledger_from_before_dropped_answers_gains_the_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.sqlite");
        let old = Connection::open(&path).unwrap();
        old.execute_batch(
            "CREATE TABLE idempotency_keys (key TEXT PRIMARY KEY, pid INTEGER NOT NULL, \
             tool TEXT NOT NULL, fingerprint TEXT NOT NULL, arguments TEXT NOT NULL, \
             started_ms INTEGER NOT NULL, answer TEXT); \
             INSERT INTO idempotency_keys VALUES ('k', 1, 't', 'f', '{}', 5, '\"kept\"');",
        )
        .unwrap();
        drop(old);
        let conn = open_for_writing(&path).unwrap();
        let kept = key(&conn, "k").unwrap().unwrap();
        assert_eq!(kept.answer.as_deref(), Some("\"kept\""));
        assert!(!kept.answer_dropped);
    }
}
