//! The rows of the run ledger: what is written of a run's start and end, what is read back,
//! and how a read row is shown (`smol://runs`, `smol://runs/{id}`).

use serde_json::{Value, json};

/// How much of each end of a stream a run's row keeps.
pub const STREAM_HEAD_BYTES: usize = 2048;
pub const STREAM_TAIL_BYTES: usize = 2048;

/// One stream as the ledger keeps it: its size, and its head and tail as text (cut on character
/// boundaries; the tail is empty when the head holds it all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamRecord {
    pub bytes: i64,
    /// Bytes between the head and the tail, kept by neither.
    pub dropped: i64,
    pub head: String,
    pub tail: String,
}

impl StreamRecord {
    /// The head and tail of a whole stream.
    pub fn of(bytes: &[u8]) -> StreamRecord {
        let head_end = crate::policy::output::utf8_prefix_len(bytes, STREAM_HEAD_BYTES);
        let rest = &bytes[head_end..];
        let mut tail_start = rest.len().saturating_sub(STREAM_TAIL_BYTES);
        while tail_start < rest.len() && rest[tail_start] & 0b1100_0000 == 0b1000_0000 {
            tail_start += 1;
        }
        StreamRecord::from_parts(bytes.len() as u64, &bytes[..head_end], &rest[tail_start..])
    }

    /// For output kept as it arrived (a job's head and tail): the total and the two ends.
    pub fn from_parts(total: u64, head: &[u8], tail: &[u8]) -> StreamRecord {
        let kept = (head.len() + tail.len()) as u64;
        StreamRecord {
            bytes: i64::try_from(total).unwrap_or(i64::MAX),
            dropped: i64::try_from(total.saturating_sub(kept)).unwrap_or(i64::MAX),
            head: String::from_utf8_lossy(head).into_owned(),
            tail: String::from_utf8_lossy(tail).into_owned(),
        }
    }
}

/// A run's start, as written.
pub(super) struct Begun {
    pub(super) id: i64,
    pub(super) pid: u32,
    pub(super) tool: &'static str,
    pub(super) fleet: &'static str,
    pub(super) machine: String,
    pub(super) command_kind: &'static str,
    pub(super) command: String,
    pub(super) workdir: Option<String>,
    pub(super) env_names: String,
    pub(super) started_ms: i64,
}

/// A run's end, as written.
pub(super) struct Ended {
    pub(super) id: i64,
    pub(super) ended_ms: i64,
    pub(super) outcome: &'static str,
    pub(super) exit_code: Option<i32>,
    pub(super) timed_out: Option<bool>,
    pub(super) error: Option<String>,
    pub(super) stdout: Option<StreamRecord>,
    pub(super) stderr: Option<StreamRecord>,
}

/// A run as `smol://runs` lists it.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub id: i64,
    pub tool: String,
    pub fleet: String,
    pub machine: String,
    pub command_kind: String,
    pub command: String,
    pub started_ms: i64,
    pub ended_ms: Option<i64>,
    pub outcome: String,
    pub exit_code: Option<i32>,
    pub timed_out: Option<bool>,
    pub stdout_bytes: Option<i64>,
    pub stderr_bytes: Option<i64>,
}

/// One run with everything kept of it.
#[derive(Debug, Clone)]
pub struct RunDetail {
    pub summary: RunSummary,
    pub workdir: Option<String>,
    pub env_names: String,
    pub error: Option<String>,
    pub stdout: Option<StreamRecord>,
    pub stderr: Option<StreamRecord>,
    /// What the run cost its machine (JSON), when it was measured.
    pub usage: Option<String>,
}

/// A run's start or end as RFC 3339 text.
fn time(ms: i64) -> Value {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| Value::from(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)))
        .unwrap_or(Value::Null)
}

impl RunSummary {
    fn command_json(&self) -> Value {
        if self.command_kind == "argv" {
            serde_json::from_str(&self.command)
                .unwrap_or_else(|_| Value::from(self.command.clone()))
        } else {
            Value::from(self.command.clone())
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id.to_string(),
            "uri": format!("smol://runs/{}", self.id),
            "tool": self.tool,
            "fleet": self.fleet,
            "machine": self.machine,
            "command": self.command_json(),
            "startedAt": time(self.started_ms),
            "endedAt": self.ended_ms.map_or(Value::Null, time),
            "durationMs": self.ended_ms.map(|end| end - self.started_ms),
            "outcome": self.outcome,
            "exitCode": self.exit_code,
            "timedOut": self.timed_out,
            "stdoutBytes": self.stdout_bytes,
            "stderrBytes": self.stderr_bytes,
        })
    }
}

impl RunDetail {
    pub fn to_json(&self) -> Value {
        let mut value = self.summary.to_json();
        let stream = |s: &Option<StreamRecord>| {
            s.as_ref().map_or(Value::Null, |s| {
                json!({
                    "bytes": s.bytes,
                    "head": s.head,
                    "tail": s.tail,
                    "droppedBytes": s.dropped,
                })
            })
        };
        if let Value::Object(map) = &mut value {
            map.insert("workdir".into(), json!(self.workdir));
            map.insert(
                "envNames".into(),
                serde_json::from_str(&self.env_names).unwrap_or(Value::Array(vec![])),
            );
            map.insert("error".into(), json!(self.error));
            map.insert("stdout".into(), stream(&self.stdout));
            map.insert("stderr".into(), stream(&self.stderr));
            map.insert(
                "usage".into(),
                self.usage
                    .as_deref()
                    .and_then(|u| serde_json::from_str(u).ok())
                    .unwrap_or(Value::Null),
            );
        }
        value
    }
}

/// A background job as the ledger keeps it while it runs: enough for a later process to find
/// it in its machine and take it over (its marker is its id; its files start at `base`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    pub id: String,
    /// Its row in `runs`, when the run was recorded.
    pub run_id: Option<i64>,
    pub fleet: crate::fleet::FleetKind,
    /// The engine it runs on, as the ephemeral record names engines (a named serve, the
    /// engine binary a process starts, the cloud's URL): a process on another engine leaves
    /// it alone.
    pub engine: String,
    pub machine: String,
    /// The command as list-jobs shows it.
    pub command: String,
    pub base: String,
    pub started_ms: i64,
    pub timeout_secs: u64,
}

/// How a job ended, as the ledger keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct JobEnd {
    pub(super) id: String,
    pub(super) state: &'static str,
    pub(super) exit_code: Option<i32>,
    pub(super) reason: Option<String>,
    pub(super) ended_ms: i64,
}

/// An MCP task as the ledger keeps it: enough to tell a client polling it after the process
/// that ran it has gone that it is gone, for as long as its TTL would have kept it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRecord {
    pub id: String,
    pub pid: u32,
    pub tool: String,
    pub created_ms: i64,
    pub ttl_ms: i64,
    /// How it ended in its process (`completed`, `failed`, `cancelled`), if it did.
    pub outcome: Option<String>,
}

/// An idempotency key as the ledger keeps it: the call it names (tool and a fingerprint of its
/// arguments, with the arguments as shown in a refusal), who runs it, and once it succeeded its
/// answer, which a repeat of the call receives instead of running it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub key: String,
    pub pid: u32,
    pub tool: String,
    pub fingerprint: String,
    /// The arguments as a refusal names them (values an agent should not see again hidden).
    pub arguments: String,
    pub started_ms: i64,
    /// The answer, as JSON, once the call succeeded; `None` while it runs, or once dropped.
    pub answer: Option<String>,
    /// The call succeeded, but its answer was dropped to keep the ledger within its bound
    /// (`store::KEY_ANSWERS_MAX_BYTES`): a repeat is told so rather than run again.
    pub answer_dropped: bool,
}
