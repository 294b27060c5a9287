//! The local serve's lifecycle with the real engine: started on the first local call (not at
//! connect) on a socket in a private runtime directory, with an environment that carries no
//! token, checked against the minimum version, and stopped when the server exits.

use crate::common::real_serve::{free_port, smolvm_binary};
use crate::common::stdio::{StdioServer, exit_with_stdin_open, server_env};
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

/// Pids of running `serve start` processes whose command line names `socket`.
fn serves_on(socket: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains("serve start") && cmdline.contains(socket) {
            found.push(pid);
        }
    }
    found
}

/// A server's environment that runs the pinned engine on a guest-rollout port of its own (and, as
/// root, with the UID drop off, as the engine asks), plus `extra`.
fn engine_env(rt: &std::path::Path, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let bin = smolvm_binary().display().to_string();
    let port = free_port().to_string();
    let mut vars = vec![
        ("SMOLVM", bin.as_str()),
        ("SMOLVM_GUEST_ROLLOUT_HOST_PORT", port.as_str()),
    ];
    if crate::common::real_serve::is_root() {
        vars.push(("SMOLVM_VM_UID_DROP", "off"));
    }
    vars.extend_from_slice(extra);
    server_env(rt, &vars)
}

/// Where the serve a server on `rt` starts listens.
fn serve_socket(rt: &tempfile::TempDir) -> String {
    rt.path().join("rt/api.sock").display().to_string()
}

/// Closes the server's stdin and waits for it to exit, then until no serve listens on `socket`.
async fn exit_then_no_serve(server: &mut StdioServer, socket: &str, why: &str) {
    exit(server).await;
    until_no_serve(socket, why).await;
}

async fn exit(server: &mut StdioServer) {
    server.close_stdin();
    tokio::time::timeout(Duration::from_secs(20), server.child.wait())
        .await
        .unwrap()
        .unwrap();
}

/// Until `pid` is a zombie or gone: dead, as `waitpid` can tell.
async fn until_dead(pid: u32) {
    let start = Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next());
        if stat.is_empty() || state == Some("Z") || state == Some("X") {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{pid} still alive"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn until_no_serve(socket: &str, why: &str) {
    let start = Instant::now();
    while !serves_on(socket).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(15), "{why}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_serve_starts_on_the_first_local_call_and_stops_at_exit() {
    let rt = tempfile::tempdir().unwrap();
    let env = engine_env(
        rt.path(),
        &[
            ("SMOL_CLOUD_TOKEN", "smk_must_not_reach_the_serve"),
            ("SMOL_MCP_TARGETS", "local"),
        ],
    );
    let mut server = StdioServer::spawn(env).await;
    let runtime = rt.path().join("rt");
    let socket = runtime.join("api.sock").display().to_string();
    assert!(serves_on(&socket).is_empty(), "no serve at connect");

    let listed = server.tool(1, "list-machines", json!({})).await;
    assert_eq!(listed["machines"], json!([]));
    let pids = serves_on(&socket);
    assert_eq!(pids.len(), 1, "one serve, started by the first local call");
    let mode = std::fs::metadata(&runtime).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    let environ =
        String::from_utf8_lossy(&std::fs::read(format!("/proc/{}/environ", pids[0])).unwrap())
            .into_owned();
    assert!(
        !environ.contains("SMOL_CLOUD_TOKEN") && !environ.contains("smk_"),
        "the serve gets no token"
    );
    assert!(
        environ.contains("SMOLVM_GUEST_ROLLOUT_HOST_PORT="),
        "SMOLVM_* settings pass through"
    );

    exit_then_no_serve(
        &mut server,
        &socket,
        "the serve this server started is stopped at exit",
    )
    .await;
}

#[tokio::test]
async fn an_engine_below_the_minimum_version_is_refused_and_stopped() {
    let rt = tempfile::tempdir().unwrap();
    let env = engine_env(rt.path(), &[("SMOL_MCP_MIN_SMOLVM", "99.0")]);
    let mut server = StdioServer::spawn(env).await;
    let answer = server
        .request(
            1,
            "tools/call",
            json!({"name": "list-machines", "arguments": {}}),
        )
        .await;
    let text = answer["result"]["content"][0]["text"].as_str().unwrap();
    insta::assert_snapshot!(text, @"UNSUPPORTED: local fleet: smolvm serve reports version 1.32.2 and this server needs at least 99.0: upgrade smolvm, or set SMOL_MCP_MIN_SMOLVM to accept the older engine (an empty value turns the check off)");
    let socket = serve_socket(&rt);
    until_no_serve(&socket, "the refused serve is stopped").await;
    exit(&mut server).await;
}

/// Refused at start-up, before a client is served: the address would be refused at every call.
#[tokio::test]
async fn a_non_loopback_serve_address_is_refused() {
    let rt = tempfile::tempdir().unwrap();
    // Stdin held open: the refusal must not wait for the client to go away.
    let out = exit_with_stdin_open(
        &[],
        server_env(rt.path(), &[("SMOL_LOCAL_URL", "http://192.0.2.10:8080")]),
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    insta::assert_snapshot!(
        crate::common::without_timestamps(&stderr),
        @"[time] ERROR configuration: localUrl ($SMOL_LOCAL_URL): refusing the non-loopback address http://192.0.2.10:8080: the local smolvm API has no authentication, so it must only listen on 127.0.0.1, localhost, [::1] or a Unix socket"
    );
}

/// A server killed with SIGKILL cannot stop its serve; the next server that finds it takes it
/// over (its recorded owner is dead) and stops it at its own exit.
#[tokio::test]
async fn a_serve_left_by_a_killed_server_is_taken_over_and_stopped() {
    let rt = tempfile::tempdir().unwrap();
    let env = engine_env(rt.path(), &[("SMOL_MCP_TARGETS", "local")]);
    let socket = serve_socket(&rt);
    let mut first = StdioServer::spawn(env.clone()).await;
    first.tool(1, "list-machines", json!({})).await;
    let pids = serves_on(&socket);
    assert_eq!(pids.len(), 1, "the first server started a serve");
    first.child.kill().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(serves_on(&socket), pids, "SIGKILL leaves the serve running");

    let mut second = StdioServer::spawn(env).await;
    second.tool(1, "list-machines", json!({})).await;
    assert_eq!(
        serves_on(&socket),
        pids,
        "the second server uses the same serve"
    );
    exit_then_no_serve(
        &mut second,
        &socket,
        "the orphaned serve is stopped when the server that took it over exits",
    )
    .await;
}

/// A serve whose owner is alive is left alone by a second server: it is not the second's to stop.
#[tokio::test]
async fn a_serve_whose_owner_lives_is_not_stopped_by_another_server() {
    let rt = tempfile::tempdir().unwrap();
    let env = engine_env(rt.path(), &[("SMOL_MCP_TARGETS", "local")]);
    let socket = serve_socket(&rt);
    let mut first = StdioServer::spawn(env.clone()).await;
    first.tool(1, "list-machines", json!({})).await;
    let mut second = StdioServer::spawn(env).await;
    second.tool(1, "list-machines", json!({})).await;
    second.close_stdin();
    tokio::time::timeout(Duration::from_secs(20), second.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        serves_on(&socket).len(),
        1,
        "the owner's serve keeps running"
    );
    exit_then_no_serve(&mut first, &socket, "its owner stops it").await;
}

/// A serve the user named (`SMOL_LOCAL_URL`) that does not answer is an error that says so:
/// the server never deletes its socket, starts an engine of its own on it, or writes the user's
/// engine state (once, one failed health check under load was enough for it to take the user's
/// serve over).
#[tokio::test]
async fn a_named_serve_that_does_not_answer_is_never_replaced() {
    let rt = tempfile::tempdir().unwrap();
    let users = tempfile::tempdir().unwrap();
    let socket = users.path().join("api.sock");
    // The user's socket file is there, but nothing answers on it (a serve that is down).
    std::fs::write(&socket, b"").unwrap();
    let url = format!("unix://{}", socket.display());
    let mut server =
        StdioServer::spawn(engine_env(rt.path(), &[("SMOL_LOCAL_URL", url.as_str())])).await;
    let answer = server
        .request(
            2,
            "tools/call",
            json!({"name": "list-machines", "arguments": {}}),
        )
        .await;
    let text = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    // The socket is a temporary path: written [socket], which also checks it is named there.
    insta::assert_snapshot!(
        text.replace(&socket.display().to_string(), "[socket]"),
        @"UNSUPPORTED: local fleet: the serve named by SMOL_LOCAL_URL (unix://[socket]) does not answer /health (error sending request for url (http://smolvm.local/health): client error (Connect): Connection refused (os error 111)): start it, or unset SMOL_LOCAL_URL to let this server start an engine of its own (it never starts one in place of a serve you named)"
    );
    assert!(socket.exists(), "the user's socket file was deleted");
    assert!(
        serves_on(&socket.display().to_string()).is_empty(),
        "a serve was started on it"
    );
    assert!(
        !rt.path().join("rt").join("serve.log").exists(),
        "no engine of the server's own was started"
    );
    exit(&mut server).await;
    assert!(socket.exists(), "nor deleted at exit");
}

/// An engine of a few lines (Python): `serve start --listen unix://PATH` answers `/health` as
/// 1.32.2 and an empty machine list, enough for the server's serve handling without a
/// hypervisor.
const TINY_ENGINE: &str = r#"#!/usr/bin/env python3
import json, os, socketserver, sys
from http.server import BaseHTTPRequestHandler
if sys.argv[1:3] != ["serve", "start"]:
    print("smolvm 1.32.2"); sys.exit(0)
path = sys.argv[sys.argv.index("--listen") + 1]
path = path[len("unix://"):] if path.startswith("unix://") else path[len("unix:"):]
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path == "/health":
            body = {"status": "ok", "version": "1.32.2", "nested_virt": False}
        elif self.path.startswith("/api/v1/machines"):
            body = {"machines": []}
        else:
            self.send_response(404); self.send_header("content-length", "0"); self.end_headers(); return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *args):
        pass
class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    def get_request(self):
        request, _ = super().get_request()
        return request, ("local", 0)
if os.path.exists(path):
    os.unlink(path)
Server(path, Handler).serve_forever()
"#;

/// A serve this server started and that was then killed is noticed by the next call, which
/// starts another and succeeds: no call fails on the dead one's socket.
#[tokio::test]
async fn the_call_after_its_serve_was_killed_starts_another_and_succeeds() {
    let rt = tempfile::tempdir().unwrap();
    let engine = rt.path().join("tiny-smolvm");
    std::fs::write(&engine, TINY_ENGINE).unwrap();
    std::fs::set_permissions(&engine, std::fs::Permissions::from_mode(0o755)).unwrap();
    let engine_path = engine.display().to_string();
    let mut server = StdioServer::spawn(server_env(
        rt.path(),
        &[
            ("SMOLVM", engine_path.as_str()),
            ("SMOL_MCP_TARGETS", "local"),
        ],
    ))
    .await;
    let socket = serve_socket(&rt);
    server.tool(1, "list-machines", json!({})).await;
    let first = serves_on(&socket);
    assert_eq!(first.len(), 1, "the first local call started a serve");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    until_no_serve(&socket, "the serve is killed").await;
    // Its command line empties as it begins to exit, before it is a zombie that a wait can
    // reap (seen under load in CI): the point is a serve that has died, so wait for that.
    until_dead(first[0]).await;

    let answer = server
        .request(
            2,
            "tools/call",
            json!({"name": "list-machines", "arguments": {}}),
        )
        .await;
    assert_eq!(
        answer["result"]["isError"], false,
        "the first call after the kill: {answer}"
    );
    let second = serves_on(&socket);
    assert_eq!(second.len(), 1, "another serve");
    assert_ne!(second, first);
    exit_then_no_serve(&mut server, &socket, "the new serve is stopped at exit").await;
}

/// doctor on this very host says what the host is: these CI hosts are virtual machines whose
/// KVM is the paravirtual kvm_pvm, where /dev/kvm opens and no guest of the engine boots.
/// Read from /sys/module as the test sees it, so that a host without it must not be called one.
#[tokio::test]
async fn doctor_says_what_this_host_is_before_any_boot() {
    let rt = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_smol-mcp"))
        .args(["doctor", "--quick"])
        .env_clear()
        .envs(engine_env(rt.path(), &[]))
        .output()
        .await
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    let paravirtual = std::path::Path::new("/sys/module/kvm_pvm").exists();
    let kvm_row = report
        .lines()
        .find(|line| line.starts_with("local  KVM"))
        .unwrap_or_else(|| panic!("no KVM row: {report}"));
    if paravirtual && std::path::Path::new("/dev/kvm").exists() {
        assert!(
            kvm_row.contains("KVM is paravirtual (the kvm_pvm module"),
            "{kvm_row}"
        );
        // Not "ok" beside a detail that says guests do not boot here.
        assert!(kvm_row.contains(" WARNING "), "{kvm_row}");
    } else {
        assert!(!kvm_row.contains("kvm_pvm"), "{kvm_row}");
        assert!(!kvm_row.contains(" WARNING "), "{kvm_row}");
    }
}
