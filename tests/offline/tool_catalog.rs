//! The tool catalog as a client sees it (tools/list): names, descriptions, schemas, annotations.
//! Any change to what the model is shown shows up as a snapshot diff.

use crate::common::mcp::Harness;
use serde_json::Value;

/// What an operator sets up to offer everything: host directories (mountAllow) and a
/// credential binding. The catalog's snapshots and bounds are of this, its fullest form.
const SET_UP: [(&str, &str); 2] = [
    ("SMOL_MCP_MOUNT_ALLOW", "/srv/projects"),
    (
        "SMOL_MCP_CREDENTIALS",
        r#"[{"name": "github", "env": "GH_TOKEN", "hosts": ["api.github.com"], "fromEnv": "SMOL_TEST_CATALOG_GH"}]"#,
    ),
];

/// The catalog of a server set up as `SET_UP` and `env` say.
async fn catalog(env: &[(&str, &str)]) -> Value {
    let mut all = SET_UP.to_vec();
    all.extend_from_slice(env);
    bare_catalog(&all).await
}

/// The catalog of a server set up by `env` alone.
async fn bare_catalog(env: &[(&str, &str)]) -> Value {
    let h = Harness::start(env).await;
    let tools = h.client.list_all_tools().await.unwrap();
    serde_json::to_value(tools).unwrap()
}

/// The catalog a client that shows views (MCP Apps) is listed: view-state, and each tool's link
/// to its view (`tests/offline/apps.rs` checks it is what such a client gets).
async fn with_views(env: &[(&str, &str)]) -> Value {
    let mut all = SET_UP.to_vec();
    all.extend_from_slice(env);
    let h = Harness::start(&all).await;
    let offers = smol_mcp::policy::tools::schema::Offers::of(h.protocol.config()).with_views(true);
    let catalog = smol_mcp::policy::tools::Catalog::offered(h.protocol.mode(), offers);
    serde_json::to_value(&catalog.listed).unwrap()
}

fn properties(tools: &Value, tool: &str) -> Vec<String> {
    let tool = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == tool)
        .unwrap_or_else(|| panic!("{tool} is listed"));
    tool["inputSchema"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

fn listed(tools: &Value) -> Vec<String> {
    tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

/// An argument or a tool the operator's settings cannot let work is not offered: without
/// mountAllow no mounts, workspace, read-file changes or keep-changes; without credentials no
/// credentials. Each comes with its setting. A call naming one all the same is refused saying
/// which setting would allow it, and the instructions say once what is not set up.
#[tokio::test]
async fn what_the_settings_cannot_let_work_is_not_offered() {
    let local = ("SMOL_MCP_TARGETS", "local");
    let bare = bare_catalog(&[local]).await;
    assert!(!listed(&bare).contains(&"keep-changes".to_owned()));
    for (tool, absent) in [
        (
            "create-machine",
            &["workspace", "mounts", "credentials"][..],
        ),
        ("run-once", &["workspace", "credentials"][..]),
        ("read-file", &["changes"][..]),
    ] {
        let offered = properties(&bare, tool);
        for arg in absent {
            assert!(
                !offered.contains(&arg.to_string()),
                "{tool}.{arg} offered: {offered:?}"
            );
        }
    }
    let text = bare.to_string();
    assert!(
        !text.contains("workspace's diff") && !text.contains("{dirs:"),
        "{text}"
    );

    let dirs = bare_catalog(&[local, ("SMOL_MCP_MOUNT_ALLOW", "/srv/projects")]).await;
    assert!(listed(&dirs).contains(&"keep-changes".to_owned()));
    let create = properties(&dirs, "create-machine");
    assert!(create.contains(&"workspace".to_owned()) && create.contains(&"mounts".to_owned()));
    assert!(!create.contains(&"credentials".to_owned()), "{create:?}");
    assert!(properties(&dirs, "read-file").contains(&"changes".to_owned()));
    assert!(
        properties(&catalog(&[local]).await, "create-machine").contains(&"credentials".to_owned())
    );

    let size = |tools: &Value| {
        serde_json::to_string(&serde_json::json!({ "tools": tools }))
            .unwrap()
            .len()
    };
    let (bare_bytes, full_bytes) = (size(&bare), size(&catalog(&[local]).await));
    println!("local catalog: {bare_bytes} bytes bare, {full_bytes} set up");
    assert!(
        full_bytes - bare_bytes > 1_500,
        "{bare_bytes} against {full_bytes}"
    );

    // Named all the same: refused with the setting, not as an unknown argument.
    let h = Harness::start(&[local]).await;
    let refused = h
        .err(
            "create-machine",
            serde_json::json!({"workspace": "/srv/projects/app"}),
        )
        .await;
    assert!(refused.contains("mountAllow"), "{refused}");
    // `minimum: 0` is not listed, but a negative count is still refused by name.
    let negative = h
        .err(
            "read-file",
            serde_json::json!({"name": "m", "path": "/a", "offset": -1}),
        )
        .await;
    assert!(negative.contains("offset"), "{negative}");
    let info = h.client.peer_info().unwrap();
    let instructions = info.instructions.clone().unwrap_or_default();
    assert!(
        instructions.contains("Not set up on this server") && instructions.contains("mountAllow"),
        "{instructions}"
    );
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
            "create-machine",
            "start-machine",
            "stop-machine",
            "delete-machine",
            "run-command",
            "job-output",
            "cancel-job",
            "run-once",
            "read-file",
            "write-file",
            "branch-machine",
            "keep-changes",
            "machine-logs",
            "publish-port",
            "terminal",
            "pull-image"
        ]
    );
    for tool in tools.as_array().unwrap() {
        let name = tool["name"].as_str().unwrap();
        assert!(
            tool["description"].as_str().unwrap().len() > 80,
            "{name} needs a real description"
        );
        // What a client reads, with the spec's defaults for hints left out, is the tool
        // table's.
        let annotations = &tool["annotations"];
        let hint = |key: &str, default: bool| annotations[key].as_bool().unwrap_or(default);
        let table = smol_mcp::policy::tools::Tool::from_name(name)
            .unwrap()
            .hints();
        assert_eq!(hint("readOnlyHint", false), table.read_only, "{name}");
        assert_eq!(hint("openWorldHint", true), table.open_world, "{name}");
        if !table.read_only {
            assert_eq!(hint("destructiveHint", true), table.destructive, "{name}");
            assert_eq!(hint("idempotentHint", false), table.idempotent, "{name}");
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
        // Unknown arguments are refused by name (tests/offline/tools_local.rs), not announced by a
        // schema keyword in every tool (see `schema::definition`).
        assert!(
            tool["inputSchema"].get("additionalProperties").is_none(),
            "{name}"
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

/// What `tools/list` costs an agent on every turn: the whole catalog of one fleet within 20 KB
/// (about 5,000 tokens) as a server starts with no settings, printed so a change shows its cost.
/// The figure is the compact JSON of the result, as it travels. The ceiling was 18,000 for the
/// 16 tools of 2026-12-03 (17,979); the issues that add pause, ports, terminals, images and the
/// workspace set 20,000 for all of them together, so each spends from the same 2 KB. The
/// ceiling holds as a server starts and with everything the operator can turn on (host
/// directories, credentials: mounts, workspaces and their changes, keep-changes, credentials),
/// whose arguments are offered only where they can work, and for a client that shows views
/// (MCP Apps: `_meta` on a tool is listed with it, and view-state is a tool all the same).
#[tokio::test]
async fn a_single_fleet_catalog_is_affordable() {
    const CEILING_BYTES: usize = 20_000;
    for (fleet, env) in [
        ("local", vec![("SMOL_MCP_TARGETS", "local")]),
        (
            "cloud",
            vec![
                ("SMOL_MCP_TARGETS", "cloud"),
                ("SMOL_CLOUD_TOKEN", "smk_catalog_only"),
            ],
        ),
    ] {
        for (how, tools) in [
            ("as started", bare_catalog(&env).await),
            ("set up", catalog(&env).await),
            (
                "set up, for a client that shows views",
                with_views(&env).await,
            ),
        ] {
            let bytes = serde_json::to_string(&serde_json::json!({ "tools": tools }))
                .unwrap()
                .len();
            // About four bytes a token for English and JSON (the usual rule of thumb for
            // BPE tokenizers).
            println!(
                "{fleet} catalog {how}: {bytes} bytes, about {} tokens",
                bytes / 4
            );
            assert!(
                bytes <= CEILING_BYTES,
                "the {fleet} catalog {how} is {bytes} bytes, over its {CEILING_BYTES}-byte ceiling"
            );
        }
    }
}

/// Every string a model reads in the catalog: descriptions, titles, schema descriptions.
fn texts(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                if matches!(key.as_str(), "description" | "title")
                    && let Value::String(text) = v
                {
                    out.push(text.clone());
                }
                texts(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| texts(v, out)),
        _ => {}
    }
}

/// A single-fleet catalog never spends the model's context on the fleet it does not serve, and
/// no text names an operator setting the agent can neither see nor set.
#[tokio::test]
async fn a_single_fleet_catalog_speaks_only_of_its_fleet() {
    let local = catalog(&[("SMOL_MCP_TARGETS", "local")]).await;
    let cloud = catalog(&[
        ("SMOL_MCP_TARGETS", "cloud"),
        ("SMOL_CLOUD_TOKEN", "smk_catalog_only"),
    ])
    .await;
    let both = catalog(&[
        ("SMOL_MCP_TARGETS", "both"),
        ("SMOL_CLOUD_TOKEN", "smk_catalog_only"),
    ])
    .await;
    let text_of = |tools: &Value| {
        let mut all = Vec::new();
        texts(tools, &mut all);
        all.join("\n").to_lowercase()
    };
    let (local_text, cloud_text, both_text) = (text_of(&local), text_of(&cloud), text_of(&both));
    for word in ["cloud", "mach-", "bill", "money", "dollar", "ingress"] {
        assert!(
            !local_text.contains(word),
            "the local catalog says {word:?}"
        );
        assert!(
            both_text.contains(word),
            "the both-fleets catalog lost {word:?}"
        );
    }
    for word in ["local", "bundled alpine", "mount", "engine"] {
        assert!(
            !cloud_text.contains(word),
            "the cloud catalog says {word:?}"
        );
        assert!(
            both_text.contains(word),
            "the both-fleets catalog lost {word:?}"
        );
    }
    // Arguments that exist on one fleet only are not offered on the other.
    let create = |tools: &Value| {
        tools
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "create-machine")
            .unwrap()["inputSchema"]["properties"]
            .clone()
    };
    assert!(create(&local).get("mounts").is_some());
    assert!(create(&cloud).get("mounts").is_none());
    assert!(create(&cloud).get("overlayGb").is_none());
    // Settings are the operator's: naming one tells the agent nothing it can act on. A key that
    // is also a tool argument (cpus, memoryMb) is the argument.
    let arguments: Vec<String> = both
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| {
            t["inputSchema"]["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect::<Vec<_>>()
        })
        .collect();
    for setting in smol_mcp::process::config::SETTINGS {
        if arguments.iter().any(|a| a == setting.key) {
            continue;
        }
        for (fleet, text) in [
            ("local", &local_text),
            ("cloud", &cloud_text),
            ("both", &both_text),
        ] {
            assert!(
                !text.contains(&setting.key.to_lowercase())
                    && !text.contains(&setting.env.to_lowercase()),
                "the {fleet} catalog names the operator setting {}",
                setting.key
            );
        }
    }
}

/// A description is read by a model choosing a tool on every turn: within 90 words, on one
/// line (a raw line break from a doc comment is noise in a schema).
#[tokio::test]
async fn descriptions_are_short_and_on_one_line() {
    for env in [
        vec![("SMOL_MCP_TARGETS", "local")],
        vec![
            ("SMOL_MCP_TARGETS", "both"),
            ("SMOL_CLOUD_TOKEN", "smk_catalog_only"),
        ],
    ] {
        let tools = catalog(&env).await;
        for tool in tools.as_array().unwrap() {
            let name = tool["name"].as_str().unwrap();
            let words = tool["description"]
                .as_str()
                .unwrap()
                .split_whitespace()
                .count();
            assert!(words <= 90, "{name}'s description is {words} words");
            let mut all = Vec::new();
            texts(tool, &mut all);
            for text in all {
                assert!(!text.contains('\n'), "{name} has a line break in {text:?}");
                assert!(
                    !["{local:", "{cloud:", "{dirs:", "{creds:"]
                        .iter()
                        .any(|marker| text.contains(marker)),
                    "{name}: a marker left in {text:?}"
                );
            }
        }
    }
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
    let expected: Vec<String> = smol_mcp::process::config::SETTINGS
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
    for tool in smol_mcp::policy::tools::Tool::ALL {
        assert!(
            readme.contains(&format!("| `{}` |", tool.name())),
            "README lacks {}",
            tool.name()
        );
    }
}

/// What a model needs to choose well and that the schema cannot say: the operator's own
/// timeouts, a choice one tool refuses not offered there, and which tools start a stopped (or
/// resume a paused) machine before they act.
#[tokio::test]
async fn descriptions_say_the_operators_bounds_and_what_a_call_starts() {
    let tools = catalog(&[
        ("SMOL_MCP_TARGETS", "local"),
        ("SMOL_MCP_EXEC_TIMEOUT_SECS", "60"),
        ("SMOL_MCP_MAX_EXEC_TIMEOUT_SECS", "300"),
        ("SMOL_MCP_MAX_JOB_SECS", "1800"),
    ])
    .await;
    let tool = |name: &str| {
        tools
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap()
            .clone()
    };
    let run = tool("run-command");
    let props = &run["inputSchema"]["properties"];
    assert_eq!(
        props["timeoutSecs"]["description"],
        "Seconds until killed (exit 124): default 60, most 300."
    );
    assert!(
        props["background"]["description"]
            .as_str()
            .unwrap()
            .contains("default and most 1800"),
        "{}",
        props["background"]
    );
    assert!(run["description"].as_str().unwrap().contains("terminal"));
    // run-once refuses "ask" (its machine is gone before anyone could answer): not offered.
    assert_eq!(
        tool("run-once")["inputSchema"]["properties"]["network"]["enum"],
        serde_json::json!(["open", "blocked"])
    );
    assert_eq!(
        tool("create-machine")["inputSchema"]["properties"]["network"]["enum"],
        serde_json::json!(["open", "blocked", "ask"])
    );
    for name in [
        "run-command",
        "read-file",
        "write-file",
        "publish-port",
        "terminal",
    ] {
        let text = tool(name)["description"].as_str().unwrap().to_owned();
        assert!(
            text.contains("Starts it if stopped or paused"),
            "{name}: {text}"
        );
    }
    let start = tool("start-machine")["description"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(start.contains("a paused one resumes as it was"), "{start}");
}
