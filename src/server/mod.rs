//! The MCP server: the policy layer that maps the tools onto the fleets.

pub mod args;
pub mod backend;
pub mod catalog;
pub mod ephemeral;
pub mod local_serve;
pub mod output;
pub mod results;
mod tools;

use crate::error::FleetError;
use crate::fleet::FleetKind;
pub use backend::{Backend, Cleanup, StartupError};
use catalog::Mode;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use std::sync::Arc;

/// A tool failure the agent reads: `CODE: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    pub code: String,
    pub message: String,
}

impl ToolError {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        ToolError {
            code: code.into(),
            message: message.into(),
        }
    }

    fn record(e: ephemeral::RecordError) -> Self {
        ToolError::new("RECORD", e.to_string())
    }

    pub fn cancelled() -> Self {
        ToolError::new("CANCELLED", "the client cancelled this call")
    }
}

impl From<FleetError> for ToolError {
    fn from(e: FleetError) -> Self {
        ToolError::new(e.kind.code(), e.to_string())
    }
}

/// A tool's successful answer: the structured result and any extra content blocks.
pub struct ToolOutput {
    pub structured: serde_json::Value,
    pub extra: Vec<ContentBlock>,
}

/// One MCP session's server. Sessions of one process share the `Backend`.
#[derive(Clone)]
pub struct SmolMcp {
    backend: Arc<Backend>,
    session: Arc<str>,
    tools: Arc<Vec<Tool>>,
    _end: Option<Arc<SessionEnd>>,
}

/// Deletes a session's ephemeral machines when the last handle on the session goes: an HTTP
/// session closed by DELETE, by its idle timeout, or by the server shutting down.
struct SessionEnd {
    backend: Arc<Backend>,
    session: Arc<str>,
}

impl Drop for SessionEnd {
    fn drop(&mut self) {
        let (backend, session) = (self.backend.clone(), self.session.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let cleanup = backend.cleanup_session(&session).await;
                tracing::info!(%session, deleted = ?cleanup.deleted, "session closed");
            });
        }
    }
}

impl SmolMcp {
    pub fn new(backend: Arc<Backend>, session: impl Into<Arc<str>>) -> Self {
        let tools = backend.catalog();
        SmolMcp {
            backend,
            session: session.into(),
            tools,
            _end: None,
        }
    }

    /// A session whose ephemeral machines are deleted when it is dropped (HTTP sessions; the
    /// stdio binary cleans up explicitly before it exits).
    pub fn cleaning_up_on_drop(mut self) -> Self {
        self._end = Some(Arc::new(SessionEnd {
            backend: self.backend.clone(),
            session: self.session.clone(),
        }));
        self
    }

    pub fn session(&self) -> &str {
        &self.session
    }

    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }

    fn instructions(&self) -> String {
        let mut text = match self.backend.mode {
            Mode::Both => "This server gives you microVMs (smol machines) to run commands and keep files in, \
                on two fleets: local (smolvm serve on this host, free) and cloud (smol cloud, billed \
                while a machine exists). Every tool takes a required target argument, local or cloud, \
                with no default: a machine on one fleet is invisible on the other."
                .to_owned(),
            Mode::Single(kind) => format!(
                "This server gives you microVMs (smol machines) to run commands and keep files in, on \
                 the {} fleet only; the tools take no target argument.",
                kind.as_str()
            ),
        };
        text.push_str(
            "\n\nMachines get no network egress unless create-machine or run-once asks for it \
             (network, allowHosts, allowCidrs). Pulling a registry image needs egress on the local fleet. \
             Machines created without a name are deleted when this session ends.",
        );
        if self.backend.serves(FleetKind::Cloud) {
            text.push_str(
                "\n\nOn cloud, machine-logs reads the control plane's event log, pull-image is refused \
                 (the service pulls at create), and every machine costs money until deleted.",
            );
        }
        text
    }
}

impl ServerHandler for SmolMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("smol-mcp", env!("CARGO_PKG_VERSION")))
            .with_instructions(self.instructions())
    }

    /// Up to 2025-11-25 only: the 2026-07-28 lifecycle has no sessions, and ephemeral machines
    /// belong to a session. Clients that offer both fall back to the `initialize` handshake.
    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.as_ref().clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        if !catalog::TOOL_NAMES.contains(&name.as_str()) {
            return Err(ErrorData::invalid_params(
                format!(
                    "no tool named {name}; the tools are {}",
                    catalog::TOOL_NAMES.join(", ")
                ),
                None,
            ));
        }
        let args = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let tools = tools::Tools {
            backend: &self.backend,
            session: &self.session,
            ct: context.ct,
            used: std::sync::OnceLock::new(),
        };
        let result = tools.call(&name, args).await;
        Ok(CallToolResponse::Complete(into_result(result)))
    }
}

fn into_result(result: Result<ToolOutput, ToolError>) -> CallToolResult {
    match result {
        Ok(out) => {
            // Compact: a page of a file is megabytes, and indentation would only add to them.
            let text = serde_json::to_string(&out.structured).unwrap_or_default();
            // Not CallToolResult::structured, which would serialize the value a second time for
            // a text block this replaces anyway.
            let mut content = vec![ContentBlock::text(text)];
            content.extend(out.extra);
            let mut r = CallToolResult::success(content);
            r.structured_content = Some(out.structured);
            r
        }
        Err(e) => {
            tracing::debug!(code = %e.code, message = %e.message, "tool error");
            CallToolResult::error(vec![ContentBlock::text(format!(
                "{}: {}",
                e.code, e.message
            ))])
        }
    }
}
