//! `smol-mcp-http`: the MCP server over Streamable HTTP, one session per client, behind the
//! bearer token `SMOL_MCP_AUTH_TOKEN` (it refuses to start without one: these tools create and
//! run virtual machines, so an open listener would be a remote shell).
//!
//!     smol-mcp-http [--host H] [--port P] [--path /p]

use anyhow::{Context, bail};
use smol_mcp::backend::Backend;
use smol_mcp::config::Config;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

fn apply_flags(config: &mut Config, args: &[String]) -> anyhow::Result<()> {
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--host" => config.http_host = value.clone(),
            "--port" => {
                config.http_port = value.parse().ok().filter(|p| *p > 0).with_context(|| {
                    format!("--port must be a port from 1 to 65535, got {value}")
                })?
            }
            "--path" => {
                if !value.starts_with('/') {
                    bail!("--path must start with a slash, got {value}");
                }
                config.http_path = value.clone();
            }
            other => bail!("unknown argument {other} (accepted: --host, --port, --path)"),
        }
    }
    Ok(())
}

async fn run() -> anyhow::Result<ExitCode> {
    let mut config = Config::load().context("configuration")?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    apply_flags(&mut config, &args)?;
    if config.auth_token.is_empty() {
        bail!(
            "the HTTP transport requires SMOL_MCP_AUTH_TOKEN: these tools create and run virtual \
             machines, so an unauthenticated listener is a remote shell"
        );
    }
    let listener = tokio::net::TcpListener::bind((config.http_host.as_str(), config.http_port))
        .await
        .with_context(|| format!("binding {}:{}", config.http_host, config.http_port))?;
    let address = listener.local_addr().context("listener address")?;
    if smol_mcp::http::allowed_hosts(&config).is_empty() {
        tracing::warn!(
            "no Host allow-list for a listener bound to {}: set SMOL_MCP_HTTP_ALLOWED_HOSTS to the names clients dial, or the token is the only gate",
            config.http_host
        );
    }
    let path = config.http_path.clone();
    let backend = Arc::new(Backend::new(config.clone()).context("startup")?);
    {
        let backend = backend.clone();
        tokio::spawn(async move { backend.sweep_orphans_at_start().await });
    }
    let shutdown = CancellationToken::new();
    let app = smol_mcp::http::app(&config, backend.clone(), shutdown.clone());
    tracing::info!("listening for MCP over HTTP on http://{address}{path}");
    let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let server = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await
        })
    };
    let code = tokio::select! {
        _ = interrupt.recv() => 130,
        _ = terminate.recv() => 143,
    };
    tracing::info!("stopping: cleaning up every session's machines");
    shutdown.cancel();
    // Open event streams may keep a graceful shutdown waiting; do not wait for them long.
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    let cleanup = backend.shutdown_process().await;
    if !cleanup.failed.is_empty() {
        tracing::error!(failed = ?cleanup.failed, "some ephemeral machines could not be deleted; they stay recorded for the next start");
    }
    Ok(ExitCode::from(code))
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SMOL_MCP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .with_env_filter(filter)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("smol-mcp-http: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("smol-mcp-http: {e:#}");
            ExitCode::from(1)
        }
    }
}
