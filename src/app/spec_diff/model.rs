//! What a spec-diff report says: the API it is about, how each operation and field changed,
//! what this server does with each operation, how each override fares.

use crate::policy::operations::{Use, classify_cloud, classify_local};
use crate::spec::overrides::OverrideError;
use crate::spec::{CLOUD_API, LOCAL_API, VendoredApi};
use serde::{Serialize, Serializer};
use std::path::PathBuf;

/// Which vendored API a report is about; the specs and overrides are compiled in, so the report
/// needs no checkout (only the request snapshots, read at run time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    Local,
    Cloud,
}

impl Api {
    pub fn vendored(self) -> VendoredApi {
        match self {
            Api::Local => LOCAL_API,
            Api::Cloud => CLOUD_API,
        }
    }

    /// How the request snapshots of this API are named (`local_requests__*.snap`).
    pub fn snapshot_prefix(self) -> &'static str {
        match self {
            Api::Local => "local_requests__",
            Api::Cloud => "cloud_requests__",
        }
    }

    /// What the server does with an operation of the vendored spec, by operationId.
    pub(super) fn classify(self, operation_id: &str) -> Option<Use> {
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

/// A closed set of statuses that print as the words the report has always used, in the Markdown
/// and in the JSON alike (one table, so the two cannot disagree).
macro_rules! words {
    (
        $(#[$meta:meta])*
        pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)* }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            pub fn as_str(&self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }
    };
}

words! {
    /// How an operation differs between the vendored spec and the candidate.
    pub enum OperationStatus {
        Added => "added",
        Removed => "removed",
        Changed => "changed",
    }
}

words! {
    /// What changed at one place of an operation.
    pub enum ChangeKind {
        Added => "added",
        Removed => "removed",
        /// A removed field next to an added one of the same type.
        Renamed => "renamed?",
        Type => "type",
        Required => "required",
        Nullable => "nullable",
        Enum => "enum",
        MediaType => "media type",
        /// A response status documented or no longer documented.
        Status => "status",
        OperationId => "operationId",
    }
}

words! {
    /// How an override relates to the candidate.
    pub enum OverrideStatus {
        Applies => "applies",
        NoLongerNeeded => "no longer needed",
        NoLongerMatches => "no longer matches",
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

impl Classification {
    /// Used by a tool or by the server itself: a change to it can break the server.
    pub(super) fn is_called(&self) -> bool {
        matches!(
            self,
            Classification::Used { .. } | Classification::Internal { .. }
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldChange {
    /// Where: `request body`, `response 200`, `query parameter tail`...
    pub place: String,
    /// A dotted path inside that schema (`resources.cpus`), empty for the place itself.
    pub field: String,
    pub change: ChangeKind,
    pub detail: String,
    pub breaking: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationChange {
    pub method: String,
    pub path: String,
    pub operation_id: String,
    pub status: OperationStatus,
    pub classification: Classification,
    pub changes: Vec<FieldChange>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OverrideCheck {
    pub id: String,
    pub status: OverrideStatus,
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

#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("the vendored spec {file} is not JSON: {source}")]
    Baseline {
        file: &'static str,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Overrides(#[from] OverrideError),
    #[error("cannot read the request snapshots in {}: {source}", dir.display())]
    Snapshots {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{} holds no {prefix}*.snap request snapshot", dir.display())]
    NoSnapshots { dir: PathBuf, prefix: &'static str },
}
