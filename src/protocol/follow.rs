//! Following a machine's log: one poller per machine, shared by everyone subscribed to its log
//! under whatever spelling of its URI, that asks the fleet for what arrived since its cursor and
//! tells each subscriber (under the URI it used) when something did.
//! Neither engine pushes log lines to a caller that is not holding a request open (the local
//! engine's `follow=true` holds one request per follower and outlives nothing; the cloud has only
//! its event list), so the upstream is polled, and only while someone is subscribed.

use crate::fleet::{FleetKind, LogSource};
use crate::process::Process;
use rmcp::model::ResourceUpdatedNotificationParam;
use rmcp::service::SubscriptionSink;
use rmcp::{ErrorData, Peer, RoleServer};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a followed log is polled: a new line reaches the client within about this long.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// How long a subscribe waits for its poller's first answer.
const BASELINE_WAIT: Duration = Duration::from_secs(10);

/// Who hears about new lines: a session that sent resources/subscribe, or a 2026-07-28
/// subscriptions/listen stream.
#[derive(Clone)]
pub enum Subscriber {
    Session(Peer<RoleServer>),
    Listen(SubscriptionSink),
}

impl Subscriber {
    fn gone(&self) -> bool {
        match self {
            Subscriber::Session(peer) => peer.is_transport_closed(),
            Subscriber::Listen(_) => false,
        }
    }

    /// Answers whether the subscriber is still there.
    async fn notify(&self, uri: &str) -> bool {
        match self {
            Subscriber::Session(peer) => peer
                .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                .await
                .is_ok(),
            Subscriber::Listen(sink) => sink.notify_resource_updated(uri).await.is_ok(),
        }
    }
}

/// The pollers of one process, by machine (its canonical logs URI).
#[derive(Clone)]
pub struct LogFollowers {
    inner: Arc<Inner>,
}

struct Inner {
    pollers: Mutex<HashMap<String, Poller>>,
    interval_ms: AtomicU64,
    next_id: AtomicU64,
    /// `maxSubscriptions`: the subscriptions of every session and listen together.
    max_subscriptions: usize,
}

struct Poller {
    /// Each subscriber with the URI it subscribed under, which its updates name.
    subscribers: HashMap<u64, (Subscriber, String)>,
    stop: CancellationToken,
    /// Becomes true once the first poll has answered (or failed): the lines before it are the
    /// baseline, and anything after a subscribe returned is news.
    baseline: tokio::sync::watch::Receiver<bool>,
    /// Tells this poller from one started later under the same URI (after the last
    /// subscriber left and a new one came) while the old task is still winding down.
    generation: u64,
}

/// One subscription; dropping it unsubscribes, and the last one gone stops the poller.
pub struct Following {
    inner: Weak<Inner>,
    /// The poller's key: the machine's fleet and name.
    key: String,
    id: u64,
}

impl Drop for Following {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            inner.remove(&self.key, self.id);
        }
    }
}

impl Inner {
    fn remove(&self, uri: &str, id: u64) {
        let Ok(mut pollers) = self.pollers.lock() else {
            return;
        };
        if let Some(poller) = pollers.get_mut(uri) {
            poller.subscribers.remove(&id);
            if poller.subscribers.is_empty() {
                poller.stop.cancel();
                pollers.remove(uri);
                tracing::debug!(%uri, "stopped following: no subscriber left");
            }
        }
    }

    /// The subscribers still there; a poller left with none is stopped and answers `None`.
    fn live_subscribers(&self, uri: &str, generation: u64) -> Option<Vec<(Subscriber, String)>> {
        let mut pollers = self.pollers.lock().ok()?;
        let poller = pollers.get_mut(uri)?;
        if poller.generation != generation || poller.stop.is_cancelled() {
            return None;
        }
        poller.subscribers.retain(|_, (s, _)| !s.gone());
        if poller.subscribers.is_empty() {
            poller.stop.cancel();
            pollers.remove(uri);
            tracing::debug!(%uri, "stopped following: the subscribers' sessions ended");
            return None;
        }
        Some(poller.subscribers.values().cloned().collect())
    }
}

impl LogFollowers {
    /// Followers that accept at most `max_subscriptions` subscriptions at once.
    pub fn new(max_subscriptions: usize) -> LogFollowers {
        LogFollowers {
            inner: Arc::new(Inner {
                pollers: Mutex::new(HashMap::new()),
                interval_ms: AtomicU64::new(DEFAULT_POLL_INTERVAL.as_millis() as u64),
                next_id: AtomicU64::new(1),
                max_subscriptions,
            }),
        }
    }

    /// Tests poll faster than a client would need.
    pub fn set_poll_interval(&self, interval: Duration) {
        self.inner
            .interval_ms
            .store(interval.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    /// How many machines' logs are being polled now.
    pub fn pollers(&self) -> usize {
        self.inner.pollers.lock().map(|p| p.len()).unwrap_or(0)
    }

    /// How many subscriptions there are now, every poller's together.
    pub fn subscriptions(&self) -> usize {
        self.inner
            .pollers
            .lock()
            .map(|p| p.values().map(|poller| poller.subscribers.len()).sum())
            .unwrap_or(0)
    }

    /// Subscribes to `uri`, the logs of `machine` on `kind`, starting the machine's poller if
    /// it is the first subscriber. Returns once the poller has its baseline (at most
    /// `BASELINE_WAIT`), so that a line written after the subscription was answered is
    /// reported. Refused past `maxSubscriptions`: each machine followed costs the engine a
    /// request every interval.
    pub async fn follow(
        &self,
        process: &Arc<Process>,
        kind: FleetKind,
        machine: &str,
        uri: &str,
        subscriber: Subscriber,
    ) -> Result<Following, ErrorData> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        // One poller per machine, however its URI was spelled.
        let key = format!("{}/{machine}", kind.as_str());
        let mut baseline = None;
        if let Ok(mut pollers) = self.inner.pollers.lock() {
            let held: usize = pollers.values().map(|p| p.subscribers.len()).sum();
            if held >= self.inner.max_subscriptions {
                return Err(ErrorData::invalid_params(
                    format!(
                        "uri: {} not followed: this server already holds {held} log \
                         subscriptions, its limit (maxSubscriptions, \
                         SMOL_MCP_MAX_SUBSCRIPTIONS); unsubscribe from one or end a listen first",
                        crate::policy::error::quote(uri)
                    ),
                    None,
                ));
            }
            let poller = pollers.entry(key.clone()).or_insert_with(|| {
                let stop = CancellationToken::new();
                let (has_baseline, baseline) = tokio::sync::watch::channel(false);
                tokio::spawn(poll(
                    Arc::downgrade(&self.inner),
                    process.clone(),
                    Followed {
                        kind,
                        machine: machine.to_owned(),
                        uri: key.clone(),
                        generation: id,
                    },
                    stop.clone(),
                    has_baseline,
                ));
                tracing::debug!(uri = %key, "following a log");
                Poller {
                    subscribers: HashMap::new(),
                    stop,
                    baseline,
                    generation: id,
                }
            });
            poller.subscribers.insert(id, (subscriber, uri.to_owned()));
            baseline = Some(poller.baseline.clone());
        }
        if let Some(mut baseline) = baseline {
            // A poller that takes longer (an engine being started) reports what arrives after
            // its first answer; the subscription stands either way.
            let _ = tokio::time::timeout(BASELINE_WAIT, baseline.wait_for(|b| *b)).await;
        }
        Ok(Following {
            inner: Arc::downgrade(&self.inner),
            key,
            id,
        })
    }
}

/// The log one poller follows.
struct Followed {
    kind: FleetKind,
    machine: String,
    uri: String,
    generation: u64,
}

/// Asks the fleet for what arrived since the cursor, every interval, until stopped. The lines
/// already there when following starts are not news; when the log does not exist yet (a machine
/// never started has none), everything that later appears is.
async fn poll(
    inner: Weak<Inner>,
    process: Arc<Process>,
    followed: Followed,
    stop: CancellationToken,
    has_baseline: tokio::sync::watch::Sender<bool>,
) {
    let Followed {
        kind,
        machine,
        uri,
        generation,
    } = followed;
    let tail = process.config.logs_tail.max(1);
    let mut cursor: Option<String> = None;
    let mut first = true;
    loop {
        if !first {
            let interval = match inner.upgrade() {
                Some(inner) => Duration::from_millis(inner.interval_ms.load(Ordering::Relaxed)),
                None => return,
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
        let Some(inner_now) = inner.upgrade() else {
            return;
        };
        let Some(subscribers) = inner_now.live_subscribers(&uri, generation) else {
            return;
        };
        drop(inner_now);
        let page = match process.fleet(kind).await {
            Ok(fleet) => tokio::select! {
                _ = stop.cancelled() => return,
                page = fleet.logs(&machine, tail, cursor.as_deref(), LogSource::default()) => page,
            },
            Err(e) => Err(e),
        };
        match page {
            Ok(page) => {
                let news = !first && !page.lines.is_empty();
                tracing::debug!(%uri, lines = page.lines.len(), news, "polled a followed log");
                cursor = Some(page.cursor);
                if news {
                    let mut gone = Vec::new();
                    for (i, (s, their_uri)) in subscribers.iter().enumerate() {
                        if !s.notify(their_uri).await {
                            gone.push(i);
                        }
                    }
                    if !gone.is_empty() {
                        tracing::debug!(%uri, gone = gone.len(), "subscribers gone");
                    }
                }
            }
            Err(e) => {
                // Not there yet (a machine that never started has no log) or not reachable
                // for now: the next poll tries again; the subscription stays.
                tracing::debug!(%uri, error = %e, "polling a followed log");
            }
        }
        if first {
            let _ = has_baseline.send(true);
        }
        first = false;
    }
}
