//! How `smol-mcp-http` scales across processes sharing one PostgreSQL store, each process held
//! to the same CPU quota in a cgroup of its own: one process behind HAProxy against three behind
//! it, in one run and under the same load. The engine is the real `smolvm serve` 1.32.2 and the
//! calls are signed in (the bench's own issuer, several users): C concurrent clients, each as
//! one of the users on its own keep-alive connection, make M pairs of sessionless (2026-07-28)
//! create-machine with `start: false` (no machine boots) and delete-machine of that machine.
//! Prints a table, the ratio three to one and the CPU each part used; writes
//! target/bench/scaling.json.
//!
//! Run with `scripts/bench-scaling.sh` as root (starts the project's PostgreSQL, installs
//! HAProxy). `LOAD_CLIENTS` (default 36), `LOAD_CALLS` (default 50 pairs a client),
//! `SCALING_USERS` (default 6), `SERVER_CPU_QUOTA_PERCENT` (default 5, of one core, for each
//! server process) and `SCALING_PERIOD_US` (the CFS period; by default long enough for the
//! quota to hold four of the kernel's bandwidth slices) shape it.
//!
//! The quota is what makes the shapes comparable on a host of few cores: unbounded, one
//! process would take the cores the other two would have used. It is small because the engine
//! costs several times what the server does for each of these calls: at 25% of a core three
//! processes were never throttled, waiting on the engine (0.97x to 1.10x), and at 10% the
//! engine, PostgreSQL and the clients filled both cores in the three-process shape, so what was
//! measured was the host. At 5% both shapes are held by their servers with most of a core free.
//! The period matters as much: at the kernel's 100 ms, a 5 ms quota is one bandwidth slice and
//! one process used 4% of a core while throttled in nearly every period (the ratio then read
//! 3.06x, flattering three); at 400 ms it uses its 5%, but a process throttled while it holds
//! the store's document lock stalls its siblings for the rest of the period (docs/benchmarks.md).
//! Not a test: it fails when a reply is lost or refused, or a machine is left on the engine.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{balancer as balancer_script, real_serve};

use common::env_number;
use common::issuer::Issuer;
use serde_json::{Value, json};
use smol_mcp::fleet::FleetApi;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

const SERVER: &str = env!("CARGO_BIN_EXE_smol-mcp-http");
/// The shortest CFS period used: the kernel's default.
const MIN_PERIOD_US: u64 = 100_000;
/// The longest CFS period the kernel takes (one second).
const MAX_PERIOD_US: u64 = 1_000_000;
/// How many of the kernel's bandwidth slices a quota holds at least. A CPU takes its runtime
/// from the group's quota a slice at a time (`sched_cfs_bandwidth_slice_us`, 5 ms by default),
/// so a quota of one slice lets one core's thread take all of it while a thread ready on the
/// other core is throttled: at 5% of a 100 ms period a process was throttled in 989 of 991
/// periods yet used 4% of a core, not 5%.
const SLICES_PER_QUOTA: u64 = 4;

/// The CFS period for a quota of `percent` of one core: long enough that the quota holds
/// `SLICES_PER_QUOTA` bandwidth slices, within what the kernel takes and never shorter than its
/// default (below 2%, a second's quota holds fewer slices).
fn period_for(percent: u64) -> u64 {
    let slice_us = std::fs::read_to_string("/proc/sys/kernel/sched_cfs_bandwidth_slice_us")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(5_000);
    (slice_us * SLICES_PER_QUOTA * 100 / percent.max(1)).clamp(MIN_PERIOD_US, MAX_PERIOD_US)
}

/// Which cgroup hierarchy holds the cpu controller, and where.
#[derive(Clone, Copy)]
enum Hierarchy {
    V1,
    V2,
}

impl Hierarchy {
    fn root(self) -> &'static Path {
        match self {
            Hierarchy::V1 => Path::new("/sys/fs/cgroup/cpu"),
            Hierarchy::V2 => Path::new("/sys/fs/cgroup"),
        }
    }

    fn find() -> Hierarchy {
        if Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists() {
            Hierarchy::V1
        } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            Hierarchy::V2
        } else {
            panic!(
                "no cpu controller: neither cgroup v1 (/sys/fs/cgroup/cpu) nor v2 \
                 (/sys/fs/cgroup/cgroup.controllers) is mounted"
            )
        }
    }
}

/// The server processes' cgroups, each with the same CPU quota; removed when dropped (a panic
/// included), their processes moved back to the root first, since a cgroup with a process in it
/// cannot be removed.
struct Cgroups {
    hierarchy: Hierarchy,
    period_us: u64,
    quota_us: u64,
    made: Vec<PathBuf>,
}

impl Cgroups {
    /// Refuses, saying why, when a cgroup with a quota cannot be made here (not root, a
    /// read-only cgroup mount): the figures would otherwise be of unbounded processes.
    fn new(period_us: u64, quota_us: u64) -> Cgroups {
        let mut groups = Cgroups {
            hierarchy: Hierarchy::find(),
            period_us,
            quota_us,
            made: Vec::new(),
        };
        if let Err(e) = groups.make("probe") {
            panic!(
                "cannot make a cgroup with a CPU quota under {} ({e}): run as root on a host \
                 whose cgroup mount is writable",
                groups.hierarchy.root().display()
            );
        }
        groups.remove_all();
        groups
    }

    fn make(&mut self, name: &str) -> std::io::Result<PathBuf> {
        let root = self.hierarchy.root();
        let dir = root.join(format!("smol-scaling-{name}"));
        match std::fs::create_dir(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        self.made.push(dir.clone());
        match self.hierarchy {
            Hierarchy::V1 => {
                std::fs::write(dir.join("cpu.cfs_period_us"), self.period_us.to_string())?;
                std::fs::write(dir.join("cpu.cfs_quota_us"), self.quota_us.to_string())?;
            }
            Hierarchy::V2 => {
                // A child's cpu.max exists only once the parent hands the controller down.
                std::fs::write(root.join("cgroup.subtree_control"), "+cpu")?;
                std::fs::write(
                    dir.join("cpu.max"),
                    format!("{} {}", self.quota_us, self.period_us),
                )?;
            }
        }
        Ok(dir)
    }

    /// A new cgroup of its own named `name`, for a process to start in.
    fn hold(&mut self, name: &str) -> PathBuf {
        self.make(name).unwrap()
    }

    fn remove_all(&mut self) {
        let root_procs = self.hierarchy.root().join("cgroup.procs");
        for dir in self.made.drain(..) {
            for _ in 0..100 {
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.split_whitespace() {
                    let _ = std::fs::write(&root_procs, pid);
                }
                if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if dir.exists() {
                eprintln!("scaling: could not remove {}", dir.display());
            }
        }
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        self.remove_all();
    }
}

/// The throttling a cgroup saw: (periods, periods throttled, seconds throttled).
fn throttling(dir: &Path, hierarchy: Hierarchy) -> (u64, u64, f64) {
    let stat = std::fs::read_to_string(dir.join("cpu.stat")).unwrap_or_default();
    let get = |key: &str| {
        stat.lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    match hierarchy {
        Hierarchy::V1 => (
            get("nr_periods "),
            get("nr_throttled "),
            get("throttled_time ") as f64 / 1e9,
        ),
        Hierarchy::V2 => (
            get("nr_periods "),
            get("nr_throttled "),
            get("throttled_usec ") as f64 / 1e6,
        ),
    }
}

/// CPU seconds a process has used (user and system), with those of its children it has reaped
/// when `reaped`: PostgreSQL's backends come and go, and the postmaster reaps them.
fn cpu_seconds(pid: u32, reaped: bool) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The fields after the command name, which may hold spaces, start after its last ')'.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // utime, stime, cutime, cstime are fields 14 to 17; `rest` starts at field 3.
    let ticks = fields[11] + fields[12] + if reaped { fields[13] + fields[14] } else { 0 };
    ticks as f64 / 100.0
}

/// Processes whose command line holds `needle`.
fn pids_with(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline)
            .replace('\0', " ")
            .contains(needle)
        {
            pids.push(pid);
        }
    }
    pids
}

/// The PostgreSQL server's processes: its postmaster (whose reaped children count with it) and
/// the live backends, found by the data directory the postmaster was started with.
fn postgres_cpu(postmaster: Option<u32>) -> f64 {
    let Some(postmaster) = postmaster else {
        return f64::NAN;
    };
    let mut total = cpu_seconds(postmaster, true);
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if parent == Some(postmaster) {
            total += cpu_seconds(pid, false);
        }
    }
    total
}

/// The postmaster of the project's cluster (scripts/postgres.sh: target/postgres unless
/// `SMOL_PG_DIR` moves it), from its pid file.
fn postmaster() -> Option<u32> {
    let dir = std::env::var_os("SMOL_PG_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/postgres"));
    std::fs::read_to_string(dir.join("data/postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

struct Server {
    child: Child,
    pid: u32,
    port: u16,
    cgroup: PathBuf,
    _runtime: tempfile::TempDir,
}

async fn start_server(
    cgroups: &mut Cgroups,
    name: &str,
    engine: &str,
    store: &str,
    issuer: &str,
    resource: &str,
) -> Server {
    let runtime = tempfile::tempdir().unwrap();
    let port = real_serve::free_port();
    let cgroup = cgroups.hold(name);
    // Started inside its cgroup, as systemd, a container runtime or Kubernetes starts a
    // process held to a quota: held from its first instruction, not moved in once running.
    let child = Command::new("/bin/sh")
        .args(["-c", "echo $$ > \"$0\" && exec \"$1\""])
        .arg(cgroup.join("cgroup.procs"))
        .arg(SERVER)
        .env_clear()
        .envs(common::isolated_env(runtime.path()))
        .envs([
            ("SMOL_LOCAL_URL", engine.to_owned()),
            ("SMOL_MCP_STORE_URL", store.to_owned()),
            ("SMOL_MCP_AUTH_ISSUER", issuer.to_owned()),
            // Every process names the balancer as the audience: a token is for the service,
            // whichever process answers it.
            ("SMOL_MCP_AUTH_RESOURCE", resource.to_owned()),
            ("SMOL_MCP_AUTH_SCOPES", "machines".to_owned()),
            ("SMOL_MCP_HTTP_PORT", port.to_string()),
            ("SMOL_MCP_LOG", "error".to_owned()),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    common::wait_listening(port, Duration::from_secs(30)).await;
    Server {
        child,
        pid,
        port,
        cgroup,
        _runtime: runtime,
    }
}

/// One sessionless tool call; whether it was answered without an error (what was, if not, is
/// printed).
async fn call(http: &reqwest::Client, url: &str, token: &str, tool: &str, args: Value) -> bool {
    common::sessionless_call(http, url, token, tool, args)
        .await
        .inspect_err(|text| eprintln!("scaling: {tool} not answered: {text}"))
        .is_ok()
}

/// The calls of one client: create-machine then delete-machine of that machine, `pairs` times;
/// each call's time when it was answered, and how many were not.
async fn pairs(
    http: reqwest::Client,
    url: String,
    token: String,
    prefix: String,
    pairs: usize,
) -> (Vec<Duration>, usize) {
    let mut times = Vec::with_capacity(pairs * 2);
    let mut lost = 0;
    for i in 0..pairs {
        let name = format!("{prefix}-{i}");
        for (tool, arguments) in [
            ("create-machine", json!({"name": name, "start": false})),
            ("delete-machine", json!({"name": name})),
        ] {
            let t = Instant::now();
            if call(&http, &url, &token, tool, arguments).await {
                times.push(t.elapsed());
            } else {
                lost += 1;
            }
        }
    }
    (times, lost)
}

/// CPU seconds of each part of the run so far.
struct Readings {
    servers: Vec<f64>,
    postgres: f64,
    engine: f64,
    haproxy: f64,
    bench: f64,
}

fn read_cpu(servers: &[Server], engine: &[u32], haproxy: Option<u32>) -> Readings {
    Readings {
        servers: servers.iter().map(|s| cpu_seconds(s.pid, false)).collect(),
        postgres: postgres_cpu(postmaster()),
        engine: engine.iter().map(|p| cpu_seconds(*p, true)).sum(),
        haproxy: haproxy.map_or(f64::NAN, |p| cpu_seconds(p, false)),
        bench: cpu_seconds(std::process::id(), false),
    }
}

struct Shape<'a> {
    name: &'a str,
    label: &'a str,
    processes: usize,
}

struct Setting<'a> {
    cgroups: &'a mut Cgroups,
    engine: &'a real_serve::RealServe,
    engine_pids: &'a [u32],
    issuer: &'a Issuer,
    users: usize,
    clients: usize,
    calls: usize,
}

async fn shape(shape: Shape<'_>, s: Setting<'_>) -> Value {
    let engine_url = format!("unix://{}", s.engine.socket().display());
    let store = common::database("scripts/bench-scaling.sh").await;
    let lb_dir = tempfile::tempdir().unwrap();
    let lb_port = real_serve::free_port();
    let url = format!("http://127.0.0.1:{lb_port}/mcp");
    let mut servers = Vec::new();
    for n in 0..shape.processes {
        servers.push(
            start_server(
                s.cgroups,
                &format!("{}-{n}", shape.label),
                &engine_url,
                &store,
                &s.issuer.url,
                &url,
            )
            .await,
        );
    }
    let mut args = vec!["up".to_owned(), lb_port.to_string()];
    args.extend(servers.iter().map(|s| s.port.to_string()));
    balancer_script::run(lb_dir.path(), &args);
    let haproxy = std::fs::read_to_string(lb_dir.path().join("haproxy.pid"))
        .ok()
        .and_then(|p| p.lines().next()?.trim().parse().ok());

    let tokens: Vec<String> = (0..s.users)
        .map(|u| s.issuer.token(&format!("bench-user-{u}"), &url))
        .collect();
    let mut connections = Vec::new();
    for c in 0..s.clients {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1)
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        // Warm: the connection made, the issuer's keys fetched and each process's first
        // create and delete done before the clock.
        let token = tokens[c % s.users].clone();
        let (_, lost) = pairs(
            http.clone(),
            url.clone(),
            token,
            format!("{}-w{c}", shape.label),
            1,
        )
        .await;
        assert_eq!(lost, 0, "{}: the warm-up calls were refused", shape.name);
        connections.push(http);
    }

    let barrier = Arc::new(tokio::sync::Barrier::new(s.clients + 1));
    let mut tasks = Vec::new();
    for (c, http) in connections.into_iter().enumerate() {
        let (barrier, url, token) = (barrier.clone(), url.clone(), tokens[c % s.users].clone());
        let (prefix, calls) = (format!("{}-c{c}", shape.label), s.calls);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            pairs(http, url, token, prefix, calls).await
        }));
    }
    let before = read_cpu(&servers, s.engine_pids, haproxy);
    let (times, lost, wall) = common::release_and_gather(&barrier, tasks).await;
    let wall = wall.as_secs_f64();
    let after = read_cpu(&servers, s.engine_pids, haproxy);
    let left = smol_mcp::fleet::LocalFleet::new(s.engine.endpoint.clone())
        .unwrap()
        .list()
        .await
        .map_or(-1, |m| m.len() as i64);

    // Each part's CPU over the load's wall time, in percent of one core.
    let share = |b: f64, a: f64| (a - b) / wall * 100.0;
    let processes: Vec<Value> = servers
        .iter()
        .zip(before.servers.iter().zip(&after.servers))
        .map(|(server, (b, a))| {
            let (periods, throttled, throttled_secs) =
                throttling(&server.cgroup, s.cgroups.hierarchy);
            json!({
                "cpuPercent": share(*b, *a),
                "periods": periods,
                "throttledPeriods": throttled,
                "throttledSecs": throttled_secs,
            })
        })
        .collect();
    balancer_script::run(lb_dir.path(), &["down".into()]);
    for mut server in servers {
        let _ = server.child.kill().await;
    }
    json!({
        "shape": shape.name,
        "processes": shape.processes,
        "calls": times.len() + lost,
        "answered": times.len(),
        "lost": lost,
        "seconds": wall,
        "callsPerSec": times.len() as f64 / wall,
        "p50Ms": common::percentile_ms(&times, 0.5),
        "p99Ms": common::percentile_ms(&times, 0.99),
        "machinesLeft": left,
        // What the servers spent on a call, together: the same in both shapes when a process
        // more costs nothing but its share of the calls.
        "serverCpuMsPerCall": before
            .servers
            .iter()
            .zip(&after.servers)
            .map(|(b, a)| a - b)
            .sum::<f64>()
            * 1000.0
            / times.len().max(1) as f64,
        "cpuPercent": {
            "servers": processes,
            "postgres": share(before.postgres, after.postgres),
            "engine": share(before.engine, after.engine),
            "haproxy": share(before.haproxy, after.haproxy),
            "benchClients": share(before.bench, after.bench),
        },
    })
}

async fn run() -> Value {
    let clients = env_number("LOAD_CLIENTS", 36);
    let calls = env_number("LOAD_CALLS", 50);
    let users = env_number("SCALING_USERS", 6).max(1);
    let quota_percent = env_number("SERVER_CPU_QUOTA_PERCENT", 5);
    assert!(
        (1..=100).contains(&quota_percent),
        "SERVER_CPU_QUOTA_PERCENT: a whole number from 1 to 100"
    );
    let period_us = match env_number("SCALING_PERIOD_US", 0) {
        0 => period_for(quota_percent as u64),
        set => set as u64,
    };
    assert!(
        (1_000..=MAX_PERIOD_US).contains(&period_us),
        "SCALING_PERIOD_US: from 1000 to {MAX_PERIOD_US} (microseconds), as the kernel takes"
    );
    let quota_us = quota_percent as u64 * period_us / 100;
    // The kernel refuses a quota under a millisecond.
    assert!(
        quota_us >= 1_000,
        "SERVER_CPU_QUOTA_PERCENT of SCALING_PERIOD_US: at least 1000 us ({quota_percent}% of \
         {period_us} us is {quota_us} us)"
    );
    let mut cgroups = Cgroups::new(period_us, quota_us);
    let engine = real_serve::RealServe::start().await;
    let engine_pids = pids_with(&engine.dir.path().display().to_string());
    let issuer = Issuer::start().await;
    let mut runs = Vec::new();
    for (name, label, processes) in [
        ("1 process behind HAProxy", "one", 1),
        ("3 processes behind HAProxy", "three", 3),
    ] {
        runs.push(
            shape(
                Shape {
                    name,
                    label,
                    processes,
                },
                Setting {
                    cgroups: &mut cgroups,
                    engine: &engine,
                    engine_pids: &engine_pids,
                    issuer: &issuer,
                    users,
                    clients,
                    calls,
                },
            )
            .await,
        );
    }
    drop(cgroups);
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    json!({
        "at": chrono::Utc::now().format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        "commit": commit,
        "cores": common::cores(),
        "serverCpuQuotaPercent": quota_percent,
        "serverCpuQuotaUs": quota_us,
        "serverCpuPeriodUs": period_us,
        "clients": clients,
        "pairsPerClient": calls,
        "users": users,
        "runs": runs,
    })
}

fn main() {
    let report = common::block_on(run());
    let f = common::figure;
    println!(
        "smol-mcp-http across processes on one PostgreSQL store, {} {} ({} cores)",
        report["at"].as_str().unwrap_or(""),
        report["commit"].as_str().unwrap_or(""),
        report["cores"]
    );
    println!(
        "{} clients as {} signed-in users x {} sessionless create-machine (start: false) + \
         delete-machine pairs, smolvm serve 1.32.2; each server process {}% of one core \
         (cfs quota {} us / {} us)",
        report["clients"],
        report["users"],
        report["pairsPerClient"],
        report["serverCpuQuotaPercent"],
        report["serverCpuQuotaUs"],
        report["serverCpuPeriodUs"]
    );
    println!();
    println!("| shape | calls/s | p50 / p99 ms | lost | machines left |");
    println!("|---|---|---|---|---|");
    let runs = report["runs"].as_array().unwrap();
    for r in runs {
        println!(
            "| {} | {:.1} | {:.1} / {:.1} | {} of {} | {} |",
            r["shape"].as_str().unwrap_or(""),
            f(&r["callsPerSec"]),
            f(&r["p50Ms"]),
            f(&r["p99Ms"]),
            r["lost"],
            r["calls"],
            r["machinesLeft"]
        );
    }
    let ratio = f(&runs[1]["callsPerSec"]) / f(&runs[0]["callsPerSec"]);
    println!(
        "\nthree processes / one process, each held to {}% of a core: {ratio:.2}x",
        report["serverCpuQuotaPercent"]
    );
    println!("\nCPU used during the load, % of one core:");
    println!(
        "| shape | each server (throttled periods) | server CPU ms a call | PostgreSQL | engine | HAProxy | bench clients |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in runs {
        let cpu = &r["cpuPercent"];
        let servers: Vec<String> = cpu["servers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                format!(
                    "{:.0} ({}/{})",
                    f(&s["cpuPercent"]),
                    s["throttledPeriods"],
                    s["periods"]
                )
            })
            .collect();
        println!(
            "| {} | {} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} |",
            r["shape"].as_str().unwrap_or(""),
            servers.join(", "),
            f(&r["serverCpuMsPerCall"]),
            f(&cpu["postgres"]),
            f(&cpu["engine"]),
            f(&cpu["haproxy"]),
            f(&cpu["benchClients"])
        );
    }
    common::write_report("scaling.json", &report);
    assert!(
        runs.iter()
            .all(|r| r["lost"] == 0 && r["machinesLeft"] == 0),
        "a reply was lost or refused, or a machine was left on the engine: {report}"
    );
}
