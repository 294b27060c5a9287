//! The user's project as a machine's workspace, on the host's side: a copy of a host directory
//! that the server owns (for a git repository, the commit the user is on), what a machine
//! changed in it, and those changes kept as a new branch of the user's repository, or as a
//! patch file for a directory that is not one.
//!
//! The user's directory is only read; in a repository, keeping writes objects and one new
//! branch, never the working tree, the index, `HEAD` or another ref. The copy a machine works
//! on (`tree/`) is the machine's to write, `.git` included, so no git command here runs with it
//! as a repository: each names the server's own (`base.git`, `--git-dir`), whose configuration
//! the server wrote, and git never reads a `.git` inside a work tree as configuration. So a
//! guest's `.git/config` (a hook, an fsmonitor, an external diff) never runs on the host.
//!
//! Git through its CLI rather than a library: the host's git is the one the user's repository
//! is made with (its object format, its extensions), a plumbing command line is a stable
//! interface, and every operation here is one or two of them.

mod archive;
mod error;
mod git;

pub use archive::{Unpacked, pack, unpack};
pub use error::WorkspaceError;
use error::io;
use git::At;
use std::path::{Path, PathBuf};

/// The host directory a workspace is made from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Origin {
    /// Resolved (symlinks, `..`).
    pub dir: PathBuf,
    pub kind: OriginKind,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum OriginKind {
    /// A repository's root, clean, on `branch` at `head`.
    Git { head: String, branch: String },
    /// A directory in no repository.
    Plain,
}

/// How many dirty paths a refusal names.
const DIRTY_NAMED: usize = 5;

/// Looks at `dir`: a clean git repository's root on a branch, or a directory in no repository.
/// Anything else is refused, saying what to do, and nothing is written.
pub fn inspect(dir: &Path) -> Result<Origin, WorkspaceError> {
    let shown = dir.display().to_string();
    let dir = std::fs::canonicalize(dir)
        .map_err(|_| WorkspaceError::NotADirectory { dir: shown.clone() })?;
    if !dir.is_dir() {
        return Err(WorkspaceError::NotADirectory { dir: shown });
    }
    git::run(&At::default(), &["--version"])?;
    let at = At {
        dir: Some(&dir),
        ..At::default()
    };
    let Ok(top) = git::line(&at, &["rev-parse", "--show-toplevel"]) else {
        return Ok(Origin {
            dir,
            kind: OriginKind::Plain,
        });
    };
    let top = std::fs::canonicalize(&top).map_err(io(format!("resolving {top}")))?;
    if top != dir {
        return Err(WorkspaceError::NotRepositoryRoot {
            dir: shown,
            root: top.display().to_string(),
        });
    }
    let head = git::line(&at, &["rev-parse", "--verify", "--quiet", "HEAD^{commit}"])
        .map_err(|_| WorkspaceError::Unborn { dir: shown.clone() })?;
    let branch = git::line(&at, &["symbolic-ref", "--quiet", "--short", "HEAD"])
        .map_err(|_| WorkspaceError::Detached { dir: shown.clone() })?;
    let status = git::run(
        &at,
        &["status", "--porcelain=v1", "-z", "--untracked-files=all"],
    )?;
    let dirty: Vec<String> = status
        .split(|b| *b == 0)
        .filter(|entry| entry.len() > 3)
        .map(|entry| String::from_utf8_lossy(&entry[3..]).into_owned())
        .collect();
    if !dirty.is_empty() {
        let mut paths = dirty
            .iter()
            .take(DIRTY_NAMED)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if dirty.len() > DIRTY_NAMED {
            paths.push_str(&format!(" and {} more", dirty.len() - DIRTY_NAMED));
        }
        return Err(WorkspaceError::Dirty { dir: shown, paths });
    }
    Ok(Origin {
        dir,
        kind: OriginKind::Git { head, branch },
    })
}

/// A workspace's copy and the server's record of where it started, in a directory of the
/// server's (`root`): `tree/` is what the machine gets and what comes back from it, `base.git`
/// the server's repository holding the commit it started from. Copies of one seed (a machine's
/// branch children) each have a `root` and `tree` of their own and share its `base.git`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Workspace {
    pub root: PathBuf,
    pub origin: Origin,
    /// The commit the copy started from: the user's `HEAD` for a repository (the same object),
    /// else a commit of the directory as given.
    pub base: String,
    tree: PathBuf,
    base_git: PathBuf,
}

impl Workspace {
    /// The copy: what the machine gets, and where its changes come back to.
    pub fn tree(&self) -> &Path {
        &self.tree
    }

    /// The server's repository holding the base, which every copy of this seed shares.
    pub fn base_git(&self) -> &Path {
        &self.base_git
    }

    /// Another copy of the same seed, rooted at `root` (its tree `root/tree`, not made yet):
    /// what a branch child's changes are read into, against the same base.
    pub fn copy_at(&self, root: &Path) -> Workspace {
        Workspace {
            root: root.to_path_buf(),
            origin: self.origin.clone(),
            base: self.base.clone(),
            tree: root.join("tree"),
            base_git: self.base_git.clone(),
        }
    }

    /// The server's repository, the copy as its work tree, and an index file of its own.
    fn at<'a>(&'a self, index: &'a Path) -> At<'a> {
        At {
            git_dir: Some(&self.base_git),
            work_tree: Some(&self.tree),
            index: Some(index),
            ours: true,
            ..At::default()
        }
    }

    fn bare(&self) -> At<'_> {
        At {
            git_dir: Some(&self.base_git),
            ours: true,
            ..At::default()
        }
    }

    /// Stages the whole copy, as it is now, into a fresh index of the server's, and answers
    /// the tree it makes. Paths named `.git` are never staged (git's own rule).
    fn stage(&self, index: &Path) -> Result<String, WorkspaceError> {
        let _ = std::fs::remove_file(index);
        let at = self.at(index);
        git::run(&at, &["read-tree", &self.base])?;
        git::run(&at, &["add", "--all", "."])?;
        git::line(&at, &["write-tree"])
    }
}

/// Each file of a repository at `rev` with its size (`ls-tree -l`; a submodule has none and is
/// left out).
fn file_sizes(at: &At<'_>, rev: &str) -> Result<Vec<(String, u64)>, WorkspaceError> {
    let listing = git::run(at, &["ls-tree", "-r", "-l", "-z", rev])?;
    Ok(listing
        .split(|b| *b == 0)
        .filter_map(|entry| {
            let tab = entry.iter().position(|b| *b == b'\t')?;
            let size = entry[..tab]
                .split(|b| *b == b' ')
                .filter(|f| !f.is_empty())
                .nth(3)?;
            let size = std::str::from_utf8(size).ok()?.trim().parse().ok()?;
            Some((
                String::from_utf8_lossy(&entry[tab + 1..]).into_owned(),
                size,
            ))
        })
        .collect())
}

/// The bytes of a directory's files (symlinks count their own length, not their target's).
fn dir_bytes(dir: &Path) -> Result<u64, WorkspaceError> {
    let mut total = 0u64;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).map_err(io(format!("reading {}", next.display())))? {
            let entry = entry.map_err(io(format!("reading {}", next.display())))?;
            let meta = entry
                .path()
                .symlink_metadata()
                .map_err(io(format!("reading {}", entry.path().display())))?;
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                total = total.saturating_add(meta.len());
            }
        }
    }
    Ok(total)
}

/// Makes the server's copy of `origin` in `root` (which must not exist yet), refusing one
/// larger than `max_bytes`. A repository's copy is its `HEAD` commit's files, with a `.git` of
/// its own so that git works in the machine; a plain directory's is the directory as it is.
pub fn seed(origin: &Origin, root: &Path, max_bytes: u64) -> Result<Workspace, WorkspaceError> {
    let tree = root.join("tree");
    let base_git = root.join("base.git");
    let shown = origin.dir.display().to_string();
    std::fs::create_dir_all(&tree).map_err(io(format!("creating {}", tree.display())))?;
    let base = match &origin.kind {
        OriginKind::Git { branch, .. } => {
            let user = At {
                dir: Some(&origin.dir),
                ..At::default()
            };
            let bytes: u64 = file_sizes(&user, "HEAD")?
                .iter()
                .map(|(_, size)| size)
                .sum();
            if bytes > max_bytes {
                return Err(WorkspaceError::TooLarge {
                    dir: shown,
                    bytes,
                    limit: max_bytes,
                });
            }
            // The branch's tip, one commit deep: the same objects as the user's, copied
            // (never hard-linked or shared through alternates, which name host paths).
            let url = format!("file://{}", origin.dir.display());
            let base_git_text = base_git.display().to_string();
            git::run(
                &At {
                    ours: true,
                    ..At::default()
                },
                &[
                    "clone",
                    "--bare",
                    "--no-local",
                    "--depth",
                    "1",
                    "--single-branch",
                    "--no-tags",
                    "--branch",
                    branch,
                    &url,
                    &base_git_text,
                ],
            )?;
            let ours = At {
                git_dir: Some(&base_git),
                ours: true,
                ..At::default()
            };
            git::line(&ours, &["rev-parse", "--verify", "HEAD^{commit}"])?
        }
        OriginKind::Plain => {
            let bytes = dir_bytes(&origin.dir)?;
            if bytes > max_bytes {
                return Err(WorkspaceError::TooLarge {
                    dir: shown,
                    bytes,
                    limit: max_bytes,
                });
            }
            copy_dir(&origin.dir, &tree)?;
            let base_git_text = base_git.display().to_string();
            git::run(
                &At {
                    ours: true,
                    ..At::default()
                },
                &["init", "--quiet", "--bare", &base_git_text],
            )?;
            let index = root.join("seed.index");
            let at = At {
                git_dir: Some(&base_git),
                work_tree: Some(&tree),
                index: Some(&index),
                ours: true,
                ..At::default()
            };
            git::run(&at, &["add", "--all", "."])?;
            let written = git::line(&at, &["write-tree"])?;
            let commit = git::line(
                &at,
                &[
                    "commit-tree",
                    &written,
                    "-m",
                    "the workspace as it was given",
                ],
            )?;
            git::run(&at, &["update-ref", "refs/heads/base", &commit])?;
            git::run(&at, &["symbolic-ref", "HEAD", "refs/heads/base"])?;
            let _ = std::fs::remove_file(&index);
            commit
        }
    };
    let workspace = Workspace {
        root: root.to_path_buf(),
        origin: origin.clone(),
        base,
        tree,
        base_git,
    };
    if matches!(origin.kind, OriginKind::Git { .. }) {
        // The files, from the server's repository into the copy.
        let index = root.join("seed.index");
        let at = workspace.at(&index);
        git::run(&at, &["read-tree", "--reset", "-u", &workspace.base])?;
        let _ = std::fs::remove_file(&index);
        // A repository of the machine's own, at the same commit, so that git status and git
        // diff work in the guest. What the guest does to it is never read here.
        let guest_git = workspace.tree.join(".git");
        copy_dir(&workspace.base_git, &guest_git)?;
        let guest = At {
            git_dir: Some(&guest_git),
            work_tree: Some(&workspace.tree),
            ours: true,
            ..At::default()
        };
        git::run(&guest, &["config", "core.bare", "false"])?;
        git::run(&guest, &["read-tree", "HEAD"])?;
    }
    Ok(workspace)
}

/// Copies a directory's contents as they are (modes, symlinks as links) with `cp -a`.
fn copy_dir(from: &Path, to: &Path) -> Result<(), WorkspaceError> {
    std::fs::create_dir_all(to).map_err(io(format!("creating {}", to.display())))?;
    let out = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .output()
        .map_err(io("running cp"))?;
    if !out.status.success() {
        return Err(WorkspaceError::Io {
            what: format!("copying {} to {}", from.display(), to.display()),
            why: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

/// How a file differs from the base.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Change {
    Added,
    Modified,
    Deleted,
    /// A file became a symlink or the other way round.
    TypeChanged,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangedFile {
    pub path: String,
    pub change: Change,
    /// Its size now (before, for a deleted one).
    pub bytes: u64,
    /// Named, not shown, in the diff.
    pub binary: bool,
}

/// What a machine changed in its workspace, and the unified diff of it (binary files named),
/// written to a file of the copy's (`changes.diff` in its root): a diff is as large as the
/// workspace, and is read a page at a time.
#[derive(Debug, Clone)]
pub struct Changes {
    pub files: Vec<ChangedFile>,
    pub diff: PathBuf,
    pub diff_bytes: u64,
}

/// A scratch file of the copy's root, unique to one operation: two at once on one copy do not
/// share an index.
fn scratch(root: &Path, what: &str) -> PathBuf {
    root.join(format!("{what}-{:08x}", rand::random::<u32>()))
}

/// Compares the copy as it is now with its base.
pub fn changes(workspace: &Workspace) -> Result<Changes, WorkspaceError> {
    let index = scratch(&workspace.root, "changes.index");
    workspace.stage(&index)?;
    let at = workspace.at(&index);
    let base = workspace.base.as_str();
    let statuses = git::run(
        &at,
        &[
            "diff",
            "--cached",
            "--name-status",
            "-z",
            "--no-renames",
            base,
        ],
    )?;
    let numstat = git::run(
        &at,
        &["diff", "--cached", "--numstat", "-z", "--no-renames", base],
    )?;
    let binary: std::collections::BTreeSet<String> = numstat
        .split(|b| *b == 0)
        .filter(|entry| entry.starts_with(b"-\t-\t"))
        .map(|entry| String::from_utf8_lossy(&entry[4..]).into_owned())
        .collect();
    let mut fields = statuses.split(|b| *b == 0).filter(|f| !f.is_empty());
    let mut files = Vec::new();
    let mut deleted = Vec::new();
    while let (Some(status), Some(path)) = (fields.next(), fields.next()) {
        let path = String::from_utf8_lossy(path).into_owned();
        let change = match status.first() {
            Some(b'A') => Change::Added,
            Some(b'D') => Change::Deleted,
            Some(b'T') => Change::TypeChanged,
            _ => Change::Modified,
        };
        let bytes = if change == Change::Deleted {
            deleted.push(files.len());
            0
        } else {
            workspace
                .tree
                .join(&path)
                .symlink_metadata()
                .map_or(0, |m| m.len())
        };
        files.push(ChangedFile {
            binary: binary.contains(&path),
            path,
            change,
            bytes,
        });
    }
    if !deleted.is_empty() {
        let by_path: std::collections::BTreeMap<String, u64> =
            file_sizes(&workspace.bare(), base)?.into_iter().collect();
        for i in deleted {
            files[i].bytes = by_path.get(&files[i].path).copied().unwrap_or(0);
        }
    }
    let written = scratch(&workspace.root, "changes.diff");
    let output = format!("--output={}", written.display());
    let diffed = git::run(
        &at,
        &[
            "diff",
            "--cached",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            "--no-renames",
            &output,
            base,
        ],
    );
    let _ = std::fs::remove_file(&index);
    diffed?;
    let diff = workspace.root.join("changes.diff");
    std::fs::rename(&written, &diff).map_err(io(format!("writing {}", diff.display())))?;
    let diff_bytes = diff.metadata().map_or(0, |m| m.len());
    Ok(Changes {
        files,
        diff,
        diff_bytes,
    })
}

/// Where a workspace's changes were kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// A new branch of the user's repository, its one commit on top of the base.
    Branch { branch: String, commit: String },
    /// A patch the user applies in the directory (`git apply`), for one in no repository.
    Patch { path: PathBuf },
}

/// Keeps the copy's changes: as a commit on a new branch `branch` of the user's repository
/// (never touching its working tree, index, `HEAD` or another ref), or for a plain directory
/// as a patch at `patch`. Refused, with nothing written, when there is nothing to keep or the
/// branch exists.
pub fn keep(
    workspace: &Workspace,
    branch: &str,
    message: &str,
    patch: &Path,
) -> Result<Kept, WorkspaceError> {
    let index = scratch(&workspace.root, "keep.index");
    let tree = workspace.stage(&index)?;
    let at = workspace.at(&index);
    let base_tree = git::line(&at, &["rev-parse", &format!("{}^{{tree}}", workspace.base)])?;
    if tree == base_tree {
        let _ = std::fs::remove_file(&index);
        return Err(WorkspaceError::NoChanges);
    }
    let kept = match workspace.origin.kind {
        OriginKind::Git { .. } => keep_as_branch(workspace, &at, &tree, branch, message)?,
        OriginKind::Plain => {
            let diff = git::run(
                &at,
                &[
                    "diff",
                    "--cached",
                    "--binary",
                    "--no-color",
                    "--no-ext-diff",
                    "--no-textconv",
                    "--no-renames",
                    &workspace.base,
                ],
            )?;
            if let Some(dir) = patch.parent() {
                std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
            }
            std::fs::write(patch, diff).map_err(io(format!("writing {}", patch.display())))?;
            Kept::Patch {
                path: patch.to_path_buf(),
            }
        }
    };
    let _ = std::fs::remove_file(&index);
    Ok(kept)
}

fn keep_as_branch(
    workspace: &Workspace,
    at: &At<'_>,
    tree: &str,
    branch: &str,
    message: &str,
) -> Result<Kept, WorkspaceError> {
    let repo = workspace.origin.dir.display().to_string();
    let user = At {
        dir: Some(&workspace.origin.dir),
        ..At::default()
    };
    if branch.starts_with('-') || !git::succeeds(&user, &["check-ref-format", "--branch", branch]) {
        return Err(WorkspaceError::BadBranchName {
            branch: branch.to_owned(),
            why: "git check-ref-format refuses it: letters, digits and / - _ . work".into(),
        });
    }
    let reference = format!("refs/heads/{branch}");
    if git::succeeds(&user, &["show-ref", "--verify", "--quiet", &reference]) {
        return Err(WorkspaceError::BranchExists {
            branch: branch.to_owned(),
            repo,
        });
    }
    let commit = git::line(
        at,
        &["commit-tree", tree, "-p", &workspace.base, "-m", message],
    )?;
    // The new objects, packed in the server's repository and unpacked in the user's: no fetch,
    // so no FETCH_HEAD, no remote, and no shallow boundary carried over.
    let wanted = format!("{commit}\n^{}\n", workspace.base);
    let pack = git::run_with(
        &workspace.bare(),
        &["pack-objects", "--revs", "--stdout", "--quiet"],
        Some(wanted.as_bytes()),
    )?;
    git::run_with(&user, &["unpack-objects", "-q"], Some(&pack))?;
    // Created only if it still does not exist: a branch made meanwhile is not overwritten.
    let none = "0".repeat(commit.len());
    git::run(&user, &["update-ref", &reference, &commit, &none]).map_err(|e| {
        if git::succeeds(&user, &["show-ref", "--verify", "--quiet", &reference]) {
            WorkspaceError::BranchExists {
                branch: branch.to_owned(),
                repo: repo.clone(),
            }
        } else {
            e
        }
    })?;
    Ok(Kept::Branch {
        branch: branch.to_owned(),
        commit,
    })
}
