//! The store as one SQLite file (WAL mode) in the runtime directory, shared by the server
//! processes of one user. A call never waits on the disk: a write goes on a bounded queue
//! (`try_send`) and one writer thread ([`writer`]) commits what is queued in transactions; a
//! full queue drops the write, counted and logged, or refuses what was asked
//! ([`StoreUnavailable::QueueFull`]). A file that cannot be opened (a corrupt file, a directory
//! in its place, a disk that refuses writes) is reported once, in the log when found and to the
//! clients at the first run it misses, and the tools go on without it. Each table's statements
//! and its repository are in its own file.

mod grants;
mod jobs;
mod keys;
mod owners;
mod queue;
mod repositories;
mod runs;
mod schema;
mod spend;
mod states;
mod tasks;
mod writer;

use crate::process::events::Events;
use crate::store::api::{Backend, Lifecycle, RunRetention, Sharing, StoreResult, StoreUnavailable};
use queue::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use writer::Shared;

/// The file's name in the runtime directory (with its `-wal` and `-shm` companions).
pub const FILE_NAME: &str = "runs.sqlite";
/// Writes waiting for the writer; beyond this a write is dropped rather than a call held up.
const QUEUE: usize = 1024;
/// How long a read waits for the writes queued before it to be written.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// A slot for a store's run ids: the pid's, and the next for each further store of a process.
fn run_id_slot() -> i64 {
    static OPENED: AtomicU64 = AtomicU64::new(0);
    let nth = OPENED.fetch_add(1, Ordering::Relaxed);
    i64::try_from((u64::from(std::process::id()) + nth) % 64).unwrap_or(0)
}

/// The SQLite store. Nothing is opened until first used.
pub struct SqliteStore {
    shared: Arc<Shared>,
    /// The writer's queue, made with the writer at the first write or read: SQLite and its
    /// thread cost about 2 MiB, which a session that never runs a command should not pay at
    /// start. `None` inside when the thread could not be started.
    queue: OnceLock<Option<SyncSender<Write>>>,
    /// The key this process seals requestStates with: random, and never written to the file
    /// (a secret on disk for a question that outlives no process).
    sealing_key: [u8; 32],
}

impl SqliteStore {
    pub fn new(path: PathBuf, retention: RunRetention, events: Events) -> SqliteStore {
        SqliteStore {
            shared: Arc::new(Shared {
                path,
                retention,
                events,
                broken: OnceLock::new(),
                announced: AtomicBool::new(false),
                dropped: AtomicU64::new(0),
                write_failures: AtomicU64::new(0),
                last_id: AtomicI64::new(0),
                slot: run_id_slot(),
                reader: Mutex::new(None),
            }),
            queue: OnceLock::new(),
            sealing_key: rand::random(),
        }
    }

    /// The writer's queue, starting the writer on first use; `None` when it could not be
    /// started.
    fn started(&self) -> Option<&SyncSender<Write>> {
        self.queue
            .get_or_init(|| {
                let (queue, receiver) = std::sync::mpsc::sync_channel(QUEUE);
                let shared = self.shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("smol-mcp-store".into())
                    .spawn(move || writer::write_loop(&shared, receiver));
                match spawned {
                    Ok(_) => Some(queue),
                    Err(e) => {
                        self.shared
                            .report_broken(format!("could not start its writer thread: {e}"));
                        None
                    }
                }
            })
            .as_ref()
    }

    /// Queues `write`, or says why it was not.
    fn queue(&self, write: Write) -> StoreResult<()> {
        let Some(queue) = self.started() else {
            let reason = self.shared.broken.get().cloned();
            return Err(self
                .shared
                .unusable(reason.unwrap_or_else(|| "its writer could not start".to_owned())));
        };
        match queue.try_send(write) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                let dropped = self.shared.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                // The first, and then ever more rarely: a slow disk must not flood the log.
                if dropped.is_power_of_two() {
                    tracing::warn!(
                        dropped,
                        "the store's writer is behind (a slow disk?); records dropped so far"
                    );
                }
                Err(StoreUnavailable::QueueFull { queue: QUEUE })
            }
            // Only a test's queue without a writer gets here.
            Err(TrySendError::Disconnected(_)) => {
                Err(self.shared.unusable("its writer has ended".to_owned()))
            }
        }
    }

    /// Queues a write nothing waits on; what could not be queued is counted or reported where
    /// [`SqliteStore::queue`] says.
    fn record(&self, write: Write) {
        let _ = self.queue(write);
    }

    /// Queues a write nothing waits on only if the writer runs already: an ending of something
    /// this process never recorded is not worth starting it for.
    fn record_if_started(&self, write: Write) {
        if self.queue.get().is_some() {
            self.record(write);
        }
    }

    /// Queues `statement` and waits until its batch is committed: its value, or why it could
    /// not be written.
    async fn ask<T: Send + 'static>(
        &self,
        adds_record: bool,
        statement: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> StoreResult<T> {
        let (done, answer) = tokio::sync::oneshot::channel();
        let shared = self.shared.clone();
        self.queue(Write::answered(adds_record, statement, move |written| {
            let _ = done.send(
                written
                    .map_err(|reason| shared.unusable(format!("could not write to it: {reason}"))),
            );
        }))?;
        match answer.await {
            Ok(answered) => answered,
            // The writer dropped the write unapplied: it found the file unusable.
            Err(_) => Err(self.shared.unusable(
                self.shared
                    .broken
                    .get()
                    .cloned()
                    .unwrap_or_else(|| "its writer has ended".to_owned()),
            )),
        }
    }

    async fn flush_queued(&self) {
        if self.queue.get().is_none() {
            return;
        }
        let (done, flushed) = tokio::sync::oneshot::channel();
        if self.queue(Write::flush(done)).is_ok() {
            let _ = tokio::time::timeout(FLUSH_WAIT, flushed).await;
        }
    }

    /// Runs `read` on the read connection, off the async threads, after the writes queued so
    /// far are written.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> StoreResult<T> {
        // A read is a first use too: the writer opens (and prunes) the file, then the flush
        // waits for that and for what was queued before.
        self.started();
        self.flush_queued().await;
        if let Some(reason) = self.shared.broken.get() {
            return Err(self.shared.unusable(reason.clone()));
        }
        let shared = self.shared.clone();
        let answer = tokio::task::spawn_blocking(move || {
            let mut reader = shared
                .reader
                .lock()
                .map_err(|_| "its reader was poisoned".to_owned())?;
            if reader.is_none() {
                *reader = Some(schema::open_for_reading(&shared.path).map_err(|e| e.to_string())?);
            }
            match reader.as_ref() {
                Some(conn) => read(conn).map_err(|e| e.to_string()),
                None => Err("no reader".to_owned()),
            }
        })
        .await;
        match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(reason)) => Err(self.shared.unusable(reason)),
            Err(e) => Err(self.shared.unusable(e.to_string())),
        }
    }
}

impl Backend for SqliteStore {}

impl Lifecycle for SqliteStore {
    fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
    fn flush(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(self.flush_queued())
    }
    fn ready(&self) -> futures::future::BoxFuture<'_, StoreResult<()>> {
        Box::pin(async { Ok(()) })
    }
    fn is_shared(&self) -> bool {
        false
    }
    fn sharing(&self) -> Sharing {
        Sharing::OneHost
    }
    fn sealing_key(&self) -> StoreResult<Vec<u8>> {
        Ok(self.sealing_key.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::FleetKind;
    use crate::store::Store;
    use crate::store::{KeyRecord, NewRun, RunCommand, SpendReading};
    use schema::now_ms;

    fn store_at(path: PathBuf) -> SqliteStore {
        SqliteStore::new(
            path,
            RunRetention {
                max_runs: 10,
                max_days: 30,
            },
            Events::default(),
        )
    }

    /// A store whose writer is stuck (a slow disk): nothing reads its queue of `room`.
    fn stuck(room: usize) -> (SqliteStore, std::sync::mpsc::Receiver<Write>) {
        let (queue, stuck_writer) = std::sync::mpsc::sync_channel(room);
        let store = store_at(PathBuf::from("/nonexistent/runs.sqlite"));
        let _ = store.queue.set(Some(queue));
        (store, stuck_writer)
    }

    fn run() -> NewRun {
        NewRun {
            user: String::new(),
            pid: std::process::id(),
            tool: "run-command",
            fleet: FleetKind::Local,
            machine: "box".into(),
            command: RunCommand::Shell("true".into()),
            workdir: None,
            env_names: Vec::new(),
            started_ms: now_ms(),
        }
    }

    fn reading() -> SpendReading {
        SpendReading {
            day: "2026-12-04".into(),
            period_total_micros: 10,
        }
    }

    fn claim() -> KeyRecord {
        KeyRecord::test_claim("k")
    }

    // The two ways the store can fail a limit that reads it; each is an error, never an
    // answer that lets the call through unchecked.

    #[tokio::test]
    async fn with_the_writer_behind_a_spend_mark_and_a_key_claim_are_errors() {
        let (store, _stuck_writer) = stuck(1);
        assert!(store.runs().begin(run()).is_ok());
        let behind = StoreUnavailable::QueueFull { queue: QUEUE };
        assert_eq!(store.spend().day_mark(reading()).await, Err(behind.clone()));
        assert_eq!(
            store.keys().claim(claim()).await.map(|_| 0),
            Err(behind.clone())
        );
        assert_eq!(
            behind.to_string(),
            "the store's writer is behind (1024 records wait to be written; a slow or full disk?)"
        );
    }

    #[tokio::test]
    async fn with_the_file_unusable_a_spend_mark_and_a_key_claim_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(FILE_NAME).join("in-the-way")).unwrap();
        let store = store_at(dir.path().join(FILE_NAME));
        for refused in [
            store.spend().day_mark(reading()).await.map(|_| ()),
            store.keys().claim(claim()).await.map(|_| ()),
        ] {
            match refused {
                Err(StoreUnavailable::Broken { path, reason }) => {
                    assert!(path.ends_with(FILE_NAME), "{path}");
                    assert!(reason.contains("unable to open database file"), "{reason}");
                }
                other => panic!("{other:?}"),
            }
        }
        // A run is not recorded either, and says why.
        assert!(matches!(
            store.runs().begin(run()),
            Err(StoreUnavailable::Broken { .. })
        ));
    }

    #[test]
    fn a_full_queue_drops_records_instead_of_waiting() {
        let (store, _stuck_writer) = stuck(2);
        let begun: Vec<_> = (0..10).map(|_| store.runs().begin(run())).collect();
        assert_eq!(store.dropped(), 8);
        assert_eq!(begun.iter().filter(|r| r.is_ok()).count(), 2);
    }

    #[test]
    fn ids_increase_even_within_one_microsecond() {
        let store = store_at(PathBuf::new());
        store.shared.last_id.store(i64::MAX / 2, Ordering::Relaxed);
        let first = store.shared.next_id();
        let second = store.shared.next_id();
        assert!(
            first > i64::MAX / 2 && first <= i64::MAX / 2 + 64,
            "{first}"
        );
        assert_eq!(second, first + 64, "the next in its slot");
        assert_eq!(first.rem_euclid(64), store.shared.slot);
    }

    /// Jobs and grants keep their own bounds: the run settings do not reach them.
    #[tokio::test]
    async fn the_run_settings_govern_runs_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::new(
            dir.path().join(FILE_NAME),
            RunRetention {
                max_runs: 0,
                max_days: 1,
            },
            Events::default(),
        );
        let two_days_ago = now_ms() - 2 * 86_400_000;
        store.egress_grants().add(crate::store::EgressGrant {
            user: String::new(),
            fleet: FleetKind::Local,
            engine: "serve".into(),
            machine: "box".into(),
            destinations: vec!["example.com".into()],
            granted_ms: two_days_ago,
        });
        store.flush().await;
        let conn = schema::open_for_writing(&dir.path().join(FILE_NAME)).unwrap();
        let mut old_run = run();
        old_run.started_ms = two_days_ago;
        let id = store.runs().begin(old_run).unwrap();
        store.flush().await;
        assert_eq!(
            writer::prune_tables(&conn, store.shared.retention, now_ms(), |_| true).unwrap(),
            1
        );
        assert_eq!(
            store
                .runs()
                .get(id, "")
                .await
                .unwrap()
                .map(|r| r.summary.id),
            None
        );
        assert_eq!(
            store
                .egress_grants()
                .for_machine(crate::store::Hold::new(FleetKind::Local, "box", ""))
                .await
                .unwrap(),
            ["example.com"]
        );
    }
}
