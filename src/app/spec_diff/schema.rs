//! Two schemas compared field by field: type, nullability, enum values, properties added,
//! removed, renamed-looking or newly required, recursively into properties and items.

use super::model::{ChangeKind, FieldChange};
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// The two documents the schemas' `$ref`s point into.
#[derive(Debug, Clone, Copy)]
pub(super) struct Docs<'a> {
    pub old: &'a Value,
    pub new: &'a Value,
}

/// Which way a schema flows decides what breaks this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    /// What this server sends: a removed field, a new requirement or a type change breaks it.
    Request,
    /// What this server reads on success: a removed required field or a type change breaks it.
    Response,
    /// Error bodies: reported, never breaking (errors are parsed leniently).
    ErrorResponse,
}

/// Beyond this depth a schema is assumed to recurse into itself.
const MAX_DEPTH: usize = 12;

/// The changes between schema `a` of the old document and `b` of the new one, found at `place`.
pub(super) fn compare_schemas(
    docs: Docs,
    a: &Value,
    b: &Value,
    place: &str,
    side: Side,
) -> Vec<FieldChange> {
    let mut diff = SchemaDiff {
        docs,
        place,
        side,
        out: Vec::new(),
    };
    diff.compare(a, b, "", 0);
    diff.out
}

/// What stays the same while one schema pair is walked.
struct SchemaDiff<'a> {
    docs: Docs<'a>,
    place: &'a str,
    side: Side,
    out: Vec<FieldChange>,
}

impl SchemaDiff<'_> {
    fn push(&mut self, field: String, change: ChangeKind, detail: String, breaking: bool) {
        self.out.push(FieldChange {
            place: self.place.to_owned(),
            field,
            change,
            detail,
            breaking: breaking && self.side != Side::ErrorResponse,
        });
    }

    /// `on_request` when the schema is sent, `on_response` when it is read.
    fn breaks(&self, on_request: bool, on_response: bool) -> bool {
        match self.side {
            Side::Request => on_request,
            Side::Response | Side::ErrorResponse => on_response,
        }
    }

    fn compare(&mut self, a: &Value, b: &Value, field: &str, depth: usize) {
        if depth > MAX_DEPTH {
            return;
        }
        let (a, b) = (resolve(self.docs.old, a), resolve(self.docs.new, b));
        let (ta, na) = type_of(a);
        let (tb, nb) = type_of(b);
        let (a, b) = (
            resolve(self.docs.old, non_null(a)),
            resolve(self.docs.new, non_null(b)),
        );
        let ta: BTreeSet<String> = ta.union(&type_of(a).0).cloned().collect();
        let tb: BTreeSet<String> = tb.union(&type_of(b).0).cloned().collect();
        if !ta.is_empty() && !tb.is_empty() && ta != tb {
            let detail = format!("{ta:?} -> {tb:?}");
            self.push(field.to_owned(), ChangeKind::Type, detail, true);
        }
        if na != nb {
            // A request field that stops being nullable breaks a `null` this server may send; a
            // response field that becomes nullable breaks a reader that expects a value.
            let breaking = self.breaks(na && !nb, !na && nb);
            let detail = format!("{na} -> {nb}");
            self.push(field.to_owned(), ChangeKind::Nullable, detail, breaking);
        }
        self.compare_enums(a, b, field);
        self.compare_properties(a, b, field, depth);
        if let (Some(ia), Some(ib)) = (a.get("items"), b.get("items")) {
            self.compare(ia, ib, &format!("{field}[]"), depth + 1);
        }
    }

    fn compare_enums(&mut self, a: &Value, b: &Value, field: &str) {
        let (Some(ea), Some(eb)) = (
            a.get("enum").and_then(Value::as_array),
            b.get("enum").and_then(Value::as_array),
        ) else {
            return;
        };
        let only_in = |x: &[Value], y: &[Value]| -> Vec<String> {
            x.iter()
                .filter(|v| !y.contains(v))
                .map(Value::to_string)
                .collect()
        };
        let (removed, added) = (only_in(ea, eb), only_in(eb, ea));
        if removed.is_empty() && added.is_empty() {
            return;
        }
        let breaking = self.breaks(!removed.is_empty(), !added.is_empty());
        let detail = format!(
            "added [{}], removed [{}]",
            added.join(", "),
            removed.join(", ")
        );
        self.push(field.to_owned(), ChangeKind::Enum, detail, breaking);
    }

    fn compare_properties(&mut self, a: &Value, b: &Value, field: &str, depth: usize) {
        let empty = Map::new();
        let (pa, pb) = (
            object(a, "properties").unwrap_or(&empty),
            object(b, "properties").unwrap_or(&empty),
        );
        let (ra, rb) = (required(a), required(b));
        let join = |name: &str| {
            if field.is_empty() {
                name.to_owned()
            } else {
                format!("{field}.{name}")
            }
        };
        let removed: Vec<&String> = pa.keys().filter(|k| !pb.contains_key(*k)).collect();
        let added: Vec<&String> = pb.keys().filter(|k| !pa.contains_key(*k)).collect();
        // One field gone and one of the same type new looks like a rename, reported once.
        let old_type = |name: &str| type_of(resolve(self.docs.old, &pa[name])).0;
        let new_type = |name: &str| type_of(resolve(self.docs.new, &pb[name])).0;
        let rename = match (removed.as_slice(), added.as_slice()) {
            ([from], [to]) if old_type(from) == new_type(to) => Some(*to),
            _ => None,
        };
        for name in &removed {
            let breaking = self.breaks(true, ra.contains(name.as_str()));
            match &rename {
                Some(to) => {
                    let detail = format!("looks renamed to {to}");
                    self.push(join(name), ChangeKind::Renamed, detail, breaking);
                }
                None => {
                    let was = if ra.contains(name.as_str()) {
                        "was required"
                    } else {
                        "was optional"
                    };
                    self.push(join(name), ChangeKind::Removed, was.into(), breaking);
                }
            }
        }
        for name in added.iter().filter(|_| rename.is_none()) {
            let required = rb.contains(name.as_str());
            let detail = if required { "required" } else { "optional" };
            let breaking = self.side == Side::Request && required;
            self.push(join(name), ChangeKind::Added, detail.into(), breaking);
        }
        for name in pa.keys().filter(|k| pb.contains_key(*k)) {
            let (was, is) = (ra.contains(name), rb.contains(name));
            if was != is {
                let breaking = self.breaks(is, was);
                let detail = format!("{was} -> {is}");
                self.push(join(name), ChangeKind::Required, detail, breaking);
            }
            self.compare(&pa[name], &pb[name], &join(name), depth + 1);
        }
    }
}

pub(super) fn object<'a>(v: &'a Value, key: &str) -> Option<&'a Map<String, Value>> {
    v.get(key).and_then(Value::as_object)
}

fn required(s: &Value) -> BTreeSet<String> {
    s.get("required")
        .and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
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

/// The types a schema allows besides null, and whether it allows null (3.0 `nullable`, a 3.1
/// type list with `null`, or a null branch).
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
            && branches.iter().any(is_null_branch)
        {
            nullable = true;
        }
    }
    (types, nullable)
}

fn is_null_branch(b: &Value) -> bool {
    b.get("type") == Some(&Value::String("null".into()))
}

/// The non-null branch of a `oneOf: [{type: null}, X]`, else the schema itself.
fn non_null(s: &Value) -> &Value {
    for key in ["oneOf", "anyOf"] {
        if let Some(branches) = s.get(key).and_then(Value::as_array) {
            let rest: Vec<&Value> = branches.iter().filter(|b| !is_null_branch(b)).collect();
            if rest.len() == 1 && rest.len() < branches.len() {
                return rest[0];
            }
        }
    }
    s
}
