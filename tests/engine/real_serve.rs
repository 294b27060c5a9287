//! The local fleet against the real `smolvm serve` 1.32.2 control plane. Guests cannot boot on
//! the CI hosts (paravirtual KVM), so nothing here starts a machine: this covers health, create,
//! list, get, stop, delete and the API's refusals, with the engine's own messages.

use crate::common::real_serve::{PINNED_SMOLVM, RealServe};
use smol_mcp::fleet::ErrorKind;
use smol_mcp::fleet::{BranchSpec, FleetApi};
use smol_mcp::fleet::{CreateSpec, Egress, LocalFleet, LogSource, PortMapping};

fn spec(name: &str) -> CreateSpec {
    let mut spec = CreateSpec::new(name, "alpine");
    spec.cpus = 1;
    spec.memory_mb = 512;
    spec
}

#[tokio::test]
async fn health_reports_the_release_not_the_spec_version() {
    let serve = RealServe::start().await;
    let fleet = LocalFleet::new(serve.endpoint.clone()).unwrap();
    let health = fleet.health().await.unwrap();
    assert_eq!(health.status, "ok");
    assert_eq!(health.version, PINNED_SMOLVM);
    assert_ne!(
        health.version, "0.5.2",
        "info.version of the spec, not a release"
    );
}

#[tokio::test]
async fn create_list_get_stop_delete_without_booting() {
    let serve = RealServe::start().await;
    let fleet = LocalFleet::new(serve.endpoint.clone()).unwrap();
    assert!(fleet.list().await.unwrap().is_empty());

    let mut s = spec("it-lifecycle");
    s.egress = Egress::Allow {
        hosts: vec!["pypi.org".into()],
        cidrs: vec!["10.1.0.0/16".into()],
    };
    s.ports = vec![PortMapping {
        guest: 8080,
        host: Some(18080),
    }];
    s.env.insert("GREETING".into(), "hello".into());
    let created = fleet.create(&s).await.unwrap();
    assert_eq!(created.id, "it-lifecycle");
    assert_eq!(created.state, smol_mcp::fleet::MachineState::Created);
    assert_eq!(created.cpus, Some(1));
    assert_eq!(created.memory_mb, Some(512));
    assert_eq!(created.network, "allow(pypi.org,10.1.0.0/16)");
    assert_eq!(created.image.as_deref(), Some("alpine"));
    assert_eq!(created.ports.len(), 1);
    assert!(
        created
            .created_at
            .as_deref()
            .is_some_and(|t| t.ends_with('Z'))
    );

    let listed = fleet.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0], created);
    assert_eq!(fleet.get("it-lifecycle").await.unwrap(), created);

    let stopped = fleet.stop("it-lifecycle").await.unwrap();
    assert!(!stopped.is_running());

    let deleted = fleet.delete("it-lifecycle").await.unwrap();
    assert_eq!(deleted.deleted, "it-lifecycle");
    assert_eq!(deleted.usage_micros, None);
    let gone = fleet.get("it-lifecycle").await.unwrap_err();
    assert_eq!(gone.kind, ErrorKind::NotFound);
    assert_eq!(gone.upstream_code.as_deref(), Some("NOT_FOUND"));
    assert!(gone.message.contains("'it-lifecycle' not found"), "{gone}");
    assert!(fleet.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn refusals_carry_the_engine_message() {
    let serve = RealServe::start().await;
    let fleet = LocalFleet::new(serve.endpoint.clone()).unwrap();

    let missing = fleet.delete("nope").await.unwrap_err();
    assert_eq!(missing.kind, ErrorKind::NotFound);
    assert_eq!(missing.status, Some(404));
    assert_eq!(
        missing.to_string(),
        "delete machine nope: HTTP 404 NOT_FOUND: machine 'nope' not found"
    );

    fleet.create(&spec("it-twice")).await.unwrap();
    let conflict = fleet.create(&spec("it-twice")).await.unwrap_err();
    assert_eq!(conflict.kind, ErrorKind::Conflict);
    assert_eq!(conflict.message, "machine 'it-twice' already exists");

    let not_branchable = fleet
        .branch(BranchSpec {
            source: "it-twice",
            child: "child",
            branchable: false,
            freeze_source: false,
        })
        .await
        .unwrap_err();
    assert_eq!(not_branchable.kind, ErrorKind::Conflict);
    assert!(
        not_branchable.message.contains("forkable"),
        "the engine names the fix: {not_branchable}"
    );

    let no_logs = fleet
        .logs("it-twice", 10, None, LogSource::Engine)
        .await
        .unwrap_err();
    assert_eq!(no_logs.kind, ErrorKind::NotFound);
    assert!(no_logs.message.contains("no logs yet"), "{no_logs}");
    // The workload's log of a machine that exists but has none is an empty page that says why.
    let no_workload = fleet
        .logs("it-twice", 10, None, LogSource::Workload)
        .await
        .unwrap();
    assert!(no_workload.lines.is_empty());
    assert!(
        no_workload
            .note
            .as_deref()
            .is_some_and(|n| n.contains("printed nothing")),
        "{no_workload:?}"
    );
    let unknown = fleet
        .logs("no-such-machine", 10, None, LogSource::Workload)
        .await
        .unwrap_err();
    assert_eq!(unknown.kind, ErrorKind::NotFound, "{unknown}");
    // The machine-logs tool never asks for more than 10000 lines; the engine, asked for more of
    // a machine that has no log, answers the 404 before it looks at `tail` (the fake serve
    // checks in the same order).
    let http = serve.endpoint.http_client().unwrap();
    let over = http
        .get(format!(
            "{}/api/v1/machines/it-twice/logs?tail=10001&follow=false",
            serve.endpoint.base_url()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(over.status(), 404);
    let body = over.text().await.unwrap();
    assert!(body.contains("has no logs yet"), "{body}");

    fleet.delete("it-twice").await.unwrap();
}

#[tokio::test]
async fn an_unknown_field_is_refused_with_the_api_message() {
    // The generated types cannot send an unknown field, so this goes through the same transport
    // by hand and maps the answer with the same function the fleet uses for undocumented statuses.
    let serve = RealServe::start().await;
    let http = serve.endpoint.http_client().unwrap();
    let response = http
        .post(format!("{}/api/v1/machines", serve.endpoint.base_url()))
        .json(&serde_json::json!({"name": "it-bogus", "image": "alpine", "bogus": 1}))
        .send()
        .await
        .unwrap();
    let err = smol_mcp::fleet::upstream::from_response("create machine it-bogus", response).await;
    assert_eq!(err.kind, ErrorKind::Invalid);
    assert_eq!(err.status, Some(422));
    assert!(err.message.contains("unknown field `bogus`"), "{err}");
    let fleet = LocalFleet::new(serve.endpoint.clone()).unwrap();
    assert!(
        fleet.list().await.unwrap().is_empty(),
        "nothing was created"
    );
}

/// The argument check and the engine agree on every name: what the check accepts the engine
/// creates, what it refuses the engine refuses too, so a bad name never reaches the engine.
#[tokio::test]
async fn machine_names_follow_the_engines_own_rule() {
    let serve = RealServe::start().await;
    let fleet = LocalFleet::new(serve.endpoint.clone()).unwrap();
    let longest = format!("n{}", "x".repeat(127));
    let too_long = format!("n{}", "x".repeat(128));
    let names = [
        "plain",
        "a_b-c9",
        "9lives",
        longest.as_str(),
        too_long.as_str(),
        "dot.ted",
        "trailing-",
        "two--dashes",
        "-leading",
        "_leading",
        "sp ace",
        "ümlaut",
    ];
    for name in names {
        let accepted = smol_mcp::policy::tools::grammar::machine_name("name", name).is_ok();
        let created = fleet.create(&spec(name)).await;
        assert_eq!(
            accepted,
            created.is_ok(),
            "{name:?}: check {accepted}, engine {created:?}"
        );
        if created.is_ok() {
            fleet.delete(name).await.unwrap();
        }
    }
}
