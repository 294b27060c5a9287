//! `smol-mcp doctor`: whether each configured fleet can be used from this host, and what to do
//! when it cannot. The static facts (`crate::process::targets`) cannot tell whether guests boot: an open
//! `/dev/kvm` on a paravirtual host passes every one of them and boots nothing. So, unless asked
//! to be quick, doctor boots a real machine from the engine's bundled rootfs (no registry) and
//! runs one command in it through the same run-once the agent calls, then reports how long
//! that took, or why it failed and what to do.

use crate::fleet::diagnosis::{host_cause, root_with_uid_drop};
use crate::policy::Policy;
use crate::policy::progress::Progress;
use crate::policy::tools::{Caller, Scope, Tool};
use crate::process::config::Config;
use crate::process::targets::{BootFacts, Problem, doctor_facts, registry_facts, render};
use std::time::Instant;

/// The command the test machine runs: its output names the guest's kernel.
const BOOT_COMMAND: [&str; 2] = ["uname", "-sr"];

/// The report a person reads, and whether any served fleet is usable.
pub async fn doctor(config: Config, quick: bool) -> (String, bool) {
    let mut facts = doctor_facts(&config).await;
    // Pulls happen where the engine runs: for a serve named by localUrl that may be another
    // host, whose DNS this one cannot speak for.
    if facts.local().is_some_and(|l| !l.serve.named) {
        facts = facts.with_registry(registry_facts().await);
    }
    let boot_worth_trying = facts.local().is_some_and(|l| l.usable);
    let facts = if quick || !boot_worth_trying {
        facts
    } else {
        let (boot, problem) = boot_a_machine(config).await;
        facts.with_boot(boot, problem)
    };
    (render(&facts), facts.usable)
}

/// Boots a machine on the local fleet, runs `BOOT_COMMAND`, deletes it (run-once deletes it
/// whatever happens), and stops the serve if this process started it.
async fn boot_a_machine(config: Config) -> (BootFacts, Option<Problem>) {
    let policy = match Policy::start(config) {
        Ok(policy) => policy,
        Err(e) => {
            let detail = format!("could not set up the server to try: {e}");
            return failed(0.0, detail, None);
        }
    };
    let owner = format!("doctor-{}", std::process::id());
    let caller = Caller {
        owner: &owner,
        scope: Scope::Process(policy.process.mode),
        ct: tokio_util::sync::CancellationToken::new(),
        progress: Progress::none(),
        session_hold: None,
        consent: None,
        prior_answer: None,
    };
    let mut args = serde_json::json!({
        "command": BOOT_COMMAND,
        "cpus": 1,
        "memoryMb": 512,
        "timeoutSecs": 60,
    });
    // `target` is an argument only where both fleets are served.
    if policy.process.mode == crate::process::Mode::Both {
        args["target"] = serde_json::json!("local");
    }
    let started = Instant::now();
    let answer = crate::policy::tools::call(&policy, caller, Tool::RunOnce, args).await;
    let secs = started.elapsed().as_secs_f64();
    let cleanup = policy.shutdown(&owner).await;
    let left = if cleanup.failed.is_empty() {
        String::new()
    } else {
        format!(
            " (could not delete {:?}: the next start of the server deletes it)",
            cleanup.failed
        )
    };
    match answer {
        Ok(answer) if answer.structured["exitCode"] == 0 => {
            let kernel = answer.structured["stdout"]
                .as_str()
                .unwrap_or_default()
                .trim()
                .to_owned();
            (
                BootFacts {
                    booted: true,
                    secs,
                    detail: format!(
                        "booted the engine's bundled Alpine and ran `{}` ({kernel}) in {secs:.1} s, \
                         the engine's start included{left}",
                        BOOT_COMMAND.join(" ")
                    ),
                },
                None,
            )
        }
        Ok(answer) => failed(
            secs,
            format!(
                "the test machine booted but `{}` exited {} (stderr: {}){left}",
                BOOT_COMMAND.join(" "),
                answer.structured["exitCode"],
                answer.structured["stderr"]
                    .as_str()
                    .unwrap_or_default()
                    .trim()
            ),
            None,
        ),
        Err(e) => {
            let message = e.message.lines().next().unwrap_or_default().to_owned();
            let cause = host_cause(&e.message, root_with_uid_drop());
            failed(secs, format!("{message}{left}"), cause.map(|c| c.explain()))
        }
    }
}

fn failed(
    secs: f64,
    detail: String,
    cause: Option<(&'static str, &'static str)>,
) -> (BootFacts, Option<Problem>) {
    let (what, fix) = match cause {
        Some((why, fix)) => (format!("guests do not boot: {why}"), fix.to_owned()),
        None => (
            format!("a test machine did not boot or run: {detail}"),
            "read the engine's log (the serve log in the runtime directory) for the cause; \
             `smol-mcp doctor --quick` shows the static checks alone"
                .to_owned(),
        ),
    };
    (
        BootFacts {
            booted: false,
            secs,
            detail: format!("failed after {secs:.1} s: {detail}"),
        },
        Some(Problem { what, fix }),
    )
}
