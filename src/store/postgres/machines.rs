//! The record of ephemeral machines in the database: the same entries the runtime directory's
//! file holds, as one document in one row, read and written whole under that row's lock
//! (`SELECT ... FOR UPDATE`) as the file is under its lock. The record's callers are
//! synchronous (as the file's are), so the book talks to the database from a thread of its own
//! with a connection of its own; a caller waits for it a bounded time, as it would for a disk.

use super::connection::connect;
use super::instances::{InstanceRow, Me, instances_query, stale_ms};
use crate::process::ephemeral::{Entry, RecordBook, RecordError};
use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::time::{Duration, Instant};

/// How long a caller waits for the database before the record counts as unreadable.
const WAIT: Duration = Duration::from_secs(15);
/// How long a reading of who lives is reused: a sweep asks it of every entry.
const LIVE_FOR: Duration = Duration::from_secs(1);

enum Request {
    Entries(SyncSender<Result<Vec<Entry>, String>>),
    /// Sends the entries under the row's lock, then waits for the new ones (`None`: no change;
    /// a dropped sender: the change failed, nothing is written) and answers once committed.
    Update {
        read: SyncSender<Result<Vec<Entry>, String>>,
        changed: Receiver<Option<Vec<Entry>>>,
        done: SyncSender<Result<(), String>>,
    },
    Instances(SyncSender<Result<Vec<InstanceRow>, String>>),
}

pub struct MachineBook {
    requests: Mutex<Sender<Request>>,
    me: Me,
    live: Mutex<Option<(Instant, Vec<InstanceRow>)>>,
    /// Who lived as read before the change now being made, if one is: a change asks who
    /// lives of entry after entry, and the book's one thread, holding the row's lock for it,
    /// cannot answer a question meanwhile. `Some(None)`: it could not be read.
    during_change: Mutex<Option<Option<Vec<InstanceRow>>>>,
}

impl MachineBook {
    pub(super) fn new(config: tokio_postgres::Config, me: Me) -> MachineBook {
        let (requests, received) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("smol-mcp-machines".into())
            .spawn(move || serve(config, received));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "could not start the machine record's thread");
        }
        MachineBook {
            requests: Mutex::new(requests),
            me,
            live: Mutex::new(None),
            during_change: Mutex::new(None),
        }
    }

    fn send(&self, request: Request) -> Result<(), RecordError> {
        self.requests
            .lock()
            .map_err(|_| unreadable("its thread's queue was poisoned"))?
            .send(request)
            .map_err(|_| unreadable("its thread has ended"))
    }

    fn instances(&self) -> Result<Vec<InstanceRow>, RecordError> {
        if let Ok(live) = self.live.lock()
            && let Some((at, rows)) = live.as_ref()
            && at.elapsed() < LIVE_FOR
        {
            return Ok(rows.clone());
        }
        let (answer, answered) = mpsc::sync_channel(1);
        self.send(Request::Instances(answer))?;
        let rows = wait(&answered)?;
        if let Ok(mut live) = self.live.lock() {
            *live = Some((Instant::now(), rows.clone()));
        }
        Ok(rows)
    }
}

impl RecordBook for MachineBook {
    fn update(&self, change: &mut dyn FnMut(&mut Vec<Entry>)) -> Result<(), RecordError> {
        let live = self.instances().ok();
        let (read, entries) = mpsc::sync_channel(1);
        let (changed, decision) = mpsc::sync_channel(1);
        let (done, committed) = mpsc::sync_channel(1);
        self.send(Request::Update {
            read,
            changed: decision,
            done,
        })?;
        let mut entries = wait(&entries)?;
        let before = entries.clone();
        // One change at a time per book: its thread serves the next once this one is written.
        if let Ok(mut during) = self.during_change.lock() {
            *during = Some(live);
        }
        change(&mut entries);
        if let Ok(mut during) = self.during_change.lock() {
            *during = None;
        }
        let _ = changed.send((entries != before).then_some(entries));
        wait(&committed)
    }

    fn entries(&self) -> Result<Vec<Entry>, RecordError> {
        let (answer, answered) = mpsc::sync_channel(1);
        self.send(Request::Entries(answer))?;
        wait(&answered)
    }

    fn me(&self) -> Option<String> {
        Some(self.me.instance.clone())
    }

    /// By its instance: this process, or one heard from within the store's bound (on this
    /// host: whose process runs). An entry the file wrote (no instance) by its pid. When the
    /// database cannot say, the owner is taken to live: nothing is deleted on a guess.
    fn owner_alive(&self, entry: &Entry) -> bool {
        let Some(owner) = entry.owner.as_deref() else {
            return crate::process::ephemeral::process_alive(entry.owner_pid);
        };
        if owner == self.me.instance {
            return true;
        }
        let during = self.during_change.lock().ok().and_then(|d| d.clone());
        let rows = match during {
            Some(Some(rows)) => Ok(rows),
            Some(None) => return true,
            None => self.instances(),
        };
        match rows {
            Ok(rows) => rows
                .iter()
                .find(|row| row.id == owner)
                .is_some_and(|row| !row.dead(&self.me)),
            Err(_) => true,
        }
    }
}

fn unreadable(why: impl Into<String>) -> RecordError {
    RecordError::Io {
        path: "the machine record in the store's database".into(),
        why: why.into(),
    }
}

fn wait<T>(answered: &Receiver<Result<T, String>>) -> Result<T, RecordError> {
    match answered.recv_timeout(WAIT) {
        Ok(answer) => answer.map_err(unreadable),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(unreadable(format!(
            "the database did not answer within {} s",
            WAIT.as_secs()
        ))),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(unreadable("its thread has ended")),
    }
}

/// The book's thread: one connection, made (again) when needed, and each request in turn.
fn serve(config: tokio_postgres::Config, requests: Receiver<Request>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "the machine record's thread has no runtime");
            return;
        }
    };
    runtime.block_on(async move {
        let mut client: Option<tokio_postgres::Client> = None;
        while let Ok(request) = requests.recv() {
            if client
                .as_ref()
                .is_none_or(tokio_postgres::Client::is_closed)
            {
                client = connect(&config).await.ok();
            }
            let Some(db) = client.as_mut() else {
                refuse(request, "could not connect to the database");
                continue;
            };
            match request {
                Request::Entries(answer) => {
                    let _ = answer.send(read(db).await);
                }
                Request::Instances(answer) => {
                    let rows = db
                        .query(&instances_query(), &[&stale_ms()])
                        .await
                        .map(|rows| rows.iter().map(InstanceRow::of).collect())
                        .map_err(|e| e.to_string());
                    let _ = answer.send(rows);
                }
                Request::Update {
                    read: entries,
                    changed,
                    done,
                } => {
                    let _ = done.send(update(db, &entries, &changed).await);
                }
            }
        }
    });
}

fn refuse(request: Request, why: &str) {
    match request {
        Request::Entries(answer) => drop(answer.send(Err(why.to_owned()))),
        Request::Instances(answer) => drop(answer.send(Err(why.to_owned()))),
        Request::Update { read, done, .. } => {
            let _ = read.send(Err(why.to_owned()));
            let _ = done.send(Err(why.to_owned()));
        }
    }
}

fn decode(text: &str) -> Result<Vec<Entry>, String> {
    serde_json::from_str(text).map_err(|e| {
        format!(
            "it is not a valid machine record ({e}). Machines this server created may still be \
             running: list them, delete what is not needed, then reset the record \
             (UPDATE machine_record SET entries = '[]')"
        )
    })
}

async fn read(db: &tokio_postgres::Client) -> Result<Vec<Entry>, String> {
    let row = db
        .query_one("SELECT entries FROM machine_record WHERE id = 1", &[])
        .await
        .map_err(|e| e.to_string())?;
    decode(row.get(0))
}

async fn update(
    db: &mut tokio_postgres::Client,
    entries: &SyncSender<Result<Vec<Entry>, String>>,
    changed: &Receiver<Option<Vec<Entry>>>,
) -> Result<(), String> {
    let transaction = db.transaction().await.map_err(|e| e.to_string())?;
    let locked = transaction
        .query_one(
            "SELECT entries FROM machine_record WHERE id = 1 FOR UPDATE",
            &[],
        )
        .await
        .map_err(|e| e.to_string());
    let current = locked.and_then(|row| decode(row.get(0)));
    let failed = current.as_ref().err().cloned();
    let _ = entries.send(current);
    if let Some(why) = failed {
        return Err(why);
    }
    // The caller changes the entries meanwhile; the row stays locked until it answers (within
    // its own wait) or gives up, when nothing is written.
    let Ok(new_entries) = changed.recv_timeout(WAIT) else {
        return Err("the change was not made".to_owned());
    };
    if let Some(new_entries) = new_entries {
        let text = serde_json::to_string(&new_entries).map_err(|e| e.to_string())?;
        transaction
            .execute(
                "UPDATE machine_record SET entries = $1 WHERE id = 1",
                &[&text],
            )
            .await
            .map_err(|e| e.to_string())?;
    }
    transaction.commit().await.map_err(|e| e.to_string())
}
