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
        let plan = json!({"resources": ["http://127.0.0.1:*"], "scopes": [SCOPE, OTHER_SCOPE]});
        let mut child = Command::new("node")
            .arg(clients_dir().join("oidc_provider.mjs"))
            .arg(plan.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
            .await
            .expect("the OpenID provider did not start within 30 s")
            .unwrap()
            .expect("the OpenID provider exited before listening");
        let started: Value = serde_json::from_str(&first).unwrap();
        // Read on, so that the provider never writes into a closed pipe (EPIPE ends it).
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Issuer {
            _child: child,
            url: started["issuer"].as_str().unwrap().to_owned(),
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
