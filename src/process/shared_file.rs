//! Files in the runtime directory that every server process of the user changes (the ephemeral
//! record, `machines.json`): a change is made under an exclusive lock on a lock file beside the
//! data, on the file read afresh, and the file is replaced whole (written to a file of this
//! process's own, synced, renamed), so a reader never sees half of one.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

fn open_lock(lock_path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(lock_path)
}

/// Held until dropped: no other process changes the file meanwhile.
pub fn lock_exclusive(lock_path: &Path) -> std::io::Result<File> {
    let lock = open_lock(lock_path)?;
    lock.lock()?;
    Ok(lock)
}

/// Held until dropped: no other process changes the file meanwhile, others may read.
pub fn lock_shared(lock_path: &Path) -> std::io::Result<File> {
    let lock = open_lock(lock_path)?;
    lock.lock_shared()?;
    Ok(lock)
}

/// `path` replaced by `bytes`, private to the user, synced before it takes the old one's place.
pub fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// A document every server process sharing it reads and changes, each change made under a
/// lock they all respect on the document read afresh: a file here, or a row of a database the
/// processes of several hosts share (the store's, `storeUrl`).
/// A change of a shared document's text: its new text, or `None` to leave it as it is.
pub type TextChange<'a> = dyn FnMut(Option<&str>) -> Option<String> + Send + 'a;

#[async_trait::async_trait]
pub trait SharedDocument: Send + Sync + std::fmt::Debug {
    /// The document's text, `None` when there is none yet.
    async fn read(&self) -> Result<Option<String>, String>;
    /// Runs `change` on the text under the lock; its answer, when `Some`, replaces it.
    async fn update(&self, change: &mut TextChange<'_>) -> Result<(), String>;
}
