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
}

fn io_text(what: &str, path: &Path, e: std::io::Error) -> String {
    format!("{what} {}: {e}", path.display())
}

impl Workspaces {
    pub fn new(dir: PathBuf) -> Workspaces {
        Workspaces { dir }
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
