//! Room for the server's copies on the host's disk, shared by all of them (the server's
//! `workspaceTotalMaxBytes`): every step that writes into a copy first takes from it the most
//! that step can write, and is refused, before writing, when that does not fit. The server's
//! ledger of it is the process's (process/workspaces.rs); here is what a step asks of it.

use super::error::WorkspaceError;

pub trait Room: Send + Sync {
    fn take(&self, bytes: u64) -> Result<(), WorkspaceError>;
}

/// No bound beyond each workspace's own: a copy made apart from a server.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unbounded;

impl Room for Unbounded {
    fn take(&self, _bytes: u64) -> Result<(), WorkspaceError> {
        Ok(())
    }
}
