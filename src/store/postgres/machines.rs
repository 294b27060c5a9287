//! The record of ephemeral machines in the database: the entries the runtime directory's file
//! holds, as the shared document `ephemeral-machines`, and the liveness of their owners by
//! instance.

use super::documents::Documents;
use super::instances::{InstanceRow, Me};
use crate::process::ephemeral::{EntriesChange, Entry, Liveness, RecordBook, RecordError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DOCUMENT: &str = "ephemeral-machines";
/// How long a reading of who lives is reused: a sweep asks it of every entry.
const LIVE_FOR: Duration = Duration::from_secs(1);

pub struct MachineBook {
    documents: Arc<Documents>,
    me: Me,
    live: Mutex<Option<(Instant, Vec<InstanceRow>)>>,
}

impl MachineBook {
    pub(super) fn new(documents: Arc<Documents>, me: Me) -> MachineBook {
        MachineBook {
            documents,
            me,
            live: Mutex::new(None),
        }
    }

    async fn instances(&self) -> Result<Vec<InstanceRow>, RecordError> {
        if let Ok(live) = self.live.lock()
            && let Some((at, rows)) = live.as_ref()
            && at.elapsed() < LIVE_FOR
        {
            return Ok(rows.clone());
        }
        let rows = self.documents.instances().await.map_err(unreadable)?;
        if let Ok(mut live) = self.live.lock() {
            *live = Some((Instant::now(), rows.clone()));
        }
        Ok(rows)
    }
}

#[async_trait::async_trait]
impl RecordBook for MachineBook {
    async fn update(&self, change: &mut EntriesChange<'_>) -> Result<(), RecordError> {
        let mut failed = None;
        self.documents
            .update(DOCUMENT, &mut |text| {
                let mut entries = match decode(text) {
                    Ok(entries) => entries,
                    Err(why) => {
                        failed = Some(why);
                        return None;
                    }
                };
                let before = entries.clone();
                change(&mut entries);
                if entries == before {
                    return None;
                }
                match serde_json::to_string(&entries) {
                    Ok(text) => Some(text),
                    Err(e) => {
                        failed = Some(e.to_string());
                        None
                    }
                }
            })
            .await
            .map_err(unreadable)?;
        failed.map_or(Ok(()), |why| Err(unreadable(why)))
    }

    async fn entries(&self) -> Result<Vec<Entry>, RecordError> {
        let text = self.documents.read(DOCUMENT).await.map_err(unreadable)?;
        decode(text.as_deref()).map_err(unreadable)
    }

    fn me(&self) -> Option<String> {
        Some(self.me.instance.clone())
    }

    /// By its instance: this process, or one heard from within the store's bound (on this
    /// host: whose process runs). An entry the file wrote (no instance) by its pid. When the
    /// database cannot say, the owner is taken to live: nothing is deleted on a guess.
    async fn liveness(&self) -> Liveness {
        let rows = self.instances().await.ok();
        let me = self.me.clone();
        Box::new(move |entry: &Entry| {
            let Some(owner) = entry.owner.as_deref() else {
                return crate::process::ephemeral::process_alive(entry.owner_pid);
            };
            if owner == me.instance {
                return true;
            }
            rows.as_ref().is_none_or(|rows| {
                rows.iter()
                    .find(|row| row.id == owner)
                    .is_some_and(|row| !row.dead(&me))
            })
        })
    }
}

fn unreadable(why: impl Into<String>) -> RecordError {
    RecordError::Io {
        path: format!("the shared document {DOCUMENT} in the store's database"),
        why: why.into(),
    }
}

fn decode(text: Option<&str>) -> Result<Vec<Entry>, String> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    serde_json::from_str(text).map_err(|e| {
        format!(
            "it is not a valid machine record ({e}). Machines this server created may still be \
             running: list them, delete what is not needed, then reset the record \
             (DELETE FROM documents WHERE name = '{DOCUMENT}')"
        )
    })
}
