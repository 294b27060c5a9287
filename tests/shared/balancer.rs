//! Three `smol-mcp-http` processes sharing one database behind HAProxy from Debian's packages
//! (scripts/balancer.sh, configured by scripts/balancer/haproxy.cfg): the official Python
//! client over both lifecycles (2025-11-25 sessions stick to the process that holds them;
//! 2026-07-28 requests go round-robin and are answered as one server), and the official
//! conformance suite through the balancer, held to the same baselines as one process.

use super::database::TestDatabase;
use crate::common::clients::{HttpServer, run_python};
use crate::common::conformance;
use crate::common::fake_serve::FakeServe;
use crate::common::real_serve::free_port;
use serde_json::{Value, json};
use std::time::Duration;

const TOKEN: &str = "balancer-token";

/// The processes, their database and the balancer in front of them; the balancer is stopped
/// when this goes (the processes are killed with their handles).
pub struct Cluster {
    pub db: TestDatabase,
    pub fake: FakeServe,
    pub servers: Vec<HttpServer>,
    pub port: u16,
    balancer_dir: tempfile::TempDir,
    _runtime_dirs: Vec<tempfile::TempDir>,
}

impl Cluster {
    pub async fn start(processes: usize, token: &str, extra: &[(&str, &str)]) -> Cluster {
        Cluster::start_at(free_port(), processes, token, extra).await
    }

    /// The same with the balancer on `port`, known before the processes start (their
    /// `authResource` is the balancer's URL).
    pub async fn start_at(
        port: u16,
        processes: usize,
        token: &str,
        extra: &[(&str, &str)],
    ) -> Cluster {
        let (db, fake, runtime_dirs, servers) =
            super::replicas::processes(processes, token, extra).await;
        let balancer_dir = tempfile::tempdir().unwrap();
        let mut args = vec!["up".to_owned(), port.to_string()];
        args.extend(servers.iter().map(|s| s.port.to_string()));
        crate::common::balancer::run(balancer_dir.path(), &args);
        Cluster {
            db,
            fake,
            servers,
            port,
            balancer_dir,
            _runtime_dirs: runtime_dirs,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// The processes (their instance ids) that recorded a run whose command contains `marker`.
    pub async fn processes_that_ran(&self, marker: &str) -> Vec<String> {
        self.db
            .client()
            .await
            .query(
                "SELECT DISTINCT owner FROM runs WHERE command LIKE '%' || $1 || '%'",
                &[&marker],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        crate::common::balancer::run(self.balancer_dir.path(), &["down".to_owned()]);
    }
}

fn plan(cluster: &Cluster, mode: &str, machine: &str) -> Value {
    let mut calls =
        vec![json!({"tool": "create-machine", "args": {"name": machine, "image": "alpine"}})];
    for i in 0..6 {
        calls.push(json!({"tool": "run-command",
            "args": {"name": machine, "command": format!("echo {machine}-{i}")}}));
    }
    calls.push(json!({"tool": "list-machines", "args": {"name": machine}}));
    calls.push(json!({"tool": "delete-machine", "args": {"name": machine}}));
    json!({"url": cluster.url(), "token": TOKEN, "mode": mode, "calls": calls})
}

fn all_answered(report: &Value) {
    let calls = report["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 9, "{report}");
    for call in calls {
        assert_eq!(call["isError"], false, "{report}");
    }
    for (i, call) in calls[1..7].iter().enumerate() {
        assert!(
            call["structured"]["stdout"]
                .as_str()
                .unwrap()
                .ends_with(&format!("-{i}\n")),
            "{report}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_client_is_served_through_the_balancer_on_both_lifecycles() {
    let cluster = Cluster::start(3, TOKEN, &[]).await;

    // A 2025-11-25 session lives in one process: every request of it lands there.
    let report = run_python("tool_plan.py", &plan(&cluster, "legacy", "sticky-box")).await;
    all_answered(&report);
    let ran = cluster.processes_that_ran("sticky-box-").await;
    assert_eq!(ran.len(), 1, "one session, one process: {ran:?}");

    // 2026-07-28 requests go round-robin and are answered as one server.
    let report = run_python("tool_plan.py", &plan(&cluster, "auto", "spread-box")).await;
    all_answered(&report);
    let ran = cluster.processes_that_ran("spread-box-").await;
    assert!(ran.len() >= 2, "round-robin over the processes: {ran:?}");
    assert!(cluster.fake.has_no_machines());
}

async fn conformance_through_the_balancer(spec_version: &str, must_pass: &[&str]) {
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_port = proxy.local_addr().unwrap().port();
    let origins = format!("http://127.0.0.1:{proxy_port},http://localhost:{proxy_port}");
    let cluster = Cluster::start(
        3,
        conformance::TOKEN,
        &[
            ("SMOL_MCP_HTTP_ALLOWED_ORIGINS", origins.as_str()),
            ("SMOL_MCP_LOG", "error"),
        ],
    )
    .await;
    conformance::token_proxy(
        proxy,
        std::net::SocketAddr::from(([127, 0, 0, 1], cluster.port)),
    );
    conformance::run_suite(spec_version, must_pass, proxy_port).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suite_passes_through_the_balancer_on_the_session_lifecycle() {
    conformance_through_the_balancer("2025-11-25", conformance::MUST_PASS_2025_11_25).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suite_passes_through_the_balancer_on_the_stateless_lifecycle() {
    conformance_through_the_balancer("2026-07-28", conformance::MUST_PASS_2026_07_28).await;
}

/// One 2026-07-28 tools/call through the balancer; `None` when the request itself failed (the
/// process answering it was killed under it).
async fn sessionless_call(url: &str, tool: &str, arguments: Value) -> Option<Value> {
    use crate::common::sessionless;
    let body = sessionless::body(1, tool, arguments, "killed-mid-call");
    let http = reqwest::Client::new();
    let response = sessionless::post(&http, url, TOKEN, tool, &body)
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    let answer = sessionless::answer_in(&response.text().await.ok()?)?;
    Some(answer["result"].clone())
}

/// One of three processes behind the balancer killed outright while calls are in flight on
/// every process (commands in a machine, creates of new machines, a job running): the calls on
/// the others answer, the one on the killed process fails at the client (nothing answers it
/// wrongly), the job and the sessionless machines go on through the survivors, and once the
/// survivors stop no machine is left on the engine.
#[tokio::test(flavor = "multi_thread")]
async fn a_process_killed_with_calls_in_flight_leaves_nothing_behind() {
    let mut cluster = Cluster::start(3, TOKEN, &[("SMOL_MCP_JOB_POLL_MILLIS", "100")]).await;
    let url = cluster.url();
    let made = sessionless_call(&url, "create-machine", json!({"image": "alpine"}))
        .await
        .unwrap();
    let machine = made["structuredContent"]["machine"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("{made}"))
        .to_owned();
    let started = sessionless_call(
        &url,
        "run-command",
        json!({"name": machine, "background": true,
               "command": "for i in 1 2 3 4 5 6; do echo \"line $i\"; sleep 0.5; done"}),
    )
    .await
    .unwrap();
    let job = started["structuredContent"]["job"]
        .as_str()
        .unwrap_or_else(|| panic!("{started}"))
        .to_owned();

    // Six calls at once, two a process by round-robin: three commands of two seconds and three
    // creates the engine takes two seconds to answer.
    cluster.fake.state.lock().unwrap().create_delay = Some(Duration::from_secs(2));
    let mut in_flight = Vec::new();
    for i in 0..3 {
        let (command_url, machine) = (url.clone(), machine.clone());
        in_flight.push(tokio::spawn(async move {
            sessionless_call(
                &command_url,
                "run-command",
                json!({"name": machine, "command": format!("sleep 2; echo call-{i}")}),
            )
            .await
        }));
        let url = url.clone();
        in_flight.push(tokio::spawn(async move {
            sessionless_call(&url, "create-machine", json!({"image": "alpine"})).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let killed = &mut cluster.servers[0];
    killed.child.start_kill().unwrap();
    killed.child.wait().await.unwrap();

    let mut answered = 0;
    let mut failed = 0;
    for call in in_flight {
        match call.await.unwrap() {
            Some(result) => {
                assert_eq!(
                    result["isError"], false,
                    "an answer is a right one: {result}"
                );
                answered += 1;
            }
            None => failed += 1,
        }
    }
    assert!(failed >= 1, "the killed process had calls in flight");
    assert!(answered >= 3, "the survivors answered theirs: {answered}");
    cluster.fake.state.lock().unwrap().create_delay = None;

    // The job is read to its end through the survivors (taken over if its watcher died).
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    loop {
        if let Some(report) = sessionless_call(&url, "job-output", json!({"job": job})).await
            && report["isError"] == false
            && report["structuredContent"]["state"] == "exited"
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the job was not seen to its end"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The sessionless machine still answers through the survivors.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(ran) = sessionless_call(
            &url,
            "run-command",
            json!({"name": machine, "command": "echo still-here"}),
        )
        .await
            && ran["structuredContent"]["stdout"] == "still-here\n"
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the machine stopped answering"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The survivors stop as a supervisor stops them, after their watch has seen the dead
    // process (its machines adopted, its orphans swept): nothing is left on the engine.
    tokio::time::sleep(Duration::from_secs(6)).await;
    for server in &mut cluster.servers[1..] {
        server.terminate().await;
    }
    let left: Vec<String> = cluster.fake.machine_names();
    assert!(left.is_empty(), "machines leaked: {left:?}");
}
