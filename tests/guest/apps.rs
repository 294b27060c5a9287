//! The MCP Apps views in a real browser: Debian's Chromium, driven by playwright-core, shows
//! them through a host page built on the extension's own host side (ext-apps' AppBridge), whose
//! MCP client (the official TypeScript SDK) talks to the real `smol-mcp` over stdio, on a
//! machine of the nested engine (`tests/clients/apps_host.mjs`). The screenshots are kept in
//! target/apps-screens/ (docs/views/ has one of each, taken from such a run).

use crate::booted_guest::{HostServer, READY_SECS};
use crate::common::nested::{nested, serial};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

const CHROMIUM: &str = "/usr/bin/chromium";

#[tokio::test]
async fn the_views_show_machines_egress_questions_and_terminals_in_a_real_browser() {
    let _one_at_a_time = serial().await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let host_page = root.join("target/apps-host/host.js");
    let built = tokio::process::Command::new("node")
        .arg(root.join("scripts/views/build.mjs"))
        .arg("--host")
        .arg(&host_page)
        .output()
        .await
        .unwrap();
    assert!(built.status.success(), "the host page: {built:?}");
    let port = crate::common::real_serve::free_port();
    let host = HostServer::start(port, None).await;
    let rt = tempfile::tempdir().unwrap();
    let url = nested().url;
    let publish_port = nested().publish_ports[1];
    let range = format!("{publish_port}-{publish_port}");
    let env = crate::common::stdio::server_env(
        rt.path(),
        &[
            ("SMOL_LOCAL_URL", url.as_str()),
            ("SMOL_MCP_PUBLISH_PORTS", range.as_str()),
            ("SMOL_MCP_READY_TIMEOUT_SECS", READY_SECS),
        ],
    );
    let shots = root.join("target/apps-screens");
    let machine = format!("apps-{}", std::process::id());
    let plan = json!({
        "server": crate::common::stdio::SERVER,
        "env": crate::common::clients::env_object(env),
        "hostPage": host_page,
        "chromium": CHROMIUM,
        "shots": shots,
        "hostPort": port,
        "machine": machine,
    });
    let report = crate::common::clients::run_client_for(
        "node",
        "apps_host.mjs",
        &plan,
        Duration::from_secs(1200),
    )
    .await;
    println!("apps_host: {report:#}");
    assert_eq!(report["problems"], json!([]), "{report:#}");
    assert_eq!(report["serverDeclares"], true, "{report:#}");
    assert_eq!(
        report["tools"]["views"],
        json!({
            "list-machines": "ui://smol-mcp/machines",
            "run-command": "ui://smol-mcp/egress",
            "terminal": "ui://smol-mcp/terminal",
        })
    );
    // The machines view: the machine running, its published port's page opened from it.
    let row = report["machinesRow"].as_str().unwrap();
    assert!(row.contains(&machine) && row.contains("running"), "{row}");
    let (terminal, job) = (
        report["terminal"].as_str().unwrap(),
        report["job"].as_str().unwrap(),
    );
    assert!(
        row.contains(terminal) && row.contains(job) && row.contains("sleep 900"),
        "{row}"
    );
    assert_eq!(report["openedText"], "hello from the guest", "{report:#}");
    assert_eq!(report["openedLinks"], json!([report["published"]]));
    // The egress view: the question the command asked, answered by the click, and that answer
    // in the asking call's result; the machine then reaches the host.
    let question = report["question"].as_str().unwrap();
    assert!(
        question.contains("10.0.2.2") && question.contains(&machine),
        "{question}"
    );
    assert_eq!(
        report["askedAnswer"],
        json!({"allowed": ["10.0.2.2"], "declined": []}),
        "{report:#}"
    );
    assert_eq!(report["afterYes"]["exitCode"], 0, "{report:#}");
    assert_eq!(report["afterYes"]["stdout"], "hello from the host\n");
    assert!(host.events().iter().any(|e| e["path"] == "/after-yes"));
    // The terminal view: the agent's command's output, then the person's typing, which the
    // agent reads as its own input's echo and output.
    let screen = report["screenText"].as_str().unwrap();
    assert!(screen.lines().any(|l| l.trim() == "agent-42"), "{screen}");
    assert!(screen.lines().any(|l| l.trim() == "person-42"), "{screen}");
    let read = report["agentReads"].as_str().unwrap();
    assert!(
        read.contains("echo person-$((7*6))") && read.contains("person-42"),
        "{read}"
    );
    // Every view call went through view-state; nothing reached any other origin.
    let calls: Vec<&str> = report["viewCalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c.as_str())
        .collect();
    for view in ["machines", "egress", "terminal"] {
        assert!(
            calls.contains(&format!("{view}:view-state").as_str()),
            "{calls:?}"
        );
    }
    assert_eq!(report["foreignRequests"], json!([]), "{report:#}");
    assert_eq!(report["consoleErrors"], json!([]), "{report:#}");
    for view in ["machines", "egress", "terminal"] {
        let shot = shots.join(format!("{view}.png"));
        let bytes = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
        assert!(bytes > 4096, "{} is {bytes} bytes", shot.display());
    }
}
