//! The stdio server as a process: driven by the official Python MCP client (pinned in
//! tests/clients/requirements.txt, installed by scripts/test.sh), and by raw JSON-RPC to check
//! what happens when a client goes away or the process is killed.

use crate::common::clients::{env_object, run_python};
use crate::common::fake_serve::FakeServe;
use crate::common::real_serve::RealServe;
use crate::common::stdio::{SERVER, StdioServer, exit_with_stdin_open, server_env, spawn_speaking};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Runs a plan through the Python client and returns its report.
async fn python_plan(env: Vec<(String, String)>, calls: Value) -> Value {
    let plan = json!({"server": SERVER, "env": env_object(env), "calls": calls});
    run_python("tool_plan.py", &plan).await
}

#[tokio::test]
async fn python_client_lists_the_tools_and_drives_the_real_serve_control_plane() {
    let serve = RealServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let url = format!(
        "unix://{}",
        match &serve.endpoint {
            smol_mcp::fleet::transport::LocalEndpoint::Unix(p) => p.display().to_string(),
            _ => unreachable!(),
        }
    );
    let env = server_env(rt.path(), &[("SMOL_LOCAL_URL", &url)]);
    let report = python_plan(
        env,
        json!([
            {"tool": "list-machines"},
            // Must boot: fails on hosts where guests cannot boot (or cannot pull), and leaves nothing.
            {"tool": "create-machine", "args": {"image": "alpine", "cpus": 1, "memoryMb": 256}},
            {"tool": "list-machines"},
            // A named machine is left for inspection when its start fails.
            {"tool": "create-machine", "args": {"image": "alpine", "name": "e2e-kept", "cpus": 1, "memoryMb": 256}},
            {"tool": "list-machines"},
            {"tool": "list-machines", "args": {"name": "e2e-kept"}},
            {"tool": "stop-machine", "args": {"name": "e2e-kept"}},
            {"tool": "delete-machine", "args": {"name": "e2e-kept"}},
            {"tool": "list-machines", "args": {"name": "e2e-kept"}},
            {"tool": "list-machines"}
        ]),
    )
    .await;
    assert_eq!(report["server"], "smol-mcp");
    assert_eq!(
        report["tools"].as_array().unwrap().len(),
        crate::common::offered_without_settings()
    );
    let calls = report["calls"].as_array().unwrap();
    assert_eq!(calls[0]["structured"]["machines"], json!([]));
    let failed = &calls[1];
    if failed["isError"] == true {
        let text = failed["text"].as_str().unwrap();
        assert!(
            text.contains("start machine mcp-"),
            "the error says what failed: {text}"
        );
        assert!(text.contains("was deleted again"), "{text}");
        assert_eq!(
            calls[2]["structured"]["machines"],
            json!([]),
            "nothing left behind"
        );
    } else {
        // A host where guests boot and the image can be pulled: the machine is ephemeral.
        assert_eq!(failed["structured"]["ready"], true);
    }
    let kept = &calls[3];
    if kept["isError"] == true {
        assert!(
            kept["text"]
                .as_str()
                .unwrap()
                .contains("e2e-kept was created and is left")
        );
    }
    let names: Vec<&str> = calls[4]["structured"]["machines"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert!(names.contains(&"e2e-kept"), "{names:?}");
    assert_eq!(calls[5]["structured"]["machines"][0]["name"], "e2e-kept");
    assert_eq!(calls[5]["structured"]["machines"][0]["image"], "alpine");
    assert_eq!(calls[6]["isError"], false, "{}", calls[6]["text"]);
    assert_eq!(calls[7]["structured"]["deleted"], "e2e-kept");
    assert!(calls[8]["text"].as_str().unwrap().starts_with("NOT_FOUND"));
    let after: Vec<&str> = calls[9]["structured"]["machines"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert!(!after.contains(&"e2e-kept"));
}

#[tokio::test]
async fn python_client_worked_flow_against_the_fake() {
    let fake = FakeServe::start().await;
    for line in ["booting", "ready"] {
        fake.push_log("mcp-flow", line);
    }
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let report = python_plan(
        server_env(rt.path(), &[("SMOL_LOCAL_URL", &url)]),
        json!([
            {"tool": "create-machine", "args": {"image": "python:3.12-alpine", "name": "mcp-flow"}},
            {"tool": "run-command", "args": {"name": "mcp-flow", "command": "exit 7"}},
            {"tool": "write-file", "args": {"name": "mcp-flow", "path": "/work/data.txt", "content": "abcdefghij"}},
            {"tool": "read-file", "args": {"name": "mcp-flow", "path": "/work/data.txt", "length": 4}},
            {"tool": "read-file", "args": {"name": "mcp-flow", "path": "/work/data.txt", "offset": 4, "length": 4}},
            {"tool": "read-file", "args": {"name": "mcp-flow", "path": "/work/data.txt", "offset": 8}},
            {"tool": "machine-logs", "args": {"name": "mcp-flow", "tail": 1}},
            {"tool": "delete-machine", "args": {"name": "mcp-flow"}}
        ]),
    )
    .await;
    let c = report["calls"].as_array().unwrap();
    for (i, call) in c.iter().enumerate() {
        assert_eq!(call["isError"], false, "call {i}: {}", call["text"]);
    }
    assert_eq!(c[0]["structured"]["ready"], true);
    assert_eq!(c[1]["structured"]["exitCode"], 7);
    assert_eq!(c[2]["structured"]["size"], 10);
    let pages: Vec<(&str, bool)> = c[3..6]
        .iter()
        .map(|p| {
            // The page is the second block; the plan joins blocks with a newline, and the
            // first block (the structured result as JSON) is one line.
            (
                p["text"].as_str().unwrap().split_once('\n').unwrap().1,
                p["structured"]["eof"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(pages, [("abcd", false), ("efgh", false), ("ij", true)]);
    assert_eq!(c[6]["structured"]["lines"], json!(["ready"]));
    assert_eq!(c[7]["structured"]["deleted"], "mcp-flow");
    assert!(fake.has_no_machines());
}

#[tokio::test]
async fn stdin_eof_deletes_the_session_s_machines_and_ends_the_process() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let mut server = StdioServer::spawn(server_env(rt.path(), &[("SMOL_LOCAL_URL", &url)])).await;
    let created = server
        .tool(1, "create-machine", json!({"image": "alpine"}))
        .await;
    server
        .tool(
            2,
            "create-machine",
            json!({"image": "alpine", "name": "stays"}),
        )
        .await;
    let ephemeral = created["machine"]["name"].as_str().unwrap().to_owned();
    assert_eq!(fake.state.lock().unwrap().machines.len(), 2);
    let start = Instant::now();
    server.close_stdin();
    let status = tokio::time::timeout(Duration::from_secs(10), server.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "ended promptly: {:?}",
        start.elapsed()
    );
    let machines: Vec<String> = fake.machine_names();
    assert_eq!(
        machines,
        ["stays"],
        "{ephemeral} was deleted, the named one stays"
    );
}

/// Waits until `done` holds of the fake's machines (the server's clean-up runs after the client
/// has gone).
async fn until_machines(fake: &FakeServe, what: &str, done: impl Fn(&Value) -> bool) {
    let start = Instant::now();
    loop {
        let machines = json!(fake.state.lock().unwrap().machines);
        if done(&machines) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{what}: {machines}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `sessionEnd` pause through real clients: the Python client's session ends (its stdin
/// closed), its temporary machines are kept (the branchable one paused, the other stopped);
/// the server starts again, and the TypeScript SDK's session takes the paused one back by name:
/// a command resumes it and says so, stop-machine pauses it, a read resumes it. That session
/// ends under the default, so the machine it took goes with it; the one nobody took stays kept.
#[tokio::test]
async fn a_machine_kept_paused_by_one_client_is_taken_back_by_another_after_a_restart() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let keep = server_env(
        rt.path(),
        &[("SMOL_LOCAL_URL", &url), ("SMOL_MCP_SESSION_END", "pause")],
    );
    let first = python_plan(
        keep,
        json!([
            {"tool": "create-machine", "args": {"image": "alpine", "name": "mcp-kept", "branchable": true}},
            {"tool": "write-file", "args": {"name": "mcp-kept", "path": "/root/plan.txt", "content": "step 2 next"}},
            {"tool": "create-machine", "args": {"image": "alpine", "name": "mcp-plain"}}
        ]),
    )
    .await;
    for call in first["calls"].as_array().unwrap() {
        assert_eq!(call["isError"], false, "{call}");
    }
    until_machines(&fake, "kept at the session's end", |m| {
        m["mcp-kept"]["state"] == "paused" && m["mcp-plain"]["state"] == "stopped"
    })
    .await;
    assert_eq!(fake.state.lock().unwrap().pauses, ["pause mcp-kept"]);
    let record: Value = serde_json::from_str(
        &std::fs::read_to_string(rt.path().join("rt/ephemeral.json")).unwrap(),
    )
    .unwrap();
    let kept = record["machines"].as_array().unwrap();
    assert_eq!(kept.len(), 2, "{record}");
    assert!(kept.iter().all(|e| e["keptUntil"].is_u64()), "{record}");

    let env = server_env(rt.path(), &[("SMOL_LOCAL_URL", &url)]);
    let plan = json!({
        "server": SERVER,
        "env": crate::common::clients::env_object(env),
        "calls": [
            {"tool": "run-command", "args": {"name": "mcp-kept", "command": ["echo", "back"]}},
            {"tool": "stop-machine", "args": {"name": "mcp-kept", "pause": true}},
            {"tool": "read-file", "args": {"name": "mcp-kept", "path": "/root/plan.txt"}}
        ]
    });
    let second = crate::common::clients::run_node("ts_plan.mjs", &plan).await;
    let calls = second["calls"].as_array().unwrap();
    for call in calls {
        assert_eq!(call["isError"], false, "{call}");
    }
    assert_eq!(calls[0]["structured"]["stdout"], "back\n", "{}", calls[0]);
    assert_eq!(
        calls[0]["structured"]["startedMachine"], true,
        "resumed: {}",
        calls[0]
    );
    assert_eq!(
        calls[1]["structured"]["machine"]["state"], "paused",
        "{}",
        calls[1]
    );
    // The file's text comes as its own content block, after the record.
    assert!(
        calls[2]["text"]
            .as_str()
            .unwrap()
            .ends_with("\nstep 2 next"),
        "{}",
        calls[2]
    );
    assert_eq!(
        calls[2]["structured"]["startedMachine"], true,
        "{}",
        calls[2]
    );
    until_machines(&fake, "the taken machine goes with its new session", |m| {
        m.get("mcp-kept").is_none()
    })
    .await;
    assert_eq!(
        fake.state.lock().unwrap().machines["mcp-plain"]["state"],
        "stopped",
        "nobody took it: still kept"
    );
}

/// SIGTERM, SIGHUP (a closed terminal, a supervisor's reload) and SIGINT each stop the server
/// cleanly: its ephemeral machine deleted, exit 0 (what supervisors count as a clean stop).
#[tokio::test]
async fn sigterm_sighup_and_sigint_clean_up_and_exit_zero() {
    use nix::sys::signal::Signal;
    for signal in [Signal::SIGHUP, Signal::SIGTERM, Signal::SIGINT] {
        let fake = FakeServe::start().await;
        let rt = tempfile::tempdir().unwrap();
        let url = fake.url();
        let mut server =
            StdioServer::spawn(server_env(rt.path(), &[("SMOL_LOCAL_URL", &url)])).await;
        server
            .tool(1, "create-machine", json!({"image": "alpine"}))
            .await;
        assert_eq!(fake.state.lock().unwrap().machines.len(), 1);
        let pid = nix::unistd::Pid::from_raw(server.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(10), server.child.wait())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status.code(), Some(0), "{signal}: {status}");
        assert!(
            fake.has_no_machines(),
            "{signal}: the ephemeral machine is deleted"
        );
    }
}

/// Orphans are the engine's that made them: a start on another engine with the same runtime
/// directory leaves them recorded (its engine does not have them), and the next start on the
/// first engine deletes them.
#[tokio::test]
async fn another_engine_on_the_same_runtime_dir_leaves_the_first_engine_s_orphans_recorded() {
    let first_engine = FakeServe::start().await;
    let other_engine = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let (first_url, other_url) = (first_engine.url(), other_engine.url());
    let mut first =
        StdioServer::spawn(server_env(rt.path(), &[("SMOL_LOCAL_URL", &first_url)])).await;
    first
        .tool(
            1,
            "create-machine",
            json!({"image": "alpine", "name": "mcp-orphan", "start": false}),
        )
        .await;
    first.child.kill().await.unwrap();
    assert!(first_engine.has_machine("mcp-orphan"));

    // Another engine, same runtime directory: its local calls do not take the record's
    // entries of the first engine for its own.
    let mut other =
        StdioServer::spawn(server_env(rt.path(), &[("SMOL_LOCAL_URL", &other_url)])).await;
    other.tool(2, "list-machines", json!({})).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    other.close_stdin();
    other.child.wait().await.unwrap();
    let record = std::fs::read_to_string(rt.path().join("rt/ephemeral.json")).unwrap();
    assert!(record.contains("mcp-orphan"), "still recorded: {record}");

    // The first engine again: its orphan is deleted.
    let mut again =
        StdioServer::spawn(server_env(rt.path(), &[("SMOL_LOCAL_URL", &first_url)])).await;
    again.tool(3, "list-machines", json!({})).await;
    let start = Instant::now();
    while first_engine.has_machine("mcp-orphan") {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the first engine's orphan is deleted by a start on it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    again.close_stdin();
    again.child.wait().await.unwrap();
}

#[tokio::test]
async fn a_sigkilled_server_s_machines_are_deleted_by_the_next_start() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let mut first = StdioServer::spawn(server_env(rt.path(), &[("SMOL_LOCAL_URL", &url)])).await;
    first
        .tool(1, "create-machine", json!({"image": "alpine"}))
        .await;
    first
        .tool(
            2,
            "create-machine",
            json!({"image": "alpine", "name": "named-survives"}),
        )
        .await;
    first.child.start_kill().unwrap();
    first.child.wait().await.unwrap();
    assert_eq!(
        fake.state.lock().unwrap().machines.len(),
        2,
        "a killed process cleans nothing"
    );

    let mut second = StdioServer::spawn(server_env(rt.path(), &[("SMOL_LOCAL_URL", &url)])).await;
    let start = Instant::now();
    while fake.state.lock().unwrap().machines.len() > 1 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the orphan was not deleted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let machines: Vec<String> = fake.machine_names();
    assert_eq!(machines, ["named-survives"]);
    second.close_stdin();
    second.child.wait().await.unwrap();
}

#[tokio::test]
async fn a_serve_that_goes_away_is_looked_for_again() {
    // The server adopts a running serve, which then dies (its owner stopped it); another comes
    // up at the same address. After one failed call, the next reaches the new serve.
    let rt = tempfile::tempdir().unwrap();
    let socket_dir = tempfile::tempdir().unwrap();
    let socket = socket_dir.path().join("api.sock");
    let url = format!("unix://{}", socket.display());
    let mut first = RealServe::start_at(&socket).await;
    let mut server = StdioServer::spawn(server_env(rt.path(), &[("SMOL_LOCAL_URL", &url)])).await;
    server
        .tool(
            1,
            "create-machine",
            json!({"image": "alpine", "name": "on-first", "start": false}),
        )
        .await;
    first.kill();
    let answer = server
        .request(
            2,
            "tools/call",
            json!({"name": "list-machines", "arguments": {}}),
        )
        .await;
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert!(
        answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("TRANSPORT"),
        "{answer}"
    );
    let _second = RealServe::start_at(&socket).await;
    let listed = server.tool(3, "list-machines", json!({})).await;
    assert_eq!(
        listed["machines"],
        json!([]),
        "the new serve (its own state) answers"
    );
    server.close_stdin();
    server.child.wait().await.unwrap();
}

/// Runs the server with `args` and stdin held open, and returns its exit code and output: none
/// of these may wait for the client.
async fn run_with_stdin_open(
    args: &[&str],
    extra: &[(&str, &str)],
) -> (Option<i32>, String, String) {
    let rt = tempfile::tempdir().unwrap();
    let out = exit_with_stdin_open(args, server_env(rt.path(), extra)).await;
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn help_version_and_refusals_never_wait_on_stdin() {
    let (code, stdout, _) = run_with_stdin_open(&["--help"], &[]).await;
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("Usage: smol-mcp") && stdout.contains("SMOL_MCP_CPUS"),
        "{stdout}"
    );
    for engine_fact in [
        "SMOLVM_VM_UID_DROP=off",
        "else smolvm on PATH",
        "~/.local/share/smol-mcp/engine/<version>/smol-vmm",
        "~/.local/share/smol-mcp/venv",
        "VIRTUAL_ENV",
    ] {
        assert!(stdout.contains(engine_fact), "{engine_fact}: {stdout}");
    }
    let (code, stdout, _) = run_with_stdin_open(&["--version"], &[]).await;
    assert_eq!(code, Some(0));
    assert_eq!(
        stdout.trim(),
        concat!("smol-mcp ", env!("CARGO_PKG_VERSION"))
    );
    let (code, _, stderr) = run_with_stdin_open(&[], &[("SMOL_MCP_TARGETS", "cloud")]).await;
    assert_eq!(code, Some(1));
    insta::assert_snapshot!(
        crate::common::without_timestamps(&stderr),
        @r#"[time] ERROR configuration: targets ($SMOL_MCP_TARGETS): "cloud" needs the cloud token: set SMOL_CLOUD_TOKEN (or cloudToken in the config file), or use local"#
    );
    assert!(
        !stderr.contains("meant to be launched"),
        "no word for a client on a pipe: {stderr}"
    );
}

/// Started by hand, with a terminal as stdin (a pty from python3's pty module), the server says
/// once what it is and still answers MCP on that terminal until ^D.
#[tokio::test]
async fn started_in_a_terminal_it_says_what_it_is_and_serves() {
    const SCRIPT: &str = r#"
import json, os, pty, select, subprocess, sys
server, env = sys.argv[1], json.loads(sys.argv[2])
master, slave = pty.openpty()
child = subprocess.Popen([server], stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
os.close(slave)
init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "by-hand", "version": "0"}}}
os.write(master, (json.dumps(init) + "\n").encode())
ready, _, _ = select.select([child.stdout], [], [], 20)
answer = child.stdout.readline().decode() if ready else ""
os.write(master, b"\x04")
_, err = child.communicate(timeout=20)
print(json.dumps({"code": child.returncode, "answer": answer, "stderr": err.decode()}))
"#;
    let rt = tempfile::tempdir().unwrap();
    let env: serde_json::Map<String, Value> = server_env(rt.path(), &[])
        .into_iter()
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("python3")
            .args(["-c", SCRIPT, SERVER, &Value::Object(env).to_string()])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the pty run ends")
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let stderr = report["stderr"].as_str().unwrap();
    assert_eq!(
        stderr
            .matches("meant to be launched by an MCP client")
            .count(),
        1,
        "one line for the person at the terminal: {stderr}"
    );
    assert!(
        stderr.contains("smol-mcp doctor") && stderr.contains("--help"),
        "{stderr}"
    );
    let answer: Value = serde_json::from_str(report["answer"].as_str().unwrap()).unwrap();
    assert_eq!(
        answer["result"]["serverInfo"]["name"], "smol-mcp",
        "still serves: {answer}"
    );
    assert_eq!(report["code"], 0, "^D ends it as stdin EOF does: {stderr}");
}

/// The server's peak memory (VmHWM), in MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb / 1024.0
}

/// read-file holds a page, not the file: pages of a 1 GiB file (at its start, past its middle,
/// and the next page of that read) leave the server's peak memory where a small read leaves it,
/// and the next page continues the same download instead of starting another.
#[tokio::test]
async fn reading_a_page_of_a_huge_file_holds_the_page_not_the_file() {
    const GIB: u64 = 1 << 30;
    let fake = FakeServe::start().await;
    fake.add_machine("big", "running");
    fake.state
        .lock()
        .unwrap()
        .generated_files
        .insert(("big".into(), "/data/huge.bin".into()), GIB);
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let mut server = StdioServer::spawn(server_env(rt.path(), &[("SMOL_LOCAL_URL", &url)])).await;
    let pid = server.child.id().unwrap();
    let first = server
        .tool(
            1,
            "read-file",
            json!({"name": "big", "path": "/data/huge.bin", "length": 100}),
        )
        .await;
    assert_eq!(first["size"], GIB);
    assert_eq!(first["bytes"], 100);
    let baseline = peak_rss_mib(pid);

    let middle: u64 = 256 * 1024 * 1024 + 3;
    let expected = |from: u64, n: u64| -> String {
        (from..from + n)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect()
    };
    let page = server
        .request(
            2,
            "tools/call",
            json!({"name": "read-file", "arguments": {"name": "big", "path": "/data/huge.bin", "offset": middle, "length": 26}}),
        )
        .await;
    let text = page["result"]["content"][1]["text"].as_str().unwrap();
    assert_eq!(text, expected(middle, 26), "the bytes at that offset");
    let next = server
        .request(
            3,
            "tools/call",
            json!({"name": "read-file", "arguments": {"name": "big", "path": "/data/huge.bin", "offset": middle + 26, "length": 3}}),
        )
        .await;
    assert_eq!(
        next["result"]["content"][1]["text"],
        expected(middle + 26, 3)
    );
    let downloads = fake
        .take_requests()
        .iter()
        .filter(|r| r["method"] == "GET" && r["path"].as_str().unwrap().contains("/files/"))
        .count();
    assert_eq!(
        downloads, 2,
        "the first read, then one download for the two later pages"
    );
    let peak = peak_rss_mib(pid);
    eprintln!("peak memory: {baseline:.1} MiB after the first page, {peak:.1} MiB at the end");
    assert!(
        baseline < 64.0,
        "a 100-byte page of a 1 GiB file took the server to {baseline:.1} MiB"
    );
    assert!(
        peak < baseline + 16.0,
        "peak memory grew from {baseline:.1} to {peak:.1} MiB reading pages of a 1 GiB file"
    );
}

/// A client that writes many requests and never reads its answers: the server stops reading
/// once `stdioMaxPendingRequests` answers wait (the client's writes then block), its memory
/// stays bounded, and when the client starts reading every answer arrives, once each.
#[tokio::test]
async fn a_client_that_never_reads_its_answers_stalls_its_writes_not_the_servers_memory() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::io::AsyncWriteExt;
    const CALLS: u64 = 5_000;
    let fake = FakeServe::start().await;
    // Answers of some size, as a real fleet's list is.
    for i in 0..40 {
        fake.add_machine(&format!("listed-machine-{i:03}"), "running");
    }
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let (mut child, mut stdin, mut lines) = spawn_speaking(
        tokio::process::Command::new(SERVER)
            .env_clear()
            .envs(server_env(rt.path(), &[("SMOL_LOCAL_URL", &url)])),
        std::process::Stdio::inherit(),
    );
    let pid = child.id().unwrap();
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "never-reads", "version": "0"}}});
    stdin
        .write_all(format!("{init}\n").as_bytes())
        .await
        .unwrap();
    let answer: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
    assert_eq!(answer["id"], 0);
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
        .await
        .unwrap();
    let baseline = peak_rss_mib(pid);

    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let written = written.clone();
        tokio::spawn(async move {
            for id in 1..=CALLS {
                let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                    "params": {"name": "list-machines", "arguments": {}}});
                stdin
                    .write_all(format!("{call}\n").as_bytes())
                    .await
                    .unwrap();
                written.store(id, Ordering::Relaxed);
            }
            stdin
        })
    };
    // Wait until the client's writes stall (or, on a server that reads on regardless, all are
    // written).
    let (mut last, mut still_since) = (0, Instant::now());
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = written.load(Ordering::Relaxed);
        if now == CALLS {
            // A server that keeps reading: give its queued answers time to pile up.
            tokio::time::sleep(Duration::from_secs(3)).await;
            break;
        }
        if now != last {
            (last, still_since) = (now, Instant::now());
        } else if still_since.elapsed() > Duration::from_secs(3) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "neither stalled nor done"
        );
    }
    let stalled_at = written.load(Ordering::Relaxed);
    let peak = peak_rss_mib(pid);
    eprintln!("stalled at {stalled_at} requests, peak RSS {peak:.1} MiB (at start {baseline:.1})");
    assert!(
        stalled_at < CALLS,
        "the server read all {CALLS} requests while no answer was read"
    );
    assert!(
        peak < baseline + 40.0,
        "peak RSS {peak:.1} MiB (at start {baseline:.1} MiB) with {stalled_at} requests written"
    );

    // The client reads now: every answer arrives, once, and the writes go on to the end.
    let mut seen = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while (seen.len() as u64) < CALLS {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let line = tokio::time::timeout(remaining, lines.next_line())
            .await
            .expect("all answers in time")
            .unwrap()
            .expect("the server closed stdout");
        let answer: Value = serde_json::from_str(&line).unwrap();
        let Some(id) = answer["id"].as_u64() else {
            continue;
        };
        assert_eq!(answer["result"]["isError"], false, "{line}");
        assert!(seen.insert(id), "answered twice: {id}");
    }
    let stdin = writer.await.unwrap();
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
}

/// Images that are no reference (a URL, a relative path, `..`, upper case, an empty tag, a
/// short digest) are refused naming `image` and what is accepted, and never reach the engine;
/// OCI references and an absolute archive path do.
#[tokio::test]
async fn odd_images_are_refused_naming_image_and_never_reach_the_engine() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let mut server = StdioServer::spawn(server_env(rt.path(), &[("SMOL_LOCAL_URL", &url)])).await;
    let digest = "a".repeat(64);
    let mut id = 1;
    for image in [
        "http://evil/".to_owned(),
        "../../x".to_owned(),
        "./x.tar".to_owned(),
        "/images/../../etc/shadow".to_owned(),
        "Alpine".to_owned(),
        "alpine:".to_owned(),
        "alpine@sha256:abc".to_owned(),
        "ghcr.io//img".to_owned(),
        "-alpine".to_owned(),
        "alpine:3.20 --privileged".to_owned(),
    ] {
        id += 1;
        let answer = server
            .request(
                id,
                "tools/call",
                json!({"name": "create-machine", "arguments": {"image": image, "start": false}}),
            )
            .await;
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        assert_eq!(answer["result"]["isError"], true, "{image}: {answer}");
        assert!(
            text.contains("image") && text.contains("alpine:3.20") && text.contains("sha256"),
            "{image}: {text}"
        );
    }
    let creates = fake
        .take_requests()
        .iter()
        .filter(|r| r["method"] == "POST" && r["path"] == "/api/v1/machines")
        .count();
    assert_eq!(creates, 0, "no refused image reached the engine");
    for image in [
        "alpine".to_owned(),
        "alpine:3.20".to_owned(),
        "python:3.12-alpine".to_owned(),
        format!("ghcr.io/org/img@sha256:{digest}"),
        format!("localhost:5000/team/app_x:v1.2-rc@sha256:{digest}"),
        "/images/app.tar".to_owned(),
    ] {
        id += 1;
        let answer = server
            .request(
                id,
                "tools/call",
                json!({"name": "create-machine", "arguments": {"image": image, "start": false}}),
            )
            .await;
        assert_eq!(answer["result"]["isError"], false, "{image}: {answer}");
    }
    server.close_stdin();
    server.child.wait().await.unwrap();
}

/// At `SMOL_MCP_LOG=debug` every request to an engine or the cloud is logged inside the span of
/// the tool call that made it (tool, JSON-RPC id, owner, machine), with its operation, status
/// and time, and the cloud's token appears nowhere in the log.
#[tokio::test]
async fn each_upstream_request_is_logged_inside_its_tool_call() {
    let fake = FakeServe::start().await;
    let cloud = crate::common::fake_cloud::FakeCloud::start().await;
    let runtime = tempfile::tempdir().unwrap();
    let (local_url, cloud_url) = (fake.url(), cloud.url());
    let env = server_env(
        runtime.path(),
        &[
            ("SMOL_LOCAL_URL", &local_url),
            ("SMOL_CLOUD_URL", &cloud_url),
            ("SMOL_CLOUD_TOKEN", crate::common::fake_cloud::TOKEN),
            ("SMOL_MCP_TARGETS", "both"),
            ("SMOL_MCP_LOG", "debug"),
        ],
    );
    let log = runtime.path().join("stderr.log");
    let mut server = StdioServer::spawn_with_stderr(env, &log).await;
    server
        .tool(
            7,
            "create-machine",
            json!({"name": "traced", "target": "local"}),
        )
        .await;
    server
        .tool(
            8,
            "run-command",
            json!({"name": "traced", "command": "true", "target": "local"}),
        )
        .await;
    server
        .tool(9, "list-machines", json!({"target": "cloud"}))
        .await;
    // Calls whose requests go out from tasks they spawn: the reading of the machine's counters
    // taken beside the command (usage), a start not waited for.
    server
        .tool(
            10,
            "run-command",
            json!({"name": "traced", "command": "true", "usage": true, "target": "local"}),
        )
        .await;
    server
        .tool(
            11,
            "stop-machine",
            json!({"name": "traced", "target": "local"}),
        )
        .await;
    server
        .tool(
            12,
            "start-machine",
            json!({"name": "traced", "wait": false, "target": "local"}),
        )
        .await;
    server.close_stdin();
    server.child.wait().await.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let line = |needles: &[&str]| {
        text.lines()
            .find(|l| needles.iter().all(|n| l.contains(n)))
            .unwrap_or_else(|| panic!("no line with {needles:?} in:\n{text}"))
            .to_owned()
    };
    let exec = line(&[
        "upstream request",
        "operation=\"exec_command\"",
        "request=8",
    ]);
    for field in [
        "tool_call{",
        "tool=\"run-command\"",
        "request=8",
        "machine=\"traced\"",
        "owner=",
        "status=200",
        "millis=",
        "fleet=\"local\"",
    ] {
        assert!(exec.contains(field), "{field} in {exec}");
    }
    let create = line(&["upstream request", "operation=\"create_machine\""]);
    assert!(create.contains("request=7"), "{create}");
    let listed = line(&[
        "upstream request",
        "fleet=\"cloud\"",
        "operation=\"machine_list\"",
    ]);
    assert!(listed.contains("tool=\"list-machines\""), "{listed}");
    assert!(
        !text.contains(crate::common::fake_cloud::TOKEN),
        "the cloud token is in the log"
    );
    // Every request to a fleet from the first call on is inside a call's span, those of the
    // tasks a call spawned included; none is left without its call.
    let first_call = text.find("tool_call{").unwrap();
    let outside: Vec<&str> = text[first_call..]
        .lines()
        .filter(|l| l.contains("upstream request") && !l.contains("tool_call{"))
        .collect();
    assert!(
        outside.is_empty(),
        "requests outside any call: {outside:#?}"
    );
    // The start not waited for (its request sent from a task of its own) is in its call's.
    let start = line(&[
        "upstream request",
        "operation=\"start_machine\"",
        "request=12",
    ]);
    assert!(start.contains("tool=\"start-machine\""), "{start}");
    let counters: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("upstream request") && l.contains("request=10"))
        .collect();
    assert!(
        counters
            .iter()
            .filter(|l| l.contains("operation=\"get_machine\""))
            .count()
            >= 2,
        "the counters read before and after the command, both in its call: {counters:#?}"
    );
}
