//! The tests that need guests that boot: the pinned engine nested in a QEMU TCG machine
//! (scripts/nested-engine.sh, brought up by scripts/test.sh), one boot at a time
//! (`common::nested::serial`, one lock for the whole process). booted_guest also drives the
//! outside clients the `clients` tests use. One module an area:
//!
//! - apps: the MCP Apps views in a real browser (Chromium), on a machine of the nested engine
//! - booted_guest: every guest-side promise of the tools on the real engine, and whole sessions
//! - engine_ports: a port the engine publishes live reaches a service in the guest from this host
//! - fake_vs_engine: the fake serve's answers against the engine's on a booted guest

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;

mod apps;
mod booted_guest;
mod engine_ports;
mod fake_vs_engine;
