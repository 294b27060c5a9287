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
        description: "List every machine on this fleet with its name (or cloud id), state, size, egress, image, url \
             and createdAt. Read-only and quick. Use it to find a machine to reuse, or to see what is still \
             running (on cloud: still costing money) before creating another; for one machine you already \
             know, get-machine is enough.",
    }
    GetMachine => "get-machine" {
        title: "Get a machine",
        hints: READ_ONLY,
        changes_machines: false,
        args: args::MachineArgs,
        result: crate::fleet::Machine,
        run: lifecycle::get_machine,
        description: "Report one machine by name (or cloud id): state (running, stopped, created...), cpus, memoryMb, \
             network, image, url (the cloud ingress of its first published port; null locally), createdAt. \
             Read-only and quick. Prefer it to list-machines to check whether a machine is running or a \
             start took. Fails with NOT_FOUND when there is no such machine.",
    }
    CreateMachine => "create-machine" {
        title: "Create a machine",
        hints: Hints { read_only: false, destructive: false, idempotent: false, open_world: true },
        changes_machines: true,
        args: args::CreateArgs,
        result: results::Created,
        run: lifecycle::create_machine,
        description: "Create a microVM from an OCI image and, unless start is false, start it and wait until it runs \
             commands (up to readyTimeoutSecs, 120 s by default, plus the image pull); then run-command, \
             read-file and write-file work in it. Egress is blocked unless network, allowHosts or allowCidrs \
             grant it, and on the local fleet a registry image needs egress to its registry. Without a name \
             (or with the mcp- prefix) the machine is ephemeral: deleted when this session ends (a client \
             without sessions: once unused for the server's lease, 30 min by default); any other name persists until delete-machine. If the start fails, a machine this call named is deleted \
             again; one you named is left, stopped, to inspect. On cloud it costs money while it exists. For \
             one command in a throwaway machine, run-once is simpler.",
    }
    StartMachine => "start-machine" {
        title: "Start a machine",
        hints: Hints { read_only: false, destructive: false, idempotent: true, open_world: false },
        changes_machines: true,
        args: args::StartArgs,
        result: results::Started,
        run: lifecycle::start_machine,
        description: "Start a stopped machine and, unless wait is false, wait until it runs commands (up to \
             readyTimeoutSecs, 120 s by default). Its disk is as it was left; memory, processes and /tmp \
             start empty. On cloud a started machine bills for CPU and memory again until it is stopped. \
             This is the way back from stop-machine (creating a machine with an existing name is a \
             conflict).",
    }
    StopMachine => "stop-machine" {
        title: "Stop a machine",
        hints: Hints { read_only: false, destructive: true, idempotent: true, open_world: false },
        changes_machines: true,
        args: args::MachineArgs,
        result: results::Stopped,
        run: lifecycle::stop_machine,
        description: "Stop a running machine: processes, memory and /tmp are lost, the disk is kept. Use it to pause \
             a machine you will come back to (start-machine resumes it); on cloud a stopped machine bills \
             for its disk only. To throw a machine away, use delete-machine instead.",
    }
    DeleteMachine => "delete-machine" {
        title: "Delete a machine",
        hints: Hints { read_only: false, destructive: true, idempotent: true, open_world: false },
        changes_machines: true,
        args: args::MachineArgs,
        result: crate::fleet::Deleted,
        run: lifecycle::delete_machine,
        description: "Delete a machine, running or not, with its disk. Irreversible. Machines created without a name \
             (the mcp- prefix) are deleted anyway when this session ends, or their lease runs out: delete \
             them earlier only to free resources. On cloud the result carries usageMicros, what the machine cost in millionths of a \
             dollar (null locally).",
    }
    RunCommand => "run-command" {
        title: "Run a command",
        hints: Hints { read_only: false, destructive: true, idempotent: false, open_world: true },
        changes_machines: true,
        args: args::RunCommandArgs,
        result: results::RunCommandAnswer,
        run: commands::run_command,
        description: "Run one command in an existing machine and wait for it to end (up to timeoutSecs: 120 s by \
             default, 900 at most), then return stdout, stderr and exitCode. A non-zero exit is a result, \
             not an error; timedOut true means it was killed at timeoutSecs (exit 124). Each call is a new \
             process: cd and export do not carry over, so pass workdir and env. Output over the budget keeps \
             its head and tail (truncated: true) and the whole stream is saved in the machine at the path \
             overflow names, for read-file. A stopped machine is started first and left running \
             (startedMachine: true). When a command fails on a local machine with restricted egress, \
             blockedEgress lists the destinations the engine refused during it (ask for them in allowHosts \
             or allowCidrs). For anything that may take longer than a minute or two (builds, test suites, \
             installs), pass background: true: the command starts as a job and this returns at once with \
             its job id and cursor; follow it with job-output (waitSecs waits for the end), stop it with \
             cancel-job. A job runs up to maxJobSecs (3600 s) and ends with its machine.",
    }
    JobOutput => "job-output" {
        title: "Read a job's output",
        hints: READ_ONLY,
        changes_machines: false,
        args: args::JobOutputArgs,
        result: results::JobReport,
        run: jobs::job_output,
        description: "Report a background job (started by run-command with background: true): its state (running, \
             exited, timedOut, cancelled, or lost when its machine stopped or went), exitCode once ended, and \
             the stdout and stderr written since the cursor you pass (from the start without one), at most \
             maxOutputBytes of each. Pass the answered cursor back next time to get only new output; more: \
             true means output is already waiting, so call again at once. With waitSecs it first waits up to \
             that long for the job to end, answering as soon as it does: the way to wait for a long build \
             without holding one call open for all of it. The whole streams stay in the machine at \
             outputFiles.",
    }
    CancelJob => "cancel-job" {
        title: "Cancel a job",
        hints: Hints { read_only: false, destructive: true, idempotent: true, open_world: false },
        changes_machines: true,
        args: args::JobArgs,
        result: results::JobSummary,
        run: jobs::cancel_job,
        description: "Stop a background job now: its command and every process it started are killed (state \
             cancelled, exitCode 137). The output written so far stays readable with job-output and in the \
             machine's outputFiles; the machine keeps running. Cancelling a job that has ended changes \
             nothing and reports how it ended.",
    }
    ListJobs => "list-jobs" {
        title: "List jobs",
        hints: READ_ONLY,
        changes_machines: false,
        args: args::TargetOnly,
        result: results::JobList,
        run: jobs::list_jobs,
        description: "List this server's background jobs on the fleet, newest first: the running ones and the last \
             100 that ended, each with its machine, command, state, exitCode, elapsedSecs and output sizes. \
             Use it to find a job id you lost track of or to see what is still running before starting \
             more (at most maxRunningJobs, 16, run at once). Read-only; job-output gives a job's output.",
    }
    RunOnce => "run-once" {
        title: "Run once in a throwaway machine",
        hints: Hints { read_only: false, destructive: false, idempotent: false, open_world: true },
        changes_machines: true,
        args: args::RunOnceArgs,
        result: results::RunOnce,
        run: commands::run_once,
        description: "Run one self-contained command in a fresh machine that is deleted afterwards, whatever happens \
             (success, failure, timeout or cancellation): create, start, wait until it runs commands, run, \
             delete, in one call. Nothing persists: use create-machine and run-command when later calls need \
             the same machine or its files. Egress is blocked unless network, allowHosts or allowCidrs grant \
             it, and on the local fleet a registry image needs egress to its registry (network: \"open\", or \
             allowHosts naming it). A failed command's blockedEgress, locally, lists the destinations the \
             engine refused during it.",
    }
    ReadFile => "read-file" {
        title: "Read a file",
        hints: Hints { read_only: false, destructive: false, idempotent: true, open_world: false },
        changes_machines: false,
        args: args::ReadFileArgs,
        result: results::FileRead,
        run: files::read_file,
        description: "Read a file from a machine, as utf8 text or base64, one page at a time. The page itself is the \
             answer's second content block (text); the structured result says where it sits: size (the whole \
             file), offset, bytes, eof. Continue from offset + bytes until eof is true; the pages of one \
             read continue one download. Use it for the overflow files run-command saves, too. A stopped \
             machine is started first and left running (startedMachine: true).",
    }
    WriteFile => "write-file" {
        title: "Write a file",
        hints: Hints { read_only: false, destructive: true, idempotent: true, open_world: false },
        changes_machines: true,
        args: args::WriteFileArgs,
        result: results::FileWritten,
        run: files::write_file,
        description: "Write a whole file into a machine (utf8 text, or base64 for bytes), creating parent directories \
             and replacing any file at that path. It first waits until the machine runs commands (up to \
             readyTimeoutSecs), so that the commands you run next see the file. A stopped machine is started \
             first and left running (startedMachine: true).",
    }
    BranchMachine => "branch-machine" {
        title: "Branch a machine",
        hints: Hints { read_only: false, destructive: false, idempotent: false, open_world: false },
        changes_machines: true,
        args: args::BranchArgs,
        result: results::Branched,
        run: lifecycle::branch_machine,
        description: "Copy a running machine into a new child, memory, processes and disk included, and wait until \
             the child runs commands (up to readyTimeoutSecs): the child goes on from the source's exact \
             state while the source keeps running. Use it to try something risky, or to fan out from a \
             prepared machine. The source must be branchable (created with branchable true on cloud; started \
             with it locally), else CONFLICT. A child named with the mcp- prefix is ephemeral, like an \
             unnamed create-machine.",
    }
    MachineLogs => "machine-logs" {
        title: "Read a machine's log",
        hints: READ_ONLY,
        changes_machines: false,
        args: args::LogsArgs,
        result: results::Logs,
        run: logs::machine_logs,
        description: "Read a machine's log: the last lines, or only what arrived since a previous call when you pass \
             back its cursor. Locally this is what the machine's workload (its image's own command) printed, \
             kept across restarts; source engine gives the engine's boot and agent log instead. On cloud it is \
             the control plane's event log (what happened to the machine). A command's output comes back from \
             run-command or job-output, not here. Read-only.",
    }
    PullImage => "pull-image" {
        title: "Pull an image",
        hints: Hints { read_only: false, destructive: false, idempotent: true, open_world: true },
        changes_machines: true,
        args: args::PullArgs,
        result: crate::fleet::PulledImage,
        run: lifecycle::pull_image,
        description: "Pull an OCI image into a running local machine's image cache and wait until the pull ends, so \
             that starting a workload from that image later does not wait for the download. The machine \
             needs egress to the registry (network open, or allowHosts naming it). Local fleet only: on \
             cloud the control plane pulls at create. create-machine and run-once pull their own image; this \
             is for images the machine will use later.",
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
