//! MCP tasks (SEP-2663, the `io.modelcontextprotocol/tasks` extension): a `run-command` or
//! `run-once` from a client that declared the extension answers as usual when it ends within
//! `taskAfterMillis`; a longer one is answered with a task, which goes on running in the
//! process while the client polls `tasks/get` for it, however short the client's request
//! timeout. rmcp's `TaskManager` keeps the tasks; it lives in [`crate::protocol::Protocol`] because over HTTP
//! rmcp builds a handler for every 2026-07-28 request, and a task outlives its request.

use crate::policy::progress::Activity;
use crate::policy::tools::results::Answer;
use crate::policy::tools::{Tool, ToolError, ToolErrorKind};
use crate::store::{Store, TaskRecord};
use rmcp::model::{CallToolResponse, CallToolResult, CreateTaskResult};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskExit, TaskManager, TaskOptions};
use rmcp::{ErrorData, RoleServer};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// What a task is told to wait between two polls (rmcp's default too).
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How often a running task's status message is brought up to date.
const STATUS_EVERY: Duration = Duration::from_secs(1);
/// Beyond the waits the configuration bounds (serve start-up, readiness, the command's
/// timeout): a machine's create and start, and the cloud's image pull at create.
const TTL_MARGIN: Duration = Duration::from_secs(600);

/// The process's tasks, each with its owner: the session that started it, or
/// [`STATELESS`] for a 2026-07-28 request (which has no session; its task id, long and random,
/// is what it holds). Another owner's task reads as unknown.
pub struct Tasks {
    manager: TaskManager,
    /// Where each task is recorded, so that a process after this one can say it is gone, and
    /// (a store several processes share) so that any of them answers for it.
    store: Arc<dyn Store>,
    owners: Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>,
    /// The copy of this process's tasks into a shared store, started with the first task.
    mirror: std::sync::OnceLock<()>,
    /// One permit per call that may become a task (`maxTasks`), taken when the call begins
    /// (so that the bound is exact) and given back when it ends, as a task or not.
    slots: Arc<tokio::sync::Semaphore>,
    max: usize,
    /// Each signed-in user's share of them (`userSharePercent`).
    shares: Arc<crate::policy::shares::UserShares>,
}

impl Tasks {
    pub fn new(max: usize, user_share_percent: u64, store: Arc<dyn Store>) -> Tasks {
        Tasks {
            shares: crate::policy::shares::UserShares::new(max, user_share_percent),
            manager: TaskManager::default(),
            store,
            owners: Default::default(),
            mirror: std::sync::OnceLock::new(),
            slots: Arc::new(tokio::sync::Semaphore::new(max)),
            max,
        }
    }
}

/// The owner of the tasks of requests without a session.
pub const STATELESS: &str = "stateless requests";

/// A tool call that runs on its own, ready to be awaited here or handed to a task.
pub struct DetachedCall {
    pub tool: Tool,
    /// The call's own token: not the request's, which rmcp cancels once the request is
    /// answered (seen on HTTP and stdio), and a task's call goes on after that.
    pub ct: CancellationToken,
    /// Fired by tasks/cancel only: it ends a keyed call's work too (see `tools::Caller::stop`).
    pub stop: CancellationToken,
    pub activity: Arc<Activity>,
    /// The longest the call can take by the configuration's bounds (see [`task_ttl`]).
    pub bound: Duration,
    pub work: Pin<Box<dyn Future<Output = Result<Answer, ToolError>> + Send>>,
}

/// Whether a call of `tool` from this request may become a task: the command tools, asked by
/// a client that declared the extension (in the request's `_meta` on 2026-07-28, at
/// `initialize` on a session; rmcp answers either way, and refuses a task to anyone else).
pub fn may_become_task(tool: Tool, context: &RequestContext<RoleServer>) -> bool {
    matches!(tool, Tool::RunCommand | Tool::RunOnce)
        && context
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks())
}

/// How long a task is kept: rmcp fails a task still running after its TTL and aborts its
/// future (its sweep, `task_manager.rs`), and keeps a finished one one more TTL for the
/// client to fetch. So the TTL is the call's own bound, the command's timeout and the waits
/// before it, plus a margin: a task is never cut short by it, and its result stays at least
/// that long after it ends.
pub fn task_ttl(exec_timeout: Duration, config: &crate::process::config::Config) -> Duration {
    exec_timeout
        + Duration::from_secs(config.serve_start_timeout_secs)
        + Duration::from_secs(config.ready_timeout_secs)
        + TTL_MARGIN
}

/// Cancels the call when dropped before the call ends (the request's handler dropped before
/// the threshold, or the task's future aborted by rmcp at its TTL), so that the call, running
/// on its own, still takes its cancellation path: the marked command killed, run-once's
/// machine deleted. Dropped after the call ended, it cancels nothing that still runs.
struct CancelOnDrop(Option<CancellationToken>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(ct) = self.0.take() {
            ct.cancel();
        }
    }
}

impl Tasks {
    /// Runs `call`; answers its result if it ends within `after` (or the request is cancelled
    /// first, as without tasks), else a task that carries it on.
    pub async fn call_or_task(
        &self,
        call: DetachedCall,
        after: Duration,
        request_ct: &CancellationToken,
        owner: &str,
        user: &crate::policy::user::User,
    ) -> CallToolResponse {
        let DetachedCall {
            tool,
            ct,
            stop,
            activity,
            bound,
            work,
        } = call;
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            return CallToolResponse::Complete(crate::protocol::answer::into_result(Err(
                ToolError::new(
                    ToolErrorKind::Fleet(crate::fleet::ErrorKind::RateLimited),
                    format!(
                        "{} calls are running as tasks already (maxTasks): wait for one to end \
                     (tasks/get), or cancel one (tasks/cancel)",
                        self.max
                    ),
                ),
            )));
        };
        let Some(share) = self.shares.take(user) else {
            return CallToolResponse::Complete(crate::protocol::answer::into_result(Err(
                ToolError::new(
                    ToolErrorKind::Fleet(crate::fleet::ErrorKind::RateLimited),
                    format!(
                        "you have {} calls running as tasks, your share of this server's \
                         (userSharePercent of maxTasks): wait for one to end (tasks/get), or \
                         cancel one (tasks/cancel)",
                        self.shares.share()
                    ),
                ),
            )));
        };
        let slot = (slot, share);
        let began = Instant::now();
        // On a task of its own: a task's future may be aborted (its TTL), the call never is.
        let mut running = tokio::spawn(tracing::Instrument::in_current_span(work));
        // If rmcp drops this request's handler (its transport gone) before the call ends or
        // becomes a task, the call is cancelled as it was when it ran inside the handler,
        // rather than running on unseen.
        let guard = CancelOnDrop(Some(ct.clone()));
        tokio::select! {
            joined = &mut running => return CallToolResponse::Complete(joined_result(joined)),
            () = request_ct.cancelled() => {
                ct.cancel();
                return CallToolResponse::Complete(joined_result(running.await));
            }
            () = tokio::time::sleep(after) => {}
        }
        activity.request_answered().await;
        let options = TaskOptions::new()
            .with_ttl_ms(u64::try_from(bound.as_millis()).unwrap_or(u64::MAX))
            .with_poll_interval_ms(u64::try_from(POLL_INTERVAL.as_millis()).unwrap_or(1000))
            .with_status_message(status_message(tool, began, &activity));
        let store = self.store.clone();
        let task = self.manager.spawn(options, move |context| {
            Box::pin(async move {
                let _guard = guard;
                let _slot = slot;
                let recorded = RecordedEnd {
                    store,
                    id: context.task_id().to_owned(),
                    outcome: "failed",
                };
                let ticker = async {
                    loop {
                        tokio::time::sleep(STATUS_EVERY).await;
                        context.set_status_message(status_message(tool, began, &activity));
                    }
                };
                let joined = tokio::select! {
                    joined = &mut running => joined,
                    () = context.cancelled() => {
                        // tasks/cancel: the call's own cancellation path ends the command
                        // (run-command's marker kill, run-once's machine deleted); the task
                        // ends once that is done. A keyed call's work stops too.
                        stop.cancel();
                        ct.cancel();
                        (&mut running).await
                    }
                    never = ticker => match never {},
                };
                match joined {
                    Ok(Err(e)) if e.kind == ToolErrorKind::Cancelled => {
                        recorded.ended("cancelled");
                        Err(TaskExit::Cancelled)
                    }
                    other => {
                        recorded.ended("completed");
                        let result = joined_result(other);
                        context.set_status_message(format!(
                            "{} ended after {} s",
                            tool.name(),
                            began.elapsed().as_secs()
                        ));
                        Ok(result)
                    }
                }
            })
        });
        self.store.tasks().created(TaskRecord {
            id: task.task_id.clone(),
            pid: std::process::id(),
            holder: None,
            client: owner.to_owned(),
            tool: tool.name().to_owned(),
            created_ms: chrono::Utc::now().timestamp_millis(),
            ttl_ms: i64::try_from(bound.as_millis()).unwrap_or(i64::MAX),
            outcome: None,
            detail: self
                .manager
                .get_task(&task.task_id)
                .ok()
                .and_then(|d| serde_json::to_string(&d).ok()),
        });
        if self.store.is_shared() {
            self.mirror.get_or_init(|| {
                tokio::spawn(mirror(
                    self.manager.clone(),
                    self.store.clone(),
                    self.owners.clone(),
                ));
            });
        }
        if let Ok(mut owners) = self.owners.lock() {
            // Tasks rmcp has let go of (past their TTL) are forgotten here too.
            owners.retain(|id, _| self.manager.get_task(id).is_ok());
            owners.insert(task.task_id.clone(), owner.to_owned());
        }
        tracing::info!(task = %task.task_id, tool = tool.name(), "a long call goes on as a task");
        CallToolResponse::Task(CreateTaskResult::new(task))
    }

    /// Refuses a task of another owner as rmcp refuses an unknown one, so that its existence
    /// is not told either.
    fn owned(&self, task_id: &str, owner: &str) -> Result<(), ErrorData> {
        let theirs = self
            .owners
            .lock()
            .map(|owners| owners.get(task_id).is_some_and(|o| o != owner))
            .unwrap_or(true);
        if theirs {
            tracing::warn!(task = %task_id, asked_by = %owner, "refused a request on another owner's task");
            return Err(ErrorData::invalid_params(
                format!("Task not found: {task_id}"),
                None,
            ));
        }
        Ok(())
    }

    /// A task of this process, or, for an id this process never made, what the ledger says of
    /// a task another process made: while its TTL would have kept it, a task whose process has
    /// gone answers as failed, saying so, rather than as unknown.
    pub async fn get(
        &self,
        task_id: &str,
        owner: &str,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        self.owned(task_id, owner)?;
        match self.manager.get_task(task_id) {
            Ok(task) => Ok(rmcp::model::GetTaskResult::new(task)),
            Err(unknown) => match self.of_another(task_id, owner).await {
                Some(record) => {
                    // Another process sharing the store runs it (or ran it): as it last
                    // answered, while it lives or once the task has ended there.
                    let answered = record
                        .detail
                        .as_deref()
                        .and_then(|d| serde_json::from_str::<rmcp::model::DetailedTask>(d).ok());
                    let alive = self.store.tasks().holder_alive(&record).await;
                    match answered {
                        Some(detail) if alive || detail.task.status.is_terminal() => {
                            Ok(rmcp::model::GetTaskResult::new(detail))
                        }
                        _ if alive => Err(unknown),
                        _ => gone_task(&record).ok_or(unknown),
                    }
                }
                None => Err(unknown),
            },
        }
    }

    /// A task this process does not hold, as the store has it: made by another process (one
    /// that shares the store, or one that has ended) for the same client.
    async fn of_another(&self, task_id: &str, owner: &str) -> Option<TaskRecord> {
        let record = self.store.tasks().get(task_id).await.ok().flatten()?;
        let mine = record.pid == std::process::id() && record.holder.is_none();
        // The file keeps no client: a task there was only ever answered by its own process.
        let theirs = !record.client.is_empty() && record.client != owner;
        if theirs {
            tracing::warn!(task = %task_id, asked_by = %owner, "refused a request on another owner's task");
        }
        (!mine && !theirs).then_some(record)
    }

    pub async fn cancel(&self, task_id: &str, owner: &str) -> Result<(), ErrorData> {
        self.owned(task_id, owner)?;
        match self.manager.cancel_task(task_id) {
            Ok(()) => Ok(()),
            Err(unknown) => match self.of_another(task_id, owner).await {
                // The process running it cancels it at its next look (within a second).
                Some(record) if self.store.is_shared() => {
                    self.store.tasks().cancel_asked(&record.id);
                    Ok(())
                }
                _ => Err(unknown),
            },
        }
    }

    /// No task of this server asks for input, so this only checks the task exists (the spec
    /// has unknown `inputResponses` keys ignored).
    pub async fn update(
        &self,
        task_id: &str,
        owner: &str,
        responses: impl IntoIterator<Item = (String, serde_json::Value)>,
    ) -> Result<(), ErrorData> {
        self.owned(task_id, owner)?;
        match self.manager.update_task(task_id, responses) {
            Ok(()) => Ok(()),
            Err(unknown) => match self.of_another(task_id, owner).await {
                Some(_) if self.store.is_shared() => Ok(()),
                _ => Err(unknown),
            },
        }
    }
}

/// How often this process copies its tasks into a shared store and looks for cancellations
/// asked through another process.
const MIRROR_EVERY: Duration = Duration::from_secs(1);

/// Copies each task of this process into the shared store as `tasks/get` answers it here,
/// whenever that changed (a status message, its end with its result), until it has ended and
/// that is written; and cancels a running one that another process was asked to cancel.
async fn mirror(
    manager: TaskManager,
    store: Arc<dyn Store>,
    owners: Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>,
) {
    let mut written: std::collections::HashMap<String, String> = Default::default();
    loop {
        tokio::time::sleep(MIRROR_EVERY).await;
        let ids: Vec<String> = owners
            .lock()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        written.retain(|id, _| ids.contains(id));
        for id in ids {
            let Ok(detail) = manager.get_task(&id) else {
                continue;
            };
            let terminal = detail.task.status.is_terminal();
            // A terminal answer written is the last: nothing changes after it.
            if written.get(&id).is_some_and(|w| w.ends_with('!')) {
                continue;
            }
            if !terminal && store.tasks().cancel_wanted(&id).await {
                let _ = manager.cancel_task(&id);
                continue;
            }
            let Ok(text) = serde_json::to_string(&detail) else {
                continue;
            };
            let marked = if terminal {
                format!("{text}!")
            } else {
                text.clone()
            };
            if written.get(&id) != Some(&marked) {
                store.tasks().answered_as(&id, text);
                written.insert(id, marked);
            }
        }
    }
}

/// Records how a task ended; a task dropped without an end (its TTL aborted it) is recorded as
/// failed.
struct RecordedEnd {
    store: Arc<dyn Store>,
    id: String,
    outcome: &'static str,
}

impl RecordedEnd {
    fn ended(mut self, outcome: &'static str) {
        self.outcome = outcome;
    }
}

impl Drop for RecordedEnd {
    fn drop(&mut self) {
        self.store.tasks().ended(&self.id, self.outcome);
    }
}

/// A task of a process that has gone, as `tasks/get` answers it while its TTL runs: failed,
/// with a message that says what happened and what to do. `None` once the TTL has passed.
fn gone_task(record: &TaskRecord) -> Option<rmcp::model::GetTaskResult> {
    let now = chrono::Utc::now().timestamp_millis();
    if now >= record.created_ms.saturating_add(record.ttl_ms) {
        return None;
    }
    let what = match record.outcome.as_deref() {
        Some("completed") => "it finished, but its result was held in that process's memory",
        Some("cancelled") => "it was cancelled",
        _ => "it had not finished, and the call ended with the process",
    };
    let message = format!(
        "the server process that ran this {} task (pid {}) has ended; {what}. Run the call \
         again; a command left running in its machine may still be there (job-output and \
         smol://runs show what is known of it).",
        record.tool, record.pid
    );
    let time = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .unwrap_or_default()
    };
    let mut task = rmcp::model::Task::new(
        record.id.clone(),
        rmcp::model::TaskStatus::Failed,
        time(record.created_ms),
        time(now),
    );
    task.status_message = Some(message.clone());
    task.ttl_ms = u64::try_from(record.ttl_ms).ok();
    let mut error = rmcp::model::JsonObject::new();
    error.insert("code".into(), serde_json::json!(-32603));
    error.insert("message".into(), serde_json::json!(message));
    Some(rmcp::model::GetTaskResult::new(
        rmcp::model::DetailedTask::new(task, rmcp::model::TaskPayload::Failed { error }),
    ))
}

/// "run-command running for 42 s: [stdout] compiling foo" (the latest output line when the
/// request asked for progress, else the latest wait).
fn status_message(tool: Tool, began: Instant, activity: &Activity) -> String {
    let mut message = format!(
        "{} running for {} s",
        tool.name(),
        began.elapsed().as_secs()
    );
    if let Some(latest) = activity.latest() {
        message.push_str(": ");
        message.push_str(&latest);
    }
    message
}

fn joined_result(
    joined: Result<Result<Answer, ToolError>, tokio::task::JoinError>,
) -> CallToolResult {
    match joined {
        Ok(result) => crate::protocol::answer::into_result(result),
        Err(e) => {
            tracing::error!(error = %e, "a tool call's task ended without a result");
            crate::protocol::answer::into_result(Err(ToolError::new(
                ToolErrorKind::Internal,
                format!("the call ended without a result: {e}"),
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A call of `tool` that waits until `ct` is cancelled, then says so on `cleaned_up` (its
    /// clean-up) and ends cancelled.
    fn until_cancelled(
        tool: Tool,
        ct: CancellationToken,
        bound: Duration,
        cleaned_up: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> DetachedCall {
        let call_ct = ct.clone();
        DetachedCall {
            tool,
            ct,
            stop: CancellationToken::new(),
            activity: Arc::default(),
            bound,
            work: Box::pin(async move {
                call_ct.cancelled().await;
                if let Some(cleaned_up) = cleaned_up {
                    let _ = cleaned_up.send(());
                }
                Err(ToolError::cancelled())
            }),
        }
    }

    /// `call` as the operator's, on a request of its own, made a task at once (threshold 0).
    async fn as_task_at_once(tasks: &Tasks, call: DetachedCall) -> CallToolResponse {
        let operator = crate::policy::user::User::operator();
        let request_ct = CancellationToken::new();
        tasks
            .call_or_task(call, Duration::ZERO, &request_ct, STATELESS, &operator)
            .await
    }

    /// The call's clean-up ran, within two seconds.
    async fn cleaned_up_soon(cleaned_up: tokio::sync::oneshot::Receiver<()>) {
        let within = tokio::time::timeout(Duration::from_secs(2), cleaned_up).await;
        assert!(matches!(within, Ok(Ok(()))), "no clean-up within 2 s");
    }

    /// A store in a directory of the test's own (kept until the process ends: a task's
    /// record may be written after the test's last line).
    fn store() -> Arc<dyn crate::store::Store> {
        let dir = tempfile::tempdir().unwrap().keep();
        Arc::new(crate::store::sqlite::SqliteStore::new(
            dir.join(crate::store::sqlite::FILE_NAME),
            crate::store::RunRetention {
                max_runs: 10,
                max_days: 1,
            },
            crate::process::events::Events::default(),
        ))
    }

    /// rmcp aborts a task's future at its TTL; the call, on a task of its own, is then
    /// cancelled and so still takes its cancellation path rather than being dropped midway.
    #[tokio::test]
    async fn a_task_aborted_at_its_ttl_cancels_its_call() {
        let tasks = Tasks::new(64, 50, store());
        let ct = CancellationToken::new();
        let (cleaned_up, mut cleaned_up_rx) = tokio::sync::oneshot::channel();
        let call = until_cancelled(
            Tool::RunCommand,
            ct.clone(),
            Duration::from_millis(100),
            Some(cleaned_up),
        );
        let CallToolResponse::Task(created) = as_task_at_once(&tasks, call).await else {
            panic!("not a task");
        };
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(
            cleaned_up_rx.try_recv().is_err(),
            "still running before the sweep"
        );
        // rmcp sweeps on its entry points: this get finds the TTL passed.
        let got = tasks.get(&created.task.task_id, STATELESS).await.unwrap();
        assert_eq!(got.task.status(), rmcp::model::TaskStatus::Failed);
        cleaned_up_soon(cleaned_up_rx).await;
    }

    /// A request's handler dropped while its call runs (before the threshold) cancels the
    /// call, as dropping the call itself did before it ran on a task of its own.
    #[tokio::test]
    async fn a_handler_dropped_before_the_threshold_cancels_its_call() {
        let tasks = Tasks::new(64, 50, store());
        let ct = CancellationToken::new();
        let (cleaned_up, cleaned_up_rx) = tokio::sync::oneshot::channel();
        let call = until_cancelled(
            Tool::RunOnce,
            ct.clone(),
            Duration::from_secs(60),
            Some(cleaned_up),
        );
        let request_ct = CancellationToken::new();
        let operator = crate::policy::user::User::operator();
        let handler = tasks.call_or_task(
            call,
            Duration::from_secs(60),
            &request_ct,
            STATELESS,
            &operator,
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(50), handler)
                .await
                .is_err()
        );
        cleaned_up_soon(cleaned_up_rx).await;
    }

    /// A signed-in user holds at most their share of `maxTasks` (`userSharePercent`): alice's
    /// third of 4 at 50% is refused naming the setting; bob and the operator still get theirs.
    #[tokio::test]
    async fn a_user_holds_only_their_share_of_tasks() {
        use crate::policy::user::User;
        let tasks = Tasks::new(4, 50, store());
        let waiting = |ct: CancellationToken| {
            until_cancelled(Tool::RunCommand, ct, Duration::from_secs(60), None)
        };
        let stop = CancellationToken::new();
        let start = |user: User| {
            let (tasks, stop) = (&tasks, stop.clone());
            async move {
                tasks
                    .call_or_task(
                        waiting(stop),
                        Duration::ZERO,
                        &CancellationToken::new(),
                        "owner",
                        &user,
                    )
                    .await
            }
        };
        for _ in 0..2 {
            let started = start(User::signed_in("alice")).await;
            assert!(
                matches!(started, CallToolResponse::Task(_)),
                "alice's own share"
            );
        }
        let CallToolResponse::Complete(refused) = start(User::signed_in("alice")).await else {
            panic!("alice's third task past her share");
        };
        let text = serde_json::to_string(&refused).unwrap();
        assert!(
            text.contains("RATE_LIMITED") && text.contains("userSharePercent"),
            "{text}"
        );
        assert!(matches!(
            start(User::signed_in("bob")).await,
            CallToolResponse::Task(_)
        ));
        assert!(matches!(
            start(User::operator()).await,
            CallToolResponse::Task(_)
        ));
        stop.cancel();
    }

    /// `maxTasks` calls at once, counted from their start: one more is refused naming the
    /// setting; a slot is given back when a call ends, as a task or before becoming one.
    #[tokio::test]
    async fn calls_past_max_tasks_are_refused_naming_the_setting_until_one_ends() {
        let tasks = Tasks::new(1, 50, store());
        let call = |ct: CancellationToken| {
            until_cancelled(Tool::RunCommand, ct, Duration::from_secs(60), None)
        };
        let first_ct = CancellationToken::new();
        let first = as_task_at_once(&tasks, call(first_ct.clone())).await;
        let CallToolResponse::Task(created) = first else {
            panic!("not a task");
        };
        let refused = as_task_at_once(&tasks, call(CancellationToken::new())).await;
        let CallToolResponse::Complete(refused) = refused else {
            panic!("a second task past maxTasks 1");
        };
        let text = serde_json::to_string(&refused).unwrap();
        assert!(refused.is_error == Some(true), "{text}");
        assert!(
            text.contains("RATE_LIMITED") && text.contains("maxTasks"),
            "{text}"
        );
        first_ct.cancel();
        for _ in 0..100 {
            if tasks
                .get(&created.task.task_id, STATELESS)
                .await
                .unwrap()
                .task
                .status()
                != rmcp::model::TaskStatus::Working
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let again = as_task_at_once(&tasks, call(CancellationToken::new())).await;
        assert!(
            matches!(again, CallToolResponse::Task(_)),
            "the slot came back"
        );
    }
}
