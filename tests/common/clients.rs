//! The real MCP clients the end-to-end tests drive the server with (the pinned Python `mcp` in
//! `.venv`, the TypeScript SDK in `tests/clients/node_modules`, both installed by
//! scripts/test.sh), and `smol-mcp-http` as a process on a free loopback port.

use super::real_serve::{free_port, listening};
use super::stdio::server_env;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

pub const HTTP_SERVER: &str = env!("CARGO_BIN_EXE_smol-mcp-http");

/// How long a client script may take before the test calls it hung.
const CLIENT_LIMIT: Duration = Duration::from_secs(120);

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// tests/clients, with the TypeScript SDK installed in it.
pub fn clients_dir() -> PathBuf {
    let dir = repo().join("tests/clients");
    assert!(
        dir.join("node_modules/@modelcontextprotocol/sdk").exists(),
        "the TypeScript clients are not installed: run scripts/test.sh"
    );
    dir
}

/// The Python with the pinned `mcp` package: `SMOL_MCP_PYTHON` where it is set, else .venv's.
pub fn python() -> PathBuf {
    let python = std::env::var_os("SMOL_MCP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".venv/bin/python"));
    assert!(
        python.exists(),
        "no Python MCP client at {}: run scripts/test.sh",
        python.display()
    );
    python
}

/// An environment as the JSON object the client scripts pass on to the server they spawn.
pub fn env_object(env: Vec<(String, String)>) -> Value {
    Value::Object(
        env.into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect(),
    )
}

/// Runs a Python client script from tests/clients with `plan` as its one argument, and answers
/// the JSON it prints.
pub async fn run_python(script: &str, plan: &Value) -> Value {
    let mut command = Command::new(python());
    command
        .arg(clients_dir().join(script))
        .arg(plan.to_string());
    run(command, script).await
}

/// The same for a Node script (the TypeScript SDK).
pub async fn run_node(script: &str, plan: &Value) -> Value {
    let mut command = Command::new("node");
    command
        .arg(clients_dir().join(script))
        .arg(plan.to_string());
    run(command, script).await
}

/// A Python or Node client script with a limit of its own (a session on a real guest boots
/// machines and takes minutes).
pub async fn run_client_for(program: &str, script: &str, plan: &Value, limit: Duration) -> Value {
    let program = if program == "python" {
        python()
    } else {
        PathBuf::from(program)
    };
    let mut command = Command::new(program);
    command
        .arg(clients_dir().join(script))
        .arg(plan.to_string());
    run_for(command, script, limit).await
}

async fn run(command: Command, script: &str) -> Value {
    run_for(command, script, CLIENT_LIMIT).await
}

async fn run_for(mut command: Command, script: &str, limit: Duration) -> Value {
    let out = tokio::time::timeout(limit, command.kill_on_drop(true).output())
        .await
        .unwrap_or_else(|_| panic!("the client {script} hung"))
        .unwrap();
    assert!(
        out.status.success(),
        "the client {script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the client {script} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `smol-mcp-http` on a free loopback port, killed when dropped.
pub struct HttpServer {
    pub child: Child,
    pub url: String,
    pub port: u16,
}

impl HttpServer {
    /// Starts the server with the test environment for `runtime_dir` (`server_env`), the bearer
    /// `token` and `extra`, and waits until it listens.
    pub async fn spawn(runtime_dir: &Path, token: &str, extra: &[(&str, &str)]) -> HttpServer {
        HttpServer::spawn_with(runtime_dir, token, extra, |_| {}).await
    }

    /// The server whose one fleet is the fake `cloud`, with `extra` settings.
    pub async fn on_fake_cloud(
        runtime_dir: &Path,
        token: &str,
        cloud: &super::fake_cloud::FakeCloud,
        extra: &[(&str, &str)],
    ) -> HttpServer {
        let url = cloud.url();
        HttpServer::spawn(
            runtime_dir,
            token,
            &super::fake_cloud::only_fleet(&url, extra),
        )
        .await
    }

    /// The same, with `adjust` applied to the command last: to unset a variable of the test
    /// environment, or to take the server's stderr.
    pub async fn spawn_with(
        runtime_dir: &Path,
        token: &str,
        extra: &[(&str, &str)],
        adjust: impl Fn(&mut Command),
    ) -> HttpServer {
        // A port free when asked may be another listener's by the time the server binds it:
        // then the server exits (or, were the check a connect, another server would answer);
        // the server is taken once it is itself seen listening, with a new port up to 5 times.
        for _ in 0..5 {
            let port = free_port();
            let port_text = port.to_string();
            let mut vars = vec![
                ("SMOL_MCP_AUTH_TOKEN", token),
                ("SMOL_MCP_HTTP_PORT", port_text.as_str()),
            ];
            vars.extend_from_slice(extra);
            let mut command = Command::new(HTTP_SERVER);
            command
                .env_clear()
                .envs(server_env(runtime_dir, &vars))
                .stdin(Stdio::null())
                .kill_on_drop(true);
            adjust(&mut command);
            let mut child = command.spawn().unwrap();
            let pid = child.id().unwrap();
            let start = Instant::now();
            loop {
                if listening(pid, port) {
                    return HttpServer {
                        child,
                        url: format!("http://127.0.0.1:{port}/mcp"),
                        port,
                    };
                }
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "the HTTP server did not listen"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        panic!("the HTTP server exited five times before it listened (its port taken each time?)")
    }
}

impl HttpServer {
    /// Stops the server as a supervisor does (SIGTERM) and waits for its clean exit.
    pub async fn terminate(&mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id().unwrap()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the server did not stop within 30 s of SIGTERM")
            .unwrap();
        assert!(status.success(), "{status}");
    }
}

/// One 2026-07-28 request to `server` over HTTP, raw (id 1): `_meta` names the version, the
/// client's `capabilities` and a client name; the answer is the JSON-RPC message with id 1,
/// from a JSON body or an SSE stream.
#[allow(dead_code)]
pub async fn stateless_request(
    server: &HttpServer,
    token: &str,
    method: &str,
    capabilities: serde_json::Value,
    params: serde_json::Value,
) -> serde_json::Value {
    stateless_request_to(&server.url, token, method, capabilities, params).await
}

/// A 2026-07-28 request to `server` as `token`'s user, declaring the tasks extension.
pub async fn task_request(
    server: &HttpServer,
    token: &str,
    method: &str,
    params: serde_json::Value,
) -> serde_json::Value {
    let tasks = serde_json::json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    stateless_request(server, token, method, tasks, params).await
}

/// The same to the MCP endpoint at `url` (a balancer's, say).
#[allow(dead_code)]
pub async fn stateless_request_to(
    url: &str,
    token: &str,
    method: &str,
    capabilities: serde_json::Value,
    params: serde_json::Value,
) -> serde_json::Value {
    let mut params = params;
    params["_meta"] = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "raw-stateless", "version": "0"},
    });
    let name = params["name"]
        .as_str()
        .or(params["taskId"].as_str())
        .or(params["uri"].as_str())
        .unwrap_or("")
        .to_owned();
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let http = reqwest::Client::new();
    let reply = super::sessionless::request(&http, url, token, (method, &name), &body)
        .send()
        .await;
    let text = reply.unwrap().text().await.unwrap();
    super::sessionless::answer_in(&text).unwrap_or_else(|| panic!("no answer in {text}"))
}
