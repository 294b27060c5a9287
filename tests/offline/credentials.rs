//! Credential bindings against the fakes: an operator's secret an agent names at create and
//! never sees. The machine is created with the binding (never its value), the value is
//! supplied before every boot this server causes (a start, an exec that boots, a start after
//! a restart of the server), the workload sees only the placeholder, and the value appears in
//! no tool result, error, progress notification, ledger byte, request snapshot or log line of
//! the server, even when a command prints it (as a server that echoes a request would).
//! What the real engine does with the value is checked on the nested guest
//! (tests/guest/booted_guest.rs).

use crate::common::fake_cloud::FakeCloud;
use crate::common::fake_serve::FakeServe;
use crate::common::mcp::Harness;
use crate::common::stdio::{StdioServer, server_env};
use serde_json::{Value, json};

const SECRET: &str = "ghp_the-real-value-7f3a91c2";
const FILE_SECRET: &str = "file-held-value-55e1d0";

fn bindings(file: &std::path::Path) -> String {
    json!([
        {"name": "github", "env": "GH_TOKEN", "hosts": ["api.github.com"], "fromEnv": "SMOL_TEST_GH"},
        {"name": "registry", "env": "REG_TOKEN", "hosts": ["*.registry.example.com"], "fromFile": file.display().to_string()},
        {"name": "unset", "env": "UNSET_TOKEN", "hosts": ["unset.example.com"], "fromEnv": "SMOL_TEST_NEVER_SET"}
    ])
    .to_string()
}

/// A file holding `text`, which a command reads back, as a workload would print what a server
/// echoed: the value reaches the output without being in any argument.
fn echo_file(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), text).unwrap();
    file
}

fn secret_file() -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), format!("{FILE_SECRET}\n")).unwrap();
    file
}

/// The fake guest shell, the file credential's file, a runtime directory and the stdio
/// server's environment with the three bindings, logging at `log`.
async fn stdio_setup(
    log: &str,
) -> (
    FakeServe,
    tempfile::NamedTempFile,
    tempfile::TempDir,
    Vec<(String, String)>,
) {
    let fake = FakeServe::start_guest_shell().await;
    let file = secret_file();
    let runtime = tempfile::tempdir().unwrap();
    let url = fake.url();
    let credentials = bindings(file.path());
    let env = server_env(
        runtime.path(),
        &[
            ("SMOL_LOCAL_URL", &url),
            ("SMOL_MCP_CREDENTIALS", &credentials),
            ("SMOL_TEST_GH", SECRET),
            ("SMOL_MCP_LOG", log),
        ],
    );
    (fake, file, runtime, env)
}

/// A server on `fake` with the three bindings, and the file credential's file it reads.
async fn with_bindings(fake: &FakeServe) -> (tempfile::NamedTempFile, Harness) {
    let file = secret_file();
    let credentials = bindings(file.path());
    let extra = [
        ("SMOL_MCP_CREDENTIALS", credentials.as_str()),
        ("SMOL_TEST_GH", SECRET),
    ];
    (file, Harness::on_fake(fake, &extra).await)
}

/// Fails when `value` appears anywhere in `haystack`.
fn assert_nowhere(what: &str, haystack: &str) {
    for secret in [SECRET, FILE_SECRET] {
        assert!(
            !haystack.contains(secret),
            "{what} holds a credential value: {haystack}"
        );
    }
}

fn puts(fake: &FakeServe) -> Vec<Value> {
    fake.take_requests()
        .into_iter()
        .filter(|r| r["method"] == "PUT")
        .collect()
}

#[tokio::test]
async fn a_machine_made_with_credentials_sees_placeholders_and_gets_the_values_at_each_boot() {
    let fake = FakeServe::start_guest_shell().await;
    let (file, h) = with_bindings(&fake).await;
    let created = h
        .ok(
            "create-machine",
            json!({"name": "box", "image": "alpine", "credentials": ["github", "registry"]}),
        )
        .await;
    assert_nowhere("the create result", &created.to_string());
    // The bindings' hosts join the allow list of a machine that would otherwise be blocked.
    assert_eq!(
        created["machine"]["network"],
        "allow(api.github.com,*.registry.example.com)"
    );
    let requests = fake.take_requests();
    let create = requests
        .iter()
        .find(|r| r["method"] == "POST" && r["path"] == "/api/v1/machines")
        .unwrap();
    assert_eq!(
        create["body"]["credentials"],
        json!({"credentials": [
            {"name": "github", "environment_variable": "GH_TOKEN", "allowed_hosts": ["api.github.com"]},
            {"name": "registry", "environment_variable": "REG_TOKEN", "allowed_hosts": ["*.registry.example.com"]}
        ]})
    );
    // The values went to the engine before its start, and that boot got them.
    let put = requests
        .iter()
        .position(|r| r["method"] == "PUT")
        .expect("the values were supplied");
    let start = requests
        .iter()
        .position(|r| r["path"] == "/api/v1/machines/box/start")
        .unwrap();
    assert!(put < start, "supplied before the start: {requests:?}");
    assert_eq!(
        requests[put]["body"],
        json!({"values": {"github": SECRET, "registry": FILE_SECRET}})
    );
    let booted = fake.state.lock().unwrap().booted_values["box"].clone();
    assert_eq!(booted["github"], SECRET);

    // The workload holds the placeholder, never the value.
    let seen = h
        .ok(
            "run-command",
            json!({"name": "box", "command": "echo \"$GH_TOKEN\" \"$REG_TOKEN\""}),
        )
        .await;
    let stdout = seen["stdout"].as_str().unwrap();
    assert!(
        stdout.starts_with("SMOL_PLACEHOLDER_GITHUB_")
            && stdout.contains("SMOL_PLACEHOLDER_REGISTRY_"),
        "{seen}"
    );
    // A command that prints the value (a server echoing the request it got) gives the agent
    // the binding's name instead, on both streams, and so does the ledger.
    let out = echo_file(&format!("before {SECRET} after\n"));
    let echoed = h
        .ok(
            "run-command",
            json!({"name": "box", "command": format!("cat {} ; cat {} >&2", out.path().display(), file.path().display())}),
        )
        .await;
    assert_eq!(echoed["stdout"], "before [credential github] after\n");
    assert_eq!(echoed["stderr"], "[credential registry]\n");
    h.protocol.policy.ledger.flush().await;
    let rt = h.runtime.path().join("rt");
    for entry in std::fs::read_dir(&rt).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let bytes = std::fs::read(&path).unwrap();
            assert_nowhere(
                &path.display().to_string(),
                &String::from_utf8_lossy(&bytes),
            );
        }
    }

    // The engine restarts (it forgets every value), the machine is started again: its boot
    // has the values all the same, supplied once before it.
    h.ok("stop-machine", json!({"name": "box"})).await;
    {
        let mut st = fake.state.lock().unwrap();
        st.credential_values.clear();
        st.booted_values.clear();
    }
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    fake.take_requests();
    h.ok("start-machine", json!({"name": "box"})).await;
    assert_eq!(
        puts(&fake).len(),
        1,
        "one supply before the start and its probe"
    );
    let booted = fake.state.lock().unwrap().booted_values["box"].clone();
    assert_eq!(booted["github"], SECRET);
    // Deleted: nothing is supplied for the name any more.
    h.ok("delete-machine", json!({"name": "box"})).await;
    assert!(
        h.protocol
            .process()
            .credentials
            .bound_to("box")
            .await
            .is_empty(),
        "forgotten with its machine"
    );
}

#[tokio::test]
async fn credentials_are_refused_by_name_with_what_to_do() {
    let fake = FakeServe::start().await;
    let (_file, h) = with_bindings(&fake).await;
    let unknown = h
        .err("create-machine", json!({"credentials": ["gitlab"]}))
        .await;
    assert!(
        unknown.contains("credentials")
            && unknown.contains("\"gitlab\" is not a credential of this server")
            && unknown.contains("github, registry, unset"),
        "{unknown}"
    );
    let missing = h
        .err(
            "run-once",
            json!({"command": ["true"], "credentials": ["unset"]}),
        )
        .await;
    assert!(
        missing.contains("credential unset has no value: set SMOL_TEST_NEVER_SET"),
        "{missing}"
    );
    // Nothing was created for either.
    assert!(
        !fake
            .take_requests()
            .iter()
            .any(|r| r["method"] == "POST" && r["path"] == "/api/v1/machines"),
        "a refused call creates nothing"
    );

    // A server without bindings says it has none.
    let plain = Harness::on_fake(&fake, &[]).await;
    let none = plain
        .err("create-machine", json!({"credentials": ["github"]}))
        .await;
    assert!(none.contains("it has none"), "{none}");
}

#[tokio::test]
async fn the_cloud_fleet_refuses_credentials_and_says_why() {
    let fake = FakeCloud::start().await;
    let file = secret_file();
    let credentials = bindings(file.path());
    let h = Harness::on_fake_cloud(
        &fake,
        &[
            ("SMOL_MCP_CREDENTIALS", &credentials),
            ("SMOL_TEST_GH", SECRET),
        ],
    )
    .await;
    let refused = h
        .err(
            "create-machine",
            json!({"image": "alpine", "credentials": ["github"]}),
        )
        .await;
    assert!(
        refused.contains("credentials are local only") && refused.contains("published spec"),
        "{refused}"
    );
    assert!(fake.take_requests().is_empty(), "nothing sent");
}

#[test]
fn bad_bindings_stop_the_server_at_start_naming_the_setting() {
    let runtime = tempfile::tempdir().unwrap();
    let bad = json!([{"name": "x", "env": "X", "hosts": ["API.example.com"], "fromEnv": "V"}])
        .to_string();
    let out = std::process::Command::new(crate::common::stdio::SERVER)
        .env_clear()
        .envs(server_env(
            runtime.path(),
            &[("SMOL_MCP_CREDENTIALS", &bad)],
        ))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    insta::assert_snapshot!(
        crate::common::without_timestamps(&stderr),
        @r#"[time] ERROR configuration: credentials ($SMOL_MCP_CREDENTIALS): binding "x": host "API.example.com" must be a lowercase DNS name (api.example.com), or *. and a name of two labels or more (*.example.com); no scheme, port or IP"#
    );
}

/// Over the binary: the value is in no message on stdout (results, progress, log messages)
/// and no line on stderr (the server's own log, at debug), and a restarted server still
/// supplies the values of a machine the previous one made.
#[tokio::test]
async fn no_value_leaves_the_binary_and_a_restart_still_supplies_them() {
    let (fake, _file, runtime, env) = stdio_setup("debug").await;
    let stderr_path = runtime.path().join("stderr.log");
    let mut server = StdioServer::spawn_with_stderr(env.clone(), &stderr_path).await;
    server
        .tool(
            1,
            "create-machine",
            json!({"name": "kept", "image": "alpine", "credentials": ["github"]}),
        )
        .await;
    // With a progress token, the output goes out as notifications too.
    let echo = echo_file(&format!("{SECRET}\n"));
    let echo = echo.path().display().to_string();
    let answer = server
        .request(
            2,
            "tools/call",
            json!({"name": "run-command", "arguments": {"name": "kept", "command": format!("cat {echo}; sleep 0.3; cat {echo}")}, "_meta": {"progressToken": "p"}}),
        )
        .await;
    assert_nowhere("the result", &answer.to_string());
    assert!(
        answer.to_string().contains("[credential github]"),
        "{answer}"
    );
    let bad = server
        .request(
            3,
            "tools/call",
            json!({"name": "run-command", "arguments": {"name": "kept", "command": format!("cat {echo} >&2; exit 3")}}),
        )
        .await;
    assert_nowhere("a failed command's result", &bad.to_string());
    let all = server.messages_so_far();
    assert!(
        all.iter().any(|m| m["method"] == "notifications/progress"),
        "progress was sent"
    );
    for message in &all {
        assert_nowhere("a message on stdout", &message.to_string());
    }
    server
        .tool(4, "stop-machine", json!({"name": "kept"}))
        .await;
    server.close_stdin();
    server.child.wait().await.unwrap();

    // The next process knows the machine's bindings and supplies them before its start.
    fake.take_requests();
    let mut next = StdioServer::spawn_with_stderr(env, &runtime.path().join("stderr2.log")).await;
    next.tool(1, "start-machine", json!({"name": "kept"})).await;
    let supplied = puts(&fake);
    assert_eq!(supplied.len(), 1, "{supplied:?}");
    assert_eq!(supplied[0]["body"]["values"]["github"], SECRET);
    next.close_stdin();
    next.child.wait().await.unwrap();
    for log in ["stderr.log", "stderr2.log"] {
        let text = std::fs::read_to_string(runtime.path().join(log)).unwrap();
        assert!(!text.is_empty(), "the server logged at debug");
        assert_nowhere(log, &text);
    }
}

/// A restarted server knows a file's value before it answers anything: a machine the previous
/// process made and supplied still runs, and what its commands print of the value (a file
/// holding it, as a server's echo would leave) is replaced in the next process's answers and
/// ledger too, though this process has not booted it.
#[tokio::test]
async fn a_restarted_server_redacts_a_files_value_it_has_not_supplied_yet() {
    let (fake, _file, runtime, env) = stdio_setup("warn").await;
    let mut first =
        StdioServer::spawn_with_stderr(env.clone(), &runtime.path().join("1.log")).await;
    first
        .tool(
            1,
            "create-machine",
            json!({"name": "carried", "image": "alpine", "credentials": ["registry"]}),
        )
        .await;
    first.close_stdin();
    first.child.wait().await.unwrap();

    let echoed = echo_file(&format!("token={FILE_SECRET}\n"));
    let echoed = echoed.path().display().to_string();
    fake.take_requests();
    let mut next = StdioServer::spawn_with_stderr(env, &runtime.path().join("2.log")).await;
    // A file in the machine holding the value (the fake keeps machine files apart from host
    // files): as a workload would save what a server echoed.
    fake.state.lock().unwrap().files.insert(
        ("carried".into(), "/tmp/echoed".into()),
        format!("token={FILE_SECRET}\n").into_bytes(),
    );
    // Whole (the page of a read is in the content, beside the structured result).
    let read = next
        .request(
            1,
            "tools/call",
            json!({"name": "read-file", "arguments": {"name": "carried", "path": "/tmp/echoed"}}),
        )
        .await;
    let ran = next
        .tool(
            2,
            "run-command",
            json!({"name": "carried", "command": format!("cat {echoed}")}),
        )
        .await;
    next.close_stdin();
    next.child.wait().await.unwrap();
    // Nothing was supplied in this process: the value was known from its start.
    assert!(
        !fake
            .take_requests()
            .iter()
            .any(|r| r["path"].as_str().unwrap().ends_with("/credential-values")),
    );
    for (what, answer) in [("run-command", &ran), ("read-file", &read)] {
        assert_nowhere(what, &answer.to_string());
        assert!(
            answer.to_string().contains("token=[credential registry]"),
            "{what}: {answer}"
        );
    }
    // The ledger (its file and write-ahead log) and every other file of the runtime directory.
    let mut dirs = vec![runtime.path().join("rt")];
    let mut files = 0;
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                files += 1;
                assert_nowhere(
                    &path.display().to_string(),
                    &String::from_utf8_lossy(&bytes),
                );
            }
        }
    }
    assert!(files > 0);
}

/// Fails when four bytes or more of a value, in a row, appear in `text`: a piece of it.
fn assert_no_piece(what: &str, text: &str) {
    for secret in [SECRET, FILE_SECRET] {
        for piece in secret.as_bytes().windows(4) {
            let piece = std::str::from_utf8(piece).unwrap();
            assert!(
                !text.contains(piece),
                "{what} holds {piece:?}, a piece of a credential value: {text}"
            );
        }
    }
}

/// Every cut the server makes in output is moved off a value: the head and tail of a long
/// output, pages of a file and of a job's output read one after another (and one starting
/// inside a value), and a value printed in three pieces across progress notifications. No
/// answer holds any piece of it (four bytes or more), and a value in a page shows as its
/// label there.
#[tokio::test]
async fn no_cut_of_the_servers_lets_a_piece_of_a_value_through() {
    let (fake, _file, runtime, mut env) = stdio_setup("warn").await;
    env.push(("SMOL_MCP_MAX_OUTPUT_BYTES".into(), "48".into()));
    env.push(("SMOL_MCP_JOB_POLL_MILLIS".into(), "100".into()));
    let mut server =
        StdioServer::spawn_with_stderr(env.clone(), &runtime.path().join("cuts.log")).await;
    server
        .tool(
            1,
            "create-machine",
            json!({"name": "cuts", "image": "alpine", "credentials": ["github"]}),
        )
        .await;

    // The head (32 bytes of 48) ends inside the first value, the tail (16) starts inside the
    // second.
    let long = echo_file(&format!(
        "{}{SECRET}{}{SECRET}ccccc",
        "a".repeat(30),
        "b".repeat(200)
    ));
    let cut = server
        .tool(
            2,
            "run-command",
            json!({"name": "cuts", "command": format!("cat {}", long.path().display())}),
        )
        .await;
    assert_eq!(cut["truncated"], true, "{cut}");
    assert_no_piece("a long output's head and tail", &cut["stdout"].to_string());

    // In three pieces, a notification each.
    let (a, b) = (&SECRET[..9], &SECRET[9..18]);
    let c = &SECRET[18..];
    let pieces = server
        .request(
            3,
            "tools/call",
            json!({"name": "run-command", "arguments": {"name": "cuts", "command": format!("printf %s 'x {a}'; sleep 0.5; printf %s '{b}'; sleep 0.5; printf %s '{c} y'")}, "_meta": {"progressToken": "pieces"}}),
        )
        .await;
    assert_eq!(
        pieces["result"]["structuredContent"]["stdout"],
        "x [credential github] y"
    );
    let notes: Vec<String> = server
        .messages_so_far()
        .into_iter()
        .filter(|m| {
            m["method"] == "notifications/progress" && m["params"]["progressToken"] == "pieces"
        })
        .map(|m| m["params"]["message"].as_str().unwrap_or("").to_owned())
        .filter(|m| m.contains("[stdout]"))
        .collect();
    assert!(notes.len() >= 2, "the output went out in pieces: {notes:?}");
    for note in &notes {
        assert_no_piece("a progress notification", note);
    }
    assert!(notes.concat().contains("[credential github]"), "{notes:?}");

    // Pages of a file: the first would end inside the value, the next start inside it.
    fake.state.lock().unwrap().files.insert(
        ("cuts".into(), "/tmp/paged".into()),
        format!("0123456789{SECRET}abcdef").into_bytes(),
    );
    let (mut offset, mut joined) = (0, String::new());
    for id in 10.. {
        let page = server
            .request(
                id,
                "tools/call",
                json!({"name": "read-file", "arguments": {"name": "cuts", "path": "/tmp/paged", "offset": offset, "length": 16}}),
            )
            .await;
        let read = &page["result"]["structuredContent"];
        assert_no_piece("a page of a file", &page.to_string());
        joined.push_str(page["result"]["content"][1]["text"].as_str().unwrap());
        offset = read["offset"].as_u64().unwrap() + read["bytes"].as_u64().unwrap();
        if read["eof"] == true {
            break;
        }
        assert!(id < 20, "the pages never ended: {page}");
    }
    assert_eq!(joined, "0123456789[credential github]abcdef");
    for (offset, encoding) in [(15, "utf8"), (12, "base64")] {
        let inside = server
            .request(
                30 + offset,
                "tools/call",
                json!({"name": "read-file", "arguments": {"name": "cuts", "path": "/tmp/paged", "offset": offset, "length": 5, "encoding": encoding}}),
            )
            .await;
        let content = inside["result"]["content"][1]["text"]
            .as_str()
            .unwrap()
            .to_owned();
        let shown = match encoding {
            "base64" => {
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(&content)
                    .unwrap();
                String::from_utf8(bytes).unwrap()
            }
            _ => content,
        };
        assert_eq!(shown, "[credential github]", "{inside}");
    }

    // Pages of a job's output (48 bytes each): the first would end inside the value.
    let job_out = echo_file(&format!("{}{SECRET}{}", "x".repeat(40), "y".repeat(10)));
    let started = server
        .tool(
            50,
            "run-command",
            json!({"name": "cuts", "command": format!("cat {}", job_out.path().display()), "background": true}),
        )
        .await;
    let job = started["job"].as_str().unwrap().to_owned();
    let (mut cursor, mut joined) = ("0:0".to_owned(), String::new());
    for id in 51.. {
        let report = server
            .tool(
                id,
                "job-output",
                json!({"job": job, "cursor": cursor, "waitSecs": 2}),
            )
            .await;
        assert_no_piece("a page of a job's output", &report.to_string());
        joined.push_str(report["stdout"].as_str().unwrap());
        cursor = report["cursor"].as_str().unwrap().to_owned();
        if report["state"] != "running" && report["more"] == false {
            break;
        }
        assert!(id < 70, "the job's pages never ended: {report}");
    }
    assert_eq!(
        joined,
        format!("{}[credential github]{}", "x".repeat(40), "y".repeat(10))
    );
    server.close_stdin();
    server.child.wait().await.unwrap();
    // Every answer and notification (the initialize answer's own words, "the real value",
    // are no piece of one).
    for message in server.messages_so_far() {
        if message["id"] != 0 {
            assert_no_piece("a message on stdout", &message.to_string());
        }
    }
}

/// A value changed across a restart (the operator rotated `$SMOL_TEST_GH`) while a machine
/// kept the old one: the new process cannot redact the old value, so it serves nothing of the
/// machine's output or files (a command, a read, a job taken over from the first process),
/// saying which credential and what to do; stop, describe and delete still work. The machine's
/// record keeps a fingerprint of what it was given, never the value, and the old value back
/// opens the machine again.
#[tokio::test]
async fn a_machine_holding_a_value_the_server_no_longer_has_shows_nothing() {
    let (_fake, _file, runtime, env) = stdio_setup("warn").await;
    let mut first =
        StdioServer::spawn_with_stderr(env.clone(), &runtime.path().join("1.log")).await;
    first
        .tool(
            1,
            "create-machine",
            json!({"name": "rotated", "image": "alpine", "credentials": ["github"]}),
        )
        .await;
    let job = first
        .tool(
            2,
            "run-command",
            json!({"name": "rotated", "command": "sleep 30", "background": true}),
        )
        .await;
    first.close_stdin();
    first.child.wait().await.unwrap();

    let rotated: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| match k.as_str() {
            "SMOL_TEST_GH" => (k.clone(), "ghp_a-rotated-value-0b7e".to_owned()),
            _ => (k.clone(), v.clone()),
        })
        .collect();
    let mut next = StdioServer::spawn_with_stderr(rotated, &runtime.path().join("2.log")).await;
    let calls = [
        ("run-command", json!({"name": "rotated", "command": "true"})),
        (
            "read-file",
            json!({"name": "rotated", "path": "/etc/hostname"}),
        ),
        ("job-output", json!({"job": job["job"]})),
        (
            "branch-machine",
            json!({"name": "rotated", "childName": "rotated-child"}),
        ),
    ];
    for (id, (tool, args)) in (1..).zip(calls) {
        let refused = next
            .request(id, "tools/call", json!({"name": tool, "arguments": args}))
            .await;
        assert_eq!(refused["result"]["isError"], true, "{tool}: {refused}");
        let text = refused["result"]["content"][0]["text"].as_str().unwrap();
        assert!(
            text.contains("credential github")
                && text.contains("does not have now")
                && text.contains("delete the machine"),
            "{tool}: {text}"
        );
    }
    let described = next
        .tool(10, "list-machines", json!({"name": "rotated"}))
        .await["machines"][0]
        .clone();
    assert_eq!(described["name"], "rotated", "{described}");
    next.tool(11, "stop-machine", json!({"name": "rotated"}))
        .await;
    next.close_stdin();
    next.child.wait().await.unwrap();
    // A fingerprint is kept, no value.
    let record = std::fs::read_to_string(runtime.path().join("rt/machines.json")).unwrap();
    assert!(record.contains("\"supplied\""), "{record}");
    assert_nowhere("machines.json", &record);
    assert!(!record.contains("ghp_a-rotated-value-0b7e"), "{record}");

    // The earlier value back: the machine is served again, its output redacted.
    let mut back = StdioServer::spawn_with_stderr(env, &runtime.path().join("3.log")).await;
    let echoed = echo_file(&format!("{SECRET}\n"));
    let ran = back
        .tool(
            1,
            "run-command",
            json!({"name": "rotated", "command": format!("cat {}", echoed.path().display())}),
        )
        .await;
    assert_eq!(ran["stdout"], "[credential github]\n", "{ran}");
    back.tool(2, "delete-machine", json!({"name": "rotated"}))
        .await;
    back.close_stdin();
    back.child.wait().await.unwrap();
}

/// A base keeps the bindings its user gave the machine it was made from, and nothing more: its
/// children (made by a later process, by create-machine and by branch-machine) hold those and
/// no other, a child cannot be given more, and each boot of a child gets exactly its bindings'
/// values.
#[tokio::test]
async fn a_bases_children_hold_the_bindings_of_its_source_and_no_other() {
    let fake = FakeServe::start_guest_shell().await;
    let file = secret_file();
    let url = fake.url();
    let credentials = bindings(file.path());
    let env = [
        ("SMOL_LOCAL_URL", url.as_str()),
        ("SMOL_MCP_CREDENTIALS", credentials.as_str()),
        ("SMOL_TEST_GH", SECRET),
    ];
    let first = Harness::start(&env).await;
    first
        .ok(
            "create-machine",
            json!({"name": "with-github", "image": "alpine", "branchable": true, "credentials": ["github"]}),
        )
        .await;
    first
        .ok(
            "create-machine",
            json!({"name": "without", "image": "alpine", "branchable": true}),
        )
        .await;
    for source in ["with-github", "without"] {
        first
            .ok(
                "branch-machine",
                json!({"name": source, "childName": format!("{source}-first"), "freezeSource": true}),
            )
            .await;
    }

    let next = first.next_process(&env).await;
    fake.take_requests();
    next.ok(
        "create-machine",
        json!({"base": "with-github", "name": "github-child"}),
    )
    .await;
    next.ok(
        "branch-machine",
        json!({"name": "without", "childName": "plain-child", "count": 2}),
    )
    .await;
    let err = next
        .err(
            "create-machine",
            json!({"base": "without", "name": "more", "credentials": ["registry"]}),
        )
        .await;
    assert!(
        err.starts_with("INVALID_ARGUMENT") && err.contains("credentials: cannot go with base"),
        "{err}"
    );
    let credentials = &next.protocol.process().credentials;
    assert_eq!(
        credentials.bound_to("github-child").await,
        vec!["github".to_owned()]
    );
    assert!(credentials.bound_to("plain-child-1").await.is_empty());
    assert!(credentials.bound_to("plain-child-2").await.is_empty());

    let shown = |r: Value| r["stdout"].as_str().unwrap_or_default().to_owned();
    let seen = shown(
        next.ok(
            "run-command",
            json!({"name": "github-child", "command": "echo \"$GH_TOKEN|$REG_TOKEN\""}),
        )
        .await,
    );
    assert!(
        seen.starts_with("SMOL_PLACEHOLDER_GITHUB_") && seen.ends_with("|\n"),
        "{seen}"
    );
    for child in ["plain-child-1", "plain-child-2"] {
        let seen = shown(
            next.ok(
                "run-command",
                json!({"name": child, "command": "echo \"$GH_TOKEN|$REG_TOKEN\""}),
            )
            .await,
        );
        assert_eq!(seen, "|\n", "{child}");
    }

    // Each child booted again: its boot gets exactly the values of its bindings, supplied
    // under its own name (once: the same values are not sent again within seconds).
    for child in ["github-child", "plain-child-1", "plain-child-2"] {
        next.ok("stop-machine", json!({"name": child})).await;
        next.ok("start-machine", json!({"name": child})).await;
    }
    let supplied: Vec<(String, Value)> = puts(&fake)
        .into_iter()
        .map(|r| (r["path"].as_str().unwrap().to_owned(), r["body"].clone()))
        .collect();
    assert_eq!(
        supplied,
        vec![(
            "/api/v1/machines/github-child/credential-values".to_owned(),
            json!({"values": {"github": SECRET}})
        )]
    );
    let booted = fake.state.lock().unwrap().booted_values.clone();
    assert_eq!(
        booted.get("github-child").cloned().unwrap_or_default(),
        [("github".to_owned(), SECRET.to_owned())].into()
    );
    for child in ["plain-child-1", "plain-child-2"] {
        assert!(
            booted.get(child).is_none_or(|values| values.is_empty()),
            "{child}: {booted:?}"
        );
    }
}
