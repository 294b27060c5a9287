//! Bases: branch sources frozen by `freezeSource` that outlive the session, the machine's name
//! in it and the server process (a frozen source survives the serve's restart:
//! docs/bases-engine.md). The machine record keeps them beside the ephemeral machines, marked,
//! so that every process sharing the record counts, keeps and ends them alike: no session's
//! end deletes one, no session takes one back, and one no branch was made of for
//! `baseIdleSecs` is swept like a kept machine whose time is up (the engine refusing while a
//! child depends on it, so it stays until the children are gone).

use super::Process;
use super::ephemeral::{self, BaseBound, BaseMark, Entry, RecordError};
use crate::fleet::FleetKind;

/// A base as list-machines shows it to its owner.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BaseInfo {
    /// Image, and workspace commit if any.
    pub made_from: String,
    /// RFC 3339, UTC.
    pub made_at: Option<String>,
    /// Its last branch.
    pub last_used: Option<String>,
    /// When it is deleted unless branched first (baseIdleSecs); absent: never.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted_after: Option<String>,
    /// Its disk in use, MiB, as the fleet reports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_used_mb: Option<i64>,
    /// The signed-in user it is kept for; absent: the operator's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

impl BaseInfo {
    fn of(entry: &Entry) -> Option<BaseInfo> {
        let mark = entry.base.as_ref()?;
        let at = |secs: u64| {
            i64::try_from(secs)
                .ok()
                .and_then(crate::fleet::epoch_to_rfc3339)
        };
        Some(BaseInfo {
            made_from: mark.made_from.clone(),
            made_at: at(mark.made_at),
            last_used: at(mark.last_used),
            deleted_after: entry.kept_until.filter(|u| *u != u64::MAX).and_then(at),
            disk_used_mb: None,
            owner: Some(mark.user.clone()).filter(|user| !user.is_empty()),
        })
    }
}

/// A freeze about to be sent: undone with [`Process::base_not_made`] if it fails.
#[derive(Debug)]
pub struct PendingBase {
    fleet: FleetKind,
    name: String,
    was: Option<Entry>,
}

/// Why a machine cannot become a base now.
#[derive(Debug, thiserror::Error)]
pub enum BaseRefused {
    #[error(
        "you keep {0} bases already (maxBasesPerUser {1}): delete-machine one you no longer need"
    )]
    PerUser(usize, usize),
    #[error(
        "this server keeps {0} bases already (maxBases {1}): delete-machine one you no longer \
         need, or ask the operator"
    )]
    Server(usize, usize),
    #[error("the machine record cannot be written, so a base would not be kept: {0}")]
    Record(#[from] RecordError),
}

impl Process {
    /// Records `name` (fleet id `id`) as `user`'s base before the freeze is sent, within
    /// `maxBasesPerUser` and `maxBases`.
    pub async fn base_to_be_made(
        &self,
        fleet: FleetKind,
        name: &str,
        id: &str,
        user: &str,
        made_from: String,
    ) -> Result<PendingBase, BaseRefused> {
        let now = ephemeral::now_secs();
        let entry = Entry {
            fleet,
            name: name.to_owned(),
            id: id.to_owned(),
            owner_pid: std::process::id(),
            owner: None,
            session: String::new(),
            parent: None,
            recorded_at: now,
            lease: None,
            engine: Some(self.engine(fleet)),
            kept_until: Some(ephemeral::base_until(now, self.config.base_idle_secs)),
            base: Some(BaseMark {
                user: user.to_owned(),
                made_at: now,
                last_used: now,
                made_from,
            }),
        };
        let (per_user, server) = (self.config.max_bases_per_user, self.config.max_bases);
        match self.record.mark_base(entry, per_user, server).await? {
            Ok(was) => Ok(PendingBase {
                fleet,
                name: name.to_owned(),
                was,
            }),
            Err(BaseBound::PerUser(held)) => Err(BaseRefused::PerUser(held, per_user)),
            Err(BaseBound::Server(held)) => Err(BaseRefused::Server(held, server)),
        }
    }

    /// The freeze of `pending` failed: the machine is what it was before.
    pub async fn base_not_made(&self, pending: PendingBase) {
        if let Err(e) = self
            .record
            .unmark_base(pending.fleet, &pending.name, pending.was)
            .await
        {
            tracing::warn!(machine = %pending.name, error = %e, "could not take back the base mark of a machine whose freeze failed");
        }
    }

    /// A branch of `name` was made: if it is a base, its idle time starts again.
    pub async fn base_branched(&self, fleet: FleetKind, name: &str) {
        let now = ephemeral::now_secs();
        if let Err(e) = self
            .record
            .base_used(fleet, name, now, self.config.base_idle_secs)
            .await
        {
            tracing::warn!(machine = name, error = %e, "could not record a base's use");
        }
    }

    /// The bases on `fleet`, by name and id, as list-machines shows them.
    pub async fn bases(&self, fleet: FleetKind) -> Vec<(String, String, BaseInfo)> {
        match self.record.bases(fleet).await {
            Ok(entries) => entries
                .iter()
                .filter_map(|e| Some((e.name.clone(), e.id.clone(), BaseInfo::of(e)?)))
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the machine record for its bases");
                Vec::new()
            }
        }
    }
}
