//! smol-mcp: an MCP server that gives an AI agent smol machines to work in.
//!
//! The layers, outermost first: `server` (the MCP protocol handler) and `http` (the Streamable
//! HTTP transport) answer from `tools` (the policy layer: one table of tools), which works
//! through `backend` (what a process holds: the fleets, the ephemeral record, the local serve)
//! and `fleet` (one vocabulary over the two APIs), which calls the raw clients in `generated`.
//! `spec` is the pipeline that turns the vendored specs into those clients; `build.rs` compiles
//! it too (through `#[path]`), so it depends on nothing but serde. `spec_diff` reports what a new
//! release of either API changes for this server. `cli` is the binaries' shared start-up.

pub mod backend;
pub mod cli;
pub mod config;
pub mod doctor;
pub mod fleet;
pub mod generated;
pub mod http;
pub mod jobs;
pub mod ledger;
pub mod operations;
pub mod resources;
pub mod server;
pub mod spec;
pub mod spec_diff;
pub mod targets;
pub mod tools;
