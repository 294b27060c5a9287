//! smol-mcp: an MCP server that gives an AI agent smol machines to work in.

pub mod generated;
pub mod spec;
