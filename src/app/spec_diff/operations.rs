//! The operation-level diff: which operations were added, removed or changed, what this server
//! does with each, how the overrides fare against the candidate, and the parity counts.

use super::fields::compare_operation;
use super::model::{
    Api, ChangeKind, Classification, FieldChange, OperationChange, OperationStatus, OverrideCheck,
    OverrideStatus, Parity, Report,
};
use super::schema::Docs;
use super::snapshots::SentFields;
use crate::policy::operations::Use;
use crate::spec::operations::{self, OperationRef};
use crate::spec::overrides::{Fix, FixStatus, Overrides, Patch, split_pointer};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Operations by (path, method), the order the report lists them in.
type Routes = BTreeMap<(String, String), OperationRef>;

fn routes(doc: &Value) -> Routes {
    operations::list(doc)
        .into_iter()
        .map(|op| ((op.path.clone(), op.method.clone()), op))
        .collect()
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
    let (old_ops, new_ops) = (routes(baseline), routes(candidate));
    let classifier = Classifier { api, overrides };
    let docs = Docs {
        old: baseline,
        new: candidate,
    };
    let mut changes = Vec::new();
    let keys: BTreeSet<&(String, String)> = old_ops.keys().chain(new_ops.keys()).collect();
    for key in keys {
        match (old_ops.get(key), new_ops.get(key)) {
            (Some(old), None) => changes.push(removed(&classifier, old)),
            (None, Some(new)) => changes.push(added(&classifier, new)),
            (Some(old), Some(new)) => {
                let sent_here = sent.get(&(old.method.clone(), old.path.clone()));
                changes.extend(changed(&classifier, docs, old, new, sent_here));
            }
            (None, None) => {}
        }
    }
    let override_checks = overrides.map(|o| check_overrides(o, candidate));
    let override_checks = override_checks.unwrap_or_default();
    let parity = parity(&classifier, &new_ops);
    let needs_decision = parity.unknown > 0
        || changes.iter().any(|c| c.changes.iter().any(|f| f.breaking))
        || override_checks
            .iter()
            .any(|o| o.status != OverrideStatus::Applies);
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

fn operation_change(
    op: &OperationRef,
    status: OperationStatus,
    classification: Classification,
    changes: Vec<FieldChange>,
) -> OperationChange {
    OperationChange {
        method: op.method.clone(),
        path: op.path.clone(),
        operation_id: op.operation_id.clone(),
        status,
        classification,
        changes,
    }
}

fn whole_operation(change: ChangeKind, detail: String, breaking: bool) -> FieldChange {
    FieldChange {
        place: "operation".into(),
        field: String::new(),
        change,
        detail,
        breaking,
    }
}

fn removed(classifier: &Classifier, old: &OperationRef) -> OperationChange {
    let classification = classifier.classify(old);
    let gone = whole_operation(
        ChangeKind::Removed,
        "the candidate has no such route".into(),
        classification.is_called(),
    );
    operation_change(old, OperationStatus::Removed, classification, vec![gone])
}

fn added(classifier: &Classifier, new: &OperationRef) -> OperationChange {
    let classification = classifier.classify(new);
    operation_change(new, OperationStatus::Added, classification, Vec::new())
}

/// An operation both specs have, when anything about it differs. A change breaks the server
/// only on an operation it calls.
fn changed(
    classifier: &Classifier,
    docs: Docs,
    old: &OperationRef,
    new: &OperationRef,
    sent: Option<&BTreeSet<String>>,
) -> Option<OperationChange> {
    let mut field_changes = compare_operation(docs, old, new, sent);
    let renamed = old.operation_id != new.operation_id;
    if field_changes.is_empty() && !renamed {
        return None;
    }
    let classification = classifier.classify(old);
    let called = classification.is_called();
    for c in &mut field_changes {
        c.breaking &= called;
    }
    if renamed {
        let detail = format!("{} -> {}", old.operation_id, new.operation_id);
        field_changes.insert(0, whole_operation(ChangeKind::OperationId, detail, called));
    }
    Some(operation_change(
        old,
        OperationStatus::Changed,
        classification,
        field_changes,
    ))
}

fn check_overrides(overrides: &Overrides, candidate: &Value) -> Vec<OverrideCheck> {
    overrides
        .fixes
        .iter()
        .map(|fix| {
            let (status, detail) = match overrides.status(fix, candidate) {
                FixStatus::Applies => (OverrideStatus::Applies, String::new()),
                FixStatus::NoLongerNeeded => (
                    OverrideStatus::NoLongerNeeded,
                    "the candidate already has what the fix writes: remove the fix".into(),
                ),
                FixStatus::NoLongerMatches { pointer, found } => (
                    OverrideStatus::NoLongerMatches,
                    format!(
                        "{pointer} now holds {}",
                        found.map_or("nothing".to_owned(), |v| short(&v))
                    ),
                ),
            };
            OverrideCheck {
                id: fix.id.clone(),
                status,
                detail,
            }
        })
        .collect()
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 120 {
        format!("{}...", s.chars().take(120).collect::<String>())
    } else {
        s
    }
}

fn parity(classifier: &Classifier, new_ops: &Routes) -> Parity {
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
        match classifier.classify(op) {
            Classification::Used { .. } | Classification::Internal { .. } => parity.called += 1,
            Classification::Omitted { .. } => parity.omitted += 1,
            Classification::Unknown => parity.unknown += 1,
        }
    }
    parity
}

/// What this server does with an operation: the exhaustive match in `src/policy/operations.rs` for
/// the operations the vendored spec has, the overrides for the rest.
struct Classifier<'a> {
    api: Api,
    overrides: Option<&'a Overrides>,
}

impl Classifier<'_> {
    fn classify(&self, op: &OperationRef) -> Classification {
        match self.api.classify(&op.operation_id) {
            Some(used @ Use::Tools(_)) => Classification::Used {
                tools: used.tool_names().into_iter().map(String::from).collect(),
            },
            Some(Use::Internal(why)) => Classification::Internal { why: why.into() },
            Some(Use::Omitted) => Classification::Omitted {
                reason: self
                    .overrides
                    .and_then(|o| o.omission_for(&op.operation_id))
                    .map(|o| o.reason.clone())
                    .unwrap_or_default(),
            },
            None => self.not_vendored(op),
        }
    }

    /// An operation the vendored spec lacks.
    fn not_vendored(&self, op: &OperationRef) -> Classification {
        let Some(overrides) = self.overrides else {
            return Classification::Unknown;
        };
        // A route an override replaces (the published cloud files route, say) is accounted for
        // by that override.
        if let Some(fix) = overrides
            .fixes
            .iter()
            .find(|fix| removes_path(fix, &op.path))
        {
            return Classification::Omitted {
                reason: format!("replaced by override {}: {}", fix.id, fix.reason),
            };
        }
        // It may still be a recorded omission, by route.
        match overrides
            .omissions
            .iter()
            .find(|om| om.method == op.method && om.path == op.path)
        {
            Some(om) => Classification::Omitted {
                reason: om.reason.clone(),
            },
            None => Classification::Unknown,
        }
    }
}

fn removes_path(fix: &Fix, path: &str) -> bool {
    fix.patches.iter().any(|p| {
        matches!(p, Patch::Remove { pointer, .. }
            if split_pointer(pointer) == ("/paths".to_owned(), path.to_owned()))
    })
}
