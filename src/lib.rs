//! smol-mcp: an MCP server that gives an AI agent smol machines to work in.

pub mod config;
pub mod error;
pub mod fleet;
pub mod generated;
pub mod http;
pub mod operations;
pub mod server;
pub mod spec;
pub mod spec_diff;
pub mod transport;
