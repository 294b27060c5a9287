//! The `machine_owners` and `user_spend` tables: which signed-in user holds which machine, and
//! what each user's deleted cloud machines cost by day.

use crate::fleet::FleetKind;
use crate::store::{HeldName, Hold, Holding, MachineClaim};
use rusqlite::{Connection, OptionalExtension, params};

/// Claims `name` for `user`, in the making, unless someone holds it; in the writer's
/// transaction, so the user's names read after the insert are all there were (one writer at a
/// time, in this process and any other on the file).
pub(super) fn claim(
    conn: &Connection,
    hold: &Hold,
    now_ms: i64,
    pending_after_ms: i64,
) -> rusqlite::Result<MachineClaim> {
    let Hold { fleet, name, user } = hold;
    let inserted = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO machine_owners (fleet, name, machine, user_id, made_ms, made) \
             VALUES (?1, ?2, ?2, ?3, ?4, 0)",
        )?
        .execute(params![fleet.as_str(), name, user, now_ms])?;
    if inserted == 0 {
        let holder: Option<String> = conn
            .prepare_cached("SELECT user_id FROM machine_owners WHERE fleet = ?1 AND name = ?2")?
            .query_row(params![fleet.as_str(), name], |row| row.get(0))
            .optional()?;
        return Ok(MachineClaim::Held(
            holder.unwrap_or_else(|| user.to_owned()),
        ));
    }
    let theirs = conn
        .prepare_cached(
            "SELECT name, made FROM machine_owners WHERE fleet = ?1 AND user_id = ?2 \
             AND name = machine AND (made = 1 OR made_ms >= ?3 OR name = ?4)",
        )?
        .query_map(
            params![fleet.as_str(), user, pending_after_ms, name],
            |row| {
                Ok(HeldName {
                    name: row.get(0)?,
                    made: row.get(1)?,
                })
            },
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(MachineClaim::Claimed { theirs })
}

/// The machine `name` was made for `user`: held as made (taken over if the claim was let go
/// meanwhile by a racing create of the same user's that failed).
pub(super) fn made(conn: &Connection, hold: &Hold, now_ms: i64) -> rusqlite::Result<()> {
    let Hold { fleet, name, user } = hold;
    conn.prepare_cached(
        "INSERT INTO machine_owners (fleet, name, machine, user_id, made_ms, made) \
         VALUES (?1, ?2, ?2, ?3, ?4, 1) ON CONFLICT (fleet, name) \
         DO UPDATE SET user_id = excluded.user_id, machine = excluded.machine, made = 1",
    )?
    .execute(params![fleet.as_str(), name, user, now_ms])?;
    Ok(())
}

pub(super) fn alias(conn: &Connection, id: &str, hold: &Hold, now_ms: i64) -> rusqlite::Result<()> {
    let Hold { fleet, name, user } = hold;
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
    conn.prepare_cached(
        "SELECT user_id FROM machine_owners WHERE fleet = ?1 AND name = ?2 AND made = 1",
    )?
    .query_row(params![fleet.as_str(), name], |row| row.get(0))
    .optional()
}

pub(super) fn held(conn: &Connection, fleet: FleetKind) -> rusqlite::Result<Vec<(String, String)>> {
    conn.prepare_cached(
        "SELECT name, user_id FROM machine_owners WHERE fleet = ?1 AND name = machine \
         AND made = 1",
    )?
    .query_map([fleet.as_str()], |row| Ok((row.get(0)?, row.get(1)?)))?
    .collect()
}

pub(super) fn release(conn: &Connection, hold: &Hold) -> rusqlite::Result<()> {
    let Hold { fleet, name, user } = hold;
    conn.prepare_cached(
        "DELETE FROM machine_owners WHERE fleet = ?1 AND user_id = ?3 AND machine IN \
         (SELECT machine FROM machine_owners WHERE fleet = ?1 AND name = ?2 AND user_id = ?3)",
    )?
    .execute(params![fleet.as_str(), name, user])?;
    Ok(())
}

pub(super) fn held_since(conn: &Connection, fleet: FleetKind) -> rusqlite::Result<Vec<Holding>> {
    conn.prepare_cached(
        "SELECT machine, MIN(made_ms), MAX(made) FROM machine_owners WHERE fleet = ?1 \
         GROUP BY machine",
    )?
    .query_map([fleet.as_str()], |row| {
        Ok(Holding {
            machine: row.get(0)?,
            since_ms: row.get(1)?,
            made: row.get(2)?,
        })
    })?
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
