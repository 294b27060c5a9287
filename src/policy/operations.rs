//! What this server does with every operation of both vendored APIs.
//!
//! Each `classify_*` is one exhaustive match with no wildcard arm: when a new smolvm (or cloud
//! spec) adds an operation, the generated `Operation` enum gains a variant and this file stops
//! compiling until someone decides whether a tool uses it or why it is left out. The reasons for
//! omissions are data in `overrides/*.json`; a test keeps the two in agreement.

use crate::generated::{smolcloud, smolvm};
use crate::policy::tools::Tool;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Called on behalf of these tools.
    Tools(&'static [Tool]),
    /// Called by the server itself, for the reason given, not as a tool.
    Internal(&'static str),
    /// Deliberately not called; `Operation::omission_reason` says why.
    Omitted,
}

impl Use {
    /// The names of the tools that call the operation (empty unless `Tools`).
    pub fn tool_names(&self) -> Vec<&'static str> {
        match self {
            Use::Tools(tools) => tools.iter().map(|t| t.name()).collect(),
            Use::Internal(_) | Use::Omitted => Vec::new(),
        }
    }
}

pub fn classify_local(op: smolvm::Operation) -> Use {
    use Use::*;
    use smolvm::Operation::*;
    match op {
        DeleteCacheBase => Omitted,
        // The machines view lists them too (view-state).
        ListMachines => Tools(&[Tool::ListMachines, Tool::ViewState]),
        CreateMachine => Tools(&[Tool::CreateMachine, Tool::RunOnce]),
        ExecCommand => Tools(&[
            Tool::RunCommand,
            Tool::RunOnce,
            Tool::CreateMachine,
            Tool::WriteFile,
            Tool::JobOutput,
            Tool::CancelJob,
            Tool::PublishPort,
            Tool::ReadFile,
            Tool::KeepChanges,
        ]),
        ExecStream => Tools(&[Tool::RunCommand, Tool::RunOnce]),
        // Spoken over the socket by fleet/terminal.rs, not through the generated method.
        ExecInteractive => Tools(&[Tool::Terminal]),
        DownloadFile => Tools(&[Tool::ReadFile, Tool::KeepChanges]),
        UploadFile => Tools(&[
            Tool::WriteFile,
            Tool::RunCommand,
            Tool::CreateMachine,
            Tool::RunOnce,
        ]),
        ListImages => Omitted,
        PullImage => Tools(&[Tool::PullImage]),
        StreamLogs => Tools(&[Tool::MachineLogs]),
        RunCommand => Omitted,
        DeleteMachine => Tools(&[Tool::DeleteMachine, Tool::RunOnce]),
        GetMachine => Tools(&[
            Tool::ListMachines,
            Tool::StartMachine,
            Tool::RunCommand,
            Tool::PublishPort,
            Tool::Terminal,
        ]),
        BranchMachine => Tools(&[Tool::BranchMachine]),
        PublishCacheDisk => Omitted,
        // Before every start the server causes, for a machine with credential bindings.
        PutCredentialValues => Tools(&[
            Tool::CreateMachine,
            Tool::StartMachine,
            Tool::RunCommand,
            Tool::RunOnce,
        ]),
        // Only after the user said yes to a network "ask" machine's question.
        UpdateMachineEgress => Tools(&[Tool::RunCommand]),
        GetMachineEgressEvents => Tools(&[Tool::RunCommand, Tool::RunOnce]),
        ExportMachine => Omitted,
        ForkMachine => Omitted,
        ReleaseHeldFork => Omitted,
        GetMachineMediationEvents => Omitted,
        DetachMount => Omitted,
        ListMounts => Omitted,
        AttachMount => Omitted,
        PauseMachine => Tools(&[Tool::StopMachine]),
        SetMachinePorts => Tools(&[Tool::PublishPort]),
        ResizeMachine => Omitted,
        // A paused machine is resumed by whatever needs it running.
        ResumeMachine => Tools(&[
            Tool::StartMachine,
            Tool::RunCommand,
            Tool::ReadFile,
            Tool::WriteFile,
            Tool::PublishPort,
            Tool::Terminal,
        ]),
        StartMachine => Tools(&[Tool::CreateMachine, Tool::StartMachine, Tool::RunOnce]),
        StopMachine => Tools(&[Tool::StopMachine]),
        SyncMachine => Omitted,
        ListPools => Omitted,
        CreatePool => Internal("a warm pool of the operator's pools setting is set up"),
        DeletePool => Internal("the warm pools this process set up go with it"),
        GetPool => Internal("a warm pool another process set up is used as it is"),
        AcquireLeaseBatch => Omitted,
        AcquireLease => Tools(&[Tool::CreateMachine, Tool::RunOnce]),
        GetLease => Omitted,
        CompleteLease => Tools(&[Tool::DeleteMachine, Tool::RunOnce]),
        HeartbeatLease => Internal("a leased machine is kept while it is in use"),
        ResizePool => Omitted,
        ListExecutors => Omitted,
        CreateExecutor => Omitted,
        DeleteExecutor => Omitted,
        GetExecutor => Omitted,
        GenerateBatch => Omitted,
        PublishDevicePolicy => Omitted,
        Generate => Omitted,
        PublishPolicy => Omitted,
        RetirePolicy => Omitted,
        Capacity => Omitted,
        Health => Internal(
            "the minimum-version check and the readiness probe of a serve this server starts",
        ),
    }
}

pub fn classify_cloud(op: smolcloud::Operation) -> Use {
    use Use::*;
    use smolcloud::Operation::*;
    match op {
        HealthCheck => Omitted,
        Livez => Omitted,
        Metrics => Omitted,
        Readyz => Omitted,
        AccountGet => Internal(
            "the cloud preflight (the account's status is checked before the first machine is created) and the daily spend ceiling",
        ),
        ApikeyList => Omitted,
        ApikeyCreate => Omitted,
        ApikeyDelete => Omitted,
        AppList => Omitted,
        AppDeploy => Omitted,
        AppDestroy => Omitted,
        AppGet => Omitted,
        AppLogs => Omitted,
        AppPromote => Omitted,
        AppRedeploy => Omitted,
        AppScale => Omitted,
        BillingMeters => Omitted,
        MachineList => Tools(&[Tool::ListMachines, Tool::ViewState]),
        MachineCreate => Tools(&[Tool::CreateMachine, Tool::RunOnce]),
        MachineDelete => Tools(&[Tool::DeleteMachine, Tool::RunOnce]),
        MachineGet => Tools(&[
            Tool::ListMachines,
            Tool::StartMachine,
            Tool::StopMachine,
            Tool::RunCommand,
            Tool::PublishPort,
        ]),
        MachineBranch => Tools(&[Tool::BranchMachine]),
        MachineCode => Omitted,
        MachineEvents => Tools(&[Tool::MachineLogs]),
        MachineExec => Tools(&[
            Tool::RunCommand,
            Tool::RunOnce,
            Tool::CreateMachine,
            Tool::WriteFile,
            Tool::ReadFile,
            Tool::JobOutput,
            Tool::CancelJob,
            Tool::PublishPort,
            Tool::KeepChanges,
        ]),
        MachineExecStream => Tools(&[Tool::RunCommand, Tool::RunOnce]),
        MachineFileRead => Tools(&[Tool::ReadFile, Tool::KeepChanges]),
        MachineFileWrite => Tools(&[
            Tool::WriteFile,
            Tool::RunCommand,
            Tool::CreateMachine,
            Tool::RunOnce,
        ]),
        MachineFork => Tools(&[Tool::BranchMachine]),
        MachineSessionList => Omitted,
        MachineSessionCreate => Omitted,
        MachineSessionDelete => Omitted,
        MachineSessionExec => Omitted,
        MachineSetPorts => Tools(&[Tool::PublishPort]),
        MachineStart => Tools(&[Tool::CreateMachine, Tool::StartMachine, Tool::RunOnce]),
        MachineStop => Tools(&[Tool::StopMachine]),
        MachineUsage => Tools(&[Tool::DeleteMachine, Tool::RunCommand, Tool::RunOnce]),
        NodeList => Omitted,
        NodeRegister => Omitted,
        NodeCredentialRevoke => Omitted,
        NodeDrain => Omitted,
        NodeHeartbeat => Omitted,
        OperationList => Omitted,
        OperationGet => Omitted,
        PlanList => Omitted,
        PlanCreate => Omitted,
        PoolList => Omitted,
        PoolCreate => Omitted,
        PoolClaim => Omitted,
        TenantList => Omitted,
        TenantCreate => Omitted,
        TenantGet => Omitted,
        TenantUpdate => Omitted,
        TenantReactivate => Omitted,
        TenantSuspend => Omitted,
        TokenList => Omitted,
        TokenCreate => Omitted,
        TokenDelete => Omitted,
        UsageQuery => Omitted,
        VolumeList => Omitted,
        VolumeCreate => Omitted,
        VolumeDelete => Omitted,
        VolumeGet => Omitted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_calls_some_upstream_operation() {
        let mut used = std::collections::HashSet::new();
        let local = smolvm::Operation::ALL.iter().map(|op| classify_local(*op));
        let cloud = smolcloud::Operation::ALL
            .iter()
            .map(|op| classify_cloud(*op));
        for classified in local.chain(cloud) {
            if let Use::Tools(tools) = classified {
                used.extend(tools.iter().copied());
            }
        }
        // Every tool asks a fleet something (job-output's list alone answers from what the
        // jobs' watchers last saw, but a job's report reads its output in the machine).
        let answered_here: [Tool; 0] = [];
        for tool in Tool::ALL {
            assert!(
                used.contains(tool) != answered_here.contains(tool),
                "{} calls no operation, or one it should not",
                tool.name()
            );
        }
    }

    #[test]
    fn every_omission_has_a_recorded_reason_and_nothing_used_has_one() {
        for op in smolvm::Operation::ALL {
            assert_eq!(
                classify_local(*op) == Use::Omitted,
                op.omission_reason().is_some(),
                "local {} {} ({})",
                op.method(),
                op.path(),
                op.operation_id()
            );
        }
        for op in smolcloud::Operation::ALL {
            assert_eq!(
                classify_cloud(*op) == Use::Omitted,
                op.omission_reason().is_some(),
                "cloud {} {} ({})",
                op.method(),
                op.path(),
                op.operation_id()
            );
        }
    }
}
