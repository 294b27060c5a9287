//! The official MCP conformance suite driven against a server (the pinned suite and the Node 22
//! it needs, tests/conformance/), behind a loopback proxy that adds the bearer token the suite
//! cannot send: against one `smol-mcp-http` (tests/clients/conformance.rs) and against three
//! behind the load balancer (tests/shared/balancer.rs), with the same baselines.

use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;
use tokio::sync::Mutex;

pub const TOKEN: &str = "conformance-token";
const BEARER: &str = "Bearer conformance-token";

/// The fixture-free scenarios: each must run and pass in full. One may stand
/// in the baseline only with a reason that starts `awaiting-merge:` (a capability not merged
/// yet); the suite reports it stale once it passes, which fails this
/// test until the entry is removed.
pub const MUST_PASS_2025_11_25: &[&str] = &[
    "server-initialize",
    "server-session-lifecycle",
    "ping",
    "logging-set-level",
    "tools-list",
    "resources-list",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
];
pub const MUST_PASS_2026_07_28: &[&str] = &[
    "tools-list",
    "resources-list",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
    "caching",
    "http-header-validation",
];

/// The upstream connection of one client connection: HTTP/1.1 answers requests on a connection
/// in order, so one upstream connection per client connection keeps that order.
async fn forward(
    upstream: SocketAddr,
    connection: &Mutex<Option<SendRequest<Incoming>>>,
    mut request: Request<Incoming>,
) -> std::io::Result<Response<Incoming>> {
    request.headers_mut().insert(
        hyper::header::AUTHORIZATION,
        hyper::header::HeaderValue::from_static(BEARER),
    );
    let mut slot = connection.lock().await;
    if slot.as_ref().is_none_or(SendRequest::is_closed) {
        let stream = TcpStream::connect(upstream).await?;
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .preserve_header_case(true)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        *slot = Some(sender);
    }
    let sender = slot
        .as_mut()
        .ok_or_else(|| std::io::Error::other("no upstream connection"))?;
    sender.ready().await.map_err(std::io::Error::other)?;
    // The response future owns what it needs: the lock is let go before the answer, whose body
    // streams through as the server writes it (an event stream stays open).
    let response = sender.send_request(request);
    drop(slot);
    response.await.map_err(std::io::Error::other)
}

/// A loopback proxy that adds the bearer token to every request and changes nothing else.
pub fn token_proxy(listener: TcpListener, upstream: SocketAddr) {
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                let connection = Arc::new(Mutex::new(None));
                let service = hyper::service::service_fn(move |request| {
                    let connection = connection.clone();
                    async move { forward(upstream, &connection, request).await }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .preserve_header_case(true)
                    .serve_connection(TokioIo::new(inbound), service)
                    .await;
            });
        }
    });
}

pub fn conformance_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
    assert!(
        dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js")
            .exists()
            && dir.join("node_modules/.bin/node").exists(),
        "the conformance suite is not installed: run scripts/test.sh"
    );
    dir
}

/// The baseline's entries and the reason written above each (the comment lines directly
/// before it). The suite reads the same file; it ignores comments.
fn baseline(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut entries = BTreeMap::new();
    let mut reason = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(comment) = line.strip_prefix('#') {
            reason.push(comment.trim().to_owned());
        } else if let Some(entry) = line.strip_prefix("- ") {
            let reason = std::mem::take(&mut reason).join(" ");
            assert!(
                !reason.is_empty(),
                "{}: the entry {entry} has no reason: write it as a comment above the entry",
                path.display()
            );
            entries.insert(entry.trim().to_owned(), reason);
        } else {
            reason.clear();
        }
    }
    entries
}

/// The baseline's entries for a scenario: the whole scenario, or one check of it
/// (`<scenario>:<check-id>`).
fn entries_of<'a>(
    expected: &'a BTreeMap<String, String>,
    scenario: &'a str,
) -> impl Iterator<Item = (&'a String, &'a String)> {
    expected.iter().filter(move |(entry, _)| {
        entry.split_once(':').map_or(entry.as_str(), |(s, _)| s) == scenario
    })
}

/// Each scenario's checks as the suite wrote them with `-o`:
/// `<dir>/server-<scenario>-<time>/checks.json`.
fn results(dir: &Path) -> BTreeMap<String, Vec<Value>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let checks = path.join("checks.json");
        if !checks.exists() {
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // The suite appends `-<ISO time with dashes>Z` to the scenario's name.
        let is_time = |rest: &[u8]| {
            rest.len() > 11
                && rest[1..5].iter().all(u8::is_ascii_digit)
                && rest[5] == b'-'
                && rest[11] == b'T'
        };
        let end = (0..name.len())
            .find(|&i| name.as_bytes()[i] == b'-' && is_time(&name.as_bytes()[i..]))
            .unwrap_or(name.len());
        let scenario = &name[..end];
        let scenario = scenario
            .strip_prefix("server-")
            .unwrap_or(scenario)
            .to_owned();
        let checks: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(checks).unwrap()).unwrap();
        out.insert(scenario, checks);
    }
    out
}

fn count(checks: &[Value], status: &str) -> usize {
    checks.iter().filter(|c| c["status"] == status).count()
}

/// Runs the suite's scenarios of `spec_version` against the token proxy on `proxy_port` and
/// holds them to the version's baseline and `must_pass`.
pub async fn run_suite(spec_version: &str, must_pass: &[&str], proxy_port: u16) {
    let dir = conformance_dir();
    let baseline_path = dir.join(format!("expected-failures-{spec_version}.yaml"));
    let expected = baseline(&baseline_path);
    for scenario in must_pass {
        for (entry, reason) in entries_of(&expected, scenario) {
            assert!(
                reason.starts_with("awaiting-merge:"),
                "{scenario} needs no fixture and must pass, but the baseline expects {entry} to fail: {reason}"
            );
        }
    }

    let out_dir = tempfile::tempdir().unwrap();
    let suite = Command::new(dir.join("node_modules/.bin/node"))
        .arg(dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js"))
        .args(["server", "--url"])
        .arg(format!("http://127.0.0.1:{proxy_port}/mcp"))
        // All the scenarios of the version, not only the default "active" set, which leaves
        // out the pending ones (caching, http-header-validation, server-sse-polling among them).
        .args(["--suite", "all", "--spec-version", spec_version])
        .arg("--expected-failures")
        .arg(&baseline_path)
        .arg("-o")
        .arg(out_dir.path())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let suite = tokio::time::timeout(Duration::from_secs(900), suite)
        .await
        .expect("the conformance suite did not finish in 15 minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&suite.stdout);
    let results = results(out_dir.path());

    // The table: every scenario the suite ran, whether it passed, and whether the baseline
    // expects it to fail.
    let mut table = format!("conformance, --spec-version {spec_version}:\n");
    for (scenario, checks) in &results {
        let clean = count(checks, "FAILURE") == 0 && count(checks, "WARNING") == 0;
        table.push_str(&format!(
            "  {} {scenario}: {} passed, {} failed, {} warnings{}\n",
            if clean { "pass" } else { "FAIL" },
            count(checks, "SUCCESS"),
            count(checks, "FAILURE"),
            count(checks, "WARNING"),
            if entries_of(&expected, scenario).next().is_some() {
                " (expected: in the baseline)"
            } else {
                ""
            }
        ));
        for check in checks
            .iter()
            .filter(|c| c["status"] == "FAILURE" || c["status"] == "WARNING")
        {
            let message = check["errorMessage"].as_str().unwrap_or_default();
            let message: String = message.chars().take(300).collect();
            table.push_str(&format!(
                "      {}: {message}\n",
                check["id"].as_str().unwrap_or("?")
            ));
        }
    }
    eprintln!("{table}");
    // The suite's verdict: stale entries and unexpected failures, after the expected ones.
    let verdict = [
        "Stale baseline entries",
        "Unexpected failures",
        "Expected failures",
    ]
    .iter()
    .find_map(|heading| stdout.find(heading))
    .map_or(stdout.as_ref(), |at| &stdout[at..]);
    assert!(
        suite.status.success(),
        "the conformance suite failed against its baseline {} (a new failure, or a stale entry \
         that now passes and must be removed):\n{verdict}\n{}",
        baseline_path.display(),
        String::from_utf8_lossy(&suite.stderr)
    );
    for scenario in must_pass {
        let checks = results
            .get(*scenario)
            .unwrap_or_else(|| panic!("the suite did not run {scenario}:\n{table}"));
        // An awaiting-merge entry is the only excuse, and the suite holds it to what it names.
        if entries_of(&expected, scenario).next().is_some() {
            continue;
        }
        assert!(
            count(checks, "SUCCESS") > 0
                && count(checks, "FAILURE") == 0
                && count(checks, "WARNING") == 0,
            "{scenario} must pass in full: {checks:#?}"
        );
    }
    for entry in expected.keys() {
        let (scenario, check) = entry.split_once(':').unwrap_or((entry, ""));
        let checks = results.get(scenario).unwrap_or_else(|| {
            panic!(
                "the baseline names {scenario}, which the suite no longer runs for {spec_version}"
            )
        });
        assert!(
            check.is_empty() || checks.iter().any(|c| c["id"] == check),
            "the baseline names {entry}, a check {scenario} no longer makes"
        );
    }
}
