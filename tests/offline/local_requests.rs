//! Pins every request the local fleet sends to `smolvm serve` (method, path, query, the headers
//! that matter, body), against the in-process fake on a Unix socket.

use crate::common::fake_serve::{FakeServe, exec_response};
use serde_json::json;
use smol_mcp::fleet::{BranchSpec, FleetApi};
use smol_mcp::fleet::{
    Command, CreateSpec, Egress, ExecSpec, LocalFleet, LogSource, Mount, PortMapping,
};

async fn fleet() -> (FakeServe, LocalFleet) {
    let fake = FakeServe::start().await;
    let fleet = LocalFleet::new(fake.endpoint()).unwrap();
    (fake, fleet)
}

#[tokio::test]
async fn create_with_each_egress_policy() {
    let (fake, fleet) = fleet().await;
    let mut open = CreateSpec::new("m-open", "python:3.12-alpine");
    open.egress = Egress::Open;
    open.env.insert("B".into(), "2".into());
    open.env.insert("A".into(), "1".into());
    let created = fleet.create(&open).await.unwrap();
    assert_eq!(created.network.to_string(), "open");
    fleet
        .create(&CreateSpec::new("m-blocked", "alpine"))
        .await
        .unwrap();
    let mut allow = CreateSpec::new("m-allow", "alpine");
    allow.egress = Egress::Allow {
        hosts: vec!["pypi.org".into(), "files.pythonhosted.org".into()],
        cidrs: vec!["10.0.0.0/8".into()],
    };
    let allowed = fleet.create(&allow).await.unwrap();
    assert_eq!(
        allowed.network.to_string(),
        "allow(pypi.org,files.pythonhosted.org,10.0.0.0/8)"
    );
    let mut hosts_only = CreateSpec::new("m-hosts", "alpine");
    hosts_only.egress = Egress::Allow {
        hosts: vec!["example.com".into()],
        cidrs: vec![],
    };
    fleet.create(&hosts_only).await.unwrap();
    assert_request_snapshot!("local", "local_create_egress", fake.take_requests());
}

/// An allow list in force that allows nothing yet (a network "ask" machine's first list) goes
/// out with an empty host list, not without one: only a host list turns the engine's DNS
/// filter on, so that a refused name is recorded and can be put to the user (on the nested
/// 1.32.2 engine, without it the guest resolved every name and no name was ever recorded).
#[tokio::test]
async fn an_allow_list_allowing_nothing_yet_sends_an_empty_host_list() {
    let (fake, fleet) = fleet().await;
    let mut nothing_yet = CreateSpec::new("m-ask", "alpine");
    nothing_yet.egress = Egress::Allow {
        hosts: vec![],
        cidrs: vec![],
    };
    let created = fleet.create(&nothing_yet).await.unwrap();
    assert_eq!(created.network.to_string(), "allow(none)");
    let requests = fake.take_requests();
    assert_eq!(
        requests[0]["body"]["allowedHosts"],
        json!([]),
        "{requests:?}"
    );
    assert_eq!(
        requests[0]["body"]["allowedCidrs"],
        json!([]),
        "{requests:?}"
    );
    assert_eq!(requests[0]["body"]["network"], false, "{requests:?}");
}

/// Without an image the engine boots its bundled Alpine root file system: the body has no
/// `image` at all (not an empty one).
#[tokio::test]
async fn create_without_an_image() {
    let (fake, fleet) = fleet().await;
    fleet.create(&CreateSpec::bare("m-bare")).await.unwrap();
    let requests = fake.take_requests();
    assert!(requests[0]["body"].get("image").is_none(), "{requests:?}");
    assert_request_snapshot!("local", "local_create_bare", requests);
}

#[tokio::test]
async fn create_with_ports_mounts_and_disks() {
    let (fake, fleet) = fleet().await;
    let mut spec = CreateSpec::new("m-full", "nginx:alpine");
    spec.cpus = 4;
    spec.memory_mb = 4096;
    spec.egress = Egress::Open;
    spec.ports = vec![
        PortMapping {
            guest: 80,
            host: Some(8081),
        },
        PortMapping {
            guest: 8080,
            host: None,
        },
    ];
    spec.mounts = vec![
        Mount {
            source: "/srv/data".into(),
            target: "/data".into(),
            readonly: true,
        },
        Mount {
            source: "/srv/work".into(),
            target: "/work".into(),
            readonly: false,
        },
    ];
    spec.storage_gb = Some(40);
    spec.overlay_gb = Some(5);
    // The cloud's backstop for ephemeral machines has no local counterpart.
    spec.ephemeral = true;
    let created = fleet.create(&spec).await.unwrap();
    assert_eq!(created.ports.len(), 2);
    assert_request_snapshot!("local", "local_create_ports_mounts", fake.take_requests());
}

/// A machine's published ports go out whole, as the engine's `PUT .../ports` replaces them;
/// a host port something else holds is the engine's 409 PORT_IN_USE, which the fleet names so
/// that the caller may try another. The fake binds the host ports for real: they are below the
/// kernel's ephemeral range (32768 up), where any test's outgoing connection could hold one
/// (47802 was, once, in CI).
#[tokio::test]
async fn ports_are_sent_as_the_whole_set_and_a_held_host_port_is_recognised() {
    let (fake, fleet) = fleet().await;
    fake.add_machine("m1", "running");
    fake.add_machine("m2", "running");
    let both = [
        PortMapping {
            guest: 8000,
            host: Some(29_801),
        },
        PortMapping {
            guest: 9000,
            host: Some(29_802),
        },
    ];
    let machine = fleet.set_ports("m1", &both).await.unwrap();
    assert_eq!(machine.ports.len(), 2);
    let address = fleet.port_address(&machine, 9000).unwrap();
    assert_eq!(address.url, "http://127.0.0.1:29802");
    assert_eq!(address.needs, None);
    assert_eq!(fleet.port_address(&machine, 7000), None, "not published");
    let held = fleet
        .set_ports(
            "m2",
            &[PortMapping {
                guest: 80,
                host: Some(29_801),
            }],
        )
        .await
        .unwrap_err();
    assert!(fleet.is_port_in_use(&held), "{held:?}");
    let not_found = fleet.set_ports("gone", &[]).await.unwrap_err();
    assert!(!fleet.is_port_in_use(&not_found) && not_found.is_not_found());
    let v6 = LocalFleet::new(fake.endpoint())
        .unwrap()
        .with_publish_host("[::1]");
    assert_eq!(
        v6.port_address(&machine, 8000).unwrap().url,
        "http://[::1]:29801"
    );
    assert_request_snapshot!("local", "local_set_ports", fake.take_requests());
}

#[tokio::test]
async fn branchable_is_asked_for_at_start_and_branch_names_the_child() {
    let (fake, fleet) = fleet().await;
    let mut spec = CreateSpec::new("m-src", "alpine");
    spec.branchable = true;
    fleet.create(&spec).await.unwrap();
    let started = fleet.start("m-src", Some(true)).await.unwrap();
    assert!(started.branchable);
    let child = fleet
        .branch(BranchSpec {
            source: "m-src",
            child: "m-child",
            branchable: false,
            freeze_source: false,
        })
        .await
        .unwrap();
    assert_eq!(child.name, "m-child");
    assert_request_snapshot!("local", "local_create_start_branch", fake.take_requests());
}

#[tokio::test]
async fn start_stop_delete_get_list() {
    let (fake, fleet) = fleet().await;
    fake.add_machine("m1", "created");
    assert!(fleet.start("m1", Some(false)).await.unwrap().is_running());
    assert!(!fleet.stop("m1").await.unwrap().is_running());
    assert_eq!(fleet.list().await.unwrap().len(), 1);
    assert_eq!(
        fleet.get("m1").await.unwrap().state,
        smol_mcp::fleet::MachineState::Stopped
    );
    assert_eq!(fleet.delete("m1").await.unwrap().deleted, "m1");
    assert!(fleet.get("m1").await.unwrap_err().is_not_found());
    assert_request_snapshot!("local", "local_lifecycle", fake.take_requests());
}

/// The blocked-egress report's question: the newest refusals, many at once (the route has no
/// `since`; the report picks the run's by time).
#[tokio::test]
async fn egress_events() {
    let (fake, fleet) = fleet().await;
    fake.add_machine("m1", "running");
    fake.push_egress_denial(
        "m1",
        "2026-08-13T02:31:05.123456Z",
        "connect",
        "93.184.215.14:443",
    );
    let denials = fleet.egress_denials("m1", 1000).await.unwrap();
    assert_eq!(denials.len(), 1);
    assert_eq!(denials[0].dest, "93.184.215.14:443");
    assert_request_snapshot!("local", "local_egress_events", fake.take_requests());
}

#[tokio::test]
async fn exec_with_argv_and_with_a_string() {
    let (fake, fleet) = fleet().await;
    fake.add_machine("m1", "running");
    fake.set_exec(|_| exec_response(3, b"out\xff\n", b"err\n"));
    let mut argv = ExecSpec::new(Command::Argv(vec![
        "python3".into(),
        "-c".into(),
        "print(1)".into(),
    ]));
    argv.workdir = Some("/work".into());
    argv.env.insert("FOO".into(), "bar".into());
    argv.stdin = Some("input text".into());
    argv.timeout_secs = Some(30);
    let out = fleet.exec("m1", &argv).await.unwrap();
    assert_eq!(out.exit_code, 3);
    assert_eq!(
        out.stdout, b"out\xff\n",
        "bytes come from the exact base64 twin"
    );
    assert_eq!(out.stderr, b"err\n");
    fleet
        .exec("m1", &ExecSpec::new(Command::Shell("ls / | wc -l".into())))
        .await
        .unwrap();
    assert_request_snapshot!("local", "local_exec", fake.take_requests());
}

#[tokio::test]
async fn files_logs_pull_and_health() {
    let (fake, fleet) = fleet().await;
    fake.add_machine("m1", "running");
    assert_eq!(
        fleet
            .write_file("m1", "/root/a b.txt", b"hello\n".to_vec())
            .await
            .unwrap(),
        6
    );
    assert_eq!(
        crate::common::read_all(fleet.read_file("m1", "/root/a b.txt").await.unwrap()).await,
        (Some(6), b"hello\n".to_vec()),
        "the answer declares the length"
    );
    let missing = fleet.read_file("m1", "/nope").await.unwrap_err();
    assert_eq!(missing.upstream_code.as_deref(), Some("INTERNAL_ERROR"));
    for line in ["boot", "ready", "third"] {
        fake.push_log("m1", line);
    }
    let first = fleet
        .logs("m1", 2, None, LogSource::Workload)
        .await
        .unwrap();
    assert_eq!(first.lines, ["ready", "third"]);
    fake.push_log("m1", "fourth");
    let next = fleet
        .logs("m1", 2, Some(&first.cursor), LogSource::Workload)
        .await
        .unwrap();
    assert_eq!(next.lines, ["fourth"]);
    // The engine's own log, without this server's internal commands in it.
    fake.state.lock().unwrap().engine_logs.insert(
        "m1".into(),
        vec![
            r#"{"message":"agent ready"}"#.into(),
            r#"{"message":"running command","command":["echo","ready-1","smol-mcp-internal"]}"#
                .into(),
            r#"{"message":"running command","command":["make"]}"#.into(),
        ],
    );
    let engine = fleet.logs("m1", 10, None, LogSource::Engine).await.unwrap();
    assert_eq!(
        engine.lines,
        [
            r#"{"message":"agent ready"}"#,
            r#"{"message":"running command","command":["make"]}"#
        ]
    );
    let image = fleet.pull_image("m1", "python:3.12-alpine").await.unwrap();
    assert_eq!(image.reference, "python:3.12-alpine");
    assert_eq!(fleet.health().await.unwrap().version, "1.32.2");
    assert_request_snapshot!(
        "local",
        "local_files_logs_pull_health",
        fake.take_requests()
    );
}

#[tokio::test]
async fn streamed_exec_sends_the_exec_body_to_exec_stream() {
    let (fake, fleet) = fleet().await;
    fake.add_machine("m1", "running");
    fake.set_exec(|_| exec_response(3, b"one\ntwo\n", b"err\n"));
    let mut argv = ExecSpec::new(Command::Argv(vec!["make".into(), "test".into()]));
    argv.workdir = Some("/work".into());
    argv.env.insert("FOO".into(), "bar".into());
    argv.timeout_secs = Some(30);
    let (sender, mut pieces) = tokio::sync::mpsc::unbounded_channel();
    let out = fleet.exec_streamed("m1", &argv, &sender).await.unwrap();
    assert_eq!(out.exit_code, 3);
    assert_eq!(out.stdout, b"one\ntwo\n");
    assert_eq!(out.stderr, b"err\n");
    let mut texts = Vec::new();
    while let Ok(piece) = pieces.try_recv() {
        texts.push(format!("{}:{}", piece.stream.as_str(), piece.text));
    }
    assert_eq!(texts, ["stdout:one\n", "stdout:two\n", "stderr:err\n"]);
    // The stream handler reads no stdin (smolvm 1.32.2 exec.rs), so a command with stdin goes
    // through the plain exec.
    let mut with_stdin = ExecSpec::new(Command::Shell("cat".into()));
    with_stdin.stdin = Some("input".into());
    fleet
        .exec_streamed("m1", &with_stdin, &sender)
        .await
        .unwrap();
    assert_request_snapshot!("local", "local_exec_stream", fake.take_requests());
}

#[tokio::test]
async fn background_exec_sends_background_true() {
    let (fake, fleet) = fleet().await;
    fake.add_machine("m1", "running");
    let mut spec = ExecSpec::new(Command::Shell("sleep 600".into()));
    spec.background = true;
    spec.env.insert("JOB".into(), "1".into());
    spec.workdir = Some("/work".into());
    let out = fleet.exec("m1", &spec).await.unwrap();
    assert_eq!(out.exit_code, 0);
    assert_eq!(out.stdout, b"pid=4242\n", "answered at once with the pid");
    assert_request_snapshot!("local", "local_exec_background", fake.take_requests());
}

/// The values a test machine is given, from nowhere but the test.
#[derive(Debug)]
struct TestValues;

const TEST_VALUE: &str = "value-that-no-snapshot-may-hold";

#[async_trait::async_trait]
impl smol_mcp::fleet::CredentialValues for TestValues {
    async fn values_for(
        &self,
        machine: &str,
    ) -> Option<Result<Vec<(String, smol_mcp::fleet::Secret)>, smol_mcp::fleet::FleetError>> {
        (machine == "m-cred").then(|| {
            Ok(vec![(
                "github".to_owned(),
                smol_mcp::fleet::Secret::new(TEST_VALUE),
            )])
        })
    }

    async fn forget(&self, _machine: &str) {}
}

/// A machine with credential bindings: the create names them (snake_case inside, as 1.32.2
/// takes them) with no value; the values go in a `PUT .../credential-values` right before the
/// start; a running machine's allow list is widened with `POST .../egress`. The value itself is
/// replaced before the snapshot, and the test fails if it went anywhere but that one body.
#[tokio::test]
async fn create_with_credentials_supply_them_and_allow_egress() {
    let fake = FakeServe::start().await;
    let fleet = LocalFleet::new(fake.endpoint())
        .unwrap()
        .with_credentials(std::sync::Arc::new(TestValues));
    let mut spec = CreateSpec::new("m-cred", "alpine");
    spec.egress = Egress::Allow {
        hosts: vec!["api.github.com".into()],
        cidrs: vec![],
    };
    spec.credentials = vec![
        smol_mcp::fleet::CredentialBindingSpec {
            name: "github".into(),
            env: Some("GH_TOKEN".into()),
            hosts: vec!["api.github.com".into()],
            header: None,
        },
        smol_mcp::fleet::CredentialBindingSpec {
            name: "npm".into(),
            env: None,
            hosts: vec!["*.npmjs.org".into()],
            header: Some("authorization".into()),
        },
    ];
    fleet.create(&spec).await.unwrap();
    fleet.start("m-cred", None).await.unwrap();
    fleet
        .allow_egress("m-cred", &["pypi.org".into()], &["10.0.2.2/32".into()])
        .await
        .unwrap();
    let requests = fake.take_requests();
    let text = serde_json::to_string(&requests).unwrap();
    assert_eq!(text.matches(TEST_VALUE).count(), 1, "{text}");
    let put = requests.iter().find(|r| r["method"] == "PUT").unwrap();
    assert_eq!(put["body"]["values"]["github"], TEST_VALUE);
    let redacted: serde_json::Value =
        serde_json::from_str(&text.replace(TEST_VALUE, "[the value of github]")).unwrap();
    assert_request_snapshot!("local", "local_credentials_and_egress", redacted);
}
