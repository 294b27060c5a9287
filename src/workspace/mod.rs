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
//! guest's `.git/config` (a hook, an fsmonitor, an external diff) never runs on the host. The
//! user's repository is as much the machine's to write (a writable mount of it), so what reads
//! its content does so through a git directory of the server's (shadow.rs), and a repository
//! whose git directory is outside the directory given is refused.
//!
//! Git through its CLI rather than a library: the host's git is the one the user's repository
//! is made with (its object format, its extensions), a plumbing command line is a stable
//! interface, and every operation here is one or two of them.

mod archive;
mod error;
mod git;
mod room;
mod shadow;

pub use archive::{Unpacked, pack, unpack};
pub use error::WorkspaceError;
use error::io;
use git::At;
pub use room::{Room, Unbounded};
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

/// The most git writes to store `files` files of `bytes` bytes as objects (zlib's worst case
/// on incompressible content, each object's header and file, the trees naming them) and an
/// index of them, with room for a repository's template files.
fn objects_at_most(bytes: u64, files: u64) -> u64 {
    bytes
        .saturating_add(bytes / 64)
        .saturating_add(files.saturating_mul(512))
        .saturating_add(128 << 10)
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
    let Some(repo) = locate_inside(&dir, &shown)? else {
        return Ok(Origin {
            dir,
            kind: OriginKind::Plain,
        });
    };
    let at = At {
        dir: Some(&dir),
        ..At::default()
    };
    let head = git::line(&at, &["rev-parse", "--verify", "--quiet", "HEAD^{commit}"])
        .map_err(|_| WorkspaceError::Unborn { dir: shown.clone() })?;
    let branch = git::line(&at, &["symbolic-ref", "--quiet", "--short", "HEAD"])
        .map_err(|_| WorkspaceError::Detached { dir: shown.clone() })?;
    // Through a shadow git directory (shadow.rs): status reads every file's content, through
    // whatever filter the repository's configuration defines. Submodules are not looked into
    // (each has a configuration of its own); the copy is of the commit, which records only
    // their commit ids.
    let shadow = shadow::Shadow::new(&std::env::temp_dir(), &repo, &head)?;
    let status = git::run(
        &At {
            dir: Some(&dir),
            git_dir: Some(shadow.dir()),
            work_tree: Some(&dir),
            ..At::default()
        },
        &[
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=all",
            "--ignore-submodules=all",
        ],
    )?;
    drop(shadow);
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

/// The repository `dir` (canonical) is in, refused unless `dir` is its root and its git
/// directory is inside `dir`: a `.git` file or symlink, or a worktree, can name a repository
/// anywhere on the host, outside what the operator allowed, and a refusal then names nothing
/// of it. `None` for a directory in no repository.
fn locate_inside(dir: &Path, shown: &str) -> Result<Option<shadow::Located>, WorkspaceError> {
    let Some(repo) = shadow::locate(dir)? else {
        return Ok(None);
    };
    let inside = |root: &Path| repo.git_dir.starts_with(root) && repo.common_dir.starts_with(root);
    if repo.top != dir {
        if dir.starts_with(&repo.top) && inside(&repo.top) {
            return Err(WorkspaceError::NotRepositoryRoot {
                dir: shown.to_owned(),
                root: repo.top.display().to_string(),
            });
        }
        return Err(WorkspaceError::GitDirOutside {
            dir: shown.to_owned(),
        });
    }
    if !inside(dir) {
        return Err(WorkspaceError::GitDirOutside {
            dir: shown.to_owned(),
        });
    }
    Ok(Some(repo))
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

    /// The server's repository, the copy as its work tree, and an index file and an object
    /// directory of one operation's own.
    fn at<'a>(&'a self, scratch: &'a Scratch) -> At<'a> {
        At {
            git_dir: Some(&self.base_git),
            work_tree: Some(&self.tree),
            index: Some(&scratch.index),
            objects: Some(&scratch.objects),
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

    /// Stages the whole copy, as it is now, into the scratch's fresh index (its blobs into the
    /// scratch's objects), and answers the tree it makes. Paths named `.git` are never staged
    /// (git's own rule).
    fn stage(&self, scratch: &Scratch, room: &dyn Room) -> Result<String, WorkspaceError> {
        let (bytes, files) = dir_size(&self.tree)?;
        room.take(objects_at_most(bytes, files))?;
        let at = self.at(scratch);
        git::run(&at, &["read-tree", &self.base])?;
        git::run(&at, &["add", "--all", "."])?;
        git::line(&at, &["write-tree"])
    }
}

/// What one operation on a copy writes beside it: an index, and an object directory for the
/// blobs, trees and commit it makes. The server's repository holds only the base: a reading
/// stages the whole copy, and its objects written there would stay, each reading's large
/// file adding to the last's. Removed when dropped, so the objects a reading made go with it,
/// and a keep's go once they are in the user's repository.
struct Scratch {
    index: PathBuf,
    objects: PathBuf,
}

impl Scratch {
    /// Names unique to one operation: two at once on one copy share nothing.
    fn new(root: &Path, what: &str) -> Result<Scratch, WorkspaceError> {
        let scratch = Scratch {
            index: scratch_path(root, &format!("{what}.index")),
            objects: scratch_path(root, &format!("{what}.objects")),
        };
        std::fs::create_dir_all(&scratch.objects)
            .map_err(io(format!("creating {}", scratch.objects.display())))?;
        Ok(scratch)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.index);
        let _ = std::fs::remove_dir_all(&self.objects);
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

/// The bytes of a directory's files (symlinks count their own length, not their target's)
/// and how many there are.
fn dir_size(dir: &Path) -> Result<(u64, u64), WorkspaceError> {
    let (mut bytes, mut files) = (0u64, 0u64);
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
                bytes = bytes.saturating_add(meta.len());
                files += 1;
            }
        }
    }
    Ok((bytes, files))
}

fn dir_bytes(dir: &Path) -> Result<u64, WorkspaceError> {
    Ok(dir_size(dir)?.0)
}

/// The bytes of the files under `dir` as far as they can be read now: what the server's copies
/// take on the disk. Entries that go while they are counted (another operation's scratch) are
/// passed over; a missing `dir` holds nothing.
pub fn bytes_under(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                total = total.saturating_add(meta.len());
            }
        }
    }
    total
}

/// Makes the server's copy of `origin` in `root` (which must not exist yet), refusing one
/// larger than `max_bytes` or than `room` has. A repository's copy is its `HEAD` commit's
/// files, with a `.git` of its own so that git works in the machine; a plain directory's is
/// the directory as it is.
pub fn seed(
    origin: &Origin,
    root: &Path,
    max_bytes: u64,
    room: &dyn Room,
) -> Result<Workspace, WorkspaceError> {
    let tree = root.join("tree");
    let base_git = root.join("base.git");
    let shown = origin.dir.display().to_string();
    std::fs::create_dir_all(&tree).map_err(io(format!("creating {}", tree.display())))?;
    let base = match &origin.kind {
        OriginKind::Git { head, branch } => {
            // Located again: the repository may have changed since it was inspected.
            let shown_dir = origin.dir.display().to_string();
            let repo = locate_inside(&origin.dir, &shown_dir)?.ok_or_else(|| {
                WorkspaceError::NotADirectory {
                    dir: shown_dir.clone(),
                }
            })?;
            // The commit inspected, read and copied through a shadow (shadow.rs): the clone's
            // upload-pack runs in a repository of the server's, not in the user's.
            let shadow = shadow::Shadow::new(root, &repo, head)?;
            let sizes = file_sizes(&shadow.at_bare(), head)?;
            let bytes: u64 = sizes.iter().map(|(_, size)| size).sum();
            if bytes > max_bytes {
                return Err(WorkspaceError::TooLarge {
                    dir: shown,
                    bytes,
                    limit: max_bytes,
                });
            }
            let files = sizes.len() as u64;
            // The server's repository, the files, and the machine's own repository (a copy of
            // the server's, measured once it exists).
            room.take(objects_at_most(bytes, files))?;
            room.take(bytes.saturating_add(files.saturating_mul(512)))?;
            git::run(
                &shadow.at_bare(),
                &["update-ref", &format!("refs/heads/{branch}"), head],
            )?;
            // The branch's tip, one commit deep: the same objects as the user's, copied
            // (never hard-linked or shared through alternates, which name host paths).
            let url = format!("file://{}", shadow.dir().display());
            let base_git_text = base_git.display().to_string();
            git::run(
                &At {
                    ours: true,
                    ..At::default()
                },
                &[
                    "clone",
                    "--quiet",
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
            drop(shadow);
            let ours = At {
                git_dir: Some(&base_git),
                ours: true,
                ..At::default()
            };
            // The remote names the shadow, gone now (and a host path, which the machine's copy
            // of this repository would show).
            let _ = git::run(&ours, &["config", "--remove-section", "remote.origin"]);
            git::line(&ours, &["rev-parse", "--verify", "HEAD^{commit}"])?
        }
        OriginKind::Plain => {
            let (bytes, files) = dir_size(&origin.dir)?;
            if bytes > max_bytes {
                return Err(WorkspaceError::TooLarge {
                    dir: shown,
                    bytes,
                    limit: max_bytes,
                });
            }
            // The files, and the server's repository of them.
            room.take(bytes)?;
            room.take(objects_at_most(bytes, files))?;
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
        let scratch = Scratch::new(root, "seed")?;
        git::run(
            &workspace.at(&scratch),
            &["read-tree", "--reset", "-u", &workspace.base],
        )?;
        drop(scratch);
        // A repository of the machine's own, at the same commit, so that git status and git
        // diff work in the guest. What the guest does to it is never read here.
        let guest_git = workspace.tree.join(".git");
        room.take(dir_bytes(&workspace.base_git)?)?;
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

/// A scratch file or directory of the copy's root, unique to one operation: two at once on one
/// copy share nothing. Gone when the operation ends; one a process ended during is recognised
/// by [`is_scratch`] and swept.
pub fn scratch_path(root: &Path, what: &str) -> PathBuf {
    root.join(format!("{what}-{:08x}", rand::random::<u32>()))
}

/// Whether a name in a copy's root is one [`scratch_path`] made.
pub fn is_scratch(name: &str) -> bool {
    name.rsplit_once('-').is_some_and(|(stem, suffix)| {
        !stem.is_empty()
            && suffix.len() == 8
            && suffix
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Compares the copy as it is now with its base, what it writes taken from `room`.
pub fn changes(workspace: &Workspace, room: &dyn Room) -> Result<Changes, WorkspaceError> {
    let scratch = Scratch::new(&workspace.root, "changes")?;
    workspace.stage(&scratch, room)?;
    let at = workspace.at(&scratch);
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
    let written = scratch_path(&workspace.root, "changes.diff");
    let diffed = git::run_into(
        &at,
        &[
            "diff",
            "--cached",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            "--no-renames",
            base,
        ],
        &written,
        room,
    );
    drop(scratch);
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

/// The longest branch name kept, in bytes. In the files ref store each `/`-separated part of
/// `refs/heads/<branch>.lock` is a file name (255 bytes at most on common file systems), and a
/// name git cannot lock fails only once the commit's objects are written: a bound well under
/// that refuses it first.
pub const MAX_BRANCH_BYTES: usize = 200;

/// What a refused branch name is told.
const BRANCH_RULE: &str = "letters, digits and / - _ . work, up to 200 bytes; not HEAD or @, \
                           not starting with refs/ or -, without .. or @{";

/// Refuses a branch name git would read as something other than a new branch of its own
/// (`@` and `HEAD` are the checked-out commit, `refs/heads/main` is `main` itself), or could not
/// store. Checked without git, so a tool refuses it before reading anything back;
/// [`keep`] also asks the repository (a tag or a commit id of that name, a branch in the way).
pub fn check_branch(branch: &str) -> Result<(), WorkspaceError> {
    let why = if branch.is_empty() {
        Some("it is empty".to_owned())
    } else if branch.len() > MAX_BRANCH_BYTES {
        Some(format!("it is {} bytes long", branch.len()))
    } else if branch == "@" || branch.eq_ignore_ascii_case("HEAD") {
        Some("git reads it as the commit checked out".to_owned())
    } else if branch.ends_with("HEAD")
        && branch.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
    {
        Some("git reads it as one of its own references (FETCH_HEAD, ORIG_HEAD)".to_owned())
    } else if branch.starts_with("refs/") {
        Some("git reads it as a full reference name, not a branch's".to_owned())
    } else if branch.starts_with('-') {
        Some("git reads it as an option".to_owned())
    } else if branch.contains("..") || branch.contains("@{") {
        Some("git reads it as a range or a reflog entry".to_owned())
    } else if branch.contains('\\') || branch.chars().any(char::is_control) {
        Some("it holds a backslash or a control character".to_owned())
    } else {
        None
    };
    match why {
        Some(why) => Err(bad_branch(branch, &why)),
        None => Ok(()),
    }
}

fn bad_branch(branch: &str, why: &str) -> WorkspaceError {
    // Shown escaped and cut short: the name is the caller's, and is echoed in an answer.
    let mut shown: String = branch.escape_debug().take(80).collect();
    if shown.len() < branch.escape_debug().count() {
        shown.push('…');
    }
    WorkspaceError::BadBranchName {
        branch: shown,
        why: format!("{why}: {BRANCH_RULE}"),
    }
}

/// Refuses a commit message git cannot carry or a terminal would act on: a NUL ends an
/// argument, other control characters (an escape sequence) would run in the user's
/// `git log`. Line breaks and tabs are kept.
pub fn check_message(message: &str) -> Result<(), WorkspaceError> {
    match message
        .chars()
        .find(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r'))
    {
        Some(c) => Err(WorkspaceError::BadMessage {
            why: format!(
                "holds the control character U+{:04X}: give text (line breaks and tabs are kept)",
                u32::from(c)
            ),
        }),
        None => Ok(()),
    }
}

/// Keeps the copy's changes: as a commit on a new branch `branch` of the user's repository
/// (never touching its working tree, index, `HEAD` or another ref), or for a plain directory
/// as a patch at `patch`. Refused, with nothing written, when there is nothing to keep or the
/// branch exists. What it writes among the server's copies is taken from `room`.
pub fn keep(
    workspace: &Workspace,
    branch: &str,
    message: &str,
    patch: &Path,
    room: &dyn Room,
) -> Result<Kept, WorkspaceError> {
    check_message(message)?;
    if matches!(workspace.origin.kind, OriginKind::Git { .. }) {
        check_branch(branch)?;
    }
    let scratch = Scratch::new(&workspace.root, "keep")?;
    let tree = workspace.stage(&scratch, room)?;
    let at = workspace.at(&scratch);
    let base_tree = git::line(&at, &["rev-parse", &format!("{}^{{tree}}", workspace.base)])?;
    if tree == base_tree {
        return Err(WorkspaceError::NoChanges);
    }
    let kept = match workspace.origin.kind {
        OriginKind::Git { .. } => keep_as_branch(workspace, &at, &tree, branch, message)?,
        OriginKind::Plain => {
            if let Some(dir) = patch.parent() {
                std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
            }
            git::run_into(
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
                patch,
                room,
            )?;
            Kept::Patch {
                path: patch.to_path_buf(),
            }
        }
    };
    drop(scratch);
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
    check_branch(branch)?;
    // Located again, and named explicitly from here on: what was inspected may since have
    // become a `.git` file naming a repository outside the directory.
    let located = locate_inside(&workspace.origin.dir, &repo)?
        .ok_or_else(|| WorkspaceError::NotADirectory { dir: repo.clone() })?;
    let user = At {
        dir: Some(&workspace.origin.dir),
        git_dir: Some(&located.git_dir),
        ..At::default()
    };
    let reference = format!("refs/heads/{branch}");
    // Git's own rules, by the server's repository: nothing of the user's is read for them.
    if !git::succeeds(&workspace.bare(), &["check-ref-format", &reference]) {
        return Err(bad_branch(branch, "git check-ref-format refuses it"));
    }
    if git::succeeds(&user, &["show-ref", "--verify", "--quiet", &reference]) {
        return Err(WorkspaceError::BranchExists {
            branch: branch.to_owned(),
            repo,
        });
    }
    // A name that already means something to git here (a tag, a commit id or its prefix, a
    // pseudo-ref) would be read as that, not as the new branch, in the review the answer
    // gives.
    if git::succeeds(&user, &["rev-parse", "--verify", "--quiet", branch]) {
        return Err(bad_branch(
            branch,
            "git already reads it as a tag, a commit or another reference of the repository",
        ));
    }
    // The ref's creation rehearsed and abandoned before any object is written: a branch in the
    // way (`main` for `main/x`) or a name the ref store cannot hold is refused here rather
    // than after the commit's objects are in the repository.
    let rehearsal = format!(
        "start\ncreate {reference} {base}\nprepare\nabort\n",
        base = workspace.base
    );
    if let Err(e) = git::run_with(
        &user,
        &["update-ref", "--stdin"],
        Some(rehearsal.as_bytes()),
    ) {
        let said = match e {
            WorkspaceError::Git { said, .. } => said,
            other => return Err(other),
        };
        return Err(bad_branch(
            branch,
            &format!("the repository cannot hold it ({said})"),
        ));
    }
    let commit = git::line(
        at,
        &["commit-tree", tree, "-p", &workspace.base, "-m", message],
    )?;
    // The new objects, packed in the server's repository and unpacked in the user's: no fetch,
    // so no FETCH_HEAD, no remote, and no shallow boundary carried over.
    let wanted = format!("{commit}\n^{}\n", workspace.base);
    // The commit and the copy's objects are in the operation's scratch objects (`at`).
    let pack = git::run_with(
        at,
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
