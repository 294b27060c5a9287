//! What a repository queues for the writer: its own statement, and what to do once the batch
//! holding it is committed. The writer knows no kind of record.

use rusqlite::Connection;

/// Told, once the batch holding a write is committed, whether it was.
pub(super) type AfterCommit = Box<dyn FnOnce(Result<(), String>) + Send>;

/// One queued write: a repository's statement, run inside the writer's transaction.
pub(super) struct Write {
    /// It adds a row that only retention takes away (it counts toward the next prune).
    pub(super) adds_record: bool,
    /// A run's start: when the file turns out unusable it is lost, and the clients are told.
    pub(super) starts_run: bool,
    /// A reader waits for it: the batch is committed at once rather than after the writer's linger.
    pub(super) flush: bool,
    pub(super) apply: Box<dyn FnOnce(&Connection) -> Applied + Send>,
}

/// What applying a write gave: the error that lost it, and what to do once the batch commits.
pub(super) struct Applied {
    pub(super) error: Option<rusqlite::Error>,
    pub(super) after_commit: Option<AfterCommit>,
}

impl Write {
    /// A record nothing waits on.
    pub(super) fn record(
        adds_record: bool,
        statement: impl FnOnce(&Connection) -> rusqlite::Result<()> + Send + 'static,
    ) -> Write {
        Write {
            adds_record,
            starts_run: false,
            flush: false,
            apply: Box::new(move |conn| Applied {
                error: statement(conn).err(),
                after_commit: None,
            }),
        }
    }

    /// A run's first record: like [`Write::record`], and lost runs are announced if the file
    /// turns out unusable.
    pub(super) fn run_start(
        statement: impl FnOnce(&Connection) -> rusqlite::Result<()> + Send + 'static,
    ) -> Write {
        Write {
            starts_run: true,
            ..Write::record(true, statement)
        }
    }

    /// A write whose answer `answer` is sent once its batch is committed: the statement's
    /// value if both it and the commit were written, else why not.
    pub(super) fn answered<T: Send + 'static>(
        adds_record: bool,
        statement: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
        answer: impl FnOnce(Result<T, String>) + Send + 'static,
    ) -> Write {
        Write {
            adds_record,
            starts_run: false,
            flush: false,
            apply: Box::new(move |conn| match statement(conn) {
                Ok(value) => Applied {
                    error: None,
                    after_commit: Some(Box::new(move |commit: Result<(), String>| {
                        answer(commit.map(|()| value));
                    })),
                },
                Err(e) => {
                    let reason = e.to_string();
                    Applied {
                        error: Some(e),
                        after_commit: Some(Box::new(move |_| answer(Err(reason)))),
                    }
                }
            }),
        }
    }

    /// Answered once everything queued before it is committed.
    pub(super) fn flush(done: tokio::sync::oneshot::Sender<()>) -> Write {
        Write {
            adds_record: false,
            starts_run: false,
            flush: true,
            apply: Box::new(move |_| Applied {
                error: None,
                after_commit: Some(Box::new(move |_| {
                    let _ = done.send(());
                })),
            }),
        }
    }
}
