//! MCP Apps (io.modelcontextprotocol/ui), against the fake serve (the views in a real browser on
//! the nested engine: tests/guest/apps.rs). Offered only to a client that declares it shows
//! views: the extension in the capabilities, the three `ui://` resources, each tool's link to
//! its view and view-state (app-only); a client that did not declare gets none of it, and a
//! view or view-state asked for all the same is refused saying why. The egress view's answer:
//! the question the command put on the board, listed with a sealed state, answered once with
//! it, and the asking call completing with that answer.

use crate::common::fake_serve::FakeServe;
use crate::common::mcp::config;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation,
    ReadResourceRequestParams,
};
use rmcp::service::RunningService;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use smol_mcp::protocol::Protocol;
use smol_mcp::protocol::server::SmolMcp;
use std::sync::Arc;

const UI: &str = "io.modelcontextprotocol/ui";
const VIEWS: [&str; 3] = [
    "ui://smol-mcp/machines",
    "ui://smol-mcp/egress",
    "ui://smol-mcp/terminal",
];

/// A client that shows views (or, with `shows_views` false, a plain one).
#[derive(Clone)]
struct Host {
    shows_views: bool,
}

impl ClientHandler for Host {
    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        if self.shows_views {
            let mut extensions = rmcp::model::ExtensionCapabilities::new();
            let settings = json!({"mimeTypes": ["text/html;profile=mcp-app"]});
            extensions.insert(UI.to_owned(), settings.as_object().unwrap().clone());
            capabilities.extensions = Some(extensions);
        }
        ClientConfig::new(capabilities, Implementation::new("apps-test", "0"))
    }
}

struct Session {
    client: RunningService<RoleClient, Host>,
    fake: FakeServe,
    _protocol: Arc<Protocol>,
    _runtime: tempfile::TempDir,
}

impl Session {
    async fn start(shows_views: bool) -> Session {
        let fake = FakeServe::start_guest_shell().await;
        let runtime = tempfile::tempdir().unwrap();
        let url = fake.url();
        let protocol = Protocol::start(config(
            &[("SMOL_LOCAL_URL", url.as_str())],
            &runtime.path().join("rt"),
        ))
        .unwrap();
        let server = SmolMcp::new(protocol.clone(), "apps");
        let client_io = crate::common::mcp::serve_in_memory(server, 1 << 20);
        Session {
            client: Host { shows_views }.serve(client_io).await.unwrap(),
            fake,
            _protocol: protocol,
            _runtime: runtime,
        }
    }

    async fn answer(&self, tool: &str, args: Value) -> rmcp::model::CallToolResult {
        self.client
            .call_tool(
                CallToolRequestParams::new(tool.to_owned())
                    .with_arguments(args.as_object().unwrap().clone()),
            )
            .await
            .unwrap()
    }

    async fn call(&self, tool: &str, args: Value) -> Value {
        let result = self.answer(tool, args).await;
        assert_ne!(result.is_error, Some(true), "{tool}: {result:?}");
        result.structured_content.unwrap()
    }

    async fn refused(&self, tool: &str, args: Value) -> String {
        let result = self.answer(tool, args.clone()).await;
        assert_eq!(result.is_error, Some(true), "{tool} {args}: {result:?}");
        format!("{:?}", result.content)
    }

    /// The extensions the server declared to this client at `initialize`.
    fn declared_extensions(&self) -> Option<rmcp::model::ExtensionCapabilities> {
        self.client.peer_info()?.capabilities.extensions.clone()
    }

    async fn tools(&self) -> Value {
        serde_json::to_value(self.client.list_all_tools().await.unwrap()).unwrap()
    }
}

fn tool<'a>(tools: &'a Value, name: &str) -> Option<&'a Value> {
    tools.as_array().unwrap().iter().find(|t| t["name"] == name)
}

#[tokio::test]
async fn a_client_that_shows_views_is_offered_them_linked_from_their_tools() {
    let s = Session::start(true).await;
    let declared = s.declared_extensions();
    assert_eq!(declared.unwrap()[UI], serde_json::Map::new());
    let tools = s.tools().await;
    for (name, view) in [
        ("list-machines", VIEWS[0]),
        ("run-command", VIEWS[1]),
        ("terminal", VIEWS[2]),
    ] {
        assert_eq!(
            tool(&tools, name).unwrap()["_meta"],
            json!({"ui": {"resourceUri": view}}),
            "{name}"
        );
    }
    let view_state = tool(&tools, "view-state").expect("view-state is listed");
    assert_eq!(view_state["_meta"], json!({"ui": {"visibility": ["app"]}}));
    assert!(
        tool(&tools, "create-machine")
            .unwrap()
            .get("_meta")
            .is_none()
    );
    let resources = s.client.list_all_resources().await.unwrap();
    for uri in VIEWS {
        let listed = resources.iter().find(|r| r.uri == uri).expect(uri);
        assert_eq!(
            listed.mime_type.as_deref(),
            Some("text/html;profile=mcp-app")
        );
        let read = s
            .client
            .read_resource(ReadResourceRequestParams::new(uri))
            .await
            .unwrap();
        let contents = serde_json::to_value(&read.contents).unwrap();
        assert_eq!(contents[0]["mimeType"], "text/html;profile=mcp-app");
        let html = contents[0]["text"].as_str().unwrap();
        // One self-contained file: nothing it loads or links to comes from anywhere, small.
        assert!(html.starts_with("<!doctype html>"), "{uri}");
        assert!(html.len() < 16 * 1024, "{uri} is {} bytes", html.len());
        for outside in [
            "src=", "href=", "@import", "url(", "http://", "https://", "//cdn",
        ] {
            assert!(!html.contains(outside), "{uri} has {outside}");
        }
        assert_eq!(listed.size, Some(html.len() as u64));
    }
}

#[tokio::test]
async fn a_client_that_did_not_declare_gets_no_views_and_a_clear_refusal() {
    let s = Session::start(false).await;
    let declared = s.declared_extensions();
    assert!(
        declared.as_ref().is_none_or(|e| !e.contains_key(UI)),
        "{declared:?}"
    );
    let tools = s.tools().await;
    assert!(tool(&tools, "view-state").is_none());
    assert!(
        tools
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t.get("_meta").is_none())
    );
    let resources = s.client.list_all_resources().await.unwrap();
    assert!(resources.iter().all(|r| !r.uri.starts_with("ui://")));
    let refused = s
        .client
        .read_resource(ReadResourceRequestParams::new(VIEWS[0]))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains(UI) && refused.contains("text/html;profile=mcp-app"),
        "{refused}"
    );
    let called = s.refused("view-state", json!({"view": "machines"})).await;
    assert!(
        called.contains(UI) && called.contains("did not declare"),
        "{called}"
    );
}

/// view-state takes each view's arguments only, and a terminal it does not know is refused.
#[tokio::test]
async fn view_state_refuses_what_its_view_does_not_take() {
    let s = Session::start(true).await;
    let machines = s.call("view-state", json!({"view": "machines"})).await;
    assert_eq!(machines, json!({"machines": [], "more": 0}));
    let stray = s
        .refused("view-state", json!({"view": "machines", "input": "ls\n"}))
        .await;
    assert!(
        stray.contains("input") && stray.contains("terminal view only"),
        "{stray}"
    );
    let bad = s.refused("view-state", json!({"view": "screens"})).await;
    assert!(bad.contains("view"), "{bad}");
    s.call("create-machine", json!({"name": "shown"})).await;
    let unnamed = s
        .refused("view-state", json!({"view": "terminal", "name": "shown"}))
        .await;
    assert!(unnamed.contains("terminal"), "{unnamed}");
    let unknown = s
        .refused(
            "view-state",
            json!({"view": "terminal", "name": "shown", "terminal": "t-0"}),
        )
        .await;
    assert!(unknown.contains("no open terminal"), "{unknown}");
    let listed = s.call("view-state", json!({"view": "machines"})).await;
    assert_eq!(listed["machines"][0]["name"], "shown", "{listed}");
    assert_eq!(listed["machines"][0]["target"], "local");
}

/// A client with views but no forms: the question goes to the egress view, whose answer, with
/// the state sealed for that question, completes the asking call; a state for another question,
/// a made-up one, or one used already settles nothing.
#[tokio::test]
async fn the_egress_view_answers_the_question_a_command_asked() {
    let s = Arc::new(Session::start(true).await);
    s.call("create-machine", json!({"name": "asks", "network": "ask"}))
        .await;
    s.fake.deny_on_exec("asks", "resolve", "pypi.org");
    s.fake.deny_on_exec("asks", "resolve", "evil.example");
    let asking = {
        let s = s.clone();
        tokio::spawn(async move {
            s.call("run-command", json!({"name": "asks", "command": "exit 7"}))
                .await
        })
    };
    let question = loop {
        let listed = s.call("view-state", json!({"view": "egress"})).await;
        if let Some(q) = listed["questions"].as_array().and_then(|q| q.first()) {
            break q.clone();
        }
        assert!(!asking.is_finished(), "the command ended without asking");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(question["machine"], "asks");
    let mut asked: Vec<&str> = question["destinations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    asked.sort_unstable();
    assert_eq!(asked, ["evil.example", "pypi.org"]);
    let id = question["question"].as_str().unwrap();
    let state = question["state"].as_str().unwrap();
    // Not the state of this question: refused, and the question still waits.
    let forged = s
        .refused(
            "view-state",
            json!({"view": "egress", "answer": {"question": id, "state": "AAAA", "allowed": ["pypi.org"]}}),
        )
        .await;
    assert!(forged.contains("answer.state"), "{forged}");
    let again = s.call("view-state", json!({"view": "egress"})).await;
    let other_state = again["questions"][0]["state"].as_str().unwrap().to_owned();
    let elsewhere = s
        .refused(
            "view-state",
            json!({"view": "egress", "answer": {"question": "q-0000000000000000", "state": state, "allowed": []}}),
        )
        .await;
    assert!(elsewhere.contains("answer.state"), "{elsewhere}");
    let stray = s
        .refused(
            "view-state",
            json!({"view": "egress", "answer": {"question": id, "state": other_state, "allowed": ["github.com"]}}),
        )
        .await;
    assert!(
        stray.contains("github.com") && stray.contains("not asked"),
        "{stray}"
    );
    let answered = s
        .call(
            "view-state",
            json!({"view": "egress", "answer": {"question": id, "state": state, "allowed": ["pypi.org"]}}),
        )
        .await;
    assert_eq!(answered["answered"], true, "{answered}");
    assert_eq!(answered["questions"], json!([]));
    let result = asking.await.unwrap();
    assert_eq!(result["exitCode"], 7);
    assert_eq!(
        result["egressAnswer"],
        json!({"allowed": ["pypi.org"], "declined": ["evil.example"]}),
        "{result}"
    );
    // The state was taken: the same answer once more settles nothing.
    let replayed = s
        .refused(
            "view-state",
            json!({"view": "egress", "answer": {"question": id, "state": state, "allowed": ["pypi.org"]}}),
        )
        .await;
    assert!(replayed.contains("used already"), "{replayed}");
}

/// The machines view lists at most 100 machines, sorted by name, and counts the rest.
#[tokio::test]
async fn the_machines_view_is_bounded() {
    let s = Session::start(true).await;
    for i in 0..105 {
        s.fake.add_machine(&format!("m{i:03}"), "running");
    }
    let listed = s.call("view-state", json!({"view": "machines"})).await;
    let machines = listed["machines"].as_array().unwrap();
    assert_eq!(machines.len(), 100);
    assert_eq!(listed["more"], 5);
    assert_eq!(machines[0]["name"], "m000");
    assert_eq!(machines[99]["name"], "m099");
}
