//! How long a line of a running command takes from the engine to the client: the fake serve
//! writes a stdout line stamped with the time it is sent, the stdio server streams it as a
//! progress notification, and the client notes when that arrives. Two runs: lines 400 ms apart
//! (each the first after a quiet spell, sent at once) and lines 20 ms apart (gathered into one
//! notification every 250 ms, so the batching wait is part of the figure).
//!
//! Run with `cargo bench --bench stream_latency`. Prints a table and writes the same figures
//! as JSON to `target/bench/stream_latency.json`. Not a test: it asserts nothing about them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{fake_serve, fake_stream, stdio};

use fake_stream::{StreamStep, epoch};
use serde_json::{Value, json};
use std::time::Duration;

struct Run {
    name: &'static str,
    gap: Duration,
    lines: usize,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank]
}

async fn measure(run: &Run) -> (Vec<f64>, usize) {
    let fake = fake_serve::FakeServe::start().await;
    fake.add_machine("m", "running");
    let lines = run.lines;
    fake.set_stream(move |_| {
        let mut steps: Vec<StreamStep> = (0..lines)
            .map(|i| StreamStep::Stamped(format!("line-{i}")))
            .collect();
        steps.push(StreamStep::exit(0));
        steps
    });
    fake.state.lock().unwrap().stream_gap = Some(run.gap);
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let mut server =
        stdio::StdioServer::spawn(stdio::server_env(rt.path(), &[("SMOL_LOCAL_URL", &url)])).await;
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "run-command", "arguments": {"name": "m", "command": "stamp"},
        "_meta": {"progressToken": "bench"}}});
    server.send_raw(format!("{call}\n").as_bytes()).await;
    let mut latencies_ms = Vec::new();
    let mut notifications = 0;
    loop {
        let message: Value = server.next_message(Duration::from_secs(120)).await;
        let arrived = epoch().elapsed().as_nanos();
        if message["id"] == json!(7) {
            assert_eq!(message["result"]["isError"], false, "{message}");
            break;
        }
        if message["method"] != "notifications/progress" {
            continue;
        }
        notifications += 1;
        let text = message["params"]["message"].as_str().unwrap_or_default();
        for line in text.lines() {
            if let Some(sent) = line
                .trim_start_matches("[stdout] ")
                .split_once(' ')
                .and_then(|(_, ns)| ns.parse::<u128>().ok())
            {
                latencies_ms.push((arrived - sent) as f64 / 1e6);
            }
        }
    }
    (latencies_ms, notifications)
}

fn main() {
    let runtime = common::runtime();
    epoch();
    let runs = [
        Run {
            name: "lines 400 ms apart (sent at once)",
            gap: Duration::from_millis(400),
            lines: 40,
        },
        Run {
            name: "lines 20 ms apart (batched, 250 ms)",
            gap: Duration::from_millis(20),
            lines: 400,
        },
    ];
    let mut report = Vec::new();
    println!(
        "{:<40} {:>6} {:>14} {:>9} {:>9}",
        "run", "lines", "notifications", "p50 ms", "p95 ms"
    );
    for run in &runs {
        let (mut latencies, notifications) = runtime.block_on(measure(run));
        latencies.sort_by(f64::total_cmp);
        let (p50, p95) = (percentile(&latencies, 0.5), percentile(&latencies, 0.95));
        println!(
            "{:<40} {:>6} {:>14} {:>9.2} {:>9.2}",
            run.name,
            latencies.len(),
            notifications,
            p50,
            p95
        );
        report.push(json!({"run": run.name, "lines": latencies.len(),
            "notifications": notifications, "p50Ms": p50, "p95Ms": p95}));
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("stream_latency.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    println!("\nfigures written to {}", path.display());
}
