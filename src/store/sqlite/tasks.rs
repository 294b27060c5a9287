//! The `tasks` table: MCP tasks, kept for as long as their TTL would have kept them.

use crate::store::TaskRecord;
use rusqlite::{Connection, OptionalExtension, params};

/// A task's row goes when its TTL has passed.
pub(super) fn prune(conn: &Connection, now_ms: i64) -> rusqlite::Result<()> {
    conn.execute("DELETE FROM tasks WHERE created_ms + ttl_ms < ?1", [now_ms])?;
    Ok(())
}

pub(super) fn end(conn: &Connection, id: &str, outcome: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE tasks SET outcome = ?2 WHERE id = ?1")?
        .execute(params![id, outcome])?;
    Ok(())
}

pub(super) fn insert(conn: &Connection, task: &TaskRecord) -> rusqlite::Result<()> {
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

/// The task as `tasks/get` answers it now (see [`TaskRecord::detail`]).
pub(super) fn answered(conn: &Connection, id: &str, detail: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE tasks SET detail = ?2 WHERE id = ?1")?
        .execute(params![id, detail])?;
    Ok(())
}

pub(super) fn cancel_ask(conn: &Connection, id: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE tasks SET cancel_asked = 1 WHERE id = ?1")?
        .execute([id])?;
    Ok(())
}

pub(super) fn cancel_wanted(conn: &Connection, id: &str) -> rusqlite::Result<bool> {
    conn.prepare_cached("SELECT 1 FROM tasks WHERE id = ?1 AND cancel_asked = 1")?
        .exists([id])
}

pub(super) fn one(conn: &Connection, id: &str) -> rusqlite::Result<Option<TaskRecord>> {
    conn.prepare_cached(
        "SELECT id, pid, tool, created_ms, ttl_ms, outcome, detail FROM tasks WHERE id = ?1",
    )?
    .query_row([id], |row| {
        Ok(TaskRecord {
            id: row.get(0)?,
            pid: row.get(1)?,
            holder: None,
            client: String::new(),
            detail: row.get(6)?,
            tool: row.get(2)?,
            created_ms: row.get(3)?,
            ttl_ms: row.get(4)?,
            outcome: row.get(5)?,
        })
    })
    .optional()
}
