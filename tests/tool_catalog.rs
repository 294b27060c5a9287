//! The tool catalog as a client sees it (tools/list): names, descriptions, schemas, annotations.
//! Any change to what the model is shown shows up as a snapshot diff.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::mcp::Harness;
use serde_json::Value;

async fn catalog(env: &[(&str, &str)]) -> Value {
    let h = Harness::start(env).await;
    let tools = h.client.list_all_tools().await.unwrap();
    serde_json::to_value(tools).unwrap()
}

#[tokio::test]
async fn local_only_catalog() {
    let tools = catalog(&[("SMOL_MCP_TARGETS", "local")]).await;
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "list-machines",
            "get-machine",
            "create-machine",
            "start-machine",
            "stop-machine",
            "delete-machine",
            "run-command",
            "job-output",
            "cancel-job",
            "list-jobs",
            "run-once",
            "read-file",
            "write-file",
            "branch-machine",
            "machine-logs",
            "pull-image"
        ]
    );
    for tool in tools.as_array().unwrap() {
        let name = tool["name"].as_str().unwrap();
        assert!(
            tool["description"].as_str().unwrap().len() > 80,
            "{name} needs a real description"
        );
        let annotations = &tool["annotations"];
        for hint in [
            "readOnlyHint",
            "destructiveHint",
            "idempotentHint",
            "openWorldHint",
        ] {
            assert!(annotations[hint].is_boolean(), "{name} lacks {hint}");
        }
        assert!(tool["outputSchema"].is_object(), "{name}");
        for (arg, schema) in tool["inputSchema"]["properties"].as_object().unwrap() {
            assert!(
                schema["description"]
                    .as_str()
                    .is_some_and(|d| !d.is_empty()),
                "{name}.{arg} has no description"
            );
        }
        assert_eq!(
            tool["inputSchema"]["additionalProperties"], false,
            "{name} refuses unknown arguments"
        );
    }
    insta::assert_json_snapshot!("catalog_local", tools);
}

#[tokio::test]
async fn both_fleets_catalog_requires_target() {
    let tools = catalog(&[
        ("SMOL_MCP_TARGETS", "both"),
        ("SMOL_CLOUD_TOKEN", "smk_catalog_only"),
    ])
    .await;
    for tool in tools.as_array().unwrap() {
        assert_eq!(
            tool["inputSchema"]["required"][0], "target",
            "{}",
            tool["name"]
        );
        assert_eq!(
            tool["inputSchema"]["properties"]["target"]["enum"],
            serde_json::json!(["local", "cloud"])
        );
    }
    insta::assert_json_snapshot!("catalog_both", tools);
}

/// The README's configuration table is the settings list, row for row: key, environment
/// variable, default, what is accepted and why.
#[test]
fn the_readme_documents_every_configuration_key() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split("\n## Configuration\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("README has a Configuration section");
    let rows: Vec<&str> = section
        .lines()
        .filter(|line| line.starts_with("| `"))
        .collect();
    let expected: Vec<String> = smol_mcp::config::SETTINGS
        .iter()
        .map(|s| s.readme_row())
        .collect();
    assert!(
        section.contains("| key | environment | default | accepted | why this default |"),
        "the table's header changed"
    );
    assert_eq!(
        rows,
        expected,
        "README's configuration table disagrees with config::SETTINGS; the rows should be:\n{}",
        expected.join("\n")
    );
    for tool in smol_mcp::tools::Tool::ALL {
        assert!(
            readme.contains(&format!("| `{}` |", tool.name())),
            "README lacks {}",
            tool.name()
        );
    }
}
