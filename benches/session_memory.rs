//! Sessions opened and ended in rounds: the release `smol-mcp-http`, as a process, against the
//! fake serve; each round opens SESSION_COUNT sessions (initialize, then `initialized`) and ends
//! every one with DELETE, in waves of SESSION_HELD held open at once (by default the server's
//! default `httpMaxSessions`, 256; the bound is set to the wave's size). The server's resident
//! memory (VmRSS, from /proc) is printed after each round, beside the first round's: memory an
//! ended session leaves behind shows as growth from round to round (the goal is every round
//! within 10% of the first).
//!
//! Run with `scripts/bench-http.sh` or `cargo bench --bench session_memory`; SESSION_COUNT
//! (default 5000), SESSION_HELD (default 256), SESSION_ROUNDS (default 4) and
//! SESSION_CONCURRENCY (default 16) change the shape. Writes `target/bench/session_memory.json`.
//! Not a test: it fails only when a session cannot be opened or ended, never on a figure.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::fake_serve;

use common::{env_number, status_kib};
use futures::StreamExt as _;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tokio::process::Child;

const SERVER: &str = env!("CARGO_BIN_EXE_smol-mcp-http");
const TOKEN: &str = "session-memory-token";

async fn start(runtime: &std::path::Path, local_url: &str, max_sessions: usize) -> (Child, u16) {
    let env = [
        ("SMOL_LOCAL_URL", local_url.to_owned()),
        ("SMOL_MCP_AUTH_TOKEN", TOKEN.to_owned()),
        ("SMOL_MCP_HTTP_MAX_SESSIONS", max_sessions.to_string()),
    ];
    common::http_server(SERVER, runtime, &env, Duration::from_secs(10)).await
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

async fn open(http: &reqwest::Client, url: &str) -> Option<String> {
    let r = http
        .post(url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .json(
            &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "session-memory", "version": "0"}}}),
        )
        .send()
        .await
        .ok()?;
    let id = r.headers().get("mcp-session-id")?.to_str().ok()?.to_owned();
    r.text().await.ok()?;
    let r = http
        .post(url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &id)
        .header("mcp-protocol-version", "2025-06-18")
        .json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .send()
        .await
        .ok()?;
    r.status().is_success().then_some(id)
}

async fn end(http: &reqwest::Client, url: &str, id: &str) -> bool {
    http.delete(url)
        .bearer_auth(TOKEN)
        .header("mcp-session-id", id)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
}

async fn run() -> Value {
    let count = env_number("SESSION_COUNT", 5000);
    let held = env_number("SESSION_HELD", 256).clamp(1, count.max(1));
    let rounds = env_number("SESSION_ROUNDS", 4);
    let concurrency = env_number("SESSION_CONCURRENCY", 16);
    let fake = fake_serve::FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let (server, port) = start(rt.path(), &fake.url(), held).await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let http = reqwest::Client::new();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle = status_kib(server.id().unwrap(), "VmRSS:");
    let mut rows = Vec::new();
    for round in 1..=rounds {
        let started = Instant::now();
        let mut most_open = 0;
        let mut left = count;
        while left > 0 {
            let wave = left.min(held);
            left -= wave;
            let ids: Vec<Option<String>> = futures::stream::iter(0..wave)
                .map(|_| open(&http, &url))
                .buffer_unordered(concurrency)
                .collect()
                .await;
            let ids: Vec<String> = ids.into_iter().flatten().collect();
            assert_eq!(ids.len(), wave, "round {round}: sessions not opened");
            most_open = most_open.max(status_kib(server.id().unwrap(), "VmRSS:"));
            let ended: Vec<bool> = futures::stream::iter(ids.iter())
                .map(|id| end(&http, &url, id))
                .buffer_unordered(concurrency)
                .collect()
                .await;
            assert!(ended.iter().all(|e| *e), "round {round}: a DELETE failed");
        }
        // What an ended session releases is released by its own tasks as they wind down.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let ended_rss = status_kib(server.id().unwrap(), "VmRSS:");
        rows.push(json!({
            "round": round,
            "seconds": started.elapsed().as_secs_f64(),
            "openRssMiB": mib(most_open),
            "endedRssMiB": mib(ended_rss),
        }));
    }
    json!({
        "machine": format!("{} cores", common::cores()),
        "sessions": count,
        "held": held,
        "idleRssMiB": mib(idle),
        "peakRssMiB": mib(status_kib(server.id().unwrap(), "VmHWM:")),
        "rounds": rows,
    })
}

fn main() {
    let report = common::block_on(run());
    let f = common::figure;
    println!(
        "smol-mcp-http sessions opened and ended ({}, {} sessions a round, {} open at once; idle {:.1} MiB)",
        report["machine"].as_str().unwrap_or(""),
        report["sessions"],
        report["held"],
        f(&report["idleRssMiB"])
    );
    println!();
    println!(
        "| round | RSS with a wave open (most) | RSS after the round | vs round 1 | seconds |"
    );
    println!("|---|---|---|---|---|");
    let rounds = report["rounds"].as_array().unwrap();
    let first = f(&rounds[0]["endedRssMiB"]);
    for r in rounds {
        let ended = f(&r["endedRssMiB"]);
        println!(
            "| {} | {:.1} MiB | {:.1} MiB | {:+.0}% | {:.1} |",
            r["round"],
            f(&r["openRssMiB"]),
            ended,
            (ended / first - 1.0) * 100.0,
            f(&r["seconds"])
        );
    }
    println!("\npeak RSS (VmHWM) {:.1} MiB", f(&report["peakRssMiB"]));
    let path = common::write_report("session_memory.json", &report);
    println!("figures written to {}", path.display());
}
