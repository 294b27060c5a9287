//! Fitting command output into a tool result: each stream keeps its head and its tail within a
//! byte budget, and says how much fell between.

/// One stream, shaped for the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shaped {
    pub text: String,
    /// Bytes left out of `text`.
    pub dropped: usize,
}

fn is_continuation(b: u8) -> bool {
    b & 0b1100_0000 == 0b1000_0000
}

/// Every string in `value` (objects and arrays walked) that `rewrite` answers for, replaced by
/// its answer: a redaction of a JSON answer that must not see a value's escaped form (a quote
/// or a backslash in it) where the text of the whole document would.
pub fn rewrite_strings(value: &mut serde_json::Value, rewrite: &impl Fn(&str) -> Option<String>) {
    match value {
        serde_json::Value::String(text) => {
            if let Some(new) = rewrite(text) {
                *text = new;
            }
        }
        serde_json::Value::Array(items) => {
            items.iter_mut().for_each(|v| rewrite_strings(v, rewrite))
        }
        serde_json::Value::Object(fields) => fields
            .values_mut()
            .for_each(|v| rewrite_strings(v, rewrite)),
        _ => {}
    }
}

/// Keeps two thirds of the budget from the head and the rest from the tail, cutting at UTF-8
/// character boundaries so no character is split (for text; binary output is rendered lossily).
pub fn head_tail(bytes: &[u8], budget: usize) -> Shaped {
    if bytes.len() <= budget {
        return Shaped {
            text: String::from_utf8_lossy(bytes).into_owned(),
            dropped: 0,
        };
    }
    let mut head = (budget * 2 / 3).max(1).min(bytes.len());
    let mut tail_start = bytes.len() - budget.saturating_sub(head).min(bytes.len() - head);
    // Back off at most three bytes to a boundary, so a multi-byte character is kept whole or left out.
    for _ in 0..3 {
        if head > 0 && head < bytes.len() && is_continuation(bytes[head]) {
            head -= 1;
        }
        if tail_start < bytes.len() && is_continuation(bytes[tail_start]) {
            tail_start += 1;
        }
    }
    let dropped = tail_start - head;
    Shaped {
        text: format!(
            "{}\n[... {dropped} bytes dropped ...]\n{}",
            String::from_utf8_lossy(&bytes[..head]),
            String::from_utf8_lossy(&bytes[tail_start..])
        ),
        dropped,
    }
}

/// The bytes of a UTF-8 text that fit in `budget`, ending on a character boundary.
pub fn utf8_prefix_len(bytes: &[u8], budget: usize) -> usize {
    if bytes.len() <= budget {
        return bytes.len();
    }
    let mut end = budget;
    while end > 0 && is_continuation(bytes[end]) {
        end -= 1;
    }
    end
}

/// The length of `bytes` without a character cut at its end (one whose continuation bytes are
/// still to come), so a chunk of a stream read while it is written never splits one.
pub fn complete_utf8_len(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=3.min(n) {
        let b = bytes[n - back];
        if b & 0b1100_0000 == 0b1000_0000 {
            continue;
        }
        let needed = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if needed > back { n - back } else { n };
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_output_is_untouched() {
        assert_eq!(
            head_tail(b"hello", 5),
            Shaped {
                text: "hello".into(),
                dropped: 0
            }
        );
    }

    #[test]
    fn large_output_keeps_head_and_tail() {
        let input = format!("START{}END", "x".repeat(90));
        let shaped = head_tail(input.as_bytes(), 12);
        assert_eq!(shaped.text, "STARTxxx\n[... 86 bytes dropped ...]\nxEND");
        assert_eq!(shaped.dropped, 86);
    }

    #[test]
    fn cuts_never_split_a_character() {
        // "é" is two bytes; a cut through it moves to a boundary.
        let input = "aé".repeat(20);
        let shaped = head_tail(input.as_bytes(), 10);
        assert!(!shaped.text.contains('\u{FFFD}'), "{}", shaped.text);
        let kept = shaped.text.replace(
            &format!("\n[... {} bytes dropped ...]\n", shaped.dropped),
            "",
        );
        assert_eq!(kept.len() + shaped.dropped, input.len());
        assert_eq!(utf8_prefix_len("aé".as_bytes(), 2), 1);
    }
}
