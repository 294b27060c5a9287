//! The skills (src/protocol/skills/) against what they name: every tool, argument, result field
//! and setting a skill writes in backticks exists in the catalog of a fully set-up server (or in
//! the settings), every example call's arguments are that tool's, every resource URI is one the
//! server serves; and each skill is valid for the extension (rmcp's own check), named by its
//! folder, and within its size bound. A skill that drifts from the tools fails here.

use crate::common::mcp::Harness;
use serde_json::Value;
use smol_mcp::process::config::SETTINGS;
use smol_mcp::protocol::skills;
use std::collections::{BTreeMap, BTreeSet};

/// A server set up to offer everything (the catalog's fullest form, as in tool_catalog.rs).
const SET_UP: [(&str, &str); 2] = [
    ("SMOL_MCP_MOUNT_ALLOW", "/srv/projects"),
    (
        "SMOL_MCP_CREDENTIALS",
        r#"[{"name": "github", "env": "GH_TOKEN", "hosts": ["api.github.com"], "fromEnv": "SMOL_TEST_CATALOG_GH"}]"#,
    ),
];

/// Words a skill may put in backticks that are values, not names: job states, the network
/// value, a shell, a directory.
const VALUES: &[&str] = &[
    "running",
    "exited",
    "cancelled",
    "lost",
    "ask",
    "sh",
    "target",
];

/// Every property name anywhere in a schema (nested objects, arrays, oneOf branches).
fn collect_properties(schema: &Value, into: &mut BTreeSet<String>) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Object(props)) = map.get("properties") {
                into.extend(props.keys().cloned());
            }
            map.values().for_each(|v| collect_properties(v, into));
        }
        Value::Array(items) => items.iter().for_each(|v| collect_properties(v, into)),
        _ => {}
    }
}

fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// What a skill names that does not exist, as (span, why).
fn unknown_names(
    text: &str,
    inputs: &BTreeMap<String, BTreeSet<String>>,
    fields: &BTreeSet<String>,
) -> Vec<(String, String)> {
    let keys: BTreeSet<&str> = SETTINGS.iter().map(|s| s.key).collect();
    let envs: BTreeSet<&str> = SETTINGS.iter().map(|s| s.env).collect();
    let skill_names: Vec<&str> = skills::all_texts().iter().map(|(n, _)| *n).collect();
    let is_kebab = |s: &str| {
        s.contains('-')
            && !s.starts_with('-')
            && !s.ends_with('-')
            && s.chars().all(|c| c.is_ascii_lowercase() || c == '-')
    };
    let is_camel = |s: &str| {
        s.starts_with(|c: char| c.is_ascii_lowercase())
            && s.chars().any(|c| c.is_ascii_uppercase())
            && s.chars().all(|c| c.is_ascii_alphanumeric())
    };
    let mut bad = Vec::new();
    let mut refuse = |span: &str, why: String| bad.push((span.to_owned(), why));
    for span in backticked(text) {
        if let Some((head, rest)) = span.split_once(' ')
            && rest.starts_with('{')
        {
            match (inputs.get(head), serde_json::from_str::<Value>(rest)) {
                (None, _) => refuse(span, format!("no tool {head}")),
                (Some(_), Err(e)) => refuse(span, format!("the arguments are not JSON: {e}")),
                (Some(args), Ok(Value::Object(given))) => {
                    for key in given.keys().filter(|k| !args.contains(*k)) {
                        refuse(span, format!("{head} takes no argument {key}"));
                    }
                }
                (Some(_), Ok(other)) => {
                    refuse(span, format!("arguments are an object, not {other}"))
                }
            }
        } else if span.starts_with('"') {
            match serde_json::from_str::<Value>(&format!("{{{span}}}")) {
                Ok(Value::Object(given)) => {
                    for key in given.keys().filter(|k| !fields.contains(*k)) {
                        refuse(span, format!("no tool has an argument or field {key}"));
                    }
                }
                _ => refuse(span, "a quoted fragment is one JSON member".into()),
            }
        } else if let Some(rest) = span.strip_prefix("skill://") {
            let name = rest.strip_suffix("/SKILL.md").unwrap_or(rest);
            if !skill_names.contains(&name) {
                refuse(span, "no such skill".into());
            }
        } else if let Some(rest) = span.strip_prefix("smol://") {
            if !(rest == "targets" || rest == "runs" || rest.starts_with("machine/")) {
                refuse(span, "not a resource this server serves".into());
            }
        } else if let Some((head, _)) = span.split_once('.')
            && is_camel(head)
            && !span.contains(' ')
        {
            // A field inside a result field (`egressAnswer.allowed`): the outer one is checked;
            // the output schemas do not spell out what is inside every field.
            if !fields.contains(head) {
                refuse(span, format!("no tool has a result field {head}"));
            }
        } else if span.starts_with("SMOL_MCP_") {
            if !envs.contains(span) {
                refuse(span, "no setting has this variable".into());
            }
        } else if is_kebab(span) {
            if !inputs.contains_key(span) && !skill_names.contains(&span) {
                refuse(span, "no tool (or skill) of this name".into());
            }
        } else if (is_camel(span)
            || (!span.is_empty() && span.chars().all(|c| c.is_ascii_lowercase())))
            && !fields.contains(span)
            && !keys.contains(span)
            && !VALUES.contains(&span)
        {
            refuse(
                span,
                "no tool argument, result field or setting of this name".into(),
            );
        }
    }
    bad
}

#[tokio::test]
async fn every_tool_argument_field_and_setting_a_skill_names_exists() {
    let h = Harness::start(&SET_UP).await;
    let tools = serde_json::to_value(h.client.list_all_tools().await.unwrap()).unwrap();
    let mut inputs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut fields = BTreeSet::new();
    for tool in tools.as_array().unwrap() {
        let mut args = BTreeSet::new();
        collect_properties(&tool["inputSchema"], &mut args);
        collect_properties(&tool["outputSchema"], &mut fields);
        fields.extend(args.iter().cloned());
        inputs.insert(tool["name"].as_str().unwrap().to_owned(), args);
    }
    let mut bad = Vec::new();
    for (name, text) in skills::all_texts() {
        bad.extend(
            unknown_names(text, &inputs, &fields)
                .into_iter()
                .map(|(span, why)| format!("{name}: `{span}`: {why}")),
        );
    }
    assert!(
        bad.is_empty(),
        "skills name what does not exist:\n{}",
        bad.join("\n")
    );

    // The check itself catches drift: a renamed tool, a dropped argument, a made-up field.
    for wrong in [
        "`branch-machines`",
        "`branch-machine {\"name\": \"a\", \"freeze\": true}`",
        "`startedMachines`",
        "`SMOL_MCP_NO_SUCH`",
        "`skill://no-such/SKILL.md`",
        "`\"netwrk\": \"open\"`",
        "`egressAnswr.allowed`",
    ] {
        assert_eq!(
            unknown_names(wrong, &inputs, &fields).len(),
            1,
            "{wrong} should be refused"
        );
    }
}

#[test]
fn skills_are_valid_named_by_their_folder_and_short() {
    let everything = skills::Offered {
        host_directories: true,
        local_credentials: true,
    };
    let listed = skills::list(everything).unwrap();
    assert_eq!(
        listed.len(),
        skills::all_texts().len(),
        "all offered when all is set up"
    );
    let mut total = 0;
    for ((folder, text), skill) in skills::all_texts().into_iter().zip(&listed) {
        skill.validate().unwrap_or_else(|e| panic!("{folder}: {e}"));
        let (name, description) = skills::frontmatter(text).unwrap();
        assert_eq!(name, folder);
        assert_eq!(skill.uri, skills::uri(folder));
        assert!(
            (20..=1024).contains(&description.len()),
            "{folder}: a description a model can choose by: {description}"
        );
        assert!(
            text.len() <= skills::MAX_SKILL_BYTES,
            "{folder} is {} bytes, over {}",
            text.len(),
            skills::MAX_SKILL_BYTES
        );
        total += text.len();
    }
    assert!(
        total <= skills::MAX_ALL_SKILLS_BYTES,
        "{total} bytes of skills"
    );
    // What the settings cannot let work is not offered.
    let bare = skills::Offered {
        host_directories: false,
        local_credentials: false,
    };
    let names = skills::names(bare);
    assert!(
        !names.contains(&"workspace-in") && !names.contains(&"credentials-unseen"),
        "{names:?}"
    );
    assert!(skills::get(bare, &skills::uri("workspace-in")).is_err());
    assert!(skills::get(everything, &skills::uri("workspace-in")).is_ok());
}
