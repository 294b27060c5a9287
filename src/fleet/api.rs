//! What every fleet does, in the shared vocabulary: [`FleetApi`], implemented by `local.rs` and
//! `cloud.rs`, and [`Fleet`], the handle the layers above hold.

use crate::fleet::error::{ErrorKind, FleetError, FleetResult};
use crate::fleet::file_stream::FileStream;
use crate::fleet::model::*;
use crate::fleet::terminal::{TerminalLink, TerminalSpec};
use std::collections::BTreeMap;

// The defaults of what only some fleets do. The layers above ask `Capabilities` first, so a
// fleet's own reason (its `lacks`) is what the agent reads; these answer a caller that did not.

fn lacking(feature: Feature, context: &str) -> FleetError {
    FleetError::new(
        ErrorKind::Unsupported,
        context,
        format!("this fleet does not offer {feature:?}"),
    )
}

fn no_pools() -> FleetError {
    lacking(Feature::WarmPools, "warm pools")
}

/// Where a fleet gets the credential values to supply before it starts a machine (the process
/// floor implements it: it knows the configured bindings and which machines have them).
#[async_trait::async_trait]
pub trait CredentialValues: Send + Sync + std::fmt::Debug {
    /// The values (binding name, value) to supply before `machine` boots; `None` when it has
    /// no bindings; an error naming the binding and what the operator must set when a value
    /// is missing.
    async fn values_for(&self, machine: &str) -> Option<Result<Vec<(String, Secret)>, FleetError>>;

    /// `machine` turned out to have none of the bindings recorded for it (the engine said so):
    /// forget them.
    async fn forget(&self, machine: &str);
}

/// A handle on one fleet where the process placed it: the target it answers for (which the
/// fleet itself does not say: a fleet is what it can do, and any make of fleet may answer for
/// a target) and the fleet. Cheap to clone; derefs to the fleet.
#[derive(Debug, Clone)]
pub struct Fleet {
    kind: FleetKind,
    api: std::sync::Arc<dyn FleetApi>,
}

impl Fleet {
    pub fn new(kind: FleetKind, api: std::sync::Arc<dyn FleetApi>) -> Fleet {
        Fleet { kind, api }
    }

    /// The target this fleet answers for in this process.
    pub fn kind(&self) -> FleetKind {
        self.kind
    }
}

impl std::ops::Deref for Fleet {
    type Target = dyn FleetApi;

    fn deref(&self) -> &Self::Target {
        &*self.api
    }
}

/// Something a fleet may or may not do beyond what every fleet does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// Host directories mounted into a machine, as the operator allows.
    HostMounts,
    /// Credential bindings whose values the fleet supplies before a machine boots.
    Credentials,
    /// The egress a machine's policy refused, reported after a command (`egress_denials`).
    EgressReport,
    /// A running machine's egress widened (`allow_egress`): network ask and allowHostsFrom.
    EgressWidening,
    /// Warm pools of ready machines (`lease` and its kin).
    WarmPools,
    /// A choice of log: the workload's output or the engine's own.
    LogSources,
    /// Pulling an image into a running machine's store.
    ImagePull,
    /// A program behind a PTY, driven by input and read as output (`open_terminal`).
    Terminal,
    /// A running machine's memory, processes and disk saved and its host memory freed, to go on
    /// later from where it stood (`pause`, `resume`).
    Pause,
}

/// When a machine becomes branchable (a branch source).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchableAt {
    /// Chosen at create, for the machine's life.
    Create,
    /// Chosen at each start.
    Start,
}

/// Who places the outside side of a published port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPorts {
    /// The caller names the host port; a port someone else holds is refused
    /// ([`FleetApi::is_port_in_use`]) and the caller may try another.
    Caller,
    /// The fleet allocates it; a host port the caller names is not sent.
    Fleet,
}

/// Where a user opens a machine's published port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAddress {
    pub url: String,
    /// What opening it takes beside the address (the cloud's key), when it takes anything.
    pub needs: Option<&'static str>,
}

/// What a fleet can do, declared once by each fleet. The layers above ask this, never which
/// fleet it is; the reasons given for what a fleet lacks are its own words.
#[derive(Debug)]
pub struct Capabilities {
    /// The features it lacks, each with why, as the agent is told.
    pub lacks: &'static [(Feature, &'static str)],
    /// `Some(why)`: a machine here needs an image (there is no bundled root file system).
    pub needs_image: Option<&'static str>,
    pub branchable_at: BranchableAt,
    /// Its machines cost money while they exist: the operator's spend ceilings apply, read
    /// from `consumption` and `account`.
    pub metered: bool,
    /// A command sent to a stopped machine boots it without a word for as long as a boot
    /// takes: the caller starts it first, so that the boot is reported as any start's.
    pub exec_boots_silently: bool,
    /// A machine also answers to an id of the fleet's own (a cloud `mach-` id), which may stand
    /// for a recorded name.
    pub ids_apart_from_names: bool,
    /// A machine whose create or branch the caller gave up waiting for (it never answered) may
    /// still come up later: the fleet queues them (the cloud's per-source queue).
    pub arrives_late: bool,
    /// Who places the outside side of a published port: the caller (a host port it names) or
    /// the fleet itself (the cloud allocates its own and gives an ingress address).
    pub host_ports: HostPorts,
    /// How the names of the machines this fleet keeps for its own use begin (a warm pool's
    /// source and its ready clones): a tool naming one asks [`FleetApi::kept`] first. Only
    /// these names cost that question, so a command on any other machine is still one request.
    pub kept_name_prefixes: &'static [&'static str],
    /// A base shows as frozen in this fleet's listings (its own state): a listing with no
    /// frozen machine has no base in it, and needs no look at the record of bases. A fleet
    /// whose states say nothing of it (the cloud documents no frozen state) has the record read
    /// at every listing.
    pub shows_frozen: bool,
}

impl Capabilities {
    /// Why `feature` is not offered, or `None` when it is.
    pub fn lacks(&self, feature: Feature) -> Option<&'static str> {
        self.lacks
            .iter()
            .find(|(lacked, _)| *lacked == feature)
            .map(|(_, why)| *why)
    }

    pub fn offers(&self, feature: Feature) -> bool {
        self.lacks(feature).is_none()
    }
}

/// What every fleet does, in the shared vocabulary.
#[async_trait::async_trait]
pub trait FleetApi: Send + Sync + std::fmt::Debug {
    /// What this fleet can do beyond what every fleet does.
    fn capabilities(&self) -> &'static Capabilities;

    /// Why a write of `len` bytes would be refused before it is sent, if it would be.
    fn upload_refusal(&self, _len: u64) -> Option<String> {
        None
    }

    /// Why no tool may touch the machine `name`, when it is one this fleet keeps for its own
    /// use; asked only for a name beginning with one of `kept_name_prefixes`.
    async fn kept(&self, _name: &str) -> FleetResult<Option<String>> {
        Ok(None)
    }

    /// Adds to the message of an error this fleet answered what the agent should know of it
    /// that the error alone does not say (why a machine may be gone, say).
    fn explain(&self, _kind: ErrorKind, _message: &mut String) {}

    /// The account's own figures (its status, its cost this billing period), on a fleet that
    /// bills one.
    async fn account(&self) -> FleetResult<Account> {
        Err(FleetError::new(
            ErrorKind::Unsupported,
            "account",
            "this fleet bills no account",
        ))
    }

    async fn list(&self) -> FleetResult<Vec<Machine>>;

    /// The machine's network (`Machine::network`) as this fleet last saw it, if it keeps it:
    /// enough to run a command without asking for the machine first. `None` when unknown,
    /// and on a fleet that keeps nothing.
    fn known_network(&self, _machine: &str) -> Option<MachineNetwork> {
        None
    }

    /// Whether `e` is this fleet's refusal of a command sent with `start_if_stopped: false`
    /// to a machine that is not running (which the caller may then start its own way).
    fn is_not_running(&self, _e: &FleetError) -> bool {
        false
    }

    /// A machine by name (or, on cloud, by `mach-` id).
    async fn get(&self, machine: &str) -> FleetResult<Machine>;

    /// Creates a machine without starting it.
    async fn create(&self, spec: &CreateSpec) -> FleetResult<Machine>;

    /// Starts a machine. `branchable`: `Some(true)` asks for a branch source, `Some(false)` for
    /// none, `None` for whatever the machine already is.
    async fn start(&self, machine: &str, branchable: Option<bool>) -> FleetResult<Machine>;

    /// Asks a machine to start and answers once the start is under way, its boot not awaited
    /// (start-machine with `wait: false`). A fleet whose start answers before the boot (the
    /// cloud's 202) needs nothing more than its start.
    async fn begin_start(&self, machine: &str, branchable: Option<bool>) -> FleetResult<Machine> {
        self.start(machine, branchable).await
    }

    async fn stop(&self, machine: &str) -> FleetResult<Machine>;

    async fn delete(&self, machine: &str) -> FleetResult<Deleted>;

    /// Deletes a machine and the branch children that depend on it. Only the local engine
    /// refuses to delete a fork base while its clones live (and takes `cascade` to delete them
    /// too); elsewhere this is a plain delete.
    async fn delete_with_clones(&self, machine: &str) -> FleetResult<Deleted> {
        self.delete(machine).await
    }

    /// Runs a command; a stopped machine is started by it and left running.
    async fn exec(&self, machine: &str, spec: &ExecSpec) -> FleetResult<ExecOutput>;

    /// Runs a command like [`FleetApi::exec`], handing each piece of its output to `output` as
    /// the fleet streams it, and answers the whole as `exec` would. A fleet without a stream
    /// sends nothing and answers at the end.
    async fn exec_streamed(
        &self,
        machine: &str,
        spec: &ExecSpec,
        output: &OutputSender,
    ) -> FleetResult<ExecOutput> {
        let _ = output;
        self.exec(machine, spec).await
    }

    /// A file's bytes as they arrive; the caller reads as far as it needs and drops the rest.
    async fn read_file(&self, machine: &str, path: &str) -> FleetResult<FileStream>;

    /// Writes a whole file and answers the bytes written.
    async fn write_file(&self, machine: &str, path: &str, bytes: Vec<u8>) -> FleetResult<u64>;

    /// Copies a running branchable machine into a new child.
    async fn branch(&self, spec: BranchSpec<'_>) -> FleetResult<Machine>;

    /// The last `tail` lines of the machine's log `source`, or what arrived since `cursor`.
    async fn logs(
        &self,
        machine: &str,
        tail: usize,
        cursor: Option<&str>,
        source: LogSource,
    ) -> FleetResult<LogPage>;

    /// The newest `limit` connections and datagrams the machine's egress policy refused, oldest
    /// first. Only the local engine records them; the cloud API has no such route.
    async fn egress_denials(&self, _machine: &str, _limit: u32) -> FleetResult<Vec<EgressDenial>> {
        Err(lacking(Feature::EgressReport, "egress denials"))
    }

    /// The refusals to leave out of the next command's report on `machine`: the engine stamps
    /// refusals in whole seconds and gives them no id, so those of a command that ended in the
    /// last seconds cannot be told from the next one's by time. Empty when no command ran on
    /// the machine lately (nothing to confuse), and on a fleet that records none.
    async fn egress_baseline(&self, _machine: &str, _limit: u32) -> Vec<EgressDenial> {
        Vec::new()
    }

    /// Adds hosts and CIDR ranges to a running machine's egress allow list, effective for its
    /// next connection or lookup. Only the local engine can; the server calls it only once the
    /// user has said yes, never on an agent's word.
    async fn allow_egress(
        &self,
        _machine: &str,
        _hosts: &[String],
        _cidrs: &[String],
    ) -> FleetResult<Machine> {
        Err(lacking(Feature::EgressWidening, "allow egress"))
    }

    /// The warm pool `pool`, or `None` when the fleet has none of that name.
    async fn pool(&self, _pool: &str) -> FleetResult<Option<PoolStatus>> {
        Err(no_pools())
    }

    /// Creates a warm pool; the fleet fills and refills it.
    async fn create_pool(&self, _setup: &PoolSetup) -> FleetResult<PoolStatus> {
        Err(no_pools())
    }

    /// Leases a ready machine of `pool`, with `env` for its later commands. The fleet keeps the
    /// lease alive while the machine lives, and a delete of the machine completes it.
    async fn lease(&self, _pool: &str, _env: &BTreeMap<String, String>) -> FleetResult<PoolLease> {
        Err(no_pools())
    }

    /// Deletes a pool with its machines, leased or not; its source stays.
    async fn delete_pool(&self, _pool: &str) -> FleetResult<()> {
        Err(no_pools())
    }

    /// What `machine` has used so far, as its fleet reports it (see [`Consumption`]).
    async fn consumption(&self, machine: &str) -> FleetResult<Consumption> {
        Ok(self.get(machine).await?.consumption)
    }

    /// Replaces the machine's published TCP ports with `ports` (the whole set; empty removes
    /// them all), live on a running machine, and answers its record.
    async fn set_ports(&self, machine: &str, ports: &[PortMapping]) -> FleetResult<Machine>;

    /// Whether `e` is this fleet's refusal of a host port that something else holds.
    fn is_port_in_use(&self, _e: &FleetError) -> bool {
        false
    }

    /// Where the user opens `machine`'s published `guest` port, from its record; `None` while
    /// the fleet has not placed it.
    fn port_address(&self, machine: &Machine, guest: u16) -> Option<PortAddress>;

    /// Saves a running machine whole (memory, processes, disk) and frees its host memory; answers
    /// once it is paused, however long the save takes.
    async fn pause(&self, _machine: &str) -> FleetResult<Machine> {
        Err(lacking(Feature::Pause, "pause"))
    }

    /// Continues a paused machine from where it stood: the same processes, no boot.
    async fn resume(&self, _machine: &str) -> FleetResult<Machine> {
        Err(lacking(Feature::Pause, "resume"))
    }

    /// Runs `spec.argv` in a running machine behind a PTY, for as long as the link is held.
    async fn open_terminal(
        &self,
        _machine: &str,
        _spec: &TerminalSpec,
    ) -> FleetResult<TerminalLink> {
        Err(lacking(Feature::Terminal, "terminal"))
    }

    /// Pulls an image into a running machine's cache. Only the local engine has such a cache.
    async fn pull_image(&self, _machine: &str, _image: &str) -> FleetResult<PulledImage> {
        Err(lacking(Feature::ImagePull, "pull-image"))
    }
}
