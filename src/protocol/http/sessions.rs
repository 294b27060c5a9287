//! The idle rule for HTTP sessions, owned here rather than by rmcp: rmcp's `keep_alive` counts
//! only events of the session's worker, so a tool call that takes longer than the idle limit
//! (a create-machine pulling an image) would have its session closed under it and its reply
//! lost. Here a session is idle only when none of its POSTs is in flight and no request of it
//! has arrived for the idle period. A GET event stream is not in flight: a client that keeps
//! only an event stream open and sends nothing is idle, so an abandoned stream cannot hold a
//! session's machines forever.

use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use crate::policy::user::User;

struct Activity {
    in_flight: usize,
    last: Instant,
    /// Who opened it: only they may use it (with sign-in, a session id is no credential).
    user: User,
}

/// The sessions the server opened, by `mcp-session-id`, with what they are doing.
#[derive(Default)]
pub(crate) struct Sessions {
    map: Mutex<HashMap<Arc<str>, Activity>>,
    /// Initializes in flight: they count against the bound before their session exists, so
    /// that a burst of them cannot overshoot it.
    opening: AtomicUsize,
    /// The same by user, for their share: taken under `map`'s lock, after it.
    opening_by: Mutex<HashMap<User, usize>>,
}

/// Why an initialize gets no place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoPlace {
    /// The user holds (or is opening) their share of sessions.
    UserShare,
    /// The process holds (or is opening) as many sessions as it may.
    Bound,
}

/// An initialize let through under the bound; its place is given back when this is dropped,
/// whether or not a session came of it.
pub(crate) struct Opening {
    sessions: Arc<Sessions>,
    user: User,
}

impl Opening {
    /// The initialize's answer carried the new session's id: from now on it is tracked.
    pub(crate) fn opened(self, id: &str) {
        self.sessions.opened(id, self.user.clone());
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        // After `opened` (if it came) has put the session in the map: the user's count never
        // dips between the two.
        let mut by = self.sessions.opening_by();
        if let Some(n) = by.get_mut(&self.user) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                by.remove(&self.user);
            }
        }
        drop(by);
        self.sessions.opening.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A POST of a session in flight; the session counts as busy until this is dropped (with the
/// response body, once it has been sent or abandoned by the client).
pub(crate) struct InFlight {
    sessions: Arc<Sessions>,
    id: Arc<str>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(a) = self.sessions.lock().get_mut(&self.id) {
            a.in_flight = a.in_flight.saturating_sub(1);
            a.last = Instant::now();
        }
    }
}

struct JobHold {
    sessions: Arc<Sessions>,
    id: Arc<str>,
}

impl crate::policy::jobs::SessionHold for JobHold {
    fn hold(&self) -> Option<Box<dyn Send + Sync>> {
        self.sessions
            .enter(&self.id)
            .map(|in_flight| Box::new(in_flight) as Box<dyn Send + Sync>)
    }
}

impl Sessions {
    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Activity>> {
        // Nothing panics while holding it; if something did, the counts are still usable.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn opening_by(&self) -> MutexGuard<'_, HashMap<User, usize>> {
        self.opening_by
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for one more session of `user`, unless they hold or are opening `share` (when
    /// they have one) or `max` are open or opening in all. Counted and taken at once: racing
    /// initializes of one user cannot pass their share between the check and the answer.
    pub(crate) fn reserve(
        self: &Arc<Self>,
        max: usize,
        user: &User,
        share: Option<usize>,
    ) -> Result<Opening, NoPlace> {
        let map = self.lock();
        let mut opening_by = self.opening_by();
        if let Some(share) = share {
            let held = map.values().filter(|a| a.user == *user).count()
                + opening_by.get(user).copied().unwrap_or(0);
            if held >= share {
                return Err(NoPlace::UserShare);
            }
        }
        if map.len() + self.opening.load(Ordering::Relaxed) >= max {
            return Err(NoPlace::Bound);
        }
        self.opening.fetch_add(1, Ordering::Relaxed);
        *opening_by.entry(user.clone()).or_default() += 1;
        Ok(Opening {
            sessions: self.clone(),
            user: user.clone(),
        })
    }

    /// A session rmcp has just opened (its initialize answer carried the id).
    fn opened(&self, id: &str, user: User) {
        self.lock().insert(
            Arc::from(id),
            Activity {
                in_flight: 0,
                last: Instant::now(),
                user,
            },
        );
    }

    /// Whether `user` may use session `id`: it opened it, or the id is not one this server
    /// tracks (rmcp answers those 404 itself).
    pub(crate) fn belongs_to(&self, id: &str, user: &User) -> bool {
        self.lock().get(id).is_none_or(|a| a.user == *user)
    }

    /// A request of a session arrives. Only ids this server opened are tracked, so a client
    /// sending made-up ids grows nothing (rmcp answers those 404).
    pub(crate) fn touch(&self, id: &str) {
        if let Some(a) = self.lock().get_mut(id) {
            a.last = Instant::now();
        }
    }

    /// A POST of a session arrives: busy until the returned guard is dropped.
    pub(crate) fn enter(self: &Arc<Self>, id: &str) -> Option<InFlight> {
        let mut map = self.lock();
        let key = map.get_key_value(id)?.0.clone();
        if let Some(a) = map.get_mut(id) {
            a.in_flight += 1;
            a.last = Instant::now();
        }
        Some(InFlight {
            sessions: self.clone(),
            id: key,
        })
    }

    /// What a job started by a request of session `id` holds while it runs: the session counts
    /// as busy, as if a POST were in flight.
    pub(crate) fn job_hold(self: &Arc<Self>, id: &str) -> crate::policy::jobs::SessionHoldRef {
        crate::policy::jobs::SessionHoldRef(Arc::new(JobHold {
            sessions: self.clone(),
            id: Arc::from(id),
        }))
    }

    pub(crate) fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Removes and returns the sessions idle for at least `limit`.
    fn take_idle(&self, limit: Duration) -> Vec<Arc<str>> {
        let mut map = self.lock();
        let idle: Vec<Arc<str>> = map
            .iter()
            .filter(|(_, a)| a.in_flight == 0 && a.last.elapsed() >= limit)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &idle {
            map.remove(id);
        }
        idle
    }

    #[cfg(test)]
    fn in_flight(&self, id: &str) -> Option<usize> {
        self.lock().get(id).map(|a| a.in_flight)
    }
}

/// Closes idle sessions through the session manager, which drops the session's handler and with
/// it deletes the session's ephemeral machines (`SessionEnd` in `crate::protocol::server`).
pub(crate) async fn reap(
    sessions: Arc<Sessions>,
    manager: Arc<LocalSessionManager>,
    limit: Duration,
    shutdown: CancellationToken,
) {
    let tick = (limit / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = interval.tick() => {}
        }
        for id in sessions.take_idle(limit) {
            match manager.close_session(&id).await {
                Ok(()) => tracing::info!(session = %id, "closed an idle session"),
                Err(e) => tracing::warn!(session = %id, error = %e, "cannot close an idle session"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_bounded_counting_those_opening() {
        let sessions = Arc::new(Sessions::default());
        let op = User::operator();
        let first = sessions.reserve(2, &op, None).unwrap();
        let second = sessions.reserve(2, &op, None).unwrap();
        assert_eq!(
            sessions.reserve(2, &op, None).err(),
            Some(NoPlace::Bound),
            "two opening fill the bound"
        );
        first.opened("a");
        drop(second);
        let third = sessions.reserve(2, &op, None).unwrap();
        assert!(
            sessions.reserve(2, &op, None).is_err(),
            "one open, one opening"
        );
        third.opened("b");
        assert!(sessions.reserve(2, &op, None).is_err());
        sessions.forget("a");
        assert!(sessions.reserve(2, &op, None).is_ok());
    }

    #[test]
    fn a_users_share_counts_the_sessions_they_are_opening() {
        let sessions = Arc::new(Sessions::default());
        let (alice, bob) = (User::signed_in("alice"), User::signed_in("bob"));
        // Two initializes of alice's in flight at once: the second is refused before either
        // has answered (checked apart from taking, both saw none and passed).
        let first = sessions.reserve(9, &alice, Some(2)).unwrap();
        let second = sessions.reserve(9, &alice, Some(2)).unwrap();
        assert_eq!(
            sessions.reserve(9, &alice, Some(2)).err(),
            Some(NoPlace::UserShare)
        );
        assert!(
            sessions.reserve(9, &bob, Some(2)).is_ok(),
            "bob's share is his"
        );
        first.opened("a1");
        assert!(
            sessions.reserve(9, &alice, Some(2)).is_err(),
            "one open, one opening"
        );
        // An initialize that made no session gives its place back.
        drop(second);
        let third = sessions.reserve(9, &alice, Some(2)).unwrap();
        third.opened("a2");
        assert!(sessions.reserve(9, &alice, Some(2)).is_err());
        sessions.forget("a1");
        assert!(sessions.reserve(9, &alice, Some(2)).is_ok());
    }

    #[test]
    fn a_session_is_idle_only_with_nothing_in_flight() {
        let sessions = Arc::new(Sessions::default());
        sessions
            .reserve(9, &User::operator(), None)
            .unwrap()
            .opened("a");
        sessions
            .reserve(9, &User::signed_in("bob"), None)
            .unwrap()
            .opened("b");
        assert!(sessions.belongs_to("b", &User::signed_in("bob")));
        assert!(!sessions.belongs_to("b", &User::operator()));
        assert!(!sessions.belongs_to("a", &User::signed_in("bob")));
        let call = sessions.enter("a");
        assert!(call.is_some());
        assert!(
            sessions.enter("unknown").is_none(),
            "unknown ids are not tracked"
        );
        assert_eq!(sessions.in_flight("a"), Some(1));
        assert_eq!(sessions.take_idle(Duration::ZERO), [Arc::from("b")]);
        drop(call);
        assert_eq!(sessions.in_flight("a"), Some(0));
        assert!(sessions.take_idle(Duration::from_secs(60)).is_empty());
        assert_eq!(sessions.take_idle(Duration::ZERO), [Arc::from("a")]);
    }
}
