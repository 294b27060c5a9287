//! The Streamable HTTP server's start, shared by `smol-mcp-http` and `smol-mcp http` (the
//! registry's package entry can only run the package's `smol-mcp`): its flags, the listener,
//! serving until a signal, and the clean-up.

use anyhow::Context;
use smol_mcp::app::serve;
use smol_mcp::process::config::Config;
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Flags override the configuration's httpHost, httpPort and httpPath.
#[derive(clap::Args)]
pub struct HttpArgs {
    /// The address to listen on [default: httpHost, 127.0.0.1]
    #[arg(long, value_name = "HOST")]
    host: Option<String>,
    /// The port to listen on, 1 to 65535 [default: httpPort, 8080]
    #[arg(long, value_name = "PORT", value_parser = port)]
    port: Option<u16>,
    /// The MCP endpoint's path, starting with a slash [default: httpPath, /mcp]
    #[arg(long, value_name = "PATH", value_parser = path)]
    path: Option<String>,
}

fn port(value: &str) -> Result<u16, String> {
    value
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("--port must be a port from 1 to 65535, got {value}"))
}

fn path(value: &str) -> Result<String, String> {
    if value.starts_with('/') {
        Ok(value.to_owned())
    } else {
        Err(format!("--path must start with a slash, got {value}"))
    }
}

impl HttpArgs {
    fn apply(self, config: &mut Config) {
        if let Some(host) = self.host {
            config.http_host = host;
        }
        if let Some(port) = self.port {
            config.http_port = port;
        }
        if let Some(path) = self.path {
            config.http_path = path;
        }
    }
}

pub async fn run(args: HttpArgs) -> anyhow::Result<ExitCode> {
    let mut config = Config::load().context("configuration")?;
    args.apply(&mut config);
    let access = smol_mcp::protocol::http::Access::from_config(&config)?;
    let listener = tokio::net::TcpListener::bind((config.http_host.as_str(), config.http_port))
        .await
        .with_context(|| format!("binding {}:{}", config.http_host, config.http_port))?;
    let address = listener.local_addr().context("listener address")?;
    if smol_mcp::protocol::http::allowed_hosts(&config).is_empty() {
        tracing::warn!(
            "no Host allow-list for a listener bound to {}: set SMOL_MCP_HTTP_ALLOWED_HOSTS to the names clients dial, or the token is the only gate",
            config.http_host
        );
    }
    let path = config.http_path.clone();
    let protocol = serve::start_http(config.clone()).await.context("startup")?;
    let shutdown = CancellationToken::new();
    tracing::info!("listening for MCP over HTTP on http://{address}{path}");
    let server = tokio::spawn(smol_mcp::protocol::http::serve(
        listener,
        &config,
        access,
        protocol.clone(),
        shutdown.clone(),
    ));
    // The listener serves until a signal: its own end is the shutdown below.
    let reason = serve::until_stopped(std::future::pending(), "never")
        .await
        .context("signal handlers")?;
    tracing::info!("{reason}: stopping, cleaning up every session's machines");
    shutdown.cancel();
    // Open event streams may keep a graceful shutdown waiting; do not wait for them long.
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    Ok(serve::exit_code(&protocol.policy.shutdown_process().await))
}
