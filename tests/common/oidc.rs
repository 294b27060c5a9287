//! A real OpenID provider for the sign-in tests: the npm package oidc-provider (pinned in
//! tests/clients/package.json) run by tests/clients/oidc_provider.mjs on a free loopback port,
//! killed when dropped. Its login and consent pages answer themselves (as the user a test
//! names), so tokens come from the whole authorization-code flow with no person at a browser.

use super::clients::clients_dir;
use serde_json::{Value, json};
use std::process::Stdio;
use tokio::io::AsyncBufReadExt as _;
use tokio::process::{Child, Command};

pub struct Issuer {
    _child: Child,
    pub url: String,
}

/// The scope the test servers require of every token.
pub const SCOPE: &str = "machines";
/// A scope the provider also grants, which the servers do not take in place of [`SCOPE`].
pub const OTHER_SCOPE: &str = "notes";

impl Issuer {
    /// A provider that issues tokens for any loopback resource (a test server's, or another's
    /// that the server under test must refuse), with the scopes [`SCOPE`] and [`OTHER_SCOPE`].
    pub async fn start() -> Issuer {
        Issuer::start_with(json!({})).await
    }

    /// The same provider with dynamic registration off and Client ID Metadata Documents on,
    /// for client ids on `host`'s origin: a client signs in only by its document.
    pub async fn start_for_metadata_documents(host: &CimdHost) -> Issuer {
        Issuer::start_with(json!({
            "registration": false,
            "cimd": {"origin": host.origin, "ca": host.ca},
        }))
        .await
    }

    async fn start_with(extra: Value) -> Issuer {
        let mut plan = json!({"resources": ["http://127.0.0.1:*"], "scopes": [SCOPE, OTHER_SCOPE]});
        if let (Some(plan), Value::Object(extra)) = (plan.as_object_mut(), extra) {
            plan.extend(extra);
        }
        let (child, first, _) = start_node("oidc_provider.mjs", &plan, "the OpenID provider").await;
        Issuer {
            _child: child,
            url: first["issuer"].as_str().unwrap().to_owned(),
        }
    }

    /// An access token for `user`, asked for `resource` with `scope`, by the whole flow a
    /// public client goes through (tests/clients/oauth_token.mjs).
    pub async fn token(&self, user: &str, resource: &str, scope: &str) -> String {
        let plan = json!({"issuer": self.url, "resource": resource, "user": user, "scope": scope});
        let answer = super::clients::run_node("oauth_token.mjs", &plan).await;
        answer["access_token"].as_str().unwrap().to_owned()
    }
}

/// How long a helper script has to print its first line: it starts in under a second alone, and
/// the bound is for a host whose two cores the tests share with the install checks' build.
const START_WITHIN: std::time::Duration = std::time::Duration::from_secs(90);

/// Starts a Node script of tests/clients with `plan`, answers the first line it prints (JSON)
/// and reads the rest into a list the caller may look at.
async fn start_node(
    script: &str,
    plan: &Value,
    what: &str,
) -> (Child, Value, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    let mut child = Command::new("node")
        .arg(clients_dir().join(script))
        .arg(plan.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    // What the script says on stderr, kept to say why it did not start (once, in a CI run
    // beside the install checks' build, the provider printed nothing within 30 s, where it
    // starts in 0.6 s alone).
    let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let heard = said.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = stderr.next_line().await {
            let mut heard = heard.lock().unwrap();
            if heard.len() < 16 * 1024 {
                heard.push_str(&line);
                heard.push('\n');
            }
        }
    });
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let started = std::time::Instant::now();
    let first = tokio::time::timeout(START_WITHIN, lines.next_line())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{what} did not start within {START_WITHIN:?}; its stderr: {}",
                said.lock().unwrap()
            )
        })
        .unwrap()
        .unwrap_or_else(|| panic!("{what} exited before listening: {}", said.lock().unwrap()));
    if started.elapsed() > std::time::Duration::from_secs(10) {
        eprintln!("{what} took {:?} to start", started.elapsed());
    }
    let started: Value = serde_json::from_str(&first).unwrap();
    let later = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = later.clone();
    // Read on, so that the script never writes into a closed pipe (EPIPE ends it).
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(value) = serde_json::from_str(&line) {
                kept.lock().unwrap().push(value);
            }
        }
    });
    (child, started, later)
}

/// Clients' Client ID Metadata Documents on an HTTPS host of the test's own on loopback
/// (tests/clients/cimd_host.mjs), each document's client_id its own URL.
pub struct CimdHost {
    _child: Child,
    pub origin: String,
    /// The PEM file of its self-signed certificate, which the provider trusts.
    pub ca: String,
    urls: Value,
    fetched: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
}

impl CimdHost {
    /// Serves `clients`: name to metadata (client_id left out: the URL is filled in).
    pub async fn start(clients: Value) -> CimdHost {
        let (child, first, fetched) = start_node(
            "cimd_host.mjs",
            &json!({"clients": clients}),
            "the metadata host",
        )
        .await;
        CimdHost {
            _child: child,
            origin: first["origin"].as_str().unwrap().to_owned(),
            ca: first["ca"].as_str().unwrap().to_owned(),
            urls: first["urls"].clone(),
            fetched,
        }
    }

    /// The URL of `name`'s document: the client's id.
    pub fn url(&self, name: &str) -> String {
        self.urls[name].as_str().unwrap().to_owned()
    }

    /// The paths fetched so far, in order.
    pub fn fetched(&self) -> Vec<String> {
        self.fetched
            .lock()
            .unwrap()
            .iter()
            .filter_map(|line| line["fetched"].as_str().map(str::to_owned))
            .collect()
    }
}
