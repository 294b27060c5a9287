//! A tool call's structured result or tool error, as the `CallToolResult` MCP answers with,
//! whether the call answered its request or a task's `tasks/get`.

use crate::policy::tools::{ToolError, results::Answer};
use rmcp::model::{CallToolResult, ContentBlock};

pub fn into_result(result: Result<Answer, ToolError>) -> CallToolResult {
    match result {
        Ok(answer) => {
            // Compact, on one line: a text-only client finds the page after the first newline.
            let text = serde_json::to_string(&answer.structured).unwrap_or_default();
            // Not CallToolResult::structured, which would serialize the value a second time for
            // a text block this replaces anyway.
            let mut content = vec![ContentBlock::text(text)];
            content.extend(answer.page.map(|page| match answer.image {
                Some(mime_type) => ContentBlock::image(page, mime_type),
                None => ContentBlock::text(page),
            }));
            let mut r = CallToolResult::success(content);
            r.structured_content = Some(answer.structured);
            r
        }
        Err(e) => {
            tracing::debug!(code = e.code(), message = %e.message, "tool error");
            CallToolResult::error(vec![ContentBlock::text(e.to_string())])
        }
    }
}
