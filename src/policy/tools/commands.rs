//! The tools that run commands: in an existing machine, or once in a throwaway one.

use super::args;
use super::call::parts::{Asking, Cancel, Fleets, JobTable, Making, Ownership, Session, Waits};
use super::call::random_hex;
use super::egress_report::{EgressWatch, refused_during};
use super::lifecycle::{Maker, admitted, base_spec, with_egress_hint};
use super::provisional::Provisional;
use super::results::{self, Overflow};
use super::workspace::Transfer;
use super::{Tool, ToolError};
use crate::fleet::{ErrorKind, ExecOutput, ExecSpec, Phase};
use crate::policy::consent::Questions;
use crate::policy::jobs::guest;
use crate::policy::ledger::{Ledger, RunStart};
use crate::policy::output::head_tail;
use crate::policy::progress::Progress;
use crate::policy::user::User;
use crate::process::config::Config;
use crate::process::credentials::Supplier;
use crate::process::redaction::Redactor;
use crate::process::workspaces::Workspaces;
use crate::store::Store;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument as _;

use crate::policy::cost::reading as consumption;

/// Reads the machine's consumption as its command is sent: beside the exec rather than a round
/// trip ahead of it (on the nested engine a machine's record takes about 55 ms to read, an exec
/// of `true` 180 ms). The engine answers it before the command can have used much (an exec
/// reaches the guest agent over vsock first); the first milliseconds of a very short command may
/// be missed, never another command's.
fn consumption_beside(
    fleet: &crate::fleet::Fleet,
    machine: &str,
) -> tokio::task::JoinHandle<Option<crate::fleet::Consumption>> {
    let (fleet, machine) = (fleet.clone(), machine.to_owned());
    tokio::spawn(async move { consumption(&fleet, &machine).await }.in_current_span())
}

/// What the run cost, from the reading taken before it and one taken now; kept in the ledger.
/// `None` when nothing was read before (the cost was not asked for).
async fn run_cost(
    ledger: &Ledger,
    fleet: &crate::fleet::Fleet,
    machine: &str,
    before: Option<tokio::task::JoinHandle<Option<crate::fleet::Consumption>>>,
    run_id: Option<i64>,
) -> Option<results::RunCost> {
    let before = before?;
    let after = consumption(fleet, machine).await;
    let before = before.await.ok().flatten();
    let cost = results::RunCost::between(before.as_ref(), after.as_ref());
    if let Some(cost) = &cost {
        ledger.run_usage(run_id, cost);
    }
    cost
}

/// Kills, in the guest, the command of a cancelled call and its children (they carry its
/// marker). Best effort, in the background: the call has already ended, and an image without
/// `sh` keeps its command (the log says so).
fn kill_marked(fleet: crate::fleet::Fleet, machine: String, marker: String) {
    let mut kill = ExecSpec::new(guest::kill_marked(&marker));
    kill.timeout_secs = Some(30);
    let killing = async move {
        match fleet.exec(&machine, &kill).await {
            Ok(out) if out.exit_code == 0 => {
                tracing::info!(%machine, %marker, "killed the command of a cancelled call")
            }
            Ok(out) => {
                tracing::warn!(%machine, exit = out.exit_code, "could not kill the command of a cancelled call")
            }
            Err(e) => {
                tracing::warn!(%machine, error = %e, "could not kill the command of a cancelled call")
            }
        }
    };
    // In the call's span, as the requests the call made itself are.
    tokio::spawn(killing.in_current_span());
}

/// The timeouts a command may ask for: a foreground one's (execTimeoutSecs up to
/// maxExecTimeoutSecs) or a background job's (up to maxJobSecs, which is also its default).
struct TimeoutRule {
    default: u64,
    max: u64,
    setting: &'static str,
}

impl TimeoutRule {
    fn foreground(config: &crate::process::config::Config) -> TimeoutRule {
        TimeoutRule {
            default: config.exec_timeout_secs,
            max: config.max_exec_timeout_secs,
            setting: "maxExecTimeoutSecs",
        }
    }

    fn background(config: &crate::process::config::Config) -> TimeoutRule {
        TimeoutRule {
            default: config.max_job_secs,
            max: config.max_job_secs,
            setting: "maxJobSecs",
        }
    }
}

fn exec_spec(fields: &args::CommandFields, rule: TimeoutRule) -> Result<ExecSpec, ToolError> {
    let mut spec = ExecSpec::new(args::command("command", &fields.command)?);
    spec.workdir = fields.workdir.clone().map(String::from);
    if let Some(env) = &fields.env {
        spec.env = (**env).clone();
    }
    spec.stdin = fields.stdin.clone();
    let secs = fields.timeout_secs.unwrap_or(rule.default);
    if secs == 0 || secs > rule.max {
        return Err(ToolError::argument(
            "timeoutSecs",
            format!(
                "{secs} is not accepted: give 1 to {} (this server's ceiling, {})",
                rule.max, rule.setting
            ),
        ));
    }
    spec.timeout_secs = Some(secs);
    Ok(spec)
}

/// Each stream's head and tail within the output budget, and whether anything was left out.
struct Shaped {
    stdout: crate::policy::output::Shaped,
    stderr: crate::policy::output::Shaped,
    truncated: bool,
}

fn shape(output: &ExecOutput, budget: usize, redactor: &Redactor) -> Shaped {
    // Redacted before the cut: a value across the head's or the tail's edge would otherwise
    // leave a piece on each side of it, neither matching the value.
    let cut = |bytes: &[u8]| match redactor.bytes(bytes) {
        Some(clean) => head_tail(&clean, budget),
        None => head_tail(bytes, budget),
    };
    let (stdout, stderr) = (cut(&output.stdout), cut(&output.stderr));
    let truncated = stdout.dropped > 0
        || stderr.dropped > 0
        || output.stdout_cut_upstream
        || output.stderr_cut_upstream;
    Shaped {
        stdout,
        stderr,
        truncated,
    }
}

/// What a command takes of the call: the machine named and brought up, the spend admitted, the
/// run recorded and its output redacted; a refused egress put to the user; a background one's
/// job started.
type Running<'c> = (
    Ownership<'c>,
    Fleets<'c>,
    Making<'c>,
    Waits<'c>,
    Cancel<'c>,
    Session<'c>,
    (&'c Progress, &'c Ledger, &'c User, &'c Config, &'c Supplier),
    (Asking<'c>, &'c Questions, &'c dyn Store, JobTable<'c>),
);

pub(super) async fn run_command(
    parts: Running<'_>,
    a: args::RunCommandArgs,
) -> Result<results::RunCommandAnswer, ToolError> {
    if a.background != Some(true) {
        return run_foreground(parts, a)
            .await
            .map(results::RunCommandAnswer::Finished);
    }
    if a.run.stdin.is_some() {
        return Err(ToolError::argument(
            "stdin",
            "is not accepted with background: true (a detached command reads nothing): write \
             the input into the machine with write-file and redirect from it, or run without \
             background",
        ));
    }
    let (machines, fleets, making, waits, _, session, (_, _, user, config, _), (.., jobs)) = parts;
    let spec = exec_spec(&a.run, TimeoutRule::background(config))?;
    making.admit_spend(&fleets.reach(a.target).await?).await?;
    let starting = (machines, fleets, waits, jobs, session, user, config);
    super::jobs::start(starting, &a, spec)
        .await
        .map(results::RunCommandAnswer::Started)
}

async fn run_foreground(
    parts: Running<'_>,
    a: args::RunCommandArgs,
) -> Result<results::CommandRun, ToolError> {
    let (machines, fleets, making, waits, cancel, session, reporting, asking) = parts;
    let (progress, ledger, user, config, credentials) = reporting;
    let (asking, questions, store, _) = asking;
    let granting = (questions, store, user, fleets);
    let named = machines.machine(&a.name)?;
    let mut spec = exec_spec(&a.run, TimeoutRule::foreground(config))?;
    let fleet = fleets.reach(a.target).await?;
    making.admit_spend(&fleet).await?;
    // A machine this server has seen is not asked for again before each command (a request
    // per command: +120-150 ms on the nested engine). Its network says whether to watch the
    // egress; whether it runs is left to the exec, sent without autoStart: a machine that is
    // not running is refused at once, then started with its boot reported, then sent the
    // command again. Unseen (or on the cloud), the machine is asked for first as before.
    let (network, mut started_machine) = match fleet.known_network(&named) {
        Some(network) => {
            spec.start_if_stopped = false;
            (network, false)
        }
        None => {
            let machine = waits.machine_to_run_in(&fleet, &named).await?;
            let paused = machine.phase() == Phase::Paused;
            if paused {
                waits.resume_reported(&fleet, &named).await?;
            }
            let boots = paused || machine.phase().boots_on_use();
            if boots && !paused && fleet.capabilities().exec_boots_silently {
                // The fleet's exec would boot the machine itself, saying nothing for as long as
                // that takes: started first, the boot is reported as progress like any other
                // start's.
                waits.start_reported(&fleet, &named, None, None).await?;
            }
            (machine.network, boots)
        }
    };
    let prior =
        super::egress_report::apply_prior((asking, credentials, granting), &fleet, &named).await;
    let watch = match network
        .egress()
        .and_then(|egress| EgressWatch::begin(fleet.capabilities(), egress))
    {
        Some(watch) => Some(watch.with_baseline(&fleet, &named).await),
        None => None,
    };
    // The run's cost only when asked: its two readings made every command wait one more
    // round trip to the engine (+100 ms a command on the nested engine), for a figure a model
    // seldom needs. A command is otherwise the one exec request.
    let before = (a.usage == Some(true)).then(|| consumption_beside(&fleet, &named));
    let began = Instant::now();
    let run =
        ledger.begin(RunStart::new(Tool::RunCommand.name(), fleet.kind(), &named, &spec).by(user));
    let run_id = run.id();
    // Neither engine can cancel an exec: dropping the request leaves the command running in the
    // guest. Every command carries a marker in its environment (children inherit it), so that a
    // cancelled one, and whatever it started, can be found and killed by a second exec.
    let marker = format!("{}-{}", std::process::id(), random_hex());
    spec.env
        .insert(guest::RUN_MARKER.to_owned(), marker.clone());
    let attempt = cancel
        .run(async {
            match super::streamed::exec(progress, &fleet, &named, &spec).await {
                Err(e) if !spec.start_if_stopped && fleet.is_not_running(&e) => {
                    // Refused as not running: stopped (booted, its boot reported) or paused
                    // (the fleet's start resumes it, the same processes going on); a base is
                    // never started (its start is 409 and its exec never answers).
                    if let Err(e) = waits.start_reported(&fleet, &named, None, None).await {
                        if e.is(ErrorKind::Conflict) {
                            // A start refused as a conflict: a base is said to be one.
                            waits.machine_to_run_in(&fleet, &named).await?;
                        }
                        return Err(e);
                    }
                    let sent_again = Instant::now();
                    let output = super::streamed::exec(progress, &fleet, &named, &spec).await?;
                    Ok::<_, ToolError>((output, Some(sent_again)))
                }
                other => Ok((other?, None)),
            }
        })
        .await;
    let output = match attempt {
        Err(e) if e.kind == crate::policy::error::ToolErrorKind::Cancelled => {
            run.failed(&e);
            kill_marked(fleet.clone(), named.to_string(), marker);
            return Err(e);
        }
        Err(e) => {
            run.failed(&e);
            return Err(e);
        }
        Ok((output, sent_again)) => {
            started_machine |= sent_again.is_some();
            (output, sent_again.unwrap_or(began))
        }
    };
    // Measured from the exec that ran the command, not from a refused one and the boot after.
    let (output, sent) = output;
    let timed_out = output.timed_out(sent.elapsed(), spec.timeout_secs);
    run.exited(&output, timed_out);
    let usage = run_cost(ledger, &fleet, &named, before, run_id).await;
    let failed = output.exit_code != 0 || timed_out;
    let blocked_egress = refused_during(watch, cancel, &fleet, &named, failed).await;
    let egress_answer = match &blocked_egress {
        Some(refused) if credentials.asks_egress(&named).await => {
            let asker = (asking, progress, cancel, session, granting);
            Some(super::egress_report::ask_the_user(asker, &fleet, &named, refused).await)
        }
        _ => prior,
    };
    let mut shaped = shape(&output, config.max_output_bytes, &credentials.redactor());
    let mut overflow = Vec::new();
    if shaped.stdout.dropped > 0 || shaped.stderr.dropped > 0 {
        let stamp = random_hex();
        for (stream, bytes, part) in [
            ("stdout", &output.stdout, &mut shaped.stdout),
            ("stderr", &output.stderr, &mut shaped.stderr),
        ] {
            if part.dropped == 0 {
                continue;
            }
            let path = format!("/tmp/smol-mcp-{stamp}.{stream}");
            match cancel
                .run(fleet.write_file(&named, &path, bytes.clone()))
                .await
            {
                Ok(_) => {
                    part.text.push_str(&format!(
                        "\n[the whole {stream}, {} bytes, is in the machine at {path}]",
                        bytes.len()
                    ));
                    overflow.push(Overflow {
                        stream: stream.into(),
                        path,
                        bytes: bytes.len() as u64,
                    });
                }
                Err(e) => {
                    tracing::warn!(%path, error = %e.message, "could not write the whole stream into the machine")
                }
            }
        }
    }
    Ok(results::CommandRun {
        stdout: shaped.stdout.text,
        stderr: shaped.stderr.text,
        exit_code: output.exit_code,
        timed_out,
        truncated: shaped.truncated,
        overflow,
        started_machine,
        blocked_egress,
        egress_answer,
        usage,
    })
}

/// What run-once takes of the call: a machine made, run in once and deleted.
type RunningOnce<'c> = (
    Maker<'c>,
    Ownership<'c>,
    Waits<'c>,
    Transfer<'c>,
    (&'c Config, &'c User, &'c Supplier, &'c Ledger),
    &'c Arc<Workspaces>,
);

pub(super) async fn run_once(
    (maker, machines, waits, transfer, reporting, workspaces): RunningOnce<'_>,
    a: args::RunOnceArgs,
) -> Result<results::RunOnce, ToolError> {
    let (config, user, credentials, ledger) = reporting;
    let (fleets, making, records, session) = maker;
    let (progress, cancel) = transfer;
    let name = format!("{}once-{}", config.machine_prefix, random_hex());
    if a.machine.network == Some(args::Network::Ask) {
        return Err(ToolError::argument(
            "network",
            "ask is for create-machine: a run-once machine is deleted before a retry could use \
             what the user allowed; create-machine with network ask, then run-command",
        ));
    }
    let mut spec = base_spec(config, &a.machine, name.clone(), config.run_once_network)?;
    spec.ephemeral = true;
    let mut exec = exec_spec(&a.run, TimeoutRule::foreground(config))?;
    let workspace = match &a.machine.workspace {
        Some(dir) => {
            if exec.workdir.is_none() {
                exec.workdir = Some(super::workspace::GUEST_PATH.to_owned());
            }
            let dirs = (user, config, machines);
            Some(super::workspace::prepare((dirs, workspaces), dir).await?)
        }
        None => None,
    };
    let admitting = (fleets, making, credentials);
    let (fleet, bindings, slot) = admitted(admitting, a.target, &a.machine, &mut spec).await?;
    let warm = making.lease_warm(&fleet, &spec, &slot).await;
    let (name, pool) = match &warm {
        Some((pool, lease)) => (lease.machine.clone(), Some(pool.clone())),
        None => (name, None),
    };
    let recording = (making, records, session);
    let mut machine = Provisional::begin(recording, &fleet, &name, true).await?;
    let result = async {
        if warm.is_some() {
            machine.created(&name).await;
        } else {
            let created = making
                .create_reported(&fleet, &spec, &slot)
                .await
                .map_err(|e| with_egress_hint(e, &spec, Tool::RunOnce))?;
            machine.created(&created.id).await;
            if !bindings.is_empty() {
                credentials.bind(machine.id(), &bindings).await;
            }
            waits
                .start_reported(&fleet, machine.id(), Some(false), spec.image.as_deref())
                .await
                .map_err(|e| with_egress_hint(e, &spec, Tool::RunOnce))?;
            waits.wait_ready(&fleet, machine.id()).await?;
        }
        if let Some(w) = workspace {
            // Gone with the machine: nothing of it is recorded.
            super::workspace::send_in(transfer, &fleet, machine.id(), &w.seed).await?;
        }
        let watch = match EgressWatch::begin(fleet.capabilities(), &spec.egress) {
            Some(watch) => Some(watch.with_baseline(&fleet, machine.id()).await),
            None => None,
        };
        // Its machine is made and deleted around it: one reading more costs it little.
        let before = Some(consumption_beside(&fleet, machine.id()));
        let began = Instant::now();
        let run =
            ledger.begin(RunStart::new(Tool::RunOnce.name(), fleet.kind(), &name, &exec).by(user));
        let run_id = run.id();
        let output = match cancel
            .run(super::streamed::exec(progress, &fleet, machine.id(), &exec))
            .await
        {
            Ok(output) => output,
            Err(e) => {
                run.failed(&e);
                return Err(e);
            }
        };
        let elapsed = began.elapsed();
        let timed_out = output.timed_out(elapsed, exec.timeout_secs);
        run.exited(&output, timed_out);
        // Asked before the machine goes: the engine's record of it goes with it.
        let usage = run_cost(ledger, &fleet, machine.id(), before, run_id).await;
        let failed = output.exit_code != 0 || timed_out;
        let blocked_egress = refused_during(watch, cancel, &fleet, machine.id(), failed).await;
        Ok::<_, ToolError>((output, elapsed, blocked_egress, usage))
    }
    .await;
    // Whatever happened, the machine goes (a cancelled call included).
    if !bindings.is_empty() {
        credentials.forget_machine(&name).await;
    }
    if let Err(e) = machine.abandon().await {
        tracing::warn!(machine = %name, error = %e.message, "run-once could not delete its machine; it stays recorded for the session's clean-up");
    }
    let (output, elapsed, blocked_egress, usage) = result?;
    let shaped = shape(&output, config.max_output_bytes, &credentials.redactor());
    Ok(results::RunOnce {
        truncated: shaped.truncated,
        timed_out: output.timed_out(elapsed, exec.timeout_secs),
        stdout: shaped.stdout.text,
        stderr: shaped.stderr.text,
        exit_code: output.exit_code,
        machine: name,
        pool,
        blocked_egress,
        usage,
    })
}
