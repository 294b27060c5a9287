//! `smol-mcp`: the MCP server on stdio. One session per process; when the client goes away
//! (stdin EOF) or the process is told to stop (SIGINT, SIGTERM, SIGHUP), the session's ephemeral
//! machines are deleted and a smolvm serve this process started is stopped.

#[path = "shared/http.rs"]
mod http;

use anyhow::Context;
use smol_mcp::app::serve;
use smol_mcp::process::config::Config;
use smol_mcp::protocol::server::SmolMcp;
use std::io::IsTerminal;
use std::process::ExitCode;

/// What a person who typed `smol-mcp` in a terminal needs to know.
const BY_HAND: &str = "smol-mcp speaks MCP (JSON-RPC) on stdin/stdout and is meant to be launched \
by an MCP client; `smol-mcp doctor` checks this host, `smol-mcp --help` lists the settings. \
Serving on this terminal until Ctrl-D.";

/// With no arguments: serve MCP on stdio.
#[derive(clap::Parser)]
#[command(
    name = "smol-mcp",
    version,
    about = "The MCP server on stdio: one session per process, for an MCP client to launch"
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Check whether the configured fleets can be used from this host, and what to do if not
    ///
    /// Prints the engine (where it was found, its version), KVM or Hypervisor.framework, the
    /// runtime directory, the cloud token and account, and what to do about each problem; then
    /// boots a small machine from the engine's bundled Alpine (no registry needed), runs one
    /// command in it, deletes it and says how long that took, or why guests do not boot here.
    /// Exits 1 when no served fleet is usable. Run it with the environment the MCP client gives
    /// the server. Nothing is booted on the cloud (it would cost money).
    Doctor {
        /// Only the static checks: boot nothing.
        #[arg(long)]
        quick: bool,
    },
    /// Serve MCP over Streamable HTTP instead of stdio, as smol-mcp-http does
    ///
    /// For a launcher that can run only this package's `smol-mcp` (uvx, the MCP registry's
    /// package entry). It needs SMOL_MCP_AUTH_TOKEN or SMOL_MCP_AUTH_ISSUER, as smol-mcp-http does.
    Http(http::HttpArgs),
}

/// `smol-mcp doctor`: the same facts as the smol://targets resource, for a person.
async fn doctor(quick: bool) -> anyhow::Result<ExitCode> {
    let config = Config::load().context("configuration")?;
    if !quick {
        eprintln!("smol-mcp doctor: checking, then booting a test machine (--quick skips it)...");
    }
    let (report, usable) = smol_mcp::app::doctor::doctor(config, quick).await;
    print!("{report}");
    Ok(ExitCode::from(if usable { 0 } else { 1 }))
}

async fn run() -> anyhow::Result<ExitCode> {
    let config = Config::load().context("configuration")?;
    let protocol = serve::start(config).await.context("startup")?;
    let session = format!("stdio-{}-{:08x}", std::process::id(), rand::random::<u32>());
    let server = SmolMcp::new(protocol.clone(), session.clone());
    // Not rmcp's stdio transport directly: it drops malformed lines without an answer.
    let serving = smol_mcp::protocol::server::stdio::serve_stdio(
        server,
        protocol.config().stdio_max_pending_requests,
    );
    let reason = serve::until_stopped(serving, "stdin closed")
        .await
        .context("signal handlers")?;
    tracing::info!("{reason}: cleaning up");
    Ok(serve::exit_code(&protocol.policy.shutdown(&session).await))
}

fn main() -> ExitCode {
    // An MCP client starts the server with no arguments: then there is nothing for clap to
    // parse, and its code need not be paged in (the process's peak memory counts those pages).
    let Args { command } = if std::env::args_os().len() > 1 {
        smol_mcp::app::cli::parse_args()
    } else {
        Args { command: None }
    };
    smol_mcp::app::cli::init_tracing();
    let runtime = match smol_mcp::app::cli::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("smol-mcp: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match command {
        Some(Command::Doctor { quick }) => {
            return match runtime.block_on(doctor(quick)) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("smol-mcp doctor: {e:#}");
                    ExitCode::from(1)
                }
            };
        }
        Some(Command::Http(args)) => {
            return match runtime.block_on(http::run(args)) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("smol-mcp http: {e:#}");
                    ExitCode::from(1)
                }
            };
        }
        None => {}
    }
    // Started by hand, the server would wait in silence for a client that is not coming.
    if std::io::stdin().is_terminal() {
        eprintln!("{BY_HAND}");
    }
    let code = match runtime.block_on(run()) {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::from(1)
        }
    };
    // A pending read on stdin cannot be cancelled; do not wait for it at runtime shutdown.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    code
}
