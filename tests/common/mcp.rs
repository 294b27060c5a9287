//! An in-process MCP client talking to the server over an in-memory pipe, as a real client would.

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use smol_mcp::policy::Policy;
use smol_mcp::policy::tools::{self, Caller, Scope, Tool};
use smol_mcp::policy::user::User;
use smol_mcp::process::config::Config;
use smol_mcp::protocol::Protocol;
use smol_mcp::protocol::server::SmolMcp;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

pub struct Harness {
    pub client: RunningService<RoleClient, ()>,
    pub protocol: Arc<Protocol>,
    pub session: String,
    /// Shared by the harnesses of one test that play a server process restarted
    /// (`next_process`): the same runtime directory, so the same machine record.
    pub runtime: Arc<tempfile::TempDir>,
}

/// The answer of one tool call.
#[derive(Debug)]
pub struct Answer {
    pub is_error: bool,
    pub structured: Value,
    pub text: String,
    /// The text of each content block.
    pub blocks: Vec<String>,
    /// Each image content block: its MIME type and its base64 data.
    pub images: Vec<(String, String)>,
}

pub fn config(env: &[(&str, &str)], runtime: &Path) -> Config {
    let mut vars: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    vars.insert("SMOL_MCP_RUNTIME_DIR".into(), runtime.display().to_string());
    vars.entry("SMOL_MCP_READY_TIMEOUT_SECS".into())
        .or_insert("5".into());
    Config::from_sources(&vars, Path::new("/nonexistent/config.json")).unwrap()
}

/// A server that signs users in (an issuer set) on the fake engine, with `extra` settings.
pub async fn signed_in_server(
    fake: &super::fake_serve::FakeServe,
    runtime: &Path,
    extra: &[(&str, &str)],
) -> Arc<Protocol> {
    let url = fake.url();
    let mut env = vec![
        ("SMOL_LOCAL_URL", url.as_str()),
        ("SMOL_MCP_AUTH_ISSUER", "https://id.example"),
    ];
    env.extend_from_slice(extra);
    Protocol::start(config(&env, &runtime.join("rt"))).unwrap()
}

/// Serves `server` over an in-memory pipe of `buffer` bytes each way, for as long as its client
/// keeps the other end: that end.
pub fn serve_in_memory(server: SmolMcp, buffer: usize) -> tokio::io::DuplexStream {
    let (server_io, client_io) = tokio::io::duplex(buffer);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    client_io
}

/// `handler` as the client of `server`, the two joined in memory.
pub async fn connect<H: rmcp::ClientHandler>(
    server: SmolMcp,
    handler: H,
) -> RunningService<RoleClient, H> {
    handler
        .serve(serve_in_memory(server, 1 << 20))
        .await
        .unwrap()
}

/// A tool call's parameters: `args` must be a JSON object.
pub fn tool_params(tool: &str, args: Value) -> CallToolRequestParams {
    let Value::Object(map) = args else {
        panic!("arguments must be an object")
    };
    CallToolRequestParams::new(tool.to_owned()).with_arguments(map)
}

/// Calls `tool` through `client` and answers what came back, tool error or not.
pub async fn call_tool(client: &RunningService<RoleClient, ()>, tool: &str, args: Value) -> Answer {
    let result = client.call_tool(tool_params(tool, args)).await.unwrap();
    let blocks: Vec<String> = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    let images = result
        .content
        .iter()
        .filter_map(|c| match c {
            rmcp::model::ContentBlock::Image(image) => {
                Some((image.mime_type.clone(), image.data.clone()))
            }
            _ => None,
        })
        .collect();
    Answer {
        is_error: result.is_error == Some(true),
        structured: result.structured_content.unwrap_or(Value::Null),
        text: blocks.join("\n"),
        blocks,
        images,
    }
}

impl Harness {
    pub async fn start(env: &[(&str, &str)]) -> Harness {
        let runtime = tempfile::Builder::new()
            .prefix("smol-mcp-rt-")
            .tempdir()
            .unwrap();
        Harness::start_in(env, Arc::new(runtime)).await
    }

    /// A server on the fake engine (its local fleet), with `extra` settings.
    pub async fn on_fake(fake: &super::fake_serve::FakeServe, extra: &[(&str, &str)]) -> Harness {
        let url = fake.url();
        let mut env = vec![("SMOL_LOCAL_URL", url.as_str())];
        env.extend_from_slice(extra);
        Harness::start(&env).await
    }

    /// A server whose one fleet is the fake cloud, with `extra` settings.
    pub async fn on_fake_cloud(
        cloud: &super::fake_cloud::FakeCloud,
        extra: &[(&str, &str)],
    ) -> Harness {
        let url = cloud.url();
        Harness::start(&super::fake_cloud::only_fleet(&url, extra)).await
    }

    /// Another server process on the same runtime directory (so the same machine record), as
    /// a server started again after this one, with its own settings and session.
    pub async fn next_process(&self, env: &[(&str, &str)]) -> Harness {
        Harness::start_in(env, self.runtime.clone()).await
    }

    async fn start_in(env: &[(&str, &str)], runtime: Arc<tempfile::TempDir>) -> Harness {
        let rt_dir = runtime.path().join("rt");
        let protocol = Protocol::start(config(env, &rt_dir)).unwrap();
        let session = format!("test-{:08x}", rand::random::<u32>());
        let server = SmolMcp::new(protocol.clone(), session.clone());
        let client = connect(server, ()).await;
        Harness {
            client,
            protocol,
            session,
            runtime,
        }
    }

    /// What the process's end does with the warm pools it set up on the local fleet.
    pub async fn tear_down_local_pools(&self) {
        let process = self.protocol.process();
        let fleet = process
            .fleet(smol_mcp::fleet::FleetKind::Local)
            .await
            .unwrap();
        process.pools.tear_down(&fleet).await;
    }

    /// `tool` called with `args` and not waited for: the handle cancels it.
    pub async fn start_call(
        &self,
        tool: &str,
        args: Value,
    ) -> rmcp::service::RequestHandle<RoleClient> {
        let request = rmcp::model::ClientRequest::CallToolRequest(
            rmcp::model::CallToolRequest::new(tool_params(tool, args)),
        );
        let options = rmcp::service::PeerRequestOptions::no_options();
        self.client
            .peer()
            .send_cancellable_request(request, options)
            .await
            .unwrap()
    }

    pub async fn call(&self, tool: &str, args: Value) -> Answer {
        call_tool(&self.client, tool, args).await
    }

    /// Calls a tool that must succeed and returns its structured result.
    pub async fn ok(&self, tool: &str, args: Value) -> Value {
        let answer = self.call(tool, args).await;
        assert!(!answer.is_error, "{tool} failed: {}", answer.text);
        answer.structured
    }

    /// Makes a machine with create-machine, which must succeed: its name.
    pub async fn create(&self, args: Value) -> String {
        let created = self.ok("create-machine", args).await;
        created["machine"]["name"].as_str().unwrap().to_owned()
    }

    /// Reads a page with read-file: the structured result, and the page (the second block).
    pub async fn read(&self, args: Value) -> (Value, String) {
        let answer = self.call("read-file", args).await;
        assert!(!answer.is_error, "read-file failed: {}", answer.text);
        assert_eq!(answer.blocks.len(), 2, "the page is the second block");
        assert!(
            answer.structured.get("content").is_none(),
            "the page travels once"
        );
        (answer.structured, answer.blocks[1].clone())
    }

    /// Calls a tool that must fail and returns its error text.
    pub async fn err(&self, tool: &str, args: Value) -> String {
        let answer = self.call(tool, args).await;
        assert!(
            answer.is_error,
            "{tool} should have failed: {}",
            answer.text
        );
        answer.text
    }

    /// A JSON resource (`smol://runs/...`), parsed.
    pub async fn resource(&self, uri: &str) -> Value {
        let contents = self
            .client
            .read_resource(rmcp::model::ReadResourceRequestParams::new(uri))
            .await
            .unwrap()
            .contents;
        match &contents[0] {
            rmcp::model::ResourceContents::TextResourceContents { text, .. } => {
                serde_json::from_str(text).unwrap()
            }
            other => panic!("not text: {other:?}"),
        }
    }

    pub fn record_path(&self) -> std::path::PathBuf {
        self.runtime.path().join("rt").join("ephemeral.json")
    }

    /// The machines in the record file (none while there is no file).
    pub fn record(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.record_path()).unwrap_or_else(|_| "{}".into());
        let file: Value = serde_json::from_str(&text).unwrap();
        file["machines"].as_array().cloned().unwrap_or_default()
    }
}

/// A tool call in process as `user` ("" for the operator): its structured answer, or its
/// error's text.
pub async fn call_as(
    policy: &Arc<Policy>,
    user: &str,
    tool: Tool,
    args: Value,
) -> Result<Value, String> {
    let who = if user.is_empty() {
        User::operator()
    } else {
        User::signed_in(user)
    };
    let caller = Caller::new(
        format!("session-of-{user}"),
        Scope::Process(policy.process.mode),
        CancellationToken::new(),
    )
    .for_user(who);
    tools::call(policy, caller, tool, args)
        .await
        .map(|answer| answer.structured)
        .map_err(|e| e.to_string())
}

/// Every tool of the table with arguments naming machine `name`, or `None` for a tool whose
/// arguments name no machine. A tool added to the table and not here fails the test: a new
/// tool cannot skip the ownership check's test.
pub fn naming(tool: Tool, name: &str) -> Option<Value> {
    Some(match tool {
        Tool::ListMachines => json!({"name": name}),
        Tool::CreateMachine => json!({"name": name}),
        Tool::StartMachine => json!({"name": name}),
        Tool::StopMachine => json!({"name": name}),
        Tool::DeleteMachine => json!({"name": name}),
        Tool::RunCommand => json!({"name": name, "command": "echo reached"}),
        Tool::ReadFile => json!({"name": name, "path": "/etc/hostname"}),
        Tool::WriteFile => json!({"name": name, "path": "/tmp/reached", "content": "x"}),
        Tool::BranchMachine => json!({"name": name, "childName": format!("{name}-child")}),
        Tool::KeepChanges => json!({"name": name, "message": "kept"}),
        Tool::MachineLogs => json!({"name": name}),
        Tool::PublishPort => json!({"name": name, "port": 8080}),
        Tool::Terminal => json!({"name": name, "command": ["sh"]}),
        Tool::PullImage => json!({"name": name, "image": "alpine:3.19"}),
        Tool::ViewState => json!({"view": "terminal", "name": name, "terminal": "t-0"}),
        Tool::JobOutput | Tool::CancelJob | Tool::RunOnce => return None,
    })
}
