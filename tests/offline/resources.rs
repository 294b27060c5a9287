//! The resources (smol://targets, a machine's logs and files), completions, log following, and
//! `smol-mcp doctor`, through an in-process MCP client against the fake serve and fake cloud.

// resources/subscribe is what session clients (2025-11-25 and older) use; rmcp marks it
// deprecated in favour of the 2026-07-28 listen, which the Python client tests cover.
#![allow(deprecated)]

use crate::common::fake_cloud::{FakeCloud, TOKEN};
use crate::common::fake_serve::FakeServe;
use crate::common::mcp::config;
use crate::common::stdio::server_env;
use rmcp::model::{
    CompletionContext, ReadResourceRequestParams, ResourceContents,
    ResourceUpdatedNotificationParam, SubscribeRequestParams, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::Value;
use smol_mcp::protocol::Protocol;
use smol_mcp::protocol::server::SmolMcp;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// A client that records every notifications/resources/updated it receives.
#[derive(Clone)]
struct Recorder {
    updated: mpsc::UnboundedSender<String>,
}

impl ClientHandler for Recorder {
    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.updated.send(params.uri);
    }
}

struct Setup {
    client: RunningService<RoleClient, Recorder>,
    updates: mpsc::UnboundedReceiver<String>,
    protocol: Arc<Protocol>,
    _runtime: tempfile::TempDir,
}

/// A protocol on `env` in a runtime directory of its own, polling followed logs every 100 ms.
fn following_protocol(env: &[(&str, &str)]) -> (tempfile::TempDir, Arc<Protocol>) {
    let runtime = tempfile::tempdir().unwrap();
    let protocol = Protocol::start(config(env, &runtime.path().join("rt"))).unwrap();
    protocol
        .follow
        .set_poll_interval(Duration::from_millis(100));
    (runtime, protocol)
}

/// The local fleet's targets as a single-fleet server gathers them with `cfg` on `host`, and
/// doctor's rendering of them.
async fn local_doctor(
    cfg: &smol_mcp::process::config::Config,
    host: &smol_mcp::process::targets::Host,
) -> (smol_mcp::process::targets::Targets, String) {
    let t = smol_mcp::process::targets::gather(
        cfg,
        smol_mcp::process::Mode::Single(smol_mcp::fleet::FleetKind::Local),
        None,
        host,
    )
    .await;
    let rendered = smol_mcp::app::doctor::render(&t);
    (t, rendered)
}

/// The fake with machine `box` running, `line` in its log so far.
async fn fake_with_logging_box(line: &str) -> FakeServe {
    let fake = FakeServe::start().await;
    fake.add_machine("box", "running");
    fake.push_log("box", line);
    fake
}

async fn connect(env: &[(&str, &str)]) -> Setup {
    let (runtime, protocol) = following_protocol(env);
    let server = SmolMcp::new(protocol.clone(), "resources-test");
    let client_io = crate::common::mcp::serve_in_memory(server, 1 << 20);
    let (tx, updates) = mpsc::unbounded_channel();
    let client = Recorder { updated: tx }.serve(client_io).await.unwrap();
    Setup {
        client,
        updates,
        protocol,
        _runtime: runtime,
    }
}

async fn local() -> (FakeServe, Setup) {
    let fake = FakeServe::start().await;
    let url = fake.url();
    let s = connect(&[("SMOL_LOCAL_URL", url.as_str())]).await;
    (fake, s)
}

async fn read(s: &Setup, uri: &str) -> Result<Vec<ResourceContents>, String> {
    s.client
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
        .map(|r| r.contents)
        .map_err(|e| e.to_string())
}

fn text_of(c: &ResourceContents) -> &str {
    match c {
        ResourceContents::TextResourceContents { text, .. } => text,
        other => panic!("not text: {other:?}"),
    }
}

async fn targets(s: &Setup) -> Value {
    let contents = read(s, "smol://targets").await.unwrap();
    assert_eq!(contents.len(), 1);
    serde_json::from_str(text_of(&contents[0])).unwrap()
}

/// How many times the fake serve was asked for logs since the last call.
fn log_polls(fake: &FakeServe) -> usize {
    fake.take_requests()
        .iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.ends_with("/logs")))
        .count()
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_resources_templates_and_capabilities_are_listed() {
    let (_fake, s) = local().await;
    let info = s.client.peer_info().unwrap();
    let resources = info.capabilities.resources.as_ref().unwrap();
    assert_eq!(resources.subscribe, Some(true));
    assert!(info.capabilities.completions.is_some());
    let instructions = info.instructions.clone().unwrap();
    for needed in [
        "local fleet only",
        "pull-image",
        "branch-machine",
        "Egress",
        "smol://targets",
    ] {
        assert!(instructions.contains(needed), "{needed}: {instructions}");
    }
    assert!(
        !instructions.contains("event log"),
        "cloud is not served: {instructions}"
    );

    let listed = s.client.list_all_resources().await.unwrap();
    let uris: Vec<&str> = listed.iter().map(|r| r.uri.as_str()).collect();
    // The server's own resources, then the skills' files this server's settings offer (no
    // host directory and no secret here: neither workspace-in nor credentials-unseen).
    assert_eq!(
        uris,
        [
            "smol://targets",
            "smol://runs",
            "skill://set-up-once-fork-many/SKILL.md",
            "skill://fan-out-compare-keep/SKILL.md",
            "skill://egress-the-user-widens/SKILL.md",
            "skill://long-jobs-and-tasks/SKILL.md",
            "skill://terminals-and-services/SKILL.md",
        ]
    );
    assert!(
        listed[2..]
            .iter()
            .all(|r| r.mime_type.as_deref() == Some("text/markdown")),
        "{listed:?}"
    );
    assert_eq!(listed[0].mime_type.as_deref(), Some("application/json"));
    let templates = s.client.list_all_resource_templates().await.unwrap();
    let templates: Vec<&str> = templates.iter().map(|t| t.uri_template.as_str()).collect();
    assert_eq!(
        templates,
        [
            "smol://machine/{target}/{name}/logs",
            "smol://machine/{target}/{name}/file{+path}",
            "smol://runs/{id}"
        ]
    );
}

#[tokio::test]
async fn targets_with_a_named_serve_reports_the_serves_own_facts_not_this_hosts() {
    let (fake, s) = local().await;
    let t = targets(&s).await;
    assert_eq!(t["mode"], "local");
    let fleets = t["fleets"].as_array().unwrap();
    assert_eq!(fleets.len(), 1);
    let l = &fleets[0];
    assert_eq!(l["target"], "local");
    assert_eq!(l["serve"]["answering"], true);
    assert_eq!(l["serve"]["named"], true);
    assert_eq!(l["serve"]["url"], fake.url());
    assert_eq!(l["serve"]["nestedVirt"], false, "its /health answer");
    assert_eq!(l["serve"]["uptimeSecs"], 1);
    assert_eq!(l["engine"]["version"], "1.32.2", "the serve's own version");
    assert_eq!(l["engine"]["foundBy"], "SMOL_LOCAL_URL");
    assert_eq!(l["engine"]["path"], Value::Null, "no engine of this host's");
    assert_eq!(l["engine"]["versionOk"], true);
    assert_eq!(l["runtimeDir"]["ok"], true);
    // The serve may be on another host (a VM, a forwarded port): this host's /dev/kvm says
    // nothing of it, whatever this host has.
    assert_eq!(l["hypervisor"], Value::Null, "{l}");
    assert_eq!(l["usable"], true, "{l}");
    assert_eq!(t["usable"], true);
    assert_eq!(t["notServed"][0]["target"], "cloud");
}

#[tokio::test]
async fn a_named_serve_that_does_not_answer_is_the_problem_not_the_engine_or_kvm() {
    let runtime = tempfile::tempdir().unwrap();
    let cfg = config(
        &[("SMOL_LOCAL_URL", "http://127.0.0.1:9")],
        &runtime.path().join("rt"),
    );
    let host = smol_mcp::process::targets::Host {
        kvm_device: runtime.path().join("no-kvm"),
        virtual_host: None,
    };
    let (t, rendered) = local_doctor(&cfg, &host).await;
    assert!(!t.usable);
    assert!(
        rendered.contains("the serve named by SMOL_LOCAL_URL (http://127.0.0.1:9) does not answer"),
        "{rendered}"
    );
    assert!(rendered.contains("never starts one in place"), "{rendered}");
    assert!(
        !rendered.contains("does not exist"),
        "no KVM advice: {rendered}"
    );
    assert!(
        !rendered.contains("pip install"),
        "no install advice: {rendered}"
    );
}

#[tokio::test]
async fn a_missing_kvm_device_is_a_problem_with_advice() {
    let runtime = tempfile::tempdir().unwrap();
    // No serve named: the one this server would start runs on this host, so its KVM counts.
    let cfg = config(&[], &runtime.path().join("rt"));
    let host = smol_mcp::process::targets::Host {
        kvm_device: runtime.path().join("no-kvm"),
        virtual_host: None,
    };
    let (t, rendered) = local_doctor(&cfg, &host).await;
    assert!(!t.usable);
    assert!(rendered.contains("does not exist"), "{rendered}");
    assert!(rendered.contains("nested virtualization"), "{rendered}");
    assert!(rendered.contains("No served fleet is usable"), "{rendered}");
}

/// A host that is itself a virtual machine with a paravirtual KVM (these CI hosts: kvm_pvm):
/// its /dev/kvm opens, and the KVM row says what the host is and what works instead, before
/// any boot is tried.
#[tokio::test]
async fn a_kvm_that_opens_on_a_paravirtual_host_is_named_for_what_it_is() {
    let runtime = tempfile::tempdir().unwrap();
    let cfg = config(&[], &runtime.path().join("rt"));
    let device = runtime.path().join("kvm");
    std::fs::write(&device, b"").unwrap();
    let host = smol_mcp::process::targets::Host {
        kvm_device: device,
        virtual_host: Some(smol_mcp::fleet::diagnosis::VirtualHost::Paravirtual),
    };
    let (_, rendered) = local_doctor(&cfg, &host).await;
    let kvm_row = rendered
        .lines()
        .find(|line| line.starts_with("local  KVM"))
        .unwrap_or_else(|| panic!("no KVM row: {rendered}"));
    assert!(
        kvm_row.contains("virtual machine whose KVM is paravirtual (the kvm_pvm module")
            && kvm_row.contains("runs only guests built for PVM"),
        "{kvm_row}"
    );
}

#[tokio::test]
async fn targets_in_both_mode_asks_the_cloud_account_and_never_shows_the_token() {
    let fake = FakeServe::start().await;
    let cloud = FakeCloud::start().await;
    let (local_url, cloud_url) = (fake.url(), cloud.url());
    let s = connect(&[
        ("SMOL_LOCAL_URL", local_url.as_str()),
        ("SMOL_CLOUD_URL", cloud_url.as_str()),
        ("SMOL_CLOUD_TOKEN", TOKEN),
    ])
    .await;
    let text = text_of(&read(&s, "smol://targets").await.unwrap()[0]).to_owned();
    assert!(!text.contains(TOKEN), "the token is never shown");
    let t: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(t["mode"], "both");
    let c = &t["fleets"][1];
    assert_eq!(c["target"], "cloud");
    assert_eq!(c["tokenSet"], true);
    assert_eq!(c["url"], cloud_url);
    assert_eq!(c["account"]["answering"], true);
    assert_eq!(c["account"]["tenantId"], "tenant-test");
    assert_eq!(c["usable"], true);
    assert_eq!(t["usable"], true);
    assert!(
        cloud
            .take_requests()
            .iter()
            .any(|r| r["path"] == "/v1/account"),
        "the account was asked through the cloud fleet"
    );
    let instructions = s.client.peer_info().unwrap().instructions.clone().unwrap();
    assert!(instructions.contains("event log"), "{instructions}");
    assert!(instructions.contains("required target"), "{instructions}");
}

#[tokio::test]
async fn a_cloud_account_that_does_not_answer_makes_the_cloud_unusable() {
    let cloud = FakeCloud::start().await;
    let url = cloud.url();
    let s = connect(&[
        ("SMOL_CLOUD_URL", url.as_str()),
        ("SMOL_CLOUD_TOKEN", "smk_wrong"),
        ("SMOL_MCP_TARGETS", "cloud"),
    ])
    .await;
    let t = targets(&s).await;
    let c = &t["fleets"][0];
    assert_eq!(c["account"]["answering"], false);
    assert_eq!(c["usable"], false);
    assert!(
        c["problems"][0]["fix"]
            .as_str()
            .unwrap()
            .contains("SMOL_CLOUD_TOKEN"),
        "{c}"
    );
    assert_eq!(t["usable"], false);
}

#[tokio::test]
async fn a_file_is_text_when_utf8_a_blob_otherwise_and_a_big_one_is_bounded() {
    let (fake, s) = local().await;
    fake.add_machine("box", "running");
    {
        let mut st = fake.state.lock().unwrap();
        st.files.insert(
            ("box".into(), "/etc/motd".into()),
            "héllo\n".as_bytes().to_vec(),
        );
        st.files
            .insert(("box".into(), "/bin/blob".into()), vec![0xff, 0x00, 0xfe]);
        st.generated_files
            .insert(("box".into(), "/var/big".into()), 10 * 1024 * 1024);
    }
    let text = read(&s, "smol://machine/local/box/file/etc/motd")
        .await
        .unwrap();
    assert_eq!(text.len(), 1, "no truncation note: {text:?}");
    assert_eq!(text_of(&text[0]), "héllo\n");

    let blob = read(&s, "smol://machine/local/box/file/bin/blob")
        .await
        .unwrap();
    match &blob[0] {
        ResourceContents::BlobResourceContents {
            blob, mime_type, ..
        } => {
            assert_eq!(blob, "/wD+");
            assert_eq!(mime_type.as_deref(), Some("application/octet-stream"));
        }
        other => panic!("not a blob: {other:?}"),
    }

    let big = read(&s, "smol://machine/local/box/file/var/big")
        .await
        .unwrap();
    assert_eq!(big.len(), 2, "the part and the note");
    let part = text_of(&big[0]);
    assert_eq!(part.len(), 65536, "maxOutputBytes, not the 10 MiB file");
    let note = text_of(&big[1]);
    assert!(note.contains("Truncated"), "{note}");
    assert!(note.contains("read-file"), "{note}");
    assert!(note.contains("offset 65536"), "{note}");
    assert!(note.contains(&(10 * 1024 * 1024).to_string()), "{note}");

    let missing = read(&s, "smol://machine/local/box/file/nope")
        .await
        .unwrap_err();
    assert!(
        missing.contains("-32002") || missing.contains("NOT_FOUND"),
        "{missing}"
    );
}

#[tokio::test]
async fn bad_uris_are_refused_with_what_would_be_accepted() {
    let (_fake, s) = local().await;
    let other = read(&s, "smol://machine/cloud/box/logs").await.unwrap_err();
    assert!(other.contains("serves only the local fleet"), "{other}");
    let unknown = read(&s, "smol://nothing").await.unwrap_err();
    assert!(unknown.contains("smol://targets"), "{unknown}");
    let bad_name = read(&s, "smol://machine/local/-x/logs").await.unwrap_err();
    assert!(bad_name.contains("name"), "{bad_name}");
    let relative = read(&s, "smol://machine/local/box/fileetc")
        .await
        .unwrap_err();
    assert!(relative.contains("path"), "{relative}");
}

#[tokio::test]
async fn the_logs_resource_returns_the_lines() {
    let (fake, s) = local().await;
    fake.add_machine("box", "running");
    fake.push_log("box", "one");
    fake.push_log("box", "two");
    let contents = read(&s, "smol://machine/local/box/logs").await.unwrap();
    assert_eq!(text_of(&contents[0]), "one\ntwo");
}

#[tokio::test]
async fn completions_offer_the_fleets_and_the_machines_of_the_chosen_one() {
    let fake = FakeServe::start().await;
    let cloud = FakeCloud::start().await;
    let (local_url, cloud_url) = (fake.url(), cloud.url());
    let s = connect(&[
        ("SMOL_LOCAL_URL", local_url.as_str()),
        ("SMOL_CLOUD_URL", cloud_url.as_str()),
        ("SMOL_CLOUD_TOKEN", TOKEN),
    ])
    .await;
    for name in ["web-1", "web-2", "db"] {
        fake.add_machine(name, "running");
    }
    cloud.add_machine("web-cloud", "running");
    let logs = "smol://machine/{target}/{name}/logs";
    let targets = s
        .client
        .complete_resource_argument(logs, "target", "", None)
        .await
        .unwrap();
    assert_eq!(targets.values, ["local", "cloud"]);
    let c = s
        .client
        .complete_resource_argument(logs, "target", "c", None)
        .await
        .unwrap();
    assert_eq!(c.values, ["cloud"]);
    let context = |target: &str| {
        Some(CompletionContext::with_arguments(
            [("target".to_owned(), target.to_owned())].into(),
        ))
    };
    let local_names = s
        .client
        .complete_resource_argument(logs, "name", "we", context("local"))
        .await
        .unwrap();
    assert_eq!(local_names.values, ["web-1", "web-2"]);
    let cloud_names = s
        .client
        .complete_resource_argument(
            "smol://machine/{target}/{name}/file{+path}",
            "name",
            "we",
            context("cloud"),
        )
        .await
        .unwrap();
    assert_eq!(cloud_names.values, ["web-cloud"]);
}

#[tokio::test]
async fn a_subscription_hears_of_new_lines_and_unsubscribing_stops_the_polling() {
    let (fake, mut s) = local().await;
    fake.add_machine("box", "running");
    fake.push_log("box", "old line");
    let uri = "smol://machine/local/box/logs";
    s.client
        .subscribe(SubscribeRequestParams::new(uri))
        .await
        .unwrap();
    assert_eq!(s.protocol.follow.pollers(), 1);
    // The lines there before the subscription are not news.
    let mut polls = 0;
    wait_until("two polls", || {
        polls += log_polls(&fake);
        polls >= 2
    })
    .await;
    assert!(s.updates.try_recv().is_err(), "no update for old lines");

    fake.push_log("box", "new line");
    let updated = tokio::time::timeout(Duration::from_secs(10), s.updates.recv())
        .await
        .expect("an update for the new line")
        .unwrap();
    assert_eq!(updated, uri);
    // Reading the resource returns the newest lines, the new one included.
    let contents = read(&s, uri).await.unwrap();
    assert_eq!(text_of(&contents[0]), "old line\nnew line");

    s.client
        .unsubscribe(UnsubscribeRequestParams::new(uri))
        .await
        .unwrap();
    assert_eq!(s.protocol.follow.pollers(), 0, "the poller is stopped");
    // A poll already under way may still land; after that, none.
    tokio::time::sleep(Duration::from_millis(150)).await;
    log_polls(&fake);
    fake.push_log("box", "unheard line");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(log_polls(&fake), 0, "the fake sees no more polls");
    if let Ok(extra) = s.updates.try_recv() {
        panic!("an update after unsubscribing: {extra}");
    }
}

#[tokio::test]
async fn two_subscribers_share_one_poller_and_the_session_end_stops_it() {
    let fake = fake_with_logging_box("start").await;
    let url = fake.url();
    let first = connect(&[("SMOL_LOCAL_URL", url.as_str())]).await;
    let uri = "smol://machine/local/box/logs";
    first
        .client
        .subscribe(SubscribeRequestParams::new(uri))
        .await
        .unwrap();
    // A second session of the same process: the same poller.
    let protocol = first.protocol.clone();
    let server = SmolMcp::new(protocol.clone(), "second");
    let client_io = crate::common::mcp::serve_in_memory(server, 1 << 16);
    let (tx, mut second_updates) = mpsc::unbounded_channel();
    let second = Recorder { updated: tx }.serve(client_io).await.unwrap();
    second
        .subscribe(SubscribeRequestParams::new(uri))
        .await
        .unwrap();
    assert_eq!(protocol.follow.pollers(), 1, "one poller per URI");

    // The first session ends without unsubscribing; the second still hears.
    first.client.cancel().await.unwrap();
    fake.push_log("box", "after the first left");
    let heard = tokio::time::timeout(Duration::from_secs(10), second_updates.recv())
        .await
        .expect("the second session still hears")
        .unwrap();
    assert_eq!(heard, uri);
    assert_eq!(protocol.follow.pollers(), 1);

    // The last session ends: the poller stops and the fake sees no more polls.
    second.cancel().await.unwrap();
    wait_until("the poller stops when its sessions end", || {
        protocol.follow.pollers() == 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    log_polls(&fake);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(log_polls(&fake), 0, "no polls after the sessions ended");
}

#[tokio::test]
async fn a_listen_hears_of_new_lines_and_its_end_stops_the_polling() {
    use rmcp::model::{ServerNotification, SubscriptionFilter};
    let fake = fake_with_logging_box("old line").await;
    let url = fake.url();
    let (client, protocol, _runtime) = discover_client(&[("SMOL_LOCAL_URL", url.as_str())]).await;
    let uri = "smol://machine/local/box/logs";
    // Only logs URIs are accepted: smol://targets is left out of the acknowledgment.
    let mut sub = client
        .listen(
            SubscriptionFilter::builder()
                .resource_subscriptions([uri, "smol://targets"])
                .build(),
        )
        .await
        .unwrap();
    assert_eq!(
        sub.acknowledged().resource_subscriptions,
        Some(vec![uri.to_owned()])
    );
    // rmcp acknowledges before the handler runs; two polls mean the baseline is taken.
    let mut polls = 0;
    wait_until("two polls", || {
        polls += log_polls(&fake);
        polls >= 2
    })
    .await;
    fake.push_log("box", "new line");
    let notification = tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("an update for the new line")
        .unwrap()
        .unwrap();
    match notification {
        ServerNotification::ResourceUpdatedNotification(n) => assert_eq!(n.params.uri, uri),
        other => panic!("not a resource update: {other:?}"),
    }
    sub.cancel().await.unwrap();
    wait_until("the poller stops when the listen ends", || {
        protocol.follow.pollers() == 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    log_polls(&fake);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(log_polls(&fake), 0, "no polls after the listen ended");
}

#[tokio::test]
async fn only_logs_can_be_subscribed_to() {
    let (_fake, s) = local().await;
    let err = s
        .client
        .subscribe(SubscribeRequestParams::new("smol://targets"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("only logs"), "{err}");
    assert_eq!(s.protocol.follow.pollers(), 0);
}

fn doctor(env: Vec<(String, String)>) -> std::process::Output {
    doctor_with(&[], env)
}

fn doctor_with(flags: &[&str], env: Vec<(String, String)>) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_smol-mcp"))
        .arg("doctor")
        .args(flags)
        .env_clear()
        .envs(env)
        .output()
        .unwrap()
}

#[tokio::test]
async fn doctor_exits_zero_with_a_usable_fleet() {
    let cloud = FakeCloud::start().await;
    let rt = tempfile::tempdir().unwrap();
    let url = cloud.url();
    let env = server_env(
        rt.path(),
        &[
            ("SMOL_CLOUD_URL", url.as_str()),
            ("SMOL_CLOUD_TOKEN", TOKEN),
            ("SMOL_MCP_TARGETS", "cloud"),
        ],
    );
    let out = tokio::task::spawn_blocking(move || doctor(env))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("cloud: usable"), "{stdout}");
    assert!(stdout.contains("tenant-test"), "{stdout}");
    assert!(!stdout.contains(TOKEN), "the token is never printed");
    assert!(stdout.contains("local: not served"), "{stdout}");
}

#[tokio::test]
async fn doctor_exits_non_zero_and_says_what_to_do_without_a_usable_fleet() {
    let rt = tempfile::tempdir().unwrap();
    let env = server_env(
        rt.path(),
        &[
            ("SMOLVM", "/nonexistent/smolvm"),
            ("SMOL_MCP_TARGETS", "local"),
        ],
    );
    let out = tokio::task::spawn_blocking(move || doctor(env))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("SMOLVM names /nonexistent/smolvm"),
        "{stdout}"
    );
    assert!(stdout.contains("smol/smol-vmm"), "{stdout}");
    // Whether this host reaches the default registry, with what to do when it does not.
    let registry = stdout
        .lines()
        .find(|l| l.starts_with("local  registry"))
        .unwrap_or_else(|| panic!("a registry row: {stdout}"));
    assert!(
        registry.contains("images can be pulled") || registry.contains("bundled Alpine"),
        "{registry}"
    );
    assert!(stdout.contains("No served fleet is usable"), "{stdout}");
    if nix::unistd::geteuid().is_root() {
        assert!(stdout.contains("SMOLVM_VM_UID_DROP=off"), "{stdout}");
    }

    let cloud = FakeCloud::start().await;
    let url = cloud.url();
    let env = server_env(
        rt.path(),
        &[
            ("SMOL_CLOUD_URL", url.as_str()),
            ("SMOL_CLOUD_TOKEN", "smk_revoked"),
            ("SMOL_MCP_TARGETS", "cloud"),
        ],
    );
    let out = tokio::task::spawn_blocking(move || doctor(env))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("the account did not answer"), "{stdout}");
    assert!(
        !stdout.contains("smk_revoked"),
        "the token is never printed"
    );
}

/// doctor boots a machine through run-once and reports the time, unless --quick; a host whose
/// guests cannot boot, and the garbled KvmOpen refusal, each get their own cause and fix.
#[tokio::test]
async fn doctor_boots_a_machine_and_names_the_cause_when_it_cannot() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let env = server_env(
        rt.path(),
        &[
            ("SMOL_LOCAL_URL", url.as_str()),
            ("SMOL_MCP_TARGETS", "local"),
        ],
    );
    let booted = {
        let env = env.clone();
        tokio::task::spawn_blocking(move || doctor(env))
            .await
            .unwrap()
    };
    let stdout = String::from_utf8_lossy(&booted.stdout);
    assert!(booted.status.success(), "{stdout}");
    assert!(
        stdout.contains("booted the engine's bundled Alpine and ran `uname -sr`"),
        "{stdout}"
    );
    let requests = fake.take_requests();
    let created = requests
        .iter()
        .find(|r| r["method"] == "POST" && r["path"] == "/api/v1/machines")
        .expect("doctor created a machine");
    assert!(
        created["body"].get("image").is_none() || created["body"]["image"].is_null(),
        "the bundled rootfs, no registry: {created}"
    );
    assert!(
        requests.iter().any(|r| r["method"] == "DELETE"
            && r["path"]
                .as_str()
                .unwrap()
                .starts_with("/api/v1/machines/mcp-")),
        "the test machine is deleted"
    );

    let quick = {
        let env = env.clone();
        tokio::task::spawn_blocking(move || doctor_with(&["--quick"], env))
            .await
            .unwrap()
    };
    let stdout = String::from_utf8_lossy(&quick.stdout);
    assert!(quick.status.success(), "{stdout}");
    assert!(stdout.contains("not tried"), "{stdout}");
    assert!(
        !fake.take_requests().iter().any(|r| r["method"] == "POST"),
        "--quick boots nothing"
    );

    fake.state.lock().unwrap().start_failure = Some("vm failed: no boot progress after 30s".into());
    let cannot = {
        let env = env.clone();
        tokio::task::spawn_blocking(move || doctor(env))
            .await
            .unwrap()
    };
    let stdout = String::from_utf8_lossy(&cannot.stdout);
    assert_eq!(cannot.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("local: NOT usable"), "{stdout}");
    assert!(stdout.contains("guests do not boot"), "{stdout}");
    assert!(stdout.contains("hardware virtualization"), "{stdout}");

    fake.state.lock().unwrap().start_failure =
        Some("monitor agent: Then log out and log back in...); KvmOpen(Error(13))".into());
    let denied = tokio::task::spawn_blocking(move || doctor(env))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&denied.stdout);
    assert_eq!(denied.status.code(), Some(1), "{stdout}");
    if nix::unistd::geteuid().is_root() {
        assert!(stdout.contains("SMOLVM_VM_UID_DROP=off"), "{stdout}");
    } else {
        assert!(stdout.contains("kvm group"), "{stdout}");
    }
}

/// A 2026-07-28 client of its own protocol, for listens.
async fn discover_client(
    env: &[(&str, &str)],
) -> (
    RunningService<RoleClient, Recorder>,
    Arc<Protocol>,
    tempfile::TempDir,
) {
    use rmcp::model::ProtocolVersion;
    use rmcp::service::{ClientLifecycleMode, ClientServiceExt};
    let (runtime, protocol) = following_protocol(env);
    let server = SmolMcp::new(protocol.clone(), "listen-bounds");
    let client_io = crate::common::mcp::serve_in_memory(server, 1 << 16);
    let (tx, _updates) = mpsc::unbounded_channel();
    let client = Recorder { updated: tx }
        .serve_with_lifecycle(
            client_io,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .unwrap();
    (client, protocol, runtime)
}

#[tokio::test]
async fn a_subscription_to_an_unknown_machine_is_refused_naming_it() {
    let (fake, s) = local().await;
    let err = s
        .client
        .subscribe(SubscribeRequestParams::new(
            "smol://machine/local/ghost-box/logs",
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ghost-box") && err.contains("no machine"),
        "{err}"
    );
    assert_eq!(s.protocol.follow.pollers(), 0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        log_polls(&fake),
        0,
        "nothing polls a machine that is not there"
    );

    // The same for a listen: its final answer names the machine, and nothing polls.
    let url = fake.url();
    let (client, protocol, _rt) = discover_client(&[("SMOL_LOCAL_URL", url.as_str())]).await;
    let mut sub = client
        .listen(
            rmcp::model::SubscriptionFilter::builder()
                .resource_subscriptions(["smol://machine/local/ghost-two/logs"])
                .build(),
        )
        .await
        .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("the listen answers")
        .unwrap_err()
        .to_string();
    assert!(err.contains("ghost-two"), "{err}");
    assert_eq!(protocol.follow.pollers(), 0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(log_polls(&fake), 0);
}

#[tokio::test]
async fn subscriptions_are_bounded_per_session_and_in_all_naming_the_limit() {
    let fake = FakeServe::start().await;
    let url = fake.url();
    for name in ["a1", "a2", "a3", "a4"] {
        fake.add_machine(name, "running");
    }
    let env = [
        ("SMOL_LOCAL_URL", url.as_str()),
        ("SMOL_MCP_MAX_SUBSCRIPTIONS_PER_SESSION", "2"),
        ("SMOL_MCP_MAX_SUBSCRIPTIONS", "3"),
    ];
    let first = connect(&env).await;
    let uri = |n: &str| format!("smol://machine/local/{n}/logs");
    for n in ["a1", "a2"] {
        first
            .client
            .subscribe(SubscribeRequestParams::new(uri(n)))
            .await
            .unwrap();
    }
    // Subscribing again to one it holds is not a new subscription.
    first
        .client
        .subscribe(SubscribeRequestParams::new(uri("a1")))
        .await
        .unwrap();
    let err = first
        .client
        .subscribe(SubscribeRequestParams::new(uri("a3")))
        .await
        .unwrap_err()
        .to_string();
    insta::assert_snapshot!(err, @r#"Mcp error: -32602: uri: "smol://machine/local/a3/logs" not followed: this session already follows 2 logs, its limit (maxSubscriptionsPerSession, SMOL_MCP_MAX_SUBSCRIPTIONS_PER_SESSION); unsubscribe from one first"#);

    // A second session of the same process meets the process's limit.
    let protocol = first.protocol.clone();
    let server = SmolMcp::new(protocol.clone(), "second");
    let client_io = crate::common::mcp::serve_in_memory(server, 1 << 16);
    let (tx, _second_updates) = mpsc::unbounded_channel();
    let second = Recorder { updated: tx }.serve(client_io).await.unwrap();
    second
        .subscribe(SubscribeRequestParams::new(uri("a3")))
        .await
        .unwrap();
    let err = second
        .subscribe(SubscribeRequestParams::new(uri("a4")))
        .await
        .unwrap_err()
        .to_string();
    insta::assert_snapshot!(err, @r#"Mcp error: -32602: uri: "smol://machine/local/a4/logs" not followed: this server already holds 3 log subscriptions, its limit (maxSubscriptions, SMOL_MCP_MAX_SUBSCRIPTIONS); unsubscribe from one or end a listen first"#);
    assert_eq!(protocol.follow.pollers(), 3);

    // One given up makes room.
    first
        .client
        .unsubscribe(UnsubscribeRequestParams::new(uri("a1")))
        .await
        .unwrap();
    second
        .subscribe(SubscribeRequestParams::new(uri("a4")))
        .await
        .unwrap();
    assert_eq!(protocol.follow.pollers(), 3);
}

#[tokio::test]
async fn a_listen_naming_more_uris_than_the_limit_is_refused_naming_it() {
    let fake = FakeServe::start().await;
    let url = fake.url();
    let mut uris = Vec::new();
    for i in 0..3 {
        fake.add_machine(&format!("l{i}"), "running");
        uris.push(format!("smol://machine/local/l{i}/logs"));
    }
    let (client, protocol, _rt) = discover_client(&[
        ("SMOL_LOCAL_URL", url.as_str()),
        ("SMOL_MCP_MAX_LISTEN_URIS", "2"),
    ])
    .await;
    let mut sub = client
        .listen(
            rmcp::model::SubscriptionFilter::builder()
                .resource_subscriptions(uris.clone())
                .build(),
        )
        .await
        .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("the listen answers")
        .unwrap_err()
        .to_string();
    insta::assert_snapshot!(err, @"Mcp error: -32602: resourceSubscriptions: 3 logs URIs in one listen; the limit is 2 (maxListenUris, SMOL_MCP_MAX_LISTEN_URIS)");
    assert_eq!(protocol.follow.pollers(), 0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(log_polls(&fake), 0, "a refused listen polls nothing");

    // At the limit it is served.
    let mut sub = client
        .listen(
            rmcp::model::SubscriptionFilter::builder()
                .resource_subscriptions(uris[..2].to_vec())
                .build(),
        )
        .await
        .unwrap();
    wait_until("two pollers", || protocol.follow.pollers() == 2).await;
    sub.cancel().await.unwrap();
}

#[tokio::test]
async fn one_poller_per_machine_whatever_the_spelling_of_its_uri() {
    let fake = fake_with_logging_box("old").await;
    let url = fake.url();
    // The same machine, five spellings (the name segment is percent-decoded).
    let spellings = [
        "smol://machine/local/box/logs",
        "smol://machine/local/b%6Fx/logs",
        "smol://machine/local/%62ox/logs",
        "smol://machine/local/bo%78/logs",
        "smol://machine/local/%62%6F%78/logs",
    ];
    let mut s = connect(&[("SMOL_LOCAL_URL", url.as_str())]).await;
    for uri in &spellings[..2] {
        s.client
            .subscribe(SubscribeRequestParams::new(*uri))
            .await
            .unwrap();
    }
    let (client, protocol, _rt) = discover_client(&[("SMOL_LOCAL_URL", url.as_str())]).await;
    let mut sub = client
        .listen(
            rmcp::model::SubscriptionFilter::builder()
                .resource_subscriptions(spellings)
                .build(),
        )
        .await
        .unwrap();
    assert_eq!(s.protocol.follow.pollers(), 1, "one poller per machine");
    wait_until("the listen's poller", || protocol.follow.pollers() >= 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        protocol.follow.pollers(),
        1,
        "one poller per machine in a listen"
    );

    // Polled about once per interval (100 ms) per protocol: two backends, so about 20 in a
    // second; a poller per URI would make 70.
    tokio::time::sleep(Duration::from_millis(300)).await;
    log_polls(&fake);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let polls = log_polls(&fake);
    assert!(
        polls <= 30,
        "{polls} log requests in a second for one machine"
    );

    // Each subscriber hears under the URI it used.
    fake.push_log("box", "new");
    let mut heard = Vec::new();
    for _ in 0..2 {
        heard.push(
            tokio::time::timeout(Duration::from_secs(10), s.updates.recv())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    heard.sort();
    let mut expected: Vec<String> = spellings[..2].iter().map(|u| u.to_string()).collect();
    expected.sort();
    assert_eq!(heard, expected);
    sub.cancel().await.unwrap();
}
