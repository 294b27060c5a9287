//! The `runs` table: a row per command run, kept within the settings' bounds (`ledgerMaxRuns`,
//! `ledgerMaxDays`), read back as `smol://runs`.

use super::schema::days_ms;
use crate::store::{NewRun, RunDetail, RunEnd, RunPage, RunRetention, RunSummary, StreamRecord};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

/// The newest id recorded, so that this process's ids come after it.
pub(super) fn newest_id(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("SELECT COALESCE(MAX(id), 0) FROM runs", [], |r| r.get(0))
}

/// Runs older than `max_days`, and all but the newest `max_runs`, go; runs a process that has
/// ended left open are marked interrupted. Answers how many runs were deleted.
pub(super) fn prune(
    conn: &Connection,
    retention: RunRetention,
    now_ms: i64,
    alive: impl Fn(u32) -> bool,
) -> rusqlite::Result<usize> {
    let cutoff = now_ms.saturating_sub(days_ms(retention.max_days));
    let keep = i64::try_from(retention.max_runs).unwrap_or(i64::MAX);
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
            // the job over (`take_over`), so its row stays open.
            conn.execute(
                "UPDATE runs SET outcome = 'interrupted', ended_ms = ?1 \
                 WHERE outcome = 'running' AND pid = ?2 AND id NOT IN \
                 (SELECT run_id FROM jobs WHERE state = 'running' AND run_id IS NOT NULL)",
                params![now_ms, pid],
            )?;
        }
    }
    Ok(deleted)
}

pub(super) fn insert(conn: &Connection, id: i64, run: &NewRun) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO runs (id, pid, tool, fleet, machine, command_kind, command, workdir, \
         env_names, started_ms, outcome, user_id) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'running', ?11)",
    )?
    .execute(params![
        id,
        run.pid,
        run.tool,
        run.fleet.as_str(),
        run.machine,
        run.command.kind(),
        run.command.text(),
        run.workdir,
        Value::from(run.env_names.clone()).to_string(),
        run.started_ms,
        run.user,
    ])?;
    Ok(())
}

pub(super) fn update(conn: &Connection, end: &RunEnd) -> rusqlite::Result<()> {
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
        end.outcome.as_str(),
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

pub(super) fn set_usage(conn: &Connection, id: i64, usage: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE runs SET usage = ?2 WHERE id = ?1")?
        .execute(params![id, usage])?;
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

pub(super) fn page(
    conn: &Connection,
    before: Option<i64>,
    limit: usize,
    user: &str,
) -> rusqlite::Result<RunPage> {
    let fetch = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
    let mut runs: Vec<RunSummary> = conn
        .prepare_cached(&format!(
            "SELECT {SUMMARY_COLUMNS} FROM runs WHERE id < ?1 AND user_id = ?3 \
             ORDER BY id DESC LIMIT ?2"
        ))?
        .query_map(params![before.unwrap_or(i64::MAX), fetch, user], summary)?
        .collect::<rusqlite::Result<_>>()?;
    let more = runs.len() > limit;
    runs.truncate(limit);
    Ok(RunPage { runs, more })
}

pub(super) fn one(conn: &Connection, id: i64, user: &str) -> rusqlite::Result<Option<RunDetail>> {
    conn.prepare_cached(&format!(
        "SELECT {SUMMARY_COLUMNS}, workdir, env_names, error, stdout_head, stdout_tail, \
         stderr_head, stderr_tail, stdout_dropped, stderr_dropped, usage FROM runs \
         WHERE id = ?1 AND user_id = ?2"
    ))?
    .query_row(params![id, user], |row| {
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
