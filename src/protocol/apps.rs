//! MCP Apps (the `io.modelcontextprotocol/ui` extension, SEP-1865): three views a host shows
//! its person beside this server's tool calls, for clients that declared they show them.
//!  - machines, beside list-machines: the user's machines, their state and cost, published
//!    ports as links, open terminals and running jobs;
//!  - egress, beside run-command: the questions about a machine's egress waiting for the person,
//!    answered with a click (so a client that shows views but no forms can still ask a person);
//!  - terminal, beside terminal: the screen the program painted, following it, and what the
//!    person types reaching the program as the agent's typing does.
//!
//! Each is one self-contained HTML file (`generated/views/`, built from `src/protocol/apps/` by
//! `scripts/views/build.mjs`): no script, style or font from anywhere else, and no connection
//! (so its resource declares no CSP domains). A view reads and acts only through view-state and
//! the tools it sits beside, which the host calls on its server connection: every check a tool
//! call gets applies to it.

use crate::policy::tools::tool::views;
use rmcp::model::{Resource, ResourceContents};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};

/// The extension's identifier in `capabilities.extensions`.
pub const EXTENSION: &str = "io.modelcontextprotocol/ui";
/// The type of a view's resource.
pub const MIME_TYPE: &str = "text/html;profile=mcp-app";

struct View {
    uri: &'static str,
    name: &'static str,
    description: &'static str,
    html: &'static str,
}

const VIEWS: [View; 3] = [
    View {
        uri: views::MACHINES,
        name: "machines",
        description: "Your machines: state, cost so far, published ports (links), open \
                      terminals and running jobs.",
        html: include_str!("../../generated/views/machines.html"),
    },
    View {
        uri: views::EGRESS,
        name: "egress",
        description: "Questions about where a machine may connect, for you to answer yes or no.",
        html: include_str!("../../generated/views/egress.html"),
    },
    View {
        uri: views::TERMINAL,
        name: "terminal",
        description: "A terminal's screen as its program paints it; what you type reaches it.",
        html: include_str!("../../generated/views/terminal.html"),
    },
];

/// Whether these capabilities declare the extension with the view type this server serves.
pub fn declared_in(capabilities: &rmcp::model::ClientCapabilities) -> bool {
    capabilities
        .extensions
        .as_ref()
        .and_then(|e| e.get(EXTENSION))
        .and_then(|ui| ui.get("mimeTypes"))
        .and_then(serde_json::Value::as_array)
        .is_some_and(|types| types.iter().any(|t| t.as_str() == Some(MIME_TYPE)))
}

/// Whether the client behind this request shows views: declared in the request's own `_meta`
/// (2026-07-28), or at its session's `initialize`.
pub fn declared(context: &RequestContext<RoleServer>) -> bool {
    if crate::protocol::is_stateless(context) {
        return context
            .meta
            .client_capabilities()
            .is_some_and(|c| declared_in(&c));
    }
    context
        .peer
        .peer_info()
        .is_some_and(|info| declared_in(&info.capabilities))
}

/// What the server declares of the extension to a client that declared it.
pub fn server_settings() -> rmcp::model::JsonObject {
    rmcp::model::JsonObject::new()
}

pub fn is_view_uri(uri: &str) -> bool {
    uri.starts_with("ui://")
}

/// The views, for `resources/list` (only to a client that declared the extension).
pub fn resources() -> Vec<Resource> {
    VIEWS
        .iter()
        .map(|v| {
            Resource::new(v.uri, v.name)
                .with_description(v.description)
                .with_mime_type(MIME_TYPE)
                .with_size(v.html.len() as u64)
        })
        .collect()
}

/// `resources/read` of a view: refused, saying why, to a client that did not declare it shows
/// them (it would get a page it cannot run).
pub fn read(uri: &str, declared: bool) -> Result<Vec<ResourceContents>, ErrorData> {
    let Some(view) = VIEWS.iter().find(|v| v.uri == uri) else {
        let known: Vec<&str> = VIEWS.iter().map(|v| v.uri).collect();
        return Err(ErrorData::resource_not_found(
            format!(
                "no view {}; the views are {}",
                crate::policy::error::quote(uri),
                known.join(", ")
            ),
            None,
        ));
    };
    if !declared {
        return Err(ErrorData::invalid_params(
            format!(
                "{uri} is an MCP Apps view, served only to a client that declares the {EXTENSION} \
                 extension with mimeTypes [\"{MIME_TYPE}\"] in its capabilities; this one did not"
            ),
            None,
        ));
    }
    Ok(vec![
        ResourceContents::text(view.html, uri).with_mime_type(MIME_TYPE),
    ])
}
