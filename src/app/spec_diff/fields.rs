//! One operation's parameters, request body and responses compared, with each change marked
//! breaking or not by what this server sends and reads.

use super::model::{ChangeKind, FieldChange};
use super::schema::{Docs, Side, compare_schemas, object};
use crate::spec::operations::OperationRef;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// What this server sends to one operation, per its request snapshots. Without a snapshot of
/// the operation's requests, every request change counts as breaking.
#[derive(Clone, Copy)]
struct Sends<'a>(Option<&'a BTreeSet<String>>);

impl Sends<'_> {
    fn field(self, field: &str) -> bool {
        self.0.is_none_or(|s| s.contains(field))
    }

    fn query(self, name: &str) -> bool {
        self.field(&format!("?{name}"))
    }
}

fn place_change(place: String, change: ChangeKind, detail: &str, breaking: bool) -> FieldChange {
    FieldChange {
        place,
        field: String::new(),
        change,
        detail: detail.into(),
        breaking,
    }
}

pub(super) fn compare_operation(
    docs: Docs,
    old: &OperationRef,
    new: &OperationRef,
    sent: Option<&BTreeSet<String>>,
) -> Vec<FieldChange> {
    let (o, n) = (op_value(docs.old, old), op_value(docs.new, new));
    let sends = Sends(sent);
    let mut out = compare_parameters(docs, o, n, sends);
    out.extend(compare_request_body(docs, o, n, sends));
    out.extend(compare_responses(docs, o, n));
    out
}

fn op_value<'a>(doc: &'a Value, op: &OperationRef) -> &'a Value {
    doc.pointer(&format!(
        "/paths/{}/{}",
        op.path.replace('~', "~0").replace('/', "~1"),
        op.method.to_lowercase()
    ))
    .unwrap_or(&Value::Null)
}

/// An operation's parameters by (in, name).
fn parameters(op: &Value) -> BTreeMap<(String, String), &Value> {
    op.get("parameters")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|p| {
                    let key = (
                        p["in"].as_str().unwrap_or_default().to_owned(),
                        p["name"].as_str().unwrap_or_default().to_owned(),
                    );
                    (key, p)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn compare_parameters(docs: Docs, o: &Value, n: &Value, sends: Sends) -> Vec<FieldChange> {
    let (old_params, new_params) = (parameters(o), parameters(n));
    let mut out = Vec::new();
    let keys: BTreeSet<&(String, String)> = old_params.keys().chain(new_params.keys()).collect();
    for key in keys {
        let (location, name) = (key.0.as_str(), key.1.as_str());
        let place = format!("{location} parameter {name}");
        // A path parameter is always sent; a query parameter when a snapshot shows it.
        let param_sent = location == "path" || sends.query(name);
        match (old_params.get(key), new_params.get(key)) {
            (Some(_), None) => out.push(place_change(
                place,
                ChangeKind::Removed,
                "no longer accepted",
                param_sent,
            )),
            (None, Some(p)) => {
                let required = p["required"] == Value::Bool(true);
                let detail = if required { "required" } else { "optional" };
                out.push(place_change(place, ChangeKind::Added, detail, required));
            }
            (Some(a), Some(b)) => {
                if a["required"] != b["required"] {
                    let detail = format!("{} -> {}", a["required"], b["required"]);
                    let breaking = b["required"] == Value::Bool(true) && !param_sent;
                    out.push(place_change(
                        place.clone(),
                        ChangeKind::Required,
                        &detail,
                        breaking,
                    ));
                }
                let side = Side::Request;
                let mut changes = compare_schemas(docs, &a["schema"], &b["schema"], &place, side);
                for c in &mut changes {
                    c.breaking &= param_sent;
                }
                out.extend(changes);
            }
            (None, None) => {}
        }
    }
    out
}

/// A body change breaks a request only where this server sends the field; an added required
/// field breaks it always, since this server does not send it.
fn compare_request_body(docs: Docs, o: &Value, n: &Value, sends: Sends) -> Vec<FieldChange> {
    let mut out = compare_content(
        docs,
        o.pointer("/requestBody/content"),
        n.pointer("/requestBody/content"),
        "request body",
        Side::Request,
    );
    for c in &mut out {
        let added_requirement = (c.change == ChangeKind::Added && c.detail == "required")
            || (c.change == ChangeKind::Required && c.detail.ends_with("-> true"));
        if !added_requirement && !c.field.is_empty() {
            c.breaking &= sends.field(&c.field);
        }
        // The body as a whole: this server never sends `null` for it.
        if c.field.is_empty() && c.change == ChangeKind::Nullable {
            c.breaking = false;
        }
    }
    out
}

/// Responses by status: a success answer that disappears breaks the reader; error answers are
/// reported but never break (they are parsed leniently).
fn compare_responses(docs: Docs, o: &Value, n: &Value) -> Vec<FieldChange> {
    let empty = Map::new();
    let (or, nr) = (
        object(o, "responses").unwrap_or(&empty),
        object(n, "responses").unwrap_or(&empty),
    );
    let mut out = Vec::new();
    for status in or.keys().chain(nr.keys()).collect::<BTreeSet<_>>() {
        let place = format!("response {status}");
        let success = status.starts_with('2');
        match (or.get(status), nr.get(status)) {
            (Some(_), None) => out.push(place_change(
                place,
                ChangeKind::Status,
                "no longer documented",
                success,
            )),
            (None, Some(_)) => out.push(place_change(
                place,
                ChangeKind::Status,
                "newly documented",
                false,
            )),
            (Some(a), Some(b)) => {
                let side = if success {
                    Side::Response
                } else {
                    Side::ErrorResponse
                };
                out.extend(compare_content(
                    docs,
                    a.get("content"),
                    b.get("content"),
                    &place,
                    side,
                ));
            }
            (None, None) => {}
        }
    }
    out
}

fn compare_content(
    docs: Docs,
    a: Option<&Value>,
    b: Option<&Value>,
    place: &str,
    side: Side,
) -> Vec<FieldChange> {
    let empty = Map::new();
    let (a, b) = (
        a.and_then(Value::as_object).unwrap_or(&empty),
        b.and_then(Value::as_object).unwrap_or(&empty),
    );
    let mut out = Vec::new();
    for media in a.keys().chain(b.keys()).collect::<BTreeSet<_>>() {
        match (a.get(media), b.get(media)) {
            (Some(_), None) | (None, Some(_)) => {
                let now = if b.contains_key(media) {
                    "added"
                } else {
                    "removed"
                };
                out.push(place_change(
                    place.to_owned(),
                    ChangeKind::MediaType,
                    &format!("{media} {now}"),
                    side != Side::ErrorResponse && b.get(media).is_none(),
                ));
            }
            (Some(x), Some(y)) => {
                out.extend(compare_schemas(
                    docs,
                    &x["schema"],
                    &y["schema"],
                    place,
                    side,
                ));
            }
            (None, None) => {}
        }
    }
    out
}
