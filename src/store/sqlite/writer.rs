//! The one thread that writes the file: it takes what is queued, commits it in batches, answers
//! what was asked once its batch is committed, and keeps the retention bounds while the process
//! lives. It knows nothing of the kinds of record: each repository queues a [`Write`] holding
//! its own statement.

use super::queue::Write;
use super::{grants, jobs, keys, owners, runs, schema, tasks};
use crate::process::events::{Events, ServerEvent};
use crate::store::{RunRetention, StoreUnavailable};
use rusqlite::Connection;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64};
use std::sync::mpsc::Receiver;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The most writes committed in one transaction.
const BATCH: usize = 256;
/// How long the writer waits for more writes before it commits what it has.
const LINGER: Duration = Duration::from_millis(5);
/// A process that lives on prunes again after this many records added (runs, jobs, tasks,
/// grants, keys), so that the retention bounds hold while it runs, not only at its start: an
/// HTTP server up for weeks would otherwise keep every run and key it ever saw.
const PRUNE_EVERY: u64 = 256;

/// What the writer thread shares with the store.
pub(super) struct Shared {
    pub(super) path: PathBuf,
    pub(super) retention: RunRetention,
    pub(super) events: Events,
    /// Set once, when the file turns out unusable; reads and claims answer with it.
    pub(super) broken: OnceLock<String>,
    /// Whether the clients were told (at the first run after `broken`).
    pub(super) announced: AtomicBool,
    pub(super) dropped: AtomicU64,
    pub(super) write_failures: AtomicU64,
    /// The last run id given; ids are microseconds since the epoch, made unique and
    /// increasing (and seeded from the file, so they follow another process's).
    pub(super) last_id: AtomicI64,
    /// This store's run-id slot: its pid's, moved on for each store the process opens (a
    /// test's several "processes" in one). Two processes of one host share a slot only when
    /// their pids do modulo 64, and then make the same id only when both begin a run within
    /// the same 64 µs, where the second run goes unrecorded (its insert refused).
    pub(super) slot: i64,
    /// A connection for reads, opened on the first.
    pub(super) reader: Mutex<Option<rusqlite::Connection>>,
}

impl Shared {
    pub(super) fn report_broken(&self, reason: String) {
        if self.broken.set(reason.clone()).is_ok() {
            tracing::warn!(
                path = %self.path.display(),
                %reason,
                "the store cannot be used; commands run on unrecorded (delete the file to \
                 start a new one)"
            );
        }
    }

    /// Tells the clients, once, that a run goes unrecorded and why.
    pub(super) fn announce_if_broken(&self) {
        if let Some(reason) = self.broken.get()
            && !self.announced.swap(true, Ordering::Relaxed)
        {
            self.events.publish(
                ServerEvent::warning(
                    "ledgerUnavailable",
                    format!(
                        "the run ledger at {} cannot be used, so runs are not recorded (the \
                         tools work as before): {reason}",
                        self.path.display()
                    ),
                )
                .with("path", self.path.display().to_string())
                .with("reason", reason.clone()),
            );
        }
    }

    pub(super) fn next_id(&self) -> i64 {
        crate::store::records::next_run_id(&self.last_id, self.slot)
    }

    pub(super) fn unusable(&self, reason: String) -> StoreUnavailable {
        StoreUnavailable::Broken {
            path: self.path.display().to_string(),
            reason,
        }
    }
}

pub(super) fn write_loop(shared: &Shared, receiver: Receiver<Write>) {
    let mut conn = match open_and_prune(shared) {
        Ok(conn) => conn,
        Err(e) => {
            shared.report_broken(e);
            // Still read the queue: a run recorded while the file was being opened goes
            // unrecorded too, and the clients hear of it at the first such run. Each write
            // dropped unapplied answers whoever waits on it at once (a reader's flush, a
            // claim), with why.
            for write in receiver {
                if write.starts_run {
                    shared.announce_if_broken();
                }
            }
            return;
        }
    };
    let mut added_since_prune: u64 = 0;
    while let Ok(first) = receiver.recv() {
        // Writes that arrive within LINGER go in the same transaction: a short command's
        // start and end (and a busy client's next runs) then cost one commit, not one each,
        // which keeps the writer's CPU off the two cores the calls run on. A reader's flush is
        // written at once.
        let until = Instant::now() + LINGER;
        let mut flush_asked = first.flush;
        let mut batch = vec![first];
        while batch.len() < BATCH && !flush_asked {
            let left = until.saturating_duration_since(Instant::now());
            match receiver.recv_timeout(left) {
                Ok(write) => {
                    flush_asked = write.flush;
                    batch.push(write);
                }
                Err(_) => break,
            }
        }
        added_since_prune += batch.iter().filter(|w| w.adds_record).count() as u64;
        if let Err(e) = write_batch(&mut conn, batch) {
            let failures = shared.write_failures.fetch_add(1, Ordering::Relaxed) + 1;
            if failures.is_power_of_two() {
                tracing::warn!(error = %e, failures, path = %shared.path.display(), "could not write to the store; records lost");
            }
        }
        if added_since_prune >= PRUNE_EVERY {
            added_since_prune = 0;
            match prune(shared, &mut conn) {
                Ok(0) => {}
                Ok(pruned) => tracing::debug!(pruned, "pruned the store"),
                Err(e) => tracing::warn!(error = %e, "could not prune the store"),
            }
        }
    }
}

/// Applies a batch in one transaction and tells each write that waits whether it was
/// committed. A write that failed is lost, the others of its batch written; a failed commit
/// loses them all. Answers what failed first.
fn write_batch(conn: &mut Connection, batch: Vec<Write>) -> rusqlite::Result<()> {
    let tx = immediate(conn)?;
    let mut first_error = None;
    let mut waiting = Vec::new();
    for write in batch {
        let applied = (write.apply)(&tx);
        if let Some(e) = applied.error {
            first_error.get_or_insert(e);
        }
        waiting.extend(applied.after_commit);
    }
    let commit = tx.commit();
    let told = commit.as_ref().map(|_| ()).map_err(|e| e.to_string());
    for after in waiting {
        after(told.clone());
    }
    commit?;
    first_error.map_or(Ok(()), Err)
}

/// A transaction that takes the file's write lock at its start, waiting (the busy timeout)
/// while another process holds it. A deferred one reads first and asks for the lock at its
/// first write, and when another process has written meanwhile SQLite refuses it at once,
/// without waiting ("database is locked"): the batch, claims and records alike, was lost.
fn immediate(conn: &mut Connection) -> rusqlite::Result<rusqlite::Transaction<'_>> {
    conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
}

/// The retention bounds: runs by the settings, the other records by their own; in one
/// transaction (see [`immediate`]).
fn prune(shared: &Shared, conn: &mut Connection) -> rusqlite::Result<usize> {
    let tx = immediate(conn)?;
    let pruned = prune_tables(
        &tx,
        shared.retention,
        schema::now_ms(),
        crate::process::ephemeral::process_alive,
    )?;
    tx.commit()?;
    Ok(pruned)
}

/// Runs past the settings' bounds, and every other table past its own; runs a process that has
/// ended left open are marked interrupted. Answers how many runs were deleted.
pub(super) fn prune_tables(
    conn: &Connection,
    retention: RunRetention,
    now_ms: i64,
    alive: impl Fn(u32) -> bool,
) -> rusqlite::Result<usize> {
    let deleted = runs::prune(conn, retention, now_ms, alive)?;
    jobs::prune(conn, now_ms)?;
    grants::prune(conn, now_ms)?;
    tasks::prune(conn, now_ms)?;
    owners::prune(conn, &chrono::Utc::now().format("%Y-%m-%d").to_string())?;
    keys::prune(
        conn,
        now_ms,
        crate::store::KEY_ANSWERS_MAX_BYTES,
        keys::MAX_KEYS,
    )?;
    Ok(deleted)
}

fn open_and_prune(shared: &Shared) -> Result<Connection, String> {
    let mut conn = schema::open_for_writing(&shared.path)?;
    let mut prune_and_seed = || -> rusqlite::Result<usize> {
        let pruned = prune(shared, &mut conn)?;
        shared
            .last_id
            .fetch_max(runs::newest_id(&conn)?, Ordering::Relaxed);
        Ok(pruned)
    };
    let pruned = prune_and_seed().map_err(|e| e.to_string())?;
    if pruned > 0 {
        tracing::info!(pruned, "pruned the store's runs");
    }
    Ok(conn)
}
