//! What both servers do around serving: the start (the stack, and the sweep of what a dead
//! predecessor left, off the first call's path), the wait for the end (the transport's own, or a
//! stop signal), and the exit code once the machines are cleaned up.

use crate::process::Cleanup;
use crate::process::config::Config;
use crate::protocol::Protocol;
use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;
use tokio::signal::unix::{SignalKind, signal};

/// Why a server does not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Stack(#[from] crate::process::StartupError),
    /// A shared database this server cannot reach or use, or whose schema is newer than it
    /// knows: a process serving without it would answer as a server that does not know its
    /// siblings' work.
    #[error("the store (storeUrl): {0}")]
    Store(#[from] crate::store::StoreUnavailable),
}

/// The protocol stack for `config`, its store opened, with a dead predecessor's orphans swept
/// in the background and the reaper of expired leases and kept machines running until the
/// clean-up at exit. The store opens first: with a shared one the sweep reads its record.
pub async fn start(config: Config) -> Result<Arc<Protocol>, StartError> {
    start_with(config, false).await
}

/// As [`start`], for HTTP: a previous server's leased machines that a sessionless client may
/// still use become this one's first, before the orphan sweep can find them.
pub async fn start_http(config: Config) -> Result<Arc<Protocol>, StartError> {
    start_with(config, true).await
}

async fn start_with(config: Config, adopt_leased: bool) -> Result<Arc<Protocol>, StartError> {
    let protocol = Protocol::start(config)?;
    protocol.policy.store.ready().await?;
    // Every process sharing the store seals requestStates alike, before any is sealed.
    let key = protocol.policy.store.sealing_key()?;
    // One host's processes each keep their own key (and a test's servers in one process, the
    // first one's): only a shared key not taken up is worth a word.
    if !crate::protocol::server::sealed::use_key(key) && protocol.policy.store.is_shared() {
        tracing::warn!(
            "requestStates were sealed before the shared key was read: answers given through another process will be refused"
        );
    }
    if adopt_leased {
        protocol.process().adopt_leased_machines().await;
    }
    let process = protocol.process().clone();
    tokio::spawn(async move { process.sweep_orphans_at_start().await });
    tokio::spawn(protocol.process().clone().reap());
    tokio::spawn(protocol.policy.clone().watch_siblings());
    tokio::spawn(protocol.policy.clone().forget_gone_owners());
    tokio::spawn(protocol.policy.clone().park_idle());
    Ok(protocol)
}

/// Serves until `serving` ends (answering `ended`) or a stop signal comes (answering its name).
/// SIGHUP too: a closed terminal or a supervisor's reload would otherwise kill the process
/// before its machines are deleted.
pub async fn until_stopped(
    serving: impl Future<Output = ()>,
    ended: &'static str,
) -> std::io::Result<&'static str> {
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut hangup = signal(SignalKind::hangup())?;
    Ok(tokio::select! {
        _ = serving => ended,
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
        _ = hangup.recv() => "SIGHUP",
    })
}

/// The exit code once the clean-up ran. A stop that was asked for and done is a success,
/// whichever signal asked: supervisors (systemd without SuccessExitStatus=, container runtimes)
/// read 128+N from a process that handled the signal as a failure.
pub fn exit_code(cleanup: &Cleanup) -> ExitCode {
    if cleanup.failed.is_empty() {
        return ExitCode::SUCCESS;
    }
    tracing::error!(failed = ?cleanup.failed, "some ephemeral machines could not be deleted; they stay recorded for the next start");
    ExitCode::from(1)
}
