//! The machines each session made, and what the cloud machines it deleted cost: what the
//! operator's limits per session count (`maxMachinesPerSession`, `cloudSpendPerSessionMicros`).
//! A session's entry goes with the session, a machine's with its delete.
//!
//! A create admitted under a limit holds a [`MachineSlot`] from its admission to its answer, and
//! the counts include the slots held: counted only once a create answered, ten creates sent at
//! once were each admitted against the same count, and a limit of 2 let 7 through. Admissions
//! take turns ([`MadeBySession::admission`]), so a count and the slot it admits are one step.

use crate::fleet::FleetKind;
use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Default)]
pub struct MadeBySession {
    state: Mutex<State>,
    admission: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    sessions: HashMap<String, SessionMade>,
    /// Slots held by creates not yet answered.
    pending: HashMap<u64, Pending>,
    next_slot: u64,
}

struct Pending {
    session: String,
    fleet: FleetKind,
    /// The machine's name as the create sends it: a listing that already shows it counts it.
    name: String,
}

/// What one session made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionMade {
    /// (fleet, the id its API takes), oldest first.
    pub machines: Vec<(FleetKind, String)>,
    /// What the cloud machines it deleted cost, settled at their delete.
    pub settled_micros: i64,
}

/// The creates admitted and not yet answered on one fleet: the names they send, in all and for
/// one session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingCreates {
    pub in_all: Vec<String>,
    pub of_session: Vec<String>,
}

/// A machine admitted under the limits and not yet made: counted as made until it is (then it
/// is the session's, [`MachineSlot::fill`]) or until it is dropped (the create failed or was
/// cancelled, and the slot is free again).
pub struct MachineSlot<'a> {
    made: &'a MadeBySession,
    slot: u64,
}

impl MachineSlot<'_> {
    /// The create answered with `id`: the session made it, in the same step as the slot goes.
    pub fn fill(&self, id: &str) {
        if let Ok(mut state) = self.made.state.lock()
            && let Some(pending) = state.pending.remove(&self.slot)
        {
            let made = state.sessions.entry(pending.session).or_default();
            if !made
                .machines
                .iter()
                .any(|(k, i)| *k == pending.fleet && i == id)
            {
                made.machines.push((pending.fleet, id.to_owned()));
            }
        }
    }
}

impl Drop for MachineSlot<'_> {
    fn drop(&mut self) {
        if let Ok(mut state) = self.made.state.lock() {
            state.pending.remove(&self.slot);
        }
    }
}

impl MadeBySession {
    /// Held while a create is counted against the limits and its slot taken.
    pub async fn admission(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.admission.lock().await
    }

    /// A slot for the machine `name` that `session` is about to make on `fleet`.
    pub fn reserve(&self, session: &str, fleet: FleetKind, name: &str) -> MachineSlot<'_> {
        let mut slot = 0;
        if let Ok(mut state) = self.state.lock() {
            state.next_slot += 1;
            slot = state.next_slot;
            state.pending.insert(
                slot,
                Pending {
                    session: session.to_owned(),
                    fleet,
                    name: name.to_owned(),
                },
            );
        }
        MachineSlot { made: self, slot }
    }

    pub fn pending(&self, session: &str, fleet: FleetKind) -> PendingCreates {
        let mut creates = PendingCreates::default();
        if let Ok(state) = self.state.lock() {
            for p in state.pending.values().filter(|p| p.fleet == fleet) {
                creates.in_all.push(p.name.clone());
                if p.session == session {
                    creates.of_session.push(p.name.clone());
                }
            }
        }
        creates
    }

    pub fn made(&self, session: &str, fleet: FleetKind, id: &str) {
        if let Ok(mut state) = self.state.lock() {
            let made = state.sessions.entry(session.to_owned()).or_default();
            if !made.machines.iter().any(|(k, i)| *k == fleet && i == id) {
                made.machines.push((fleet, id.to_owned()));
            }
        }
    }

    /// A machine was deleted (by any session): it no longer counts, and what it cost is added
    /// to its maker's settled spend.
    pub fn deleted(&self, fleet: FleetKind, id: &str, cost_micros: Option<i64>) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        for made in state.sessions.values_mut() {
            let before = made.machines.len();
            made.machines.retain(|(k, i)| !(*k == fleet && i == id));
            if made.machines.len() < before {
                made.settled_micros = made.settled_micros.saturating_add(cost_micros.unwrap_or(0));
            }
        }
    }

    pub fn of(&self, session: &str) -> SessionMade {
        self.state
            .lock()
            .ok()
            .and_then(|s| s.sessions.get(session).cloned())
            .unwrap_or_default()
    }

    pub fn forget(&self, session: &str) {
        if let Ok(mut state) = self.state.lock() {
            state.sessions.remove(session);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_machine_stops_counting_and_its_cost_stays_with_its_maker() {
        let made = MadeBySession::default();
        made.made("s1", FleetKind::Cloud, "mach-a");
        made.made("s1", FleetKind::Cloud, "mach-a");
        made.made("s1", FleetKind::Local, "b");
        made.made("s2", FleetKind::Cloud, "mach-c");
        assert_eq!(made.of("s1").machines.len(), 2);
        made.deleted(FleetKind::Cloud, "mach-a", Some(1800));
        assert_eq!(
            made.of("s1"),
            SessionMade {
                machines: vec![(FleetKind::Local, "b".into())],
                settled_micros: 1800
            }
        );
        assert_eq!(made.of("s2").settled_micros, 0);
        made.forget("s1");
        assert_eq!(made.of("s1"), SessionMade::default());
    }

    #[test]
    fn a_slot_counts_until_it_is_filled_or_dropped() {
        let made = MadeBySession::default();
        let a = made.reserve("s1", FleetKind::Local, "a");
        let b = made.reserve("s1", FleetKind::Local, "b");
        let _c = made.reserve("s2", FleetKind::Local, "c");
        let _d = made.reserve("s1", FleetKind::Cloud, "d");
        let pending = made.pending("s1", FleetKind::Local);
        let mut in_all = pending.in_all.clone();
        in_all.sort();
        assert_eq!(in_all, ["a", "b", "c"]);
        assert_eq!(pending.of_session.len(), 2);
        a.fill("a-id");
        drop(a);
        drop(b);
        assert_eq!(
            made.pending("s1", FleetKind::Local).of_session,
            Vec::<String>::new()
        );
        assert_eq!(
            made.of("s1").machines,
            vec![(FleetKind::Local, "a-id".to_owned())]
        );
    }
}
