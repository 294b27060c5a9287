//! Which request fields this server sends, from its request snapshots: they pin every request
//! it makes, so a change to anything else in a request cannot break it.

use super::model::{Api, DiffError};
use crate::spec::operations;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Fields this server sends, per operation (`METHOD /template`): request-body fields as dotted
/// paths (`resources.cpus`, `env[].name`) and query parameters as `?name`.
pub type SentFields = BTreeMap<(String, String), BTreeSet<String>>;

/// The texts of `api`'s request snapshots in `dir` (`tests/snapshots` in the checkout), in file
/// name order. None at all is an error: judged against nothing, every request change would
/// count as breaking.
pub fn read_request_snapshots(dir: &Path, api: Api) -> Result<Vec<String>, DiffError> {
    let unreadable = |source| DiffError::Snapshots {
        dir: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.is_some_and(|n| n.starts_with(api.snapshot_prefix()) && n.ends_with(".snap")) {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(DiffError::NoSnapshots {
            dir: dir.to_path_buf(),
            prefix: api.snapshot_prefix(),
        });
    }
    files.sort();
    files
        .iter()
        .map(|path| std::fs::read_to_string(path).map_err(unreadable))
        .collect()
}

fn flatten(value: &Value, prefix: &str, into: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                into.insert(path.clone());
                flatten(v, &path, into);
            }
        }
        Value::Array(items) => {
            for item in items {
                flatten(item, &format!("{prefix}[]"), into);
            }
        }
        _ => {}
    }
}

/// Matches a concrete request path to a spec path template; a trailing `{path}` takes the rest.
fn matches_template(template: &str, path: &str) -> bool {
    let t: Vec<&str> = template.trim_start_matches('/').split('/').collect();
    let p: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    for (i, seg) in t.iter().enumerate() {
        let is_param = seg.starts_with('{') && seg.ends_with('}');
        if is_param && i == t.len() - 1 && *seg == "{path}" {
            return p.len() > i;
        }
        match p.get(i) {
            Some(actual) if is_param || actual == seg => {}
            _ => return false,
        }
    }
    t.len() == p.len()
}

/// The fields the requests recorded in `snapshots` (insta snapshot texts) send, by operation of
/// `spec`.
pub fn sent_fields(spec: &Value, snapshots: &[String]) -> SentFields {
    let ops = operations::list(spec);
    let mut sent = SentFields::new();
    for snapshot in snapshots {
        // An insta snapshot is a `---` header, then the JSON.
        let Some(json) = snapshot.splitn(3, "---").nth(2) else {
            continue;
        };
        let Ok(Value::Array(requests)) = serde_json::from_str::<Value>(json) else {
            continue;
        };
        for r in requests {
            let (method, path) = (
                r["method"].as_str().unwrap_or_default(),
                r["path"].as_str().unwrap_or_default(),
            );
            let Some(op) = ops
                .iter()
                .find(|op| op.method == method && matches_template(&op.path, path))
            else {
                continue;
            };
            let fields = sent
                .entry((op.method.clone(), op.path.clone()))
                .or_default();
            record(&r, fields);
        }
    }
    sent
}

fn record(request: &Value, fields: &mut BTreeSet<String>) {
    if request["body"].is_object() && request["body"].get("octets").is_none() {
        flatten(&request["body"], "", fields);
    }
    for pair in request["query"]
        .as_str()
        .unwrap_or_default()
        .split('&')
        .filter(|q| !q.is_empty())
    {
        fields.insert(format!("?{}", pair.split('=').next().unwrap_or_default()));
    }
}
