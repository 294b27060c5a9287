//! Questions for the user, never the agent: whether a machine created with `network: "ask"` may
//! reach the destinations its command was refused. The protocol floor asks (elicitation on a
//! session whose client can show a form); this floor decides when to ask and what a yes does.

use std::future::Future;
use std::pin::Pin;

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

/// What the user declined for each machine, in this process: not asked again (a command the
/// agent retries would otherwise put the same question to the user each time).
#[derive(Debug, Default)]
pub struct Declined {
    seen: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
}

impl Declined {
    pub fn record(&self, machine: &str, destinations: &[String]) {
        if let Ok(mut seen) = self.seen.lock() {
            for d in destinations {
                seen.insert((machine.to_owned(), d.clone()));
            }
        }
    }

    pub fn contains(&self, machine: &str, destination: &str) -> bool {
        self.seen
            .lock()
            .is_ok_and(|seen| seen.contains(&(machine.to_owned(), destination.to_owned())))
    }
}
