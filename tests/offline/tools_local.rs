//! Every tool on the local fleet, through an MCP client, against the fake serve.

use crate::common::fake_serve::{FakeServe, TimeoutForm, exec_response};
use crate::common::mcp::Harness;
use serde_json::json;

async fn setup() -> (FakeServe, Harness) {
    let fake = FakeServe::start().await;
    let h = Harness::on_fake(&fake, &[]).await;
    (fake, h)
}

#[tokio::test]
async fn create_run_files_logs_delete() {
    let (fake, h) = setup().await;
    let created = h
        .ok(
            "create-machine",
            json!({"image": "alpine", "env": {"A": "1"}}),
        )
        .await;
    let name = created["machine"]["name"].as_str().unwrap().to_owned();
    assert!(name.starts_with("mcp-"), "{name}");
    assert_eq!(created["ephemeral"], true);
    assert_eq!(created["ready"], true);
    assert_eq!(created["machine"]["state"], "running");
    assert_eq!(
        created["machine"]["network"], "blocked",
        "no egress by default"
    );

    let listed = h.ok("list-machines", json!({})).await;
    assert_eq!(listed["machines"][0]["name"], name.as_str());
    assert_eq!(
        h.ok("list-machines", json!({"name": name})).await["machines"][0].clone()["state"],
        "running"
    );

    let failed = h
        .ok("run-command", json!({"name": name, "command": "exit 3"}))
        .await;
    assert_eq!(failed["exitCode"], 3, "a failing command is a result");
    assert_eq!(failed["startedMachine"], false);
    let echoed = h
        .ok(
            "run-command",
            json!({"name": name, "command": ["echo", "hi"], "timeoutSecs": 5}),
        )
        .await;
    assert_eq!(echoed["stdout"], "hi\n");

    let written = h
        .ok(
            "write-file",
            json!({"name": name, "path": "/root/notes.txt", "content": "héllo wörld"}),
        )
        .await;
    assert_eq!(written["size"], 13);
    let (page, content) = h
        .read(json!({"name": name, "path": "/root/notes.txt", "length": 2}))
        .await;
    assert_eq!(content, "h", "a page never splits a character");
    assert_eq!(page["bytes"], 1);
    assert_eq!(page["eof"], false);
    let (rest, content) = h
        .read(json!({"name": name, "path": "/root/notes.txt", "offset": 1}))
        .await;
    assert_eq!(content, "éllo wörld");
    assert_eq!(rest["eof"], true);
    assert_eq!(rest["size"], 13);
    let (b64, content) = h
        .read(json!({"name": name, "path": "/root/notes.txt", "encoding": "base64"}))
        .await;
    assert_eq!(b64["encoding"], "base64");
    assert_eq!(content, "aMOpbGxvIHfDtnJsZA==");

    for line in ["boot", "ready", "third"] {
        fake.push_log(&name, line);
    }
    let logs = h.ok("machine-logs", json!({"name": name, "tail": 2})).await;
    assert_eq!(logs["lines"], json!(["ready", "third"]));
    fake.push_log(&name, "fourth");
    let more = h
        .ok(
            "machine-logs",
            json!({"name": name, "cursor": logs["cursor"]}),
        )
        .await;
    assert_eq!(more["lines"], json!(["fourth"]));

    let pulled = h
        .ok(
            "pull-image",
            json!({"name": name, "image": "python:3.12-alpine"}),
        )
        .await;
    assert_eq!(pulled["reference"], "python:3.12-alpine");

    let stopped = h.ok("stop-machine", json!({"name": name})).await;
    assert_eq!(stopped["machine"]["state"], "stopped");
    let restarted = h.ok("start-machine", json!({"name": name})).await;
    assert_eq!(restarted["ready"], true);

    let deleted = h.ok("delete-machine", json!({"name": name})).await;
    assert_eq!(deleted["deleted"], name.as_str());
    assert_eq!(deleted["usageMicros"], serde_json::Value::Null);
    assert!(
        h.err("list-machines", json!({"name": name}))
            .await
            .starts_with("NOT_FOUND")
    );
    let record = std::fs::read_to_string(h.record_path()).unwrap();
    assert!(
        !record.contains(&name),
        "delete-machine forgets it: {record}"
    );
}

#[tokio::test]
async fn output_past_the_budget_keeps_head_and_tail_and_spills_the_rest() {
    let fake = FakeServe::start().await;
    let h = Harness::on_fake(&fake, &[("SMOL_MCP_MAX_OUTPUT_BYTES", "300")]).await;
    fake.add_machine("big", "running");
    let long: Vec<u8> = (0..4096).map(|i| b'a' + (i % 26) as u8).collect();
    let expected_tail = String::from_utf8(long[long.len() - 100..].to_vec()).unwrap();
    fake.set_exec(move |req| {
        if req["command"][0] == "echo" {
            crate::common::fake_serve::default_exec(req)
        } else {
            exec_response(0, &long, b"")
        }
    });
    let r = h
        .ok("run-command", json!({"name": "big", "command": "yes"}))
        .await;
    assert_eq!(r["truncated"], true);
    let stdout = r["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("abcdefgh"), "{stdout}");
    assert!(stdout.contains("[... 3796 bytes dropped ...]"), "{stdout}");
    assert!(stdout.contains(&expected_tail[..50]));
    let overflow = &r["overflow"][0];
    assert_eq!(overflow["stream"], "stdout");
    assert_eq!(overflow["bytes"], 4096);
    let path = overflow["path"].as_str().unwrap();
    assert!(
        path.starts_with("/tmp/smol-mcp-") && path.ends_with(".stdout"),
        "{path}"
    );
    let stored = fake
        .state
        .lock()
        .unwrap()
        .files
        .get(&("big".to_string(), path.to_string()))
        .cloned();
    assert_eq!(
        stored.map(|b| b.len()),
        Some(4096),
        "the whole stream is in the machine"
    );
}

#[tokio::test]
async fn run_once_deletes_its_machine_on_every_path() {
    let (fake, h) = setup().await;
    let r = h
        .ok(
            "run-once",
            json!({"image": "alpine", "command": ["echo", "hello"]}),
        )
        .await;
    assert_eq!(r["stdout"], "hello\n");
    assert!(r["machine"].as_str().unwrap().starts_with("mcp-once-"));
    assert!(fake.has_no_machines());

    fake.set_exec(|req| {
        if req["command"][0] == "echo" {
            crate::common::fake_serve::default_exec(req)
        } else {
            exec_response(124, b"", b"\ncommand timed out after 1000ms")
        }
    });
    let timed = h
        .ok(
            "run-once",
            json!({"image": "alpine", "command": "sleep 600", "timeoutSecs": 1}),
        )
        .await;
    assert_eq!(timed["timedOut"], true);
    assert_eq!(timed["exitCode"], 124);
    assert!(fake.has_no_machines());

    // A start that fails: the machine still goes.
    fake.set_exec(|_| exec_response(1, b"", b"not ready"));
    let err = h
        .err("run-once", json!({"image": "alpine", "command": "true"}))
        .await;
    assert!(err.starts_with("NOT_READY"), "{err}");
    assert!(fake.has_no_machines());
    let record = std::fs::read_to_string(h.record_path()).unwrap();
    assert!(!record.contains("mcp-once-"), "{record}");
}

#[tokio::test]
async fn a_failed_start_deletes_an_unnamed_machine_and_keeps_a_named_one() {
    let (fake, h) = setup().await;
    fake.set_exec(|_| exec_response(1, b"", b"boot failed"));
    let err = h.err("create-machine", json!({"image": "alpine"})).await;
    assert!(
        err.starts_with("NOT_READY") && err.contains("was deleted again"),
        "{err}"
    );
    assert!(fake.has_no_machines());

    let err = h
        .err(
            "create-machine",
            json!({"image": "alpine", "name": "keep-me"}),
        )
        .await;
    assert!(err.contains("keep-me was created and is left"), "{err}");
    assert!(fake.has_machine("keep-me"));
}

#[tokio::test]
async fn branch_children_with_the_prefix_are_ephemeral() {
    let (fake, h) = setup().await;
    h.ok(
        "create-machine",
        json!({"image": "alpine", "name": "src", "branchable": true}),
    )
    .await;
    let refused = h
        .err("branch-machine", json!({"name": "mcp-x", "childName": "c"}))
        .await;
    assert!(refused.starts_with("NOT_FOUND"), "{refused}");
    let child = h
        .ok(
            "branch-machine",
            json!({"name": "src", "childName": "mcp-child"}),
        )
        .await;
    assert_eq!(child["ephemeral"], true);
    assert_eq!(child["ready"], true);
    fake.add_machine("plain", "running");
    let not_branchable = h
        .err(
            "branch-machine",
            json!({"name": "plain", "childName": "c2"}),
        )
        .await;
    assert!(
        // 1.32.2's words: "was not started as branchable ... --branchable".
        not_branchable.starts_with("CONFLICT") && not_branchable.contains("branchable"),
        "{not_branchable}"
    );
    let cleanup = h.protocol.process().cleanup_session(&h.session).await;
    assert_eq!(cleanup.deleted, ["mcp-child"]);
    let machines: Vec<String> = fake.machine_names();
    assert_eq!(machines, ["plain", "src"], "named machines persist");
}

#[tokio::test]
async fn bad_input_names_the_argument_and_sends_nothing() {
    let (fake, h) = setup().await;
    let cases = [
        (
            "create-machine",
            json!({"image": "alpine", "bogus": 1}),
            "bogus: not an argument of create-machine; its arguments are allowCidrs",
        ),
        (
            "create-machine",
            json!({"image": "alpine", "cpus": 0}),
            "cpus: 0 is out of range: give 1 to 64",
        ),
        (
            "create-machine",
            json!({"image": "alpine", "name": "no spaces"}),
            "name: \"no spaces\"",
        ),
        (
            "create-machine",
            json!({"image": "alpine", "ports": [{"guest": 70000}]}),
            "ports[0].guest: 70000 is out of range: give 1 to 65535",
        ),
        (
            "create-machine",
            json!({"image": "alpine", "allowCidrs": ["10.0.0.0/99"]}),
            "allowCidrs: \"10.0.0.0/99\"",
        ),
        (
            "create-machine",
            json!({"image": "alpine", "network": "off"}),
            "network",
        ),
        (
            "create-machine",
            json!({"image": "alpine", "target": "local"}),
            "target: not an argument",
        ),
        (
            "run-command",
            json!({"name": "m", "command": []}),
            "command: an argv array needs",
        ),
        (
            "run-command",
            json!({"name": "m", "command": ["a", 1]}),
            "command[1]: 1 is not accepted: give a string",
        ),
        (
            "run-command",
            json!({"name": "m", "command": "x", "timeoutSecs": 901}),
            "timeoutSecs: 901 is not accepted: give 1 to 900",
        ),
        (
            "read-file",
            json!({"name": "m", "path": "etc/hosts"}),
            "path: \"etc/hosts\" is not accepted: give an absolute path",
        ),
        (
            "write-file",
            json!({"name": "m", "path": "/x", "content": "@@", "encoding": "base64"}),
            "content: not valid base64",
        ),
        (
            "machine-logs",
            json!({"name": "m", "tail": 0}),
            "tail: 0 is out of range",
        ),
        (
            "delete-machine",
            json!({}),
            "name: required, and missing: Machine name",
        ),
        (
            "list-machines",
            json!({"bogus": 1}),
            "bogus: not an argument of list-machines; its arguments are name",
        ),
        (
            "create-machine",
            json!({"image": "alpine", "cpus": "2"}),
            "cpus: \"2\" is not accepted: give a whole number, 1 to 64",
        ),
    ];
    for (tool, args, expected) in cases {
        let err = h.err(tool, args.clone()).await;
        assert!(
            err.starts_with("INVALID_ARGUMENT: "),
            "{tool} {args}: {err}"
        );
        assert!(err.contains(expected), "{tool} {args}: {err}");
    }
    assert!(
        fake.take_requests().is_empty(),
        "nothing reached the engine"
    );
}

#[tokio::test]
async fn session_cleanup_deletes_only_ephemeral_machines() {
    let (fake, h) = setup().await;
    let a = h.ok("create-machine", json!({"image": "alpine"})).await;
    h.ok(
        "create-machine",
        json!({"image": "alpine", "name": "persistent"}),
    )
    .await;
    h.ok(
        "create-machine",
        json!({"image": "alpine", "name": "mcp-mine"}),
    )
    .await;
    let cleanup = h.protocol.process().cleanup_session(&h.session).await;
    let mut deleted = cleanup.deleted.clone();
    deleted.sort();
    let mut expected = vec![
        a["machine"]["name"].as_str().unwrap().to_owned(),
        "mcp-mine".to_owned(),
    ];
    expected.sort();
    assert_eq!(deleted, expected);
    let machines: Vec<String> = fake.machine_names();
    assert_eq!(machines, ["persistent"]);
}

#[tokio::test]
async fn the_pages_of_one_read_come_from_one_download() {
    let (fake, h) = setup().await;
    fake.add_machine("m", "running");
    h.ok(
        "write-file",
        json!({"name": "m", "path": "/f.txt", "content": "0123456789"}),
    )
    .await;
    fake.take_requests();
    let mut offset = 0;
    let mut text = String::new();
    loop {
        let (page, content) = h
            .read(json!({"name": "m", "path": "/f.txt", "offset": offset, "length": 3}))
            .await;
        text.push_str(&content);
        offset += page["bytes"].as_u64().unwrap();
        if page["eof"] == true {
            break;
        }
    }
    assert_eq!(text, "0123456789");
    let downloads = |fake: &FakeServe| {
        fake.take_requests()
            .iter()
            .filter(|r| r["method"] == "GET" && r["path"].as_str().unwrap().contains("/files/"))
            .count()
    };
    assert_eq!(downloads(&fake), 1, "four pages, one download");

    // A page out of order is read from a new download, skipped to its offset.
    let (_, content) = h
        .read(json!({"name": "m", "path": "/f.txt", "offset": 7, "length": 2}))
        .await;
    assert_eq!(content, "78");
    assert_eq!(downloads(&fake), 1);

    // A write in between: the next page is read afresh.
    h.ok(
        "write-file",
        json!({"name": "m", "path": "/f.txt", "content": "abcdefghij"}),
    )
    .await;
    let (_, content) = h
        .read(json!({"name": "m", "path": "/f.txt", "offset": 3, "length": 3}))
        .await;
    assert_eq!(content, "def");
    assert_eq!(downloads(&fake), 1);
    // A read from the start always fetches.
    h.ok("read-file", json!({"name": "m", "path": "/f.txt"}))
        .await;
    assert_eq!(downloads(&fake), 1);
}

#[tokio::test]
async fn create_without_start_then_start_it_branchable() {
    let (fake, h) = setup().await;
    let created = h
        .ok(
            "create-machine",
            json!({"image": "alpine", "name": "later", "start": false}),
        )
        .await;
    assert_eq!(created["ready"], false);
    assert_eq!(created["machine"]["state"], "created");
    let err = h
        .err(
            "create-machine",
            json!({"image": "alpine", "start": false, "branchable": true}),
        )
        .await;
    assert!(err.contains("pass branchable to start-machine"), "{err}");
    let started = h
        .ok(
            "start-machine",
            json!({"name": "later", "branchable": true}),
        )
        .await;
    assert_eq!(started["machine"]["branchable"], true);
    let start_request = fake
        .take_requests()
        .into_iter()
        .find(|r| r["path"] == "/api/v1/machines/later/start")
        .unwrap();
    assert_eq!(start_request["query"], "forkable=true");
    h.ok(
        "branch-machine",
        json!({"name": "later", "childName": "later-child"}),
    )
    .await;
}

/// A bad value is quoted by a short prefix, whatever its size: a 1 MB name, path or argument name
/// makes an error of a few hundred bytes, not a megabyte.
#[tokio::test]
async fn errors_quote_a_short_prefix_of_a_huge_value() {
    let (fake, h) = setup().await;
    let huge = "é".repeat(1 << 19);
    let cases = [
        ("create-machine", json!({"image": "alpine", "name": huge})),
        ("list-machines", json!({"name": huge})),
        ("read-file", json!({"name": "m", "path": huge})),
        (
            "write-file",
            json!({"name": "m", "path": "/x", "content": "@", "encoding": "base64", huge.clone(): 1}),
        ),
        ("create-machine", json!({"image": "alpine", "cpus": huge})),
        (
            "create-machine",
            json!({"image": "alpine", "allowHosts": [huge]}),
        ),
        (
            "run-command",
            json!({"name": "m", "command": "x", "env": {huge.clone(): "v"}}),
        ),
    ];
    for (tool, args) in cases {
        let err = h.err(tool, args).await;
        assert!(
            err.starts_with("INVALID_ARGUMENT: "),
            "{tool}: {}",
            &err[..200.min(err.len())]
        );
        assert!(err.len() < 600, "{tool}: an error of {} bytes", err.len());
    }
    assert!(fake.take_requests().is_empty());
}

/// The engine reads `tail` like `tail -n` and gives at most its newest 10000 lines (the fake
/// does the same): a first page asks for the tail wanted, a cursor finds its place by content
/// in the newest 10000, and one whose place has rolled out says so.
#[tokio::test]
async fn logs_ask_for_the_tail_and_resume_by_content_in_a_moving_window() {
    let (fake, h) = setup().await;
    fake.add_machine("chatty", "running");
    for i in 1..=12_000 {
        fake.push_log("chatty", &format!("line {i}"));
    }
    let first = h
        .ok("machine-logs", json!({"name": "chatty", "tail": 3}))
        .await;
    assert_eq!(
        first["lines"],
        json!(["line 11998", "line 11999", "line 12000"])
    );
    assert_eq!(first["gap"], false);
    let queries: Vec<serde_json::Value> = fake
        .take_requests()
        .into_iter()
        .filter(|r| r["path"] == "/api/v1/machines/chatty/logs")
        .map(|r| r["query"].clone())
        .collect();
    assert_eq!(queries, [json!("follow=false&source=workload&tail=3")]);

    for i in 12_001..=12_005 {
        fake.push_log("chatty", &format!("line {i}"));
    }
    let next = h
        .ok(
            "machine-logs",
            json!({"name": "chatty", "cursor": first["cursor"]}),
        )
        .await;
    assert_eq!(
        next["lines"],
        json!([
            "line 12001",
            "line 12002",
            "line 12003",
            "line 12004",
            "line 12005"
        ])
    );
    assert_eq!(next["gap"], false);
    let query = fake
        .take_requests()
        .into_iter()
        .find(|r| r["path"] == "/api/v1/machines/chatty/logs")
        .unwrap();
    assert_eq!(query["query"], "follow=false&source=workload&tail=10000");

    // More than the engine's window arrives: the cursor's lines are gone from it.
    for i in 12_006..=22_100 {
        fake.push_log("chatty", &format!("line {i}"));
    }
    let rolled = h
        .ok(
            "machine-logs",
            json!({"name": "chatty", "cursor": next["cursor"]}),
        )
        .await;
    assert_eq!(rolled["gap"], true);
    let lines = rolled["lines"].as_array().unwrap();
    assert_eq!(lines.last().unwrap(), "line 22100");
    assert!(lines.len() <= 10_000);
}

/// An ephemeral branchable source `mcp-src` and a child of it named `child`.
async fn source_and_child(h: &Harness, child: &str) {
    let source = h
        .ok(
            "create-machine",
            json!({"image": "alpine", "name": "mcp-src", "branchable": true}),
        )
        .await;
    assert_eq!(source["ephemeral"], true);
    h.ok(
        "branch-machine",
        json!({"name": "mcp-src", "childName": child}),
    )
    .await;
}

/// The engine refuses to delete a fork base while its clones live (the fake does the same):
/// the session's clean-up deletes the child first, then its source.
#[tokio::test]
async fn session_cleanup_deletes_a_branch_child_before_its_source() {
    let (fake, h) = setup().await;
    source_and_child(&h, "mcp-kid").await;
    let refused = h.err("delete-machine", json!({"name": "mcp-src"})).await;
    assert!(
        refused.starts_with("CONFLICT")
            && refused.contains("fork base of 1 live clone(s) (mcp-kid)"),
        "{refused}"
    );
    let record = std::fs::read_to_string(h.record_path()).unwrap();
    assert!(record.contains(r#""parent": "mcp-src""#), "{record}");
    let cleanup = h.protocol.process().cleanup_session(&h.session).await;
    assert_eq!(cleanup.failed, []);
    assert_eq!(cleanup.deleted, ["mcp-kid", "mcp-src"]);
    assert!(fake.has_no_machines());
    let record = std::fs::read_to_string(h.record_path()).unwrap();
    assert!(!record.contains("mcp-"), "{record}");
}

/// A record written before parents were recorded: the source comes first, is refused, and the
/// engine names a clone this same clean-up owns, so it is deleted with `cascade`.
#[tokio::test]
async fn session_cleanup_of_a_record_without_parents_still_deletes_both() {
    let (fake, h) = setup().await;
    source_and_child(&h, "mcp-kid").await;
    let path = h.record_path();
    let record = std::fs::read_to_string(&path).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&record).unwrap();
    for m in doc["machines"].as_array_mut().unwrap() {
        m.as_object_mut().unwrap().remove("parent");
    }
    std::fs::write(&path, doc.to_string()).unwrap();
    fake.take_requests();
    let cleanup = h.protocol.process().cleanup_session(&h.session).await;
    assert_eq!(cleanup.failed, []);
    assert_eq!(cleanup.deleted, ["mcp-kid", "mcp-src"]);
    assert!(fake.has_no_machines());
    let deletes: Vec<serde_json::Value> = fake
        .take_requests()
        .into_iter()
        .filter(|r| r["method"] == "DELETE")
        .map(|r| json!([r["path"], r["query"]]))
        .collect();
    assert_eq!(
        deletes,
        [
            json!(["/api/v1/machines/mcp-src", null]),
            json!(["/api/v1/machines/mcp-src", "cascade=true"]),
            json!(["/api/v1/machines/mcp-kid", null]),
        ]
    );
}

/// A clone the session does not own is never deleted by the clean-up's `cascade`: the source
/// stays, reported.
#[tokio::test]
async fn session_cleanup_never_cascades_into_a_clone_it_does_not_own() {
    let (fake, h) = setup().await;
    source_and_child(&h, "keep-me").await;
    let cleanup = h.protocol.process().cleanup_session(&h.session).await;
    assert_eq!(cleanup.deleted, Vec::<String>::new());
    assert_eq!(cleanup.failed.len(), 1);
    assert!(cleanup.failed[0].1.contains("keep-me"), "{cleanup:?}");
    let machines: Vec<String> = fake.machine_names();
    assert_eq!(machines, ["keep-me", "mcp-src"]);
}

/// The engine answers a start of a running machine with its record unchanged (the fake does
/// the same): asking it to become branchable is refused before the engine is asked.
#[tokio::test]
async fn start_branchable_on_a_running_machine_is_refused_with_the_way_out() {
    let (fake, h) = setup().await;
    h.ok("create-machine", json!({"image": "alpine", "name": "busy"}))
        .await;
    fake.take_requests();
    let err = h
        .err("start-machine", json!({"name": "busy", "branchable": true}))
        .await;
    assert!(err.starts_with("CONFLICT"), "{err}");
    assert!(
        err.contains("branchable")
            && err.contains("stop-machine, then start-machine with branchable true"),
        "{err}"
    );
    assert!(
        !fake
            .take_requests()
            .iter()
            .any(|r| r["path"] == "/api/v1/machines/busy/start"),
        "the engine is not asked"
    );
    h.ok("stop-machine", json!({"name": "busy"})).await;
    let started = h
        .ok("start-machine", json!({"name": "busy", "branchable": true}))
        .await;
    assert_eq!(started["machine"]["branchable"], true);
    // A running machine that is branchable already is simply started (the engine's no-op).
    h.ok("start-machine", json!({"name": "busy", "branchable": true}))
        .await;
    h.ok(
        "branch-machine",
        json!({"name": "busy", "childName": "busy-child"}),
    )
    .await;
}

/// The engine answers 408 with an empty body once its request deadline passes on a route it
/// bounds (the fake's is set to 1 s here; the engine's is 300 s), while the work goes on behind
/// it; an exec, which 1.32.2 does not bound, runs past the same deadline and answers.
#[tokio::test]
async fn a_request_past_the_engines_deadline_is_a_timeout_that_says_so_and_exec_is_not_cut() {
    let (fake, h) = setup().await;
    fake.add_machine("slow", "running");
    {
        let mut st = fake.state.lock().unwrap();
        st.request_deadline = Some(std::time::Duration::from_secs(1));
        st.file_delay = Some(std::time::Duration::from_secs(3));
        st.files
            .insert(("slow".into(), "/tmp/f".into()), b"bytes".to_vec());
        st.exec_delay = Some(std::time::Duration::from_secs(3));
    }
    let err = h
        .err("read-file", json!({"name": "slow", "path": "/tmp/f"}))
        .await;
    assert!(err.starts_with("TIMEOUT"), "{err}");
    assert!(
        err.contains("HTTP 408")
            && err.contains("request deadline (300 s) passed")
            && err.contains("may still be going on in the guest"),
        "{err}"
    );
    assert!(!err.contains("empty answer"), "{err}");
    // Both exec routes: the plain one (stdin) and the stream (a progress token).
    let plain = h
        .ok(
            "run-command",
            json!({"name": "slow", "command": "make", "timeoutSecs": 60, "stdin": ""}),
        )
        .await;
    assert_eq!(plain["exitCode"], 0, "{plain}");
}

/// A local timeout longer than the engine's 300 s request deadline is sent as asked (1.32.2
/// bounds exec by the command's own timeout only); the ceiling is the operator's
/// maxExecTimeoutSecs, on both tools.
#[tokio::test]
async fn a_local_timeout_past_300_s_is_sent_up_to_the_operators_ceiling() {
    let (fake, h) = setup().await;
    fake.add_machine("m", "running");
    fake.take_requests();
    let r = h
        .ok(
            "run-command",
            json!({"name": "m", "command": "true", "timeoutSecs": 600}),
        )
        .await;
    assert_eq!(r["exitCode"], 0);
    let sent = fake.take_requests();
    let exec = sent
        .iter()
        .find(|r| r["path"].as_str().is_some_and(|p| p.contains("/exec")))
        .unwrap();
    assert_eq!(exec["body"]["timeoutSecs"], 600, "{exec}");
    for (tool, args) in [
        (
            "run-command",
            json!({"name": "m", "command": "make", "timeoutSecs": 901}),
        ),
        (
            "run-once",
            json!({"image": "alpine", "command": "make", "timeoutSecs": 901}),
        ),
    ] {
        let err = h.err(tool, args).await;
        assert_eq!(
            err,
            "INVALID_ARGUMENT: timeoutSecs: 901 is not accepted: give 1 to 900 (this server's \
             ceiling, maxExecTimeoutSecs)",
            "{tool}"
        );
    }
    assert!(
        fake.take_requests().iter().all(|r| r["method"] == "GET"),
        "no machine is created and no command sent past the ceiling"
    );
}

/// Past 11 MiB on a stream the engine answers 500 "command output exceeded ..." and none of the
/// output: the error says so and how to get the output.
#[tokio::test]
async fn output_over_the_engines_cap_says_how_to_get_it() {
    let (fake, h) = setup().await;
    fake.add_machine("loud", "running");
    let over = vec![b'x'; crate::common::fake_serve::ENGINE_OUTPUT_CAP + 1];
    fake.set_exec(move |req| {
        if req["command"][0] == "echo" {
            crate::common::fake_serve::default_exec(req)
        } else {
            exec_response(0, &over, b"")
        }
    });
    // With stdin the plain exec runs (the stream route reads no stdin, and ends output past
    // its cap with an error frame instead: src/fleet/exec_stream.rs).
    let err = h
        .err(
            "run-command",
            json!({"name": "loud", "command": "yes | head -c 12M", "stdin": ""}),
        )
        .await;
    assert!(err.starts_with("UPSTREAM"), "{err}");
    assert!(
        err.contains("cap of 11 MiB per stream")
            && err.contains("read-file")
            && err.contains("command output exceeded 11534336 bytes"),
        "{err}"
    );
    // At the cap exactly, the output comes back.
    let at_cap = vec![b'y'; crate::common::fake_serve::ENGINE_OUTPUT_CAP];
    fake.set_exec(move |_| exec_response(0, &at_cap, b""));
    let r = h
        .ok("run-command", json!({"name": "loud", "command": "yes"}))
        .await;
    assert_eq!(r["truncated"], true, "shaped to the budget, spilled whole");
}

/// Each of the engine's three ways of reporting a timeout reads `timedOut: true`; a command that
/// exits 124 on its own well before its timeout does not.
#[tokio::test]
async fn every_form_of_the_engines_timeout_reads_timed_out() {
    let (fake, h) = setup().await;
    fake.add_machine("t", "running");
    for form in [
        TimeoutForm::Command,
        TimeoutForm::Container,
        TimeoutForm::Bare,
    ] {
        fake.state.lock().unwrap().timeout_form = form;
        let r = h
            .ok(
                "run-command",
                json!({"name": "t", "command": "sleep 5", "timeoutSecs": 1}),
            )
            .await;
        assert_eq!(r["exitCode"], 124, "{form:?}");
        assert_eq!(r["timedOut"], true, "{form:?}: {r}");
    }
    let r = h
        .ok(
            "run-command",
            json!({"name": "t", "command": "exit 124", "timeoutSecs": 5}),
        )
        .await;
    assert_eq!(
        (r["exitCode"].as_i64(), r["timedOut"].as_bool()),
        (Some(124), Some(false))
    );
    let r = h
        .ok(
            "run-command",
            json!({"name": "t", "command": "sleep 0.2", "timeoutSecs": 5}),
        )
        .await;
    assert_eq!(
        (r["exitCode"].as_i64(), r["timedOut"].as_bool()),
        (Some(0), Some(false))
    );
}

/// The states the engine has besides running and stopped: list and get report them as the
/// engine words them, none is called running, and only a machine with nothing running (failed,
/// or paused: saved, its VM stopped) is reported as started by the command that brings it up.
#[tokio::test]
async fn a_machine_in_every_engine_state_reads_sensibly() {
    let (fake, h) = setup().await;
    let states = [
        ("failed", true),
        ("unreachable", false),
        // 1.32.2's pause saves the guest and stops its VM: the command resumes it first.
        ("paused", true),
        ("pausing", false),
    ];
    for (state, _) in states {
        fake.add_machine(&format!("in-{state}"), state);
    }
    let listed = h.ok("list-machines", json!({})).await;
    let machines = listed["machines"].as_array().unwrap();
    for (state, started) in states {
        let name = format!("in-{state}");
        let m = machines
            .iter()
            .find(|m| m["name"] == name.as_str())
            .unwrap();
        assert_eq!(m["state"], state);
        assert_eq!(
            h.ok("list-machines", json!({"name": name})).await["machines"][0].clone()["state"],
            state
        );
        let r = h
            .ok("run-command", json!({"name": name, "command": "true"}))
            .await;
        assert_eq!(r["startedMachine"], started, "{state}");
    }
}

/// A base (a frozen branch source) runs nothing more: every tool that would run something in
/// it is refused at once, saying what to do instead, rather than waiting out the readiness
/// deadline (the engine's own 409 says "retry", which never helps), and its start is never
/// tried. A branch of it still works.
#[tokio::test]
async fn a_base_is_refused_at_once_by_what_would_run_in_it() {
    let fake = FakeServe::start().await;
    // Two minutes to wait for readiness, as by default: a refusal that waited would show.
    let h = Harness::on_fake(&fake, &[("SMOL_MCP_READY_TIMEOUT_SECS", "120")]).await;
    fake.add_machine("frozen-base", "frozen");
    fake.state
        .lock()
        .unwrap()
        .machines
        .get_mut("frozen-base")
        .unwrap()["branchable"] = json!(true);
    let calls = [
        (
            "run-command",
            json!({"name": "frozen-base", "command": "true"}),
        ),
        (
            "run-command",
            json!({"name": "frozen-base", "command": "sleep 1", "background": true}),
        ),
        (
            "read-file",
            json!({"name": "frozen-base", "path": "/etc/hostname"}),
        ),
        (
            "write-file",
            json!({"name": "frozen-base", "path": "/root/x", "content": "x"}),
        ),
        ("publish-port", json!({"name": "frozen-base", "port": 8080})),
    ];
    for (tool, args) in calls {
        let began = std::time::Instant::now();
        let err = h.err(tool, args.clone()).await;
        assert!(
            err.starts_with("CONFLICT")
                && err.contains("frozen-base is a base")
                && err.contains("branch-machine frozen-base"),
            "{tool}: {err}"
        );
        assert!(
            began.elapsed() < std::time::Duration::from_secs(10),
            "{tool} waited {:?}",
            began.elapsed()
        );
    }
    // Seen once by list-machines, the machine's network is known and a command goes straight
    // to exec without autoStart: refused as not running, it is still not started.
    h.ok("list-machines", json!({})).await;
    let err = h
        .err(
            "run-command",
            json!({"name": "frozen-base", "command": "true"}),
        )
        .await;
    assert!(err.contains("frozen-base is a base"), "{err}");
    let starts = fake
        .take_requests()
        .into_iter()
        .filter(|r| r["path"] == "/api/v1/machines/frozen-base/start")
        .count();
    assert_eq!(starts, 0, "a base is never started");
    h.ok(
        "branch-machine",
        json!({"name": "frozen-base", "childName": "from-base"}),
    )
    .await;
    let r = h
        .ok(
            "run-command",
            json!({"name": "from-base", "command": "true"}),
        )
        .await;
    assert_eq!(r["exitCode"], 0);
}

/// A directory read answers 200 JSON `entries` (1.32.2), which read-file refuses as a
/// directory; a missing file, a 500 in the source and a 404 in 1.32.2's spec, is NOT_FOUND
/// naming the path either way.
#[tokio::test]
async fn a_directory_and_a_missing_file_read_as_what_they_are() {
    let (fake, h) = setup().await;
    fake.add_machine("fs", "running");
    fake.state.lock().unwrap().directories.insert(
        ("fs".into(), "/root".into()),
        vec![json!({"name": "a.txt", "kind": "file", "size": 3})],
    );
    let err = h
        .err("read-file", json!({"name": "fs", "path": "/root"}))
        .await;
    assert!(
        err.starts_with("INVALID") && err.contains("/root is a directory"),
        "{err}"
    );
    for answer_404 in [false, true] {
        fake.state.lock().unwrap().missing_file_404 = answer_404;
        let err = h
            .err("read-file", json!({"name": "fs", "path": "/root/nope.txt"}))
            .await;
        assert!(
            err.starts_with("NOT_FOUND") && err.contains("/root/nope.txt does not exist"),
            "404 {answer_404}: {err}"
        );
    }
}

/// An upload over the engine's 100 MiB limit is refused before it is sent; the engine would
/// answer 413 in plain text.
#[tokio::test]
async fn an_upload_over_the_engines_limit_is_refused_before_it_is_sent() {
    use smol_mcp::fleet::{ErrorKind, FleetApi, LocalFleet};
    let fake = FakeServe::start().await;
    fake.add_machine("up", "running");
    let fleet = LocalFleet::new(fake.endpoint()).unwrap();
    let limit = usize::try_from(crate::common::fake_serve::ENGINE_UPLOAD_LIMIT).unwrap();
    let err = fleet
        .write_file("up", "/root/big", vec![0; limit + 1])
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Invalid);
    assert!(
        err.message.contains("100 MiB upload limit") && err.message.contains("in parts"),
        "the limit and the way around it: {err}"
    );
    assert!(fake.take_requests().is_empty(), "nothing was sent");

    // The engine's own answer, had it been sent: 413, plain text.
    let http = fake.endpoint().http_client().unwrap();
    let response = http
        .put(format!(
            "{}/api/v1/machines/up/files/root/big",
            fake.endpoint().base_url()
        ))
        .body(vec![0u8; limit + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    assert!(
        response
            .headers()
            .get("content-type")
            .is_some_and(|v| v.to_str().unwrap().starts_with("text/plain"))
    );
    assert_eq!(
        response.text().await.unwrap(),
        "file exceeds the 100 MiB upload limit"
    );
}

/// read-file's length is bounded by the page budget: past it the call is refused, naming the
/// bound, before the file is asked for (a length of 2^53 had the server buffer a whole 1 GiB
/// file).
#[tokio::test]
async fn a_read_longer_than_a_page_is_refused_before_anything_is_read() {
    let (fake, h) = setup().await;
    fake.add_machine("m", "running");
    fake.state
        .lock()
        .unwrap()
        .generated_files
        .insert(("m".into(), "/big".into()), 1 << 30);
    fake.take_requests();
    for (length, encoding, most) in [
        (1u64 << 53, "utf8", 65_536),
        (64 << 20, "utf8", 65_536),
        (65_537, "utf8", 65_536),
        (65_537, "base64", 65_536),
    ] {
        let err = h
            .err(
                "read-file",
                json!({"name": "m", "path": "/big", "length": length, "encoding": encoding}),
            )
            .await;
        assert!(
            err.starts_with("INVALID_ARGUMENT: length:")
                && err.contains(&format!("at most {most}")),
            "{length} {encoding}: {err}"
        );
    }
    assert!(
        fake.take_requests()
            .iter()
            .all(|r| !r["path"].as_str().unwrap_or_default().contains("/files/")),
        "no file was asked for"
    );
    let (page, text) = h
        .read(json!({"name": "m", "path": "/big", "length": 65_536}))
        .await;
    assert_eq!(text.len(), 65_536);
    assert_eq!(page["eof"], false);
}

/// A machine-logs cursor this server did not give is refused naming the argument, instead of
/// reading as none (every line returned as new, `gap: false`).
#[tokio::test]
async fn a_malformed_logs_cursor_is_refused() {
    let (fake, h) = setup().await;
    fake.add_machine("m", "running");
    fake.push_log("m", "a line");
    for cursor in ["garbage", "c:-1:x", "e:ev-1", ""] {
        let err = h
            .err("machine-logs", json!({"name": "m", "cursor": cursor}))
            .await;
        assert!(
            err.contains("cursor:") && err.contains("is not a cursor machine-logs gave"),
            "{cursor:?}: {err}"
        );
    }
    let first = h.ok("machine-logs", json!({"name": "m"})).await;
    let next = h
        .ok(
            "machine-logs",
            json!({"name": "m", "cursor": first["cursor"]}),
        )
        .await;
    assert_eq!(next["lines"], json!([]), "{next}");
}

/// Mounts need the operator's allow-list (unset: refused), resolve symlinks before the check,
/// and are read-only unless under mountWritable (without the list an agent could mount /etc or
/// ~/.ssh read-write).
#[tokio::test]
async fn mounts_need_the_operators_allow_list_and_are_read_only_by_default() {
    let (fake, h) = setup().await;
    let err = h
        .err(
            "create-machine",
            json!({"image": "a", "mounts": [{"source": "/etc", "target": "/mnt"}]}),
        )
        .await;
    insta::assert_snapshot!(err, @"INVALID_ARGUMENT: mounts[0].source: mounts are off on this server: the operator has allowed no host directory (mountAllow). Copy files in with write-file instead");
    let shared = tempfile::tempdir().unwrap();
    let writable = shared.path().join("rw");
    std::fs::create_dir(&writable).unwrap();
    let escape = shared.path().join("escape");
    std::os::unix::fs::symlink("/etc", &escape).unwrap();
    let runtime = tempfile::tempdir().unwrap();
    let allow = shared.path().display().to_string();
    let rw = writable.display().to_string();
    let h = crate::common::mcp::Harness::on_fake(
        &fake,
        &[
            ("SMOL_MCP_MOUNT_ALLOW", allow.as_str()),
            ("SMOL_MCP_MOUNT_WRITABLE", rw.as_str()),
        ],
    )
    .await;
    drop(runtime);
    let outside = |source: &str| {
        format!(
            "INVALID_ARGUMENT: mounts[0].source: {source} is not in a directory the operator \
             allows mounting (mountAllow: {allow})"
        )
    };
    for (source, readonly, refused) in [
        ("/etc".to_owned(), None, outside("/etc")),
        (
            escape.display().to_string(),
            None,
            outside(&escape.display().to_string()),
        ),
        (
            allow.clone(),
            Some(false),
            format!(
                "INVALID_ARGUMENT: mounts[0].readonly: false is not allowed for {allow}: the \
                 operator allows writable mounts only under mountWritable ({rw}); leave readonly \
                 out for a read-only mount"
            ),
        ),
    ] {
        let mut mount = json!({"source": source, "target": "/mnt"});
        if let Some(ro) = readonly {
            mount["readonly"] = json!(ro);
        }
        let err = h
            .err("create-machine", json!({"image": "a", "mounts": [mount]}))
            .await;
        assert_eq!(err, refused, "{source}");
    }
    fake.take_requests();
    h.ok(
        "create-machine",
        json!({"image": "a", "name": "mounted", "start": false, "mounts": [
            {"source": allow, "target": "/ro"},
            {"source": rw, "target": "/rw", "readonly": false}
        ]}),
    )
    .await;
    let sent = fake.take_requests();
    let create = sent.iter().find(|r| r["method"] == "POST").unwrap();
    let mounts = &create["body"]["mounts"];
    assert_eq!(mounts[0]["readonly"], true, "{mounts}");
    assert_eq!(mounts[1].get("readonly"), None, "{mounts}");
    // The engine will not pause a machine with mounts; the local fleet says what to do instead.
    h.ok(
        "create-machine",
        json!({"image": "a", "name": "mounted-live", "branchable": true, "mounts": [
            {"source": allow, "target": "/ro"}
        ]}),
    )
    .await;
    let refused = h
        .err(
            "stop-machine",
            json!({"name": "mounted-live", "pause": true}),
        )
        .await;
    assert!(
        refused.contains("host mounts")
            && refused.contains(
                "A machine with host mounts cannot be paused: stop-machine keeps its disk"
            ),
        "{refused}"
    );
}

/// A machine this server has seen is not asked for before each command: the exec goes alone,
/// without autoStart. Stopped behind the server's back, the machine refuses that exec at once;
/// it is then started (its boot reported like any start) and sent the command again. Deleted
/// behind its back, the command fails NOT_FOUND and the next one asks for the machine again.
#[tokio::test]
async fn a_seen_machine_runs_a_command_in_one_request_and_a_stopped_one_is_started_first() {
    let (fake, h) = setup().await;
    h.ok("create-machine", json!({"name": "seen"})).await;
    fake.take_requests();
    let ran = h
        .ok("run-command", json!({"name": "seen", "command": "true"}))
        .await;
    assert_eq!(ran["startedMachine"], false);
    let requests = fake.take_requests();
    let sent: Vec<String> = requests
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r["method"].as_str().unwrap(),
                r["path"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(sent, ["POST /api/v1/machines/seen/exec/stream"]);
    assert_eq!(requests[0]["body"]["autoStart"], false, "{requests:?}");
    assert!(
        ran.get("usage").is_none(),
        "its cost was not asked for: {ran}"
    );

    fake.state.lock().unwrap().machines.get_mut("seen").unwrap()["state"] = json!("stopped");
    let ran = h
        .ok("run-command", json!({"name": "seen", "command": "true"}))
        .await;
    assert_eq!(ran["startedMachine"], true, "{ran}");
    assert_eq!(ran["exitCode"], 0);
    let sent: Vec<String> = fake
        .take_requests()
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r["method"].as_str().unwrap(),
                r["path"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        sent,
        [
            "POST /api/v1/machines/seen/exec/stream",
            "GET /api/v1/machines/seen",
            "POST /api/v1/machines/seen/start",
            "POST /api/v1/machines/seen/exec/stream",
        ],
        "refused, started (its state read first, as every start), then run"
    );

    fake.state.lock().unwrap().machines.remove("seen");
    let gone = h
        .err("run-command", json!({"name": "seen", "command": "true"}))
        .await;
    assert!(gone.starts_with("NOT_FOUND"), "{gone}");
    fake.take_requests();
    h.err("run-command", json!({"name": "seen", "command": "true"}))
        .await;
    let first = &fake.take_requests()[0];
    assert_eq!(
        (first["method"].as_str(), first["path"].as_str()),
        (Some("GET"), Some("/api/v1/machines/seen"))
    );
}

/// A whole 1x1 red PNG (signature, IHDR, IDAT, IEND, their CRCs right): what a model can see.
const ONE_PIXEL_PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x02\0\0\0\x90wS\xde\0\0\0\x0cIDAT\x08\xd7c\xf8\xcf\xc0\0\0\x03\x01\x01\0\x18\xdd\x8d\xb0\0\0\0\0IEND\xaeB`\x82";

/// read-file with no encoding, offset or length: an image (known by its bytes, whatever its
/// name) comes whole as an image content block the model sees; asked for as base64 or a page,
/// the same file pages as bytes; a text file named .png stays text; past `maxImageBytes` the
/// read is refused with the size, the bound and `encoding` to use instead.
#[tokio::test]
async fn an_image_is_read_as_an_image_the_model_sees() {
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let fake = FakeServe::start().await;
    let h = Harness::on_fake(&fake, &[("SMOL_MCP_MAX_IMAGE_BYTES", "100")]).await;
    fake.add_machine("m", "running");
    let gif = b"GIF89a\x01\0\x01\0\x80\0\0\xff\0\0\0\0\0,\0\0\0\0\x01\0\x01\0\0\x02\x02D\x01\0;";
    let jpeg_head = b"\xff\xd8\xff\xe0\0\x10JFIF\0\x01\x01\0\0\x01\0\x01\0\0\xff\xd9";
    let webp = b"RIFF\x1a\0\0\0WEBPVP8L\x0d\0\0\0/\0\0\0\x10\x07\x10\x11\x11\x88\x88\xfe\x07\0";
    for (path, bytes, mime) in [
        ("/shot.png", ONE_PIXEL_PNG, "image/png"),
        ("/tmp/no-extension", &gif[..], "image/gif"),
        ("/photo.jpg", &jpeg_head[..], "image/jpeg"),
        ("/a.webp", &webp[..], "image/webp"),
    ] {
        h.ok(
            "write-file",
            json!({"name": "m", "path": path, "content": b64(bytes), "encoding": "base64"}),
        )
        .await;
        let answer = h
            .call("read-file", json!({"name": "m", "path": path}))
            .await;
        assert!(!answer.is_error, "{path}: {}", answer.text);
        assert_eq!(
            answer.images,
            vec![(mime.to_string(), b64(bytes))],
            "{path}"
        );
        assert_eq!(
            answer.blocks.len(),
            1,
            "{path}: the result's text, and no text page"
        );
        assert_eq!(answer.structured["encoding"], "image");
        assert_eq!(answer.structured["size"], bytes.len());
        assert_eq!(answer.structured["bytes"], bytes.len());
        assert_eq!(answer.structured["eof"], true);
    }
    // Asked for as bytes, or a page of it, an image pages as before.
    let (page, content) = h
        .read(json!({"name": "m", "path": "/shot.png", "encoding": "base64"}))
        .await;
    assert_eq!(
        (page["encoding"].clone(), content),
        (json!("base64"), b64(ONE_PIXEL_PNG))
    );
    let answer = h
        .call(
            "read-file",
            json!({"name": "m", "path": "/shot.png", "length": 8}),
        )
        .await;
    assert!(
        answer.images.is_empty() && answer.blocks.len() == 2,
        "{}",
        answer.text
    );
    // Its name does not make a text file an image.
    h.ok(
        "write-file",
        json!({"name": "m", "path": "/fake.png", "content": "not a picture"}),
    )
    .await;
    let (page, content) = h.read(json!({"name": "m", "path": "/fake.png"})).await;
    assert_eq!(
        (page["encoding"].clone(), content.as_str()),
        (json!("utf8"), "not a picture")
    );
    // Past the bound: refused, naming the size, the bound and what to do.
    let big = [ONE_PIXEL_PNG, &[0u8; 200][..]].concat();
    h.ok(
        "write-file",
        json!({"name": "m", "path": "/big.png", "content": b64(&big), "encoding": "base64"}),
    )
    .await;
    let err = h
        .err("read-file", json!({"name": "m", "path": "/big.png"}))
        .await;
    assert!(
        err.starts_with("INVALID_ARGUMENT: encoding:")
            && err.contains(&format!("image/png of {} bytes", big.len()))
            && err.contains("over the 100 bytes")
            && err.contains("maxImageBytes")
            && err.contains("encoding \"base64\""),
        "{err}"
    );
}

/// A port free on this host now (bound, then let go).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The bodies of the `PUT .../ports` requests among `requests`.
fn port_sets(requests: &[serde_json::Value]) -> Vec<serde_json::Value> {
    requests
        .iter()
        .filter(|r| r["method"] == "PUT" && r["path"].as_str().unwrap().ends_with("/ports"))
        .map(|r| r["body"]["ports"].clone())
        .collect()
}

/// publish-port against the fake serve whose guest shell runs commands on this host, so the
/// "guest's" sockets are this process's: a listener on every address is reachable, one on
/// loopback only is not, and the published port's URL names the host port the server chose.
#[tokio::test]
async fn a_port_is_published_once_something_listens_and_keeps_the_machines_other_ports() {
    let fake = FakeServe::start_guest_shell().await;
    let h = Harness::on_fake(&fake, &[]).await;
    fake.add_machine("web", "running");
    let service = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let guest = service.local_addr().unwrap().port();
    let published = h
        .ok("publish-port", json!({"name": "web", "port": guest}))
        .await;
    assert_eq!(published["listening"], true, "{published}");
    let host = published["hostPort"].as_u64().unwrap();
    assert_ne!(host, u64::from(guest), "a free host port was chosen");
    assert_eq!(published["url"], format!("http://127.0.0.1:{host}"));
    assert_eq!(published["startedMachine"], false);
    assert!(published.get("note").is_none(), "{published}");
    let record = h.ok("list-machines", json!({"name": "web"})).await["machines"][0].clone();
    assert_eq!(record["ports"], json!([{"guest": guest, "host": host}]));
    assert_eq!(
        port_sets(&fake.take_requests()),
        [json!([{"guest": guest, "host": host}])]
    );

    // Asked again, it answers again without changing anything.
    let again = h
        .ok("publish-port", json!({"name": "web", "port": guest}))
        .await;
    assert_eq!(again["url"], published["url"]);
    assert!(port_sets(&fake.take_requests()).is_empty());

    // A service on the guest's loopback only: published, but the answer says to rebind it.
    let inner = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let inner_port = inner.local_addr().unwrap().port();
    let second = h
        .ok(
            "publish-port",
            json!({"name": "web", "port": inner_port, "waitSecs": 1}),
        )
        .await;
    assert_eq!(second["listening"], false, "{second}");
    let note = second["note"].as_str().unwrap();
    assert!(
        note.contains("loopback only") && note.contains("0.0.0.0"),
        "{note}"
    );
    let sets = port_sets(&fake.take_requests());
    let sent = sets.last().unwrap().as_array().unwrap();
    assert_eq!(sent.len(), 2, "the first port is kept: {sent:?}");
    assert_eq!(sent[0], json!({"guest": guest, "host": host}));

    // Nothing listening at all, within a second.
    let idle = free_port();
    let third = h
        .ok(
            "publish-port",
            json!({"name": "web", "port": idle, "waitSecs": 1}),
        )
        .await;
    assert_eq!(third["listening"], false);
    assert!(
        third["note"]
            .as_str()
            .unwrap()
            .contains("nothing listened on port"),
        "{third}"
    );

    // A host port another machine holds, asked for: refused, naming the argument.
    fake.add_machine("other", "running");
    let err = h
        .err(
            "publish-port",
            json!({"name": "other", "port": 80, "hostPort": host, "waitSecs": 0}),
        )
        .await;
    assert!(
        err.starts_with(&format!("CONFLICT: hostPort: {host} is held")),
        "{err}"
    );
    // Gone with its machine: the port is free for another.
    h.ok("delete-machine", json!({"name": "web"})).await;
    let moved = h
        .ok(
            "publish-port",
            json!({"name": "other", "port": 80, "hostPort": host, "waitSecs": 0}),
        )
        .await;
    assert_eq!(moved["hostPort"], host);
    drop(service);
}

/// The operator's publishPorts bounds the host ports, chosen or asked for; a machine holds at
/// most 16; a stopped machine is started first and the answer says so.
#[tokio::test]
async fn published_ports_stay_within_the_operators_range_and_the_per_machine_bound() {
    // Two ports in a row that are free now.
    let first = loop {
        let p = free_port();
        if p < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            break p;
        }
    };
    let range = format!("{first}-{}", first + 1);
    let fake = FakeServe::start().await;
    let h = Harness::on_fake(&fake, &[("SMOL_MCP_PUBLISH_PORTS", range.as_str())]).await;
    for name in ["a", "b", "c"] {
        fake.add_machine(name, "running");
    }
    let err = h
        .err(
            "publish-port",
            json!({"name": "a", "port": 80, "hostPort": 1024}),
        )
        .await;
    assert_eq!(
        err,
        format!(
            "INVALID_ARGUMENT: hostPort: 1024 is outside the host ports this server may publish \
             ({range}, the operator's publishPorts): give one within it, or leave hostPort out \
             to have a free one chosen"
        )
    );
    let mut placed = Vec::new();
    for name in ["a", "b"] {
        let answer = h
            .ok(
                "publish-port",
                json!({"name": name, "port": 80, "waitSecs": 0}),
            )
            .await;
        placed.push(answer["hostPort"].as_u64().unwrap());
    }
    placed.sort_unstable();
    assert_eq!(placed, [u64::from(first), u64::from(first) + 1]);
    let err = h
        .err(
            "publish-port",
            json!({"name": "c", "port": 80, "waitSecs": 0}),
        )
        .await;
    assert!(
        err.starts_with(&format!(
            "LIMIT_REACHED: port: no host port in the operator's publishPorts ({range}) was free"
        )),
        "{err}"
    );

    let (fake, h) = setup().await;
    fake.add_machine("many", "running");
    for port in 1..=16 {
        h.ok(
            "publish-port",
            json!({"name": "many", "port": 9000 + port, "waitSecs": 0}),
        )
        .await;
    }
    let err = h
        .err(
            "publish-port",
            json!({"name": "many", "port": 9100, "waitSecs": 0}),
        )
        .await;
    assert!(
        err.starts_with("LIMIT_REACHED: port: many already publishes 16 ports"),
        "{err}"
    );
    fake.add_machine("sleepy", "stopped");
    let started = h
        .ok(
            "publish-port",
            json!({"name": "sleepy", "port": 80, "waitSecs": 0}),
        )
        .await;
    assert_eq!(started["startedMachine"], true, "{started}");
    let err = h
        .err(
            "publish-port",
            json!({"name": "nobody", "port": 80, "waitSecs": 0}),
        )
        .await;
    assert!(err.starts_with("NOT_FOUND"), "{err}");
    let err = h
        .err("publish-port", json!({"name": "many", "port": 0}))
        .await;
    assert!(err.starts_with("INVALID_ARGUMENT: port"), "{err}");
}

/// The terminal tool against the fake serve's interactive exec (a line program behind the
/// engine's WebSocket frames): opened, typed into with text and keys, resized, read again by
/// cursor, ended by its program's exit; and the refusals, each naming its argument.
#[tokio::test]
async fn a_terminal_is_typed_into_read_by_cursor_resized_and_ended() {
    let (fake, h) = setup().await;
    fake.add_machine("t", "running");
    let opened = h.ok("terminal", json!({"name": "t"})).await;
    let id = opened["terminal"].as_str().unwrap().to_owned();
    assert!(id.starts_with("t-"), "{opened}");
    assert_eq!(opened["output"], "$ ");
    assert_eq!(opened["cursor"], 2);
    assert_eq!(opened["startedMachine"], false);
    assert!(opened.get("ended").is_none(), "{opened}");
    let said = h
        .ok(
            "terminal",
            json!({"name": "t", "terminal": id, "input": "hello wörld", "keys": ["enter"]}),
        )
        .await;
    assert_eq!(said["output"], "hello wörld\nyou said: hello wörld\n$ ");
    let resized = h
        .ok(
            "terminal",
            json!({"name": "t", "terminal": id, "cols": 100, "rows": 30}),
        )
        .await;
    assert_eq!(resized["output"], "[100x30]\n$ ", "escapes stripped");
    let raw = h
        .ok(
            "terminal",
            json!({"name": "t", "terminal": id, "cursor": said["cursor"], "raw": true, "waitMs": 0}),
        )
        .await;
    assert_eq!(raw["output"], "\u{1b}[1;32m[100x30]\u{1b}[0m\r\n$ ");
    // The screen as painted, from everything printed since the terminal opened, at its new
    // size; the stream's answer is unchanged beside it.
    let painted = h
        .ok(
            "terminal",
            json!({"name": "t", "terminal": id, "waitMs": 0, "screen": true}),
        )
        .await;
    let screen = &painted["screen"];
    let rows = crate::common::strings(&screen["rows"]);
    assert_eq!(rows.len(), 30, "{painted}");
    assert_eq!(
        &rows[..4],
        ["$ hello wörld", "you said: hello wörld", "$ [100x30]", "$"],
        "{painted}"
    );
    assert_eq!(screen["cursor"], json!([3, 2]), "{painted}");
    assert_eq!(painted["output"], "", "{painted}");
    let interrupted = h
        .ok(
            "terminal",
            json!({"name": "t", "terminal": id, "input": "abc", "keys": ["ctrl-c"]}),
        )
        .await;
    assert_eq!(interrupted["output"], "abc^C\n$ ");
    let ended = h
        .ok(
            "terminal",
            json!({"name": "t", "terminal": id, "input": "exit 7", "keys": ["enter"]}),
        )
        .await;
    assert_eq!(ended["ended"], "exited 7", "{ended}");
    assert_eq!(ended["output"], "exit 7\n");
    assert_eq!(
        fake.state.lock().unwrap().terminal_log,
        ["open t sh 80x24", "resize 100x30", "exit 7"]
    );
    for (args, refusal) in [
        (
            json!({"name": "t", "terminal": id, "keys": ["hyper"]}),
            "INVALID_ARGUMENT: keys: \"hyper\" is not a key this server knows: enter,",
        ),
        (
            json!({"name": "t", "close": true}),
            "INVALID_ARGUMENT: close: names no terminal",
        ),
        (
            json!({"name": "other", "terminal": id}),
            "NOT_FOUND: terminal:",
        ),
        (
            json!({"name": "t", "terminal": id, "cols": 90}),
            "INVALID_ARGUMENT: cols: a resize takes both cols and rows",
        ),
        (
            json!({"name": "t", "terminal": id, "command": "top"}),
            "INVALID_ARGUMENT: command:",
        ),
        (json!({"name": "nowhere"}), "NOT_FOUND"),
        // The screen model's bound: 500 columns by 200 rows.
        (
            json!({"name": "t", "terminal": id, "cols": 501, "rows": 30}),
            "INVALID_ARGUMENT: cols",
        ),
        (
            json!({"name": "t", "terminal": id, "cols": 100, "rows": 201}),
            "INVALID_ARGUMENT: rows",
        ),
    ] {
        let err = h.err("terminal", args.clone()).await;
        assert!(err.starts_with(refusal), "{args}: {err}");
    }
}

/// Terminals are bounded per machine and per session, end with their machine and their
/// session, and run what the call names.
#[tokio::test]
async fn terminals_are_bounded_and_end_with_their_machine_and_session() {
    let (fake, h) = setup().await;
    for name in ["a", "b", "c"] {
        fake.add_machine(name, "running");
    }
    let open = |name: &str| json!({"name": name, "waitMs": 0});
    let mut in_a = Vec::new();
    for _ in 0..4 {
        in_a.push(h.ok("terminal", open("a")).await["terminal"].clone());
    }
    let err = h.err("terminal", open("a")).await;
    assert_eq!(
        err,
        "LIMIT_REACHED: terminal: a has 4 terminals open, the most one machine may: close one \
         (close: true) first"
    );
    let closed = h
        .ok(
            "terminal",
            json!({"name": "a", "terminal": in_a[0], "close": true}),
        )
        .await;
    assert_eq!(closed["ended"], "closed: closed by the agent");
    in_a[0] = h.ok("terminal", open("a")).await["terminal"].clone();
    let argv = h
        .ok(
            "terminal",
            json!({"name": "b", "command": ["python3", "-i"], "waitMs": 0}),
        )
        .await;
    let shell = h
        .ok(
            "terminal",
            json!({"name": "b", "command": "top -b | head", "cols": 120, "rows": 40, "waitMs": 0}),
        )
        .await;
    h.ok("terminal", open("b")).await;
    h.ok("terminal", open("c")).await;
    let err = h.err("terminal", open("c")).await;
    assert!(
        err.starts_with("LIMIT_REACHED: terminal: this session has 8 terminals open"),
        "{err}"
    );
    // Deleting a machine ends its terminals.
    h.ok("delete-machine", json!({"name": "a"})).await;
    let err = h
        .err("terminal", json!({"name": "a", "terminal": in_a[1]}))
        .await;
    assert!(err.starts_with("NOT_FOUND: terminal:"), "{err}");
    // The session's end ends the rest.
    h.protocol.policy.shutdown(&h.session).await;
    let mut log = Vec::new();
    for _ in 0..50 {
        log = fake.state.lock().unwrap().terminal_log.clone();
        if log.iter().filter(|e| e.starts_with("closed ")).count() == 9 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        log.contains(&"open b python3 -i 80x24".to_owned()),
        "{log:?}"
    );
    assert!(
        log.contains(&"open b sh -c top -b | head 120x40".to_owned()),
        "{log:?}"
    );
    let closed: Vec<&String> = log.iter().filter(|e| e.starts_with("closed ")).collect();
    let opened = log.iter().filter(|e| e.starts_with("open ")).count();
    assert_eq!(
        (opened, closed.len()),
        (9, 9),
        "every program ended: {log:?}"
    );
    let _ = (argv, shell);
}

/// A save that outlasts the engine's request deadline (the fake's is 1 s here, the engine's
/// 300 s; on the nested engine a save takes 10 to 16 minutes): the pause is answered 408, the
/// machine reads `unreachable` while the save has stopped its guest, and stop-machine waits
/// that out and answers it paused. A save that leaves the machine `failed` is the pause's
/// error, naming the state.
#[tokio::test]
async fn a_pause_past_the_engines_deadline_waits_out_an_unreachable_machine() {
    let (fake, h) = setup().await;
    fake.add_forkable("slow");
    fake.add_forkable("lost");
    {
        let mut st = fake.state.lock().unwrap();
        st.request_deadline = Some(std::time::Duration::from_secs(1));
        for (name, end) in [("slow", "paused"), ("lost", "failed")] {
            let script = ["running", "unreachable", end].map(String::from).to_vec();
            st.pause_save.insert(name.into(), script);
        }
    }
    let (paused, err) = tokio::join!(
        h.ok("stop-machine", json!({"name": "slow", "pause": true})),
        h.err("stop-machine", json!({"name": "lost", "pause": true})),
    );
    assert_eq!(paused["machine"]["state"], "paused", "{paused}");
    assert!(
        err.starts_with("CONFLICT")
            && err.contains("the pause did not finish: the machine is failed"),
        "{err}"
    );
    let st = fake.state.lock().unwrap();
    assert!(
        st.saving.is_empty(),
        "every state was read: {:?}",
        st.saving
    );
    let mut pauses = st.pauses.clone();
    pauses.sort();
    assert_eq!(pauses, ["pause lost", "pause slow"]);
}

/// stop-machine with pause on the fake serve: refused before anything is sent for a machine not
/// started branchable or not running, paused otherwise; the next command (by either of its
/// paths), read, write or start resumes it and says so.
#[tokio::test]
async fn a_paused_machine_is_resumed_by_the_next_call_and_says_so() {
    let (fake, h) = setup().await;
    fake.add_machine("plain", "running");
    fake.add_machine("off", "stopped");
    let err = h
        .err("stop-machine", json!({"name": "plain", "pause": true}))
        .await;
    assert!(
        err.starts_with("CONFLICT: pause: plain was not started branchable")
            && err.contains("start-machine with branchable: true"),
        "{err}"
    );
    let err = h
        .err("stop-machine", json!({"name": "off", "pause": true}))
        .await;
    assert!(err.starts_with("CONFLICT: pause: off is stopped"), "{err}");
    assert!(fake.state.lock().unwrap().pauses.is_empty(), "nothing sent");

    fake.add_forkable("kept");
    let pause = json!({"name": "kept", "pause": true});
    let paused = h.ok("stop-machine", pause.clone()).await;
    assert_eq!(paused["machine"]["state"], "paused", "{paused}");
    let again = h.ok("stop-machine", pause.clone()).await;
    assert_eq!(again["machine"]["state"], "paused");
    // The first command asks for the machine; the later ones are refused by the engine as
    // not running and resume it then.
    for _ in 0..2 {
        let ran = h
            .ok(
                "run-command",
                json!({"name": "kept", "command": ["echo", "hi"]}),
            )
            .await;
        assert_eq!(
            (ran["stdout"].clone(), ran["startedMachine"].clone()),
            (json!("hi\n"), json!(true)),
            "{ran}"
        );
        h.ok("stop-machine", pause.clone()).await;
    }
    h.ok(
        "write-file",
        json!({"name": "kept", "path": "/tmp/a", "content": "x"}),
    )
    .await;
    h.ok("stop-machine", pause.clone()).await;
    let (page, _) = h.read(json!({"name": "kept", "path": "/tmp/a"})).await;
    assert_eq!(page["startedMachine"], true, "{page}");
    h.ok("stop-machine", pause.clone()).await;
    let started = h.ok("start-machine", json!({"name": "kept"})).await;
    assert_eq!(started["machine"]["state"], "running", "{started}");
    let running = h
        .ok(
            "run-command",
            json!({"name": "kept", "command": ["echo", "on"]}),
        )
        .await;
    assert_eq!(running["startedMachine"], false);
    assert_eq!(
        fake.state.lock().unwrap().pauses,
        [
            "pause kept",
            "resume kept",
            "pause kept",
            "resume kept",
            "pause kept",
            "resume kept",
            "pause kept",
            "resume kept",
            "pause kept",
            "resume kept"
        ]
    );
}

/// With publishPorts left unset, the host ports are the default range above Linux's ephemeral
/// ports: a well-known port (a database's, a web server's) is refused when asked for, and a
/// chosen one lies in the range.
#[tokio::test]
async fn without_publish_ports_the_host_ports_stay_above_the_ephemeral_range() {
    let fake = FakeServe::start().await;
    let h = Harness::on_fake(&fake, &[]).await;
    fake.add_machine("svc", "running");
    for asked in [22, 80, 5432, 40000] {
        let err = h
            .err(
                "publish-port",
                json!({"name": "svc", "port": 80, "hostPort": asked}),
            )
            .await;
        assert!(
            err.starts_with(&format!(
                "INVALID_ARGUMENT: hostPort: {asked} is outside the host ports this server may \
                 publish (61000-65535, the operator's publishPorts)"
            )),
            "{err}"
        );
    }
    let placed = h
        .ok(
            "publish-port",
            json!({"name": "svc", "port": 80, "waitSecs": 0}),
        )
        .await;
    let port = placed["hostPort"].as_u64().unwrap();
    assert!((61000..=65535).contains(&port), "{placed}");
}
