//! OAuth 2.1 sign-in on `smol-mcp-http` against a real OpenID provider (oidc-provider, started
//! by the test): the protected resource metadata, 401 with `WWW-Authenticate`, tokens refused
//! for another audience, without the scope, forged or garbled; the static token kept beside
//! sign-in; and two clients no one here wrote signing in by themselves, the TypeScript SDK's
//! OAuth client and the Inspector CLI.

use crate::common::clients::{HttpServer, clients_dir, run_node};
use crate::common::fake_serve::FakeServe;
use crate::common::oidc::{CimdHost, Issuer, OTHER_SCOPE, SCOPE};
use crate::common::real_serve::free_port;
use serde_json::{Value, json};
use std::time::Duration;
use tokio::io::AsyncBufReadExt as _;

async fn signed_in_server(
    issuer: &Issuer,
    fake: &FakeServe,
    token: &str,
) -> (HttpServer, tempfile::TempDir) {
    signed_in(issuer, token, &[("SMOL_LOCAL_URL", &fake.url())]).await
}

/// `smol-mcp-http` signing users in with `issuer`, requiring [`SCOPE`], with the static
/// `token` (empty: none) and `extra` settings.
async fn signed_in(
    issuer: &Issuer,
    token: &str,
    extra: &[(&str, &str)],
) -> (HttpServer, tempfile::TempDir) {
    let rt = tempfile::tempdir().unwrap();
    let mut vars = vec![
        ("SMOL_MCP_AUTH_ISSUER", issuer.url.as_str()),
        ("SMOL_MCP_AUTH_SCOPES", SCOPE),
    ];
    vars.extend_from_slice(extra);
    let server = HttpServer::spawn(rt.path(), token, &vars).await;
    (server, rt)
}

async fn post(url: &str, bearer: Option<&str>) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/list")
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
            }}}),
        );
    if let Some(bearer) = bearer {
        request = request.bearer_auth(bearer);
    }
    request.send().await.unwrap()
}

fn challenge(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn tokens_of_the_issuer_sign_in_and_others_are_refused() {
    let issuer = Issuer::start().await;
    let fake = FakeServe::start().await;
    let (server, _rt) = signed_in_server(&issuer, &fake, "static-token").await;
    let base = format!("http://127.0.0.1:{}", server.port);

    // The metadata, where RFC 9728 puts it for /mcp and at the bare well-known path.
    for path in [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ] {
        let metadata: Value = reqwest::get(format!("{base}{path}"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(metadata["resource"], server.url, "{path}");
        assert_eq!(metadata["authorization_servers"], json!([issuer.url]));
        assert_eq!(metadata["scopes_supported"], json!([SCOPE]));
    }

    // No token: 401 naming the metadata.
    let response = post(&server.url, None).await;
    assert_eq!(response.status(), 401);
    let expected_metadata =
        format!("resource_metadata=\"{base}/.well-known/oauth-protected-resource/mcp\"");
    assert!(
        challenge(&response).contains(&expected_metadata),
        "{}",
        challenge(&response)
    );

    // A good token: in.
    let good = issuer.token("alice", &server.url, SCOPE).await;
    let response = post(&server.url, Some(&good)).await;
    assert_eq!(response.status(), 200);
    assert!(response.text().await.unwrap().contains("list-machines"));

    // A token the same issuer made for another server: refused as not meant for this one.
    let elsewhere = format!("http://127.0.0.1:{}/mcp", free_port());
    let stray = issuer.token("alice", &elsewhere, SCOPE).await;
    let response = post(&server.url, Some(&stray)).await;
    assert_eq!(response.status(), 401);
    let header = challenge(&response);
    assert!(
        header.contains("error=\"invalid_token\"") && header.contains("aud"),
        "{header}"
    );

    // Without the scope the server requires: 403 insufficient_scope.
    let narrow = issuer.token("alice", &server.url, OTHER_SCOPE).await;
    let response = post(&server.url, Some(&narrow)).await;
    assert_eq!(response.status(), 403);
    assert!(challenge(&response).contains("error=\"insufficient_scope\""));

    // Its payload changed (another subject) under the issuer's signature: refused.
    let mut pieces: Vec<String> = good.split('.').map(str::to_owned).collect();
    use base64::Engine as _;
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut claims: Value = serde_json::from_slice(&engine.decode(&pieces[1]).unwrap()).unwrap();
    claims["sub"] = "mallory".into();
    pieces[1] = engine.encode(claims.to_string());
    let response = post(&server.url, Some(&pieces.join("."))).await;
    assert_eq!(response.status(), 401);
    assert!(challenge(&response).contains("signature"));
    for garbage in ["x", "a.b.c", &"y".repeat(20_000)] {
        assert_eq!(post(&server.url, Some(garbage)).await.status(), 401);
    }

    // The static token still works beside sign-in (a one-person setup, an operator's script).
    assert_eq!(post(&server.url, Some("static-token")).await.status(), 200);
}

#[tokio::test]
async fn the_typescript_sdk_signs_in_by_itself() {
    let issuer = Issuer::start().await;
    let fake = FakeServe::start().await;
    let (server, _rt) = signed_in_server(&issuer, &fake, "").await;
    let report = run_node(
        "ts_signin.mjs",
        &json!({"url": server.url, "user": "erin", "calls": [{"name": "list-machines"}]}),
    )
    .await;
    assert!(
        report["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "run-command"),
        "{report}"
    );
    assert_eq!(report["subject"], "erin");
    assert_eq!(report["audience"], server.url);
    assert_eq!(report["results"][0]["isError"], false, "{report}");
}

#[tokio::test]
async fn the_inspector_cli_signs_in_by_itself() {
    let issuer = Issuer::start().await;
    let fake = FakeServe::start().await;
    let (server, rt) = signed_in_server(&issuer, &fake, "").await;
    let dir = clients_dir();
    let callback = format!("http://127.0.0.1:{}/oauth/callback", free_port());
    // The Inspector opens a browser for the sign-in: here a no-op `xdg-open`, and the test's
    // browser follows the URL it prints instead.
    let bin = rt.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("xdg-open"), "#!/bin/sh\nexit 0\n").unwrap();
    let mut permissions = std::fs::metadata(bin.join("xdg-open"))
        .unwrap()
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(bin.join("xdg-open"), permissions).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let mut inspector = tokio::process::Command::new(dir.join("node_modules/.bin/mcp-inspector"))
        .arg("--cli")
        .args(["--server-url", &server.url, "--transport", "http"])
        .args(["--method", "tools/call", "--tool-name", "list-machines"])
        .args(["--callback-url", &callback])
        .env("HOME", rt.path())
        .env("PATH", path)
        .env("MCP_AUTO_OPEN_ENABLED", "true")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = tokio::io::BufReader::new(inspector.stderr.take().unwrap()).lines();
    let prompt = "Please navigate to: ";
    let url = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            if let Some(at) = line.find(prompt) {
                return line[at + prompt.len()..].trim().to_owned();
            }
        }
        panic!("the Inspector exited without asking for a sign-in");
    })
    .await
    .expect("the Inspector did not ask for a sign-in within 60 s");
    assert!(url.starts_with(&issuer.url), "{url}");
    assert!(
        url.contains("resource="),
        "the Inspector asks for this server's audience: {url}"
    );
    let delivered = tokio::process::Command::new("node")
        .arg(dir.join("oauth_deliver.mjs"))
        .args([&url, "frank", &callback])
        .output()
        .await
        .unwrap();
    assert!(
        delivered.status.success(),
        "{}",
        String::from_utf8_lossy(&delivered.stderr)
    );
    tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
    let out = tokio::time::timeout(Duration::from_secs(60), inspector.wait_with_output())
        .await
        .expect("the Inspector did not finish after the sign-in")
        .unwrap();
    assert!(out.status.success());
    let called: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        called["structuredContent"]["machines"].is_array(),
        "{called}"
    );
}

/// One stateless tool call as `token`'s user: the JSON-RPC answer.
async fn call_as(server: &HttpServer, token: &str, tool: &str, arguments: Value) -> Value {
    crate::common::clients::stateless_request(
        server,
        token,
        "tools/call",
        json!({}),
        json!({"name": tool, "arguments": arguments}),
    )
    .await
}

/// `call_as` of a call that must succeed: the answer.
async fn ok_as(server: &HttpServer, token: &str, tool: &str, arguments: Value) -> Value {
    let answer = call_as(server, token, tool, arguments).await;
    assert_eq!(answer["result"]["isError"], false, "{tool}: {answer}");
    answer
}

/// A server signing users in with `issuer` on `fake`, with the static `token` (empty: none)
/// and `extra` settings, and alice's and bob's tokens for it.
async fn alice_and_bob(
    issuer: &Issuer,
    fake: &FakeServe,
    token: &str,
    extra: &[(&str, &str)],
) -> (HttpServer, tempfile::TempDir, String, String) {
    let url = fake.url();
    let mut settings = vec![("SMOL_LOCAL_URL", url.as_str())];
    settings.extend_from_slice(extra);
    let (server, rt) = signed_in(issuer, token, &settings).await;
    let alice = issuer.token("alice", &server.url, SCOPE).await;
    let bob = issuer.token("bob", &server.url, SCOPE).await;
    (server, rt, alice, bob)
}

fn error_text(answer: &Value) -> String {
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Two users signed in through the real provider, on one server: each sees and acts only on
/// the machines, runs, jobs and keys they made; the other's machine answers as one that does
/// not exist (its name as taken), and nothing of the other's is touched; each user's limit is
/// their own.
#[tokio::test]
async fn each_user_sees_and_acts_on_their_own_only() {
    let issuer = Issuer::start().await;
    let fake = FakeServe::start_guest_shell().await;
    let (server, _rt, alice, bob) = alice_and_bob(
        &issuer,
        &fake,
        "operator-token",
        &[("SMOL_MCP_MAX_MACHINES_PER_USER", "2")],
    )
    .await;

    // Alice makes a machine, runs a command (a run), starts a job, with a key.
    ok_as(
        &server,
        &alice,
        "create-machine",
        json!({"name": "alice-box"}),
    )
    .await;
    let ran = call_as(
        &server,
        &alice,
        "run-command",
        json!({"name": "alice-box", "command": "echo mine", "idempotencyKey": "k-1"}),
    )
    .await;
    assert_eq!(
        ran["result"]["structuredContent"]["stdout"], "mine\n",
        "{ran}"
    );
    let runs_of = |token: String| {
        let server = &server;
        async move {
            let read = crate::common::clients::stateless_request(
                server,
                &token,
                "resources/read",
                json!({}),
                json!({"uri": "smol://runs"}),
            )
            .await;
            let page: Value = serde_json::from_str(
                read["result"]["contents"][0]["text"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{read}")),
            )
            .unwrap();
            page["runs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["id"].as_str().unwrap().parse::<i64>().unwrap())
                .collect::<Vec<i64>>()
        }
    };
    let run_id = runs_of(alice.clone()).await[0];
    let job = call_as(
        &server,
        &alice,
        "run-command",
        json!({"name": "alice-box", "command": "sleep 30", "background": true}),
    )
    .await;
    let job_id = job["result"]["structuredContent"]["job"]
        .as_str()
        .unwrap()
        .to_owned();

    // Bob: the machine is not in his list, and every tool naming it answers not found.
    let listed = call_as(&server, &bob, "list-machines", json!({})).await;
    assert_eq!(
        listed["result"]["structuredContent"]["machines"],
        json!([]),
        "{listed}"
    );
    for (tool, args) in [
        ("list-machines", json!({"name": "alice-box"})),
        (
            "run-command",
            json!({"name": "alice-box", "command": "echo theirs"}),
        ),
        (
            "read-file",
            json!({"name": "alice-box", "path": "/etc/hostname"}),
        ),
        (
            "write-file",
            json!({"name": "alice-box", "path": "/tmp/x", "content": "x"}),
        ),
        ("stop-machine", json!({"name": "alice-box"})),
        ("delete-machine", json!({"name": "alice-box"})),
        (
            "branch-machine",
            json!({"name": "alice-box", "childName": "bobs-copy"}),
        ),
    ] {
        let text = error_text(&call_as(&server, &bob, tool, args).await);
        assert!(
            text.starts_with("NOT_FOUND") && text.contains("alice-box"),
            "{tool}: {text}"
        );
    }
    assert!(fake.has_machine("alice-box"), "bob deleted nothing");
    let taken = error_text(
        &call_as(
            &server,
            &bob,
            "create-machine",
            json!({"name": "alice-box"}),
        )
        .await,
    );
    assert!(taken.contains("taken"), "{taken}");
    // Her job, her run and her key are not his either.
    let text = error_text(&call_as(&server, &bob, "job-output", json!({"job": job_id})).await);
    assert!(text.starts_with("NOT_FOUND"), "{text}");
    let text = error_text(&call_as(&server, &bob, "cancel-job", json!({"job": job_id})).await);
    assert!(text.starts_with("NOT_FOUND"), "{text}");
    let jobs = call_as(&server, &bob, "job-output", json!({})).await;
    assert_eq!(
        jobs["result"]["structuredContent"]["jobs"],
        json!([]),
        "{jobs}"
    );
    assert_eq!(runs_of(bob.clone()).await, Vec::<i64>::new());
    let run = crate::common::clients::stateless_request(
        &server,
        &bob,
        "resources/read",
        json!({}),
        json!({"uri": format!("smol://runs/{run_id}")}),
    )
    .await;
    assert!(run["error"].is_object(), "{run}");
    // The same key from bob on his own machine is his own call, not a replay of hers.
    ok_as(&server, &bob, "create-machine", json!({"name": "bob-box"})).await;
    let his = call_as(
        &server,
        &bob,
        "run-command",
        json!({"name": "bob-box", "command": "echo his", "idempotencyKey": "k-1"}),
    )
    .await;
    assert_eq!(
        his["result"]["structuredContent"]["stdout"], "his\n",
        "{his}"
    );

    // Alice still has all of hers, and sees only hers.
    let listed = call_as(&server, &alice, "list-machines", json!({})).await;
    let names: Vec<&str> = listed["result"]["structuredContent"]["machines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alice-box"], "{listed}");
    let report = call_as(&server, &alice, "job-output", json!({"job": job_id})).await;
    assert_eq!(
        report["result"]["structuredContent"]["state"], "running",
        "{report}"
    );
    let replay = call_as(
        &server,
        &alice,
        "run-command",
        json!({"name": "alice-box", "command": "echo mine", "idempotencyKey": "k-1"}),
    )
    .await;
    assert_eq!(
        replay["result"]["structuredContent"]["stdout"], "mine\n",
        "{replay}"
    );
    // Replayed, not run again: her runs are still the command and the job.
    assert_eq!(runs_of(alice.clone()).await.len(), 2);
    // The operator (the static token) does not see signed-in users' machines either.
    let listed = call_as(&server, "operator-token", "list-machines", json!({})).await;
    assert_eq!(
        listed["result"]["structuredContent"]["machines"],
        json!([]),
        "{listed}"
    );

    // Her limit is hers: a second machine passes, a third does not; bob's one is not counted.
    ok_as(
        &server,
        &alice,
        "create-machine",
        json!({"name": "alice-two"}),
    )
    .await;
    let third = error_text(
        &call_as(
            &server,
            &alice,
            "create-machine",
            json!({"name": "alice-three"}),
        )
        .await,
    );
    assert!(
        third.starts_with("LIMIT_REACHED") && third.contains("maxMachinesPerUser"),
        "{third}"
    );
    assert!(!fake.has_machine("alice-three"));
    // The refused name is not left held: bob may take it.
    ok_as(
        &server,
        &bob,
        "create-machine",
        json!({"name": "alice-three"}),
    )
    .await;
    // Deleted, her name is free again (for bob, at his own limit of two until he deletes one).
    ok_as(&server, &bob, "delete-machine", json!({"name": "bob-box"})).await;
    ok_as(
        &server,
        &alice,
        "delete-machine",
        json!({"name": "alice-two"}),
    )
    .await;
    ok_as(
        &server,
        &bob,
        "create-machine",
        json!({"name": "alice-two"}),
    )
    .await;
}

/// A session a user opened is that user's: another signed-in user's request on its id is
/// answered as for a session that does not exist.
#[tokio::test]
async fn a_session_is_its_users_alone() {
    let issuer = Issuer::start().await;
    let fake = FakeServe::start().await;
    let (server, _rt, alice, bob) = alice_and_bob(&issuer, &fake, "", &[]).await;
    let http = reqwest::Client::new();
    let open = initialize_as(&server.url, &alice).await;
    assert_eq!(open.status(), 200);
    let session = crate::common::session_id(&open);
    let list = |token: &str| {
        http.post(&server.url)
            .bearer_auth(token)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
            .send()
    };
    assert_eq!(list(&bob).await.unwrap().status(), 404);
    assert_eq!(list(&alice).await.unwrap().status(), 200);

    // In a session of his own, bob can neither follow nor read the log or files of alice's
    // machine: the resource answers as for a machine that does not exist.
    ok_as(
        &server,
        &alice,
        "create-machine",
        json!({"name": "alice-logs"}),
    )
    .await;
    let open = initialize_as(&server.url, &bob).await;
    let his = crate::common::session_id(&open);
    for (method, uri) in [
        (
            "resources/subscribe",
            "smol://machine/local/alice-logs/logs",
        ),
        ("resources/read", "smol://machine/local/alice-logs/logs"),
        (
            "resources/read",
            "smol://machine/local/alice-logs/file/etc/hostname",
        ),
    ] {
        let text = crate::common::text_answer(
            http.post(&server.url)
                .bearer_auth(&bob)
                .header("accept", "application/json, text/event-stream")
                .header("mcp-session-id", &his)
                .header("mcp-protocol-version", "2025-11-25")
                .json(
                    &json!({"jsonrpc": "2.0", "id": 3, "method": method, "params": {"uri": uri}}),
                ),
        )
        .await;
        assert!(
            text.contains("\"error\"")
                && text.contains("alice-logs")
                && !text.contains("\"contents\""),
            "{method} {uri}: {text}"
        );
    }
}

/// On the cloud (faked, as it answers usage: 1812 micros a live machine, 1810 settled at its
/// delete), each user's spend is their own: past `cloudSpendPerUserMicros` a user's next
/// create or command is refused, another user's are not; a deleted machine's cost still counts
/// that day. A machine named by its cloud id is the user's as by its name.
#[tokio::test]
async fn each_users_cloud_spend_is_their_own() {
    use crate::common::fake_cloud::{FakeCloud, TOKEN as CLOUD_TOKEN};
    let issuer = Issuer::start().await;
    let cloud = FakeCloud::start().await;
    let (server, _rt) = signed_in(
        &issuer,
        "",
        &[
            ("SMOL_CLOUD_URL", &cloud.url()),
            ("SMOL_CLOUD_TOKEN", CLOUD_TOKEN),
            ("SMOL_MCP_TARGETS", "cloud"),
            ("SMOL_MCP_CLOUD_SPEND_PER_USER_MICROS", "3000"),
        ],
    )
    .await;
    let alice = issuer.token("alice", &server.url, SCOPE).await;
    let bob = issuer.token("bob", &server.url, SCOPE).await;
    async fn make(server: &HttpServer, token: &str, name: &str) -> Value {
        call_as(
            server,
            token,
            "create-machine",
            json!({"name": name, "image": "alpine"}),
        )
        .await
    }
    let first = make(&server, &alice, "alice-a").await;
    let id = first["result"]["structuredContent"]["machine"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{first}"))
        .to_owned();
    assert_ne!(id, "alice-a", "the cloud names it by an id of its own");
    let ran = call_as(
        &server,
        &alice,
        "run-command",
        json!({"name": id, "command": "true"}),
    )
    .await;
    assert_eq!(ran["result"]["isError"], false, "by its id, hers: {ran}");
    let text = error_text(
        &call_as(
            &server,
            &bob,
            "run-command",
            json!({"name": id, "command": "true"}),
        )
        .await,
    );
    assert!(
        text.starts_with("NOT_FOUND"),
        "by its id, not bob's: {text}"
    );
    let his = make(&server, &bob, "bob-a").await;
    assert_eq!(his["result"]["isError"], false, "{his}");
    let second = make(&server, &alice, "alice-b").await;
    assert_eq!(
        second["result"]["isError"], false,
        "1812 spent, under 3000: {second}"
    );

    // Two live machines, 3624: her next command is refused; bob's is not.
    let refused = error_text(
        &call_as(
            &server,
            &alice,
            "run-command",
            json!({"name": "alice-a", "command": "true"}),
        )
        .await,
    );
    assert!(
        refused.starts_with("LIMIT_REACHED") && refused.contains("cloudSpendPerUserMicros"),
        "{refused}"
    );
    ok_as(
        &server,
        &bob,
        "run-command",
        json!({"name": "bob-a", "command": "true"}),
    )
    .await;

    // Her deletes are let through, and what they cost stays on her day.
    for name in ["alice-b", "alice-a"] {
        ok_as(&server, &alice, "delete-machine", json!({"name": name})).await;
    }
    let again = error_text(&make(&server, &alice, "alice-c").await);
    assert!(
        again.starts_with("LIMIT_REACHED"),
        "3620 settled today: {again}"
    );
    assert!(
        !cloud.with(|s| s.machines.values().any(|m| m["name"] == "alice-c")),
        "nothing made past her ceiling"
    );
}

/// A sessionless task is its user's: another user's tasks/get and tasks/cancel of its id
/// answer as for a task that does not exist, and leave it running; its user polls it to its end.
#[tokio::test]
async fn a_task_is_its_users_alone() {
    let issuer = Issuer::start().await;
    let fake = FakeServe::start().await;
    let (server, _rt, alice, bob) =
        alice_and_bob(&issuer, &fake, "", &[("SMOL_MCP_TASK_AFTER_MILLIS", "0")]).await;
    ok_as(&server, &alice, "create-machine", json!({"name": "tasked"})).await;
    let tasks = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let ask = |token: &str, method: &str, params: Value| {
        let (server, token, method, tasks) =
            (&server, token.to_owned(), method.to_owned(), tasks.clone());
        async move {
            crate::common::clients::stateless_request(server, &token, &method, tasks, params).await
        }
    };
    let created = ask(
        &alice,
        "tools/call",
        json!({"name": "run-command", "arguments": {"name": "tasked", "command": "sleep 1; echo done"}}),
    )
    .await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    for method in ["tasks/get", "tasks/cancel"] {
        let refused = ask(&bob, method, json!({"taskId": task_id})).await;
        assert_eq!(refused["error"]["code"], -32602, "{method}: {refused}");
    }
    let start = std::time::Instant::now();
    loop {
        let got = ask(&alice, "tasks/get", json!({"taskId": task_id})).await;
        let status = got["result"]["status"]
            .as_str()
            .unwrap_or_else(|| panic!("{got}"))
            .to_owned();
        if status != "working" {
            assert_eq!(status, "completed", "not cancelled by bob: {got}");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{got}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The official Python client signs in by itself on both lifecycles (a 2025-11-25 session, and
/// 2026-07-28 requests), each as a user of their own: what one makes the other cannot see.
#[tokio::test]
async fn the_python_client_signs_in_by_itself_on_both_lifecycles() {
    let issuer = Issuer::start().await;
    let fake = FakeServe::start().await;
    let (server, _rt) = signed_in_server(&issuer, &fake, "").await;
    let alice = crate::common::clients::run_python(
        "signin_py.py",
        &json!({"url": server.url, "user": "alice", "mode": "legacy", "calls": [
            {"tool": "create-machine", "args": {"name": "py-alice"}},
            {"tool": "list-machines", "args": {}},
        ]}),
    )
    .await;
    assert_eq!(alice["subject"], "alice", "{alice}");
    assert_eq!(alice["calls"][0]["isError"], false, "{alice}");
    assert_eq!(
        alice["calls"][1]["structured"]["machines"][0]["name"], "py-alice",
        "{alice}"
    );
    let bob = crate::common::clients::run_python(
        "signin_py.py",
        &json!({"url": server.url, "user": "bob", "mode": "auto", "calls": [
            {"tool": "list-machines", "args": {}},
            {"tool": "run-command", "args": {"name": "py-alice", "command": "true"}},
        ]}),
    )
    .await;
    assert_eq!(bob["subject"], "bob", "{bob}");
    assert_eq!(
        bob["calls"][0]["structured"]["machines"],
        json!([]),
        "{bob}"
    );
    assert_eq!(bob["calls"][1]["isError"], true, "{bob}");
    assert!(
        bob["calls"][1]["text"]
            .as_str()
            .unwrap()
            .starts_with("NOT_FOUND"),
        "{bob}"
    );
}

/// Sessionless requests lease their machines under their own user's lease session: with
/// `maxMachinesPerSession` 1, alice's temporary machine does not count against bob's, and
/// bob's refusal (his second) counts only his own.
#[tokio::test]
async fn each_users_sessionless_machines_are_their_own_lease_session() {
    let issuer = Issuer::start().await;
    let fake = FakeServe::start().await;
    let (server, _rt, alice, bob) = alice_and_bob(
        &issuer,
        &fake,
        "",
        &[("SMOL_MCP_MAX_MACHINES_PER_SESSION", "1")],
    )
    .await;
    let temporary = json!({"start": false});
    ok_as(&server, &alice, "create-machine", temporary.clone()).await;
    let made = call_as(&server, &bob, "create-machine", temporary.clone()).await;
    assert_eq!(
        made["result"]["isError"], false,
        "alice's counted for bob: {made}"
    );
    let refused = error_text(&call_as(&server, &bob, "create-machine", temporary).await);
    assert!(
        refused.starts_with(
            "LIMIT_REACHED: this session's machines (still existing or being made): 1;"
        ),
        "{refused}"
    );
}

/// An initialize of the 2025-11-25 lifecycle sent as `token`'s user, its answer as it came.
async fn initialize_as(url: &str, token: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}),
        )
        .send()
        .await
        .unwrap()
}

/// A user's initializes sent all at once get no more than their share between them: the share
/// is counted and taken in one step, so none of them is let through on a count that the others
/// are about to change. 50% of 8 sessions: 4 for alice of 16 sent together, and bob his own.
#[tokio::test]
async fn racing_initializes_of_one_user_get_only_their_share() {
    let issuer = Issuer::start().await;
    let fake = FakeServe::start_guest_shell().await;
    let (server, _rt, alice, bob) =
        alice_and_bob(&issuer, &fake, "", &[("SMOL_MCP_HTTP_MAX_SESSIONS", "8")]).await;
    let statuses = futures::future::join_all(
        (0..16).map(|_| async { initialize_as(&server.url, &alice).await.status() }),
    )
    .await;
    let opened = statuses.iter().filter(|s| s.as_u16() == 200).count();
    let refused = statuses.iter().filter(|s| s.as_u16() == 503).count();
    assert_eq!((opened, refused), (4, 12), "{statuses:?}");
    assert_eq!(
        initialize_as(&server.url, &bob).await.status(),
        200,
        "bob's own share"
    );
}

/// Each signed-in user holds at most their share (`userSharePercent`) of the process's
/// sessions and running jobs: one user cannot use a bound up for all. Here 50% of 2 sessions
/// and of 2 running jobs: alice's second of each is refused naming the setting, bob still gets
/// his.
#[tokio::test]
async fn each_user_holds_only_their_share_of_sessions_and_jobs() {
    let issuer = Issuer::start().await;
    let fake = FakeServe::start_guest_shell().await;
    fake.add_machine("alice-box", "running");
    let (server, _rt, alice, bob) = alice_and_bob(
        &issuer,
        &fake,
        "",
        &[
            ("SMOL_MCP_HTTP_MAX_SESSIONS", "2"),
            ("SMOL_MCP_MAX_RUNNING_JOBS", "2"),
        ],
    )
    .await;
    assert_eq!(initialize_as(&server.url, &alice).await.status(), 200);
    let refused = initialize_as(&server.url, &alice).await;
    assert_eq!(refused.status(), 503);
    let text = refused.text().await.unwrap();
    assert!(text.contains("userSharePercent"), "{text}");
    assert_eq!(
        initialize_as(&server.url, &bob).await.status(),
        200,
        "bob's own share"
    );

    for (user, token) in [("alice", &alice), ("bob", &bob)] {
        ok_as(
            &server,
            token,
            "create-machine",
            json!({"name": format!("{user}-jobs")}),
        )
        .await;
    }
    let job = |token: String, name: &'static str| {
        let server = &server;
        async move {
            call_as(
                server,
                &token,
                "run-command",
                json!({"name": name, "command": "sleep 30", "background": true}),
            )
            .await
        }
    };
    let started = job(alice.clone(), "alice-jobs").await;
    assert_eq!(started["result"]["isError"], false, "{started}");
    let text = error_text(&job(alice.clone(), "alice-jobs").await);
    assert!(
        text.starts_with("RATE_LIMITED: you have 1 jobs running")
            && text.contains("userSharePercent"),
        "{text}"
    );
    let started = job(bob.clone(), "bob-jobs").await;
    assert_eq!(
        started["result"]["isError"], false,
        "bob's own share: {started}"
    );
}

/// A client's metadata as its Client ID Metadata Document says it: a public native client with
/// the redirect the test clients use (PKCE, no secret).
fn public_client(name: &str) -> Value {
    json!({
        "client_name": name,
        "redirect_uris": ["http://127.0.0.1:1/callback"],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
        "application_type": "native",
    })
}

/// Sign-in without registration (MCP 2026-07-28's preferred way, Client ID Metadata Documents):
/// the provider has dynamic registration off, so a client gets in only as the HTTPS URL of its
/// metadata document, which the provider fetches from the test's loopback host. The Python
/// client on both lifecycles and the TypeScript SDK sign in so, each token's client_id is its
/// document's URL, and each document was fetched from the host; a client that has no document
/// there (and may not register) gets no token.
#[tokio::test]
async fn clients_sign_in_by_their_metadata_documents_without_registering() {
    let host = CimdHost::start(json!({
        "python": public_client("smol-mcp sign-in test (Python)"),
        "typescript": public_client("smol-mcp sign-in test (TypeScript)"),
        "posing": {"client_id": "https://claude.ai/oauth/client.json", "client_name": "posing",
                   "redirect_uris": ["http://127.0.0.1:1/callback"], "token_endpoint_auth_method": "none"},
    }))
    .await;
    let issuer = Issuer::start_for_metadata_documents(&host).await;
    let discovery: Value = reqwest::get(format!(
        "{}/.well-known/oauth-authorization-server",
        issuer.url
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(
        (
            &discovery["client_id_metadata_document_supported"],
            &discovery["registration_endpoint"]
        ),
        (&json!(true), &Value::Null),
        "{discovery}"
    );
    let fake = FakeServe::start().await;
    let (server, _rt) = signed_in_server(&issuer, &fake, "").await;
    let python_id = host.url("python");
    for (user, mode) in [("alice", "legacy"), ("bob", "auto")] {
        let report = crate::common::clients::run_python(
            "signin_py.py",
            &json!({"url": server.url, "user": user, "mode": mode, "clientMetadataUrl": python_id,
                    "calls": [{"tool": "list-machines", "args": {}}]}),
        )
        .await;
        assert_eq!(
            (&report["subject"], &report["clientId"]),
            (&json!(user), &json!(python_id)),
            "{mode}: {report}"
        );
        assert_eq!(report["calls"][0]["isError"], false, "{mode}: {report}");
    }
    let typescript_id = host.url("typescript");
    let report = run_node(
        "ts_signin.mjs",
        &json!({"url": server.url, "user": "erin", "clientMetadataUrl": typescript_id,
                "calls": [{"name": "list-machines"}]}),
    )
    .await;
    assert_eq!(
        (&report["subject"], &report["clientId"], &report["audience"]),
        (&json!("erin"), &json!(typescript_id), &json!(server.url)),
        "{report}"
    );
    assert_eq!(report["results"][0]["isError"], false, "{report}");
    let fetched = host.fetched();
    for document in ["/clients/python.json", "/clients/typescript.json"] {
        assert!(
            fetched.iter().any(|f| f == document),
            "the provider fetched {fetched:?}"
        );
    }
    // Refused at the authorization request, before any sign-in page: a client id whose
    // document is not there (and registration is off), and a document that names another
    // client id than its own URL (one client posing as another).
    let authorize = |client_id: String| {
        let mut url = reqwest::Url::parse(&format!("{}/auth", issuer.url)).unwrap();
        url.query_pairs_mut()
            .append_pair("client_id", &client_id)
            .append_pair("response_type", "code")
            .append_pair("redirect_uri", "http://127.0.0.1:1/callback")
            .append_pair("scope", SCOPE)
            .append_pair(
                "code_challenge",
                "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",
            )
            .append_pair("code_challenge_method", "S256");
        url
    };
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let missing = format!("{}/clients/mallory.json", host.origin);
    let posing = host.url("posing");
    for client_id in [missing, posing] {
        let answer = browser
            .get(authorize(client_id.clone()))
            .send()
            .await
            .unwrap();
        let status = answer.status();
        let body = answer.text().await.unwrap();
        assert!(
            status.is_client_error() && body.contains("invalid_client"),
            "{client_id}: {status} {body}"
        );
    }
    let allowed = browser.get(authorize(python_id)).send().await.unwrap();
    assert_eq!(
        allowed.status(),
        303,
        "the same request with a real document goes on to sign-in"
    );
}
