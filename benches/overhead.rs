//! What this server costs beside the agent, measured in one run on this machine: cold start,
//! peak memory, tools/list, and the overhead of each tool call over the raw API request it
//! makes, each beside that raw request made directly in the same run.
//!
//! Run with `scripts/bench.sh` (fetches the pinned engine, then `cargo bench --bench overhead`).
//! Prints a table and writes the same figures as JSON to `target/bench/overhead.json`. Not a
//! test: it asserts nothing about the figures.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::stdio_client::Client;
use common::{fake_serve, real_serve};

use serde_json::{Value, json};
use smol_mcp::fleet::transport::LocalEndpoint;
use std::process::Stdio;
use std::time::{Duration, Instant};

const SERVER: &str = env!("CARGO_BIN_EXE_smol-mcp");

/// The server measured: the build `SMOL_MCP_BENCH_SERVER` names (scripts/bench.sh builds it as
/// `cargo install` does, without the features the test dependencies switch on in the bench
/// build), else the bench build's own.
fn server() -> String {
    std::env::var("SMOL_MCP_BENCH_SERVER").unwrap_or_else(|_| SERVER.to_owned())
}

#[derive(Clone, Copy, serde::Serialize)]
struct Stats {
    min_ms: f64,
    p50_ms: f64,
    p95_ms: f64,
    max_ms: f64,
    n: usize,
}

fn stats(samples: &[Duration]) -> Stats {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |q: f64| ms[((ms.len() as f64 - 1.0) * q).round() as usize];
    Stats {
        min_ms: ms[0],
        p50_ms: at(0.5),
        p95_ms: at(0.95),
        max_ms: ms[ms.len() - 1],
        n: ms.len(),
    }
}

#[derive(serde::Serialize)]
struct Versus {
    name: String,
    tool: Stats,
    raw: Stats,
    overhead_p50_ms: f64,
    overhead_p95_ms: f64,
    ratio_p50: f64,
}

fn versus(name: &str, tool: &[Duration], raw: &[Duration]) -> Versus {
    let (t, r) = (stats(tool), stats(raw));
    Versus {
        name: name.into(),
        overhead_p50_ms: t.p50_ms - r.p50_ms,
        overhead_p95_ms: t.p95_ms - r.p95_ms,
        ratio_p50: t.p50_ms / r.p50_ms,
        tool: t,
        raw: r,
    }
}

fn base_env(runtime: &std::path::Path, local_url: &str) -> Vec<(String, String)> {
    common::stdio_env(runtime, local_url, "error")
}

fn url_of(endpoint: &LocalEndpoint) -> String {
    match endpoint {
        LocalEndpoint::Unix(p) => format!("unix://{}", p.display()),
        LocalEndpoint::Loopback { authority } => format!("http://{authority}"),
    }
}

fn machine_info() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("unknown cpu")
        .trim()
        .to_owned();
    let mem_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    format!(
        "{} cores ({cpu}), {} GiB",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        mem_kib / 1024 / 1024
    )
}

async fn run() -> Value {
    let real = real_serve::RealServe::start().await;
    let fake = fake_serve::FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let real_env = base_env(rt.path(), &url_of(&real.endpoint));
    let raw = real.endpoint.http_client().unwrap();
    let base = real.endpoint.base_url();

    // Cold start: spawn to initialize response.
    let mut cold = Vec::new();
    for _ in 0..10 {
        let (client, took) = Client::spawn(&server(), &real_env, Stdio::null()).await;
        cold.push(took);
        client.close(Duration::from_secs(10)).await;
    }

    let (mut c, _) = Client::spawn(&server(), &real_env, Stdio::null()).await;
    let mut list_tools = Vec::new();
    // What a client sends its model on every turn: the tools/list result, compact, for this
    // single-fleet server; the both-fleets figure adds the target argument to every tool.
    let mut catalog_bytes = 0;
    let mut description_bytes = 0;
    for _ in 0..200 {
        let t = Instant::now();
        let r = c.request("tools/list", json!({})).await;
        list_tools.push(t.elapsed());
        // The tools a server offers without settings (no mountAllow: no keep-changes).
        let bare = smol_mcp::policy::tools::schema::Offers {
            host_dirs: false,
            credentials: false,
            // The bench's client declares no MCP Apps support, so view-state is not listed.
            views: false,
            ..smol_mcp::policy::tools::schema::Offers::ALL
        };
        let offered = smol_mcp::policy::tools::Tool::ALL
            .iter()
            .filter(|tool| bare.lists(**tool))
            .count();
        assert_eq!(r["result"]["tools"].as_array().unwrap().len(), offered);
        catalog_bytes = serde_json::to_string(&r["result"]).unwrap().len();
        description_bytes = r["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["description"].as_str().unwrap().len())
            .sum();
    }
    let rss_kib = c.peak_rss_kib();

    // list-machines, all and by name (missing), beside the same GETs made directly.
    c.tool("list-machines", json!({})).await; // the first local call finds the serve
    let (mut tool_list, mut raw_list, mut tool_get, mut raw_get) = (vec![], vec![], vec![], vec![]);
    for _ in 0..300 {
        let t = Instant::now();
        let r = c.tool("list-machines", json!({})).await;
        tool_list.push(t.elapsed());
        assert_eq!(r["result"]["isError"], false);
        let t = Instant::now();
        let r = raw
            .get(format!("{base}/api/v1/machines"))
            .send()
            .await
            .unwrap();
        r.bytes().await.unwrap();
        raw_list.push(t.elapsed());
        let t = Instant::now();
        let r = c.tool("list-machines", json!({"name": "missing"})).await;
        tool_get.push(t.elapsed());
        assert_eq!(r["result"]["isError"], true);
        let t = Instant::now();
        let r = raw
            .get(format!("{base}/api/v1/machines/missing"))
            .send()
            .await
            .unwrap();
        r.bytes().await.unwrap();
        raw_get.push(t.elapsed());
    }

    // create without start, then delete, beside the same two requests made directly.
    let (mut tool_create, mut raw_create) = (vec![], vec![]);
    for i in 0..30 {
        let t = Instant::now();
        let r = c
            .tool("create-machine", json!({"image": "alpine", "name": format!("bench-t{i}"), "start": false, "cpus": 1, "memoryMb": 256}))
            .await;
        assert_eq!(r["result"]["isError"], false, "{r}");
        let r = c
            .tool("delete-machine", json!({"name": format!("bench-t{i}")}))
            .await;
        assert_eq!(r["result"]["isError"], false, "{r}");
        tool_create.push(t.elapsed());
        let t = Instant::now();
        let r = raw
            .post(format!("{base}/api/v1/machines"))
            .json(&json!({"name": format!("bench-r{i}"), "image": "alpine", "cpus": 1, "memoryMb": 256, "network": false,
                          "cmd": ["sh", "-c", "while true; do sleep 3600; done"]}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
        r.bytes().await.unwrap();
        let r = raw
            .delete(format!("{base}/api/v1/machines/bench-r{i}"))
            .send()
            .await
            .unwrap();
        r.bytes().await.unwrap();
        raw_create.push(t.elapsed());
    }
    c.close(Duration::from_secs(10)).await;

    // read-file throughput over a 64 MiB file on the fake, beside its raw files route.
    const SIZE: usize = 64 * 1024 * 1024;
    const PAGE: usize = 4 * 1024 * 1024;
    fake.add_machine("big", "running");
    let content: Vec<u8> = (0..SIZE).map(|i| b'a' + (i % 26) as u8).collect();
    fake.state
        .lock()
        .unwrap()
        .files
        .insert(("big".into(), "/data/big.txt".into()), content);
    let fake_raw = fake.endpoint().http_client().unwrap();
    let fake_base = fake.endpoint().base_url();
    let mut raw_secs = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let r = fake_raw
            .get(format!(
                "{fake_base}/api/v1/machines/big/files/%2Fdata%2Fbig.txt"
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(r.bytes().await.unwrap().len(), SIZE);
        raw_secs.push(t.elapsed());
    }
    let mut fake_env = base_env(rt.path(), &fake.url());
    // A page is at most maxOutputBytes (64 KiB by default, what fits a model's context); the
    // throughput of large pages is what this row measures.
    fake_env.push(("SMOL_MCP_MAX_OUTPUT_BYTES".into(), PAGE.to_string()));
    let (mut c, _) = Client::spawn(&server(), &fake_env, Stdio::null()).await;
    let mut tool_secs = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let mut offset = 0usize;
        loop {
            let r = c
                .tool("read-file", json!({"name": "big", "path": "/data/big.txt", "offset": offset, "length": PAGE}))
                .await;
            let s = &r["result"]["structuredContent"];
            assert_eq!(
                r["result"]["content"][1]["text"].as_str().map(str::len),
                s["bytes"].as_u64().map(|b| b as usize),
                "the page is the second block"
            );
            offset += s["bytes"]
                .as_u64()
                .unwrap_or_else(|| panic!("read-file did not answer a page: {r}"))
                as usize;
            if s["eof"] == true {
                break;
            }
        }
        assert_eq!(offset, SIZE);
        tool_secs.push(t.elapsed());
    }
    // The protocol's floor for the same pages: every page travels once, as a JSON string in a
    // text block beside the small structured result, serialized by the server and parsed by the
    // client. This does that, in-process, with no I/O and no engine at all.
    let mut floor_secs = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let mut offset = 0usize;
        while offset < SIZE {
            let page: String = std::iter::repeat_n('x', PAGE.min(SIZE - offset)).collect();
            let structured = json!({"path": "/data/big.txt", "encoding": "utf8", "size": SIZE,
                                    "offset": offset, "bytes": PAGE, "eof": false, "startedMachine": false});
            let text = serde_json::to_string(&structured).unwrap();
            let line = serde_json::to_string(&json!({"jsonrpc": "2.0", "id": 1, "result": {
                "content": [{"type": "text", "text": text}, {"type": "text", "text": page}],
                "structuredContent": structured, "isError": false}}))
            .unwrap();
            let parsed: Value = serde_json::from_str(&line).unwrap();
            assert!(parsed["result"]["content"][1]["text"].is_string());
            offset += PAGE;
        }
        floor_secs.push(t.elapsed());
    }
    let mib = SIZE as f64 / 1024.0 / 1024.0;
    let floor_mibs = mib / stats(&floor_secs).p50_ms * 1000.0;
    let raw_mibs = mib / stats(&raw_secs).p50_ms * 1000.0;
    let tool_mibs = mib / stats(&tool_secs).p50_ms * 1000.0;

    // A cancelled create: the machine never becomes ready; cancel, and time until its delete.
    fake.set_exec(|_| fake_serve::exec_response(1, b"", b"booting"));
    fake.take_requests();
    let mut cancel_times = Vec::new();
    for i in 0..5 {
        let id = 10_000 + i;
        c.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "create-machine", "arguments": {"image": "alpine"}}})).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t = Instant::now();
        c.send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": id, "reason": "bench"}})).await;
        loop {
            let deleted = fake.take_requests().iter().any(|r| r["method"] == "DELETE");
            if deleted {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the cancelled create never cleaned up"
            );
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        cancel_times.push(t.elapsed());
    }
    c.close(Duration::from_secs(10)).await;

    let ledger = ledger_cost(&fake).await;
    let mut builds = builds_side_by_side(&real_env).await;
    job_starts_side_by_side(&mut builds).await;

    json!({
        "machine": machine_info(),
        "smolvm": real_serve::PINNED_SMOLVM,
        "coldStartMs": stats(&cold),
        "peakRssMiB": rss_kib as f64 / 1024.0,
        "toolsListMs": stats(&list_tools),
        "catalogBytes": catalog_bytes,
        "catalogDescriptionBytes": description_bytes,
        "calls": [
            versus("list-machines", &tool_list, &raw_list),
            versus("list-machines name (missing)", &tool_get, &raw_get),
            versus("create (no start) + delete", &tool_create, &raw_create),
        ],
        "readFile64MiB": {"rawMiBps": raw_mibs, "toolMiBps": tool_mibs, "ratio": tool_mibs / raw_mibs, "pageBytes": PAGE,
                          "protocolFloorMiBps": floor_mibs},
        "cancelledCreateMs": stats(&cancel_times),
        "ledger": ledger,
        "builds": builds,
    })
}

/// The figures a change to the server's structure can move, for this build and for the other
/// builds of `smol-mcp` that `SMOL_MCP_BENCH_BASELINE` names (`label=path`, comma-separated),
/// measured in turn in the same run (so that all see the same machine at the same moments):
/// spawn to initialize, peak RSS after initialize and tools/list, peak RSS after initialize
/// and 50 list-machines, and the p50 / p95 of tools/list and list-machines.
async fn builds_side_by_side(env: &[(String, String)]) -> Value {
    let mut builds: Vec<(String, String)> = std::env::var("SMOL_MCP_BENCH_BASELINE")
        .unwrap_or_default()
        .split(',')
        .filter(|b| !b.is_empty())
        .map(|b| match b.split_once('=') {
            Some((label, path)) => (label.to_owned(), path.to_owned()),
            None => ("baseline".to_owned(), b.to_owned()),
        })
        .collect();
    builds.push(("this build".to_owned(), server()));
    let mut cold: Vec<Vec<Duration>> = vec![Vec::new(); builds.len()];
    let mut rss_list_tools = vec![Vec::new(); builds.len()];
    let mut rss_list_machines = vec![Vec::new(); builds.len()];
    let mut tools_list: Vec<Vec<Duration>> = vec![Vec::new(); builds.len()];
    let mut list_machines: Vec<Vec<Duration>> = vec![Vec::new(); builds.len()];
    for _round in 0..5 {
        for (i, (_, binary)) in builds.iter().enumerate() {
            for _ in 0..2 {
                let (client, took) = Client::spawn(binary, env, Stdio::null()).await;
                cold[i].push(took);
                client.close(Duration::from_secs(10)).await;
            }
            let (mut c, _) = Client::spawn(binary, env, Stdio::null()).await;
            for _ in 0..20 {
                let t = Instant::now();
                c.request("tools/list", json!({})).await;
                tools_list[i].push(t.elapsed());
            }
            rss_list_tools[i].push(c.peak_rss_kib());
            c.close(Duration::from_secs(10)).await;
            let (mut c, _) = Client::spawn(binary, env, Stdio::null()).await;
            for _ in 0..50 {
                let t = Instant::now();
                let r = c.tool("list-machines", json!({})).await;
                list_machines[i].push(t.elapsed());
                assert_eq!(r["result"]["isError"], false, "{r}");
            }
            rss_list_machines[i].push(c.peak_rss_kib());
            c.close(Duration::from_secs(10)).await;
        }
    }
    let median_mib = |kib: &mut Vec<u64>| {
        kib.sort_unstable();
        kib[kib.len() / 2] as f64 / 1024.0
    };
    let rows: Vec<Value> = builds
        .iter()
        .enumerate()
        .map(|(i, (label, binary))| {
            json!({
                "build": label,
                "binary": binary,
                "coldStartMs": stats(&cold[i]),
                "peakRssListToolsMiB": median_mib(&mut rss_list_tools[i].clone()),
                "peakRssListMachinesMiB": median_mib(&mut rss_list_machines[i].clone()),
                "peakRssListMachinesMaxMiB": rss_list_machines[i].iter().max().copied().unwrap_or(0) as f64 / 1024.0,
                "toolsListMs": stats(&tools_list[i]),
                "listMachinesMs": stats(&list_machines[i]),
            })
        })
        .collect();
    Value::Array(rows)
}

/// A background job's start (run-command `background: true` answered with its id), 30 of
/// them per build in turn, on the fake serve's guest shell: the job's record is written before
/// the answer since 2026-12-05 (a process killed right after must leave it).
async fn job_starts_side_by_side(builds: &mut Value) {
    let fake = fake_serve::FakeServe::start_guest_shell().await;
    fake.add_machine("jobs", "running");
    let rows = builds.as_array_mut().unwrap();
    let mut starts: Vec<Vec<Duration>> = vec![Vec::new(); rows.len()];
    for _round in 0..3 {
        for (i, row) in rows.iter().enumerate() {
            let binary = row["binary"].as_str().unwrap().to_owned();
            let rt = tempfile::tempdir().unwrap();
            let (mut c, _) =
                Client::spawn(&binary, &base_env(rt.path(), &fake.url()), Stdio::null()).await;
            for _ in 0..10 {
                let t = Instant::now();
                let r = c
                    .tool(
                        "run-command",
                        json!({"name": "jobs", "command": "true", "background": true}),
                    )
                    .await;
                starts[i].push(t.elapsed());
                assert_eq!(r["result"]["isError"], false, "{r}");
            }
            c.close(Duration::from_secs(10)).await;
        }
    }
    for (i, row) in rows.iter_mut().enumerate() {
        row["jobStartMs"] = json!(stats(&starts[i]));
    }
}

fn print_builds(builds: &Value) {
    let f = common::figure;
    let rows = builds.as_array().unwrap();
    println!();
    println!(
        "Builds side by side (5 rounds in turn; RSS is the median of 5 fresh processes, VmHWM):"
    );
    println!();
    let header: Vec<String> = rows
        .iter()
        .map(|r| r["build"].as_str().unwrap_or("").to_owned())
        .collect();
    println!("| measure | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(rows.len()));
    let line = |name: &str, cell: &dyn Fn(&Value) -> String| {
        let cells: Vec<String> = rows.iter().map(cell).collect();
        println!("| {name} | {} |", cells.join(" | "));
    };
    line("spawn to initialize, min / median / max (ms)", &|r| {
        let c = &r["coldStartMs"];
        format!(
            "{:.2} / {:.2} / {:.2}",
            f(&c["min_ms"]),
            f(&c["p50_ms"]),
            f(&c["max_ms"])
        )
    });
    line("peak RSS after initialize and tools/list (MiB)", &|r| {
        format!("{:.1}", f(&r["peakRssListToolsMiB"]))
    });
    line(
        "peak RSS after initialize and 50 list-machines (MiB; max of 5)",
        &|r| {
            format!(
                "{:.1} ({:.1})",
                f(&r["peakRssListMachinesMiB"]),
                f(&r["peakRssListMachinesMaxMiB"])
            )
        },
    );
    line("tools/list p50 / p95 (ms)", &|r| {
        let c = &r["toolsListMs"];
        format!("{:.3} / {:.3}", f(&c["p50_ms"]), f(&c["p95_ms"]))
    });
    line("list-machines p50 / p95 (ms, real serve)", &|r| {
        let c = &r["listMachinesMs"];
        format!("{:.3} / {:.3}", f(&c["p50_ms"]), f(&c["p95_ms"]))
    });
    line(
        "background job start p50 / p95 (ms, fake guest shell)",
        &|r| {
            let c = &r["jobStartMs"];
            format!("{:.3} / {:.3}", f(&c["p50_ms"]), f(&c["p95_ms"]))
        },
    );
}

/// What the run ledger costs a call: run-command on the fake serve through two stdio servers
/// of the same build, one with the ledger and one with it off, called in turn so that both see
/// the same machine at the same moments; and, in-process, the work the ledger adds to a call's
/// path (a run begun and ended: two records put on the writer's queue).
async fn ledger_cost(fake: &fake_serve::FakeServe) -> Value {
    fake.set_exec(fake_serve::default_exec);
    fake.add_machine("bench-run", "running");
    let (on_dir, off_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut on, _) = Client::spawn(
        &server(),
        &base_env(on_dir.path(), &fake.url()),
        Stdio::null(),
    )
    .await;
    let mut off_env = base_env(off_dir.path(), &fake.url());
    off_env.push(("SMOL_MCP_LEDGER_MAX_RUNS".into(), "0".into()));
    let (mut off, _) = Client::spawn(&server(), &off_env, Stdio::null()).await;
    let args =
        json!({"name": "bench-run", "command": ["echo", "hello"], "env": {"TOKEN": "not-kept"}});
    for c in [&mut on, &mut off] {
        let r = c.tool("run-command", args.clone()).await;
        assert_eq!(r["result"]["isError"], false, "{r}");
    }
    let (mut with, mut without) = (vec![], vec![]);
    for _ in 0..500 {
        for (c, samples) in [(&mut on, &mut with), (&mut off, &mut without)] {
            let t = Instant::now();
            let r = c.tool("run-command", args.clone()).await;
            samples.push(t.elapsed());
            assert_eq!(r["result"]["isError"], false, "{r}");
        }
    }
    let listed = on
        .request("resources/read", json!({"uri": "smol://runs?limit=500"}))
        .await;
    let text = listed["result"]["contents"][0]["text"]
        .as_str()
        .unwrap_or("{}");
    let recorded = serde_json::from_str::<Value>(text).unwrap()["runs"]
        .as_array()
        .map_or(0, Vec::len);
    on.close(Duration::from_secs(10)).await;
    off.close(Duration::from_secs(10)).await;

    // In-process: begin and end a run 20,000 times, letting the writer catch up (untimed) every
    // 500 so that the queue never fills and every record is really queued.
    let dir = tempfile::tempdir().unwrap();
    let vars: std::collections::BTreeMap<String, String> = [(
        "SMOL_MCP_RUNTIME_DIR".to_owned(),
        dir.path().join("rt").display().to_string(),
    )]
    .into();
    let config = smol_mcp::process::config::Config::from_sources(
        &vars,
        std::path::Path::new("/nonexistent"),
    )
    .unwrap();
    std::fs::create_dir_all(&config.runtime_dir).unwrap();
    let ledger = smol_mcp::policy::ledger::Ledger::open(&config, Default::default());
    let mut spec = smol_mcp::fleet::ExecSpec::new(smol_mcp::fleet::Command::Argv(vec![
        "echo".into(),
        "hello".into(),
    ]));
    spec.env.insert("TOKEN".into(), "not-kept".into());
    let output = smol_mcp::fleet::ExecOutput {
        exit_code: 0,
        stdout: b"hello\n".repeat(2000),
        stderr: Vec::new(),
        stdout_cut_upstream: false,
        stderr_cut_upstream: false,
    };
    let mut path_cost = Vec::new();
    for i in 0..20_000 {
        if i % 500 == 0 {
            ledger.flush().await;
        }
        let t = Instant::now();
        let run = ledger.begin(smol_mcp::policy::ledger::RunStart::new(
            "run-command",
            smol_mcp::fleet::FleetKind::Local,
            "bench-run",
            &spec,
        ));
        run.exited(&output, false);
        path_cost.push(t.elapsed());
    }
    ledger.flush().await;
    json!({
        "withLedgerMs": stats(&with),
        "withoutLedgerMs": stats(&without),
        "overheadP50Ms": stats(&with).p50_ms - stats(&without).p50_ms,
        "overheadP95Ms": stats(&with).p95_ms - stats(&without).p95_ms,
        "runsRecorded": recorded,
        "onTheCallPathMs": stats(&path_cost),
        "droppedInProcess": ledger.dropped(),
    })
}

fn print_table(r: &Value) {
    let f = common::figure;
    println!(
        "smol-mcp overhead benchmark on {} (smolvm {})",
        r["machine"].as_str().unwrap_or(""),
        r["smolvm"].as_str().unwrap_or("")
    );
    println!();
    println!("| measure | figure | target |");
    println!("|---|---|---|");
    let cs = &r["coldStartMs"];
    println!(
        "| spawn to initialize response (min / median / max of {}) | {:.2} / {:.2} / {:.2} ms | <= 10 ms |",
        cs["n"],
        f(&cs["min_ms"]),
        f(&cs["p50_ms"]),
        f(&cs["max_ms"])
    );
    println!(
        "| peak RSS after initialize and tools/list (VmHWM) | {:.1} MiB | <= 12 MB |",
        f(&r["peakRssMiB"])
    );
    println!(
        "| tools/list result size (one fleet), of which tool descriptions | {} / {} bytes | |",
        r["catalogBytes"], r["catalogDescriptionBytes"]
    );
    let tl = &r["toolsListMs"];
    println!(
        "| tools/list p50 / p95 | {:.3} / {:.3} ms | <= 1 ms |",
        f(&tl["p50_ms"]),
        f(&tl["p95_ms"])
    );
    for c in r["calls"].as_array().unwrap() {
        println!(
            "| {}: tool p50 / p95 vs raw p50 / p95 | {:.3} / {:.3} ms vs {:.3} / {:.3} ms: +{:.3} / +{:.3} ms, x{:.2} | +0.1 ms p50, +1 ms p95 |",
            c["name"].as_str().unwrap_or(""),
            f(&c["tool"]["p50_ms"]),
            f(&c["tool"]["p95_ms"]),
            f(&c["raw"]["p50_ms"]),
            f(&c["raw"]["p95_ms"]),
            f(&c["overhead_p50_ms"]),
            f(&c["overhead_p95_ms"]),
            f(&c["ratio_p50"])
        );
    }
    let rf = &r["readFile64MiB"];
    println!(
        "| read-file of 64 MiB in {} MiB pages vs the raw files route | {:.0} vs {:.0} MiB/s ({:.0}%) | >= 80% |",
        f(&rf["pageBytes"]) / 1048576.0,
        f(&rf["toolMiBps"]),
        f(&rf["rawMiBps"]),
        f(&rf["ratio"]) * 100.0
    );
    println!(
        "| the same pages serialized and parsed as MCP results, in-process (the protocol's own cost) | {:.0} MiB/s | |",
        f(&rf["protocolFloorMiBps"])
    );
    let cc = &r["cancelledCreateMs"];
    println!(
        "| cancelled create: cancel to clean-up (p50 / max of {}) | {:.1} / {:.1} ms | <= 100 ms |",
        cc["n"],
        f(&cc["p50_ms"]),
        f(&cc["max_ms"])
    );
}

fn print_ledger(l: &Value) {
    let f = common::figure;
    println!(
        "| run-command with the ledger vs without (same run, in turn): p50 / p95 | {:.3} / {:.3} ms vs {:.3} / {:.3} ms: {:+.3} / {:+.3} ms ({} runs in smol://runs?limit=500 after) | <= 0.1 ms p50 |",
        f(&l["withLedgerMs"]["p50_ms"]),
        f(&l["withLedgerMs"]["p95_ms"]),
        f(&l["withoutLedgerMs"]["p50_ms"]),
        f(&l["withoutLedgerMs"]["p95_ms"]),
        f(&l["overheadP50Ms"]),
        f(&l["overheadP95Ms"]),
        l["runsRecorded"]
    );
    println!(
        "| the ledger's work on a call's path, in-process (begin + end, 12 KB of output): p50 / p95 | {:.4} / {:.4} ms ({} dropped) | |",
        f(&l["onTheCallPathMs"]["p50_ms"]),
        f(&l["onTheCallPathMs"]["p95_ms"]),
        l["droppedInProcess"]
    );
}

fn main() {
    let report = common::block_on(run());
    print_table(&report);
    print_ledger(&report["ledger"]);
    print_builds(&report["builds"]);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("overhead.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    println!("\nfigures written to {}", path.display());
}
