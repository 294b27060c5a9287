//! A third fleet, written here and nowhere in `src/`: an in-memory fleet that offers little
//! (no mounts, credentials, egress report or widening, pools, log sources or image pulls; it
//! needs an image and takes at most 1 KiB a write). Placed to answer for the `local` target (a
//! fleet does not say what it is: the process says which target it answers for), it runs the
//! whole tool table: what it does works, and what it lacks is refused before anything is sent,
//! in its own words, because the policy asks a fleet's capabilities, never which fleet it is.

use crate::common::mcp::Harness;
use serde_json::json;
use smol_mcp::fleet::{
    BranchSpec, BranchableAt, Capabilities, Command, CreateSpec, Deleted, ErrorKind, ExecOutput,
    ExecSpec, Feature, FileStream, FleetApi, FleetError, FleetKind, FleetResult, HostPorts,
    LogPage, LogSource, Machine, PortAddress, PortMapping, PublishedPort,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

static TINY: Capabilities = Capabilities {
    lacks: &[
        (Feature::HostMounts, "the tiny fleet mounts nothing"),
        (Feature::Credentials, "the tiny fleet keeps no secrets"),
        (Feature::EgressReport, "the tiny fleet reports no egress"),
        (
            Feature::EgressWidening,
            "the tiny fleet never widens egress",
        ),
        (Feature::WarmPools, "the tiny fleet keeps no pools"),
        (Feature::LogSources, "the tiny fleet has one log"),
        (Feature::ImagePull, "the tiny fleet pulls nothing by hand"),
        (Feature::Terminal, "the tiny fleet has no terminals"),
    ],
    needs_image: Some("the tiny fleet boots images only"),
    branchable_at: BranchableAt::Create,
    metered: false,
    exec_boots_silently: false,
    ids_apart_from_names: false,
    arrives_late: false,
    host_ports: HostPorts::Fleet,
    kept_name_prefixes: &[],
    shows_frozen: false,
};

/// Every request the policy made of it, as `operation machine`.
#[derive(Debug, Default)]
struct TinyFleet {
    machines: Mutex<BTreeMap<String, Machine>>,
    files: Mutex<BTreeMap<(String, String), Vec<u8>>>,
    asked: Mutex<Vec<String>>,
}

impl TinyFleet {
    fn note(&self, what: &str, machine: &str) {
        self.asked.lock().unwrap().push(format!("{what} {machine}"));
    }

    fn asked(&self) -> Vec<String> {
        std::mem::take(&mut *self.asked.lock().unwrap())
    }

    fn machine(&self, name: &str) -> FleetResult<Machine> {
        self.machines
            .lock()
            .unwrap()
            .get(name)
            .cloned()
            .ok_or_else(|| FleetError::new(ErrorKind::NotFound, name, "no such tiny machine"))
    }

    fn set_state(&self, name: &str, state: &str) -> FleetResult<Machine> {
        let mut machines = self.machines.lock().unwrap();
        let machine = machines
            .get_mut(name)
            .ok_or_else(|| FleetError::new(ErrorKind::NotFound, name, "no such tiny machine"))?;
        machine.state = state.into();
        Ok(machine.clone())
    }
}

#[async_trait::async_trait]
impl FleetApi for TinyFleet {
    fn capabilities(&self) -> &'static Capabilities {
        &TINY
    }

    fn upload_refusal(&self, len: u64) -> Option<String> {
        (len > 1024).then(|| format!("{len} bytes: the tiny fleet takes at most 1 KiB a write"))
    }

    async fn list(&self) -> FleetResult<Vec<Machine>> {
        self.note("list", "-");
        Ok(self.machines.lock().unwrap().values().cloned().collect())
    }

    async fn get(&self, machine: &str) -> FleetResult<Machine> {
        self.note("get", machine);
        self.machine(machine)
    }

    async fn create(&self, spec: &CreateSpec) -> FleetResult<Machine> {
        self.note("create", &spec.name);
        if !spec.mounts.is_empty() {
            return Err(FleetError::new(
                ErrorKind::Unsupported,
                "create",
                "the tiny fleet mounts nothing",
            ));
        }
        let machine = Machine {
            id: spec.name.clone(),
            name: spec.name.clone(),
            state: "created".into(),
            cpus: Some(spec.cpus),
            memory_mb: Some(spec.memory_mb),
            network: spec.egress.clone().into(),
            image: spec.image.clone(),
            url: None,
            pid: None,
            created_at: None,
            branchable: spec.branchable,
            ports: Vec::new(),
            upstream_ready: None,
            consumption: Default::default(),
        };
        self.machines
            .lock()
            .unwrap()
            .insert(spec.name.clone(), machine.clone());
        Ok(machine)
    }

    async fn start(&self, machine: &str, _branchable: Option<bool>) -> FleetResult<Machine> {
        self.note("start", machine);
        self.set_state(machine, "running")
    }

    async fn stop(&self, machine: &str) -> FleetResult<Machine> {
        self.note("stop", machine);
        self.set_state(machine, "stopped")
    }

    async fn delete(&self, machine: &str) -> FleetResult<Deleted> {
        self.note("delete", machine);
        self.machines
            .lock()
            .unwrap()
            .remove(machine)
            .map(|_| Deleted {
                deleted: machine.to_owned(),
                usage_micros: None,
            })
            .ok_or_else(|| FleetError::new(ErrorKind::NotFound, machine, "no such tiny machine"))
    }

    async fn exec(&self, machine: &str, spec: &ExecSpec) -> FleetResult<ExecOutput> {
        self.note("exec", machine);
        self.set_state(machine, "running")?;
        let text = match &spec.command {
            Command::Shell(text) => text.clone(),
            Command::Argv(argv) => argv.join(" "),
        };
        Ok(ExecOutput {
            exit_code: text
                .strip_prefix("exit ")
                .and_then(|code| code.parse().ok())
                .unwrap_or(0),
            stdout: format!("tiny ran: {text}\n").into_bytes(),
            stderr: Vec::new(),
            stdout_cut_upstream: false,
            stderr_cut_upstream: false,
        })
    }

    async fn read_file(&self, machine: &str, path: &str) -> FleetResult<FileStream> {
        self.note("read", machine);
        let files = self.files.lock().unwrap();
        let bytes = files
            .get(&(machine.to_owned(), path.to_owned()))
            .cloned()
            .ok_or_else(|| FleetError::new(ErrorKind::NotFound, path, "no such tiny file"))?;
        Ok(FileStream::whole(bytes))
    }

    async fn write_file(&self, machine: &str, path: &str, bytes: Vec<u8>) -> FleetResult<u64> {
        self.note("write", machine);
        let len = bytes.len() as u64;
        self.files
            .lock()
            .unwrap()
            .insert((machine.to_owned(), path.to_owned()), bytes);
        Ok(len)
    }

    async fn branch(&self, spec: BranchSpec<'_>) -> FleetResult<Machine> {
        self.note("branch", spec.source);
        Err(FleetError::new(
            ErrorKind::Unsupported,
            "branch",
            "the tiny fleet cannot branch",
        ))
    }

    async fn set_ports(&self, machine: &str, ports: &[PortMapping]) -> FleetResult<Machine> {
        self.note("ports", machine);
        let mut machines = self.machines.lock().unwrap();
        let Some(m) = machines.get_mut(machine) else {
            return Err(FleetError::new(
                ErrorKind::NotFound,
                "ports",
                "no such machine",
            ));
        };
        // It places the outside side itself, as the cloud does: 40000 + the guest port.
        m.ports = ports
            .iter()
            .map(|p| PublishedPort {
                guest: p.guest,
                host: Some(40_000 + p.guest % 20_000),
            })
            .collect();
        Ok(m.clone())
    }

    fn port_address(&self, machine: &Machine, guest: u16) -> Option<PortAddress> {
        let placed = machine.ports.iter().find(|p| p.guest == guest)?.host?;
        Some(PortAddress {
            url: format!("tiny://{}:{placed}", machine.name),
            needs: None,
        })
    }

    // What it lacks, answered as a fleet without it would, noted so a test sees any use.

    async fn egress_denials(
        &self,
        machine: &str,
        _limit: u32,
    ) -> FleetResult<Vec<smol_mcp::fleet::EgressDenial>> {
        self.note("egress-denials", machine);
        Ok(Vec::new())
    }

    async fn egress_baseline(
        &self,
        machine: &str,
        _limit: u32,
    ) -> Vec<smol_mcp::fleet::EgressDenial> {
        self.note("egress-baseline", machine);
        Vec::new()
    }

    async fn logs(
        &self,
        machine: &str,
        _tail: usize,
        _cursor: Option<&str>,
        _source: LogSource,
    ) -> FleetResult<LogPage> {
        self.note("logs", machine);
        Ok(LogPage {
            lines: vec!["tiny booted".into()],
            note: None,
            cursor: "1".into(),
            gap: false,
        })
    }
}

async fn tiny_harness() -> (Harness, Arc<TinyFleet>) {
    let h = Harness::start(&[("SMOL_MCP_TARGETS", "local")]).await;
    let tiny = Arc::new(TinyFleet::default());
    assert!(
        h.protocol
            .process()
            .use_fleet(FleetKind::Local, tiny.clone())
    );
    (h, tiny)
}

#[tokio::test]
async fn a_third_fleet_runs_the_tool_table_and_what_it_does_works() {
    let (h, tiny) = tiny_harness().await;
    let made = h
        .ok(
            "create-machine",
            json!({"name": "t1", "image": "alpine", "allowHosts": ["example.com"]}),
        )
        .await;
    assert_eq!(made["machine"]["state"], "running", "{made}");
    let ran = h
        .ok("run-command", json!({"name": "t1", "command": "make"}))
        .await;
    assert_eq!(ran["stdout"], "tiny ran: make\n", "{ran}");
    // No egress watch on a fleet that reports none, even for an allow-listed machine's failed
    // command: it keeps no machine's network, so the machine is read, then the command sent.
    tiny.asked();
    let ran = h
        .ok("run-command", json!({"name": "t1", "command": "exit 3"}))
        .await;
    assert_eq!(ran["exitCode"], 3, "{ran}");
    assert!(ran.get("blockedEgress").is_none(), "{ran}");
    assert_eq!(tiny.asked(), ["get t1", "exec t1"]);
    h.ok(
        "write-file",
        json!({"name": "t1", "path": "/tmp/a", "content": "hello"}),
    )
    .await;
    let (_, page) = h.read(json!({"name": "t1", "path": "/tmp/a"})).await;
    assert_eq!(page, "hello");
    let logs = h.ok("machine-logs", json!({"name": "t1"})).await;
    assert_eq!(logs["lines"], json!(["tiny booted"]), "{logs}");
    let once = h
        .ok("run-once", json!({"image": "alpine", "command": "true"}))
        .await;
    assert_eq!(once["stdout"], "tiny ran: true\n", "{once}");
    // branchable at create on this fleet: start false with branchable is taken as is.
    let later = h
        .ok(
            "create-machine",
            json!({"name": "t2", "image": "alpine", "start": false, "branchable": true}),
        )
        .await;
    assert_eq!(later["machine"]["branchable"], true, "{later}");
    let deleted = h.ok("delete-machine", json!({"name": "t2"})).await;
    assert_eq!(deleted["deleted"], "t2");
    // A fleet that places the outside side itself is asked for the guest port only, and its
    // own address is the answer.
    tiny.asked();
    let published = h
        .ok(
            "publish-port",
            json!({"name": "t1", "port": 8000, "waitSecs": 0}),
        )
        .await;
    assert_eq!(published["url"], "tiny://t1:48000", "{published}");
    assert_eq!(published["hostPort"], 48000, "{published}");
    assert_eq!(tiny.asked(), ["get t1", "get t1", "ports t1"]);
    let again = h
        .ok(
            "publish-port",
            json!({"name": "t1", "port": 8000, "waitSecs": 0}),
        )
        .await;
    assert_eq!(again["url"], published["url"]);
    assert_eq!(
        tiny.asked(),
        ["get t1", "get t1"],
        "a published port is answered again, not sent again"
    );
}

#[tokio::test]
async fn what_a_third_fleet_lacks_is_refused_in_its_own_words_before_anything_is_sent() {
    let (h, tiny) = tiny_harness().await;
    h.ok("create-machine", json!({"name": "t1", "image": "alpine"}))
        .await;
    tiny.asked();
    for (tool, args, refusal) in [
        (
            "create-machine",
            json!({"name": "bare"}),
            "INVALID_ARGUMENT: image: the tiny fleet boots images only",
        ),
        (
            "create-machine",
            json!({"name": "c", "image": "alpine", "credentials": ["github"]}),
            "INVALID_ARGUMENT: credentials: the tiny fleet keeps no secrets",
        ),
        (
            "create-machine",
            json!({"name": "c", "image": "alpine", "network": "ask"}),
            "INVALID_ARGUMENT: network: the tiny fleet never widens egress",
        ),
        (
            "create-machine",
            json!({"name": "c", "image": "alpine", "allowHostsFrom": "t1"}),
            "INVALID_ARGUMENT: allowHostsFrom: the tiny fleet never widens egress",
        ),
        (
            "run-once",
            json!({"command": "true"}),
            "INVALID_ARGUMENT: image: the tiny fleet boots images only",
        ),
        (
            "machine-logs",
            json!({"name": "t1", "source": "engine"}),
            "INVALID_ARGUMENT: source: the tiny fleet has one log",
        ),
        (
            "pull-image",
            json!({"name": "t1", "image": "alpine"}),
            "UNSUPPORTED: pull-image: the tiny fleet pulls nothing by hand",
        ),
        (
            "terminal",
            json!({"name": "t1"}),
            "UNSUPPORTED: terminal: the tiny fleet has no terminals",
        ),
        (
            "publish-port",
            json!({"name": "t1", "port": 8000, "hostPort": 8000}),
            "INVALID_ARGUMENT: hostPort: this fleet allocates the outside side itself and answers its address: leave hostPort out",
        ),
        (
            "write-file",
            json!({"name": "t1", "path": "/tmp/big", "content": "x".repeat(2048)}),
            "INVALID_ARGUMENT: content: 2048 bytes: the tiny fleet takes at most 1 KiB a write",
        ),
    ] {
        let text = h.err(tool, args.clone()).await;
        assert_eq!(text, refusal, "{tool} {args}");
        assert_eq!(tiny.asked(), Vec::<String>::new(), "{tool} sent nothing");
    }
    // What only the fleet can know it lacks, it refuses itself.
    let text = h
        .err(
            "create-machine",
            json!({"name": "m", "image": "alpine", "mounts": [{"source": "/tmp", "target": "/mnt"}]}),
        )
        .await;
    assert_eq!(text, "UNSUPPORTED: create: the tiny fleet mounts nothing");
    let text = h
        .err(
            "branch-machine",
            json!({"name": "t1", "childName": "child"}),
        )
        .await;
    assert!(
        text.starts_with("UNSUPPORTED: branch: the tiny fleet cannot branch"),
        "{text}"
    );
}

/// What a listing shows of bases is decided by whether the fleet's states show a base
/// (`shows_frozen`), not by which fleet answers: the tiny fleet, in the local fleet's place,
/// says nothing of frozen, so its base (recorded, its state `running`) is named as a base in
/// list-machines. Decided by the slot's kind, as it was, the record was read only for a frozen
/// machine there, and the base went unnamed.
#[tokio::test]
async fn a_fleet_whose_states_say_nothing_of_bases_has_its_bases_named_in_listings() {
    let (h, _tiny) = tiny_harness().await;
    h.ok("create-machine", json!({"name": "t1", "image": "alpine"}))
        .await;
    h.protocol
        .process()
        .base_to_be_made(FleetKind::Local, "t1", "t1", "", "alpine".into())
        .await
        .unwrap();
    let listed = h.ok("list-machines", json!({})).await;
    let t1 = listed["machines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "t1")
        .cloned()
        .unwrap();
    assert_eq!(t1["state"], "running", "{t1}");
    assert!(t1["base"].is_object(), "{t1}");
}
