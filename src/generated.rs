//! The raw clients progenitor generates in `build.rs`, and the `Operation` enums. Compiled from
//! OUT_DIR; `generated/` holds a committed, readable mirror that a test keeps in sync.

// Generated code is not held to this crate's lints.
#![allow(
    clippy::all,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    dead_code,
    unused_imports
)]

pub mod smolvm {
    include!(concat!(env!("OUT_DIR"), "/smolvm_client.rs"));
    include!(concat!(env!("OUT_DIR"), "/smolvm_operations.rs"));
}

pub mod smolcloud {
    include!(concat!(env!("OUT_DIR"), "/smolcloud_client.rs"));
    include!(concat!(env!("OUT_DIR"), "/smolcloud_operations.rs"));
}
