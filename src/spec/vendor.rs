//! The facts-only form of an OpenAPI document: what the interface is, without the prose.
//!
//! Upstream prose (descriptions, summaries, titles, examples) changes between releases without
//! changing the interface; vendoring without it keeps a spec bump's diff down to real changes.

use serde_json::{Map, Value};

/// Keys whose value is a map from names the document author chose to objects. The names are
/// data (a property may well be called `description`), so they are never stripped.
const NAME_MAPS: &[&str] = &[
    "properties",
    "patternProperties",
    "paths",
    "schemas",
    "responses",
    "parameters",
    "requestBodies",
    "headers",
    "content",
    "securitySchemes",
    "callbacks",
    "links",
    "encoding",
    "variables",
    "mapping",
    "definitions",
    "$defs",
    "webhooks",
];

/// Prose keys, removed wherever they are keywords.
const PROSE: &[&str] = &[
    "description",
    "summary",
    "title",
    "examples",
    "example",
    "externalDocs",
    "contact",
    "license",
    "termsOfService",
];

/// Returns the facts-only form of `doc`.
pub fn facts_only(doc: &Value) -> Value {
    sort_keys(&strip(doc))
}

/// Renders a document the way every vendored or generated JSON file in this project is written:
/// keys sorted, two-space indentation, one trailing newline.
pub fn render(doc: &Value) -> String {
    let mut text = serde_json::to_string_pretty(&sort_keys(doc)).unwrap_or_default();
    text.push('\n');
    text
}

fn strip(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, child) in map {
                if PROSE.contains(&key.as_str()) {
                    continue;
                }
                let child = if NAME_MAPS.contains(&key.as_str()) {
                    strip_name_map(child)
                } else if key == "tags" {
                    strip_tags(child)
                } else {
                    strip(child)
                };
                out.insert(key.clone(), child);
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(strip).collect()),
        other => other.clone(),
    }
}

fn strip_name_map(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(name, child)| (name.clone(), strip(child)))
                .collect(),
        ),
        // `parameters` is a list on operations and path items; its entries are plain objects.
        other => strip(other),
    }
}

/// Top-level `tags` are objects with prose; operation `tags` are plain names. Both keep only names.
fn strip_tags(value: &Value) -> Value {
    match value {
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|tag| match tag {
                    Value::Object(obj) => {
                        let mut kept = Map::new();
                        if let Some(name) = obj.get("name") {
                            kept.insert("name".into(), name.clone());
                        }
                        Value::Object(kept)
                    }
                    other => other.clone(),
                })
                .collect(),
        ),
        other => strip(other),
    }
}

/// Sorts object keys recursively, whatever map type `serde_json` was built with.
pub fn sort_keys(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.clone(), sort_keys(v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sort_keys).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prose_goes_but_property_names_stay() {
        let raw = json!({
            "openapi": "3.1.0",
            "info": {"title": "t", "version": "1", "description": "d", "license": {"name": "MIT"}},
            "tags": [{"name": "Machines", "description": "all about machines"}],
            "paths": {"/x": {"get": {"summary": "s", "tags": ["Machines"], "operationId": "x",
                "responses": {"200": {"description": "ok"}}}}},
            "components": {"schemas": {"Thing": {"type": "object", "title": "Thing",
                "properties": {"description": {"type": "string", "description": "the text", "examples": ["a"]},
                               "title": {"type": "string"}}}}}
        });
        let out = facts_only(&raw);
        assert_eq!(
            out,
            json!({
                "openapi": "3.1.0",
                "info": {"version": "1"},
                "tags": [{"name": "Machines"}],
                "paths": {"/x": {"get": {"tags": ["Machines"], "operationId": "x", "responses": {"200": {}}}}},
                "components": {"schemas": {"Thing": {"type": "object",
                    "properties": {"description": {"type": "string"}, "title": {"type": "string"}}}}}
            })
        );
    }

    #[test]
    fn render_sorts_keys_and_ends_with_newline() {
        let text = render(&json!({"b": 1, "a": {"d": 2, "c": 3}}));
        assert_eq!(
            text,
            "{\n  \"a\": {\n    \"c\": 3,\n    \"d\": 2\n  },\n  \"b\": 1\n}\n"
        );
    }
}
