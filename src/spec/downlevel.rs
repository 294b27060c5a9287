//! OpenAPI 3.1 to 3.0.3, the version progenitor 0.15 reads.
//!
//! progenitor refuses any version but 3.0.x, and `openapiv3` cannot parse 3.1's `type` arrays.
//! Both vendored specs are 3.1 and use only a handful of 3.1 constructs; each rule below covers
//! one of them. Keyword rules run on schema objects only, never on the name maps under
//! `properties` or `components.schemas`, so a property called `type` or `const` is left alone.

use serde_json::{Map, Value, json};

/// Keywords 3.0 does not know and that change nothing the generator needs.
const DROPPED_KEYWORDS: &[&str] = &[
    "propertyNames",
    "$schema",
    "$id",
    "contentMediaType",
    "contentEncoding",
    "unevaluatedProperties",
    "dependentRequired",
    "dependentSchemas",
    "if",
    "then",
    "else",
    "prefixItems",
    "$comment",
];

pub fn downlevel(doc: &mut Value) {
    let Some(root) = doc.as_object_mut() else {
        return;
    };
    root.insert("openapi".into(), json!("3.0.3"));
    root.remove("webhooks");
    root.remove("jsonSchemaDialect");
    if let Some(license) = root
        .get_mut("info")
        .and_then(|i| i.get_mut("license"))
        .and_then(Value::as_object_mut)
    {
        license.remove("identifier");
    }
    if let Some(paths) = root.get_mut("paths").and_then(Value::as_object_mut) {
        for item in paths.values_mut() {
            walk_non_schema(item);
        }
    }
    if let Some(components) = root.get_mut("components").and_then(Value::as_object_mut) {
        if let Some(schemas) = components.get_mut("schemas").and_then(Value::as_object_mut) {
            for schema in schemas.values_mut() {
                schema_3_0(schema);
            }
        }
        for key in ["parameters", "responses", "requestBodies", "headers"] {
            if let Some(map) = components.get_mut(key).and_then(Value::as_object_mut) {
                for item in map.values_mut() {
                    walk_non_schema(item);
                }
            }
        }
    }
}

/// Outside schemas, only the value under a `schema` key is a schema.
fn walk_non_schema(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if key == "schema" {
                    schema_3_0(child);
                } else {
                    walk_non_schema(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(walk_non_schema),
        _ => {}
    }
}

fn is_null_schema(value: &Value) -> bool {
    value.get("type") == Some(&json!("null")) && value.as_object().is_some_and(|m| m.len() == 1)
}

fn schema_3_0(schema: &mut Value) {
    let Some(map) = schema.as_object_mut() else {
        return;
    };
    for keyword in DROPPED_KEYWORDS {
        map.remove(*keyword);
    }
    type_arrays(map);
    if let Some(Value::Array(examples)) = map.remove("examples")
        && let Some(first) = examples.into_iter().next()
    {
        map.insert("example".into(), first);
    }
    if let Some(value) = map.remove("const") {
        map.insert("enum".into(), Value::Array(vec![value]));
    }
    for (exclusive, bound) in [
        ("exclusiveMinimum", "minimum"),
        ("exclusiveMaximum", "maximum"),
    ] {
        if let Some(n) = map.get(exclusive).filter(|v| v.is_number()).cloned() {
            map.insert(bound.into(), n);
            map.insert(exclusive.into(), json!(true));
        }
    }
    for combinator in ["oneOf", "anyOf"] {
        nullable_union(map, combinator);
    }
    ref_with_siblings(map);

    if let Some(props) = map.get_mut("properties").and_then(Value::as_object_mut) {
        props.values_mut().for_each(schema_3_0);
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(child) = map.get_mut(key) {
            schema_3_0(child);
        }
    }
    for key in ["allOf", "oneOf", "anyOf"] {
        if let Some(Value::Array(branches)) = map.get_mut(key) {
            branches.iter_mut().for_each(schema_3_0);
        }
    }
}

/// `type: [X, "null"]` becomes `type: X, nullable: true`; several non-null types become `anyOf`.
fn type_arrays(map: &mut Map<String, Value>) {
    match map.get("type").cloned() {
        Some(Value::Array(types)) => {
            let nullable = types.iter().any(|t| t == "null");
            let rest: Vec<Value> = types.into_iter().filter(|t| t != "null").collect();
            map.remove("type");
            match rest.len() {
                0 => {
                    map.insert("enum".into(), json!([null]));
                }
                1 => {
                    map.insert("type".into(), rest[0].clone());
                }
                _ => {
                    let branches = rest.into_iter().map(|t| json!({"type": t})).collect();
                    map.insert("anyOf".into(), Value::Array(branches));
                }
            }
            if nullable {
                map.insert("nullable".into(), json!(true));
            }
        }
        Some(Value::String(t)) if t == "null" => {
            map.remove("type");
            map.insert("nullable".into(), json!(true));
            map.insert("enum".into(), json!([null]));
        }
        _ => {}
    }
}

/// `oneOf: [{type: null}, X]` becomes X marked nullable (typify maps it to `Option<X>`).
fn nullable_union(map: &mut Map<String, Value>, combinator: &str) {
    let Some(Value::Array(branches)) = map.get(combinator) else {
        return;
    };
    if !branches.iter().any(is_null_schema) {
        return;
    }
    let rest: Vec<Value> = branches
        .iter()
        .filter(|b| !is_null_schema(b))
        .cloned()
        .collect();
    map.remove(combinator);
    map.insert("nullable".into(), json!(true));
    if rest.len() == 1 {
        let only = rest.into_iter().next().unwrap_or(Value::Null);
        if only.get("$ref").is_some() {
            map.insert("allOf".into(), Value::Array(vec![only]));
        } else if let Value::Object(inner) = only {
            for (k, v) in inner {
                map.entry(k).or_insert(v);
            }
        }
    } else {
        map.insert(combinator.into(), Value::Array(rest));
    }
}

/// In 3.0 a `$ref` replaces its whole object; keep the siblings by moving the ref into `allOf`.
fn ref_with_siblings(map: &mut Map<String, Value>) {
    if map.keys().any(|k| k != "$ref" && k != "description")
        && let Some(reference) = map.remove("$ref")
    {
        map.insert("allOf".into(), json!([{ "$ref": reference }]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_arrays_and_null_unions_become_nullable() {
        let mut doc = json!({
            "openapi": "3.1.0",
            "paths": {"/x": {"get": {"parameters": [{"name": "type", "in": "query",
                "schema": {"type": ["integer", "null"]}}], "responses": {}}}},
            "components": {"schemas": {
                "A": {"type": "object", "properties": {
                    "type": {"type": ["string", "null"]},
                    "child": {"oneOf": [{"type": "null"}, {"$ref": "#/components/schemas/B"}]},
                    "either": {"type": ["string", "integer"]},
                    "names": {"type": "object", "propertyNames": {"type": "string"},
                              "additionalProperties": {"type": "string"}}}},
                "B": {"const": "b"}}}
        });
        downlevel(&mut doc);
        assert_eq!(doc["openapi"], "3.0.3");
        assert_eq!(
            doc["paths"]["/x"]["get"]["parameters"][0]["schema"],
            json!({"type": "integer", "nullable": true})
        );
        let a = &doc["components"]["schemas"]["A"]["properties"];
        assert_eq!(a["type"], json!({"type": "string", "nullable": true}));
        assert_eq!(
            a["child"],
            json!({"nullable": true, "allOf": [{"$ref": "#/components/schemas/B"}]})
        );
        assert_eq!(
            a["either"],
            json!({"anyOf": [{"type": "string"}, {"type": "integer"}]})
        );
        assert_eq!(
            a["names"],
            json!({"type": "object", "additionalProperties": {"type": "string"}})
        );
        assert_eq!(doc["components"]["schemas"]["B"], json!({"enum": ["b"]}));
    }
}
