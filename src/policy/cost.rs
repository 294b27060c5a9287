//! What a run cost its machine, from the fleet's figures read before and after it: the
//! foreground commands' (`tools::commands`) and the background jobs' (`jobs`).

use schemars::JsonSchema;
use serde::Serialize;
use std::time::Duration;

/// How long reading a machine's consumption may hold up a run's answer; past it the run's cost
/// goes unreported rather than the answer late.
const READING_WAIT: Duration = Duration::from_secs(5);

/// The machine's consumption now, or `None` when its fleet does not say in time: a run's cost
/// is worth a request, not a failed run.
pub async fn reading(
    fleet: &crate::fleet::Fleet,
    machine: &str,
) -> Option<crate::fleet::Consumption> {
    match tokio::time::timeout(READING_WAIT, fleet.consumption(machine)).await {
        Ok(Ok(now)) => Some(now),
        Ok(Err(e)) => {
            tracing::debug!(%machine, error = %e, "no consumption figures for the run's cost");
            None
        }
        Err(_) => None,
    }
}

/// What a run cost its machine: the change in the fleet's own figures from just before the
/// command to just after it (so a background process it left running counts too).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunCost {
    /// CPU time used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<i64>,
    /// The higher of the machine's resident memory before and after, in MiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss_mb: Option<i64>,
    /// Disk it wrote (or freed, if negative), in MiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_bytes: Option<i64>,
    /// What the cloud reports it cost, in millionths of a dollar (a lower bound: it samples
    /// every few minutes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_micros: Option<i64>,
}

impl RunCost {
    /// The cost between two readings; `None` when neither reports anything. A counter lower
    /// after than before (the machine restarted meanwhile) counts from zero.
    pub fn between(
        before: Option<&crate::fleet::Consumption>,
        after: Option<&crate::fleet::Consumption>,
    ) -> Option<RunCost> {
        let after = after?;
        let counted = |a: Option<i64>, b: Option<i64>| match (a, b) {
            (Some(after), Some(before)) if after >= before => Some(after - before),
            (Some(after), _) => Some(after),
            (None, _) => None,
        };
        let cost = RunCost {
            cpu_millis: counted(after.cpu_millis, before.and_then(|b| b.cpu_millis)),
            peak_rss_mb: after
                .rss_mb
                .max(before.and_then(|b| b.rss_mb))
                .or(after.rss_mb),
            disk_mb: match (after.disk_used_mb, before.and_then(|b| b.disk_used_mb)) {
                (Some(a), Some(b)) => Some(a - b),
                _ => None,
            },
            egress_bytes: counted(after.egress_bytes, before.and_then(|b| b.egress_bytes)),
            cost_micros: counted(after.cost_micros, before.and_then(|b| b.cost_micros)),
        };
        (cost != RunCost::default()).then_some(cost)
    }
}
