//! MCP itself: the handler of one session (`server`), the resources (`resources`), and the two
//! transports in front of it (`server::stdio`, `http`). What this floor holds for every session
//! of a process is [`Protocol`]: the policy below it, and the two things that outlive one
//! request but exist only because of the protocol, the logs clients follow and the calls
//! carried on as MCP tasks.
//!
//! Within the floor the order is `resources` < [`Protocol`] (this file) < `server` < `http`.

pub mod answer;
pub mod apps;
pub mod follow;
pub mod http;
pub mod resources;
pub mod server;
pub mod skills;
pub mod tasks;

use crate::policy::Policy;
use crate::process::config::Config;
use crate::process::{Mode, Process, StartupError};
use std::sync::Arc;

/// What the protocol floor holds for a process, shared by all its sessions.
pub struct Protocol {
    pub policy: Arc<Policy>,
    /// The logs clients follow, one poller each, shared by every session of the process.
    pub follow: follow::LogFollowers,
    /// Long calls carried on as MCP tasks; here because they outlive the handler of their
    /// request (over HTTP rmcp builds one for every 2026-07-28 request).
    pub tasks: tasks::Tasks,
    /// What `get_info` answers, made once: it depends on the settings alone, and rmcp asks
    /// for it on every sessionless request (building it, instructions included, was 4% of
    /// such a call's time under wrk: docs/benchmarks.md).
    pub(crate) server_info: std::sync::OnceLock<rmcp::model::ServerConfig>,
}

impl Protocol {
    pub fn new(policy: Arc<Policy>) -> Protocol {
        let config = &policy.process.config;
        Protocol {
            follow: follow::LogFollowers::new(config.max_subscriptions),
            tasks: tasks::Tasks::new(
                config.max_tasks,
                config.user_share_percent,
                policy.store.clone(),
            ),
            policy,
            server_info: std::sync::OnceLock::new(),
        }
    }

    /// The whole stack for a server process, from its settings.
    pub fn start(config: Config) -> Result<Arc<Protocol>, StartupError> {
        Ok(Arc::new(Protocol::new(Policy::start(config)?)))
    }

    pub fn process(&self) -> &Arc<Process> {
        &self.policy.process
    }

    pub fn config(&self) -> &Config {
        &self.policy.process.config
    }

    pub fn mode(&self) -> Mode {
        self.policy.process.mode
    }
}

/// The user a request is for: the one the HTTP guard signed in (`crate::protocol::http`), else
/// (stdio, or the static token) the operator.
pub fn user_of(
    context: &rmcp::service::RequestContext<rmcp::RoleServer>,
) -> crate::policy::user::User {
    user_in(&context.extensions)
}

/// The same, from a message's extensions (a notification's as well as a request's).
pub fn user_in(extensions: &rmcp::model::Extensions) -> crate::policy::user::User {
    extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<crate::policy::user::User>().cloned())
        .unwrap_or_else(crate::policy::user::User::operator)
}

/// Whether this request follows the 2026-07-28 lifecycle: it says so in its own `_meta`. Asked
/// per request, since one stdio process can see both kinds.
pub fn is_stateless(context: &rmcp::service::RequestContext<rmcp::RoleServer>) -> bool {
    context
        .meta
        .protocol_version()
        .is_some_and(|v| v >= rmcp::model::ProtocolVersion::V_2026_07_28)
}
