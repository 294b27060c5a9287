//! The `idempotency_keys` table: which call holds a key, and its answer once it succeeded. A
//! key names its call for a day; the answers kept are bounded in bytes and the keys in number.

use crate::store::{KeyClaim, KeyRecord};
use rusqlite::{Connection, OptionalExtension, params};

/// How many keys are kept at most (each a few hundred bytes once its answer is dropped).
pub(super) const MAX_KEYS: i64 = 100_000;

/// Keys of calls older than a day go; past `answers_max_bytes` of answers (newest first) the
/// older answers are dropped, their keys kept as answered; past `max_keys` the oldest keys go.
pub(super) fn prune(
    conn: &Connection,
    now_ms: i64,
    answers_max_bytes: i64,
    max_keys: i64,
) -> rusqlite::Result<()> {
    conn.execute(
        "DELETE FROM idempotency_keys WHERE started_ms < ?1",
        [now_ms.saturating_sub(LIFETIME_MS)],
    )?;
    conn.execute(
        "UPDATE idempotency_keys SET answer = NULL, answer_dropped = 1 WHERE key IN \
         (SELECT key FROM (SELECT key, SUM(LENGTH(CAST(answer AS BLOB))) \
            OVER (ORDER BY started_ms DESC, key) AS newer_bytes \
          FROM idempotency_keys WHERE answer IS NOT NULL) WHERE newer_bytes > ?1)",
        [answers_max_bytes],
    )?;
    conn.execute(
        "DELETE FROM idempotency_keys WHERE key NOT IN \
         (SELECT key FROM idempotency_keys ORDER BY started_ms DESC, key LIMIT ?1)",
        [max_keys],
    )?;
    Ok(())
}

/// How long a key names its call: a repeat after this runs as a new call.
const LIFETIME_MS: i64 = 24 * 3_600_000;

/// Claims `claim.key` for `claim`'s call unless a call of the last day holds it. One statement
/// decides, in the writer's transaction, so two processes sharing the file never both claim it.
pub(super) fn claim(
    conn: &Connection,
    claim: &KeyRecord,
    now_ms: i64,
) -> rusqlite::Result<KeyClaim> {
    conn.prepare_cached("DELETE FROM idempotency_keys WHERE key = ?1 AND started_ms < ?2")?
        .execute(params![claim.key, now_ms.saturating_sub(LIFETIME_MS)])?;
    let inserted = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO idempotency_keys (key, pid, tool, fingerprint, arguments, \
             started_ms, pid_started) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![
            claim.key,
            claim.pid,
            claim.tool,
            claim.fingerprint,
            claim.arguments,
            claim.started_ms,
            claim.pid_started.and_then(|t| i64::try_from(t).ok()),
        ])?;
    if inserted == 1 {
        return Ok(KeyClaim::Claimed);
    }
    Ok(one(conn, &claim.key)?.map_or(KeyClaim::Claimed, KeyClaim::Taken))
}

pub(super) fn one(conn: &Connection, key: &str) -> rusqlite::Result<Option<KeyRecord>> {
    conn.prepare_cached(
        "SELECT key, pid, tool, fingerprint, arguments, started_ms, answer, answer_dropped, \
         pid_started FROM idempotency_keys WHERE key = ?1",
    )?
    .query_row([key], |row| {
        let pid_started: Option<i64> = row.get(8)?;
        Ok(KeyRecord {
            key: row.get(0)?,
            pid: row.get(1)?,
            holder: None,
            pid_started: pid_started.and_then(|t| u64::try_from(t).ok()),
            tool: row.get(2)?,
            fingerprint: row.get(3)?,
            arguments: row.get(4)?,
            started_ms: row.get(5)?,
            answer: row.get(6)?,
            answer_dropped: row.get(7)?,
        })
    })
    .optional()
}

/// The call holding `key` in this process succeeded with `answer`.
pub(super) fn answer(conn: &Connection, key: &str, answer: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE idempotency_keys SET answer = ?2 WHERE key = ?1 AND pid = ?3")?
        .execute(params![key, answer, std::process::id()])?;
    Ok(())
}

/// The call holding `key` in this process failed: the key is free for a retry.
pub(super) fn release(conn: &Connection, key: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "DELETE FROM idempotency_keys WHERE key = ?1 AND pid = ?2 AND answer IS NULL",
    )?
    .execute(params![key, std::process::id()])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_record(key: &str, started_ms: i64) -> KeyRecord {
        KeyRecord {
            key: key.to_owned(),
            pid: std::process::id(),
            holder: None,
            pid_started: None,
            tool: "run-command".to_owned(),
            fingerprint: "f".to_owned(),
            arguments: "{}".to_owned(),
            started_ms,
            answer: None,
            answer_dropped: false,
        }
    }

    #[test]
    fn keys_keep_to_a_day_a_byte_budget_of_answers_and_a_count() {
        let dir = tempfile::tempdir().unwrap();
        let conn = super::super::schema::open_for_writing(&dir.path().join("runs.sqlite")).unwrap();
        let now = 10 * LIFETIME_MS;
        // Oldest first: one of more than a day ago, then four answered (10 bytes each), and one
        // still running.
        let keys = [
            ("stale", now - LIFETIME_MS - 1),
            ("a", now - 50),
            ("b", now - 40),
            ("c", now - 30),
            ("d", now - 20),
            ("running", now - 10),
        ];
        for (key, started) in keys {
            assert_eq!(
                claim(&conn, &key_record(key, started), started).unwrap(),
                KeyClaim::Claimed
            );
            if key != "running" {
                answer(&conn, key, &format!("\"answer-{key}\"")).unwrap();
            }
        }
        // 25 bytes keep the two newest answers (d, c); b and a are dropped, their keys kept.
        prune(&conn, now, 25, 100).unwrap();
        let found = |k: &str| one(&conn, k).unwrap();
        assert_eq!(found("stale"), None);
        for k in ["d", "c"] {
            let kept = found(k).unwrap();
            assert_eq!(
                kept.answer.as_deref(),
                Some(format!("\"answer-{k}\"").as_str())
            );
            assert!(!kept.answer_dropped);
        }
        for k in ["b", "a"] {
            let dropped = found(k).unwrap();
            assert_eq!(dropped.answer, None);
            assert!(dropped.answer_dropped, "{k}");
        }
        let running = found("running").unwrap();
        assert!(running.answer.is_none() && !running.answer_dropped);
        // Three keys at most: the oldest go.
        prune(&conn, now, 25, 3).unwrap();
        assert_eq!(found("a"), None);
        assert_eq!(found("b"), None);
        assert!(found("c").is_some() && found("d").is_some() && found("running").is_some());
    }

    #[test]
    fn a_ledger_from_before_dropped_answers_gains_the_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.sqlite");
        let old = Connection::open(&path).unwrap();
        old.execute_batch(
            "CREATE TABLE idempotency_keys (key TEXT PRIMARY KEY, pid INTEGER NOT NULL, \
             tool TEXT NOT NULL, fingerprint TEXT NOT NULL, arguments TEXT NOT NULL, \
             started_ms INTEGER NOT NULL, answer TEXT); \
             INSERT INTO idempotency_keys VALUES ('k', 1, 't', 'f', '{}', 5, '\"kept\"');",
        )
        .unwrap();
        drop(old);
        let conn = super::super::schema::open_for_writing(&path).unwrap();
        let kept = one(&conn, "k").unwrap().unwrap();
        assert_eq!(kept.answer.as_deref(), Some("\"kept\""));
        assert!(!kept.answer_dropped);
    }
}
