//! What a program behind a terminal painted: a terminal emulator's model of the screen (the
//! vt100 crate), fed every byte the program printed from its first, so that a full-screen
//! program (vi, less, top, a test runner's live display) reads as the screen it drew rather
//! than as the escape sequences that drew it, which the terminal tool's stream strips.
//!
//! Its memory is the screen's cells (32 bytes each, no scrollback): at the terminal tool's
//! largest size, 500 by 200, about 3 MiB a terminal.

use schemars::JsonSchema;
use serde::Serialize;
use std::num::NonZeroU16;

/// The longest window title kept, in bytes: a title is a line, not a channel.
const MAX_TITLE_BYTES: usize = 256;

/// The screen as painted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Painted {
    /// Each row's text, trailing blanks dropped; as many rows as the screen has.
    pub rows: Vec<String>,
    /// The cursor's row and column, from 0.
    pub cursor: [u16; 2],
    /// The window title the program set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

/// Keeps the window title a program sets (OSC 0 or 2); the emulator reports it only as an event.
#[derive(Debug, Default)]
struct Title(String);

impl vt100::Callbacks for Title {
    fn set_window_title(&mut self, _: &mut vt100::Screen, title: &[u8]) {
        let kept = &title[..title.len().min(MAX_TITLE_BYTES)];
        self.0 = String::from_utf8_lossy(kept).into_owned();
    }
}

/// One terminal's screen.
pub struct Screen {
    emulator: vt100::Parser<Title>,
}

impl std::fmt::Debug for Screen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (rows, cols) = self.emulator.screen().size();
        write!(f, "Screen({rows}x{cols})")
    }
}

fn dimension(value: u16, default: NonZeroU16) -> NonZeroU16 {
    NonZeroU16::new(value).unwrap_or(default)
}

impl Screen {
    pub fn new(rows: u16, cols: u16) -> Screen {
        Screen {
            emulator: vt100::Parser::new_with_callbacks(
                dimension(rows, vt100::Parser::DEFAULT_ROWS),
                dimension(cols, vt100::Parser::DEFAULT_COLS),
                0,
                Title::default(),
            ),
        }
    }

    /// What the program printed next.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.emulator.process(bytes);
    }

    /// The terminal was resized (the program is told as well, and redraws).
    pub fn resize(&mut self, rows: u16, cols: u16) {
        self.emulator.set_size(
            dimension(rows, vt100::Parser::DEFAULT_ROWS),
            dimension(cols, vt100::Parser::DEFAULT_COLS),
        );
    }

    pub fn painted(&self) -> Painted {
        let screen = self.emulator.screen();
        let (_, cols) = screen.size();
        let rows = screen
            .rows(0, cols.get())
            .map(|row| row.trim_end().to_owned())
            .collect();
        let (row, col) = screen.cursor_position();
        let title = &self.emulator.callbacks().0;
        Painted {
            rows,
            cursor: [row, col],
            title: (!title.is_empty()).then(|| title.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_screen_program_reads_as_what_it_painted() {
        let mut screen = Screen::new(5, 20);
        // Clear, home, two lines of a file, a status line on the last row, the cursor back at
        // the first line, and a title: what vi does, in short.
        screen.feed(b"\x1b]0;notes.txt\x07\x1b[2J\x1b[Hfirst line\r\nsecond\x1b[5;1H\"notes.txt\" 2L\x1b[1;1H");
        let painted = screen.painted();
        assert_eq!(
            painted.rows,
            ["first line", "second", "", "", "\"notes.txt\" 2L"]
        );
        assert_eq!(painted.cursor, [0, 0]);
        assert_eq!(painted.title.as_deref(), Some("notes.txt"));
    }

    #[test]
    fn a_line_redrawn_many_times_shows_its_last_state() {
        let mut screen = Screen::new(3, 30);
        for percent in 0..=100 {
            screen.feed(format!("\rprogress {percent:>3}%").as_bytes());
        }
        let painted = screen.painted();
        assert_eq!(painted.rows[0], "progress 100%");
        assert_eq!(painted.cursor, [0, 13]);
        assert_eq!(painted.title, None);
    }

    #[test]
    fn a_resize_changes_the_rows_answered_and_a_long_title_is_cut() {
        let mut screen = Screen::new(4, 10);
        screen.resize(6, 12);
        assert_eq!(screen.painted().rows.len(), 6);
        let mut long = b"\x1b]2;".to_vec();
        long.extend(std::iter::repeat_n(b'x', 10_000));
        long.push(0x07);
        screen.feed(&long);
        assert_eq!(
            screen.painted().title.map(|t| t.len()),
            Some(MAX_TITLE_BYTES)
        );
        // Zero is no size: the emulator's default stands in.
        assert_eq!(Screen::new(0, 0).painted().rows.len(), 24);
    }
}
