//! Running the host's `git`: a clean environment, no hooks, no fsmonitor, no external diff or
//! textconv, and for the server's own repositories none of the user's configuration. A command
//! that fails is an error carrying what git said.

use super::error::{WorkspaceError, io};
use super::room::Room;
use std::io::{Read, Write};
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
    /// An object directory of the server's own that the objects written go to
    /// (`GIT_OBJECT_DIRECTORY`), the repository's own still read beside it: what one operation
    /// writes is removed with that directory, and never accumulates in the repository.
    pub objects: Option<&'a Path>,
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
    // A partial clone fetches a missing object from its promisor remote, a transport the
    // repository configures (`remote.<name>.uploadpack`, `core.sshCommand`): never.
    cmd.env("LC_ALL", "C")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_NO_LAZY_FETCH", "1");
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
    if let Some(objects) = at.objects {
        cmd.env("GIT_OBJECT_DIRECTORY", objects);
        if let Some(git_dir) = at.git_dir {
            cmd.env(
                "GIT_ALTERNATE_OBJECT_DIRECTORIES",
                quoted(&git_dir.join("objects")),
            );
        }
    }
    // Whatever the repository's configuration says, nothing it names is run. The commands run
    // in a user's repository itself are plumbing (rev-parse, symbolic-ref, show-ref,
    // unpack-objects, update-ref) that runs no filter, textconv or external diff; what they
    // could still run is turned off here: a hook (a reference-transaction hook fires on
    // update-ref), an fsmonitor (any index refresh), a pager, a credential helper, a signing
    // program, an automatic gc or maintenance. The content-reading commands run with a git
    // directory of the server's instead (shadow.rs), where no driver is defined.
    cmd.args([
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "core.fsmonitor=false",
        "-c",
        "core.pager=cat",
        "-c",
        "credential.helper=",
        "-c",
        "commit.gpgSign=false",
        "-c",
        "tag.gpgSign=false",
        "-c",
        "log.showSignature=false",
        "-c",
        "gc.auto=0",
        "-c",
        "maintenance.auto=false",
        "--no-pager",
    ]);
    if !at.ours {
        // No transport at all (ssh's `core.sshCommand`, a remote's `uploadpack`): only the
        // server's own repositories clone, from a shadow of the user's.
        cmd.args(["-c", "protocol.allow=never"]);
    }
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

/// A path as one entry of a `:`-separated alternates list: C-quoted when it holds a `:` (or
/// starts with the quote itself), as git reads a quoted entry whole.
fn quoted(path: &Path) -> std::ffi::OsString {
    let text = path.display().to_string();
    if !text.contains(':') && !text.starts_with('"') {
        return path.as_os_str().to_owned();
    }
    let mut out = String::from("\"");
    for c in text.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out.into()
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

/// Runs git with its standard output written to the file `out` (made anew), each part of it
/// taken from `room` before it is written: a diff can be as large as the copy and is never
/// held in memory. On any failure, refused room included, git is stopped and `out` removed.
pub fn run_into(
    at: &At<'_>,
    args: &[&str],
    out: &Path,
    room: &dyn Room,
) -> Result<u64, WorkspaceError> {
    let what = args.first().copied().unwrap_or("git").to_owned();
    let mut child = command(at, args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| WorkspaceError::GitMissing { why: e.to_string() })?;
    // Read from a thread: git may fill its stderr pipe while its stdout is read here.
    let said = child.stderr.take().map(|mut stderr| {
        std::thread::spawn(move || {
            let mut said = Vec::new();
            let _ = stderr.read_to_end(&mut said);
            said
        })
    });
    let copied = child
        .stdout
        .take()
        .ok_or_else(|| WorkspaceError::Io {
            what: format!("git {what}"),
            why: "no output pipe".into(),
        })
        .and_then(|stdout| copy_within(stdout, out, room));
    if copied.is_err() {
        let _ = child.kill();
    }
    let status = child.wait().map_err(|e| WorkspaceError::Io {
        what: format!("git {what}"),
        why: e.to_string(),
    });
    let said = said.and_then(|t| t.join().ok()).unwrap_or_default();
    let result = copied.and_then(|written| match status {
        Ok(status) if status.success() => Ok(written),
        Ok(_) => Err(WorkspaceError::Git {
            what,
            said: String::from_utf8_lossy(&said).trim().to_owned(),
        }),
        Err(e) => Err(e),
    });
    if result.is_err() {
        let _ = std::fs::remove_file(out);
    }
    result
}

fn copy_within(mut from: impl Read, out: &Path, room: &dyn Room) -> Result<u64, WorkspaceError> {
    let mut file = std::fs::File::create(out).map_err(io(format!("creating {}", out.display())))?;
    let mut buf = vec![0u8; 64 << 10];
    let mut written = 0u64;
    loop {
        let n = from
            .read(&mut buf)
            .map_err(io(format!("reading git's output for {}", out.display())))?;
        if n == 0 {
            break;
        }
        room.take(n as u64)?;
        file.write_all(&buf[..n])
            .map_err(io(format!("writing {}", out.display())))?;
        written += n as u64;
    }
    file.flush()
        .map_err(io(format!("writing {}", out.display())))?;
    Ok(written)
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
