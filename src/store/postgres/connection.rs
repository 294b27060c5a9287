//! Reaching the database: a connection with a bounded connect time and the server's name, and
//! the database as messages show it (never its password).

use std::time::Duration;
use tokio_postgres::Client;

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
