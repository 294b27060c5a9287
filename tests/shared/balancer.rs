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

const TOKEN: &str = "balancer-token";

/// The processes, their database and the balancer in front of them; the balancer is stopped
/// when this goes (the processes are killed with their handles).
pub struct Cluster {
    pub db: TestDatabase,
    pub fake: FakeServe,
    _servers: Vec<HttpServer>,
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
        let db = TestDatabase::new().await;
        let fake = FakeServe::start_guest_shell().await;
        let url = fake.url();
        let mut vars = vec![
            ("SMOL_LOCAL_URL", url.as_str()),
            ("SMOL_MCP_STORE_URL", db.url.as_str()),
        ];
        vars.extend_from_slice(extra);
        let mut servers = Vec::new();
        let mut runtime_dirs = Vec::new();
        for _ in 0..processes {
            let rt = tempfile::tempdir().unwrap();
            servers.push(HttpServer::spawn(rt.path(), token, &vars).await);
            runtime_dirs.push(rt);
        }
        let balancer_dir = tempfile::tempdir().unwrap();
        let mut args = vec!["up".to_owned(), port.to_string()];
        args.extend(servers.iter().map(|s| s.port.to_string()));
        crate::common::balancer::run(balancer_dir.path(), &args);
        Cluster {
            db,
            fake,
            _servers: servers,
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
    let report = run_python("http_plan.py", &plan(&cluster, "legacy", "sticky-box")).await;
    all_answered(&report);
    let ran = cluster.processes_that_ran("sticky-box-").await;
    assert_eq!(ran.len(), 1, "one session, one process: {ran:?}");

    // 2026-07-28 requests go round-robin and are answered as one server.
    let report = run_python("http_plan.py", &plan(&cluster, "auto", "spread-box")).await;
    all_answered(&report);
    let ran = cluster.processes_that_ran("spread-box-").await;
    assert!(ran.len() >= 2, "round-robin over the processes: {ran:?}");
    assert!(cluster.fake.state.lock().unwrap().machines.is_empty());
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
