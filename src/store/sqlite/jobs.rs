//! The `jobs` table: background jobs while they run, so that a later process on the same
//! engine can take one over when its owner has ended.

use super::schema::days_ms;
use crate::fleet::FleetKind;
use crate::store::{JobEnd, JobRecord, ServedEngine, StoredJob};
use rusqlite::OptionalExtension;
use rusqlite::{Connection, params};

/// A job's row goes this many days after its start, ended or not: the longest a job may run
/// is far shorter, and only a running job's row is ever read.
const KEPT_DAYS: u64 = 30;

pub(super) fn prune(conn: &Connection, now_ms: i64) -> rusqlite::Result<()> {
    conn.execute(
        "DELETE FROM jobs WHERE started_ms < ?1",
        [now_ms.saturating_sub(days_ms(KEPT_DAYS))],
    )?;
    Ok(())
}

pub(super) fn insert(conn: &Connection, job: &JobRecord) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO jobs (id, run_id, pid, fleet, engine, machine, command, base, \
         started_ms, timeout_secs, state, user_id) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'running', ?11)",
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
        job.user,
    ])?;
    Ok(())
}

pub(super) fn update(conn: &Connection, end: &JobEnd) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE jobs SET state = ?2, exit_code = ?3, reason = ?4, ended_ms = ?5 WHERE id = ?1",
    )?
    .execute(params![
        end.id,
        end.state.word(),
        end.exit_code,
        end.reason,
        end.ended_ms
    ])?;
    Ok(())
}

/// A job this process took over but cannot watch (its fleet would not answer): left for the
/// next process that tries, as if its owner had just died.
pub(super) fn let_go(conn: &Connection, id: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE jobs SET pid = 0 WHERE id = ?1 AND pid = ?2")?
        .execute(params![id, std::process::id()])?;
    Ok(())
}

/// Takes over the running jobs whose process has ended and whose engine is one of `served`:
/// each is claimed by this process (only if its owner is still the dead one, so two processes
/// starting at once never both take a job), its run row with it.
pub(super) fn take_over(
    conn: &Connection,
    served: &[ServedEngine],
    alive: impl Fn(u32) -> bool,
) -> rusqlite::Result<Vec<JobRecord>> {
    let me = std::process::id();
    let candidates: Vec<(JobRecord, i64)> = conn
        .prepare_cached(&format!(
            "SELECT {STORED_COLUMNS}, pid FROM jobs WHERE state = 'running' ORDER BY started_ms"
        ))?
        .query_map([], |row| {
            let pid: i64 = row.get(13)?;
            Ok(stored(row)?.map(|job| (job.record, pid)))
        })?
        .filter_map(Result::transpose)
        .collect::<rusqlite::Result<_>>()?;
    let mut claimed = Vec::new();
    for (job, pid) in candidates {
        let owner_gone = u32::try_from(pid).map_or(true, |p| p != me && !alive(p));
        let ours_to_serve = served
            .iter()
            .any(|s| s.fleet == job.fleet && s.engine == job.engine);
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

const STORED_COLUMNS: &str = "id, run_id, fleet, engine, machine, command, base, started_ms, \
     timeout_secs, state, exit_code, reason, user_id";

/// The fleet a row names, which `as_str` wrote; a word no fleet has is refused (the row is
/// not read, and the log says so), never taken for a fleet it may not be.
fn known_fleet(id: &str, word: &str) -> Option<FleetKind> {
    let fleet = FleetKind::parse(word);
    if fleet.is_none() {
        tracing::warn!(job = %id, fleet = %word, "a stored job names no fleet this server knows; it is left unread");
    }
    fleet
}

fn stored(row: &rusqlite::Row<'_>) -> rusqlite::Result<Option<StoredJob>> {
    let fleet: String = row.get(2)?;
    let timeout: i64 = row.get(8)?;
    let id: String = row.get(0)?;
    let state: String = row.get(9)?;
    let Some(fleet) = known_fleet(&id, &fleet) else {
        return Ok(None);
    };
    let Some(state) = crate::store::records::known_job_state(&id, &state) else {
        return Ok(None);
    };
    let Ok(timeout_secs) = u64::try_from(timeout) else {
        tracing::warn!(job = %id, timeout, "a stored job's timeout is negative; it is left unread");
        return Ok(None);
    };
    Ok(Some(StoredJob {
        record: JobRecord {
            id,
            user: row.get(12)?,
            run_id: row.get(1)?,
            fleet,
            engine: row.get(3)?,
            machine: row.get(4)?,
            command: row.get(5)?,
            base: row.get(6)?,
            started_ms: row.get(7)?,
            timeout_secs,
        },
        state,
        exit_code: row.get(10)?,
        reason: row.get(11)?,
    }))
}

pub(super) fn one(conn: &Connection, id: &str) -> rusqlite::Result<Option<StoredJob>> {
    conn.prepare_cached(&format!("SELECT {STORED_COLUMNS} FROM jobs WHERE id = ?1"))?
        .query_row([id], stored)
        .optional()
        .map(Option::flatten)
}

/// The jobs of the last day another process than this one started or watches.
pub(super) fn others(
    conn: &Connection,
    now_ms: i64,
    limit: usize,
) -> rusqlite::Result<Vec<StoredJob>> {
    conn.prepare_cached(&format!(
        "SELECT {STORED_COLUMNS} FROM jobs WHERE pid <> ?1 AND started_ms > ?2 \
         ORDER BY started_ms DESC LIMIT ?3"
    ))?
    .query_map(
        params![
            std::process::id(),
            now_ms.saturating_sub(days_ms(1)),
            i64::try_from(limit).unwrap_or(i64::MAX)
        ],
        stored,
    )?
    .filter_map(Result::transpose)
    .collect()
}
