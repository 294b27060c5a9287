//! What the HTTP benchmarks share: their shape from the environment, a JSON-RPC answer read
//! from a reply whether it came as JSON or as an event stream, and an OAuth issuer of their own.

#![allow(dead_code)]

pub mod issuer;

use serde_json::Value;

/// `name` from the environment as a number, else `default`.
pub fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The JSON-RPC answer in a reply (a JSON body, or the event of an SSE stream that carries an
/// id); `Null` when there is none.
pub fn answer(text: &str) -> Value {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return v;
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("id").is_some())
        .unwrap_or(Value::Null)
}
