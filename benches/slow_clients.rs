//! Slow clients beside a legitimate one: the release `smol-mcp-http`, as a process, against the
//! fake serve, with its default limits. A client calls list-machines CALLS times, CALL_GAP_MS
//! apart (300 and 100 ms: half a minute, past the header timeout, so slow connections are closed
//! and come back while it runs), each call on a new connection (so each has to find a slot, as
//! after any reconnect), first alone, then while
//! SLOW_BODY connections send a valid token and headers and then their body a byte a second,
//! and SLOW_HEADER connections send their headers a byte a second; each slow connection the
//! server closes comes back a second later. Prints the calls answered and the client's p50 / p95
//! alone and under the slow clients (the goal: every call answered, p95 within 3x).
//!
//! Run with `scripts/bench-http.sh` or `cargo bench --bench slow_clients`; SLOW_BODY and
//! SLOW_HEADER (default 600 each), CALLS and CALL_GAP_MS change the shape. Writes
//! `target/bench/slow_clients.json`. Not a test: it never fails on a figure.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::fake_serve;

use common::{answer, env_number};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt as _;
use tokio::process::Child;
use tokio_util::sync::CancellationToken;

const SERVER: &str = env!("CARGO_BIN_EXE_smol-mcp-http");
const TOKEN: &str = "slow-clients-token";

async fn start(runtime: &std::path::Path, local_url: &str) -> (Child, u16) {
    let env = [
        ("SMOL_LOCAL_URL", local_url.to_owned()),
        ("SMOL_MCP_AUTH_TOKEN", TOKEN.to_owned()),
    ];
    common::http_server(SERVER, runtime, &env, Duration::from_secs(10)).await
}

fn post(http: &reqwest::Client, url: &str, session: &str, body: Value) -> reqwest::RequestBuilder {
    let mut r = http
        .post(url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .timeout(Duration::from_secs(60))
        .json(&body);
    if !session.is_empty() {
        r = r
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", "2025-06-18");
    }
    r
}

async fn open_session(http: &reqwest::Client, url: &str) -> String {
    let r = post(http, url, "", json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "slow-clients", "version": "0"}}}))
        .send()
        .await
        .unwrap();
    let Some(id) = r
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned())
    else {
        panic!(
            "initialize: {} {}",
            r.status(),
            r.text().await.unwrap_or_default()
        );
    };
    r.text().await.unwrap();
    post(
        http,
        url,
        &id,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .send()
    .await
    .unwrap();
    id
}

/// `calls` list-machines calls one after another; the times of those answered, and the
/// statuses of those that were not.
async fn client(url: &str, calls: usize, gap: Duration) -> (Vec<Duration>, Vec<String>) {
    // No idle connection kept: every call connects anew.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let session = open_session(&http, url).await;
    let mut times = Vec::new();
    let mut failed = Vec::new();
    for i in 0..calls {
        tokio::time::sleep(gap).await;
        let started = Instant::now();
        let body = json!({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",
            "params": {"name": "list-machines", "arguments": {}}});
        match post(&http, url, &session, body).send().await {
            Ok(r) => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                let v = answer(&text);
                if status == 200 && v["result"]["structuredContent"]["machines"].is_array() {
                    times.push(started.elapsed());
                } else {
                    failed.push(format!("{status}"));
                }
            }
            Err(e) => failed.push(format!("{e}")),
        }
    }
    (times, failed)
}

/// One slow connection, again and again until `stop`: it comes back a second after the server
/// closes it.
async fn slow(port: u16, body: bool, stop: CancellationToken, connected: Arc<AtomicUsize>) {
    let head = if body {
        format!(
            "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nauthorization: Bearer {TOKEN}\r\n\
             content-type: application/json\r\naccept: application/json, text/event-stream\r\n\
             content-length: 100000\r\n\r\n{{"
        )
    } else {
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\n".to_owned()
    };
    while !stop.is_cancelled() {
        if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            connected.fetch_add(1, Ordering::Relaxed);
            let mut ok = s.write_all(head.as_bytes()).await.is_ok();
            while ok && !stop.is_cancelled() {
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                ok = s.write_all(if body { b" " } else { b"x" }).await.is_ok();
            }
        }
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

fn summary(name: &str, mut times: Vec<Duration>, failed: &[String], calls: usize) -> Value {
    times.sort();
    let mut statuses: Vec<String> = failed.to_vec();
    statuses.sort();
    statuses.dedup();
    json!({
        "run": name,
        "calls": calls,
        "answered": times.len(),
        "p50Ms": common::percentile_ms(&times, 0.50),
        "p95Ms": common::percentile_ms(&times, 0.95),
        "maxMs": common::percentile_ms(&times, 1.0),
        "failures": statuses,
    })
}

async fn run() -> Value {
    let slow_body = env_number("SLOW_BODY", 600);
    let slow_header = env_number("SLOW_HEADER", 600);
    let calls = env_number("CALLS", 300);
    let gap = Duration::from_millis(env_number("CALL_GAP_MS", 100) as u64);
    let fake = fake_serve::FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let (_server, port) = start(rt.path(), &fake.url()).await;
    let url = format!("http://127.0.0.1:{port}/mcp");

    let (times, failed) = client(&url, calls, gap).await;
    let alone = summary("alone", times, &failed, calls);

    let stop = CancellationToken::new();
    let connected = Arc::new(AtomicUsize::new(0));
    let mut attackers = Vec::new();
    for i in 0..slow_body + slow_header {
        attackers.push(tokio::spawn(slow(
            port,
            i < slow_body,
            stop.clone(),
            connected.clone(),
        )));
    }
    let started = Instant::now();
    while connected.load(Ordering::Relaxed) < slow_body + slow_header
        && started.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (times, failed) = client(&url, calls, gap).await;
    let loaded = summary("slow clients", times, &failed, calls);
    let slow_connections = connected.load(Ordering::Relaxed);
    stop.cancel();
    for a in attackers {
        let _ = a.await;
    }
    json!({
        "machine": format!("{} cores", common::cores()),
        "slowBody": slow_body,
        "slowHeader": slow_header,
        "slowConnectionsMade": slow_connections,
        "runs": [alone, loaded],
    })
}

fn main() {
    let report = common::block_on(run());
    let f = common::figure;
    println!(
        "smol-mcp-http beside slow clients ({}; {} slow-body and {} slow-header connections, {} made in all)",
        report["machine"].as_str().unwrap_or(""),
        report["slowBody"],
        report["slowHeader"],
        report["slowConnectionsMade"]
    );
    println!();
    println!("| run | calls answered | p50 / p95 / max ms | not answered |");
    println!("|---|---|---|---|");
    let runs = report["runs"].as_array().unwrap();
    for r in runs {
        println!(
            "| {} | {} / {} | {:.2} / {:.2} / {:.2} | {} |",
            r["run"].as_str().unwrap_or(""),
            r["answered"],
            r["calls"],
            f(&r["p50Ms"]),
            f(&r["p95Ms"]),
            f(&r["maxMs"]),
            r["failures"]
        );
    }
    println!(
        "\np95 under slow clients / alone: {:.2}x",
        f(&runs[1]["p95Ms"]) / f(&runs[0]["p95Ms"])
    );
    let path = common::write_report("slow_clients.json", &report);
    println!("figures written to {}", path.display());
}
