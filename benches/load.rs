//! Load on the HTTP server: N concurrent MCP sessions over loopback, each on its own keep-alive
//! connection, each making M list-machines calls, against the fake serve and against the real
//! one. Prints calls/s, p50 / p95 / p99 latency and the server's peak RSS; checks that every
//! call was answered and that no machine was left behind.
//!
//! Run with `scripts/load.sh` (fetches the pinned engine, then `cargo bench --bench load`);
//! `LOAD_SESSIONS` (default 20) and `LOAD_CALLS` (default 200) change the shape. Writes the
//! figures as JSON to `target/bench/load.json`. Not a test: it fails only when a reply is lost
//! or a machine leaks, never on a figure.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{fake_serve, real_serve};

use common::{answer, env_number};
use serde_json::{Value, json};
use smol_mcp::fleet::FleetApi as _;
use smol_mcp::fleet::transport::LocalEndpoint;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::process::Child;

const SERVER: &str = env!("CARGO_BIN_EXE_smol-mcp-http");

/// The server under load: this build, or the build `SMOL_MCP_BENCH_BINARY` names (to set two
/// builds side by side, one run after the other).
fn server_binary() -> String {
    std::env::var("SMOL_MCP_BENCH_BINARY").unwrap_or_else(|_| SERVER.to_owned())
}
const TOKEN: &str = "load-token";

struct Server {
    child: Child,
    url: String,
}

impl Server {
    async fn start(runtime: &std::path::Path, local_url: &str) -> Server {
        let env = [
            ("SMOL_LOCAL_URL", local_url.to_owned()),
            ("SMOL_MCP_AUTH_TOKEN", TOKEN.to_owned()),
        ];
        let (child, port) =
            common::http_server(&server_binary(), runtime, &env, Duration::from_secs(10)).await;
        Server {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }

    fn peak_rss_kib(&self) -> u64 {
        common::status_kib(self.child.id().unwrap(), "VmHWM:")
    }
}

/// One MCP session on one keep-alive connection.
struct Session {
    http: reqwest::Client,
    url: String,
    id: String,
}

impl Session {
    async fn open(url: &str) -> Session {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1)
            .build()
            .unwrap();
        let mut s = Session {
            http,
            url: url.to_owned(),
            id: String::new(),
        };
        let r = s
            .post(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "load", "version": "0"}}}))
            .send()
            .await
            .unwrap();
        s.id = r.headers()["mcp-session-id"].to_str().unwrap().to_owned();
        r.text().await.unwrap();
        s.post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .send()
            .await
            .unwrap();
        s
    }

    fn post(&self, body: Value) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .post(&self.url)
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if !self.id.is_empty() {
            r = r
                .header("mcp-session-id", &self.id)
                .header("mcp-protocol-version", "2025-06-18");
        }
        r
    }

    /// The call's structured result, or None when the reply was lost or an error.
    async fn tool(&self, id: usize, name: &str, args: Value) -> Option<Value> {
        let r = self
            .post(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": name, "arguments": args}}))
            .send()
            .await
            .ok()?;
        let v = answer(&r.text().await.ok()?);
        (v["result"]["isError"] == false).then(|| v["result"]["structuredContent"].clone())
    }

    async fn close(self) -> u16 {
        self.http
            .delete(&self.url)
            .bearer_auth(TOKEN)
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", "2025-06-18")
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    }
}

/// N sessions, each creating one ephemeral machine when `create` (the fake only: the real serve
/// would boot a VM), then M list-machines calls, then DELETE.
async fn load(name: &str, local_url: &str, create: bool, sessions: usize, calls: usize) -> Value {
    let rt = tempfile::tempdir().unwrap();
    let server = Server::start(rt.path(), local_url).await;
    let mut opened = Vec::new();
    for _ in 0..sessions {
        opened.push(Session::open(&server.url).await);
    }
    if create {
        for s in &opened {
            s.tool(1, "create-machine", json!({"image": "alpine"}))
                .await
                .expect("create-machine");
        }
    }
    // One warm-up call each, so that the first connection set-up is not measured.
    for s in &opened {
        s.tool(2, "list-machines", json!({})).await;
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(sessions + 1));
    let mut tasks = Vec::new();
    for s in opened {
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let session = &s;
            let (times, lost) = common::timed_calls(calls, move |i| async move {
                matches!(session.tool(10 + i, "list-machines", json!({})).await,
                    Some(v) if v["machines"].is_array())
            })
            .await;
            (s, times, lost)
        }));
    }
    barrier.wait().await;
    let started = Instant::now();
    let mut times = Vec::new();
    let mut lost = 0;
    let mut done = Vec::new();
    for t in tasks {
        let (s, t, l) = t.await.unwrap();
        times.extend(t);
        lost += l;
        done.push(s);
    }
    let wall = started.elapsed();
    let mut close_statuses = Vec::new();
    for s in done {
        close_statuses.push(s.close().await);
    }
    let rss = server.peak_rss_kib();
    times.sort();
    json!({
        "serve": name,
        "sessions": sessions,
        "callsPerSession": calls,
        "answered": times.len(),
        "lost": lost,
        "callsPerSec": times.len() as f64 / wall.as_secs_f64(),
        "p50Ms": common::percentile_ms(&times, 0.50),
        "p95Ms": common::percentile_ms(&times, 0.95),
        "p99Ms": common::percentile_ms(&times, 0.99),
        "maxMs": common::percentile_ms(&times, 1.0),
        "peakRssMiB": rss as f64 / 1024.0,
        "deleteStatuses": close_statuses.iter().copied().collect::<std::collections::BTreeSet<u16>>(),
    })
}

async fn settle(mut leaked: impl FnMut() -> usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    while leaked() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    leaked()
}

async fn run() -> Value {
    let sessions = env_number("LOAD_SESSIONS", 20);
    let calls = env_number("LOAD_CALLS", 200);

    let fake = fake_serve::FakeServe::start().await;
    let mut fake_run = load("fake", &fake.url(), true, sessions, calls).await;
    let fake_left = settle(|| fake.state.lock().unwrap().machines.len()).await;
    fake_run["machinesLeft"] = json!(fake_left);

    let real = real_serve::RealServe::start().await;
    let url = match &real.endpoint {
        LocalEndpoint::Unix(p) => format!("unix://{}", p.display()),
        LocalEndpoint::Loopback { authority } => format!("http://{authority}"),
    };
    let fleet = smol_mcp::fleet::LocalFleet::new(real.endpoint.clone()).unwrap();
    let before = fleet.list().await.map(|m| m.len()).unwrap_or(usize::MAX);
    let mut real_run = load("real", &url, false, sessions, calls).await;
    let after = fleet.list().await.map(|m| m.len()).unwrap_or(usize::MAX);
    real_run["machinesLeft"] = json!(after.saturating_sub(before));

    json!({
        "machine": format!("{} cores", common::cores()),
        "smolvm": real_serve::PINNED_SMOLVM,
        "runs": [fake_run, real_run],
    })
}

fn main() {
    let report = common::block_on(run());
    let f = common::figure;
    println!(
        "smol-mcp-http load ({}, smolvm {})",
        report["machine"].as_str().unwrap_or(""),
        report["smolvm"].as_str().unwrap_or("")
    );
    println!();
    println!(
        "| serve | sessions x calls | calls/s | p50 / p95 / p99 ms | peak RSS | lost | machines left |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut failed = false;
    for r in report["runs"].as_array().unwrap() {
        println!(
            "| {} | {} x {} | {:.0} | {:.2} / {:.2} / {:.2} | {:.1} MiB | {} | {} |",
            r["serve"].as_str().unwrap_or(""),
            r["sessions"],
            r["callsPerSession"],
            f(&r["callsPerSec"]),
            f(&r["p50Ms"]),
            f(&r["p95Ms"]),
            f(&r["p99Ms"]),
            f(&r["peakRssMiB"]),
            r["lost"],
            r["machinesLeft"]
        );
        failed |= r["lost"] != 0 || r["machinesLeft"] != 0;
    }
    let path = common::write_report("load.json", &report);
    println!("\nfigures written to {}", path.display());
    assert!(!failed, "a reply was lost or a machine leaked");
}
