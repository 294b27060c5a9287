//! A command's output sent to the client while it runs, when the request asked for progress.

use crate::fleet::{ExecOutput, ExecSpec, Fleet, FleetResult};
use crate::policy::progress::Progress;

/// Runs `spec` in `machine`. With a progress token, through the fleet's output stream, each
/// new piece of output going to the client as a progress notification and all of it there
/// before this returns; the answer is the same whole output either way. Without one, the plain
/// exec, exactly as before streaming existed.
pub(super) async fn exec(
    progress: &Progress,
    fleet: &Fleet,
    machine: &str,
    spec: &ExecSpec,
) -> FleetResult<ExecOutput> {
    progress.doing("the command is running");
    if !progress.is_requested() {
        return fleet.exec(machine, spec).await;
    }
    progress
        .with_output(|output| {
            Box::pin(async move { fleet.exec_streamed(machine, spec, &output).await })
        })
        .await
}
