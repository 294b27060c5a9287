//! Which machines have a workspace, and where the server keeps their copies: one directory per
//! seed (`seeds/<id>`: the server's repository of the base, and the files a machine got) and
//! one per machine (`machines/<fleet>/<name>`: its record and its tree as last read back).
//! A branch child of a machine with a workspace gets a record of its own naming the same seed,
//! so every child is compared with one base; a seed goes when no machine names it.
//!
//! On disk and not in memory, so that a restarted process (or another of the user's) still
//! knows a machine's workspace; the machine's record is written before its files are sent, and
//! removed with the machine.

use crate::fleet::FleetKind;
use crate::workspace::{Room, Workspace, WorkspaceError};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const RECORD: &str = "workspace.json";

/// A machine's workspace, as recorded.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attached {
    pub name: String,
    /// The fleet's own id, where it has one apart from the name.
    pub id: String,
    /// The machine it was branched from, for a child.
    pub parent: Option<String>,
    pub workspace: Workspace,
}

#[derive(Debug)]
pub struct Workspaces {
    dir: PathBuf,
    /// The bytes all copies may take (workspaceTotalMaxBytes), and what operations took.
    ledger: Arc<Ledger>,
    /// One reading at a time per machine: a reading replaces the machine's tree and diff whole,
    /// and a keep stages that tree. Entries go with the machine.
    busy: std::sync::Mutex<Holds>,
}

type Holds = std::collections::HashMap<(FleetKind, String), Arc<tokio::sync::Mutex<()>>>;

fn io_text(what: &str, path: &Path, e: std::io::Error) -> String {
    format!("{what} {}: {e}", path.display())
}

impl Workspaces {
    pub fn new(dir: PathBuf, total_max_bytes: u64) -> Workspaces {
        Workspaces {
            dir,
            ledger: Arc::new(Ledger {
                limit: total_max_bytes,
                taken: std::sync::Mutex::new(Taken::default()),
            }),
            busy: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Waits until no other reading or keep of `name`'s copy is under way, and holds it.
    pub async fn hold(&self, fleet: FleetKind, name: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = match self.busy.lock() {
            Ok(mut busy) => busy.entry((fleet, name.to_owned())).or_default().clone(),
            Err(poisoned) => poisoned
                .into_inner()
                .entry((fleet, name.to_owned()))
                .or_default()
                .clone(),
        };
        lock.lock_owned().await
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Room for one operation on the copies (a seed, a reading, a keep), bounded with every
    /// other's by workspaceTotalMaxBytes. Measures what the copies take on disk now: call it
    /// off the async threads.
    pub fn room(&self) -> Arc<OperationRoom> {
        let settled_before = self.ledger.lock().settled;
        let on_disk = crate::workspace::bytes_under(&self.dir);
        Arc::new(OperationRoom {
            ledger: self.ledger.clone(),
            settled_before,
            own: std::sync::Mutex::new(Own { on_disk, taken: 0 }),
        })
    }

    /// A fresh directory for a new seed (not made yet).
    pub fn new_seed_dir(&self) -> PathBuf {
        self.dir
            .join("seeds")
            .join(format!("{:016x}", rand::random::<u64>()))
    }

    /// Where a machine's copy and record live. Machine names are checked by the tools'
    /// grammar (no `/`, no leading `.`), and a cloud id is letters, digits and `-`.
    pub fn machine_dir(&self, fleet: FleetKind, name: &str) -> PathBuf {
        self.dir.join("machines").join(fleet.as_str()).join(name)
    }

    /// Where a kept plain directory's patch is written.
    pub fn patch_path(&self, name: &str) -> PathBuf {
        self.dir.join("patches").join(format!(
            "{name}-{}.patch",
            chrono::Utc::now().format("%Y%m%dT%H%M%SZ")
        ))
    }

    /// Records that machine `name` (fleet id `id`) has `seed`'s workspace, as a copy of its
    /// own under its directory. Answers that copy.
    pub fn attach(
        &self,
        fleet: FleetKind,
        name: &str,
        id: &str,
        parent: Option<&str>,
        seed: &Workspace,
    ) -> Result<Attached, String> {
        let dir = self.machine_dir(fleet, name);
        std::fs::create_dir_all(&dir).map_err(|e| io_text("creating", &dir, e))?;
        let attached = Attached {
            name: name.to_owned(),
            id: id.to_owned(),
            parent: parent.map(str::to_owned),
            workspace: seed.copy_at(&dir),
        };
        let text = serde_json::to_vec_pretty(&attached).map_err(|e| e.to_string())?;
        let path = dir.join(RECORD);
        let partial = dir.join(format!("{RECORD}.partial"));
        std::fs::write(&partial, text).map_err(|e| io_text("writing", &partial, e))?;
        std::fs::rename(&partial, &path).map_err(|e| io_text("writing", &path, e))?;
        Ok(attached)
    }

    /// The workspace of the machine `name_or_id`, if it has one.
    pub fn of(&self, fleet: FleetKind, name_or_id: &str) -> Option<Attached> {
        let read = |dir: &Path| -> Option<Attached> {
            let text = std::fs::read(dir.join(RECORD)).ok()?;
            serde_json::from_slice(&text).ok()
        };
        if let Some(found) = read(&self.machine_dir(fleet, name_or_id)) {
            return Some(found);
        }
        self.all(fleet).into_iter().find(|a| a.id == name_or_id)
    }

    /// Every machine of `fleet` with a workspace.
    pub fn all(&self, fleet: FleetKind) -> Vec<Attached> {
        let Ok(entries) = std::fs::read_dir(self.dir.join("machines").join(fleet.as_str())) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|entry| {
                let text = std::fs::read(entry.path().join(RECORD)).ok()?;
                serde_json::from_slice(&text).ok()
            })
            .collect()
    }

    /// The other children of `attached`'s parent, on the same seed.
    pub fn siblings(&self, fleet: FleetKind, attached: &Attached) -> Vec<Attached> {
        let Some(parent) = &attached.parent else {
            return Vec::new();
        };
        self.all(fleet)
            .into_iter()
            .filter(|a| {
                a.name != attached.name
                    && a.parent.as_ref() == Some(parent)
                    && a.workspace.base_git() == attached.workspace.base_git()
            })
            .collect()
    }

    /// Removes a deleted machine's copy and record, and its seed once no machine names it.
    pub fn forget(&self, fleet: FleetKind, name_or_id: &str) {
        let Some(attached) = self.of(fleet, name_or_id) else {
            return;
        };
        if let Ok(mut busy) = self.busy.lock() {
            busy.remove(&(fleet, attached.name.clone()));
        }
        let dir = self.machine_dir(fleet, &attached.name);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "could not remove a deleted machine's workspace copy");
        }
        let seed = attached
            .workspace
            .base_git()
            .parent()
            .map(Path::to_path_buf);
        if let Some(seed) = seed {
            self.remove_seed_if_unused(&seed);
        }
    }

    /// After a sweep: the copies of the machines it deleted.
    pub fn forget_all(&self, fleet: FleetKind, deleted: &[String]) {
        for name in deleted {
            self.forget(fleet, name);
        }
    }

    /// At start-up: removes what an operation left in a copy's directory when its process ended
    /// during it (a half-read tree, an archive, a scratch index or object directory) once it
    /// is older than `older_than` (a younger one may be another process's operation under way).
    pub fn sweep_scratch(&self, older_than: std::time::Duration) {
        let mut roots = Vec::new();
        for fleet in [FleetKind::Local, FleetKind::Cloud] {
            if let Ok(machines) = std::fs::read_dir(self.dir.join("machines").join(fleet.as_str()))
            {
                roots.extend(machines.flatten().map(|e| e.path()));
            }
        }
        if let Ok(seeds) = std::fs::read_dir(self.dir.join("seeds")) {
            roots.extend(seeds.flatten().map(|e| e.path()));
        }
        for root in roots {
            let Ok(entries) = std::fs::read_dir(&root) else {
                continue;
            };
            for entry in entries.flatten() {
                let scratch = entry
                    .file_name()
                    .to_str()
                    .is_some_and(crate::workspace::is_scratch);
                if !scratch || !older(&entry, older_than) {
                    continue;
                }
                let path = entry.path();
                let removed = if path.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                match removed {
                    Ok(()) => {
                        tracing::info!(path = %path.display(), "removed what an ended process's workspace operation left")
                    }
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "could not remove an ended operation's workspace scratch")
                    }
                }
            }
        }
    }

    /// At start-up: removes the seeds no machine names that are older than `older_than` (a
    /// create that ended with its process before its machine was recorded; a younger one may
    /// be another process's create under way).
    pub fn prune_seeds(&self, older_than: std::time::Duration) {
        let Ok(entries) = std::fs::read_dir(self.dir.join("seeds")) else {
            return;
        };
        for entry in entries.flatten() {
            if older(&entry, older_than) {
                self.remove_seed_if_unused(&entry.path());
            }
        }
    }

    /// Removes a seed no machine's record names (a create that failed before attaching).
    pub fn remove_seed_if_unused(&self, seed: &Path) {
        let used = [FleetKind::Local, FleetKind::Cloud]
            .into_iter()
            .any(|fleet| {
                self.all(fleet)
                    .iter()
                    .any(|a| a.workspace.base_git().parent() == Some(seed))
            });
        if !used
            && seed.starts_with(self.dir.join("seeds"))
            && let Err(e) = std::fs::remove_dir_all(seed)
        {
            tracing::warn!(dir = %seed.display(), error = %e, "could not remove an unused workspace seed");
        }
    }
}

fn older(entry: &std::fs::DirEntry, than: std::time::Duration) -> bool {
    entry
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > than)
}

/// The bound on all copies together, and what the operations of this process took from it.
#[derive(Debug)]
struct Ledger {
    limit: u64,
    taken: std::sync::Mutex<Taken>,
}

#[derive(Debug, Default)]
struct Taken {
    /// By operations under way.
    in_flight: u64,
    /// By operations that have ended, ever (only grows): an operation that measured the disk
    /// before another ended still counts what that one wrote.
    settled: u64,
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, Taken> {
        self.taken
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One operation's room: what the disk held when it began, plus what every operation of this
/// process has taken since (under way or ended since then), plus what it takes, stays within
/// the bound. What it removes is given back ([`OperationRoom::give_back`]); what it frees
/// otherwise counts until the next operation measures the disk, so the bound errs on the side
/// of refusing. Another process sharing the directory is counted by what it has written when
/// an operation begins.
#[derive(Debug)]
pub struct OperationRoom {
    ledger: Arc<Ledger>,
    settled_before: u64,
    own: std::sync::Mutex<Own>,
}

#[derive(Debug)]
struct Own {
    /// What the disk held when the operation began, less what it removed of that since.
    on_disk: u64,
    /// What it has set aside and not given back.
    taken: u64,
}

impl OperationRoom {
    fn own(&self) -> std::sync::MutexGuard<'_, Own> {
        self.own
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `bytes` this operation removed from the disk (an archive it unpacked, the tree its
    /// reading replaced): room again for its own next steps. What it took itself is given back
    /// to every operation; what was there when it began, to itself only (the others measured
    /// the disk with it, and keep erring on the side of refusing).
    pub fn give_back(&self, bytes: u64) {
        let mut ledger = self.ledger.lock();
        let mut own = self.own();
        let taken = bytes.min(own.taken);
        own.taken -= taken;
        own.on_disk = own.on_disk.saturating_sub(bytes - taken);
        ledger.in_flight = ledger.in_flight.saturating_sub(taken);
    }
}

impl Room for OperationRoom {
    fn take(&self, bytes: u64) -> Result<(), WorkspaceError> {
        let mut ledger = self.ledger.lock();
        let mut own = self.own();
        let used = own
            .on_disk
            .saturating_add(ledger.in_flight)
            .saturating_add(ledger.settled.saturating_sub(self.settled_before));
        if used.saturating_add(bytes) > self.ledger.limit {
            return Err(WorkspaceError::ServerFull {
                need: bytes,
                limit: self.ledger.limit,
            });
        }
        ledger.in_flight = ledger.in_flight.saturating_add(bytes);
        own.taken = own.taken.saturating_add(bytes);
        Ok(())
    }
}

impl Drop for OperationRoom {
    fn drop(&mut self) {
        let taken = self.own().taken;
        let mut ledger = self.ledger.lock();
        ledger.in_flight = ledger.in_flight.saturating_sub(taken);
        ledger.settled = ledger.settled.saturating_add(taken);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_reading_of_a_machine_at_a_time_and_others_meanwhile() {
        let tmp = tempfile::tempdir().unwrap();
        let workspaces = Arc::new(Workspaces::new(tmp.path().to_path_buf(), 1 << 30));
        let first = workspaces.hold(FleetKind::Local, "m").await;
        // Another machine's reading is not held up.
        let other = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            workspaces.hold(FleetKind::Local, "n"),
        )
        .await;
        assert!(other.is_ok(), "another machine waits for nothing");
        let waiting = {
            let workspaces = workspaces.clone();
            tokio::spawn(async move { workspaces.hold(FleetKind::Local, "m").await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "the second reading of m waits");
        drop(first);
        let second = tokio::time::timeout(std::time::Duration::from_secs(5), waiting).await;
        assert!(second.is_ok(), "and goes on once the first is done");
    }

    #[test]
    fn operations_together_stay_within_the_bound_and_an_ended_ones_bytes_still_count() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("there"), vec![0u8; 100]).unwrap();
        let workspaces = Workspaces::new(tmp.path().to_path_buf(), 1000);
        let first = workspaces.room();
        let second = workspaces.room();
        first.take(500).unwrap();
        // 100 on disk, 500 taken by the first: 400 left for both.
        let err = second.take(401).unwrap_err();
        assert!(
            matches!(
                err,
                WorkspaceError::ServerFull {
                    need: 401,
                    limit: 1000
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("workspaceTotalMaxBytes"), "{err}");
        second.take(300).unwrap();
        // The first ends; what it wrote is still on the disk the second measured without it.
        std::fs::write(tmp.path().join("first"), vec![0u8; 500]).unwrap();
        drop(first);
        assert!(second.take(101).is_err(), "the first's 500 still count");
        second.take(100).unwrap();
        drop(second);
        // A new operation measures the disk: 600 written, nothing taken.
        let third = workspaces.room();
        assert!(third.take(401).is_err());
        third.take(400).unwrap();
        drop(third);
        // What an operation removes is room again for its own next steps: what it took, for
        // every operation; what was on the disk when it began, for itself alone.
        let fourth = workspaces.room();
        fourth.take(300).unwrap();
        let other = workspaces.room();
        assert!(other.take(101).is_err());
        fourth.give_back(250);
        other.take(101).unwrap();
        drop((other, fourth));
        let fifth = workspaces.room();
        fifth.give_back(200);
        fifth.take(600).unwrap();
        assert!(
            workspaces.room().take(1).is_err(),
            "the others still count it"
        );
        drop(fifth);
        // A copy removed is room again for the operation after.
        std::fs::remove_file(tmp.path().join("first")).unwrap();
        workspaces.room().take(900).unwrap();
    }

    #[test]
    fn scratch_an_ended_process_left_is_swept_and_the_rest_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let workspaces = Workspaces::new(tmp.path().to_path_buf(), 1 << 30);
        let machine = workspaces.machine_dir(FleetKind::Local, "m");
        std::fs::create_dir_all(machine.join("tree-0123abcd/src")).unwrap();
        std::fs::create_dir_all(machine.join("tree")).unwrap();
        std::fs::write(machine.join("incoming.tgz-89abcdef"), "x").unwrap();
        std::fs::write(machine.join("changes.diff"), "kept").unwrap();
        std::fs::write(machine.join("workspace.json"), "{}").unwrap();
        std::fs::write(machine.join("notes-0123ABCD"), "not ours").unwrap();
        workspaces.sweep_scratch(std::time::Duration::from_secs(3600));
        assert!(
            machine.join("tree-0123abcd").exists(),
            "a young one may be an operation under way"
        );
        workspaces.sweep_scratch(std::time::Duration::ZERO);
        let mut left: Vec<String> = std::fs::read_dir(&machine)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["changes.diff", "notes-0123ABCD", "tree", "workspace.json"]
        );
    }
}
