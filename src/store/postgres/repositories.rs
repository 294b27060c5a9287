//! The store's traits answered by the database: records queued for the writer, asks answered
//! by it, reads on the read connection.

use super::PgStore;
use super::connection::said;
use super::schema::NOW_MS;
use super::writes::{self, Write};
use crate::fleet::FleetKind;
use crate::store::{
    EgressGrant, EgressGrantRepository, Hold, JobEnd, JobRecord, JobRepository, KeyClaim,
    KeyRecord, KeyRepository, NewRun, REQUEST_STATES_MAX, RunDetail, RunEnd, RunPage,
    RunRepository, RunSummary, ServedEngine, SpendReading, SpendRepository, StoreResult,
    StreamRecord, Taken, TaskRecord, TaskRepository,
};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

impl PgStore {
    /// Whether instance `id` is this process or still lives. When the database cannot say,
    /// it is taken to live: nothing of it is taken or called lost on a guess.
    async fn instance_alive(&self, id: &str) -> bool {
        let Some(opened) = self.opened() else {
            return true;
        };
        if id == opened.instance {
            return true;
        }
        let Ok(reader) = self.reader().await else {
            return true;
        };
        let row = reader
            .prepared()
            .query_opt(
                &super::instances::instances_query("WHERE id = $2"),
                &[&super::instances::stale_ms(), &id],
            )
            .await;
        match row {
            Ok(Some(row)) => !super::instance_dead(&row, opened),
            Ok(None) => false,
            Err(_) => true,
        }
    }
}

#[async_trait::async_trait]
impl RunRepository for PgStore {
    fn begin(&self, run: NewRun) -> StoreResult<i64> {
        let slot = match self.opened() {
            Some(opened) => opened.slot,
            None => {
                let why = self.broken().unwrap_or_else(|| self.unusable("unknown"));
                self.announce(&why);
                return Err(why);
            }
        };
        let id = crate::store::records::next_run_id(&self.last_id, slot);
        self.queue(Write::RunStart(id, Box::new(run)))
            .inspect_err(|why| self.announce(why))?;
        Ok(id)
    }

    fn end(&self, end: RunEnd) {
        self.record(Write::RunEnd(Box::new(end)));
    }

    fn cost(&self, id: i64, usage_json: String) {
        self.record(Write::RunCost(id, usage_json));
    }

    async fn page(&self, before: Option<i64>, limit: usize, user: &str) -> StoreResult<RunPage> {
        let fetch = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
        let before = before.unwrap_or(i64::MAX);
        let mut runs: Vec<RunSummary> = self
            .read(async |db| {
                let rows = db
                    .query(
                        &format!(
                            "SELECT {SUMMARY_COLUMNS} FROM runs WHERE id < $1 AND user_id = $3 \
                             ORDER BY id DESC LIMIT $2"
                        ),
                        &[&before, &fetch, &user],
                    )
                    .await?;
                Ok(rows.iter().map(summary).collect())
            })
            .await?;
        let more = runs.len() > limit;
        runs.truncate(limit);
        Ok(RunPage { runs, more })
    }

    async fn get(&self, id: i64, user: &str) -> StoreResult<Option<RunDetail>> {
        self.read(async |db| {
            let row = db
                .query_opt(
                    &format!(
                        "SELECT {SUMMARY_COLUMNS}, workdir, env_names, error, stdout_head, \
                         stdout_tail, stderr_head, stderr_tail, stdout_dropped, \
                         stderr_dropped, usage FROM runs WHERE id = $1 AND user_id = $2"
                    ),
                    &[&id, &user],
                )
                .await?;
            Ok(row.map(|row| detail(&row)))
        })
        .await
    }
}

const SUMMARY_COLUMNS: &str = "id, tool, fleet, machine, command_kind, command, started_ms, \
     ended_ms, outcome, exit_code, timed_out, stdout_bytes, stderr_bytes";

fn summary(row: &Row) -> RunSummary {
    RunSummary {
        id: row.get(0),
        tool: row.get(1),
        fleet: row.get(2),
        machine: row.get(3),
        command_kind: row.get(4),
        command: row.get(5),
        started_ms: row.get(6),
        ended_ms: row.get(7),
        outcome: row.get(8),
        exit_code: row.get(9),
        timed_out: row.get(10),
        stdout_bytes: row.get(11),
        stderr_bytes: row.get(12),
    }
}

fn detail(row: &Row) -> RunDetail {
    let summary = summary(row);
    let stream = |bytes: Option<i64>, head: usize, tail: usize, dropped: usize| {
        bytes.map(|bytes| StreamRecord {
            bytes,
            dropped: row.get::<_, Option<i64>>(dropped).unwrap_or(0),
            head: row.get::<_, Option<String>>(head).unwrap_or_default(),
            tail: row.get::<_, Option<String>>(tail).unwrap_or_default(),
        })
    };
    RunDetail {
        stdout: stream(summary.stdout_bytes, 16, 17, 20),
        stderr: stream(summary.stderr_bytes, 18, 19, 21),
        usage: row.get(22),
        workdir: row.get(13),
        env_names: row.get(14),
        error: row.get(15),
        summary,
    }
}

#[async_trait::async_trait]
impl JobRepository for PgStore {
    fn started(&self, job: JobRecord) {
        self.record(Write::JobStarted(Box::new(job)));
    }

    fn ended(&self, end: JobEnd) {
        self.record(Write::JobEnded(end));
    }

    fn let_go(&self, id: &str) {
        self.record(Write::JobLetGo(id.to_owned()));
    }

    async fn take_over(&self, served: Vec<ServedEngine>) -> Vec<JobRecord> {
        self.ask(|answer| Write::TakeOver(served, answer))
            .await
            .unwrap_or_default()
    }

    async fn get(&self, id: &str) -> StoreResult<Option<crate::store::StoredJob>> {
        self.read(async |db| {
            let row = db
                .query_opt(
                    &format!("SELECT {STORED_JOB_COLUMNS} FROM jobs WHERE id = $1"),
                    &[&id],
                )
                .await?;
            Ok(row.and_then(|row| stored_job(&row)))
        })
        .await
    }

    async fn others(&self, limit: usize) -> StoreResult<Vec<crate::store::StoredJob>> {
        let me = self.me.instance.clone();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(async |db| {
            let rows = db
                .query(
                    &format!(
                        "SELECT {STORED_JOB_COLUMNS} FROM jobs WHERE owner <> $1 \
                         AND started_ms > {} - 86400000 ORDER BY started_ms DESC LIMIT $2",
                        super::schema::NOW_MS
                    ),
                    &[&me, &limit],
                )
                .await?;
            Ok(rows.iter().filter_map(stored_job).collect())
        })
        .await
    }
}

const STORED_JOB_COLUMNS: &str = "id, run_id, fleet, engine, machine, command, base, started_ms, \
     timeout_secs, state, exit_code, reason, user_id";

fn stored_job(row: &Row) -> Option<crate::store::StoredJob> {
    let record = writes::job(row, 12)?;
    let state = crate::store::records::known_job_state(&record.id, row.get(9))?;
    Some(crate::store::StoredJob {
        record,
        state,
        exit_code: row.get(10),
        reason: row.get(11),
    })
}

#[async_trait::async_trait]
impl TaskRepository for PgStore {
    fn created(&self, task: TaskRecord) {
        self.record(Write::TaskCreated(task));
    }

    fn ended(&self, id: &str, outcome: &'static str) {
        self.record(Write::TaskEnded(id.to_owned(), outcome));
    }

    async fn get(&self, id: &str) -> StoreResult<Option<TaskRecord>> {
        self.read(async |db| {
            let row = db
                .query_opt(
                    "SELECT id, pid, tool, created_ms, ttl_ms, outcome, owner, client, detail \
                     FROM tasks WHERE id = $1",
                    &[&id],
                )
                .await?;
            Ok(row.map(|row| TaskRecord {
                id: row.get(0),
                pid: u32::try_from(row.get::<_, i64>(1)).unwrap_or(0),
                tool: row.get(2),
                created_ms: row.get(3),
                ttl_ms: row.get(4),
                outcome: row.get(5),
                holder: Some(row.get(6)),
                client: row.get(7),
                detail: row.get(8),
            }))
        })
        .await
    }

    fn answered_as(&self, id: &str, detail: String) {
        self.record(Write::TaskAnswered(id.to_owned(), detail));
    }

    fn cancel_asked(&self, id: &str) {
        self.record(Write::TaskCancelAsked(id.to_owned()));
    }

    async fn cancel_wanted(&self, id: &str) -> bool {
        let Ok(reader) = self.reader().await else {
            return false;
        };
        reader
            .prepared()
            .query_opt("SELECT cancel_asked FROM tasks WHERE id = $1", &[&id])
            .await
            .ok()
            .flatten()
            .is_some_and(|row| row.get::<_, bool>(0))
    }

    async fn holder_alive(&self, task: &TaskRecord) -> bool {
        let Some(holder) = task.holder.as_deref() else {
            return crate::process::ephemeral::process_alive(task.pid);
        };
        self.instance_alive(holder).await
    }
}

#[async_trait::async_trait]
impl EgressGrantRepository for PgStore {
    fn add(&self, grant: EgressGrant) {
        if !grant.destinations.is_empty() {
            self.record(Write::Grant(grant));
        }
    }

    async fn for_machine(&self, hold: Hold) -> StoreResult<Vec<String>> {
        let Hold {
            fleet,
            name: machine,
            user,
        } = &hold;
        self.read(async |db| {
            let rows = db
                .query(
                    "SELECT destination FROM egress_grants WHERE machine = $1 AND fleet = $2 \
                     AND user_id = $3 GROUP BY destination ORDER BY MIN(granted_ms), MIN(id)",
                    &[&machine, &fleet.as_str(), &user],
                )
                .await?;
            Ok(rows.iter().map(|row| row.get(0)).collect())
        })
        .await
    }
}

#[async_trait::async_trait]
impl SpendRepository for PgStore {
    async fn day_mark(&self, reading: SpendReading) -> StoreResult<i64> {
        self.ask(|answer| Write::DayMark(reading, answer)).await
    }
}

#[async_trait::async_trait]
impl KeyRepository for PgStore {
    async fn claim(&self, claim: KeyRecord) -> StoreResult<KeyClaim> {
        self.ask(|answer| Write::ClaimKey(Box::new(claim), answer))
            .await
    }

    fn answered(&self, key: &str, answer: String) {
        self.record(Write::KeyAnswered(key.to_owned(), answer));
    }

    fn released(&self, key: &str) {
        self.record(Write::KeyReleased(key.to_owned()));
    }

    async fn get(&self, key: &str) -> StoreResult<Option<KeyRecord>> {
        self.read(async |db| writes::key(db, key).await).await
    }

    /// The holder is this process, or an instance heard from within [`super::STALE`] (on
    /// this host: whose process still runs). When the database cannot say, the holder is
    /// taken to live: the caller then waits for an answer (within its own bound) rather than
    /// telling the client a call was cut off that may still be running.
    async fn holder_alive(&self, record: &KeyRecord) -> bool {
        let Some(opened) = self.opened() else {
            return true;
        };
        let Some(holder) = record.holder.as_deref() else {
            return record.pid == std::process::id()
                || crate::process::ephemeral::process_alive_since(record.pid, record.pid_started);
        };
        if holder == opened.instance {
            return true;
        }
        self.instance_alive(holder).await
    }
}

#[async_trait::async_trait]
impl crate::store::RequestStateRepository for PgStore {
    /// One statement inserts unless a bound is reached; a second tells a nonce taken before
    /// from a full table. Processes inserting at the same instant may each pass the count
    /// before the other's row is seen: the bound holds to within the processes sharing it.
    async fn take(&self, nonce: &str, lifetime_ms: i64, user: &str) -> StoreResult<Taken> {
        let reader = self.reader().await?;
        let db = reader.prepared();
        let now = super::schema::NOW_MS;
        let unusable = |e: tokio_postgres::Error| self.unusable(said(&e));
        db.execute(
            &format!("DELETE FROM taken_states WHERE taken_ms < {now} - $1"),
            &[&lifetime_ms],
        )
        .await
        .map_err(unusable)?;
        let taken = db
            .execute(
                &format!(
                    "INSERT INTO taken_states (nonce, user_id, taken_ms) SELECT $1, $2, {now} \
                     WHERE (SELECT COUNT(*) FROM taken_states) < $3 AND ($2 = '' OR \
                     (SELECT COUNT(*) FROM taken_states WHERE user_id = $2) < $3 / 2) \
                     ON CONFLICT (nonce) DO NOTHING"
                ),
                &[&nonce, &user, &REQUEST_STATES_MAX],
            )
            .await
            .map_err(unusable)?;
        if taken == 1 {
            return Ok(Taken::Now);
        }
        let before = db
            .query_opt("SELECT 1 FROM taken_states WHERE nonce = $1", &[&nonce])
            .await
            .map_err(unusable)?;
        Ok(if before.is_some() {
            Taken::Before
        } else {
            Taken::Full
        })
    }
}

/// The advisory lock class of one user's claims on one fleet (the key's second half is a hash
/// of the two): apart from the migrations' lock.
const CLAIM_LOCK_CLASS: i32 = 0x736d_6f6c;

/// A claim is one transaction under its user's lock (so a per-user limit counts every claim
/// made before it, in any process); the other statements each decide alone.
#[async_trait::async_trait]
impl crate::store::OwnerRepository for PgStore {
    async fn claim(
        &self,
        hold: Hold,
        pending_after_ms: i64,
    ) -> StoreResult<crate::store::MachineClaim> {
        use crate::store::{HeldName, MachineClaim};
        let Hold { fleet, name, user } = &hold;
        self.on_claimer(async |db| {
            // One user's claims one at a time, in every process: the names read below are
            // then all the user held, none committed unseen between the insert and the read.
            // The transaction goes in one round trip (BEGIN, the four statements in order,
            // COMMIT), so the user's lock is held for no round trip at all: a process that
            // waits for the CPU holding it would hold up that user's creates in every process.
            let lock_key = format!("{}/{user}", fleet.as_str());
            let fleet = fleet.as_str();
            let lock: [&(dyn ToSql + Sync); 2] = [&CLAIM_LOCK_CLASS, &lock_key];
            let insert: [&(dyn ToSql + Sync); 3] = [&fleet, name, user];
            let holder: [&(dyn ToSql + Sync); 2] = [&fleet, name];
            let theirs: [&(dyn ToSql + Sync); 4] = [&fleet, user, &pending_after_ms, name];
            let insert_sql = format!(
                "INSERT INTO machine_owners (fleet, name, machine, user_id, made_ms, made) \
                 VALUES ($1, $2, $2, $3, {NOW_MS}, false) \
                 ON CONFLICT (fleet, name) DO NOTHING RETURNING user_id"
            );
            let prepared = db.prepared();
            let lock_sql = prepared
                .statement("SELECT pg_advisory_xact_lock($1, hashtext($2))")
                .await?;
            let insert_sql = prepared.statement(&insert_sql).await?;
            let holder_sql = prepared
                .statement("SELECT user_id FROM machine_owners WHERE fleet = $1 AND name = $2")
                .await?;
            let theirs_sql = prepared
                .statement(
                    "SELECT name, made FROM machine_owners WHERE fleet = $1 AND user_id = $2 \
                     AND name = machine AND (made OR made_ms >= $3 OR name = $4)",
                )
                .await?;
            let transaction = db.pipelined();
            let client = transaction.client();
            let (begun, locked, claimed, holder, theirs, committed) = futures::join!(
                transaction.begin(),
                client.execute(&lock_sql, &lock),
                client.query(&insert_sql, &insert),
                client.query(&holder_sql, &holder),
                client.query(&theirs_sql, &theirs),
                transaction.commit(),
            );
            let failed = |e| transaction.failed(e);
            begun.map_err(failed)?;
            locked.map_err(failed)?;
            let claimed = claimed.map_err(failed)?;
            let holder = holder.map_err(failed)?;
            let theirs = theirs.map_err(failed)?;
            committed.map_err(failed)?;
            if claimed.is_empty() {
                return Ok(MachineClaim::Held(
                    holder
                        .first()
                        .map_or_else(|| user.to_owned(), |row| row.get(0)),
                ));
            }
            Ok(MachineClaim::Claimed {
                theirs: theirs
                    .iter()
                    .map(|row| HeldName {
                        name: row.get(0),
                        made: row.get(1),
                    })
                    .collect(),
            })
        })
        .await
    }

    async fn made(&self, hold: Hold) -> StoreResult<()> {
        let Hold { fleet, name, user } = &hold;
        self.read(async |db| {
            db.execute(
                &format!(
                    "INSERT INTO machine_owners (fleet, name, machine, user_id, made_ms, made) \
                     VALUES ($1, $2, $2, $3, {NOW_MS}, true) ON CONFLICT (fleet, name) \
                     DO UPDATE SET user_id = EXCLUDED.user_id, machine = EXCLUDED.machine, \
                     made = true"
                ),
                &[&fleet.as_str(), &name, &user],
            )
            .await?;
            Ok(())
        })
        .await
    }

    async fn alias(&self, id: &str, hold: Hold) -> StoreResult<()> {
        let Hold { fleet, name, user } = &hold;
        self.read(async |db| {
            db.execute(
                &format!(
                    "INSERT INTO machine_owners (fleet, name, machine, user_id, made_ms) \
                     VALUES ($1, $2, $3, $4, {NOW_MS}) ON CONFLICT (fleet, name) DO NOTHING"
                ),
                &[&fleet.as_str(), &id, &name, &user],
            )
            .await?;
            Ok(())
        })
        .await
    }

    async fn holder(&self, fleet: FleetKind, name: &str) -> StoreResult<Option<String>> {
        self.read(async |db| {
            let row = db
                .query_opt(
                    "SELECT user_id FROM machine_owners WHERE fleet = $1 AND name = $2 AND made",
                    &[&fleet.as_str(), &name],
                )
                .await?;
            Ok(row.map(|row| row.get(0)))
        })
        .await
    }

    async fn held(&self, fleet: FleetKind) -> StoreResult<Vec<(String, String)>> {
        self.read(async |db| {
            let rows = db
                .query(
                    "SELECT name, user_id FROM machine_owners \
                     WHERE fleet = $1 AND name = machine AND made",
                    &[&fleet.as_str()],
                )
                .await?;
            Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
        })
        .await
    }

    async fn release(&self, hold: Hold) -> StoreResult<()> {
        let Hold { fleet, name, user } = &hold;
        self.read(async |db| {
            db.execute(
                "DELETE FROM machine_owners WHERE fleet = $1 AND user_id = $3 AND machine IN \
                 (SELECT machine FROM machine_owners \
                  WHERE fleet = $1 AND name = $2 AND user_id = $3)",
                &[&fleet.as_str(), &name, &user],
            )
            .await?;
            Ok(())
        })
        .await
    }

    async fn held_since(&self, fleet: FleetKind) -> StoreResult<Vec<crate::store::Holding>> {
        self.read(async |db| {
            let rows = db
                .query(
                    "SELECT machine, MIN(made_ms), bool_or(made) FROM machine_owners \
                     WHERE fleet = $1 GROUP BY machine",
                    &[&fleet.as_str()],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|row| crate::store::Holding {
                    machine: row.get(0),
                    since_ms: row.get(1),
                    made: row.get(2),
                })
                .collect())
        })
        .await
    }

    async fn forget(&self, fleet: FleetKind, machine: &str) -> StoreResult<()> {
        self.read(async |db| {
            db.execute(
                "DELETE FROM machine_owners WHERE fleet = $1 AND machine = $2",
                &[&fleet.as_str(), &machine],
            )
            .await?;
            Ok(())
        })
        .await
    }

    async fn settle(&self, user: &str, day: &str, micros: i64) -> StoreResult<()> {
        self.read(async |db| {
            db.execute(
                "INSERT INTO user_spend (user_id, day, settled_micros) VALUES ($1, $2, $3) \
                 ON CONFLICT (user_id, day) DO UPDATE \
                 SET settled_micros = user_spend.settled_micros + EXCLUDED.settled_micros",
                &[&user, &day, &micros],
            )
            .await?;
            Ok(())
        })
        .await
    }

    async fn settled(&self, user: &str, day: &str) -> StoreResult<i64> {
        self.read(async |db| {
            let row = db
                .query_opt(
                    "SELECT settled_micros FROM user_spend WHERE user_id = $1 AND day = $2",
                    &[&user, &day],
                )
                .await?;
            Ok(row.map_or(0, |row| row.get(0)))
        })
        .await
    }
}
