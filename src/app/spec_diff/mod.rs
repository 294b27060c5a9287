//! The spec-diff report: what a new smolvm release (or cloud spec) changes for this server.
//!
//! It compares a candidate spec, vendored with the same facts-only step as `specs/`, with the
//! vendored spec the clients are generated from, and classifies every difference by what this
//! server does with the operation: used by named tools, omitted on purpose, or unknown (a
//! decision to make). It also re-checks every override against the candidate.
//!
//! `operations` diffs and classifies operations, `fields` compares one operation's parameters,
//! body and responses, `schema` compares two schemas field by field, `snapshots` reads which
//! request fields this server sends, and `render` writes the Markdown; `model` is the report's
//! own vocabulary, which all of them share.

mod fields;
mod model;
mod operations;
mod render;
mod schema;
mod snapshots;

pub use model::*;
pub use operations::diff_specs;
pub use snapshots::{SentFields, read_request_snapshots, sent_fields};

use crate::spec::overrides::Overrides;
use crate::spec::vendor;
use serde_json::Value;

/// Compares a raw candidate spec with the vendored one of `api`. `snapshots` are the texts of
/// this API's request snapshots (see [`read_request_snapshots`]): what they send is what a
/// change can break.
pub fn diff(
    api: Api,
    candidate_raw: &Value,
    release: Option<String>,
    snapshots: &[String],
) -> Result<Report, DiffError> {
    let vendored = api.vendored();
    let baseline: Value =
        serde_json::from_str(vendored.spec_text).map_err(|source| DiffError::Baseline {
            file: vendored.spec_file,
            source,
        })?;
    let overrides = Overrides::parse(vendored.overrides_text)?;
    let candidate = vendor::facts_only(candidate_raw);
    let sent = sent_fields(&baseline, snapshots);
    Ok(diff_specs(
        api,
        &baseline,
        &candidate,
        Some(&overrides),
        &sent,
        release,
    ))
}
