//! What a tool call tells its client while it works, decided here and sent by the protocol: the
//! waits of a call (at most one notification a second: what is being waited for, for how long,
//! against which limit) and a running command's output (batched), both as the call's elapsed
//! time in increasing values. The protocol floor implements [`ProgressChannel`] on the
//! request's stream; a request without a progress token gets none, and nothing is sent.

use crate::fleet::{OutputChunk, OutputSender, OutputStream};
use crate::process::redaction::StreamRedactor;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// At most one progress notification a second (the spec leaves the rate to the server; a
/// client renders each one).
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// A running command's output goes out at most this often: a chatty command's lines are
/// gathered into one notification, and a line after a quiet spell goes at once.
pub const OUTPUT_EVERY: Duration = Duration::from_millis(250);
/// The most output text one notification carries; more within one interval is left out of the
/// notification (never out of the result), and the notification says how much.
pub const OUTPUT_BATCH_MAX_BYTES: usize = 64 * 1024;

/// One progress notification of a call.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressNote {
    /// The call's elapsed seconds, above every value sent before for the call.
    pub progress: f64,
    /// When the wait has a limit: the elapsed seconds at which it runs out.
    pub total: Option<f64>,
    pub message: String,
    /// The command output this notification carries, each run of one stream a piece.
    pub output: Vec<OutputChunk>,
}

/// Where a call's notifications go (the request's stream, on the protocol floor). Sending
/// never fails a call: a notification that cannot be sent is dropped, and a slow client is
/// dropped from, never waited for without end.
pub trait ProgressChannel: Send + Sync {
    fn send(&self, note: ProgressNote) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// The progress of one tool call: nothing at all unless its request carried a progress token.
#[derive(Clone, Default)]
pub struct Progress {
    sink: Option<Arc<ProgressSink>>,
    /// What the call is doing now, kept for a task's status message.
    activity: Option<Arc<Activity>>,
}

/// The latest thing a call waited for or printed, in one line: what a task's `statusMessage`
/// shows, since a task's request has been answered and its progress has nowhere to go.
#[derive(Default)]
pub struct Activity {
    latest: Mutex<Option<String>>,
    /// Set once the call's request has been answered (with a task): its progress token is
    /// spent, so nothing more goes out on it. A sender holds the read lock while it sends, so
    /// no notification can follow the answer.
    answered: tokio::sync::RwLock<bool>,
}

/// The most of one output line a status message quotes.
const ACTIVITY_MAX_CHARS: usize = 200;

impl Activity {
    /// Stops the notifications on the call's request, once any being sent has gone.
    pub async fn request_answered(&self) {
        *self.answered.write().await = true;
    }

    /// While the request is still unanswered, a guard to hold while sending on it.
    pub async fn unless_answered(&self) -> Option<tokio::sync::RwLockReadGuard<'_, bool>> {
        let answered = self.answered.read().await;
        (!*answered).then_some(answered)
    }

    pub fn latest(&self) -> Option<String> {
        self.latest.lock().ok().and_then(|l| l.clone())
    }

    fn set(&self, text: String) {
        if let Ok(mut latest) = self.latest.lock() {
            *latest = Some(text);
        }
    }

    /// Keeps the batch's last non-blank line, marked with its stream.
    fn saw_output(&self, batch: &OutputBatch) {
        let last = batch.pieces.iter().rev().find_map(|piece| {
            let line = piece.text.lines().rev().find(|l| !l.trim().is_empty())?;
            Some((piece.stream, line))
        });
        if let Some((stream, line)) = last {
            let line: String = line.trim_end().chars().take(ACTIVITY_MAX_CHARS).collect();
            self.set(format!("[{}] {line}", stream.as_str()));
        }
    }
}

struct ProgressSink {
    channel: Arc<dyn ProgressChannel>,
    /// When the call began: progress is the call's elapsed time, so it keeps increasing across
    /// the several waits one call may have (serve start-up, pull, boot, readiness).
    began: Instant,
    /// The last progress value sent and when, to keep values increasing and the rate down.
    last: Mutex<Option<(Instant, f64)>>,
    activity: Option<Arc<Activity>>,
    /// Replaces credential values in the output sent (set by the call, which knows them).
    redaction: std::sync::OnceLock<Arc<crate::process::credentials::Supplier>>,
}

impl Progress {
    /// No progress notifications (a request without a progress token, doctor, a test).
    pub fn none() -> Self {
        Progress::default()
    }

    /// A call's progress: sent on `channel` when the request asked for progress, and kept in
    /// `activity` (the waits always, the output when the request asked for progress: only then
    /// does the command go through the engine's output stream).
    pub fn new(channel: Option<Arc<dyn ProgressChannel>>, activity: Option<Arc<Activity>>) -> Self {
        Progress {
            sink: channel.map(|channel| {
                Arc::new(ProgressSink {
                    channel,
                    began: Instant::now(),
                    last: Mutex::new(None),
                    activity: activity.clone(),
                    redaction: std::sync::OnceLock::new(),
                })
            }),
            activity,
        }
    }

    /// Output sent from now on has every credential value `credentials` knows replaced, however
    /// many notifications a value's bytes arrive across.
    pub fn redacting(&self, credentials: &Arc<crate::process::credentials::Supplier>) {
        if let Some(sink) = &self.sink {
            let _ = sink.redaction.set(credentials.clone());
        }
    }

    /// Notes what the call is doing now, for a task's status message; nothing is sent.
    pub fn doing(&self, what: &str) {
        if let Some(activity) = &self.activity {
            activity.set(what.to_owned());
        }
    }

    /// Whether the request asked for progress (and so gets a running command's output).
    pub fn is_requested(&self) -> bool {
        self.sink.is_some()
    }

    /// Runs `work`, which hands a command's output to the sender it is given, and sends that
    /// output to the client as progress notifications while it runs: batched (at most one
    /// notification every [`OUTPUT_EVERY`]; the first piece after a quiet spell goes at once),
    /// and all of it sent before this returns, so the client has every line before the result.
    pub async fn with_output<'a, T>(
        &self,
        work: impl FnOnce(OutputSender) -> Pin<Box<dyn Future<Output = T> + Send + 'a>>,
    ) -> T {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let Some(sink) = self.sink.clone() else {
            drop(receiver);
            return work(sender).await;
        };
        // A task of its own, not a branch of a select: a notification being sent when the
        // command ends is never cut off midway, and the last batch goes once the sender (moved
        // into `work`) is dropped with it, on every path, cancellation included.
        let forwarding = tokio::spawn(forward_output(sink, receiver));
        let out = work(sender).await;
        let _ = forwarding.await;
        out
    }

    /// Runs `work`, telling the client once a second what is being waited for: `waiting_for`
    /// ("waiting for machine m to run commands"), how long so far, and `limit` when the wait has
    /// one. A wait over within a second sends nothing.
    ///
    /// `work` comes boxed: the waits nest inside tool calls, and a generic wrapper holding each
    /// one inline grew every enclosing future (in a debug build, past a test thread's 2 MiB
    /// stack, seen in tests/offline/tools_local.rs).
    pub async fn during<T>(
        &self,
        waiting_for: &str,
        limit: Option<Duration>,
        mut work: Pin<Box<dyn Future<Output = T> + Send + '_>>,
    ) -> T {
        if let Some(activity) = &self.activity {
            activity.set(waiting_for.to_owned());
        }
        let Some(sink) = &self.sink else {
            return work.await;
        };
        let mut ticker = Box::pin(sink.tick(waiting_for, limit));
        tokio::select! {
            out = &mut work => out,
            never = &mut ticker => match never {},
        }
    }
}

/// Gathers a command's output between two notifications.
#[derive(Default)]
struct OutputBatch {
    pieces: Vec<OutputChunk>,
    bytes: usize,
    /// Bytes over [`OUTPUT_BATCH_MAX_BYTES`] left out of this batch.
    skipped: usize,
}

impl OutputBatch {
    fn push(&mut self, chunk: OutputChunk) {
        let room = OUTPUT_BATCH_MAX_BYTES - self.bytes;
        let mut text = chunk.text;
        if text.len() > room {
            let mut cut = room;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            self.skipped += text.len() - cut;
            text.truncate(cut);
        }
        if text.is_empty() {
            return;
        }
        self.bytes += text.len();
        match self.pieces.last_mut() {
            Some(last) if last.stream == chunk.stream => last.text.push_str(&text),
            _ => self.pieces.push(OutputChunk {
                stream: chunk.stream,
                text,
            }),
        }
    }

    fn is_empty(&self) -> bool {
        self.pieces.is_empty() && self.skipped == 0
    }

    /// The notification's `message`: each run of one stream marked `[stdout]` or `[stderr]`,
    /// a marker always at the start of a line.
    fn message(&self) -> String {
        let mut message = String::with_capacity(self.bytes + 16 * self.pieces.len());
        for piece in &self.pieces {
            if !message.is_empty() && !message.ends_with('\n') {
                message.push('\n');
            }
            message.push_str(match piece.stream {
                OutputStream::Stdout => "[stdout] ",
                OutputStream::Stderr => "[stderr] ",
            });
            message.push_str(&piece.text);
        }
        if self.skipped > 0 {
            if !message.is_empty() && !message.ends_with('\n') {
                message.push('\n');
            }
            message.push_str(&format!(
                "[smol-mcp] {} more bytes of output in this moment are not shown here; the \
                 result keeps the head and tail, and the whole when it is long",
                self.skipped
            ));
        }
        message
    }
}

async fn forward_output(
    sink: Arc<ProgressSink>,
    mut receiver: tokio::sync::mpsc::UnboundedReceiver<OutputChunk>,
) {
    let mut batch = OutputBatch::default();
    let mut redacting = Redacting::default();
    let mut last_sent: Option<Instant> = None;
    loop {
        let due = last_sent.map_or_else(Instant::now, |at| at + OUTPUT_EVERY);
        let next = if batch.is_empty() {
            receiver.recv().await
        } else {
            tokio::select! {
                next = receiver.recv() => next,
                () = tokio::time::sleep_until(due.into()) => {
                    sink.send_output(std::mem::take(&mut batch)).await;
                    last_sent = Some(Instant::now());
                    continue;
                }
            }
        };
        let Some(chunk) = next else {
            break;
        };
        batch.push(redacting.piece(&sink, chunk));
        if Instant::now() >= due {
            // A quiet spell is over: what is already queued goes with this piece, at once.
            while let Ok(more) = receiver.try_recv() {
                batch.push(redacting.piece(&sink, more));
            }
            sink.send_output(std::mem::take(&mut batch)).await;
            last_sent = Some(Instant::now());
        }
    }
    for rest in redacting.finish() {
        batch.push(rest);
    }
    if !batch.is_empty() {
        sink.send_output(batch).await;
    }
}

/// Each stream's credential redaction across the pieces it arrives in: redacted before the
/// pieces are batched, so neither a notification's edges nor a batch's size cut goes through
/// a value ([`StreamRedactor`] holds back a value's possible start until what follows it).
#[derive(Default)]
struct Redacting {
    streams: Option<[StreamRedactor; 2]>,
}

impl Redacting {
    fn piece(&mut self, sink: &ProgressSink, chunk: OutputChunk) -> OutputChunk {
        let Some(credentials) = sink.redaction.get() else {
            return chunk;
        };
        let streams = self.streams.get_or_insert_with(|| {
            let redactor = credentials.redactor();
            [
                StreamRedactor::new(redactor.clone()),
                StreamRedactor::new(redactor),
            ]
        });
        let index = match chunk.stream {
            OutputStream::Stdout => 0,
            OutputStream::Stderr => 1,
        };
        let text = streams[index].push(chunk.text.as_bytes());
        OutputChunk {
            stream: chunk.stream,
            text: String::from_utf8_lossy(&text).into_owned(),
        }
    }

    /// What each stream held back, once the command has ended.
    fn finish(self) -> Vec<OutputChunk> {
        let Some([mut stdout, mut stderr]) = self.streams else {
            return Vec::new();
        };
        [
            (OutputStream::Stdout, stdout.finish()),
            (OutputStream::Stderr, stderr.finish()),
        ]
        .into_iter()
        .filter(|(_, text)| !text.is_empty())
        .map(|(stream, text)| OutputChunk {
            stream,
            text: String::from_utf8_lossy(&text).into_owned(),
        })
        .collect()
    }
}

impl ProgressSink {
    /// Sends a batch of output. Progress is the call's elapsed seconds, in milliseconds and
    /// always above the last value sent (the spec wants it increasing).
    async fn send_output(&self, batch: OutputBatch) {
        let _sending = match &self.activity {
            Some(activity) => {
                activity.saw_output(&batch);
                match activity.unless_answered().await {
                    Some(guard) => Some(guard),
                    None => return,
                }
            }
            None => None,
        };
        let now = Instant::now();
        let mut progress = ((now - self.began).as_secs_f64() * 1000.0).floor() / 1000.0;
        {
            let Ok(mut last) = self.last.lock() else {
                return;
            };
            if let Some((_, value)) = *last
                && progress <= value
            {
                progress = value + 0.001;
            }
            *last = Some((now, progress));
        }
        let message = batch.message();
        self.channel
            .send(ProgressNote {
                progress,
                total: None,
                message,
                output: batch.pieces,
            })
            .await;
    }

    async fn tick(&self, waiting_for: &str, limit: Option<Duration>) -> Infallible {
        let phase_began = Instant::now();
        // Progress and total are in seconds of the whole call, so that the fraction is how
        // much of the longest this wait could take has passed.
        let total = limit.map(|l| (phase_began - self.began + l).as_secs_f64().ceil());
        loop {
            tokio::time::sleep(PROGRESS_EVERY).await;
            let waited = phase_began.elapsed().as_secs();
            let message = match limit {
                Some(limit) => format!("{waiting_for} ({waited} s of {} s)", limit.as_secs()),
                None => format!("{waiting_for} ({waited} s)"),
            };
            self.send(message, total).await;
        }
    }

    async fn send(&self, message: String, total: Option<f64>) {
        let _sending = match &self.activity {
            Some(activity) => match activity.unless_answered().await {
                Some(guard) => Some(guard),
                None => return,
            },
            None => None,
        };
        let now = Instant::now();
        // Tenths of a second: whole seconds could repeat a value across two waits of one call.
        let progress = ((now - self.began).as_secs_f64() * 10.0).floor() / 10.0;
        {
            let Ok(mut last) = self.last.lock() else {
                return;
            };
            if let Some((at, value)) = *last
                && (progress <= value || now - at < PROGRESS_EVERY.mul_f64(0.9))
            {
                return;
            }
            *last = Some((now, progress));
        }
        self.channel
            .send(ProgressNote {
                progress,
                total: total.map(|t| t.max(progress)),
                message,
                output: Vec::new(),
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(stream: OutputStream, text: &str) -> OutputChunk {
        OutputChunk {
            stream,
            text: text.to_owned(),
        }
    }

    #[test]
    fn a_batch_marks_each_run_of_a_stream_on_its_own_line() {
        let mut batch = OutputBatch::default();
        batch.push(chunk(OutputStream::Stdout, "one\n"));
        batch.push(chunk(OutputStream::Stdout, "two"));
        batch.push(chunk(OutputStream::Stderr, "warn\n"));
        batch.push(chunk(OutputStream::Stdout, "three\n"));
        assert_eq!(
            batch.message(),
            "[stdout] one\ntwo\n[stderr] warn\n[stdout] three\n"
        );
        assert_eq!(
            batch.pieces,
            [
                chunk(OutputStream::Stdout, "one\ntwo"),
                chunk(OutputStream::Stderr, "warn\n"),
                chunk(OutputStream::Stdout, "three\n"),
            ]
        );
    }

    #[test]
    fn an_oversized_batch_is_cut_on_a_character_and_says_how_much_is_left_out() {
        let mut batch = OutputBatch::default();
        batch.push(chunk(
            OutputStream::Stdout,
            &"a".repeat(OUTPUT_BATCH_MAX_BYTES - 1),
        ));
        batch.push(chunk(OutputStream::Stdout, "\u{e9}\u{e9}"));
        let message = batch.message();
        assert_eq!(batch.bytes, OUTPUT_BATCH_MAX_BYTES - 1);
        assert_eq!(batch.skipped, 4);
        assert!(
            message.contains("4 more bytes"),
            "{}",
            &message[message.len() - 200..]
        );
    }
}
