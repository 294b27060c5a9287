//! Everything that turns an upstream OpenAPI document into the one progenitor reads.
//!
//! This module is compiled twice: by `build.rs` (through `#[path]`) to generate the clients, and
//! by the library, where the vendoring tool and the spec-diff report reuse the very same steps.
//! It therefore depends on `serde`, `serde_json` and `std` only.

pub mod downlevel;
pub mod operations;
pub mod overrides;
pub mod vendor;

/// One vendored API: where its facts-only spec and its overrides live, relative to the crate root,
/// and their text as compiled in.
#[derive(Debug, Clone, Copy)]
pub struct VendoredApi {
    /// Short name used for generated file names and module names.
    pub name: &'static str,
    pub spec_file: &'static str,
    pub spec_text: &'static str,
    pub overrides_file: &'static str,
    pub overrides_text: &'static str,
}

/// Names each vendored file once: the path a report prints and the text the clients are
/// generated from (and the spec-diff report compares against) come from the same literal, so a
/// bump cannot update one and forget the other.
macro_rules! vendored_api {
    ($name:literal, spec: $spec:literal, overrides: $overrides:literal) => {
        VendoredApi {
            name: $name,
            spec_file: $spec,
            spec_text: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/", $spec)),
            overrides_file: $overrides,
            overrides_text: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/", $overrides)),
        }
    };
}

/// The local engine's API: `smolvm serve openapi` of smolvm 1.32.2.
pub const LOCAL_API: VendoredApi = vendored_api!(
    "smolvm",
    spec: "specs/smolvm-1.32.2.openapi.json",
    overrides: "overrides/smolvm.json"
);

/// The smol cloud control plane: the published spec, archived 2026-08-01.
pub const CLOUD_API: VendoredApi = vendored_api!(
    "smolcloud",
    spec: "specs/smolcloud-0.1.0-published-2026-08-01.openapi.json",
    overrides: "overrides/smolcloud.json"
);

pub const VENDORED_APIS: [VendoredApi; 2] = [LOCAL_API, CLOUD_API];

/// The whole pipeline from a vendored spec to the document progenitor consumes:
/// overrides (written against the vendored 3.1 text), then the 3.1 to 3.0 down-level, then the
/// operations this server omits are dropped along with the schemas only they reached.
pub struct Effective {
    /// The spec after overrides and down-levelling, with every operation (for the `Operation` enum).
    pub full: serde_json::Value,
    /// `full` without the omitted operations: what progenitor generates from.
    pub kept: serde_json::Value,
    pub overrides: overrides::Overrides,
}

pub fn effective(
    vendored: &serde_json::Value,
    overrides_text: &str,
) -> Result<Effective, overrides::OverrideError> {
    let overrides = overrides::Overrides::parse(overrides_text)?;
    let mut full = vendored.clone();
    overrides.apply(&mut full)?;
    downlevel::downlevel(&mut full);
    restore_required_prose(&mut full, &overrides.api);
    let mut kept = full.clone();
    let omitted: Vec<&str> = overrides
        .omissions
        .iter()
        .filter_map(|o| o.operation.as_deref())
        .collect();
    operations::drop_operations(&mut kept, &omitted);
    operations::prune_unreachable_schemas(&mut kept);
    Ok(Effective {
        full,
        kept,
        overrides,
    })
}

/// OpenAPI 3.0 (and openapiv3) require `info.title` and a `description` on every response, both
/// of which vendoring strips as prose; put back empty placeholders.
fn restore_required_prose(doc: &mut serde_json::Value, api: &str) {
    use serde_json::Value;
    if let Some(info) = doc.get_mut("info").and_then(Value::as_object_mut) {
        info.insert("title".into(), Value::String(api.to_owned()));
    }
    let describe = |responses: &mut Value| {
        if let Some(map) = responses.as_object_mut() {
            for response in map.values_mut().filter_map(Value::as_object_mut) {
                if !response.contains_key("$ref") {
                    response
                        .entry("description")
                        .or_insert_with(|| Value::String(String::new()));
                }
            }
        }
    };
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for item in paths.values_mut().filter_map(Value::as_object_mut) {
            for op in item.values_mut() {
                if let Some(responses) = op.get_mut("responses") {
                    describe(responses);
                }
            }
        }
    }
    if let Some(responses) = doc.pointer_mut("/components/responses") {
        describe(responses);
    }
}
