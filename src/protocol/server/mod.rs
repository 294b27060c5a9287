//! The MCP protocol side: one `ServerHandler` per session, answering from the tool table
//! (`crate::policy::tools`) with the process's [`Protocol`]. `stdio` is the stdio transport in front of it,
//! which answers the malformed input rmcp would drop.

pub mod consent;
pub mod fleet_choice;
pub mod instructions;
pub mod notify;
pub mod sealed;
pub mod stdio;

use crate::policy::tools::{self, Catalog, Tool};
use crate::protocol::{Protocol, answer, is_stateless, tasks, user_of};
#[allow(deprecated)]
use rmcp::model::SetLevelRequestParams;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CompleteRequestParams,
    CompleteResult, GetSkillRequestParams, GetSkillResult, GetTaskParams, GetTaskResult,
    Implementation, ListResourceTemplatesResult, ListResourcesResult, ListSkillsResult,
    ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, ServerCapabilities, ServerConfig, SubscribeRequestParams,
    SubscriptionFilter, UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use std::sync::Arc;
use tracing::Instrument;

/// One MCP session's server (over HTTP also one 2026-07-28 request's: rmcp builds a handler
/// for each). Sessions of one process share its [`Protocol`].
#[derive(Clone)]
pub struct SmolMcp {
    protocol: Arc<Protocol>,
    session: Arc<str>,
    fleet_choice: Arc<fleet_choice::SessionChoice>,
    /// Whether machines made by 2026-07-28 requests belong to the process under a lease (HTTP,
    /// where such a request's handler lives for that request only) rather than to `session`.
    leases_stateless_machines: bool,
    /// The level set by `logging/setLevel`, and the forwarding of events it governs.
    log: Arc<notify::SessionLog>,
    /// This session's resources/subscribe; dropped with the session, which stops its polling.
    subscriptions: Arc<crate::protocol::resources::SessionSubscriptions>,
    _end: Option<Arc<SessionEnd>>,
}

/// Deletes a session's ephemeral machines when the last handle on the session goes: an HTTP
/// session closed by DELETE, by its idle timeout, or by the server shutting down.
struct SessionEnd {
    protocol: Arc<Protocol>,
    session: Arc<str>,
    /// Whether a tool call ran for the session: a handler rmcp built for one 2026-07-28
    /// request (no session, no machines of its own) then has nothing to clean up.
    called: std::sync::atomic::AtomicBool,
}

impl Drop for SessionEnd {
    fn drop(&mut self) {
        if !self.called.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let (protocol, session) = (self.protocol.clone(), self.session.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                protocol.policy.terminals.close_session(&session);
                let cleanup = protocol.process().cleanup_session(&session).await;
                tracing::info!(%session, deleted = ?cleanup.deleted, kept = ?cleanup.kept, "session closed");
            });
        }
    }
}

impl SmolMcp {
    pub fn new(protocol: Arc<Protocol>, session: impl Into<Arc<str>>) -> Self {
        SmolMcp {
            protocol,
            session: session.into(),
            fleet_choice: Arc::default(),
            leases_stateless_machines: false,
            log: Arc::default(),
            subscriptions: Arc::default(),
            _end: None,
        }
    }

    /// A session whose ephemeral machines are deleted when it is dropped (HTTP sessions; the
    /// stdio binary cleans up explicitly before it exits).
    pub fn cleaning_up_on_drop(mut self) -> Self {
        self._end = Some(Arc::new(SessionEnd {
            protocol: self.protocol.clone(),
            session: self.session.clone(),
            called: std::sync::atomic::AtomicBool::new(false),
        }));
        self.leases_stateless_machines = true;
        self
    }

    pub fn session(&self) -> &str {
        &self.session
    }

    pub fn protocol(&self) -> &Arc<Protocol> {
        &self.protocol
    }

    /// Which skills this server's settings let work.
    fn skills_offered(&self) -> crate::protocol::skills::Offered {
        crate::protocol::skills::Offered::of(
            self.protocol.mode(),
            !self.protocol.config().mount_allow.is_empty(),
            !self.protocol.process().credentials.bindings().is_empty(),
        )
    }

    /// The instructions as a session or a discovery is told them, with the machines kept now
    /// (read from the record: `get_info`, which cannot wait on it, leaves them out).
    async fn instructions(&self) -> String {
        let now = crate::process::ephemeral::now_secs();
        // Whatever this process's own setting: machines kept by an earlier one stay takeable.
        let kept_now = self
            .protocol
            .process()
            .record
            .kept()
            .await
            .map(|kept| {
                kept.into_iter()
                    .filter(|e| e.kept_at(now))
                    .map(|e| e.name)
                    .collect()
            })
            .unwrap_or_default();
        self.instructions_with(kept_now)
    }

    /// The server's capabilities, name and instructions (without the machines kept now: see
    /// `instructions`), as `get_info` answers them for the process's life.
    #[allow(deprecated)] // logging: see set_level
    fn made_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_logging()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_completions()
                // No prompts, but declared, so that rmcp answers prompts/list with an empty
                // list rather than method-not-found: on 2026-07-28 it is one of the cacheable
                // results (SEP-2549) that clients, the official conformance suite's caching
                // scenario among them, ask of every server, and a server that answers it must
                // declare it in server/discover (SEP-2575).
                .enable_prompts()
                // SEP-2663: a long run-command or run-once becomes a task for a client that
                // declares the extension too (`tasks`).
                .enable_tasks()
                // SEP-2640: the workflows as skills (protocol::skills), served as resources.
                .enable_skills()
                .build(),
        )
        .with_server_info(Implementation::new("smol-mcp", env!("CARGO_PKG_VERSION")))
        .with_instructions(self.instructions_with(Vec::new()))
    }

    fn instructions_with(&self, kept_now: Vec<String>) -> String {
        let process = self.protocol.process();
        let mut text = instructions::instructions(
            self.protocol.mode(),
            process.credentials.bindings(),
            !self.protocol.config().mount_allow.is_empty(),
            self.protocol.config().agent_network,
            &instructions::Temporary {
                session_end: self.protocol.config().session_end,
                kept_secs: self.protocol.config().kept_machine_secs,
                kept_now,
            },
        );
        text.push_str("\n\n");
        text.push_str(&crate::protocol::skills::pointer(self.skills_offered()));
        text
    }
}

impl ServerHandler for SmolMcp {
    fn get_info(&self) -> ServerConfig {
        self.protocol
            .server_info
            .get_or_init(|| self.made_info())
            .clone()
    }

    /// As rmcp's, but the MCP Apps extension is declared only to a client that declared it
    /// (the extension asks servers to offer views only to hosts that show them).
    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let mut result = self.negotiate_initialize(&request)?;
        result.instructions = Some(self.instructions().await);
        if crate::protocol::apps::declared_in(&request.capabilities) {
            with_views(&mut result.capabilities);
        }
        Ok(result)
    }

    async fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::DiscoverResult, ErrorData> {
        let mut info = self.get_info();
        info.instructions = Some(self.instructions().await);
        if crate::protocol::apps::declared(&context) {
            with_views(&mut info.capabilities);
        }
        Ok(rmcp::model::DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            info,
        ))
    }

    /// A session (2025-11-25 and before) hears the server's events from its `initialized` on.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let user = crate::protocol::user_in(&context.extensions);
        let audience = notify::Audience::new(self.protocol.policy.clone(), user);
        self.log.forward(
            self.protocol.process().events.subscribe(),
            context.peer,
            audience,
        );
    }

    #[allow(deprecated)] // rmcp marks logging deprecated; both spec versions served have it.
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.log.set_level(request.level);
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let scope = self.fleet_choice.scope(self.protocol.mode(), &context);
        let offers = crate::policy::tools::schema::Offers::of(self.protocol.config())
            .with_views(crate::protocol::apps::declared(&context));
        Ok(ListToolsResult::with_all_items(
            Catalog::offered(scope.mode(), offers).listed.clone(),
        ))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let mut resources = crate::protocol::resources::list(&self.protocol);
        resources.extend(crate::protocol::skills::resources(self.skills_offered()));
        if crate::protocol::apps::declared(&context) {
            resources.extend(crate::protocol::apps::resources());
        }
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_skills(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListSkillsResult, ErrorData> {
        Ok(ListSkillsResult::with_all_items(
            crate::protocol::skills::list(self.skills_offered())?,
        ))
    }

    async fn get_skill(
        &self,
        request: GetSkillRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetSkillResult, ErrorData> {
        Ok(GetSkillResult::new(crate::protocol::skills::get(
            self.skills_offered(),
            &request.uri,
        )?))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(
            crate::protocol::resources::templates(self.protocol.mode()),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if crate::protocol::skills::is_skill_uri(&request.uri) {
            let contents = crate::protocol::skills::read(self.skills_offered(), &request.uri)?;
            return Ok(ReadResourceResult::new(contents).into());
        }
        if crate::protocol::apps::is_view_uri(&request.uri) {
            let contents = crate::protocol::apps::read(
                &request.uri,
                crate::protocol::apps::declared(&context),
            )?;
            return Ok(ReadResourceResult::new(contents).into());
        }
        let user = user_of(&context);
        let contents = crate::protocol::resources::read(
            &self.protocol,
            &self.session,
            &user,
            context.ct,
            &request.uri,
        )
        .await?;
        Ok(ReadResourceResult::new(contents).into())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let user = user_of(&context);
        crate::protocol::resources::complete(&self.protocol, &request, &user).await
    }

    // resources/subscribe is the session lifecycle's way to follow a log; 2026-07-28 clients
    // use subscriptions/listen (below), which rmcp routes instead.
    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let user = user_of(&context);
        self.subscriptions
            .subscribe(&self.protocol, &request.uri, context.peer, &user)
            .await
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions.unsubscribe(&request.uri);
        Ok(())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(crate::protocol::resources::accepted_filter(
            requested,
            self.protocol.mode(),
        ))
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let user = user_of(context.request_context());
        crate::protocol::resources::listen(&self.protocol, context, &user).await
    }

    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        Catalog::of(self.protocol.mode())
            .listed
            .iter()
            .find(|t| t.name == name)
            .cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(tool) = Tool::from_name(&request.name) else {
            let names: Vec<&str> = Tool::ALL.iter().map(|t| t.name()).collect();
            return Err(ErrorData::invalid_params(
                format!(
                    "no tool named {}; the tools are {}",
                    crate::policy::error::quote(&request.name),
                    names.join(", ")
                ),
                None,
            ));
        };
        // Every event of the call, the engine requests it makes included (fleet::hooks), carries
        // these fields; the owner and the machine are filled in once known.
        let span = tracing::info_span!(
            "tool_call",
            tool = tool.name(),
            request = %context.id,
            owner = tracing::field::Empty,
            machine = tracing::field::Empty,
        );
        async move {
            let (scope, args) = match self
                .fleet_choice
                .settle(self.protocol.mode(), &request, &context)
                .await?
            {
                fleet_choice::Settled::Run(scope, args) => (scope, args),
                fleet_choice::Settled::Answer(answer) => return Ok(answer),
            };
            // A client without a session leases its machines under its user's lease session.
            let leased;
            let owner = if self.leases_stateless_machines && is_stateless(&context) {
                leased = self
                    .protocol
                    .process()
                    .lease_session_of(user_of(&context).id());
                leased.as_str()
            } else {
                if let Some(end) = &self._end {
                    end.called.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                &self.session
            };
            tracing::Span::current().record("owner", owner);
            let args = serde_json::Value::Object(args);
            if tasks::may_become_task(tool, &context) {
                let call = self.detached_call(tool, scope, owner.to_owned(), args, &context);
                let after =
                    std::time::Duration::from_millis(self.protocol.config().task_after_millis);
                let task_owner = self.task_owner(&context);
                return Ok(self
                    .protocol
                    .tasks
                    .call_or_task(call, after, &context.ct, &task_owner, &user_of(&context))
                    .await);
            }
            let stateless = is_stateless(&context);
            // A 2026-07-28 call made again with the user's answer to its input-required result.
            let prior_answer = if stateless {
                consent::prior_answer(&request, &self.protocol.policy.store, &user_of(&context))
                    .await?
            } else {
                None
            };
            let deferred = consent::deferred_for(&context);
            let asker: Option<Arc<dyn crate::policy::consent::Consent>> = match &deferred {
                Some(d) => Some(d.clone()),
                None => self.person_of(&context),
            };
            let caller = tools::Caller::new(owner, scope, context.ct.clone())
                .for_user(user_of(&context))
                .with_progress(notify::progress_of(&context, None))
                .with_session_hold(session_hold(&context))
                .with_consent(asker, prior_answer)
                .with_views(self.views_of(&context));
            // On the heap: a tool call's future holds every handler's (the key's detached run
            // among them), and moved about by value it took a debug build's 2 MiB thread stack
            // past its end on a failed create.
            let call = Box::pin(tools::call(&self.protocol.policy, caller, tool, args));
            let result = if stateless {
                notify::with_request_events(
                    self.protocol.process().events.subscribe(),
                    &context,
                    call,
                    &notify::Audience::new(self.protocol.policy.clone(), user_of(&context)),
                )
                .await
            } else {
                call.await
            };
            if let Some(question) = deferred
                .as_deref()
                .and_then(|d| consent::question_of(d, &request, &user_of(&context)))
            {
                return Ok(question);
            }
            Ok(CallToolResponse::Complete(answer::into_result(result)))
        }
        .instrument(span)
        .await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.protocol
            .tasks
            .get(&request.task_id, &self.task_owner(&context))
            .await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.protocol
            .tasks
            .cancel(&request.task_id, &self.task_owner(&context))
            .await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.protocol
            .tasks
            .update(
                &request.task_id,
                &self.task_owner(&context),
                request.input_responses,
            )
            .await
    }
}

impl SmolMcp {
    /// Who answers for the person on this request: a form (elicitation) when the client shows
    /// them, else the egress view when it shows views, else no one.
    fn person_of(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Option<Arc<dyn crate::policy::consent::Consent>> {
        consent::of_request(context).or_else(|| {
            crate::protocol::apps::declared(context).then(|| {
                Arc::new(consent::ViewConsent::new(
                    self.protocol.policy.clone(),
                    &user_of(context),
                )) as Arc<dyn crate::policy::consent::Consent>
            })
        })
    }

    /// What seals a view's answers to this request's user, when its client shows views.
    fn views_of(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Option<Arc<dyn crate::policy::consent::ViewSeal>> {
        crate::protocol::apps::declared(context).then(|| {
            Arc::new(consent::SealedViews::new(
                self.protocol.policy.store.clone(),
                user_of(context),
            )) as Arc<dyn crate::policy::consent::ViewSeal>
        })
    }

    /// Who a task of this request belongs to: its session (which only its user may use), or
    /// the sessionless requests of its user.
    fn task_owner(&self, context: &RequestContext<RoleServer>) -> String {
        if !is_stateless(context) {
            return self.session.to_string();
        }
        let user = user_of(context);
        if user.is_operator() {
            tasks::STATELESS.to_owned()
        } else {
            format!("{} of user {}", tasks::STATELESS, user.id())
        }
    }

    /// The call as a future of its own (owning what it uses), so that it can outlive its
    /// request as a task.
    fn detached_call(
        &self,
        tool: Tool,
        scope: tools::Scope,
        owner: String,
        args: serde_json::Value,
        context: &RequestContext<RoleServer>,
    ) -> tasks::DetachedCall {
        let config = self.protocol.config();
        let prepared = tools::Prepared::new(tool, scope.mode(), args);
        let exec_timeout = prepared
            .timeout_secs()
            .unwrap_or(config.exec_timeout_secs)
            .min(config.max_exec_timeout_secs);
        let bound = tasks::task_ttl(std::time::Duration::from_secs(exec_timeout), config);
        let ct = tokio_util::sync::CancellationToken::new();
        let stop = tokio_util::sync::CancellationToken::new();
        let activity = Arc::new(crate::policy::progress::Activity::default());
        let progress = notify::progress_of(context, Some(activity.clone()));
        let policy = self.protocol.policy.clone();
        let call_ct = ct.clone();
        let request = is_stateless(context).then(|| context.clone());
        let answered = activity.clone();
        let caller = tools::Caller::new(owner, scope, call_ct)
            .for_user(user_of(context))
            .with_progress(progress)
            .with_session_hold(session_hold(context))
            .with_consent(self.person_of(context), None)
            .with_views(self.views_of(context))
            .with_stop(stop.clone());
        let work = async move {
            let call = tools::call_prepared(&policy, caller, prepared);
            match &request {
                Some(context) => {
                    let events = policy.process.events.subscribe();
                    notify::with_request_events_until_answered(
                        events,
                        context,
                        call,
                        Some(&answered),
                        &notify::Audience::new(policy.clone(), user_of(context)),
                    )
                    .await
                }
                None => call.await,
            }
        };
        tasks::DetachedCall {
            tool,
            ct,
            stop,
            activity,
            bound,
            work: Box::pin(work),
        }
    }
}

/// The MCP Apps extension added to the capabilities declared.
fn with_views(capabilities: &mut ServerCapabilities) {
    capabilities
        .extensions
        .get_or_insert_with(Default::default)
        .insert(
            crate::protocol::apps::EXTENSION.to_owned(),
            crate::protocol::apps::server_settings(),
        );
}

/// What keeps the request's HTTP session open while a job it starts runs (`crate::policy::jobs`); the
/// HTTP layer puts it among the request's extensions.
fn session_hold(
    context: &RequestContext<RoleServer>,
) -> Option<crate::policy::jobs::SessionHoldRef> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| {
            parts
                .extensions
                .get::<crate::policy::jobs::SessionHoldRef>()
        })
        .cloned()
}
