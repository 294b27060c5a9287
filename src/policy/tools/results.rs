//! What each tool answers, as structured content (and its output schema).

use crate::fleet::Machine;
pub use crate::policy::cost::RunCost;
use crate::policy::error::{ToolError, ToolErrorKind};
use schemars::JsonSchema;
use serde::Serialize;

// A field skipped when `None` is absent from an answer, never null: its schema is the inner
// type's (`schemars(with)`), without a null branch that would cost the catalog bytes for nothing.

/// A tool's answer: the structured result and, for a page of a file, the page itself, which
/// travels once, as a content block of its own, rather than inside the structured result and
/// again in the text block that repeats it for clients without structured content.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Answer {
    pub structured: serde_json::Value,
    pub page: Option<String>,
    /// The page is an image of this type, in base64: an image content block, not text.
    /// Absent from answers kept before there were images (idempotency keys, tasks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// A result type: serialized as the structured content; `take_page` moves out what travels as
/// a content block of its own.
pub trait Reply: Serialize {
    fn take_page(&mut self) -> Option<String> {
        None
    }

    /// The page's image type, when it travels as an image block.
    fn page_image_type(&self) -> Option<String> {
        None
    }
}

macro_rules! replies_without_a_page {
    ($($ty:ty),* $(,)?) => {
        $(impl Reply for $ty {})*
    };
}

replies_without_a_page!(
    PortPublished,
    TerminalRead,
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
    JobOutputAnswer,
    RunOnce,
    FileWritten,
    Branched,
    Logs,
    Machine,
    crate::fleet::Deleted,
    crate::fleet::PulledImage,
    ViewState,
);

replies_without_a_page!(ChangesKept);

impl Reply for FileRead {
    fn take_page(&mut self) -> Option<String> {
        Some(std::mem::take(&mut self.content))
    }

    fn page_image_type(&self) -> Option<String> {
        self.mime_type.clone()
    }
}

pub fn answer<R: Reply>(mut result: R) -> Result<Answer, ToolError> {
    let page = result.take_page();
    let image = result.page_image_type();
    let structured = serde_json::to_value(&result)
        .map_err(|e| ToolError::new(ToolErrorKind::Internal, e.to_string()))?;
    Ok(Answer {
        structured,
        page,
        image,
    })
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct MachineList {
    pub machines: Vec<Listed>,
}

/// A machine, and what the server keeps of it as a base.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Listed {
    #[serde(flatten)]
    pub machine: Machine,
    /// Set for a base (branch-machine freezeSource).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<crate::process::bases::BaseInfo>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Created {
    pub machine: Machine,
    /// The server deletes it when the session ends.
    pub ephemeral: bool,
    /// It runs commands.
    pub ready: bool,
    /// The warm pool it came from, booted ahead.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub pool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "WorkspaceIn")]
    pub workspace: Option<WorkspaceIn>,
}

/// A workspace a machine got.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceIn {
    /// Where it is in the machine.
    pub path: String,
    /// The host directory.
    pub from: String,
    /// The commit it is, the base of its changes.
    pub base: String,
    /// The user's branch it came from (a git repository).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub branch: Option<String>,
}

/// What a machine changed in its workspace, beside the diff read-file pages.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceFiles {
    /// The commit compared with.
    pub base: String,
    /// Added, modified or deleted, with sizes (the first 200).
    #[schemars(with = "Vec<serde_json::Value>")]
    pub files: Vec<crate::workspace::ChangedFile>,
    /// Changed files not listed.
    pub more_files: usize,
}

/// Where a machine's changes were kept.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangesKept {
    /// The new branch of the user's repository, and its commit.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub branch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub commit: Option<String>,
    /// A patch for `git apply` (a directory in no repository).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub patch: Option<String>,
    /// What the user runs to see and take it.
    pub review: String,
    /// Siblings deleted.
    pub deleted: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Started {
    pub machine: Machine,
    /// It runs commands (false after wait: false).
    pub ready: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Stopped {
    pub machine: Machine,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Overflow {
    pub stream: String,
    pub path: String,
    pub bytes: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandRun {
    pub stdout: String,
    pub stderr: String,
    /// Non-zero is a result, not an error.
    pub exit_code: i32,
    /// Killed at timeoutSecs (exit 124).
    pub timed_out: bool,
    /// Output was cut to its head and tail.
    pub truncated: bool,
    /// Where each cut stream was saved whole in the machine, for read-file.
    pub overflow: Vec<Overflow>,
    /// The stopped machine was started (and left running).
    pub started_machine: bool,
    /// {local:When a command with restricted egress failed: what the engine refused meanwhile (ask for it in allowHosts or allowCidrs).}
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<BlockedEgress>")]
    pub blocked_egress: Option<Vec<BlockedEgress>>,
    /// {local:On a network ask machine: what the user said of the refused hosts.}
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "EgressAnswer")]
    pub egress_answer: Option<EgressAnswer>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "RunCost")]
    pub usage: Option<RunCost>,
}

/// What the user said when asked about the hosts a command was refused.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressAnswer {
    /// Now reachable: run the command again.
    pub allowed: Vec<String>,
    /// Still refused.
    pub declined: Vec<String>,
    /// Why no one was asked, when no one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub not_asked: Option<String>,
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
    /// For job-output and cancel-job.
    pub job: String,
    /// running.
    pub state: String,
    pub machine: String,
    /// For job-output: from the start.
    pub cursor: String,
    /// Killed after this (timedOut).
    pub timeout_secs: u64,
    /// Where the whole streams accumulate in the machine.
    pub output_files: JobFiles,
    /// Its record: smol://runs/{run}.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "i64")]
    pub run: Option<i64>,
    /// The stopped machine was started (and left running).
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
    /// As given, cut to 200 characters.
    pub command: String,
    /// running, exited, timedOut, cancelled or lost (its machine stopped or went).
    pub state: String,
    /// Once ended (124 timedOut, 137 cancelled, null lost).
    pub exit_code: Option<i32>,
    /// Why it is lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub reason: Option<String>,
    pub started_at: String,
    pub elapsed_secs: u64,
    /// Written so far, at the last look.
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub output_files: JobFiles,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "i64")]
    pub run: Option<i64>,
}

/// job-output's answer: the job's state and the output after the cursor it was given.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobReport {
    #[serde(flatten)]
    pub summary: JobSummary,
    /// Written after the cursor, at most a page.
    pub stdout: String,
    /// Likewise.
    pub stderr: String,
    /// Pass it back to read what follows.
    pub cursor: String,
    /// More is waiting: call again at once.
    pub more: bool,
    /// Why no output could be read (the state still holds).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub output_unavailable: Option<String>,
    /// Once it ended: what it cost the machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "RunCost")]
    pub usage: Option<RunCost>,
}

/// job-output's answer: one job's report, or without a job the list.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum JobOutputAnswer {
    Report(Box<JobReport>),
    List(JobList),
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct JobList {
    /// Newest first.
    pub jobs: Vec<JobSummary>,
}

/// Egress the machine's policy refused while the command ran, by destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockedEgress {
    /// An address, or a name for resolve.
    pub host: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u16")]
    pub port: Option<u16>,
    /// connect (TCP), sendto (UDP) or resolve (a name outside allowHosts).
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
    /// Already deleted.
    pub machine: String,
    /// The warm pool the machine came from, booted ahead.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub pool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "RunCost")]
    pub usage: Option<RunCost>,
    /// {local:When a command with restricted egress failed: what the engine refused meanwhile (ask for it in allowHosts or allowCidrs).}
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<BlockedEgress>")]
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
    /// The image block's type, when the page is an image.
    #[serde(skip)]
    #[schemars(skip)]
    pub mime_type: Option<String>,
    // utf8, base64, or image (the second block is an image); the argument's description says
    // so, and a second one would cost the catalog for nothing.
    pub encoding: String,
    /// The whole file, in bytes.
    pub size: u64,
    /// Where this page starts.
    pub offset: u64,
    /// This page, in bytes.
    pub bytes: u64,
    /// This page ends the file.
    pub eof: bool,
    pub started_machine: bool,
    /// With changes: the changed files; the pages are their diff.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "WorkspaceFiles")]
    pub changes: Option<WorkspaceFiles>,
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
#[serde(rename_all = "camelCase")]
pub struct PortPublished {
    /// Where the user opens the service.
    pub url: String,
    /// The outside port, when the fleet gives one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u16")]
    pub host_port: Option<u16>,
    /// Something in the guest accepts on port from outside.
    pub listening: bool,
    /// What opening it takes, or why nothing answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub note: Option<String>,
    pub started_machine: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TerminalRead {
    /// Pass it to the next call.
    pub terminal: String,
    /// Printed since the cursor.
    pub output: String,
    /// Where the next read starts.
    pub cursor: u64,
    /// More is kept past this page: call again.
    pub more: bool,
    /// Once its program ended: exited N, or why it closed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub ended: Option<String>,
    pub started_machine: bool,
    /// With screen: what the program painted.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "crate::policy::screen::Painted")]
    pub screen: Option<crate::policy::screen::Painted>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Branched {
    /// The (first) child.
    pub machine: Machine,
    pub ready: bool,
    /// The server deletes it when the session ends.
    pub ephemeral: bool,
    /// Every child's name, with count.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Logs {
    pub lines: Vec<String>,
    /// Pass it back to get only what arrives after.
    pub cursor: String,
    /// Older lines were left out to fit a page.
    pub truncated: bool,
    /// Lines between the cursor and this page may be missing.
    pub gap: bool,
    /// Why there is nothing to read.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub note: Option<String>,
}

/// What a view shows (`view-state`), by view.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum ViewState {
    Machines(MachinesView),
    Egress(EgressView),
    Terminal(TerminalView),
}

/// Listed as an object only: view-state is for this server's own views, which know each form
/// (docs/tools.md has them), and every byte of its listing is in the catalog a client is sent.
impl JsonSchema for ViewState {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ViewState".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "object", "description": "By view."})
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MachinesView {
    pub machines: Vec<MachineRow>,
    /// Machines past the view's bound, not listed.
    pub more: usize,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineRow {
    pub name: String,
    pub target: crate::fleet::FleetKind,
    pub state: String,
    pub image: Option<String>,
    pub created_at: Option<String>,
    /// What it has cost so far, in dollars (cloud).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<String>,
    pub ports: Vec<PortLink>,
    /// Open terminals' ids.
    pub terminals: Vec<String>,
    /// Background jobs running.
    pub jobs: Vec<JobRow>,
}

#[derive(Debug, Serialize)]
pub struct PortLink {
    pub guest: u16,
    pub url: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct JobRow {
    pub job: String,
    pub command: String,
    pub state: String,
}

#[derive(Debug, Serialize)]
pub struct EgressView {
    pub questions: Vec<QuestionRow>,
    /// Whether the answer given was applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered: Option<bool>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuestionRow {
    pub question: String,
    pub machine: String,
    pub destinations: Vec<String>,
    pub asked_at: u64,
    /// Sent back with the answer.
    pub state: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TerminalView {
    pub terminal: String,
    pub machine: String,
    /// Bytes printed so far: the next call's after.
    pub printed: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    pub screen: Option<crate::policy::screen::Painted>,
}
