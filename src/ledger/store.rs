//! The ledger's SQLite file: opening it (WAL), pruning it at start, writing batches of records
//! and reading pages of runs. Everything here blocks; it runs on the writer thread, or in
//! `spawn_blocking` for reads.

use super::{Begun, Ended, RunDetail, RunSummary, StreamRecord};
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
    stderr_tail TEXT
);
CREATE INDEX IF NOT EXISTS runs_started ON runs (started_ms);
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
    Ok(Ok(conn))
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
            conn.execute(
                "UPDATE runs SET outcome = 'interrupted', ended_ms = ?1 \
                 WHERE outcome = 'running' AND pid = ?2",
                params![now_ms, pid],
            )?;
        }
    }
    Ok(deleted)
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
         stderr_head, stderr_tail, stdout_dropped, stderr_dropped FROM runs WHERE id = ?1"
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
