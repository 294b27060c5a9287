//! view-state: what this server's views (MCP Apps, `crate::protocol::apps`) show, and what the
//! person did in them. Only a client that declared it shows views may call it, and a view's call
//! passes every check an agent's call does: the machines are the caller's user's (a terminal's
//! machine through the ownership check, the listing through `only_theirs`), an egress answer
//! settles only a question asked of that user and comes with the state sealed for it, typing
//! reaches the program the way the terminal tool's does. Each answer is bounded: so many
//! machines listed, the board's questions, the screen the terminal's size.

use super::args::{self, ViewName};
use super::call::parts::{Asking, Cancel, Fleets, JobTable, Ownership, Session};
use super::results::{
    EgressView, JobRow, MachineRow, MachinesView, PortLink, QuestionRow, TerminalView, ViewState,
};
use super::terminal::TerminalAccess;
use crate::fleet::terminal::TerminalInput;
use crate::policy::consent::{Board, NotSettled};
use crate::policy::reads::ParkedReads;
use crate::policy::terminals::{End, Terminals};
use crate::policy::tools::{ToolError, ToolErrorKind};
use crate::policy::user::User;
use std::time::Duration;

/// Machines the machines view lists; past it the answer counts the rest (`more`).
pub const MACHINES_LISTED: usize = 100;
/// Running jobs shown per machine.
const JOBS_LISTED: usize = 8;
/// The longest a terminal view waits for the program to print.
const TERMINAL_WAIT: Duration = Duration::from_secs(20);
/// How long output must be quiet before the screen is answered: a program painting a screen
/// sends it in bursts, and a view shown mid-burst flickers.
const QUIET: Duration = Duration::from_millis(60);

/// What view-state takes of the call: the views' seal, and what each view shows.
type ViewParts<'c> = (
    Asking<'c>,
    TerminalAccess<'c>,
    &'c User,
    &'c ParkedReads,
    (&'c Board, JobTable<'c>, Session<'c>),
);

pub(super) async fn view_state(
    (asking, access, user, reads, (board, jobs, session)): ViewParts<'_>,
    a: args::ViewArgs,
) -> Result<ViewState, ToolError> {
    let Some(seal) = asking.views() else {
        return Err(ToolError::new(
            ToolErrorKind::InvalidArgument,
            "view-state answers this server's views (MCP Apps) only, and this client did not \
             declare the io.modelcontextprotocol/ui extension with text/html;profile=mcp-app \
             in its capabilities",
        ));
    };
    let only = |arg: &str, given: bool, view: &str| {
        if given {
            Err(ToolError::argument(
                arg,
                format!("is for the {view} view only; leave it out here"),
            ))
        } else {
            Ok(())
        }
    };
    if a.view != ViewName::Egress {
        only("answer", a.answer.is_some(), "egress")?;
    }
    if a.view != ViewName::Terminal {
        for (arg, given) in [
            ("name", a.name.is_some()),
            ("terminal", a.terminal.is_some()),
            ("after", a.after.is_some()),
            ("input", a.input.is_some()),
            ("keys", a.keys.is_some()),
        ] {
            only(arg, given, "terminal")?;
        }
    }
    match a.view {
        ViewName::Machines => {
            let (machines, fleets, cancel, _, terminals, _) = access;
            let parts = (fleets, machines, cancel, user, terminals, jobs, session);
            machines_view(parts, a.target)
                .await
                .map(ViewState::Machines)
        }
        ViewName::Egress => egress((user, board), seal.as_ref(), a.answer)
            .await
            .map(ViewState::Egress),
        ViewName::Terminal => terminal((access, reads), a).await.map(ViewState::Terminal),
    }
}

async fn machines_view(
    (fleets, machines, cancel, user, terminals, jobs, session): (
        Fleets<'_>,
        Ownership<'_>,
        Cancel<'_>,
        &User,
        &Terminals,
        JobTable<'_>,
        Session<'_>,
    ),
    target: Option<crate::fleet::FleetKind>,
) -> Result<MachinesView, ToolError> {
    let fleet = fleets.reach(target).await?;
    let kind = fleet.kind();
    let mut listed = machines
        .only_theirs(kind, cancel.run(fleet.list()).await?)
        .await?;
    listed.sort_by(|a, b| a.name.cmp(&b.name));
    let more = listed.len().saturating_sub(MACHINES_LISTED);
    listed.truncate(MACHINES_LISTED);
    let user = user.id();
    let jobs = jobs.here();
    let machines = listed
        .into_iter()
        .map(|machine| MachineRow {
            ports: machine
                .ports
                .iter()
                .map(|p| PortLink {
                    guest: p.guest,
                    url: fleet.port_address(&machine, p.guest).map(|a| a.url),
                })
                .collect(),
            terminals: terminals.open_of(session.id(), kind, &machine.name),
            jobs: jobs
                .iter()
                .filter(|j| j.user == user && j.kind() == kind && j.machine == machine.name)
                .filter(|j| j.state().phase == crate::policy::jobs::Phase::Running)
                .take(JOBS_LISTED)
                .map(|j| JobRow {
                    job: j.id.clone(),
                    command: j.command.chars().take(120).collect(),
                    state: j.state().phase.word().to_owned(),
                })
                .collect(),
            cost: machine
                .consumption
                .cost_micros
                .map(|m| format!("${:.4}", m as f64 / 1_000_000.0)),
            state: machine.state.to_string(),
            image: machine.image.clone(),
            created_at: machine.created_at.clone(),
            target: kind,
            name: machine.name,
        })
        .collect();
    Ok(MachinesView { machines, more })
}

async fn egress(
    (user, board): (&User, &Board),
    seal: &dyn crate::policy::consent::ViewSeal,
    answer: Option<args::ViewAnswer>,
) -> Result<EgressView, ToolError> {
    let user = user.id();
    let answered = match answer {
        None => None,
        Some(answer) => {
            // The state first: an answer whose state was not sealed for this question and
            // user, or was used, settles nothing, whatever it says.
            seal.open(&answer.question, &answer.state)
                .await
                .map_err(|why| ToolError::argument("answer.state", why))?;
            match board.settle(user, &answer.question, &answer.allowed) {
                Ok(()) => Some(true),
                Err(NotSettled::NotAsked(destination)) => {
                    return Err(ToolError::argument(
                        "answer.allowed",
                        format!(
                            "{} was not asked about: allow only destinations the question lists",
                            crate::policy::error::quote(&destination)
                        ),
                    ));
                }
                // Answered from another view, or the asking call ended (its wait ran out, it
                // was cancelled): nothing waits for this answer any more.
                Err(NotSettled::Unknown) => Some(false),
            }
        }
    };
    let questions = board
        .open_for(user)
        .into_iter()
        .map(|q| QuestionRow {
            state: seal.seal(&q.id),
            question: q.id,
            machine: q.machine,
            destinations: q.destinations,
            asked_at: q.asked_at,
        })
        .collect();
    Ok(EgressView {
        questions,
        answered,
    })
}

async fn terminal(
    ((machines, fleets, cancel, config, terminals, credentials), reads): (
        TerminalAccess<'_>,
        &ParkedReads,
    ),
    a: args::ViewArgs,
) -> Result<TerminalView, ToolError> {
    let (Some(name), Some(id)) = (&a.name, &a.terminal) else {
        return Err(ToolError::argument(
            if a.name.is_none() { "name" } else { "terminal" },
            "the terminal view names the machine (name) and the terminal (terminal) the \
             terminal tool answered",
        ));
    };
    let named = machines.machine(name)?;
    let kind = fleets.kind(a.target)?;
    let terminal = terminals
        .get(id)
        .filter(|t| t.fleet == kind && t.machine == *named)
        .ok_or_else(|| {
            ToolError::new(
                ToolErrorKind::Fleet(crate::fleet::ErrorKind::NotFound),
                format!("view-state: {id} is no open terminal of {named}"),
            )
        })?;
    let keys = super::terminal::key_bytes(a.keys.as_deref())?;
    let typed = a.input.as_deref().is_some_and(|i| !i.is_empty()) || !keys.is_empty();
    if typed {
        // The person typed: what the program does with it may change files a read kept.
        reads.forget_all();
    }
    if let Some(input) = a.input.as_deref().filter(|i| !i.is_empty()) {
        terminal
            .send(TerminalInput::Bytes(input.as_bytes().to_vec()))
            .await;
    }
    for key in keys {
        terminal.send(TerminalInput::Bytes(key)).await;
    }
    if let Some(after) = a.after
        && !typed
    {
        cancel
            .run(async {
                terminal.settle(after, QUIET, TERMINAL_WAIT).await;
                Ok::<_, ToolError>(())
            })
            .await?;
    } else if typed {
        let before = terminal.printed();
        cancel
            .run(async {
                terminal.settle(before, QUIET, Duration::from_secs(2)).await;
                Ok::<_, ToolError>(())
            })
            .await?;
    }
    let budget = config.max_output_bytes;
    let screen = terminal.painted().map(|painted| {
        super::terminal::within_budget(super::terminal::redacted(credentials, painted), budget)
    });
    Ok(TerminalView {
        terminal: terminal.id.clone(),
        machine: named.to_string(),
        printed: terminal.printed(),
        ended: terminal.end().map(|end| match end {
            End::Exited(code) => format!("exited {code}"),
            End::Lost(why) => format!("lost: {why}"),
            End::Closed(why) => format!("closed: {why}"),
        }),
        screen,
    })
}
