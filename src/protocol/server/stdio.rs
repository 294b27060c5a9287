//! The stdio transport boundary: every line the client writes is read and checked here before
//! rmcp sees it, and every line rmcp writes goes out through the one writer this module owns.
//!
//! Why not hand stdin to rmcp directly: rmcp 3.11's `AsyncRwTransport::receive`
//! (`transport/async_rw.rs`) drops input it cannot parse without a word. A line that is not
//! JSON, not UTF-8, has a lone surrogate, NaN, or nests deeper than serde_json's 128 levels is
//! logged at debug and skipped (its rmcp issue #938: "ignore unparsable input"), and a line over
//! its 16 MiB limit is discarded the same way, so a client waiting on that request's id waits
//! forever. Well-formed JSON that does not map onto rmcp's message types gets `-32600` with no id
//! (`ErrorData::invalid_request(.., None)` answered with id `None`), and a `tools/call` whose
//! params do not deserialize falls through rmcp's untagged `ClientRequest` to `CustomRequest`,
//! answered `-32601` "method not found". JSON-RPC 2.0 asks for `-32700` (id null) and `-32600`
//! or `-32602` with the request's id; this module answers those itself and hands rmcp only the
//! messages it will take, already parsed (rmcp's Sink/Stream transport), and writes rmcp's
//! messages itself, serialized once, so a page of a file is not copied through a pipe and split
//! into lines again on its way out.
//!
//! Backpressure: rmcp keeps reading while its answers wait, each in a task of its own for the
//! stdout lock, so a client that writes requests and never reads its answers would grow the
//! process without bound. Each request handed to rmcp holds a permit until its answer is
//! written (or the client cancels it); while `stdioMaxPendingRequests` are held, stdin is not
//! read, so the client's own writes block instead.

use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, JsonRpcRequest, RequestId,
    ServerJsonRpcMessage,
};
use rmcp::{ServerHandler, ServiceExt};
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The longest line accepted, its newline included: rmcp's own `DEFAULT_MAX_LINE_LENGTH`, so a
/// line forwarded to rmcp is never one rmcp discards.
pub const MAX_LINE: usize = 16 * 1024 * 1024;

/// How much of a refused over-long line is kept to look for its id.
const ID_PREFIX: usize = 64 * 1024;

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const INVALID_PARAMS: i64 = -32602;

/// The methods this server implements (`SmolMcp`): one of them whose params rmcp cannot read
/// becomes rmcp's `CustomRequest`, which it answers "method not found"; the params are what is
/// wrong, so it is answered `-32602` here.
/// Only the methods rmcp models and this server declares: an unknown or undeclared method is
/// still "method not found".
const SERVED_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "server/discover",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "subscriptions/listen",
    "completion/complete",
    "logging/setLevel",
    "prompts/list",
    "prompts/get",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
];

/// What to do with one line from the client.
#[derive(Debug)]
pub enum Verdict {
    /// Hand it to rmcp, parsed in its own model.
    Forward(Box<ClientJsonRpcMessage>),
    /// Answer this JSON-RPC error and do not forward the line.
    Reply(Value),
    /// Neither: an empty line, or a malformed notification (JSON-RPC 2.0 answers no
    /// notification, not even with an error).
    Ignore,
}

/// A JSON-RPC error response.
pub fn error_response(id: Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

/// Checks one line (its `\n` already removed) as a JSON-RPC 2.0 message for this server.
pub fn check_line(line: &[u8]) -> Verdict {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    // rmcp strips a UTF-8 byte order mark too; some Windows clients send one.
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    // rmcp skips empty lines; whitespace alone is no message either.
    if line.iter().all(u8::is_ascii_whitespace) {
        return Verdict::Ignore;
    }
    let Ok(text) = std::str::from_utf8(line) else {
        return Verdict::Reply(error_response(
            Value::Null,
            PARSE_ERROR,
            "Parse error: the line is not UTF-8",
        ));
    };
    // serde_json refuses lone surrogates, NaN and nesting deeper than 128 as syntax errors.
    let value: Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(e) => {
            return Verdict::Reply(error_response(
                Value::Null,
                PARSE_ERROR,
                format!("Parse error: {e}"),
            ));
        }
    };
    let message = match value {
        Value::Object(message) => message,
        Value::Array(_) => {
            return Verdict::Reply(error_response(
                Value::Null,
                INVALID_REQUEST,
                "Invalid Request: batches are not part of MCP 2025-11-25; send one message per line",
            ));
        }
        _ => {
            return Verdict::Reply(error_response(
                Value::Null,
                INVALID_REQUEST,
                "Invalid Request: a JSON-RPC message is an object",
            ));
        }
    };
    match check_message(&message, text) {
        Ok(parsed) => Verdict::Forward(Box::new(parsed)),
        Err(refusal) => refusal.into_verdict(&message),
    }
}

/// Why a well-formed JSON object is not passed on.
struct Refusal {
    code: i64,
    message: String,
}

impl Refusal {
    fn invalid(message: impl Into<String>) -> Refusal {
        Refusal {
            code: INVALID_REQUEST,
            message: format!("Invalid Request: {}", message.into()),
        }
    }

    fn params(message: impl Into<String>) -> Refusal {
        Refusal {
            code: INVALID_PARAMS,
            message: format!("Invalid params: {}", message.into()),
        }
    }

    fn into_verdict(self, message: &Map<String, Value>) -> Verdict {
        let id = message.get("id");
        // A notification is a request without an id (JSON-RPC 2.0 section 4.1); it is never
        // answered, even when it is wrong. Anything else without a usable id is answered with
        // id null (section 5).
        if id.is_none() && message.get("method").is_some_and(Value::is_string) {
            tracing::info!(error = %self.message, "ignored a malformed notification");
            return Verdict::Ignore;
        }
        let id = match id {
            Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
            _ => Value::Null,
        };
        tracing::info!(%id, error = %self.message, "refused a message");
        Verdict::Reply(error_response(id, self.code, self.message))
    }
}

fn check_message(
    message: &Map<String, Value>,
    text: &str,
) -> Result<ClientJsonRpcMessage, Refusal> {
    if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(Refusal::invalid("\"jsonrpc\" must be \"2.0\""));
    }
    match message.get("id") {
        None | Some(Value::String(_) | Value::Number(_)) => {}
        Some(_) => return Err(Refusal::invalid("\"id\" must be a string or a number")),
    }
    match message.get("method") {
        Some(Value::String(method)) => check_request(method, message)?,
        Some(_) => return Err(Refusal::invalid("\"method\" must be a string")),
        None => {
            // A response to a request of the server's (rmcp matches it to its request).
            let has = |key| message.contains_key(key);
            if !message.contains_key("id") || has("result") == has("error") {
                return Err(Refusal::invalid(
                    "a message has a \"method\", or an \"id\" and one of \"result\" or \"error\"",
                ));
            }
        }
    }
    // The rest of the shape is rmcp's model. Asked here, so that what rmcp would answer with
    // -32600 and no id (or "method not found") is answered with the request's id.
    match serde_json::from_str::<ClientJsonRpcMessage>(text) {
        Ok(ClientJsonRpcMessage::Request(JsonRpcRequest {
            request: ClientRequest::CustomRequest(custom),
            ..
        })) if SERVED_METHODS.contains(&custom.method.as_str()) => Err(Refusal::params(format!(
            "the params of {} do not have the shape MCP 2025-11-25 gives them",
            custom.method
        ))),
        Ok(parsed) => Ok(parsed),
        Err(e) => Err(Refusal::invalid(e.to_string())),
    }
}

/// The checks rmcp's model does not make, or makes by falling back to "method not found".
fn check_request(method: &str, message: &Map<String, Value>) -> Result<(), Refusal> {
    // `params: null` is read by rmcp as no params; it is kept that way for the clients that
    // send it.
    let params = match message.get("params") {
        None | Some(Value::Null) => None,
        Some(Value::Object(params)) => Some(params),
        Some(_) => return Err(Refusal::invalid("\"params\" must be an object")),
    };
    if method == "tools/call" {
        let Some(params) = params else {
            return Err(Refusal::params(
                "tools/call needs params with the tool's \"name\"",
            ));
        };
        if !params.get("name").is_some_and(Value::is_string) {
            return Err(Refusal::params(
                "tools/call needs a string \"name\" in its params",
            ));
        }
        match params.get("arguments") {
            None | Some(Value::Null | Value::Object(_)) => {}
            Some(_) => {
                return Err(Refusal::params(
                    "the \"arguments\" of tools/call must be an object",
                ));
            }
        }
    }
    Ok(())
}

/// The id of a line too long to read, if its first bytes hold one (`{"jsonrpc":"2.0","id":7,..`
/// usually does): the client then learns which request was refused.
pub fn id_in_prefix(prefix: &[u8]) -> Value {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    struct Seek<'a>(&'a mut Value);
    impl<'de> Visitor<'de> for Seek<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON-RPC message")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<String>()? {
                if key == "id" {
                    let id: Value = map.next_value()?;
                    if id.is_string() || id.is_number() {
                        *self.0 = id;
                    }
                    return Ok(());
                }
                map.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }
    let mut id = Value::Null;
    // The prefix ends mid-message, so the parse ends in an error; the id is kept if it was seen.
    let _ = serde_json::Deserializer::from_slice(prefix).deserialize_map(Seek(&mut id));
    id
}

/// One line read from the client, bounded by `MAX_LINE`.
enum Read {
    /// A whole line is in the buffer, its `\n` included.
    Line,
    /// The line was longer than `MAX_LINE`; the buffer holds its first `ID_PREFIX` bytes and the
    /// rest was discarded up to its newline.
    TooLong,
    /// The client closed stdin (or reading failed, which rmcp also treats as the end). A last
    /// line without a newline is dropped, as rmcp drops it.
    End,
}

struct LineReader<R> {
    read: BufReader<R>,
    line: Vec<u8>,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    /// Not `read_until`, which grows its buffer until the newline comes: the length is checked
    /// before each append, and an over-long line is discarded as it arrives.
    async fn next(&mut self) -> Read {
        self.line.clear();
        let mut length = 0usize;
        let mut too_long = false;
        loop {
            let available = match self.read.fill_buf().await {
                Ok(available) => available,
                Err(e) => {
                    tracing::error!(error = %e, "reading stdin failed");
                    return Read::End;
                }
            };
            if available.is_empty() {
                return Read::End;
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |at| at + 1);
            length = length.saturating_add(take);
            if !too_long && length > MAX_LINE {
                too_long = true;
                self.line.truncate(ID_PREFIX);
            }
            let keep = if too_long {
                take.min(ID_PREFIX.saturating_sub(self.line.len()))
            } else {
                take
            };
            self.line.extend_from_slice(&available[..keep]);
            self.read.consume(take);
            if newline.is_some() {
                return if too_long { Read::TooLong } else { Read::Line };
            }
        }
    }
}

/// stdout, shared by rmcp's messages and this module's answers: each line is written whole
/// under the lock and flushed, so the two never interleave.
type Output<W> = std::sync::Arc<tokio::sync::Mutex<W>>;

async fn write_line<W: AsyncWrite + Unpin>(output: &Output<W>, line: &[u8]) -> std::io::Result<()> {
    let mut output = output.lock().await;
    output.write_all(line).await?;
    output.flush().await
}

/// The requests rmcp has and has not answered yet, each with its permit.
struct Pending {
    permits: Arc<Semaphore>,
    held: std::sync::Mutex<HashMap<String, OwnedSemaphorePermit>>,
}

impl Pending {
    fn new(max: usize) -> Pending {
        Pending {
            permits: Arc::new(Semaphore::new(max.max(1))),
            held: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn key(id: &RequestId) -> String {
        serde_json::to_string(id).unwrap_or_default()
    }

    fn hold(&self, id: &RequestId, permit: OwnedSemaphorePermit) {
        if let Ok(mut held) = self.held.lock() {
            // A reused id replaces the older entry; its permit goes back.
            held.insert(Pending::key(id), permit);
        }
    }

    fn release(&self, id: &RequestId) {
        if let Ok(mut held) = self.held.lock() {
            held.remove(&Pending::key(id));
        }
    }

    /// What a message handed to rmcp does to the count: a request takes `spare`; a
    /// cancellation gives its request's permit back, since rmcp drops the cancelled request's
    /// answer and nothing would be written to release it.
    fn forwarded(&self, message: &ClientJsonRpcMessage, spare: &mut Option<OwnedSemaphorePermit>) {
        match message {
            ClientJsonRpcMessage::Request(request) => {
                if let Some(permit) = spare.take() {
                    self.hold(&request.id, permit);
                }
            }
            ClientJsonRpcMessage::Notification(notification) => {
                if let ClientNotification::CancelledNotification(cancelled) =
                    &notification.notification
                    && let Some(id) = &cancelled.params.request_id
                {
                    self.release(id);
                }
            }
            _ => {}
        }
    }

    /// An answer was written: its request's permit goes back.
    fn answered(&self, message: &ServerJsonRpcMessage) {
        match message {
            ServerJsonRpcMessage::Response(response) => self.release(&response.id),
            ServerJsonRpcMessage::Error(error) => {
                if let Some(id) = &error.id {
                    self.release(id);
                }
            }
            _ => {}
        }
    }
}

/// The reading side's state between messages.
struct Incoming<R, W> {
    reader: LineReader<R>,
    output: Output<W>,
    pending: Arc<Pending>,
    /// The permit taken before the next line is read; a line that is no request leaves it for
    /// the one after.
    spare: Option<OwnedSemaphorePermit>,
}

/// The client's next message for rmcp: bad lines in between are answered here and skipped.
/// rmcp's own receive loop drives this, so a line reaches rmcp with no task in between. No line
/// is read until a request may be taken on (a permit is free).
async fn next_message<R, W>(incoming: &mut Incoming<R, W>) -> Option<ClientJsonRpcMessage>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        if incoming.spare.is_none() {
            let permits = incoming.pending.permits.clone();
            let permit = match permits.clone().try_acquire_owned() {
                Ok(permit) => permit,
                Err(_) => {
                    tracing::debug!(
                        "stdioMaxPendingRequests answers not yet written: not reading stdin until the client takes some"
                    );
                    permits.acquire_owned().await.ok()?
                }
            };
            incoming.spare = Some(permit);
        }
        let (reader, output) = (&mut incoming.reader, &incoming.output);
        let verdict = match reader.next().await {
            // rmcp ends the session when its input ends, as it did at stdin's EOF.
            Read::End => return None,
            Read::Line => check_line(reader.line.strip_suffix(b"\n").unwrap_or(&reader.line)),
            Read::TooLong => {
                let id = id_in_prefix(&reader.line);
                tracing::info!(%id, "refused a line longer than 16 MiB");
                Verdict::Reply(error_response(
                    id,
                    INVALID_REQUEST,
                    format!("Invalid Request: the line is longer than {MAX_LINE} bytes"),
                ))
            }
        };
        match verdict {
            Verdict::Forward(message) => {
                incoming.pending.forwarded(&message, &mut incoming.spare);
                return Some(*message);
            }
            Verdict::Reply(answer) => {
                let mut line = answer.to_string().into_bytes();
                line.push(b'\n');
                if let Err(e) = write_line(output, &line).await {
                    tracing::error!(error = %e, "writing stdout failed");
                    return None;
                }
            }
            Verdict::Ignore => {}
        }
    }
}

/// Serves one MCP session on the process's stdin and stdout; ends when the client closes stdin
/// (or the session ends otherwise), after rmcp's last answers are written. At most
/// `max_pending` requests are taken on before their answers are written.
pub async fn serve_stdio<S: ServerHandler>(server: S, max_pending: usize) {
    let (stdin, stdout) = rmcp::transport::stdio_pipes();
    serve(server, stdin, stdout, max_pending).await;
}

/// `serve_stdio` on any byte streams.
pub async fn serve<S, R, W>(server: S, input: R, output: W, max_pending: usize)
where
    S: ServerHandler,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let output: Output<W> = std::sync::Arc::new(tokio::sync::Mutex::new(output));
    let pending = Arc::new(Pending::new(max_pending));
    let reader = Incoming {
        reader: LineReader {
            read: BufReader::new(input),
            line: Vec::new(),
        },
        output: output.clone(),
        pending: pending.clone(),
        spare: None,
    };
    let incoming = Box::pin(futures::stream::unfold(reader, |mut reader| async move {
        let message = next_message(&mut reader).await?;
        Some((message, reader))
    }));
    // Each of rmcp's messages, serialized once, written whole. A failed write is logged and
    // not returned: `sink::unfold` panics when it is used again after an error, and rmcp goes
    // on sending; a client that closed stdout closes stdin too, which ends the session.
    let outgoing = Box::pin(futures::sink::unfold(
        (output, pending),
        |(output, pending), message: ServerJsonRpcMessage| async move {
            match serde_json::to_vec(&message) {
                Ok(mut line) => {
                    line.push(b'\n');
                    if let Err(e) = write_line(&output, &line).await {
                        tracing::debug!(error = %e, "writing stdout failed; the answer is lost");
                    }
                }
                Err(e) => tracing::error!(error = %e, "an answer could not be serialized"),
            }
            pending.answered(&message);
            Ok::<_, std::io::Error>((output, pending))
        },
    ));
    match server.serve((outgoing, incoming)).await {
        Ok(running) => {
            let _ = running.waiting().await;
        }
        Err(e) => tracing::info!(error = %e, "the client went away before the session started"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(line: &str) -> Value {
        match check_line(line.as_bytes()) {
            Verdict::Reply(answer) => answer,
            other => panic!("{line}: {other:?}"),
        }
    }

    fn code_and_id(line: &str) -> (i64, Value) {
        let answer = reply(line);
        (
            answer["error"]["code"].as_i64().unwrap_or_default(),
            answer["id"].clone(),
        )
    }

    #[test]
    fn bad_json_is_a_parse_error_with_id_null() {
        let deep = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{{\"x\":{}{}}}}}",
            "[".repeat(129),
            "]".repeat(129)
        );
        for line in [
            "garbage",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list""#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"s":"\ud800"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"n":NaN}}"#,
            &deep,
        ] {
            assert_eq!(code_and_id(line), (PARSE_ERROR, Value::Null), "{line}");
        }
        let Verdict::Reply(answer) = check_line(b"{\"id\":1,\"s\":\"\xff\"}") else {
            panic!("not UTF-8")
        };
        assert_eq!(answer["error"]["code"], PARSE_ERROR);
    }

    #[test]
    fn nesting_up_to_serde_json_s_limit_passes() {
        // serde_json's limit admits 127 levels; the message and its params are two of them.
        let depth = 125;
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{{\"x\":{}{}}}}}",
            "[".repeat(depth),
            "]".repeat(depth)
        );
        let v = check_line(line.as_bytes());
        assert!(matches!(v, Verdict::Forward(_)), "{v:?}");
    }

    #[test]
    fn invalid_requests_carry_their_id_when_it_can_be_read() {
        for (line, code, id) in [
            ("[]", INVALID_REQUEST, Value::Null),
            (
                r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
                INVALID_REQUEST,
                Value::Null,
            ),
            ("5", INVALID_REQUEST, Value::Null),
            (
                r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":[1]}"#,
                INVALID_REQUEST,
                json!(3),
            ),
            (
                r#"{"jsonrpc":"1.0","id":"a","method":"ping"}"#,
                INVALID_REQUEST,
                json!("a"),
            ),
            (
                r#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#,
                INVALID_REQUEST,
                Value::Null,
            ),
            (
                r#"{"jsonrpc":"2.0","method":1,"params":"bar"}"#,
                INVALID_REQUEST,
                Value::Null,
            ),
            (r#"{"jsonrpc":"2.0","id":4}"#, INVALID_REQUEST, json!(4)),
            (
                r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
                INVALID_REQUEST,
                json!(1.5),
            ),
            (
                r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"x","arguments":[]}}"#,
                INVALID_PARAMS,
                json!(5),
            ),
            (
                r#"{"jsonrpc":"2.0","id":6,"method":"tools/call"}"#,
                INVALID_PARAMS,
                json!(6),
            ),
            (
                r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"arguments":{}}}"#,
                INVALID_PARAMS,
                json!(7),
            ),
            (
                r#"{"jsonrpc":"2.0","id":8,"method":"initialize","params":{"capabilities":[]}}"#,
                INVALID_PARAMS,
                json!(8),
            ),
            (
                r#"{"jsonrpc":"2.0","id":9,"method":"resources/read","params":{"uri":7}}"#,
                INVALID_PARAMS,
                json!(9),
            ),
            (
                r#"{"jsonrpc":"2.0","id":10,"method":"resources/read","params":{}}"#,
                INVALID_PARAMS,
                json!(10),
            ),
            (
                r#"{"jsonrpc":"2.0","id":11,"method":"logging/setLevel","params":{"level":"loud"}}"#,
                INVALID_PARAMS,
                json!(11),
            ),
            (
                r#"{"jsonrpc":"2.0","id":12,"method":"resources/subscribe","params":{"uri":[]}}"#,
                INVALID_PARAMS,
                json!(12),
            ),
        ] {
            assert_eq!(code_and_id(line), (code, id), "{line}");
        }
    }

    #[test]
    fn notifications_and_blank_lines_get_no_answer_and_good_lines_pass() {
        for line in [
            "",
            "  \r",
            r#"{"jsonrpc":"2.0","method":"notifications/initialized","params":5}"#,
            r#"{"jsonrpc":"1.0","method":"notifications/cancelled"}"#,
        ] {
            assert!(
                matches!(check_line(line.as_bytes()), Verdict::Ignore),
                "{line}"
            );
        }
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":null}"#,
            r#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"list-machines"}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":9,"result":{}}"#,
            "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\r",
        ] {
            assert!(
                matches!(check_line(line.as_bytes()), Verdict::Forward(_)),
                "{line}"
            );
        }
    }

    #[test]
    fn the_id_of_an_over_long_line_is_found_in_its_first_bytes() {
        assert_eq!(
            id_in_prefix(br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"na"#),
            json!(42)
        );
        assert_eq!(
            id_in_prefix(br#"{"jsonrpc":"2.0","method":"x","params":{"a":"#),
            Value::Null
        );
        assert_eq!(id_in_prefix(b"garbage"), Value::Null);
    }
}
