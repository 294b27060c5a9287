//! Asking the user whether a machine may reach the hosts a command was refused: a form with one
//! yes/no per destination, through elicitation on a session whose client can show forms. A
//! 2026-07-28 request has no session: its client gets the same form in an input-required result
//! (MRTR), and the call it makes again with the answer applies it before running the command.

use crate::policy::consent::{Asked, Consent, EgressAnswer, PriorAnswer, ViewSeal};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ElicitRequest, ElicitRequestParams, ElicitResult,
    ElicitationAction, ElicitationSchema, InputRequest, InputRequiredResult, JsonObject,
    SealOptions,
};
use rmcp::service::{ElicitationMode, Peer, RequestContext};
use rmcp::{ErrorData, RoleServer};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long the user has to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(600);

/// The user behind one session's client.
struct SessionConsent {
    peer: Peer<RoleServer>,
}

/// Who can answer for the user on this request: its session's client, if it shows forms.
pub fn of_request(context: &RequestContext<RoleServer>) -> Option<Arc<dyn Consent>> {
    if crate::protocol::is_stateless(context)
        || !context
            .peer
            .supported_elicitation_modes()
            .contains(&ElicitationMode::Form)
    {
        return None;
    }
    Some(Arc::new(SessionConsent {
        peer: context.peer.clone(),
    }))
}

/// The key of the egress question among a request's `inputResponses`.
const QUESTION: &str = "egress";

fn key(i: usize) -> String {
    format!("allow{i}")
}

/// The form: one yes/no a destination.
fn egress_form(machine: &str, destinations: &[String]) -> Option<ElicitRequestParams> {
    let mut schema = ElicitationSchema::builder();
    for (i, destination) in destinations.iter().enumerate() {
        let title = destination.clone();
        schema = schema.required_bool_with(key(i), move |b| b.title(title).with_default(false));
    }
    Some(ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: format!(
            "A command in machine {machine} tried to reach {}, which its network does not \
             allow. Allow the machine to reach each? A yes lasts for this machine (and machines \
             made from its list later); the agent cannot widen it itself.",
            destinations.join(", ")
        ),
        requested_schema: schema.build().ok()?,
    })
}

/// What an answer to the form says of each destination.
fn answer_of(result: &ElicitResult, destinations: &[String]) -> Option<EgressAnswer> {
    if result.action != ElicitationAction::Accept {
        return None;
    }
    let content = result.content.as_ref()?;
    let mut answer = EgressAnswer::default();
    for (i, destination) in destinations.iter().enumerate() {
        if content
            .get(key(i).as_str())
            .and_then(serde_json::Value::as_bool)
            == Some(true)
        {
            answer.allowed.push(destination.clone());
        } else {
            answer.declined.push(destination.clone());
        }
    }
    Some(answer)
}

#[async_trait::async_trait]
impl Consent for SessionConsent {
    async fn ask_egress(&self, machine: &str, destinations: &[String]) -> Asked {
        let Some(params) = egress_form(machine, destinations) else {
            return Asked::NoAnswer;
        };
        match self
            .peer
            .create_elicitation_with_timeout(params, Some(ANSWER_WITHIN))
            .await
        {
            Ok(result) => answer_of(&result, destinations).map_or(Asked::NoAnswer, Asked::Answered),
            Err(e) => {
                tracing::info!(error = %e, %machine, "the egress question got no answer");
                Asked::NoAnswer
            }
        }
    }
}

/// A 2026-07-28 request's way to the user: the question is kept, and goes back to the client in
/// an input-required result instead of the call's answer.
#[derive(Default)]
pub struct Deferred {
    question: Mutex<Option<(String, Vec<String>)>>,
}

#[async_trait::async_trait]
impl Consent for Deferred {
    async fn ask_egress(&self, machine: &str, destinations: &[String]) -> Asked {
        if let Ok(mut question) = self.question.lock() {
            *question = Some((machine.to_owned(), destinations.to_vec()));
        }
        Asked::Deferred
    }

    fn awaits_answer(&self) -> bool {
        self.question.lock().is_ok_and(|q| q.is_some())
    }
}

/// For a 2026-07-28 request whose client declared form elicitation (the spec's default when an
/// elicitation capability names no mode).
pub fn deferred_for(context: &RequestContext<RoleServer>) -> Option<Arc<Deferred>> {
    let can_elicit = context
        .meta
        .client_capabilities()
        .and_then(|c| c.elicitation)
        .is_some_and(|e| e.form.is_some() || e.url.is_none());
    (crate::protocol::is_stateless(context) && can_elicit).then(Arc::default)
}

/// The input-required result that asks the deferred question, if the call asked one; the call
/// comes back with the answer and the sealed state.
pub fn question_of(
    deferred: &Deferred,
    request: &CallToolRequestParams,
    user: &crate::policy::user::User,
) -> Option<CallToolResponse> {
    let (machine, destinations) = deferred.question.lock().ok()?.take()?;
    let params = egress_form(&machine, &destinations)?;
    let args = request.arguments.clone().unwrap_or_default();
    let payload = serde_json::to_vec(&(machine, destinations, super::sealed::nonce())).ok()?;
    let state = super::sealed::codec().seal_with(
        &payload,
        &SealOptions::new()
            .associated_data(&super::sealed::bound_to(user, &request.name, &args))
            .ttl(ANSWER_WITHIN),
    );
    let question = InputRequest::Elicitation(ElicitRequest::new(params));
    Some(
        InputRequiredResult::new(Some([(QUESTION.to_owned(), question)].into()), Some(state))
            .into(),
    )
}

/// The answer a call made again carries to its earlier question, if any: only with the state
/// sealed for this very call (the spec has requestState attacker-controlled).
pub async fn prior_answer(
    request: &CallToolRequestParams,
    store: &std::sync::Arc<dyn crate::store::Store>,
    user: &crate::policy::user::User,
) -> Result<Option<PriorAnswer>, ErrorData> {
    let Some(response) = request
        .input_responses
        .as_ref()
        .and_then(|r| r.get(QUESTION))
    else {
        return Ok(None);
    };
    let args: JsonObject = request.arguments.clone().unwrap_or_default();
    let sealed = request.request_state.as_deref().unwrap_or_default();
    let payload = super::sealed::codec()
        .open_with(sealed, &super::sealed::bound_to(user, &request.name, &args))
        .map_err(|_| {
            ErrorData::invalid_params(
                "requestState is not the one this server issued for this call: make the call \
                 again without inputResponses to be asked again",
                None,
            )
        })?;
    let Ok((machine, destinations, nonce)) =
        serde_json::from_slice::<(String, Vec<String>, [u8; 16])>(&payload)
    else {
        return Ok(None);
    };
    // Once: the answer it carries has been applied (or refused) by the call that took it.
    super::sealed::take_once(store, nonce, ANSWER_WITHIN, user)
        .await
        .map_err(|why| {
            ErrorData::invalid_params(
                match why {
                    super::sealed::NotTaken::Again => "requestState was used already: its \
                         answer was applied once. Make the call again without inputResponses \
                         to be asked again"
                        .to_owned(),
                    super::sealed::NotTaken::Full => "too many answers came back in the last \
                         10 minutes for this server to remember them all: make the call again \
                         without inputResponses to be asked again"
                        .to_owned(),
                    super::sealed::NotTaken::Unknown(why) => format!(
                        "whether this requestState's answer was applied already could not be \
                         known ({why}), so it is not applied: make the call again without \
                         inputResponses to be asked again"
                    ),
                },
                None,
            )
        })?;
    let answer = serde_json::from_value::<ElicitResult>(response.clone())
        .ok()
        .and_then(|result| answer_of(&result, &destinations))
        .unwrap_or(EgressAnswer {
            allowed: Vec::new(),
            declined: destinations,
        });
    Ok(Some(PriorAnswer { machine, answer }))
}

/// The person behind a client that shows views and no forms: a question goes on the board,
/// where the egress view shows it, and the call waits for their click.
pub struct ViewConsent {
    policy: Arc<crate::policy::Policy>,
    user: String,
}

impl ViewConsent {
    pub fn new(policy: Arc<crate::policy::Policy>, user: &crate::policy::user::User) -> Self {
        ViewConsent {
            policy,
            user: user.id().to_owned(),
        }
    }
}

#[async_trait::async_trait]
impl Consent for ViewConsent {
    async fn ask_egress(&self, machine: &str, destinations: &[String]) -> Asked {
        let mut posted = match self.policy.board.post(&self.user, machine, destinations) {
            Ok(posted) => posted,
            Err(full) => {
                tracing::info!(?full, %machine, "the egress question was not posted: the board is full");
                return Asked::NoAnswer;
            }
        };
        match tokio::time::timeout(ANSWER_WITHIN, &mut posted.answer).await {
            Ok(Ok(answer)) => Asked::Answered(answer),
            _ => Asked::NoAnswer,
        }
        // Dropping `posted` (here or when the call is cancelled) takes the question down.
    }
}

/// Seals each question's state for one user's views; an answer is taken once.
pub struct SealedViews {
    store: Arc<dyn crate::store::Store>,
    user: crate::policy::user::User,
}

impl SealedViews {
    pub fn new(store: Arc<dyn crate::store::Store>, user: crate::policy::user::User) -> Self {
        SealedViews { store, user }
    }

    fn bound(&self, id: &str) -> Vec<u8> {
        let args: rmcp::model::JsonObject = [("question".to_owned(), serde_json::Value::from(id))]
            .into_iter()
            .collect();
        super::sealed::bound_to(&self.user, "view-state", &args)
    }
}

impl ViewSeal for SealedViews {
    fn seal(&self, id: &str) -> String {
        let payload = super::sealed::nonce();
        super::sealed::codec().seal_with(
            &payload,
            &rmcp::model::SealOptions::new()
                .associated_data(&self.bound(id))
                .ttl(ANSWER_WITHIN),
        )
    }

    fn open<'a>(
        &'a self,
        id: &'a str,
        state: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(async move {
            let payload = super::sealed::codec()
                .open_with(state, &self.bound(id))
                .map_err(|_| {
                    "is not the state this server listed for this question and user: list the \
                     questions again (view egress) and answer with the state given"
                        .to_owned()
                })?;
            let nonce: [u8; 16] = payload
                .try_into()
                .map_err(|_| "is not a state this server issued".to_owned())?;
            super::sealed::take_once(&self.store, nonce, ANSWER_WITHIN, &self.user)
                .await
                .map_err(|why| match why {
                    super::sealed::NotTaken::Again => {
                        "was used already: its answer was given once".to_owned()
                    }
                    super::sealed::NotTaken::Full => {
                        "cannot be taken now: too many answers came back in the last 10 minutes"
                            .to_owned()
                    }
                    super::sealed::NotTaken::Unknown(why) => {
                        format!("could not be checked as unused ({why})")
                    }
                })
        })
    }
}
