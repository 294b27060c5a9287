//! What this server does with every operation of both vendored APIs.
//!
//! Each `classify_*` is one exhaustive match with no wildcard arm: when a new smolvm (or cloud
//! spec) adds an operation, the generated `Operation` enum gains a variant and this file stops
//! compiling until someone decides whether a tool uses it or why it is left out. The reasons for
//! omissions are data in `overrides/*.json`; a test keeps the two in agreement.

use crate::generated::{smolcloud, smolvm};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Called on behalf of these tools.
    Tools(&'static [&'static str]),
    /// Called by the server itself, for the reason given, not as a tool.
    Internal(&'static str),
    /// Deliberately not called; `Operation::omission_reason` says why.
    Omitted,
}

impl Use {
    /// The names of the tools that call the operation (empty unless `Tools`).
    pub fn tool_names(&self) -> Vec<&'static str> {
        match self {
            Use::Tools(tools) => tools.to_vec(),
            Use::Internal(_) | Use::Omitted => Vec::new(),
        }
    }
}

pub fn classify_local(op: smolvm::Operation) -> Use {
    use Use::*;
    use smolvm::Operation::*;
    match op {
        DeleteCacheBase => Omitted,
        ListMachines => Tools(&["list-machines"]),
        CreateMachine => Tools(&["create-machine", "run-once"]),
        ExecCommand => Tools(&["run-command", "run-once", "create-machine", "write-file"]),
        ExecStream => Omitted,
        DownloadFile => Tools(&["read-file"]),
        UploadFile => Tools(&["write-file", "run-command"]),
        ListImages => Omitted,
        PullImage => Tools(&["pull-image"]),
        StreamLogs => Tools(&["machine-logs"]),
        RunCommand => Omitted,
        DeleteMachine => Tools(&["delete-machine", "run-once"]),
        GetMachine => Tools(&["get-machine", "start-machine"]),
        BranchMachine => Tools(&["branch-machine"]),
        PublishCacheDisk => Omitted,
        PutCredentialValues => Omitted,
        UpdateMachineEgress => Omitted,
        GetMachineEgressEvents => Omitted,
        ExportMachine => Omitted,
        ForkMachine => Omitted,
        ReleaseHeldFork => Omitted,
        GetMachineMediationEvents => Omitted,
        DetachMount => Omitted,
        ListMounts => Omitted,
        AttachMount => Omitted,
        PauseMachine => Omitted,
        SetMachinePorts => Omitted,
        ResizeMachine => Omitted,
        ResumeMachine => Omitted,
        StartMachine => Tools(&["create-machine", "start-machine", "run-once"]),
        StopMachine => Tools(&["stop-machine"]),
        SyncMachine => Omitted,
        ListPools => Omitted,
        CreatePool => Omitted,
        DeletePool => Omitted,
        GetPool => Omitted,
        AcquireLeaseBatch => Omitted,
        AcquireLease => Omitted,
        GetLease => Omitted,
        CompleteLease => Omitted,
        HeartbeatLease => Omitted,
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
            "the cloud preflight: the account's status is checked before the first machine is created",
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
        MachineList => Tools(&["list-machines"]),
        MachineCreate => Tools(&["create-machine", "run-once"]),
        MachineDelete => Tools(&["delete-machine", "run-once"]),
        MachineGet => Tools(&["get-machine", "start-machine", "stop-machine"]),
        MachineBranch => Tools(&["branch-machine"]),
        MachineCode => Omitted,
        MachineEvents => Tools(&["machine-logs"]),
        MachineExec => Tools(&[
            "run-command",
            "run-once",
            "create-machine",
            "write-file",
            "read-file",
        ]),
        MachineFileRead => Tools(&["read-file"]),
        MachineFileWrite => Tools(&["write-file", "run-command"]),
        MachineFork => Tools(&["branch-machine"]),
        MachineSessionList => Omitted,
        MachineSessionCreate => Omitted,
        MachineSessionDelete => Omitted,
        MachineSessionExec => Omitted,
        MachineStart => Tools(&["create-machine", "start-machine", "run-once"]),
        MachineStop => Tools(&["stop-machine"]),
        MachineUsage => Tools(&["delete-machine"]),
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
