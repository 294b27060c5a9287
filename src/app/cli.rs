//! What both server binaries do before they serve: log to stderr, build the runtime, and explain
//! their configuration in `--help`.

use crate::process::config::SETTINGS;
use tracing::field::{Field, Visit};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata};
use tracing_subscriber::filter::{EnvFilter, FilterExt, LevelFilter};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Filter, Layer, SubscriberExt};
use tracing_subscriber::registry::Registry;
use tracing_subscriber::util::SubscriberInitExt;

/// The log filter when SMOL_MCP_LOG is unset or unreadable.
pub const DEFAULT_LOG: &str = "info,rmcp=warn";

/// Logs go to stderr: on stdio, stdout is the protocol. Plain text without targets, since it
/// usually ends up in an MCP client's log pane rather than a terminal.
pub fn init_tracing() {
    // A subscriber already installed (only possible if a caller did so) keeps logging.
    let _ = match EnvFilter::try_from_env("SMOL_MCP_LOG") {
        Ok(chosen) => subscriber(chosen, std::io::stderr).try_init(),
        Err(_) => subscriber(default_filter(), std::io::stderr).try_init(),
    };
}

fn subscriber<F, W>(filter: F, writer: W) -> impl tracing::Subscriber + Send + Sync + 'static
where
    F: Filter<Registry> + Send + Sync + 'static,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::registry().with(
        tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .with_ansi(false)
            .with_target(false)
            .with_filter(filter),
    )
}

/// DEFAULT_LOG, less rmcp's report of a response it could not deliver to a client that had
/// already gone (a 2026-07-28 client ending a listen or dropping a call): rmcp logs it as an
/// error, a dozen times a session, and nothing is wrong. Only the default drops it: a filter
/// the operator chose in SMOL_MCP_LOG sees it as rmcp emits it.
fn default_filter() -> impl Filter<Registry> + Send + Sync + 'static {
    EnvFilter::new(DEFAULT_LOG).and(ClientGone)
}

/// rmcp 3.11's words in `rmcp::service`, while it drains the responses of a closed transport.
const CLIENT_GONE: &str = "failed to send pending response during drain";

struct ClientGone;

impl ClientGone {
    fn may_be(meta: &Metadata<'_>) -> bool {
        meta.is_event() && *meta.level() == Level::ERROR && meta.target() == "rmcp::service"
    }
}

impl<S> Filter<S> for ClientGone {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        // Only the message tells this event from rmcp's other errors, so those callsites are
        // asked event by event.
        if Self::may_be(meta) {
            Interest::sometimes()
        } else {
            Interest::always()
        }
    }

    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
        if !Self::may_be(event.metadata()) {
            return true;
        }
        let mut message = MessageIs {
            expected: CLIENT_GONE,
            matches: false,
        };
        event.record(&mut message);
        !message.matches
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::TRACE)
    }
}

struct MessageIs {
    expected: &'static str,
    matches: bool,
}

impl Visit for MessageIs {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.matches = value == self.expected;
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.matches = format!("{value:?}") == self.expected;
        }
    }
}

/// Two workers: the servers mostly wait on the engine or the cloud, and an MCP client starts one
/// process per session, so a worker per core would only multiply idle threads. Two even in a
/// process held to part of a core: one there spent more CPU a call, not less (the scaling
/// benchmark, docs/benchmarks.md).
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
    // Neither is a setting of this server, and both are what a first local run trips on.
    help.push_str(
        "The engine (local fleet): SMOLVM if set, else the one installed with this server (the \
         smolmachines package in the environment of its binary: `pipx install .` brings it), \
         else smolvm on PATH, else smol-vmm of the smolmachines package, looked for in \
         ~/.local/share/smol-mcp/engine/<version>/smol-vmm \
         (scripts/install-engine.sh), the venv ~/.local/share/smol-mcp/venv, the user's, pipx's \
         and the system's site-packages, and an active VIRTUAL_ENV; `smol-mcp doctor` shows \
         which one is used.\n\
         As root, the engine refuses to start unless SMOLVM_VM_UID_DROP=off is in the server's \
         environment (the env of the MCP client's entry for it).\n",
    );
    help.push_str(&format!(
        "Logs go to stderr; SMOL_MCP_LOG takes a tracing filter [default: {DEFAULT_LOG}, less \
         rmcp's \"{CLIENT_GONE}\", which only means the client left]"
    ));
    help
}

/// Parses the command line, with the settings at the end of `--help`. `--help`, `--version` and
/// a usage error end the process here (exit 0, 0 and 2), before anything reads stdin.
pub fn parse_args<P: clap::Parser>() -> P {
    let matches = P::command().after_long_help(settings_help()).get_matches();
    P::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn rmcp_events() {
        tracing::error!(target: "rmcp::service", error = "closed", "failed to send pending response during drain");
        tracing::error!(target: "rmcp::service", "response send task failed during drain");
        tracing::warn!(target: "rmcp::service", "timed out draining in-flight responses");
        tracing::info!(target: "rmcp::service", "rmcp chatter");
        tracing::info!("our own news");
    }

    #[test]
    fn the_default_log_drops_only_the_client_gone_error() {
        let out = Captured::default();
        tracing::subscriber::with_default(subscriber(default_filter(), out.clone()), rmcp_events);
        let text = out.text();
        assert!(!text.contains(CLIENT_GONE), "{text}");
        for kept in [
            "response send task failed during drain",
            "timed out draining in-flight responses",
            "our own news",
        ] {
            assert!(text.contains(kept), "{kept} is still logged: {text}");
        }
        assert!(
            !text.contains("rmcp chatter"),
            "rmcp=warn still holds: {text}"
        );
    }

    #[test]
    fn a_chosen_filter_sees_the_client_gone_error() {
        let out = Captured::default();
        let chosen = EnvFilter::new("warn");
        tracing::subscriber::with_default(subscriber(chosen, out.clone()), rmcp_events);
        assert!(out.text().contains(CLIENT_GONE), "{}", out.text());
    }
}
