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
#[async_trait::async_trait]
pub trait Consent: Send + Sync {
    /// Asks whether `machine` may reach each of `destinations` (host names or addresses).
    async fn ask_egress(&self, machine: &str, destinations: &[String]) -> Asked;

    /// A question was put off to the client's next attempt of this call (`Asked::Deferred`):
    /// this call's answer is not its last.
    fn awaits_answer(&self) -> bool {
        false
    }
}

/// A client that shows this server's views (MCP Apps): what binds a view's answer to the
/// question it answers and to the user it was shown to, once, as an elicitation's answer is
/// bound by its sealed state (the protocol floor seals).
pub trait ViewSeal: Send + Sync {
    /// The state a view sends back with its answer to question `id`.
    fn seal(&self, id: &str) -> String;

    /// Whether `state` is the one sealed for question `id` for this caller's user, and never
    /// used before; else why not, in words for the view.
    fn open<'a>(
        &'a self,
        id: &'a str,
        state: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;
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

/// Questions a view answers (MCP Apps, `crate::protocol::apps`): a client that shows views
/// but no forms puts each question here, its view lists the user's open ones, and the person's
/// click comes back as a tool call that settles it. Held by the call that asked, which waits.
#[derive(Debug, Default)]
pub struct Board {
    open: std::sync::Mutex<Vec<Posted>>,
}

/// Open questions one user may have on the board at once; past it a question is not posted
/// (the command's refusals stand) until one is answered or given up.
pub const POSTED_PER_USER: usize = 8;
/// Open questions on the board, every user's together.
pub const POSTED_MAX: usize = 256;

#[derive(Debug)]
struct Posted {
    id: String,
    user: String,
    machine: String,
    destinations: Vec<String>,
    at: std::time::SystemTime,
    answer: Option<tokio::sync::oneshot::Sender<EgressAnswer>>,
}

/// An open question as a view shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenQuestion {
    pub id: String,
    pub machine: String,
    pub destinations: Vec<String>,
    /// When it was asked, in seconds since the epoch.
    pub asked_at: u64,
}

/// Why a question was not posted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BoardFull {
    User,
    All,
}

/// Why an answer settled nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotSettled {
    /// No open question of this user has the id (never asked, answered, or given up).
    Unknown,
    /// The answer named a destination the question did not ask about.
    NotAsked(String),
}

/// A posted question: dropping it (the asking call ended, answered or not) takes it down.
pub struct PostedQuestion<'a> {
    board: &'a Board,
    pub id: String,
    pub answer: tokio::sync::oneshot::Receiver<EgressAnswer>,
}

impl Drop for PostedQuestion<'_> {
    fn drop(&mut self) {
        if let Ok(mut open) = self.board.open.lock() {
            open.retain(|p| p.id != self.id);
        }
    }
}

impl Board {
    /// Puts `user`'s question about `machine` up for a view to show.
    pub fn post(
        &self,
        user: &str,
        machine: &str,
        destinations: &[String],
    ) -> Result<PostedQuestion<'_>, BoardFull> {
        let mut open = self.open.lock().map_err(|_| BoardFull::All)?;
        if open.len() >= POSTED_MAX {
            return Err(BoardFull::All);
        }
        if open.iter().filter(|p| p.user == user).count() >= POSTED_PER_USER {
            return Err(BoardFull::User);
        }
        let id = format!("q-{:016x}", rand::random::<u64>());
        let (tx, rx) = tokio::sync::oneshot::channel();
        open.push(Posted {
            id: id.clone(),
            user: user.to_owned(),
            machine: machine.to_owned(),
            destinations: destinations.to_vec(),
            at: std::time::SystemTime::now(),
            answer: Some(tx),
        });
        Ok(PostedQuestion {
            board: self,
            id,
            answer: rx,
        })
    }

    /// `user`'s open questions, oldest first.
    pub fn open_for(&self, user: &str) -> Vec<OpenQuestion> {
        let Ok(open) = self.open.lock() else {
            return Vec::new();
        };
        open.iter()
            .filter(|p| p.user == user && p.answer.is_some())
            .map(|p| OpenQuestion {
                id: p.id.clone(),
                machine: p.machine.clone(),
                destinations: p.destinations.clone(),
                asked_at: p
                    .at
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
            })
            .collect()
    }

    /// Settles `user`'s question `id`: `allowed` (each one it asked about) yes, the rest no.
    pub fn settle(&self, user: &str, id: &str, allowed: &[String]) -> Result<(), NotSettled> {
        let mut open = self.open.lock().map_err(|_| NotSettled::Unknown)?;
        let posted = open
            .iter_mut()
            .find(|p| p.id == id && p.user == user && p.answer.is_some())
            .ok_or(NotSettled::Unknown)?;
        if let Some(stray) = allowed.iter().find(|a| !posted.destinations.contains(a)) {
            return Err(NotSettled::NotAsked(stray.clone()));
        }
        let answer = EgressAnswer {
            allowed: allowed.to_vec(),
            declined: posted
                .destinations
                .iter()
                .filter(|d| !allowed.contains(d))
                .cloned()
                .collect(),
        };
        if let Some(tx) = posted.answer.take() {
            // The asking call may have ended just now: then nobody waits for the answer.
            let _ = tx.send(answer);
        }
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
    #[tokio::test]
    async fn a_view_settles_only_its_users_question_and_only_what_it_asked() {
        let board = Board::default();
        let asked = vec!["pypi.org".to_owned(), "github.com".to_owned()];
        let mut posted = board.post("alice", "m", &asked).unwrap();
        assert!(board.open_for("bob").is_empty());
        let open = board.open_for("alice");
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].destinations, asked);
        assert_eq!(
            board.settle("bob", &posted.id, &[]),
            Err(NotSettled::Unknown)
        );
        assert_eq!(
            board.settle("alice", &posted.id, &["evil.example".to_owned()]),
            Err(NotSettled::NotAsked("evil.example".to_owned()))
        );
        board
            .settle("alice", &posted.id, &["pypi.org".to_owned()])
            .unwrap();
        assert_eq!(
            board.settle("alice", &posted.id, &[]),
            Err(NotSettled::Unknown),
            "settled once"
        );
        let id = posted.id.clone();
        let answer = (&mut posted.answer).await.unwrap();
        drop(posted);
        assert_eq!(answer.allowed, ["pypi.org"]);
        assert_eq!(answer.declined, ["github.com"]);
        assert!(board.open_for("alice").is_empty());
        assert_eq!(board.settle("alice", &id, &[]), Err(NotSettled::Unknown));
    }

    #[test]
    fn the_board_is_bounded_per_user_and_a_dropped_question_comes_down() {
        let board = Board::default();
        let held: Vec<_> = (0..POSTED_PER_USER)
            .map(|_| board.post("alice", "m", &["a".to_owned()]).unwrap())
            .collect();
        assert_eq!(
            board.post("alice", "m", &["a".to_owned()]).err(),
            Some(BoardFull::User)
        );
        assert!(board.post("bob", "m", &["a".to_owned()]).is_ok());
        drop(held);
        assert!(board.open_for("alice").is_empty());
        assert!(board.post("alice", "m", &["a".to_owned()]).is_ok());
    }
}
