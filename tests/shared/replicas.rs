//! Server processes given one database (`storeUrl`) answer as one, each with a runtime
//! directory of its own (nothing shared but the database): a keyed call answered by one is
//! replayed by another without reaching the engine again, and a run made through one is listed
//! by another. A server refuses to start on a database whose schema is newer than it knows.

use super::database::TestDatabase;
use crate::common::clients::{HTTP_SERVER, HttpServer, stateless_request};
use crate::common::fake_serve::FakeServe;
use crate::common::stdio::server_env;
use serde_json::{Value, json};
use std::time::Duration;

const TOKEN: &str = "replicas-token";

/// `count` `smol-mcp-http` processes with the static `token`, each with a runtime directory of
/// its own, on one new database and one fake serve (its guest shell), with `extra` settings.
pub async fn processes(
    count: usize,
    token: &str,
    extra: &[(&str, &str)],
) -> (
    TestDatabase,
    FakeServe,
    Vec<tempfile::TempDir>,
    Vec<HttpServer>,
) {
    let db = TestDatabase::new().await;
    let fake = FakeServe::start_guest_shell().await;
    let url = fake.url();
    let mut vars = vec![
        ("SMOL_LOCAL_URL", url.as_str()),
        ("SMOL_MCP_STORE_URL", db.url.as_str()),
    ];
    vars.extend_from_slice(extra);
    let mut dirs = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..count {
        let rt = tempfile::tempdir().unwrap();
        servers.push(HttpServer::spawn(rt.path(), token, &vars).await);
        dirs.push(rt);
    }
    (db, fake, dirs, servers)
}

/// [`processes`] with this module's token, as an array of `N`.
async fn replicas<const N: usize>(
    extra: &[(&str, &str)],
) -> (
    TestDatabase,
    FakeServe,
    Vec<tempfile::TempDir>,
    [HttpServer; N],
) {
    let (db, fake, dirs, servers) = processes(N, TOKEN, extra).await;
    let servers: [HttpServer; N] = servers
        .try_into()
        .unwrap_or_else(|_| panic!("{N} processes"));
    (db, fake, dirs, servers)
}

fn creates(fake: &FakeServe) -> usize {
    fake.take_requests()
        .iter()
        .filter(|r| r["method"] == "POST" && r["path"] == "/api/v1/machines")
        .count()
}

async fn call(server: &HttpServer, tool: &str, args: Value) -> Value {
    let answer = stateless_request(
        server,
        TOKEN,
        "tools/call",
        json!({}),
        json!({"name": tool, "arguments": args}),
    )
    .await;
    answer["result"].clone()
}

#[tokio::test]
async fn a_key_answered_through_one_process_replays_through_another() {
    let (_db, fake, _dirs, [a, b]) = replicas(&[]).await;

    let create = json!({"name": "shared-box", "image": "alpine", "idempotencyKey": "make-1"});
    let first = call(&a, "create-machine", create.clone()).await;
    assert_eq!(first["isError"], false, "{first}");
    assert_eq!(creates(&fake), 1);
    let again = call(&b, "create-machine", create).await;
    assert_eq!(again["isError"], false, "{again}");
    assert_eq!(
        again["structuredContent"]["machine"]["name"], "shared-box",
        "{again}"
    );
    assert_eq!(
        creates(&fake),
        0,
        "the repeat through b did nothing: {again}"
    );
    // The same key with other arguments, through b, is refused as another call.
    let other = call(
        &b,
        "create-machine",
        json!({"name": "other-box", "image": "alpine", "idempotencyKey": "make-1"}),
    )
    .await;
    assert_eq!(other["isError"], true, "{other}");
    assert_eq!(creates(&fake), 0);

    let ran = call(
        &a,
        "run-command",
        json!({"name": "shared-box", "command": "echo through-a"}),
    )
    .await;
    assert_eq!(ran["isError"], false, "{ran}");
    let runs = stateless_request(
        &b,
        TOKEN,
        "resources/read",
        json!({}),
        json!({"uri": "smol://runs"}),
    )
    .await;
    let text = runs["result"]["contents"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("through-a"), "b lists a's run: {runs}");
}

#[tokio::test]
async fn a_server_refuses_to_start_on_a_newer_schema() {
    let db = TestDatabase::new().await;
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE smol_mcp_schema (version INTEGER PRIMARY KEY, applied_ms BIGINT NOT NULL); \
             INSERT INTO smol_mcp_schema VALUES (1, 0), (2, 0), (3, 0), (42, 0);",
        )
        .await
        .unwrap();
    let rt = tempfile::tempdir().unwrap();
    let port = crate::common::real_serve::free_port().to_string();
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(HTTP_SERVER)
            .env_clear()
            .envs(server_env(
                rt.path(),
                &[
                    ("SMOL_MCP_AUTH_TOKEN", TOKEN),
                    ("SMOL_MCP_HTTP_PORT", port.as_str()),
                    ("SMOL_MCP_STORE_URL", db.url.as_str()),
                ],
            ))
            .output(),
    )
    .await
    .expect("the server stops at once")
    .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("storeUrl") && stderr.contains("version 42, newer than this server knows"),
        "{stderr}"
    );
    let password = super::database::server_url();
    let password = password
        .split_once(':')
        .and_then(|(_, rest)| rest.split_once(':'))
        .and_then(|(_, rest)| rest.split_once('@'))
        .map(|(p, _)| p.to_owned())
        .unwrap();
    assert!(
        !stderr.contains(&password),
        "the password is in the log: {stderr}"
    );
}

/// Waits for `what`, polling `done` until `limit`.
async fn until<T>(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(value) = done().await {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn stop(server: &HttpServer) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(server.child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
}

/// A process killed outright (no clean-up of any kind) with a sessionless client's machine
/// and a running job: a sibling takes both over within its watch (the machine's lease
/// adopted, the job watched from there and read to its end), and when the siblings stop,
/// every machine is gone from the engine.
#[tokio::test]
async fn a_killed_process_s_machine_and_job_move_to_a_sibling_and_nothing_leaks() {
    let (db, fake, _dirs, [mut a, mut b, mut c]) =
        replicas(&[("SMOL_MCP_JOB_POLL_MILLIS", "100")]).await;

    let made = call(&a, "create-machine", json!({"image": "alpine"})).await;
    assert_eq!(made["isError"], false, "{made}");
    let machine = made["structuredContent"]["machine"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let started = call(
        &a,
        "run-command",
        json!({"name": machine, "background": true,
               "command": "for i in 1 2 3 4 5 6 7 8; do echo \"line $i\"; sleep 0.5; done; exit 3"}),
    )
    .await;
    assert_eq!(started["isError"], false, "{started}");
    let job = started["structuredContent"]["job"]
        .as_str()
        .unwrap()
        .to_owned();

    a.child.start_kill().unwrap();
    a.child.wait().await.unwrap();

    // One of the siblings takes the job over; whichever it is answers for it to its end.
    let (owner, first) = until(
        "a sibling to take the job over",
        Duration::from_secs(30),
        async || {
            for (name, server) in [("b", &b), ("c", &c)] {
                let report = call(server, "job-output", json!({"job": job, "cursor": "0:0"})).await;
                if report["isError"] == false {
                    return Some((name, report));
                }
            }
            None
        },
    )
    .await;
    let server = if owner == "b" { &b } else { &c };
    let mut stdout = first["structuredContent"]["stdout"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut cursor = first["structuredContent"]["cursor"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut last = first["structuredContent"].clone();
    while last["state"] == "running" || last["more"] == true {
        let report = call(
            server,
            "job-output",
            json!({"job": job, "cursor": cursor, "waitSecs": 2}),
        )
        .await;
        assert_eq!(report["isError"], false, "{report}");
        last = report["structuredContent"].clone();
        stdout.push_str(last["stdout"].as_str().unwrap());
        cursor = last["cursor"].as_str().unwrap().to_owned();
    }
    assert_eq!(
        stdout,
        (1..=8).map(|i| format!("line {i}\n")).collect::<String>()
    );
    assert_eq!(last["exitCode"], 3, "{last}");

    // The machine is a sessionless client's, whose lease has not run out: a sibling adopts it
    // within its watch, as a process started after the dead one would at its start.
    let siblings = [b.child.id().unwrap(), c.child.id().unwrap()];
    let client = db.client().await;
    until(
        "a sibling to adopt the machine",
        Duration::from_secs(20),
        async || {
            let text: String = client
                .query_opt(
                    "SELECT body::text FROM ephemeral_machines WHERE name = $1",
                    &[&machine],
                )
                .await
                .unwrap()?
                .get(0);
            let entry: Value = serde_json::from_str(&text).unwrap();
            let owner = u32::try_from(entry["ownerPid"].as_u64()?).ok()?;
            siblings.contains(&owner).then_some(())
        },
    )
    .await;

    // The sessionless client's machine still answers, through either sibling.
    let ran = call(
        &b,
        "run-command",
        json!({"name": machine, "command": "echo still-here"}),
    )
    .await;
    assert_eq!(ran["structuredContent"]["stdout"], "still-here\n", "{ran}");
    assert_eq!(fake.state.lock().unwrap().machines.len(), 1);

    // The siblings stop as a supervisor stops them: whichever adopted the machine deletes it.
    stop(&b);
    stop(&c);
    for server in [&mut b, &mut c] {
        let status = tokio::time::timeout(Duration::from_secs(30), server.child.wait())
            .await
            .expect("a sibling did not stop")
            .unwrap();
        assert!(status.success(), "{status}");
    }
    let left: Vec<String> = fake.machine_names();
    assert!(left.is_empty(), "machines leaked: {left:?}");
}

/// An input-required answer (the network ask) given through another process than the one
/// that asked applies there once: every process seals with the key they share in the store,
/// and takes a state once among them all. A replayed state with another answer, and a
/// tampered one, are refused by a third, and nothing is widened by either.
#[tokio::test]
async fn an_input_required_answer_completes_through_another_process_once() {
    let (_db, fake, _dirs, [a, b, c]) = replicas(&[]).await;
    let asking = |server, params| async move {
        stateless_request(
            server,
            TOKEN,
            "tools/call",
            json!({"elicitation": {"form": {}}}),
            params,
        )
        .await
    };
    let created = asking(
        &a,
        json!({"name": "create-machine", "arguments": {"name": "asks", "network": "ask"}}),
    )
    .await;
    assert_eq!(created["result"]["isError"], false, "{created}");
    fake.deny_on_exec("asks", "resolve", "pypi.org");
    fake.deny_on_exec("asks", "resolve", "evil.example");
    let egress_posts = || {
        fake.take_requests()
            .into_iter()
            .filter(|r| r["path"].as_str().unwrap().ends_with("/egress"))
            .collect::<Vec<Value>>()
    };

    let run = json!({"name": "run-command", "arguments": {"name": "asks", "command": "exit 7"}});
    let asked = asking(&a, run.clone()).await;
    assert_eq!(asked["result"]["resultType"], "input_required", "{asked}");
    let state = asked["result"]["requestState"].as_str().unwrap().to_owned();
    assert!(
        egress_posts().is_empty(),
        "nothing widened before the answer"
    );

    fake.state.lock().unwrap().denials_on_exec.clear();
    let mut retry = run.clone();
    retry["inputResponses"] =
        json!({"egress": {"action": "accept", "content": {"allow0": true, "allow1": false}}});
    retry["requestState"] = json!(state);
    let answered = asking(&b, retry.clone()).await;
    let content = &answered["result"]["structuredContent"];
    assert_eq!(content["exitCode"], 7, "answered through b: {answered}");
    assert_eq!(
        content["egressAnswer"],
        json!({"allowed": ["pypi.org"], "declined": ["evil.example"]}),
        "{answered}"
    );
    let posts = egress_posts();
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(posts[0]["body"], json!({"allowHosts": ["pypi.org"]}));

    // The same state with a yes to both, through c: taken already, by b.
    let mut yes_after_no = retry.clone();
    yes_after_no["inputResponses"] =
        json!({"egress": {"action": "accept", "content": {"allow0": true, "allow1": true}}});
    let refused = asking(&c, yes_after_no).await;
    crate::common::assert_invalid_params(&refused, "used already");
    // A state with one character changed, through c: it does not open.
    fake.deny_on_exec("asks", "resolve", "other.example");
    let fresh = asking(&a, run.clone()).await;
    let fresh_state = fresh["result"]["requestState"].as_str().unwrap().to_owned();
    let mut tampered_state: Vec<char> = fresh_state.chars().collect();
    let middle = tampered_state.len() / 2;
    tampered_state[middle] = if tampered_state[middle] == 'A' {
        'B'
    } else {
        'A'
    };
    let mut tampered = retry;
    tampered["requestState"] = json!(tampered_state.into_iter().collect::<String>());
    tampered["inputResponses"] =
        json!({"egress": {"action": "accept", "content": {"allow0": true, "allow1": true}}});
    let refused = asking(&c, tampered).await;
    crate::common::assert_invalid_params(&refused, "requestState is not the one");
    assert!(
        egress_posts().is_empty(),
        "nothing widened by a replay or a forgery"
    );
}

/// Jobs started through one live process: one read to its end through a second (waiting for
/// it there), another cancelled through a third, which the first, watching it, records as
/// cancelled; the list through any shows both.
#[tokio::test]
async fn a_job_started_through_one_process_is_read_and_cancelled_through_others() {
    let (_db, fake, _dirs, [a, b, c]) = replicas(&[("SMOL_MCP_JOB_POLL_MILLIS", "100")]).await;
    let made = call(
        &a,
        "create-machine",
        json!({"name": "jobs-box", "image": "alpine"}),
    )
    .await;
    assert_eq!(made["isError"], false, "{made}");
    let start = |command: &str| json!({"name": "jobs-box", "background": true, "command": command});
    let finite = call(
        &a,
        "run-command",
        start("for i in 1 2 3 4 5; do echo \"line $i\"; sleep 0.4; done; echo bye >&2; exit 4"),
    )
    .await;
    let finite = finite["structuredContent"]["job"]
        .as_str()
        .unwrap()
        .to_owned();
    let endless = call(&a, "run-command", start("while true; do sleep 1; done")).await;
    let endless = endless["structuredContent"]["job"]
        .as_str()
        .unwrap()
        .to_owned();

    // Read to its end through b, waiting there for it.
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let mut cursor = "0:0".to_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let last = loop {
        let report = call(
            &b,
            "job-output",
            json!({"job": finite, "cursor": cursor, "waitSecs": 2}),
        )
        .await;
        assert_eq!(report["isError"], false, "{report}");
        let report = report["structuredContent"].clone();
        stdout.push_str(report["stdout"].as_str().unwrap());
        stderr.push_str(report["stderr"].as_str().unwrap());
        cursor = report["cursor"].as_str().unwrap().to_owned();
        if report["state"] != "running" && report["more"] == false {
            break report;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never ended: {report}"
        );
    };
    assert_eq!(stdout, "line 1\nline 2\nline 3\nline 4\nline 5\n");
    assert_eq!(stderr, "bye\n");
    assert_eq!(last["state"], "exited", "{last}");
    assert_eq!(last["exitCode"], 4, "{last}");

    // Cancelled through c: its command goes from the machine, and a, which watches it,
    // records it cancelled (the store says so through any process).
    assert!(!fake.guest_processes("jobs-box").is_empty());
    let cancelled = call(&c, "cancel-job", json!({"job": endless})).await;
    assert_eq!(cancelled["isError"], false, "{cancelled}");
    assert_eq!(
        cancelled["structuredContent"]["state"], "cancelled",
        "{cancelled}"
    );
    until(
        "the cancelled job's command to go",
        Duration::from_secs(10),
        async || fake.guest_processes("jobs-box").is_empty().then_some(()),
    )
    .await;
    let seen_by_a = until(
        "a to record the cancel",
        Duration::from_secs(10),
        async || {
            let report = call(&a, "job-output", json!({"job": endless})).await;
            (report["structuredContent"]["state"] != "running").then_some(report)
        },
    )
    .await;
    assert_eq!(
        seen_by_a["structuredContent"]["state"], "cancelled",
        "{seen_by_a}"
    );

    let listed = call(&c, "job-output", json!({})).await;
    let jobs = listed["structuredContent"]["jobs"]
        .as_array()
        .unwrap()
        .clone();
    let state_of = |id: &str| {
        jobs.iter()
            .find(|j| j["job"] == id)
            .map(|j| j["state"].clone())
            .unwrap_or_else(|| panic!("{id} not listed: {listed}"))
    };
    assert_eq!(state_of(&finite), "exited");
    assert_eq!(state_of(&endless), "cancelled");
}

/// A 2026-07-28 request declaring the tasks extension.
async fn task_request(server: &HttpServer, method: &str, params: Value) -> Value {
    crate::common::clients::task_request(server, TOKEN, method, params).await
}

/// A task created through one process is polled through others to its result (each answers
/// from the store as the process running it last answered), and another is cancelled through
/// a second process: the one running it cancels it, its command killed.
#[tokio::test]
async fn a_task_created_on_one_process_is_polled_and_cancelled_through_others() {
    let (_db, fake, _dirs, [a, b, c]) = replicas(&[("SMOL_MCP_TASK_AFTER_MILLIS", "300")]).await;
    fake.add_machine("m", "running");
    let task_of = |answer: &Value| {
        answer["result"]["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("not a task: {answer}"))
            .to_owned()
    };
    let finite = task_of(
        &task_request(
            &a,
            "tools/call",
            json!({"name": "run-command", "arguments": {"name": "m", "command": "sleep 2; echo done-on-a"}}),
        )
        .await,
    );
    // Working as seen through b, then completed with its result as seen through c.
    let working = until("b to see the task", Duration::from_secs(10), async || {
        let polled = task_request(&b, "tasks/get", json!({"taskId": finite})).await;
        (polled["result"]["status"] == "working").then_some(polled)
    })
    .await;
    assert_eq!(working["result"]["taskId"], finite.as_str(), "{working}");
    let completed = until(
        "c to see the task's result",
        Duration::from_secs(20),
        async || {
            let polled = task_request(&c, "tasks/get", json!({"taskId": finite})).await;
            (polled["result"]["status"] == "completed").then_some(polled)
        },
    )
    .await;
    assert_eq!(
        completed["result"]["result"]["structuredContent"]["stdout"], "done-on-a\n",
        "{completed}"
    );

    // Cancelled through b: a, running it, cancels it and its command goes from the machine.
    let endless = task_of(
        &task_request(
            &a,
            "tools/call",
            json!({"name": "run-command", "arguments": {"name": "m", "command": "sleep 300"}}),
        )
        .await,
    );
    let cancelled = task_request(&b, "tasks/cancel", json!({"taskId": endless})).await;
    assert!(cancelled.get("error").is_none(), "{cancelled}");
    let seen = until("the cancel to take", Duration::from_secs(20), async || {
        let polled = task_request(&c, "tasks/get", json!({"taskId": endless})).await;
        (polled["result"]["status"] == "cancelled").then_some(polled)
    })
    .await;
    assert_eq!(seen["result"]["taskId"], endless.as_str());
    until(
        "the cancelled command to go",
        Duration::from_secs(10),
        async || fake.guest_processes("m").is_empty().then_some(()),
    )
    .await;
    // An id no process made is unknown through any.
    let unknown = task_request(&b, "tasks/get", json!({"taskId": "no-such-task"})).await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
}
