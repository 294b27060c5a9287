//! A machine a tool call is creating. An ephemeral one is recorded before its create is sent, so
//! that a crash between the two cannot leak it; what happens to it afterwards is one of three
//! endings, each a method: it exists (`created`, and the call goes on with it), its create was
//! refused because the name is taken (`refused`), or the call gives it up (`abandon`). A guard
//! dropped without an ending leaves the record as it is: the session's clean-up deletes the machine.

use super::ToolError;
use super::call::parts::{Making, Records, Session};
use crate::fleet::Fleet;

/// What a machine in the making takes of the call: its deletion, the process's record of it,
/// and the session it is made in.
pub type Recording<'c> = (Making<'c>, Records<'c>, Session<'c>);

pub struct Provisional<'c> {
    making: Making<'c>,
    records: Records<'c>,
    fleet: Fleet,
    name: String,
    /// What the fleet calls it, once create has answered (the name until then).
    id: String,
    ephemeral: bool,
    /// The record already had this name before the call (another create of ours, say): a
    /// refused create must not forget it.
    known_before: bool,
}

impl<'c> Provisional<'c> {
    /// Before the create: records `name` if it is ephemeral.
    pub async fn begin(
        parts: Recording<'c>,
        fleet: &Fleet,
        name: &str,
        ephemeral: bool,
    ) -> Result<Self, ToolError> {
        Self::begin_child(parts, fleet, name, ephemeral, None).await
    }

    /// Before a branch: records `name` if it is ephemeral, with the machine it is made from, so
    /// that the session's clean-up deletes it before its source (the engine refuses to delete
    /// a fork base while its clones live).
    pub async fn begin_child(
        (making, records, session): Recording<'c>,
        fleet: &Fleet,
        name: &str,
        ephemeral: bool,
        parent: Option<&str>,
    ) -> Result<Self, ToolError> {
        // The reaper of leased machines must not take one still being made by this call.
        session.hold(name).await;
        let known_before = if ephemeral {
            records.remember(fleet.kind(), name, parent).await?
        } else {
            false
        };
        Ok(Provisional {
            making,
            records,
            fleet: fleet.clone(),
            name: name.to_owned(),
            id: name.to_owned(),
            ephemeral,
            known_before,
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The create answered: the machine exists under `id` and belongs to this call's session.
    pub async fn created(&mut self, id: &str) {
        id.clone_into(&mut self.id);
        if self.ephemeral {
            self.records
                .remember_created(self.fleet.kind(), &self.name, id)
                .await;
        }
    }

    /// The create was refused because the name is taken: that machine is not this call's.
    pub async fn refused(self) {
        if self.ephemeral && !self.known_before {
            self.records.forget(self.fleet.kind(), &self.name).await;
        }
    }

    /// The call gives the machine up: an ephemeral one is deleted (a create that failed or was
    /// cancelled may still have made it) and forgotten; one the caller named is left.
    pub async fn abandon(self) -> Result<(), ToolError> {
        if !self.ephemeral {
            return Ok(());
        }
        self.making
            .delete_quietly(&self.fleet, &self.name, &self.id)
            .await
    }

    /// The machine this call made is not what was asked for (its workspace could not be sent
    /// in, a sibling of a fan-out failed): deleted whatever its name, as a create that never
    /// happened.
    pub async fn discard(self) -> Result<(), ToolError> {
        self.making
            .delete_quietly(&self.fleet, &self.name, &self.id)
            .await
    }
}
