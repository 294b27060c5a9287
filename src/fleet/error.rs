//! One error type for both fleets. It keeps what upstream said (status, code, message) so that a
//! tool error can pass the engine's or the service's own words to the agent.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The machine (or file) does not exist.
    NotFound,
    /// A name is taken, or the machine is in the wrong state for the request.
    Conflict,
    /// Upstream refused the request as malformed or invalid (400, 422).
    Invalid,
    /// The key is missing, unknown, expired, or lacks a scope (401, 403).
    Unauthorized,
    /// The cloud account cannot pay for this (402).
    PaymentRequired,
    /// Upstream asked us to slow down (429).
    RateLimited,
    /// This fleet cannot do what was asked (mounts on cloud, pull-image on cloud...).
    Unsupported,
    /// The request was refused before sending because its arguments contradict each other.
    Refused,
    /// No answer within the deadline.
    Timeout,
    /// The connection failed: nothing reached upstream, or the answer was cut off.
    Transport,
    /// Upstream failed (5xx) or answered a status the API does not document.
    Upstream,
    /// Upstream answered 2xx with a body this server cannot read.
    BadResponse,
    /// The cloud account is suspended or otherwise cannot create machines.
    AccountNotActive,
}

impl ErrorKind {
    /// A stable upper-case code, the first word of a tool error.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "NOT_FOUND",
            ErrorKind::Conflict => "CONFLICT",
            ErrorKind::Invalid => "INVALID",
            ErrorKind::Unauthorized => "UNAUTHORIZED",
            ErrorKind::PaymentRequired => "PAYMENT_REQUIRED",
            ErrorKind::RateLimited => "RATE_LIMITED",
            ErrorKind::Unsupported => "UNSUPPORTED",
            ErrorKind::Refused => "REFUSED",
            ErrorKind::Timeout => "TIMEOUT",
            ErrorKind::Transport => "TRANSPORT",
            ErrorKind::Upstream => "UPSTREAM",
            ErrorKind::BadResponse => "BAD_RESPONSE",
            ErrorKind::AccountNotActive => "ACCOUNT_NOT_ACTIVE",
        }
    }

    pub fn from_status(status: u16) -> Self {
        match status {
            404 | 410 => ErrorKind::NotFound,
            409 => ErrorKind::Conflict,
            400 | 405 | 413 | 415 | 422 => ErrorKind::Invalid,
            401 | 403 => ErrorKind::Unauthorized,
            402 => ErrorKind::PaymentRequired,
            429 => ErrorKind::RateLimited,
            408 | 504 => ErrorKind::Timeout,
            _ => ErrorKind::Upstream,
        }
    }
}

/// A failed fleet call. `context` says what was being done ("create machine m1"), `message` is
/// upstream's own text where there was one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetError {
    pub kind: ErrorKind,
    pub context: String,
    pub message: String,
    /// The HTTP status upstream answered, if it answered.
    pub status: Option<u16>,
    /// Upstream's machine-readable code (`NOT_FOUND`, `payment_required`...), if it sent one.
    pub upstream_code: Option<String>,
    /// The cloud's `x-request-id`, which its operators ask for.
    pub request_id: Option<String>,
    /// How long upstream asked us to wait before trying again (`Retry-After`).
    pub retry_after: Option<std::time::Duration>,
}

impl FleetError {
    pub fn new(kind: ErrorKind, context: impl Into<String>, message: impl Into<String>) -> Self {
        FleetError {
            kind,
            context: context.into(),
            message: message.into(),
            status: None,
            upstream_code: None,
            request_id: None,
            retry_after: None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.kind == ErrorKind::NotFound
    }
}

impl fmt::Display for FleetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.context)?;
        if let Some(status) = self.status {
            write!(f, "HTTP {status}")?;
            if let Some(code) = &self.upstream_code {
                write!(f, " {code}")?;
            }
            write!(f, ": ")?;
        }
        write!(f, "{}", self.message)?;
        if let Some(id) = &self.request_id {
            write!(f, " (x-request-id {id})")?;
        }
        Ok(())
    }
}

impl std::error::Error for FleetError {}

pub type FleetResult<T> = Result<T, FleetError>;
