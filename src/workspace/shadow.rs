//! A user's repository read through a git directory of the server's own.
//!
//! Everything under a user's repository may have been written by a machine (a writable mount
//! of it), so its configuration is the attacker's: a filter (`clean`, `smudge`, `process`) or a
//! `textconv` named by an attribute, an fsmonitor, a submodule's own configuration, an include
//! pulling in any of these. Driver names are the repository's to choose, so no fixed list of
//! `-c` overrides can undefine them all. What reads the repository's content (the clean-tree
//! check, the copy of its commit) therefore runs with `--git-dir` a shadow: a temporary git
//! directory whose configuration the server writes, borrowing the repository's objects
//! (`objects/info/alternates`), a copy of its index, and `HEAD` as the commit already
//! resolved. The working tree is the user's directory, read as it is; its `.gitattributes` can
//! only name drivers, which the shadow does not define. The operator's global and system
//! configuration are still read: they are the host's, which no machine can write, and they are
//! what makes the check agree with the user's own `git status` (a `core.excludesFile`, an LFS
//! filter a large file's stat change sends it through).
//!
//! The commands that must run in the user's repository itself (resolving `HEAD`, writing the
//! kept branch's objects and ref) are plumbing that runs no driver; what else they could run is
//! disabled in `git.rs`.

use super::error::{WorkspaceError, io};
use super::git::{self, At};
use std::path::{Path, PathBuf};

/// Where a user's repository keeps itself, as git reports it from its root.
#[derive(Debug, Clone)]
pub(super) struct Located {
    /// The working tree's root, canonical.
    pub top: PathBuf,
    /// The git directory (`.git`), canonical.
    pub git_dir: PathBuf,
    /// The directory shared by its worktrees (objects, config, refs), canonical.
    pub common_dir: PathBuf,
    /// `sha1` or `sha256`.
    pub object_format: String,
}

/// Finds the repository `dir` is in, if any: `None` for a directory in no repository (or in a
/// git directory, which has no working tree).
pub(super) fn locate(dir: &Path) -> Result<Option<Located>, WorkspaceError> {
    let at = At {
        dir: Some(dir),
        ..At::default()
    };
    let Ok(out) = git::run(
        &at,
        &[
            "rev-parse",
            "--path-format=absolute",
            "--show-toplevel",
            "--git-dir",
            "--git-common-dir",
            "--show-object-format",
        ],
    ) else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&out);
    let mut lines = text.lines();
    let (Some(top), Some(git_dir), Some(common_dir), Some(format)) =
        (lines.next(), lines.next(), lines.next(), lines.next())
    else {
        return Err(WorkspaceError::Git {
            what: "rev-parse".into(),
            said: format!("an answer of fewer lines than asked for: {text}"),
        });
    };
    let resolve = |path: &str| std::fs::canonicalize(path).map_err(io(format!("resolving {path}")));
    Ok(Some(Located {
        top: resolve(top)?,
        git_dir: resolve(git_dir)?,
        common_dir: resolve(common_dir)?,
        object_format: format.trim().to_owned(),
    }))
}

/// Settings of the user's repository that change what a clean tree looks like (modes, case,
/// line endings, which stat fields count) and run nothing: copied into the shadow, so that a
/// repository on a file system without modes or on a case-insensitive one is not seen as
/// changed. Any other setting is left behind.
const COPIED: &[&str] = &[
    "core.filemode",
    "core.symlinks",
    "core.ignorecase",
    "core.precomposeunicode",
    "core.autocrlf",
    "core.eol",
    "core.safecrlf",
    "core.checkstat",
    "core.trustctime",
];

/// A shadow git directory, removed when dropped.
#[derive(Debug)]
pub(super) struct Shadow {
    dir: PathBuf,
}

impl Drop for Shadow {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Shadow {
    /// Makes a shadow of `repo` in a new directory under `parent`, its `HEAD` at `head`.
    pub(super) fn new(parent: &Path, repo: &Located, head: &str) -> Result<Shadow, WorkspaceError> {
        let format = match repo.object_format.as_str() {
            "sha1" => None,
            "sha256" => Some("sha256"),
            other => {
                return Err(WorkspaceError::Git {
                    what: "rev-parse".into(),
                    said: format!("an object format this server does not know: {other}"),
                });
            }
        };
        let objects = repo.common_dir.join("objects");
        let objects_text = objects.display().to_string();
        if objects_text.contains('\n') {
            // One alternate a line: a name with a line break would name two.
            return Err(WorkspaceError::Io {
                what: "reading the repository's objects".into(),
                why: "its path holds a line break".into(),
            });
        }
        std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
        let dir = parent.join(format!("shadow-{:016x}.git", rand::random::<u64>()));
        // `create_dir`, not `_all`: a directory already there (another's) is never shared.
        std::fs::create_dir(&dir).map_err(io(format!("creating {}", dir.display())))?;
        let shadow = Shadow { dir };
        let dir = &shadow.dir;
        for sub in ["objects/info", "refs", "info"] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(io(format!("creating {}", path.display())))?;
        }
        write(&dir.join("HEAD"), &format!("{head}\n"))?;
        write(
            &dir.join("objects/info/alternates"),
            &format!("{objects_text}\n"),
        )?;
        let mut config = String::from("[core]\n\tbare = false\n");
        if let Some(format) = format {
            config = format!(
                "[core]\n\trepositoryformatversion = 1\n\tbare = false\n[extensions]\n\t\
                 objectformat = {format}\n"
            );
        } else {
            config.push_str("\trepositoryformatversion = 0\n");
        }
        write(&dir.join("config"), &config)?;
        // Read as a file, without its includes: only the settings named are taken, each only
        // with a plain word for a value (a boolean, `input`, `lf`), so nothing of it is quoted
        // into the shadow's configuration.
        let listing = git::run(
            &shadow.at_bare(),
            &[
                "config",
                "--file",
                &repo.common_dir.join("config").display().to_string(),
                "--no-includes",
                "--null",
                "--list",
            ],
        )
        .unwrap_or_default();
        let mut copied = String::new();
        for entry in listing.split(|b| *b == 0) {
            let entry = String::from_utf8_lossy(entry);
            let Some((key, value)) = entry.split_once('\n') else {
                continue;
            };
            let plain = !value.is_empty()
                && value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if plain && COPIED.contains(&key) {
                copied.push_str(&format!("\t{key_name} = {value}\n", key_name = &key[5..]));
            }
        }
        if !copied.is_empty() {
            config.push_str("[core]\n");
            config.push_str(&copied);
            write(&dir.join("config"), &config)?;
        }
        // The index (and a split index's shared part), so that the check compares stat data as
        // the user's own status would; the excludes and attributes, which only name patterns and
        // drivers. Regular files only: a symlink there is not followed out of the repository.
        copy_file(&repo.git_dir.join("index"), &dir.join("index"))?;
        if let Ok(entries) = std::fs::read_dir(&repo.git_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                if name.to_string_lossy().starts_with("sharedindex.") {
                    copy_file(&entry.path(), &dir.join(&name))?;
                }
            }
        }
        for file in ["info/exclude", "info/attributes"] {
            copy_file(&repo.common_dir.join(file), &dir.join(file))?;
        }
        Ok(shadow)
    }

    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The shadow as a repository of the server's, for plumbing on the user's objects.
    pub(super) fn at_bare(&self) -> At<'_> {
        At {
            git_dir: Some(&self.dir),
            ours: true,
            ..At::default()
        }
    }
}

fn write(path: &Path, text: &str) -> Result<(), WorkspaceError> {
    std::fs::write(path, text).map_err(io(format!("writing {}", path.display())))
}

/// Copies `from` if it is a regular file; anything else (missing, a symlink) is left out.
fn copy_file(from: &Path, to: &Path) -> Result<(), WorkspaceError> {
    match from.symlink_metadata() {
        Ok(meta) if meta.is_file() => std::fs::copy(from, to)
            .map(|_| ())
            .map_err(io(format!("copying {}", from.display()))),
        _ => Ok(()),
    }
}
