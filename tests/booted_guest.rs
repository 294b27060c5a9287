//! The tools against the real engine with guests that boot: commands, files, output spill, logs,
//! timeouts, branching and run-once. The CI hosts' KVM is paravirtual and guests cannot boot
//! there, so these are opt-in, for a host with working KVM (or Hypervisor.framework) and
//! registry access:
//!
//!     cargo test --test booted_guest -- --ignored

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::mcp::Harness;
use common::real_serve::RealServe;
use serde_json::json;

async fn setup() -> (RealServe, Harness) {
    let serve = RealServe::start().await;
    let url = match &serve.endpoint {
        smol_mcp::fleet::transport::LocalEndpoint::Unix(p) => format!("unix://{}", p.display()),
        other => panic!("unexpected endpoint {other:?}"),
    };
    let h = Harness::start(&[
        ("SMOL_LOCAL_URL", url.as_str()),
        ("SMOL_MCP_READY_TIMEOUT_SECS", "180"),
        ("SMOL_MCP_MAX_OUTPUT_BYTES", "4096"),
    ])
    .await;
    (serve, h)
}

#[tokio::test]
#[ignore = "needs a host whose hypervisor boots guests and that reaches an image registry"]
async fn commands_files_spill_logs_and_timeouts_in_a_booted_guest() {
    let (_serve, h) = setup().await;
    let created = h
        .ok(
            "create-machine",
            json!({"image": "alpine", "network": "open", "cpus": 1, "memoryMb": 512}),
        )
        .await;
    assert_eq!(created["ready"], true);
    let name = created["machine"]["name"].as_str().unwrap().to_owned();

    let r = h
        .ok(
            "run-command",
            json!({"name": name, "command": "echo out; echo err >&2; exit 42"}),
        )
        .await;
    assert_eq!(
        (
            r["exitCode"].as_i64(),
            r["stdout"].as_str(),
            r["stderr"].as_str()
        ),
        (Some(42), Some("out\n"), Some("err\n"))
    );
    let r = h
        .ok(
            "run-command",
            json!({"name": name, "command": ["cat"], "stdin": "piped"}),
        )
        .await;
    assert_eq!(r["stdout"], "piped");
    let r = h.ok("run-command", json!({"name": name, "command": "echo $GREETING; pwd", "env": {"GREETING": "hi"}, "workdir": "/tmp"})).await;
    assert_eq!(r["stdout"], "hi\n/tmp\n");

    h.ok(
        "write-file",
        json!({"name": name, "path": "/root/a.bin", "content": "AAEC/w==", "encoding": "base64"}),
    )
    .await;
    let (_, back) = h
        .read(json!({"name": name, "path": "/root/a.bin", "encoding": "base64"}))
        .await;
    assert_eq!(back, "AAEC/w==");
    let r = h
        .ok(
            "run-command",
            json!({"name": name, "command": "wc -c < /root/a.bin"}),
        )
        .await;
    assert_eq!(r["stdout"].as_str().unwrap().trim(), "4");

    let big = h
        .ok(
            "run-command",
            json!({"name": name, "command": "yes a | head -c 20000"}),
        )
        .await;
    assert_eq!(big["truncated"], true);
    let spilled = big["overflow"][0]["path"].as_str().unwrap();
    let whole = h
        .ok(
            "read-file",
            json!({"name": name, "path": spilled, "length": 100}),
        )
        .await;
    assert_eq!(whole["size"], 20000);

    let timed = h
        .ok(
            "run-command",
            json!({"name": name, "command": "sleep 30", "timeoutSecs": 2}),
        )
        .await;
    assert_eq!(
        (timed["exitCode"].as_i64(), timed["timedOut"].as_bool()),
        (Some(124), Some(true))
    );

    let logs = h.ok("machine-logs", json!({"name": name, "tail": 5})).await;
    assert!(!logs["lines"].as_array().unwrap().is_empty());

    h.ok("delete-machine", json!({"name": name})).await;
}

#[tokio::test]
#[ignore = "needs a host whose hypervisor boots guests and that reaches an image registry"]
async fn branching_and_run_once_in_booted_guests() {
    let (_serve, h) = setup().await;
    h.ok(
        "create-machine",
        json!({"image": "alpine", "name": "mcp-src", "network": "open", "branchable": true}),
    )
    .await;
    h.ok(
        "run-command",
        json!({"name": "mcp-src", "command": "echo state > /root/s"}),
    )
    .await;
    let child = h
        .ok(
            "branch-machine",
            json!({"name": "mcp-src", "childName": "mcp-child"}),
        )
        .await;
    assert_eq!(child["ready"], true);
    let r = h
        .ok(
            "run-command",
            json!({"name": "mcp-child", "command": "cat /root/s"}),
        )
        .await;
    assert_eq!(r["stdout"], "state\n", "the child has the source's disk");
    let once = h
        .ok(
            "run-once",
            json!({"image": "alpine", "network": "open", "command": ["echo", "hello"]}),
        )
        .await;
    assert_eq!(once["stdout"], "hello\n");
    let cleanup = h.backend.cleanup_session(&h.session).await;
    assert_eq!(cleanup.failed.len(), 0, "{:?}", cleanup.failed);
    let left = h.ok("list-machines", json!({})).await;
    assert_eq!(left["machines"], json!([]));
}

/// What the fake serve claims about the engine's limits, checked on a booted guest: a 1 s
/// timeout reads `timedOut` (whichever of the three forms the engine uses for this machine),
/// an exit 124 of the command's own does not, output over 11 MiB is the clear error the fake's
/// 500 produces, and a timeout past the 300 s request deadline is refused before anything runs.
#[tokio::test]
#[ignore = "needs a host whose hypervisor boots guests and that reaches an image registry"]
async fn the_engines_limits_are_what_the_fake_says() {
    let (serve, h) = setup().await;
    let created = h
        .ok(
            "create-machine",
            json!({"image": "alpine", "network": "open", "cpus": 1, "memoryMb": 512}),
        )
        .await;
    let name = created["machine"]["name"].as_str().unwrap().to_owned();

    let timed = h
        .ok(
            "run-command",
            json!({"name": name, "command": "sleep 30", "timeoutSecs": 1}),
        )
        .await;
    assert_eq!(
        (timed["exitCode"].as_i64(), timed["timedOut"].as_bool()),
        (Some(124), Some(true)),
        "{timed}"
    );
    let own = h
        .ok(
            "run-command",
            json!({"name": name, "command": "exit 124", "timeoutSecs": 30}),
        )
        .await;
    assert_eq!(
        (own["exitCode"].as_i64(), own["timedOut"].as_bool()),
        (Some(124), Some(false)),
        "{own}"
    );

    // 12 MiB on stdout: past the agent's 11 MiB cap. The fake answers the VM path's 500; an
    // image machine's container path may instead hang until the timeout, which this shows too.
    let answer = h
        .call(
            "run-command",
            json!({"name": name, "command": "head -c 12582912 /dev/zero | tr '\\0' x", "timeoutSecs": 60}),
        )
        .await;
    assert!(
        answer.is_error,
        "no error: if this is a timeout, the container path hung past the cap and the fake's \
         VM-path 500 does not describe image machines: {}",
        answer.text
    );
    assert!(
        answer.text.contains("cap of 11 MiB per stream") && answer.text.contains("read-file"),
        "{}",
        answer.text
    );

    let err = h
        .err(
            "run-command",
            json!({"name": name, "command": "sleep 400", "timeoutSecs": 400}),
        )
        .await;
    assert!(
        err.starts_with("INVALID_ARGUMENT: timeoutSecs:") && err.contains("at most 290"),
        "{err}"
    );

    // An upload over 100 MiB, straight to the engine (the tool refuses it before sending): the
    // fake answers 413 in plain text, as the engine's upload handler says it does.
    let http = serve.endpoint.http_client().unwrap();
    let base = serve.endpoint.base_url();
    let response = http
        .put(format!("{base}/api/v1/machines/{name}/files/tmp%2Fbig"))
        .header("content-type", "application/octet-stream")
        .body(vec![0u8; 101 * 1024 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 413);
    assert!(
        response
            .text()
            .await
            .unwrap()
            .contains("100 MiB upload limit"),
        "the engine's words for an upload over its limit"
    );

    h.ok("delete-machine", json!({"name": name})).await;
}

/// What the fake claims about logs, starts and file reads, on a booted guest: `tail` returns at most that many
/// of the console's lines (never none for a machine that booted), a cursor returns only what came
/// after it, and `branchable: true` on a running machine that is not branchable is refused rather
/// than answered with the record unchanged.
#[tokio::test]
#[ignore = "needs a host whose hypervisor boots guests and that reaches an image registry"]
async fn logs_tail_cursor_and_a_branchable_start_on_a_booted_guest() {
    let (_serve, h) = setup().await;
    h.ok(
        "create-machine",
        json!({"image": "alpine", "name": "mcp-logs", "network": "open"}),
    )
    .await;
    let first = h
        .ok("machine-logs", json!({"name": "mcp-logs", "tail": 5}))
        .await;
    let lines = first["lines"].as_array().unwrap();
    assert!(
        !lines.is_empty() && lines.len() <= 5,
        "a booted machine's console has lines: {first}"
    );
    let again = h
        .ok(
            "machine-logs",
            json!({"name": "mcp-logs", "cursor": first["cursor"]}),
        )
        .await;
    for line in again["lines"].as_array().unwrap() {
        assert!(
            !lines.contains(line) || again["gap"] == true,
            "{line} came twice"
        );
    }
    let refused = h
        .err(
            "start-machine",
            json!({"name": "mcp-logs", "branchable": true}),
        )
        .await;
    assert!(refused.starts_with("CONFLICT"), "{refused}");
    // The fake's answers for a directory and a missing file, checked against the engine's.
    let directory = h
        .err("read-file", json!({"name": "mcp-logs", "path": "/etc"}))
        .await;
    assert!(directory.contains("is a directory"), "{directory}");
    let missing = h
        .err(
            "read-file",
            json!({"name": "mcp-logs", "path": "/no/such/file"}),
        )
        .await;
    assert!(missing.starts_with("NOT_FOUND"), "{missing}");
    let cleanup = h.backend.cleanup_session(&h.session).await;
    assert_eq!(cleanup.failed.len(), 0, "{:?}", cleanup.failed);
}

/// A cancelled run-command's command (and what it started) is killed in the guest.
#[tokio::test]
#[ignore = "needs a host whose hypervisor boots guests and that reaches an image registry"]
async fn a_cancelled_command_is_killed_in_a_booted_guest() {
    use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest};
    use rmcp::service::PeerRequestOptions;
    let (_serve, h) = setup().await;
    h.ok(
        "create-machine",
        json!({"image": "alpine", "name": "mcp-kill", "network": "open"}),
    )
    .await;
    let serde_json::Value::Object(args) = json!({
        "name": "mcp-kill",
        "command": "sleep 271 & sleep 272",
        "timeoutSecs": 280
    }) else {
        panic!()
    };
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(
        CallToolRequestParams::new("run-command").with_arguments(args),
    ));
    let handle = h
        .client
        .peer()
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    handle.cancel(Some("test".into())).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let ps = h
        .ok(
            "run-command",
            json!({"name": "mcp-kill", "command": "ps -o args"}),
        )
        .await;
    let listing = ps["stdout"].as_str().unwrap();
    assert!(
        !listing.contains("sleep 271") && !listing.contains("sleep 272"),
        "the cancelled command and its child are gone: {listing}"
    );
    let cleanup = h.backend.cleanup_session(&h.session).await;
    assert_eq!(cleanup.failed.len(), 0, "{:?}", cleanup.failed);
}

/// The blocked-egress report on a booted guest, where the fake's account of the engine can be
/// checked: a connect to an address outside the allow-list is refused and reported as `ip:port`
/// with its count, and a name outside allowHosts fails to resolve (libkrun answers NXDOMAIN)
/// rather than being refused at connect. Never run where this was written (no guest boots
/// there): what it asserts is what the engine's source says.
#[tokio::test]
#[ignore = "needs a host whose hypervisor boots guests and that reaches an image registry"]
async fn a_refused_connect_is_reported_on_a_booted_guest() {
    let (_serve, h) = setup().await;
    // The registry's hosts, so that the image pulls; nothing else.
    h.ok(
        "create-machine",
        json!({
            "image": "alpine", "name": "mcp-egress",
            "allowHosts": ["registry-1.docker.io", "auth.docker.io", "production.cloudflare.docker.com"]
        }),
    )
    .await;
    let refused = h
        .ok(
            "run-command",
            json!({"name": "mcp-egress", "command": "wget -q -T 3 -O /dev/null http://1.1.1.1/; wget -q -T 3 -O /dev/null http://1.1.1.1/"}),
        )
        .await;
    assert_ne!(refused["exitCode"], 0, "{refused}");
    let reported = refused["blockedEgress"].as_array().expect("blockedEgress");
    assert!(
        reported
            .iter()
            .any(|b| b["host"] == "1.1.1.1" && b["port"] == 80 && b["count"].as_u64() >= Some(2)),
        "{refused}"
    );
    let unresolved = h
        .ok(
            "run-command",
            json!({"name": "mcp-egress", "command": "wget -q -T 3 -O /dev/null http://example.com/"}),
        )
        .await;
    assert_ne!(unresolved["exitCode"], 0, "{unresolved}");
    assert!(
        unresolved["stderr"]
            .as_str()
            .unwrap()
            .contains("bad address"),
        "a name outside allowHosts does not resolve: {unresolved}"
    );
    let cleanup = h.backend.cleanup_session(&h.session).await;
    assert_eq!(cleanup.failed.len(), 0, "{:?}", cleanup.failed);
}

/// 1.32.2's `exec/stream` is live by its source (its handler forwards each event of the guest
/// agent as it comes); this confirms it on a guest: the first line arrives seconds before the
/// command ends, and a CR comes back as it was.
#[tokio::test]
#[ignore = "needs a host whose hypervisor boots guests and that reaches an image registry"]
async fn the_engines_exec_stream_is_live_in_a_booted_guest() {
    use smol_mcp::fleet::{Command, ExecSpec, FleetApi, LocalFleet};
    let (serve, h) = setup().await;
    let created = h
        .ok(
            "create-machine",
            json!({"image": "alpine", "cpus": 1, "memoryMb": 512}),
        )
        .await;
    let name = created["machine"]["name"].as_str().unwrap().to_owned();
    let fleet = LocalFleet::new(serve.endpoint.clone()).unwrap();
    let (sender, mut pieces) = tokio::sync::mpsc::unbounded_channel();
    let spec = ExecSpec::new(Command::Shell(
        "echo first; sleep 3; printf 'a\\r\\nb'".into(),
    ));
    let began = std::time::Instant::now();
    let run = tokio::spawn(async move { fleet.exec_streamed(&name, &spec, &sender).await });
    let first = pieces.recv().await.unwrap();
    let first_at = began.elapsed();
    let out = run.await.unwrap().unwrap();
    let ended_at = began.elapsed();
    assert_eq!(first.text, "first\n");
    assert!(
        ended_at - first_at > std::time::Duration::from_secs(2),
        "the first line came {first_at:?} in, the end {ended_at:?}: not live"
    );
    assert_eq!(out.stdout, b"first\na\r\nb");
    assert_eq!(out.exit_code, 0);
}

/// A background job in a real guest (alpine: busybox sh, tail and head): the engine's detached
/// exec keeps the command running after it answers, the wrapper's files fill, job-output reads
/// them by cursor to the exit status, and cancel-job's marker kill ends a second job and its
/// child (no `sleep 300` left in the guest).
#[tokio::test]
#[ignore = "needs a host whose hypervisor boots guests and that reaches an image registry"]
async fn a_background_job_runs_and_is_read_and_cancelled_in_a_booted_guest() {
    let (_serve, h) = setup().await;
    let created = h
        .ok(
            "create-machine",
            json!({"image": "alpine", "network": "open", "cpus": 1, "memoryMb": 512}),
        )
        .await;
    let name = created["machine"]["name"].as_str().unwrap().to_owned();
    let started = h
        .ok(
            "run-command",
            json!({"name": name, "background": true,
                   "command": "for i in 1 2 3; do echo \"line $i é\"; sleep 1; done; exit 4"}),
        )
        .await;
    let job = started["job"].as_str().unwrap().to_owned();
    let mut cursor = "0:0".to_owned();
    let mut stdout = String::new();
    let last = loop {
        let r = h
            .ok(
                "job-output",
                json!({"job": job, "cursor": cursor, "waitSecs": 2}),
            )
            .await;
        stdout.push_str(r["stdout"].as_str().unwrap());
        cursor = r["cursor"].as_str().unwrap().to_owned();
        if r["state"] != "running" && r["more"] == false {
            break r;
        }
    };
    assert_eq!(stdout, "line 1 é\nline 2 é\nline 3 é\n", "{last}");
    assert_eq!(last["state"], "exited");
    assert_eq!(last["exitCode"], 4);

    let sleeper = h
        .ok(
            "run-command",
            json!({"name": name, "background": true, "command": "sleep 300 & sleep 301"}),
        )
        .await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let cancelled = h.ok("cancel-job", json!({"job": sleeper["job"]})).await;
    assert_eq!(cancelled["state"], "cancelled");
    let ps = h
        .ok(
            "run-command",
            json!({"name": name, "command": "ps -o args | grep -c '^sleep 30[01]' || true"}),
        )
        .await;
    assert_eq!(ps["stdout"].as_str().unwrap().trim(), "0", "{ps}");
    h.ok("delete-machine", json!({"name": name})).await;
}
