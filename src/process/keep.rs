//! Temporary machines kept past their session (`sessionEnd` stop or pause): put away when the
//! session ends, taken back by a later session that names one, deleted once `keptMachineSecs`
//! have passed by whichever server process runs then. The record is written before the machine
//! is touched, so a process that dies half way leaves a kept machine, never an unrecorded one.

use crate::fleet::{ErrorKind, Feature, Fleet, Phase};
use crate::process::config::SessionEnd;
use crate::process::ephemeral::{Entry, Record, children_first};

/// How one kept machine was left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutAway {
    Paused,
    Stopped,
    /// It was stopped or paused already.
    AsItWas,
    /// Neither stop nor pause took: it runs until it is taken back or its time is up.
    Running,
    /// The fleet no longer has it; its entry is gone from the record.
    Gone,
}

/// When a machine kept now goes: `keep_secs` from now, and on cloud no later than the time
/// its create gave it (`ttlSeconds`, `ephemeralTtlSecs` then), which the cloud enforces itself.
pub fn kept_until(entry: &Entry, now: u64, keep_secs: u64, cloud_ttl_secs: u64) -> u64 {
    let until = now.saturating_add(keep_secs);
    match entry.fleet {
        crate::fleet::FleetKind::Cloud if entry.recorded_at > 0 => {
            until.min(entry.recorded_at.saturating_add(cloud_ttl_secs))
        }
        _ => until,
    }
}

/// A duration as a person says it: "2 hours", "90 seconds".
pub fn duration_words(secs: u64) -> String {
    let (n, unit) = match secs {
        s if s >= 86_400 && s % 86_400 == 0 => (s / 86_400, "day"),
        s if s >= 3_600 && s % 3_600 == 0 => (s / 3_600, "hour"),
        s if s >= 60 && s % 60 == 0 => (s / 60, "minute"),
        s => (s, "second"),
    };
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
}

/// Stops or pauses the kept `entries` of one fleet, children before their source (a source
/// with live children cannot be paused; its children go first so that at least they are).
/// A pause the engine cannot make (a machine not started branchable, host mounts, live
/// children, a fleet without pause) falls back to a stop, which keeps the disk.
pub async fn put_away(
    record: &Record,
    fleet: &Fleet,
    entries: Vec<Entry>,
    how: SessionEnd,
) -> Vec<(String, PutAway)> {
    let mut done = Vec::with_capacity(entries.len());
    for entry in children_first(entries) {
        let outcome = put_away_one(fleet, &entry, how).await;
        if outcome == PutAway::Gone {
            let _ = record.remove(fleet.kind(), &entry.name).await;
        }
        tracing::info!(
            fleet = fleet.kind().as_str(),
            machine = %entry.name,
            outcome = ?outcome,
            "kept a temporary machine past its session"
        );
        done.push((entry.name, outcome));
    }
    done
}

/// Parks one idle machine (`parkIdleSecs`): paused where the fleet can pause it (a local
/// machine started branchable, without host mounts or live children), else stopped.
pub async fn park(fleet: &Fleet, entry: &Entry) -> PutAway {
    put_away_one(fleet, entry, SessionEnd::Pause).await
}

async fn put_away_one(fleet: &Fleet, entry: &Entry, how: SessionEnd) -> PutAway {
    let machine = match fleet.get(&entry.id).await {
        Ok(machine) => machine,
        Err(e) if e.kind == ErrorKind::NotFound => return PutAway::Gone,
        Err(e) => {
            tracing::warn!(machine = %entry.name, error = %e, "cannot read a machine being kept; left as it is");
            return PutAway::Running;
        }
    };
    if machine.phase() != Phase::Running {
        return PutAway::AsItWas;
    }
    if how == SessionEnd::Pause
        && fleet.capabilities().lacks(Feature::Pause).is_none()
        && machine.branchable
    {
        match fleet.pause(&entry.id).await {
            Ok(_) => return PutAway::Paused,
            Err(e) => {
                tracing::info!(machine = %entry.name, error = %e, "the engine would not pause a machine being kept; stopping it instead")
            }
        }
    }
    match fleet.stop(&entry.id).await {
        Ok(_) => PutAway::Stopped,
        Err(e) if e.kind == ErrorKind::NotFound => PutAway::Gone,
        Err(e) => {
            tracing::warn!(machine = %entry.name, error = %e, "cannot stop a machine being kept; it runs until taken back or deleted at its time");
            PutAway::Running
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::FleetKind;

    fn entry(fleet: FleetKind, recorded_at: u64) -> Entry {
        Entry {
            fleet,
            name: "mcp-a".into(),
            id: "mcp-a".into(),
            owner_pid: 1,
            owner: None,
            session: "s".into(),
            parent: None,
            recorded_at,
            lease: None,
            engine: None,
            kept_until: None,
            base: None,
        }
    }

    #[test]
    fn durations_read_as_a_person_says_them() {
        assert_eq!(duration_words(1), "1 second");
        assert_eq!(duration_words(90), "90 seconds");
        assert_eq!(duration_words(7_200), "2 hours");
        assert_eq!(duration_words(86_400), "1 day");
    }

    #[test]
    fn a_cloud_machine_is_kept_no_longer_than_its_create_time_ttl() {
        let now = 10_000;
        assert_eq!(
            kept_until(&entry(FleetKind::Local, 100), now, 50, 60),
            10_050
        );
        // Made at 100 with a 3600 s TTL: the cloud deletes it at 3700 whatever is kept.
        assert_eq!(
            kept_until(&entry(FleetKind::Cloud, 100), 1_000, 86_400, 3_600),
            3_700
        );
        assert_eq!(
            kept_until(&entry(FleetKind::Cloud, 100), now, 50, 3_600),
            3_700
        );
        assert_eq!(
            kept_until(&entry(FleetKind::Cloud, 9_990), now, 50, 3_600),
            10_050
        );
        // A record from before recorded_at existed: the keep time alone.
        assert_eq!(kept_until(&entry(FleetKind::Cloud, 0), now, 50, 60), 10_050);
    }
}
