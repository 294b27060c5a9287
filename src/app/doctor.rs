//! `smol-mcp doctor`: whether each configured fleet can be used from this host, and what to do
//! when it cannot. The static facts (`crate::process::targets`) cannot tell whether guests boot: an open
//! `/dev/kvm` on a paravirtual host passes every one of them and boots nothing. So, unless asked
//! to be quick, doctor boots a real machine from the engine's bundled rootfs (no registry) and
//! runs one command in it through the same run-once the agent calls, then reports how long
//! that took, or why it failed and what to do.

use crate::fleet::diagnosis::{host_cause, root_with_uid_drop, this_virtual_host};
use crate::policy::Policy;
use crate::policy::tools::{Caller, Scope, Tool};
use crate::process::config::Config;
use crate::process::targets::{
    BootFacts, FleetFacts, Problem, Targets, doctor_facts, registry_facts,
};
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
    let caller = Caller::new(
        owner.as_str(),
        Scope::Process(policy.process.mode),
        tokio_util::sync::CancellationToken::new(),
    );
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
            let cause = host_cause(&e.message, root_with_uid_drop(), this_virtual_host());
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

/// The facts as a table a person reads, then what to do about each problem.
pub fn render(targets: &Targets) -> String {
    let mut rows: Vec<[String; 4]> = Vec::new();
    let yes = |ok: bool| if ok { "ok" } else { "PROBLEM" }.to_owned();
    for fleet in &targets.fleets {
        match fleet {
            FleetFacts::Local(l) => {
                let e = &l.engine;
                let engine_detail = match (&e.path, &e.version) {
                    (Some(p), Some(v)) => format!("{v} at {p} ({})", e.found_by),
                    (Some(p), None) => format!("{p} ({}), does not run", e.found_by),
                    (None, Some(v)) => format!("{v}, answering at {}", l.serve.url),
                    (None, None) if l.serve.named => {
                        "behind SMOL_LOCAL_URL, which does not answer".into()
                    }
                    (None, None) => "not found".into(),
                };
                let engine_ok = e.version_ok && (e.path.is_some() || l.serve.answering);
                rows.push([
                    "local".into(),
                    "engine".into(),
                    yes(engine_ok),
                    engine_detail,
                ]);
                rows.push([
                    "local".into(),
                    "version".into(),
                    yes(e.version_ok),
                    match (&e.version, e.minimum.as_str()) {
                        (Some(v), "") => format!("{v} (no floor set)"),
                        (Some(v), min) => format!("{v}, needs at least {min}"),
                        (None, min) => format!("unknown, needs at least {min}"),
                    },
                ]);
                rows.push([
                    "local".into(),
                    "serve".into(),
                    yes(l.serve.answering || !l.serve.named),
                    match (l.serve.answering, l.serve.named) {
                        (true, named) => format!(
                            "answering at {}{}{}",
                            l.serve.url,
                            if named { " (SMOL_LOCAL_URL)" } else { "" },
                            match (l.serve.machines, l.serve.running_machines) {
                                (Some(all), Some(running)) =>
                                    format!(", {all} machines, {running} running"),
                                _ => String::new(),
                            }
                        ),
                        (false, true) => format!(
                            "the serve named by SMOL_LOCAL_URL does not answer at {}",
                            l.serve.url
                        ),
                        (false, false) => format!(
                            "none at {} yet; started on the first local call",
                            l.serve.url
                        ),
                    },
                ]);
                match &l.hypervisor {
                    Some(h) => rows.push([
                        "local".into(),
                        h.kind.into(),
                        if h.on_virtual_host {
                            "WARNING".into()
                        } else {
                            yes(h.usable)
                        },
                        h.detail.clone(),
                    ]),
                    None => rows.push([
                        "local".into(),
                        "hypervisor".into(),
                        "ok".into(),
                        format!(
                            "the named serve's host's{}; this host's is not used",
                            match l.serve.nested_virt {
                                Some(true) => " (it reports nested virtualization)",
                                _ => "",
                            }
                        ),
                    ]),
                }
                rows.push([
                    "local".into(),
                    "runtime dir".into(),
                    yes(l.runtime_dir.ok),
                    format!("{}: {}", l.runtime_dir.path, l.runtime_dir.detail),
                ]);
                if l.running_as_root && !l.serve.named {
                    let ok = l.uid_drop_off || l.serve.answering;
                    rows.push([
                        "local".into(),
                        "root".into(),
                        yes(ok),
                        if l.uid_drop_off {
                            "running as root, SMOLVM_VM_UID_DROP=off".into()
                        } else {
                            "running as root, SMOLVM_VM_UID_DROP not off".into()
                        },
                    ]);
                }
                if let Some(r) = &l.registry {
                    rows.push([
                        "local".into(),
                        "registry".into(),
                        if r.resolves { "ok" } else { "WARNING" }.into(),
                        r.detail.clone(),
                    ]);
                }
                match &l.boot {
                    Some(b) => rows.push([
                        "local".into(),
                        "boot".into(),
                        yes(b.booted),
                        b.detail.clone(),
                    ]),
                    None => rows.push([
                        "local".into(),
                        "boot".into(),
                        "-".into(),
                        "not tried (--quick, or the checks above failed): guests may still not boot"
                            .into(),
                    ]),
                }
            }
            FleetFacts::Cloud(c) => {
                rows.push(["cloud".into(), "url".into(), "ok".into(), c.url.clone()]);
                rows.push([
                    "cloud".into(),
                    "token".into(),
                    yes(c.token_set),
                    if c.token_set { "set" } else { "not set" }.into(),
                ]);
                let a = &c.account;
                rows.push([
                    "cloud".into(),
                    "account".into(),
                    yes(a.answering && a.status.as_deref() == Some("active")),
                    match (&a.tenant_id, &a.status, &a.error) {
                        (Some(t), Some(s), _) => format!(
                            "{t}, {s}{}",
                            a.plan
                                .as_deref()
                                .map(|p| format!(", plan {p}"))
                                .unwrap_or_default()
                        ),
                        (_, _, Some(e)) => format!("not answering: {e}"),
                        _ => "not asked (no token)".into(),
                    },
                ]);
            }
        }
    }
    let header = ["fleet", "check", "state", "detail"].map(str::to_owned);
    let mut widths = [0usize; 3];
    for row in std::iter::once(&header).chain(rows.iter()) {
        for (w, cell) in widths.iter_mut().zip(row.iter()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows.iter()) {
        out.push_str(&format!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {}\n",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        ));
    }
    out.push('\n');
    for fleet in &targets.fleets {
        let name = fleet.kind().as_str();
        if fleet.usable() {
            out.push_str(&format!("{name}: usable\n"));
        } else {
            out.push_str(&format!("{name}: NOT usable\n"));
            for p in fleet.problems() {
                out.push_str(&format!("  - {}\n    fix: {}\n", p.what, p.fix));
            }
        }
    }
    for n in &targets.not_served {
        out.push_str(&format!("{}: not served; {}\n", n.target, n.how));
    }
    if !targets.usable {
        out.push_str("\nNo served fleet is usable from this host.\n");
    }
    out
}
