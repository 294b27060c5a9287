//! Overrides: corrections to vendored spec entries that are known to be wrong, and the record of
//! every operation this server leaves out on purpose. Both are data, in `overrides/<api>.json`.
//!
//! A fix is a list of patches in the shape of a JSON Patch `test` then `replace`: each names the
//! JSON Pointer it touches and the value it expects to find there. When upstream changes that
//! entry, the expectation no longer holds and the build stops with the fix's id, so a fix can
//! neither silently patch the wrong thing nor linger after upstream repaired the entry.

use serde::Deserialize;
use serde_json::Value;
use std::fmt;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overrides {
    pub api: String,
    pub fixes: Vec<Fix>,
    pub omissions: Vec<Omission>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fix {
    pub id: String,
    pub reason: String,
    pub evidence: String,
    pub patches: Vec<Patch>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Patch {
    /// The pointer must hold `expect`; it then holds `value`.
    Replace {
        pointer: String,
        expect: Value,
        value: Value,
    },
    /// The pointer must not exist yet (upstream has not added the entry); it then holds `value`.
    Add { pointer: String, value: Value },
    /// The pointer must hold `expect`; it is then removed.
    Remove { pointer: String, expect: Value },
}

impl Patch {
    pub fn pointer(&self) -> &str {
        match self {
            Patch::Replace { pointer, .. }
            | Patch::Add { pointer, .. }
            | Patch::Remove { pointer, .. } => pointer,
        }
    }
}

/// An operation the server deliberately does not call.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Omission {
    /// The operationId, for an operation the vendored spec has. `None` for a route that is known
    /// to exist upstream but is absent from the vendored spec and is not added by a fix.
    pub operation: Option<String>,
    pub method: String,
    pub path: String,
    pub reason: String,
}

/// What a fix finds when checked against a spec, used by the build (which needs `Applies`) and
/// by the spec-diff report (which reports the other two).
#[derive(Debug, Clone, PartialEq)]
pub enum FixStatus {
    Applies,
    /// Every patch's target already holds what the fix would write: upstream fixed it.
    NoLongerNeeded,
    /// Some patch finds neither the expected value nor the replacement.
    NoLongerMatches {
        pointer: String,
        found: Option<Value>,
    },
}

#[derive(Debug)]
pub enum OverrideError {
    Malformed(String),
    Stale {
        fix: String,
        api: String,
        pointer: String,
        expected: String,
        found: String,
    },
}

impl fmt::Display for OverrideError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OverrideError::Malformed(why) => write!(f, "malformed overrides file: {why}"),
            OverrideError::Stale {
                fix,
                api,
                pointer,
                expected,
                found,
            } => write!(
                f,
                "override `{fix}` (overrides/{api}.json) no longer matches the vendored spec at \
                 {pointer}: it expects {expected} but the spec has {found}. Upstream changed this \
                 entry: check whether the fix is still needed, then update or remove it."
            ),
        }
    }
}

impl std::error::Error for OverrideError {}

fn short(v: Option<&Value>) -> String {
    match v {
        None => "nothing (the entry is absent)".to_owned(),
        Some(v) => {
            let s = v.to_string();
            if s.chars().count() > 300 {
                format!("{}...", s.chars().take(300).collect::<String>())
            } else {
                s
            }
        }
    }
}

/// Serde's message for a whole file does not say which entry is wrong; re-reading the entries
/// one by one finds the first that fails, so the message names its file and its fix (or route).
fn locate(doc: &Value, whole: serde_json::Error) -> String {
    let file = match doc.get("api").and_then(Value::as_str) {
        Some(api) => format!("overrides/{api}.json"),
        None => "the overrides file".to_owned(),
    };
    let entries = |key: &str| {
        doc.get(key)
            .and_then(Value::as_array)
            .map(|list| list.iter().enumerate())
            .into_iter()
            .flatten()
    };
    let name = |entry: &Value, key: &str, i: usize| match entry.get(key).and_then(Value::as_str) {
        Some(name) => format!("`{name}`"),
        None => format!("#{}", i + 1),
    };
    for (i, fix) in entries("fixes") {
        if let Err(e) = Fix::deserialize(fix) {
            return format!("{file}: fix {}: {e}", name(fix, "id", i));
        }
    }
    for (i, omission) in entries("omissions") {
        if let Err(e) = Omission::deserialize(omission) {
            return format!("{file}: omission {}: {e}", name(omission, "path", i));
        }
    }
    format!("{file}: {whole}")
}

impl Overrides {
    pub fn parse(source: &str) -> Result<Self, OverrideError> {
        let doc: Value = serde_json::from_str(source)
            .map_err(|e| OverrideError::Malformed(format!("not JSON: {e}")))?;
        Overrides::deserialize(&doc).map_err(|e| OverrideError::Malformed(locate(&doc, e)))
    }

    /// Applies every fix, in order, or fails naming the first one whose expectation does not hold.
    pub fn apply(&self, doc: &mut Value) -> Result<(), OverrideError> {
        for fix in &self.fixes {
            for patch in &fix.patches {
                self.apply_patch(fix, patch, doc)?;
            }
        }
        Ok(())
    }

    fn apply_patch(&self, fix: &Fix, patch: &Patch, doc: &mut Value) -> Result<(), OverrideError> {
        let stale = |expected: String, found: Option<&Value>| OverrideError::Stale {
            fix: fix.id.clone(),
            api: self.api.clone(),
            pointer: patch.pointer().to_owned(),
            expected,
            found: short(found),
        };
        match patch {
            Patch::Replace {
                pointer,
                expect,
                value,
            } => match doc.pointer_mut(pointer) {
                Some(slot) if slot == expect => {
                    *slot = value.clone();
                    Ok(())
                }
                found => Err(stale(short(Some(expect)), found.map(|v| &*v))),
            },
            Patch::Remove { pointer, expect } => {
                if doc.pointer(pointer) != Some(expect) {
                    return Err(stale(short(Some(expect)), doc.pointer(pointer)));
                }
                remove_pointer(doc, pointer);
                Ok(())
            }
            Patch::Add { pointer, value } => {
                if let Some(found) = doc.pointer(pointer) {
                    return Err(stale("nothing (an entry to add)".into(), Some(found)));
                }
                let (parent, key) = split_pointer(pointer);
                match doc.pointer_mut(&parent) {
                    Some(Value::Object(map)) => {
                        map.insert(key, value.clone());
                        Ok(())
                    }
                    Some(Value::Array(items)) if key == "-" => {
                        items.push(value.clone());
                        Ok(())
                    }
                    found => Err(stale(
                        format!("an object at {parent} to add into"),
                        found.map(|v| &*v),
                    )),
                }
            }
        }
    }

    /// How each fix relates to `doc` (a vendored spec), without changing it.
    pub fn status(&self, fix: &Fix, doc: &Value) -> FixStatus {
        let mut scratch = doc.clone();
        if fix
            .patches
            .iter()
            .all(|p| self.apply_patch(fix, p, &mut scratch).is_ok())
        {
            return FixStatus::Applies;
        }
        let already = fix.patches.iter().all(|p| match p {
            Patch::Replace { pointer, value, .. } | Patch::Add { pointer, value } => {
                doc.pointer(pointer) == Some(value)
            }
            Patch::Remove { pointer, .. } => doc.pointer(pointer).is_none(),
        });
        if already {
            return FixStatus::NoLongerNeeded;
        }
        let mut scratch = doc.clone();
        for p in &fix.patches {
            if self.apply_patch(fix, p, &mut scratch).is_err() {
                return FixStatus::NoLongerMatches {
                    pointer: p.pointer().to_owned(),
                    found: doc.pointer(p.pointer()).cloned(),
                };
            }
        }
        FixStatus::Applies
    }

    pub fn omission_for(&self, operation_id: &str) -> Option<&Omission> {
        self.omissions
            .iter()
            .find(|o| o.operation.as_deref() == Some(operation_id))
    }
}

/// Splits `/a/b~1c` into the parent pointer `/a` and the unescaped last token `b/c`.
pub fn split_pointer(pointer: &str) -> (String, String) {
    match pointer.rfind('/') {
        Some(i) => (
            pointer[..i].to_owned(),
            pointer[i + 1..].replace("~1", "/").replace("~0", "~"),
        ),
        None => (String::new(), pointer.to_owned()),
    }
}

fn remove_pointer(doc: &mut Value, pointer: &str) {
    let (parent, key) = split_pointer(pointer);
    match doc.pointer_mut(&parent) {
        Some(Value::Object(map)) => {
            map.remove(&key);
        }
        Some(Value::Array(items)) => {
            if let Ok(i) = key.parse::<usize>()
                && i < items.len()
            {
                items.remove(i);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn overrides(patches: Value) -> Overrides {
        Overrides::parse(
            &json!({"api": "t", "omissions": [], "fixes": [
                {"id": "the-fix", "reason": "r", "evidence": "e", "patches": patches}]})
            .to_string(),
        )
        .unwrap()
    }

    #[test]
    fn replace_add_remove_apply_when_expectations_hold() {
        let o = overrides(json!([
            {"op": "replace", "pointer": "/a", "expect": 1, "value": 2},
            {"op": "add", "pointer": "/b~1c", "value": 3},
            {"op": "remove", "pointer": "/d", "expect": [4]}
        ]));
        let mut doc = json!({"a": 1, "d": [4]});
        assert_eq!(o.status(&o.fixes[0], &doc), FixStatus::Applies);
        o.apply(&mut doc).unwrap();
        assert_eq!(doc, json!({"a": 2, "b/c": 3}));
        assert_eq!(o.status(&o.fixes[0], &doc), FixStatus::NoLongerNeeded);
    }

    #[test]
    fn a_changed_entry_fails_naming_the_fix() {
        let o = overrides(json!([{"op": "replace", "pointer": "/a", "expect": 1, "value": 2}]));
        let mut doc = json!({"a": 5});
        let err = o.apply(&mut doc).unwrap_err().to_string();
        assert!(err.contains("override `the-fix`"), "{err}");
        assert!(err.contains("/a") && err.contains('5'), "{err}");
        assert_eq!(
            o.status(&o.fixes[0], &doc),
            FixStatus::NoLongerMatches {
                pointer: "/a".into(),
                found: Some(json!(5))
            }
        );
    }

    fn malformed(patch: Value) -> String {
        Overrides::parse(
            &json!({"api": "t", "omissions": [], "fixes": [
                {"id": "the-fix", "reason": "r", "evidence": "e", "patches": [patch]}]})
            .to_string(),
        )
        .unwrap_err()
        .to_string()
    }

    #[test]
    fn a_malformed_fix_is_named_with_its_file() {
        let unknown_op = malformed(json!({"op": "move", "pointer": "/a", "value": 1}));
        assert!(
            unknown_op.contains("overrides/t.json: fix `the-fix`") && unknown_op.contains("move"),
            "{unknown_op}"
        );
        let missing = malformed(json!({"op": "replace", "pointer": "/a", "value": 1}));
        assert!(
            missing.contains("`the-fix`") && missing.contains("`expect`"),
            "{missing}"
        );
        let stray = malformed(json!({"op": "add", "pointer": "/a", "value": 1, "expect": 0}));
        assert!(
            stray.contains("`the-fix`") && stray.contains("`expect`"),
            "{stray}"
        );
        let top = Overrides::parse(r#"{"api": "t", "fixes": [], "omissions": [], "extra": 1}"#)
            .unwrap_err()
            .to_string();
        assert!(
            top.contains("overrides/t.json") && top.contains("`extra`"),
            "{top}"
        );
    }

    #[test]
    fn an_add_over_an_existing_entry_is_stale() {
        let o = overrides(json!([{"op": "add", "pointer": "/a", "value": 2}]));
        assert!(o.apply(&mut json!({"a": 1})).is_err());
    }
}
