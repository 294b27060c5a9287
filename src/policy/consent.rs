//! Questions for the user, never the agent: whether a machine created with `network: "ask"` may
//! reach the destinations its command was refused. The protocol floor asks (elicitation on a
//! session whose client can show a form); this floor decides when to ask and what a yes does.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What the user said of each destination asked about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressAnswer {
    pub allowed: Vec<String>,
    pub declined: Vec<String>,
}

/// How a question went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    Answered(EgressAnswer),
    /// Declined as a whole, cancelled, timed out, or the client could not be asked: every
    /// destination stays refused.
    NoAnswer,
    /// The question goes back to the client with this call's answer (a 2026-07-28 client's
    /// input-required result); the answer comes with the call made again.
    Deferred,
}

/// Someone who can answer for the user (the protocol floor implements it per request).
pub trait Consent: Send + Sync {
    /// Asks whether `machine` may reach each of `destinations` (host names or addresses).
    fn ask_egress<'a>(
        &'a self,
        machine: &'a str,
        destinations: &'a [String],
    ) -> Pin<Box<dyn Future<Output = Asked> + Send + 'a>>;

    /// A question was put off to the client's next attempt of this call (`Asked::Deferred`):
    /// this call's answer is not its last.
    fn awaits_answer(&self) -> bool {
        false
    }
}

/// The user's answer to a question this call's earlier attempt asked (MRTR): applied before the
/// command runs again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorAnswer {
    pub machine: String,
    pub answer: EgressAnswer,
}

/// How many questions about egress one session may put to the user in `QUESTION_WINDOW`: a
/// workload that fails on a new host each time would otherwise have its agent's retries ask the
/// user again and again (six commands made six forms in 4.5 s).
pub const QUESTIONS_PER_WINDOW: usize = 3;
pub const QUESTION_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// The questions about egress in this process: what the user answered for each machine (not
/// asked again), one question open per machine at a time (a later command's refusals wait for
/// it, then ask only what it left undecided), and each session's rate.
#[derive(Debug, Default)]
pub struct Questions {
    /// (machine, destination) -> whether the user allowed it.
    answered: std::sync::Mutex<std::collections::HashMap<(String, String), bool>>,
    open: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    asked: std::sync::Mutex<std::collections::HashMap<String, Vec<std::time::Instant>>>,
}

/// The turn of one machine's question: held while it is open.
pub struct Turn {
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Questions {
    pub fn record(&self, machine: &str, destinations: &[String], allowed: bool) {
        if let Ok(mut answered) = self.answered.lock() {
            for d in destinations {
                answered.insert((machine.to_owned(), d.clone()), allowed);
            }
        }
    }

    /// What the user answered about `destination` for `machine`, if asked.
    pub fn answer(&self, machine: &str, destination: &str) -> Option<bool> {
        self.answered
            .lock()
            .ok()?
            .get(&(machine.to_owned(), destination.to_owned()))
            .copied()
    }

    /// Waits for the question open about `machine`, if any, then holds the turn.
    pub async fn turn(&self, machine: &str) -> Option<Turn> {
        let lock = {
            let mut open = self.open.lock().ok()?;
            // Turns nobody holds or waits for are dropped: one entry per machine asked about
            // at this moment, not per machine ever asked about.
            open.retain(|_, turn| Arc::strong_count(turn) > 1);
            open.entry(machine.to_owned()).or_default().clone()
        };
        Some(Turn {
            _guard: lock.lock_owned().await,
        })
    }

    /// Whether `session` may ask the user now; else how long until it may.
    pub fn admit(&self, session: &str) -> Result<(), std::time::Duration> {
        let Ok(mut asked) = self.asked.lock() else {
            return Err(QUESTION_WINDOW);
        };
        let now = std::time::Instant::now();
        asked.retain(|_, times| {
            times.retain(|t| now.duration_since(*t) < QUESTION_WINDOW);
            !times.is_empty()
        });
        let times = asked.entry(session.to_owned()).or_default();
        if times.len() >= QUESTIONS_PER_WINDOW {
            let oldest = times.first().copied().unwrap_or(now);
            return Err(QUESTION_WINDOW.saturating_sub(now.duration_since(oldest)));
        }
        times.push(now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_asks_at_most_so_many_questions_a_window() {
        let q = Questions::default();
        for _ in 0..QUESTIONS_PER_WINDOW {
            assert_eq!(q.admit("s"), Ok(()));
        }
        assert!(q.admit("s").is_err());
        assert_eq!(q.admit("other"), Ok(()));
    }

    #[tokio::test]
    async fn one_question_per_machine_at_a_time() {
        let q = Arc::new(Questions::default());
        let first = q.turn("m").await;
        let waiting = {
            let q = q.clone();
            tokio::spawn(async move { q.turn("m").await.is_some() })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a second question waited");
        assert!(q.turn("n").await.is_some(), "another machine did not");
        drop(first);
        assert!(waiting.await.unwrap());
    }
}
