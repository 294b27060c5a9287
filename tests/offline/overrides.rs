//! Every override holds against the vendored spec, and one whose expectation no longer holds
//! stops the pipeline build.rs runs with an error that names it.

use serde_json::{Value, json};
use smol_mcp::spec::overrides::{FixStatus, Overrides, Patch};
use smol_mcp::spec::{VENDORED_APIS, VendoredApi, effective, operations};

fn load(api: VendoredApi) -> (Value, String, Overrides) {
    let spec: Value = serde_json::from_str(api.spec_text).unwrap();
    let text = api.overrides_text.to_owned();
    let overrides = Overrides::parse(&text).unwrap();
    (spec, text, overrides)
}

#[test]
fn every_fix_applies_to_the_vendored_spec() {
    for api in VENDORED_APIS {
        let (spec, _, overrides) = load(api);
        assert!(!overrides.fixes.is_empty());
        for fix in &overrides.fixes {
            assert_eq!(
                overrides.status(fix, &spec),
                FixStatus::Applies,
                "{}: {}",
                api.name,
                fix.id
            );
            assert!(
                !fix.reason.is_empty() && !fix.evidence.is_empty(),
                "{}",
                fix.id
            );
        }
    }
}

#[test]
fn a_stale_expectation_fails_naming_its_override() {
    for api in VENDORED_APIS {
        let (spec, text, overrides) = load(api);
        let raw: Value = serde_json::from_str(&text).unwrap();
        for (f, fix) in overrides.fixes.iter().enumerate() {
            for (p, patch) in fix.patches.iter().enumerate() {
                let mut changed = raw.clone();
                let mut spec = spec.clone();
                match patch {
                    Patch::Replace { .. } | Patch::Remove { .. } => {
                        changed["fixes"][f]["patches"][p]["expect"] = json!("no longer upstream");
                    }
                    // An addition is stale once upstream has the entry itself.
                    Patch::Add { pointer, .. } if !pointer.ends_with("/-") => {
                        let (parent, key) = smol_mcp::spec::overrides::split_pointer(pointer);
                        if let Some(Value::Object(map)) = spec.pointer_mut(&parent) {
                            map.insert(key, json!({"added": "upstream"}));
                        } else {
                            continue;
                        }
                    }
                    Patch::Add { .. } => continue,
                }
                let err = match effective(&spec, &changed.to_string()) {
                    Ok(_) => panic!("{}: patch {p} of {} still applied", api.name, fix.id),
                    Err(e) => e.to_string(),
                };
                assert!(
                    err.contains(&format!("override `{}`", fix.id)),
                    "{}: the error does not name {}: {err}",
                    api.name,
                    fix.id
                );
            }
        }
    }
}

#[test]
fn omissions_name_real_operations_and_unpublished_routes() {
    for api in VENDORED_APIS {
        let (spec, text, overrides) = load(api);
        let full = effective(&spec, &text).unwrap().full;
        let ops = operations::list(&full);
        for o in &overrides.omissions {
            let found = ops
                .iter()
                .find(|op| op.method == o.method && op.path == o.path);
            match &o.operation {
                Some(id) => assert_eq!(
                    found.map(|op| op.operation_id.as_str()),
                    Some(id.as_str()),
                    "{}: omission {id} does not match {} {}",
                    api.name,
                    o.method,
                    o.path
                ),
                None => assert!(
                    found.is_none(),
                    "{}: {} {} is in the spec; name its operation",
                    api.name,
                    o.method,
                    o.path
                ),
            }
            assert!(!o.reason.is_empty());
        }
    }
}

#[test]
fn the_effective_specs_keep_exactly_the_used_operations() {
    for api in VENDORED_APIS {
        let (spec, text, overrides) = load(api);
        let effective = effective(&spec, &text).unwrap();
        assert_eq!(effective.kept["openapi"], "3.0.3");
        let kept = operations::list(&effective.kept);
        let all = operations::list(&effective.full);
        let omitted = overrides
            .omissions
            .iter()
            .filter(|o| o.operation.is_some())
            .count();
        assert_eq!(kept.len() + omitted, all.len(), "{}", api.name);
        assert!(
            kept.iter()
                .all(|op| overrides.omission_for(&op.operation_id).is_none())
        );
    }
}
