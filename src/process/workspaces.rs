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
use crate::workspace::Workspace;
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
    /// One reading at a time per machine: a reading replaces the machine's tree and diff whole,
    /// and a keep stages that tree. Entries go with the machine.
    busy: std::sync::Mutex<Holds>,
}

type Holds = std::collections::HashMap<(FleetKind, String), Arc<tokio::sync::Mutex<()>>>;

fn io_text(what: &str, path: &Path, e: std::io::Error) -> String {
    format!("{what} {}: {e}", path.display())
}

impl Workspaces {
    pub fn new(dir: PathBuf) -> Workspaces {
        Workspaces {
            dir,
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

    /// At start-up: removes the seeds no machine names that are older than `older_than` (a
    /// create that ended with its process before its machine was recorded; a younger one may
    /// be another process's create under way).
    pub fn prune_seeds(&self, older_than: std::time::Duration) {
        let Ok(entries) = std::fs::read_dir(self.dir.join("seeds")) else {
            return;
        };
        for entry in entries.flatten() {
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > older_than);
            if old {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_reading_of_a_machine_at_a_time_and_others_meanwhile() {
        let tmp = tempfile::tempdir().unwrap();
        let workspaces = Arc::new(Workspaces::new(tmp.path().to_path_buf()));
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
}
