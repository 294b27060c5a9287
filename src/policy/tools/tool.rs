//! Every tool this server offers, and what the catalog says of each: its name, hints,
//! whether it can change a machine, and its description. How each is run (its argument and
//! result types and its handler) is the run table in `mod.rs`, checked against this one by the
//! compiler: a tool without a row there does not build.
//!
//! The handlers name tools (in errors, in the ledger) through this file, which is why the list
//! lives below them and not beside the run table, which uses them.

/// What a client may assume about a tool (MCP tool annotations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hints {
    pub read_only: bool,
    pub destructive: bool,
    pub idempotent: bool,
    pub open_world: bool,
}

/// No tool has a `title`: the names read as they are (run-command), and the catalog's bytes
/// (20 KB for a fleet's whole list, `tests/offline/tool_catalog.rs`) go to what the model reads.
///
/// Declares every tool once. A row: `Variant => "name" { hints, changes_machines,
/// description }`.
macro_rules! tool_list {
    ($(
        $variant:ident => $name:literal {
            hints: $hints:expr,
            changes_machines: $changes:literal,
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
        }
    };
}

const READ_ONLY: Hints = Hints {
    read_only: true,
    destructive: false,
    idempotent: true,
    open_world: false,
};

tool_list! {
    ListMachines => "list-machines" {
        hints: READ_ONLY,
        changes_machines: false,
        description: "Machines and bases: state, size, egress, image{cloud:, url}. One to reuse, or \
             what runs before making more; with name, that one now.",
    }
    CreateMachine => "create-machine" {
        hints: Hints { read_only: false, destructive: false, idempotent: false, open_world: true },
        changes_machines: true,
        description: "Create a microVM, booted until it runs commands. Egress blocked unless \
             network, allowHosts or allowCidrs grant it. Unnamed or mcp-...: ephemeral (gone at \
             session end); others stay until deleted.{cloud: Costs money while it exists.} One \
             command only: run-once.",
    }
    StartMachine => "start-machine" {
        hints: Hints { read_only: false, destructive: false, idempotent: true, open_world: false },
        changes_machines: true,
        description: "Start a stopped machine and wait until it runs commands: disk kept; memory, \
             processes and /tmp start empty{local: (a paused one resumes as it was)}. To boot \
             ahead or set branchable.{cloud: A running cloud \
             machine bills for CPU and memory.}",
    }
    StopMachine => "stop-machine" {
        hints: Hints { read_only: false, destructive: true, idempotent: true, open_world: false },
        changes_machines: true,
        description: "Stop a running machine: processes, memory, /tmp and jobs end{local: (pause \
             keeps them paused)}; the disk stays (mcp- ones still go at session end).{cloud: A \
             stopped cloud machine bills for disk only.} Tools working in it bring it back.",
    }
    DeleteMachine => "delete-machine" {
        hints: Hints { read_only: false, destructive: true, idempotent: true, open_world: false },
        changes_machines: true,
        description: "Delete a machine, running or not, with its disk and jobs: irreversible. \
             {local:A source or base with children is refused: delete them first. }{cloud: usageMicros: what it cost, in millionths of a dollar.}",
    }
    RunCommand => "run-command" {
        hints: Hints { read_only: false, destructive: true, idempotent: false, open_world: true },
        changes_machines: true,
        description: "Run a command in a machine and wait: stdout, stderr, exitCode (non-zero \
             is a result, not an error). A new process each call{local: (REPLs: terminal)}. \
             Long output: head and tail, the rest kept (overflow). Longer than the call: \
             background, then job-output. Starts it if stopped{local: or paused}.",
    }
    JobOutput => "job-output" {
        hints: READ_ONLY,
        changes_machines: false,
        description: "A background job: state (running, exited, timedOut, cancelled, lost), \
             exitCode and usage once ended, output after your cursor (more: call again). No \
             job: the jobs.",
    }
    CancelJob => "cancel-job" {
        hints: Hints { read_only: false, destructive: true, idempotent: true, open_world: false },
        changes_machines: true,
        description: "Kill a background job and every process it started (cancelled, exit 137); \
             its output stays readable, the machine runs on.",
    }
    RunOnce => "run-once" {
        hints: Hints { read_only: false, destructive: false, idempotent: false, open_world: true },
        changes_machines: true,
        description: "One command in a fresh machine, deleted afterwards whatever happens; \
             answers as run-command. To keep the machine (background, network \
             ask): create-machine, then run-command.",
    }
    ReadFile => "read-file" {
        hints: Hints { read_only: false, destructive: false, idempotent: true, open_world: false },
        changes_machines: false,
        description: "Read a machine's file a page at a time (second content block), from offset \
             + bytes until eof; a whole PNG, JPEG, GIF or WebP (no encoding) as an image you \
             see. Reads overflow, job outputFiles{dirs:, a workspace's diff \
             (changes)}. Starts it if stopped{local: or paused}.",
    }
    WriteFile => "write-file" {
        hints: Hints { read_only: false, destructive: true, idempotent: true, open_world: false },
        changes_machines: true,
        description: "Write a whole file into a machine (parents made, an old one \
             replaced). Better than echo in run-command. Starts it if \
             stopped{local: or paused}.",
    }
    BranchMachine => "branch-machine" {
        hints: Hints { read_only: false, destructive: false, idempotent: false, open_world: false },
        changes_machines: true,
        description: "Copy a running machine (memory, processes, disk) into children going on \
             from there: to try something risky or several ways at once. The source must be \
             branchable (create{local: or start-machine}). Set up once, fork many: \
             freezeSource keeps it as a base.",
    }
    KeepChanges => "keep-changes" {
        hints: Hints { read_only: false, destructive: true, idempotent: false, open_world: false },
        changes_machines: true,
        description: "Give the user a machine's /workspace changes (see read-file changes; starts \
             a stopped{local: or paused} one): a commit on a new branch of their repository \
             (nothing else touched), or a patch outside git. Says how to merge it.",
    }
    MachineLogs => "machine-logs" {
        hints: READ_ONLY,
        changes_machines: false,
        description: "A machine's log: the last lines, or those since a cursor. \
             {local:Its workload's output, kept across restarts. }{cloud:On cloud: the control \
             plane's event log of the machine. }Not command output (run-command, job-output).",
    }
    PublishPort => "publish-port" {
        hints: Hints { read_only: false, destructive: false, idempotent: true, open_world: true },
        changes_machines: true,
        description: "Open a machine's service to the user: publish a guest TCP port, wait until \
             something listens, answer the url (kept with the machine).{local: Only this host reaches it unless the operator allows more.} Starts it \
             if stopped{local: or paused}.",
    }
    Terminal => "terminal" {
        hints: Hints { read_only: false, destructive: true, idempotent: false, open_world: true },
        changes_machines: true,
        description: "Drive an interactive program (shell, vi, a prompt): each call types input \
             and keys, waits for output to settle, answers what it printed since the last read. \
             The first call opens it (its id); it ends on exit, close, or with its machine \
             or session. Starts it if stopped or paused.",
    }
    PullImage => "pull-image" {
        hints: Hints { read_only: false, destructive: false, idempotent: true, open_world: true },
        changes_machines: true,
        description: "Pull an OCI image into a running machine's own store, for it alone (minutes \
             if large; its egress must reach the registry). Nothing here runs it; create-machine \
             and run-once pull their own.",
    }
    // The spec's default hints (no annotations listed): what the person types in a terminal
    // view may reach anything its program does.
    ViewState => "view-state" {
        hints: Hints { read_only: false, destructive: true, idempotent: false, open_world: true },
        changes_machines: false,
        description: "MCP Apps views only.",
    }
}

/// The views (MCP Apps resources, served by `crate::protocol::apps`) and the tools whose calls a
/// host shows each beside.
pub mod views {
    pub const MACHINES: &str = "ui://smol-mcp/machines";
    pub const EGRESS: &str = "ui://smol-mcp/egress";
    pub const TERMINAL: &str = "ui://smol-mcp/terminal";
    pub const ALL: [&str; 3] = [MACHINES, EGRESS, TERMINAL];
}

impl Tool {
    /// The view a host shows beside this tool's calls: the machines beside a listing, the
    /// questions a command may put to the person beside it, the screen beside a terminal.
    pub fn view(self) -> Option<&'static str> {
        match self {
            Tool::ListMachines => Some(views::MACHINES),
            Tool::RunCommand => Some(views::EGRESS),
            Tool::Terminal => Some(views::TERMINAL),
            _ => None,
        }
    }

    pub fn from_name(name: &str) -> Option<Tool> {
        Tool::ALL.iter().copied().find(|t| t.name() == name)
    }
}
