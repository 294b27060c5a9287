//! A program in a machine behind a PTY, as the local engine offers it: `GET
//! /api/v1/machines/{name}/exec/interactive`, a WebSocket that is not in the OpenAPI (1.32.2's
//! `serve --help` and route table; reference/engine-next-features.md section 3). Query `cmd`,
//! `arg` (repeated, in order), `tty` (true: a PTY, stderr merged), `cols`/`rows`. Binary frames
//! carry stdin one way and output the other; a text frame `{"type":"resize","cols":N,"rows":N}`
//! resizes; the engine ends with a text frame `{"type":"exit","code":N}` and closes. Closing the
//! socket kills the program. Seen on the nested engine: busybox `sh` under it prompts, reads a
//! line, reports `stty size` after a resize, and its `exit 7` arrives as code 7.

use super::error::{ErrorKind, FleetError, FleetResult};
use super::transport::LocalEndpoint;
use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::{self, Message};
use tracing::Instrument as _;

/// What to run, and the PTY's first size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalSpec {
    /// The program and its arguments; the first is looked up on the guest's `PATH`.
    pub argv: Vec<String>,
    pub cols: u16,
    pub rows: u16,
}

/// What the caller sends the program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminalInput {
    Bytes(Vec<u8>),
    Resize { cols: u16, rows: u16 },
}

/// What the program did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminalEvent {
    Output(Vec<u8>),
    /// It exited with this code; nothing follows.
    Exited(i32),
    /// The connection ended without an exit (the machine stopped, the engine went away); why.
    Lost(String),
}

/// An open terminal: input goes in through `input` (dropping it closes the terminal, which
/// ends the program); `events` ends after [`TerminalEvent::Exited`] or [`TerminalEvent::Lost`].
#[derive(Debug)]
pub struct TerminalLink {
    pub input: mpsc::Sender<TerminalInput>,
    pub events: mpsc::Receiver<TerminalEvent>,
}

/// How many inputs wait for the socket, and outputs for their reader, before the other side
/// waits: a program that prints fast is slowed to its reader's pace, never buffered without end.
const CHANNEL_DEPTH: usize = 64;

/// Opens `argv` in `machine` behind a PTY over the engine's interactive exec.
pub async fn open_local(
    endpoint: &LocalEndpoint,
    machine: &str,
    spec: &TerminalSpec,
) -> FleetResult<TerminalLink> {
    let ctx = format!("open a terminal in {machine}");
    let url = interactive_url(endpoint, machine, spec)?;
    let request = tungstenite::client::IntoClientRequest::into_client_request(url.as_str())
        .map_err(|e| FleetError::new(ErrorKind::Invalid, &ctx, e.to_string()))?;
    match endpoint {
        LocalEndpoint::Unix(path) => {
            let stream = tokio::net::UnixStream::connect(path).await;
            upgrade(&ctx, request, stream).await
        }
        LocalEndpoint::Loopback { authority } => {
            let stream = tokio::net::TcpStream::connect(authority.as_str()).await;
            upgrade(&ctx, request, stream).await
        }
    }
}

/// The WebSocket handshake over a connection to the engine, then the pump.
async fn upgrade<S>(
    ctx: &str,
    request: tungstenite::handshake::client::Request,
    stream: std::io::Result<S>,
) -> FleetResult<TerminalLink>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let stream = stream.map_err(|e| unreachable_engine(ctx, &e))?;
    let (socket, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .map_err(|e| handshake_error(ctx, e))?;
    Ok(pump(socket))
}

fn interactive_url(
    endpoint: &LocalEndpoint,
    machine: &str,
    spec: &TerminalSpec,
) -> FleetResult<String> {
    use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
    // RFC 3986's unreserved characters stay as they are (a machine named fz-a is fz-a).
    const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    let Some((program, args)) = spec.argv.split_first() else {
        return Err(FleetError::new(
            ErrorKind::Invalid,
            "open a terminal",
            "no program to run",
        ));
    };
    let host = match endpoint {
        LocalEndpoint::Unix(_) => "smolvm.local",
        LocalEndpoint::Loopback { authority } => authority.as_str(),
    };
    let encode = |s: &str| utf8_percent_encode(s, COMPONENT).to_string();
    let mut url = format!(
        "ws://{host}/api/v1/machines/{}/exec/interactive?cmd={}&tty=true&cols={}&rows={}",
        encode(machine),
        encode(program),
        spec.cols,
        spec.rows
    );
    for arg in args {
        url.push_str("&arg=");
        url.push_str(&encode(arg));
    }
    Ok(url)
}

fn unreachable_engine(ctx: &str, e: &std::io::Error) -> FleetError {
    FleetError::new(
        ErrorKind::Transport,
        ctx,
        format!("the engine could not be reached: {e}"),
    )
}

/// The engine refuses an upgrade as it refuses any request: its status and JSON error body.
fn handshake_error(ctx: &str, e: tungstenite::Error) -> FleetError {
    match e {
        tungstenite::Error::Http(response) => {
            let status = response.status().as_u16();
            let text = response
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            let (message, code) = super::upstream::parse_error_text(&text);
            let mut err = FleetError::new(
                ErrorKind::from_status(status),
                ctx,
                message.unwrap_or_else(|| format!("the engine answered {status}")),
            );
            err.status = Some(status);
            err.upstream_code = code;
            err
        }
        other => FleetError::new(ErrorKind::Transport, ctx, other.to_string()),
    }
}

/// One task moves frames both ways until the program exits, the socket ends, or the caller
/// drops its input (which closes the socket and so ends the program).
fn pump<S>(socket: tokio_tungstenite::WebSocketStream<S>) -> TerminalLink
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (input_tx, mut input_rx) = mpsc::channel::<TerminalInput>(CHANNEL_DEPTH);
    let (events_tx, events_rx) = mpsc::channel::<TerminalEvent>(CHANNEL_DEPTH);
    let pumping = async move {
        let (mut sink, mut stream) = socket.split();
        let end = loop {
            tokio::select! {
                frame = stream.next() => match frame {
                    Some(Ok(Message::Binary(bytes))) => {
                        if events_tx.send(TerminalEvent::Output(bytes.to_vec())).await.is_err() {
                            break None;
                        }
                    }
                    Some(Ok(Message::Text(text))) => {
                        if let Some(code) = exit_code(text.as_str()) {
                            break Some(TerminalEvent::Exited(code));
                        }
                    }
                    Some(Ok(Message::Close(frame))) => {
                        let why = frame.map_or_else(
                            || "the engine closed the terminal without an exit".to_owned(),
                            |f| format!("the engine closed the terminal: {}", f.reason),
                        );
                        break Some(TerminalEvent::Lost(why));
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => break Some(TerminalEvent::Lost(e.to_string())),
                    None => break Some(TerminalEvent::Lost(
                        "the connection to the engine ended".to_owned(),
                    )),
                },
                input = input_rx.recv() => {
                    let message = match input {
                        Some(TerminalInput::Bytes(bytes)) => Message::Binary(bytes.into()),
                        Some(TerminalInput::Resize { cols, rows }) => Message::Text(
                            serde_json::json!({"type": "resize", "cols": cols, "rows": rows})
                                .to_string()
                                .into(),
                        ),
                        // The caller let go: closing the socket ends the program.
                        None => {
                            let _ = sink.send(Message::Close(None)).await;
                            break None;
                        }
                    };
                    if let Err(e) = sink.send(message).await {
                        break Some(TerminalEvent::Lost(e.to_string()));
                    }
                }
            }
        };
        if let Some(end) = end {
            let _ = events_tx.send(end).await;
        }
        let _ = sink.close().await;
    };
    // In the span of the call that opened it: its frames are that call's engine traffic.
    tokio::spawn(pumping.in_current_span());
    TerminalLink {
        input: input_tx,
        events: events_rx,
    }
}

fn exit_code(text: &str) -> Option<i32> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    if value["type"] != "exit" {
        return None;
    }
    value["code"].as_i64().and_then(|c| i32::try_from(c).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_carries_the_program_its_arguments_in_order_and_the_size() {
        let spec = TerminalSpec {
            argv: vec!["sh".into(), "-c".into(), "read a && echo \"$a\"".into()],
            cols: 100,
            rows: 30,
        };
        let url = interactive_url(
            &LocalEndpoint::Loopback {
                authority: "127.0.0.1:8080".into(),
            },
            "m-1",
            &spec,
        )
        .unwrap();
        assert_eq!(
            url,
            "ws://127.0.0.1:8080/api/v1/machines/m-1/exec/interactive?cmd=sh&tty=true&cols=100&rows=30&arg=-c&arg=read%20a%20%26%26%20echo%20%22%24a%22"
        );
        let empty = TerminalSpec {
            argv: vec![],
            cols: 80,
            rows: 24,
        };
        assert!(interactive_url(&LocalEndpoint::Unix("/s".into()), "m", &empty).is_err());
    }

    #[test]
    fn only_an_exit_frame_ends_the_program() {
        assert_eq!(exit_code(r#"{"type":"exit","code":7}"#), Some(7));
        assert_eq!(exit_code(r#"{"type":"stderr","data":"x"}"#), None);
        assert_eq!(exit_code("not json"), None);
    }
}
