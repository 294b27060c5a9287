//! The `machine_owners` and `user_spend` tables: which signed-in user holds which machine, and
//! what each user's deleted cloud machines cost by day.

use crate::fleet::FleetKind;
use crate::store::MachineClaim;
use rusqlite::{Connection, OptionalExtension, params};

/// Holds `name` for `user` unless someone holds it, in the writer's transaction.
pub(super) fn claim(
    conn: &Connection,
    fleet: FleetKind,
    name: &str,
    user: &str,
    now_ms: i64,
) -> rusqlite::Result<MachineClaim> {
    let inserted = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO machine_owners (fleet, name, machine, user_id, made_ms) \
             VALUES (?1, ?2, ?2, ?3, ?4)",
        )?
        .execute(params![fleet.as_str(), name, user, now_ms])?;
    if inserted == 1 {
        return Ok(MachineClaim::Claimed);
    }
    Ok(MachineClaim::Held(
        holder(conn, fleet, name)?.unwrap_or_else(|| user.to_owned()),
    ))
}

pub(super) fn alias(
    conn: &Connection,
    fleet: FleetKind,
    id: &str,
    name: &str,
    user: &str,
    now_ms: i64,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT OR IGNORE INTO machine_owners (fleet, name, machine, user_id, made_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![fleet.as_str(), id, name, user, now_ms])?;
    Ok(())
}

pub(super) fn holder(
    conn: &Connection,
    fleet: FleetKind,
    name: &str,
) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached("SELECT user_id FROM machine_owners WHERE fleet = ?1 AND name = ?2")?
        .query_row(params![fleet.as_str(), name], |row| row.get(0))
        .optional()
}

pub(super) fn held(conn: &Connection, fleet: FleetKind) -> rusqlite::Result<Vec<(String, String)>> {
    conn.prepare_cached(
        "SELECT name, user_id FROM machine_owners WHERE fleet = ?1 AND name = machine",
    )?
    .query_map([fleet.as_str()], |row| Ok((row.get(0)?, row.get(1)?)))?
    .collect()
}

pub(super) fn release(
    conn: &Connection,
    fleet: FleetKind,
    name: &str,
    user: &str,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "DELETE FROM machine_owners WHERE fleet = ?1 AND user_id = ?3 AND machine IN \
         (SELECT machine FROM machine_owners WHERE fleet = ?1 AND name = ?2 AND user_id = ?3)",
    )?
    .execute(params![fleet.as_str(), name, user])?;
    Ok(())
}

pub(super) fn held_since(
    conn: &Connection,
    fleet: FleetKind,
) -> rusqlite::Result<Vec<(String, i64)>> {
    conn.prepare_cached(
        "SELECT machine, MIN(made_ms) FROM machine_owners WHERE fleet = ?1 GROUP BY machine",
    )?
    .query_map([fleet.as_str()], |row| Ok((row.get(0)?, row.get(1)?)))?
    .collect()
}

pub(super) fn forget(conn: &Connection, fleet: FleetKind, machine: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("DELETE FROM machine_owners WHERE fleet = ?1 AND machine = ?2")?
        .execute(params![fleet.as_str(), machine])?;
    Ok(())
}

pub(super) fn settle(
    conn: &Connection,
    user: &str,
    day: &str,
    micros: i64,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO user_spend (user_id, day, settled_micros) VALUES (?1, ?2, ?3) \
         ON CONFLICT (user_id, day) DO UPDATE SET settled_micros = settled_micros + ?3",
    )?
    .execute(params![user, day, micros])?;
    Ok(())
}

pub(super) fn settled(conn: &Connection, user: &str, day: &str) -> rusqlite::Result<i64> {
    conn.prepare_cached("SELECT settled_micros FROM user_spend WHERE user_id = ?1 AND day = ?2")?
        .query_row(params![user, day], |row| row.get(0))
        .optional()
        .map(Option::unwrap_or_default)
}

/// Days of spend older than a year go; a user's machines stay held as long as they exist.
pub(super) fn prune(conn: &Connection, today: &str) -> rusqlite::Result<()> {
    let year_ago = chrono::NaiveDate::parse_from_str(today, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.checked_sub_days(chrono::Days::new(366)))
        .map(|d| d.format("%Y-%m-%d").to_string())
        .unwrap_or_default();
    conn.execute("DELETE FROM user_spend WHERE day < ?1", [year_ago])?;
    Ok(())
}
