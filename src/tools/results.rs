//! What each tool answers, as structured content (and its output schema).

use super::{ToolError, ToolErrorKind};
use crate::fleet::Machine;
use schemars::JsonSchema;
use serde::Serialize;

/// A tool's answer: the structured result and, for a page of a file, the page itself, which
/// travels once, as a content block of its own, rather than inside the structured result and
/// again in the text block that repeats it for clients without structured content.
#[derive(Debug)]
pub struct Answer {
    pub structured: serde_json::Value,
    pub page: Option<String>,
}

/// A result type: serialized as the structured content; `take_page` moves out what travels as
/// a content block of its own.
pub trait Reply: Serialize {
    fn take_page(&mut self) -> Option<String> {
        None
    }
}

macro_rules! replies_without_a_page {
    ($($ty:ty),* $(,)?) => {
        $(impl Reply for $ty {})*
    };
}

replies_without_a_page!(
    MachineList,
    Created,
    Started,
    Stopped,
    CommandRun,
    RunOnce,
    FileWritten,
    Branched,
    Logs,
    Machine,
    crate::fleet::Deleted,
    crate::fleet::PulledImage,
);

impl Reply for FileRead {
    fn take_page(&mut self) -> Option<String> {
        Some(std::mem::take(&mut self.content))
    }
}

pub fn answer<R: Reply>(mut result: R) -> Result<Answer, ToolError> {
    let page = result.take_page();
    let structured = serde_json::to_value(&result)
        .map_err(|e| ToolError::new(ToolErrorKind::Internal, e.to_string()))?;
    Ok(Answer { structured, page })
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct MachineList {
    pub machines: Vec<Machine>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Created {
    pub machine: Machine,
    /// Deleted by the server: when this session ends, or once its lease runs out for a client without sessions (the name has the ephemeral prefix).
    pub ephemeral: bool,
    /// A command has run in the machine.
    pub ready: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Started {
    pub machine: Machine,
    /// A command has run in the machine (false when wait was false).
    pub ready: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Stopped {
    pub machine: Machine,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Overflow {
    /// stdout or stderr.
    pub stream: String,
    /// Where the whole stream was written inside the machine.
    pub path: String,
    /// The whole stream's length.
    pub bytes: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandRun {
    pub stdout: String,
    pub stderr: String,
    /// The command's exit status; non-zero is a result, not an error.
    pub exit_code: i32,
    /// The command hit its timeout and was killed (exit 124).
    pub timed_out: bool,
    /// Some output was left out of stdout or stderr.
    pub truncated: bool,
    /// Streams written whole into the machine because they were over the budget.
    pub overflow: Vec<Overflow>,
    /// The machine was stopped and this command started it (it is left running).
    pub started_machine: bool,
    /// Present when the command failed on a local machine with blocked or allow-listed egress
    /// and the engine refused egress while it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_egress: Option<Vec<BlockedEgress>>,
}

/// Egress the machine's policy refused while the command ran, by destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockedEgress {
    /// As the engine recorded it: an IP address (a name outside allowHosts fails to resolve
    /// instead, and is not recorded).
    pub host: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Refusals during the command.
    pub count: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunOnce {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
    pub timed_out: bool,
    pub truncated: bool,
    /// The throwaway machine's name (already deleted).
    pub machine: String,
    /// Present when the command failed on a local machine with blocked or allow-listed egress
    /// and the engine refused egress while it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_egress: Option<Vec<BlockedEgress>>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileRead {
    pub path: String,
    /// The page, sent as the answer's second content block.
    #[serde(skip)]
    #[schemars(skip)]
    pub content: String,
    /// utf8 or base64.
    pub encoding: String,
    /// The whole file's length in bytes.
    pub size: u64,
    /// Where this page starts.
    pub offset: u64,
    /// This page's length in bytes.
    pub bytes: u64,
    /// This page reaches the end of the file.
    pub eof: bool,
    pub started_machine: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileWritten {
    pub path: String,
    /// Bytes written.
    pub size: u64,
    pub started_machine: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Branched {
    /// The child.
    pub machine: Machine,
    pub ready: bool,
    /// The child is deleted by the server, as an unnamed create-machine is.
    pub ephemeral: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Logs {
    pub lines: Vec<String>,
    /// Pass it back as cursor to get only what arrives after these lines.
    pub cursor: String,
    /// Older lines of this page were left out to fit the output budget.
    pub truncated: bool,
    /// Local fleet, with a cursor: the cursor's last lines have rolled out of the newest 10000
    /// lines the engine returns, so this page is those lines and some before them may be
    /// missing. Always false on cloud.
    pub gap: bool,
}
