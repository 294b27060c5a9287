//! Documents the server processes share (see migration 2): each one row, read and written whole
//! under that row's lock (`SELECT ... FOR UPDATE`) as a file of the runtime directory is under
//! its lock. Their callers are synchronous, as a file's are, so the documents are served from a
//! thread of their own with a connection of its own; a caller waits for it a bounded time, as
//! it would for a disk. The same thread answers who lives (the instances), which a change of
//! the machine record asks entry after entry.

use super::connection::connect;
use super::instances::{InstanceRow, instances_query, stale_ms};
use crate::process::shared_file::SharedDocument;
use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::time::Duration;

/// How long a caller waits for the database before the document counts as unreadable.
const WAIT: Duration = Duration::from_secs(15);

enum Request {
    Read(String, SyncSender<Result<Option<String>, String>>),
    /// Sends the text under the row's lock, then waits for the new one (`None`: no change; a
    /// dropped sender: the change failed, nothing is written) and answers once committed.
    Update {
        name: String,
        read: SyncSender<Result<Option<String>, String>>,
        changed: Receiver<Option<String>>,
        done: SyncSender<Result<(), String>>,
    },
    Instances(SyncSender<Result<Vec<InstanceRow>, String>>),
}

/// The documents' thread, as its callers reach it.
#[derive(Debug)]
pub(super) struct Documents {
    requests: Mutex<Sender<Request>>,
}

impl Documents {
    /// The thread for the database `config` names; a `config` that names none (a storeUrl
    /// that does not parse) gets one that answers every request with why.
    pub(super) fn new(config: Result<tokio_postgres::Config, String>) -> Documents {
        let (requests, received) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("smol-mcp-documents".into())
            .spawn(move || serve(config, received));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "could not start the shared documents' thread");
        }
        Documents {
            requests: Mutex::new(requests),
        }
    }

    fn send(&self, request: Request) -> Result<(), String> {
        self.requests
            .lock()
            .map_err(|_| "the documents' queue was poisoned".to_owned())?
            .send(request)
            .map_err(|_| "the documents' thread has ended".to_owned())
    }

    pub(super) fn read(&self, name: &str) -> Result<Option<String>, String> {
        let (answer, answered) = mpsc::sync_channel(1);
        self.send(Request::Read(name.to_owned(), answer))?;
        wait(&answered)
    }

    pub(super) fn update(
        &self,
        name: &str,
        change: &mut dyn FnMut(Option<&str>) -> Option<String>,
    ) -> Result<(), String> {
        let (read, text) = mpsc::sync_channel(1);
        let (changed, decision) = mpsc::sync_channel(1);
        let (done, committed) = mpsc::sync_channel(1);
        self.send(Request::Update {
            name: name.to_owned(),
            read,
            changed: decision,
            done,
        })?;
        let text = wait(&text)?;
        let _ = changed.send(change(text.as_deref()));
        wait(&committed)
    }

    pub(super) fn instances(&self) -> Result<Vec<InstanceRow>, String> {
        let (answer, answered) = mpsc::sync_channel(1);
        self.send(Request::Instances(answer))?;
        wait(&answered)
    }
}

/// One named document, for the process floor.
#[derive(Debug)]
pub(super) struct DocumentBook {
    pub(super) documents: std::sync::Arc<Documents>,
    pub(super) name: &'static str,
}

impl SharedDocument for DocumentBook {
    fn read(&self) -> Result<Option<String>, String> {
        self.documents.read(self.name)
    }

    fn update(&self, change: &mut dyn FnMut(Option<&str>) -> Option<String>) -> Result<(), String> {
        self.documents.update(self.name, change)
    }
}

fn wait<T>(answered: &Receiver<Result<T, String>>) -> Result<T, String> {
    match answered.recv_timeout(WAIT) {
        Ok(answer) => answer,
        Err(mpsc::RecvTimeoutError::Timeout) => Err(format!(
            "the database did not answer within {} s",
            WAIT.as_secs()
        )),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err("the documents' thread has ended".to_owned())
        }
    }
}

/// The thread: one connection, made (again) when needed, and each request in turn.
fn serve(config: Result<tokio_postgres::Config, String>, requests: Receiver<Request>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "the shared documents' thread has no runtime");
            return;
        }
    };
    runtime.block_on(async move {
        let mut client: Option<tokio_postgres::Client> = None;
        while let Ok(request) = requests.recv() {
            let config = match &config {
                Ok(config) => config,
                Err(why) => {
                    refuse(request, why);
                    continue;
                }
            };
            if client
                .as_ref()
                .is_none_or(tokio_postgres::Client::is_closed)
            {
                client = connect(config).await.ok();
            }
            let Some(db) = client.as_mut() else {
                refuse(request, "could not connect to the database");
                continue;
            };
            match request {
                Request::Read(name, answer) => {
                    let text = db
                        .query_opt("SELECT body FROM documents WHERE name = $1", &[&name])
                        .await
                        // A row made for a first change that wrote nothing holds ''.
                        .map(|row| row.map(|r| r.get::<_, String>(0)).filter(|b| !b.is_empty()))
                        .map_err(|e| e.to_string());
                    let _ = answer.send(text);
                }
                Request::Instances(answer) => {
                    let rows = db
                        .query(&instances_query(""), &[&stale_ms()])
                        .await
                        .map(|rows| rows.iter().map(InstanceRow::of).collect())
                        .map_err(|e| e.to_string());
                    let _ = answer.send(rows);
                }
                Request::Update {
                    name,
                    read,
                    changed,
                    done,
                } => {
                    let _ = done.send(update(db, &name, &read, &changed).await);
                }
            }
        }
    });
}

fn refuse(request: Request, why: &str) {
    match request {
        Request::Read(_, answer) => drop(answer.send(Err(why.to_owned()))),
        Request::Instances(answer) => drop(answer.send(Err(why.to_owned()))),
        Request::Update { read, done, .. } => {
            let _ = read.send(Err(why.to_owned()));
            let _ = done.send(Err(why.to_owned()));
        }
    }
}

async fn update(
    db: &mut tokio_postgres::Client,
    name: &str,
    read: &SyncSender<Result<Option<String>, String>>,
    changed: &Receiver<Option<String>>,
) -> Result<(), String> {
    let transaction = db.transaction().await.map_err(|e| e.to_string())?;
    // The row exists before it is locked: a first change of a document has something to lock.
    transaction
        .execute(
            "INSERT INTO documents (name, body) VALUES ($1, '') ON CONFLICT (name) DO NOTHING",
            &[&name],
        )
        .await
        .map_err(|e| e.to_string())?;
    let locked = transaction
        .query_one(
            "SELECT body FROM documents WHERE name = $1 FOR UPDATE",
            &[&name],
        )
        .await
        .map_err(|e| e.to_string());
    let current = locked.map(|row| Some(row.get::<_, String>(0)).filter(|b| !b.is_empty()));
    let failed = current.as_ref().err().cloned();
    let _ = read.send(current);
    if let Some(why) = failed {
        return Err(why);
    }
    // The caller changes the text meanwhile; the row stays locked until it answers (within its
    // own wait) or gives up, when nothing is written.
    let Ok(new_text) = changed.recv_timeout(WAIT) else {
        return Err("the change was not made".to_owned());
    };
    if let Some(new_text) = new_text {
        transaction
            .execute(
                "UPDATE documents SET body = $2 WHERE name = $1",
                &[&name, &new_text],
            )
            .await
            .map_err(|e| e.to_string())?;
    }
    transaction.commit().await.map_err(|e| e.to_string())
}
