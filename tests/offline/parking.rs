//! `parkIdleSecs`: a temporary machine no call has named for that long and that runs nothing
//! the server knows of is paused (stopped where it cannot be), and the next call brings it back
//! and says so; one with a running job, a named one, or one just named is left running.

use crate::common::fake_serve::FakeServe;
use crate::common::mcp::Harness;
use serde_json::json;

fn state(fake: &FakeServe, name: &str) -> String {
    fake.state.lock().unwrap().machines[name]["state"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn idle_machines_are_parked_and_the_next_call_brings_them_back() {
    let fake = FakeServe::start_guest_shell().await;
    let h = Harness::on_fake(&fake, &[("SMOL_MCP_PARK_IDLE_SECS", "1")]).await;
    let name_of = |v: serde_json::Value| v["machine"]["name"].as_str().unwrap().to_owned();
    let pausable = name_of(
        h.ok(
            "create-machine",
            json!({"image": "alpine", "branchable": true}),
        )
        .await,
    );
    let plain = name_of(h.ok("create-machine", json!({"image": "alpine"})).await);
    let working = name_of(h.ok("create-machine", json!({"image": "alpine"})).await);
    h.ok(
        "run-command",
        json!({"name": working, "command": "sleep 30", "background": true}),
    )
    .await;
    h.ok(
        "create-machine",
        json!({"image": "alpine", "name": "named"}),
    )
    .await;
    assert!(
        h.protocol.policy.park_idle_once().await.is_empty(),
        "nothing is idle a second yet"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let mut parked = h.protocol.policy.park_idle_once().await;
    parked.sort_by(|a, b| a.0.cmp(&b.0));
    let mut expected = vec![
        (pausable.clone(), "Paused".to_owned()),
        (plain.clone(), "Stopped".to_owned()),
    ];
    expected.sort();
    assert_eq!(
        parked
            .iter()
            .map(|(n, how)| (n.clone(), format!("{how:?}")))
            .collect::<Vec<_>>(),
        expected
    );
    assert_eq!(state(&fake, &pausable), "paused");
    assert_eq!(state(&fake, &plain), "stopped");
    assert_eq!(state(&fake, &working), "running", "its job runs");
    assert_eq!(
        state(&fake, "named"),
        "running",
        "a named machine is never parked"
    );

    for machine in [&pausable, &plain] {
        let r = h
            .ok("run-command", json!({"name": machine, "command": "true"}))
            .await;
        assert_eq!(r["startedMachine"], true, "{machine}: {r}");
        assert_eq!(state(&fake, machine), "running");
    }
    assert!(
        h.protocol.policy.park_idle_once().await.is_empty(),
        "just named: not idle"
    );
}

#[tokio::test]
async fn when_machines_were_last_named_is_kept_only_for_parking_and_only_for_living_machines() {
    let fake = FakeServe::start_guest_shell().await;
    let url = fake.url();
    let off = Harness::on_fake(&fake, &[]).await;
    let made = off.ok("create-machine", json!({"image": "alpine"})).await;
    let name = made["machine"]["name"].as_str().unwrap().to_owned();
    off.ok("run-command", json!({"name": name, "command": "true"}))
        .await;
    assert_eq!(
        off.protocol.policy.process.leases.naming_len(),
        0,
        "parking off: nothing kept"
    );

    let on = Harness::start(&[
        ("SMOL_LOCAL_URL", url.as_str()),
        ("SMOL_MCP_PARK_IDLE_SECS", "3600"),
    ])
    .await;
    let mut names = Vec::new();
    for _ in 0..3 {
        let name = on.create(json!({"image": "alpine"})).await;
        on.ok("run-command", json!({"name": name, "command": "true"}))
            .await;
        names.push(name);
    }
    let leases = &on.protocol.policy.process.leases;
    assert!(leases.naming_len() >= 3, "{}", leases.naming_len());
    for name in &names[..2] {
        on.ok("delete-machine", json!({"name": name})).await;
    }
    assert!(on.protocol.policy.park_idle_once().await.is_empty());
    assert_eq!(
        leases.naming_len(),
        1,
        "only the machine still in the record is remembered"
    );
}
