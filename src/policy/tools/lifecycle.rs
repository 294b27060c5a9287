//! The tools that make, find, start, stop, copy and remove machines.

use super::args::{self, Network};
use super::call::parts::{Cancel, Fleets, JobTable, Making, Ownership, Records, Session, Waits};
use super::call::random_hex;
use super::grammar::{CidrRanges, HostNames};
use super::provisional::{Provisional, Recording};
use super::results;
use super::workspace::{HostDirs, Transfer};
use super::{Tool, ToolError, ToolErrorKind};
use crate::fleet::{
    BranchSpec, BranchableAt, Capabilities, CreateSpec, Deleted, Egress, ErrorKind, Feature, Fleet,
    FleetError, FleetKind, Machine, Mount, Phase, PortMapping,
};
use crate::policy::progress::Progress;
use crate::policy::terminals::Terminals;
use crate::policy::user::User;
use crate::process::config::{Config, MAX_CPUS, MAX_MEMORY_MB, MIN_MEMORY_MB, NetworkDefault};
use crate::process::credentials::Supplier;
use crate::process::made::MachineSlot;
use crate::process::workspaces::Workspaces;
use crate::store::{Hold, Store};
use std::sync::Arc;

/// What making a machine takes of the call: the fleet reached, and the machine's limits,
/// create, record and session.
pub(super) type Maker<'c> = (Fleets<'c>, Making<'c>, Records<'c>, Session<'c>);

/// What making a machine from another (a branch, a base's child) takes of the call.
pub(super) type Branching<'c> = (
    Maker<'c>,
    Ownership<'c>,
    Waits<'c>,
    Transfer<'c>,
    &'c Config,
    &'c User,
    &'c Arc<Workspaces>,
    &'c Supplier,
);

fn recording<'c>((_, making, records, session): Maker<'c>) -> Recording<'c> {
    (making, records, session)
}

pub(super) async fn list_machines(
    (fleets, ownership, cancel, records): (Fleets<'_>, Ownership<'_>, Cancel<'_>, Records<'_>),
    a: args::ListArgs,
) -> Result<results::MachineList, ToolError> {
    let fleet = fleets.reach(a.target).await?;
    let machines = match &a.name {
        Some(name) => vec![cancel.run(fleet.get(&ownership.machine(name)?)).await?],
        None => {
            ownership
                .only_theirs(fleet.kind(), cancel.run(fleet.list()).await?)
                .await?
        }
    };
    // The record says which are bases; only the caller's machines are listed at all. Where a
    // base shows as frozen, a listing with no frozen machine reads no record (a file read and
    // parse a list, +0.04 ms p50 measured beside ba70d7a); a fleet whose states say nothing of
    // it (the cloud: its round trip dwarfs the read) has it read every time.
    let bases = if !fleet.capabilities().shows_frozen
        || machines.iter().any(|m| m.phase() == Phase::Frozen)
    {
        records.bases(fleet.kind()).await
    } else {
        Vec::new()
    };
    let machines = machines
        .into_iter()
        .map(|machine| {
            let base = bases
                .iter()
                .find(|(name, id, _)| *name == machine.name || *id == machine.id)
                .map(|(_, _, info)| crate::process::bases::BaseInfo {
                    disk_used_mb: machine.consumption.disk_used_mb,
                    ..info.clone()
                });
            results::Listed { machine, base }
        })
        .collect();
    Ok(results::MachineList { machines })
}

fn egress(
    network: Option<Network>,
    hosts: Option<HostNames>,
    cidrs: Option<CidrRanges>,
    default: NetworkDefault,
) -> Result<Egress, ToolError> {
    let mut hosts = hosts.map(HostNames::into_inner).unwrap_or_default();
    let cidrs = cidrs.map(CidrRanges::into_inner).unwrap_or_default();
    if network == Some(Network::Ask) && hosts.is_empty() {
        // So that the names its commands look up are filtered and recorded, and can be put to
        // the user, however its list grows (see the constant).
        hosts.push(crate::fleet::NAME_FILTER_HOST.to_owned());
    }
    // An allow list in force from the start, empty or not: the engine then takes additions
    // while the machine runs (it refuses them for a machine that has no list).
    if !hosts.is_empty() || !cidrs.is_empty() || network == Some(Network::Ask) {
        return Ok(Egress::Allow { hosts, cidrs });
    }
    Ok(match network {
        Some(Network::Open) => Egress::Open,
        Some(Network::Blocked | Network::Ask) => Egress::Blocked,
        None => match default {
            NetworkDefault::Open => Egress::Open,
            NetworkDefault::Blocked => Egress::Blocked,
        },
    })
}

/// What the user allowed `earlier` (a machine of this fleet, alive or deleted), put into `spec`'s
/// allow list: the next run of the same work needs no questions. Only what a user said yes to
/// is taken, from the run ledger, so this widens nothing the user did not allow.
async fn learned_egress(
    (fleets, store, user): (Fleets<'_>, &dyn Store, &User),
    kind: FleetKind,
    earlier: &str,
    spec: &mut CreateSpec,
) -> Result<(), ToolError> {
    if let Some(why) = fleets.capabilities_of(kind).lacks(Feature::EgressWidening) {
        return Err(ToolError::argument("allowHostsFrom", why));
    }
    let learned = store
        .egress_grants()
        .for_machine(Hold::new(kind, earlier, user.id()))
        .await
        .map_err(|e| ToolError::argument("allowHostsFrom", format!("the store cannot say: {e}")))?;
    if learned.is_empty() {
        return Err(ToolError::argument(
            "allowHostsFrom",
            format!(
                "the user allowed {} nothing (only a network ask machine's answers are kept); \
                 name the hosts in allowHosts instead",
                crate::policy::error::quote(earlier)
            ),
        ));
    }
    let (cidrs, hosts): (Vec<String>, Vec<String>) = learned
        .into_iter()
        .partition(|d| d.parse::<std::net::IpAddr>().is_ok());
    let cidrs = cidrs.into_iter().map(|ip| {
        if ip.contains(':') {
            format!("{ip}/128")
        } else {
            format!("{ip}/32")
        }
    });
    let (mut all_hosts, mut all_cidrs) = match std::mem::replace(&mut spec.egress, Egress::Blocked)
    {
        Egress::Open => {
            spec.egress = Egress::Open;
            return Ok(());
        }
        Egress::Blocked => (Vec::new(), Vec::new()),
        Egress::Allow { hosts, cidrs } => (hosts, cidrs),
    };
    for host in hosts {
        if !all_hosts.contains(&host) {
            all_hosts.push(host);
        }
    }
    for cidr in cidrs {
        if !all_cidrs.contains(&cidr) {
            all_cidrs.push(cidr);
        }
    }
    spec.egress = Egress::Allow {
        hosts: all_hosts,
        cidrs: all_cidrs,
    };
    Ok(())
}

/// smolvm 1.32.2 accepts a create with no egress and fails the start when the image has to come
/// from a registry; say which argument of `tool` (the one that was called) grants the pull.
pub(super) fn with_egress_hint(mut e: ToolError, spec: &CreateSpec, tool: Tool) -> ToolError {
    // Without an image nothing is pulled: the engine's words for a bare machine name
    // `registryRef` among the create fields, which is no pull failing.
    if spec.image.is_none() {
        return e;
    }
    let lower = e.message.to_lowercase();
    let about_pull = ["registry ", "registry-", "registry:", "pull", "manifest"]
        .iter()
        .any(|w| lower.contains(w));
    // A lookup that failed on the host (the engine resolves the registry there) is this
    // host's network, which the machine's egress does not change.
    let on_the_host = lower.contains("host-side") || lower.contains("on the host");
    if about_pull && on_the_host {
        e.message.push_str(
            "\nThe engine fetches the image from this host, and the host could not reach the \
             registry (its DNS or network): the machine's egress does not change that. Check the \
             host's network, or create the machine without an image (the engine's bundled \
             Alpine needs no registry).",
        );
        return e;
    }
    if about_pull && spec.egress != Egress::Open {
        e.message.push_str(&format!(
            "\nThe machine has no egress to the image's registry (network is blocked or an allow-list \
             without it), and the image is pulled from there. Pass network: \"open\" to {}, or \
             allowHosts naming the registry (Docker Hub: registry-1.docker.io, auth.docker.io, \
             production.cloudflare.docker.com).",
            tool.name()
        ));
    }
    e
}

/// The spec of a machine made of `base` (what create-machine and run-once share), named `name`,
/// kept running between commands. `default_network` applies when `base` asks for none.
pub(super) fn base_spec(
    config: &Config,
    base: &args::MachineBase,
    name: String,
    default_network: NetworkDefault,
) -> Result<CreateSpec, ToolError> {
    let mut spec = match &base.image {
        Some(image) => CreateSpec::new(name, &**image),
        None => CreateSpec::bare(name),
    };
    spec.cpus = base.cpus.unwrap_or(config.cpus);
    args::range("cpus", u64::from(spec.cpus), 1, u64::from(MAX_CPUS))?;
    spec.memory_mb = base.memory_mb.unwrap_or(config.memory_mb);
    args::range(
        "memoryMb",
        u64::from(spec.memory_mb),
        u64::from(MIN_MEMORY_MB),
        u64::from(MAX_MEMORY_MB),
    )?;
    if config.agent_network == crate::process::config::AgentNetwork::Ask {
        only_the_user_widens(base)?;
    }
    spec.egress = egress(
        base.network,
        base.allow_hosts.clone(),
        base.allow_cidrs.clone(),
        default_network,
    )?;
    Ok(spec)
}

/// On a server whose operator leaves every widening of egress to the user (`agentNetwork`
/// "ask"): the agent's own `open` or allow list is refused, naming what it may use instead.
fn only_the_user_widens(base: &args::MachineBase) -> Result<(), ToolError> {
    const INSTEAD: &str = "on this server only the user widens a machine's egress: create it \
        with network \"ask\" (a refused host is put to the user) or without network, or take \
        the hosts the user allowed an earlier machine with allowHostsFrom";
    if base.network == Some(Network::Open) {
        return Err(ToolError::argument(
            "network",
            format!("\"open\" is not allowed: {INSTEAD}"),
        ));
    }
    for (arg, given) in [
        ("allowHosts", base.allow_hosts.as_deref()),
        ("allowCidrs", base.allow_cidrs.as_deref()),
    ] {
        if given.is_some_and(|list| !list.is_empty()) {
            return Err(ToolError::argument(
                arg,
                format!("is not allowed: {INSTEAD}"),
            ));
        }
    }
    Ok(())
}

/// What create-machine and run-once do before anything is sent to make a machine: the
/// credentials named put into `spec`, then the fleet reached (a local serve started only now
/// that the arguments are known good), the image a fleet needs, and the operator's machine
/// limits. Answers the fleet and the bindings to record for the machine.
pub(super) async fn admitted<'c>(
    (fleets, making, credentials): (Fleets<'c>, Making<'c>, &Supplier),
    target: Option<FleetKind>,
    base: &args::MachineBase,
    spec: &mut CreateSpec,
) -> Result<(Fleet, Vec<String>, MachineSlot<'c>), ToolError> {
    let capabilities = fleets.capabilities(target)?;
    let bindings =
        super::credentials::apply(credentials, capabilities, base.credentials.as_deref(), spec)?;
    let fleet = fleets.reach(target).await?;
    require_image(capabilities, spec)?;
    let slot = making.admit_machine(&fleet, &spec.name).await?;
    Ok((fleet, bindings, slot))
}

/// A fleet without a root file system of its own to boot (the cloud's) refuses a spec without an
/// image before anything is sent.
fn require_image(capabilities: &Capabilities, spec: &CreateSpec) -> Result<(), ToolError> {
    match capabilities.needs_image {
        Some(why) if spec.image.is_none() => Err(ToolError::argument("image", why)),
        _ => Ok(()),
    }
}

/// A mount's host directory, resolved (symlinks, `..`), if the operator's `mountAllow` holds it
/// for this call's user, and, for a writable mount, `mountWritable` too; refused otherwise,
/// naming the setting.
fn allowed_mount(
    dirs: HostDirs<'_>,
    i: usize,
    source: &str,
    readonly: bool,
) -> Result<String, ToolError> {
    let arg = format!("mounts[{i}].source");
    let resolved = super::workspace::allowed_host_dir(
        dirs,
        &arg,
        source,
        "mounts are off on this server: the operator has allowed no host directory \
         (mountAllow). Copy files in with write-file instead",
    )?;
    let writable = super::workspace::host_dirs_for(dirs, &dirs.1.mount_writable);
    let under = |dirs: &[String]| {
        dirs.iter().any(|dir| {
            std::fs::canonicalize(dir).is_ok_and(|allowed| resolved.starts_with(allowed))
        })
    };
    if !readonly && !under(&writable) {
        return Err(ToolError::argument(
            &format!("mounts[{i}].readonly"),
            format!(
                "false is not allowed for {source}: the operator allows writable mounts only \
                 under mountWritable ({}); leave readonly out for a read-only mount",
                if writable.is_empty() {
                    "none".to_owned()
                } else {
                    writable.join(", ")
                }
            ),
        ));
    }
    Ok(resolved.display().to_string())
}

/// Sends a prepared workspace into a machine this call made; a machine that could not get it
/// is deleted again (it is not what was asked for), and the error says so.
async fn with_workspace(
    prepared: super::workspace::Prepared,
    moving: (&Arc<Workspaces>, Transfer<'_>),
    fleet: &Fleet,
    machine: &Machine,
    provisional: Provisional<'_>,
) -> Result<results::WorkspaceIn, ToolError> {
    match prepared.install(moving, fleet, machine).await {
        Ok(w) => Ok(w),
        Err(mut e) => {
            match provisional.discard().await {
                Ok(()) => e
                    .message
                    .push_str(&format!("\n{} was deleted again.", machine.name)),
                Err(d) => e.message.push_str(&format!(
                    "\n{} could not be deleted ({}): delete-machine removes it.",
                    machine.name, d.message
                )),
            }
            Err(e)
        }
    }
}

fn create_spec(
    (dirs, fleets): (HostDirs<'_>, Fleets<'_>),
    a: &args::CreateArgs,
    name: String,
    kind: FleetKind,
) -> Result<CreateSpec, ToolError> {
    let config = dirs.1;
    let mut spec = base_spec(config, &a.machine, name, config.network_default)?;
    let ports = a.ports.clone().unwrap_or_default();
    args::range("ports", ports.len() as u64, 0, 16)?;
    for (i, p) in ports.iter().enumerate() {
        let guest = args::port(&format!("ports[{i}].guest"), p.guest)?;
        let host = match p.host {
            Some(h) => Some(args::port(&format!("ports[{i}].host"), h)?),
            None => None,
        };
        spec.ports.push(PortMapping { guest, host });
    }
    let mounts = a.mounts.clone().unwrap_or_default();
    args::range("mounts", mounts.len() as u64, 0, 16)?;
    for (i, m) in mounts.iter().enumerate() {
        let readonly = m.readonly.unwrap_or(true);
        // A fleet without host mounts (the cloud's) refuses them itself, in its own words.
        let source = if fleets.capabilities_of(kind).offers(Feature::HostMounts) {
            allowed_mount(dirs, i, &m.source, readonly)?
        } else {
            m.source.to_string()
        };
        spec.mounts.push(Mount {
            source,
            target: m.target.to_string(),
            readonly,
        });
    }
    if let Some(gb) = a.storage_gb {
        args::range("storageGb", u64::from(gb), 1, u64::from(args::MAX_DISK_GB))?;
    }
    if let Some(gb) = a.overlay_gb {
        args::range("overlayGb", u64::from(gb), 1, u64::from(args::MAX_DISK_GB))?;
    }
    spec.storage_gb = a.storage_gb;
    spec.overlay_gb = a.overlay_gb;
    if let Some(env) = &a.env {
        spec.env = (**env).clone();
    }
    spec.branchable = a.branchable;
    Ok(spec)
}

pub(super) async fn create_machine(
    (branching, store): (Branching<'_>, &dyn Store),
    a: args::CreateArgs,
) -> Result<results::Created, ToolError> {
    if let Some(base) = &a.base {
        return create_from_base(branching, &a, base).await;
    }
    let (maker, machines, waits, transfer, config, user, workspaces, credentials) = branching;
    let (fleets, making, _, session) = maker;
    let dirs = (user, config, machines);
    let prefix = &config.machine_prefix;
    let named_by_caller = a.name.is_some();
    let name = a
        .name
        .clone()
        .map_or_else(|| format!("{prefix}{}", random_hex()), String::from);
    let ephemeral = name.starts_with(prefix.as_str());
    let kind = fleets.kind(a.target)?;
    let capabilities = fleets.capabilities_of(kind);
    if a.start == Some(false) && a.branchable && capabilities.branchable_at == BranchableAt::Start {
        return Err(ToolError::argument(
            "branchable",
            format!(
                "on the {} fleet a machine becomes branchable when it starts; with start \
                 false, pass branchable to start-machine instead",
                kind.as_str()
            ),
        ));
    }
    let asks_egress = a.machine.network == Some(Network::Ask);
    if asks_egress && let Some(why) = capabilities.lacks(Feature::EgressWidening) {
        return Err(ToolError::argument("network", why));
    }
    let mut spec = create_spec((dirs, fleets), &a, name.clone(), kind)?;
    spec.ephemeral = ephemeral;
    if a.machine.workspace.is_some() && a.start == Some(false) {
        return Err(ToolError::argument(
            "start",
            "false cannot go with workspace: the workspace is copied into the running machine. \
             Leave start out",
        ));
    }
    // Every refusal of the workspace (outside mountAllow, a dirty repository, too large) comes
    // before a machine exists.
    let workspace = match &a.machine.workspace {
        Some(dir) => Some(super::workspace::prepare((dirs, workspaces), dir).await?),
        None => None,
    };
    if let Some(earlier) = &a.allow_hosts_from {
        learned_egress((fleets, store, user), kind, earlier, &mut spec).await?;
    }
    let admitting = (fleets, making, credentials);
    let (fleet, bindings, slot) = admitted(admitting, a.target, &a.machine, &mut spec).await?;
    // An unnamed machine may come warm: its name is then the pool's (the engine names them).
    if !named_by_caller
        && a.start != Some(false)
        && let Some((pool, lease)) = making.lease_warm(&fleet, &spec, &slot).await
    {
        let mut provisional =
            Provisional::begin(recording(maker), &fleet, &lease.machine, true).await?;
        provisional.created(&lease.machine).await;
        let machine = transfer.1.run(fleet.get(&lease.machine)).await?;
        let workspace = match workspace {
            Some(w) => {
                let moving = (workspaces, transfer);
                Some(with_workspace(w, moving, &fleet, &machine, provisional).await?)
            }
            None => None,
        };
        return Ok(results::Created {
            machine,
            ephemeral: true,
            ready: true,
            pool: Some(pool),
            workspace,
        });
    }
    let mut provisional = Provisional::begin(recording(maker), &fleet, &name, ephemeral).await?;
    let machine = match making.create_reported(&fleet, &spec, &slot).await {
        Ok(m) => m,
        Err(e) if e.is(ErrorKind::Conflict) => {
            provisional.refused().await;
            return Err(e);
        }
        Err(e) => {
            let _ = provisional.abandon().await;
            return Err(with_egress_hint(e, &spec, Tool::CreateMachine));
        }
    };
    provisional.created(&machine.id).await;
    if fleet.capabilities().offers(Feature::Credentials) {
        // Before any start: the fleet supplies the values of what is recorded here.
        credentials.bind(&machine.id, &bindings).await;
        credentials.set_asks_egress(&machine.id, asks_egress).await;
    }
    if !a.start.unwrap_or(true) {
        return Ok(results::Created {
            machine,
            ephemeral,
            ready: false,
            pool: None,
            workspace: None,
        });
    }
    let started = async {
        let m = waits
            .start_reported(
                &fleet,
                &machine.id,
                Some(a.branchable),
                spec.image.as_deref(),
            )
            .await?;
        waits.wait_ready(&fleet, &m.id).await?;
        Ok::<Machine, ToolError>(m)
    }
    .await;
    match started {
        Ok(m) => {
            let workspace = match workspace {
                Some(w) => {
                    let moving = (workspaces, transfer);
                    Some(with_workspace(w, moving, &fleet, &m, provisional).await?)
                }
                None => None,
            };
            Ok(results::Created {
                machine: m,
                ephemeral,
                ready: true,
                pool: None,
                workspace,
            })
        }
        Err(e) => {
            let mut e = with_egress_hint(e, &spec, Tool::CreateMachine);
            if named_by_caller && e.is(ErrorKind::Timeout) {
                e.message.push_str(&format!(
                    "\nThe start may still be under way: the service queues starts and can take \
                     minutes, so {name} may come up after this call gave up."
                ));
            }
            if named_by_caller {
                e.message.push_str(&format!(
                    "\n{name} was created and is left as it is for you to inspect: start-machine \
                     tries again, delete-machine removes it{}.",
                    if ephemeral {
                        format!(", and it is deleted {}", session.ephemeral_end())
                    } else {
                        String::new()
                    }
                ));
            } else {
                match provisional.abandon().await {
                    Ok(()) => e.message.push_str(&format!("\n{name} was deleted again.")),
                    Err(d) => e.message.push_str(&format!(
                        "\n{name} could not be deleted ({}); it stays recorded and is deleted {}.",
                        d.message,
                        session.ephemeral_end()
                    )),
                }
            }
            Err(e)
        }
    }
}

/// Whether a start or branch gave up waiting for its answer (its deadline passed, or the client
/// cancelled) rather than being refused: the cloud queues both per source and carries them out
/// minutes later all the same (facts 3.4, 3.9), so the machine may still come up.
fn gave_up_waiting(e: &ToolError) -> bool {
    e.is(ErrorKind::Timeout) || e.kind == crate::policy::error::ToolErrorKind::Cancelled
}

pub(super) async fn start_machine(
    (machines, fleets, waits, cancel): (Ownership<'_>, Fleets<'_>, Waits<'_>, Cancel<'_>),
    a: args::StartArgs,
) -> Result<results::Started, ToolError> {
    let named = machines.machine(&a.name)?;
    let fleet = fleets.reach(a.target).await?;
    let wait = a.wait.unwrap_or(true);
    let started = if wait {
        waits
            .start_reported(&fleet, &named, a.branchable, None)
            .await
    } else {
        cancel.run(fleet.begin_start(&named, a.branchable)).await
    };
    let machine = match started {
        Ok(m) => m,
        Err(mut e) if e.is(ErrorKind::Timeout) => {
            e.message.push_str(&format!(
                "\nThe start may still be under way: the service queues starts and can take \
                 minutes, and {} may come up after this call gave up. list-machines with its name shows its \
                 state; start-machine again waits for it.",
                named
            ));
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    if wait {
        waits.wait_ready(&fleet, &machine.id).await?;
    }
    Ok(results::Started {
        machine,
        ready: wait,
    })
}

pub(super) async fn stop_machine(
    (machines, fleets, cancel, progress, jobs): (
        Ownership<'_>,
        Fleets<'_>,
        Cancel<'_>,
        &Progress,
        JobTable<'_>,
    ),
    a: args::StopArgs,
) -> Result<results::Stopped, ToolError> {
    let named = machines.machine(&a.name)?;
    let fleet = fleets.reach(a.target).await?;
    if a.pause {
        return pause_machine((cancel, progress), &fleet, &named).await;
    }
    // Its jobs end first: a watcher's look sent after the stop would start a cloud machine
    // again (the cloud's exec always does).
    jobs.machine_stopping(fleet.kind(), &named).await;
    let machine = cancel.run(fleet.stop(&named)).await?;
    Ok(results::Stopped { machine })
}

/// A pause keeps the guest whole, jobs included: they go on after the resume.
async fn pause_machine(
    (cancel, progress): (Cancel<'_>, &Progress),
    fleet: &Fleet,
    name: &str,
) -> Result<results::Stopped, ToolError> {
    if let Some(why) = fleet.capabilities().lacks(Feature::Pause) {
        return Err(ToolError::argument("pause", why));
    }
    let machine = cancel.run(fleet.get(name)).await?;
    match machine.phase() {
        Phase::Paused => return Ok(results::Stopped { machine }),
        Phase::Running => {}
        _ => {
            return Err(ToolError::new(
                ToolErrorKind::Fleet(ErrorKind::Conflict),
                format!(
                    "pause: {name} is {}, and only a running machine can be paused; a stopped \
                     one already keeps its disk",
                    machine.state
                ),
            ));
        }
    }
    // The engine saves a paused machine as it saves a branch source: one started otherwise is
    // refused here, saying what to do, rather than after minutes.
    if !machine.branchable {
        return Err(ToolError::new(
            ToolErrorKind::Fleet(ErrorKind::Conflict),
            format!(
                "pause: {name} was not started branchable, which a pause needs (its memory is \
                 saved as a branch source's). start-machine with branchable: true restarts it so \
                 (its memory, processes and /tmp start anew), after which it can be paused; or \
                 stop-machine without pause keeps its disk"
            ),
        ));
    }
    let paused = progress
        .during(
            &format!(
                "pausing machine {name}: saving its memory, processes and disk (minutes on an \
                 emulated host)"
            ),
            None,
            Box::pin(cancel.run(fleet.pause(name))),
        )
        .await?;
    Ok(results::Stopped { machine: paused })
}

/// What deleting a machine takes of the call: the delete, and everything the server keeps of
/// the machine let go.
type Deleting<'c> = (
    Ownership<'c>,
    Fleets<'c>,
    Cancel<'c>,
    Making<'c>,
    Records<'c>,
    &'c Supplier,
    &'c Terminals,
    &'c Arc<Workspaces>,
);

pub(super) async fn delete_machine(
    (machines, fleets, cancel, making, records, credentials, terminals, workspaces): Deleting<'_>,
    a: args::MachineArgs,
) -> Result<Deleted, ToolError> {
    let named = machines.machine(&a.name)?;
    let fleet = fleets.reach(a.target).await?;
    let deleted = cancel.run(fleet.delete(&named)).await?;
    making
        .released(fleet.kind(), &named, deleted.usage_micros)
        .await;
    let made = records.made();
    made.deleted(fleet.kind(), &named, deleted.usage_micros);
    if deleted.deleted != *named {
        made.deleted(fleet.kind(), &deleted.deleted, deleted.usage_micros);
    }
    if fleet.capabilities().offers(Feature::Credentials) {
        credentials.forget_machine(&named).await;
    }
    terminals.close_machine(fleet.kind(), &named);
    workspaces.forget(fleet.kind(), &named);
    // Prefixed names and bases are recorded (a cloud id may stand for either).
    records.forget(fleet.kind(), &named).await;
    Ok(deleted)
}

/// create-machine with `base`: one child of the base, made as branch-machine makes it (ready,
/// recorded, held, its workspace and credentials carried). What a child has of its base cannot
/// be asked for as well, and is refused naming the argument.
async fn create_from_base(
    branching: Branching<'_>,
    a: &args::CreateArgs,
    base: &super::owners::MachineRef,
) -> Result<results::Created, ToolError> {
    let m = &a.machine;
    let given = [
        ("image", m.image.is_some()),
        ("cpus", m.cpus.is_some()),
        ("memoryMb", m.memory_mb.is_some()),
        ("network", m.network.is_some()),
        ("allowHosts", m.allow_hosts.is_some()),
        ("allowCidrs", m.allow_cidrs.is_some()),
        ("credentials", m.credentials.is_some()),
        ("workspace", m.workspace.is_some()),
        ("ports", a.ports.is_some()),
        ("storageGb", a.storage_gb.is_some()),
        ("allowHostsFrom", a.allow_hosts_from.is_some()),
        ("mounts", a.mounts.is_some()),
        ("overlayGb", a.overlay_gb.is_some()),
        ("env", a.env.is_some()),
        ("start", a.start == Some(false)),
    ];
    if let Some((arg, _)) = given.iter().find(|(_, set)| *set) {
        return Err(ToolError::argument(
            arg,
            "cannot go with base: a child of a base has its image, size, egress, credentials, \
             workspace and disk, and runs at once. Give base with name and branchable only; \
             branch-machine makes several, each with its env",
        ));
    }
    let child = a.name.clone().map_or_else(
        || format!("{}{}", branching.4.machine_prefix, random_hex()),
        String::from,
    );
    let child_name: super::grammar::MachineName =
        serde_json::from_value(serde_json::Value::String(child))
            .map_err(|e| ToolError::argument("name", e.to_string()))?;
    let branched = branch_machine(
        branching,
        args::BranchArgs {
            target: a.target,
            name: base.clone(),
            child_name,
            branchable: a.branchable,
            wait: None,
            count: None,
            env: None,
            freeze_source: None,
        },
    )
    .await?;
    Ok(results::Created {
        machine: branched.machine,
        ephemeral: branched.ephemeral,
        ready: branched.ready,
        pool: None,
        workspace: None,
    })
}

/// Where a branch child finds the variables given for it: written by the server on both fleets
/// (the cloud's branch takes no env, and the engine's own file is its format, not ours), as
/// `KEY='value'` lines a shell sources.
const FORK_ENV_PATH: &str = "/etc/smol/branch-env";

pub(super) async fn branch_machine(
    branching: Branching<'_>,
    a: args::BranchArgs,
) -> Result<results::Branched, ToolError> {
    let ((fleets, _, records, _), machines, _, (_, cancel), config, user, workspaces, _) =
        branching;
    let count = a.count.unwrap_or(1);
    args::range("count", count, 1, args::MAX_CHILDREN)?;
    let envs = a.env.clone().unwrap_or_default();
    if !envs.is_empty() && envs.len() as u64 != count {
        return Err(ToolError::argument(
            "env",
            format!(
                "{} objects for {count} children: give one per child, in order (an empty {{}} \
                 for a child without variables)",
                envs.len()
            ),
        ));
    }
    if !envs.is_empty() && a.wait == Some(false) {
        return Err(ToolError::argument(
            "wait",
            "false cannot go with env: the variables are written into each child once it runs \
             commands. Leave wait out",
        ));
    }
    let names: Vec<String> = if count == 1 {
        vec![a.child_name.to_string()]
    } else {
        (1..=count)
            .map(|i| format!("{}-{i}", &*a.child_name))
            .collect()
    };
    let fleet = fleets.reach(a.target).await?;
    let named = machines.machine(&a.name)?;
    let mut pending_base = match a.freeze_source {
        Some(true) => base_to_be_made((cancel, records, workspaces), &fleet, &named).await?,
        _ => None,
    };
    let mut made: Vec<(Machine, Provisional<'_>)> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let freeze = a.freeze_source == Some(true) && i + 1 == names.len();
        let env = envs.get(i).map(|e| e.clone().into_inner());
        match branch_one(branching, &fleet, &a, name, freeze, env).await {
            Ok(child) => made.push(child),
            Err(mut e) => {
                // The freeze goes with the last child: a failure before or at it leaves the
                // source what it was (running, and not a base).
                if let Some(pending) = pending_base.take() {
                    records.base_not_made(pending).await;
                }
                // All or none: the children this call made before the failure go again.
                let mut gone = Vec::new();
                for (machine, provisional) in made {
                    if provisional.discard().await.is_ok() {
                        gone.push(machine.name);
                    }
                }
                if !gone.is_empty() {
                    e.message.push_str(&format!(
                        "\nThe children made before it were deleted again: {}.",
                        gone.join(", ")
                    ));
                }
                return Err(e);
            }
        }
    }
    if pending_base.is_some() {
        tracing::info!(machine = %named, user = user.id(), "a machine became a base");
    }
    records.base_branched(fleet.kind(), &named).await;
    let ephemeral = names[0].starts_with(&config.machine_prefix);
    let children = if count > 1 { names } else { Vec::new() };
    let mut machines = made.into_iter().map(|(machine, _)| machine);
    let Some(machine) = machines.next() else {
        return Err(ToolError::new(ToolErrorKind::Internal, "no child was made"));
    };
    Ok(results::Branched {
        machine,
        ready: a.wait.unwrap_or(true),
        ephemeral,
        children,
    })
}

/// A freeze asked of `source`: recorded as a base first, within the bounds on bases, so that
/// no session's end deletes it. `None` when it is a base already (a freeze again changes
/// nothing).
async fn base_to_be_made(
    (cancel, records, workspaces): (Cancel<'_>, Records<'_>, &Arc<Workspaces>),
    fleet: &Fleet,
    source: &str,
) -> Result<Option<crate::process::bases::PendingBase>, ToolError> {
    let machine = cancel.run(fleet.get(source)).await?;
    if machine.phase() == Phase::Frozen {
        return Ok(None);
    }
    let mut made_from = machine
        .image
        .clone()
        .unwrap_or_else(|| "a bare machine".to_owned());
    if let Some(attached) = workspaces.of(fleet.kind(), source) {
        made_from.push_str(&format!(
            ", workspace at commit {}",
            attached.workspace.base
        ));
    }
    let pending = records
        .base_to_be_made(fleet.kind(), &machine.name, &machine.id, made_from)
        .await
        .map_err(|refused| {
            let kind = match refused {
                crate::process::bases::BaseRefused::Record(_) => ToolErrorKind::Record,
                _ => ToolErrorKind::LimitReached,
            };
            ToolError::new(
                kind,
                format!("freezeSource: {refused}; nothing was branched"),
            )
        })?;
    // Frozen at a branchpoint, a base can also be a warm pool's source: the engine leases from
    // a frozen source only if it was (nested 1.32.2). Only the local engine has pools.
    if fleet.capabilities().offers(Feature::WarmPools)
        && let Err(e) = cancel
            .run(crate::process::pools::declare_branchpoint(fleet, source))
            .await
    {
        records.base_not_made(pending).await;
        return Err(e);
    }
    Ok(Some(pending))
}

/// One child of a branch-machine call, made, recorded and (unless the call said not to wait)
/// ready, with its variables written.
async fn branch_one<'c>(
    (maker, machines, waits, (progress, cancel), config, _, workspaces, credentials): Branching<'c>,
    fleet: &Fleet,
    a: &args::BranchArgs,
    child_name: &str,
    freeze_source: bool,
    env: Option<std::collections::BTreeMap<String, String>>,
) -> Result<(Machine, Provisional<'c>), ToolError> {
    let (_, making, _, session) = maker;
    let named = machines.machine(&a.name)?;
    let ephemeral = child_name.starts_with(&config.machine_prefix);
    let slot = making.admit_machine(fleet, child_name).await?;
    let mut provisional =
        Provisional::begin_child(recording(maker), fleet, child_name, ephemeral, Some(&named))
            .await?;
    let waiting_for = format!("waiting for the branch {child_name} of {}", &named);
    let branching = Box::pin(cancel.run(fleet.branch(BranchSpec {
        source: &named,
        child: child_name,
        branchable: a.branchable,
        freeze_source,
    })));
    let child = match progress.during(&waiting_for, None, branching).await {
        Ok(c) => {
            if let Err(e) = making.hold_made(fleet, &c.name, &c.id).await {
                // Made, but held by no one: gone again rather than left the operator's.
                provisional.created(&c.id).await;
                let _ = provisional.discard().await;
                return Err(e);
            }
            c
        }
        Err(e) if e.is(ErrorKind::Conflict) => {
            provisional.refused().await;
            return Err(e);
        }
        // The child may not exist yet (it is still in the source's queue), so a delete now would
        // find nothing and the record would forget a machine that comes up later. It stays
        // recorded under its name instead, for the session's clean-up to find.
        Err(mut e) if fleet.capabilities().arrives_late && gave_up_waiting(&e) => {
            e.message.push_str(&format!(
                "\nThe branch may still be made: the service queues branches of a source and can \
                 take minutes, so {child_name} may come up after this call gave up. list-machines \
                 {child_name} shows whether it exists; delete-machine removes it{}.",
                if ephemeral {
                    format!(", and it is deleted {}", session.ephemeral_end())
                } else {
                    String::new()
                },
            ));
            drop(provisional);
            return Err(e);
        }
        Err(e) => {
            let _ = provisional.abandon().await;
            return Err(e);
        }
    };
    provisional.created(&child.id).await;
    slot.fill(&child.id);
    // The child has its source's /workspace as it stood: its changes are read against the same
    // base as every other child's.
    if let Some(source) = workspaces.of(fleet.kind(), &named)
        && let Err(why) = workspaces.attach(
            fleet.kind(),
            child_name,
            &child.id,
            Some(&source.name),
            &source.workspace,
        )
    {
        tracing::warn!(child = %child_name, error = %why, "could not record a branch child's workspace");
    }
    if fleet.capabilities().offers(Feature::Credentials) {
        // A branch child keeps its source's bindings and placeholders (smolvm resolves the
        // values under the child's own name), so its next boots get the source's values; it
        // holds what the source was given too.
        credentials.branched(&named, &child.id).await;
    }
    if a.wait.unwrap_or(true) {
        let ready = async {
            waits.wait_ready(fleet, &child.id).await?;
            if let Some(env) = env.filter(|e| !e.is_empty()) {
                let text: String = env
                    .iter()
                    .map(|(k, v)| format!("{k}='{}'\n", v.replace('\'', r"'\''")))
                    .collect();
                cancel
                    .run(fleet.write_file(&child.id, FORK_ENV_PATH, text.into_bytes()))
                    .await?;
            }
            Ok::<(), ToolError>(())
        };
        if let Err(mut e) = ready.await {
            if a.count.unwrap_or(1) > 1 {
                // One of several: the call makes all of them or none.
                if provisional.discard().await.is_ok() {
                    e.message
                        .push_str(&format!("\nThe child {child_name} was deleted again."));
                }
            } else {
                e.message.push_str(&format!(
                    "\nThe child {child_name} exists; delete-machine removes it."
                ));
            }
            return Err(e);
        }
    }
    Ok((child, provisional))
}

pub(super) async fn pull_image(
    (machines, fleets, waits): (Ownership<'_>, Fleets<'_>, Waits<'_>),
    a: args::PullArgs,
) -> Result<crate::fleet::PulledImage, ToolError> {
    let named = machines.machine(&a.name)?;
    if let Some(why) = fleets.capabilities(a.target)?.lacks(Feature::ImagePull) {
        return Err(FleetError::new(ErrorKind::Unsupported, "pull-image", why).into());
    }
    let fleet = fleets.reach(a.target).await?;
    waits.pull_reported(&fleet, &named, &a.image).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tools::ToolErrorKind;

    #[test]
    fn the_egress_hint_names_the_tool_that_was_called() {
        let pull_failed = || {
            ToolError::new(
                ToolErrorKind::Fleet(ErrorKind::Upstream),
                "start machine m: HTTP 500: failed to fetch manifest from registry-1.docker.io",
            )
        };
        let blocked = CreateSpec::new("m", "alpine");
        let mut open = blocked.clone();
        open.egress = Egress::Open;
        let hinted = with_egress_hint(pull_failed(), &blocked, Tool::RunOnce);
        assert!(
            hinted
                .message
                .contains("Pass network: \"open\" to run-once"),
            "{}",
            hinted.message
        );
        let hinted = with_egress_hint(pull_failed(), &blocked, Tool::CreateMachine);
        assert!(
            hinted.message.contains("to create-machine"),
            "{}",
            hinted.message
        );
        let open = with_egress_hint(pull_failed(), &open, Tool::RunOnce);
        assert_eq!(open, pull_failed(), "no hint when egress was open");
        // A bare machine pulls nothing: the engine's refusal naming registryRef is no pull.
        let bare_refused = ToolError::new(
            ToolErrorKind::Fleet(ErrorKind::Invalid),
            "create machine m: HTTP 400: cmd/entrypoint require an image, from, or registryRef",
        );
        let bare = with_egress_hint(bare_refused.clone(), &CreateSpec::bare("m"), Tool::RunOnce);
        assert_eq!(bare, bare_refused);
        // A lookup that failed on the host is not the machine's egress.
        let host_dns = ToolError::new(
            ToolErrorKind::Fleet(ErrorKind::Upstream),
            "start machine m: pull alpine: host-side DNS lookup of registry-1.docker.io failed",
        );
        let hinted = with_egress_hint(host_dns, &blocked, Tool::CreateMachine);
        assert!(
            hinted.message.contains("from this host")
                && !hinted.message.contains("network: \"open\""),
            "{}",
            hinted.message
        );
    }
}
