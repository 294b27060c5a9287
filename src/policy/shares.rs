//! Each signed-in user's share of a process-wide bound (`maxTasks`, `maxRunningJobs`,
//! `httpMaxSessions`): without one, a single user could hold all of a bound and refuse every
//! other user's calls. A user may hold `userSharePercent` of a bound (at least one); the
//! operator (stdio, the static token) is held only by the bound itself.

use crate::policy::user::User;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How much of one bound each signed-in user holds now.
#[derive(Debug)]
pub struct UserShares {
    held: Mutex<HashMap<String, usize>>,
    /// The most one user may hold.
    share: usize,
}

/// One unit of a user's share, given back when dropped.
#[derive(Debug)]
pub struct ShareHeld {
    shares: Option<(Arc<UserShares>, String)>,
}

impl Drop for ShareHeld {
    fn drop(&mut self) {
        let Some((shares, user)) = self.shares.take() else {
            return;
        };
        if let Ok(mut held) = shares.held.lock()
            && let Some(count) = held.get_mut(&user)
        {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&user);
            }
        }
    }
}

impl UserShares {
    /// The shares of a bound of `bound` units, `percent` of it a user (at least one).
    pub fn new(bound: usize, percent: u64) -> Arc<UserShares> {
        let percent = usize::try_from(percent.min(100)).unwrap_or(100);
        let share = (bound.saturating_mul(percent) / 100).max(1);
        Arc::new(UserShares {
            held: Mutex::new(HashMap::new()),
            share,
        })
    }

    /// The most one user may hold.
    pub fn share(&self) -> usize {
        self.share
    }

    /// One more unit for `user`, or `None` when they hold their share already.
    pub fn take(self: &Arc<Self>, user: &User) -> Option<ShareHeld> {
        if user.is_operator() {
            return Some(ShareHeld { shares: None });
        }
        let mut held = self.held.lock().ok()?;
        let count = held.entry(user.id().to_owned()).or_default();
        if *count >= self.share {
            return None;
        }
        *count += 1;
        Some(ShareHeld {
            shares: Some((self.clone(), user.id().to_owned())),
        })
    }

    /// How much `user` holds now.
    pub fn held_by(&self, user: &User) -> usize {
        self.held
            .lock()
            .ok()
            .and_then(|held| held.get(user.id()).copied())
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_holds_at_most_their_share_and_gets_it_back() {
        let shares = UserShares::new(10, 50);
        let alice = User::signed_in("alice");
        let held: Vec<ShareHeld> = (0..5).map(|_| shares.take(&alice).unwrap()).collect();
        assert!(shares.take(&alice).is_none(), "past her share");
        assert!(shares.take(&User::signed_in("bob")).is_some());
        assert!(shares.take(&User::operator()).is_some());
        drop(held);
        assert_eq!(shares.held_by(&alice), 0);
        assert!(shares.take(&alice).is_some());
        assert_eq!(UserShares::new(1, 50).share(), 1, "at least one");
    }
}
