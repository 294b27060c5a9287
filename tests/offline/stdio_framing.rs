//! Bad JSON-RPC on stdio: the real `smol-mcp` binary over pipes, against the fake serve. Every
//! malformed line gets its JSON-RPC error (rmcp alone drops most of them without a word, see
//! `src/protocol/server/stdio.rs`), and the server goes on serving the next line.

use crate::common::fake_serve::FakeServe;
use crate::common::offered_without_settings;
use crate::common::stdio::{StdioServer, server_env};
use serde_json::{Value, json};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);
const MIB: usize = 1024 * 1024;

fn nested(depth: usize) -> String {
    // `depth` levels in all: the message object, its params object, and arrays inside.
    format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"x":{}{}}}}}"#,
        "[".repeat(depth - 2),
        "]".repeat(depth - 2)
    )
}

/// A line of exactly `length` bytes (its newline not counted) that is valid JSON-RPC up to its
/// size: a `method` call with one long string parameter.
fn long_line(id: u64, method: &str, length: usize) -> Vec<u8> {
    let head = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{"pad":""#);
    let tail = r#""}}"#;
    let mut line = head.into_bytes();
    line.resize(length - tail.len(), b'a');
    line.extend_from_slice(tail.as_bytes());
    assert_eq!(line.len(), length);
    line
}

fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status")
}

async fn start(fake: &FakeServe, rt: &tempfile::TempDir) -> StdioServer {
    StdioServer::spawn(server_env(rt.path(), &[("SMOL_LOCAL_URL", &fake.url())])).await
}

async fn assert_still_serving(server: &mut StdioServer, id: u64) {
    let listed = server.request(id, "tools/list", json!({})).await;
    assert_eq!(
        listed["result"]["tools"].as_array().map(Vec::len),
        Some(offered_without_settings()),
        "{listed}"
    );
}

#[tokio::test]
async fn every_bad_line_gets_its_error_and_the_next_line_is_served() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let mut server = start(&fake, &rt).await;
    let cases: Vec<(&str, Vec<u8>, i64, Value)> = vec![
        ("garbage", b"garbage".to_vec(), -32700, Value::Null),
        (
            "truncated",
            br#"{"jsonrpc":"2.0","id":11,"method":"tools/list""#.to_vec(),
            -32700,
            Value::Null,
        ),
        (
            "invalid UTF-8",
            b"{\"jsonrpc\":\"2.0\",\"id\":12,\"method\":\"ping\",\"params\":{\"s\":\"\xff\xfe\"}}"
                .to_vec(),
            -32700,
            Value::Null,
        ),
        (
            "lone surrogate",
            br#"{"jsonrpc":"2.0","id":13,"method":"ping","params":{"s":"\ud800"}}"#.to_vec(),
            -32700,
            Value::Null,
        ),
        (
            "NaN",
            br#"{"jsonrpc":"2.0","id":14,"method":"ping","params":{"n":NaN}}"#.to_vec(),
            -32700,
            Value::Null,
        ),
        (
            "129 levels",
            nested(129).into_bytes(),
            -32700,
            Value::Null,
        ),
        (
            "batch",
            br#"[{"jsonrpc":"2.0","id":15,"method":"ping"}]"#.to_vec(),
            -32600,
            Value::Null,
        ),
        ("empty batch", b"[]".to_vec(), -32600, Value::Null),
        ("a number", b"42".to_vec(), -32600, Value::Null),
        (
            "params an array",
            br#"{"jsonrpc":"2.0","id":16,"method":"tools/list","params":[]}"#.to_vec(),
            -32600,
            json!(16),
        ),
        (
            "params a string",
            br#"{"jsonrpc":"2.0","id":"s-17","method":"ping","params":"x"}"#.to_vec(),
            -32600,
            json!("s-17"),
        ),
        (
            "arguments an array",
            br#"{"jsonrpc":"2.0","id":18,"method":"tools/call","params":{"name":"list-machines","arguments":[]}}"#.to_vec(),
            -32602,
            json!(18),
        ),
        (
            "tools/call without params",
            br#"{"jsonrpc":"2.0","id":19,"method":"tools/call"}"#.to_vec(),
            -32602,
            json!(19),
        ),
        (
            "tools/call with a numeric name",
            br#"{"jsonrpc":"2.0","id":20,"method":"tools/call","params":{"name":7}}"#.to_vec(),
            -32602,
            json!(20),
        ),
        (
            "wrong jsonrpc version",
            br#"{"jsonrpc":"1.0","id":21,"method":"ping"}"#.to_vec(),
            -32600,
            json!(21),
        ),
        (
            "id a boolean",
            br#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#.to_vec(),
            -32600,
            Value::Null,
        ),
        (
            "id a fraction",
            br#"{"jsonrpc":"2.0","id":2.5,"method":"ping"}"#.to_vec(),
            -32600,
            json!(2.5),
        ),
        (
            "method a number",
            br#"{"jsonrpc":"2.0","method":1,"params":"bar"}"#.to_vec(),
            -32600,
            Value::Null,
        ),
        (
            "neither request nor response",
            br#"{"jsonrpc":"2.0","id":22}"#.to_vec(),
            -32600,
            json!(22),
        ),
        (
            "initialize params of the wrong shape",
            br#"{"jsonrpc":"2.0","id":23,"method":"initialize","params":{"capabilities":[]}}"#
                .to_vec(),
            -32602,
            json!(23),
        ),
        (
            "resources/read with a numeric uri",
            br#"{"jsonrpc":"2.0","id":30,"method":"resources/read","params":{"uri":7}}"#.to_vec(),
            -32602,
            json!(30),
        ),
        (
            "resources/read without a uri",
            br#"{"jsonrpc":"2.0","id":31,"method":"resources/read","params":{}}"#.to_vec(),
            -32602,
            json!(31),
        ),
        (
            "logging/setLevel with an unknown level",
            br#"{"jsonrpc":"2.0","id":32,"method":"logging/setLevel","params":{"level":"loud"}}"#
                .to_vec(),
            -32602,
            json!(32),
        ),
        (
            "completion/complete without a ref",
            br#"{"jsonrpc":"2.0","id":33,"method":"completion/complete","params":{}}"#.to_vec(),
            -32602,
            json!(33),
        ),
        // Forwarded: rmcp's own answer, with the id.
        (
            "unknown method",
            br#"{"jsonrpc":"2.0","id":24,"method":"no/such"}"#.to_vec(),
            -32601,
            json!(24),
        ),
    ];
    for (name, mut line, code, id) in cases {
        line.push(b'\n');
        server.send_raw(&line).await;
        let answer = server.next_message(WAIT).await;
        assert_eq!(answer["jsonrpc"], "2.0", "{name}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{name}: {answer}");
        assert_eq!(answer["id"], id, "{name}: {answer}");
    }

    // Malformed notifications are not answered (JSON-RPC 2.0), and do not stop the server: the
    // next message out is the answer to the ping after them.
    for line in [
        r#"{"jsonrpc":"2.0","method":"notifications/initialized","params":5}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":[]}}"#,
        r#"{"jsonrpc":"1.0","method":"notifications/progress"}"#,
        "",
        "   ",
    ] {
        server.send_raw(format!("{line}\n").as_bytes()).await;
    }
    server
        .send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":25,\"method\":\"ping\"}\r\n")
        .await;
    let pong = server.next_message(WAIT).await;
    assert_eq!(pong, json!({"jsonrpc": "2.0", "id": 25, "result": {}}));

    assert_still_serving(&mut server, 26).await;
    server.close_stdin();
    let status = tokio::time::timeout(WAIT, server.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn a_line_over_16_mib_is_refused_whole_with_bounded_memory() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let mut server = start(&fake, &rt).await;
    let pid = server.child.id().unwrap();

    // One byte too many (the newline not counted): refused, with the id read from its start.
    let mut line = long_line(30, "tools/call", 16 * MIB + 1);
    line.push(b'\n');
    server.send_raw(&line).await;
    let answer = server.next_message(WAIT).await;
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    assert_eq!(answer["id"], 30, "{answer}");
    let hwm = vm_hwm_kib(pid);
    eprintln!("VmHWM after a 16 MiB + 1 line: {hwm} kB");
    assert!(hwm < 64 * 1024, "VmHWM {hwm} kB");

    // A line with no id in reach is refused with id null, and a longer one still without
    // buffering it.
    let mut line = vec![b' '; 40 * MIB];
    line.push(b'\n');
    server.send_raw(&line).await;
    let answer = server.next_message(WAIT).await;
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    assert_eq!(answer["id"], Value::Null, "{answer}");
    let hwm = vm_hwm_kib(pid);
    assert!(hwm < 64 * 1024, "VmHWM {hwm} kB after 40 MiB");
    assert_still_serving(&mut server, 31).await;

    // The longest line accepted, newline included, is rmcp's own limit: it reaches rmcp.
    let mut line = long_line(32, "ping", 16 * MIB - 1);
    line.push(b'\n');
    server.send_raw(&line).await;
    let pong = server.next_message(WAIT).await;
    assert_eq!(pong, json!({"jsonrpc": "2.0", "id": 32, "result": {}}));
    assert_still_serving(&mut server, 33).await;
}
