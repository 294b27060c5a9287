//! A machine's log: locally what its workload printed, or the engine's own log of it; on cloud
//! the control plane's event log.

use super::args;
use super::results;
use super::{Call, ToolError};
use crate::fleet::{FleetKind, LogSource};

pub(super) async fn machine_logs(
    call: &Call<'_>,
    a: args::LogsArgs,
) -> Result<results::Logs, ToolError> {
    args::machine_ref("name", &a.name)?;
    let tail = a.tail.unwrap_or(call.config().logs_tail as u64);
    args::range("tail", tail, 1, 10_000)?;
    let fleet = call.fleet(a.target).await?;
    let source = match (a.source, fleet.kind()) {
        (None, _) => LogSource::Workload,
        (Some(_), FleetKind::Cloud) => {
            return Err(ToolError::argument(
                "source",
                "is local only: a cloud machine has one log, its control plane's event log; \
                 leave source out",
            ));
        }
        (Some(args::LogSourceArg::Workload), _) => LogSource::Workload,
        (Some(args::LogSourceArg::Engine), _) => LogSource::Engine,
    };
    let page = call
        .cancellable(fleet.logs(&a.name, tail as usize, a.cursor.as_deref(), source))
        .await?;
    // Keep the newest lines that fit the budget.
    let budget = call.config().max_output_bytes;
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
