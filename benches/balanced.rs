//! Calls per second of one `smol-mcp-http` process against three behind HAProxy, in one run
//! and under the same load: C concurrent clients, each making M sessionless (2026-07-28)
//! list-machines calls on its own keep-alive connection, against the fake serve, every process
//! on one PostgreSQL store. Three shapes: one process reached directly, one behind the
//! balancer (the balancer's own cost), three behind it. Prints a table and the ratio three to
//! one; writes target/bench/balanced.json.
//!
//! Run with `scripts/bench-balanced.sh` (starts the project's PostgreSQL, installs HAProxy);
//! `LOAD_CLIENTS` (default 24) and `LOAD_CALLS` (default 150) shape it. Not a test: it fails
//! only when a reply is lost. Every process, the balancer and the clients share this host's
//! cores: three processes can only outrun one where there are cores for them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{balancer as balancer_script, real_serve};

use common::{answer, env_number};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::process::Child;

const SERVER: &str = env!("CARGO_BIN_EXE_smol-mcp-http");
const TOKEN: &str = "balanced-token";

async fn start_server(runtime: &Path, local_url: &str, store: &str) -> (Child, u16) {
    let env = [
        ("SMOL_LOCAL_URL", local_url.to_owned()),
        ("SMOL_MCP_STORE_URL", store.to_owned()),
        ("SMOL_MCP_AUTH_TOKEN", TOKEN.to_owned()),
    ];
    common::http_server(SERVER, runtime, &env, Duration::from_secs(15)).await
}

/// One sessionless list-machines call; whether it was answered with a listing.
async fn list_machines(http: &reqwest::Client, url: &str, id: usize) -> bool {
    let Some(response) =
        common::sessionless_reply(http, url, TOKEN, id as u64, "list-machines", json!({})).await
    else {
        return false;
    };
    let text = response.text().await.unwrap_or_default();
    answer(&text)["result"]["structuredContent"]["machines"].is_array()
}

async fn load(name: &str, url: &str, clients: usize, calls: usize) -> Value {
    let mut connections = Vec::new();
    for _ in 0..clients {
        let http = common::one_connection_client();
        // Warm: the connection made and the process's first answer given before the clock.
        list_machines(&http, url, 0).await;
        connections.push(http);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let mut tasks = Vec::new();
    for http in connections {
        let (barrier, url) = (barrier.clone(), url.to_owned());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let (http, url) = (&http, &url);
            common::timed_calls(calls, move |i| list_machines(http, url, i + 1)).await
        }));
    }
    let (times, lost, wall) = common::release_and_gather(&barrier, tasks).await;
    common::load_figures(name, &times, lost, wall)
}

async fn run() -> Value {
    let clients = env_number("LOAD_CLIENTS", 24);
    let calls = env_number("LOAD_CALLS", 150);
    let fake = common::fake_of_ten_machines().await;
    let mut runs = Vec::new();

    let store = common::database("scripts/bench-balanced.sh").await;
    let rt = tempfile::tempdir().unwrap();
    let (one, one_port) = start_server(rt.path(), &fake.url(), &store).await;
    runs.push(
        load(
            "1 process, direct",
            &format!("http://127.0.0.1:{one_port}/mcp"),
            clients,
            calls,
        )
        .await,
    );
    let lb_dir = tempfile::tempdir().unwrap();
    let lb_port = real_serve::free_port();
    balancer_script::run(
        lb_dir.path(),
        &["up".into(), lb_port.to_string(), one_port.to_string()],
    );
    let through = format!("http://127.0.0.1:{lb_port}/mcp");
    runs.push(load("1 process, behind HAProxy", &through, clients, calls).await);
    balancer_script::run(lb_dir.path(), &["down".into()]);
    drop(one);

    let store = common::database("scripts/bench-balanced.sh").await;
    let mut children = Vec::new();
    let mut ports = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..3 {
        let rt = tempfile::tempdir().unwrap();
        let (child, port) = start_server(rt.path(), &fake.url(), &store).await;
        children.push(child);
        ports.push(port.to_string());
        dirs.push(rt);
    }
    let mut args = vec!["up".to_owned(), lb_port.to_string()];
    args.extend(ports);
    balancer_script::run(lb_dir.path(), &args);
    runs.push(load("3 processes, behind HAProxy", &through, clients, calls).await);
    balancer_script::run(lb_dir.path(), &["down".into()]);
    drop(children);

    common::load_report(clients, calls, runs)
}

fn main() {
    let report = common::block_on(run());
    let f = common::figure;
    common::print_load_heading(
        &report,
        "smol-mcp-http behind HAProxy",
        "sessionless list-machines calls, fake serve, PostgreSQL store",
    );
    println!();
    println!("| shape | calls/s | p50 / p99 ms | lost |");
    println!("|---|---|---|---|");
    let runs = report["runs"].as_array().unwrap();
    for r in runs {
        println!(
            "| {} | {:.0} | {:.2} / {:.2} | {} |",
            r["shape"].as_str().unwrap_or(""),
            f(&r["callsPerSec"]),
            f(&r["p50Ms"]),
            f(&r["p99Ms"]),
            r["lost"]
        );
    }
    let ratio = f(&runs[2]["callsPerSec"]) / f(&runs[0]["callsPerSec"]);
    println!("\nthree processes behind the balancer / one process direct: {ratio:.2}x");
    common::write_report("balanced.json", &report);
    assert!(
        runs.iter().all(|r| r["lost"] == 0),
        "a reply was lost: {report}"
    );
}
