//! The record of ephemeral machines: which machines, on which fleet, belong to which session of
//! which process. It lives in the runtime directory, so it survives a crash of the process that
//! wrote it: the next start finds entries whose process is dead and deletes those machines, on
//! the local fleet and on cloud alike.

use crate::fleet::FleetKind;
use crate::process::shared_file;
use serde::{Deserialize, Serialize};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What separates a lease session's process part from its user (`leased-<instance> of user
/// alice`, `crate::process::lease`): a machine adopted by another process keeps its user.
pub const LEASE_USER_MARK: &str = " of user ";

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0}")]
    RuntimeDir(String),
    #[error(
        "{path} is not a valid machine record ({why}). Machines this server created may still be \
         running: list them, delete what is not needed, then remove the file"
    )]
    Corrupt { path: String, why: String },
    #[error("{path}: {why}")]
    Io { path: String, why: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub fleet: FleetKind,
    pub name: String,
    /// What the fleet calls it (the `mach-` id on cloud); the name until create answers.
    pub id: String,
    pub owner_pid: u32,
    /// The owning process as a shared store registers it (its instance id), where the record
    /// is shared by hosts on which `owner_pid` names nothing. Absent in the file's record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub session: String,
    /// The machine a branch child was made from. The local engine refuses to delete a machine
    /// that is the fork base of live clones (409, smolvm src/api/handlers/machines.rs
    /// `delete_machine`), so the clean-up deletes children before their source. Absent in
    /// records written before it existed, and for machines that are not branch children.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// When the entry was recorded (seconds since the epoch; 0 in records from before).
    #[serde(default)]
    pub recorded_at: u64,
    /// Set for a machine that belongs to the process rather than to a session: one created by a
    /// 2026-07-28 request over HTTP, whose handler lives for that one request. Absent in records
    /// written before it existed, and for session machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
    /// The engine the machine was made on (`Process::engine`): another engine using the same
    /// runtime directory has no such machine, and its 404 must not count as the delete. Absent
    /// in records written before it existed, which any engine's sweep takes as its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// Set when the session that made the machine ended under `sessionEnd` stop or pause: the
    /// machine then belongs to no session, any later one may take it back by name, and once
    /// this time (seconds since the epoch) has passed whichever server process runs deletes it,
    /// whether the process that kept it is alive or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_until: Option<u64>,
    /// Set for a base (a branch source frozen by `freezeSource`): it belongs to no session,
    /// is never taken back by one, and goes at `kept_until` (its last use and `baseIdleSecs`)
    /// unless a branch of it comes first. Absent for every other machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<BaseMark>,
}

/// What the record keeps of a base beside its machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BaseMark {
    /// The user it is kept for (the empty id: the operator), counted against their bases.
    pub user: String,
    /// Seconds since the epoch.
    pub made_at: u64,
    /// The last branch made of it (seconds since the epoch).
    pub last_used: u64,
    /// What it was set up from: the image, and the workspace's commit where it has one.
    pub made_from: String,
}

/// Why a base was not marked: a bound it would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseBound {
    /// The user keeps this many already (`maxBasesPerUser`).
    PerUser(usize),
    /// The server keeps this many already (`maxBases`).
    Server(usize),
}

/// A process-owned machine's lease: renewed by every tool call naming the machine, and over
/// once it has gone unused for `secs`. Kept in the record so that a restarted server can tell
/// a machine a stateless client may still use from one nobody has touched for too long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// The last tool call naming the machine (seconds since the epoch).
    pub last_used: u64,
    /// The idle period the lease was taken with (`machineLeaseSecs` then).
    pub secs: u64,
}

impl Lease {
    pub fn expired(&self, now: u64) -> bool {
        now >= self.last_used.saturating_add(self.secs)
    }
}

#[cfg(test)]
impl Entry {
    /// A local machine `name` of `session`, owned by `pid`, nothing else set: for tests.
    pub(crate) fn for_test(name: &str, pid: u32, session: &str) -> Entry {
        Entry {
            fleet: FleetKind::Local,
            name: name.into(),
            id: name.into(),
            owner_pid: pid,
            owner: None,
            session: session.into(),
            parent: None,
            recorded_at: 0,
            lease: None,
            engine: None,
            kept_until: None,
            base: None,
        }
    }
}

impl Entry {
    /// Whether the process that owned the machine is gone and nobody may still use it: a dead
    /// owner's leased machine stays until its lease runs out, for the next server to adopt.
    fn orphaned(&self, now: u64, owner_alive: impl Fn(&Entry) -> bool) -> bool {
        match self.kept_until {
            Some(until) => now >= until,
            None => !owner_alive(self) && self.lease.is_none_or(|l| l.expired(now)),
        }
    }

    /// Whether the machine was kept at its session's end and may still be taken back.
    pub fn kept_at(&self, now: u64) -> bool {
        self.kept_until.is_some_and(|until| now < until)
    }

    pub fn made_on(&self, engine: &str) -> bool {
        self.engine.as_deref().is_none_or(|e| e == engine)
    }
}

/// When a base last used at `last_used` goes, under `baseIdleSecs` (0: never).
pub fn base_until(last_used: u64, idle_secs: u64) -> u64 {
    if idle_secs == 0 {
        u64::MAX
    } else {
        last_used.saturating_add(idle_secs)
    }
}

/// Seconds since the epoch, for `Entry::recorded_at`.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The session of a machine a sweep has claimed for deletion: it belongs to no session any
/// more, only to the process that claimed it (and to the next, should that one end first).
pub const CLAIMED: &str = "(claimed for deletion)";

#[derive(Debug, Default, Serialize, Deserialize)]
struct RecordFile {
    machines: Vec<Entry>,
}

/// Creates the runtime directory with mode 0700, or checks that an existing one is a directory
/// owned by this user that nobody else can reach: the engine's socket lives in it, and anything
/// that can reach that socket can create machines on this host.
pub fn ensure_runtime_dir(dir: &Path) -> Result<(), RecordError> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| {
            RecordError::RuntimeDir(format!("cannot create {}: {e}", parent.display()))
        })?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(RecordError::RuntimeDir(format!(
                "cannot create {}: {e}; set SMOL_MCP_RUNTIME_DIR to somewhere else",
                dir.display()
            )));
        }
    }
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| RecordError::RuntimeDir(format!("{}: {e}", dir.display())))?;
    if !meta.is_dir() {
        return Err(RecordError::RuntimeDir(format!(
            "{} exists and is not a directory; set SMOL_MCP_RUNTIME_DIR to somewhere else",
            dir.display()
        )));
    }
    let me = nix::unistd::getuid().as_raw();
    if meta.uid() != me {
        return Err(RecordError::RuntimeDir(format!(
            "{} belongs to uid {} and this process runs as {me}; refusing to put a socket in a \
             directory another user owns. Set SMOL_MCP_RUNTIME_DIR to somewhere else",
            dir.display(),
            meta.uid()
        )));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(RecordError::RuntimeDir(format!(
            "{} is mode {:o} and must be 700: anything that can reach the socket in it can create \
             a machine on this host. Fix the mode, or set SMOL_MCP_RUNTIME_DIR to somewhere else",
            dir.display(),
            meta.permissions().mode() & 0o777
        )));
    }
    Ok(())
}

/// Whether a process is still there (a zombie or one we may not signal counts as alive).
pub fn process_alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    let signalled = match nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), None) {
        Ok(()) => true,
        Err(nix::errno::Errno::EPERM) => true,
        Err(_) => false,
    };
    // A process that ended and is not yet reaped (a zombie) still takes the signal: it holds
    // nothing any more, and a holder waited on as if it ran made a repeat wait 23 minutes.
    signalled && !proc_stat(pid).is_some_and(|stat| matches!(stat.state, 'Z' | 'X'))
}

/// Whether `pid` is the live process that started at `started` (clock ticks after boot, as
/// /proc says; `None`: not known, the pid alone decides): a pid reused by a later process is
/// not the one that held something.
pub fn process_alive_since(pid: u32, started: Option<u64>) -> bool {
    process_alive(pid)
        && started.is_none_or(|started| proc_stat(pid).is_none_or(|s| s.started == started))
}

/// When process `pid` started, as [`process_alive_since`] compares it.
pub fn process_started(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|stat| stat.started)
}

struct ProcStat {
    state: char,
    started: u64,
}

/// Fields 3 (state) and 22 (start time) of `/proc/<pid>/stat`; `None` where there is no /proc.
fn proc_stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces and parentheses itself.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        started: fields.get(19)?.parse().ok()?,
    })
}

/// The entries ordered so that no machine comes before a recorded child of it (a child may
/// itself be a source when it was branched branchable).
pub fn children_first(mut pending: Vec<Entry>) -> Vec<Entry> {
    let mut ordered = Vec::with_capacity(pending.len());
    while !pending.is_empty() {
        let is_parent = |e: &Entry, of: &[Entry]| {
            of.iter().any(|c| {
                c.parent
                    .as_deref()
                    .is_some_and(|p| p == e.name || p == e.id)
            })
        };
        let (leaves, rest): (Vec<Entry>, Vec<Entry>) = pending
            .iter()
            .cloned()
            .partition(|e| !is_parent(e, &pending));
        if leaves.is_empty() {
            // A cycle can only come from a hand-edited record: take the rest as it is.
            ordered.extend(rest);
            break;
        }
        ordered.extend(leaves);
        pending = rest;
    }
    ordered
}

/// Where the record is kept: the runtime directory's file (the server processes of one user
/// on one host), or a database the server processes of several hosts share. Every change is
/// made under a lock all the processes sharing it respect, so that a claim (an orphan to sweep,
/// a leased machine to adopt, a kept one to take back) is made by one process.
#[async_trait::async_trait]
pub trait RecordBook: Send + Sync {
    /// Runs `change` under that lock, writing what it changed. `change` is given at least the
    /// entries `scope` covers (a book may give it every entry), and reads, changes, removes or
    /// adds only entries `scope` covers: so a database can lock and rewrite those rows alone,
    /// while two changes of different machines go on side by side.
    async fn update(
        &self,
        scope: &Scope,
        change: &mut EntriesChange<'_>,
    ) -> Result<(), RecordError>;
    /// The entries `scope` covers, in the order they were recorded.
    async fn entries(&self, scope: &Scope) -> Result<Vec<Entry>, RecordError>;
    /// This process as the book names owners beside its pid (`Entry::owner`), if it does.
    fn me(&self) -> Option<String>;
    /// Who lives, as the book can tell now, for a change or a reading about to be made: the
    /// file's by pid; a database's by instance, read once for all the entries it is asked of.
    async fn liveness(&self) -> Liveness;
}

/// Which entries a change or a reading of the record concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every entry: a sweep's claim, a count of bases.
    All,
    /// The entries of the machines called any of `names` (by name or by the fleet's id), on
    /// `fleet`, or on either fleet when a call names a machine before its fleet is known.
    Named {
        fleet: Option<FleetKind>,
        names: Vec<String>,
    },
}

impl Scope {
    /// The machine `name` (or id) on `fleet`.
    pub fn machine(fleet: FleetKind, name: &str) -> Scope {
        Scope::Named {
            fleet: Some(fleet),
            names: vec![name.to_owned()],
        }
    }

    pub fn covers(&self, entry: &Entry) -> bool {
        match self {
            Scope::All => true,
            Scope::Named { fleet, names } => {
                fleet.is_none_or(|f| f == entry.fleet)
                    && names.iter().any(|n| *n == entry.name || *n == entry.id)
            }
        }
    }
}

/// A change of the record's entries, made under the book's lock.
pub type EntriesChange<'a> = dyn FnMut(&mut Vec<Entry>) + Send + 'a;

/// Whether the process owning an entry still runs, as a book read it (see
/// [`RecordBook::liveness`]).
pub type Liveness = Box<dyn Fn(&Entry) -> bool + Send + Sync>;

/// The record as a file in the runtime directory, shared by the processes of one user there.
#[derive(Debug, Clone)]
struct FileBook {
    path: PathBuf,
    lock_path: PathBuf,
}

impl FileBook {
    fn io(&self, why: impl std::fmt::Display) -> RecordError {
        RecordError::Io {
            path: self.path.display().to_string(),
            why: why.to_string(),
        }
    }

    fn read_unlocked(&self) -> Result<Vec<Entry>, RecordError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.io(e)),
        };
        serde_json::from_str::<RecordFile>(&text)
            .map(|f| f.machines)
            .map_err(|e| RecordError::Corrupt {
                path: self.path.display().to_string(),
                why: e.to_string(),
            })
    }

    async fn off_the_runtime<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, RecordError> + Send + 'static,
    ) -> Result<T, RecordError> {
        tokio::task::spawn_blocking(work)
            .await
            .unwrap_or_else(|e| Err(self.io(e)))
    }

    fn write_unlocked(&self, entries: &[Entry]) -> Result<(), RecordError> {
        let text = serde_json::to_string_pretty(&RecordFile {
            machines: entries.to_vec(),
        })
        .map_err(|e| self.io(e))?;
        shared_file::replace(&self.path, text.as_bytes()).map_err(|e| self.io(e))
    }
}

#[async_trait::async_trait]
impl RecordBook for FileBook {
    /// The lock, the read and the write (its fsync) on the blocking threads: another
    /// process may hold the lock, and a disk may be slow; the change itself between them.
    async fn update(
        &self,
        _scope: &Scope,
        change: &mut EntriesChange<'_>,
    ) -> Result<(), RecordError> {
        let book = self.clone();
        let (lock, mut entries) = self
            .off_the_runtime(move || {
                let lock = shared_file::lock_exclusive(&book.lock_path).map_err(|e| book.io(e))?;
                Ok((lock, book.read_unlocked()?))
            })
            .await?;
        let before = entries.clone();
        change(&mut entries);
        // Most deletes are of machines that were never recorded: skip the write (and its fsync).
        if entries == before {
            return Ok(());
        }
        let book = self.clone();
        self.off_the_runtime(move || {
            book.write_unlocked(&entries)?;
            drop(lock);
            Ok(())
        })
        .await
    }

    async fn entries(&self, scope: &Scope) -> Result<Vec<Entry>, RecordError> {
        let book = self.clone();
        let mut entries = self
            .off_the_runtime(move || {
                let _lock = shared_file::lock_shared(&book.lock_path).map_err(|e| book.io(e))?;
                book.read_unlocked()
            })
            .await?;
        entries.retain(|e| scope.covers(e));
        Ok(entries)
    }

    fn me(&self) -> Option<String> {
        None
    }

    async fn liveness(&self) -> Liveness {
        Box::new(|entry: &Entry| process_alive(entry.owner_pid))
    }
}

#[derive(Clone)]
pub struct Record {
    book: std::sync::Arc<dyn RecordBook>,
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record").finish_non_exhaustive()
    }
}

impl Record {
    /// The record in `runtime_dir`'s file.
    pub fn new(runtime_dir: &Path) -> Record {
        Record {
            book: std::sync::Arc::new(FileBook {
                path: runtime_dir.join("ephemeral.json"),
                lock_path: runtime_dir.join("ephemeral.lock"),
            }),
        }
    }

    /// The record kept in `book` (a shared store's).
    pub fn in_book(book: std::sync::Arc<dyn RecordBook>) -> Record {
        Record { book }
    }

    /// Runs `change` on the record under the book's lock (several processes share it): on
    /// the entries `scope` covers, which are all `change` may read or touch.
    async fn update<R: Send>(
        &self,
        scope: Scope,
        change: impl FnOnce(&mut Vec<Entry>) -> R + Send,
    ) -> Result<R, RecordError> {
        let mut change = Some(change);
        let mut result = None;
        self.book
            .update(&scope, &mut |entries| {
                if let Some(change) = change.take() {
                    result = Some(change(entries));
                }
            })
            .await?;
        result.ok_or_else(|| RecordError::Io {
            path: "the machine record".into(),
            why: "its book never ran the change".into(),
        })
    }

    /// Marks `entry` as this process's when its pid says so (the book's name for it beside).
    fn stamp(&self, entry: &mut Entry) {
        if entry.owner_pid == std::process::id() {
            entry.owner = self.book.me();
        }
    }

    /// Whether an entry is orphaned at `now`, by who lives as the book reads it now.
    async fn orphaned_now(&self, now: u64) -> impl Fn(&Entry) -> bool + Send + Sync + use<> {
        let alive = self.book.liveness().await;
        move |e: &Entry| e.orphaned(now, &alive)
    }

    pub async fn entries(&self) -> Result<Vec<Entry>, RecordError> {
        self.book.entries(&Scope::All).await
    }

    /// The entries of machines called `name_or_id`, on either fleet.
    pub async fn entries_named(&self, name_or_id: &str) -> Result<Vec<Entry>, RecordError> {
        let scope = Scope::Named {
            fleet: None,
            names: vec![name_or_id.to_owned()],
        };
        self.book.entries(&scope).await
    }

    /// The entries `keep` keeps.
    async fn entries_where(
        &self,
        keep: impl Fn(&Entry) -> bool,
    ) -> Result<Vec<Entry>, RecordError> {
        let mut entries = self.entries().await?;
        entries.retain(keep);
        Ok(entries)
    }

    pub async fn add(&self, entry: Entry) -> Result<(), RecordError> {
        let mut entry = entry;
        self.stamp(&mut entry);
        self.update(Scope::machine(entry.fleet, &entry.name), |entries| {
            entries.retain(|e| !(e.fleet == entry.fleet && e.name == entry.name));
            entries.push(entry);
        })
        .await
    }

    /// Adds an entry unless one of that name is recorded already; answers whether one was.
    pub async fn add_new(&self, entry: Entry) -> Result<bool, RecordError> {
        let mut entry = entry;
        self.stamp(&mut entry);
        self.update(Scope::machine(entry.fleet, &entry.name), |entries| {
            let known = entries
                .iter()
                .any(|e| e.fleet == entry.fleet && e.name == entry.name);
            if !known {
                entries.push(entry);
            }
            known
        })
        .await
    }

    /// Once create has answered: the machine's id, and the session that made it as its owner.
    /// The parent recorded before the create stays.
    pub async fn set_created(&self, created: &Entry) -> Result<(), RecordError> {
        let mut created = created.clone();
        self.stamp(&mut created);
        let created = &created;
        self.update(Scope::machine(created.fleet, &created.name), |entries| {
            for e in entries
                .iter_mut()
                .filter(|e| e.fleet == created.fleet && e.name == created.name)
            {
                let parent = e.parent.take();
                e.clone_from(created);
                e.parent = created.parent.clone().or(parent);
            }
        })
        .await
    }

    /// Removes a machine by name or id (delete-machine may be given either).
    pub async fn remove(&self, fleet: FleetKind, name_or_id: &str) -> Result<(), RecordError> {
        self.update(Scope::machine(fleet, name_or_id), |entries| {
            entries.retain(|e| !(e.fleet == fleet && (e.name == name_or_id || e.id == name_or_id)))
        })
        .await
    }

    /// Entries of this session, and entries whose process has died (leased ones once their
    /// lease has run out), of machines made on `engine`; the orphans are claimed for this
    /// process to delete ([`Record::claim_orphans`]).
    pub async fn owned_or_orphaned(
        &self,
        session: &str,
        fleet: FleetKind,
        engine: &str,
    ) -> Result<Vec<Entry>, RecordError> {
        let mut entries: Vec<Entry> = self
            .entries()
            .await?
            .into_iter()
            .filter(|e| {
                e.fleet == fleet
                    && e.made_on(engine)
                    && e.session == session
                    && e.kept_until.is_none()
            })
            .collect();
        entries.extend(self.claim_orphans(fleet, engine).await?);
        Ok(entries)
    }

    /// Claims the machines made on `engine` whose process has died (or whose kept time has
    /// passed) for this process to delete: in one change under the book's lock each becomes
    /// this process's, so that of two processes sweeping at once each machine is deleted by
    /// one. A machine whose delete then fails stays this process's, and is orphaned again if
    /// it ends.
    pub async fn claim_orphans(
        &self,
        fleet: FleetKind,
        engine: &str,
    ) -> Result<Vec<Entry>, RecordError> {
        let now = now_secs();
        let me = self.book.me();
        let orphaned = self.orphaned_now(now).await;
        let alive = self.book.liveness().await;
        // Claimed by this process before (a delete that failed, or a sweep of this process
        // under way): this process's to delete still. Claimed by another live one: its own.
        // Otherwise an orphan is claimed now.
        let mine_before = |e: &Entry| e.session == CLAIMED && self.is_mine(e);
        let claimable = |e: &Entry| orphaned(e) && !(e.session == CLAIMED && alive(e));
        // Read first, then lock only the machines that may be claimed: a sweep runs every few
        // seconds in every process and mostly finds nothing, and the whole record locked
        // would hold every create and delete up meanwhile.
        let candidates = self
            .entries_where(|e| {
                e.fleet == fleet && e.made_on(engine) && (mine_before(e) || claimable(e))
            })
            .await?;
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let scope = Scope::Named {
            fleet: Some(fleet),
            names: candidates.into_iter().map(|e| e.name).collect(),
        };
        self.update(scope.clone(), |entries| {
            let mut claimed = Vec::new();
            for e in entries
                .iter_mut()
                .filter(|e| scope.covers(e) && e.made_on(engine))
            {
                if mine_before(e) {
                    claimed.push(e.clone());
                    continue;
                }
                if !claimable(e) {
                    continue;
                }
                e.owner_pid = std::process::id();
                e.owner.clone_from(&me);
                e.session = CLAIMED.to_owned();
                e.lease = None;
                claimed.push(e.clone());
            }
            claimed
        })
        .await
    }

    /// Machines made on `engine` whose process has died (read only: a sweep claims them).
    pub async fn orphaned(
        &self,
        fleet: FleetKind,
        engine: &str,
    ) -> Result<Vec<Entry>, RecordError> {
        let orphaned = self.orphaned_now(now_secs()).await;
        self.entries_where(|e| e.fleet == fleet && e.made_on(engine) && orphaned(e))
            .await
    }

    /// This process as the record's book names owners beside its pid, if it does.
    pub fn me(&self) -> Option<String> {
        self.book.me()
    }

    /// Whether `entry` is this process's.
    pub fn is_mine(&self, entry: &Entry) -> bool {
        entry.owner_pid == std::process::id() && entry.owner == self.book.me()
    }

    /// Orphans made on another engine than `engine`: left recorded for a start on theirs.
    pub async fn orphaned_elsewhere(
        &self,
        fleet: FleetKind,
        engine: &str,
    ) -> Result<Vec<Entry>, RecordError> {
        let orphaned = self.orphaned_now(now_secs()).await;
        self.entries_where(|e| e.fleet == fleet && !e.made_on(engine) && orphaned(e))
            .await
    }

    /// Renews the lease of every leased machine called `name_or_id` (on either fleet: a call
    /// names a machine before its fleet is known, and renewing one too many is harmless).
    pub async fn renew(&self, names: &[String], now: u64) -> Result<(), RecordError> {
        let scope = Scope::Named {
            fleet: None,
            names: names.to_vec(),
        };
        self.update(scope, |entries| {
            for e in entries
                .iter_mut()
                .filter(|e| names.iter().any(|n| *n == e.name || *n == e.id))
            {
                if let Some(lease) = &mut e.lease {
                    lease.last_used = lease.last_used.max(now);
                }
            }
        })
        .await
    }

    /// Makes `owner`/`session` the owner of every leased machine whose process died before its
    /// lease ran out: a stateless client still holds those names. Answers what was adopted.
    pub async fn adopt_leased(
        &self,
        owner: u32,
        session: &str,
        now: u64,
    ) -> Result<Vec<Entry>, RecordError> {
        let me = self.book.me();
        let alive = self.book.liveness().await;
        let adoptable = |e: &Entry| {
            e.kept_until.is_none() && e.lease.is_some_and(|l| !l.expired(now)) && !alive(e)
        };
        // Read first, then lock only what may be adopted: every process looks every few
        // seconds, and mostly finds nothing.
        let candidates = self.entries_where(adoptable).await?;
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let scope = Scope::Named {
            fleet: None,
            names: candidates.into_iter().map(|e| e.name).collect(),
        };
        self.update(scope.clone(), |entries| {
            let mut adopted = Vec::new();
            for e in entries
                .iter_mut()
                .filter(|e| scope.covers(e) && adoptable(e))
            {
                e.owner_pid = owner;
                e.owner.clone_from(&me);
                // The user's part of a lease session stays: the machine is still theirs.
                e.session = match e.session.find(LEASE_USER_MARK) {
                    Some(at) => format!("{session}{}", &e.session[at..]),
                    None => session.to_owned(),
                };
                adopted.push(e.clone());
            }
            adopted
        })
        .await
    }

    /// At a session's end under `sessionEnd` stop or pause (or a lease's, for a client without
    /// a session): the machines on `fleet` that `which` picks, unless kept already, belong to
    /// no session from now, and go at `until` unless a session takes them back first.
    pub async fn keep(
        &self,
        fleet: FleetKind,
        which: impl Fn(&Entry) -> bool + Send + Sync,
        until: impl Fn(&Entry) -> u64 + Send + Sync,
    ) -> Result<Vec<Entry>, RecordError> {
        self.update(Scope::All, |entries| {
            let mut kept = Vec::new();
            for e in entries
                .iter_mut()
                .filter(|e| e.fleet == fleet && e.kept_until.is_none() && which(e))
            {
                e.kept_until = Some(until(e));
                e.session = String::new();
                e.lease = None;
                kept.push(e.clone());
            }
            kept
        })
        .await
    }

    /// A kept machine called `name_or_id` (on either fleet), not yet expired, becomes the
    /// session's own again: owned by `owner`, going with the session (or, for the process's
    /// lease session, under `lease`). Answers the entries taken.
    pub async fn take_back(
        &self,
        name_or_id: &str,
        owner: u32,
        session: &str,
        lease: Option<Lease>,
        now: u64,
    ) -> Result<Vec<Entry>, RecordError> {
        let me = self.book.me();
        let scope = Scope::Named {
            fleet: None,
            names: vec![name_or_id.to_owned()],
        };
        self.update(scope, |entries| {
            let mut taken = Vec::new();
            for e in entries.iter_mut().filter(|e| {
                (e.name == name_or_id || e.id == name_or_id) && e.kept_at(now) && e.base.is_none()
            }) {
                e.kept_until = None;
                e.owner_pid = owner;
                e.owner.clone_from(&me);
                e.session = session.to_owned();
                e.lease = lease;
                taken.push(e.clone());
            }
            taken
        })
        .await
    }

    /// Marks `machine` as a base before it is frozen, unless that passes `per_user` bases of
    /// its user or `server` bases in all (counted and marked under the book's lock, so that
    /// two freezes at once cannot both take the last place). A machine not yet recorded (one
    /// with a name of its own) is recorded now. Answers what to put back should the freeze
    /// fail ([`Record::unmark_base`]): the entry as it was, or none.
    pub async fn mark_base(
        &self,
        machine: Entry,
        per_user: usize,
        server: usize,
    ) -> Result<Result<Option<Entry>, BaseBound>, RecordError> {
        let mut machine = machine;
        self.stamp(&mut machine);
        // All: the bases already kept are counted against the bounds.
        self.update(Scope::All, |entries| {
            let Some(mark) = machine.base.clone() else {
                return Ok(None);
            };
            let others = |e: &&Entry| !(e.fleet == machine.fleet && e.name == machine.name);
            let bases: Vec<&Entry> = entries
                .iter()
                .filter(others)
                .filter(|e| e.base.is_some())
                .collect();
            let users = bases
                .iter()
                .filter(|e| e.base.as_ref().is_some_and(|b| b.user == mark.user))
                .count();
            if users >= per_user {
                return Err(BaseBound::PerUser(users));
            }
            if bases.len() >= server {
                return Err(BaseBound::Server(bases.len()));
            }
            let before = entries.iter().position(|e| {
                e.fleet == machine.fleet && (e.name == machine.name || e.id == machine.name)
            });
            Ok(match before {
                Some(i) => {
                    let was = entries[i].clone();
                    let e = &mut entries[i];
                    e.base = Some(mark);
                    e.kept_until = machine.kept_until;
                    e.session = String::new();
                    e.lease = None;
                    Some(was)
                }
                None => {
                    entries.push(machine.clone());
                    None
                }
            })
        })
        .await
    }

    /// A freeze that failed: `machine`'s entry as it was before [`Record::mark_base`]
    /// (`was`), or none when it was not recorded.
    pub async fn unmark_base(
        &self,
        fleet: FleetKind,
        machine: &str,
        was: Option<Entry>,
    ) -> Result<(), RecordError> {
        let mut names = vec![machine.to_owned()];
        names.extend(was.as_ref().map(|e| e.name.clone()));
        let scope = Scope::Named {
            fleet: Some(fleet),
            names,
        };
        self.update(scope, |entries| {
            entries.retain(|e| !(e.fleet == fleet && e.name == machine));
            entries.extend(was);
        })
        .await
    }

    /// A branch was made of base `name_or_id`: it was used now, and goes `idle_secs` from now
    /// (never, with 0). A sweep's claim of it is let go. Answers whether it is a base.
    pub async fn base_used(
        &self,
        fleet: FleetKind,
        name_or_id: &str,
        now: u64,
        idle_secs: u64,
    ) -> Result<bool, RecordError> {
        self.update(Scope::machine(fleet, name_or_id), |entries| {
            let mut found = false;
            for e in entries.iter_mut().filter(|e| {
                e.fleet == fleet && (e.name == name_or_id || e.id == name_or_id) && e.base.is_some()
            }) {
                if let Some(mark) = &mut e.base {
                    mark.last_used = now;
                }
                e.kept_until = Some(base_until(now, idle_secs));
                e.session = String::new();
                found = true;
            }
            found
        })
        .await
    }

    /// The bases on `fleet`.
    pub async fn bases(&self, fleet: FleetKind) -> Result<Vec<Entry>, RecordError> {
        self.entries_where(|e| e.fleet == fleet && e.base.is_some())
            .await
    }

    /// Kept machines, whether expired or not.
    pub async fn kept(&self) -> Result<Vec<Entry>, RecordError> {
        self.entries_where(|e| e.kept_until.is_some()).await
    }

    /// The leased machines of `owner` on `fleet` whose lease has run out.
    pub async fn expired_leases(
        &self,
        owner: u32,
        fleet: FleetKind,
        now: u64,
    ) -> Result<Vec<Entry>, RecordError> {
        self.entries_where(|e| {
            e.fleet == fleet
                && e.owner_pid == owner
                && e.owner == self.book.me()
                && e.lease.is_some_and(|l| l.expired(now))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, pid: u32, session: &str) -> Entry {
        Entry::for_test(name, pid, session)
    }

    #[test]
    fn the_runtime_dir_is_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/rt");
        ensure_runtime_dir(&dir).unwrap();
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        ensure_runtime_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = ensure_runtime_dir(&dir).unwrap_err().to_string();
        assert!(err.contains("must be 700"), "{err}");
        let file = tmp.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(
            ensure_runtime_dir(&file)
                .unwrap_err()
                .to_string()
                .contains("not a directory")
        );
    }

    #[tokio::test]
    async fn own_and_dead_sessions_are_found_live_siblings_are_not() {
        let tmp = tempfile::tempdir().unwrap();
        let record = Record::new(tmp.path());
        let me = std::process::id();
        // A pid that is not running: the largest pid_max allows is never handed out here.
        let dead = 4_194_303;
        record.add(entry("mine", me, "s1")).await.unwrap();
        record.add(entry("sibling", me, "s2")).await.unwrap();
        record.add(entry("orphan", dead, "s9")).await.unwrap();
        let found: Vec<String> = record
            .owned_or_orphaned("s1", FleetKind::Local, "e")
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(found, ["mine", "orphan"]);
        // The sweep that found the orphan claimed it: it is this process's now, no orphan,
        // and found again by this process's next sweep (should its delete have failed).
        assert!(
            record
                .orphaned(FleetKind::Local, "e")
                .await
                .unwrap()
                .is_empty()
        );
        let again: Vec<String> = record
            .claim_orphans(FleetKind::Local, "e")
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(again, ["orphan"]);
        assert!(
            record
                .orphaned(FleetKind::Cloud, "e")
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            record.add_new(entry("mine", dead, "s7")).await.unwrap(),
            "kept as it was"
        );
        let mut created = entry("mine", me, "s1");
        created.id = "id-1".into();
        record.set_created(&created).await.unwrap();
        record.remove(FleetKind::Local, "id-1").await.unwrap();
        assert_eq!(record.entries().await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_record_without_parents_still_loads_and_a_parent_survives_the_create() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("ephemeral.json"),
            r#"{"machines":[{"fleet":"local","name":"mcp-old","id":"mcp-old","ownerPid":1,"session":"s"}]}"#,
        )
        .unwrap();
        let record = Record::new(tmp.path());
        assert_eq!(record.entries().await.unwrap()[0].parent, None);
        let mut child = entry("mcp-child", 1, "s");
        child.parent = Some("mcp-old".into());
        record.add(child).await.unwrap();
        record
            .set_created(&entry("mcp-child", 1, "s"))
            .await
            .unwrap();
        let entries = record.entries().await.unwrap();
        assert_eq!(entries[1].parent.as_deref(), Some("mcp-old"));
        let text = std::fs::read_to_string(tmp.path().join("ephemeral.json")).unwrap();
        assert_eq!(
            text.matches("parent").count(),
            1,
            "written only when known: {text}"
        );
    }

    #[tokio::test]
    async fn a_dead_owners_leased_machine_waits_for_its_lease_to_run_out() {
        let tmp = tempfile::tempdir().unwrap();
        let record = Record::new(tmp.path());
        let dead = 4_194_303;
        let now = now_secs();
        let leased = |name: &str, last_used: u64| {
            let mut e = entry(name, dead, "leased-4194303");
            e.lease = Some(Lease {
                last_used,
                secs: 60,
            });
            e
        };
        record.add(leased("fresh", now - 10)).await.unwrap();
        record.add(leased("stale", now - 61)).await.unwrap();
        record.add(entry("session", dead, "s9")).await.unwrap();
        let names =
            |entries: Vec<Entry>| -> Vec<String> { entries.into_iter().map(|e| e.name).collect() };
        assert_eq!(
            names(record.orphaned(FleetKind::Local, "e").await.unwrap()),
            ["stale", "session"],
            "a client may still use the fresh one"
        );
        assert_eq!(
            names(
                record
                    .owned_or_orphaned("s1", FleetKind::Local, "e")
                    .await
                    .unwrap()
            ),
            ["stale", "session"]
        );
        let me = std::process::id();
        assert_eq!(
            names(record.adopt_leased(me, "leased-me", now).await.unwrap()),
            ["fresh"]
        );
        let adopted = record.entries().await.unwrap()[0].clone();
        assert_eq!(
            (adopted.owner_pid, adopted.session.as_str()),
            (me, "leased-me")
        );
        assert!(
            record
                .expired_leases(me, FleetKind::Local, now)
                .await
                .unwrap()
                .is_empty()
        );
        record.renew(&["fresh".to_owned()], now + 30).await.unwrap();
        assert!(
            record
                .expired_leases(me, FleetKind::Local, now + 61)
                .await
                .unwrap()
                .is_empty(),
            "renewed at +30, so not expired at +61"
        );
        assert_eq!(
            names(
                record
                    .expired_leases(me, FleetKind::Local, now + 90)
                    .await
                    .unwrap()
            ),
            ["fresh"]
        );
    }

    #[tokio::test]
    async fn a_record_without_leases_still_loads() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("ephemeral.json"),
            r#"{"machines":[{"fleet":"local","name":"mcp-old","id":"mcp-old","ownerPid":1,"session":"s"}]}"#,
        )
        .unwrap();
        assert_eq!(
            Record::new(tmp.path()).entries().await.unwrap()[0].lease,
            None
        );
    }

    #[tokio::test]
    async fn a_corrupt_record_is_an_error_not_an_empty_one() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("ephemeral.json"), "{oops").unwrap();
        let err = Record::new(tmp.path())
            .entries()
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("may still be running"), "{err}");
    }
}
