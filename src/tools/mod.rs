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
mod egress_report;
pub mod error;
mod files;
mod jobs;
mod lifecycle;
mod logs;
pub mod output;
mod provisional;
pub mod results;
pub mod schema;
mod streamed;

use crate::backend::{Backend, Mode};
pub use call::{Call, Scope};
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
        description: "List this fleet's machines. Use it to find a machine to reuse, or to see what still runs \
             before creating another{cloud: (each costs money while it exists)}; for one known machine, \
             get-machine.",
    }
    GetMachine => "get-machine" {
        title: "Get a machine",
        hints: READ_ONLY,
        changes_machines: false,
        args: args::MachineArgs,
        result: crate::fleet::Machine,
        run: lifecycle::get_machine,
        description: "Report one machine's state (running, stopped, created...), size, egress and image{cloud:, \
             and its url (ingress of its first published port)}. Use it to check a machine exists, runs, \
             or that a start took. NOT_FOUND if there is none.",
    }
    CreateMachine => "create-machine" {
        title: "Create a machine",
        hints: Hints { read_only: false, destructive: false, idempotent: false, open_world: true },
        changes_machines: true,
        args: args::CreateArgs,
        result: results::Created,
        run: lifecycle::create_machine,
        description: "Create a microVM and, unless start is false, boot it and wait until it runs commands. Egress \
             is blocked unless network, allowHosts or allowCidrs grant it. Unnamed, it is ephemeral \
             (deleted when the session ends); a named one persists until delete-machine, and is left \
             stopped if its start fails. {cloud:A cloud machine costs money while it exists. }For one \
             command in a throwaway machine, use run-once.",
    }
    StartMachine => "start-machine" {
        title: "Start a machine",
        hints: Hints { read_only: false, destructive: false, idempotent: true, open_world: false },
        changes_machines: true,
        args: args::StartArgs,
        result: results::Started,
        run: lifecycle::start_machine,
        description: "Start a stopped machine and, unless wait is false, wait until it runs commands. Its disk is \
             as left; memory, processes and /tmp start empty. The way back from stop-machine.{cloud: A \
             running cloud machine bills for CPU and memory.}",
    }
    StopMachine => "stop-machine" {
        title: "Stop a machine",
        hints: Hints { read_only: false, destructive: true, idempotent: true, open_world: false },
        changes_machines: true,
        args: args::MachineArgs,
        result: results::Stopped,
        run: lifecycle::stop_machine,
        description: "Stop a running machine: processes, memory, /tmp and jobs end; the disk stays. Use it to \
             pause a machine to resume with start-machine{cloud: (a stopped cloud machine bills for disk \
             only)}; to throw it away, delete-machine.",
    }
    DeleteMachine => "delete-machine" {
        title: "Delete a machine",
        hints: Hints { read_only: false, destructive: true, idempotent: true, open_world: false },
        changes_machines: true,
        args: args::MachineArgs,
        result: crate::fleet::Deleted,
        run: lifecycle::delete_machine,
        description: "Delete a machine, running or not, with its disk and jobs. Irreversible. Ephemeral machines \
             go anyway when the session ends: delete them earlier only to free resources. To keep the \
             disk, stop-machine.{cloud: On cloud, usageMicros is what it cost, in millionths of a \
             dollar.}",
    }
    RunCommand => "run-command" {
        title: "Run a command",
        hints: Hints { read_only: false, destructive: true, idempotent: false, open_world: true },
        changes_machines: true,
        args: args::RunCommandArgs,
        result: results::RunCommandAnswer,
        run: commands::run_command,
        description: "Run a command in an existing machine and wait for its end: stdout, stderr, exitCode \
             (non-zero is a result, not an error). Each call is a new process: cd and export do not carry \
             over; pass workdir and env. Long output keeps head and tail; the whole is saved in the \
             machine (overflow). Starts a stopped machine. For builds, tests, installs or anything that \
             may outlast this call, pass background: true and follow the job with job-output.",
    }
    JobOutput => "job-output" {
        title: "Read a job's output",
        hints: READ_ONLY,
        changes_machines: false,
        args: args::JobOutputArgs,
        result: results::JobReport,
        run: jobs::job_output,
        description: "Read a background job: state (running, exited, timedOut, cancelled, or lost with its \
             machine), exitCode once ended, and output after the cursor you pass. Pass the returned \
             cursor back for new output; more: true means more waits. waitSecs waits that long for the \
             end: how to wait out a long build.",
    }
    CancelJob => "cancel-job" {
        title: "Cancel a job",
        hints: Hints { read_only: false, destructive: true, idempotent: true, open_world: false },
        changes_machines: true,
        args: args::JobArgs,
        result: results::JobSummary,
        run: jobs::cancel_job,
        description: "Stop a background job now, killing its command and every process it started (cancelled, exit \
             137). Its output so far stays readable with job-output; the machine keeps running.",
    }
    ListJobs => "list-jobs" {
        title: "List jobs",
        hints: READ_ONLY,
        changes_machines: false,
        args: args::TargetOnly,
        result: results::JobList,
        run: jobs::list_jobs,
        description: "List this server's background jobs on the fleet, newest first: running ones and the last 100 \
             ended. Use it to find a lost job id, or to see what runs before starting more.",
    }
    RunOnce => "run-once" {
        title: "Run in a throwaway machine",
        hints: Hints { read_only: false, destructive: false, idempotent: false, open_world: true },
        changes_machines: true,
        args: args::RunOnceArgs,
        result: results::RunOnce,
        run: commands::run_once,
        description: "Run one command in a fresh machine deleted afterwards, whatever happens (even timeout or \
             cancellation); the result is run-command's. Nothing persists: use create-machine and \
             run-command when later calls need the machine or its files. Egress is blocked unless \
             network, allowHosts or allowCidrs grant it.",
    }
    ReadFile => "read-file" {
        title: "Read a file",
        hints: Hints { read_only: false, destructive: false, idempotent: true, open_world: false },
        changes_machines: false,
        args: args::ReadFileArgs,
        result: results::FileRead,
        run: files::read_file,
        description: "Read a file from a machine a page at a time: the page is the answer's second content block; \
             size, offset, bytes and eof place it. Continue from offset + bytes until eof. Also reads \
             run-command's overflow and job outputFiles. Starts a stopped machine.",
    }
    WriteFile => "write-file" {
        title: "Write a file",
        hints: Hints { read_only: false, destructive: true, idempotent: true, open_world: false },
        changes_machines: true,
        args: args::WriteFileArgs,
        result: results::FileWritten,
        run: files::write_file,
        description: "Write a whole file into a machine, creating parent directories and replacing what was there. \
             Waits until the machine runs commands, so the next command sees the file. Starts a stopped \
             machine.",
    }
    BranchMachine => "branch-machine" {
        title: "Branch a machine",
        hints: Hints { read_only: false, destructive: false, idempotent: false, open_world: false },
        changes_machines: true,
        args: args::BranchArgs,
        result: results::Branched,
        run: lifecycle::branch_machine,
        description: "Copy a running machine (memory, processes, disk) into a new child that goes on from that \
             state while the source runs on. Use it to try something risky or to fan out from a prepared \
             machine. The source must be branchable (branchable: true at create{local:, or at \
             start-machine}), else CONFLICT.",
    }
    MachineLogs => "machine-logs" {
        title: "Read a machine's log",
        hints: READ_ONLY,
        changes_machines: false,
        args: args::LogsArgs,
        result: results::Logs,
        run: logs::machine_logs,
        description: "Read a machine's log: the last lines, or what arrived since a previous cursor. {local:By \
             default what its workload (the image's own command) printed, kept across restarts; source \
             engine: the engine's boot and agent log. }{cloud:On cloud it is the control plane's event \
             log: what happened to the machine. }Command output comes from run-command or job-output.",
    }
    PullImage => "pull-image" {
        title: "Pull an image",
        hints: Hints { read_only: false, destructive: false, idempotent: true, open_world: true },
        changes_machines: true,
        args: args::PullArgs,
        result: crate::fleet::PulledImage,
        run: lifecycle::pull_image,
        description: "{local:Pull an OCI image into a running machine's image store. Rarely needed: create-machine \
             and run-once pull their own image. Use it to fetch another image ahead of time.}{cloud: Not \
             on cloud: the control plane pulls each machine's image at create.}",
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
            inputs.push((tool, schema::worded_for(input, mode)));
        }
        schema::refer_to_first_mention(&mut listed);
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

/// Who a tool call is made for: the owner of the ephemeral machines it makes (a session, or the
/// process's lease holder), the fleets it may name, the client's cancellation, and where its
/// waits are reported.
pub struct Caller<'a> {
    pub owner: &'a str,
    pub scope: call::Scope,
    pub ct: tokio_util::sync::CancellationToken,
    pub progress: crate::server::notify::Progress,
    /// Keeps the caller's session open while a job it starts runs (HTTP sessions only).
    pub session_hold: Option<crate::jobs::SessionHoldRef>,
}

/// Runs one tool call to its structured result or its tool error.
pub async fn call(
    backend: &Arc<Backend>,
    caller: Caller<'_>,
    tool: Tool,
    args: Value,
) -> Result<results::Answer, ToolError> {
    if tool.changes_machines() {
        // Later pages of a read must not come from a copy taken before this call.
        backend.forget_parked_reads();
    }
    let call = Call::new(
        backend,
        caller.owner,
        caller.scope,
        caller.ct,
        caller.progress,
    )
    .with_session_hold(caller.session_hold);
    // Every machine the call names: its lease is renewed and the reaper waits for the call.
    for key in ["name", "childName"] {
        if let Some(name) = args.get(key).and_then(Value::as_str) {
            call.hold(name);
        }
    }
    let result = tool.run(&call, args).await;
    call.after(result).await
}
