//! The `egress_grants` table: what the user allowed a machine to reach, listed for it later.

use super::schema::days_ms;
use crate::store::{EgressGrant, Hold};
use rusqlite::{Connection, params};

/// A grant goes this many days after it was given: a machine kept for lasting work keeps the
/// record of what it was allowed for as long as it is likely to live.
const KEPT_DAYS: u64 = 365;
/// The most grants kept, the oldest going first past it.
const MAX_GRANTS: i64 = 100_000;

pub(super) fn prune(conn: &Connection, now_ms: i64) -> rusqlite::Result<()> {
    conn.execute(
        "DELETE FROM egress_grants WHERE granted_ms < ?1",
        [now_ms.saturating_sub(days_ms(KEPT_DAYS))],
    )?;
    conn.execute(
        "DELETE FROM egress_grants WHERE rowid NOT IN \
         (SELECT rowid FROM egress_grants ORDER BY granted_ms DESC, rowid DESC LIMIT ?1)",
        [MAX_GRANTS],
    )?;
    Ok(())
}

pub(super) fn insert(conn: &Connection, grant: &EgressGrant) -> rusqlite::Result<()> {
    let mut insert = conn.prepare_cached(
        "INSERT INTO egress_grants (machine, fleet, engine, destination, granted_ms, user_id) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    for destination in &grant.destinations {
        insert.execute(params![
            grant.machine,
            grant.fleet.as_str(),
            grant.engine,
            destination,
            grant.granted_ms,
            grant.user
        ])?;
    }
    Ok(())
}

pub(super) fn for_machine(conn: &Connection, hold: &Hold) -> rusqlite::Result<Vec<String>> {
    let Hold {
        fleet,
        name: machine,
        user,
    } = hold;
    conn.prepare_cached(
        "SELECT destination FROM egress_grants WHERE machine = ?1 AND fleet = ?2 \
         AND user_id = ?3 GROUP BY destination ORDER BY MIN(granted_ms), MIN(rowid)",
    )?
    .query_map(params![machine, fleet.as_str(), user], |row| row.get(0))?
    .collect()
}
