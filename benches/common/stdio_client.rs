//! The stdio server as a child process, spoken to with one JSON-RPC message a line: the
//! benchmarks' client, which times and measures where the tests' (tests/common/stdio.rs)
//! checks as it goes.

use serde_json::{Value, json};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

pub struct Client {
    pub child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    next_id: u64,
}

/// Now, in microseconds since the epoch: when a message arrived, comparable across processes.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

impl Client {
    /// Spawns `binary` with only `env` and completes the handshake; answers the time from the
    /// spawn to the initialize answer.
    pub async fn spawn(
        binary: &str,
        env: &[(String, String)],
        stderr: Stdio,
    ) -> (Client, Duration) {
        let start = Instant::now();
        let (child, stdin, lines) = super::stdio::spawn_speaking(
            Command::new(binary).env_clear().envs(env.iter().cloned()),
            stderr,
        );
        let mut client = Client {
            child,
            stdin,
            lines,
            next_id: 0,
        };
        let init = json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}});
        client.request("initialize", init).await;
        let took = start.elapsed();
        client
            .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        (client, took)
    }

    pub async fn send(&mut self, message: Value) {
        self.stdin
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// The next message and when it arrived (µs since the epoch).
    pub async fn next(&mut self) -> (Value, i64) {
        let line = tokio::time::timeout(Duration::from_secs(900), self.lines.next_line())
            .await
            .expect("no message from the server in 900 s")
            .unwrap()
            .expect("the server closed stdout");
        let at = now_us();
        (serde_json::from_str(&line).unwrap(), at)
    }

    /// A new request id.
    pub fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// The answer to `method`, messages before it passed over.
    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.id();
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        loop {
            let (v, _) = self.next().await;
            if v["id"] == json!(id) {
                return v;
            }
        }
    }

    /// The whole JSON-RPC answer to a tool call.
    pub async fn tool(&mut self, name: &str, args: Value) -> Value {
        self.request("tools/call", json!({"name": name, "arguments": args}))
            .await
    }

    /// A tool call's result (`isError` and all), panicking only on a JSON-RPC error.
    pub async fn tool_result(&mut self, name: &str, args: Value) -> Value {
        let answer = self.tool(name, args).await;
        assert!(answer.get("error").is_none(), "{name}: {answer}");
        answer["result"].clone()
    }

    /// The server's peak resident memory so far (VmHWM), KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        super::status_kib(self.child.id().unwrap(), "VmHWM:")
    }

    /// Closes stdin (the end of the session) and waits up to `wait` for the server to exit.
    pub async fn close(mut self, wait: Duration) {
        drop(self.stdin);
        let _ = tokio::time::timeout(wait, self.child.wait()).await;
    }
}
