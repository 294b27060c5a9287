//! Every tool on the cloud fleet, and the two-fleet mode, through an MCP client, against the
//! fake cloud (and the fake serve for the local half).

use crate::common::fake_cloud::{FakeCloud, TOKEN, short_deadlines};
use crate::common::fake_serve::FakeServe;
use crate::common::mcp::Harness;
use serde_json::json;
use smol_mcp::fleet::{Backstop, CloudFleet};
use std::time::Duration;

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn setup() -> (FakeCloud, Harness) {
    let cloud = FakeCloud::start().await;
    let h = Harness::on_fake_cloud(&cloud, &[]).await;
    (cloud, h)
}

/// `setup`, with the cloud fleet's deadlines cut short (`short_deadlines`).
async fn setup_short() -> (FakeCloud, Harness) {
    let (cloud, h) = setup().await;
    let backstop = Backstop {
        ttl_secs: 3600,
        auto_stop_secs: 900,
    };
    let fleet = CloudFleet::new(&cloud.url(), TOKEN, backstop)
        .unwrap()
        .with_deadlines(short_deadlines());
    assert!(h.protocol.process().use_cloud_fleet(fleet));
    (cloud, h)
}

#[tokio::test]
async fn the_worked_flow_on_cloud() {
    let (cloud, h) = setup().await;
    let created = h
        .ok(
            "create-machine",
            json!({"image": "alpine:3.20", "cpus": 1, "memoryMb": 256}),
        )
        .await;
    let m = &created["machine"];
    let id = m["id"].as_str().unwrap().to_owned();
    let name = m["name"].as_str().unwrap().to_owned();
    assert!(id.starts_with("mach-"));
    assert_eq!(m["network"], "blocked");
    assert_eq!(m["image"], "registry.smolmachines.com/library/alpine:3.20");
    assert_eq!(created["ready"], true);
    let body = cloud
        .take_requests()
        .into_iter()
        .find(|r| r["method"] == "POST" && r["path"] == "/v1/machines")
        .unwrap()["body"]
        .clone();
    assert_eq!(
        body["ttlSeconds"], 3600,
        "ephemeral cloud machines carry the backstop timers"
    );
    assert_eq!(body["autoStopSeconds"], 900);
    assert!(
        body.get("ephemeral").is_none(),
        "never the service's own ephemeral flag"
    );

    // By name: resolved to the id with one list call.
    let r = h
        .ok("run-command", json!({"name": name, "command": "exit 42"}))
        .await;
    assert_eq!(r["exitCode"], 42);
    h.ok(
        "write-file",
        json!({"name": name, "path": "/workspace/a b.txt", "content": "0123456789"}),
    )
    .await;
    let (page, content) = h
        .read(json!({"name": id, "path": "/workspace/a b.txt", "offset": 4, "length": 3}))
        .await;
    assert_eq!(content, "456");
    assert_eq!(page["size"], 10);
    // An image comes as one the model sees, on this fleet too.
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVQI12P4z8AAAAMBAQAY3Y2wAAAAAElFTkSuQmCC";
    h.ok(
        "write-file",
        json!({"name": id, "path": "/workspace/dot.png", "content": png, "encoding": "base64"}),
    )
    .await;
    let image = h
        .call(
            "read-file",
            json!({"name": id, "path": "/workspace/dot.png"}),
        )
        .await;
    assert_eq!(
        image.images,
        vec![("image/png".to_string(), png.to_string())],
        "{}",
        image.text
    );
    let logs = h.ok("machine-logs", json!({"name": id})).await;
    assert!(
        logs["lines"][0]
            .as_str()
            .unwrap()
            .ends_with("INFO machine created")
    );
    assert!(logs["cursor"].as_str().unwrap().starts_with("e:"));

    let stopped = h.ok("stop-machine", json!({"name": id})).await;
    assert_eq!(stopped["machine"]["state"], "stopped");
    let again = h
        .ok("run-command", json!({"name": id, "command": ["echo", "x"]}))
        .await;
    assert_eq!(
        again["startedMachine"], true,
        "the command started the stopped machine"
    );

    let pull = h
        .err("pull-image", json!({"name": id, "image": "alpine"}))
        .await;
    assert!(
        pull.starts_with("UNSUPPORTED") && pull.contains("local only"),
        "{pull}"
    );

    let deleted = h.ok("delete-machine", json!({"name": name})).await;
    assert_eq!(deleted["usageMicros"], 1810, "the settled bill");
    assert!(cloud.with(|st| st.machines.is_empty()));
}

/// On cloud the service places the outside side: only the guest port is sent, a host port is
/// refused before anything is sent, and the answer is the ingress address with what opening
/// it takes (the account's key, never the key itself).
#[tokio::test]
async fn a_cloud_port_is_published_at_the_machines_ingress() {
    let (cloud, h) = setup().await;
    let id = cloud.add_machine("web", "started");
    let err = h
        .err(
            "publish-port",
            json!({"name": "web", "port": 8000, "hostPort": 8000}),
        )
        .await;
    assert!(err.starts_with("INVALID_ARGUMENT: hostPort:"), "{err}");
    let err = h
        .err("stop-machine", json!({"name": "web", "pause": true}))
        .await;
    assert!(
        err.starts_with("INVALID_ARGUMENT: pause: pause is local only")
            && err.contains("stop-machine keeps the disk"),
        "{err}"
    );
    cloud.take_requests();
    let published = h
        .ok(
            "publish-port",
            json!({"name": "web", "port": 8000, "waitSecs": 0}),
        )
        .await;
    assert_eq!(published["url"], "https://web-7f3a.apps.smol.test");
    let note = published["note"].as_str().unwrap();
    assert!(note.contains("Authorization: Bearer"), "{note}");
    assert!(!published.to_string().contains(TOKEN));
    let puts: Vec<_> = cloud
        .take_requests()
        .into_iter()
        .filter(|r| r["method"] == "PUT")
        .collect();
    assert_eq!(puts.len(), 1);
    assert_eq!(puts[0]["path"], format!("/v1/machines/{id}/ports"));
    assert_eq!(puts[0]["body"], json!({"ports": [{"port": 8000}]}));
    let second = h
        .ok(
            "publish-port",
            json!({"name": "web", "port": 9000, "waitSecs": 0}),
        )
        .await;
    assert_eq!(
        second["url"],
        format!("{}/v1/machines/{id}/connect/9000", cloud.url())
    );
    let record = h.ok("list-machines", json!({"name": "web"})).await["machines"][0].clone();
    assert_eq!(record["ports"].as_array().unwrap().len(), 2, "{record}");
}

#[tokio::test]
async fn cloud_refusals_come_before_any_request() {
    let (cloud, h) = setup().await;
    let err = h
        .err(
            "create-machine",
            json!({"image": "nginx", "ports": [{"guest": 80}]}),
        )
        .await;
    assert!(
        err.starts_with("REFUSED") && err.contains("published port and blocked egress"),
        "{err}"
    );
    let err = h
        .err(
            "create-machine",
            json!({"image": "a", "mounts": [{"source": "/a", "target": "/b"}]}),
        )
        .await;
    assert!(
        err.starts_with("UNSUPPORTED") && err.contains("mounts are local only"),
        "{err}"
    );
    // Only the local engine boots a machine without an image.
    for tool in ["create-machine", "run-once"] {
        let args = if tool == "run-once" {
            json!({"command": "true"})
        } else {
            json!({})
        };
        let err = h.err(tool, args).await;
        assert!(
            err.contains("image") && err.contains("required on the cloud fleet"),
            "{tool}: {err}"
        );
    }
    let creates = cloud
        .take_requests()
        .into_iter()
        .filter(|r| r["method"] == "POST")
        .count();
    assert_eq!(creates, 0);
    // An allow-list with a port is fine.
    h.ok(
        "create-machine",
        json!({"image": "nginx", "ports": [{"guest": 80}], "allowHosts": ["pypi.org"]}),
    )
    .await;
}

#[tokio::test]
async fn a_suspended_account_is_refused_before_create() {
    let (cloud, h) = setup().await;
    cloud.with(|st| st.account_status = Some("suspended".into()));
    let err = h.err("create-machine", json!({"image": "alpine"})).await;
    assert!(
        err.starts_with("ACCOUNT_NOT_ACTIVE") && err.contains("suspended"),
        "{err}"
    );
    assert!(
        cloud.take_requests().iter().all(|r| r["method"] == "GET"),
        "no machine was created"
    );
}

#[tokio::test]
async fn a_bad_key_is_reported_without_echoing_it() {
    let cloud = FakeCloud::start().await;
    let url = cloud.url();
    let h = Harness::start(&[
        ("SMOL_CLOUD_URL", url.as_str()),
        ("SMOL_CLOUD_TOKEN", "smk_wrong"),
        ("SMOL_MCP_TARGETS", "cloud"),
    ])
    .await;
    let err = h.err("create-machine", json!({"image": "alpine"})).await;
    assert!(
        err.starts_with("UNAUTHORIZED") && err.contains("account"),
        "{err}"
    );
    assert!(
        err.contains("HTTP 401 unknown_key: unknown API key"),
        "the service's code and words: {err}"
    );
    assert!(!err.contains("smk_wrong"));
    // A newer control plane's problem+json carries the same code and its detail.
    cloud.with(|st| st.problem_json = true);
    let err = h.err("list-machines", json!({})).await;
    assert!(
        err.starts_with("UNAUTHORIZED") && err.contains("HTTP 401 unknown_key: unknown API key"),
        "{err}"
    );
}

#[tokio::test]
async fn problem_json_errors_reach_the_tool_with_code_and_detail() {
    let (cloud, h) = setup().await;
    cloud.with(|st| st.problem_json = true);
    let err = h
        .err(
            "list-machines",
            json!({"name": "mach-00000000000000000000000000000000"}),
        )
        .await;
    assert!(
        err.starts_with("NOT_FOUND") && err.contains("HTTP 404 not_found: machine not found"),
        "{err}"
    );
    cloud.add_machine("taken", "stopped");
    let err = h
        .err(
            "create-machine",
            json!({"image": "alpine", "name": "taken"}),
        )
        .await;
    assert!(
        err.starts_with("CONFLICT")
            && err.contains("HTTP 409 conflict: machine name 'taken' already exists"),
        "{err}"
    );
}

#[tokio::test]
async fn run_once_on_cloud_deletes_its_machine() {
    let (cloud, h) = setup().await;
    let r = h
        .ok(
            "run-once",
            json!({"image": "alpine", "command": ["echo", "hello"]}),
        )
        .await;
    assert_eq!(r["stdout"], "hello\n");
    assert!(cloud.with(|st| st.machines.is_empty()));
}

#[tokio::test]
async fn both_fleets_need_a_target_on_every_call() {
    let cloud = FakeCloud::start().await;
    let serve = FakeServe::start().await;
    let (curl, surl) = (cloud.url(), serve.url());
    let h = Harness::start(&[
        ("SMOL_CLOUD_URL", curl.as_str()),
        ("SMOL_CLOUD_TOKEN", TOKEN),
        ("SMOL_LOCAL_URL", surl.as_str()),
    ])
    .await;
    let err = h.err("list-machines", json!({})).await;
    assert!(err.contains("target: required"), "{err}");
    let err = h.err("list-machines", json!({"target": "mars"})).await;
    assert!(
        err.contains("target") && err.contains("local") && err.contains("cloud"),
        "{err}"
    );
    serve.add_machine("here", "running");
    cloud.add_machine("there", "started");
    let local = h.ok("list-machines", json!({"target": "local"})).await;
    assert_eq!(local["machines"][0]["name"], "here");
    let remote = h.ok("list-machines", json!({"target": "cloud"})).await;
    assert_eq!(remote["machines"][0]["name"], "there");
    let tools = h.client.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), crate::common::offered_without_settings());
    for t in tools {
        let required = t.input_schema["required"].as_array().unwrap();
        assert!(required.contains(&json!("target")), "{}", t.name);
    }
}

#[tokio::test]
async fn a_crashed_session_s_cloud_machines_are_deleted_at_the_next_start() {
    let (cloud, h) = setup().await;
    let created = h.ok("create-machine", json!({"image": "alpine"})).await;
    let id = created["machine"]["id"].as_str().unwrap().to_owned();
    // Pretend the owning process died: rewrite the record's pid to one that is not running.
    let path = h.record_path();
    let text = std::fs::read_to_string(&path).unwrap();
    let pid = std::process::id().to_string();
    std::fs::write(
        &path,
        text.replace(&format!("\"ownerPid\": {pid}"), "\"ownerPid\": 4194303"),
    )
    .unwrap();
    h.protocol.process().sweep_orphans_at_start().await;
    assert!(
        cloud.with(|st| !st.machines.contains_key(&id)),
        "the orphan was deleted"
    );
    assert!(!std::fs::read_to_string(&path).unwrap().contains(&id));
}

#[tokio::test]
async fn get_start_and_branch_on_cloud() {
    let (cloud, h) = setup().await;
    let id = cloud.add_machine("src", "stopped");
    let got = h.ok("list-machines", json!({"name": "src"})).await["machines"][0].clone();
    assert_eq!(
        (got["id"].as_str(), got["state"].as_str()),
        (Some(id.as_str()), Some("stopped"))
    );
    let err = h
        .err("start-machine", json!({"name": "src", "branchable": true}))
        .await;
    assert!(
        err.starts_with("CONFLICT") && err.contains("created with branchable true"),
        "{err}"
    );
    let started = h.ok("start-machine", json!({"name": "src"})).await;
    assert_eq!(
        (
            started["machine"]["state"].as_str(),
            started["ready"].as_bool()
        ),
        (Some("started"), Some(true))
    );
    let refused = h
        .err("branch-machine", json!({"name": "src", "childName": "kid"}))
        .await;
    assert!(
        refused.starts_with("CONFLICT") && refused.contains("is not branchable"),
        "{refused}"
    );
    cloud.with(|st| st.machines.get_mut(&id).unwrap()["branchable"] = json!(true));
    let child = h
        .ok(
            "branch-machine",
            json!({"name": "src", "childName": "mcp-kid"}),
        )
        .await;
    assert_eq!(
        (child["ready"].as_bool(), child["ephemeral"].as_bool()),
        (Some(true), Some(true))
    );
    let cleanup = h.protocol.process().cleanup_session(&h.session).await;
    assert_eq!(cleanup.deleted, ["mcp-kid"]);
}

#[tokio::test]
async fn a_machine_the_auto_stop_sweep_stopped_is_started_by_the_next_command() {
    let (cloud, h) = setup_short().await;
    let created = h.ok("create-machine", json!({"image": "alpine"})).await;
    let id = created["machine"]["id"].as_str().unwrap().to_owned();
    cloud.with(|st| {
        st.auto_stop_after = Some(ms(300));
        // Longer than the command's 1 s timeout plus the 0.5 s slack.
        st.boot_delay = ms(2000);
    });
    tokio::time::sleep(ms(400)).await;
    assert_eq!(
        cloud.with(|st| st.machines[&id]["state"].clone()),
        "stopped",
        "the sweep stopped the idle machine"
    );
    let r = h
        .ok(
            "run-command",
            json!({"name": id, "command": ["echo", "back"], "timeoutSecs": 1}),
        )
        .await;
    assert_eq!(
        (r["startedMachine"].as_bool(), r["stdout"].as_str()),
        (Some(true), Some("back\n"))
    );
}

#[tokio::test]
async fn a_start_that_outlasts_its_deadline_says_the_machine_may_still_come_up() {
    let (cloud, h) = setup_short().await;
    cloud.add_machine("slow", "stopped");
    cloud.with(|st| st.start_delay = ms(1500));
    let err = h.err("start-machine", json!({"name": "slow"})).await;
    assert!(
        err.starts_with("TIMEOUT") && err.contains("slow may come up after this call gave up"),
        "{err}"
    );
    tokio::time::sleep(ms(1600)).await;
    let got = h.ok("list-machines", json!({"name": "slow"})).await["machines"][0].clone();
    assert_eq!(got["state"], "started", "it came up after all");
}

/// A running branchable `src` whose branches wait 1.5 s in the service's queue: longer than the
/// short deadlines of `setup_short`.
fn queue_branches_of_a_source(cloud: &FakeCloud) {
    let src = cloud.add_machine("src", "started");
    cloud.with(|st| {
        st.machines.get_mut(&src).unwrap()["branchable"] = json!(true);
        st.branch_delay = ms(1500);
    });
}

fn has_machine(cloud: &FakeCloud, name: &str) -> bool {
    cloud.with(|st| st.machines.values().any(|m| m["name"] == name))
}

#[tokio::test]
async fn a_branch_that_outlasts_its_deadline_is_still_deleted_at_session_end() {
    let (cloud, h) = setup_short().await;
    queue_branches_of_a_source(&cloud);
    let has_kid = |cloud: &FakeCloud| has_machine(cloud, "mcp-kid");
    let err = h
        .err(
            "branch-machine",
            json!({"name": "src", "childName": "mcp-kid"}),
        )
        .await;
    assert!(
        err.starts_with("TIMEOUT")
            && err.contains("mcp-kid may come up after this call gave up")
            && err.contains("deleted when this session ends"),
        "{err}"
    );
    assert!(!has_kid(&cloud), "still in the source's queue");
    tokio::time::sleep(ms(1600)).await;
    assert!(has_kid(&cloud), "the branch was made after all");
    let cleanup = h.protocol.process().cleanup_session(&h.session).await;
    assert_eq!(cleanup.deleted, ["mcp-kid"]);
    assert!(!has_kid(&cloud));
}

#[tokio::test]
async fn an_ephemeral_machine_the_ttl_sweep_deleted_is_not_found_and_counts_as_cleaned_up() {
    let (cloud, h) = setup().await;
    let created = h.ok("create-machine", json!({"image": "alpine"})).await;
    let id = created["machine"]["id"].as_str().unwrap().to_owned();
    let name = created["machine"]["name"].as_str().unwrap().to_owned();
    cloud.with(|st| st.ttl_after = Some(ms(200)));
    tokio::time::sleep(ms(300)).await;
    assert!(
        cloud.with(|st| !st.machines.contains_key(&id)),
        "the TTL sweep deleted it"
    );
    for machine in [&id, &name] {
        let err = h
            .err("run-command", json!({"name": machine, "command": ["true"]}))
            .await;
        assert!(
            err.starts_with("NOT_FOUND") && err.contains("ttlSeconds"),
            "{err}"
        );
    }
    let cleanup = h.protocol.process().cleanup_session(&h.session).await;
    assert_eq!(cleanup.deleted, [name]);
    assert!(cleanup.failed.is_empty(), "{:?}", cleanup.failed);
    assert!(
        !std::fs::read_to_string(h.record_path())
            .unwrap()
            .contains(&id)
    );
}

#[tokio::test]
async fn the_readiness_wait_is_bounded_by_ready_timeout_even_while_a_probe_boots_the_machine() {
    let cloud = FakeCloud::start().await;
    let url = cloud.url();
    let h = Harness::on_fake_cloud(&cloud, &[("SMOL_MCP_READY_TIMEOUT_SECS", "1")]).await;
    let backstop = Backstop {
        ttl_secs: 3600,
        auto_stop_secs: 900,
    };
    let fleet = CloudFleet::new(&url, TOKEN, backstop)
        .unwrap()
        .with_deadlines(short_deadlines());
    assert!(h.protocol.process().use_cloud_fleet(fleet));
    cloud.add_machine("cold", "stopped");
    // The probe's own deadline (10 s + slack + boot) is longer than the boot; the 1 s readiness
    // wait is what bounds it.
    cloud.with(|st| st.boot_delay = ms(4000));
    let began = std::time::Instant::now();
    let err = h
        .err(
            "write-file",
            json!({"name": "cold", "path": "/workspace/a", "content": "x"}),
        )
        .await;
    assert!(
        err.starts_with("NOT_READY") && err.contains("within 1 s"),
        "{err}"
    );
    assert!(began.elapsed() < ms(3000), "{:?}", began.elapsed());
}

/// A branch child still in the source's queue when the session ends is not there to delete yet;
/// it stays recorded, and a later clean-up deletes it once it exists (a branch child has no TTL
/// of its own, so forgetting it would leak it).
#[tokio::test]
async fn a_branch_child_still_queued_at_session_end_is_deleted_by_a_later_sweep() {
    let (cloud, h) = setup_short().await;
    queue_branches_of_a_source(&cloud);
    let has_kid = |cloud: &FakeCloud| has_machine(cloud, "mcp-late");
    h.err(
        "branch-machine",
        json!({"name": "src", "childName": "mcp-late"}),
    )
    .await;
    let early = h.protocol.process().cleanup_session(&h.session).await;
    assert!(early.deleted.is_empty(), "{early:?}");
    assert_eq!(early.failed.len(), 1, "reported, not forgotten: {early:?}");
    assert!(
        std::fs::read_to_string(h.record_path())
            .unwrap()
            .contains("mcp-late"),
        "still recorded"
    );
    tokio::time::sleep(ms(1600)).await;
    assert!(has_kid(&cloud), "the branch was made after all");
    let later = h.protocol.process().cleanup_session(&h.session).await;
    assert_eq!(later.deleted, ["mcp-late"]);
    assert!(!has_kid(&cloud));
}
