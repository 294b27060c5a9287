//! smol-mcp: an MCP server that gives an AI agent smol machines to work in.
//!
//! The crate is built in floors, and a module uses only modules on its own floor or below
//! (tests/offline/floors.rs has the compiler check each floor without the floors above it;
//! docs/architecture.md draws it):
//!
//! 1. `generated` (the raw progenitor clients) and `spec` (the pipeline build.rs runs to make
//!    them; build.rs compiles it too, through `#[path]`, so it depends on nothing but serde);
//! 2. `fleet`: one vocabulary over the two APIs; `workspace`: the user's project copied for a
//!    machine, its changes, and those kept as a git branch (the host's git);
//! 3. `process`: what one server process owns: its settings, the local serve it found or
//!    started, the crash-proof record of its ephemeral machines, their leases, its events;
//! 4. `store`: what outlives a call (runs, jobs, tasks, egress grants, spend marks, idempotency
//!    keys), a repository per kind of record behind one trait, and its SQLite backend;
//! 5. `policy`: what a tool call does: the tool table and its handlers, background jobs, the run
//!    ledger;
//! 6. `protocol`: MCP itself: the handler, resources, the stdio and HTTP transports;
//! 7. `app`: what the binaries run: their shared start-up, doctor, the spec-diff report.
//!
//! What a lower floor needs from a higher one is a trait or a type of the lower floor (the
//! progress of a call is `policy::progress::ProgressChannel`, implemented by the protocol; a
//! session a job keeps open is `policy::jobs::SessionHold`, implemented by the HTTP sessions).

pub mod generated;
pub mod spec;

pub mod fleet;
pub mod workspace;

pub mod process;

pub mod store;

pub mod policy;

pub mod protocol;

pub mod app;
