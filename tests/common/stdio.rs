//! The stdio server binary as a child process, spoken to with raw JSON-RPC lines.

use serde_json::{Value, json};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

pub const SERVER: &str = env!("CARGO_BIN_EXE_smol-mcp");

/// The environment the server runs with in tests: only what is named here, so a developer's
/// own SMOL_CLOUD_TOKEN or config file never leaks into a test.
pub fn server_env(runtime_dir: &std::path::Path, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
        ("HOME".into(), runtime_dir.display().to_string()),
        (
            "XDG_CONFIG_HOME".into(),
            runtime_dir.join("config").display().to_string(),
        ),
        (
            "SMOL_MCP_RUNTIME_DIR".into(),
            runtime_dir.join("rt").display().to_string(),
        ),
        ("SMOL_MCP_READY_TIMEOUT_SECS".into(), "5".into()),
        ("SMOL_MCP_LOG".into(), "warn".into()),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

/// Starts `command` with stdin and stdout piped to the test, killed when its handle is dropped.
pub fn spawn_piped(command: &mut Command, stderr: Stdio) -> Child {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Starts `command` as a process spoken to one line at a time: the child, its stdin, and its
/// stdout read by line.
pub fn spawn_speaking(
    command: &mut Command,
    stderr: Stdio,
) -> (Child, ChildStdin, Lines<BufReader<ChildStdout>>) {
    let mut child = spawn_piped(command, stderr);
    let stdin = child.stdin.take().unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, stdin, lines)
}

/// Runs the server with `args` and `env` to its exit with stdin held open, so that it has to
/// end without waiting for the client to go away; fails the test after 10 s.
pub async fn exit_with_stdin_open(
    args: &[&str],
    env: Vec<(String, String)>,
) -> std::process::Output {
    let mut child = spawn_piped(
        Command::new(SERVER).args(args).env_clear().envs(env),
        Stdio::piped(),
    );
    let _stdin = child.stdin.take();
    tokio::time::timeout(std::time::Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("the server exits without waiting on stdin")
        .unwrap()
}

pub struct StdioServer {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    /// Every message `request` has read, answers and notifications alike.
    seen: Vec<Value>,
}

impl StdioServer {
    pub async fn spawn(env: Vec<(String, String)>) -> StdioServer {
        StdioServer::spawn_uninitialized(env)
            .await
            .initialized()
            .await
    }

    /// The session opened: initialize answered by smol-mcp, and initialized sent.
    async fn initialized(mut self) -> StdioServer {
        let init = self
            .request(
                0,
                "initialize",
                json!({
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "smol-mcp-tests", "version": "0"}
                }),
            )
            .await;
        assert_eq!(init["result"]["serverInfo"]["name"], "smol-mcp");
        self.notify("notifications/initialized").await;
        self
    }

    /// The server with no session opened: for 2026-07-28 requests, each carrying its own
    /// `_meta`.
    pub async fn spawn_uninitialized(env: Vec<(String, String)>) -> StdioServer {
        StdioServer::spawn_uninitialized_with(env, Stdio::inherit()).await
    }

    /// The server initialized, its stderr (its log) written to `path`.
    pub async fn spawn_with_stderr(
        env: Vec<(String, String)>,
        path: &std::path::Path,
    ) -> StdioServer {
        let log = std::fs::File::create(path).unwrap();
        StdioServer::spawn_uninitialized_with(env, Stdio::from(log))
            .await
            .initialized()
            .await
    }

    async fn spawn_uninitialized_with(env: Vec<(String, String)>, stderr: Stdio) -> StdioServer {
        let (child, stdin, lines) =
            spawn_speaking(Command::new(SERVER).env_clear().envs(env), stderr);
        StdioServer {
            child,
            stdin: Some(stdin),
            lines,
            seen: Vec::new(),
        }
    }

    async fn send(&mut self, message: Value) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
    }

    /// Writes bytes to the server's stdin as they are (a test adds the newline).
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).await.unwrap();
        stdin.flush().await.unwrap();
    }

    /// The next message the server writes, failing the test after `wait` without one.
    pub async fn next_message(&mut self, wait: std::time::Duration) -> Value {
        let line = tokio::time::timeout(wait, self.lines.next_line())
            .await
            .expect("no answer in time")
            .unwrap()
            .expect("the server closed stdout");
        serde_json::from_str(&line).unwrap()
    }

    /// The next message, or None if none comes within `wait`.
    pub async fn maybe_message(&mut self, wait: std::time::Duration) -> Option<Value> {
        let line = tokio::time::timeout(wait, self.lines.next_line())
            .await
            .ok()?
            .unwrap()
            .expect("the server closed stdout");
        Some(serde_json::from_str(&line).unwrap())
    }

    pub async fn notify(&mut self, method: &str) {
        self.send(json!({"jsonrpc": "2.0", "method": method})).await;
    }

    pub async fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        loop {
            let line = self
                .lines
                .next_line()
                .await
                .unwrap()
                .expect("the server closed stdout");
            let message: Value = serde_json::from_str(&line).unwrap();
            self.seen.push(message.clone());
            if message["id"] == json!(id) {
                return message;
            }
        }
    }

    /// Calls a tool and returns its structured result, failing the test on a tool error.
    pub async fn tool(&mut self, id: u64, name: &str, args: Value) -> Value {
        let answer = self
            .request(id, "tools/call", json!({"name": name, "arguments": args}))
            .await;
        let result = &answer["result"];
        assert_eq!(result["isError"], false, "{name}: {answer}");
        result["structuredContent"].clone()
    }

    /// Every message `request` has read so far.
    pub fn messages_so_far(&self) -> Vec<Value> {
        self.seen.clone()
    }

    /// Closes stdin, as a client does when it goes away.
    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }
}
