//! The `requestState` this server hands a 2026-07-28 client with an input-required result
//! (MRTR): sealed with a key random per process (a question outlives no process: a restarted
//! server simply asks again), or, with a store several processes share, the key they all read
//! from it, so that the answer may come back through any of them; and bound to the call it was
//! asked for, so that an answer given for one call cannot be replayed into another. Each state
//! carries a nonce and is taken once (in the shared store when there is one): replayed after
//! its answer was applied, a state with another answer (a "yes" after a "no") would have
//! widened the machine again.

use rmcp::model::RequestStateCodec;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The states taken in the last `lifetime`, at most: past it a state cannot be taken until one
/// ages out, and the call is asked again instead.
const TAKEN_MAX: usize = 4096;

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
    /// `TAKEN_MAX` states were taken within their lifetime.
    Full,
    /// The shared store could not say whether another process took it: refused, since
    /// applying it might be its second time.
    Unknown(String),
}

/// Takes `nonce` for good, among every process sharing `store` when it keeps states, else in
/// this process.
pub async fn take_once(
    store: &std::sync::Arc<dyn crate::store::Store>,
    nonce: [u8; 16],
    lifetime: Duration,
    user: &crate::policy::user::User,
) -> Result<(), NotTaken> {
    let Some(states) = store.request_states() else {
        return take(nonce, lifetime, user.id());
    };
    let hex: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    let lifetime_ms = i64::try_from(lifetime.as_millis()).unwrap_or(i64::MAX);
    match states.take(&hex, lifetime_ms).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(NotTaken::Again),
        Err(e) => Err(NotTaken::Unknown(e.to_string())),
    }
}

/// Takes `nonce` for good (states live `lifetime`; a nonce older than that cannot come back
/// inside a state that still opens), for `user` (an id; the operator's is empty): a signed-in
/// user holds at most half of `TAKEN_MAX`, so that no one user's answers fill it for all.
pub fn take(nonce: [u8; 16], lifetime: Duration, user: &str) -> Result<(), NotTaken> {
    type Taken = HashMap<[u8; 16], (Instant, String)>;
    static TAKEN: OnceLock<Mutex<Taken>> = OnceLock::new();
    let Ok(mut taken) = TAKEN.get_or_init(Mutex::default).lock() else {
        return Err(NotTaken::Full);
    };
    let now = Instant::now();
    taken.retain(|_, (at, _)| now.duration_since(*at) < lifetime);
    if taken.contains_key(&nonce) {
        return Err(NotTaken::Again);
    }
    let users = || taken.values().filter(|(_, by)| by == user).count();
    if taken.len() >= TAKEN_MAX || (!user.is_empty() && users() >= TAKEN_MAX / 2) {
        return Err(NotTaken::Full);
    }
    taken.insert(nonce, (now, user.to_owned()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nonce_is_taken_once() {
        let n = nonce();
        assert_eq!(take(n, Duration::from_secs(600), ""), Ok(()));
        assert_eq!(take(n, Duration::from_secs(600), ""), Err(NotTaken::Again));
        assert_eq!(take(nonce(), Duration::from_secs(600), ""), Ok(()));
    }

    /// A signed-in user takes at most half of the states the process keeps: past it theirs are
    /// refused, another user's are not.
    #[test]
    fn one_user_takes_at_most_half_of_the_states() {
        let life = Duration::from_secs(600);
        let user = format!("u-{}", rand::random::<u64>());
        for _ in 0..TAKEN_MAX / 2 {
            assert_eq!(take(nonce(), life, &user), Ok(()));
        }
        assert_eq!(take(nonce(), life, &user), Err(NotTaken::Full));
        assert_eq!(take(nonce(), life, "someone-else"), Ok(()));
    }
}
