//! The two fleets behind one vocabulary. `Fleet` dispatches each call to the local engine or
//! the cloud and answers in the same model (`model.rs`) and error type whichever one it was.

pub mod cloud;
pub mod local;
pub mod model;
pub mod upstream;

use crate::error::{ErrorKind, FleetError, FleetResult};
pub use cloud::CloudFleet;
pub use local::LocalFleet;
pub use model::*;

/// A handle on one fleet; cheap to clone.
#[derive(Debug, Clone)]
pub enum Fleet {
    Local(std::sync::Arc<LocalFleet>),
    Cloud(std::sync::Arc<CloudFleet>),
}

fn local_only(what: &str, why: &str) -> FleetError {
    FleetError::new(ErrorKind::Unsupported, what, why)
}

impl Fleet {
    pub fn kind(&self) -> FleetKind {
        match self {
            Fleet::Local(_) => FleetKind::Local,
            Fleet::Cloud(_) => FleetKind::Cloud,
        }
    }

    pub async fn list(&self) -> FleetResult<Vec<Machine>> {
        match self {
            Fleet::Local(f) => f.list().await,
            Fleet::Cloud(f) => f.list().await,
        }
    }

    pub async fn get(&self, machine: &str) -> FleetResult<Machine> {
        match self {
            Fleet::Local(f) => f.get(machine).await,
            Fleet::Cloud(f) => f.get(machine).await,
        }
    }

    pub async fn create(&self, spec: &CreateSpec) -> FleetResult<Machine> {
        match self {
            Fleet::Local(f) => f.create(spec).await,
            Fleet::Cloud(f) => f.create(spec).await,
        }
    }

    /// `branchable` matters locally only, where it is chosen at start; on cloud it is fixed at
    /// create.
    pub async fn start(&self, machine: &str, branchable: bool) -> FleetResult<Machine> {
        match self {
            Fleet::Local(f) => f.start(machine, branchable).await,
            Fleet::Cloud(f) => f.start(machine).await,
        }
    }

    pub async fn stop(&self, machine: &str) -> FleetResult<Machine> {
        match self {
            Fleet::Local(f) => f.stop(machine).await,
            Fleet::Cloud(f) => f.stop(machine).await,
        }
    }

    pub async fn delete(&self, machine: &str) -> FleetResult<Deleted> {
        match self {
            Fleet::Local(f) => f.delete(machine).await,
            Fleet::Cloud(f) => f.delete(machine).await,
        }
    }

    pub async fn exec(&self, machine: &str, spec: &ExecSpec) -> FleetResult<ExecOutput> {
        match self {
            Fleet::Local(f) => f.exec(machine, spec).await,
            Fleet::Cloud(f) => f.exec(machine, spec).await,
        }
    }

    pub async fn read_file(&self, machine: &str, path: &str) -> FleetResult<Vec<u8>> {
        match self {
            Fleet::Local(f) => f.read_file(machine, path).await,
            Fleet::Cloud(f) => f.read_file(machine, path).await,
        }
    }

    pub async fn write_file(&self, machine: &str, path: &str, bytes: Vec<u8>) -> FleetResult<u64> {
        match self {
            Fleet::Local(f) => f.write_file(machine, path, bytes).await,
            Fleet::Cloud(f) => f.write_file(machine, path, bytes).await,
        }
    }

    pub async fn branch(
        &self,
        source: &str,
        child: &str,
        branchable: bool,
    ) -> FleetResult<Machine> {
        match self {
            Fleet::Local(f) => f.branch(source, child, branchable).await,
            Fleet::Cloud(f) => f.branch(source, child, branchable).await,
        }
    }

    pub async fn logs(
        &self,
        machine: &str,
        tail: usize,
        cursor: Option<&str>,
    ) -> FleetResult<LogPage> {
        match self {
            Fleet::Local(f) => f.logs(machine, tail, cursor).await,
            Fleet::Cloud(f) => f.logs(machine, tail, cursor).await,
        }
    }

    pub async fn pull_image(&self, machine: &str, image: &str) -> FleetResult<PulledImage> {
        match self {
            Fleet::Local(f) => f.pull_image(machine, image).await,
            Fleet::Cloud(_) => Err(local_only(
                "pull-image",
                "pull-image is local only: the cloud control plane pulls the image itself at create",
            )),
        }
    }

    pub async fn usage(&self, machine: &str) -> FleetResult<Usage> {
        match self {
            Fleet::Local(_) => Err(local_only(
                "usage",
                "the local engine meters nothing: local machines cost nothing but this host",
            )),
            Fleet::Cloud(f) => f.usage(machine).await,
        }
    }

    pub async fn account(&self) -> FleetResult<Account> {
        match self {
            Fleet::Local(_) => Err(local_only(
                "account",
                "the local fleet has no account: it is this host",
            )),
            Fleet::Cloud(f) => f.account().await,
        }
    }
}
