//! The two fleets behind one vocabulary. Each fleet implements [`FleetApi`] and answers in the
//! same model (`model.rs`) and error type (`error.rs`) whichever API it speaks; what one API
//! does differently (the local keep-alive workload, branchability chosen at start locally and at
//! create on cloud, the cloud's ephemeral backstop) is settled inside `local.rs` and `cloud.rs`.

pub mod api;
pub mod cloud;
pub mod diagnosis;
pub mod error;
pub mod exec_stream;
pub mod file_stream;
mod hooks;
pub mod internal;
pub mod local;
pub mod model;
pub mod terminal;
pub mod transport;
pub mod upstream;

pub use api::{
    BranchableAt, Capabilities, CredentialValues, Feature, Fleet, FleetApi, HostPorts, PortAddress,
};
pub use cloud::{Backstop, CloudFleet, Deadlines};
pub use error::{ErrorKind, FleetError, FleetResult};
pub use file_stream::{FileReader, FileStream};
pub use local::{LocalFleet, NAME_FILTER_HOST, POOL_SOURCE_PREFIX};
pub use model::*;
