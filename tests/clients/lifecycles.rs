//! Both protocol lifecycles from one binary: session clients (initialize) and 2026-07-28
//! requests (stateless); who owns an ephemeral machine a stateless request creates (the
//! process, under a lease); choosing the fleet in both-fleets mode (elicitation on a session,
//! an input-required result on 2026-07-28); and the Origin check on both lifecycles.

use crate::common::clients::{HttpServer, env_object, run_node, run_python};
use crate::common::until;

use crate::common::fake_cloud::FakeCloud;
use crate::common::fake_serve::FakeServe;
use crate::common::mcp::config;
use crate::common::stdio::{SERVER, server_env};
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult,
    ElicitationAction, Implementation,
};
use rmcp::service::{NotificationContext, RequestContext, RunningService};
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use serde_json::{Value, json};
use smol_mcp::protocol::Protocol;
use smol_mcp::protocol::server::SmolMcp;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const TOKEN: &str = "lifecycles-token";

/// Both fleets: local on the fake serve, cloud on the fake cloud.
fn both_fleets<'a>(fake: &'a str, cloud: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("SMOL_LOCAL_URL", fake),
        ("SMOL_MCP_TARGETS", "both"),
        ("SMOL_CLOUD_TOKEN", crate::common::fake_cloud::TOKEN),
        ("SMOL_CLOUD_URL", cloud),
    ]
}

// ---- Session clients, in process ----------------------------------------------------------

/// A session client that answers the fleet question with `answer` (None: it declares no
/// elicitation), counting the questions and the tools/list_changed notifications.
#[derive(Clone)]
struct Chooser {
    answer: Option<&'static str>,
    asked: Arc<AtomicUsize>,
    changed: Arc<AtomicUsize>,
}

impl ClientHandler for Chooser {
    fn get_info(&self) -> ClientConfig {
        let capabilities: ClientCapabilities = if self.answer.is_some() {
            serde_json::from_value(json!({"elicitation": {"form": {}}})).unwrap()
        } else {
            ClientCapabilities::default()
        };
        ClientConfig::new(capabilities, Implementation::new("chooser", "0"))
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let ElicitRequestParams::FormElicitationParams {
            requested_schema, ..
        } = request
        else {
            panic!("the fleet question is a form")
        };
        let schema = serde_json::to_value(&requested_schema).unwrap();
        assert_eq!(schema["required"], json!(["fleet"]), "{schema}");
        let mut result: ElicitResult =
            serde_json::from_value(json!({"action": "decline"})).unwrap();
        match self.answer {
            Some("decline") | None => {}
            Some(fleet) => {
                result.action = ElicitationAction::Accept;
                result.content = Some(json!({ "fleet": fleet }));
            }
        }
        Ok(result)
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changed.fetch_add(1, Ordering::SeqCst);
    }
}

struct Session {
    client: RunningService<RoleClient, Chooser>,
    asked: Arc<AtomicUsize>,
    changed: Arc<AtomicUsize>,
    fake: FakeServe,
    _cloud: FakeCloud,
    _runtime: tempfile::TempDir,
}

impl Session {
    async fn start(answer: Option<&'static str>) -> Session {
        let fake = FakeServe::start().await;
        let cloud = FakeCloud::start().await;
        let runtime = tempfile::tempdir().unwrap();
        let (local_url, cloud_url) = (fake.url(), cloud.url());
        let protocol = Protocol::start(config(
            &both_fleets(&local_url, &cloud_url),
            &runtime.path().join("rt"),
        ))
        .unwrap();
        let server = SmolMcp::new(protocol, "fleet-choice");
        let client_io = crate::common::mcp::serve_in_memory(server, 1 << 20);
        let chooser = Chooser {
            answer,
            asked: Arc::default(),
            changed: Arc::default(),
        };
        let (asked, changed) = (chooser.asked.clone(), chooser.changed.clone());
        Session {
            client: chooser.serve(client_io).await.unwrap(),
            asked,
            changed,
            fake,
            _cloud: cloud,
            _runtime: runtime,
        }
    }

    async fn call(&self, tool: &str, args: Value) -> (bool, String) {
        let Value::Object(args) = args else { panic!() };
        let r = self
            .client
            .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
            .await
            .unwrap();
        let text = r
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect::<Vec<_>>()
            .join("\n");
        (r.is_error == Some(true), text)
    }

    /// Whether any listed tool takes `target`.
    async fn lists_target(&self) -> bool {
        self.client.list_all_tools().await.unwrap().iter().any(|t| {
            t.input_schema
                .get("properties")
                .and_then(Value::as_object)
                .is_some_and(|p| p.contains_key("target"))
        })
    }
}

#[tokio::test]
async fn a_session_that_chooses_local_loses_target_once_asked() {
    let s = Session::start(Some("local")).await;
    assert!(
        s.lists_target().await,
        "both fleets: target before the choice"
    );
    assert_eq!(
        s.asked.load(Ordering::SeqCst),
        0,
        "not asked before a tool call"
    );

    // The first call still carries target (it was required when the model wrote it).
    let (failed, text) = s
        .call(
            "create-machine",
            json!({"image": "alpine", "name": "mcp-a", "target": "local"}),
        )
        .await;
    assert!(!failed, "{text}");
    until("tools/list_changed", Duration::from_secs(5), || {
        s.changed.load(Ordering::SeqCst) == 1
    })
    .await;
    assert!(
        !s.lists_target().await,
        "narrowed: target gone from every tool"
    );

    let (failed, text) = s
        .call(
            "run-command",
            json!({"name": "mcp-a", "command": ["echo", "hi"]}),
        )
        .await;
    assert!(!failed, "no target needed now: {text}");
    let (failed, text) = s
        .call("list-machines", json!({"name": "mcp-a", "target": "local"}))
        .await;
    assert!(!failed, "the session's own fleet is accepted: {text}");
    let (failed, text) = s.call("list-machines", json!({"target": "cloud"})).await;
    assert!(failed, "{text}");
    assert!(
        text.contains("target") && text.contains("set to the local fleet"),
        "{text}"
    );
    assert_eq!(s.asked.load(Ordering::SeqCst), 1, "asked once");
    assert_eq!(s.changed.load(Ordering::SeqCst), 1);
    assert!(s.fake.has_machine("mcp-a"));
}

#[tokio::test]
async fn a_session_that_chooses_cloud_refuses_a_local_first_call() {
    let s = Session::start(Some("cloud")).await;
    let (failed, text) = s.call("list-machines", json!({"target": "local"})).await;
    assert!(failed, "{text}");
    assert!(text.contains("set to the cloud fleet"), "{text}");
    assert!(!s.lists_target().await);
    let (failed, text) = s.call("list-machines", json!({})).await;
    assert!(!failed, "{text}");
    assert_eq!(s.asked.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_declining_session_keeps_target_and_is_asked_once() {
    let s = Session::start(Some("decline")).await;
    let (failed, text) = s.call("list-machines", json!({})).await;
    assert!(failed, "{text}");
    assert!(
        text.contains("target") && text.contains("required"),
        "{text}"
    );
    let (failed, text) = s.call("list-machines", json!({"target": "local"})).await;
    assert!(!failed, "{text}");
    let (failed, _) = s.call("list-machines", json!({"target": "cloud"})).await;
    assert!(!failed, "both fleets stay reachable");
    assert!(s.lists_target().await);
    assert_eq!(s.asked.load(Ordering::SeqCst), 1, "asked once, not again");
    assert_eq!(s.changed.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_session_client_that_cannot_elicit_is_not_asked() {
    let s = Session::start(None).await;
    let (failed, text) = s.call("list-machines", json!({})).await;
    assert!(failed && text.contains("required"), "{text}");
    assert_eq!(s.asked.load(Ordering::SeqCst), 0);
    assert!(s.lists_target().await);
}

// ---- 2026-07-28 requests, in process (raw JSON-RPC) --------------------------------------

/// A server in both-fleets mode spoken to with raw JSON-RPC lines, as a 2026-07-28 client does.
struct Stateless {
    to_server: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    lines: tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    next_id: u64,
    _fakes: (FakeServe, FakeCloud, tempfile::TempDir),
}

impl Stateless {
    async fn start() -> Stateless {
        let fake = FakeServe::start().await;
        let cloud = FakeCloud::start().await;
        let runtime = tempfile::tempdir().unwrap();
        let (local_url, cloud_url) = (fake.url(), cloud.url());
        let protocol = Protocol::start(config(
            &both_fleets(&local_url, &cloud_url),
            &runtime.path().join("rt"),
        ))
        .unwrap();
        let server = SmolMcp::new(protocol, "stdio-like");
        let client_io = crate::common::mcp::serve_in_memory(server, 1 << 20);
        let (read, write) = tokio::io::split(client_io);
        Stateless {
            to_server: write,
            lines: BufReader::new(read).lines(),
            next_id: 1,
            _fakes: (fake, cloud, runtime),
        }
    }

    async fn call(&mut self, params: Value, can_elicit: bool) -> Value {
        let capabilities = if can_elicit {
            json!({"elicitation": {"form": {}}})
        } else {
            json!({})
        };
        let mut params = params;
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": capabilities,
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        });
        let id = self.next_id;
        self.next_id += 1;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
        self.to_server
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        loop {
            let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == id {
                return message;
            }
        }
    }
}

fn error_text(answer: &Value) -> String {
    answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_stateless_call_without_target_is_asked_for_the_fleet_and_retried() {
    let mut s = Stateless::start().await;
    let asked = s
        .call(json!({"name": "list-machines", "arguments": {}}), true)
        .await;
    let result = &asked["result"];
    assert_eq!(result["resultType"], "input_required", "{asked}");
    let question = &result["inputRequests"]["fleet"];
    assert_eq!(question["method"], "elicitation/create", "{question}");
    assert_eq!(
        question["params"]["requestedSchema"]["required"],
        json!(["fleet"])
    );
    let state = result["requestState"].as_str().unwrap().to_owned();

    let accepted = json!({"fleet": {"action": "accept", "content": {"fleet": "local"}}});
    let done = s
        .call(
            json!({"name": "list-machines", "arguments": {}, "inputResponses": accepted,
                   "requestState": state}),
            true,
        )
        .await;
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    assert_eq!(done["result"]["isError"], false, "{done}");

    // The answer is bound to the call it was asked for: the same state with other arguments
    // is refused, and so is a forged one.
    let replayed = s
        .call(
            json!({"name": "list-machines", "arguments": {"all": true}, "inputResponses": accepted,
                   "requestState": state}),
            true,
        )
        .await;
    assert!(
        replayed["error"]["message"]
            .as_str()
            .unwrap()
            .contains("requestState"),
        "{replayed}"
    );
    let forged = s
        .call(
            json!({"name": "list-machines", "arguments": {}, "inputResponses": accepted,
                   "requestState": "rs1.forged"}),
            true,
        )
        .await;
    assert!(forged["error"].is_object(), "{forged}");

    // Declined: the call goes on without a target, which the tool refuses naming it.
    let declined = s
        .call(
            json!({"name": "list-machines", "arguments": {},
                   "inputResponses": {"fleet": {"action": "decline"}}, "requestState": state}),
            true,
        )
        .await;
    assert_eq!(declined["result"]["isError"], true, "{declined}");
    assert!(error_text(&declined).contains("target"), "{declined}");
}

#[tokio::test]
async fn a_stateless_call_that_names_its_target_or_cannot_elicit_is_not_asked() {
    let mut s = Stateless::start().await;
    let named = s
        .call(
            json!({"name": "list-machines", "arguments": {"target": "local"}}),
            true,
        )
        .await;
    assert_eq!(named["result"]["isError"], false, "{named}");
    let mute = s
        .call(json!({"name": "list-machines", "arguments": {}}), false)
        .await;
    assert_eq!(mute["result"]["isError"], true, "{mute}");
    assert!(
        error_text(&mute).contains("target") && error_text(&mute).contains("required"),
        "{mute}"
    );
}

// ---- Real clients ------------------------------------------------------------------------

async fn python(plan: Value) -> Value {
    run_python("lifecycle_plan.py", &plan).await
}

async fn typescript(plan: Value) -> Value {
    run_node("lifecycle_ts.mjs", &plan).await
}

async fn spawn_http(rt: &Path, extra: &[(&str, &str)]) -> HttpServer {
    HttpServer::spawn(rt, TOKEN, extra).await
}

fn check_narrowed(report: &Value) {
    assert_eq!(report["targetBefore"], true, "{report}");
    assert_eq!(report["targetAfter"], false, "{report}");
    assert!(report["listChanged"].as_u64().unwrap() >= 1, "{report}");
    assert_eq!(report["asked"].as_array().unwrap().len(), 1, "{report}");
    let calls = report["calls"].as_array().unwrap();
    assert_eq!(calls[0]["isError"], false, "{report}");
    assert_eq!(calls[1]["isError"], false, "no target needed: {report}");
    assert_eq!(calls[2]["isError"], true, "{report}");
    assert!(
        calls[2]["text"]
            .as_str()
            .unwrap()
            .contains("set to the local fleet")
    );
}

fn check_declined(report: &Value) {
    assert_eq!(report["targetAfter"], true, "{report}");
    assert_eq!(report["asked"].as_array().unwrap().len(), 1, "{report}");
    let calls = report["calls"].as_array().unwrap();
    assert_eq!(calls[0]["isError"], true, "{report}");
    assert!(calls[0]["text"].as_str().unwrap().contains("required"));
    assert_eq!(calls[1]["isError"], false, "{report}");
}

fn narrowing_calls() -> Value {
    json!([
        {"tool": "list-machines", "args": {"target": "local"}},
        {"tool": "list-machines", "args": {}},
        {"tool": "list-machines", "args": {"target": "cloud"}}
    ])
}

fn declining_calls() -> Value {
    json!([
        {"tool": "list-machines", "args": {}},
        {"tool": "list-machines", "args": {"target": "local"}}
    ])
}

#[tokio::test]
async fn typescript_sessions_choose_their_fleet_over_stdio() {
    let fake = FakeServe::start().await;
    let cloud = FakeCloud::start().await;
    let rt = tempfile::tempdir().unwrap();
    let (local_url, cloud_url) = (fake.url(), cloud.url());
    let env = env_object(server_env(rt.path(), &both_fleets(&local_url, &cloud_url)));
    let report = typescript(
        json!({"server": SERVER, "env": env, "answer": "local", "calls": narrowing_calls()}),
    )
    .await;
    check_narrowed(&report);
    let report = typescript(
        json!({"server": SERVER, "env": env, "answer": "decline", "calls": declining_calls()}),
    )
    .await;
    check_declined(&report);
}

#[tokio::test]
async fn typescript_sessions_choose_their_fleet_over_http() {
    let fake = FakeServe::start().await;
    let cloud = FakeCloud::start().await;
    let rt = tempfile::tempdir().unwrap();
    let (local_url, cloud_url) = (fake.url(), cloud.url());
    let server = spawn_http(rt.path(), &both_fleets(&local_url, &cloud_url)).await;
    let report = typescript(
        json!({"url": server.url, "token": TOKEN, "answer": "local", "calls": narrowing_calls()}),
    )
    .await;
    check_narrowed(&report);
    // Another session is asked again: the choice was the first session's only.
    let report = typescript(
        json!({"url": server.url, "token": TOKEN, "answer": "decline", "calls": declining_calls()}),
    )
    .await;
    check_declined(&report);
}

/// The Python client in its default mode settles on 2026-07-28; a call without target is
/// asked for the fleet (input required) and the retried call runs on the answer.
fn check_python_default_mode(report: &Value) {
    assert_eq!(report["protocol"], "2026-07-28", "{report}");
    assert_eq!(report["targetListed"], true, "no session to narrow");
    let calls = report["calls"].as_array().unwrap();
    assert_eq!(calls[0]["isError"], false, "{report}");
    assert!(
        calls[0]["structured"]["machine"]["name"]
            .as_str()
            .unwrap()
            .starts_with("mcp-")
    );
    assert_eq!(calls[1]["isError"], false, "{report}");
    assert_eq!(calls[1]["structured"]["stdout"], "hi\n", "{report}");
    assert_eq!(
        report["asked"].as_array().unwrap().len(),
        2,
        "each call without target is asked: {report}"
    );
}

fn python_default_calls() -> Value {
    json!([
        {"tool": "create-machine", "args": {"image": "alpine"}},
        {"tool": "run-command", "args": {"name": "$created", "command": ["echo", "hi"]}}
    ])
}

#[tokio::test]
async fn python_default_mode_answers_the_fleet_question_over_stdio() {
    let fake = FakeServe::start().await;
    let cloud = FakeCloud::start().await;
    let rt = tempfile::tempdir().unwrap();
    let (local_url, cloud_url) = (fake.url(), cloud.url());
    let env = env_object(server_env(rt.path(), &both_fleets(&local_url, &cloud_url)));
    let report = python(
        json!({"server": SERVER, "env": env, "answer": "local", "calls": python_default_calls()}),
    )
    .await;
    check_python_default_mode(&report);
    // On stdio the process owns the machine, as a session would: gone when it exits.
    assert!(fake.has_no_machines());
    let declined = python(json!({"server": SERVER, "env": env, "answer": "decline",
        "calls": [{"tool": "list-machines", "args": {}}]}))
    .await;
    assert_eq!(declined["calls"][0]["isError"], true, "{declined}");
    assert!(
        declined["calls"][0]["text"]
            .as_str()
            .unwrap()
            .contains("required")
    );
}

#[tokio::test]
async fn python_default_mode_answers_the_fleet_question_over_http() {
    let fake = FakeServe::start().await;
    let cloud = FakeCloud::start().await;
    let rt = tempfile::tempdir().unwrap();
    let (local_url, cloud_url) = (fake.url(), cloud.url());
    let server = spawn_http(rt.path(), &both_fleets(&local_url, &cloud_url)).await;
    let report = python(
        json!({"url": server.url, "token": TOKEN, "answer": "local", "calls": python_default_calls()}),
    )
    .await;
    check_python_default_mode(&report);
    let name = report["calls"][0]["structured"]["machine"]["name"]
        .as_str()
        .unwrap();
    assert!(
        fake.has_machine(name),
        "leased to the server: the client leaving does not delete it"
    );
}

/// Over HTTP a stateless unnamed machine belongs to the server under a lease: kept while a
/// call on it runs longer than the lease, deleted once nobody has named it for the lease.
#[tokio::test]
async fn a_stateless_machine_is_reaped_after_its_lease_and_kept_during_a_call() {
    let fake = FakeServe::start().await;
    fake.state.lock().unwrap().exec_delay = Some(Duration::from_secs(8));
    let rt = tempfile::tempdir().unwrap();
    let local_url = fake.url();
    let server = spawn_http(
        rt.path(),
        &[
            ("SMOL_LOCAL_URL", &local_url),
            ("SMOL_MCP_MACHINE_LEASE_SECS", "3"),
        ],
    )
    .await;
    let report = python(json!({"url": server.url, "token": TOKEN, "calls": [
        {"tool": "create-machine", "args": {"image": "alpine"}},
        {"tool": "run-command", "args": {"name": "$created", "command": ["echo", "long"]}}
    ]}))
    .await;
    assert_eq!(report["protocol"], "2026-07-28");
    let calls = report["calls"].as_array().unwrap();
    assert_eq!(calls[1]["isError"], false, "{report}");
    let name = calls[0]["structured"]["machine"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let deletes = |fake: &FakeServe| fake.requests_of("DELETE");
    assert_eq!(
        deletes(&fake),
        0,
        "not deleted during the 8 s call on a 3 s lease (renewed when it ended)"
    );
    assert!(fake.has_machine(&name));
    until(
        "the leased machine is reaped once unused",
        Duration::from_secs(10),
        || !fake.has_machine(&name),
    )
    .await;
    let record = rt.path().join("rt/ephemeral.json");
    until("and forgotten", Duration::from_secs(5), || {
        !std::fs::read_to_string(&record).unwrap().contains(&name)
    })
    .await;
    drop(server);
}

/// A restarted server adopts the leased machines of a dead one whose lease has not run out
/// (a stateless client still holds their names) and deletes the expired ones.
#[tokio::test]
async fn a_restarted_server_adopts_live_leases_and_deletes_expired_ones() {
    let fake = FakeServe::start().await;
    for name in ["mcp-fresh", "mcp-stale", "mcp-session"] {
        fake.add_machine(name, "running");
    }
    let rt = tempfile::tempdir().unwrap();
    let rt_dir = rt.path().join("rt");
    std::fs::create_dir_all(&rt_dir).unwrap();
    // The server refuses a runtime dir others can reach.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&rt_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // A pid that is not running: the largest pid_max allows is never handed out here.
    let dead = 4_194_303;
    let entry = |name: &str, lease: Value| {
        let mut e = json!({"fleet": "local", "name": name, "id": name, "ownerPid": dead,
            "session": "leased-4194303", "recordedAt": now - 100});
        if !lease.is_null() {
            e["lease"] = lease;
        }
        e
    };
    let record = json!({"machines": [
        // Used a moment ago, with a 5 s lease: adopted, then reaped by the new server.
        entry("mcp-fresh", json!({"lastUsed": now, "secs": 5})),
        entry("mcp-stale", json!({"lastUsed": now - 100, "secs": 10})),
        // A session's machine of the dead process (no lease): an orphan, as before.
        entry("mcp-session", Value::Null),
    ]});
    std::fs::write(rt_dir.join("ephemeral.json"), record.to_string()).unwrap();

    let local_url = fake.url();
    let server = spawn_http(rt.path(), &[("SMOL_LOCAL_URL", &local_url)]).await;
    let machines = |fake: &FakeServe| -> Vec<String> { fake.machine_names() };
    until(
        "the expired and the session orphans are deleted",
        Duration::from_secs(10),
        || machines(&fake) == ["mcp-fresh"],
    )
    .await;
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(rt_dir.join("ephemeral.json")).unwrap())
            .unwrap();
    let adopted = &record["machines"][0];
    assert_eq!(adopted["name"], "mcp-fresh");
    let pid = server.child.id().unwrap();
    assert_eq!(adopted["ownerPid"], pid, "{record}");
    assert_eq!(adopted["session"], format!("leased-{pid}"));
    until(
        "the adopted machine is reaped once its lease runs out",
        Duration::from_secs(10),
        || machines(&fake).is_empty(),
    )
    .await;
}

/// An adopted lease on a fleet no call of the new server touched is still deleted at its stop.
#[tokio::test]
async fn a_stopping_server_deletes_the_leased_machines_it_adopted() {
    let fake = FakeServe::start().await;
    fake.add_machine("mcp-adopted", "running");
    let rt = tempfile::tempdir().unwrap();
    let rt_dir = rt.path().join("rt");
    std::fs::create_dir_all(&rt_dir).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&rt_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let record = json!({"machines": [{"fleet": "local", "name": "mcp-adopted",
        "id": "mcp-adopted", "ownerPid": 4_194_303, "session": "leased-4194303",
        "recordedAt": now, "lease": {"lastUsed": now, "secs": 600}}]});
    let record_path = rt_dir.join("ephemeral.json");
    std::fs::write(&record_path, record.to_string()).unwrap();
    let local_url = fake.url();
    let mut server = spawn_http(rt.path(), &[("SMOL_LOCAL_URL", &local_url)]).await;
    let pid = server.child.id().unwrap();
    until("adopted", Duration::from_secs(10), || {
        std::fs::read_to_string(&record_path)
            .unwrap()
            .contains(&format!("leased-{pid}"))
    })
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    tokio::time::timeout(Duration::from_secs(15), server.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(fake.has_no_machines());
    assert!(
        !std::fs::read_to_string(&record_path)
            .unwrap()
            .contains("mcp-adopted")
    );
}

// ---- Origin on both lifecycles -----------------------------------------------------------

#[tokio::test]
async fn a_foreign_origin_is_refused_on_both_lifecycles() {
    let fake = FakeServe::start().await;
    let rt = tempfile::tempdir().unwrap();
    let local_url = fake.url();
    let server = spawn_http(rt.path(), &[("SMOL_LOCAL_URL", &local_url)]).await;
    let http = reqwest::Client::new();
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}});
    let stateless = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"}}}});
    let own = format!("http://127.0.0.1:{}", server.port);
    for (lifecycle, body, modern) in [
        ("initialize", &initialize, false),
        ("2026-07-28", &stateless, true),
    ] {
        for (origin, allowed) in [("http://evil.example", false), (own.as_str(), true)] {
            let mut request = http
                .post(&server.url)
                .bearer_auth(TOKEN)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("origin", origin)
                .json(body);
            if modern {
                request = request
                    .header("mcp-protocol-version", "2026-07-28")
                    .header("mcp-method", "tools/list");
            }
            let response = request.send().await.unwrap();
            let status = response.status();
            let text = response.text().await.unwrap();
            if allowed {
                assert_eq!(status, 200, "{lifecycle} from {origin}: {text}");
                assert!(text.contains("\"result\""), "{lifecycle}: answered: {text}");
            } else {
                assert_eq!(status, 403, "{lifecycle} from {origin}: {text}");
                assert!(text.contains("Origin"), "{text}");
            }
        }
    }
}
