//! Two users signed in through a real OpenID provider (oidc-provider, started by the test) to
//! three `smol-mcp-http` processes sharing one database behind HAProxy: whichever process a
//! request lands on (round-robin), each user sees and acts on their own machines, jobs and runs
//! only; the other's answer as if they did not exist; a `requestState` issued to one user does
//! not open for the other.

use super::balancer::Cluster;
use crate::common::clients::stateless_request_to;
use crate::common::oidc::{Issuer, SCOPE};
use crate::common::real_serve::free_port;
use serde_json::{Value, json};

async fn call(url: &str, token: &str, tool: &str, arguments: Value) -> Value {
    stateless_request_to(
        url,
        token,
        "tools/call",
        json!({}),
        json!({"name": tool, "arguments": arguments}),
    )
    .await
}

fn refused_as_missing(answer: &Value, name: &str) {
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = answer["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("NOT_FOUND") && text.contains(name),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_users_through_the_balancer_each_keep_to_their_own() {
    let issuer = Issuer::start().await;
    let port = free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    let cluster = Cluster::start_at(
        port,
        3,
        "",
        &[
            ("SMOL_MCP_AUTH_ISSUER", &issuer.url),
            ("SMOL_MCP_AUTH_SCOPES", SCOPE),
            ("SMOL_MCP_AUTH_RESOURCE", &resource),
        ],
    )
    .await;
    let url = cluster.url();
    assert_eq!(url, resource);
    let alice = issuer.token("alice", &resource, SCOPE).await;
    let bob = issuer.token("bob", &resource, SCOPE).await;

    // Alice, through whichever processes the balancer picks: a machine, a run, a job.
    let made = call(&url, &alice, "create-machine", json!({"name": "alice-box"})).await;
    assert_eq!(made["result"]["isError"], false, "{made}");
    let ran = call(
        &url,
        &alice,
        "run-command",
        json!({"name": "alice-box", "command": "echo alice-ran"}),
    )
    .await;
    assert_eq!(
        ran["result"]["structuredContent"]["stdout"], "alice-ran\n",
        "{ran}"
    );
    let job = call(
        &url,
        &alice,
        "run-command",
        json!({"name": "alice-box", "command": "sleep 60", "background": true}),
    )
    .await;
    let job_id = job["result"]["structuredContent"]["job"]
        .as_str()
        .unwrap()
        .to_owned();

    // Three of each of bob's attempts, so that each process answers one: all as not found.
    for _ in 0..3 {
        let listed = call(&url, &bob, "list-machines", json!({})).await;
        assert_eq!(
            listed["result"]["structuredContent"]["machines"],
            json!([]),
            "{listed}"
        );
        refused_as_missing(
            &call(
                &url,
                &bob,
                "run-command",
                json!({"name": "alice-box", "command": "echo bob"}),
            )
            .await,
            "alice-box",
        );
        refused_as_missing(
            &call(&url, &bob, "delete-machine", json!({"name": "alice-box"})).await,
            "alice-box",
        );
        refused_as_missing(
            &call(&url, &bob, "cancel-job", json!({"job": job_id})).await,
            &job_id,
        );
        let jobs = call(&url, &bob, "job-output", json!({})).await;
        assert_eq!(
            jobs["result"]["structuredContent"]["jobs"],
            json!([]),
            "{jobs}"
        );
        let runs = stateless_request_to(
            &url,
            &bob,
            "resources/read",
            json!({}),
            json!({"uri": "smol://runs"}),
        )
        .await;
        let text = runs["result"]["contents"][0]["text"].as_str().unwrap();
        assert!(!text.contains("alice-ran"), "bob sees alice's run: {text}");
    }
    assert!(cluster.fake.has_machine("alice-box"));

    // Alice meanwhile, on every process: her machine, her job running, her run.
    for _ in 0..3 {
        let listed = call(&url, &alice, "list-machines", json!({})).await;
        assert_eq!(
            listed["result"]["structuredContent"]["machines"][0]["name"], "alice-box",
            "{listed}"
        );
        let report = call(&url, &alice, "job-output", json!({"job": job_id})).await;
        assert_eq!(
            report["result"]["structuredContent"]["state"], "running",
            "{report}"
        );
        let runs = stateless_request_to(
            &url,
            &alice,
            "resources/read",
            json!({}),
            json!({"uri": "smol://runs"}),
        )
        .await;
        assert!(
            runs["result"]["contents"][0]["text"]
                .as_str()
                .unwrap()
                .contains("alice-ran")
        );
    }

    // A requestState the server sealed for alice's call does not open for bob, who echoes it
    // with the same tool and arguments.
    let asking = json!({"elicitation": {"form": {}}});
    let made = stateless_request_to(
        &url,
        &alice,
        "tools/call",
        asking.clone(),
        json!({"name": "create-machine", "arguments": {"name": "alice-asks", "network": "ask"}}),
    )
    .await;
    assert_eq!(made["result"]["isError"], false, "{made}");
    cluster
        .fake
        .deny_on_exec("alice-asks", "resolve", "pypi.org");
    let run =
        json!({"name": "run-command", "arguments": {"name": "alice-asks", "command": "exit 7"}});
    let asked = stateless_request_to(&url, &alice, "tools/call", asking.clone(), run.clone()).await;
    assert_eq!(asked["result"]["resultType"], "input_required", "{asked}");
    let mut echoed = run.clone();
    echoed["requestState"] = asked["result"]["requestState"].clone();
    echoed["inputResponses"] = json!({"egress": {"action": "accept", "content": {"allow0": true}}});
    let refused =
        stateless_request_to(&url, &bob, "tools/call", asking.clone(), echoed.clone()).await;
    crate::common::assert_invalid_params(&refused, "requestState is not the one");

    // Alice answers her own question (through whichever process): pypi.org is hers to carry
    // to a later machine, not bob's.
    cluster.fake.state.lock().unwrap().denials_on_exec.clear();
    let answered = stateless_request_to(&url, &alice, "tools/call", asking, echoed).await;
    assert_eq!(
        answered["result"]["structuredContent"]["exitCode"], 7,
        "{answered}"
    );
    let theirs = call(
        &url,
        &bob,
        "create-machine",
        json!({"name": "bob-learns", "allowHostsFrom": "alice-asks"}),
    )
    .await;
    assert_eq!(theirs["result"]["isError"], true, "{theirs}");
    assert!(
        theirs["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("allowed"),
        "{theirs}"
    );
    assert!(!cluster.fake.has_machine("bob-learns"));
    let hers = call(
        &url,
        &alice,
        "create-machine",
        json!({"name": "alice-learns", "allowHostsFrom": "alice-asks"}),
    )
    .await;
    assert_eq!(hers["result"]["isError"], false, "{hers}");
    assert!(hers.to_string().contains("pypi.org"), "{hers}");

    // Her own clean-up, through the balancer; nothing of hers was touched by bob.
    call(&url, &alice, "cancel-job", json!({"job": job_id})).await;
    for name in ["alice-box", "alice-asks", "alice-learns"] {
        let gone = call(&url, &alice, "delete-machine", json!({"name": name})).await;
        assert_eq!(gone["result"]["isError"], false, "{gone}");
    }
    assert!(cluster.fake.has_no_machines());
}
