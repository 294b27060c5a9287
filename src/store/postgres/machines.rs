//! The record of ephemeral machines in the database: the entries the runtime directory's file
//! holds, as the shared document `ephemeral-machines`, and the liveness of their owners by
//! instance.

use super::documents::Documents;
use super::instances::{InstanceRow, Me};
use crate::process::ephemeral::{Entry, RecordBook, RecordError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DOCUMENT: &str = "ephemeral-machines";
/// How long a reading of who lives is reused: a sweep asks it of every entry.
const LIVE_FOR: Duration = Duration::from_secs(1);

pub struct MachineBook {
    documents: Arc<Documents>,
    me: Me,
    live: Mutex<Option<(Instant, Vec<InstanceRow>)>>,
    /// Who lived as read before the change now being made, if one is: a change asks who
    /// lives of entry after entry, and the documents' one thread, holding the row's lock for
    /// it, cannot answer meanwhile. `Some(None)`: it could not be read.
    during_change: Mutex<Option<Option<Vec<InstanceRow>>>>,
}

impl MachineBook {
    pub(super) fn new(documents: Arc<Documents>, me: Me) -> MachineBook {
        MachineBook {
            documents,
            me,
            live: Mutex::new(None),
            during_change: Mutex::new(None),
        }
    }

    fn instances(&self) -> Result<Vec<InstanceRow>, RecordError> {
        if let Ok(live) = self.live.lock()
            && let Some((at, rows)) = live.as_ref()
            && at.elapsed() < LIVE_FOR
        {
            return Ok(rows.clone());
        }
        let rows = self.documents.instances().map_err(unreadable)?;
        if let Ok(mut live) = self.live.lock() {
            *live = Some((Instant::now(), rows.clone()));
        }
        Ok(rows)
    }
}

impl RecordBook for MachineBook {
    fn update(&self, change: &mut dyn FnMut(&mut Vec<Entry>)) -> Result<(), RecordError> {
        let live = self.instances().ok();
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
                // One change at a time: the thread serves the next once this one is written.
                if let Ok(mut during) = self.during_change.lock() {
                    *during = Some(live.clone());
                }
                change(&mut entries);
                if let Ok(mut during) = self.during_change.lock() {
                    *during = None;
                }
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
            .map_err(unreadable)?;
        failed.map_or(Ok(()), |why| Err(unreadable(why)))
    }

    fn entries(&self) -> Result<Vec<Entry>, RecordError> {
        let text = self.documents.read(DOCUMENT).map_err(unreadable)?;
        decode(text.as_deref()).map_err(unreadable)
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
