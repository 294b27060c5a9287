//! Deleting recorded ephemeral machines: a session's at its end, a dead process's orphans, the
//! leased machines whose lease ran out. Children go before the machine they were branched
//! from, and a sweep deletes only what it was given.

use crate::fleet::{ErrorKind, Fleet, FleetError, FleetKind};
use crate::process::ephemeral::{self, Entry, Record, children_first};
use crate::process::events::{Events, ServerEvent};

/// What ended up deleted, and what could not be.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Cleanup {
    pub deleted: Vec<String>,
    pub failed: Vec<(String, String)>,
    /// Kept past their session (`sessionEnd` stop or pause), with how each was left.
    pub kept: Vec<(String, crate::process::keep::PutAway)>,
}

impl Cleanup {
    pub fn add(&mut self, other: Cleanup) {
        self.deleted.extend(other.deleted);
        self.failed.extend(other.failed);
        self.kept.extend(other.kept);
    }
}

/// What a sweep of machines left by a process that ended did, for the clients to see: those
/// machines were someone's, and their going is news. An event a machine: with sign-in, each
/// is told only to the sessions of the user who held it (`machine` and `fleet` say which).
pub fn publish_orphan_sweep(events: &Events, kind: FleetKind, cleanup: &Cleanup) {
    for name in &cleanup.deleted {
        events.publish(
            ServerEvent::info(
                "orphansDeleted",
                format!(
                    "deleted machine {name} on the {} fleet, which a server process that ended \
                     had left",
                    kind.as_str(),
                ),
            )
            .with("fleet", kind.as_str())
            .with("machine", name.clone())
            .with("machines", vec![name.clone()]),
        );
    }
    for (name, why) in &cleanup.failed {
        events.publish(
            ServerEvent::warning(
                "orphanNotDeleted",
                format!(
                    "could not delete {name} on the {} fleet, left by a server process that \
                     ended: {why}",
                    kind.as_str()
                ),
            )
            .with("fleet", kind.as_str())
            .with("machine", name.clone()),
        );
    }
}

/// Deletes one recorded machine and forgets it; answers the error when it stays. A 409 naming
/// live clones that are all machines of this same sweep (so the session owns them, or a dead
/// process left them) is retried with the engine's `cascade`, which deletes them with it;
/// clones it does not own are never deleted this way.
/// How long a cloud machine whose create or branch never answered stays recorded while it is
/// not found.
const PENDING_SECS: u64 = 24 * 3600;

async fn delete_one(
    record: &Record,
    fleet: &Fleet,
    entry: &Entry,
    ours: &std::collections::BTreeSet<String>,
    cleanup: &mut Cleanup,
) -> Option<FleetError> {
    let kind = fleet.kind();
    let mut answer = fleet.delete(&entry.id).await;
    if let Err(e) = &answer
        && e.kind == ErrorKind::Conflict
        && let Some(clones) = live_clones(&e.message)
        && clones.iter().all(|c| ours.contains(c))
    {
        answer = fleet.delete_with_clones(&entry.id).await;
        if answer.is_ok() {
            for clone in &clones {
                let _ = record.remove(kind, clone).await;
                cleanup.deleted.push(clone.clone());
            }
        }
    }
    match answer {
        Ok(_) => {
            let _ = record.remove(kind, &entry.name).await;
            cleanup.deleted.push(entry.name.clone());
            None
        }
        // Not there yet: a cloud create or branch that never answered with an id (its call
        // gave up on the deadline) may still come out of the service's per-source queue (facts
        // 3.9), and a branch child has no TTL of its own. Kept, for a later sweep (the next start
        // deletes what a dead process left), until it is a day old.
        Err(e)
            if e.kind == ErrorKind::NotFound
                && fleet.capabilities().arrives_late
                && entry.id == entry.name
                && ephemeral::now_secs().saturating_sub(entry.recorded_at) < PENDING_SECS =>
        {
            Some(FleetError::new(
                ErrorKind::NotFound,
                format!("delete machine {}", entry.name),
                "not there yet: its create or branch never answered and may still finish; it \
                 stays recorded, and a later clean-up deletes it",
            ))
        }
        // Already gone: on cloud the TTL sweep deletes an ephemeral machine whatever the
        // session is doing (facts 3.3 ttlSeconds, 3.6 "404 when already gone"). Done all the
        // same, once (a cascade earlier in this sweep may have taken it already).
        Err(e) if e.kind == ErrorKind::NotFound => {
            let _ = record.remove(kind, &entry.name).await;
            if !cleanup.deleted.contains(&entry.name) {
                cleanup.deleted.push(entry.name.clone());
            }
            None
        }
        Err(e) => Some(e),
    }
}

/// The clones the engine names in its refusal to delete a fork base: "machine 'x' is the fork
/// base of 2 live clone(s) (a, b); ..." (smolvm src/api/handlers/machines.rs; the same words
/// are in the 1.32.2 binary). `None` when the message is not that refusal.
pub(crate) fn live_clones(message: &str) -> Option<Vec<String>> {
    let (_, rest) = message.split_once("live clone(s) (")?;
    let (names, _) = rest.split_once(')')?;
    let names: Vec<String> = names
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    (!names.is_empty()).then_some(names)
}

/// Deletes the recorded machines of `session` (or only orphans when `None`) made on `engine`,
/// on one fleet. Orphans of other engines stay recorded, and the log says so: this engine
/// would answer 404 for them, which is no delete.
pub async fn sweep(record: &Record, fleet: &Fleet, engine: &str, session: Option<&str>) -> Cleanup {
    let kind = fleet.kind();
    if let Ok(elsewhere) = record.orphaned_elsewhere(kind, engine).await
        && !elsewhere.is_empty()
    {
        let engines: std::collections::BTreeSet<&str> = elsewhere
            .iter()
            .filter_map(|e| e.engine.as_deref())
            .collect();
        let names: Vec<&str> = elsewhere.iter().map(|e| e.name.as_str()).collect();
        tracing::info!(
            fleet = kind.as_str(),
            this_engine = engine,
            their_engines = ?engines,
            machines = ?names,
            "orphaned machines made on another engine are left recorded; a start on their engine deletes them"
        );
    }
    let entries = match session {
        Some(s) => record.owned_or_orphaned(s, kind, engine).await,
        None => record.claim_orphans(kind, engine).await,
    };
    let entries = match entries {
        Ok(entries) => entries,
        Err(e) => {
            tracing::error!(error = %e, "cannot read the ephemeral record; nothing deleted");
            return Cleanup {
                failed: vec![("(the machine record)".into(), e.to_string())],
                ..Cleanup::default()
            };
        }
    };
    delete_all(record, fleet, entries, |_| true).await
}

/// Deletes `entries` on one fleet, children before their sources, each only if `still` says so
/// right before its delete is sent.
pub async fn delete_all(
    record: &Record,
    fleet: &Fleet,
    entries: Vec<Entry>,
    still: impl Fn(&Entry) -> bool,
) -> Cleanup {
    let kind = fleet.kind();
    let mut cleanup = Cleanup::default();
    // Children before their source: the local engine refuses to delete a machine that is the
    // fork base of live clones (409 "is the fork base of N live clone(s) (..)", smolvm
    // src/api/handlers/machines.rs `delete_machine`).
    let ours: std::collections::BTreeSet<String> = entries
        .iter()
        .flat_map(|e| [e.name.clone(), e.id.clone()])
        .collect();
    let mut refused = Vec::new();
    for entry in children_first(entries) {
        if !still(&entry) {
            continue;
        }
        match delete_one(record, fleet, &entry, &ours, &mut cleanup).await {
            Some(e) if e.kind == ErrorKind::Conflict => refused.push((entry, e)),
            Some(e) => cleanup.failed.push((entry.name, e.to_string())),
            None => {}
        }
    }
    // A source refused because of a child deleted after it (a record written before parents
    // were recorded, or a child another call of this session branched by id): once more, now
    // that this sweep's other machines are gone.
    for (entry, first) in refused {
        if let Some(e) = delete_one(record, fleet, &entry, &ours, &mut cleanup).await {
            tracing::debug!(first = %first, "delete refused twice");
            cleanup.failed.push((entry.name, e.to_string()));
        }
    }
    if !cleanup.deleted.is_empty() {
        tracing::info!(fleet = kind.as_str(), deleted = ?cleanup.deleted, "deleted ephemeral machines");
    }
    for (name, why) in &cleanup.failed {
        tracing::warn!(fleet = kind.as_str(), %name, %why, "could not delete an ephemeral machine");
    }
    cleanup
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, parent: Option<&str>) -> Entry {
        Entry {
            parent: parent.map(Into::into),
            ..Entry::for_test(name, 1, "s")
        }
    }

    #[test]
    fn children_come_before_their_sources_at_every_depth() {
        let order: Vec<String> = children_first(vec![
            entry("root", None),
            entry("mid", Some("root")),
            entry("other", None),
            entry("leaf", Some("mid")),
        ])
        .into_iter()
        .map(|e| e.name)
        .collect();
        assert_eq!(order, ["other", "leaf", "mid", "root"]);
    }

    #[test]
    fn the_clones_the_engine_names() {
        assert_eq!(
            live_clones(
                "machine 'src' is the fork base of 2 live clone(s) (a, b-2); their disks are \
                 backed by its disks — delete the clones first"
            ),
            Some(vec!["a".to_owned(), "b-2".to_owned()])
        );
        assert_eq!(live_clones("machine 'x' already exists"), None);
    }
}
