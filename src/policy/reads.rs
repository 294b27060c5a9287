//! Downloads read-file paused at the end of a page, so that the next page of the same read
//! continues the same download (neither API reads a byte range).

use crate::fleet::{FileReader, FleetKind};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A read-file download paused between pages: where it is, and the stream to go on with.
#[derive(Debug)]
pub struct ParkedRead {
    pub kind: FleetKind,
    pub machine: String,
    pub path: String,
    /// Where the next page starts.
    pub offset: u64,
    /// Shared with the task that reads ahead while the last page travels to the client.
    pub reader: Arc<tokio::sync::Mutex<FileReader>>,
    /// The file's last bytes before `offset`, as many as a credential value is long less one:
    /// where a value running into the next page would start.
    pub behind: Vec<u8>,
    pub parked_at: Instant,
}

/// How long a paused download waits for its next page (each holds an open request to the
/// engine, which holds the file).
const PARKED_READ: Duration = Duration::from_secs(30);

/// The paused downloads of a process, at most `max` at once (the oldest goes first).
#[derive(Debug)]
pub struct ParkedReads {
    parked: Mutex<Vec<ParkedRead>>,
    max: usize,
}

impl ParkedReads {
    pub fn new(max: usize) -> ParkedReads {
        ParkedReads {
            parked: Mutex::new(Vec::new()),
            max,
        }
    }

    /// Drops every paused download: after a call that may change a machine, a page must not
    /// come from a download begun before it.
    pub fn forget_all(&self) {
        if let Ok(mut parked) = self.parked.lock() {
            parked.clear();
        }
    }

    /// The paused download of `path` on `machine` that stopped exactly at `offset`, if one is
    /// still fresh, and the bytes it kept from before `offset`.
    pub fn take(
        &self,
        kind: FleetKind,
        machine: &str,
        path: &str,
        offset: u64,
    ) -> Option<(Arc<tokio::sync::Mutex<FileReader>>, Vec<u8>)> {
        let mut parked = self.parked.lock().ok()?;
        parked.retain(|p| p.parked_at.elapsed() < PARKED_READ);
        let at = parked.iter().position(|p| {
            p.kind == kind && p.machine == machine && p.path == path && p.offset == offset
        })?;
        let read = parked.swap_remove(at);
        Some((read.reader, read.behind))
    }

    pub fn park(&self, read: ParkedRead) {
        if let Ok(mut parked) = self.parked.lock() {
            if parked.len() >= self.max
                && let Some(oldest) = (0..parked.len()).min_by_key(|&i| parked[i].parked_at)
            {
                parked.swap_remove(oldest);
            }
            parked.push(read);
        }
    }
}
