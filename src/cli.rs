//! What both server binaries do before they serve: log to stderr, build the runtime, and explain
//! their configuration in `--help`.

use crate::config::SETTINGS;

/// Logs go to stderr: on stdio, stdout is the protocol. Plain text without targets, since it
/// usually ends up in an MCP client's log pane rather than a terminal.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SMOL_MCP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"));
    // A subscriber already installed (only possible if a caller did so) keeps logging.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .with_env_filter(filter)
        .try_init();
}

/// Two workers: the servers mostly wait on the engine or the cloud, and an MCP client starts one
/// process per session, so a worker per core would only multiply idle threads.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// The settings, for the end of `--help`: every environment variable, its file key, what it
/// accepts and its default.
pub fn settings_help() -> String {
    let mut help = String::from(
        "Settings (environment over the JSON file at $SMOL_MCP_CONFIG, else \
         $XDG_CONFIG_HOME/smol-mcp/config.json, over the default; file keys in parentheses):\n",
    );
    for s in SETTINGS {
        let default = match (s.shown_default, s.default) {
            (Some(shown), _) => shown.replace('`', ""),
            (None, "") => "empty".to_owned(),
            (None, text) => text.to_owned(),
        };
        help.push_str(&format!(
            "  {} ({}): {} [default: {default}]\n",
            s.env, s.key, s.accepts
        ));
    }
    help.push_str(
        "Logs go to stderr; SMOL_MCP_LOG takes a tracing filter [default: info,rmcp=warn]",
    );
    help
}

/// Parses the command line, with the settings at the end of `--help`. `--help`, `--version` and
/// a usage error end the process here (exit 0, 0 and 2), before anything reads stdin.
pub fn parse_args<P: clap::Parser>() -> P {
    let matches = P::command().after_long_help(settings_help()).get_matches();
    P::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}
