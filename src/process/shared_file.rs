//! Files in the runtime directory that every server process of the user changes (the ephemeral
//! record, `machines.json`): a change is made under an exclusive lock on a lock file beside the
//! data, on the file read afresh, and the file is replaced whole (written to a file of this
//! process's own, synced, renamed), so a reader never sees half of one.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

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

/// A document kept in a file of the runtime directory, shared by the server processes of one
/// user there: changed under an exclusive lock on `lock_path`, replaced whole. The lock, the
/// read and the write (its fsync) are made on the blocking threads, the change between them.
#[derive(Debug, Clone)]
pub struct FileDocument {
    path: PathBuf,
    lock_path: PathBuf,
}

impl FileDocument {
    pub fn new(path: PathBuf, lock_path: PathBuf) -> FileDocument {
        FileDocument { path, lock_path }
    }
}

fn read_text(path: &Path) -> Result<Option<String>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

async fn off_the_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
}

#[async_trait::async_trait]
impl SharedDocument for FileDocument {
    /// Without the lock: the file is only ever replaced whole, so a read sees one version.
    async fn read(&self) -> Result<Option<String>, String> {
        let path = self.path.clone();
        off_the_runtime(move || read_text(&path)).await
    }

    async fn update(&self, change: &mut TextChange<'_>) -> Result<(), String> {
        let document = self.clone();
        let (lock, text) = off_the_runtime(move || {
            let lock = lock_exclusive(&document.lock_path)
                .map_err(|e| format!("{}: {e}", document.lock_path.display()))?;
            Ok((lock, read_text(&document.path)?))
        })
        .await?;
        let Some(new_text) = change(text.as_deref()) else {
            return Ok(());
        };
        let path = self.path.clone();
        off_the_runtime(move || {
            let written =
                replace(&path, new_text.as_bytes()).map_err(|e| format!("{}: {e}", path.display()));
            drop(lock);
            written
        })
        .await
    }
}
