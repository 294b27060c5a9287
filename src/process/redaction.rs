//! Replacing credential values in output the server hands out, wherever the server cuts it.
//!
//! A whole value in a text is easy to find; the server's own cuts are where a value escapes:
//! a page of a file or of a job's output, the head and tail kept of a long output, a piece of a
//! stream sent as a notification. A cut through a value leaves two pieces, neither matching,
//! and two reads give it whole. So every cut here is moved off a value: a page that would end
//! inside one ends after it (showing its label), a page that starts inside one starts after it
//! (showing its label), and a stream's last bytes that could be a value's start wait for what
//! follows them.
//!
//! What the guest does in its own output (a value encoded, reversed, printed in two halves)
//! is beyond this: the server only knows the value's own bytes.

use aho_corasick::{AhoCorasick, MatchKind};
use std::ops::Range;

/// A value's start left at the very end of a stream is replaced when it is at least this long:
/// shorter, it is as likely a word of ordinary output.
pub const EDGE_MIN: usize = 4;

/// What may follow the bytes at hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// More may come (a stream still open, a file still being written): a value's first bytes
    /// at the end are held back until it does.
    Continues,
    /// Nothing follows: a value's first bytes at the end, [`EDGE_MIN`] or more, are replaced.
    Final,
}

/// A window of output with the cuts moved off every value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub bytes: Vec<u8>,
    /// Where the next window starts, in the bytes given: the window's end, or past it when a
    /// value ran across it, or before it when a value's first bytes are held back.
    pub end: usize,
}

/// The values to replace and their labels, searched for all at once.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    values: Vec<(Vec<u8>, String)>,
    finder: Option<AhoCorasick>,
}

impl Redactor {
    /// `values` with what replaces each; empty values are left out.
    pub fn new(values: impl IntoIterator<Item = (Vec<u8>, String)>) -> Redactor {
        let values: Vec<(Vec<u8>, String)> =
            values.into_iter().filter(|(v, _)| !v.is_empty()).collect();
        // Leftmost-longest: of two values starting at one byte, the longer is replaced whole.
        let finder = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(values.iter().map(|(v, _)| v))
            .ok();
        Redactor { values, finder }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The longest value's length: how far around a cut a value can reach.
    pub fn longest(&self) -> usize {
        self.values.iter().map(|(v, _)| v.len()).max().unwrap_or(0)
    }

    /// `bytes` with every whole value replaced; `None` when there is none in it.
    pub fn bytes(&self, bytes: &[u8]) -> Option<Vec<u8>> {
        let finder = self.finder.as_ref()?;
        let mut out: Option<Vec<u8>> = None;
        let mut at = 0;
        for found in finder.find_iter(bytes) {
            let out = out.get_or_insert_with(|| Vec::with_capacity(bytes.len()));
            out.extend_from_slice(&bytes[at..found.start()]);
            out.extend_from_slice(self.values[found.pattern().as_usize()].1.as_bytes());
            at = found.end();
        }
        let mut out = out?;
        out.extend_from_slice(&bytes[at..]);
        Some(out)
    }

    /// `text` with every whole value replaced; `None` when there is none in it.
    pub fn text(&self, text: &str) -> Option<String> {
        // Values and labels are whole UTF-8 texts, so the result is one too.
        self.bytes(text.as_bytes())
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The bytes of `window` within `around` (which holds, when it can, the longest value's
    /// length less one on either side of it), every value in it replaced and the cuts moved
    /// off values: see the module's words.
    pub fn window(&self, around: &[u8], window: Range<usize>, ending: Ending) -> Window {
        let (start, stop) = (window.start.min(around.len()), window.end.min(around.len()));
        let mut out = Vec::with_capacity(stop.saturating_sub(start));
        let mut at = start;
        if let Some(finder) = &self.finder {
            for found in finder.find_iter(around) {
                if found.end() <= start {
                    continue;
                }
                if found.start() >= stop {
                    break;
                }
                if found.start() > at {
                    out.extend_from_slice(&around[at..found.start()]);
                }
                out.extend_from_slice(self.values[found.pattern().as_usize()].1.as_bytes());
                at = found.end();
            }
        }
        if at >= stop {
            return Window {
                bytes: out,
                end: at,
            };
        }
        if let Some((begins, label)) = self.unfinished(around, at).filter(|&(b, _)| b < stop) {
            match ending {
                Ending::Continues => {
                    out.extend_from_slice(&around[at..begins]);
                    return Window {
                        bytes: out,
                        end: begins,
                    };
                }
                Ending::Final if around.len() - begins >= EDGE_MIN => {
                    out.extend_from_slice(&around[at..begins]);
                    out.extend_from_slice(label.as_bytes());
                    return Window {
                        bytes: out,
                        end: around.len(),
                    };
                }
                Ending::Final => {}
            }
        }
        out.extend_from_slice(&around[at..stop]);
        Window {
            bytes: out,
            end: stop,
        }
    }

    /// The earliest place at or after `from` where the rest of `bytes` is a value's start (not
    /// the whole value), with that value's label.
    fn unfinished(&self, bytes: &[u8], from: usize) -> Option<(usize, &str)> {
        let first = from.max(bytes.len().saturating_sub(self.longest().saturating_sub(1)));
        (first..bytes.len()).find_map(|begins| {
            let rest = &bytes[begins..];
            self.values
                .iter()
                .find(|(v, _)| v.len() > rest.len() && v.starts_with(rest))
                .map(|(_, label)| (begins, label.as_str()))
        })
    }
}

/// One stream's redaction as it arrives piece by piece: a piece's last bytes that could begin a
/// value wait for the next piece, so no number of pieces lets a value through.
#[derive(Debug)]
pub struct StreamRedactor {
    redactor: std::sync::Arc<Redactor>,
    held: Vec<u8>,
}

impl StreamRedactor {
    pub fn new(redactor: std::sync::Arc<Redactor>) -> StreamRedactor {
        StreamRedactor {
            redactor,
            held: Vec::new(),
        }
    }

    /// What of `piece` (after anything held back) can go out now.
    pub fn push(&mut self, piece: &[u8]) -> Vec<u8> {
        if self.redactor.is_empty() {
            return piece.to_vec();
        }
        self.held.extend_from_slice(piece);
        let window = self
            .redactor
            .window(&self.held, 0..self.held.len(), Ending::Continues);
        self.held.drain(..window.end.min(self.held.len()));
        window.bytes
    }

    /// The stream has ended: what was held back, a value's start replaced.
    pub fn finish(&mut self) -> Vec<u8> {
        let held = std::mem::take(&mut self.held);
        self.redactor
            .window(&held, 0..held.len(), Ending::Final)
            .bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const VALUE: &str = "ghp_0123456789abcdefSECRET";
    const LABEL: &str = "[credential GH]";

    fn redactor() -> Redactor {
        Redactor::new([
            (VALUE.as_bytes().to_vec(), LABEL.to_owned()),
            (b"short-one".to_vec(), "[credential S]".to_owned()),
        ])
    }

    fn show(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).into_owned()
    }

    /// Pages read one after another, each with the longest value's length around it, as the
    /// file and job pages are: whatever the page size, no page holds any piece of the value,
    /// and the pages together hold the rest of the text whole.
    #[test]
    fn consecutive_pages_never_show_a_piece_of_a_value() {
        let r = redactor();
        let text = format!("before {VALUE} middle short-one {VALUE}{VALUE} after");
        let bytes = text.as_bytes();
        let reach = r.longest() - 1;
        for page in 1..=40 {
            let (mut at, mut joined) = (0, Vec::new());
            while at < bytes.len() {
                let lo = at.saturating_sub(reach);
                let hi = (at + page + reach).min(bytes.len());
                let ending = if hi == bytes.len() {
                    Ending::Final
                } else {
                    Ending::Continues
                };
                let w = r.window(&bytes[lo..hi], at - lo..at - lo + page, ending);
                let shown = show(&w.bytes)
                    .replace(LABEL, "|")
                    .replace("[credential S]", "|");
                for piece in VALUE.as_bytes().windows(EDGE_MIN) {
                    let piece = show(piece);
                    assert!(
                        !shown.contains(&piece),
                        "page {page} at {at}: {shown:?} holds {piece:?}"
                    );
                }
                assert!(w.end + lo > at, "page {page} at {at} made no progress");
                joined.extend_from_slice(&w.bytes);
                at = lo + w.end;
            }
            assert_eq!(
                show(&joined),
                format!("before {LABEL} middle [credential S] {LABEL}{LABEL} after"),
                "pages of {page}"
            );
        }
    }

    #[test]
    fn a_page_starting_inside_a_value_starts_with_its_label() {
        let r = redactor();
        let text = format!("ab{VALUE}cd");
        let w = r.window(text.as_bytes(), 5..8, Ending::Final);
        assert_eq!(show(&w.bytes), LABEL);
        assert_eq!(w.end, 2 + VALUE.len());
    }

    #[test]
    fn a_value_begun_at_the_end_waits_while_more_may_come_and_is_replaced_at_the_end() {
        let r = redactor();
        let text = format!("log: {}", &VALUE[..10]);
        let open = r.window(text.as_bytes(), 0..text.len(), Ending::Continues);
        assert_eq!((show(&open.bytes), open.end), ("log: ".to_owned(), 5));
        let closed = r.window(text.as_bytes(), 0..text.len(), Ending::Final);
        assert_eq!(show(&closed.bytes), format!("log: {LABEL}"));
        // Three bytes of a value at the very end are ordinary output.
        let few = r.window(b"log: ghp", 0..8, Ending::Final);
        assert_eq!(show(&few.bytes), "log: ghp");
    }

    /// A value sent in any number of pieces: none of its bytes four or more at a time goes
    /// out, and nothing else is held back past the stream's end.
    #[test]
    fn a_stream_in_pieces_never_lets_a_value_through() {
        let text = format!("one {VALUE} two short-one three {VALUE}");
        for size in 1..=12 {
            let mut stream = StreamRedactor::new(Arc::new(redactor()));
            let mut sent = Vec::new();
            for piece in text.as_bytes().chunks(size) {
                let out = stream.push(piece);
                assert!(!show(&out).contains(&VALUE[..4]), "{size}: {}", show(&out));
                sent.extend(out);
            }
            sent.extend(stream.finish());
            assert_eq!(
                show(&sent),
                format!("one {LABEL} two [credential S] three {LABEL}"),
                "pieces of {size}"
            );
        }
    }

    #[test]
    fn whole_values_are_replaced_longest_first() {
        let r = Redactor::new([
            (b"abcd".to_vec(), "[A]".to_owned()),
            (b"abcdef".to_vec(), "[B]".to_owned()),
        ]);
        assert_eq!(r.text("xabcdefx abcdx").as_deref(), Some("x[B]x [A]x"));
        assert_eq!(r.text("nothing"), None);
        assert_eq!(Redactor::default().bytes(b"abcd"), None);
    }
}
