//! The policy's front: the run table (each tool's argument and result types and handler; what
//! the catalog says of each tool is `tool.rs`), the catalog built from both (`tools/list`), and
//! the dispatch of one call.
//!
//! The handlers are grouped by what they touch: `lifecycle.rs` (machines), `commands.rs`
//! (commands run in them), `files.rs`, `logs.rs`, `jobs.rs` (background jobs); `egress_report.rs`
//! says what a failed command was refused; `streamed.rs` picks the streamed exec when the
//! request asked for progress. What they share is in `call.rs` (fleet choice, cancellation,
//! readiness), `provisional.rs` (machines a call creates), `args.rs` (arguments, checked
//! against their own schema), `results.rs` and `schema.rs` (the catalog's schemas).

pub mod args;
pub mod call;
mod commands;
mod credentials;
mod egress_report;
mod files;
pub mod grammar;
mod jobs;
mod lifecycle;
mod logs;
use call::owners;
pub use call::owners::{user_sees, users_machines};
mod ports;
mod provisional;
pub mod results;
pub mod schema;
mod streamed;
mod terminal;
pub mod tool;
mod views;
mod workspace;

pub use crate::policy::error::{ToolError, ToolErrorKind};
pub use call::{Caller, Scope};
pub use tool::Tool;

use crate::policy::Policy;
use crate::policy::idempotency;
use crate::process::Mode;
use call::Call;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// How each tool is run. A row: `Variant { args, result, run }`, where `run` is an
/// `async fn(Parts, Args) -> Result<Result, ToolError>`: `Parts` the parts of the call it uses
/// (`call::parts::Part`: one, or a tuple of them), `Args` its typed arguments. Every variant of
/// [`Tool`] needs a row (the matches are exhaustive).
macro_rules! run_table {
    ($(
        $variant:ident {
            args: $args:ty,
            result: $result:ty,
            run: $handler:path $(,)?
        }
    )+) => {
        /// The input schema of `tool`, with `target` as an optional property (the catalog adapts
        /// it to the mode).
        fn input_schema(tool: Tool) -> rmcp::model::JsonObject {
            let input = match tool {
                $(Tool::$variant => schema::input::<$args>(),)+
            };
            schema::with_idempotency_key(tool, input)
        }

        /// The output schema of `tool`.
        fn output_schema(tool: Tool) -> rmcp::model::JsonObject {
            match tool {
                $(Tool::$variant => schema::output::<$result>(),)+
            }
        }

        /// A call's arguments, parsed once into the tool's own type.
        pub enum Parsed {
            $($variant($args),)+
        }

        impl Parsed {
            /// `args` checked against `tool`'s input schema (worded for `mode`) and parsed.
            fn parse(tool: Tool, mode: Mode, args: Value) -> Result<Parsed, ToolError> {
                let input = checked_input(tool, mode);
                Ok(match tool {
                    $(Tool::$variant => {
                        Parsed::$variant(args::parse(tool, Some(&input), mode, args)?)
                    })+
                })
            }

            fn call_args(&self) -> &dyn args::CallArgs {
                match self {
                    $(Parsed::$variant(parsed) => parsed,)+
                }
            }

            /// The handler's future, on the heap: made side by side in one async match, every
            /// handler's state took a slot in its frame (300 KiB of a debug build's stack,
            /// which a failed create in a test took past its 2 MiB thread's end).
            fn run<'a>(
                self,
                call: &'a Call<'_>,
            ) -> futures::future::BoxFuture<'a, Result<results::Answer, ToolError>> {
                match self {
                    $(Parsed::$variant(parsed) => Box::pin(async move {
                        let result: $result = $handler(call::parts::Part::of(call), parsed).await?;
                        results::answer(result)
                    }),)+
                }
            }
        }
    };
}

run_table! {
    ListMachines {
        args: args::ListArgs,
        result: results::MachineList,
        run: lifecycle::list_machines,
    }
    CreateMachine {
        args: args::CreateArgs,
        result: results::Created,
        run: lifecycle::create_machine,
    }
    StartMachine {
        args: args::StartArgs,
        result: results::Started,
        run: lifecycle::start_machine,
    }
    StopMachine {
        args: args::StopArgs,
        result: results::Stopped,
        run: lifecycle::stop_machine,
    }
    DeleteMachine {
        args: args::MachineArgs,
        result: crate::fleet::Deleted,
        run: lifecycle::delete_machine,
    }
    RunCommand {
        args: args::RunCommandArgs,
        result: results::RunCommandAnswer,
        run: commands::run_command,
    }
    JobOutput {
        args: args::JobOutputArgs,
        result: results::JobOutputAnswer,
        run: jobs::job_output,
    }
    CancelJob {
        args: args::JobArgs,
        result: results::JobSummary,
        run: jobs::cancel_job,
    }
    RunOnce {
        args: args::RunOnceArgs,
        result: results::RunOnce,
        run: commands::run_once,
    }
    ReadFile {
        args: args::ReadFileArgs,
        result: results::FileRead,
        run: files::read_file,
    }
    WriteFile {
        args: args::WriteFileArgs,
        result: results::FileWritten,
        run: files::write_file,
    }
    BranchMachine {
        args: args::BranchArgs,
        result: results::Branched,
        run: lifecycle::branch_machine,
    }
    KeepChanges {
        args: args::KeepArgs,
        result: results::ChangesKept,
        run: workspace::keep_changes,
    }
    MachineLogs {
        args: args::LogsArgs,
        result: results::Logs,
        run: logs::machine_logs,
    }
    PublishPort {
        args: args::PublishArgs,
        result: results::PortPublished,
        run: ports::publish_port,
    }
    Terminal {
        args: args::TerminalArgs,
        result: results::TerminalRead,
        run: terminal::terminal,
    }
    PullImage {
        args: args::PullArgs,
        result: crate::fleet::PulledImage,
        run: lifecycle::pull_image,
    }
    ViewState {
        args: args::ViewArgs,
        result: results::ViewState,
        run: views::view_state,
    }
}

/// The tools as this process shows them (`tools/list`).
#[derive(Debug)]
pub struct Catalog {
    pub mode: Mode,
    pub offers: schema::Offers,
    /// What `tools/list` answers: `target` removed with one fleet, required with both.
    pub listed: Vec<rmcp::model::Tool>,
}

/// The input schema a call's arguments are checked against: `tool`'s, with `target` optional,
/// worded for `mode`. Built on first use for each tool and mode: a call needs its own tool's,
/// not the whole catalog (whose output schemas cost most of its making).
pub fn checked_input(tool: Tool, mode: Mode) -> Arc<rmcp::model::JsonObject> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Inputs = Mutex<HashMap<(Mode, Tool), Arc<rmcp::model::JsonObject>>>;
    static INPUTS: OnceLock<Inputs> = OnceLock::new();
    let inputs = INPUTS.get_or_init(Mutex::default);
    if let Ok(known) = inputs.lock()
        && let Some(input) = known.get(&(mode, tool))
    {
        return input.clone();
    }
    let input = Arc::new(schema::worded_for(input_schema(tool), mode));
    if let Ok(mut known) = inputs.lock() {
        known.insert((mode, tool), input.clone());
    }
    input
}

impl Catalog {
    fn build(mode: Mode, offers: schema::Offers) -> Catalog {
        let mut listed: Vec<rmcp::model::Tool> = Tool::ALL
            .iter()
            .filter(|tool| offers.lists(**tool))
            .map(|tool| {
                schema::definition(
                    *tool,
                    mode,
                    offers,
                    input_schema(*tool),
                    output_schema(*tool),
                )
            })
            .collect();
        schema::refer_to_first_mention(&mut listed);
        Catalog {
            mode,
            offers,
            listed,
        }
    }

    /// Every tool and argument, whatever the settings.
    pub fn of(mode: Mode) -> Arc<Catalog> {
        Catalog::offered(mode, schema::Offers::ALL)
    }

    /// Built once per process, mode and offers: the schemas depend on nothing else.
    pub fn offered(mode: Mode, offers: schema::Offers) -> Arc<Catalog> {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock};
        type Built = Mutex<HashMap<(Mode, schema::Offers), Arc<Catalog>>>;
        static BUILT: OnceLock<Built> = OnceLock::new();
        let built = BUILT.get_or_init(Mutex::default);
        let mut built = built
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        built
            .entry((mode, offers))
            .or_insert_with(|| Arc::new(Catalog::build(mode, offers)))
            .clone()
    }

    /// The schema `tool`'s arguments are checked against in this catalog's mode.
    pub fn input(&self, tool: Tool) -> Arc<rmcp::model::JsonObject> {
        checked_input(tool, self.mode)
    }
}

/// A call's arguments as the wire gave them, taken in once: its idempotency key taken out, the
/// rest parsed into the tool's own type. What the plumbing needs of them (a task's TTL, the
/// machines held) is read from here, never from the JSON again.
pub struct Prepared {
    tool: Tool,
    key: Result<Option<String>, ToolError>,
    /// The call as a key's record names it (tool and arguments), when it has a key.
    described: Option<idempotency::Described>,
    parsed: Result<Parsed, ToolError>,
}

impl Prepared {
    pub fn new(tool: Tool, mode: Mode, mut args: Value) -> Prepared {
        let key = if tool.changes_machines() {
            idempotency::take_key(&mut args)
        } else {
            Ok(None)
        };
        let described =
            matches!(key, Ok(Some(_))).then(|| idempotency::describe(tool.name(), &args));
        Prepared {
            tool,
            key,
            described,
            parsed: Parsed::parse(tool, mode, args),
        }
    }

    /// The command's timeout the arguments ask for, if they parsed and name one.
    pub fn timeout_secs(&self) -> Option<u64> {
        self.parsed
            .as_ref()
            .ok()
            .and_then(|parsed| parsed.call_args().timeout_secs())
    }
}

/// Runs one tool call to its structured result or its tool error. A call with an
/// `idempotencyKey` runs once per key (`crate::policy::idempotency`): detached from its request,
/// so that a repeat after the client gave up can have its answer.
pub async fn call(
    policy: &Arc<Policy>,
    caller: Caller,
    tool: Tool,
    args: Value,
) -> Result<results::Answer, ToolError> {
    let prepared = Prepared::new(tool, caller.scope.mode(), args);
    call_prepared(policy, caller, prepared).await
}

/// [`call`] with its arguments already taken in.
pub async fn call_prepared(
    policy: &Arc<Policy>,
    caller: Caller,
    prepared: Prepared,
) -> Result<results::Answer, ToolError> {
    let Prepared {
        tool,
        key,
        described,
        parsed,
    } = prepared;
    let key = key?;
    // Arguments refused as given are refused before the key is claimed: nothing is kept of a
    // call that never reached a fleet.
    let (Some(key), Some(described), true) = (key, described, parsed.is_ok()) else {
        return Box::pin(call_now(policy, caller, tool, parsed)).await;
    };
    // Each user's keys are their own: the same key from another user is another call, and
    // never replays this one's answer.
    let key = if caller.user.is_operator() {
        key
    } else {
        format!("{key} (user {})", caller.user.id())
    };
    let caller_ct = caller.ct.clone();
    let consent = caller.consent.clone();
    let detached_policy = policy.clone();
    let work = async move {
        let caller = Caller {
            // The request's cancellation ends only its wait (idempotency::Keys::once); the
            // work ends as the tool's own deadlines say, or by an explicit stop (tasks/cancel):
            // a task reported cancelled while its work ran on would tell its client a lie.
            ct: caller.stop.clone(),
            ..caller
        };
        let outcome = match Box::pin(call_now(&detached_policy, caller, tool, parsed)).await {
            Ok(answer) => serde_json::to_value(&answer)
                .map_err(|e| ToolError::new(ToolErrorKind::Internal, e.to_string())),
            Err(e) => Err(e),
        };
        idempotency::Ended {
            outcome,
            last: !consent.is_some_and(|c| c.awaits_answer()),
        }
    };
    let kept = policy
        .keys
        .once(
            &policy.store,
            key,
            described,
            longest_call(policy),
            caller_ct,
            work,
        )
        .await?;
    serde_json::from_value(kept).map_err(|e| ToolError::new(ToolErrorKind::Internal, e.to_string()))
}

/// The longest a call can rightly take: the engine's start, a machine's readiness and the
/// longest command, with five minutes over for what no setting bounds alone (a user's answer to
/// a consent question, a large file on a slow link).
fn longest_call(policy: &Policy) -> Duration {
    let config = &policy.process.config;
    Duration::from_secs(
        config
            .serve_start_timeout_secs
            .saturating_add(config.ready_timeout_secs)
            .saturating_add(config.max_exec_timeout_secs)
            .saturating_add(300),
    )
}

async fn call_now(
    policy: &Arc<Policy>,
    caller: Caller,
    tool: Tool,
    parsed: Result<Parsed, ToolError>,
) -> Result<results::Answer, ToolError> {
    if tool.changes_machines() {
        // Later pages of a read must not come from a copy taken before this call.
        policy.reads.forget_all();
    }
    let call = Call::new(policy, caller);
    let result = match parsed {
        Ok(parsed) => {
            let target = parsed.call_args().target();
            let named = parsed.call_args().machines();
            // Boxed: it may reach the fleet, whose start's future is large.
            let checked = Box::pin(call.admit(tool, target, named));
            match checked.await {
                // On the heap (`run` boxes it): the largest handler's future would otherwise be
                // the size of every call's and sit on the stack of whoever polls the call (a
                // debug build's HTTP server overflowed its stack on a job tool).
                Ok(()) => parsed.run(&call).await,
                Err(refused) => Err(refused),
            }
        }
        Err(refused) => Err(refused),
    };
    let result = call.finish(result).await;
    without_secrets(&policy.process.credentials, result)
}

/// A tool's answer or error with every credential value this process has read replaced by the
/// binding's name: the workload holds only placeholders, but a server it calls may echo back
/// what the engine put into the request, and nothing of that may reach the agent.
fn without_secrets(
    credentials: &crate::process::credentials::Supplier,
    result: Result<results::Answer, ToolError>,
) -> Result<results::Answer, ToolError> {
    if !credentials.has_values() {
        return result;
    }
    match result {
        Ok(mut answer) => {
            crate::policy::output::rewrite_strings(&mut answer.structured, &|text| {
                credentials.redact(text)
            });
            // An image's bytes were redacted before encoding; its base64 is not text to search.
            if let Some(page) = answer.page.as_mut().filter(|_| answer.image.is_none())
                && let Some(clean) = credentials.redact(page)
            {
                *page = clean;
            }
            Ok(answer)
        }
        Err(mut e) => {
            if let Some(clean) = credentials.redact(&e.message) {
                e.message = clean;
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod parse_tests {
    use super::*;
    use crate::fleet::FleetKind;
    use serde_json::json;

    fn refused(tool: Tool, args: Value) -> String {
        match Parsed::parse(tool, Mode::Single(FleetKind::Local), args) {
            Ok(_) => panic!("{} took the arguments", tool.name()),
            Err(e) => e.to_string(),
        }
    }

    /// Each grammar refuses at the parse with the words its check writes, under the argument's
    /// own name, in every tool that takes it: also inside the groups run-once and run-command
    /// flatten, where serde loses the path.
    #[test]
    fn a_grammar_refusal_names_its_argument_in_every_tool() {
        let expect = |refusal: Result<(), ToolError>| refusal.unwrap_err().to_string();
        let bad_name = expect(grammar::machine_name("name", "a--b"));
        let bad_ref = expect(grammar::machine_ref("name", "a b"));
        let bad_image = expect(grammar::image("image", "http://evil/"));
        let bad_hosts = expect(grammar::hosts("allowHosts", &["https://x".into()]));
        let bad_cidrs = expect(grammar::cidrs("allowCidrs", &["10.0.0.0/33".into()]));
        let env = std::collections::BTreeMap::from([("1X".to_owned(), "v".to_owned())]);
        let bad_env = expect(grammar::env("env", &env));
        let cases = [
            (Tool::CreateMachine, json!({"name": "a--b"}), &bad_name),
            (Tool::ListMachines, json!({"name": "a b"}), &bad_ref),
            (
                Tool::RunCommand,
                json!({"name": "a b", "command": "true"}),
                &bad_ref,
            ),
            (
                Tool::CreateMachine,
                json!({"image": "http://evil/"}),
                &bad_image,
            ),
            (
                Tool::RunOnce,
                json!({"image": "http://evil/", "command": "true"}),
                &bad_image,
            ),
            (
                Tool::PullImage,
                json!({"name": "m", "image": "http://evil/"}),
                &bad_image,
            ),
            (
                Tool::CreateMachine,
                json!({"allowHosts": ["https://x"]}),
                &bad_hosts,
            ),
            (
                Tool::RunOnce,
                json!({"command": "true", "allowHosts": ["https://x"]}),
                &bad_hosts,
            ),
            (
                Tool::CreateMachine,
                json!({"allowCidrs": ["10.0.0.0/33"]}),
                &bad_cidrs,
            ),
            (Tool::CreateMachine, json!({"env": {"1X": "v"}}), &bad_env),
            (
                Tool::RunCommand,
                json!({"name": "m", "command": "true", "env": {"1X": "v"}}),
                &bad_env,
            ),
            (
                Tool::RunOnce,
                json!({"command": "true", "env": {"1X": "v"}}),
                &bad_env,
            ),
        ];
        for (tool, args, expected) in cases {
            assert_eq!(
                &refused(tool, args.clone()),
                expected,
                "{} {args}",
                tool.name()
            );
        }
        let bad_path = |arg: &str| expect(grammar::absolute_path(arg, "rel/x"));
        let path_cases = [
            (
                Tool::RunCommand,
                json!({"name": "m", "command": "true", "workdir": "rel/x"}),
                bad_path("workdir"),
            ),
            (
                Tool::RunOnce,
                json!({"command": "true", "workdir": "rel/x"}),
                bad_path("workdir"),
            ),
            (
                Tool::ReadFile,
                json!({"name": "m", "path": "rel/x"}),
                bad_path("path"),
            ),
            (
                Tool::WriteFile,
                json!({"name": "m", "path": "rel/x", "content": ""}),
                bad_path("path"),
            ),
            (
                Tool::CreateMachine,
                json!({"mounts": [{"source": "/a", "target": "rel/x"}]}),
                bad_path("mounts[0].target"),
            ),
        ];
        for (tool, args, expected) in path_cases {
            assert_eq!(
                refused(tool, args.clone()),
                expected,
                "{} {args}",
                tool.name()
            );
        }
        // An argument of another name holding the same grammar is named by its own name.
        assert_eq!(
            refused(
                Tool::BranchMachine,
                json!({"name": "m", "childName": "a--b"})
            ),
            expect(grammar::machine_name("childName", "a--b"))
        );
        assert_eq!(
            refused(Tool::CreateMachine, json!({"allowHostsFrom": "a b"})),
            expect(grammar::machine_ref("allowHostsFrom", "a b"))
        );
    }
}
