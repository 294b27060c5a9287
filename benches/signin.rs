//! What OAuth sign-in costs a call: one `smol-mcp-http` process, the same load twice in one
//! run, first with the static token (the operator: nothing checked, nothing read), then as a
//! signed-in user (each request's access token verified, ES256, and each call naming a machine
//! checked against who holds it in the store). C concurrent clients each make M sessionless
//! calls on their own keep-alive connection, against the fake serve: list-machines (the listing
//! narrowed to the user's) and run-command `true` in a machine of the caller's. Prints a table
//! and the ratios; writes target/bench/signin.json.
//!
//! Run with `cargo bench --bench signin`; `LOAD_CLIENTS` (default 8) and `LOAD_CALLS` (default
//! 200) shape it. The issuer is the bench's own (its metadata and key set on loopback, tokens
//! signed with a key made by ring): what is measured is the server's side. Not a test: it fails
//! only when a reply is lost or refused.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::env_number;
use common::issuer::Issuer;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

const SERVER: &str = env!("CARGO_BIN_EXE_smol-mcp-http");
const STATIC_TOKEN: &str = "signin-bench-token";

/// One sessionless tool call; its result, or `None` when it was not answered (or was a tool
/// error).
async fn call(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    tool: &str,
    args: Value,
) -> Option<Value> {
    common::sessionless_call(http, url, token, tool, args)
        .await
        .ok()
}

async fn load(
    shape: &str,
    url: &str,
    token: &str,
    tool: &str,
    arguments: Value,
    clients: usize,
    calls: usize,
) -> Value {
    let barrier = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let http = common::one_connection_client();
        assert!(
            call(&http, url, token, tool, arguments.clone())
                .await
                .is_some(),
            "{shape}: the warm-up call was refused"
        );
        let (barrier, url, token, tool, arguments) = (
            barrier.clone(),
            url.to_owned(),
            token.to_owned(),
            tool.to_owned(),
            arguments.clone(),
        );
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let (http, url, token, tool, arguments) = (&http, &url, &token, &tool, &arguments);
            common::timed_calls(calls, move |_| async move {
                assert!(
                    call(http, url, token, tool, arguments.clone())
                        .await
                        .is_some(),
                    "a call was lost or refused"
                );
                true
            })
            .await
        }));
    }
    let (times, lost, wall) = common::release_and_gather(&barrier, tasks).await;
    common::load_figures(shape, &times, lost, wall)
}

async fn run() -> Value {
    let clients = env_number("LOAD_CLIENTS", 8);
    let calls = env_number("LOAD_CALLS", 200);
    let fake = common::fake_of_ten_machines().await;
    let issuer = Issuer::start().await;
    let rt = tempfile::tempdir().unwrap();
    let env = [
        ("SMOL_LOCAL_URL", fake.url()),
        ("SMOL_MCP_AUTH_TOKEN", STATIC_TOKEN.to_owned()),
        ("SMOL_MCP_AUTH_ISSUER", issuer.url.clone()),
        ("SMOL_MCP_AUTH_SCOPES", "machines".to_owned()),
    ];
    let (_server, port) =
        common::http_server(SERVER, rt.path(), &env, Duration::from_secs(15)).await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let user_token = issuer.token("bench-user", &url);
    let http = reqwest::Client::new();
    for (token, name) in [
        (STATIC_TOKEN, "operator-box"),
        (user_token.as_str(), "user-box"),
    ] {
        call(&http, &url, token, "create-machine", json!({"name": name}))
            .await
            .expect("the bench's machine");
    }
    let mut runs = Vec::new();
    for (tool, who, token, arguments) in [
        ("list-machines", "static token", STATIC_TOKEN, json!({})),
        ("list-machines", "signed in", user_token.as_str(), json!({})),
        (
            "run-command",
            "static token",
            STATIC_TOKEN,
            json!({"name": "operator-box", "command": "true"}),
        ),
        (
            "run-command",
            "signed in",
            user_token.as_str(),
            json!({"name": "user-box", "command": "true"}),
        ),
    ] {
        let shape = format!("{tool}, {who}");
        runs.push(load(&shape, &url, token, tool, arguments, clients, calls).await);
    }
    common::load_report(clients, calls, runs)
}

fn main() {
    let report = common::block_on(run());
    let f = common::figure;
    common::print_load_heading(
        &report,
        "smol-mcp-http, static token against sign-in",
        "sessionless calls, fake serve, SQLite store",
    );
    println!(
        "{:<32} {:>10} {:>9} {:>9}",
        "shape", "calls/s", "p50 ms", "p99 ms"
    );
    let runs = report["runs"].as_array().unwrap();
    for r in runs {
        println!(
            "{:<32} {:>10.0} {:>9.2} {:>9.2}",
            r["shape"].as_str().unwrap(),
            f(&r["callsPerSec"]),
            f(&r["p50Ms"]),
            f(&r["p99Ms"])
        );
    }
    for pair in runs.chunks(2) {
        println!(
            "{}: signed in {:.2}x the static token's calls per second",
            pair[0]["shape"]
                .as_str()
                .unwrap()
                .split(',')
                .next()
                .unwrap(),
            f(&pair[1]["callsPerSec"]) / f(&pair[0]["callsPerSec"])
        );
    }
    common::write_report("signin.json", &report);
}
