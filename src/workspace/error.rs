//! What a workspace operation refuses or fails with, each saying what to do.

/// An I/O failure as a workspace error, saying what was being done.
pub(super) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> WorkspaceError {
    let what = what.into();
    move |e| WorkspaceError::Io {
        what,
        why: e.to_string(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("{dir} is not a directory on this host")]
    NotADirectory { dir: String },
    #[error(
        "{dir} is inside the git repository {root}: give the repository's root, whose current \
         commit the machine gets"
    )]
    NotRepositoryRoot { dir: String, root: String },
    #[error(
        "{dir} has no branch checked out (a detached HEAD): check out the branch the changes \
         should start from"
    )]
    Detached { dir: String },
    #[error("{dir} is a git repository without a commit: commit something first")]
    Unborn { dir: String },
    #[error(
        "{dir} has uncommitted changes ({paths}): commit or stash them first; the machine gets \
         the commit you are on, and its changes come back as a branch from it"
    )]
    Dirty { dir: String, paths: String },
    #[error(
        "{dir} holds {bytes} bytes, over the {limit} a workspace may (workspaceMaxBytes): give \
         a smaller directory, or ask the operator for a larger bound"
    )]
    TooLarge { dir: String, bytes: u64, limit: u64 },
    #[error("{branch} exists in {repo}: give another branch name (nothing was written)")]
    BranchExists { branch: String, repo: String },
    #[error("{branch} is not a valid branch name ({why})")]
    BadBranchName { branch: String, why: String },
    #[error("the commit message {why}")]
    BadMessage { why: String },
    #[error(
        "{dir} keeps its git repository outside it (a .git file or symlink naming another \
         directory, or a worktree of another repository): give the directory that holds the \
         repository's .git directory itself"
    )]
    GitDirOutside { dir: String },
    #[error("the machine has not changed its workspace: nothing to keep")]
    NoChanges,
    #[error(
        "the machine's /workspace is over the {limit} bytes a workspace may hold \
         (workspaceMaxBytes): remove build outputs from it (or build outside /workspace) and ask \
         again"
    )]
    ArchiveTooLarge { limit: u64 },
    #[error(
        "the server's workspace copies are at their bound (workspaceTotalMaxBytes, {limit} bytes \
         for all of them): {need} bytes more do not fit, and nothing of them was written. Delete \
         machines with a workspace you no longer need (their copies go with them), or ask the \
         operator for a larger bound"
    )]
    ServerFull { need: u64, limit: u64 },
    #[error(
        "the machine's workspace archive names {path} outside the workspace: nothing of it was \
         kept"
    )]
    UnsafeArchive { path: String },
    #[error("git is needed for workspaces and could not be run: {why}")]
    GitMissing { why: String },
    #[error("git {what} failed: {said}")]
    Git { what: String, said: String },
    #[error("{what}: {why}")]
    Io { what: String, why: String },
}
