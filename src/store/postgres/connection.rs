//! Reaching the database: a connection with a bounded connect time and the server's name, the
//! statements it has prepared, and the database as messages show it (never its password).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// The client or transaction itself, for what is not a prepared statement.
    pub(super) fn inner(&self) -> &C {
        self.db
    }

    async fn statement(&self, sql: &str) -> Result<Statement, Error> {
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
    Ok(Connection {
        client: connect(config).await?,
        statements: Statements::counted(prepared),
    })
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
