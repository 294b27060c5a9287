//! The workflows as skills (SEP-2640) through the official Python MCP client on both lifecycles:
//! the session's (`initialize`, over stdio) and 2026-07-28's (each request on its own, over HTTP).
//! No pinned client has skills helpers (mcp 2.3.0 and the TypeScript SDK 1.32.2 have none), so
//! skills/list and skills/get go through the Python client's generic request, and each skill's
//! file through its own resources/read and resources/list (tests/clients/skills_py.py).

use crate::common::clients::{HttpServer, env_object, run_python};
use crate::common::stdio::{SERVER, server_env};
use serde_json::{Value, json};

const TOKEN: &str = "skills-token";

/// What the settings of `server_env` offer: everything but what needs a host directory or a
/// bound secret.
const OFFERED_BARE: &[&str] = &[
    "set-up-once-fork-many",
    "fan-out-compare-keep",
    "egress-the-user-widens",
    "long-jobs-and-tasks",
    "terminals-and-services",
];

fn check(report: &Value, offered: &[&str]) {
    assert_eq!(
        report["extension"],
        json!({}),
        "the capabilities declare the extension: {report}"
    );
    assert_eq!(report["instructionsPointAtSkills"], true, "{report}");
    let listed: Vec<&str> = report["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(listed, offered, "{report}");
    for skill in report["skills"].as_array().unwrap() {
        let uri = skill["uri"].as_str().unwrap();
        assert_eq!(
            uri,
            format!("skill://{}/SKILL.md", skill["name"].as_str().unwrap())
        );
        for fact in [
            "getMatchesList",
            "digestMatches",
            "sizeMatches",
            "inResourcesList",
            "startsWithFrontmatter",
        ] {
            assert_eq!(skill[fact], true, "{uri}: {fact}: {skill}");
        }
        assert_eq!(skill["mimeType"], "text/markdown", "{skill}");
        assert_eq!(skill["resourceMimeType"], "text/markdown", "{skill}");
    }
    // The extension's answer for a skill that is not there: invalid params, naming those that are.
    let unknown = &report["unknown"];
    assert_eq!(unknown["code"], -32602, "{report}");
    let message = unknown["message"].as_str().unwrap();
    assert!(
        message.contains("skill://no-such-skill/SKILL.md")
            && message.contains("skill://long-jobs-and-tasks/SKILL.md"),
        "{message}"
    );
}

#[tokio::test]
async fn the_python_client_reads_every_skill_on_the_session_lifecycle_over_stdio() {
    let rt = tempfile::tempdir().unwrap();
    let env = server_env(rt.path(), &[]);
    let plan = json!({"server": SERVER, "env": env_object(env), "mode": "legacy"});
    let report = run_python("skills_py.py", &plan).await;
    assert_ne!(report["protocol"], "2026-07-28", "{report}");
    check(&report, OFFERED_BARE);
    // What the settings cannot let work is not offered, and a request for it says which setting.
    let not_offered = &report["notOffered"];
    assert_eq!(not_offered["code"], -32602, "{report}");
    assert!(
        not_offered["message"]
            .as_str()
            .unwrap()
            .contains("mountAllow"),
        "{report}"
    );
}

#[tokio::test]
async fn the_python_client_reads_every_skill_on_the_2026_07_28_lifecycle_over_http() {
    let rt = tempfile::tempdir().unwrap();
    let projects = tempfile::tempdir().unwrap();
    let allow = projects.path().display().to_string();
    let server = HttpServer::spawn(rt.path(), TOKEN, &[("SMOL_MCP_MOUNT_ALLOW", &allow)]).await;
    let plan = json!({"url": server.url, "token": TOKEN, "mode": "auto"});
    let report = run_python("skills_py.py", &plan).await;
    assert_eq!(report["protocol"], "2026-07-28", "{report}");
    // A host directory open: the user's project in is offered, after set-up-once-fork-many.
    let mut offered = OFFERED_BARE.to_vec();
    offered.insert(1, "workspace-in");
    check(&report, &offered);
    assert_eq!(
        report["notOffered"],
        Value::Null,
        "workspace-in is offered now: {report}"
    );
}
