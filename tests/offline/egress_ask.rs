//! Egress only the user widens, against the fake serve (the real engine: tests/guest/booted_guest.rs).
//! A machine created with `network: "ask"` starts with an allow list in force that allows
//! nothing (so the engine takes additions while it runs); when a command fails and the engine
//! refused hosts meanwhile, the user is asked, through the session's client, about each one: a
//! yes widens the machine's list live and the result says to run the command again, a no leaves
//! it refused and is not asked again. A client that cannot be asked gets the refusal and why; no
//! tool argument can widen a running machine's egress.

use crate::common::asker::User;
use crate::common::fake_serve::FakeServe;
use crate::common::mcp::config;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use smol_mcp::protocol::Protocol;
use smol_mcp::protocol::server::SmolMcp;
use std::sync::{Arc, Mutex};

struct Session {
    client: RunningService<RoleClient, User>,
    questions: Arc<Mutex<Vec<Value>>>,
    protocol: Arc<Protocol>,
    fake: FakeServe,
    _runtime: tempfile::TempDir,
}

impl Session {
    async fn start(can_be_asked: bool, allow: Vec<&'static str>) -> Session {
        Session::start_with(can_be_asked, allow, &[]).await
    }

    async fn start_with(
        can_be_asked: bool,
        allow: Vec<&'static str>,
        settings: &[(&str, &str)],
    ) -> Session {
        Session::start_thinking(can_be_asked, allow, settings, std::time::Duration::ZERO).await
    }

    async fn start_thinking(
        can_be_asked: bool,
        allow: Vec<&'static str>,
        settings: &[(&str, &str)],
        thinks: std::time::Duration,
    ) -> Session {
        let fake = FakeServe::start_guest_shell().await;
        let runtime = tempfile::tempdir().unwrap();
        let url = fake.url();
        let mut env = vec![("SMOL_LOCAL_URL", url.as_str())];
        env.extend_from_slice(settings);
        let protocol = Protocol::start(config(&env, &runtime.path().join("rt"))).unwrap();
        let server = SmolMcp::new(protocol.clone(), "ask");
        let client_io = crate::common::mcp::serve_in_memory(server, 1 << 20);
        let mut user = User::new(can_be_asked, allow);
        user.thinks = thinks;
        let questions = user.questions.clone();
        Session {
            client: user.serve(client_io).await.unwrap(),
            questions,
            protocol,
            fake,
            _runtime: runtime,
        }
    }

    async fn call(&self, tool: &str, args: Value) -> Value {
        let params = CallToolRequestParams::new(tool.to_owned())
            .with_arguments(args.as_object().unwrap().clone());
        let result = self.client.call_tool(params).await.unwrap();
        assert_ne!(result.is_error, Some(true), "{tool}: {result:?}");
        result.structured_content.unwrap()
    }

    /// The tool error's text of a call that must fail.
    async fn refused(&self, tool: &str, args: Value) -> String {
        let params = CallToolRequestParams::new(tool.to_owned())
            .with_arguments(args.as_object().unwrap().clone());
        let result = self.client.call_tool(params).await.unwrap();
        assert_eq!(result.is_error, Some(true), "{tool} {args}: {result:?}");
        format!("{:?}", result.content)
    }

    fn egress_posts(&self) -> Vec<Value> {
        self.fake
            .take_requests()
            .into_iter()
            .filter(|r| r["path"].as_str().unwrap().ends_with("/egress"))
            .collect()
    }
}

#[tokio::test]
async fn the_user_allows_one_refused_host_live_and_declines_another_for_good() {
    let s = Session::start(true, vec!["pypi.org"]).await;
    let created = s
        .call("create-machine", json!({"name": "asks", "network": "ask"}))
        .await;
    assert_eq!(created["machine"]["network"], "allow(none)", "{created}");
    let create = s
        .fake
        .take_requests()
        .into_iter()
        .find(|r| r["method"] == "POST" && r["path"] == "/api/v1/machines")
        .unwrap();
    // An allow list in force from the start, allowing nothing: one name that never resolves,
    // which keeps the engine's DNS filter on, so refused names are recorded and asked about.
    assert_eq!(create["body"].get("allowedCidrs"), None, "{create}");
    assert_eq!(
        create["body"]["allowedHosts"],
        json!([smol_mcp::fleet::NAME_FILTER_HOST]),
        "{create}"
    );

    s.fake.deny_on_exec("asks", "resolve", "pypi.org");
    s.fake.deny_on_exec("asks", "resolve", "evil.example");
    let failed = s
        .call("run-command", json!({"name": "asks", "command": "exit 7"}))
        .await;
    assert_eq!(failed["exitCode"], 7);
    assert_eq!(
        failed["egressAnswer"],
        json!({"allowed": ["pypi.org"], "declined": ["evil.example"]}),
        "{failed}"
    );
    let questions = s.questions.lock().unwrap().clone();
    assert_eq!(questions.len(), 1, "one question for the command");
    let message = questions[0]["message"].as_str().unwrap();
    assert!(
        message.contains("asks")
            && message.contains("pypi.org")
            && message.contains("evil.example"),
        "{message}"
    );
    // The yes widened the running machine's list; the no did not.
    let posts = s.egress_posts();
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(posts[0]["body"], json!({"allowHosts": ["pypi.org"]}));
    let machine = s.call("list-machines", json!({"name": "asks"})).await["machines"][0].clone();
    assert_eq!(machine["network"], "allow(pypi.org)");
    // What the user allowed is kept for the machine.
    s.protocol.policy.ledger.flush().await;
    let kept = s
        .protocol
        .policy
        .store
        .egress_grants()
        .for_machine(smol_mcp::store::Hold::new(
            smol_mcp::fleet::FleetKind::Local,
            "asks",
            "",
        ))
        .await
        .unwrap();
    assert_eq!(kept, ["pypi.org"]);

    // The declined host is refused again on the next failure (the allowed one no more, as the
    // engine would), and not asked about again.
    s.fake.state.lock().unwrap().denials_on_exec.clear();
    s.fake.deny_on_exec("asks", "resolve", "evil.example");
    let again = s
        .call("run-command", json!({"name": "asks", "command": "exit 7"}))
        .await;
    assert_eq!(
        again["egressAnswer"]["declined"],
        json!(["evil.example"]),
        "{again}"
    );
    assert!(
        again["egressAnswer"]["notAsked"]
            .as_str()
            .unwrap()
            .contains("declined")
    );
    assert_eq!(s.questions.lock().unwrap().len(), 1, "not asked twice");
    assert!(s.egress_posts().is_empty());

    // The next machine for the same work starts with what the user allowed, even once the
    // first is gone: no question again.
    s.call("delete-machine", json!({"name": "asks"})).await;
    s.fake.take_requests();
    let next = s
        .call(
            "create-machine",
            json!({"name": "asks-2", "network": "ask", "allowHostsFrom": "asks"}),
        )
        .await;
    assert_eq!(next["machine"]["network"], "allow(pypi.org)", "{next}");
    let params = CallToolRequestParams::new("create-machine".to_owned()).with_arguments(
        json!({"allowHostsFrom": "never-asked"})
            .as_object()
            .unwrap()
            .clone(),
    );
    let refused = s.client.call_tool(params).await.unwrap();
    assert_eq!(refused.is_error, Some(true));
    let text = format!("{:?}", refused.content);
    assert!(
        text.contains("allowHostsFrom") && text.contains("nothing"),
        "{text}"
    );
}

/// A machine that comes back as a branch child keeps what its source promised: the children
/// of an ask machine ask the user too, whether branched while it runs or from it as a base
/// (before, a child held the source's allow list but never asked: a refusal came back as a
/// plain failure).
#[tokio::test]
async fn the_children_of_an_ask_machine_ask_too_live_or_from_a_base() {
    let s = Session::start(true, vec!["pypi.org"]).await;
    s.call(
        "create-machine",
        json!({"name": "asks", "network": "ask", "branchable": true}),
    )
    .await;
    s.call(
        "branch-machine",
        json!({"name": "asks", "childName": "asks-live"}),
    )
    .await;
    s.call(
        "branch-machine",
        json!({"name": "asks", "childName": "asks-frozen", "freezeSource": true}),
    )
    .await;
    s.call(
        "branch-machine",
        json!({"name": "asks", "childName": "asks-of-base"}),
    )
    .await;
    for child in ["asks-live", "asks-of-base"] {
        s.fake.deny_on_exec(child, "resolve", "pypi.org");
        let failed = s
            .call("run-command", json!({"name": child, "command": "exit 7"}))
            .await;
        assert_eq!(
            failed["egressAnswer"],
            json!({"allowed": ["pypi.org"], "declined": []}),
            "{child}: {failed}"
        );
        let machine = s.call("list-machines", json!({"name": child})).await["machines"][0].clone();
        assert_eq!(machine["network"], "allow(pypi.org)", "{child}: {machine}");
    }
    assert_eq!(s.questions.lock().unwrap().len(), 2, "one question a child");
}

#[tokio::test]
async fn a_client_that_cannot_be_asked_gets_the_refusal_and_why_and_nothing_is_widened() {
    let s = Session::start(false, vec![]).await;
    s.call("create-machine", json!({"name": "asks", "network": "ask"}))
        .await;
    s.fake.deny_on_exec("asks", "resolve", "pypi.org");
    let failed = s
        .call("run-command", json!({"name": "asks", "command": "exit 1"}))
        .await;
    let answer = &failed["egressAnswer"];
    assert_eq!(answer["allowed"], json!([]), "{failed}");
    assert_eq!(answer["declined"], json!(["pypi.org"]));
    assert!(
        answer["notAsked"]
            .as_str()
            .unwrap()
            .contains("cannot show the user a question"),
        "{failed}"
    );
    assert!(s.egress_posts().is_empty());
}

#[tokio::test]
async fn a_machine_without_ask_is_never_put_to_the_user() {
    let s = Session::start(true, vec!["pypi.org"]).await;
    s.call(
        "create-machine",
        json!({"name": "listed", "allowHosts": ["example.com"]}),
    )
    .await;
    s.fake.deny_on_exec("listed", "resolve", "pypi.org");
    let failed = s
        .call(
            "run-command",
            json!({"name": "listed", "command": "exit 1"}),
        )
        .await;
    assert!(failed.get("egressAnswer").is_none(), "{failed}");
    assert_eq!(failed["blockedEgress"][0]["host"], "pypi.org");
    assert!(s.questions.lock().unwrap().is_empty());
    assert!(s.egress_posts().is_empty());
}

#[tokio::test]
async fn ask_is_refused_where_it_cannot_work_naming_the_argument() {
    let s = Session::start(true, vec![]).await;
    let params = CallToolRequestParams::new("run-once".to_owned()).with_arguments(
        json!({"command": ["true"], "network": "ask"})
            .as_object()
            .unwrap()
            .clone(),
    );
    let refused = s.client.call_tool(params).await.unwrap();
    assert_eq!(refused.is_error, Some(true));
    let text = format!("{:?}", refused.content);
    assert!(
        text.contains("network") && text.contains("create-machine"),
        "{text}"
    );
}

/// One 2026-07-28 tools/call over HTTP, raw (no SDK speaks MRTR's input-required result yet),
/// from a client that declares form elicitation; answers the JSON-RPC response.
async fn stateless_call(server: &crate::common::clients::HttpServer, params: Value) -> Value {
    crate::common::clients::stateless_request(
        server,
        MRTR_TOKEN,
        "tools/call",
        json!({"elicitation": {"form": {}}}),
        params,
    )
    .await
}

const MRTR_TOKEN: &str = "mrtr-token";

/// `smol-mcp-http` on the fake guest shell, with machine `asks` made (`network: "ask"`) by a
/// sessionless request.
async fn http_server_with_an_ask_machine() -> (
    FakeServe,
    tempfile::TempDir,
    crate::common::clients::HttpServer,
) {
    let fake = FakeServe::start_guest_shell().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let server = crate::common::clients::HttpServer::spawn(
        rt.path(),
        MRTR_TOKEN,
        &[("SMOL_LOCAL_URL", &url)],
    )
    .await;
    let created = stateless_call(
        &server,
        json!({"name": "create-machine", "arguments": {"name": "asks", "network": "ask"}}),
    )
    .await;
    assert_eq!(
        created["result"]["structuredContent"]["machine"]["network"], "allow(none)",
        "{created}"
    );
    (fake, rt, server)
}

#[tokio::test]
async fn a_sessionless_client_gets_the_question_as_input_required_and_its_answer_applies_on_the_retry()
 {
    let (fake, _rt, server) = http_server_with_an_ask_machine().await;
    fake.deny_on_exec("asks", "resolve", "pypi.org");
    fake.deny_on_exec("asks", "resolve", "evil.example");
    let run = json!({"name": "run-command", "arguments": {"name": "asks", "command": "exit 7"}});
    let asked = stateless_call(&server, run.clone()).await;
    let result = &asked["result"];
    assert_eq!(result["resultType"], "input_required", "{asked}");
    let question = &result["inputRequests"]["egress"];
    assert_eq!(question["method"], "elicitation/create", "{asked}");
    let message = question["params"]["message"].as_str().unwrap();
    assert!(
        message.contains("pypi.org") && message.contains("evil.example"),
        "{message}"
    );
    let properties = question["params"]["requestedSchema"]["properties"]
        .as_object()
        .unwrap();
    assert_eq!(properties.len(), 2, "{question}");
    let state = result["requestState"].as_str().unwrap().to_owned();
    assert!(
        !fake
            .take_requests()
            .iter()
            .any(|r| r["path"].as_str().unwrap().ends_with("/egress")),
        "nothing widened before the user answered"
    );

    // The user says yes to the first destination only (the keys name them in the message's order).
    fake.state.lock().unwrap().denials_on_exec.clear();
    let mut retry = run.clone();
    retry["inputResponses"] =
        json!({"egress": {"action": "accept", "content": {"allow0": true, "allow1": false}}});
    retry["requestState"] = json!(state);
    let answered = stateless_call(&server, retry.clone()).await;
    let content = &answered["result"]["structuredContent"];
    assert_eq!(content["exitCode"], 7, "{answered}");
    assert_eq!(
        content["egressAnswer"],
        json!({"allowed": ["pypi.org"], "declined": ["evil.example"]}),
        "{answered}"
    );
    let posts: Vec<Value> = fake
        .take_requests()
        .into_iter()
        .filter(|r| r["path"].as_str().unwrap().ends_with("/egress"))
        .collect();
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(posts[0]["body"], json!({"allowHosts": ["pypi.org"]}));

    // A state is taken once: after its answer (a no to evil.example) was applied, the same state
    // carrying a yes to both is refused, and nothing is widened.
    let mut yes_after_no = retry.clone();
    yes_after_no["inputResponses"] =
        json!({"egress": {"action": "accept", "content": {"allow0": true, "allow1": true}}});
    let refused = stateless_call(&server, yes_after_no).await;
    crate::common::assert_invalid_params(&refused, "used already");
    // A state sealed for this call does not open for another (here: other arguments), and a
    // made-up one is refused: the agent's side cannot forge a yes.
    let mut replayed = retry.clone();
    replayed["arguments"]["command"] = json!("exit 8");
    let refused = stateless_call(&server, replayed).await;
    crate::common::assert_invalid_params(&refused, "requestState");
    let mut forged = retry;
    forged["requestState"] = json!("made-up");
    let refused = stateless_call(&server, forged).await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert!(
        !fake
            .take_requests()
            .iter()
            .any(|r| r["path"].as_str().unwrap().ends_with("/egress"))
    );
}

/// Commands refused the same host while a question about their machine is open wait for its
/// answer: one form, and each command told the host is allowed (five concurrent commands made
/// five forms, and two could be answered differently).
#[tokio::test]
async fn concurrent_refusals_of_one_machine_make_one_question() {
    let s = Session::start_thinking(
        true,
        vec!["pypi.org"],
        &[],
        std::time::Duration::from_millis(400),
    )
    .await;
    s.call("create-machine", json!({"name": "asks", "network": "ask"}))
        .await;
    s.fake.deny_on_exec("asks", "resolve", "pypi.org");
    let run = || s.call("run-command", json!({"name": "asks", "command": "exit 7"}));
    let answers = futures::future::join_all([run(), run(), run()]).await;
    for answer in &answers {
        assert_eq!(
            answer["egressAnswer"]["allowed"],
            json!(["pypi.org"]),
            "{answer}"
        );
    }
    assert_eq!(s.questions.lock().unwrap().len(), 1, "one form");
    assert_eq!(s.egress_posts().len(), 1, "widened once");
}

/// A session puts at most so many questions to the user a minute: the next refusal is reported
/// with when to run the command again, and no form is shown.
#[tokio::test]
async fn a_session_asks_the_user_at_most_three_times_a_minute() {
    let s = Session::start(true, vec![]).await;
    s.call("create-machine", json!({"name": "asks", "network": "ask"}))
        .await;
    let mut last = Value::Null;
    for host in ["a.example", "b.example", "c.example", "d.example"] {
        s.fake.state.lock().unwrap().denials_on_exec.clear();
        s.fake.deny_on_exec("asks", "resolve", host);
        last = s
            .call("run-command", json!({"name": "asks", "command": "exit 7"}))
            .await;
    }
    assert_eq!(s.questions.lock().unwrap().len(), 3, "{last}");
    let why = last["egressAnswer"]["notAsked"].as_str().unwrap();
    assert!(
        why.starts_with("this session put 3 questions to the user in the last 60 s"),
        "{why}"
    );
    assert_eq!(
        last["egressAnswer"]["declined"],
        json!(["d.example"]),
        "{last}"
    );
}

/// A keyed call that asks the user: its input-required answer is not kept as the key's answer,
/// so the call made again with the same key and the user's answer runs with it applied.
#[tokio::test]
async fn a_keyed_call_that_asks_the_user_runs_again_with_the_answer() {
    let (fake, _rt, server) = http_server_with_an_ask_machine().await;
    fake.deny_on_exec("asks", "resolve", "pypi.org");
    let run = json!({"name": "run-command", "arguments": {
        "name": "asks", "command": "exit 7", "idempotencyKey": "asks-once-7f3a"}});
    let asked = stateless_call(&server, run.clone()).await;
    assert_eq!(asked["result"]["resultType"], "input_required", "{asked}");
    let state = asked["result"]["requestState"].as_str().unwrap().to_owned();

    fake.state.lock().unwrap().denials_on_exec.clear();
    fake.take_requests();
    let mut retry = run.clone();
    retry["inputResponses"] = json!({"egress": {"action": "accept", "content": {"allow0": true}}});
    retry["requestState"] = json!(state);
    let answered = stateless_call(&server, retry.clone()).await;
    let content = &answered["result"]["structuredContent"];
    assert_eq!(
        content["egressAnswer"],
        json!({"allowed": ["pypi.org"], "declined": []}),
        "{answered}"
    );
    let sent = fake.take_requests();
    let widened = sent
        .iter()
        .filter(|r| r["path"].as_str().unwrap().ends_with("/egress"))
        .count();
    assert_eq!(widened, 1, "{sent:?}");
    // The state was taken by that call: sent again it is refused, whatever answer it carries.
    let replayed = stateless_call(&server, retry).await;
    assert_eq!(replayed["error"]["code"], -32602, "{replayed}");
    // The answer is the key's now: the same call again runs nothing.
    let again = stateless_call(&server, run).await;
    assert_eq!(again["result"]["structuredContent"], *content, "{again}");
    assert!(
        !fake
            .take_requests()
            .iter()
            .any(|r| r["path"].as_str().unwrap().ends_with("/exec")),
        "the kept answer was not run again"
    );
}

#[tokio::test]
async fn where_the_operator_leaves_egress_to_the_user_the_agent_cannot_open_or_list_hosts() {
    let s = Session::start_with(true, vec!["pypi.org"], &[("SMOL_MCP_AGENT_NETWORK", "ask")]).await;
    for (args, argument) in [
        (json!({"network": "open"}), "network"),
        (json!({"allowHosts": ["pypi.org"]}), "allowHosts"),
        (json!({"allowCidrs": ["10.0.0.0/8"]}), "allowCidrs"),
    ] {
        for tool in ["create-machine", "run-once"] {
            let mut args = args.clone();
            if tool == "run-once" {
                args["command"] = json!("true");
            }
            let text = s.refused(tool, args.clone()).await;
            assert!(
                text.contains(argument) && text.contains("only the user widens"),
                "{tool} {args}: {text}"
            );
        }
    }
    let creates = s
        .fake
        .take_requests()
        .into_iter()
        .filter(|r| r["method"] == "POST" && r["path"] == "/api/v1/machines")
        .count();
    assert_eq!(creates, 0, "nothing created for a refused call");

    // What the user widens still works: ask, and the hosts the user allowed before.
    s.call("create-machine", json!({"name": "asks", "network": "ask"}))
        .await;
    s.fake.deny_on_exec("asks", "resolve", "pypi.org");
    let failed = s
        .call("run-command", json!({"name": "asks", "command": "exit 1"}))
        .await;
    assert_eq!(failed["egressAnswer"]["allowed"], json!(["pypi.org"]));
    let next = s
        .call(
            "create-machine",
            json!({"name": "asks-2", "network": "ask", "allowHostsFrom": "asks"}),
        )
        .await;
    assert_eq!(next["machine"]["network"], "allow(pypi.org)", "{next}");
    let blocked = s.call("create-machine", json!({"name": "plain"})).await;
    assert_eq!(blocked["machine"]["network"], "blocked", "{blocked}");
}

/// A machine adopted by a restarted server keeps what it promised: a sessionless client's
/// temporary ask machine, its server killed outright, is the next server's (same runtime
/// directory), and a refusal in it is still put to the user, its allow list as it was.
#[tokio::test]
async fn an_ask_machine_adopted_by_a_restarted_server_still_asks() {
    let fake = FakeServe::start_guest_shell().await;
    let rt = tempfile::tempdir().unwrap();
    let url = fake.url();
    let vars = [("SMOL_LOCAL_URL", url.as_str())];
    let mut first = crate::common::clients::HttpServer::spawn(rt.path(), MRTR_TOKEN, &vars).await;
    let created = stateless_call(
        &first,
        json!({"name": "create-machine", "arguments": {"network": "ask"}}),
    )
    .await;
    let name = created["result"]["structuredContent"]["machine"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    assert!(name.starts_with("mcp-"), "a temporary machine: {created}");
    first.child.start_kill().unwrap();
    first.child.wait().await.unwrap();

    let next = crate::common::clients::HttpServer::spawn(rt.path(), MRTR_TOKEN, &vars).await;
    // The server binds its port before it adopts (a second one whose port is taken must not
    // take the first one's machines), so the record is read once it has answered a call.
    let listed = stateless_call(&next, json!({"name": "list-machines", "arguments": {}})).await;
    assert!(listed["result"]["isError"] != json!(true), "{listed}");
    let record = walk_for(rt.path(), "ephemeral.json");
    let entries: Value = serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    let entry = entries["machines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{entries}"));
    assert_eq!(
        entry["ownerPid"],
        next.child.id().unwrap(),
        "adopted: {entry}"
    );

    fake.deny_on_exec(&name, "resolve", "pypi.org");
    let asked = stateless_call(
        &next,
        json!({"name": "run-command", "arguments": {"name": name, "command": "exit 7"}}),
    )
    .await;
    assert_eq!(asked["result"]["resultType"], "input_required", "{asked}");
    let listed = stateless_call(
        &next,
        json!({"name": "list-machines", "arguments": {"name": name}}),
    )
    .await;
    assert_eq!(
        listed["result"]["structuredContent"]["machines"][0]["network"], "allow(none)",
        "{listed}"
    );
}

/// The one file called `file` under `dir`.
fn walk_for(dir: &std::path::Path, file: &str) -> std::path::PathBuf {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == file) {
                return path;
            }
        }
    }
    panic!("no {file} under {}", dir.display())
}
