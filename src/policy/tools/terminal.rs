//! The terminal tool: one call opens, types into, resizes, reads or closes a terminal (the
//! registry and its bounds are `crate::policy::terminals`). A call waits as a person at a
//! keyboard would: until the output has been quiet a moment after it changed, the program
//! ended, or the call's wait ran out; then it answers what was printed since the last read.

use super::args;
use super::call::parts::{Cancel, Fleets, Ownership, Session, Waits};
use super::results::TerminalRead;
use super::{ToolError, ToolErrorKind};
use crate::fleet::terminal::{TerminalInput, TerminalSpec};
use crate::fleet::{Command, ErrorKind, Feature, FleetError};
use crate::policy::terminals::{self, End, Refusal, Terminals};
use crate::process::config::Config;
use crate::process::credentials::Supplier;
use std::time::Duration;

const DEFAULT_COLS: u16 = 80;
const DEFAULT_ROWS: u16 = 24;
/// How long a call waits for output when it does not say.
const DEFAULT_WAIT_MS: u32 = 2000;
/// Output quiet this long after it changed counts as settled: a prompt is drawn at once.
const QUIET: Duration = Duration::from_millis(300);

/// What reaching an open terminal takes of the call (the terminal tool's and the terminal
/// view's): the machine's ownership checked, its fleet, the client's cancellation, the output
/// budget, the terminals open, and the values its screen is redacted of.
pub(super) type TerminalAccess<'c> = (
    Ownership<'c>,
    Fleets<'c>,
    Cancel<'c>,
    &'c Config,
    &'c Terminals,
    &'c Supplier,
);

/// The terminal tool opens terminals too: it brings the machine up and counts the session's.
pub(super) async fn terminal(
    ((machines, fleets, cancel, config, terminals, credentials), waits, session): (
        TerminalAccess<'_>,
        Waits<'_>,
        Session<'_>,
    ),
    a: args::TerminalArgs,
) -> Result<TerminalRead, ToolError> {
    let named = machines.machine(&a.name)?;
    let size = |arg: &str, value: Option<u32>| -> Result<Option<u16>, ToolError> {
        value
            .map(|v| {
                u16::try_from(v).map_err(|_| ToolError::argument(arg, "too large for a terminal"))
            })
            .transpose()
    };
    let (cols, rows) = (size("cols", a.cols)?, size("rows", a.rows)?);
    let keys = key_bytes(a.keys.as_deref())?;
    let fleet = fleets.reach(a.target).await?;
    let kind = fleet.kind();
    let mut started_machine = false;
    let terminal = match &a.terminal {
        Some(id) => {
            if a.command.is_some() {
                return Err(ToolError::argument(
                    "command",
                    "a terminal runs the program it was opened with: leave terminal out to open \
                     another",
                ));
            }
            let found = terminals
                .get(id)
                .filter(|t| t.fleet == kind && t.machine == *named);
            found.ok_or_else(|| {
                ToolError::new(
                    ToolErrorKind::Fleet(ErrorKind::NotFound),
                    format!(
                        "terminal: {id} is no open terminal of {} (it ended over 10 minutes \
                         ago, or was never opened there): leave terminal out to open one",
                        named
                    ),
                )
            })?
        }
        None => {
            if a.close {
                return Err(ToolError::argument(
                    "close",
                    "names no terminal: give terminal, the id the opening call answered",
                ));
            }
            if let Some(why) = fleet.capabilities().lacks(Feature::Terminal) {
                return Err(FleetError::new(ErrorKind::Unsupported, "terminal", why).into());
            }
            match terminals.refusal(session.id(), kind, &named) {
                Some(Refusal::SessionFull) => {
                    return Err(ToolError::new(
                        ToolErrorKind::LimitReached,
                        format!(
                            "terminal: this session has {} terminals open, the most it may: \
                             close one (close: true) first",
                            terminals::MAX_PER_SESSION
                        ),
                    ));
                }
                Some(Refusal::MachineFull) => {
                    return Err(ToolError::new(
                        ToolErrorKind::LimitReached,
                        format!(
                            "terminal: {} has {} terminals open, the most one machine may: \
                             close one (close: true) first",
                            named,
                            terminals::MAX_PER_MACHINE
                        ),
                    ));
                }
                None => {}
            }
            started_machine = waits.ensure_running(&fleet, &named).await?;
            let argv = match &a.command {
                None => vec!["sh".to_owned()],
                Some(command) => match args::command("command", command)? {
                    Command::Argv(argv) => argv,
                    Command::Shell(script) => vec!["sh".into(), "-c".into(), script],
                },
            };
            let spec = TerminalSpec {
                argv,
                cols: cols.unwrap_or(DEFAULT_COLS),
                rows: rows.unwrap_or(DEFAULT_ROWS),
            };
            let link = cancel.run(fleet.open_terminal(&named, &spec)).await?;
            terminals.add(kind, &named, session.id(), link, (spec.rows, spec.cols))
        }
    };

    if a.close {
        terminal.close("closed by the agent");
    } else {
        let before = terminal.printed();
        let mut sent = true;
        if a.terminal.is_some() {
            match (cols, rows) {
                (Some(cols), Some(rows)) => {
                    sent &= terminal.send(TerminalInput::Resize { cols, rows }).await;
                    terminal.resize_screen(rows, cols);
                }
                (None, None) => {}
                _ => {
                    return Err(ToolError::argument(
                        "cols",
                        "a resize takes both cols and rows",
                    ));
                }
            }
        }
        // What a PTY echoes of the typing comes back at once, before the program's answer
        // (on the nested guest a command's output followed its echo by more than the quiet
        // time): the output is settled once it has gone past the echo, as many bytes as were
        // typed with each Enter's \r echoed as \r\n.
        let echo = |bytes: &[u8]| bytes.len() as u64 + bytecount(bytes, b'\r');
        let mut typed = 0u64;
        if let Some(input) = a.input.as_deref().filter(|i| !i.is_empty()) {
            typed += echo(input.as_bytes());
            sent &= terminal
                .send(TerminalInput::Bytes(input.as_bytes().to_vec()))
                .await;
        }
        for key in keys {
            typed += echo(&key);
            sent &= terminal.send(TerminalInput::Bytes(key)).await;
        }
        if !sent && a.input.is_some() {
            tracing::debug!(terminal = %terminal.id, "input to an ended terminal was dropped");
        }
        let wait = Duration::from_millis(u64::from(a.wait_ms.unwrap_or(DEFAULT_WAIT_MS)));
        cancel
            .run(async {
                terminal.settle(before + typed, QUIET, wait).await;
                Ok::<_, ToolError>(())
            })
            .await?;
    }

    let budget = config.max_output_bytes;
    let page = terminal.read(a.cursor, budget);
    let text = String::from_utf8_lossy(&page.bytes);
    let mut output = if a.raw {
        text.into_owned()
    } else {
        terminals::plain_text(&text)
    };
    if page.gap {
        output.insert_str(
            0,
            &format!(
                "[output before this was dropped: the newest {} KiB are kept]\n",
                terminals::KEPT_BYTES / 1024
            ),
        );
    }
    // The guest holds placeholders, not values; a value it printed anyway is replaced.
    let output = credentials.redactor().text(&output).unwrap_or(output);
    Ok(TerminalRead {
        terminal: terminal.id.clone(),
        output,
        cursor: page.cursor,
        more: page.more,
        ended: page.end.map(|end| match end {
            End::Exited(code) => format!("exited {code}"),
            End::Lost(why) => format!("lost: {why}"),
            End::Closed(why) => format!("closed: {why}"),
        }),
        started_machine,
        screen: a
            .screen
            .then(|| terminal.painted())
            .flatten()
            .map(|painted| within_budget(redacted(credentials, painted), budget)),
    })
}

/// The screen with any credential value the program printed replaced, as in the stream.
/// The bytes each named key sends, or a refusal naming the key not known.
pub(super) fn key_bytes(keys: Option<&[String]>) -> Result<Vec<Vec<u8>>, ToolError> {
    keys.unwrap_or_default()
        .iter()
        .map(|key| {
            terminals::key_bytes(key).ok_or_else(|| {
                ToolError::argument(
                    "keys",
                    format!(
                        "{key:?} is not a key this server knows: {}",
                        terminals::KEY_NAMES
                    ),
                )
            })
        })
        .collect()
}

pub(super) fn redacted(
    credentials: &Supplier,
    mut painted: crate::policy::screen::Painted,
) -> crate::policy::screen::Painted {
    let redactor = credentials.redactor();
    for line in painted.rows.iter_mut().chain(painted.title.as_mut()) {
        if let Some(clean) = redactor.text(line) {
            *line = clean;
        }
    }
    painted
}

/// The screen's rows within the output budget: a screen larger than it (500 wide, many rows
/// of wide characters) keeps its first rows and says how many were left out in the last.
pub(super) fn within_budget(
    mut painted: crate::policy::screen::Painted,
    budget: usize,
) -> crate::policy::screen::Painted {
    let mut used = 0usize;
    let fits = painted
        .rows
        .iter()
        .take_while(|row| {
            used += row.len() + 1;
            used <= budget
        })
        .count();
    if fits < painted.rows.len() {
        let left_out = painted.rows.len() - fits;
        painted.rows.truncate(fits.saturating_sub(1));
        painted.rows.push(format!(
            "[{} more rows left out: the screen is larger than maxOutputBytes]",
            left_out + 1
        ));
    }
    painted
}

fn bytecount(bytes: &[u8], byte: u8) -> u64 {
    bytes.iter().filter(|b| **b == byte).count() as u64
}
