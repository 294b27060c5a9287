//! A tool failure as the agent reads it: a stable code, then a message (`NOT_FOUND: ...`).

use crate::fleet::{ErrorKind, FleetError};
use crate::process::ephemeral::RecordError;

/// What went wrong, as the first word of a tool error. A fleet's failures keep the fleet's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolErrorKind {
    /// An argument is missing, mistyped, out of range or contradicts another.
    InvalidArgument,
    /// The machine never ran a command within the readiness timeout.
    NotReady,
    /// The client cancelled the call.
    Cancelled,
    /// The crash-proof record of ephemeral machines could not be read or written.
    Record,
    /// A defect of this server (a result that does not serialize, say).
    Internal,
    /// An operator's limit (machines, cloud spend) would be passed: nothing was done.
    LimitReached,
    /// What a limit or an idempotency key depends on could not be read or written in the
    /// store: nothing was done rather than something unchecked.
    StoreUnavailable,
    /// The fleet answered with this failure.
    Fleet(ErrorKind),
}

impl ToolErrorKind {
    pub fn code(self) -> &'static str {
        match self {
            ToolErrorKind::InvalidArgument => "INVALID_ARGUMENT",
            ToolErrorKind::NotReady => "NOT_READY",
            ToolErrorKind::Cancelled => "CANCELLED",
            ToolErrorKind::Record => "RECORD",
            ToolErrorKind::Internal => "INTERNAL",
            ToolErrorKind::LimitReached => "LIMIT_REACHED",
            ToolErrorKind::StoreUnavailable => "STORE_UNAVAILABLE",
            ToolErrorKind::Fleet(kind) => kind.code(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", kind.code())]
pub struct ToolError {
    pub kind: ToolErrorKind,
    pub message: String,
    /// For a refused argument, the argument and the words apart, as they were given (the
    /// message joins them).
    pub refused: Option<RefusedArgument>,
}

/// A refused argument: its name, and why and what would be accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedArgument {
    pub argument: String,
    pub words: String,
}

impl ToolError {
    pub fn new(kind: ToolErrorKind, message: impl Into<String>) -> Self {
        ToolError {
            kind,
            message: message.into(),
            refused: None,
        }
    }

    /// A refused argument: its name, then why and what would be accepted.
    pub fn argument(arg: &str, message: impl std::fmt::Display) -> Self {
        let words = message.to_string();
        ToolError {
            kind: ToolErrorKind::InvalidArgument,
            message: format!("{arg}: {words}"),
            refused: Some(RefusedArgument {
                argument: arg.to_owned(),
                words,
            }),
        }
    }

    pub fn cancelled() -> Self {
        ToolError::new(ToolErrorKind::Cancelled, "the client cancelled this call")
    }

    pub fn code(&self) -> &'static str {
        self.kind.code()
    }

    pub fn is(&self, kind: ErrorKind) -> bool {
        self.kind == ToolErrorKind::Fleet(kind)
    }
}

impl From<FleetError> for ToolError {
    fn from(e: FleetError) -> Self {
        // The engine's words when the host cannot run a guest at all (or this user cannot reach
        // its hypervisor): the agent can do nothing about it but pass the cause and the fix on.
        let message = crate::fleet::diagnosis::with_host_hint(&e.to_string());
        ToolError::new(ToolErrorKind::Fleet(e.kind), message)
    }
}

impl From<RecordError> for ToolError {
    fn from(e: RecordError) -> Self {
        ToolError::new(ToolErrorKind::Record, e.to_string())
    }
}

/// At most a short prefix of a value the agent sent, for an error message: a 1 MB name must not
/// make a 1 MB error.
pub fn quote(value: &str) -> String {
    const MAX_CHARS: usize = 80;
    if value.chars().count() <= MAX_CHARS {
        return format!("{value:?}");
    }
    let prefix: String = value.chars().take(MAX_CHARS).collect();
    format!("{prefix:?}... ({} bytes)", value.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable_words() {
        let e = ToolError::argument("cpus", "65 is out of range: give 1 to 64");
        assert_eq!(
            e.to_string(),
            "INVALID_ARGUMENT: cpus: 65 is out of range: give 1 to 64"
        );
        let fleet: ToolError = FleetError::new(ErrorKind::NotFound, "get machine x", "gone").into();
        assert_eq!(fleet.to_string(), "NOT_FOUND: get machine x: gone");
        assert!(fleet.is(ErrorKind::NotFound));
        let boot: ToolError = FleetError::new(
            ErrorKind::Upstream,
            "start machine m",
            "HTTP 500: vm failed: no boot progress after 30s",
        )
        .into();
        assert!(
            boot.message.contains("could not boot a guest"),
            "{}",
            boot.message
        );
        // On a host known to boot none (these CI hosts, kvm_pvm), the hint says what the host
        // is rather than listing every hypervisor.
        let names_the_hypervisor = match crate::fleet::diagnosis::this_virtual_host() {
            Some(_) => boot.message.contains("is itself a virtual machine"),
            None => boot.message.contains("Hypervisor.framework"),
        };
        assert!(
            boot.message.contains("`smol-mcp doctor`") && names_the_hypervisor,
            "the hint names the check to run and the hypervisor: {}",
            boot.message
        );
        let unrelated: ToolError = FleetError::new(
            ErrorKind::Upstream,
            "start machine m",
            "HTTP 500: disk full",
        )
        .into();
        assert!(
            !unrelated.message.contains("smol-mcp doctor"),
            "only a boot failure gets the hint: {}",
            unrelated.message
        );
    }

    #[test]
    fn long_values_are_quoted_short() {
        assert_eq!(quote("web"), "\"web\"");
        let long = "x".repeat(1_000_000);
        let q = quote(&long);
        assert!(q.len() < 120 && q.ends_with("(1000000 bytes)"), "{q}");
    }
}
