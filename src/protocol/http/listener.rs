//! The accept loop, in place of `axum::serve`, which has no header timeout, no limit on open
//! connections and leaves Nagle on: with it, twenty thousand idle or half-sent connections (no
//! token needed) used up the process's file descriptors, and every reply on a keep-alive
//! connection waited ~40 ms for the client's delayed ACK.
//!
//! The limit alone let slow clients starve the rest: 600 connections dribbling their headers or
//! bodies held every slot, and every legitimate call was refused for as long as they lasted. So
//! at the limit a new connection takes the slot of the one that has waited longest on its client
//! (no request of it being served: headers or a body still arriving, or idle between requests);
//! only when every open connection is serving a request is the new one refused.

use axum::Router;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// How long a refused connection is kept to let the client finish sending its request: closing
/// a socket with unread bytes sends a reset, which can destroy the 503 before the client reads it.
const REFUSAL_LINGER: Duration = Duration::from_millis(500);

struct Entry {
    /// Requests of the connection being served; 0 while it waits on its client.
    serving: usize,
    /// Since when it has been waiting (its accept, or the end of its last request).
    waiting_since: Instant,
    close: CancellationToken,
    /// The connection's slot: handed to the connection that displaces it, so that the slot
    /// cannot be taken by another in between.
    slot: OwnedSemaphorePermit,
}

/// The open connections, with what each is doing.
#[derive(Default)]
pub(crate) struct Connections {
    map: Mutex<HashMap<u64, Entry>>,
    next: AtomicU64,
}

impl Connections {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Entry>> {
        // Nothing panics while holding it; if something did, the entries are still usable.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn open(self: &Arc<Self>, slot: OwnedSemaphorePermit) -> (Connection, CancellationToken) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let close = CancellationToken::new();
        self.lock().insert(
            id,
            Entry {
                serving: 0,
                waiting_since: Instant::now(),
                close: close.clone(),
                slot,
            },
        );
        (
            Connection {
                connections: self.clone(),
                id,
            },
            close,
        )
    }

    /// Closes the connection that has waited longest on its client and answers its slot; none
    /// when every open connection is serving a request.
    fn displace_longest_waiting(&self) -> Option<OwnedSemaphorePermit> {
        let mut map = self.lock();
        let victim = map
            .iter()
            .filter(|(_, e)| e.serving == 0)
            .min_by_key(|(_, e)| e.waiting_since)
            .map(|(id, _)| *id);
        let entry = map.remove(&victim?)?;
        entry.close.cancel();
        Some(entry.slot)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// One open connection, as its requests see it (an extension of each request).
#[derive(Clone)]
pub(crate) struct Connection {
    connections: Arc<Connections>,
    id: u64,
}

impl Connection {
    /// The connection serves a request (its body has arrived and it passed the guard) until
    /// the returned value is dropped, and meanwhile no new connection may take its slot.
    pub(crate) fn serving(&self) -> Serving {
        if let Some(e) = self.connections.lock().get_mut(&self.id) {
            e.serving += 1;
        }
        Serving(self.clone())
    }

    fn closed(&self) {
        self.connections.lock().remove(&self.id);
    }
}

pub(crate) struct Serving(Connection);

impl Drop for Serving {
    fn drop(&mut self) {
        if let Some(e) = self.0.connections.lock().get_mut(&self.0.id) {
            e.serving = e.serving.saturating_sub(1);
            if e.serving == 0 {
                e.waiting_since = Instant::now();
            }
        }
    }
}

/// Serves until `shutdown`, then stops accepting and lets open connections finish (the caller
/// bounds how long it waits).
pub(crate) async fn accept_loop(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: CancellationToken,
) {
    let max = limits.max_connections;
    let open = Arc::new(Semaphore::new(max));
    // Refusals are bounded too, else a flood would hold a descriptor per refused socket for
    // the linger time; past this bound a connection is closed without an answer.
    let refusing = Arc::new(Semaphore::new(max));
    let connections = Arc::new(Connections::default());
    let mut builder = http1::Builder::new();
    // The header timeout also runs while a keep-alive connection waits for its next request
    // (hyper starts it on every head read), so idle connections are closed after it too.
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors (EMFILE) or a connection reset before accept: back off
                    // rather than spin, and keep serving the connections already open.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // A reply is written in more than one write; with Nagle on, the second waits for the
        // client's delayed ACK (~40 ms on Linux) on every keep-alive request.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let serve = Serve {
            builder: builder.clone(),
            app: app.clone(),
            connections: connections.clone(),
            shutdown: shutdown.clone(),
        };
        let slot = match open.clone().try_acquire_owned() {
            Ok(slot) => Some(slot),
            Err(_) => connections.displace_longest_waiting(),
        };
        if let Some(slot) = slot {
            tokio::spawn(serve.run(stream, slot));
            continue;
        }
        if let Ok(refusal) = refusing.clone().try_acquire_owned() {
            tokio::spawn(async move {
                refuse(stream, max).await;
                drop(refusal);
            });
        }
    }
    drop(listener);
    // A connection's slot comes back when it has finished or was displaced: all back, all done.
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    let _ = open.acquire_many(all).await;
}

struct Serve {
    builder: http1::Builder,
    app: Router,
    connections: Arc<Connections>,
    shutdown: CancellationToken,
}

impl Serve {
    /// One connection, until it ends, is displaced, or the server stops (then its request in
    /// flight is finished first).
    async fn run(self, stream: TcpStream, slot: OwnedSemaphorePermit) {
        if self.shutdown.is_cancelled() {
            return;
        }
        let (connection, displaced) = self.connections.open(slot);
        let tagged = connection.clone();
        // Nothing per connection beyond hyper's own state, its entry in `Connections` and a
        // clone of the router (reference counts): an unauthenticated connection costs no
        // session and no MCP work.
        let app = self.app;
        let service = tower::service_fn(move |mut request: Request<Incoming>| {
            request.extensions_mut().insert(tagged.clone());
            let app = app.clone();
            async move {
                let (request, read) = ReadToEnd::track(request);
                let mut response = app.oneshot(request).await?;
                // An answer given before the request's body was read (a 401, a 404, a refused
                // Host): hyper then closes the connection rather than read the rest, but the
                // head it wrote did not say so, and a client that sends its next request on the
                // connection loses it ("Server disconnected without sending a response": the
                // Python client's sign-in, about one run in six). Said, the client opens a new one.
                if read.is_some_and(|read| !read.load(Ordering::Relaxed)) {
                    response.headers_mut().insert(
                        axum::http::header::CONNECTION,
                        axum::http::HeaderValue::from_static("close"),
                    );
                }
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let conn = self
            .builder
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        tokio::pin!(conn);
        let ended = tokio::select! {
            ended = conn.as_mut() => ended,
            // Dropping the connection closes its socket.
            () = displaced.cancelled() => {
                tracing::debug!("closed a waiting connection to make room for a new one");
                Ok(())
            }
            () = self.shutdown.cancelled() => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        if let Err(e) = ended {
            tracing::debug!(error = %e, "connection ended");
        }
        connection.closed();
    }
}

/// A request's body that notes when it has been read to its end.
struct ReadToEnd {
    body: Incoming,
    read: Arc<std::sync::atomic::AtomicBool>,
}

impl ReadToEnd {
    /// `request` with its body tracked, and the flag that says it was read; no flag for a
    /// request without a body (nothing is left unread).
    fn track(
        request: Request<Incoming>,
    ) -> (
        Request<axum::body::Body>,
        Option<Arc<std::sync::atomic::AtomicBool>>,
    ) {
        use axum::body::HttpBody as _;
        if request.body().is_end_stream() {
            return (request.map(axum::body::Body::new), None);
        }
        let read = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = read.clone();
        (
            request.map(|body| axum::body::Body::new(ReadToEnd { body, read })),
            Some(flag),
        )
    }
}

impl axum::body::HttpBody for ReadToEnd {
    type Data = axum::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None)) || self.body.is_end_stream() {
            self.read.store(true, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// The answer past the connection limit: a complete 503 with `Retry-After`, then close.
async fn refuse(mut stream: TcpStream, max: usize) {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "error": {
            "code": -32000,
            "message": format!("too many connections: this server holds at most {max} at once (httpMaxConnections), all of them serving requests; retry shortly"),
        },
        "id": null,
    })
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(response.as_bytes()).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(REFUSAL_LINGER, async {
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_waiting_connection_is_displaced_never_one_serving() {
        let connections = Arc::new(Connections::default());
        let slots = Arc::new(Semaphore::new(3));
        let slot = || slots.clone().try_acquire_owned().unwrap();
        let (old, old_closed) = connections.open(slot());
        let (busy, busy_closed) = connections.open(slot());
        let (young, young_closed) = connections.open(slot());
        let serving = busy.serving();
        // `old` waited longest, but a request it finishes starts its wait again.
        std::thread::sleep(Duration::from_millis(2));
        drop(old.serving());
        let taken = connections.displace_longest_waiting();
        assert!(taken.is_some());
        assert!(young_closed.is_cancelled(), "young waited longest now");
        assert!(!old_closed.is_cancelled() && !busy_closed.is_cancelled());
        assert_eq!(slots.available_permits(), 0, "the slot was handed over");
        drop(taken);
        assert!(connections.displace_longest_waiting().is_some());
        assert!(old_closed.is_cancelled());
        assert!(
            connections.displace_longest_waiting().is_none(),
            "the one left is serving a request"
        );
        assert!(!busy_closed.is_cancelled());
        drop(serving);
        assert_eq!(connections.len(), 1);
        busy.closed();
        young.closed();
        assert_eq!(connections.len(), 0);
        assert_eq!(slots.available_permits(), 3);
    }
}
