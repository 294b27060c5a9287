//! The `spend_days` table: the cloud account's period cost at the first reading of each UTC
//! day, by any process, from which the daily spend ceiling counts. Only today's row is kept.

use crate::store::SpendReading;
use rusqlite::{Connection, params};

pub(super) fn day_mark(conn: &Connection, reading: &SpendReading) -> rusqlite::Result<i64> {
    conn.prepare_cached("DELETE FROM spend_days WHERE day < ?1")?
        .execute([&reading.day])?;
    conn.prepare_cached(
        "INSERT OR IGNORE INTO spend_days (day, period_total_micros) VALUES (?1, ?2)",
    )?
    .execute(params![reading.day, reading.period_total_micros])?;
    conn.prepare_cached("SELECT period_total_micros FROM spend_days WHERE day = ?1")?
        .query_row([&reading.day], |row| row.get(0))
}
