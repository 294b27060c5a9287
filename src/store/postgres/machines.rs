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
/// comment names; what it changed, added or removed is written before the commit.
async fn change_rows(
    db: &mut Connection,
    scope: &Scope,
    change: &mut EntriesChange<'_>,
) -> Result<(), String> {
    let failed = |e: tokio_postgres::Error| said(&e);
    let began = db.client.transaction().await.map_err(failed)?;
    let transaction = db.statements.on(&began);
    let rows = match scope {
        Scope::All => {
            let lock_table = format!("LOCK TABLE {TABLE} IN EXCLUSIVE MODE");
            transaction
                .inner()
                .batch_execute(&lock_table)
                .await
                .map_err(failed)?;
            transaction
                .query(&select("ORDER BY seq"), &[])
                .await
                .map_err(failed)?
        }
        Scope::Named { fleet, names } => {
            let fleet = fleet.map(|f| f.as_str());
            let lock_table = format!("LOCK TABLE {TABLE} IN ROW EXCLUSIVE MODE");
            let lock_rows = select(&format!("{NAMED} ORDER BY fleet, name FOR UPDATE"));
            let name_params: [&(dyn ToSql + Sync); 2] = [&NAME_LOCK_CLASS, names];
            let row_params: [&(dyn ToSql + Sync); 2] = [&fleet, names];
            // Sent together (the client pipelines them), run one after the other.
            let (table, named, rows) = futures::join!(
                transaction.inner().batch_execute(&lock_table),
                transaction.execute(
                    "SELECT pg_advisory_xact_lock($1, key) FROM (SELECT DISTINCT hashtext(n) \
                     AS key FROM unnest($2::text[]) AS n ORDER BY key) AS keys",
                    &name_params,
                ),
                transaction.query(&lock_rows, &row_params),
            );
            table.map_err(failed)?;
            named.map_err(failed)?;
            rows.map_err(failed)?
        }
    };
    let before = decode(&rows)?;
    let mut after = before.clone();
    change(&mut after);
    let Difference { upserts, removed } = difference(&before, &after)?;
    if !removed.fleets.is_empty() {
        transaction
            .execute(
                &format!(
                    "DELETE FROM {TABLE} WHERE (fleet, name) IN \
                     (SELECT * FROM unnest($1::text[], $2::text[]))"
                ),
                &[&removed.fleets, &removed.names],
            )
            .await
            .map_err(failed)?;
    }
    if !upserts.fleets.is_empty() {
        transaction
            .execute(
                &format!(
                    "INSERT INTO {TABLE} (fleet, name, id, body) \
                     SELECT f, n, i, b::jsonb FROM unnest($1::text[], $2::text[], $3::text[], \
                     $4::text[]) AS u(f, n, i, b) \
                     ON CONFLICT (fleet, name) DO UPDATE SET id = EXCLUDED.id, body = EXCLUDED.body"
                ),
                &[
                    &upserts.fleets,
                    &upserts.names,
                    &upserts.ids,
                    &upserts.bodies,
                ],
            )
            .await
            .map_err(failed)?;
    }
    began.commit().await.map_err(failed)
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
