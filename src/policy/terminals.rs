//! Terminals the agent holds open in machines: each a program behind a PTY (the fleet's
//! [`TerminalLink`]), its output kept here so that the agent reads it by cursor, call after
//! call. Every one is bounded: so many a session and a machine, so much output kept (the oldest
//! dropped first, which a read from before it is told), so long unused. One ends when its
//! program exits, its machine goes, its session ends, or the agent closes it.

use crate::fleet::FleetKind;
use crate::fleet::terminal::{TerminalEvent, TerminalInput, TerminalLink};
use crate::policy::screen::{Painted, Screen};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Terminals one session may hold open at once.
pub const MAX_PER_SESSION: usize = 8;
/// Terminals open in one machine at once.
pub const MAX_PER_MACHINE: usize = 4;
/// Output kept per terminal: the newest this many bytes.
pub const KEPT_BYTES: usize = 1024 * 1024;
/// A terminal no call has named for this long is closed (its program ended).
pub const IDLE: Duration = Duration::from_secs(15 * 60);
/// An ended terminal stays readable this long after its end, then is forgotten.
const ENDED_KEPT: Duration = Duration::from_secs(10 * 60);
/// How often idle and ended terminals are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// How a terminal ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    Exited(i32),
    /// The connection ended without an exit: why.
    Lost(String),
    /// The server closed it: why (the agent asked, its session ended, its machine went, idle).
    Closed(String),
}

/// A page of output read from a terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub bytes: Vec<u8>,
    /// Where the next read starts.
    pub cursor: u64,
    /// Output was dropped between the cursor asked for and the oldest kept.
    pub gap: bool,
    /// More output is kept past this page.
    pub more: bool,
    pub end: Option<End>,
}

#[derive(Debug, Default)]
struct Kept {
    /// The offset of `bytes[0]` in everything the program printed.
    start: u64,
    bytes: VecDeque<u8>,
    /// Where the last read ended: a read without a cursor starts here.
    read_to: u64,
    end: Option<End>,
    ended_at: Option<Instant>,
    /// What the program painted, from everything it printed (not only what is kept).
    screen: Option<Screen>,
}

impl Kept {
    fn end_offset(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }
}

/// One open terminal.
#[derive(Debug)]
pub struct Terminal {
    pub id: String,
    pub fleet: FleetKind,
    pub machine: String,
    pub session: String,
    /// `None` once closed: dropping the sender closes the socket, which ends the program.
    input: Mutex<Option<tokio::sync::mpsc::Sender<TerminalInput>>>,
    kept: Mutex<Kept>,
    changed: Notify,
    last_use: Mutex<Instant>,
}

impl Terminal {
    fn touch(&self) {
        if let Ok(mut at) = self.last_use.lock() {
            *at = Instant::now();
        }
    }

    /// Sends input (bytes or a resize) to the program; false once it has ended.
    pub async fn send(&self, input: TerminalInput) -> bool {
        self.touch();
        let sender = self.input.lock().ok().and_then(|s| s.clone());
        match sender {
            Some(sender) => sender.send(input).await.is_ok(),
            None => false,
        }
    }

    /// Ends the program (closing its socket), recording why.
    pub fn close(&self, why: &str) {
        if let Ok(mut input) = self.input.lock() {
            input.take();
        }
        if let Ok(mut kept) = self.kept.lock()
            && kept.end.is_none()
        {
            kept.end = Some(End::Closed(why.to_owned()));
            kept.ended_at = Some(Instant::now());
        }
        self.changed.notify_waiters();
    }

    /// The terminal's screen now has this size (the program was told with a resize).
    pub fn resize_screen(&self, rows: u16, cols: u16) {
        if let Ok(mut kept) = self.kept.lock()
            && let Some(screen) = kept.screen.as_mut()
        {
            screen.resize(rows, cols);
        }
    }

    /// The screen as the program painted it so far.
    pub fn painted(&self) -> Option<Painted> {
        self.touch();
        let kept = self.kept.lock().ok()?;
        kept.screen.as_ref().map(Screen::painted)
    }

    pub fn end(&self) -> Option<End> {
        self.kept.lock().ok().and_then(|k| k.end.clone())
    }

    /// The offset after everything printed so far.
    pub fn printed(&self) -> u64 {
        self.kept.lock().map(|k| k.end_offset()).unwrap_or(0)
    }

    /// Where a read without a cursor starts.
    pub fn read_to(&self) -> u64 {
        self.kept.lock().map(|k| k.read_to).unwrap_or(0)
    }

    /// Waits until the output passes `after` and then stays quiet for `quiet`, the program
    /// ends, or `limit` passes: what a person waits for after pressing a key.
    pub async fn settle(&self, after: u64, quiet: Duration, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.changed.notified();
            let (printed, ended) = match self.kept.lock() {
                Ok(k) => (k.end_offset(), k.end.is_some()),
                Err(_) => return,
            };
            if ended {
                return;
            }
            let wait_until = if printed > after {
                (tokio::time::Instant::now() + quiet).min(deadline)
            } else {
                deadline
            };
            match tokio::time::timeout_at(wait_until, notified).await {
                Ok(()) => continue,
                Err(_) if printed > after || tokio::time::Instant::now() >= deadline => return,
                Err(_) => continue,
            }
        }
    }

    /// Up to `max` bytes from `cursor` (or where the last read ended), never splitting a UTF-8
    /// character at the page's end unless the output ends there.
    pub fn read(&self, cursor: Option<u64>, max: usize) -> Read {
        self.touch();
        let Ok(mut kept) = self.kept.lock() else {
            return Read {
                bytes: Vec::new(),
                cursor: cursor.unwrap_or(0),
                gap: false,
                more: false,
                end: None,
            };
        };
        let asked = cursor.unwrap_or(kept.read_to);
        let end = kept.end_offset();
        let from = asked.clamp(kept.start, end);
        let gap = asked < kept.start;
        let offset = usize::try_from(from - kept.start).unwrap_or(0);
        let available = kept.bytes.len() - offset;
        // Three bytes past the page tell whether its end splits a character.
        let window: Vec<u8> = kept
            .bytes
            .iter()
            .skip(offset)
            .take(max.saturating_add(3).min(available))
            .copied()
            .collect();
        let mut len = crate::policy::output::utf8_prefix_len(&window, max.min(available));
        if len == available && kept.end.is_none() {
            // The rest of a character still on its way is read with it next time.
            len = crate::policy::output::complete_utf8_len(&window[..len]);
        }
        let page = window;
        let bytes = page[..len].to_vec();
        let next = from + len as u64;
        kept.read_to = kept.read_to.max(next);
        Read {
            bytes,
            cursor: next,
            gap,
            more: next < end,
            end: kept.end.clone(),
        }
    }

    fn record(&self, event: TerminalEvent) {
        let Ok(mut kept) = self.kept.lock() else {
            return;
        };
        match event {
            TerminalEvent::Output(bytes) => {
                if let Some(screen) = kept.screen.as_mut() {
                    screen.feed(&bytes);
                }
                kept.bytes.extend(bytes);
                let over = kept.bytes.len().saturating_sub(KEPT_BYTES);
                if over > 0 {
                    kept.bytes.drain(..over);
                    kept.start += over as u64;
                }
            }
            TerminalEvent::Exited(code) => {
                kept.end.get_or_insert(End::Exited(code));
                kept.ended_at.get_or_insert_with(Instant::now);
            }
            TerminalEvent::Lost(why) => {
                kept.end.get_or_insert(End::Lost(why));
                kept.ended_at.get_or_insert_with(Instant::now);
            }
        }
        drop(kept);
        self.changed.notify_waiters();
    }
}

/// Why a new terminal is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    SessionFull,
    MachineFull,
}

/// Every open terminal of the process, by id.
#[derive(Debug, Default)]
pub struct Terminals {
    open: Arc<Mutex<HashMap<String, Arc<Terminal>>>>,
    sweeper: std::sync::OnceLock<()>,
}

impl Terminals {
    /// Why one more terminal for `session` in `machine` would pass a bound, if it would.
    pub fn refusal(&self, session: &str, fleet: FleetKind, machine: &str) -> Option<Refusal> {
        let open = self.open.lock().ok()?;
        let live = |t: &&Arc<Terminal>| t.end().is_none();
        if open
            .values()
            .filter(live)
            .filter(|t| t.session == session)
            .count()
            >= MAX_PER_SESSION
        {
            return Some(Refusal::SessionFull);
        }
        let in_machine = open
            .values()
            .filter(live)
            .filter(|t| t.fleet == fleet && t.machine == machine)
            .count();
        (in_machine >= MAX_PER_MACHINE).then_some(Refusal::MachineFull)
    }

    /// Whether a terminal is open in `machine` (its program not ended).
    pub fn open_in(&self, fleet: FleetKind, machine: &str) -> bool {
        self.open.lock().is_ok_and(|open| {
            open.values()
                .any(|t| t.end().is_none() && t.fleet == fleet && t.machine == machine)
        })
    }

    /// The open terminals in `machine` of `session`, oldest first by id.
    pub fn open_of(&self, session: &str, fleet: FleetKind, machine: &str) -> Vec<String> {
        let Ok(open) = self.open.lock() else {
            return Vec::new();
        };
        let mut ids: Vec<String> = open
            .values()
            .filter(|t| t.end().is_none() && t.session == session)
            .filter(|t| t.fleet == fleet && t.machine == machine)
            .map(|t| t.id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// Keeps `link` as a new terminal of `rows` by `cols` and starts recording what it prints.
    pub fn add(
        &self,
        fleet: FleetKind,
        machine: &str,
        session: &str,
        link: TerminalLink,
        (rows, cols): (u16, u16),
    ) -> Arc<Terminal> {
        let TerminalLink { input, mut events } = link;
        let terminal = Arc::new(Terminal {
            id: format!("t-{:016x}", rand::random::<u64>()),
            fleet,
            machine: machine.to_owned(),
            session: session.to_owned(),
            input: Mutex::new(Some(input)),
            kept: Mutex::new(Kept {
                screen: Some(Screen::new(rows, cols)),
                ..Kept::default()
            }),
            changed: Notify::new(),
            last_use: Mutex::new(Instant::now()),
        });
        let recorder = Arc::downgrade(&terminal);
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                let Some(terminal) = recorder.upgrade() else {
                    return;
                };
                terminal.record(event);
            }
        });
        if let Ok(mut open) = self.open.lock() {
            open.insert(terminal.id.clone(), terminal.clone());
        }
        self.start_sweeper();
        terminal
    }

    pub fn get(&self, id: &str) -> Option<Arc<Terminal>> {
        self.open.lock().ok()?.get(id).cloned()
    }

    /// Closes and forgets the terminals of `session`.
    pub fn close_session(&self, session: &str) {
        self.close_where(|t| t.session == session, "its session ended");
    }

    /// Closes every terminal (the process ends).
    pub fn close_all(&self) {
        self.close_where(|_| true, "the server stopped");
    }

    /// Closes and forgets the terminals in `machine`.
    pub fn close_machine(&self, fleet: FleetKind, machine: &str) {
        self.close_where(
            |t| t.fleet == fleet && t.machine == machine,
            "its machine was deleted",
        );
    }

    fn close_where(&self, which: impl Fn(&Terminal) -> bool, why: &str) {
        let Ok(mut open) = self.open.lock() else {
            return;
        };
        open.retain(|_, t| {
            if which(t) {
                t.close(why);
                false
            } else {
                true
            }
        });
    }

    /// Closes idle terminals and forgets those ended a while ago.
    fn sweep(open: &Mutex<HashMap<String, Arc<Terminal>>>) {
        let Ok(mut open) = open.lock() else {
            return;
        };
        open.retain(|_, t| {
            let idle = t.last_use.lock().map(|at| at.elapsed()).unwrap_or_default();
            if idle >= IDLE {
                t.close("no call used it for 15 minutes");
            }
            let ended_long_ago = t
                .kept
                .lock()
                .ok()
                .and_then(|k| k.ended_at)
                .is_some_and(|at| at.elapsed() >= ENDED_KEPT);
            !ended_long_ago
        });
    }

    fn start_sweeper(&self) {
        self.sweeper.get_or_init(|| {
            let open: Weak<Mutex<HashMap<String, Arc<Terminal>>>> = Arc::downgrade(&self.open);
            tokio::spawn(async move {
                let mut every = tokio::time::interval(SWEEP_EVERY);
                loop {
                    every.tick().await;
                    let Some(open) = open.upgrade() else {
                        return;
                    };
                    Terminals::sweep(&open);
                }
            });
        });
    }
}

/// The keys a call may press by name, as a PTY in its default (VT100) mode takes them.
pub fn key_bytes(name: &str) -> Option<Vec<u8>> {
    let lower = name.to_ascii_lowercase();
    let fixed: &[u8] = match lower.as_str() {
        "enter" | "return" => b"\r",
        "tab" => b"\t",
        "escape" | "esc" => b"\x1b",
        "backspace" => b"\x7f",
        "delete" => b"\x1b[3~",
        "space" => b" ",
        "up" => b"\x1b[A",
        "down" => b"\x1b[B",
        "right" => b"\x1b[C",
        "left" => b"\x1b[D",
        "home" => b"\x1b[H",
        "end" => b"\x1b[F",
        "pageup" => b"\x1b[5~",
        "pagedown" => b"\x1b[6~",
        _ => {
            let letter = lower.strip_prefix("ctrl-")?;
            let [c] = letter.as_bytes() else {
                return None;
            };
            return c.is_ascii_lowercase().then(|| vec![c - b'a' + 1]);
        }
    };
    Some(fixed.to_vec())
}

/// The key names [`key_bytes`] takes, as a refusal lists them.
pub const KEY_NAMES: &str = "enter, tab, escape, backspace, delete, space, up, down, left, \
     right, home, end, pageup, pagedown, ctrl-a to ctrl-z (ctrl-c interrupts, ctrl-d ends input)";

/// Terminal output as a model reads it: escape sequences (colours, cursor moves, titles)
/// removed, `\r\n` as `\n`, a lone `\r` as a new line, other control characters dropped.
pub fn plain_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => match chars.next() {
                // CSI: parameters and intermediates, then one final byte from @ to ~.
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
                // OSC, DCS, SOS, PM, APC: to BEL or ST (ESC \).
                Some(']' | 'P' | 'X' | '^' | '_') => {
                    while let Some(c) = chars.next() {
                        if c == '\x07' {
                            break;
                        }
                        if c == '\x1b' && chars.peek() == Some(&'\\') {
                            chars.next();
                            break;
                        }
                    }
                }
                // A character set chosen: one more character.
                Some('(' | ')' | '*' | '+' | '#') => {
                    chars.next();
                }
                _ => {}
            },
            '\r' => {
                if chars.peek() != Some(&'\n') {
                    out.push('\n');
                }
            }
            '\n' | '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_go_and_lines_stay() {
        assert_eq!(
            plain_text("/ # \x1b[6necho hi\r\nhi\r\n"),
            "/ # echo hi\nhi\n"
        );
        assert_eq!(
            plain_text("\x1b[1;31mred\x1b[0m \x1b]0;title\x07plain\x1b(B."),
            "red plain."
        );
        assert_eq!(plain_text("\x1b]2;t\x1b\\ok"), "ok");
        assert_eq!(plain_text("50%\r100%\r\n"), "50%\n100%\n");
        assert_eq!(plain_text("bell\x07 and \x08back"), "bell and back");
        assert_eq!(plain_text("grüße ✓"), "grüße ✓");
        // A sequence cut at the page's end is dropped, not shown half.
        assert_eq!(plain_text("done\x1b[3"), "done");
    }

    #[test]
    fn keys_are_named_and_ctrl_letters_are_control_codes() {
        assert_eq!(key_bytes("Enter"), Some(b"\r".to_vec()));
        assert_eq!(key_bytes("ctrl-c"), Some(vec![3]));
        assert_eq!(key_bytes("ctrl-d"), Some(vec![4]));
        assert_eq!(key_bytes("up"), Some(b"\x1b[A".to_vec()));
        assert_eq!(key_bytes("ctrl-"), None);
        assert_eq!(key_bytes("ctrl-1"), None);
        assert_eq!(key_bytes("hyper"), None);
    }

    fn terminal() -> (Arc<Terminal>, tokio::sync::mpsc::Receiver<TerminalInput>) {
        let (input, taken) = tokio::sync::mpsc::channel(4);
        let terminal = Arc::new(Terminal {
            id: "t-test".into(),
            fleet: FleetKind::Local,
            machine: "m".into(),
            session: "s".into(),
            input: Mutex::new(Some(input)),
            kept: Mutex::new(Kept {
                screen: Some(Screen::new(24, 80)),
                ..Kept::default()
            }),
            changed: Notify::new(),
            last_use: Mutex::new(Instant::now()),
        });
        (terminal, taken)
    }

    #[test]
    fn reads_go_on_from_the_last_and_say_what_was_dropped() {
        let (t, _input) = terminal();
        t.record(TerminalEvent::Output(b"hello ".to_vec()));
        t.record(TerminalEvent::Output("wörld".as_bytes().to_vec()));
        // A page that would split "ö" stops before it.
        let first = t.read(None, 8);
        assert_eq!(first.bytes, b"hello w");
        assert!(first.more && !first.gap);
        let rest = t.read(None, 100);
        assert_eq!(rest.bytes, "örld".as_bytes());
        assert!(!rest.more);
        assert_eq!(t.read(None, 100).bytes, b"");
        // A cursor re-reads.
        assert_eq!(t.read(Some(0), 5).bytes, b"hello");
        // A character still arriving is not read half.
        t.record(TerminalEvent::Output(vec![0xC3]));
        assert_eq!(t.read(None, 100).bytes, b"");
        t.record(TerminalEvent::Output(vec![0xA9]));
        assert_eq!(t.read(None, 100).bytes, "é".as_bytes());
        // Past the bound, the oldest bytes go, and a read from before them says so.
        t.record(TerminalEvent::Output(vec![b'x'; KEPT_BYTES]));
        let late = t.read(Some(0), 4);
        assert!(late.gap);
        assert_eq!(late.bytes, b"xxxx");
        t.record(TerminalEvent::Exited(7));
        assert_eq!(t.end(), Some(End::Exited(7)));
        t.close("too late");
        assert_eq!(t.end(), Some(End::Exited(7)), "the first end stays");
    }

    #[tokio::test]
    async fn a_close_ends_the_program_and_bounds_count_live_terminals() {
        let terminals = Terminals::default();
        let mut inputs = Vec::new();
        for _ in 0..MAX_PER_MACHINE {
            assert_eq!(terminals.refusal("s", FleetKind::Local, "m"), None);
            let (input, taken) = tokio::sync::mpsc::channel(4);
            let (_events_tx, events) = tokio::sync::mpsc::channel(4);
            inputs.push(taken);
            terminals.add(
                FleetKind::Local,
                "m",
                "s",
                TerminalLink { input, events },
                (24, 80),
            );
        }
        assert_eq!(
            terminals.refusal("s", FleetKind::Local, "m"),
            Some(Refusal::MachineFull)
        );
        assert_eq!(terminals.refusal("s", FleetKind::Local, "other"), None);
        terminals.close_machine(FleetKind::Local, "m");
        assert_eq!(terminals.refusal("s", FleetKind::Local, "m"), None);
        for mut taken in inputs {
            assert_eq!(taken.recv().await, None, "the program's input closed");
        }
    }
}
