//! The file's tables, how it is opened (WAL, the tables made or brought up to date) and its
//! retention, which asks each table's own bounds.

use rusqlite::{Connection, OpenFlags};
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
CREATE TABLE IF NOT EXISTS taken_states (
    nonce TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    taken_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS spend_days (
    day TEXT PRIMARY KEY,
    period_total_micros INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS machine_owners (
    fleet TEXT NOT NULL,
    name TEXT NOT NULL,
    machine TEXT NOT NULL,
    user_id TEXT NOT NULL,
    made_ms INTEGER NOT NULL,
    made INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (fleet, name)
);
CREATE TABLE IF NOT EXISTS user_spend (
    user_id TEXT NOT NULL,
    day TEXT NOT NULL,
    settled_micros INTEGER NOT NULL,
    PRIMARY KEY (user_id, day)
);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    tool TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    arguments TEXT NOT NULL,
    started_ms INTEGER NOT NULL,
    answer TEXT,
    answer_dropped INTEGER NOT NULL DEFAULT 0,
    pid_started INTEGER
);
";

/// Opens (creating) the ledger for writing, in WAL mode, with its table.
pub(super) fn open_for_writing(path: &Path) -> Result<Connection, String> {
    // Switching a new file to WAL takes it whole, and SQLite answers a second process doing the
    // same at that moment "database is locked" at once, without the busy timeout: two servers
    // starting together then lost their store for good. Such a refusal is tried again, within
    // the busy timeout.
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    let opened = loop {
        match open_wal(path) {
            Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            opened => break opened,
        }
    };
    opened.map_err(|e| e.to_string())?.map_err(|mode| {
        format!("the file stays in journal mode {mode}: SQLite could not switch it to WAL")
    })
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
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
    // Processes starting together on a new file each make its tables and add the columns an
    // older file lacks: one at a time, or two would add the same column (the second refused).
    conn.execute_batch("BEGIN IMMEDIATE")?;
    match bring_up_to_date(&conn) {
        Ok(()) => conn.execute_batch("COMMIT")?,
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e);
        }
    }
    Ok(Ok(conn))
}

/// The tables made, and the columns an older version of this server made them without added.
fn bring_up_to_date(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(SCHEMA)?;
    // A ledger written before runs kept their cost, or before a key's answer could be dropped.
    add_column_once(conn, "runs", "usage", "TEXT")?;
    add_column_once(
        conn,
        "idempotency_keys",
        "answer_dropped",
        "INTEGER NOT NULL DEFAULT 0",
    )?;
    // Or before a key's holder was known by its start time as well as its pid.
    add_column_once(conn, "idempotency_keys", "pid_started", "INTEGER")?;
    // Or before records were each user's (OAuth sign-in): what was there is the operator's.
    add_column_once(conn, "runs", "user_id", "TEXT NOT NULL DEFAULT ''")?;
    add_column_once(conn, "jobs", "user_id", "TEXT NOT NULL DEFAULT ''")?;
    add_column_once(conn, "egress_grants", "user_id", "TEXT NOT NULL DEFAULT ''")?;
    // Or before a claimed name was held only once its machine was made: what was held then
    // was made.
    add_column_once(conn, "machine_owners", "made", "INTEGER NOT NULL DEFAULT 1")?;
    // Or before a task's answer and a cancel asked by another process were kept.
    add_column_once(conn, "tasks", "detail", "TEXT")?;
    add_column_once(conn, "tasks", "cancel_asked", "INTEGER NOT NULL DEFAULT 0")?;
    Ok(())
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

pub(super) fn open_for_reading(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(conn)
}

/// Days as milliseconds, saturating.
pub(super) fn days_ms(days: u64) -> i64 {
    i64::try_from(days.saturating_mul(86_400_000)).unwrap_or(i64::MAX)
}

pub(super) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
