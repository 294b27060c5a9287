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
    RunCommandAnswer,
    JobStarted,
    JobReport,
    JobSummary,
    JobList,
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

/// run-command's answer: the finished command, or, with `background: true`, the job it started.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum RunCommandAnswer {
    Finished(CommandRun),
    Started(JobStarted),
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobStarted {
    /// The job's id, for job-output, cancel-job and list-jobs.
    pub job: String,
    /// Always "running": the command was started, nothing more is known yet.
    pub state: String,
    pub machine: String,
    /// The cursor to give job-output to read from the start.
    pub cursor: String,
    /// The seconds after which the server kills it (timedOut).
    pub timeout_secs: u64,
    /// Where the whole stdout and stderr accumulate in the machine (for read-file, or commands).
    pub output_files: JobFiles,
    /// The job's row in the run ledger (smol://runs/{run}), when the ledger is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<i64>,
    /// The machine was stopped and starting the job started it (it is left running).
    pub started_machine: bool,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct JobFiles {
    pub stdout: String,
    pub stderr: String,
}

/// A job as it stands.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobSummary {
    pub job: String,
    pub target: crate::fleet::FleetKind,
    pub machine: String,
    /// The command as given (argv joined by spaces, or the shell text), cut to 200 characters.
    pub command: String,
    /// running, exited, timedOut (killed at timeoutSecs), cancelled (by cancel-job) or lost (its machine stopped or went: see reason).
    pub state: String,
    /// Once ended: the command's exit status (124 for timedOut, 137 for cancelled; null when lost).
    pub exit_code: Option<i32>,
    /// Why a lost job is lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// RFC 3339.
    pub started_at: String,
    pub elapsed_secs: u64,
    /// How much each stream had written at the last look (every jobPollMillis while it runs).
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub output_files: JobFiles,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<i64>,
}

/// job-output's answer: the job's state and the output after the cursor it was given.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobReport {
    #[serde(flatten)]
    pub summary: JobSummary,
    /// stdout written after the cursor (at most maxOutputBytes; a character cut at the end waits for the next call).
    pub stdout: String,
    /// stderr written after the cursor, likewise.
    pub stderr: String,
    /// Give it back as cursor next time to read only what follows.
    pub cursor: String,
    /// More output is already there after cursor: call again without waiting.
    pub more: bool,
    /// Why no output could be read this time (the machine is gone, say); the state still holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_unavailable: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct JobList {
    /// Newest first: the running jobs and the last 100 ended ones of this server.
    pub jobs: Vec<JobSummary>,
}

/// Egress the machine's policy refused while the command ran, by destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockedEgress {
    /// As the engine recorded it: an IP address for a refused connection, the name for a
    /// refused lookup.
    pub host: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// connect (TCP), sendto (UDP), or resolve: a name outside allowHosts, which the guest saw
    /// fail to resolve; add it to allowHosts.
    pub operation: String,
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
    /// Why there is nothing to read, when the log is not there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}
