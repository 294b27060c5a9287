//! Why the network failed: after a command fails on a local machine whose egress is blocked or
//! allow-listed, the egress the engine refused while it ran, grouped by destination, so that
//! the agent can ask for the allowHosts or allowCidrs it needs instead of guessing.
//!
//! Only the local engine records refusals (`GET /api/v1/machines/{name}/egress-events`); the
//! cloud API has nothing of the kind. The engine's route has no `since` and no cursor (the newest
//! `limit` events, oldest first), so the command's events are picked by their timestamps.

use super::Call;
use super::results::BlockedEgress;
use crate::fleet::{Egress, EgressDenial, Fleet, FleetKind};
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

/// How many of the machine's newest refusals are asked for. Enough for the refusals of one
/// command, even a retrying one; the engine reads them from a file either way.
pub const DENIALS_ASKED: u32 = 1000;
/// The most destinations one result lists, the most refused first.
pub const MAX_DESTINATIONS: usize = 20;
/// Clock slack on each side of the run. The engine's log may stamp whole seconds, cut down (the
/// logger's default form), so a refusal early in the run can carry a time up to a second before
/// it began; same host, same clock, so no more is needed. A command that follows another at once
/// may therefore also count the previous one's last refusals.
pub const SLACK: Duration = Duration::from_secs(1);

/// A command being watched for refused egress: started only where refusals can be recorded.
#[derive(Debug, Clone, Copy)]
pub struct EgressWatch {
    started: SystemTime,
}

impl EgressWatch {
    /// Starts watching a command about to run on a machine of `fleet` with `egress`. `None` on
    /// the cloud (which records nothing) and for an open machine (nothing is refused).
    pub fn begin(fleet: FleetKind, egress: &Egress) -> Option<EgressWatch> {
        (fleet == FleetKind::Local && *egress != Egress::Open).then(|| EgressWatch {
            started: SystemTime::now(),
        })
    }

    /// As [`EgressWatch::begin`], for a machine known by its record: `Machine::network` is
    /// `Egress::describe`'s reading.
    pub fn begin_described(fleet: FleetKind, network: &str) -> Option<EgressWatch> {
        (network != Egress::Open.describe())
            .then(|| Self::begin(fleet, &Egress::Blocked))
            .flatten()
    }
}

/// The egress refused while a watched command ran, when it failed (a non-zero exit or a
/// timeout). `None` when nothing was refused in its run, and whenever the engine cannot say: the
/// command's result is worth more than this report, so a failing route leaves it out (logged at
/// debug), never fails the call.
pub async fn refused_during(
    watch: Option<EgressWatch>,
    call: &Call<'_>,
    fleet: &Fleet,
    machine: &str,
    failed: bool,
) -> Option<Vec<BlockedEgress>> {
    let watch = watch.filter(|_| failed)?;
    match call
        .cancellable(fleet.egress_denials(machine, DENIALS_ASKED))
        .await
    {
        Ok(denials) => {
            let found = group(&denials, watch.started, SystemTime::now());
            (!found.is_empty()).then_some(found)
        }
        Err(e) => {
            tracing::debug!(%machine, error = %e.message, "could not read the egress the engine refused; the result goes without it");
            None
        }
    }
}

/// The refusals stamped within `[started - SLACK, ended + SLACK]`, grouped by host and port, the
/// most refused first (then the first refused), at most [`MAX_DESTINATIONS`]. A refusal without
/// a time cannot be placed in the run and is left out.
pub fn group(
    denials: &[EgressDenial],
    started: SystemTime,
    ended: SystemTime,
) -> Vec<BlockedEgress> {
    let from = started.checked_sub(SLACK).unwrap_or(SystemTime::UNIX_EPOCH);
    let to = ended + SLACK;
    let mut order: Vec<(String, Option<u16>)> = Vec::new();
    let mut counts: HashMap<(String, Option<u16>), u64> = HashMap::new();
    for denial in denials {
        if !denial.at.is_some_and(|at| from <= at && at <= to) {
            continue;
        }
        let key = host_and_port(&denial.dest);
        let count = counts.entry(key.clone()).or_insert(0);
        if *count == 0 {
            order.push(key);
        }
        *count += 1;
    }
    let mut found: Vec<BlockedEgress> = order
        .into_iter()
        .map(|key| BlockedEgress {
            count: counts[&key],
            host: key.0,
            port: key.1,
        })
        .collect();
    // Stable: equal counts keep the order they were first refused in.
    found.sort_by_key(|b| std::cmp::Reverse(b.count));
    found.truncate(MAX_DESTINATIONS);
    found
}

/// `ip:port` and `[v6]:port` as libkrun writes them; a `name:port` or anything else the engine
/// passes on is split at its last colon when a port follows, else kept whole.
fn host_and_port(dest: &str) -> (String, Option<u16>) {
    if let Ok(addr) = dest.parse::<std::net::SocketAddr>() {
        return (addr.ip().to_string(), Some(addr.port()));
    }
    match dest.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && !host.contains(':') => match port.parse() {
            Ok(port) => (host.to_owned(), Some(port)),
            Err(_) => (dest.to_owned(), None),
        },
        _ => (dest.to_owned(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn denial(secs: Option<u64>, dest: &str) -> EgressDenial {
        EgressDenial {
            at: secs.map(at),
            operation: "connect".into(),
            dest: dest.into(),
        }
    }

    #[test]
    fn destinations_are_split_as_the_engine_writes_them() {
        assert_eq!(
            host_and_port("93.184.215.14:443"),
            ("93.184.215.14".into(), Some(443))
        );
        assert_eq!(
            host_and_port("[2001:db8::1]:53"),
            ("2001:db8::1".into(), Some(53))
        );
        assert_eq!(
            host_and_port("pypi.org:443"),
            ("pypi.org".into(), Some(443))
        );
        assert_eq!(host_and_port("2001:db8::1"), ("2001:db8::1".into(), None));
        assert_eq!(
            host_and_port("pypi.org:https"),
            ("pypi.org:https".into(), None)
        );
        assert_eq!(host_and_port(""), (String::new(), None));
    }

    #[test]
    fn only_the_runs_refusals_count_grouped_and_most_refused_first() {
        let denials = [
            denial(Some(98), "1.1.1.1:443"),  // before the run and its slack
            denial(Some(99), "9.9.9.9:80"),   // within the slack before it
            denial(Some(101), "1.1.1.1:443"), // in the run
            denial(Some(102), "8.8.8.8:53"),
            denial(Some(103), "1.1.1.1:443"),
            denial(Some(103), "1.1.1.1:80"),
            denial(None, "1.1.1.1:443"),      // cannot be placed
            denial(Some(111), "1.1.1.1:443"), // within the slack after it
            denial(Some(112), "7.7.7.7:443"), // after the slack
        ];
        let found = group(&denials, at(100), at(110));
        let seen: Vec<(&str, Option<u16>, u64)> = found
            .iter()
            .map(|b| (b.host.as_str(), b.port, b.count))
            .collect();
        assert_eq!(
            seen,
            [
                ("1.1.1.1", Some(443), 3),
                ("9.9.9.9", Some(80), 1),
                ("8.8.8.8", Some(53), 1),
                ("1.1.1.1", Some(80), 1),
            ]
        );
    }

    #[test]
    fn the_list_is_bounded() {
        let denials: Vec<EgressDenial> = (0..MAX_DESTINATIONS + 5)
            .map(|i| denial(Some(100), &format!("10.0.0.{i}:443")))
            .collect();
        assert_eq!(group(&denials, at(100), at(100)).len(), MAX_DESTINATIONS);
    }

    #[test]
    fn only_local_machines_with_restricted_egress_are_watched() {
        let allow = Egress::Allow {
            hosts: vec!["pypi.org".into()],
            cidrs: vec![],
        };
        assert!(EgressWatch::begin(FleetKind::Local, &Egress::Blocked).is_some());
        assert!(EgressWatch::begin(FleetKind::Local, &allow).is_some());
        assert!(EgressWatch::begin(FleetKind::Local, &Egress::Open).is_none());
        assert!(EgressWatch::begin(FleetKind::Cloud, &Egress::Blocked).is_none());
        assert!(EgressWatch::begin_described(FleetKind::Local, &allow.describe()).is_some());
        assert!(EgressWatch::begin_described(FleetKind::Local, "blocked").is_some());
        assert!(EgressWatch::begin_described(FleetKind::Local, "open").is_none());
        assert!(EgressWatch::begin_described(FleetKind::Cloud, "blocked").is_none());
    }
}
