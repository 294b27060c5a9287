//! The streamed exec of both fakes: `POST .../exec/stream` answering `text/event-stream` frame
//! by frame over time, as the engines do.
//!
//! Local (smolvm 1.32.2 src/api/handlers/exec.rs `exec_stream`, search-index id 70216742866): axum `Event`s sent as the guest agent produces them,
//! `event: stdout` / `event: stderr` with the output as text (`String::from_utf8_lossy` of each
//! chunk, one chunk a line per smolvm's docs/local-api api-fields.md), then `event: exit` with
//! `{"exitCode":N}`, or `event: error` with `{"message":"<msg>"}` written by `format!` without
//! escaping and no exit after it. Cloud (reference/cloud-api-facts.md 3.7): the same events,
//! its error data plain text. Frames are rendered by axum's own `Sse` here, so a CR or LF in
//! the output is split into `data:` lines exactly as the engine's axum 0.8.9 splits it.

use axum::body::{Body, Bytes};
use axum::response::IntoResponse;
use axum::response::sse::{Event, Sse};
use serde_json::Value;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// One step of a streamed command.
#[derive(Debug, Clone)]
pub enum StreamStep {
    /// An event as the engine writes it: `stdout`, `stderr`, `exit` (data `{"exitCode":N}`) or
    /// `error`.
    Event(String, String),
    /// An event's bytes cut in two at `at`, the second half sent `pause` later: a frame (and a
    /// character in it) split across two reads.
    Split(String, String, usize, Duration),
    /// Waits before the next step (the command is quiet).
    Pause(Duration),
    /// A stdout line `<prefix> <ns>`, `<ns>` the nanoseconds from [`epoch`] to its sending:
    /// what the latency benchmark times.
    Stamped(String),
}

/// The instant stamped lines count from, shared by everything in this process.
pub fn epoch() -> std::time::Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

impl StreamStep {
    pub fn stdout(text: &str) -> StreamStep {
        StreamStep::Event("stdout".into(), text.into())
    }
    pub fn stderr(text: &str) -> StreamStep {
        StreamStep::Event("stderr".into(), text.into())
    }
    pub fn exit(code: i32) -> StreamStep {
        StreamStep::Event("exit".into(), format!("{{\"exitCode\":{code}}}"))
    }
    /// The local engine's error frame, unescaped as it writes it.
    pub fn engine_error(message: &str) -> StreamStep {
        StreamStep::Event("error".into(), format!("{{\"message\":\"{message}\"}}"))
    }
}

/// What a test sets to script a streamed command from its request body.
pub type StreamHook = Arc<dyn Fn(&Value) -> Vec<StreamStep> + Send + Sync>;

/// Counts of the streams a fake served: how many began, how many the client closed before
/// their last frame was sent (a cancelled call), how many were sent to the end.
#[derive(Debug, Default)]
pub struct StreamCounts {
    pub begun: AtomicUsize,
    pub closed_early: AtomicUsize,
    pub finished: AtomicUsize,
}

impl StreamCounts {
    pub fn closed_early(&self) -> usize {
        self.closed_early.load(Ordering::SeqCst)
    }
    pub fn finished(&self) -> usize {
        self.finished.load(Ordering::SeqCst)
    }
    pub fn begun(&self) -> usize {
        self.begun.load(Ordering::SeqCst)
    }
}

/// The steps of a command the fake runs by its plain exec answer (`exitCode`, `stdout`,
/// `stderr`, as the fakes' exec hooks give it): one event a line of stdout, then of stderr,
/// then the exit.
pub fn steps_from_answer(answer: &Value) -> Vec<StreamStep> {
    let mut steps = Vec::new();
    for (event, key) in [("stdout", "stdout"), ("stderr", "stderr")] {
        let text = answer[key].as_str().unwrap_or_default();
        for line in text.split_inclusive('\n') {
            steps.push(StreamStep::Event(event.into(), line.into()));
        }
    }
    steps.push(StreamStep::exit(
        answer["exitCode"].as_i64().unwrap_or(0) as i32
    ));
    steps
}

/// An event rendered by axum's `Sse`, byte for byte as the engine sends it.
async fn frame(event: &str, data: &str) -> Bytes {
    let event = Event::default().event(event).data(data);
    let response = Sse::new(futures::stream::iter([Ok::<_, Infallible>(event)])).into_response();
    axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap()
}

/// Marks the stream closed early unless it was sent to its end.
struct Watch {
    counts: Arc<StreamCounts>,
    done: bool,
}

impl Watch {
    /// Counts a stream begun, and watches it to its end.
    fn begin(counts: Arc<StreamCounts>) -> Watch {
        counts.begun.fetch_add(1, Ordering::SeqCst);
        Watch {
            counts,
            done: false,
        }
    }

    fn finish(&mut self) {
        self.done = true;
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let counter = if self.done {
            &self.counts.finished
        } else {
            &self.counts.closed_early
        };
        counter.fetch_add(1, Ordering::SeqCst);
    }
}

/// The `200 text/event-stream` answer playing `steps`, `gap` between every two of them (the
/// knob for a command that prints over time).
pub fn sse_response(
    steps: Vec<StreamStep>,
    gap: Option<Duration>,
    counts: Arc<StreamCounts>,
) -> axum::response::Response {
    let watch = Watch::begin(counts);
    let body = async_stream_of(steps, gap, watch);
    (
        [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
        Body::from_stream(body),
    )
        .into_response()
}

fn async_stream_of(
    steps: Vec<StreamStep>,
    gap: Option<Duration>,
    watch: Watch,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> + Send {
    // Each step yields its bytes; the state carries the steps left, a pending second half and
    // the watch, which is dropped (and so counts the stream) when the body is.
    struct State {
        steps: std::collections::VecDeque<StreamStep>,
        pending: Option<(Bytes, Duration)>,
        gap: Option<Duration>,
        watch: Watch,
        first: bool,
    }
    let state = State {
        steps: steps.into(),
        pending: None,
        gap,
        watch,
        first: true,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some((rest, pause)) = st.pending.take() {
                tokio::time::sleep(pause).await;
                return Some((Ok(rest), st));
            }
            let step = match st.steps.pop_front() {
                Some(step) => step,
                None => {
                    st.watch.finish();
                    return None;
                }
            };
            if let (false, Some(gap)) = (std::mem::replace(&mut st.first, false), st.gap) {
                tokio::time::sleep(gap).await;
            }
            match step {
                StreamStep::Pause(d) => tokio::time::sleep(d).await,
                StreamStep::Event(event, data) => {
                    return Some((Ok(frame(&event, &data).await), st));
                }
                StreamStep::Stamped(prefix) => {
                    let line = format!("{prefix} {}\n", epoch().elapsed().as_nanos());
                    return Some((Ok(frame("stdout", &line).await), st));
                }
                StreamStep::Split(event, data, at, pause) => {
                    let bytes = frame(&event, &data).await;
                    st.pending = Some((bytes.slice(at..), pause));
                    return Some((Ok(bytes.slice(..at)), st));
                }
            }
        }
    })
}

/// The whole body of `steps` at once, pauses ignored: for a fake that cannot send over time
/// (wiremock answers whole bodies).
pub fn whole_body(steps: &[StreamStep]) -> Vec<u8> {
    futures::executor::block_on(async {
        let mut body = Vec::new();
        for step in steps {
            match step {
                StreamStep::Event(event, data) | StreamStep::Split(event, data, _, _) => {
                    body.extend_from_slice(&frame(event, data).await);
                }
                StreamStep::Pause(_) | StreamStep::Stamped(_) => {}
            }
        }
        body
    })
}

/// The `200 text/event-stream` answer sending each `(event, data)` as it is received, until the
/// sender is dropped: a command the fake really runs (its guest shell), streamed live.
pub fn live_sse_response(
    events: tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
    counts: Arc<StreamCounts>,
) -> axum::response::Response {
    let watch = Watch::begin(counts);
    let body = futures::stream::unfold((events, watch), |(mut events, mut watch)| async move {
        match events.recv().await {
            Some((event, data)) => Some((
                Ok::<_, Infallible>(frame(&event, &data).await),
                (events, watch),
            )),
            None => {
                watch.finish();
                None
            }
        }
    });
    (
        [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
        Body::from_stream(body),
    )
        .into_response()
}
