//! The tests of a server several processes share, against real parts started by the project's
//! own scripts: PostgreSQL from Debian's packages (scripts/postgres.sh; `SMOL_TEST_PG_URL`) and
//! HAProxy from Debian's packages (scripts/balancer.sh).
//! Each test makes a database of its own. One module an area:
//!
//! - store: the PostgreSQL store behind the store's seam: every kind of record, migrations and
//!   the refusal of a newer schema, and the claims two processes race for, each taken once
//! - replicas: `smol-mcp-http` processes given one database answer as one
//! - balancer: three of them behind HAProxy (scripts/balancer.sh), with the official Python
//!   client and the official conformance suite
//! - users: two users signed in through a real OpenID provider (oidc-provider, started by the
//!   test) to three processes behind the balancer: each sees and acts on their own only

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;

mod balancer;
mod database;
mod replicas;
mod store;
mod users;
