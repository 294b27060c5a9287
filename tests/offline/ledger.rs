//! The run ledger: a row for every command run-command and run-once run on either fleet, no
//! environment value anywhere in its files, kept across a restart, pruned at start, a broken
//! ledger reported once while the tools go on, and the smol://runs resources with their paging.
//! In process, through an MCP client, against the fake serve and the fake cloud.

use crate::common::fake_cloud::{FakeCloud, TOKEN, exec_answer};
use crate::common::fake_serve::{FakeServe, exec_response};
use crate::common::mcp::config;
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams, ResourceContents};
use rmcp::service::RunningService;
use serde_json::{Value, json};
use smol_mcp::policy::ledger::FILE_NAME;
use smol_mcp::protocol::Protocol;
use smol_mcp::protocol::server::SmolMcp;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A value passed in a command's environment, which must never be written to the ledger.
const SECRET: &str = "hunter2-s3cr3t-value-7f3a";

struct Server {
    client: RunningService<RoleClient, ()>,
    protocol: Arc<Protocol>,
}

async fn serve(env: &[(&str, &str)], runtime: &Path) -> Server {
    let protocol = Protocol::start(config(env, runtime)).unwrap();
    let server = SmolMcp::new(protocol.clone(), "ledger-test");
    let client = crate::common::mcp::connect(server, ()).await;
    Server { client, protocol }
}

impl Server {
    async fn call(&self, tool: &str, args: Value) -> Result<Value, String> {
        let answer = crate::common::mcp::call_tool(&self.client, tool, args).await;
        if answer.is_error {
            return Err(answer.text);
        }
        Ok(answer.structured)
    }

    async fn ok(&self, tool: &str, args: Value) -> Value {
        match self.call(tool, args).await {
            Ok(v) => v,
            Err(e) => panic!("{tool} failed: {e}"),
        }
    }

    async fn read(&self, uri: &str) -> Result<Value, String> {
        let contents = self
            .client
            .read_resource(ReadResourceRequestParams::new(uri))
            .await
            .map_err(|e| e.to_string())?
            .contents;
        assert_eq!(contents.len(), 1, "{contents:?}");
        match &contents[0] {
            ResourceContents::TextResourceContents {
                text, mime_type, ..
            } => {
                assert_eq!(mime_type.as_deref(), Some("application/json"));
                Ok(serde_json::from_str(text).unwrap())
            }
            other => panic!("not text: {other:?}"),
        }
    }

    /// Every run, newest first, following `next` from page to page.
    async fn all_runs(&self) -> Vec<Value> {
        let mut runs = Vec::new();
        let mut uri = "smol://runs".to_owned();
        loop {
            let page = self.read(&uri).await.unwrap();
            runs.extend(page["runs"].as_array().unwrap().iter().cloned());
            match page["next"].as_str() {
                Some(next) => uri = next.to_owned(),
                None => return runs,
            }
        }
    }
}

/// The values of the environment an exec request carries: an array of {name, value} locally
/// (smolvm ExecRequest), a map on cloud (MachineCommandRequest, facts 3.7).
fn env_values(request: &Value) -> Vec<String> {
    match &request["env"] {
        Value::Array(vars) => vars
            .iter()
            .filter_map(|v| v["value"].as_str().map(str::to_owned))
            .collect(),
        Value::Object(vars) => vars
            .values()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// What a command that prints its environment gives: every value on stdout and stderr.
fn printed_env(request: &Value) -> (Vec<u8>, Vec<u8>) {
    let values = env_values(request).join(" ");
    (
        format!("env says {values}\n").into_bytes(),
        format!("warning: {values}\n").into_bytes(),
    )
}

fn is_probe(request: &Value) -> bool {
    request["command"][0] == "echo"
}

/// Both fleets, each of whose commands print the environment they were given and exit 3 (the
/// readiness probes excepted).
async fn both_fleets(runtime: &Path, extra: &[(&str, &str)]) -> (FakeServe, FakeCloud, Server) {
    let fake = FakeServe::start().await;
    fake.set_exec(|req| {
        if is_probe(req) {
            return crate::common::fake_serve::default_exec(req);
        }
        let (out, err) = printed_env(req);
        exec_response(3, &out, &err)
    });
    let cloud = FakeCloud::start().await;
    cloud.with(|st| {
        st.exec_hook = Some(Arc::new(|req: &Value| {
            if is_probe(req) {
                let rest: Vec<&str> = req["command"].as_array().unwrap()[1..]
                    .iter()
                    .filter_map(Value::as_str)
                    .collect();
                return exec_answer(0, format!("{}\n", rest.join(" ")).as_bytes(), b"");
            }
            let (out, err) = printed_env(req);
            exec_answer(3, &out, &err)
        }))
    });
    let (local_url, cloud_url) = (fake.url(), cloud.url());
    let mut env = vec![
        ("SMOL_LOCAL_URL", local_url.as_str()),
        ("SMOL_CLOUD_URL", cloud_url.as_str()),
        ("SMOL_CLOUD_TOKEN", TOKEN),
        ("SMOL_MCP_TARGETS", "both"),
    ];
    env.extend_from_slice(extra);
    let server = serve(&env, runtime).await;
    (fake, cloud, server)
}

/// The ledger's files in `runtime` (the database and those SQLite keeps beside it): each one's
/// name and bytes.
fn ledger_files(runtime: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(runtime).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with(FILE_NAME) {
            files.push((name, std::fs::read(&path).unwrap()));
        }
    }
    files
}

/// The fake engine with one running machine, `box`.
async fn fake_with_a_box() -> FakeServe {
    let fake = FakeServe::start().await;
    fake.add_machine("box", "running");
    fake
}

/// A server on `fake` (its local fleet) with `extra` settings, on `runtime`.
async fn serve_on(fake: &FakeServe, extra: &[(&str, &str)], runtime: &Path) -> Server {
    let url = fake.url();
    let mut env = vec![("SMOL_LOCAL_URL", url.as_str())];
    env.extend_from_slice(extra);
    serve(&env, runtime).await
}

/// A runtime directory that does not exist yet (the server makes it, mode 0700).
fn runtime_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("smol-mcp-ledger-")
        .tempdir()
        .unwrap();
    let rt = dir.path().join("rt");
    (dir, rt)
}

fn make_runtime_dir(rt: &Path) {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(rt).unwrap();
}

/// One command on each fleet with each tool; answers the run-command results, local first.
async fn run_everywhere(fake: &FakeServe, cloud: &FakeCloud, s: &Server) -> (Value, Value) {
    fake.add_machine("box", "running");
    cloud.add_machine("cbox", "running");
    let local = s
        .ok(
            "run-command",
            json!({
                "target": "local", "name": "box", "command": ["printenv", "TOKEN"],
                "workdir": "/srv", "env": {"TOKEN": SECRET, "MODE": "ci"},
            }),
        )
        .await;
    let on_cloud = s
        .ok(
            "run-command",
            json!({
                "target": "cloud", "name": "cbox", "command": "echo \"$TOKEN\" | wc -c",
                "env": {"TOKEN": SECRET},
            }),
        )
        .await;
    s.ok(
        "run-once",
        json!({"target": "local", "image": "alpine", "command": ["env"], "env": {"TOKEN": SECRET}}),
    )
    .await;
    s.ok(
        "run-once",
        json!({"target": "cloud", "image": "alpine", "command": "env", "env": {"TOKEN": SECRET}}),
    )
    .await;
    (local, on_cloud)
}

#[tokio::test]
async fn every_run_on_either_fleet_is_a_ledger_row_with_its_fields() {
    let (_dir, rt) = runtime_dir();
    let (fake, cloud, s) = both_fleets(&rt, &[]).await;
    let (local, on_cloud) = run_everywhere(&fake, &cloud, &s).await;
    assert_eq!(local["exitCode"], 3);
    assert_eq!(on_cloud["exitCode"], 3);

    let runs = s.all_runs().await;
    let summary: Vec<(&str, &str, &str)> = runs
        .iter()
        .map(|r| {
            (
                r["tool"].as_str().unwrap(),
                r["fleet"].as_str().unwrap(),
                r["machine"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(summary.len(), 4, "{runs:#?}");
    // Newest first.
    assert_eq!(summary[0].0, "run-once");
    assert_eq!(summary[0].1, "cloud");
    assert!(summary[0].2.starts_with("mcp-once-"));
    assert_eq!(summary[1].0, "run-once");
    assert_eq!(summary[1].1, "local");
    assert!(summary[1].2.starts_with("mcp-once-"));
    assert_eq!(summary[2], ("run-command", "cloud", "cbox"));
    assert_eq!(summary[3], ("run-command", "local", "box"));
    let ids: Vec<i64> = runs
        .iter()
        .map(|r| r["id"].as_str().unwrap().parse().unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "{ids:?}");
    for run in &runs {
        assert_eq!(run["outcome"], "exited");
        assert_eq!(run["exitCode"], 3);
        assert_eq!(run["timedOut"], false);
        assert!(run["stdoutBytes"].as_i64().unwrap() > 0);
        assert!(run["endedAt"].as_str().unwrap() >= run["startedAt"].as_str().unwrap());
    }
    assert_eq!(runs[2]["command"], "echo \"$TOKEN\" | wc -c");

    let first = s.read(runs[3]["uri"].as_str().unwrap()).await.unwrap();
    assert_eq!(first["command"], json!(["printenv", "TOKEN"]));
    assert_eq!(first["workdir"], "/srv");
    assert_eq!(first["envNames"], json!(["MODE", "TOKEN"]));
    let printed = local["stdout"].as_str().unwrap();
    assert!(printed.contains(SECRET), "{printed}");
    assert_eq!(first["stdout"]["bytes"], printed.len());
    // Kept output names the value's variable instead of the value.
    assert_eq!(first["stdout"]["head"], printed.replace(SECRET, "[$TOKEN]"));
    assert_eq!(
        first["stderr"]["head"],
        local["stderr"]
            .as_str()
            .unwrap()
            .replace(SECRET, "[$TOKEN]")
    );
    assert_eq!(first["stdout"]["droppedBytes"], 0);
    assert_eq!(first["error"], Value::Null);
    assert!(first["durationMs"].as_i64().unwrap() >= 0);
}

#[tokio::test]
async fn no_environment_value_is_in_the_ledger_files() {
    let (_dir, rt) = runtime_dir();
    let (fake, cloud, s) = both_fleets(&rt, &[]).await;
    let (local, on_cloud) = run_everywhere(&fake, &cloud, &s).await;
    // The commands did print the value, so the ledger had it in hand.
    assert!(local["stdout"].as_str().unwrap().contains(SECRET));
    assert!(on_cloud["stderr"].as_str().unwrap().contains(SECRET));
    // A run the fleet fails, whose error may quote the request.
    fake.set_exec(|req| {
        if is_probe(req) {
            return crate::common::fake_serve::default_exec(req);
        }
        json!({"error": format!("agent refused env {}", env_values(req).join(","))})
    });
    let _ = s
        .call(
            "run-command",
            json!({"target": "local", "name": "box", "command": "true", "env": {"TOKEN": SECRET}}),
        )
        .await;
    assert_eq!(s.all_runs().await.len(), 5);

    let files = ledger_files(&rt);
    for (name, bytes) in &files {
        assert!(
            !bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
            "{name} holds an environment value"
        );
        // Names are recorded (in the WAL until a checkpoint): the file is not just empty.
        if name.ends_with("-wal") {
            assert!(bytes.windows(5).any(|w| w == b"TOKEN"), "{name}");
        }
    }
    assert!(files.len() >= 2, "the database and its WAL");
}

#[tokio::test]
async fn the_ledger_is_kept_across_a_restart_and_open_runs_of_a_dead_process_are_interrupted() {
    let (_dir, rt) = runtime_dir();
    let (fake, cloud, s) = both_fleets(&rt, &[]).await;
    run_everywhere(&fake, &cloud, &s).await;
    let before = s.all_runs().await;
    assert_eq!(before.len(), 4);
    // A run some other process began and never ended: that process is gone.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let db = rusqlite::Connection::open(rt.join(FILE_NAME)).unwrap();
    db.execute(
        "INSERT INTO runs (id, pid, tool, fleet, machine, command_kind, command, env_names, \
         started_ms, outcome) VALUES (1, ?1, 'run-command', 'local', 'gone', 'shell', 'sleep 9', \
         '[]', ?2, 'running')",
        rusqlite::params![dead_pid, chrono::Utc::now().timestamp_millis() - 1000],
    )
    .unwrap();
    drop(db);
    s.client.cancel().await.unwrap();

    let again = serve(
        &[
            ("SMOL_LOCAL_URL", fake.url().as_str()),
            ("SMOL_MCP_TARGETS", "local"),
        ],
        &rt,
    )
    .await;
    let after = again.all_runs().await;
    assert_eq!(after.len(), 5, "{after:#?}");
    assert_eq!(after[..4], before[..]);
    assert_eq!(after[4]["machine"], "gone");
    assert_eq!(after[4]["outcome"], "interrupted");
    assert!(after[4]["endedAt"].is_string());
    // And it records on: ids go on after the old ones.
    fake.add_machine("next", "running");
    again
        .ok("run-command", json!({"name": "next", "command": "true"}))
        .await;
    let newest = again.all_runs().await;
    assert_eq!(newest.len(), 6);
    assert_eq!(newest[0]["machine"], "next");
    let id = |r: &Value| r["id"].as_str().unwrap().parse::<i64>().unwrap();
    assert!(id(&newest[0]) > id(&before[0]));
}

#[tokio::test]
async fn retention_prunes_at_start_by_count_and_by_age() {
    let (_dir, rt) = runtime_dir();
    let fake = fake_with_a_box().await;
    let url = fake.url();
    let s = serve_on(&fake, &[], &rt).await;
    for n in 0..5 {
        s.ok(
            "run-command",
            json!({"name": "box", "command": format!("echo {n}")}),
        )
        .await;
    }
    assert_eq!(s.all_runs().await.len(), 5);
    let old_ms = chrono::Utc::now().timestamp_millis() - 40 * 86_400_000;
    let db = rusqlite::Connection::open(rt.join(FILE_NAME)).unwrap();
    db.execute(
        "INSERT INTO runs (id, pid, tool, fleet, machine, command_kind, command, env_names, \
         started_ms, outcome) VALUES (2, 1, 'run-command', 'local', 'old', 'shell', 'true', '[]', \
         ?1, 'exited')",
        [old_ms],
    )
    .unwrap();
    drop(db);
    assert_eq!(s.all_runs().await.len(), 6);

    let restart = |extra: &'static [(&'static str, &'static str)]| {
        let (url, rt) = (url.clone(), rt.clone());
        async move {
            let mut env = vec![("SMOL_LOCAL_URL", url.as_str())];
            env.extend_from_slice(extra);
            let server = serve(&env, &rt).await;
            let runs = server.all_runs().await;
            runs.iter()
                .map(|r| {
                    format!(
                        "{} {}",
                        r["machine"].as_str().unwrap(),
                        r["command"].as_str().unwrap()
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    // Forty-one days keep the forty-day-old run.
    let kept = restart(&[("SMOL_MCP_LEDGER_MAX_DAYS", "41")]).await;
    assert_eq!(kept.len(), 6);
    assert_eq!(kept[5], "old true");
    // Thirty (the default) do not.
    let kept = restart(&[]).await;
    assert_eq!(
        kept,
        [
            "box echo 4",
            "box echo 3",
            "box echo 2",
            "box echo 1",
            "box echo 0"
        ]
    );
    // Three runs keep the newest three.
    let kept = restart(&[("SMOL_MCP_LEDGER_MAX_RUNS", "3")]).await;
    assert_eq!(kept, ["box echo 4", "box echo 3", "box echo 2"]);
}

#[tokio::test]
async fn a_process_that_lives_on_keeps_to_its_retention() {
    let (_dir, rt) = runtime_dir();
    let fake = fake_with_a_box().await;
    let s = serve_on(&fake, &[("SMOL_MCP_LEDGER_MAX_RUNS", "3")], &rt).await;
    // The ledger prunes again after every 256 records it adds, not only at a process's start.
    for n in 0..256 {
        s.ok(
            "run-command",
            json!({"name": "box", "command": format!("echo {n}")}),
        )
        .await;
    }
    let commands: Vec<String> = s
        .all_runs()
        .await
        .iter()
        .map(|r| r["command"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(commands, ["echo 255", "echo 254", "echo 253"]);
}

/// Counts the ledger's reports among the events published so far.
fn ledger_reports(
    events: &mut tokio::sync::broadcast::Receiver<smol_mcp::process::events::ServerEvent>,
) -> Vec<String> {
    let mut reports = Vec::new();
    while let Ok(event) = events.try_recv() {
        if event.event == "ledgerUnavailable" {
            reports.push(event.message);
        }
    }
    reports
}

/// With `prepare` done to the ledger's path before start: the tools work, the ledger is
/// reported once (log event) and smol://runs says why it cannot answer.
async fn broken_ledger(
    prepare: impl FnOnce(&Path),
    expected: &str,
) -> (tempfile::TempDir, PathBuf) {
    let (dir, rt) = runtime_dir();
    make_runtime_dir(&rt);
    prepare(&rt.join(FILE_NAME));
    let fake = fake_with_a_box().await;
    let s = serve_on(&fake, &[], &rt).await;
    let mut events = s.protocol.process().events.subscribe();
    for _ in 0..3 {
        let r = s
            .ok(
                "run-command",
                json!({"name": "box", "command": ["echo", "still here"]}),
            )
            .await;
        assert_eq!(r["stdout"], "still here\n");
    }
    let r = s
        .ok(
            "run-once",
            json!({"image": "alpine", "command": ["echo", "once"]}),
        )
        .await;
    assert_eq!(r["stdout"], "once\n");
    let err = s.read("smol://runs").await.unwrap_err();
    assert!(
        err.contains("run ledger") && err.contains(FILE_NAME) && err.contains(expected),
        "{err}"
    );
    let err = s.read("smol://runs/12").await.unwrap_err();
    assert!(err.contains("not available"), "{err}");
    let reports = ledger_reports(&mut events);
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert!(reports[0].contains(expected), "{reports:?}");
    assert!(reports[0].contains("the tools work"), "{reports:?}");
    (dir, rt)
}

#[tokio::test]
async fn a_corrupt_ledger_leaves_the_tools_working_and_is_reported_once() {
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i * 7919 % 251) as u8).collect();
    let written = garbage.clone();
    let (_dir, rt) = broken_ledger(
        move |path| std::fs::write(path, &written).unwrap(),
        "not a database",
    )
    .await;
    // The file is left as it was, for whoever wants to look at it.
    assert_eq!(std::fs::read(rt.join(FILE_NAME)).unwrap(), garbage);
}

#[tokio::test]
async fn an_unwritable_ledger_path_leaves_the_tools_working_and_is_reported_once() {
    // A directory where the file goes: no user, root included, can write it as a database.
    broken_ledger(
        |path| std::fs::create_dir(path).unwrap(),
        "unable to open database file",
    )
    .await;
}

#[tokio::test]
async fn the_runs_resources_page_newest_first_and_refuse_bad_uris() {
    let (_dir, rt) = runtime_dir();
    let fake = fake_with_a_box().await;
    let s = serve_on(&fake, &[], &rt).await;

    let listed = s.client.list_all_resources().await.unwrap();
    assert!(listed.iter().any(|r| r.uri == "smol://runs"), "{listed:?}");
    let templates = s.client.list_all_resource_templates().await.unwrap();
    assert!(
        templates
            .iter()
            .any(|t| t.uri_template == "smol://runs/{id}"),
        "{templates:?}"
    );

    let empty = s.read("smol://runs").await.unwrap();
    assert_eq!(empty["runs"], json!([]));
    assert_eq!(empty["next"], Value::Null);

    for n in 0..7 {
        s.ok(
            "run-command",
            json!({"name": "box", "command": format!("exit {n}")}),
        )
        .await;
    }
    let first = s.read("smol://runs?limit=3").await.unwrap();
    let codes = |page: &Value| -> Vec<i64> {
        page["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["exitCode"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(codes(&first), [6, 5, 4]);
    let next = first["next"].as_str().unwrap();
    assert_eq!(
        next,
        format!(
            "smol://runs?before={}&limit=3",
            first["runs"][2]["id"].as_str().unwrap()
        )
    );
    let second = s.read(next).await.unwrap();
    assert_eq!(codes(&second), [3, 2, 1]);
    let third = s.read(second["next"].as_str().unwrap()).await.unwrap();
    assert_eq!(codes(&third), [0]);
    assert_eq!(third["next"], Value::Null);
    assert_eq!(
        s.all_runs().await.len(),
        7,
        "the default page holds them all"
    );
    let exact = s.read("smol://runs?limit=7").await.unwrap();
    assert_eq!(exact["runs"].as_array().unwrap().len(), 7);
    assert_eq!(exact["next"], Value::Null, "no page after the last");
    assert_eq!(first["droppedRecords"], 0);

    let one = s
        .read(first["runs"][0]["uri"].as_str().unwrap())
        .await
        .unwrap();
    assert_eq!(one["command"], "exit 6");
    assert_eq!(one["exitCode"], 6);

    for (uri, says) in [
        (
            "smol://runs?limit=0",
            "limit: \"0\" is not accepted: give 1 to 500",
        ),
        ("smol://runs?limit=501", "limit"),
        ("smol://runs?after=3", "takes only before"),
        ("smol://runs?before=x", "before: \"x\" is not a run id"),
        ("smol://runs/abc", "id: \"abc\" is not a run id"),
        ("smol://runs/12345", "no run 12345 in the run ledger"),
    ] {
        let err = s.read(uri).await.unwrap_err();
        assert!(err.contains(says), "{uri}: {err}");
    }
}

#[tokio::test]
async fn with_no_runs_kept_none_are_offered() {
    let (_dir, rt) = runtime_dir();
    let fake = fake_with_a_box().await;
    let s = serve_on(&fake, &[("SMOL_MCP_LEDGER_MAX_RUNS", "0")], &rt).await;
    s.ok("run-command", json!({"name": "box", "command": "true"}))
        .await;
    let listed = s.client.list_all_resources().await.unwrap();
    assert!(!listed.iter().any(|r| r.uri == "smol://runs"), "{listed:?}");
    let err = s.read("smol://runs").await.unwrap_err();
    assert!(err.contains("the run ledger is off"), "{err}");
    // The store may exist now (it keeps jobs, keys and spend marks), but never a run.
    if rt.join(FILE_NAME).exists() {
        let db = rusqlite::Connection::open(rt.join(FILE_NAME)).unwrap();
        let runs: i64 = db
            .query_row("SELECT COUNT(*) FROM runs", [], |r| r.get(0))
            .unwrap();
        assert_eq!(runs, 0);
    }
}

#[tokio::test]
async fn long_output_keeps_its_head_and_tail_and_counts_what_fell_between() {
    let (_dir, rt) = runtime_dir();
    let fake = fake_with_a_box().await;
    let long: Vec<u8> = (0..10_000).map(|i| b'a' + (i % 26) as u8).collect();
    let expected = long.clone();
    fake.set_exec(move |req| {
        if is_probe(req) {
            return crate::common::fake_serve::default_exec(req);
        }
        exec_response(0, &expected, b"")
    });
    let s = serve_on(&fake, &[], &rt).await;
    s.ok("run-command", json!({"name": "box", "command": "yes"}))
        .await;
    let runs = s.all_runs().await;
    let run = s.read(runs[0]["uri"].as_str().unwrap()).await.unwrap();
    let stdout = &run["stdout"];
    let head = stdout["head"].as_str().unwrap();
    let tail = stdout["tail"].as_str().unwrap();
    assert_eq!(stdout["bytes"], 10_000);
    assert_eq!(head.as_bytes(), &long[..2048]);
    assert_eq!(tail.as_bytes(), &long[10_000 - 2048..]);
    assert_eq!(stdout["droppedBytes"], 10_000 - 4096);
    assert_eq!(run["stderr"]["bytes"], 0);
}

#[tokio::test]
async fn a_cancelled_run_and_a_failed_one_are_recorded_as_such() {
    use rmcp::model::{CallToolRequest, ClientRequest};
    use rmcp::service::PeerRequestOptions;
    let (_dir, rt) = runtime_dir();
    let fake = fake_with_a_box().await;
    let s = serve_on(&fake, &[], &rt).await;

    let Value::Object(args) = json!({"name": "box", "command": "sleep 60", "timeoutSecs": 120})
    else {
        unreachable!()
    };
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(
        CallToolRequestParams::new("run-command").with_arguments(args),
    ));
    let handle = s
        .client
        .peer()
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
        .unwrap();
    // Cancel once the run has begun: the ledger lists it as running.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let runs = s.all_runs().await;
        if runs.first().is_some_and(|r| r["outcome"] == "running") {
            assert_eq!(runs[0]["endedAt"], Value::Null);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{runs:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    handle.cancel(Some("test".into())).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let cancelled = loop {
        let runs = s.all_runs().await;
        if runs[0]["outcome"] != "running" {
            break runs[0].clone();
        }
        assert!(std::time::Instant::now() < deadline, "{runs:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(cancelled["outcome"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["exitCode"], Value::Null);
    let detail = s.read(cancelled["uri"].as_str().unwrap()).await.unwrap();
    assert!(
        detail["error"].as_str().unwrap().contains("CANCELLED"),
        "{detail}"
    );
    assert_eq!(detail["stdout"], Value::Null);

    // Output past the engine's 11 MiB cap: the engine answers 500 and the run has no exit code.
    let huge = vec![b'x'; 11 * 1024 * 1024 + 1];
    fake.set_exec(move |req| {
        if is_probe(req) {
            return crate::common::fake_serve::default_exec(req);
        }
        exec_response(0, &huge, b"")
    });
    let err = s
        .call("run-command", json!({"name": "box", "command": "yes"}))
        .await
        .unwrap_err();
    let failed = s
        .read(s.all_runs().await[0]["uri"].as_str().unwrap())
        .await
        .unwrap();
    assert_eq!(failed["outcome"], "error");
    assert!(
        failed["error"].as_str().unwrap().contains("exceeded"),
        "{failed} (the tool said {err})"
    );
}

/// SQLite and its writer thread cost about 2 MiB, so a process opens the ledger only when it
/// first runs a command (or reads smol://runs), and prunes it then.
#[tokio::test]
async fn the_ledger_is_opened_at_the_first_run_not_at_start() {
    let (_dir, rt) = runtime_dir();
    let fake = fake_with_a_box().await;
    let s = serve_on(&fake, &[], &rt).await;
    s.ok("list-machines", json!({})).await;
    assert!(rt.is_dir() && !rt.join(FILE_NAME).exists());
    s.ok("run-command", json!({"name": "box", "command": "true"}))
        .await;
    assert_eq!(s.all_runs().await.len(), 1);
    assert!(rt.join(FILE_NAME).exists());
}

/// Where a value lies against the 2 KiB cuts of the kept output.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Across the head's end, the output short enough that the tail starts where the head
    /// ends: `split` bytes of the value in the head, the rest in the tail.
    AcrossTheHead,
    /// The value's first `split` bytes end the head and its rest starts the tail, from two
    /// places of a long output (never whole in it).
    PiecesAtBothCuts,
    /// Across the tail's start in a long output: its last `split` bytes start the tail.
    AcrossTheTail,
}

fn laid_out(value: &str, split: usize, layout: Layout) -> Vec<u8> {
    let v = value.as_bytes();
    let mut out = Vec::new();
    match layout {
        Layout::AcrossTheHead => {
            out.extend(std::iter::repeat_n(b'a', 2048 - split));
            out.extend_from_slice(v);
            out.extend(std::iter::repeat_n(b'b', 1000));
        }
        Layout::PiecesAtBothCuts => {
            out.extend(std::iter::repeat_n(b'a', 2048 - split));
            out.extend_from_slice(&v[..split]);
            out.extend(std::iter::repeat_n(b'c', 5000));
            out.extend_from_slice(&v[split..]);
            out.extend(std::iter::repeat_n(b'b', 2048 - (v.len() - split)));
        }
        Layout::AcrossTheTail => {
            out.extend(std::iter::repeat_n(b'a', 6000));
            out.extend_from_slice(v);
            out.extend(std::iter::repeat_n(b'b', 2048 - split));
        }
    }
    out
}

/// A value across a 2 KiB cut, or its pieces at both cuts, is in no ledger file whole
/// (database, WAL), on stdout and stderr, for a short value and a 47-character one cut at its
/// first, middle and last byte; and the output around it is kept.
#[tokio::test]
async fn a_value_across_the_cuts_of_the_kept_output_is_in_no_ledger_file() {
    const SHORT: &str = "hunter2xyz";
    const LONG: &str = "k7Qz-secret-token-0123456789-abcdefghij-XYZWV42"; // 47 characters
    assert_eq!(LONG.len(), 47);
    let (_dir, rt) = runtime_dir();
    let fake = FakeServe::start().await;
    let url = fake.url();
    fake.add_machine("box", "running");
    let layouts = [
        Layout::AcrossTheHead,
        Layout::PiecesAtBothCuts,
        Layout::AcrossTheTail,
    ];
    fake.set_exec(move |req| {
        if is_probe(req) {
            return crate::common::fake_serve::default_exec(req);
        }
        // The command says where the value goes: "case LAYOUT SPLIT".
        let text = req["command"].to_string();
        let words: Vec<&str> = text
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
            .collect();
        let at = words.iter().position(|w| *w == "case").unwrap();
        let layout = layouts[words[at + 1].parse::<usize>().unwrap()];
        let split: usize = words[at + 2].parse().unwrap();
        let value = env_values(req).into_iter().next().unwrap();
        let out = laid_out(&value, split, layout);
        exec_response(0, &out, &out)
    });
    let s = serve(&[("SMOL_LOCAL_URL", url.as_str())], &rt).await;
    let mut cases = 0;
    for value in [SHORT, LONG] {
        for split in [1, value.len() / 2, value.len() - 1] {
            for (i, layout) in layouts.iter().enumerate() {
                let result = s
                    .ok(
                        "run-command",
                        json!({"name": "box", "command": format!("case {i} {split}"),
                               "env": {"SECRET": value}}),
                    )
                    .await;
                // The command really printed the value (or its pieces).
                let printed = result["stdout"].as_str().unwrap_or_default().to_owned();
                assert!(
                    printed.contains(&value[..split]) || result["stdoutFile"].is_string(),
                    "{layout:?} {split}: {result}"
                );
                cases += 1;
            }
        }
    }
    let runs = s.all_runs().await;
    assert_eq!(runs.len(), cases);
    let files = ledger_files(&rt);
    for (name, bytes) in &files {
        for value in [SHORT, LONG] {
            let count = bytes
                .windows(value.len())
                .filter(|w| *w == value.as_bytes())
                .count();
            assert_eq!(count, 0, "{name} holds {value} {count} times");
        }
    }
    assert!(files.len() >= 2, "the database and its WAL");
    for run in &runs {
        let detail = s.read(run["uri"].as_str().unwrap()).await.unwrap();
        for stream in ["stdout", "stderr"] {
            let head = detail[stream]["head"].as_str().unwrap();
            let tail = detail[stream]["tail"].as_str().unwrap();
            let joined = format!("{head}{tail}");
            for value in [SHORT, LONG] {
                assert!(
                    !joined.contains(value),
                    "{stream} of {}: {joined}",
                    run["uri"]
                );
            }
            // What is around the value is kept.
            assert!(head.starts_with("aaaa"), "{head}");
            assert!(tail.ends_with('b'), "{tail}");
        }
    }
}

/// What one call can make the ledger keep is bounded at the arguments: an environment past its
/// bounds (variables, a name's length, one variable's size, the whole) is refused naming `env`
/// before anything is sent to the engine or written to the ledger.
#[tokio::test]
async fn an_environment_past_its_bounds_is_refused_before_anything_is_kept() {
    let fake = FakeServe::start().await;
    let h = crate::common::mcp::Harness::on_fake(&fake, &[]).await;
    h.ok("create-machine", json!({"name": "m"})).await;
    fake.take_requests();
    let env_of = |vars: Vec<(String, String)>| -> Value {
        Value::Object(vars.into_iter().map(|(k, v)| (k, Value::from(v))).collect())
    };
    let many = env_of((0..257).map(|i| (format!("V{i}"), "x".into())).collect());
    let long_name = env_of(vec![("N".repeat(129), "x".into())]);
    let big_value = env_of(vec![("BIG".into(), "x".repeat(128 * 1024))]);
    let big_total = env_of(
        (0..9)
            .map(|i| (format!("PART{i}"), "x".repeat(120 * 1024)))
            .collect(),
    );
    let mut refusals = Vec::new();
    for env in [many, long_name, big_value, big_total] {
        refusals.push(
            h.err(
                "run-command",
                json!({"name": "m", "command": "true", "env": env}),
            )
            .await,
        );
    }
    insta::assert_snapshot!(refusals.join("\n"), @r#"
    INVALID_ARGUMENT: env: 257 variables are too many: give at most 256 (write more into a file in the machine with write-file and source it)
    INVALID_ARGUMENT: env: a variable name of 129 bytes is too long: give at most 128
    INVALID_ARGUMENT: env: "BIG" takes 131077 bytes: a process's environment takes at most 131072 a variable (its name, =, its value and the NUL that ends it); write the value into a file in the machine with write-file instead
    INVALID_ARGUMENT: env: 1105983 bytes in all are too many: give at most 1048576 (write large values into a file in the machine with write-file instead)
    "#);
    assert_eq!(fake.take_requests(), Vec::<Value>::new());
    let page = h.resource("smol://runs").await;
    assert_eq!(page["runs"], json!([]), "{page}");
    // At the bounds, the call runs.
    let at_bound = env_of((0..256).map(|i| (format!("V{i}"), "x".into())).collect());
    h.ok(
        "run-command",
        json!({"name": "m", "command": "true", "env": at_bound}),
    )
    .await;
}
