//! A background job that prints steadily for ten minutes, read by cursor, and the server's
//! memory meanwhile. The stdio server (release build) runs against the fake serve's guest
//! shell, where the job is a real host process writing its files as the engine's detached
//! exec would in the guest; a client calls job-output every 2 s with the cursor it was given.
//! Every minute the server's resident memory (VmRSS) is sampled from /proc; at the end the
//! output read is checked whole (every numbered line, in order) against what the job wrote.
//!
//! Run with `cargo bench --bench job_memory` (10 minutes); `JOB_BENCH_MINUTES=1` for a quick
//! run. Prints a table and writes the figures as JSON to `target/bench/job_memory.json`. Not a
//! test: it asserts nothing about the figures.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{fake_serve, status_kib, stdio};

use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// How often the client reads, and the job's line rate: 100 lines of 100 bytes a second
/// (10 KB/s, 6 MB in ten minutes), under one job-output's budget per read.
const READ_EVERY: Duration = Duration::from_secs(2);

#[tokio::main]
async fn main() {
    let minutes: u64 = std::env::var("JOB_BENCH_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(10);
    let fake = fake_serve::FakeServe::start_guest_shell().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let mut server =
        stdio::StdioServer::spawn(stdio::server_env(rt.path(), &[("SMOL_LOCAL_URL", &url)])).await;
    let pid = server.child.id().unwrap();
    server
        .tool(
            1,
            "create-machine",
            json!({"name": "bench", "image": "alpine"}),
        )
        .await;
    // Numbered lines of 100 bytes, 100 a second, for the whole run.
    let script = format!(
        "end=$(( $(date +%s) + {} )); i=0; \
         while [ $(date +%s) -lt $end ]; do \
           for j in 0 1 2 3 4 5 6 7 8 9; do printf '%010d %088d\\n' $i 0; i=$((i+1)); done; \
           sleep 0.1; \
         done",
        minutes * 60
    );
    let started = server
        .tool(
            2,
            "run-command",
            json!({"name": "bench", "command": script, "background": true, "timeoutSecs": minutes * 60 + 120}),
        )
        .await;
    let job = started["job"].as_str().unwrap().to_owned();
    let began = Instant::now();
    let rss_start = status_kib(pid, "VmRSS:");
    let mut samples = vec![(0u64, rss_start, 0u64)];
    let mut cursor = "0:0".to_owned();
    let mut read_bytes = 0u64;
    let mut next_line = 0u64;
    let mut partial = String::new();
    let mut id = 3;
    let mut last: Value;
    let mut calls = 0u64;
    loop {
        tokio::time::sleep(READ_EVERY).await;
        loop {
            id += 1;
            calls += 1;
            last = server
                .tool(id, "job-output", json!({"job": job, "cursor": cursor}))
                .await;
            let text = last["stdout"].as_str().unwrap();
            read_bytes += text.len() as u64;
            partial.push_str(text);
            while let Some(end) = partial.find('\n') {
                let line: String = partial.drain(..=end).collect();
                let n: u64 = line[..10].parse().expect("a numbered line");
                assert_eq!(n, next_line, "lines arrive whole and in order");
                next_line += 1;
            }
            cursor = last["cursor"].as_str().unwrap().to_owned();
            if last["more"] != true {
                break;
            }
        }
        let minute = began.elapsed().as_secs() / 60;
        if minute > samples.last().unwrap().0 {
            let rss = status_kib(pid, "VmRSS:");
            eprintln!(
                "minute {minute}: server RSS {:.1} MiB, {read_bytes} bytes read",
                rss as f64 / 1024.0
            );
            samples.push((minute, rss, read_bytes));
        }
        if last["state"] != "running" && last["more"] != true {
            break;
        }
    }
    let rss_end = status_kib(pid, "VmRSS:");
    let hwm = status_kib(pid, "VmHWM:");
    let written = last["stdoutBytes"].as_u64().unwrap();
    println!(
        "| job of {minutes} min, read every {} s | |",
        READ_EVERY.as_secs()
    );
    println!("|---|---|");
    println!("| bytes the job wrote | {written} |");
    println!("| bytes read by cursor ({calls} job-output calls) | {read_bytes} |");
    println!("| lines checked whole and in order | {next_line} |");
    println!(
        "| server RSS at the job's start / end | {:.1} / {:.1} MiB |",
        rss_start as f64 / 1024.0,
        rss_end as f64 / 1024.0
    );
    println!(
        "| server peak RSS (VmHWM) | {:.1} MiB |",
        hwm as f64 / 1024.0
    );
    for (minute, rss, read) in &samples {
        println!(
            "| minute {minute}: RSS | {:.1} MiB ({read} bytes read) |",
            *rss as f64 / 1024.0
        );
    }
    let report = json!({
        "minutes": minutes,
        "bytesWritten": written,
        "bytesRead": read_bytes,
        "jobOutputCalls": calls,
        "linesChecked": next_line,
        "rssStartKib": rss_start,
        "rssEndKib": rss_end,
        "peakRssKib": hwm,
        "samples": samples.iter().map(|(m, r, b)| json!({"minute": m, "rssKib": r, "bytesRead": b})).collect::<Vec<_>>(),
        "state": last["state"],
    });
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("job_memory.json"), report.to_string()).unwrap();
    drop(fake);
}
