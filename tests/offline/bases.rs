//! Bases: a branch source frozen by branch-machine `freezeSource` is kept past its session and
//! its server process, branched again by a later one, listed with what it was made from, ended
//! by a delete (refused while a child depends on it) or by `baseIdleSecs`, bounded per user and
//! per server, and its user's alone; against the fake serve, whose frozen source behaves as the
//! nested 1.32.2 engine's did (docs/bases-engine.md).

use crate::common::fake_cloud::{FakeCloud, TOKEN};
use crate::common::fake_serve::FakeServe;
use crate::common::mcp::{Harness, call_as, signed_in_server};
use serde_json::{Value, json};
use smol_mcp::policy::tools::Tool;

fn listed(list: &Value, name: &str) -> Value {
    list["machines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

fn branch_requests(fake: &FakeServe) -> usize {
    fake.take_requests()
        .into_iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.ends_with("/branches")))
        .count()
}

#[tokio::test]
async fn a_base_outlives_its_session_and_its_server_and_is_branched_again() {
    let fake = FakeServe::start().await;
    let url = fake.url();
    let env = [("SMOL_LOCAL_URL", url.as_str())];
    let first = Harness::start(&env).await;
    let source = first
        .create(json!({"image": "alpine", "branchable": true}))
        .await;
    assert!(source.starts_with("mcp-"), "an ephemeral source: {source}");
    first
        .ok(
            "branch-machine",
            json!({"name": source, "childName": "mcp-first-try", "freezeSource": true}),
        )
        .await;
    assert_eq!(fake.machine_state(&source).as_deref(), Some("frozen"));
    let list = first.ok("list-machines", json!({})).await;
    let base = listed(&list, &source);
    assert_eq!(base["state"], "frozen", "{base}");
    assert!(
        base["base"]["madeFrom"]
            .as_str()
            .is_some_and(|f| f.contains("alpine")),
        "{base}"
    );
    assert!(
        base["base"]["deletedAfter"].is_string(),
        "7 days by default: {base}"
    );
    assert!(
        base["base"].get("owner").is_none(),
        "the operator's: {base}"
    );
    let engine_disk = fake.state.lock().unwrap().machines[&source]["diskUsedMb"].clone();
    assert_eq!(
        base["base"]["diskUsedMb"], engine_disk,
        "the engine's figure: {base}"
    );
    assert!(listed(&list, "mcp-first-try")["base"].is_null(), "{list}");

    // The session ends: its machines go, the base stays.
    let cleanup = first.protocol.policy.shutdown(&first.session).await;
    assert_eq!(
        cleanup.deleted,
        vec!["mcp-first-try".to_owned()],
        "{cleanup:?}"
    );
    assert_eq!(fake.machine_state(&source).as_deref(), Some("frozen"));

    // A later server process lists it, and branches it three times at once.
    let second = first.next_process(&env).await;
    let list = second.ok("list-machines", json!({})).await;
    let before = listed(&list, &source)["base"].clone();
    assert!(before.is_object(), "{list}");
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let children = second
        .ok(
            "branch-machine",
            json!({"name": source, "childName": "mcp-next", "count": 3,
                   "env": [{"N": "1"}, {"N": "2"}, {"N": "3"}]}),
        )
        .await;
    assert_eq!(
        children["children"],
        json!(["mcp-next-1", "mcp-next-2", "mcp-next-3"])
    );
    for child in ["mcp-next-1", "mcp-next-2", "mcp-next-3"] {
        let r = second
            .ok("run-command", json!({"name": child, "command": "true"}))
            .await;
        assert_eq!(r["exitCode"], 0, "{child}");
    }
    let after = listed(&second.ok("list-machines", json!({})).await, &source)["base"].clone();
    assert_eq!(after["madeAt"], before["madeAt"]);
    assert!(
        after["lastUsed"].as_str() > before["lastUsed"].as_str(),
        "a branch is a use: {before} then {after}"
    );
    // Its session ends: the children go, the base stays; a session never takes a base back.
    let cleanup = second.protocol.policy.shutdown(&second.session).await;
    assert_eq!(cleanup.deleted.len(), 3, "{cleanup:?}");
    assert_eq!(fake.machine_state(&source).as_deref(), Some("frozen"));
    let entry = second
        .record()
        .into_iter()
        .find(|e| e["name"] == source.as_str())
        .unwrap();
    assert_eq!(entry["session"], "", "{entry}");

    // A delete while a child depends on it is refused, naming the child; then it goes.
    let third = second.next_process(&env).await;
    third
        .ok(
            "branch-machine",
            json!({"name": source, "childName": "kept-child"}),
        )
        .await;
    let err = third.err("delete-machine", json!({"name": source})).await;
    assert!(
        err.starts_with("CONFLICT") && err.contains("kept-child"),
        "{err}"
    );
    assert_eq!(fake.machine_state(&source).as_deref(), Some("frozen"));
    third
        .ok("delete-machine", json!({"name": "kept-child"}))
        .await;
    third.ok("delete-machine", json!({"name": source})).await;
    assert_eq!(fake.machine_state(&source), None);
    assert!(
        !third.record().iter().any(|e| e["name"] == source.as_str()),
        "forgotten with its machine"
    );
}

/// The bounds on bases refuse a freeze before anything is sent, leaving the source running and
/// not a base; a failed freeze leaves no mark either.
#[tokio::test]
async fn bases_are_bounded_per_user_and_per_server_before_anything_is_sent() {
    let fake = FakeServe::start().await;
    let url = fake.url();
    let h = Harness::on_fake(&fake, &[("SMOL_MCP_MAX_BASES_PER_USER", "1")]).await;
    for name in ["one", "two"] {
        h.ok(
            "create-machine",
            json!({"image": "alpine", "branchable": true, "name": name}),
        )
        .await;
    }
    h.ok(
        "branch-machine",
        json!({"name": "one", "childName": "one-kid", "freezeSource": true}),
    )
    .await;
    fake.take_requests();
    let err = h
        .err(
            "branch-machine",
            json!({"name": "two", "childName": "two-kid", "freezeSource": true}),
        )
        .await;
    assert!(
        err.starts_with("LIMIT_REACHED") && err.contains("maxBasesPerUser 1"),
        "{err}"
    );
    assert_eq!(
        branch_requests(&fake),
        0,
        "refused before anything was sent"
    );
    assert_eq!(fake.machine_state("two").as_deref(), Some("running"));
    assert!(!h.record().iter().any(|e| e["name"] == "two"), "no mark");
    // A freeze again of the base is no new base; a plain branch of the other is no base.
    h.ok(
        "branch-machine",
        json!({"name": "one", "childName": "one-kid-2", "freezeSource": true}),
    )
    .await;
    h.ok(
        "branch-machine",
        json!({"name": "two", "childName": "two-kid"}),
    )
    .await;

    // The server's bound counts every user's.
    let server = h
        .next_process(&[
            ("SMOL_LOCAL_URL", url.as_str()),
            ("SMOL_MCP_MAX_BASES", "1"),
        ])
        .await;
    let err = server
        .err(
            "branch-machine",
            json!({"name": "two", "childName": "two-kid-2", "freezeSource": true}),
        )
        .await;
    assert!(
        err.starts_with("LIMIT_REACHED") && err.contains("maxBases 1"),
        "{err}"
    );
    // A freeze the engine refuses leaves the machine unmarked.
    h.ok(
        "create-machine",
        json!({"image": "alpine", "name": "plain"}),
    )
    .await;
    let unlimited = h.next_process(&[("SMOL_LOCAL_URL", url.as_str())]).await;
    unlimited
        .err(
            "branch-machine",
            json!({"name": "plain", "childName": "plain-kid", "freezeSource": true}),
        )
        .await;
    assert!(!h.record().iter().any(|e| e["name"] == "plain"), "no mark");
}

/// A base no branch was made of for `baseIdleSecs` goes, once no child depends on it.
#[tokio::test]
async fn an_idle_base_goes_once_no_child_depends_on_it() {
    let fake = FakeServe::start().await;
    let h = Harness::on_fake(&fake, &[("SMOL_MCP_BASE_IDLE_SECS", "1")]).await;
    h.ok(
        "create-machine",
        json!({"image": "alpine", "branchable": true, "name": "idle-base"}),
    )
    .await;
    h.ok(
        "branch-machine",
        json!({"name": "idle-base", "childName": "its-child", "freezeSource": true}),
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(2_100)).await;
    let reaped = h.protocol.process().reap_expired_kept().await;
    assert!(reaped.deleted.is_empty(), "{reaped:?}");
    assert!(
        reaped
            .failed
            .iter()
            .any(|(name, why)| name == "idle-base" && why.contains("its-child")),
        "the engine refuses while a child depends on it: {reaped:?}"
    );
    assert_eq!(fake.machine_state("idle-base").as_deref(), Some("frozen"));
    h.ok("delete-machine", json!({"name": "its-child"})).await;
    let reaped = h.protocol.process().reap_expired_kept().await;
    assert_eq!(reaped.deleted, vec!["idle-base".to_owned()], "{reaped:?}");
    assert_eq!(fake.machine_state("idle-base"), None);
    assert!(h.record().is_empty(), "{:?}", h.record());
}

/// A base is its maker's: another user neither sees it listed nor branches or deletes it.
#[tokio::test]
async fn a_base_is_its_makers_alone() {
    let fake = FakeServe::start().await;
    let runtime = tempfile::tempdir().unwrap();
    let protocol = signed_in_server(&fake, runtime.path(), &[]).await;
    let policy = &protocol.policy;
    call_as(
        policy,
        "alice",
        Tool::CreateMachine,
        json!({"image": "alpine", "branchable": true, "name": "alice-base"}),
    )
    .await
    .unwrap();
    call_as(
        policy,
        "alice",
        Tool::BranchMachine,
        json!({"name": "alice-base", "childName": "alice-kid", "freezeSource": true}),
    )
    .await
    .unwrap();
    let hers = call_as(policy, "alice", Tool::ListMachines, json!({}))
        .await
        .unwrap();
    assert_eq!(
        listed(&hers, "alice-base")["base"]["owner"],
        "alice",
        "{hers}"
    );
    let his = call_as(policy, "bob", Tool::ListMachines, json!({}))
        .await
        .unwrap();
    assert!(listed(&his, "alice-base").is_null(), "{his}");
    for (tool, args) in [
        (
            Tool::BranchMachine,
            json!({"name": "alice-base", "childName": "bob-kid"}),
        ),
        (Tool::DeleteMachine, json!({"name": "alice-base"})),
        (Tool::ListMachines, json!({"name": "alice-base"})),
        (
            Tool::CreateMachine,
            json!({"base": "alice-base", "name": "bob-kid"}),
        ),
    ] {
        let err = call_as(policy, "bob", tool, args).await.unwrap_err();
        assert!(err.starts_with("NOT_FOUND"), "{tool:?}: {err}");
    }
    assert_eq!(fake.machine_state("alice-base").as_deref(), Some("frozen"));
    assert!(fake.machine_state("bob-kid").is_none());
}

/// On cloud a base is made with the branch's `freezeSource` (pinned below), recorded and
/// listed as locally, and branched again by a later process.
#[tokio::test]
async fn a_cloud_base_is_made_with_freeze_source_and_branched_by_a_later_process() {
    let cloud = FakeCloud::start().await;
    let url = cloud.url();
    let env = [
        ("SMOL_CLOUD_URL", url.as_str()),
        ("SMOL_CLOUD_TOKEN", TOKEN),
        ("SMOL_MCP_TARGETS", "cloud"),
    ];
    let first = Harness::start(&env).await;
    let id = cloud.add_machine("cloud-base", "started");
    cloud.with(|st| st.machines.get_mut(&id).unwrap()["branchable"] = json!(true));
    first
        .ok(
            "branch-machine",
            json!({"name": "cloud-base", "childName": "mcp-cloud-kid", "freezeSource": true}),
        )
        .await;
    let listed = listed(&first.ok("list-machines", json!({})).await, "cloud-base");
    assert!(listed["base"]["madeFrom"].is_string(), "{listed}");
    first.protocol.policy.shutdown(&first.session).await;
    let second = first.next_process(&env).await;
    second
        .ok(
            "branch-machine",
            json!({"name": "cloud-base", "childName": "later-kid"}),
        )
        .await;
    let branches: Vec<Value> = cloud
        .take_requests()
        .into_iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.ends_with("/branches")))
        .collect();
    assert_request_snapshot!("cloud", "cloud_base_branches", branches);
}

/// create-machine with `base` makes one child of it, as branch-machine would: ready, named or
/// ephemeral; what a child has of its base is refused as an argument beside it, before
/// anything is sent.
#[tokio::test]
async fn create_machine_with_a_base_makes_a_child_of_it() {
    let fake = FakeServe::start().await;
    let h = Harness::on_fake(&fake, &[]).await;
    h.ok(
        "create-machine",
        json!({"image": "alpine", "branchable": true, "name": "prepared"}),
    )
    .await;
    h.ok(
        "branch-machine",
        json!({"name": "prepared", "childName": "first", "freezeSource": true}),
    )
    .await;
    fake.take_requests();
    for (arg, value) in [
        ("image", json!("alpine")),
        ("network", json!("open")),
        ("env", json!({"A": "1"})),
        ("cpus", json!(1)),
    ] {
        let mut args = json!({"base": "prepared", "name": "refused"});
        args[arg] = value;
        let err = h.err("create-machine", args).await;
        assert!(
            err.starts_with("INVALID_ARGUMENT")
                && err.contains(&format!("{arg}: cannot go with base")),
            "{arg}: {err}"
        );
    }
    assert_eq!(
        branch_requests(&fake),
        0,
        "refused before anything was sent"
    );
    let named = h
        .ok(
            "create-machine",
            json!({"base": "prepared", "name": "from-create"}),
        )
        .await;
    assert_eq!(
        (
            named["machine"]["name"].as_str(),
            named["ready"].as_bool(),
            named["ephemeral"].as_bool()
        ),
        (Some("from-create"), Some(true), Some(false)),
        "{named}"
    );
    let ephemeral = h.ok("create-machine", json!({"base": "prepared"})).await;
    let temp = ephemeral["machine"]["name"].as_str().unwrap().to_owned();
    assert!(
        temp.starts_with("mcp-") && ephemeral["ephemeral"] == true,
        "{ephemeral}"
    );
    let sent: Vec<Value> = fake
        .take_requests()
        .into_iter()
        .filter(|r| r["path"] == "/api/v1/machines/prepared/branches")
        .map(|r| r["body"]["name"].clone())
        .collect();
    assert_eq!(sent, vec![json!("from-create"), json!(temp)]);
    let r = h
        .ok("run-command", json!({"name": temp, "command": "true"}))
        .await;
    assert_eq!(r["exitCode"], 0);
    let cleanup = h.protocol.policy.shutdown(&h.session).await;
    assert_eq!(cleanup.deleted, vec![temp], "{cleanup:?}");
    assert_eq!(fake.machine_state("prepared").as_deref(), Some("frozen"));
}
