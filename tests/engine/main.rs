//! The tests that need the real pinned smolvm engine from `.smolvm/` (scripts/fetch-smolvm.sh),
//! but no guest that boots: its serve's control plane, its spec, and the older engine the
//! spec-diff report compares with. One module an area:
//!
//! - fake_fidelity: the fake serve's answers against the real serve's, request by request
//! - local_serve: the server's own serve: started, private, version-checked, stopped, taken over
//! - owners_race: a signed-in user racing a create of the operator's machine, the engine's log as witness
//! - real_serve: the local fleet against the real serve (health, create, list, refusals, names)
//! - spec_diff: the spec-diff report on the real 1.14.3/1.32.2 pair and hand-made pairs
//! - vendored_spec: the vendored specs are what `serve openapi` and the published spec give

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;

mod fake_fidelity;
mod local_serve;
mod owners_race;
mod real_serve;
mod spec_diff;
mod vendored_spec;
