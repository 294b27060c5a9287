//! A tool's definition as `tools/list` shows it: input and output schemas derived from the
//! argument and result types, then simplified for portability (no `type` arrays, no `$defs`, no
//! non-standard formats), and the annotations from the tool table.

use super::Tool;
use crate::backend::Mode;
use rmcp::model::{JsonObject, ToolAnnotations};
use schemars::JsonSchema;
use schemars::generate::{Contract, SchemaSettings};
use serde_json::Value;
use std::sync::Arc;

/// The arguments' schema, with `target` an optional property whatever the mode.
pub fn input<T: JsonSchema>() -> JsonObject {
    let mut input = schema::<T>(Contract::Deserialize);
    // A flattened group's own doc would surface as the whole object's description; the tool's
    // description is what says what the arguments are for.
    input.remove("description");
    if let Some(Value::Object(target)) = input
        .get_mut("properties")
        .and_then(|p| p.get_mut("target"))
    {
        target.insert(
            "description".into(),
            Value::String(super::args::TARGET_DESCRIPTION.into()),
        );
    }
    input
}

/// The result's schema, trimmed of what only repeats: a result object's own description (the
/// tool's description says what the result is) and the numeric bounds of fields this server
/// fills itself. Field descriptions that say what a value means stay.
pub fn output<T: JsonSchema>() -> JsonObject {
    let mut output = schema::<T>(Contract::Serialize);
    // MCP wants an object schema at the top; a result that is one of several objects
    // (run-command's) comes out of schemars as a bare anyOf.
    if !output.contains_key("type") {
        output.insert("type".into(), Value::String("object".into()));
    }
    let mut value = Value::Object(std::mem::take(&mut output));
    trim_output(&mut value);
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

fn trim_output(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.get("type").and_then(Value::as_str) == Some("object") {
                map.remove("description");
            }
            map.remove("minimum");
            map.remove("maximum");
            map.values_mut().for_each(trim_output);
        }
        Value::Array(items) => items.iter_mut().for_each(trim_output),
        _ => {}
    }
}

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

/// The definition of `tool` for a process serving `mode`.
pub fn definition(
    tool: Tool,
    mode: Mode,
    input: JsonObject,
    output: JsonObject,
) -> rmcp::model::Tool {
    let hints = tool.hints();
    let mut annotations = ToolAnnotations::with_title(tool.title());
    annotations.read_only_hint = Some(hints.read_only);
    annotations.destructive_hint = Some(hints.destructive);
    annotations.idempotent_hint = Some(hints.idempotent);
    annotations.open_world_hint = Some(hints.open_world);
    rmcp::model::Tool::new(
        tool.name(),
        tool.description(),
        Arc::new(apply_mode(input, mode)),
    )
    .with_title(tool.title())
    .with_raw_output_schema(Arc::new(output))
    .with_annotations(annotations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::FleetKind;
    use crate::tools::Catalog;

    #[test]
    fn target_follows_the_mode() {
        let single = &Catalog::of(Mode::Single(FleetKind::Local)).listed;
        let both = &Catalog::of(Mode::Both).listed;
        assert_eq!(single.len(), Tool::ALL.len());
        for (s, b) in single.iter().zip(both) {
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
        let tools = &Catalog::of(Mode::Both).listed;
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
