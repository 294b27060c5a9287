//! Warm pools against the fake engine (its pools behave as the 1.32.2 engine's did on the nested
//! guest: /work/notes-derived `tests/offline/fake_pools.rs`): the server sets the operator's pool up at
//! its first local call with the requests pinned here, leases a ready machine for an unnamed
//! create-machine or run-once of the pool's shape (and says so), completes the lease at delete,
//! makes a machine cold when no pool matches or none is ready, keeps the pool's own machines out
//! of list-machines, and refuses a `pools` setting it cannot use, naming what is accepted.
//! The same on the real engine: `booted_guest::warm_machines_come_from_the_pool_and_go_back`.

use crate::common::fake_serve::FakeServe;
use crate::common::mcp::Harness;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const POOLS: &str = r#"[{"name": "py", "size": 1, "image": "python:3.12-alpine", "cpus": 1}]"#;

async fn pool_ready(fake: &FakeServe, pool: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let ready = |fake: &FakeServe| {
        fake.pool(pool)
            .is_some_and(|p| p["ready"].as_i64() >= Some(1))
    };
    while !ready(fake) {
        assert!(Instant::now() < deadline, "the pool was never set up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The pool's requests, as sent, with each lease's random key made stable.
fn pool_requests(requests: &[Value]) -> Vec<Value> {
    requests
        .iter()
        .filter(|r| {
            let path = r["path"].as_str().unwrap();
            path.starts_with("/api/v1/pools")
                || path.contains("smolmcp-pool-")
                || r["body"]["name"] == "smolmcp-pool-py"
        })
        .map(|r| {
            // The engine's lease ids are random too.
            let path = r["path"].as_str().unwrap();
            let path = match path.find("/leases/lease-") {
                Some(at) => {
                    let rest = &path[at + "/leases/lease-".len()..];
                    let end = rest.find('/').unwrap_or(rest.len());
                    format!("{}/leases/<lease>{}", &path[..at], &rest[end..])
                }
                None => path.to_owned(),
            };
            let mut r = json!({"method": r["method"], "path": path, "query": r["query"], "body": r["body"]});
            if let Some(key) = r["body"].get_mut("idempotencyKey") {
                assert!(key.as_str().unwrap().starts_with("smolmcp-"), "{key}");
                *key = json!("smolmcp-<random>");
            }
            r
        })
        .collect()
}

#[tokio::test]
async fn a_matching_create_leases_a_warm_machine_and_delete_completes_it() {
    let fake = FakeServe::start().await;
    let h = Harness::on_fake(&fake, &[("SMOL_MCP_POOLS", POOLS)]).await;
    h.ok("list-machines", json!({})).await;
    pool_ready(&fake, "smolmcp-py").await;
    let listed = h.ok("list-machines", json!({})).await;
    assert_eq!(
        listed["machines"],
        json!([]),
        "the pool's machines are not the agent's"
    );

    let warm = h
        .ok(
            "create-machine",
            json!({"image": "python:3.12-alpine", "cpus": 1, "env": {"JOB": "7"}}),
        )
        .await;
    assert_eq!(
        (warm["pool"].as_str(), warm["ready"].as_bool()),
        (Some("py"), Some(true))
    );
    let name = warm["machine"]["name"].as_str().unwrap().to_owned();
    assert!(name.starts_with("pool-smolmcp-py-"), "{name}");
    let listed = h.ok("list-machines", json!({})).await;
    assert_eq!(
        listed["machines"][0]["name"],
        json!(name),
        "a leased machine is the agent's"
    );
    let lease_id = fake
        .state
        .lock()
        .unwrap()
        .leases
        .keys()
        .next()
        .cloned()
        .unwrap();
    h.ok("delete-machine", json!({"name": name})).await;
    assert_eq!(fake.lease(&lease_id).unwrap()["state"], "completed");

    // Another shape, or a named machine, is made cold.
    let cold = h
        .ok(
            "create-machine",
            json!({"image": "python:3.12-alpine", "cpus": 2}),
        )
        .await;
    assert!(cold.get("pool").is_none(), "{cold}");
    let named = h
        .ok(
            "create-machine",
            json!({"name": "mine", "image": "python:3.12-alpine", "cpus": 1}),
        )
        .await;
    assert!(named.get("pool").is_none(), "{named}");

    pool_ready(&fake, "smolmcp-py").await;
    let once = h
        .ok(
            "run-once",
            json!({"image": "python:3.12-alpine", "cpus": 1, "command": "echo hi"}),
        )
        .await;
    assert_eq!(once["pool"], "py", "{once}");
    let leases: Vec<Value> = fake
        .state
        .lock()
        .unwrap()
        .leases
        .values()
        .map(|l| l.info.clone())
        .collect();
    assert!(
        leases.iter().all(|l| l["state"] == "completed"),
        "run-once's lease completed: {leases:?}"
    );

    insta::assert_json_snapshot!("warm_pool_requests", pool_requests(&fake.take_requests()));
}

/// With the pool's one machine leased and its refill not ready, the next create is made cold
/// rather than waiting.
#[tokio::test]
async fn an_empty_pool_means_a_cold_machine() {
    let fake = FakeServe::start().await;
    let h = Harness::on_fake(&fake, &[("SMOL_MCP_POOLS", POOLS)]).await;
    h.ok("list-machines", json!({})).await;
    pool_ready(&fake, "smolmcp-py").await;
    fake.state.lock().unwrap().pool_fill_delay = Some(Duration::from_secs(60));
    let args = json!({"image": "python:3.12-alpine", "cpus": 1});
    let first = h.ok("create-machine", args.clone()).await;
    assert_eq!(first["pool"], "py");
    let second = h.ok("create-machine", args).await;
    assert!(second.get("pool").is_none(), "{second}");
    assert!(
        second["machine"]["name"]
            .as_str()
            .unwrap()
            .starts_with("mcp-")
    );
}

/// The refusal of a `pools` setting, as the server says it at start.
fn pools_refused(pools: &str) -> String {
    let rt = tempfile::tempdir().unwrap();
    smol_mcp::process::config::Config::from_sources(
        &[
            ("SMOL_MCP_POOLS".to_owned(), pools.to_owned()),
            (
                "SMOL_MCP_RUNTIME_DIR".to_owned(),
                rt.path().display().to_string(),
            ),
        ]
        .into_iter()
        .collect(),
        std::path::Path::new("/nonexistent/config.json"),
    )
    .unwrap_err()
    .to_string()
}

#[test]
fn a_pools_setting_it_cannot_use_is_refused_at_start() {
    insta::assert_snapshot!(pools_refused(r#"[{"name": "py"}]"#), @"pools ($SMOL_MCP_POOLS): missing field `size`");
    insta::assert_snapshot!(pools_refused(r#"[{"name": "py", "size": 99}]"#), @r#"pools ($SMOL_MCP_POOLS): pool "py": size 99 is not accepted: give 1 to 16"#);
    insta::assert_snapshot!(pools_refused("not json"), @"pools ($SMOL_MCP_POOLS): not JSON: expected ident at line 1 column 2");
}

/// A pool of the operator's own prepared machine: the server restarts it branchable (it ran
/// without), never freezes it, leases its clones for a create of its shape, and leaves it in
/// place at the end.
#[tokio::test]
async fn a_pool_of_the_operators_machine_clones_it_and_leaves_it() {
    let fake = FakeServe::start().await;
    fake.add_machine("prepared", "running");
    let url = fake.url();
    let pools = r#"[{"name": "prep", "size": 1, "source": "prepared"}]"#;
    let h = Harness::start(&[("SMOL_LOCAL_URL", url.as_str()), ("SMOL_MCP_POOLS", pools)]).await;
    h.ok("list-machines", json!({})).await;
    pool_ready(&fake, "smolmcp-prep").await;
    let sent = fake.take_requests();
    let path = |r: &Value| {
        format!(
            "{} {}",
            r["method"].as_str().unwrap(),
            r["path"].as_str().unwrap()
        )
    };
    let stop = sent
        .iter()
        .position(|r| path(r) == "POST /api/v1/machines/prepared/stop");
    let start = sent
        .iter()
        .position(|r| path(r) == "POST /api/v1/machines/prepared/start");
    assert!(
        stop.is_some() && stop < start,
        "restarted branchable: {sent:?}"
    );
    let created = sent
        .iter()
        .find(|r| path(r) == "POST /api/v1/pools")
        .unwrap();
    assert_eq!(created["body"]["source"], "prepared");
    assert_eq!(
        created["body"]["freezeSource"], false,
        "the operator's machine is never frozen"
    );

    // The fake's machine: image alpine, 2 CPUs, 2048 MiB, no network (the defaults).
    let warm = h.ok("create-machine", json!({"image": "alpine"})).await;
    assert_eq!(warm["pool"], "prep", "{warm}");
    h.tear_down_local_pools().await;
    assert!(fake.pool("smolmcp-prep").is_none());
    assert!(fake.has_machine("prepared"), "the source stays");
}

/// A pool's source and its ready machines are the server's: every tool that names one is
/// refused before anything is sent about it (a file written or a process left in a ready
/// machine would be in the machine the next lease hands out), and no machine may take such a
/// name. A leased machine is the agent's (the first test runs and deletes one).
#[tokio::test]
async fn every_tool_refuses_a_pools_source_and_its_ready_machines() {
    let fake = FakeServe::start().await;
    let h = Harness::on_fake(&fake, &[("SMOL_MCP_POOLS", POOLS)]).await;
    h.ok("list-machines", json!({})).await;
    pool_ready(&fake, "smolmcp-py").await;
    let ready = fake
        .state
        .lock()
        .unwrap()
        .machines
        .keys()
        .find(|name| name.starts_with("pool-smolmcp-py-"))
        .cloned()
        .unwrap();
    let source = "smolmcp-pool-py";
    fake.take_requests();
    let mut refusals = Vec::new();
    for name in [source, ready.as_str()] {
        for (tool, args) in [
            ("list-machines", json!({"name": name})),
            ("start-machine", json!({"name": name})),
            ("stop-machine", json!({"name": name})),
            ("delete-machine", json!({"name": name})),
            (
                "run-command",
                json!({"name": name, "command": "touch /tmp/left"}),
            ),
            (
                "run-command",
                json!({"name": name, "command": "sleep 600", "background": true}),
            ),
            (
                "write-file",
                json!({"name": name, "path": "/tmp/left", "content": "x"}),
            ),
            ("read-file", json!({"name": name, "path": "/etc/hostname"})),
            ("machine-logs", json!({"name": name})),
            ("pull-image", json!({"name": name, "image": "alpine"})),
            (
                "branch-machine",
                json!({"name": name, "childName": "taken-from-the-pool"}),
            ),
        ] {
            let text = h.err(tool, args).await;
            assert!(
                text.starts_with("INVALID_ARGUMENT: name: "),
                "{tool}: {text}"
            );
            refusals.push(text);
        }
    }
    insta::assert_snapshot!(refusals[0], @"INVALID_ARGUMENT: name: smolmcp-pool-py is the source of one of the operator's warm pools, which this server keeps to clone from: no tool may use it or take its name");
    let ready_refusal = refusals.last().unwrap().replace(&ready, "<ready>");
    insta::assert_snapshot!(ready_refusal, @"INVALID_ARGUMENT: name: <ready> is a ready machine of one of the operator's warm pools, leased to no one: the next create-machine of its pool's shape hands it out as it is, so nothing may run in it or change it before. create-machine without a name leases one");
    // Nor may a new machine take such a name.
    let text = h.err("create-machine", json!({"name": source})).await;
    assert!(
        text.starts_with("INVALID_ARGUMENT: name: smolmcp-pool-py is the source"),
        "{text}"
    );
    h.ok("create-machine", json!({"name": "mine"})).await;
    let text = h
        .err(
            "branch-machine",
            json!({"name": "mine", "childName": "smolmcp-pool-py"}),
        )
        .await;
    assert!(
        text.starts_with("INVALID_ARGUMENT: childName: smolmcp-pool-py is the source"),
        "{text}"
    );
    // Of the pool's machines, only the question whether the clone is still ready was sent.
    let sent = fake.take_requests();
    let touched: Vec<(String, String)> = sent
        .iter()
        .map(|r| {
            (
                r["method"].as_str().unwrap().to_owned(),
                r["path"].as_str().unwrap().to_owned(),
            )
        })
        .filter(|(_, path)| path.contains(source) || path.contains(&ready))
        .collect();
    assert!(
        touched
            .iter()
            .all(|(method, path)| method == "GET" && *path == format!("/api/v1/machines/{ready}")),
        "{touched:?}"
    );
    // The ready machine is still the pool's, as it was: the next lease gets it unchanged.
    let st = fake.state.lock().unwrap();
    assert_eq!(st.machines[&ready]["forkpointHeld"], true);
    assert!(!st.files.keys().any(|(machine, _)| *machine == ready));
}

/// A pool whose source is a base (branch-machine freezeSource): set up as it is, neither
/// restarted nor declared (it runs nothing), and its leases are clones of the base as it was
/// frozen. The engine leases from a frozen source only if it was frozen at a branchpoint, which
/// the server declares before every freeze; one frozen otherwise makes cold machines instead.
#[tokio::test]
async fn a_pool_over_a_base_leases_clones_of_it() {
    let fake = FakeServe::start().await;
    let url = fake.url();
    let first = Harness::on_fake(&fake, &[]).await;
    first
        .ok(
            "create-machine",
            json!({"name": "set-up", "image": "alpine", "branchable": true}),
        )
        .await;
    first
        .ok(
            "branch-machine",
            json!({"name": "set-up", "childName": "set-up-kid", "freezeSource": true}),
        )
        .await;
    let sent = fake.take_requests();
    let declared = sent.iter().position(|r| {
        r["path"] == "/api/v1/machines/set-up/exec"
            && r["body"]["command"]
                .to_string()
                .contains("smolvm-branch-ready")
    });
    let frozen = sent
        .iter()
        .position(|r| r["body"]["freezeSource"] == json!(true));
    assert!(
        declared.is_some() && declared < frozen,
        "declared before the freeze: {sent:?}"
    );
    // An unparked base beside it: frozen by a branch without a branchpoint declared first.
    fake.add_machine("unparked", "frozen");
    {
        let mut st = fake.state.lock().unwrap();
        let unparked = st.machines.get_mut("unparked").unwrap();
        unparked["cpus"] = json!(1);
        unparked["branchable"] = json!(true);
        unparked["forkable"] = json!(true);
        st.frozen_off_branchpoint.insert("unparked".to_owned());
    }

    let pools = r#"[{"name": "from-base", "size": 1, "source": "set-up"},
                    {"name": "unparked", "size": 1, "source": "unparked"}]"#;
    let second = first
        .next_process(&[("SMOL_LOCAL_URL", url.as_str()), ("SMOL_MCP_POOLS", pools)])
        .await;
    second.ok("list-machines", json!({})).await;
    pool_ready(&fake, "smolmcp-from-base").await;
    pool_ready(&fake, "smolmcp-unparked").await;
    let sent = fake.take_requests();
    for source in ["set-up", "unparked"] {
        assert!(
            !sent.iter().any(|r| {
                let path = r["path"].as_str().unwrap();
                path == format!("/api/v1/machines/{source}/start")
                    || path == format!("/api/v1/machines/{source}/stop")
                    || path == format!("/api/v1/machines/{source}/exec")
            }),
            "a base is neither restarted nor sent a command: {sent:?}"
        );
    }
    let warm = second
        .ok("create-machine", json!({"image": "alpine"}))
        .await;
    assert_eq!(warm["pool"], "from-base", "{warm}");
    let cold = second
        .ok("create-machine", json!({"image": "alpine", "cpus": 1}))
        .await;
    assert!(
        cold["pool"].is_null(),
        "the unparked base leases nothing: {cold}"
    );
    assert_eq!(
        fake.state.lock().unwrap().machines["set-up"]["state"],
        "frozen"
    );
}
