//! Streamed exec on both fleets: the server-sent events of local
//! `POST /api/v1/machines/{id}/exec/stream` and cloud `POST /v1/machines/{id}/exec/stream`,
//! read as they arrive, each piece of output handed on at once and the whole kept for the
//! result.
//!
//! Both speak the same frames: `event: stdout` / `event: stderr` with the output as plain text
//! (not base64), then `event: exit` with `{"exitCode":N}` or `event: error` with a message,
//! after which the body ends (smolvm 1.32.2 src/api/handlers/exec.rs `exec_stream`; the cloud's
//! in reference/cloud-api-facts.md 3.7 and the Rust client's `SseEvents`).

use super::error::{ErrorKind, FleetError, FleetResult};
use super::model::{ExecOutput, OutputChunk, OutputSender, OutputStream};
use bytes::Bytes;
use futures::{Stream, StreamExt};

/// One server-sent event: its type and its data lines, joined as [`SseParser`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

/// A server-sent-event parser fed the body as it arrives, in chunks cut anywhere.
///
/// Lines end at LF, CR or CR LF, as the SSE format says. CR matters: axum's `Event::data`
/// (which the local engine uses, axum 0.8.9 `EventDataWriter::write_buf`) starts a new `data:`
/// line after every `\r` as well as every `\n`, so output holding a CR is only read right by a
/// parser that ends lines there too. Lines are decoded only once whole, so a character whose
/// bytes arrive in two chunks is never broken.
///
/// The data lines of an event are joined by what ended them: a lone CR by a CR, an LF or a
/// CR LF by an LF. The SSE format joins them all with LF; the engine's axum writes each CR or
/// LF of the output itself as the end of a data line, so joining by the ending it wrote gives
/// back the output byte for byte (`"a\r\nb"` arrives as `data: a\r`, `data: \n`, `data: b`).
/// A CR LF is never such an ending (axum follows each with `data: `), nor is a lone CR on the
/// cloud, whose own client ends lines only at LF and CR LF.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    /// The last byte fed was a CR: an LF right after it ends nothing more.
    after_cr: bool,
    event: String,
    data: String,
    has_data: bool,
    /// What ended the event's last data line, to join the next one with.
    data_line_end: char,
}

impl SseParser {
    /// Feeds `bytes` and answers the events they completed.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut done = Vec::new();
        for &byte in bytes {
            let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
            match byte {
                // The CR before it ended the line: the line's ending was a CR LF.
                b'\n' if after_cr => self.data_line_end = '\n',
                b'\n' | b'\r' => {
                    let end = byte as char;
                    let line = std::mem::take(&mut self.line);
                    if let Some(event) = self.line_ended(&line, end) {
                        done.push(event);
                    }
                }
                _ => self.line.push(byte),
            }
        }
        done
    }

    fn line_ended(&mut self, line: &[u8], end: char) -> Option<SseEvent> {
        if line.is_empty() {
            // A blank line dispatches the event; one without data is no event at all.
            let event = std::mem::take(&mut self.event);
            let data = std::mem::take(&mut self.data);
            if !std::mem::take(&mut self.has_data) {
                return None;
            }
            return Some(SseEvent {
                event: if event.is_empty() {
                    "message".to_owned()
                } else {
                    event
                },
                data,
            });
        }
        // A comment: the keep-alive axum sends every 15 s.
        if line[0] == b':' {
            return None;
        }
        let text = String::from_utf8_lossy(line);
        let (field, value) = match text.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (text.as_ref(), ""),
        };
        match field {
            "event" => self.event = value.to_owned(),
            "data" => {
                if std::mem::replace(&mut self.has_data, true) {
                    self.data.push(self.data_line_end);
                }
                self.data.push_str(value);
                self.data_line_end = end;
            }
            _ => {}
        }
        None
    }
}

/// Reads an exec stream to its end: every stdout or stderr piece goes to `output` as it comes
/// and into the result; `exit` ends it with the command's code, `error` with a failure.
///
/// Closing the stream (dropping this future) does not end the command on either fleet: the
/// engine ignores the failed send and its agent runs the command on (notes on exec.rs), so a
/// cancelled caller has to kill it another way.
pub async fn read_exec_stream<S, E>(
    context: &str,
    body: S,
    output: &OutputSender,
    transport: impl Fn(&E) -> FleetError,
) -> FleetResult<ExecOutput>
where
    S: Stream<Item = Result<Bytes, E>>,
{
    let mut body = std::pin::pin!(body);
    let mut parser = SseParser::default();
    let mut result = ExecOutput {
        exit_code: 0,
        stdout: Vec::new(),
        stderr: Vec::new(),
        stdout_cut_upstream: false,
        stderr_cut_upstream: false,
    };
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| transport(&e))?;
        for event in parser.feed(&chunk) {
            let stream = match event.event.as_str() {
                "stdout" => OutputStream::Stdout,
                "stderr" => OutputStream::Stderr,
                "exit" => {
                    result.exit_code = exit_code(&event.data).ok_or_else(|| {
                        FleetError::new(
                            ErrorKind::BadResponse,
                            context,
                            format!(
                                "the exit frame carries no exit code: {}",
                                super::upstream::snippet(&event.data, 200)
                            ),
                        )
                    })?;
                    return Ok(result);
                }
                "error" => return Err(stream_error(context, &event.data)),
                // Nothing else is sent today; a newer engine's extra frames are not output.
                _ => continue,
            };
            if event.data.is_empty() {
                continue;
            }
            match stream {
                OutputStream::Stdout => result.stdout.extend_from_slice(event.data.as_bytes()),
                OutputStream::Stderr => result.stderr.extend_from_slice(event.data.as_bytes()),
            }
            // The receiver may be gone (a caller that stopped listening): the result still
            // needs the rest.
            let _ = output.send(OutputChunk {
                stream,
                text: event.data,
            });
        }
    }
    Err(FleetError::new(
        ErrorKind::Transport,
        context,
        "the output stream ended before the command's exit: the command may still be running \
         in the guest",
    ))
}

fn exit_code(data: &str) -> Option<i32> {
    #[derive(serde::Deserialize)]
    struct Exit {
        #[serde(rename = "exitCode")]
        exit_code: i32,
    }
    serde_json::from_str::<Exit>(data).ok().map(|e| e.exit_code)
}

/// The engine writes its error frame as `{"message":"<msg>"}` without escaping the message
/// (`format!` in exec.rs), so a message holding a quote or a backslash is not JSON; the cloud
/// sends plain text. All three read as the message.
fn stream_error(context: &str, data: &str) -> FleetError {
    #[derive(serde::Deserialize)]
    struct Message {
        message: String,
    }
    let message = match serde_json::from_str::<Message>(data) {
        Ok(m) => m.message,
        Err(_) => data
            .strip_prefix("{\"message\":\"")
            .and_then(|rest| rest.strip_suffix("\"}"))
            .unwrap_or(data)
            .to_owned(),
    };
    // The local agent's cap on a streamed exec: "streaming output exceeded 11534336 byte cap;
    // exec terminated (output truncated)" (smolvm src/agent/client.rs,
    // `MAX_STREAMING_EXEC_OUTPUT`; the string is in the 1.32.2 binary).
    let message = if message.contains("byte cap") {
        format!(
            "the command's output passed the engine's cap on a streamed exec and the command was \
             ended (the engine: {message}). Send the output to a file in the machine \
             (`... > /tmp/out.txt 2>&1`) and page through it with read-file"
        )
    } else {
        message
    };
    FleetError::new(ErrorKind::Upstream, context, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut parser = SseParser::default();
        chunks.iter().flat_map(|c| parser.feed(c)).collect()
    }

    fn ev(event: &str, data: &str) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
        }
    }

    #[test]
    fn axum_framing_of_newlines_and_carriage_returns() {
        // What axum writes for the data "a\n": the newline starts an empty data line.
        assert_eq!(
            events(&[b"event: stdout\ndata: a\ndata: \n\n"]),
            vec![ev("stdout", "a\n")]
        );
        // "a\r\nb": CR and LF each end a data line, and come back as they were.
        assert_eq!(
            events(&[b"event: stdout\ndata: a\rdata: \ndata: b\n\n"]),
            vec![ev("stdout", "a\r\nb")]
        );
        // A progress bar's bare CRs.
        assert_eq!(
            events(&[b"event: stdout\ndata: 10%\rdata: 90%\rdata: \n\n"]),
            vec![ev("stdout", "10%\r90%\r")]
        );
        // CR LF line ends (the cloud may send them) end one line, not two.
        assert_eq!(
            events(&[b"event: exit\r\ndata: {\"exitCode\":3}\r\n\r\n"]),
            vec![ev("exit", "{\"exitCode\":3}")]
        );
    }

    #[test]
    fn chunks_cut_anywhere_keep_characters_and_line_ends_whole() {
        let frame = "event: stdout\r\ndata: h\u{e9}llo \u{1f600}\r\ndata: \r\n\r\n".as_bytes();
        for cut in 1..frame.len() {
            let (a, b) = frame.split_at(cut);
            assert_eq!(
                events(&[a, b]),
                vec![ev("stdout", "h\u{e9}llo \u{1f600}\n")],
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn comments_and_dataless_events_are_skipped() {
        assert_eq!(
            events(&[b":\n\nevent: stderr\n\n: keep-alive\nevent: stderr\ndata: x\n\n"]),
            vec![ev("stderr", "x")]
        );
    }

    #[test]
    fn error_frames_read_whatever_their_escaping() {
        assert_eq!(
            stream_error("c", r#"{"message":"agent gone"}"#).message,
            "agent gone"
        );
        assert_eq!(
            stream_error("c", r#"{"message":"bad "quoted" path \x"}"#).message,
            r#"bad "quoted" path \x"#
        );
        assert_eq!(stream_error("c", "plain words").message, "plain words");
        let capped = stream_error(
            "c",
            r#"{"message":"streaming output exceeded 11534336 byte cap; exec terminated (output truncated)"}"#,
        );
        assert!(capped.message.contains("read-file"), "{capped:?}");
    }

    fn body(frames: &[&str]) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> {
        let chunks: Vec<_> = frames
            .iter()
            .map(|f| Ok(Bytes::copy_from_slice(f.as_bytes())))
            .collect();
        futures::stream::iter(chunks)
    }

    #[tokio::test]
    async fn a_stream_is_read_to_its_exit_and_each_piece_handed_on() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let out = read_exec_stream(
            "exec in m",
            body(&[
                "event: stdout\ndata: one\ndata: \n\n",
                "event: stderr\ndata: warn\ndata: \n\n",
                "event: stdout\ndata: two\n\nevent: exit\ndata: {\"exitCode\":7}\n\n",
            ]),
            &tx,
            |_| unreachable_error(),
        )
        .await
        .unwrap();
        assert_eq!(out.exit_code, 7);
        assert_eq!(out.stdout, b"one\ntwo");
        assert_eq!(out.stderr, b"warn\n");
        let mut got = Vec::new();
        while let Ok(c) = rx.try_recv() {
            got.push((c.stream, c.text));
        }
        assert_eq!(
            got,
            vec![
                (OutputStream::Stdout, "one\n".to_owned()),
                (OutputStream::Stderr, "warn\n".to_owned()),
                (OutputStream::Stdout, "two".to_owned()),
            ]
        );
    }

    #[tokio::test]
    async fn an_error_frame_or_a_cut_body_is_a_failure() {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let failed = read_exec_stream(
            "exec in m",
            body(&[
                "event: stdout\ndata: a\n\nevent: error\ndata: {\"message\":\"vsock: reset\"}\n\n",
            ]),
            &tx,
            |_| unreachable_error(),
        )
        .await
        .unwrap_err();
        assert_eq!(failed.message, "vsock: reset");
        let cut = read_exec_stream(
            "exec in m",
            body(&["event: stdout\ndata: a\n\n"]),
            &tx,
            |_| unreachable_error(),
        )
        .await
        .unwrap_err();
        assert_eq!(cut.kind, ErrorKind::Transport);
        assert!(cut.message.contains("may still be running"), "{cut:?}");
    }

    fn unreachable_error() -> FleetError {
        FleetError::new(
            ErrorKind::Transport,
            "t",
            "no transport error in these tests",
        )
    }
}
