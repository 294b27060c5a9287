//! The policy layer: one table of tools. Each row owns a tool's name, title, annotations,
//! argument and result types, whether it can change a machine, its handler and its description;
//! the catalog (`tools/list`), the dispatch of `tools/call`, the unknown-name error and the
//! classification of upstream operations (`crate::operations`) all derive from it.
//!
//! The handlers are grouped by what they touch: `lifecycle.rs` (machines), `commands.rs`
//! (commands run in them), `files.rs`, `logs.rs`. What they share is in `call.rs` (fleet choice,
//! cancellation, readiness) and `provisional.rs` (machines a call creates).

pub mod args;
mod call;
mod commands;
pub mod error;
mod files;
mod lifecycle;
mod logs;
pub mod output;
mod provisional;
pub mod results;
pub mod schema;

use crate::backend::{Backend, Mode};
pub use call::Call;
pub use error::{ToolError, ToolErrorKind};
use serde_json::Value;
use std::sync::Arc;

/// What a client may assume about a tool (MCP tool annotations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hints {
    pub read_only: bool,
    pub destructive: bool,
    pub idempotent: bool,
    pub open_world: bool,
}

/// Declares every tool once. A row: `Variant => "name" { title, hints, changes_machines, args,
/// result, run, description }`. Adding a tool is a row here and its handler.
macro_rules! tool_table {
    ($(
        $variant:ident => $name:literal {
            title: $title:literal,
            hints: $hints:expr,
            changes_machines: $changes:literal,
            args: $args:ty,
            result: $result:ty,
            run: $handler:path,
            description: $description:literal $(,)?
        }
    )+) => {
        /// Every tool this server offers.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Tool {
            $($variant,)+
        }

        impl Tool {
            pub const ALL: &'static [Tool] = &[$(Tool::$variant,)+];

            pub fn name(self) -> &'static str {
                match self {
                    $(Tool::$variant => $name,)+
                }
            }

            pub fn title(self) -> &'static str {
                match self {
                    $(Tool::$variant => $title,)+
                }
            }

            /// Written for a model choosing between tools.
            pub fn description(self) -> &'static str {
                match self {
                    $(Tool::$variant => $description,)+
                }
            }

            pub fn hints(self) -> Hints {
                match self {
                    $(Tool::$variant => $hints,)+
                }
            }

            /// Whether a call may change a machine or its files (so that nothing read before it
            /// may be served from a copy after it).
            pub fn changes_machines(self) -> bool {
                match self {
                    $(Tool::$variant => $changes,)+
                }
            }

            /// The input schema (with `target` as an optional property; the catalog adapts it
            /// to the mode) and the output schema.
            fn schemas(self) -> (rmcp::model::JsonObject, rmcp::model::JsonObject) {
                match self {
                    $(Tool::$variant => (schema::input::<$args>(), schema::output::<$result>()),)+
                }
            }

            async fn run(self, call: &Call<'_>, args: Value) -> Result<results::Answer, ToolError> {
                match self {
                    $(Tool::$variant => {
                        let parsed: $args = args::parse(self, &call.catalog, args)?;
                        let result: $result = $handler(call, parsed).await?;
                        results::answer(result)
                    })+
                }
            }
        }
    };
}

const READ_ONLY: Hints = Hints {
    read_only: true,
    destructive: false,
    idempotent: true,
    open_world: false,
};

tool_table! {
    ListMachines => "list-machines" {
        title: "List machines",
        hints: READ_ONLY,
        changes_machines: false,
        args: args::TargetOnly,
        result: results::MachineList,
        run: lifecycle::list_machines,
        description: "List every machine on the fleet with its state, size, egress, image and (cloud) ingress url. \
             Read-only. Use it to find a machine's name or to see what is still running before creating another.",
    }
    GetMachine => "get-machine" {
        title: "Get a machine",
        hints: READ_ONLY,
        changes_machines: false,
        args: args::MachineArgs,
        result: crate::fleet::Machine,
        run: lifecycle::get_machine,
        description: "Report one machine: state (running, stopped, created...), cpus, memoryMb, network, image, \
             url (the cloud ingress of its first published port, null locally or until something listens), \
             pid, createdAt. Read-only; fails with NOT_FOUND when there is no such machine.",
    }
    CreateMachine => "create-machine" {
        title: "Create a machine",
        hints: Hints { read_only: false, destructive: false, idempotent: false, open_world: true },
        changes_machines: true,
        args: args::CreateArgs,
        result: results::Created,
        run: lifecycle::create_machine,
        description: "Create a microVM from an OCI image, start it, and wait until a command has run in it \
             (ready: true). Egress is blocked unless network, allowHosts or allowCidrs says otherwise. \
             Without a name (or with the mcp- prefix) the machine is ephemeral: deleted when this session ends. \
             If the start fails, a machine this call named itself is deleted again; one you named is left, \
             stopped, for you to inspect or delete. On cloud the machine costs money while it exists. \
             For one command in a throwaway machine, run-once is simpler.",
    }
    StartMachine => "start-machine" {
        title: "Start a machine",
        hints: Hints { read_only: false, destructive: false, idempotent: true, open_world: false },
        changes_machines: true,
        args: args::StartArgs,
        result: results::Started,
        run: lifecycle::start_machine,
        description: "Start a stopped machine and, unless wait is false, wait until a command has run in it. \
             This is the way back from stop-machine: creating a machine with an existing name is a conflict.",
    }
    StopMachine => "stop-machine" {
        title: "Stop a machine",
        hints: Hints { read_only: false, destructive: true, idempotent: true, open_world: false },
        changes_machines: true,
        args: args::MachineArgs,
        result: results::Stopped,
        run: lifecycle::stop_machine,
        description: "Stop a running machine. Its disk is kept; memory, running processes and /tmp are lost. \
             On cloud a stopped machine bills for its disk only. start-machine starts it again.",
    }
    DeleteMachine => "delete-machine" {
        title: "Delete a machine",
        hints: Hints { read_only: false, destructive: true, idempotent: true, open_world: false },
        changes_machines: true,
        args: args::MachineArgs,
        result: crate::fleet::Deleted,
        run: lifecycle::delete_machine,
        description: "Delete a machine, running or not, with its disk. Irreversible. On cloud the result carries \
             usageMicros, what the machine cost in millionths of a dollar; it is null locally.",
    }
    RunCommand => "run-command" {
        title: "Run a command",
        hints: Hints { read_only: false, destructive: true, idempotent: false, open_world: true },
        changes_machines: true,
        args: args::RunCommandArgs,
        result: results::CommandRun,
        run: commands::run_command,
        description: "Run a command in an existing machine and return stdout, stderr and exitCode. A non-zero exit \
             is a result, not an error; timedOut says the command hit timeoutSecs (exit 124). Output past \
             the budget keeps its head and tail (truncated: true) and the whole stream is written into the \
             machine at the path overflow names, to read with read-file. A stopped machine is started by \
             the command and left running (startedMachine: true).",
    }
    RunOnce => "run-once" {
        title: "Run once in a throwaway machine",
        hints: Hints { read_only: false, destructive: false, idempotent: false, open_world: true },
        changes_machines: true,
        args: args::RunOnceArgs,
        result: results::RunOnce,
        run: commands::run_once,
        description: "Create a machine from an image, run one command, and delete the machine, whatever happens \
             (success, failure, timeout or cancellation). Use it for a self-contained command; use \
             create-machine and run-command when later calls need the same machine.",
    }
    ReadFile => "read-file" {
        title: "Read a file",
        hints: Hints { read_only: false, destructive: false, idempotent: true, open_world: false },
        changes_machines: false,
        args: args::ReadFileArgs,
        result: results::FileRead,
        run: files::read_file,
        description: "Read a file from a machine, as utf8 text or base64. The page itself is the answer's second \
             content block (text); the structured result says where it sits: size (the whole file), offset, bytes, \
             eof. Large files are read in pages: pass offset and length, and continue from offset + bytes until \
             eof is true. A stopped machine is started by the read and left running (startedMachine: true).",
    }
    WriteFile => "write-file" {
        title: "Write a file",
        hints: Hints { read_only: false, destructive: true, idempotent: true, open_world: false },
        changes_machines: true,
        args: args::WriteFileArgs,
        result: results::FileWritten,
        run: files::write_file,
        description: "Write a whole file into a machine (utf8 or base64 content), creating parent directories and \
             replacing any file at that path. Waits until the machine runs commands first, so the file is \
             not written under a mount that later hides it. A stopped machine is started and left running.",
    }
    BranchMachine => "branch-machine" {
        title: "Branch a machine",
        hints: Hints { read_only: false, destructive: false, idempotent: false, open_world: false },
        changes_machines: true,
        args: args::BranchArgs,
        result: results::Branched,
        run: lifecycle::branch_machine,
        description: "Copy a running machine created with branchable true into a new child, memory and disks \
             included, and wait until a command has run in the child. The source keeps running. \
             Refused (CONFLICT) when the source is not branchable or not running.",
    }
    MachineLogs => "machine-logs" {
        title: "Read a machine's log",
        hints: READ_ONLY,
        changes_machines: false,
        args: args::LogsArgs,
        result: results::Logs,
        run: logs::machine_logs,
        description: "Read the last lines of a machine's log, or only what arrived since a previous call by passing \
             back its cursor. Locally this is the guest console; on cloud it is the control plane's event \
             log (what happened to the machine, not what ran inside it).",
    }
    PullImage => "pull-image" {
        title: "Pull an image",
        hints: Hints { read_only: false, destructive: false, idempotent: true, open_world: true },
        changes_machines: true,
        args: args::PullArgs,
        result: crate::fleet::PulledImage,
        run: lifecycle::pull_image,
        description: "Pull an OCI image into a running local machine's image cache. Local fleet only: on cloud the \
             control plane pulls the image at create.",
    }
}

impl Tool {
    pub fn from_name(name: &str) -> Option<Tool> {
        Tool::ALL.iter().copied().find(|t| t.name() == name)
    }
}

/// The tools as this process shows them, and the schemas arguments are checked against.
#[derive(Debug)]
pub struct Catalog {
    pub mode: Mode,
    /// What `tools/list` answers: `target` removed with one fleet, required with both.
    pub listed: Vec<rmcp::model::Tool>,
    /// Each tool's input schema with `target` optional, for checking arguments.
    inputs: Vec<(Tool, rmcp::model::JsonObject)>,
}

impl Catalog {
    fn build(mode: Mode) -> Catalog {
        let mut listed = Vec::new();
        let mut inputs = Vec::new();
        for tool in Tool::ALL.iter().copied() {
            let (input, output) = tool.schemas();
            listed.push(schema::definition(tool, mode, input.clone(), output));
            inputs.push((tool, input));
        }
        Catalog {
            mode,
            listed,
            inputs,
        }
    }

    /// Built once per process and mode: the schemas depend on nothing else.
    pub fn of(mode: Mode) -> Arc<Catalog> {
        use crate::fleet::FleetKind;
        use std::sync::OnceLock;
        static LOCAL: OnceLock<Arc<Catalog>> = OnceLock::new();
        static CLOUD: OnceLock<Arc<Catalog>> = OnceLock::new();
        static BOTH: OnceLock<Arc<Catalog>> = OnceLock::new();
        let cell = match mode {
            Mode::Single(FleetKind::Local) => &LOCAL,
            Mode::Single(FleetKind::Cloud) => &CLOUD,
            Mode::Both => &BOTH,
        };
        cell.get_or_init(|| Arc::new(Catalog::build(mode))).clone()
    }

    pub fn input(&self, tool: Tool) -> Option<&rmcp::model::JsonObject> {
        self.inputs.iter().find(|(t, _)| *t == tool).map(|(_, s)| s)
    }
}

/// Runs one tool call to its structured result or its tool error.
pub async fn call(
    backend: &Backend,
    session: &str,
    ct: tokio_util::sync::CancellationToken,
    tool: Tool,
    args: Value,
) -> Result<results::Answer, ToolError> {
    if tool.changes_machines() {
        // Later pages of a read must not come from a copy taken before this call.
        backend.forget_parked_reads();
    }
    let call = Call::new(backend, session, ct);
    let result = tool.run(&call, args).await;
    call.after(&result).await;
    result
}
