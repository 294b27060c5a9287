//! `smol-mcp-http`: the MCP server over Streamable HTTP, one session per client, behind the
//! bearer token `SMOL_MCP_AUTH_TOKEN` or OAuth sign-in with the issuer `SMOL_MCP_AUTH_ISSUER`
//! (it refuses to start with neither: these tools create and run virtual machines, so an open
//! listener would be a remote shell). `smol-mcp http` is the same server.
//!
//!     smol-mcp-http [--host H] [--port P] [--path /p]   (`--help` lists the settings)

#[path = "shared/http.rs"]
mod http;

use std::process::ExitCode;

/// mimalloc: a sessionless call allocates and frees often enough that glibc's malloc was a
/// quarter of its instructions (docs/benchmarks.md, "Where an HTTP call's time goes").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(clap::Parser)]
#[command(
    name = "smol-mcp-http",
    version,
    about = "The MCP server over Streamable HTTP, one session per client, behind the bearer token SMOL_MCP_AUTH_TOKEN"
)]
struct Args {
    #[command(flatten)]
    http: http::HttpArgs,
}

fn main() -> ExitCode {
    let args: Args = smol_mcp::app::cli::parse_args();
    smol_mcp::app::cli::init_tracing();
    let runtime = match smol_mcp::app::cli::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("smol-mcp-http: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(http::run(args.http)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("smol-mcp-http: {e:#}");
            ExitCode::from(1)
        }
    }
}
