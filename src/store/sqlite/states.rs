//! The `taken_states` table: the nonces of sealed requestStates whose answer was applied.

use crate::store::{REQUEST_STATES_MAX, Taken};
use rusqlite::{Connection, params};

/// Takes `nonce` for `user` unless it was taken, or the bound is reached; nonces older than
/// `lifetime_ms` go first (their states no longer open).
pub(super) fn take(
    conn: &Connection,
    nonce: &str,
    lifetime_ms: i64,
    user: &str,
    now_ms: i64,
) -> rusqlite::Result<Taken> {
    conn.prepare_cached("DELETE FROM taken_states WHERE taken_ms < ?1")?
        .execute([now_ms.saturating_sub(lifetime_ms)])?;
    let before = conn
        .prepare_cached("SELECT 1 FROM taken_states WHERE nonce = ?1")?
        .exists([nonce])?;
    if before {
        return Ok(Taken::Before);
    }
    let count = |sql: &str, value: &str| -> rusqlite::Result<i64> {
        conn.prepare_cached(sql)?
            .query_row([value], |row| row.get(0))
    };
    let all = count("SELECT COUNT(*) FROM taken_states WHERE ?1 = ?1", "")?;
    let users = if user.is_empty() {
        0
    } else {
        count("SELECT COUNT(*) FROM taken_states WHERE user_id = ?1", user)?
    };
    if all >= REQUEST_STATES_MAX || users >= REQUEST_STATES_MAX / 2 {
        return Ok(Taken::Full);
    }
    conn.prepare_cached("INSERT INTO taken_states (nonce, user_id, taken_ms) VALUES (?1, ?2, ?3)")?
        .execute(params![nonce, user, now_ms])?;
    Ok(Taken::Now)
}
