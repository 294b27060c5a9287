//! Pins every request the cloud fleet sends to the smol cloud API (method, path, query, the
//! headers that matter, body), against the wiremock fake that behaves like the service.

use crate::common::fake_cloud::{FakeCloud, TEXT_CAP, TOKEN, exec_answer, short_deadlines};
use smol_mcp::fleet::{Backstop, BranchSpec, FleetApi, LogSource};
use std::time::Duration;

/// What the server gives ephemeral machines by default (ephemeralTtlSecs, ephemeralAutoStopSecs).
const BACKSTOP: Backstop = Backstop {
    ttl_secs: 3600,
    auto_stop_secs: 900,
};
use smol_mcp::fleet::ErrorKind;
use smol_mcp::fleet::{CloudFleet, Command, CreateSpec, Egress, ExecSpec, Mount, PortMapping};

async fn fleet() -> (FakeCloud, CloudFleet) {
    let fake = FakeCloud::start().await;
    let fleet = CloudFleet::new(&format!("{}/", fake.url()), TOKEN, BACKSTOP).unwrap();
    (fake, fleet)
}

#[tokio::test]
async fn create_with_each_egress_policy() {
    let (fake, fleet) = fleet().await;
    let mut open = CreateSpec::new("c-open", "alpine:3.20");
    open.egress = Egress::Open;
    open.env.insert("A".into(), "1".into());
    let created = fleet.create(&open).await.unwrap();
    assert!(created.id.starts_with("mach-"));
    assert_eq!(
        created.state,
        smol_mcp::fleet::MachineState::Stopped,
        "the service creates machines stopped"
    );
    assert_eq!(
        created.image.as_deref(),
        Some("registry.smolmachines.com/library/alpine:3.20")
    );
    let blocked = fleet
        .create(&CreateSpec::new("c-blocked", "alpine:3.20"))
        .await
        .unwrap();
    assert_eq!(blocked.network, "blocked");
    let mut allow = CreateSpec::new("c-allow", "alpine:3.20");
    allow.egress = Egress::Allow {
        hosts: vec!["pypi.org".into()],
        cidrs: vec!["10.0.0.0/8".into()],
    };
    assert_eq!(
        fleet.create(&allow).await.unwrap().network,
        "allow(pypi.org,10.0.0.0/8)"
    );
    assert_request_snapshot!("cloud", "cloud_create_egress", fake.take_requests());
}

#[tokio::test]
async fn create_with_ports_disk_branchable_and_ephemeral_timers() {
    let (fake, fleet) = fleet().await;
    let mut spec = CreateSpec::new("mcp-1234abcd", "python:3.12-alpine");
    spec.cpus = 1;
    spec.memory_mb = 256;
    spec.egress = Egress::Allow {
        hosts: vec!["pypi.org".into()],
        cidrs: vec![],
    };
    spec.ports = vec![PortMapping {
        guest: 8080,
        host: Some(9999),
    }];
    spec.storage_gb = Some(40);
    spec.branchable = true;
    spec.ephemeral = true;
    let created = fleet.create(&spec).await.unwrap();
    assert!(created.branchable);
    assert_eq!(created.ports[0].guest, 8080);
    assert_eq!(created.ports[0].host, None, "the host side is placed later");
    assert_request_snapshot!(
        "cloud",
        "cloud_create_ports_branchable_ttl",
        fake.take_requests()
    );
}

#[tokio::test]
async fn create_refusals_send_nothing() {
    let (fake, fleet) = fleet().await;
    let mut ported = CreateSpec::new("c-port", "alpine");
    ported.ports = vec![PortMapping {
        guest: 80,
        host: None,
    }];
    let err = fleet.create(&ported).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Refused);
    assert!(err.message.contains("network open"), "{err}");
    let mut mounted = CreateSpec::new("c-mount", "alpine");
    mounted.mounts = vec![Mount {
        source: "/a".into(),
        target: "/b".into(),
        readonly: false,
    }];
    assert_eq!(
        fleet.create(&mounted).await.unwrap_err().kind,
        ErrorKind::Unsupported
    );
    let mut overlay = CreateSpec::new("c-overlay", "alpine");
    overlay.overlay_gb = Some(5);
    assert_eq!(
        fleet.create(&overlay).await.unwrap_err().kind,
        ErrorKind::Unsupported
    );
    assert!(fake.take_requests().is_empty());
}

#[tokio::test]
async fn lifecycle_resolves_names_and_reads_back() {
    let (fake, fleet) = fleet().await;
    let id = fake.add_machine("web", "stopped");
    let started = fleet.start("web", None).await.unwrap();
    assert_eq!(started.id, id);
    assert!(started.is_running());
    assert_eq!(started.upstream_ready, Some(true));
    assert!(!fleet.stop(&id).await.unwrap().is_running());
    let deleted = fleet.delete("web").await.unwrap();
    assert_eq!(
        deleted.usage_micros,
        Some(1810),
        "the settled bill from includeUsage"
    );
    let gone = fleet.get(&id).await.unwrap_err();
    assert_eq!(gone.kind, ErrorKind::NotFound);
    assert_eq!(gone.message, "machine not found");
    assert!(
        gone.request_id.is_some(),
        "x-request-id is kept for the operators"
    );
    let unknown = fleet.get("never-made").await.unwrap_err();
    assert_eq!(
        unknown.message,
        "machine 'never-made' not found on the cloud fleet"
    );
    assert_request_snapshot!("cloud", "cloud_lifecycle", fake.take_requests());
}

#[tokio::test]
async fn delete_on_a_control_plane_without_include_usage_reads_the_usage_route() {
    let (fake, fleet) = fleet().await;
    let id = fake.add_machine("old", "stopped");
    fake.with(|st| st.delete_ignores_include_usage = true);
    let deleted = fleet.delete(&id).await.unwrap();
    assert_eq!(deleted.usage_micros, Some(1812));
    assert_request_snapshot!("cloud", "cloud_delete_fallback_usage", fake.take_requests());
}

#[tokio::test]
async fn exec_with_argv_and_with_a_string() {
    let (fake, fleet) = fleet().await;
    let id = fake.add_machine("w", "started");
    fake.with(|st| {
        st.exec_hook = Some(std::sync::Arc::new(|_| {
            exec_answer(42, b"partial\xfe", b"boom\n")
        }))
    });
    let mut argv = ExecSpec::new(Command::Argv(vec!["make".into(), "test".into()]));
    argv.workdir = Some("/workspace".into());
    argv.env.insert("CI".into(), "1".into());
    argv.stdin = Some("yes\n".into());
    argv.timeout_secs = Some(60);
    let out = fleet.exec(&id, &argv).await.unwrap();
    assert_eq!(
        out.exit_code, 42,
        "a failing command is a 200 with its exit code"
    );
    assert_eq!(out.stdout, b"partial\xfe");
    assert!(!out.stdout_cut_upstream);
    fleet
        .exec(&id, &ExecSpec::new(Command::Shell("echo $HOME".into())))
        .await
        .unwrap();
    assert_request_snapshot!("cloud", "cloud_exec", fake.take_requests());
}

#[tokio::test]
async fn exec_text_past_the_cap_is_reported_cut() {
    let (fake, fleet) = fleet().await;
    let id = fake.add_machine("w", "started");
    fake.with(|st| {
        st.exec_hook = Some(std::sync::Arc::new(|_| {
            serde_json::json!({"stdout": "head", "stderr": "", "exitCode": 0, "stdoutTruncated": true})
        }))
    });
    let out = fleet
        .exec(&id, &ExecSpec::new(Command::Shell("yes".into())))
        .await
        .unwrap();
    assert!(out.stdout_cut_upstream, "no byte-exact twin came back");
}

#[tokio::test]
async fn files_through_the_route() {
    let (fake, fleet) = fleet().await;
    let id = fake.add_machine("f", "stopped");
    assert_eq!(
        fleet
            .write_file(&id, "/workspace/a b.txt", b"hi\n".to_vec())
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        crate::common::read_all(fleet.read_file(&id, "/workspace/a b.txt").await.unwrap()).await,
        (Some(3), b"hi\n".to_vec())
    );
    let missing = fleet.read_file(&id, "/workspace/none").await.unwrap_err();
    assert_eq!(missing.kind, ErrorKind::NotFound);
    assert_eq!(missing.message, "file not found: workspace/none");
    assert_request_snapshot!("cloud", "cloud_files_route", fake.take_requests());
}

#[tokio::test]
async fn files_through_exec_where_the_route_is_missing() {
    let (fake, fleet) = fleet().await;
    let id = fake.add_machine("f", "started");
    fake.with(|st| st.files_route_missing = true);
    fleet
        .write_file(&id, "/tmp/it's.bin", vec![0, 159, 146, 150])
        .await
        .unwrap();
    assert_eq!(
        crate::common::read_all(fleet.read_file(&id, "/tmp/it's.bin").await.unwrap()).await,
        (Some(4), vec![0, 159, 146, 150])
    );
    let missing = fleet.read_file(&id, "/tmp/none").await.unwrap_err();
    assert_eq!(missing.kind, ErrorKind::NotFound);
    assert_request_snapshot!("cloud", "cloud_files_exec_fallback", fake.take_requests());
}

#[tokio::test]
async fn branch_and_its_fork_fallback() {
    let (fake, fleet) = fleet().await;
    let src = fake.add_machine("src", "started");
    let refused = fleet
        .branch(BranchSpec {
            source: &src,
            child: "child-0",
            branchable: false,
            freeze_source: false,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.kind, ErrorKind::Conflict);
    assert!(refused.message.contains("is not branchable"), "{refused}");
    fake.with(|st| st.machines.get_mut(&src).unwrap()["branchable"] = serde_json::json!(true));
    let child = fleet
        .branch(BranchSpec {
            source: &src,
            child: "child-1",
            branchable: true,
            freeze_source: false,
        })
        .await
        .unwrap();
    assert_eq!(child.name, "child-1");
    assert!(child.branchable);
    fake.with(|st| st.branches_route_missing = true);
    assert_eq!(
        fleet
            .branch(BranchSpec {
                source: &src,
                child: "child-2",
                branchable: false,
                freeze_source: false
            })
            .await
            .unwrap()
            .name,
        "child-2"
    );
    assert_request_snapshot!("cloud", "cloud_branch", fake.take_requests());
}

/// The guest ports only, the whole set (override cloud-ports-route); a caller's host port is
/// not sent. The first port's address is the record's ingress url; any other's is the connect
/// bridge, and both take the account's key, which the address names without containing it.
#[tokio::test]
async fn ports_send_guest_ports_only_and_addresses_need_the_key() {
    let (fake, fleet) = fleet().await;
    let id = fake.add_machine("web", "started");
    let machine = fleet
        .set_ports(
            "web",
            &[
                PortMapping {
                    guest: 8000,
                    host: Some(9999),
                },
                PortMapping {
                    guest: 9000,
                    host: None,
                },
            ],
        )
        .await
        .unwrap();
    let first = fleet.port_address(&machine, 8000).unwrap();
    assert_eq!(first.url, "https://web-7f3a.apps.smol.test");
    let second = fleet.port_address(&machine, 9000).unwrap();
    assert_eq!(
        second.url,
        format!("{}/v1/machines/{id}/connect/9000", fake.url())
    );
    let needs = second.needs.unwrap();
    assert!(needs.contains("Authorization: Bearer"), "{needs}");
    assert!(
        !needs.contains(TOKEN),
        "the key itself is never in an answer"
    );
    assert_eq!(fleet.port_address(&machine, 7000), None);
    assert!(!fleet.is_port_in_use(&fleet.set_ports("gone", &[]).await.unwrap_err()));
    assert_request_snapshot!("cloud", "cloud_set_ports", fake.take_requests());
}

#[tokio::test]
async fn events_account_and_usage() {
    let (fake, fleet) = fleet().await;
    let created = fleet
        .create(&CreateSpec::new("ev", "alpine"))
        .await
        .unwrap();
    fleet.start(&created.id, None).await.unwrap();
    let page = fleet
        .logs(&created.id, 1, None, LogSource::default())
        .await
        .unwrap();
    assert_eq!(page.lines, ["2026-09-08T14:47:39Z INFO machine started"]);
    assert_eq!(page.cursor, "e:ev-2");
    fleet.stop(&created.id).await.unwrap();
    let next = fleet
        .logs(&created.id, 1, Some(&page.cursor), LogSource::default())
        .await
        .unwrap();
    assert_eq!(next.lines, ["2026-09-08T14:47:40Z INFO machine stopped"]);
    let account = fleet.account().await.unwrap();
    assert_eq!(account.status, "active");
    assert_eq!(account.period_total_micros, Some(1810));
    assert_eq!(
        fleet.usage(&created.id).await.unwrap().total_micros,
        Some(1812)
    );
    assert_request_snapshot!("cloud", "cloud_events_account_usage", fake.take_requests());
}

#[tokio::test]
async fn a_bad_key_is_reported_without_echoing_it() {
    let fake = FakeCloud::start().await;
    let fleet = CloudFleet::new(&fake.url(), "smk_wrong", BACKSTOP).unwrap();
    let err = fleet.list().await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Unauthorized);
    assert_eq!(err.status, Some(401));
    assert!(!err.to_string().contains("smk_wrong"));
    assert!(
        !format!("{fleet:?}").contains("smk_wrong"),
        "the token stays out of Debug"
    );
}

#[tokio::test]
async fn exec_on_a_stopped_machine_waits_for_the_boot_inside_the_call() {
    let (fake, fleet) = fleet().await;
    let fleet = fleet.with_deadlines(short_deadlines());
    let id = fake.add_machine("cold", "stopped");
    // The boot alone takes longer than the command's timeout plus the slack (1.5 s).
    fake.with(|st| st.boot_delay = Duration::from_millis(2000));
    let mut spec = ExecSpec::new(Command::Argv(vec!["echo".into(), "up".into()]));
    spec.timeout_secs = Some(1);
    let out = fleet.exec(&id, &spec).await.unwrap();
    assert_eq!(out.stdout, b"up\n");
    assert!(
        fake.with(|st| st.machines[&id]["state"] == "started"),
        "the exec left it running"
    );
    // Through the base64-over-exec files fallback too.
    let other = fake.add_machine("cold-2", "stopped");
    fake.with(|st| st.files_route_missing = true);
    fleet
        .write_file(&other, "/workspace/x", b"x".to_vec())
        .await
        .unwrap();
}

#[tokio::test]
async fn exec_output_at_the_1_mib_cap_comes_whole_from_the_base64_twin() {
    let (fake, fleet) = fleet().await;
    let id = fake.add_machine("big", "started");
    // Just past the text cap, with a byte that is not UTF-8 where the cap falls.
    let mut big = vec![b'a'; TEXT_CAP - 1];
    big.extend_from_slice(&[0xfe, b'z', b'\n']);
    let sent = big.clone();
    fake.with(|st| st.exec_hook = Some(std::sync::Arc::new(move |_| exec_answer(0, &sent, b""))));
    let out = fleet
        .exec(&id, &ExecSpec::new(Command::Shell("cat big".into())))
        .await
        .unwrap();
    assert_eq!(out.stdout.len(), big.len());
    assert_eq!(out.stdout, big, "byte-exact past the cap");
    assert!(!out.stdout_cut_upstream);
    // The files fallback reads a file whose base64 is far past the text cap.
    fake.with(|st| {
        st.exec_hook = None;
        st.files_route_missing = true;
        st.files
            .insert((id.clone(), "workspace/big".into()), big.clone());
    });
    let (_, bytes) =
        crate::common::read_all(fleet.read_file(&id, "/workspace/big").await.unwrap()).await;
    assert_eq!(bytes, big);
}

#[tokio::test]
async fn error_bodies_of_every_shape_keep_their_code_and_message() {
    let fake = FakeCloud::start().await;
    // A key the service does not know: JSON `{code, error}` (API 0.1.0).
    let wrong = CloudFleet::new(&fake.url(), "smk_wrong", BACKSTOP).unwrap();
    let err = wrong.list().await.unwrap_err();
    assert_eq!(
        (err.kind, err.upstream_code.as_deref(), err.message.as_str()),
        (
            ErrorKind::Unauthorized,
            Some("unknown_key"),
            "unknown API key"
        )
    );
    // No key at all (the server always sends one; this is the parsing of what comes back): an
    // empty 401.
    let bare = reqwest::get(format!("{}/v1/machines", fake.url()))
        .await
        .unwrap();
    let err = smol_mcp::fleet::upstream::from_response("list machines", bare).await;
    assert_eq!(
        (err.kind, err.upstream_code, err.message.as_str()),
        (ErrorKind::Unauthorized, None, "empty answer")
    );
    // A newer control plane: problem+json on every error.
    fake.with(|st| st.problem_json = true);
    let err = wrong.account().await.unwrap_err();
    assert_eq!(
        (err.upstream_code.as_deref(), err.message.as_str()),
        (Some("unknown_key"), "unknown API key")
    );
    let fleet = CloudFleet::new(&fake.url(), TOKEN, BACKSTOP).unwrap();
    let err = fleet
        .get("mach-00000000000000000000000000000000")
        .await
        .unwrap_err();
    assert_eq!(
        (err.kind, err.upstream_code.as_deref(), err.message.as_str()),
        (ErrorKind::NotFound, Some("not_found"), "machine not found")
    );
    let src = fake.add_machine("src", "started");
    let err = fleet
        .branch(BranchSpec {
            source: &src,
            child: "kid",
            branchable: false,
            freeze_source: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Conflict);
    assert_eq!(err.upstream_code.as_deref(), Some("conflict"));
    assert!(err.message.contains("is not branchable"), "{err}");
    let missing = fleet.read_file(&src, "/workspace/none").await.unwrap_err();
    assert_eq!(missing.message, "file not found: workspace/none");
}

#[tokio::test]
async fn streamed_exec_sends_the_exec_body_to_exec_stream() {
    let (fake, fleet) = fleet().await;
    let id = fake.add_machine("w", "started");
    fake.with(|st| {
        st.exec_hook = Some(std::sync::Arc::new(|_| {
            exec_answer(42, b"one\ntwo\n", b"boom\n")
        }))
    });
    let mut argv = ExecSpec::new(Command::Argv(vec!["make".into(), "test".into()]));
    argv.workdir = Some("/workspace".into());
    argv.env.insert("CI".into(), "1".into());
    argv.stdin = Some("yes\n".into());
    argv.timeout_secs = Some(60);
    let (sender, mut pieces) = tokio::sync::mpsc::unbounded_channel();
    let out = fleet.exec_streamed(&id, &argv, &sender).await.unwrap();
    assert_eq!(out.exit_code, 42);
    assert_eq!(out.stdout, b"one\ntwo\n");
    assert_eq!(out.stderr, b"boom\n");
    let mut texts = Vec::new();
    while let Ok(piece) = pieces.try_recv() {
        texts.push(format!("{}:{}", piece.stream.as_str(), piece.text));
    }
    assert_eq!(texts, ["stdout:one\n", "stdout:two\n", "stderr:boom\n"]);
    assert_request_snapshot!("cloud", "cloud_exec_stream", fake.take_requests());
}

#[tokio::test]
async fn background_exec_sends_background_true() {
    let (fake, fleet) = fleet().await;
    let id = fake.add_machine("w", "started");
    let mut spec = ExecSpec::new(Command::Shell("sleep 600".into()));
    spec.background = true;
    spec.env.insert("JOB".into(), "1".into());
    spec.workdir = Some("/workspace".into());
    let out = fleet.exec(&id, &spec).await.unwrap();
    assert_eq!(out.exit_code, 0);
    assert_eq!(out.stdout, b"pid=4242\n", "answered at once with the pid");
    assert_request_snapshot!("cloud", "cloud_exec_background", fake.take_requests());
}
