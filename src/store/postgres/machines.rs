//! The record of ephemeral machines in the database: a row per machine (migration 8), and the
//! liveness of their owners by instance.
//!
//! A change of named machines (a create, a delete, a lease renewed) locks their rows and a
//! lock per name (a machine not yet recorded has no row to lock), so that changes of other
//! machines, in this process or another, go on beside it. A change of the whole record (a
//! sweep's claim, a count of bases) locks the table against every change. Both take the
//! table's lock first and the names' locks in one order, so neither waits on the other in a
//! circle.

use super::connection::{Connection, said};
use super::documents::Documents;
use super::instances::{InstanceRow, Me};
use crate::process::ephemeral::{EntriesChange, Entry, Liveness, RecordBook, RecordError, Scope};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_postgres::types::ToSql;

const TABLE: &str = "ephemeral_machines";
/// How long a reading of who lives is reused: a sweep asks it of every entry.
const LIVE_FOR: Duration = Duration::from_secs(1);
/// The advisory lock class of one machine name ("smrn"): apart from the claims' class.
const NAME_LOCK_CLASS: i32 = 0x736d_726e;

pub struct MachineBook {
    documents: Arc<Documents>,
    me: Me,
    live: Mutex<Option<(Instant, Vec<InstanceRow>)>>,
}

impl MachineBook {
    pub(super) fn new(documents: Arc<Documents>, me: Me) -> MachineBook {
        MachineBook {
            documents,
            me,
            live: Mutex::new(None),
        }
    }

    async fn instances(&self) -> Result<Vec<InstanceRow>, RecordError> {
        if let Ok(live) = self.live.lock()
            && let Some((at, rows)) = live.as_ref()
            && at.elapsed() < LIVE_FOR
        {
            return Ok(rows.clone());
        }
        let rows = self.documents.instances().await.map_err(unreadable)?;
        if let Ok(mut live) = self.live.lock() {
            *live = Some((Instant::now(), rows.clone()));
        }
        Ok(rows)
    }
}

#[async_trait::async_trait]
impl RecordBook for MachineBook {
    async fn update(
        &self,
        scope: &Scope,
        change: &mut EntriesChange<'_>,
    ) -> Result<(), RecordError> {
        self.documents
            .on_connection(async |db| change_rows(db, scope, change).await)
            .await
            .map_err(unreadable)
    }

    async fn entries(&self, scope: &Scope) -> Result<Vec<Entry>, RecordError> {
        self.documents
            .on_connection(async |db| {
                let db = db.prepared();
                let rows = match scope {
                    Scope::All => db.query(&select("ORDER BY seq"), &[]).await,
                    Scope::Named { fleet, names } => {
                        let fleet = fleet.map(|f| f.as_str());
                        db.query(&select(&format!("{NAMED} ORDER BY seq")), &[&fleet, names])
                            .await
                    }
                };
                decode(&rows.map_err(|e| said(&e))?)
            })
            .await
            .map_err(unreadable)
    }

    fn me(&self) -> Option<String> {
        Some(self.me.instance.clone())
    }

    /// By its instance: this process, or one heard from within the store's bound (on this
    /// host: whose process runs). An entry the file wrote (no instance) by its pid. When the
    /// database cannot say, the owner is taken to live: nothing is deleted on a guess.
    async fn liveness(&self) -> Liveness {
        let rows = self.instances().await.ok();
        let me = self.me.clone();
        Box::new(move |entry: &Entry| {
            let Some(owner) = entry.owner.as_deref() else {
                return crate::process::ephemeral::process_alive(entry.owner_pid);
            };
            if owner == me.instance {
                return true;
            }
            rows.as_ref().is_none_or(|rows| {
                rows.iter()
                    .find(|row| row.id == owner)
                    .is_some_and(|row| !row.dead(&me))
            })
        })
    }
}

/// The rows of the machines called any of `$2` (by name or id), on fleet `$1` or on either.
const NAMED: &str = "WHERE ($1::text IS NULL OR fleet = $1) AND (name = ANY($2) OR id = ANY($2))";

fn select(rest: &str) -> String {
    format!("SELECT fleet, name, body::text FROM {TABLE} {rest}")
}

/// `change` on the rows `scope` covers, in one transaction under the locks the module's
/// comment names; what it changed, added or removed is written before the commit. Two round
/// trips: the BEGIN goes with the locks and the read, the COMMIT with the writes.
async fn change_rows(
    db: &Connection,
    scope: &Scope,
    change: &mut EntriesChange<'_>,
) -> Result<(), String> {
    let prepared = db.prepared();
    let failed = |e: tokio_postgres::Error| said(&e);
    let transaction = db.pipelined();
    let client = transaction.client();
    let read = match scope {
        Scope::All => {
            let all = prepared
                .statement(&select("ORDER BY seq"))
                .await
                .map_err(failed)?;
            let lock_table = format!("LOCK TABLE {TABLE} IN EXCLUSIVE MODE");
            let (begun, table, rows) = futures::join!(
                transaction.begin(),
                client.batch_execute(&lock_table),
                client.query(&all, &[]),
            );
            begun.and(table).and(rows)
        }
        Scope::Named { fleet, names } => {
            let fleet = fleet.map(|f| f.as_str());
            let lock_names = prepared
                .statement(
                    "SELECT pg_advisory_xact_lock($1, key) FROM (SELECT DISTINCT hashtext(n) \
                     AS key FROM unnest($2::text[]) AS n ORDER BY key) AS keys",
                )
                .await
                .map_err(failed)?;
            let lock_rows = prepared
                .statement(&select(&format!("{NAMED} ORDER BY fleet, name FOR UPDATE")))
                .await
                .map_err(failed)?;
            let lock_table = format!("LOCK TABLE {TABLE} IN ROW EXCLUSIVE MODE");
            let name_params: [&(dyn ToSql + Sync); 2] = [&NAME_LOCK_CLASS, names];
            let row_params: [&(dyn ToSql + Sync); 2] = [&fleet, names];
            let (begun, table, named, rows) = futures::join!(
                transaction.begin(),
                client.batch_execute(&lock_table),
                client.execute(&lock_names, &name_params),
                client.query(&lock_rows, &row_params),
            );
            begun.and(table).and(named).and(rows)
        }
    };
    let written = async {
        let before = decode(&read.map_err(|e| failed(transaction.failed(e)))?)?;
        let mut after = before.clone();
        change(&mut after);
        let Difference { upserts, removed } = difference(&before, &after)?;
        let delete = prepared
            .statement(&format!(
                "DELETE FROM {TABLE} WHERE (fleet, name) IN \
                 (SELECT * FROM unnest($1::text[], $2::text[]))"
            ))
            .await
            .map_err(failed)?;
        let upsert = prepared
            .statement(&format!(
                "INSERT INTO {TABLE} (fleet, name, id, body) \
                 SELECT f, n, i, b::jsonb FROM unnest($1::text[], $2::text[], $3::text[], \
                 $4::text[]) AS u(f, n, i, b) \
                 ON CONFLICT (fleet, name) DO UPDATE SET id = EXCLUDED.id, body = EXCLUDED.body"
            ))
            .await
            .map_err(failed)?;
        let removed_params: [&(dyn ToSql + Sync); 2] = [&removed.fleets, &removed.names];
        let upsert_params: [&(dyn ToSql + Sync); 4] = [
            &upserts.fleets,
            &upserts.names,
            &upserts.ids,
            &upserts.bodies,
        ];
        // Each sends its request when first polled, in this order; an empty one sends none.
        let (deleted, upserted, committed) = futures::join!(
            async {
                match removed.fleets.is_empty() {
                    true => Ok(0),
                    false => client.execute(&delete, &removed_params).await,
                }
            },
            async {
                match upserts.fleets.is_empty() {
                    true => Ok(0),
                    false => client.execute(&upsert, &upsert_params).await,
                }
            },
            transaction.commit(),
        );
        deleted
            .and(upserted)
            .and(committed)
            .map_err(|e| failed(transaction.failed(e)))
    };
    match written.await {
        Ok(_) => Ok(()),
        Err(why) => {
            // Ended already if the COMMIT went out; if not (the read failed or did not decode),
            // ended here. Not ended, the connection is made again (see `Pipelined`).
            let _ = transaction.rollback().await;
            Err(why)
        }
    }
}

/// Rows to write, column by column.
#[derive(Default)]
struct Upserts {
    fleets: Vec<&'static str>,
    names: Vec<String>,
    ids: Vec<String>,
    bodies: Vec<String>,
}

/// The keys of rows to delete, column by column.
#[derive(Default)]
struct Removed {
    fleets: Vec<&'static str>,
    names: Vec<String>,
}

struct Difference {
    upserts: Upserts,
    removed: Removed,
}

/// What to write so that the rows read (`before`) become `after`: entries added or changed
/// (the last of a name, should a change add one twice), and the keys of those removed.
fn difference(before: &[Entry], after: &[Entry]) -> Result<Difference, String> {
    let key = |e: &Entry| (e.fleet.as_str(), e.name.clone());
    let was: HashMap<_, &Entry> = before.iter().map(|e| (key(e), e)).collect();
    let mut now: HashMap<_, &Entry> = HashMap::new();
    let mut order = Vec::new();
    for entry in after {
        if now.insert(key(entry), entry).is_none() {
            order.push(key(entry));
        }
    }
    let mut upserts = Upserts::default();
    for k in order {
        let Some(entry) = now.get(&k).copied() else {
            continue;
        };
        if was.get(&k).is_some_and(|old| *old == entry) {
            continue;
        }
        upserts.fleets.push(k.0);
        upserts.names.push(k.1);
        upserts.ids.push(entry.id.clone());
        upserts
            .bodies
            .push(serde_json::to_string(entry).map_err(|e| e.to_string())?);
    }
    let mut removed = Removed::default();
    for (fleet, name) in was.keys().filter(|k| !now.contains_key(*k)) {
        removed.fleets.push(fleet);
        removed.names.push(name.clone());
    }
    Ok(Difference { upserts, removed })
}

fn unreadable(why: impl Into<String>) -> RecordError {
    RecordError::Io {
        path: format!("the machine record ({TABLE}) in the store's database"),
        why: why.into(),
    }
}

/// The rows as entries; a row that is not one is refused, naming it and how to drop it.
fn decode(rows: &[tokio_postgres::Row]) -> Result<Vec<Entry>, String> {
    rows.iter()
        .map(|row| {
            let (fleet, name, body): (String, String, String) =
                (row.get(0), row.get(1), row.get(2));
            serde_json::from_str::<Entry>(&body).map_err(|e| {
                format!(
                    "the entry of {fleet} machine {name} is not a valid machine record ({e}). \
                     The machine may still be running: delete it if it is not needed, then drop \
                     its entry (DELETE FROM {TABLE} WHERE fleet = '{fleet}' AND name = '{name}')"
                )
            })
        })
        .collect()
}
