//! A workspace between the server's copy and a machine: the copy sent in to `/workspace` as a
//! gzip'd tar in parts the fleets' file routes take, unpacked by the guest's own `tar`; and the
//! machine's `/workspace` read back the same way into the machine's copy on the host, to be
//! compared with its base or kept.
//!
//! Both fleets the same way, by upload, rather than the local engine's staged mount: a branch
//! child of a staged machine can never sync its copy back (engine-next-features.md), the cloud
//! has no mounts, and on the nested engine a staged mount of 10,000 files did not start within
//! the agent's 180 s where the upload took 11 s (docs/benchmarks.md).

use super::call::parts::{Cancel, Fleets, Making, Ownership, Records, Waits};
use super::{ToolError, ToolErrorKind};
use crate::fleet::internal::marked_script;
use crate::fleet::{Command, ExecSpec, Fleet};
use crate::policy::progress::Progress;
use crate::policy::terminals::Terminals;
use crate::policy::user::User;
use crate::process::config::Config;
use crate::process::workspaces::Workspaces;
use crate::process::workspaces::{Attached, OperationRoom};
use crate::workspace::{self, Room, Unpacked, Workspace, WorkspaceError};
use futures::StreamExt;
use std::path::PathBuf;
use std::sync::Arc;

/// What moving a workspace in or out takes of the call: its waits reported and cancellable.
pub(super) type Transfer<'c> = (&'c Progress, Cancel<'c>);

/// Whose host directories a call may reach: its user's, by the settings, and whether users
/// are kept apart.
pub(super) type HostDirs<'c> = (&'c User, &'c Config, Ownership<'c>);

/// Where a machine's workspace is, on every fleet.
pub const GUEST_PATH: &str = "/workspace";
/// The file routes of both fleets take 100 MiB a file: the archive goes in parts under it.
const PART_BYTES: usize = 64 << 20;
/// On the machine's disk (the cloud's `/tmp` is memory and emptied at a stop).
const INCOMING: &str = "/var/tmp/smol-workspace-in";
/// The archive a reading makes in the machine: a name of its own, as two server processes (or
/// a reading and a keep) may read one machine at once.
const OUTGOING: &str = "/var/tmp/smol-workspace-out";
/// A guest's tar of a large tree under emulation takes seconds a thousand files.
const GUEST_TAR_SECS: u64 = 900;

/// A workspace refusal or failure as a tool error: what the user or agent can act on is an
/// argument's refusal (`arg`), the rest is the server's.
pub fn refused(arg: &str, e: WorkspaceError) -> ToolError {
    match e {
        WorkspaceError::Git { .. }
        | WorkspaceError::Io { .. }
        | WorkspaceError::GitMissing { .. } => {
            ToolError::new(ToolErrorKind::Internal, e.to_string())
        }
        WorkspaceError::ServerFull { .. } => {
            ToolError::new(ToolErrorKind::LimitReached, e.to_string())
        }
        _ => ToolError::argument(arg, e),
    }
}

/// Runs blocking host work (git, tar, the file system) off the async threads.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, WorkspaceError> + Send + 'static,
) -> Result<T, WorkspaceError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| WorkspaceError::Io {
            what: "a workspace task".into(),
            why: e.to_string(),
        })?
}

fn guest_failure(what: &str, out: &crate::fleet::ExecOutput) -> ToolError {
    let said = String::from_utf8_lossy(&out.stderr);
    let said = said.trim();
    let hint = if said.contains("not found") {
        "; the workspace needs tar and gzip in the image (Alpine, Debian and Ubuntu images have them)"
    } else {
        ""
    };
    ToolError::new(
        ToolErrorKind::Internal,
        format!(
            "{what} failed in the machine (exit {}): {said}{hint}",
            out.exit_code
        ),
    )
}

async fn run_internal(
    (progress, cancel): Transfer<'_>,
    fleet: &Fleet,
    machine: &str,
    script: &str,
    what: &str,
) -> Result<(), ToolError> {
    let mut spec = ExecSpec::new(Command::Argv(vec![
        "sh".into(),
        "-c".into(),
        marked_script(script),
    ]));
    spec.timeout_secs = Some(GUEST_TAR_SECS);
    let out = progress
        .during(what, None, Box::pin(cancel.run(fleet.exec(machine, &spec))))
        .await?;
    if out.exit_code != 0 {
        return Err(guest_failure(what, &out));
    }
    Ok(())
}

/// Sends the copy `ws` into the running machine `machine` at [`GUEST_PATH`].
pub async fn send_in(
    transfer: Transfer<'_>,
    fleet: &Fleet,
    machine: &str,
    ws: &Workspace,
) -> Result<(), ToolError> {
    let tree = ws.tree().to_path_buf();
    let archive = blocking(move || workspace::pack(&tree))
        .await
        .map_err(|e| refused("workspace", e))?;
    let archive_bytes = archive.len() as u64;
    let parts: Vec<&[u8]> = archive.chunks(PART_BYTES).collect();
    for (i, part) in parts.iter().enumerate() {
        let path = format!("{INCOMING}.{i:04}");
        if let Some(why) = fleet.upload_refusal(part.len() as u64) {
            return Err(ToolError::argument("workspace", why));
        }
        let what = format!(
            "sending the workspace to {machine} ({} of {} parts, {archive_bytes} bytes)",
            i + 1,
            parts.len()
        );
        let (progress, cancel) = transfer;
        progress
            .during(
                &what,
                None,
                Box::pin(cancel.run(fleet.write_file(machine, &path, part.to_vec()))),
            )
            .await?;
    }
    let script = format!(
        "set -e; mkdir -p {GUEST_PATH}; cat {INCOMING}.* | tar -x -z -o -f - -C {GUEST_PATH}; \
         rm -f {INCOMING}.*"
    );
    run_internal(transfer, fleet, machine, &script, "unpacking the workspace").await
}

/// Reads the machine's [`GUEST_PATH`] back into its copy on the host (`attached`'s tree,
/// replaced whole), bounded by `max_bytes` (workspaceMaxBytes) and by `room`, the server's
/// room for all copies (workspaceTotalMaxBytes).
pub async fn read_back(
    transfer: Transfer<'_>,
    fleet: &Fleet,
    machine: &str,
    attached: &Attached,
    max_bytes: u64,
    room: &Arc<OperationRoom>,
) -> Result<Unpacked, ToolError> {
    // The guest's `.git` is the machine's own: never read back (its configuration could name
    // commands, and git on the host reads only the server's repository).
    let outgoing = format!("{OUTGOING}-{:08x}.tgz", rand::random::<u32>());
    let script = format!("set -e; cd {GUEST_PATH}; tar -c -z -f {outgoing} --exclude=./.git .");
    run_internal(
        transfer,
        fleet,
        machine,
        &script,
        "packing the workspace in the machine",
    )
    .await?;
    let root = attached.workspace.root.clone();
    let archive_path = workspace::scratch_path(&root, "incoming.tgz");
    let fetched = fetch(
        transfer.1,
        fleet,
        machine,
        &outgoing,
        &archive_path,
        max_bytes,
        room.as_ref(),
    )
    .await;
    // The archive is not left on the machine's disk, whatever happened to the download.
    let _ = run_internal(
        transfer,
        fleet,
        machine,
        &format!("rm -f {outgoing}"),
        "tidying up",
    )
    .await;
    if let Err(e) = fetched {
        let _ = std::fs::remove_file(&archive_path);
        return Err(e);
    }
    let tree = attached.workspace.tree().to_path_buf();
    let room = room.clone();
    blocking(move || {
        let fresh = workspace::scratch_path(&root, "tree");
        let file = std::fs::File::open(&archive_path).map_err(|e| WorkspaceError::Io {
            what: format!("opening {}", archive_path.display()),
            why: e.to_string(),
        });
        let unpacked = file.and_then(|f| {
            workspace::unpack(std::io::BufReader::new(f), &fresh, max_bytes, room.as_ref())
        });
        let archive_bytes = archive_path.metadata().map_or(0, |m| m.len());
        if std::fs::remove_file(&archive_path).is_ok() {
            room.give_back(archive_bytes);
        }
        let unpacked = match unpacked {
            Ok(u) => u,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&fresh);
                return Err(e);
            }
        };
        let old = workspace::scratch_path(&root, "old");
        let _ = std::fs::rename(&tree, &old);
        std::fs::rename(&fresh, &tree).map_err(|e| WorkspaceError::Io {
            what: format!("replacing {}", tree.display()),
            why: e.to_string(),
        })?;
        let old_bytes = workspace::bytes_under(&old);
        if std::fs::remove_dir_all(&old).is_ok() {
            room.give_back(old_bytes);
        }
        Ok(unpacked)
    })
    .await
    .map_err(|e| refused("name", e))
}

/// Downloads the machine's archive to `to`, refusing one over `max_bytes`, each part taken
/// from `room` before it is written.
async fn fetch(
    cancel: Cancel<'_>,
    fleet: &Fleet,
    machine: &str,
    from: &str,
    to: &PathBuf,
    max_bytes: u64,
    room: &OperationRoom,
) -> Result<(), ToolError> {
    use tokio::io::AsyncWriteExt;
    let stream = cancel.run(fleet.read_file(machine, from)).await?;
    if stream.size.is_some_and(|s| s > max_bytes) {
        return Err(refused(
            "name",
            WorkspaceError::ArchiveTooLarge { limit: max_bytes },
        ));
    }
    let mut chunks = stream.chunks;
    let mut file = tokio::fs::File::create(to)
        .await
        .map_err(|e| ToolError::new(ToolErrorKind::Internal, format!("{}: {e}", to.display())))?;
    let mut written = 0u64;
    loop {
        let chunk = cancel
            .run(async { chunks.next().await.transpose() })
            .await?;
        let Some(chunk) = chunk else { break };
        written += chunk.len() as u64;
        if written > max_bytes {
            return Err(refused(
                "name",
                WorkspaceError::ArchiveTooLarge { limit: max_bytes },
            ));
        }
        room.take(chunk.len() as u64)
            .map_err(|e| refused("name", e))?;
        file.write_all(&chunk).await.map_err(|e| {
            ToolError::new(ToolErrorKind::Internal, format!("{}: {e}", to.display()))
        })?;
    }
    file.flush()
        .await
        .map_err(|e| ToolError::new(ToolErrorKind::Internal, format!("{}: {e}", to.display())))?;
    Ok(())
}

/// The placeholder a `mountAllow` or `mountWritable` entry names a signed-in user's own
/// directory by: `/srv/work/{user}` is alice's `/srv/work/alice`.
pub const USER_PLACEHOLDER: &str = "{user}";

/// The directories of `entries` (`mountAllow` or `mountWritable`) this call's user may reach,
/// as written. Under sign-in, a signed-in user reaches only the entries naming
/// [`USER_PLACEHOLDER`], with their id in its place (an id that is not one plain path segment
/// names none), and the operator only the entries without it; without sign-in, the one user
/// is the operator.
pub(super) fn host_dirs_for((user, _, machines): HostDirs<'_>, entries: &[String]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|entry| {
            let per_user = entry.contains(USER_PLACEHOLDER);
            match (user.is_operator(), per_user) {
                (true, false) => Some(entry.clone()),
                (false, true) if machines.users_apart() && plain_segment(user.id()) => {
                    Some(entry.replace(USER_PLACEHOLDER, user.id()))
                }
                _ => None,
            }
        })
        .collect()
}

/// A user id that can stand for one directory's name: no separator, no `.` or `..`, no
/// character a shell or a path would read as something else.
fn plain_segment(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@' | '+'))
}

/// A host directory a machine may be given (a mount's source, a workspace): `source`
/// resolved (symlinks, `..`) and under one of the `mountAllow` directories this call's user
/// may reach ([`host_dirs_for`]); refused otherwise as `arg`, with `when_off` when the
/// operator allows none.
pub(super) fn allowed_host_dir(
    dirs: HostDirs<'_>,
    arg: &str,
    source: &str,
    when_off: &str,
) -> Result<std::path::PathBuf, ToolError> {
    let (user, config, _) = dirs;
    if config.mount_allow.is_empty() {
        return Err(ToolError::argument(arg, when_off));
    }
    let theirs = host_dirs_for(dirs, &config.mount_allow);
    if theirs.is_empty() {
        return Err(ToolError::argument(
            arg,
            if user.is_operator() {
                "the operator's mountAllow names only signed-in users' own directories (entries \
                 with {user}): copy files in with write-file instead"
                    .to_owned()
            } else if plain_segment(user.id()) {
                "no host directory is allowed to you: the operator's mountAllow names none for \
                 signed-in users (an entry with {user} would). Copy files in with write-file \
                 instead"
                    .to_owned()
            } else {
                "your user id cannot name a directory of yours (mountAllow's {user} takes \
                 letters, digits and . _ - @ +): copy files in with write-file instead"
                    .to_owned()
            },
        ));
    }
    let resolved = std::fs::canonicalize(source).map_err(|e| {
        ToolError::argument(arg, format!("{source} cannot be resolved on the host: {e}"))
    })?;
    let under = theirs
        .iter()
        .any(|dir| std::fs::canonicalize(dir).is_ok_and(|allowed| resolved.starts_with(allowed)));
    if !under {
        return Err(ToolError::argument(
            arg,
            format!(
                "{source} is not in a directory the operator allows mounting (mountAllow{}: {})",
                if user.is_operator() {
                    ""
                } else {
                    ", as it applies to you"
                },
                theirs.join(", ")
            ),
        ));
    }
    Ok(resolved)
}

/// A workspace made ready before its machine exists, so that every refusal (a directory
/// outside mountAllow, a dirty repository, one too large) comes before anything is created.
/// Its seed is removed when it is dropped, unless a machine's record names it by then.
#[derive(Debug)]
pub struct Prepared {
    pub seed: Workspace,
    attached: bool,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if !self.attached
            && let Some(seed) = self.seed.base_git().parent()
        {
            let _ = std::fs::remove_dir_all(seed);
        }
    }
}

/// Checks `dir` and makes the server's copy of it.
pub async fn prepare(
    (dirs, workspaces): (HostDirs<'_>, &Arc<Workspaces>),
    dir: &str,
) -> Result<Prepared, ToolError> {
    let resolved = allowed_host_dir(
        dirs,
        "workspace",
        dir,
        "workspaces are off on this server: the operator has allowed no host directory \
         (mountAllow). Copy files in with write-file instead",
    )?;
    let workspaces = workspaces.clone();
    let seed_dir = workspaces.new_seed_dir();
    let max_bytes = dirs.1.workspace_max_bytes;
    let seeded = {
        let seed_dir = seed_dir.clone();
        blocking(move || {
            let origin = workspace::inspect(&resolved)?;
            let room = workspaces.room();
            workspace::seed(&origin, &seed_dir, max_bytes, room.as_ref())
        })
        .await
    };
    match seeded {
        Ok(seed) => Ok(Prepared {
            seed,
            attached: false,
        }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&seed_dir);
            Err(refused("workspace", e))
        }
    }
}

impl Prepared {
    /// Sends the copy into the running machine and records it as the machine's. On failure the
    /// caller deletes the machine; the seed goes here.
    pub async fn install(
        mut self,
        (workspaces, transfer): (&Arc<Workspaces>, Transfer<'_>),
        fleet: &Fleet,
        machine: &crate::fleet::Machine,
    ) -> Result<super::results::WorkspaceIn, ToolError> {
        let attached =
            workspaces.attach(fleet.kind(), &machine.name, &machine.id, None, &self.seed);
        let sent = match attached {
            Ok(_) => send_in(transfer, fleet, &machine.id, &self.seed).await,
            Err(why) => Err(ToolError::new(ToolErrorKind::Internal, why)),
        };
        if let Err(e) = sent {
            workspaces.forget(fleet.kind(), &machine.name);
            return Err(e);
        }
        self.attached = true;
        // The files as sent are the machine's now, and what comes back is read into the
        // machine's own copy: only the base (`base.git`) is compared with, by it and by any
        // child branched from it.
        let sent_tree = self.seed.tree().to_path_buf();
        if let Err(e) = blocking(move || {
            std::fs::remove_dir_all(&sent_tree).map_err(|e| WorkspaceError::Io {
                what: format!("removing {}", sent_tree.display()),
                why: e.to_string(),
            })
        })
        .await
        {
            tracing::warn!(error = %e, "could not remove a workspace's files once sent");
        }
        Ok(self.answer())
    }

    /// What the answer says of it.
    pub fn answer(&self) -> super::results::WorkspaceIn {
        super::results::WorkspaceIn {
            path: GUEST_PATH.to_owned(),
            from: self.seed.origin.dir.display().to_string(),
            base: self.seed.base.clone(),
            branch: match &self.seed.origin.kind {
                workspace::OriginKind::Git { branch, .. } => Some(branch.clone()),
                workspace::OriginKind::Plain => None,
            },
        }
    }
}

/// Room for one reading or keep among all the server's copies (the disk measured off the
/// async threads).
async fn room_for(workspaces: &Arc<Workspaces>) -> Result<Arc<OperationRoom>, ToolError> {
    let workspaces = workspaces.clone();
    tokio::task::spawn_blocking(move || workspaces.room())
        .await
        .map_err(|e| ToolError::new(ToolErrorKind::Internal, format!("a workspace task: {e}")))
}

/// How many changed files an answer lists.
const FILES_LISTED: usize = 200;

fn no_workspace(name: &str) -> ToolError {
    ToolError::argument(
        "name",
        format!(
            "{name} has no workspace: only a machine made by create-machine with workspace (or \
             branched from one) has one. Create one with workspace set to the host directory"
        ),
    )
}

/// read-file with `changes`: the machine's `/workspace` read back and compared with its base
/// (at offset 0; a later page reads the same reading), answered as a file whose content is the
/// diff, with the changed files beside it.
pub(super) async fn read_changes(
    (machines, fleets, waits, config, workspaces, transfer): (
        Ownership<'_>,
        Fleets<'_>,
        Waits<'_>,
        &Config,
        &Arc<Workspaces>,
        Transfer<'_>,
    ),
    a: super::args::ReadFileArgs,
) -> Result<super::results::FileRead, ToolError> {
    let named = machines.machine(&a.name)?;
    if a.path.trim_end_matches('/') != GUEST_PATH {
        return Err(ToolError::argument(
            "changes",
            format!(
                "only {GUEST_PATH}, the machine's workspace, has a base to compare with: give \
                 path {GUEST_PATH}, or leave changes out to read {}",
                &*a.path
            ),
        ));
    }
    if a.encoding == Some(super::args::Encoding::Base64) {
        return Err(ToolError::argument(
            "encoding",
            "a diff is text: leave encoding out with changes (binary files are named, not shown)",
        ));
    }
    let fleet = fleets.reach(a.target).await?;
    let attached = workspaces
        .of(fleet.kind(), &named)
        .ok_or_else(|| no_workspace(&named))?;
    let _reading = workspaces.hold(fleet.kind(), &attached.name).await;
    let offset = a.offset.unwrap_or(0);
    let listed = attached.workspace.root.join("changes.json");
    let mut started_machine = false;
    let (mut files, diff_path, diff_bytes) = if offset == 0 || !listed.exists() {
        started_machine = waits.ensure_running(&fleet, &named).await?;
        let max_bytes = config.workspace_max_bytes;
        let room = room_for(workspaces).await?;
        read_back(transfer, &fleet, &named, &attached, max_bytes, &room).await?;
        let ws = attached.workspace.clone();
        let changes = blocking(move || workspace::changes(&ws, room.as_ref()))
            .await
            .map_err(|e| refused("name", e))?;
        let _ = std::fs::write(
            &listed,
            serde_json::to_vec(&changes.files).unwrap_or_default(),
        );
        (changes.files, changes.diff, changes.diff_bytes)
    } else {
        let files: Vec<workspace::ChangedFile> = std::fs::read(&listed)
            .ok()
            .and_then(|t| serde_json::from_slice(&t).ok())
            .unwrap_or_default();
        let diff = attached.workspace.root.join("changes.diff");
        let bytes = diff.metadata().map_or(0, |m| m.len());
        (files, diff, bytes)
    };
    if offset > diff_bytes {
        return Err(ToolError::argument(
            "offset",
            format!("{offset} is past the diff's end ({diff_bytes} bytes)"),
        ));
    }
    let budget = config.max_output_bytes;
    let want = a
        .length
        .map_or(budget, |l| usize::try_from(l).unwrap_or(budget));
    let page = read_page(&diff_path, offset, want)
        .map_err(|e| ToolError::new(ToolErrorKind::Internal, format!("reading the diff: {e}")))?;
    let end = offset + page.len() as u64;
    let more_files = files.len().saturating_sub(FILES_LISTED);
    files.truncate(FILES_LISTED);
    Ok(super::results::FileRead {
        path: GUEST_PATH.to_owned(),
        content: String::from_utf8_lossy(&page).into_owned(),
        mime_type: None,
        encoding: "utf8".into(),
        size: diff_bytes,
        offset,
        bytes: page.len() as u64,
        eof: end >= diff_bytes,
        started_machine,
        changes: Some(super::results::WorkspaceFiles {
            base: attached.workspace.base.clone(),
            files,
            more_files,
        }),
    })
}

/// Up to `want` bytes of `path` from `offset`, ending on a character's end.
fn read_page(path: &std::path::Path, offset: u64, want: usize) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    let mut page = Vec::with_capacity(want.min(1 << 20) + 3);
    file.take(want as u64 + 3).read_to_end(&mut page)?;
    if page.len() > want {
        let len = crate::policy::output::utf8_prefix_len(&page, want).max(1);
        page.truncate(len);
    }
    Ok(page)
}

/// The longest commit message kept.
const MAX_MESSAGE_BYTES: usize = 16 * 1024;

/// What keep-changes takes of the call: the workspace read back into the user's repository,
/// and the siblings deleted as delete-machine deletes them.
type Keeping<'c> = (
    Ownership<'c>,
    Fleets<'c>,
    Waits<'c>,
    &'c Config,
    &'c User,
    &'c Arc<Workspaces>,
    Transfer<'c>,
    (Making<'c>, Records<'c>, &'c Terminals),
);

pub(super) async fn keep_changes(
    (machines, fleets, waits, config, user, workspaces, transfer, (making, records, terminals)): Keeping<'_>,
    a: super::args::KeepArgs,
) -> Result<super::results::ChangesKept, ToolError> {
    let named = machines.machine(&a.name)?;
    let message = a.message.trim().to_owned();
    if message.is_empty() || message.len() > MAX_MESSAGE_BYTES {
        return Err(ToolError::argument(
            "message",
            format!("give the commit's message: 1 to {MAX_MESSAGE_BYTES} bytes"),
        ));
    }
    workspace::check_message(&message).map_err(|e| refused("message", e))?;
    let fleet = fleets.reach(a.target).await?;
    let attached = workspaces
        .of(fleet.kind(), &named)
        .ok_or_else(|| no_workspace(&named))?;
    let branch = a
        .branch
        .clone()
        .unwrap_or_else(|| format!("smol/{}", attached.name));
    // Refused before the machine's workspace is read back; `keep` asks the repository too.
    if matches!(
        attached.workspace.origin.kind,
        workspace::OriginKind::Git { .. }
    ) {
        workspace::check_branch(&branch).map_err(|e| refused("branch", e))?;
    }
    let siblings = if a.delete_siblings.unwrap_or(false) {
        let siblings = workspaces.siblings(fleet.kind(), &attached);
        if siblings.is_empty() {
            return Err(ToolError::argument(
                "deleteSiblings",
                format!(
                    "{} has no siblings to delete: it was not branched from a machine with other \
                     children on the same workspace. Leave deleteSiblings out",
                    named
                ),
            ));
        }
        siblings
    } else {
        Vec::new()
    };
    let reading = workspaces.hold(fleet.kind(), &attached.name).await;
    if matches!(
        attached.workspace.origin.kind,
        workspace::OriginKind::Git { .. }
    ) {
        // The branch is written into the user's repository: it must still be a directory this
        // user may reach under the settings in force now (a machine kept across a restart
        // with another mountAllow, or another user's entry).
        let origin = attached.workspace.origin.dir.display().to_string();
        allowed_host_dir(
            (user, config, machines),
            "name",
            &origin,
            "keeping changes is off on this server now: the operator allows no host directory \
             (mountAllow). Read them with read-file changes instead",
        )?;
    }
    waits.ensure_running(&fleet, &named).await?;
    let max_bytes = config.workspace_max_bytes;
    let room = room_for(workspaces).await?;
    read_back(transfer, &fleet, &named, &attached, max_bytes, &room).await?;
    let patch = workspaces.patch_path(&attached.name);
    let ws = attached.workspace.clone();
    let kept = blocking(move || workspace::keep(&ws, &branch, &message, &patch, room.as_ref()))
        .await
        .map_err(|e| match e {
            WorkspaceError::BranchExists { .. } | WorkspaceError::BadBranchName { .. } => {
                refused("branch", e)
            }
            WorkspaceError::BadMessage { .. } => refused("message", e),
            e => refused("name", e),
        })?;
    drop(reading);
    let mut deleted = Vec::new();
    for sibling in &siblings {
        // The siblings go only once the kept one's changes are safe in the user's repository.
        match transfer.1.run(fleet.delete(&sibling.id)).await {
            Ok(gone) => {
                making
                    .released(fleet.kind(), &sibling.name, gone.usage_micros)
                    .await;
                workspaces.forget(fleet.kind(), &sibling.name);
                records.made().deleted(fleet.kind(), &sibling.name, None);
                terminals.close_machine(fleet.kind(), &sibling.name);
                if sibling.name.starts_with(&config.machine_prefix) {
                    records.forget(fleet.kind(), &sibling.name).await;
                }
                deleted.push(sibling.name.clone());
            }
            Err(e) if e.is(crate::fleet::ErrorKind::NotFound) => {
                workspaces.forget(fleet.kind(), &sibling.name);
            }
            Err(e) => {
                return Err(ToolError::new(
                    e.kind,
                    format!(
                        "the changes were kept ({}), but deleting the sibling {} failed: {}; \
                         delete-machine removes it (deleted so far: {})",
                        describe(&kept),
                        sibling.name,
                        e.message,
                        if deleted.is_empty() {
                            "none".to_owned()
                        } else {
                            deleted.join(", ")
                        }
                    ),
                ));
            }
        }
    }
    let repo = attached.workspace.origin.dir.display().to_string();
    Ok(match kept {
        workspace::Kept::Branch { branch, commit } => super::results::ChangesKept {
            review: format!(
                "git -C {repo} diff {base}..{branch}, then git -C {repo} merge {branch}",
                base = short(&attached.workspace.base),
            ),
            branch: Some(branch),
            commit: Some(commit),
            patch: None,
            deleted,
        },
        workspace::Kept::Patch { path } => super::results::ChangesKept {
            review: format!("cd {repo} && git apply {}", path.display()),
            branch: None,
            commit: None,
            patch: Some(path.display().to_string()),
            deleted,
        },
    })
}

fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}

fn describe(kept: &workspace::Kept) -> String {
    match kept {
        workspace::Kept::Branch { branch, commit } => {
            format!("branch {branch} at {}", short(commit))
        }
        workspace::Kept::Patch { path } => format!("patch {}", path.display()),
    }
}
