//! How the server's notifications travel: a tool call's progress (decided by
//! `crate::policy::progress`) as `notifications/progress` on its request, and the process's
//! notable events (`crate::process::events`) as `notifications/message` at the level the
//! client asked for.
//!
//! Both go through the request's or the session's `Peer`, which is what makes them work on both
//! lifecycles: on a 2025-11-25 session the peer is the session's (progress goes on the request's
//! stream, rmcp routes it by token; log messages on the session's stream), and on 2026-07-28 the
//! peer of a request is that request's own reply stream. Sending never fails a tool call: a
//! notification that cannot be sent is dropped.

// rmcp marks logging deprecated (SEP-2577 drops it from a future spec); 2025-11-25 and
// 2026-07-28 both still have it, and clients show these messages.
#![allow(deprecated)]

use crate::fleet::OutputChunk;
use crate::policy::progress::{Activity, Progress, ProgressChannel, ProgressNote};
use crate::process::events::{EventLevel, ServerEvent};
use rmcp::RoleServer;
use rmcp::model::{
    LoggingLevel, LoggingMessageNotificationParam, MetaObject, NotificationMetaObject,
    ProgressNotificationParam, ProgressToken,
};
use rmcp::service::{Peer, RequestContext};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// Who hears the process's events on one session or request: with sign-in, an event about a
/// machine reaches only the user who holds it (the operator: one no user holds); every other
/// event reaches everyone.
#[derive(Clone)]
pub struct Audience {
    policy: Arc<crate::policy::Policy>,
    user: crate::policy::user::User,
}

impl Audience {
    pub fn new(policy: Arc<crate::policy::Policy>, user: crate::policy::user::User) -> Audience {
        Audience { policy, user }
    }

    pub async fn hears(&self, event: &ServerEvent) -> bool {
        let Some((fleet, machine)) = event.machine() else {
            return true;
        };
        let Some(kind) = crate::fleet::FleetKind::parse(fleet) else {
            return false;
        };
        crate::policy::tools::user_sees(&self.policy, &self.user, kind, machine)
            .await
            .unwrap_or(false)
    }
}

/// The logger name of the server's own messages.
pub const LOGGER: &str = "smol-mcp";

/// The `_meta` key of a progress notification's output pieces, each `{stream, text}`.
pub const OUTPUT_META_KEY: &str = "smol-mcp/output";
/// A notification that the transport does not take within this is dropped, so that a stuck
/// client never holds up the call it is being told about.
const SEND_DEADLINE: Duration = Duration::from_secs(2);

/// The progress of a call made by `context`'s request: none unless it carried a progress
/// token; `activity`, when given, keeps what the call does for a task's status message.
pub fn progress_of(
    context: &RequestContext<RoleServer>,
    activity: Option<Arc<Activity>>,
) -> Progress {
    let channel = context.meta.get_progress_token().map(|token| {
        Arc::new(RequestChannel {
            token,
            peer: context.peer.clone(),
        }) as Arc<dyn ProgressChannel>
    });
    Progress::new(channel, activity)
}

/// A request's progress token and the peer its notifications go through.
struct RequestChannel {
    token: ProgressToken,
    peer: Peer<RoleServer>,
}

impl ProgressChannel for RequestChannel {
    fn send(&self, note: ProgressNote) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let mut param = ProgressNotificationParam::new(self.token.clone(), note.progress)
                .with_message(note.message);
            if let Some(total) = note.total {
                param = param.with_total(total);
            }
            if !note.output.is_empty() {
                param.meta = Some(output_meta(&note.output));
            }
            match tokio::time::timeout(SEND_DEADLINE, self.peer.notify_progress(param)).await {
                Ok(Ok(())) => tracing::trace!(progress = note.progress, "progress sent"),
                Ok(Err(e)) => tracing::debug!(error = %e, "a progress notification was not sent"),
                Err(_) => {
                    tracing::debug!("a progress notification was dropped: the client is slow")
                }
            }
        })
    }
}

/// The output pieces of a notification under [`OUTPUT_META_KEY`], each `{stream, text}`, for a
/// client that shows the streams apart.
fn output_meta(pieces: &[OutputChunk]) -> NotificationMetaObject {
    let pieces: Vec<serde_json::Value> = pieces
        .iter()
        .map(|p| serde_json::json!({"stream": p.stream.as_str(), "text": p.text}))
        .collect();
    let mut map = serde_json::Map::new();
    map.insert(OUTPUT_META_KEY.to_owned(), serde_json::Value::Array(pieces));
    NotificationMetaObject(MetaObject(map))
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

    /// Forwards every event from now on that `audience` hears to the session's client, until
    /// the session ends.
    pub fn forward(
        &self,
        events: broadcast::Receiver<ServerEvent>,
        peer: Peer<RoleServer>,
        audience: Audience,
    ) {
        let (level, stop) = (self.level.clone(), self.stop.clone());
        let threshold = move || level.lock().map(|l| *l).unwrap_or(LoggingLevel::Info);
        tokio::spawn(async move {
            let send = |event: ServerEvent| {
                let (peer, audience) = (peer.clone(), audience.clone());
                let level = threshold();
                async move { send_event(&peer, &event, level, Some(&audience)).await }
            };
            tokio::select! {
                () = forward_events_until(events, send, None, std::future::pending()) => {}
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
    audience: &Audience,
) -> F::Output {
    with_request_events_until_answered(events, context, work, None, audience).await
}

/// The same, ending when `answered`'s request has been answered before `work` is done (a
/// call answered with a task): the request is over, and an event raised later is no longer
/// its news. Each send holds `answered`'s read lock, so none follows the answer.
pub async fn with_request_events_until_answered<F: Future>(
    events: broadcast::Receiver<ServerEvent>,
    context: &RequestContext<RoleServer>,
    work: F,
    answered: Option<&Activity>,
    audience: &Audience,
) -> F::Output {
    let Some(level) = context.meta.log_level() else {
        return work.await;
    };
    let send = |event: ServerEvent| {
        let peer = context.peer.clone();
        async move { send_event(&peer, &event, level, Some(audience)).await }
    };
    alongside(events, work, send, answered).await
}

/// Runs `work` while `send`ing each event published meanwhile, and those still queued when it
/// ends, before answering `work`'s output: the caller answers the request next, so every event
/// of the call goes out before the answer. An event taken off the bus is sent to the end even
/// when `work` finishes during the send; dropping the send there lost the `localServe` event of a
/// fresh process's first call, whose list-machines ended while it was being sent.
async fn alongside<F, S, Sent>(
    events: broadcast::Receiver<ServerEvent>,
    work: F,
    send: S,
    answered: Option<&Activity>,
) -> F::Output
where
    F: Future,
    S: FnMut(ServerEvent) -> Sent,
    Sent: Future<Output = bool>,
{
    let (finished, work_finished) = tokio::sync::oneshot::channel::<()>();
    let work = async move {
        let out = work.await;
        let _ = finished.send(());
        out
    };
    let until = async move {
        let _ = work_finished.await;
    };
    let (out, ()) = tokio::join!(work, forward_events_until(events, send, answered, until));
    out
}

/// Sends each event until the bus closes, the client's transport is gone, `answered`'s request
/// is answered, or `until` ends; then the events already published, which belong to what ended.
async fn forward_events_until<S, Sent>(
    mut events: broadcast::Receiver<ServerEvent>,
    mut send: S,
    answered: Option<&Activity>,
    until: impl Future<Output = ()>,
) where
    S: FnMut(ServerEvent) -> Sent,
    Sent: Future<Output = bool>,
{
    tokio::pin!(until);
    loop {
        let received = tokio::select! {
            biased;
            () = &mut until => break,
            received = events.recv() => received,
        };
        match received {
            Ok(event) => {
                if !send_unless_answered(&mut send, event, answered).await {
                    return;
                }
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::debug!(missed, "a listener missed server events");
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
    while let Ok(event) = events.try_recv() {
        if !send_unless_answered(&mut send, event, answered).await {
            return;
        }
    }
}

/// Sends `event` while `answered`'s request is unanswered; false when it is answered or the
/// transport is gone, and nothing more should be sent.
async fn send_unless_answered<S, Sent>(
    send: &mut S,
    event: ServerEvent,
    answered: Option<&Activity>,
) -> bool
where
    S: FnMut(ServerEvent) -> Sent,
    Sent: Future<Output = bool>,
{
    let _sending = match answered {
        Some(activity) => match activity.unless_answered().await {
            Some(guard) => Some(guard),
            None => return false,
        },
        None => None,
    };
    send(event).await
}

/// Sends `event` if it is at `threshold` or above; answers false once the transport is closed.
async fn send_event(
    peer: &Peer<RoleServer>,
    event: &ServerEvent,
    threshold: LoggingLevel,
    audience: Option<&Audience>,
) -> bool {
    let level = logging_level(event.level);
    if rank(level) < rank(threshold) {
        return true;
    }
    if let Some(audience) = audience
        && !audience.hears(event).await
    {
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
    use crate::fleet::OutputStream;
    use crate::process::events::Events;

    type Sent = Arc<Mutex<Vec<&'static str>>>;
    type SlowSend = Pin<Box<dyn Future<Output = bool> + Send>>;

    /// A send that takes `delay`, recording the events it finished sending.
    fn slow_send(delay: Duration) -> (Sent, impl FnMut(ServerEvent) -> SlowSend) {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let record = sent.clone();
        let send = move |event: ServerEvent| {
            let record = record.clone();
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                record.lock().unwrap().push(event.event);
                true
            }) as SlowSend
        };
        (sent, send)
    }

    #[tokio::test]
    async fn an_event_being_sent_when_the_call_ends_is_sent_before_the_answer() {
        let events = Events::default();
        let listener = events.subscribe();
        let work = async {
            events.publish(ServerEvent::info("localServe", "started a serve"));
            // The forwarder takes the event and is still sending it when the call ends.
            tokio::time::sleep(Duration::from_millis(20)).await;
            "listed"
        };
        let (sent, send) = slow_send(Duration::from_millis(300));
        assert_eq!(alongside(listener, work, send, None).await, "listed");
        assert_eq!(*sent.lock().unwrap(), ["localServe"]);
    }

    #[tokio::test]
    async fn events_raised_as_the_call_ends_are_sent_in_order_before_the_answer() {
        let events = Events::default();
        let listener = events.subscribe();
        let work = async {
            events.publish(ServerEvent::info("first", "one"));
            events.publish(ServerEvent::warning("second", "two"));
            "done"
        };
        let (sent, send) = slow_send(Duration::from_millis(10));
        assert_eq!(alongside(listener, work, send, None).await, "done");
        assert_eq!(*sent.lock().unwrap(), ["first", "second"]);
    }

    #[tokio::test]
    async fn nothing_more_is_sent_once_the_transport_is_gone() {
        let events = Events::default();
        let listener = events.subscribe();
        let attempts = Arc::new(Mutex::new(0));
        let counted = attempts.clone();
        let send = move |_event: ServerEvent| {
            *counted.lock().unwrap() += 1;
            std::future::ready(false)
        };
        let work = async {
            events.publish(ServerEvent::info("first", "one"));
            events.publish(ServerEvent::info("second", "two"));
            "done"
        };
        assert_eq!(alongside(listener, work, send, None).await, "done");
        assert_eq!(*attempts.lock().unwrap(), 1);
    }

    #[test]
    fn output_pieces_travel_under_the_meta_key_each_with_its_stream() {
        let pieces = [
            OutputChunk {
                stream: OutputStream::Stdout,
                text: "one\n".into(),
            },
            OutputChunk {
                stream: OutputStream::Stderr,
                text: "warn".into(),
            },
        ];
        assert_eq!(
            serde_json::to_value(output_meta(&pieces)).unwrap()[OUTPUT_META_KEY],
            serde_json::json!([
                {"stream": "stdout", "text": "one\n"},
                {"stream": "stderr", "text": "warn"},
            ])
        );
    }

    #[test]
    fn levels_rank_as_the_spec_orders_them() {
        assert!(rank(LoggingLevel::Info) < rank(LoggingLevel::Warning));
        assert!(rank(LoggingLevel::Debug) < rank(LoggingLevel::Info));
        assert!(rank(LoggingLevel::Notice) < rank(LoggingLevel::Warning));
        assert!(rank(LoggingLevel::Alert) < rank(LoggingLevel::Emergency));
    }
}
