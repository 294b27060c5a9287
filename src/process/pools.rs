//! Warm pools: machines the local engine keeps booted ahead of the agent's call, so that a
//! create-machine or run-once that asks for what a pool holds gets one in well under a second
//! instead of waiting for a boot.
//!
//! The operator describes each pool (`pools`: image, size, cpus, memory, network); the process
//! sets each up on the engine once, in the background, at its first local call: a source machine
//! booted branchable, its branchpoint declared (`smolvm-branch-ready`, the 1.32.2 agent's
//! helper: the engine clones the source only from a live branchpoint), then the engine's fork
//! pool over it, frozen, which the engine keeps filled. A pool another process (or an earlier
//! one) set up on the same engine is used as it is. At the process's end the pools it set up go,
//! their source with them. Leasing, heartbeating and completing a machine are the fleet's
//! (`crate::fleet::LocalFleet`).

use crate::fleet::{
    Command, CreateSpec, Egress, ExecSpec, Fleet, FleetResult, POOL_SOURCE_PREFIX, PoolSetup,
};
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

/// What the `pools` setting accepts, as `--help` and the README say it.
pub const ACCEPTS: &str = "a JSON list of pools, each {\"name\" (1 to 24 lowercase letters, \
     digits or -), \"size\" (1 to 16 machines kept ready), and either \"source\" (a local \
     machine, or a base, to clone as it is) or optionally \"image\", \"cpus\", \"memoryMb\", \"network\" \
     (open or blocked), what is left out being the machine defaults}";

const MAX_POOL_SIZE: u32 = 16;
const LEASE_TTL_SECS: u64 = 300;
/// How long the source may take to run its first command after its start (an image pull
/// included).
const SOURCE_READY: Duration = Duration::from_secs(300);

/// One pool as the operator describes it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolDef {
    pub name: String,
    pub size: u32,
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub cpus: Option<u32>,
    #[serde(default)]
    pub memory_mb: Option<u32>,
    #[serde(default)]
    pub network: Option<String>,
    /// A machine of the operator's (prepared with what the agents need) whose clones the pool
    /// holds, instead of a machine made from `image`.
    #[serde(default)]
    pub source: Option<String>,
}

impl PoolDef {
    /// The engine's pool.
    pub fn engine_pool(&self) -> String {
        format!("smolmcp-{}", self.name)
    }

    /// The machine the pool clones: the operator's, or one the server makes.
    fn source(&self) -> String {
        self.source
            .clone()
            .unwrap_or_else(|| format!("{POOL_SOURCE_PREFIX}{}", self.name))
    }

    /// The machine this pool holds, with the defaults a create-machine gets for what the
    /// operator left out.
    pub fn machine(&self, defaults: &PoolDefaults) -> CreateSpec {
        let mut spec = CreateSpec::bare(self.source());
        spec.image = self.image.clone();
        spec.cpus = self.cpus.unwrap_or(defaults.cpus);
        spec.memory_mb = self.memory_mb.unwrap_or(defaults.memory_mb);
        spec.egress = match self.network.as_deref() {
            Some("open") => Egress::Open,
            Some(_) => Egress::Blocked,
            None => defaults.egress.clone(),
        };
        spec
    }
}

/// What a create-machine gets when it does not say: the pools' defaults too.
#[derive(Debug, Clone)]
pub struct PoolDefaults {
    pub cpus: u32,
    pub memory_mb: u32,
    pub egress: Egress,
}

/// Reads and checks the `pools` setting; each refusal names the pool and what is accepted.
pub fn parse(value: serde_json::Value) -> Result<Vec<PoolDef>, String> {
    let defs: Vec<PoolDef> = serde_json::from_value(value).map_err(|e| e.to_string())?;
    let mut names = HashSet::new();
    for def in &defs {
        let label = format!("pool {:?}", def.name);
        let name_ok = (1..=24).contains(&def.name.len())
            && def
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !name_ok {
            return Err(format!(
                "{label}: a name is 1 to 24 lowercase letters, digits or -"
            ));
        }
        if !names.insert(def.name.clone()) {
            return Err(format!("{label} is declared twice"));
        }
        if !(1..=MAX_POOL_SIZE).contains(&def.size) {
            return Err(format!(
                "{label}: size {} is not accepted: give 1 to {MAX_POOL_SIZE}",
                def.size
            ));
        }
        if def.cpus.is_some_and(|c| !(1..=64).contains(&c)) {
            return Err(format!("{label}: cpus: give 1 to 64"));
        }
        if def.memory_mb.is_some_and(|m| !(128..=262_144).contains(&m)) {
            return Err(format!("{label}: memoryMb: give 128 to 262144"));
        }
        if def
            .network
            .as_deref()
            .is_some_and(|n| n != "open" && n != "blocked")
        {
            return Err(format!("{label}: network: give open or blocked"));
        }
        if def.image.as_deref().is_some_and(str::is_empty) {
            return Err(format!(
                "{label}: image: give an OCI reference or leave it out"
            ));
        }
        if def.source.is_some()
            && (def.image.is_some()
                || def.cpus.is_some()
                || def.memory_mb.is_some()
                || def.network.is_some())
        {
            return Err(format!(
                "{label}: source: its clones are the source machine as it is; give source alone, \
                 or image, cpus, memoryMb and network without it"
            ));
        }
    }
    Ok(defs)
}

/// The process's warm pools: the operator's, and which of them are set up on the engine.
pub struct WarmPools {
    defs: Vec<PoolDef>,
    defaults: PoolDefaults,
    /// Pools found or set up on the engine, ready to lease from, with the machine each holds.
    usable: Mutex<HashMap<String, CreateSpec>>,
    /// Pools this process set up (and so removes at its end).
    made: Mutex<HashSet<String>>,
}

impl WarmPools {
    pub fn new(defs: Vec<PoolDef>, defaults: PoolDefaults) -> WarmPools {
        WarmPools {
            defs,
            defaults,
            usable: Mutex::default(),
            made: Mutex::default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.defs.is_empty()
    }

    /// The usable pool whose machine is `spec` (name aside): same image, size and network, and
    /// nothing a pool machine cannot have (ports, mounts, disks, credentials, branchable).
    /// Environment variables are the lease's own.
    pub fn matching(&self, spec: &CreateSpec) -> Option<&PoolDef> {
        if !spec.ports.is_empty()
            || !spec.mounts.is_empty()
            || spec.storage_gb.is_some()
            || spec.overlay_gb.is_some()
            || spec.branchable
            || !spec.credentials.is_empty()
        {
            return None;
        }
        let usable = self.usable.lock().ok()?;
        self.defs.iter().find(|def| {
            usable.get(&def.name).is_some_and(|held| {
                held.image == spec.image
                    && held.cpus == spec.cpus
                    && held.memory_mb == spec.memory_mb
                    && held.egress == spec.egress
            })
        })
    }

    /// Sets up every pool on `fleet` that is not there yet, one after another; a pool that
    /// cannot be set up is logged and left out (creates then boot cold).
    pub async fn set_up(&self, fleet: &Fleet) {
        for def in &self.defs {
            match self.set_up_one(fleet, def).await {
                Ok(held) => {
                    if let Ok(mut usable) = self.usable.lock() {
                        usable.insert(def.name.clone(), held);
                    }
                    tracing::info!(pool = %def.name, size = def.size, "warm pool ready to lease");
                }
                Err(e) => {
                    tracing::warn!(pool = %def.name, error = %e, "could not set up the warm pool; its machines are made cold")
                }
            }
        }
    }

    /// Sets `def` up (or finds it set up); answers the machine its clones are.
    async fn set_up_one(&self, fleet: &Fleet, def: &PoolDef) -> FleetResult<CreateSpec> {
        let pool = def.engine_pool();
        let operators = def.source.is_some();
        let held = if operators {
            held_by(&fleet.get(&def.source()).await?)
        } else {
            def.machine(&self.defaults)
        };
        if fleet.pool(&pool).await?.is_some() {
            return Ok(held);
        }
        let source = held.name.clone();
        // A base (a frozen source) is cloned as it was frozen: it runs nothing to restart or
        // declare, and the engine takes it as a golden (its leases work because the freeze
        // was made at a branchpoint: `declare_branchpoint` before every freeze).
        let frozen = operators && fleet.get(&source).await?.phase() == crate::fleet::Phase::Frozen;
        if operators && !frozen {
            // The engine clones only a machine started branchable (forkable): one running
            // without is restarted so, as start-machine with branchable would.
            let machine = fleet.get(&source).await?;
            if !(machine.is_running() && machine.branchable) {
                if machine.is_running() {
                    fleet.stop(&source).await?;
                }
                fleet.start(&source, Some(true)).await?;
            }
        } else if !operators {
            // A source left by a process that ended (frozen with its pool gone, which the
            // engine cannot resume) is made anew.
            if fleet.get(&source).await.is_ok() {
                fleet.delete_with_clones(&source).await?;
            }
            fleet.create(&held).await?;
            fleet.start(&source, Some(true)).await?;
        }
        if !frozen {
            wait_until_it_runs_commands(fleet, &source).await?;
            declare_branchpoint(fleet, &source).await?;
        }
        fleet
            .create_pool(&PoolSetup {
                pool: pool.clone(),
                source: source.clone(),
                ready: def.size,
                lease_ttl_secs: LEASE_TTL_SECS,
                // The engine cannot resume a frozen source: only one the server made (and
                // deletes at its end) is frozen, never the operator's.
                freeze_source: !operators,
            })
            .await?;
        if let Ok(mut made) = self.made.lock() {
            made.insert(def.name.clone());
        }
        Ok(held)
    }

    /// At the process's end: the pools it set up, and their sources.
    pub async fn tear_down(&self, fleet: &Fleet) {
        let made: Vec<String> = self
            .made
            .lock()
            .map(|m| m.iter().cloned().collect())
            .unwrap_or_default();
        for def in self.defs.iter().filter(|d| made.contains(&d.name)) {
            if let Err(e) = fleet.delete_pool(&def.engine_pool()).await {
                tracing::warn!(pool = %def.name, error = %e, "could not delete the warm pool");
            }
            // The operator's source stays: it was theirs before the pool.
            if def.source.is_none()
                && let Err(e) = fleet.delete_with_clones(&def.source()).await
            {
                tracing::warn!(pool = %def.name, error = %e, "could not delete the warm pool's source");
            }
        }
    }
}

/// Parks a running branchable machine at a branchpoint: the engine clones a pool's source only
/// from a live one (and leases from a frozen source only if it was frozen at one, seen on the
/// nested engine). The agent's helper declares it and waits, in the background; every child
/// has it running too, harmlessly.
pub async fn declare_branchpoint(fleet: &Fleet, machine: &str) -> FleetResult<()> {
    let mut declare = ExecSpec::new(Command::Shell(
        "smolvm-branch-ready > /tmp/smolmcp-branch-ready.log 2>&1".into(),
    ));
    declare.background = true;
    fleet.exec(machine, &declare).await.map(|_| ())
}

/// The machine a clone of `source` is, as a create-machine would ask for it.
fn held_by(source: &crate::fleet::Machine) -> CreateSpec {
    let mut held = CreateSpec::bare(source.name.clone());
    held.image = source.image.clone();
    held.cpus = source.cpus.unwrap_or(0);
    held.memory_mb = source.memory_mb.unwrap_or(0);
    held.egress = match source.network.egress() {
        // An allow list a create can ask for (allowHosts, allowCidrs) is matched as such; one
        // that asks the user (its name filter) or a mode this server does not know matches no
        // create: a clone would not carry what the create promised.
        Some(egress @ (Egress::Open | Egress::Blocked)) => egress.clone(),
        Some(egress @ Egress::Allow { hosts, .. })
            if !hosts.iter().any(|h| h == crate::fleet::NAME_FILTER_HOST) =>
        {
            egress.clone()
        }
        _ => Egress::Allow {
            hosts: vec![source.network.to_string()],
            cidrs: Vec::new(),
        },
    };
    held
}

async fn wait_until_it_runs_commands(fleet: &Fleet, machine: &str) -> FleetResult<()> {
    let deadline = tokio::time::Instant::now() + SOURCE_READY;
    loop {
        let mut probe = ExecSpec::new(Command::Argv(vec!["true".into()]));
        probe.timeout_secs = Some(10);
        match fleet.exec(machine, &probe).await {
            Ok(out) if out.exit_code == 0 => return Ok(()),
            Ok(_) => {}
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(_) => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(crate::fleet::FleetError::new(
                crate::fleet::ErrorKind::Timeout,
                format!("start warm-pool source {machine}"),
                format!("it ran no command within {} s", SOURCE_READY.as_secs()),
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn defaults() -> PoolDefaults {
        PoolDefaults {
            cpus: 2,
            memory_mb: 2048,
            egress: Egress::Blocked,
        }
    }

    #[test]
    fn pools_are_checked_naming_the_pool_and_what_is_accepted() {
        let ok = parse(json!([{"name": "py", "size": 2, "image": "python:3.12-alpine"}])).unwrap();
        assert_eq!(ok[0].engine_pool(), "smolmcp-py");
        for (bad, says) in [
            (json!([{"name": "Py", "size": 1}]), "lowercase"),
            (json!([{"name": "a", "size": 0}]), "give 1 to 16"),
            (
                json!([{"name": "a", "size": 1}, {"name": "a", "size": 1}]),
                "twice",
            ),
            (
                json!([{"name": "a", "size": 1, "network": "ask"}]),
                "open or blocked",
            ),
            (
                json!([{"name": "a", "size": 1, "gpu": true}]),
                "unknown field",
            ),
            (
                json!([{"name": "a", "size": 1, "source": "m", "cpus": 2}]),
                "give source alone",
            ),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn only_a_machine_the_pool_holds_matches_it() {
        let pools = WarmPools::new(
            parse(json!([{"name": "py", "size": 1, "image": "python", "cpus": 1}])).unwrap(),
            defaults(),
        );
        let mut spec = CreateSpec::bare("mcp-x");
        spec.image = Some("python".into());
        spec.cpus = 1;
        assert!(pools.matching(&spec).is_none(), "not set up yet");
        let held = pools.defs[0].machine(&defaults());
        pools.usable.lock().unwrap().insert("py".into(), held);
        assert_eq!(pools.matching(&spec).map(|d| d.name.as_str()), Some("py"));
        spec.env.insert("A".into(), "1".into());
        assert!(pools.matching(&spec).is_some(), "env goes with the lease");
        for change in [
            |s: &mut CreateSpec| s.cpus = 2,
            |s: &mut CreateSpec| s.image = None,
            |s: &mut CreateSpec| s.egress = Egress::Open,
            |s: &mut CreateSpec| s.branchable = true,
            |s: &mut CreateSpec| s.storage_gb = Some(4),
        ] {
            let mut other = spec.clone();
            change(&mut other);
            assert!(pools.matching(&other).is_none(), "{other:?}");
        }
    }
}
