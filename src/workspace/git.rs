//! Running the host's `git`: a clean environment, no hooks, no fsmonitor, no external diff or
//! textconv, and for the server's own repositories none of the user's configuration. A command
//! that fails is an error carrying what git said.

use super::error::WorkspaceError;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where a git command runs and what it may read.
#[derive(Debug, Clone, Default)]
pub struct At<'a> {
    /// The working directory (`-C`).
    pub dir: Option<&'a Path>,
    /// A repository named explicitly (`--git-dir`): never one found by walking up from `dir`.
    pub git_dir: Option<&'a Path>,
    pub work_tree: Option<&'a Path>,
    /// An index file of the server's own (`GIT_INDEX_FILE`), so the repository's is untouched.
    pub index: Option<&'a Path>,
    /// A repository of the server's own: the user's global and system configuration are not
    /// read (an `init.defaultBranch`, a `diff.external`, an alias cannot change what it does).
    pub ours: bool,
}

/// The identity of the commits the server writes.
const AUTHOR: [(&str, &str); 4] = [
    ("GIT_AUTHOR_NAME", "smol-mcp"),
    ("GIT_AUTHOR_EMAIL", "smol-mcp@localhost"),
    ("GIT_COMMITTER_NAME", "smol-mcp"),
    ("GIT_COMMITTER_EMAIL", "smol-mcp@localhost"),
];

fn command(at: &At<'_>, args: &[&str]) -> Command {
    let mut cmd = Command::new(program());
    cmd.env_clear();
    for var in ["PATH", "HOME", "TMPDIR"] {
        if let Some(value) = std::env::var_os(var) {
            cmd.env(var, value);
        }
    }
    cmd.env("LC_ALL", "C").env("GIT_TERMINAL_PROMPT", "0");
    if at.ours {
        cmd.env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null");
    }
    for (k, v) in AUTHOR {
        cmd.env(k, v);
    }
    if let Some(index) = at.index {
        cmd.env("GIT_INDEX_FILE", index);
    }
    // Whatever the repository's configuration says, nothing it names is run: no hook (a
    // reference-transaction hook fires on update-ref), no fsmonitor, no pager.
    cmd.args([
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "core.fsmonitor=false",
        "-c",
        "core.pager=cat",
        "--no-pager",
    ]);
    if let Some(dir) = at.dir {
        cmd.arg("-C").arg(dir);
    }
    if let Some(git_dir) = at.git_dir {
        cmd.arg("--git-dir").arg(git_dir);
    }
    if let Some(work_tree) = at.work_tree {
        cmd.arg("--work-tree").arg(work_tree);
    }
    cmd.args(args);
    cmd
}

/// The git program: `$SMOL_MCP_GIT` for tests that need another, else `git` on `PATH`.
fn program() -> PathBuf {
    std::env::var_os("SMOL_MCP_GIT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("git"))
}

/// Runs git and answers its standard output; a non-zero exit is `WorkspaceError::Git`.
pub fn run(at: &At<'_>, args: &[&str]) -> Result<Vec<u8>, WorkspaceError> {
    run_with(at, args, None)
}

/// The same, with `input` on standard input.
pub fn run_with(
    at: &At<'_>,
    args: &[&str],
    input: Option<&[u8]>,
) -> Result<Vec<u8>, WorkspaceError> {
    let what = args.first().copied().unwrap_or("git").to_owned();
    let mut cmd = command(at, args);
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| WorkspaceError::GitMissing { why: e.to_string() })?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        // Written from a thread: git may fill its stdout pipe before it has read all of stdin.
        let input = input.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
    }
    let out = child.wait_with_output().map_err(|e| WorkspaceError::Io {
        what: format!("git {what}"),
        why: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(WorkspaceError::Git {
            what,
            said: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(out.stdout)
}

/// Standard output as one trimmed line.
pub fn line(at: &At<'_>, args: &[&str]) -> Result<String, WorkspaceError> {
    Ok(String::from_utf8_lossy(&run(at, args)?).trim().to_owned())
}

/// Whether git succeeds (for questions asked by exit status: does this ref exist?).
pub fn succeeds(at: &At<'_>, args: &[&str]) -> bool {
    command(at, args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
