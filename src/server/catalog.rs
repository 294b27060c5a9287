//! The tool catalog: names, descriptions written for a model choosing between tools, input and
//! output schemas, and annotations. The schemas are derived from the argument and result types
//! and then simplified for portability (no `type` arrays, no `$defs`, no non-standard formats).

use super::args;
use super::results;
use crate::fleet::FleetKind;
use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use schemars::JsonSchema;
use schemars::generate::{Contract, SchemaSettings};
use serde_json::Value;
use std::sync::Arc;

/// Which fleets this process serves, decided once at startup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Single(FleetKind),
    Both,
}

struct Hints {
    read_only: bool,
    destructive: bool,
    idempotent: bool,
    open_world: bool,
}

const fn hints(read_only: bool, destructive: bool, idempotent: bool, open_world: bool) -> Hints {
    Hints {
        read_only,
        destructive,
        idempotent,
        open_world,
    }
}

pub const TOOL_NAMES: [&str; 13] = [
    "list-machines",
    "get-machine",
    "create-machine",
    "start-machine",
    "stop-machine",
    "delete-machine",
    "run-command",
    "run-once",
    "read-file",
    "write-file",
    "branch-machine",
    "machine-logs",
    "pull-image",
];

fn schema<T: JsonSchema>(contract: Contract) -> JsonObject {
    let input = matches!(contract, Contract::Deserialize);
    let mut generator = SchemaSettings::draft2020_12()
        .with(|s| {
            s.inline_subschemas = true;
            s.contract = contract;
            s.meta_schema = None;
        })
        .into_generator();
    let mut value = generator.root_schema_for::<T>().to_value();
    if input {
        simplify(&mut value);
    } else {
        // Results really carry nulls (url locally, pid on cloud): keep them, as `anyOf` with a
        // `null` branch rather than a `type` array, which single-type dialects reject.
        drop_integer_formats(&mut value);
        nullable_as_any_of(&mut value);
    }
    if let Value::Object(map) = &mut value {
        map.remove("title");
        map.remove("$schema");
    }
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

/// Optional fields are optional by being absent from `required`; the `null` alternatives that
/// schemars adds for `Option` only make schemas harder for clients (type arrays are not portable).
fn simplify(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Array(types)) = map.get("type").cloned() {
                let rest: Vec<Value> = types.into_iter().filter(|t| t != "null").collect();
                if rest.len() == 1 {
                    map.insert("type".into(), rest[0].clone());
                } else {
                    map.insert("type".into(), Value::Array(rest));
                }
            }
            for key in ["anyOf", "oneOf"] {
                if let Some(Value::Array(branches)) = map.get(key).cloned() {
                    let rest: Vec<Value> = branches
                        .into_iter()
                        .filter(|b| b.get("type") != Some(&Value::String("null".into())))
                        .collect();
                    if rest.len() == 1 {
                        map.remove(key);
                        if let Value::Object(inner) = rest[0].clone() {
                            for (k, v) in inner {
                                map.entry(k).or_insert(v);
                            }
                        }
                    } else {
                        map.insert(key.into(), Value::Array(rest));
                    }
                }
            }
            if map
                .get("format")
                .and_then(Value::as_str)
                .is_some_and(|f| f.starts_with("uint") || f.starts_with("int"))
            {
                map.remove("format");
            }
            if let Some(Value::Array(options)) = map.get_mut("enum") {
                options.retain(|o| !o.is_null());
            }
            for child in map.values_mut() {
                simplify(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(simplify),
        _ => {}
    }
}

fn nullable_as_any_of(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.values_mut().for_each(nullable_as_any_of);
            let Some(Value::Array(types)) = map.get("type").cloned() else {
                return;
            };
            let rest: Vec<Value> = types.into_iter().filter(|t| t != "null").collect();
            if rest.len() != 1 {
                return;
            }
            map.remove("type");
            let mut branch = serde_json::Map::new();
            branch.insert("type".into(), rest[0].clone());
            let keys: Vec<String> = map
                .keys()
                .filter(|k| !matches!(k.as_str(), "description" | "title" | "default"))
                .cloned()
                .collect();
            for k in keys {
                if let Some(v) = map.remove(&k) {
                    branch.insert(k, v);
                }
            }
            map.insert(
                "anyOf".into(),
                serde_json::json!([Value::Object(branch), {"type": "null"}]),
            );
        }
        Value::Array(items) => items.iter_mut().for_each(nullable_as_any_of),
        _ => {}
    }
}

fn drop_integer_formats(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map
                .get("format")
                .and_then(Value::as_str)
                .is_some_and(|f| f.starts_with("uint") || f.starts_with("int"))
            {
                map.remove("format");
            }
            map.values_mut().for_each(drop_integer_formats);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_integer_formats),
        _ => {}
    }
}

/// Removes `target` in a single-fleet mode; requires it when both fleets are served.
fn apply_mode(mut input: JsonObject, mode: Mode) -> JsonObject {
    match mode {
        Mode::Single(_) => {
            if let Some(Value::Object(props)) = input.get_mut("properties") {
                props.remove("target");
            }
        }
        Mode::Both => {
            let required = input
                .entry("required")
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(list) = required
                && !list.iter().any(|v| v == "target")
            {
                list.insert(0, Value::String("target".into()));
            }
        }
    }
    input
}

fn tool<I: JsonSchema, O: JsonSchema>(
    mode: Mode,
    name: &'static str,
    title: &str,
    description: &str,
    h: Hints,
) -> Tool {
    let input = apply_mode(schema::<I>(Contract::Deserialize), mode);
    let output = schema::<O>(Contract::Serialize);
    let mut annotations = ToolAnnotations::with_title(title);
    annotations.read_only_hint = Some(h.read_only);
    annotations.destructive_hint = Some(h.destructive);
    annotations.idempotent_hint = Some(h.idempotent);
    annotations.open_world_hint = Some(h.open_world);
    Tool::new(name, description.to_owned(), Arc::new(input))
        .with_title(title)
        .with_raw_output_schema(Arc::new(output))
        .with_annotations(annotations)
}

pub fn tools(mode: Mode) -> Vec<Tool> {
    vec![
        tool::<args::TargetOnly, results::MachineList>(
            mode,
            "list-machines",
            "List machines",
            "List every machine on the fleet with its state, size, egress, image and (cloud) ingress url. \
             Read-only. Use it to find a machine's name or to see what is still running before creating another.",
            hints(true, false, true, false),
        ),
        tool::<args::MachineArgs, crate::fleet::Machine>(
            mode,
            "get-machine",
            "Get a machine",
            "Report one machine: state (running, stopped, created...), cpus, memoryMb, network, image, \
             url (the cloud ingress of its first published port, null locally or until something listens), \
             pid, createdAt. Read-only; fails with NOT_FOUND when there is no such machine.",
            hints(true, false, true, false),
        ),
        tool::<args::CreateArgs, results::Created>(
            mode,
            "create-machine",
            "Create a machine",
            "Create a microVM from an OCI image, start it, and wait until a command has run in it \
             (ready: true). Egress is blocked unless network, allowHosts or allowCidrs says otherwise. \
             Without a name (or with the mcp- prefix) the machine is ephemeral: deleted when this session ends. \
             If the start fails, a machine this call named itself is deleted again; one you named is left, \
             stopped, for you to inspect or delete. On cloud the machine costs money while it exists. \
             For one command in a throwaway machine, run-once is simpler.",
            hints(false, false, false, true),
        ),
        tool::<args::StartArgs, results::Started>(
            mode,
            "start-machine",
            "Start a machine",
            "Start a stopped machine and, unless wait is false, wait until a command has run in it. \
             This is the way back from stop-machine: creating a machine with an existing name is a conflict.",
            hints(false, false, true, false),
        ),
        tool::<args::MachineArgs, results::Stopped>(
            mode,
            "stop-machine",
            "Stop a machine",
            "Stop a running machine. Its disk is kept; memory, running processes and /tmp are lost. \
             On cloud a stopped machine bills for its disk only. start-machine starts it again.",
            hints(false, true, true, false),
        ),
        tool::<args::MachineArgs, crate::fleet::Deleted>(
            mode,
            "delete-machine",
            "Delete a machine",
            "Delete a machine, running or not, with its disk. Irreversible. On cloud the result carries \
             usageMicros, what the machine cost in millionths of a dollar; it is null locally.",
            hints(false, true, true, false),
        ),
        tool::<args::RunCommandArgs, results::CommandRun>(
            mode,
            "run-command",
            "Run a command",
            "Run a command in an existing machine and return stdout, stderr and exitCode. A non-zero exit \
             is a result, not an error; timedOut says the command hit timeoutSecs (exit 124). Output past \
             the budget keeps its head and tail (truncated: true) and the whole stream is written into the \
             machine at the path overflow names, to read with read-file. A stopped machine is started by \
             the command and left running (startedMachine: true).",
            hints(false, true, false, true),
        ),
        tool::<args::RunOnceArgs, results::RunOnce>(
            mode,
            "run-once",
            "Run once in a throwaway machine",
            "Create a machine from an image, run one command, and delete the machine, whatever happens \
             (success, failure, timeout or cancellation). Use it for a self-contained command; use \
             create-machine and run-command when later calls need the same machine.",
            hints(false, false, false, true),
        ),
        tool::<args::ReadFileArgs, results::FileRead>(
            mode,
            "read-file",
            "Read a file",
            "Read a file from a machine, as utf8 text or base64. Large files are read in pages: pass \
             offset and length, and continue until eof is true; size is the whole file's length. A \
             stopped machine is started by the read and left running (startedMachine: true).",
            hints(false, false, true, false),
        ),
        tool::<args::WriteFileArgs, results::FileWritten>(
            mode,
            "write-file",
            "Write a file",
            "Write a whole file into a machine (utf8 or base64 content), creating parent directories and \
             replacing any file at that path. Waits until the machine runs commands first, so the file is \
             not written under a mount that later hides it. A stopped machine is started and left running.",
            hints(false, true, true, false),
        ),
        tool::<args::BranchArgs, results::Branched>(
            mode,
            "branch-machine",
            "Branch a machine",
            "Copy a running machine created with branchable true into a new child, memory and disks \
             included, and wait until a command has run in the child. The source keeps running. \
             Refused (CONFLICT) when the source is not branchable or not running.",
            hints(false, false, false, false),
        ),
        tool::<args::LogsArgs, results::Logs>(
            mode,
            "machine-logs",
            "Read a machine's log",
            "Read the last lines of a machine's log, or only what arrived since a previous call by passing \
             back its cursor. Locally this is the guest console; on cloud it is the control plane's event \
             log (what happened to the machine, not what ran inside it).",
            hints(true, false, true, false),
        ),
        tool::<args::PullArgs, crate::fleet::PulledImage>(
            mode,
            "pull-image",
            "Pull an image",
            "Pull an OCI image into a running local machine's image cache. Local fleet only: on cloud the \
             control plane pulls the image at create.",
            hints(false, false, true, true),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_follows_the_mode() {
        let single = tools(Mode::Single(FleetKind::Local));
        let both = tools(Mode::Both);
        assert_eq!(single.len(), TOOL_NAMES.len());
        for (s, b) in single.iter().zip(&both) {
            assert!(
                s.input_schema["properties"].get("target").is_none(),
                "{}",
                s.name
            );
            assert!(
                b.input_schema["required"]
                    .as_array()
                    .unwrap()
                    .contains(&"target".into()),
                "{}",
                b.name
            );
        }
    }

    #[test]
    fn input_schemas_are_portable_and_outputs_keep_their_nulls() {
        let tools = tools(Mode::Both);
        let inputs =
            serde_json::to_string(&tools.iter().map(|t| &t.input_schema).collect::<Vec<_>>())
                .unwrap();
        assert!(!inputs.contains("\"null\""), "no null types in inputs");
        let all = serde_json::to_string(&tools).unwrap();
        assert!(!all.contains("$defs") && !all.contains("$ref"));
        assert!(!all.contains("uint"));
        let get = tools.iter().find(|t| t.name == "get-machine").unwrap();
        let url = &get.output_schema.as_ref().unwrap()["properties"]["url"]["anyOf"];
        assert_eq!(
            url,
            &serde_json::json!([{"type": "string"}, {"type": "null"}]),
            "url is null locally"
        );
        let outputs =
            serde_json::to_string(&tools.iter().map(|t| &t.output_schema).collect::<Vec<_>>())
                .unwrap();
        assert!(!outputs.contains("\"type\":["), "no type arrays in outputs");
    }
}
