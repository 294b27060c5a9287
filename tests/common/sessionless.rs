//! A sessionless (2026-07-28) tools/call over Streamable HTTP, as the raw-HTTP tests and the
//! HTTP benchmarks send it, and the JSON-RPC answer read out of its reply.

use serde_json::{Value, json};

/// The request's body: `tool` with `args`, its `_meta` as that lifecycle has it, the client
/// named `client`.
pub fn body(id: u64, tool: &str, args: Value, client: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": tool, "arguments": args, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": client, "version": "0"}}}})
}

/// `body` posted to `url` with `token` and the headers the lifecycle asks of a tools/call.
pub fn post(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    tool: &str,
    body: &Value,
) -> reqwest::RequestBuilder {
    request(http, url, token, ("tools/call", tool), body)
}

/// The same for any `(method, name)`: the name is the tool's, the task's or the resource's.
pub fn request(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    (method, name): (&str, &str),
    body: &Value,
) -> reqwest::RequestBuilder {
    http.post(url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .header("mcp-name", name)
        .json(body)
}

/// The JSON-RPC answer in a reply: a JSON body, or the event of an SSE stream that answers a
/// request (an id, and no method of its own).
pub fn answer_in(text: &str) -> Option<Value> {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return Some(v);
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("id").is_some() && v.get("method").is_none())
}
