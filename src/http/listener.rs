//! The accept loop, in place of `axum::serve`, which has no header timeout, no limit on open
//! connections and leaves Nagle on: with it, twenty thousand idle or half-sent connections (no
//! token needed) used up the process's file descriptors, and every reply on a keep-alive
//! connection waited ~40 ms for the client's delayed ACK.

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// How long a refused connection is kept to let the client finish sending its request: closing
/// a socket with unread bytes sends a reset, which can destroy the 503 before the client reads it.
const REFUSAL_LINGER: Duration = Duration::from_millis(500);

/// Serves until `shutdown`, then stops accepting and lets open connections finish (the caller
/// bounds how long it waits).
pub(crate) async fn accept_loop(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: CancellationToken,
) {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    // Refusals are bounded too, else a flood would hold a descriptor per refused socket for
    // the linger time; past this bound a connection is closed without an answer.
    let refusing = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
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
        let Ok(permit) = open.clone().try_acquire_owned() else {
            if let Ok(refusal) = refusing.clone().try_acquire_owned() {
                let max = limits.max_connections;
                tokio::spawn(async move {
                    refuse(stream, max).await;
                    drop(refusal);
                });
            }
            continue;
        };
        // Nothing per connection beyond hyper's own state and a clone of the router (reference
        // counts): an unauthenticated connection costs no session and no MCP work.
        let connection =
            builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The answer past the connection limit: a complete 503 with `Retry-After`, then close.
async fn refuse(mut stream: TcpStream, max: usize) {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "error": {
            "code": -32000,
            "message": format!("too many connections: this server holds at most {max} at once; retry shortly"),
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
