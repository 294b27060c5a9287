//! Processes as the database knows them: each registers as an *instance* (a random id, never
//! reused) and tells the database every [`HEARTBEAT`] that it lives; one not heard from for
//! [`STALE`], or on this very host with its pid ended, is dead. Times are the database's.

use super::connection::{connect, said};
use super::schema::NOW_MS;
use std::time::Duration;
use tokio_postgres::Client;

/// How often a process tells the database it lives.
pub(super) const HEARTBEAT: Duration = Duration::from_secs(5);
/// A process not heard from for this long is dead: its jobs, keys and runs are anyone's.
/// Six heartbeats, so that a stalled second or a slow commit does not bury a live process.
pub const STALE: Duration = Duration::from_secs(30);

/// This process as the database names it.
#[derive(Debug, Clone)]
pub(super) struct Me {
    pub instance: String,
    pub host: String,
}

/// An instance's row as liveness reads it: `SELECT id, host, pid, pid_started, <stale>`.
#[derive(Debug, Clone)]
pub(super) struct InstanceRow {
    pub id: String,
    host: String,
    pid: i64,
    pid_started: Option<i64>,
    stale: bool,
}

impl InstanceRow {
    pub(super) fn of(row: &tokio_postgres::Row) -> InstanceRow {
        InstanceRow {
            id: row.get(0),
            host: row.get(1),
            pid: row.get(2),
            pid_started: row.get(3),
            stale: row.get(4),
        }
    }

    /// Not heard from for [`STALE`], or on this host with its process gone.
    pub(super) fn dead(&self, me: &Me) -> bool {
        let gone_here = self.host == me.host
            && !crate::process::ephemeral::process_alive_since(
                u32::try_from(self.pid).unwrap_or(0),
                self.pid_started.and_then(|t| u64::try_from(t).ok()),
            );
        self.stale || gone_here
    }
}

/// The one statement liveness reads instances with, as [`InstanceRow::of`] takes them (`$1`:
/// [`stale_ms`]; `filter`, a `WHERE` clause or nothing, numbers its own parameters from `$2`).
pub(super) fn instances_query(filter: &str) -> String {
    format!(
        "SELECT id, host, pid, pid_started, heartbeat_ms < {NOW_MS} - $1 FROM instances {filter}"
    )
}

pub(super) fn stale_ms() -> i64 {
    i64::try_from(STALE.as_millis()).unwrap_or(i64::MAX)
}

/// Tells the database every [`HEARTBEAT`] that this process lives, on a connection of its own
/// so that a busy writer never makes it look dead.
pub(super) async fn heartbeat(config: tokio_postgres::Config, instance: String) {
    let mut client: Option<Client> = None;
    let mut tick = tokio::time::interval(HEARTBEAT);
    loop {
        tick.tick().await;
        if client.as_ref().is_none_or(Client::is_closed) {
            client = connect(&config).await.ok();
        }
        let Some(db) = client.as_ref() else { continue };
        let beat = db
            .execute(
                &format!("UPDATE instances SET heartbeat_ms = {NOW_MS} WHERE id = $1"),
                &[&instance],
            )
            .await;
        match beat {
            Ok(1) => {}
            Ok(_) => tracing::error!(
                "the store forgot this process (it was not heard from for {} s): others may \
                 have taken over its jobs",
                STALE.as_secs()
            ),
            Err(e) => {
                tracing::warn!(error = %said(&e), "could not tell the store this process lives")
            }
        }
    }
}
