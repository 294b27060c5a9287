//! Reaching the database: a connection with a bounded connect time and the server's name, the
//! statements it has prepared, and the database as messages show it (never its password).

use futures::FutureExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Error, GenericClient, Row, Statement};

/// How long connecting may take before the store is reported unusable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The database as messages name it, from its parsed connection settings.
pub(super) fn shown(config: &tokio_postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_default();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "postgres://{}@{host}:{port}/{}",
        config.get_user().unwrap_or(""),
        config.get_dbname().unwrap_or("")
    )
}

/// What went wrong, in the database's own words: tokio-postgres shows a database's refusal as
/// "db error" alone and keeps the server's message in its source.
pub(super) fn said(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let detail = db.detail().map(|d| format!(" ({d})")).unwrap_or_default();
        return format!(
            "{} {}: {}{detail}",
            db.severity(),
            db.code().code(),
            db.message()
        );
    }
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

/// The most statements one connection keeps prepared; one beyond is prepared for its use alone.
/// The server's statements are a fixed set of texts, fewer than this on any one connection.
const STATEMENTS_KEPT: usize = 96;

/// A connection and the statements prepared on it, by their text. tokio-postgres prepares a
/// statement given as text anew on every use: a round trip more, and the database's parse and
/// plan again. A statement is prepared once per connection, and its plan is the database's to
/// keep; a new connection starts with none.
#[derive(Debug)]
pub(super) struct Connection {
    pub(super) client: Client,
    pub(super) statements: Statements,
}

impl Connection {
    pub(super) fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// A transaction on this connection sent in as few round trips as its statements allow.
    pub(super) fn pipelined(&self) -> Pipelined<'_> {
        Pipelined {
            connection: self,
            open: AtomicBool::new(false),
        }
    }

    /// `client`, with no statements prepared (counted in `prepared`).
    pub(super) fn new(client: Client, prepared: &Arc<AtomicU64>) -> Connection {
        Connection {
            client,
            statements: Statements::counted(prepared),
        }
    }

    /// The connection's client (or a transaction on it) with its prepared statements.
    pub(super) fn prepared(&self) -> Prepared<'_, Client> {
        self.statements.on(&self.client)
    }
}

/// The statements one connection has prepared, and a count of every statement prepared by the
/// store's connections (a diagnostic: each text is prepared once per connection).
#[derive(Debug)]
pub(super) struct Statements {
    kept: Mutex<HashMap<Box<str>, Statement>>,
    prepared: Arc<AtomicU64>,
}

impl Statements {
    /// None yet, counted in `prepared`.
    pub(super) fn counted(prepared: &Arc<AtomicU64>) -> Statements {
        Statements {
            kept: Mutex::new(HashMap::new()),
            prepared: prepared.clone(),
        }
    }

    /// `db` (the connection these were prepared on, or a transaction on it) with them.
    pub(super) fn on<'a, C>(&'a self, db: &'a C) -> Prepared<'a, C> {
        Prepared {
            db,
            statements: self,
        }
    }

    fn kept(&self, sql: &str) -> Option<Statement> {
        self.kept.lock().ok()?.get(sql).cloned()
    }

    fn keep(&self, sql: &str, statement: &Statement) {
        self.prepared.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut kept) = self.kept.lock()
            && kept.len() < STATEMENTS_KEPT
        {
            kept.insert(sql.into(), statement.clone());
        }
    }

    /// Whether `error` says the kept statements no longer hold, which are then forgotten: the
    /// database refuses a kept statement whose result changed under it (a column's type
    /// changed by a newer server's migration), or has lost it (a pooler between that reset
    /// the session).
    fn stale_after(&self, error: &Error) -> bool {
        let stale = [
            SqlState::FEATURE_NOT_SUPPORTED,
            SqlState::INVALID_SQL_STATEMENT_NAME,
        ];
        let is_stale = error.code().is_some_and(|code| stale.contains(code));
        if is_stale && let Ok(mut kept) = self.kept.lock() {
            kept.clear();
        }
        is_stale
    }
}

/// A transaction whose BEGIN goes out with its first statements and whose COMMIT with its
/// last: tokio-postgres' `Transaction` waits a round trip for each, and a round trip is a wakeup
/// of the process and of the database's backend. The statements are sent together (futures
/// joined, each sending its request when first polled, so in the order joined: the statements
/// must be prepared before, or a prepare's round trip would reorder them). A statement after
/// a failed one fails as well and the COMMIT then ends the transaction (PostgreSQL rolls it
/// back), so the connection is outside a transaction either way. A caller that stops waiting
/// between the BEGIN and the COMMIT (a deadline, while a statement waits for a lock) sends a
/// ROLLBACK as it goes, as tokio-postgres' `Transaction` does: queued behind the statements
/// sent, it ends the transaction once they are done, rather than leaving its locks held on an
/// idle connection that every other process would wait on.
pub(super) struct Pipelined<'a> {
    connection: &'a Connection,
    open: AtomicBool,
}

impl Pipelined<'_> {
    pub(super) fn client(&self) -> &Client {
        &self.connection.client
    }

    pub(super) async fn begin(&self) -> Result<(), Error> {
        self.open.store(true, Ordering::Release);
        self.connection.client.batch_execute("BEGIN").await
    }

    /// Commits, or (after a failed statement) ends the transaction rolled back.
    pub(super) async fn commit(&self) -> Result<(), Error> {
        self.end("COMMIT").await
    }

    /// Rolls back a transaction not ended yet (its COMMIT not sent, or not answered).
    pub(super) async fn rollback(&self) -> Result<(), Error> {
        if !self.open.load(Ordering::Acquire) {
            return Ok(());
        }
        self.end("ROLLBACK").await
    }

    async fn end(&self, how: &str) -> Result<(), Error> {
        self.connection.client.batch_execute(how).await?;
        self.open.store(false, Ordering::Release);
        Ok(())
    }

    /// `error`, the kept statements forgotten if it says they no longer hold.
    pub(super) fn failed(&self, error: Error) -> Error {
        self.connection.statements.stale_after(&error);
        error
    }
}

impl Drop for Pipelined<'_> {
    fn drop(&mut self) {
        if self.open.load(Ordering::Acquire) {
            // Polled once, the request is sent (tokio-postgres sends on the first poll); its
            // answer is not waited for.
            let _ = self
                .connection
                .client
                .batch_execute("ROLLBACK")
                .now_or_never();
        }
    }
}

/// `sql` prepared (or kept) and run by `method`; prepared again and run once more when the kept
/// statement no longer held, which succeeds outside a transaction (inside one, the database
/// has refused the transaction already, and says so). A macro rather than a function taking
/// an async closure: such a future is not `Send` for every lifetime the callers need.
macro_rules! prepared_run {
    ($prepared:ident, $sql:ident, $method:ident, $params:ident) => {{
        let statement = $prepared.statement($sql).await?;
        match $prepared.db.$method(&statement, $params).await {
            Err(e) if $prepared.statements.stale_after(&e) => {
                let statement = $prepared.statement($sql).await?;
                $prepared.db.$method(&statement, $params).await
            }
            done => done,
        }
    }};
}

/// A client or transaction whose statements, given as text, are prepared once.
pub(super) struct Prepared<'a, C> {
    db: &'a C,
    statements: &'a Statements,
}

impl<C: GenericClient + Sync> Prepared<'_, C> {
    /// `sql` prepared, or kept from before: for the statements of a [`Pipelined`] transaction,
    /// which are prepared before any is sent.
    pub(super) async fn statement(&self, sql: &str) -> Result<Statement, Error> {
        if let Some(statement) = self.statements.kept(sql) {
            return Ok(statement);
        }
        let statement = self.db.prepare(sql).await?;
        self.statements.keep(sql, &statement);
        Ok(statement)
    }

    pub(super) async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error> {
        prepared_run!(self, sql, execute, params)
    }

    pub(super) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        prepared_run!(self, sql, query, params)
    }

    pub(super) async fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error> {
        prepared_run!(self, sql, query_one, params)
    }

    pub(super) async fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error> {
        prepared_run!(self, sql, query_opt, params)
    }
}

/// A new connection to the database, with no statements prepared (counted in `prepared`).
pub(super) async fn connection(
    config: &tokio_postgres::Config,
    prepared: &Arc<AtomicU64>,
) -> Result<Connection, String> {
    Ok(Connection::new(connect(config).await?, prepared))
}

pub(super) async fn connect(config: &tokio_postgres::Config) -> Result<Client, String> {
    let mut config = config.clone();
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("smol-mcp");
    }
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("could not connect: {}", said(&e)))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %said(&e), "a connection to the store ended");
        }
    });
    Ok(client)
}
