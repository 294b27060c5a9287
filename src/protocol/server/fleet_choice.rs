//! Choosing the fleet, when the process serves both. A session client that can elicit (form
//! mode) is asked once, at its first tool call, which fleet the session is for; an answer
//! narrows the session to that fleet (the catalog loses `target`, `tools/list_changed` is sent)
//! and the call goes on. A 2026-07-28 request has no session to narrow: when it leaves `target`
//! out and its client declared elicitation, it gets an input-required result (MRTR) asking for
//! the fleet, and the retried call carries the answer. Anyone else keeps the required `target`.

use crate::fleet::FleetKind;
use crate::policy::tools::Scope;
use crate::process::Mode;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ElicitRequest, ElicitRequestParams, ElicitResult,
    ElicitationAction, ElicitationSchema, EnumSchema, InputRequest, InputRequiredResult,
    JsonObject, SealOptions,
};
use rmcp::service::{ElicitationMode, RequestContext};
use rmcp::{ErrorData, RoleServer};
use std::time::Duration;

/// The key of the one input request: the answer comes back under it in `inputResponses`.
const QUESTION: &str = "fleet";
/// How long a sealed question stays answerable, and how long a session client may take.
const ANSWER_WITHIN: Duration = Duration::from_secs(600);

/// A session's answer, asked for once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    NotAsked,
    Chose(FleetKind),
    /// Declined, cancelled, or the client cannot be asked: `target` stays required.
    KeepsTarget,
}

/// What one session decided about its fleet. Shared by the clones of its handler.
#[derive(Debug)]
pub struct SessionChoice {
    answer: tokio::sync::Mutex<Answer>,
}

impl Default for SessionChoice {
    fn default() -> Self {
        SessionChoice {
            answer: tokio::sync::Mutex::new(Answer::NotAsked),
        }
    }
}

/// How a tool call goes on.
#[derive(Debug)]
pub enum Settled {
    /// Run the tool with these arguments (a fleet chosen by MRTR is put in as `target`).
    Run(Scope, JsonObject),
    /// Answer the client with this instead (the MRTR question).
    Answer(CallToolResponse),
}

impl SessionChoice {
    /// The scope of a session request right now, without asking.
    pub fn scope(&self, mode: Mode, context: &RequestContext<RoleServer>) -> Scope {
        match self.answer.try_lock().map(|a| *a) {
            Ok(Answer::Chose(kind)) if !crate::protocol::is_stateless(context) => {
                Scope::Chosen(kind)
            }
            _ => Scope::Process(mode),
        }
    }

    /// Decides the fleet question for one `tools/call`, asking it if this is the moment.
    pub async fn settle(
        &self,
        mode: Mode,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<Settled, ErrorData> {
        let args = request.arguments.clone().unwrap_or_default();
        if mode != Mode::Both {
            return Ok(Settled::Run(Scope::Process(mode), args));
        }
        if crate::protocol::is_stateless(context) {
            return ask_by_input_required(request, args, context);
        }
        let mut answer = self.answer.lock().await;
        if *answer == Answer::NotAsked {
            *answer = ask_the_session(context).await;
            if let Answer::Chose(kind) = *answer {
                tracing::info!(fleet = kind.as_str(), "the session chose its fleet");
                if let Err(e) = context.peer.notify_tool_list_changed().await {
                    tracing::debug!(error = %e, "could not send tools/list_changed");
                }
            }
        }
        let scope = match *answer {
            Answer::Chose(kind) => Scope::Chosen(kind),
            _ => Scope::Process(mode),
        };
        Ok(Settled::Run(scope, args))
    }
}

fn question_schema() -> Option<ElicitationSchema> {
    let fleets = EnumSchema::builder(vec!["local".to_owned(), "cloud".to_owned()])
        .enum_titles(vec![
            "local: microVMs on this host (free)".to_owned(),
            "cloud: smol cloud (billed while a machine exists)".to_owned(),
        ])
        .ok()?
        .description("The fleet the machines run on")
        .build();
    ElicitationSchema::builder()
        .required_enum_schema(QUESTION, fleets)
        .build()
        .ok()
}

fn form(message: &str) -> Option<ElicitRequestParams> {
    Some(ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: message.to_owned(),
        requested_schema: question_schema()?,
    })
}

/// The fleet an accepted answer names.
fn chosen(result: &ElicitResult) -> Option<FleetKind> {
    if result.action != ElicitationAction::Accept {
        return None;
    }
    FleetKind::parse(result.content.as_ref()?.get(QUESTION)?.as_str()?)
}

const SESSION_QUESTION: &str = "Which fleet is this session for? local runs microVMs on this \
     host, free; cloud runs them on smol cloud, billed while a machine exists. The choice holds \
     for the rest of the session and the tools stop asking for a target; decline to keep \
     choosing per call.";

async fn ask_the_session(context: &RequestContext<RoleServer>) -> Answer {
    if !context
        .peer
        .supported_elicitation_modes()
        .contains(&ElicitationMode::Form)
    {
        return Answer::KeepsTarget;
    }
    let Some(params) = form(SESSION_QUESTION) else {
        return Answer::KeepsTarget;
    };
    let asked = context
        .peer
        .create_elicitation_with_timeout(params, Some(ANSWER_WITHIN));
    let result = tokio::select! {
        result = asked => result,
        // The call was cancelled while the user was asked: the question stays answered "no".
        _ = context.ct.cancelled() => return Answer::KeepsTarget,
    };
    match result {
        Ok(result) => chosen(&result).map_or(Answer::KeepsTarget, Answer::Chose),
        Err(e) => {
            tracing::info!(error = %e, "the fleet question got no answer; target stays required");
            Answer::KeepsTarget
        }
    }
}

const CALL_QUESTION: &str = "Which fleet should this call run on? local runs microVMs on this \
     host, free; cloud runs them on smol cloud, billed while a machine exists.";

fn ask_by_input_required(
    request: &CallToolRequestParams,
    mut args: JsonObject,
    context: &RequestContext<RoleServer>,
) -> Result<Settled, ErrorData> {
    let can_elicit = context
        .meta
        .client_capabilities()
        .and_then(|c| c.elicitation)
        // An elicitation capability naming neither mode means form (the spec's default).
        .is_some_and(|e| e.form.is_some() || e.url.is_none());
    if args.contains_key("target") || !can_elicit {
        return Ok(Settled::Run(Scope::Process(Mode::Both), args));
    }
    let binding = super::sealed::bound_to(&crate::protocol::user_of(context), &request.name, &args);
    if let Some(response) = request
        .input_responses
        .as_ref()
        .and_then(|r| r.get(QUESTION))
    {
        // The spec: requestState is attacker-controlled, so an answer counts only with the
        // state sealed for this very call.
        let sealed = request.request_state.as_deref().unwrap_or_default();
        if super::sealed::codec().open_with(sealed, &binding).is_err() {
            return Err(ErrorData::invalid_params(
                "requestState is not the one this server issued for this call: retry the call \
                 without inputResponses to be asked again",
                None,
            ));
        }
        let answer = serde_json::from_value::<ElicitResult>(response.clone())
            .ok()
            .as_ref()
            .and_then(chosen);
        // Declined or cancelled: the call runs without a target, which the tool refuses
        // naming the argument.
        if let Some(kind) = answer {
            args.insert("target".into(), kind.as_str().into());
        }
        return Ok(Settled::Run(Scope::Process(Mode::Both), args));
    }
    let Some(params) = form(CALL_QUESTION) else {
        return Ok(Settled::Run(Scope::Process(Mode::Both), args));
    };
    let state = super::sealed::codec().seal_with(
        b"fleet",
        &SealOptions::new()
            .associated_data(&binding)
            .ttl(ANSWER_WITHIN),
    );
    let question = InputRequest::Elicitation(ElicitRequest::new(params));
    Ok(Settled::Answer(
        InputRequiredResult::new(Some([(QUESTION.to_owned(), question)].into()), Some(state))
            .into(),
    ))
}
