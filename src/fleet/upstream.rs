//! Turning what upstream answered into a `FleetError`, and bounding each call in time.

use super::error::{ErrorKind, FleetError, FleetResult};
use crate::generated::smolvm;
use progenitor_client::{Error as ClientError, ResponseValue};
use std::future::Future;
use std::time::Duration;

/// The parts of a declared error body that carry meaning.
pub(crate) trait ErrorBody {
    fn code(&self) -> Option<String>;
    fn message(&self) -> Option<String>;
}

impl ErrorBody for () {
    fn code(&self) -> Option<String> {
        None
    }
    fn message(&self) -> Option<String> {
        None
    }
}

impl ErrorBody for smolvm::types::ApiErrorResponse {
    fn code(&self) -> Option<String> {
        Some(self.code.clone())
    }
    fn message(&self) -> Option<String> {
        Some(self.error.clone())
    }
}

pub(crate) async fn map_error<E: ErrorBody>(context: &str, err: ClientError<E>) -> FleetError {
    match err {
        ClientError::ErrorResponse(response) => {
            let status = response.status().as_u16();
            let request_id = request_id(response.headers());
            let body = response.into_inner();
            FleetError {
                kind: ErrorKind::from_status(status),
                context: context.to_owned(),
                message: without_ansi(
                    &body
                        .message()
                        .unwrap_or_else(|| "no message in the answer".to_owned()),
                ),
                status: Some(status),
                upstream_code: body.code(),
                request_id,
                retry_after: None,
            }
        }
        ClientError::UnexpectedResponse(response) => from_response(context, response).await,
        ClientError::CommunicationError(e) | ClientError::ResponseBodyError(e) => {
            transport(context, &e)
        }
        // Also what a documented error status with an undocumented body (plain text) becomes:
        // progenitor does not say which status it was, so the body itself is the message.
        ClientError::InvalidResponsePayload(bytes, e) => {
            let text = String::from_utf8_lossy(&bytes);
            let (message, code) = parse_error_text(&text);
            let mut err = FleetError::new(
                ErrorKind::BadResponse,
                context,
                match message {
                    Some(m) => format!("{m} (an answer not in the documented shape: {e})"),
                    None => format!("an empty answer where the API documents a body: {e}"),
                },
            );
            err.upstream_code = code;
            err
        }
        ClientError::InvalidRequest(why) => FleetError::new(ErrorKind::Invalid, context, why),
        ClientError::InvalidUpgrade(e) => transport(context, &e),
        ClientError::Custom(why) => FleetError::new(ErrorKind::Upstream, context, why),
    }
}

pub(crate) fn transport(context: &str, e: &reqwest::Error) -> FleetError {
    let kind = if e.is_timeout() {
        ErrorKind::Timeout
    } else {
        ErrorKind::Transport
    };
    // reqwest's Display stops at the outermost layer ("error sending request"); the cause says why.
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    FleetError::new(kind, context, message)
}

fn request_id(headers: &reqwest::header::HeaderMap) -> Option<String> {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// `text` without terminal colour codes: the engine passes on its own coloured log lines in
/// some errors (a failed start quotes `\x1b[33m WARN\x1b[0m ...`, seen on the real 1.32.2
/// guest), which read as noise to an agent.
pub(crate) fn without_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            // Parameters and intermediates, then one final byte in @..~.
            for next in chars.by_ref() {
                if ('@'..='~').contains(&next) {
                    break;
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

pub(crate) fn snippet(text: &str, max_chars: usize) -> String {
    let trimmed = text.trim();
    if trimmed.chars().count() <= max_chars {
        trimmed.to_owned()
    } else {
        format!("{}...", trimmed.chars().take(max_chars).collect::<String>())
    }
}

/// An error from a raw response whose body may be empty, plain text, `{code, error}` JSON, or
/// RFC 9457 problem+json: the cloud uses all four depending on status and release.
pub async fn from_response(context: &str, response: reqwest::Response) -> FleetError {
    let status = response.status().as_u16();
    let request_id = request_id(response.headers());
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|secs| Duration::from_secs(secs.min(MAX_RETRY_AFTER_SECS)));
    let text = response.text().await.unwrap_or_default();
    let (message, code) = parse_error_text(&text);
    FleetError {
        kind: ErrorKind::from_status(status),
        context: context.to_owned(),
        message: without_ansi(&message.unwrap_or_else(|| {
            if text.trim().is_empty() {
                "empty answer".to_owned()
            } else {
                snippet(&text, 500)
            }
        })),
        status: Some(status),
        upstream_code: code,
        request_id,
        retry_after,
    }
}

/// Longest `Retry-After` honoured; an HTTP-date form is treated as absent (the backoff applies).
const MAX_RETRY_AFTER_SECS: u64 = 30;
const READ_ATTEMPTS: u32 = 3;

/// Retries a read (never a create, exec or delete, which may have taken effect) on 429, 5xx
/// gateway errors and dropped connections: three attempts, honouring `Retry-After`, otherwise
/// backing off 250 ms, then 500 ms.
pub(crate) async fn retry_read<T, F, Fut>(mut call: F) -> FleetResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = FleetResult<T>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        match call().await {
            Err(e) if attempt < READ_ATTEMPTS && is_transient(&e) => {
                let backoff = Duration::from_millis(250 * 2u64.pow(attempt - 1));
                tokio::time::sleep(e.retry_after.unwrap_or(backoff)).await;
            }
            other => return other,
        }
    }
}

fn is_transient(e: &FleetError) -> bool {
    matches!(e.status, Some(429 | 500 | 502 | 503 | 504)) || e.kind == ErrorKind::Transport
}

/// The message is the first string among `detail`, `error`, `message`, `title`.
pub fn parse_error_text(text: &str) -> (Option<String>, Option<String>) {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(text) else {
        let trimmed = text.trim();
        return ((!trimmed.is_empty()).then(|| snippet(trimmed, 500)), None);
    };
    let message = ["detail", "error", "message", "title"]
        .iter()
        .find_map(|k| map.get(*k).and_then(|v| v.as_str()).map(str::to_owned));
    let code = map.get("code").and_then(|v| v.as_str()).map(str::to_owned);
    (message, code)
}

/// Sends one generated-client request within `limit` and answers its body, or the error upstream
/// gave in the shared vocabulary. Dropping the returned future cancels the request.
pub(crate) async fn send<T, E: ErrorBody>(
    context: &str,
    limit: Duration,
    request: impl Future<Output = Result<ResponseValue<T>, ClientError<E>>>,
) -> FleetResult<T> {
    send_raw(context, limit, request)
        .await
        .map(ResponseValue::into_inner)
}

/// [`send`], keeping the status and headers of the answer.
pub(crate) async fn send_raw<T, E: ErrorBody>(
    context: &str,
    limit: Duration,
    request: impl Future<Output = Result<ResponseValue<T>, ClientError<E>>>,
) -> FleetResult<ResponseValue<T>> {
    within(context, limit, async {
        match request.await {
            Ok(response) => Ok(response),
            Err(e) => Err(map_error(context, e).await),
        }
    })
    .await
}

/// Time allowed to move `len` bytes, on top of the base deadline (at least 1 MiB/s).
pub(crate) fn transfer_time(len: u64) -> Duration {
    Duration::from_secs(len / (1024 * 1024))
}

/// Runs `call`, failing with a timeout error naming `context` if it takes longer than `limit`.
/// Dropping the call's future cancels its HTTP request.
pub(crate) async fn within<T>(
    context: &str,
    limit: Duration,
    call: impl Future<Output = FleetResult<T>>,
) -> FleetResult<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(FleetError::new(
            ErrorKind::Timeout,
            context,
            format!("no answer within {} s", limit.as_secs()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_codes_are_taken_out_of_upstream_words() {
        assert_eq!(
            without_ansi(
                "\u{1b}[2m2026-12-01T20:32:13Z\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m VM exited"
            ),
            "2026-12-01T20:32:13Z  WARN VM exited"
        );
        assert_eq!(without_ansi("plain [text]"), "plain [text]");
    }

    #[test]
    fn error_texts_of_every_shape() {
        assert_eq!(
            parse_error_text(
                r#"{"type":"about:blank","title":"Payment Required","status":402,"detail":"no credit yet","code":"payment_required"}"#
            ),
            (
                Some("no credit yet".into()),
                Some("payment_required".into())
            )
        );
        assert_eq!(
            parse_error_text(r#"{"code":"unknown_key","error":"unknown API key"}"#),
            (Some("unknown API key".into()), Some("unknown_key".into()))
        );
        assert_eq!(
            parse_error_text("machine not found\n"),
            (Some("machine not found".into()), None)
        );
        assert_eq!(parse_error_text(""), (None, None));
    }
}
