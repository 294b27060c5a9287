//! The tests that need nothing outside this process: the fakes (the fake serve on a Unix socket,
//! the wiremock cloud, their guest shell running commands as host processes), the server in
//! process, our own binaries spawned against the fakes, and checks of the sources. One module
//! an area:
//!
//! - accounting: a run's cost (`usage`), the machine and spend limits refused before a request
//! - cancellation: notifications/cancelled ends a wait at once and the call still cleans up
//! - cloud_requests: every request the cloud fleet sends, pinned (request snapshots)
//! - credentials: credential bindings: the value supplied before each boot, shown nowhere
//! - egress_ask: `network: "ask"`: the user widens a running machine's egress, or does not
//! - fake_pools: the fake engine's fork pools and leases, as the 1.32.2 engine answered
//! - fleet_capabilities: a third, in-memory fleet runs the tool table by its capabilities
//! - fuzz: property tests of tool arguments, stdio framing, HTTP Host/Origin and bodies
//! - generated_in_sync: `generated/` mirrors what build.rs writes
//! - guest_shell: the fakes' guest shell runs commands as the engine runs them in a guest
//! - http_hardening: `smol-mcp-http`'s idle rule, Origin and Host, limits, body deadline
//! - job_wrapper: the shell a background job runs in (wrapper, probe, reads, marker kill)
//! - jobs: background jobs through an MCP client on both fleets (request snapshots)
//! - floors: each floor of src/ compiles without the floors above it (the compiler keeps them)
//! - layering: no file or folder of src/ is in a circle of uses
//! - ledger: the run ledger's rows, redaction, restart, pruning, breakage and smol://runs
//! - local_requests: every request the local fleet sends, pinned (request snapshots)
//! - overrides: every spec override holds, and a stale one stops the build's pipeline
//! - owners: with sign-in, who held a machine gone from its fleet is forgotten
//! - packaging: the Python package pins the engine the scripts pin and carries the two servers
//! - resources: resources, completions, log following, `smol-mcp doctor`
//! - restart: jobs and tasks outlive the server process that started them
//! - stdio_framing: bad JSON-RPC on stdio gets its error and the server goes on
//! - tool_catalog: the tool catalog as a client sees it (snapshots)
//! - tools_cloud: every tool on the cloud fleet, and the two-fleet mode
//! - tools_local: every tool on the local fleet
//! - warm_pools: warm pools set up, leased from and refilled against the fake engine

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;

/// A request snapshot, `tests/snapshots/<api>_requests__<name>.snap`: outside this binary's own
/// snapshot directory and without its prefix, because `smol-spec diff` reads the request
/// snapshots there by those names (src/app/spec_diff/snapshots.rs) to know which request fields
/// this server sends.
macro_rules! assert_request_snapshot {
    ($api:literal, $name:literal, $value:expr) => {
        insta::with_settings!(
            {snapshot_path => "../snapshots", prepend_module_to_snapshot => false},
            { insta::assert_json_snapshot!(concat!($api, "_requests__", $name), $value) }
        )
    };
}

mod accounting;
mod apps;
mod bases;
mod cancellation;
mod cloud_requests;
mod credentials;
mod egress_ask;
mod fake_pools;
mod fleet_capabilities;
mod floors;
mod fuzz;
mod generated_in_sync;
mod guest_shell;
mod http_hardening;
mod job_wrapper;
mod jobs;
mod kept_machines;
mod layering;
mod ledger;
mod local_requests;
mod overrides;
mod owners;
mod packaging;
mod parking;
mod resources;
mod restart;
mod skills;
mod stdio_framing;
mod store_sqlite;
mod tool_catalog;
mod tools_cloud;
mod tools_local;
mod warm_pools;
mod workspace;
mod workspace_tools;
