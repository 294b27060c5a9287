//! A machine's log: locally what its workload printed, or the engine's own log of it; on cloud
//! the control plane's event log.

use super::ToolError;
use super::args;
use super::call::parts::{Cancel, Fleets, Ownership};
use super::results;
use crate::fleet::{Feature, LogSource};
use crate::process::config::Config;

pub(super) async fn machine_logs(
    (machines, fleets, cancel, config): (Ownership<'_>, Fleets<'_>, Cancel<'_>, &Config),
    a: args::LogsArgs,
) -> Result<results::Logs, ToolError> {
    let named = machines.machine(&a.name)?;
    let tail = a.tail.unwrap_or(config.logs_tail as u64);
    args::range("tail", tail, 1, args::MAX_LOG_TAIL)?;
    let fleet = fleets.reach(a.target).await?;
    let one_log = fleet.capabilities().lacks(Feature::LogSources);
    let source = match (a.source, one_log) {
        (None, _) => LogSource::Workload,
        (Some(_), Some(why)) => return Err(ToolError::argument("source", why)),
        (Some(args::LogSourceArg::Workload), None) => LogSource::Workload,
        (Some(args::LogSourceArg::Engine), None) => LogSource::Engine,
    };
    let page = cancel
        .run(fleet.logs(&named, tail as usize, a.cursor.as_deref(), source))
        .await?;
    // Keep the newest lines that fit the budget.
    let budget = config.max_output_bytes;
    let mut used = 0;
    let mut keep = 0;
    for line in page.lines.iter().rev() {
        if used + line.len() + 1 > budget {
            break;
        }
        used += line.len() + 1;
        keep += 1;
    }
    let truncated = keep < page.lines.len();
    let lines = page.lines[page.lines.len() - keep..].to_vec();
    Ok(results::Logs {
        lines,
        cursor: page.cursor,
        truncated,
        gap: page.gap,
        note: page.note,
    })
}
