#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod fake_cloud;
pub mod fake_serve;
pub mod mcp;
pub mod real_serve;
pub mod stdio;
