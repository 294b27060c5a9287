//! `sessionEnd` stop and pause: a session's temporary machines kept past its end, taken back by
//! a later process's session that names one, and deleted once `keptMachineSecs` have passed,
//! against the fake serve.

use crate::common::fake_serve::FakeServe;
use crate::common::mcp::Harness;
use serde_json::{Value, json};
use smol_mcp::process::ephemeral::CLAIMED;

fn entry(h: &Harness, name: &str) -> Option<Value> {
    h.record().into_iter().find(|e| e["name"] == name)
}

fn instructions(h: &Harness) -> String {
    h.client
        .peer_info()
        .and_then(|info| info.instructions.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_stopped_machine_outlives_its_session_and_a_later_process_takes_it_back() {
    let fake = FakeServe::start().await;
    let url = fake.url();
    let first = Harness::on_fake(&fake, &[("SMOL_MCP_SESSION_END", "stop")]).await;
    assert!(
        instructions(&first).contains("they are stopped (disk kept) and kept for 1 day"),
        "{}",
        instructions(&first)
    );
    let name = first.create(json!({"image": "alpine"})).await;
    first
        .ok(
            "write-file",
            json!({"name": name, "path": "/root/work.txt", "content": "half done"}),
        )
        .await;
    first
        .ok("create-machine", json!({"image": "alpine", "name": "mine"}))
        .await;

    let cleanup = first.protocol.policy.shutdown(&first.session).await;
    assert!(cleanup.deleted.is_empty(), "{cleanup:?}");
    assert_eq!(cleanup.kept.len(), 1, "{cleanup:?}");
    assert_eq!(cleanup.kept[0].0, name);
    assert_eq!(fake.machine_state(&name).as_deref(), Some("stopped"));
    let kept = entry(&first, &name).expect("still recorded");
    assert_eq!(kept["session"], "", "it belongs to no session: {kept}");
    let until = kept["keptUntil"].as_u64().expect("a time to go");
    let in_a_day = smol_mcp::process::ephemeral::now_secs() + 86_400;
    assert!(until <= in_a_day && until + 60 >= in_a_day, "{kept}");

    // The server starts again, now under the default: its session is told what is kept, and
    // takes it by naming it.
    let plain = [("SMOL_LOCAL_URL", url.as_str())];
    let second = first.next_process(&plain).await;
    assert!(
        instructions(&second).contains(&format!("Kept from earlier sessions now: {name}.")),
        "{}",
        instructions(&second)
    );
    let (page, content) = second
        .read(json!({"name": name, "path": "/root/work.txt"}))
        .await;
    assert_eq!(content, "half done", "the disk was kept");
    assert_eq!(page["startedMachine"], true, "{page}");
    let taken = entry(&second, &name).unwrap();
    assert_eq!(taken["session"], second.session.as_str(), "{taken}");
    assert!(taken.get("keptUntil").is_none(), "{taken}");
    // Another process no longer names it as kept: it is the second session's.
    let third = second.next_process(&plain).await;
    assert!(
        !instructions(&third).contains(&name),
        "{}",
        instructions(&third)
    );
    // Nor does another session take it from the second by naming it.
    third.ok("list-machines", json!({"name": name})).await;
    assert_eq!(entry(&third, &name).unwrap(), taken);

    // The second session ends under the default: its machines go, the taken one with them.
    let cleanup = second.protocol.policy.shutdown(&second.session).await;
    assert_eq!(cleanup.deleted, std::slice::from_ref(&name), "{cleanup:?}");
    assert!(cleanup.kept.is_empty(), "{cleanup:?}");
    assert_eq!(fake.machine_state(&name), None);
    assert_eq!(fake.machine_state("mine").as_deref(), Some("running"));
    assert!(entry(&second, &name).is_none());
}

#[tokio::test]
async fn a_kept_machine_goes_when_its_time_is_up_and_can_no_longer_be_taken() {
    let fake = FakeServe::start().await;
    let url = fake.url();
    let first = Harness::on_fake(
        &fake,
        &[
            ("SMOL_MCP_SESSION_END", "stop"),
            ("SMOL_MCP_KEPT_MACHINE_SECS", "1"),
        ],
    )
    .await;
    let a = first.create(json!({"image": "alpine"})).await;
    let b = first.create(json!({"image": "alpine"})).await;
    let cleanup = first.protocol.policy.shutdown(&first.session).await;
    assert_eq!(cleanup.kept.len(), 2, "{cleanup:?}");
    tokio::time::sleep(std::time::Duration::from_millis(2_100)).await;

    let later = first
        .next_process(&[("SMOL_LOCAL_URL", url.as_str())])
        .await;
    assert!(
        !instructions(&later).contains(&a),
        "{}",
        instructions(&later)
    );
    // Naming one after its time takes nothing: it is an orphan now, for the reaper.
    // The start's own sweep may have deleted it before this read (seen once in CI's offline
    // run): then it is gone from the engine too, below.
    let before = entry(&later, &a);
    later.ok("list-machines", json!({"name": a})).await;
    // Not taken back: its kept time stays and it joins no session. The sweep this first
    // local call starts may meanwhile have claimed it for deletion, which marks it so, or
    // even deleted it already (the record is read after the call, on another thread); a
    // machine taken back would still be here, under the later session.
    match (before, entry(&later, &a)) {
        (Some(before), Some(after)) => {
            assert_eq!(
                after["keptUntil"], before["keptUntil"],
                "not taken once expired"
            );
            assert_ne!(
                after["session"],
                later.session.as_str(),
                "not taken once expired"
            );
            assert!(
                after["session"] == before["session"] || after["session"] == CLAIMED,
                "{after}"
            );
        }
        (None, Some(after)) => panic!("back in the record after it was gone: {after}"),
        (_, None) => assert_eq!(
            fake.machine_state(&a),
            None,
            "gone from the record, so from the engine"
        ),
    }
    // The reaper deletes what the sweep has not claimed; what the sweep claimed, the sweep
    // deletes (each machine by one of them): within a few seconds both are gone, from the
    // engine and from the record.
    let reaped = later.protocol.process().reap_expired_kept().await;
    assert!(
        reaped.failed.is_empty() && reaped.kept.is_empty(),
        "{reaped:?}"
    );
    assert!(
        reaped.deleted.iter().all(|d| *d == a || *d == b),
        "{reaped:?}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while (fake.machine_state(&a).is_some()
        || fake.machine_state(&b).is_some()
        || !later.record().is_empty())
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(fake.machine_state(&a), None);
    assert_eq!(fake.machine_state(&b), None);
    assert!(later.record().is_empty(), "{:?}", later.record());
}

#[tokio::test]
async fn pause_keeps_a_branchable_machine_paused_and_stops_the_others() {
    let fake = FakeServe::start().await;
    let url = fake.url();
    let env = [
        ("SMOL_LOCAL_URL", url.as_str()),
        ("SMOL_MCP_SESSION_END", "pause"),
    ];
    let first = Harness::start(&env).await;
    let branchable = first
        .create(json!({"image": "alpine", "branchable": true}))
        .await;
    let plain = first.create(json!({"image": "alpine"})).await;
    let stopped = first.create(json!({"image": "alpine"})).await;
    first.ok("stop-machine", json!({"name": stopped})).await;

    let cleanup = first.protocol.policy.shutdown(&first.session).await;
    let how: std::collections::BTreeMap<String, String> = cleanup
        .kept
        .iter()
        .map(|(name, how)| (name.clone(), format!("{how:?}")))
        .collect();
    assert_eq!(how[&branchable], "Paused", "{how:?}");
    assert_eq!(how[&plain], "Stopped", "not started branchable: {how:?}");
    assert_eq!(how[&stopped], "AsItWas", "{how:?}");
    assert_eq!(fake.machine_state(&branchable).as_deref(), Some("paused"));
    assert_eq!(fake.machine_state(&plain).as_deref(), Some("stopped"));
    assert_eq!(
        fake.state.lock().unwrap().pauses,
        [format!("pause {branchable}")]
    );

    // Taken back by a command, which resumes it; kept again (still paused: as it was) when
    // the next session ends too, with a new time.
    let second = first.next_process(&env).await;
    let ran = second
        .ok(
            "run-command",
            json!({"name": branchable, "command": "true"}),
        )
        .await;
    assert_eq!(ran["startedMachine"], true, "{ran}");
    assert_eq!(fake.machine_state(&branchable).as_deref(), Some("running"));
    let cleanup = second.protocol.policy.shutdown(&second.session).await;
    assert_eq!(
        cleanup
            .kept
            .iter()
            .map(|(n, _)| n.clone())
            .collect::<Vec<_>>(),
        std::slice::from_ref(&branchable),
        "only what the second session took: {cleanup:?}"
    );
    assert_eq!(fake.machine_state(&branchable).as_deref(), Some("paused"));
    assert_eq!(second.record().len(), 3, "{:?}", second.record());
}

#[tokio::test]
async fn a_lease_that_runs_out_keeps_its_machine_like_a_session_end() {
    let fake = FakeServe::start().await;
    let h = Harness::on_fake(
        &fake,
        &[
            ("SMOL_MCP_SESSION_END", "stop"),
            ("SMOL_MCP_MACHINE_LEASE_SECS", "1"),
        ],
    )
    .await;
    let process = h.protocol.process();
    process
        .fleet(smol_mcp::fleet::FleetKind::Local)
        .await
        .unwrap();
    // What a sessionless (2026-07-28) HTTP request's create records: a leased machine.
    fake.add_machine("mcp-leased", "running");
    let lease_session = process.lease_session().to_owned();
    process
        .remember(
            smol_mcp::fleet::FleetKind::Local,
            "mcp-leased",
            &lease_session,
            None,
        )
        .await
        .unwrap();
    assert!(entry(&h, "mcp-leased").unwrap()["lease"].is_object());
    tokio::time::sleep(std::time::Duration::from_millis(2_100)).await;
    let reaped = process.reap_expired_leases().await;
    assert!(reaped.deleted.is_empty(), "{reaped:?}");
    assert_eq!(reaped.kept.len(), 1, "{reaped:?}");
    assert_eq!(fake.machine_state("mcp-leased").as_deref(), Some("stopped"));
    let kept = entry(&h, "mcp-leased").unwrap();
    assert!(
        kept["keptUntil"].is_u64() && kept.get("lease").is_none(),
        "{kept}"
    );
    // A sessionless request naming it again takes it back under a new lease.
    assert!(process.take_back("mcp-leased", &lease_session).await);
    let taken = entry(&h, "mcp-leased").unwrap();
    assert!(taken["lease"].is_object(), "{taken}");
    assert!(taken.get("keptUntil").is_none(), "{taken}");
}

/// A machine taken back after its session's end keeps what it promised: made to ask the user
/// about refused egress, it still does under the later process (whose client here cannot be
/// asked, which the answer says), its allow list in force.
#[tokio::test]
async fn a_kept_machine_taken_back_still_asks_about_its_egress() {
    let fake = FakeServe::start().await;
    let url = fake.url();
    let first = Harness::on_fake(&fake, &[("SMOL_MCP_SESSION_END", "stop")]).await;
    let name = first.create(json!({"network": "ask"})).await;
    let cleanup = first.protocol.policy.shutdown(&first.session).await;
    assert_eq!(cleanup.kept.len(), 1, "{cleanup:?}");

    let second = first
        .next_process(&[("SMOL_LOCAL_URL", url.as_str())])
        .await;
    fake.deny_on_exec(&name, "resolve", "pypi.org");
    let failed = second
        .ok("run-command", json!({"name": name, "command": "exit 1"}))
        .await;
    assert_eq!(failed["startedMachine"], true, "{failed}");
    let answer = &failed["egressAnswer"];
    assert_eq!(answer["declined"], json!(["pypi.org"]), "{failed}");
    assert!(
        answer["notAsked"]
            .as_str()
            .is_some_and(|why| why.contains("cannot show the user a question")),
        "{failed}"
    );
    let listed = second.ok("list-machines", json!({"name": name})).await["machines"][0].clone();
    assert_eq!(listed["network"], "allow(none)", "{listed}");
}
