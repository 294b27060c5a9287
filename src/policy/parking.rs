//! Parking idle machines (`parkIdleSecs`): a temporary machine of this process that no call has
//! named for that long and that runs nothing the server knows of (no call using it, no running
//! job, no open terminal) is paused, or stopped where the fleet cannot pause it, so that an
//! agent that wandered off does not hold the host's memory. Nothing is recorded: the next call
//! finds it paused or stopped, resumes or starts it, and says so (`startedMachine`).
//!
//! Only this process's temporary machines are parked (its sessions' and its leases'): a
//! session is served by one process, and a leased machine's last use is in the shared record,
//! so a call of another process is seen. A named machine may be used by any process, and is
//! never parked. Bases (frozen) and kept machines are not running, and are left alone.

use super::Policy;
use crate::fleet::FleetKind;
use crate::process::events::ServerEvent;
use crate::process::keep::{self, PutAway};
use std::sync::Arc;
use std::time::Duration;

impl Policy {
    /// Parks idle machines every quarter of `parkIdleSecs` (at most every 30 s), until the
    /// process's clean-up begins; nothing when the setting is 0.
    pub async fn park_idle(self: Arc<Self>) {
        let idle = self.process.config.park_idle_secs;
        if idle == 0 {
            return;
        }
        let mut tick = tokio::time::interval(
            crate::process::lease::reap_interval(idle).min(Duration::from_secs(30)),
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.process.stopping() => return,
                _ = tick.tick() => {}
            }
            self.park_idle_once().await;
        }
    }

    /// One look: the machines parked now, and how each was left.
    pub async fn park_idle_once(&self) -> Vec<(String, PutAway)> {
        let idle = Duration::from_secs(self.process.config.park_idle_secs);
        if idle.is_zero() {
            return Vec::new();
        }
        // An unreadable record parks nothing this time, and forgets nothing either.
        let Ok(entries) = self.process.record.entries().await else {
            return Vec::new();
        };
        self.process.leases.forget_naming_except(&entries);
        let mut parked = Vec::new();
        for entry in entries.into_iter().filter(|e| {
            self.process.record.is_mine(e)
                && e.kept_until.is_none()
                && e.base.is_none()
                && e.session != crate::process::ephemeral::CLAIMED
        }) {
            let quiet_long_enough = self
                .process
                .leases
                .idle_for(&entry)
                .is_some_and(|quiet| quiet >= idle);
            if !quiet_long_enough || self.runs_something(entry.fleet, &entry.name, &entry.id) {
                continue;
            }
            // Only a fleet this process already reached: parking never starts a serve.
            let Some(fleet) = self.process.reached_fleet(entry.fleet).await else {
                continue;
            };
            let outcome = keep::park(&fleet, &entry).await;
            if matches!(outcome, PutAway::Paused | PutAway::Stopped) {
                tracing::info!(machine = %entry.name, outcome = ?outcome, idle_secs = idle.as_secs(), "parked an idle machine");
                self.process.events.publish(
                    ServerEvent::info(
                        "machineParked",
                        format!(
                            "{} was {} after {} unused; the next call on it {} it",
                            entry.name,
                            if outcome == PutAway::Paused {
                                "paused"
                            } else {
                                "stopped"
                            },
                            keep::duration_words(idle.as_secs()),
                            if outcome == PutAway::Paused {
                                "resumes"
                            } else {
                                "starts"
                            },
                        ),
                    )
                    .with("fleet", entry.fleet.as_str())
                    .with("machine", entry.name.clone()),
                );
                parked.push((entry.name, outcome));
            }
        }
        parked
    }

    /// A running job or an open terminal in the machine.
    fn runs_something(&self, fleet: FleetKind, name: &str, id: &str) -> bool {
        self.terminals.open_in(fleet, name)
            || self.terminals.open_in(fleet, id)
            || self.jobs.list().iter().any(|job| {
                job.kind() == fleet
                    && (job.machine == name || job.machine == id)
                    && job.state().phase == crate::policy::jobs::Phase::Running
            })
    }
}
