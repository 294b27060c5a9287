//! The tests that need the outside MCP clients scripts/test.sh installs: the pinned Python `mcp`
//! in `.venv`, the TypeScript SDK and Inspector CLI in tests/clients/node_modules, the
//! conformance suite in tests/conformance/node_modules. Two modules also need the real engine
//! the `engine` tests use (stdio, egress). One module an area:
//!
//! - conformance: the official MCP conformance suite against `smol-mcp-http`, both lifecycles
//! - egress: the blocked-egress report (fake serve, real 1.32.2 serve's route, Python and TS)
//! - http: `smol-mcp-http` as a process: token, path, Host, signals, the Python client
//! - idempotency: a retried call with the same key runs once (Python client, stdio and HTTP)
//! - jobs: background jobs followed past the clients' own request timeouts (Python, TS)
//! - lifecycles: session and 2026-07-28 lifecycles, leases, the fleet question (Python, TS)
//! - progress: progress notifications and log messages (in process, Python, TS)
//! - registry: `server.json` against the MCP registry's schema and publish rules (Python)
//! - resources: resources and log following under the TypeScript SDK and the Python client
//! - signin: OAuth sign-in on `smol-mcp-http` against a real OpenID provider (TS SDK, Inspector,
//!   Python), and each signed-in user's own machines, runs, jobs, keys, tasks and spend
//! - stdio: `smol-mcp` as a process under the Python client, on the real serve and fakes
//! - streaming: a running command's output as progress notifications (in process, TS)
//! - tasks: MCP tasks on 2026-07-28, raw JSON-RPC and the Python client
//! - typescript: the TypeScript SDK over stdio and HTTP, and the Inspector CLI's schema lint

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;

mod conformance;
mod egress;
mod http;
mod idempotency;
mod jobs;
mod lifecycles;
mod progress;
mod registry;
mod resources;
mod signin;
mod skills;
mod stdio;
mod streaming;
mod tasks;
mod typescript;
mod views;
