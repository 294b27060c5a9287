//! The spec-diff report: what a new smolvm release (or cloud spec) changes for this server.
//!
//! It compares a candidate spec, vendored with the same facts-only step as `specs/`, with the
//! vendored spec the clients are generated from, and classifies every difference by what this
//! server does with the operation: used by named tools, omitted on purpose, or unknown (a
//! decision to make). It also re-checks every override against the candidate.

use crate::operations::{Use, classify_cloud, classify_local};
use crate::spec::overrides::{FixStatus, Overrides};
use crate::spec::{CLOUD_API, LOCAL_API, VendoredApi, operations, vendor};
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// Which vendored API a report is about; the specs and overrides are compiled in, so the report
/// needs no checkout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    Local,
    Cloud,
}

impl Api {
    fn vendored(self) -> VendoredApi {
        match self {
            Api::Local => LOCAL_API,
            Api::Cloud => CLOUD_API,
        }
    }

    /// What the server does with an operation of the vendored spec, by operationId.
    fn classify(self, operation_id: &str) -> Option<Use> {
        match self {
            Api::Local => crate::generated::smolvm::Operation::ALL
                .iter()
                .find(|op| op.operation_id() == operation_id)
                .map(|op| classify_local(*op)),
            Api::Cloud => crate::generated::smolcloud::Operation::ALL
                .iter()
                .find(|op| op.operation_id() == operation_id)
                .map(|op| classify_cloud(*op)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Classification {
    Used { tools: Vec<String> },
    Internal { why: String },
    Omitted { reason: String },
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldChange {
    /// Where: `request body`, `response 200`, `query parameter tail`...
    pub place: String,
    /// A dotted path inside that schema (`resources.cpus`), empty for the place itself.
    pub field: String,
    /// added, removed, renamed?, type, required, nullable, enum, media type, status
    pub change: String,
    pub detail: String,
    pub breaking: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationChange {
    pub method: String,
    pub path: String,
    pub operation_id: String,
    /// added, removed or changed.
    pub status: String,
    pub classification: Classification,
    pub changes: Vec<FieldChange>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OverrideCheck {
    pub id: String,
    /// applies, no longer needed, no longer matches.
    pub status: String,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Parity {
    pub operations: usize,
    pub paths: usize,
    pub called: usize,
    pub omitted: usize,
    pub unknown: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub api: Api,
    pub baseline: String,
    /// The candidate's release as its binary reports it (`smolvm 1.14.3`), when known.
    pub release: Option<String>,
    /// `info.version` of the candidate, reported but never trusted (smolvm 1.32.2 says 0.5.2).
    pub spec_version: Option<String>,
    pub operations: Vec<OperationChange>,
    pub overrides: Vec<OverrideCheck>,
    pub parity: Parity,
    pub needs_decision: bool,
}

/// The request snapshots pin every request this server sends; what they send is what a change
/// can break. A test keeps these lists equal to the snapshot files.
pub const LOCAL_REQUEST_SNAPSHOTS: &[&str] = &[
    include_str!("../tests/snapshots/local_requests__local_create_egress.snap"),
    include_str!("../tests/snapshots/local_requests__local_create_ports_mounts.snap"),
    include_str!("../tests/snapshots/local_requests__local_create_start_branch.snap"),
    include_str!("../tests/snapshots/local_requests__local_exec.snap"),
    include_str!("../tests/snapshots/local_requests__local_files_logs_pull_health.snap"),
    include_str!("../tests/snapshots/local_requests__local_lifecycle.snap"),
];

pub const CLOUD_REQUEST_SNAPSHOTS: &[&str] = &[
    include_str!("../tests/snapshots/cloud_requests__cloud_branch.snap"),
    include_str!("../tests/snapshots/cloud_requests__cloud_create_egress.snap"),
    include_str!("../tests/snapshots/cloud_requests__cloud_create_ports_branchable_ttl.snap"),
    include_str!("../tests/snapshots/cloud_requests__cloud_delete_fallback_usage.snap"),
    include_str!("../tests/snapshots/cloud_requests__cloud_events_account_usage.snap"),
    include_str!("../tests/snapshots/cloud_requests__cloud_exec.snap"),
    include_str!("../tests/snapshots/cloud_requests__cloud_files_exec_fallback.snap"),
    include_str!("../tests/snapshots/cloud_requests__cloud_files_route.snap"),
    include_str!("../tests/snapshots/cloud_requests__cloud_lifecycle.snap"),
];

/// Fields this server sends, per operation (`METHOD /template`): request-body fields as dotted
/// paths (`resources.cpus`, `env[].name`) and query parameters as `?name`.
pub type SentFields = BTreeMap<(String, String), BTreeSet<String>>;

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

pub fn sent_fields(spec: &Value, snapshots: &[&str]) -> SentFields {
    let ops = operations::list(spec);
    let mut sent = SentFields::new();
    for snapshot in snapshots {
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
            if r["body"].is_object() && r["body"].get("octets").is_none() {
                flatten(&r["body"], "", fields);
            }
            for pair in r["query"]
                .as_str()
                .unwrap_or_default()
                .split('&')
                .filter(|q| !q.is_empty())
            {
                fields.insert(format!("?{}", pair.split('=').next().unwrap_or_default()));
            }
        }
    }
    sent
}

/// Compares a raw candidate spec with the vendored one of `api`.
pub fn diff(api: Api, candidate_raw: &Value, release: Option<String>) -> Report {
    let baseline: Value = serde_json::from_str(api.vendored().spec_text).unwrap_or(Value::Null);
    let candidate = vendor::facts_only(candidate_raw);
    let overrides = Overrides::parse(api.vendored().overrides_text).ok();
    let snapshots = match api {
        Api::Local => LOCAL_REQUEST_SNAPSHOTS,
        Api::Cloud => CLOUD_REQUEST_SNAPSHOTS,
    };
    let sent = sent_fields(&baseline, snapshots);
    diff_specs(
        api,
        &baseline,
        &candidate,
        overrides.as_ref(),
        &sent,
        release,
    )
}

/// The comparison itself, on two facts-only specs (also what the unit tests drive).
pub fn diff_specs(
    api: Api,
    baseline: &Value,
    candidate: &Value,
    overrides: Option<&Overrides>,
    sent: &SentFields,
    release: Option<String>,
) -> Report {
    let old_ops: BTreeMap<(String, String), operations::OperationRef> = operations::list(baseline)
        .into_iter()
        .map(|op| ((op.path.clone(), op.method.clone()), op))
        .collect();
    let new_ops: BTreeMap<(String, String), operations::OperationRef> = operations::list(candidate)
        .into_iter()
        .map(|op| ((op.path.clone(), op.method.clone()), op))
        .collect();
    let classify = |op: &operations::OperationRef| -> Classification {
        match api.classify(&op.operation_id) {
            Some(used @ Use::Tools(_)) => Classification::Used {
                tools: used.tool_names().into_iter().map(String::from).collect(),
            },
            Some(Use::Internal(why)) => Classification::Internal { why: why.into() },
            Some(Use::Omitted) => Classification::Omitted {
                reason: overrides
                    .and_then(|o| o.omission_for(&op.operation_id))
                    .map(|o| o.reason.clone())
                    .unwrap_or_default(),
            },
            None => {
                // A route an override replaces (the published cloud files route, say) is
                // accounted for by that override.
                if let Some(fix) = overrides.and_then(|o| {
                    o.fixes.iter().find(|fix| {
                        fix.patches.iter().any(|p| {
                            matches!(p, crate::spec::overrides::Patch::Remove { pointer, .. }
                                if crate::spec::overrides::split_pointer(pointer) == ("/paths".to_owned(), op.path.clone()))
                        })
                    })
                }) {
                    return Classification::Omitted {
                        reason: format!("replaced by override {}: {}", fix.id, fix.reason),
                    };
                }
                // An operation the vendored spec lacks may still be a recorded omission by route.
                match overrides.and_then(|o| {
                    o.omissions
                        .iter()
                        .find(|om| om.method == op.method && om.path == op.path)
                }) {
                    Some(om) => Classification::Omitted {
                        reason: om.reason.clone(),
                    },
                    None => Classification::Unknown,
                }
            }
        }
    };
    let mut changes = Vec::new();
    let keys: BTreeSet<&(String, String)> = old_ops.keys().chain(new_ops.keys()).collect();
    for key in keys {
        match (old_ops.get(key), new_ops.get(key)) {
            (Some(old), None) => {
                let classification = classify(old);
                let used = matches!(
                    classification,
                    Classification::Used { .. } | Classification::Internal { .. }
                );
                changes.push(OperationChange {
                    method: old.method.clone(),
                    path: old.path.clone(),
                    operation_id: old.operation_id.clone(),
                    status: "removed".into(),
                    changes: vec![FieldChange {
                        place: "operation".into(),
                        field: String::new(),
                        change: "removed".into(),
                        detail: "the candidate has no such route".into(),
                        breaking: used,
                    }],
                    classification,
                });
            }
            (None, Some(new)) => changes.push(OperationChange {
                method: new.method.clone(),
                path: new.path.clone(),
                operation_id: new.operation_id.clone(),
                status: "added".into(),
                classification: classify(new),
                changes: Vec::new(),
            }),
            (Some(old), Some(new)) => {
                let sent_here = sent.get(&(old.method.clone(), old.path.clone()));
                let field_changes = compare_operation(baseline, candidate, old, new, sent_here);
                if !field_changes.is_empty() || old.operation_id != new.operation_id {
                    let classification = classify(old);
                    let used = matches!(
                        classification,
                        Classification::Used { .. } | Classification::Internal { .. }
                    );
                    let mut field_changes: Vec<FieldChange> = field_changes
                        .into_iter()
                        .map(|mut c| {
                            c.breaking &= used;
                            c
                        })
                        .collect();
                    if old.operation_id != new.operation_id {
                        field_changes.insert(
                            0,
                            FieldChange {
                                place: "operation".into(),
                                field: String::new(),
                                change: "operationId".into(),
                                detail: format!("{} -> {}", old.operation_id, new.operation_id),
                                breaking: used,
                            },
                        );
                    }
                    changes.push(OperationChange {
                        method: old.method.clone(),
                        path: old.path.clone(),
                        operation_id: old.operation_id.clone(),
                        status: "changed".into(),
                        classification,
                        changes: field_changes,
                    });
                }
            }
            (None, None) => {}
        }
    }

    let override_checks: Vec<OverrideCheck> = overrides
        .map(|o| {
            o.fixes
                .iter()
                .map(|fix| match o.status(fix, candidate) {
                    FixStatus::Applies => OverrideCheck {
                        id: fix.id.clone(),
                        status: "applies".into(),
                        detail: String::new(),
                    },
                    FixStatus::NoLongerNeeded => OverrideCheck {
                        id: fix.id.clone(),
                        status: "no longer needed".into(),
                        detail: "the candidate already has what the fix writes: remove the fix"
                            .into(),
                    },
                    FixStatus::NoLongerMatches { pointer, found } => OverrideCheck {
                        id: fix.id.clone(),
                        status: "no longer matches".into(),
                        detail: format!(
                            "{pointer} now holds {}",
                            found.map_or("nothing".to_owned(), |v| short(&v))
                        ),
                    },
                })
                .collect()
        })
        .unwrap_or_default();

    let mut parity = Parity {
        operations: new_ops.len(),
        paths: new_ops
            .keys()
            .map(|(p, _)| p.as_str())
            .collect::<BTreeSet<_>>()
            .len(),
        called: 0,
        omitted: 0,
        unknown: 0,
    };
    for op in new_ops.values() {
        match classify(op) {
            Classification::Used { .. } | Classification::Internal { .. } => parity.called += 1,
            Classification::Omitted { .. } => parity.omitted += 1,
            Classification::Unknown => parity.unknown += 1,
        }
    }
    let needs_decision = parity.unknown > 0
        || changes.iter().any(|c| c.changes.iter().any(|f| f.breaking))
        || override_checks.iter().any(|o| o.status != "applies");
    Report {
        api,
        baseline: api.vendored().spec_file.to_owned(),
        release,
        spec_version: candidate
            .pointer("/info/version")
            .and_then(Value::as_str)
            .map(str::to_owned),
        operations: changes,
        overrides: override_checks,
        parity,
        needs_decision,
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 120 {
        format!("{}...", s.chars().take(120).collect::<String>())
    } else {
        s
    }
}

fn op_value<'a>(doc: &'a Value, op: &operations::OperationRef) -> &'a Value {
    doc.pointer(&format!(
        "/paths/{}/{}",
        op.path.replace('~', "~0").replace('/', "~1"),
        op.method.to_lowercase()
    ))
    .unwrap_or(&Value::Null)
}

/// Follows `$ref`s into `components.schemas` (a chain of them, not cycles).
fn resolve<'a>(doc: &'a Value, mut schema: &'a Value) -> &'a Value {
    for _ in 0..16 {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => match r.strip_prefix('#').and_then(|p| doc.pointer(p)) {
                Some(target) => schema = target,
                None => return schema,
            },
            None => return schema,
        }
    }
    schema
}

fn compare_operation(
    old_doc: &Value,
    new_doc: &Value,
    old: &operations::OperationRef,
    new: &operations::OperationRef,
    sent: Option<&BTreeSet<String>>,
) -> Vec<FieldChange> {
    let (o, n) = (op_value(old_doc, old), op_value(new_doc, new));
    let mut out = Vec::new();
    // Without a snapshot of this operation's requests, every request change counts as breaking.
    let sends = |field: &str| sent.is_none_or(|s| s.contains(field));
    // Parameters, by (in, name).
    let params = |v: &Value| -> BTreeMap<(String, String), Value> {
        v.get("parameters")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .map(|p| {
                        (
                            (
                                p["in"].as_str().unwrap_or_default().to_owned(),
                                p["name"].as_str().unwrap_or_default().to_owned(),
                            ),
                            p.clone(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let (op_params, np_params) = (params(o), params(n));
    for key in op_params
        .keys()
        .chain(np_params.keys())
        .collect::<BTreeSet<_>>()
    {
        let place = format!("{} parameter {}", key.0, key.1);
        match (op_params.get(key), np_params.get(key)) {
            (Some(_), None) => out.push(FieldChange {
                breaking: key.0 == "path" || sends(&format!("?{}", key.1)),
                place,
                field: String::new(),
                change: "removed".into(),
                detail: "no longer accepted".into(),
            }),
            (None, Some(p)) => {
                let required = p["required"] == Value::Bool(true);
                out.push(FieldChange {
                    place,
                    field: String::new(),
                    change: "added".into(),
                    detail: if required {
                        "required".into()
                    } else {
                        "optional".into()
                    },
                    breaking: required,
                });
            }
            (Some(a), Some(b)) => {
                if a["required"] != b["required"] {
                    out.push(FieldChange {
                        place: place.clone(),
                        field: String::new(),
                        change: "required".into(),
                        detail: format!("{} -> {}", a["required"], b["required"]),
                        breaking: b["required"] == Value::Bool(true)
                            && key.0 != "path"
                            && !sends(&format!("?{}", key.1)),
                    });
                }
                let param_sent = key.0 == "path" || sends(&format!("?{}", key.1));
                let before = out.len();
                compare_schema(
                    old_doc,
                    new_doc,
                    &a["schema"],
                    &b["schema"],
                    &place,
                    "",
                    Side::Request,
                    &mut out,
                );
                for c in &mut out[before..] {
                    c.breaking &= param_sent;
                }
            }
            (None, None) => {}
        }
    }
    // Request body: a change breaks a request only where this server sends the field (an added
    // required field breaks it always: this server does not send it).
    let before = out.len();
    compare_content(
        old_doc,
        new_doc,
        o.pointer("/requestBody/content"),
        n.pointer("/requestBody/content"),
        "request body",
        Side::Request,
        &mut out,
    );
    for c in &mut out[before..] {
        let added_requirement = (c.change == "added" && c.detail == "required")
            || (c.change == "required" && c.detail.ends_with("-> true"));
        if !added_requirement && !c.field.is_empty() {
            c.breaking &= sends(&c.field);
        }
        // The body as a whole: this server never sends `null` for it.
        if c.field.is_empty() && c.change == "nullable" {
            c.breaking = false;
        }
    }
    // Responses, by status.
    let empty = Map::new();
    let (or, nr) = (
        o.get("responses")
            .and_then(Value::as_object)
            .unwrap_or(&empty),
        n.get("responses")
            .and_then(Value::as_object)
            .unwrap_or(&empty),
    );
    for status in or.keys().chain(nr.keys()).collect::<BTreeSet<_>>() {
        let place = format!("response {status}");
        let success = status.starts_with('2');
        match (or.get(status), nr.get(status)) {
            (Some(_), None) => out.push(FieldChange {
                place,
                field: String::new(),
                change: "status".into(),
                detail: "no longer documented".into(),
                breaking: success,
            }),
            (None, Some(_)) => out.push(FieldChange {
                place,
                field: String::new(),
                change: "status".into(),
                detail: "newly documented".into(),
                breaking: false,
            }),
            (Some(a), Some(b)) => compare_content(
                old_doc,
                new_doc,
                a.get("content"),
                b.get("content"),
                &place,
                if success {
                    Side::Response
                } else {
                    Side::ErrorResponse
                },
                &mut out,
            ),
            (None, None) => {}
        }
    }
    out
}

/// Which way a schema flows decides what breaks this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// What this server sends: a removed field, a new requirement or a type change breaks it.
    Request,
    /// What this server reads on success: a removed required field or a type change breaks it.
    Response,
    /// Error bodies: reported, never breaking (errors are parsed leniently).
    ErrorResponse,
}

fn compare_content(
    old_doc: &Value,
    new_doc: &Value,
    a: Option<&Value>,
    b: Option<&Value>,
    place: &str,
    side: Side,
    out: &mut Vec<FieldChange>,
) {
    let empty = Map::new();
    let (a, b) = (
        a.and_then(Value::as_object).unwrap_or(&empty),
        b.and_then(Value::as_object).unwrap_or(&empty),
    );
    for media in a.keys().chain(b.keys()).collect::<BTreeSet<_>>() {
        match (a.get(media), b.get(media)) {
            (Some(_), None) | (None, Some(_)) => out.push(FieldChange {
                place: place.to_owned(),
                field: String::new(),
                change: "media type".into(),
                detail: format!(
                    "{media} {}",
                    if b.contains_key(media) {
                        "added"
                    } else {
                        "removed"
                    }
                ),
                breaking: side != Side::ErrorResponse && b.get(media).is_none(),
            }),
            (Some(x), Some(y)) => compare_schema(
                old_doc,
                new_doc,
                &x["schema"],
                &y["schema"],
                place,
                "",
                side,
                out,
            ),
            (None, None) => {}
        }
    }
}

fn type_of(s: &Value) -> (BTreeSet<String>, bool) {
    let mut types = BTreeSet::new();
    let mut nullable = s.get("nullable") == Some(&Value::Bool(true));
    match s.get("type") {
        Some(Value::String(t)) => {
            types.insert(t.clone());
        }
        Some(Value::Array(list)) => {
            for t in list.iter().filter_map(Value::as_str) {
                if t == "null" {
                    nullable = true;
                } else {
                    types.insert(t.to_owned());
                }
            }
        }
        _ => {}
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(branches) = s.get(key).and_then(Value::as_array)
            && branches
                .iter()
                .any(|b| b.get("type") == Some(&Value::String("null".into())))
        {
            nullable = true;
        }
    }
    (types, nullable)
}

/// The non-null branch of a `oneOf: [{type: null}, X]`, else the schema itself.
fn non_null(s: &Value) -> &Value {
    for key in ["oneOf", "anyOf"] {
        if let Some(branches) = s.get(key).and_then(Value::as_array) {
            let rest: Vec<&Value> = branches
                .iter()
                .filter(|b| b.get("type") != Some(&Value::String("null".into())))
                .collect();
            if rest.len() == 1 && rest.len() < branches.len() {
                return rest[0];
            }
        }
    }
    s
}

#[allow(clippy::too_many_arguments)]
fn compare_schema(
    old_doc: &Value,
    new_doc: &Value,
    a: &Value,
    b: &Value,
    place: &str,
    field: &str,
    side: Side,
    out: &mut Vec<FieldChange>,
) {
    compare_schema_depth(old_doc, new_doc, a, b, place, field, side, out, 0);
}

#[allow(clippy::too_many_arguments)]
fn compare_schema_depth(
    old_doc: &Value,
    new_doc: &Value,
    a: &Value,
    b: &Value,
    place: &str,
    field: &str,
    side: Side,
    out: &mut Vec<FieldChange>,
    depth: usize,
) {
    if depth > 12 {
        return;
    }
    let (a, b) = (resolve(old_doc, a), resolve(new_doc, b));
    let (ta, na) = type_of(a);
    let (tb, nb) = type_of(b);
    let (a, b) = (resolve(old_doc, non_null(a)), resolve(new_doc, non_null(b)));
    let push = |out: &mut Vec<FieldChange>, change: &str, detail: String, breaking: bool| {
        out.push(FieldChange {
            place: place.to_owned(),
            field: field.to_owned(),
            change: change.to_owned(),
            detail,
            breaking: breaking && side != Side::ErrorResponse,
        });
    };
    let (ta2, _) = type_of(a);
    let (tb2, _) = type_of(b);
    let (ta, tb) = (
        ta.union(&ta2).cloned().collect::<BTreeSet<_>>(),
        tb.union(&tb2).cloned().collect::<BTreeSet<_>>(),
    );
    if !ta.is_empty() && !tb.is_empty() && ta != tb {
        push(out, "type", format!("{ta:?} -> {tb:?}"), true);
    }
    if na != nb {
        // A request field that stops being nullable breaks a `null` this server may send; a
        // response field that becomes nullable breaks a reader that expects a value.
        let breaking = match side {
            Side::Request => na && !nb,
            _ => !na && nb,
        };
        push(out, "nullable", format!("{na} -> {nb}"), breaking);
    }
    if let (Some(ea), Some(eb)) = (
        a.get("enum").and_then(Value::as_array),
        b.get("enum").and_then(Value::as_array),
    ) {
        let removed: Vec<String> = ea
            .iter()
            .filter(|v| !eb.contains(v))
            .map(Value::to_string)
            .collect();
        let added: Vec<String> = eb
            .iter()
            .filter(|v| !ea.contains(v))
            .map(Value::to_string)
            .collect();
        if !removed.is_empty() || !added.is_empty() {
            let breaking = match side {
                Side::Request => !removed.is_empty(),
                _ => !added.is_empty(),
            };
            push(
                out,
                "enum",
                format!(
                    "added [{}], removed [{}]",
                    added.join(", "),
                    removed.join(", ")
                ),
                breaking,
            );
        }
    }
    let empty = Map::new();
    let pa = a
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let pb = b
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let req = |s: &Value| -> BTreeSet<String> {
        s.get("required")
            .and_then(Value::as_array)
            .map(|l| {
                l.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let (ra, rb) = (req(a), req(b));
    let join = |name: &str| {
        if field.is_empty() {
            name.to_owned()
        } else {
            format!("{field}.{name}")
        }
    };
    let removed: Vec<&String> = pa.keys().filter(|k| !pb.contains_key(*k)).collect();
    let added: Vec<&String> = pb.keys().filter(|k| !pa.contains_key(*k)).collect();
    for name in &removed {
        // A removed field next to an added one of the same type looks like a rename.
        let renamed_to = added.iter().find(|n| {
            type_of(resolve(new_doc, &pb[n.as_str()])).0
                == type_of(resolve(old_doc, &pa[name.as_str()])).0
        });
        let breaking = match side {
            Side::Request => true,
            _ => ra.contains(name.as_str()),
        };
        match renamed_to {
            Some(to) if removed.len() == 1 && added.len() == 1 => out.push(FieldChange {
                place: place.to_owned(),
                field: join(name),
                change: "renamed?".into(),
                detail: format!("looks renamed to {to}"),
                breaking: breaking && side != Side::ErrorResponse,
            }),
            _ => out.push(FieldChange {
                place: place.to_owned(),
                field: join(name),
                change: "removed".into(),
                detail: if ra.contains(name.as_str()) {
                    "was required".into()
                } else {
                    "was optional".into()
                },
                breaking: breaking && side != Side::ErrorResponse,
            }),
        }
    }
    for name in &added {
        if removed.len() == 1 && added.len() == 1 {
            let old_type = type_of(resolve(old_doc, &pa[removed[0].as_str()])).0;
            if type_of(resolve(new_doc, &pb[name.as_str()])).0 == old_type {
                continue;
            }
        }
        let required = rb.contains(name.as_str());
        out.push(FieldChange {
            place: place.to_owned(),
            field: join(name),
            change: "added".into(),
            detail: if required {
                "required".into()
            } else {
                "optional".into()
            },
            breaking: side == Side::Request && required,
        });
    }
    for name in pa.keys().filter(|k| pb.contains_key(*k)) {
        let (was, is) = (ra.contains(name), rb.contains(name));
        if was != is {
            let breaking = match side {
                Side::Request => is,
                _ => was,
            };
            out.push(FieldChange {
                place: place.to_owned(),
                field: join(name),
                change: "required".into(),
                detail: format!("{was} -> {is}"),
                breaking: breaking && side != Side::ErrorResponse,
            });
        }
        compare_schema_depth(
            old_doc,
            new_doc,
            &pa[name],
            &pb[name],
            place,
            &join(name),
            side,
            out,
            depth + 1,
        );
    }
    if let (Some(ia), Some(ib)) = (a.get("items"), b.get("items")) {
        compare_schema_depth(
            old_doc,
            new_doc,
            ia,
            ib,
            place,
            &format!("{field}[]"),
            side,
            out,
            depth + 1,
        );
    }
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let api = match self.api {
            Api::Local => "smolvm (local API)",
            Api::Cloud => "smol cloud",
        };
        s.push_str(&format!("# Spec diff: {api}\n\n"));
        s.push_str(&format!("- baseline: `{}`\n", self.baseline));
        s.push_str(&format!(
            "- candidate release: {}\n",
            self.release
                .as_deref()
                .unwrap_or("unknown (a spec file was given)")
        ));
        s.push_str(&format!(
            "- candidate `info.version`: {} (reported, not trusted: smolvm 1.32.2 still says 0.5.2)\n",
            self.spec_version.as_deref().unwrap_or("none")
        ));
        s.push_str(&format!(
            "- verdict: {}\n\n",
            if self.needs_decision {
                "**needs a decision** (unknown operations, breaking changes or stale overrides)"
            } else {
                "nothing needs a decision"
            }
        ));
        let p = &self.parity;
        s.push_str(&format!(
            "## Parity\n\n{} operations on {} paths: {} called, {} omitted on purpose, {} unknown.\n\n",
            p.operations, p.paths, p.called, p.omitted, p.unknown
        ));
        for (title, status) in [
            ("Added", "added"),
            ("Removed", "removed"),
            ("Changed", "changed"),
        ] {
            let ops: Vec<&OperationChange> = self
                .operations
                .iter()
                .filter(|o| o.status == status)
                .collect();
            s.push_str(&format!("## {title} operations ({})\n\n", ops.len()));
            if ops.is_empty() {
                s.push_str("None.\n\n");
                continue;
            }
            for op in ops {
                s.push_str(&format!(
                    "- `{} {}` ({}): {}\n",
                    op.method,
                    op.path,
                    op.operation_id,
                    describe(&op.classification)
                ));
                for c in &op.changes {
                    s.push_str(&format!(
                        "  - {}{}{}: {} ({}){}\n",
                        c.place,
                        if c.field.is_empty() { "" } else { " `" },
                        if c.field.is_empty() {
                            String::new()
                        } else {
                            format!("{}`", c.field)
                        },
                        c.change,
                        c.detail,
                        if c.breaking { " **breaking**" } else { "" }
                    ));
                }
            }
            s.push('\n');
        }
        s.push_str("## Overrides\n\n");
        if self.overrides.is_empty() {
            s.push_str("None.\n");
        }
        for o in &self.overrides {
            s.push_str(&format!(
                "- `{}`: {}{}\n",
                o.id,
                o.status,
                if o.detail.is_empty() {
                    String::new()
                } else {
                    format!(": {}", o.detail)
                }
            ));
        }
        s
    }
}

fn describe(c: &Classification) -> String {
    match c {
        Classification::Used { tools } => format!("used by {}", tools.join(", ")),
        Classification::Internal { why } => format!("used by the server itself ({why})"),
        Classification::Omitted { reason } => format!("omitted: {reason}"),
        Classification::Unknown => {
            "**unknown**: neither used nor recorded as omitted; decide".into()
        }
    }
}
