//! What the server tells a client while it works: `notifications/progress` during the waits of
//! a tool call whose request carried a progress token, and the process's notable events
//! (`crate::backend::events`) as `notifications/message` at the level the client asked for.
//!
//! Both go through the request's or the session's `Peer`, which is what makes them work on both
//! lifecycles: on a 2025-11-25 session the peer is the session's (progress goes on the request's
//! stream, rmcp routes it by token; log messages on the session's stream), and on 2026-07-28 the
//! peer of a request is that request's own reply stream. Sending never fails a tool call: a
//! notification that cannot be sent is dropped.

// rmcp marks logging deprecated (SEP-2577 drops it from a future spec); 2025-11-25 and
// 2026-07-28 both still have it, and clients show these messages.
#![allow(deprecated)]

use crate::backend::events::{EventLevel, ServerEvent};
use rmcp::RoleServer;
use rmcp::model::{
    LoggingLevel, LoggingMessageNotificationParam, ProgressNotificationParam, ProgressToken,
};
use rmcp::service::{Peer, RequestContext};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// The logger name of the server's own messages.
pub const LOGGER: &str = "smol-mcp";

/// At most one progress notification a second (the spec leaves the rate to the server; a
/// client renders each one).
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// A notification that the transport does not take within this is dropped, so that a stuck
/// client never holds up the call it is being told about.
const SEND_DEADLINE: Duration = Duration::from_secs(2);

/// The progress of one tool call: nothing at all unless its request carried a progress token.
#[derive(Clone, Default)]
pub struct Progress {
    sink: Option<Arc<ProgressSink>>,
}

struct ProgressSink {
    token: ProgressToken,
    peer: Peer<RoleServer>,
    /// When the call began: progress is the call's elapsed time, so it keeps increasing across
    /// the several waits one call may have (serve start-up, pull, boot, readiness).
    began: Instant,
    /// The last progress value sent and when, to keep values increasing and the rate down.
    last: Mutex<Option<(Instant, f64)>>,
}

impl Progress {
    /// No progress notifications (a request without a progress token, or a test).
    pub fn none() -> Self {
        Progress::default()
    }

    pub fn from_request(context: &RequestContext<RoleServer>) -> Self {
        Progress {
            sink: context.meta.get_progress_token().map(|token| {
                Arc::new(ProgressSink {
                    token,
                    peer: context.peer.clone(),
                    began: Instant::now(),
                    last: Mutex::new(None),
                })
            }),
        }
    }

    /// Runs `work`, telling the client once a second what is being waited for: `waiting_for`
    /// ("waiting for machine m to run commands"), how long so far, and `limit` when the wait has
    /// one. A wait over within a second sends nothing.
    ///
    /// `work` comes boxed: the waits nest inside tool calls, and a generic wrapper holding each
    /// one inline grew every enclosing future (in a debug build, past a test thread's 2 MiB
    /// stack, seen in tests/tools_local.rs).
    pub async fn during<T>(
        &self,
        waiting_for: &str,
        limit: Option<Duration>,
        mut work: Pin<Box<dyn Future<Output = T> + Send + '_>>,
    ) -> T {
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

impl ProgressSink {
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
        let mut param = ProgressNotificationParam::new(self.token.clone(), progress)
            .with_message(message.clone());
        if let Some(total) = total {
            param = param.with_total(total.max(progress));
        }
        match tokio::time::timeout(SEND_DEADLINE, self.peer.notify_progress(param)).await {
            Ok(Ok(())) => tracing::debug!(%message, progress, "progress sent"),
            Ok(Err(e)) => tracing::debug!(error = %e, "a progress notification was not sent"),
            Err(_) => tracing::debug!("a progress notification was dropped: the client is slow"),
        }
    }
}

fn rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

fn logging_level(level: EventLevel) -> LoggingLevel {
    match level {
        EventLevel::Info => LoggingLevel::Info,
        EventLevel::Warning => LoggingLevel::Warning,
    }
}

/// A session's log level and the forwarding of events to its client. A session that never
/// sent `logging/setLevel` gets `info` and above: the server's events are few and each is
/// something a user may want to see (the engine it started, machines it deleted).
pub struct SessionLog {
    level: Arc<Mutex<LoggingLevel>>,
    /// Ends the forwarding when the session's handler goes.
    stop: CancellationToken,
}

impl Default for SessionLog {
    fn default() -> Self {
        SessionLog {
            level: Arc::new(Mutex::new(LoggingLevel::Info)),
            stop: CancellationToken::new(),
        }
    }
}

impl Drop for SessionLog {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl SessionLog {
    pub fn set_level(&self, level: LoggingLevel) {
        if let Ok(mut current) = self.level.lock() {
            *current = level;
        }
    }

    /// Forwards every event from now on to the session's client, until the session ends.
    pub fn forward(&self, events: broadcast::Receiver<ServerEvent>, peer: Peer<RoleServer>) {
        let (level, stop) = (self.level.clone(), self.stop.clone());
        let threshold = move || level.lock().map(|l| *l).unwrap_or(LoggingLevel::Info);
        tokio::spawn(async move {
            tokio::select! {
                () = forward_events(events, &peer, threshold) => {}
                () = stop.cancelled() => {}
            }
        });
    }
}

/// Runs `work` (one 2026-07-28 request) and sends the events raised meanwhile on its reply
/// stream, at `level` and above; with no level, nothing is sent.
pub async fn with_request_events<F: Future>(
    events: broadcast::Receiver<ServerEvent>,
    context: &RequestContext<RoleServer>,
    work: F,
) -> F::Output {
    let Some(level) = context.meta.log_level() else {
        return work.await;
    };
    let mut events = events;
    let out = {
        let forwarding = forward_events_borrowed(&mut events, &context.peer, move || level);
        tokio::pin!(work, forwarding);
        tokio::select! {
            out = &mut work => out,
            () = &mut forwarding => work.await,
        }
    };
    // Events raised at the very end of the call still belong to it.
    while let Ok(event) = events.try_recv() {
        send_event(&context.peer, &event, level).await;
    }
    out
}

async fn forward_events(
    mut events: broadcast::Receiver<ServerEvent>,
    peer: &Peer<RoleServer>,
    threshold: impl Fn() -> LoggingLevel,
) {
    forward_events_borrowed(&mut events, peer, threshold).await;
}

/// Ends when the bus closes or the client's transport is gone.
async fn forward_events_borrowed(
    events: &mut broadcast::Receiver<ServerEvent>,
    peer: &Peer<RoleServer>,
    threshold: impl Fn() -> LoggingLevel,
) {
    loop {
        match events.recv().await {
            Ok(event) => {
                if !send_event(peer, &event, threshold()).await {
                    return;
                }
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::debug!(missed, "a session missed server events");
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Sends `event` if it is at `threshold` or above; answers false once the transport is closed.
async fn send_event(peer: &Peer<RoleServer>, event: &ServerEvent, threshold: LoggingLevel) -> bool {
    let level = logging_level(event.level);
    if rank(level) < rank(threshold) {
        return true;
    }
    let mut param = LoggingMessageNotificationParam::new(level, event.data());
    param.logger = Some(LOGGER.to_owned());
    match tokio::time::timeout(SEND_DEADLINE, peer.notify_logging_message(param)).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "a log message was not sent");
            !peer.is_transport_closed()
        }
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_rank_as_the_spec_orders_them() {
        assert!(rank(LoggingLevel::Info) < rank(LoggingLevel::Warning));
        assert!(rank(LoggingLevel::Debug) < rank(LoggingLevel::Info));
        assert!(rank(LoggingLevel::Notice) < rank(LoggingLevel::Warning));
        assert!(rank(LoggingLevel::Alert) < rank(LoggingLevel::Emergency));
    }
}
