//! Why the network failed: after a command fails on a local machine whose egress is blocked or
//! allow-listed, the egress the engine refused while it ran, grouped by destination, so that
//! the agent can ask for the allowHosts or allowCidrs it needs instead of guessing.
//!
//! Only the local engine records refusals (`GET /api/v1/machines/{name}/egress-events`): refused
//! connects and datagrams, and names outside allowHosts refused at lookup (`resolve`); the cloud
//! API has nothing of the kind. The engine's route has no `since`, no cursor and no id (the
//! newest `limit` events, oldest first), and stamps whole seconds, so the command's events are
//! picked by their timestamps, less a baseline read before it when another command ran on the
//! machine in the last seconds (whose refusals could carry the same second).

use super::ToolError;
use super::call::parts::{Asking, Cancel, Fleets, Session};
use super::results::{BlockedEgress, EgressAnswer};
use crate::fleet::{Capabilities, Egress, EgressDenial, Feature, Fleet};
use crate::policy::consent::Asked;
use crate::policy::consent::Questions;
use crate::policy::progress::Progress;
use crate::policy::user::User;
use crate::process::credentials::Supplier;
use crate::store::Store;
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

/// How many of the machine's newest refusals are asked for. Enough for the refusals of one
/// command, even a retrying one; the engine reads them from a file either way.
pub const DENIALS_ASKED: u32 = 1000;
/// The most destinations one result lists, the most refused first.
pub const MAX_DESTINATIONS: usize = 20;
/// Clock slack on each side of the run. The engine stamps whole seconds, cut down, on its own
/// clock, which [`EgressDenial::on_this_host`] places on ours within a second either way (the
/// nested engine's clock was seen most of a second off ours: with no slack for that, a refusal
/// at the start of a short command fell before it). A command that follows another at once may
/// therefore also count the previous one's last refusals, which the baseline takes out.
pub const SLACK: Duration = Duration::from_secs(1);

/// A command being watched for refused egress: started only where refusals can be recorded.
#[derive(Debug, Clone)]
pub struct EgressWatch {
    started: SystemTime,
    /// Refusals already recorded before the command, which are not its own.
    before: Vec<EgressDenial>,
}

impl EgressWatch {
    /// Starts watching a command about to run on a machine of `fleet` with `egress`. Only a
    /// local machine with an allow-list is watched: the cloud records nothing, an open machine
    /// is refused nothing, and a blocked one has no network at all (its guest sees "Network
    /// unreachable" and the engine records no event: seen on the real 1.32.2 guest).
    pub fn begin(fleet: &Capabilities, egress: &Egress) -> Option<EgressWatch> {
        let reported = fleet.offers(Feature::EgressReport);
        (reported && matches!(egress, Egress::Allow { .. })).then(|| EgressWatch {
            started: SystemTime::now(),
            before: Vec::new(),
        })
    }

    /// Reads the refusals already recorded that could be taken for the command's own (see
    /// [`crate::fleet::FleetApi::egress_baseline`]); at once when there are none to fear.
    pub async fn with_baseline(mut self, fleet: &Fleet, machine: &str) -> EgressWatch {
        self.before = fleet.egress_baseline(machine, DENIALS_ASKED).await;
        self.started = SystemTime::now();
        self
    }
}

/// The egress refused while a watched command ran, when it failed (a non-zero exit or a
/// timeout). `None` when nothing was refused in its run, and whenever the engine cannot say: the
/// command's result is worth more than this report, so a failing route leaves it out (logged at
/// debug), never fails the call.
pub async fn refused_during(
    watch: Option<EgressWatch>,
    cancel: Cancel<'_>,
    fleet: &Fleet,
    machine: &str,
    failed: bool,
) -> Option<Vec<BlockedEgress>> {
    let watch = watch.filter(|_| failed)?;
    match cancel
        .run(fleet.egress_denials(machine, DENIALS_ASKED))
        .await
    {
        Ok(denials) => {
            let fresh = without_baseline(denials, &watch.before);
            let found = group(&fresh, watch.started, SystemTime::now());
            (!found.is_empty()).then_some(found)
        }
        Err(e) => {
            tracing::debug!(%machine, error = %e.message, "could not read the egress the engine refused; the result goes without it");
            None
        }
    }
}

/// `denials` less one of each refusal in `before` (the engine's list is oldest first and only
/// grows at its end, so an earlier read's events are matched as a multiset).
fn without_baseline(denials: Vec<EgressDenial>, before: &[EgressDenial]) -> Vec<EgressDenial> {
    let key = |d: &EgressDenial| (d.at, d.operation.clone(), d.dest.clone());
    let mut left: HashMap<(Option<SystemTime>, String, String), usize> = HashMap::new();
    for d in before {
        *left.entry(key(d)).or_insert(0) += 1;
    }
    denials
        .into_iter()
        .filter(|d| match left.get_mut(&key(d)) {
            Some(n) if *n > 0 => {
                *n -= 1;
                false
            }
            _ => true,
        })
        .collect()
}

/// The refusals placed (on this host's clock) within `[started - SLACK, ended + SLACK]`, grouped by host and port, the
/// most refused first (then the first refused), at most [`MAX_DESTINATIONS`]. A refusal without
/// a time cannot be placed in the run and is left out.
pub fn group(
    denials: &[EgressDenial],
    started: SystemTime,
    ended: SystemTime,
) -> Vec<BlockedEgress> {
    let from = started.checked_sub(SLACK).unwrap_or(SystemTime::UNIX_EPOCH);
    let to = ended + SLACK;
    let mut order: Vec<(String, Option<u16>, String)> = Vec::new();
    let mut counts: HashMap<(String, Option<u16>, String), u64> = HashMap::new();
    for denial in denials {
        if !denial.on_this_host.is_some_and(|at| from <= at && at <= to) {
            continue;
        }
        let (host, port) = if denial.operation == "resolve" {
            (denial.dest.clone(), None)
        } else {
            host_and_port(&denial.dest)
        };
        let key = (host, port, denial.operation.clone());
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
            operation: key.2,
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

/// On a machine made with `network: "ask"`: puts the destinations a command was refused to the
/// user, and adds those the user allows to the machine's allow list, live. The agent's word
/// never widens it: only an answer through [`crate::policy::consent::Consent`] does. What was
/// allowed is recorded in the run ledger, for a later machine's `allowHostsFrom`.
/// What an answer about egress takes of the call: the answers kept, the grant recorded for
/// the user under the fleet's engine.
pub(super) type Granting<'c> = (&'c Questions, &'c dyn Store, &'c User, Fleets<'c>);

/// What putting refused egress to the user takes of the call: someone to ask, a turn among the
/// questions open, the wait reported and cancellable, the session's rate of questions.
pub(super) type Asker<'c> = (
    Asking<'c>,
    &'c Progress,
    Cancel<'c>,
    Session<'c>,
    Granting<'c>,
);

pub(super) async fn ask_the_user(
    (asking, progress, cancel, session, granting): Asker<'_>,
    fleet: &Fleet,
    machine: &str,
    refused: &[BlockedEgress],
) -> EgressAnswer {
    let not_asked = |why: &str, allowed: Vec<String>, declined: Vec<String>| EgressAnswer {
        allowed,
        declined,
        not_asked: Some(why.to_owned()),
    };
    let mut refused_to: Vec<String> = Vec::new();
    for destination in refused.iter().map(|r| r.host.clone()) {
        if !refused_to.contains(&destination) {
            refused_to.push(destination);
        }
    }
    let Some(consent) = asking.consent() else {
        return not_asked(
            "this client cannot show the user a question (it has no form elicitation): the \
             user can allow hosts by name, in allowHosts of a new machine",
            Vec::new(),
            refused_to,
        );
    };
    let questions = granting.0;
    // One question open about a machine at a time: a command refused while one is open waits
    // for its answer, then asks only what that answer left undecided.
    let turn = progress
        .during(
            &format!("waiting for the user's answer to an earlier question about {machine}"),
            None,
            Box::pin(cancel.run(async { Ok::<_, ToolError>(questions.turn(machine).await) })),
        )
        .await;
    let Ok(_turn) = turn else {
        return not_asked(
            "the call was cancelled while another question about this machine was open",
            Vec::new(),
            refused_to,
        );
    };
    let (mut asked, mut allowed_before, mut declined_before) = (Vec::new(), Vec::new(), Vec::new());
    for destination in refused_to {
        match questions.answer(machine, &destination) {
            Some(true) => allowed_before.push(destination),
            Some(false) => declined_before.push(destination),
            None => asked.push(destination),
        }
    }
    if asked.is_empty() {
        if !allowed_before.is_empty() {
            // Allowed by the answer to a question open while this command ran.
            return EgressAnswer {
                allowed: allowed_before,
                declined: declined_before,
                not_asked: None,
            };
        }
        return not_asked(
            "the user declined these for this machine already",
            Vec::new(),
            declined_before,
        );
    }
    if let Err(wait) = questions.admit(session.id()) {
        let mut all = asked;
        all.extend(declined_before);
        return not_asked(
            &format!(
                "this session put {} questions to the user in the last {} s, as many as it \
                 may: run the command again in {} s to be asked",
                crate::policy::consent::QUESTIONS_PER_WINDOW,
                crate::policy::consent::QUESTION_WINDOW.as_secs(),
                wait.as_secs().max(1)
            ),
            allowed_before,
            all,
        );
    }
    let answer = progress
        .during(
            &format!("waiting for the user to answer about {}", asked.join(", ")),
            None,
            consent.ask_egress(machine, &asked),
        )
        .await;
    let answer = match answer {
        Asked::Answered(answer) => answer,
        Asked::NoAnswer => {
            questions.record(machine, &asked, false);
            let mut all = asked;
            all.extend(declined_before);
            return not_asked("the user declined, or did not answer", allowed_before, all);
        }
        Asked::Deferred => {
            let mut all = asked;
            all.extend(declined_before);
            return not_asked(
                "the question goes to the user with this answer; the call comes again with theirs",
                allowed_before,
                all,
            );
        }
    };
    let mut answered = apply(granting, fleet, machine, answer, declined_before).await;
    answered.allowed.extend(allowed_before);
    answered
}

/// The answer to a question an earlier attempt of this call asked (a 2026-07-28 client's call
/// made again with the user's answer): applied before the command runs again.
pub(super) async fn apply_prior(
    (asking, credentials, granting): (Asking<'_>, &Supplier, Granting<'_>),
    fleet: &Fleet,
    machine: &str,
) -> Option<EgressAnswer> {
    let prior = asking.prior_answer().filter(|p| p.machine == machine)?;
    if !credentials.asks_egress(machine).await {
        return None;
    }
    Some(apply(granting, fleet, machine, prior.answer.clone(), Vec::new()).await)
}

/// What the user said, done: the allowed destinations added to the machine's list live and
/// recorded, the declined ones not asked about again.
async fn apply(
    (questions, store, user, fleets): Granting<'_>,
    fleet: &Fleet,
    machine: &str,
    answer: crate::policy::consent::EgressAnswer,
    declined_before: Vec<String>,
) -> EgressAnswer {
    questions.record(machine, &answer.declined, false);
    let mut declined = answer.declined;
    declined.extend(declined_before);
    if answer.allowed.is_empty() {
        return EgressAnswer {
            allowed: Vec::new(),
            declined,
            not_asked: None,
        };
    }
    let (cidrs, hosts): (Vec<String>, Vec<String>) = answer
        .allowed
        .iter()
        .cloned()
        .partition(|d| d.parse::<std::net::IpAddr>().is_ok());
    let cidrs: Vec<String> = cidrs
        .into_iter()
        .map(|ip| {
            if ip.contains(':') {
                format!("{ip}/128")
            } else {
                format!("{ip}/32")
            }
        })
        .collect();
    match fleet.allow_egress(machine, &hosts, &cidrs).await {
        Ok(_) => {
            questions.record(machine, &answer.allowed, true);
            store.egress_grants().add(crate::store::EgressGrant {
                user: user.id().to_owned(),
                fleet: fleet.kind(),
                engine: fleets.engine(fleet.kind()),
                machine: machine.to_owned(),
                destinations: answer.allowed.clone(),
                granted_ms: chrono::Utc::now().timestamp_millis(),
            });
            EgressAnswer {
                allowed: answer.allowed,
                declined,
                not_asked: None,
            }
        }
        Err(e) => {
            declined.extend(answer.allowed);
            EgressAnswer {
                allowed: Vec::new(),
                declined,
                not_asked: Some(format!(
                    "the user said yes, but the engine did not widen the machine's egress: {}",
                    e.message
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::cloud::CAPABILITIES as CLOUD;
    use crate::fleet::local::CAPABILITIES as LOCAL;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn denial(secs: Option<u64>, dest: &str) -> EgressDenial {
        EgressDenial {
            at: secs.map(at),
            on_this_host: secs.map(at),
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
    fn a_baseline_read_before_the_command_takes_out_one_of_each_earlier_refusal() {
        let earlier = [
            denial(Some(100), "1.1.1.1:443"),
            denial(Some(100), "1.1.1.1:443"),
        ];
        let now = vec![
            denial(Some(100), "1.1.1.1:443"),
            denial(Some(100), "1.1.1.1:443"),
            // The same second and destination, refused again by the command itself.
            denial(Some(100), "1.1.1.1:443"),
            denial(Some(100), "8.8.8.8:53"),
        ];
        let fresh = without_baseline(now, &earlier);
        let found = group(&fresh, at(100), at(101));
        let seen: Vec<(&str, u64)> = found.iter().map(|b| (b.host.as_str(), b.count)).collect();
        assert_eq!(seen, [("1.1.1.1", 1), ("8.8.8.8", 1)]);
    }

    #[test]
    fn a_refused_name_is_reported_by_name_with_its_operation() {
        let mut refused = denial(Some(100), "example.com");
        refused.operation = "resolve".into();
        let found = group(&[refused], at(100), at(100));
        assert_eq!(
            (
                found[0].host.as_str(),
                found[0].port,
                found[0].operation.as_str()
            ),
            ("example.com", None, "resolve")
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
        assert!(EgressWatch::begin(&LOCAL, &Egress::Blocked).is_none());
        assert!(EgressWatch::begin(&LOCAL, &allow).is_some());
        assert!(EgressWatch::begin(&LOCAL, &Egress::Open).is_none());
        assert!(EgressWatch::begin(&CLOUD, &Egress::Blocked).is_none());
        assert!(EgressWatch::begin(&CLOUD, &allow).is_none());
    }
}
