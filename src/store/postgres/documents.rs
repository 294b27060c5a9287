//! Documents the server processes share (see migration 2): each one row, read and written whole
//! under that row's lock (`SELECT ... FOR UPDATE`) as a file of the runtime directory is under
//! its lock. One connection of their own serves them, one request at a time (a change holds
//! the row's lock while its caller changes the text); a caller awaits it a bounded time, as it
//! would a disk, and no thread waits meanwhile. The same connection answers who lives (the
//! instances), which a change of the machine record asks before it is made, and serves that
//! record's rows (`machines.rs`).

use super::connection::{Connection, connection, said};
use super::instances::{InstanceRow, instances_query, stale_ms};
use crate::process::shared_file::{SharedDocument, TextChange};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// How long a caller waits for the database before the document counts as unreadable.
const WAIT: Duration = Duration::from_secs(15);

/// The documents' connection, as its callers reach it.
#[derive(Debug)]
pub(super) struct Documents {
    /// `Err`: the storeUrl did not parse, and every request is answered with why.
    config: Result<tokio_postgres::Config, String>,
    /// Held for the length of one request: requests are served one at a time.
    client: tokio::sync::Mutex<Option<Connection>>,
    /// The store's count of statements prepared.
    prepared: Arc<AtomicU64>,
}

impl Documents {
    pub(super) fn new(
        config: Result<tokio_postgres::Config, String>,
        prepared: Arc<AtomicU64>,
    ) -> Documents {
        Documents {
            config,
            client: tokio::sync::Mutex::new(None),
            prepared,
        }
    }

    /// Runs `request` on the connection (made again when lost), within [`WAIT`].
    pub(super) async fn on_connection<T>(
        &self,
        request: impl AsyncFnOnce(&mut Connection) -> Result<T, String>,
    ) -> Result<T, String> {
        let served = async {
            let config = self.config.as_ref().map_err(Clone::clone)?;
            let mut kept = self.client.lock().await;
            if kept.as_ref().is_none_or(Connection::is_closed) {
                *kept = Some(connection(config, &self.prepared).await?);
            }
            let Some(client) = kept.as_mut() else {
                return Err("could not connect to the database".to_owned());
            };
            request(client).await
        };
        tokio::time::timeout(WAIT, served)
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "the database did not answer within {} s",
                    WAIT.as_secs()
                ))
            })
    }

    pub(super) async fn read(&self, name: &str) -> Result<Option<String>, String> {
        self.on_connection(async |db| {
            db.prepared()
                .query_opt("SELECT body FROM documents WHERE name = $1", &[&name])
                .await
                // A row made for a first change that wrote nothing holds ''.
                .map(|row| row.map(|r| r.get::<_, String>(0)).filter(|b| !b.is_empty()))
                .map_err(|e| said(&e))
        })
        .await
    }

    pub(super) async fn update(
        &self,
        name: &str,
        change: &mut TextChange<'_>,
    ) -> Result<(), String> {
        self.on_connection(async |db| update(db, name, change).await)
            .await
    }

    pub(super) async fn instances(&self) -> Result<Vec<InstanceRow>, String> {
        self.on_connection(async |db| {
            db.prepared()
                .query(&instances_query(""), &[&stale_ms()])
                .await
                .map(|rows| rows.iter().map(InstanceRow::of).collect())
                .map_err(|e| said(&e))
        })
        .await
    }
}

/// One named document, for the process floor.
#[derive(Debug)]
pub(super) struct DocumentBook {
    pub(super) documents: Arc<Documents>,
    pub(super) name: &'static str,
}

#[async_trait::async_trait]
impl SharedDocument for DocumentBook {
    async fn read(&self) -> Result<Option<String>, String> {
        self.documents.read(self.name).await
    }

    async fn update(&self, change: &mut TextChange<'_>) -> Result<(), String> {
        self.documents.update(self.name, change).await
    }
}

/// `change` on the document's text under its row's lock, written when it answers `Some`.
async fn update(
    db: &mut Connection,
    name: &str,
    change: &mut TextChange<'_>,
) -> Result<(), String> {
    let failed = |e: tokio_postgres::Error| said(&e);
    let began = db.client.transaction().await.map_err(failed)?;
    let transaction = db.statements.on(&began);
    // The row exists before it is locked: a first change of a document has something to lock.
    transaction
        .execute(
            "INSERT INTO documents (name, body) VALUES ($1, '') ON CONFLICT (name) DO NOTHING",
            &[&name],
        )
        .await
        .map_err(failed)?;
    let locked = transaction
        .query_one(
            "SELECT body FROM documents WHERE name = $1 FOR UPDATE",
            &[&name],
        )
        .await
        .map_err(failed)?;
    let current = Some(locked.get::<_, String>(0)).filter(|b| !b.is_empty());
    if let Some(new_text) = change(current.as_deref()) {
        transaction
            .execute(
                "UPDATE documents SET body = $2 WHERE name = $1",
                &[&name, &new_text],
            )
            .await
            .map_err(failed)?;
    }
    began.commit().await.map_err(failed)
}
