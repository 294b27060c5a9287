//! What the HTTP benchmarks share: their shape from the environment, a JSON-RPC answer read
//! from a reply whether it came as JSON or as an event stream, a free port and the wait for a
//! server to listen on it, a percentile, a database of their own on the project's PostgreSQL,
//! and an OAuth issuer of their own.

#![allow(dead_code)]

pub mod issuer;
pub mod stdio_client;

// The fakes and helpers the tests have, shared with the benchmarks from tests/common.
#[path = "../../tests/common/balancer.rs"]
pub mod balancer;
#[path = "../../tests/common/fake_serve.rs"]
pub mod fake_serve;
#[path = "../../tests/common/fake_stream.rs"]
pub mod fake_stream;
#[path = "../../tests/common/guest_shell.rs"]
pub mod guest_shell;
#[path = "../../tests/common/nested.rs"]
pub mod nested;
#[path = "../../tests/common/real_serve.rs"]
pub mod real_serve;
#[path = "../../tests/common/sessionless.rs"]
pub mod sessionless;
#[path = "../../tests/common/stdio.rs"]
pub mod stdio;

use serde_json::Value;
use std::time::{Duration, Instant};

/// `name` from the environment as a number, else `default`.
pub fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The JSON-RPC answer in a reply (a JSON body, or the event of an SSE stream that carries an
/// id); `Null` when there is none.
pub fn answer(text: &str) -> Value {
    sessionless::answer_in(text).unwrap_or(Value::Null)
}

/// A port free on loopback now (the server binds it a moment later).
pub use real_serve::free_port;

/// Waits until something listens on `port`, for at most `within`.
pub async fn wait_listening(port: u16, within: Duration) {
    let start = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(start.elapsed() < within, "not listening on {port}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The `p` quantile of `sorted` in milliseconds (NaN for none).
pub fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// One sessionless call of `tool` as `token`'s user: its reply, or `None` when it was not
/// answered at all.
pub async fn sessionless_reply(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    id: u64,
    tool: &str,
    arguments: Value,
) -> Option<reqwest::Response> {
    let body = sessionless::body(id, tool, arguments, "bench");
    sessionless::post(http, url, token, tool, &body)
        .send()
        .await
        .ok()
}

/// One sessionless call of `tool` as `token`'s user: its result when it was answered (a 2xx)
/// without a tool error; else what came back, or that nothing did.
pub async fn sessionless_call(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    tool: &str,
    arguments: Value,
) -> Result<Value, String> {
    let Some(response) = sessionless_reply(http, url, token, 1, tool, arguments).await else {
        return Err("no reply".to_owned());
    };
    let ok = response.status().is_success();
    let text = response.text().await.unwrap_or_default();
    let result = answer(&text)["result"].clone();
    if ok && result["isError"] == false {
        Ok(result)
    } else {
        Err(text.trim().to_owned())
    }
}

/// A client of one kept connection, as one user's client is.
pub fn one_connection_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()
        .unwrap()
}

/// Makes `calls` calls with `call` (given each one's number from 0), timing each: the times of
/// those it answers true, and how many it answered false (lost).
pub async fn timed_calls<F, Fut>(calls: usize, mut call: F) -> (Vec<Duration>, usize)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut times = Vec::with_capacity(calls);
    let mut lost = 0;
    for i in 0..calls {
        let t = Instant::now();
        if call(i).await {
            times.push(t.elapsed());
        } else {
            lost += 1;
        }
    }
    (times, lost)
}

/// Lets the clients waiting at `barrier` go, and gathers what each timed: every answered call's
/// time, sorted; how many calls were lost; and the wall time from the start to the last end.
pub async fn release_and_gather(
    barrier: &tokio::sync::Barrier,
    clients: Vec<tokio::task::JoinHandle<(Vec<Duration>, usize)>>,
) -> (Vec<Duration>, usize, Duration) {
    barrier.wait().await;
    let started = Instant::now();
    let (mut times, mut lost) = (Vec::new(), 0);
    for client in clients {
        let (t, l) = client.await.unwrap();
        times.extend(t);
        lost += l;
    }
    let wall = started.elapsed();
    times.sort();
    (times, lost, wall)
}

/// A load run's figures: the calls answered and lost, the answered calls a second over `wall`,
/// and the median and 99th percentile of `sorted`.
pub fn load_figures(shape: &str, sorted: &[Duration], lost: usize, wall: Duration) -> Value {
    serde_json::json!({
        "shape": shape,
        "answered": sorted.len(),
        "lost": lost,
        "callsPerSec": sorted.len() as f64 / wall.as_secs_f64(),
        "p50Ms": percentile_ms(sorted, 0.5),
        "p99Ms": percentile_ms(sorted, 0.99),
    })
}

/// The fake engine holding ten running machines, `m0` to `m9`: a listing of some size.
pub async fn fake_of_ten_machines() -> fake_serve::FakeServe {
    let fake = fake_serve::FakeServe::start().await;
    for i in 0..10 {
        fake.add_machine(&format!("m{i}"), "running");
    }
    fake
}

/// A load bench's report: the host's cores, its `clients` making `calls` calls each, and its
/// `runs` (each of [`load_figures`]).
pub fn load_report(clients: usize, calls: usize, runs: Vec<Value>) -> Value {
    serde_json::json!({
        "cores": cores(),
        "clients": clients,
        "callsPerClient": calls,
        "runs": runs,
    })
}

/// Prints a [`load_report`]'s heading: `title`, then the cores and the clients with their
/// calls (`calls` says of what).
pub fn print_load_heading(report: &Value, title: &str, calls: &str) {
    println!(
        "{title} ({} cores, {} clients x {} {calls})",
        report["cores"], report["clients"], report["callsPerClient"]
    );
}

/// A database of the bench's own on the server `SMOL_TEST_PG_URL` names (which `script`
/// exports), its URL.
pub async fn database(script: &str) -> String {
    let server = std::env::var("SMOL_TEST_PG_URL")
        .unwrap_or_else(|_| panic!("SMOL_TEST_PG_URL: run through {script}"));
    let name = format!("smolbench_{:016x}", rand::random::<u64>());
    let (client, connection) = tokio_postgres::connect(&server, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let base = server.rsplit_once('/').map_or(server.as_str(), |(b, _)| b);
    format!("{base}/{name}")
}

/// The start of a server's environment, which a bench clears first: PATH, and a home, a
/// config folder and a runtime directory of its own under `runtime`.
pub fn isolated_env(runtime: &std::path::Path) -> [(&'static str, String); 4] {
    [
        ("PATH", std::env::var("PATH").unwrap_or_default()),
        ("HOME", runtime.display().to_string()),
        (
            "XDG_CONFIG_HOME",
            runtime.join("config").display().to_string(),
        ),
        (
            "SMOL_MCP_RUNTIME_DIR",
            runtime.join("rt").display().to_string(),
        ),
    ]
}

/// The stdio server's whole environment: the isolated one of `runtime`, the local engine at
/// `local_url` and the log filter `log`.
pub fn stdio_env(runtime: &std::path::Path, local_url: &str, log: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = isolated_env(runtime)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    env.push(("SMOL_LOCAL_URL".into(), local_url.into()));
    env.push(("SMOL_MCP_LOG".into(), log.into()));
    env
}

/// `binary` (a build of `smol-mcp-http`) on a free port, in the isolated environment of
/// `runtime` with `env` beside it (`SMOL_MCP_LOG` error unless `env` says otherwise), once it
/// listens (within `within`).
pub async fn http_server(
    binary: &str,
    runtime: &std::path::Path,
    env: &[(&str, String)],
    within: Duration,
) -> (tokio::process::Child, u16) {
    let port = free_port();
    let child = tokio::process::Command::new(binary)
        .env_clear()
        .envs(isolated_env(runtime))
        .env("SMOL_MCP_LOG", "error")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("SMOL_MCP_HTTP_PORT", port.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_listening(port, within).await;
    (child, port)
}

/// A field of `/proc/PID/status` in KiB (`VmRSS:`, `VmHWM:`); 0 when it cannot be read.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The cores this host offers the run (0 when it cannot tell), as every report states them.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

/// A report's figure as a number to print; NaN where the report has none.
pub fn figure(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// Runs a bench's `run` on a [`runtime`] of its own.
pub fn block_on(run: impl std::future::Future<Output = Value>) -> Value {
    runtime().block_on(run)
}

/// A runtime of two workers whatever the host (the figures in docs/benchmarks.md are of two).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Writes `report` to target/bench/`file`, and says where.
pub fn write_report(file: &str, report: &Value) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(file);
    std::fs::write(&path, serde_json::to_string_pretty(report).unwrap()).unwrap();
    path
}
