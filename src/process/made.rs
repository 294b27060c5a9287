//! The machines each session made, and what the cloud machines it deleted cost: what the
//! operator's limits per session count (`maxMachinesPerSession`, `cloudSpendPerSessionMicros`).
//! A session's entry goes with the session, a machine's with its delete.

use crate::fleet::FleetKind;
use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Default)]
pub struct MadeBySession {
    sessions: Mutex<HashMap<String, SessionMade>>,
}

/// What one session made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionMade {
    /// (fleet, the id its API takes), oldest first.
    pub machines: Vec<(FleetKind, String)>,
    /// What the cloud machines it deleted cost, settled at their delete.
    pub settled_micros: i64,
}

impl MadeBySession {
    pub fn made(&self, session: &str, fleet: FleetKind, id: &str) {
        if let Ok(mut sessions) = self.sessions.lock() {
            let made = sessions.entry(session.to_owned()).or_default();
            if !made.machines.iter().any(|(k, i)| *k == fleet && i == id) {
                made.machines.push((fleet, id.to_owned()));
            }
        }
    }

    /// A machine was deleted (by any session): it no longer counts, and what it cost is added
    /// to its maker's settled spend.
    pub fn deleted(&self, fleet: FleetKind, id: &str, cost_micros: Option<i64>) {
        let Ok(mut sessions) = self.sessions.lock() else {
            return;
        };
        for made in sessions.values_mut() {
            let before = made.machines.len();
            made.machines.retain(|(k, i)| !(*k == fleet && i == id));
            if made.machines.len() < before {
                made.settled_micros = made.settled_micros.saturating_add(cost_micros.unwrap_or(0));
            }
        }
    }

    pub fn of(&self, session: &str) -> SessionMade {
        self.sessions
            .lock()
            .ok()
            .and_then(|s| s.get(session).cloned())
            .unwrap_or_default()
    }

    pub fn forget(&self, session: &str) {
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.remove(session);
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
}
