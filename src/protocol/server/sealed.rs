//! The `requestState` this server hands a 2026-07-28 client with an input-required result
//! (MRTR): sealed with a key random per process (a question outlives no process: a restarted
//! server simply asks again), or, with a store several processes share, the key they all read
//! from it, so that the answer may come back through any of them; and bound to the call it was
//! asked for, so that an answer given for one call cannot be replayed into another. Each state
//! carries a nonce and is taken once in the store (the file of one host's processes, or the
//! database): replayed after its answer was applied, a state with another answer (a "yes"
//! after a "no") would have widened the machine again. The store's contract tests take them.

use crate::store::Taken;
use rmcp::model::RequestStateCodec;
use std::sync::OnceLock;
use std::time::Duration;

static CODEC: OnceLock<RequestStateCodec> = OnceLock::new();

pub fn codec() -> &'static RequestStateCodec {
    CODEC.get_or_init(|| RequestStateCodec::new_unchecked(rand::random::<[u8; 32]>().to_vec()))
}

/// Seals and opens with `key` from now on (the shared store's, at start-up, before any state
/// is sealed). Answers false when a key is in use already: the first one stays.
pub fn use_key(key: Vec<u8>) -> bool {
    CODEC.set(RequestStateCodec::new_unchecked(key)).is_ok()
}

/// What a sealed state is bound to: the user it was issued to (the spec: bound to its
/// principal), the tool and the arguments it was called with. Another user echoing it, or the
/// same user another call, opens nothing.
pub fn bound_to(
    user: &crate::policy::user::User,
    tool: &str,
    args: &rmcp::model::JsonObject,
) -> Vec<u8> {
    serde_json::to_vec(&(user.id(), tool, args)).unwrap_or_default()
}

/// A fresh nonce for a state about to be sealed.
pub fn nonce() -> [u8; 16] {
    rand::random()
}

/// Why a state's nonce cannot be taken.
#[derive(Debug, PartialEq, Eq)]
pub enum NotTaken {
    /// It was taken before: its answer has been applied once.
    Again,
    /// [`crate::store::REQUEST_STATES_MAX`] states (half of them, for one signed-in user)
    /// were taken within their lifetime.
    Full,
    /// The shared store could not say whether another process took it: refused, since
    /// applying it might be its second time.
    Unknown(String),
}

/// Takes `nonce` for good for `user`, among every process sharing `store` (the processes of
/// one host share its file; those of several, the database).
pub async fn take_once(
    store: &std::sync::Arc<dyn crate::store::Store>,
    nonce: [u8; 16],
    lifetime: Duration,
    user: &crate::policy::user::User,
) -> Result<(), NotTaken> {
    let hex: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    let lifetime_ms = i64::try_from(lifetime.as_millis()).unwrap_or(i64::MAX);
    match store
        .request_states()
        .take(&hex, lifetime_ms, user.id())
        .await
    {
        Ok(Taken::Now) => Ok(()),
        Ok(Taken::Before) => Err(NotTaken::Again),
        Ok(Taken::Full) => Err(NotTaken::Full),
        Err(e) => Err(NotTaken::Unknown(e.to_string())),
    }
}
