//! Each table's repository: the store's traits answered with that table's statements, queued
//! for the writer or read on the read connection.

use super::queue::Write;
use super::schema::now_ms;
use super::{SqliteStore, grants, jobs, keys, owners, runs, spend, states, tasks};
use crate::fleet::FleetKind;
use crate::store::{
    EgressGrant, EgressGrantRepository, Hold, JobEnd, JobRecord, JobRepository, KeyClaim,
    KeyRecord, KeyRepository, NewRun, RequestStateRepository, RunDetail, RunEnd, RunPage,
    RunRepository, ServedEngine, SpendReading, SpendRepository, StoreResult, Taken, TaskRecord,
    TaskRepository,
};

#[async_trait::async_trait]
impl RunRepository for SqliteStore {
    fn begin(&self, run: NewRun) -> StoreResult<i64> {
        if self.started().is_none() || self.shared.broken.get().is_some() {
            self.shared.announce_if_broken();
            let reason = self.shared.broken.get().cloned().unwrap_or_default();
            return Err(self.shared.unusable(reason));
        }
        let id = self.shared.next_id();
        self.queue(Write::run_start(move |conn| runs::insert(conn, id, &run)))?;
        Ok(id)
    }

    fn end(&self, end: RunEnd) {
        self.record(Write::record(false, move |conn| runs::update(conn, &end)));
    }

    fn cost(&self, id: i64, usage_json: String) {
        self.record(Write::record(false, move |conn| {
            runs::set_usage(conn, id, &usage_json)
        }));
    }

    async fn page(&self, before: Option<i64>, limit: usize, user: &str) -> StoreResult<RunPage> {
        let user = user.to_owned();
        self.read(move |conn| runs::page(conn, before, limit, &user))
            .await
    }

    async fn get(&self, id: i64, user: &str) -> StoreResult<Option<RunDetail>> {
        let user = user.to_owned();
        self.read(move |conn| runs::one(conn, id, &user)).await
    }
}

#[async_trait::async_trait]
impl JobRepository for SqliteStore {
    fn started(&self, job: JobRecord) {
        self.record(Write::record(true, move |conn| jobs::insert(conn, &job)));
    }

    fn ended(&self, end: JobEnd) {
        self.record_if_started(Write::record(false, move |conn| jobs::update(conn, &end)));
    }

    fn let_go(&self, id: &str) {
        let id = id.to_owned();
        self.record(Write::record(false, move |conn| jobs::let_go(conn, &id)));
    }

    async fn take_over(&self, served: Vec<ServedEngine>) -> Vec<JobRecord> {
        // Answered after the commit: a job is taken over only once its claim is written.
        self.ask(false, move |conn| {
            jobs::take_over(conn, &served, crate::process::ephemeral::process_alive)
        })
        .await
        .unwrap_or_default()
    }

    async fn get(&self, id: &str) -> StoreResult<Option<crate::store::StoredJob>> {
        let id = id.to_owned();
        self.read(move |conn| jobs::one(conn, &id)).await
    }

    async fn others(&self, limit: usize) -> StoreResult<Vec<crate::store::StoredJob>> {
        self.read(move |conn| jobs::others(conn, now_ms(), limit))
            .await
    }
}

#[async_trait::async_trait]
impl TaskRepository for SqliteStore {
    fn created(&self, task: TaskRecord) {
        self.record(Write::record(true, move |conn| tasks::insert(conn, &task)));
    }

    fn ended(&self, id: &str, outcome: &'static str) {
        let id = id.to_owned();
        self.record_if_started(Write::record(false, move |conn| {
            tasks::end(conn, &id, outcome)
        }));
    }

    async fn get(&self, id: &str) -> StoreResult<Option<TaskRecord>> {
        let id = id.to_owned();
        self.read(move |conn| tasks::one(conn, &id)).await
    }

    fn answered_as(&self, id: &str, detail: String) {
        let id = id.to_owned();
        self.record_if_started(Write::record(false, move |conn| {
            tasks::answered(conn, &id, &detail)
        }));
    }

    fn cancel_asked(&self, id: &str) {
        let id = id.to_owned();
        self.record(Write::record(false, move |conn| {
            tasks::cancel_ask(conn, &id)
        }));
    }

    async fn cancel_wanted(&self, id: &str) -> bool {
        let id = id.to_owned();
        self.read(move |conn| tasks::cancel_wanted(conn, &id))
            .await
            .unwrap_or(false)
    }

    /// One host: the task's process lives while its pid does.
    async fn holder_alive(&self, task: &TaskRecord) -> bool {
        task.pid == std::process::id() || crate::process::ephemeral::process_alive(task.pid)
    }
}

#[async_trait::async_trait]
impl EgressGrantRepository for SqliteStore {
    fn add(&self, grant: EgressGrant) {
        if !grant.destinations.is_empty() {
            self.record(Write::record(true, move |conn| {
                grants::insert(conn, &grant)
            }));
        }
    }

    async fn for_machine(&self, hold: Hold) -> StoreResult<Vec<String>> {
        self.read(move |conn| grants::for_machine(conn, &hold))
            .await
    }
}

#[async_trait::async_trait]
impl SpendRepository for SqliteStore {
    async fn day_mark(&self, reading: SpendReading) -> StoreResult<i64> {
        self.ask(false, move |conn| spend::day_mark(conn, &reading))
            .await
    }
}

#[async_trait::async_trait]
impl KeyRepository for SqliteStore {
    async fn claim(&self, claim: KeyRecord) -> StoreResult<KeyClaim> {
        self.ask(true, move |conn| keys::claim(conn, &claim, now_ms()))
            .await
    }

    fn answered(&self, key: &str, answer: String) {
        let key = key.to_owned();
        self.record(Write::record(false, move |conn| {
            keys::answer(conn, &key, &answer)
        }));
    }

    fn released(&self, key: &str) {
        let key = key.to_owned();
        self.record(Write::record(false, move |conn| keys::release(conn, &key)));
    }

    async fn get(&self, key: &str) -> StoreResult<Option<KeyRecord>> {
        let key = key.to_owned();
        self.read(move |conn| keys::one(conn, &key)).await
    }

    /// One host: a pid and its start time tell (a pid reused since is another process).
    async fn holder_alive(&self, record: &KeyRecord) -> bool {
        record.pid == std::process::id()
            || crate::process::ephemeral::process_alive_since(record.pid, record.pid_started)
    }
}

#[async_trait::async_trait]
impl RequestStateRepository for SqliteStore {
    async fn take(&self, nonce: &str, lifetime_ms: i64, user: &str) -> StoreResult<Taken> {
        let (nonce, user) = (nonce.to_owned(), user.to_owned());
        self.ask(false, move |conn| {
            states::take(conn, &nonce, lifetime_ms, &user, now_ms())
        })
        .await
    }
}

#[async_trait::async_trait]
impl crate::store::OwnerRepository for SqliteStore {
    async fn claim(
        &self,
        hold: Hold,
        pending_after_ms: i64,
    ) -> StoreResult<crate::store::MachineClaim> {
        self.ask(true, move |conn| {
            owners::claim(conn, &hold, now_ms(), pending_after_ms)
        })
        .await
    }

    async fn made(&self, hold: Hold) -> StoreResult<()> {
        self.ask(true, move |conn| owners::made(conn, &hold, now_ms()))
            .await
    }

    async fn alias(&self, id: &str, hold: Hold) -> StoreResult<()> {
        let id = id.to_owned();
        self.ask(true, move |conn| owners::alias(conn, &id, &hold, now_ms()))
            .await
    }

    async fn holder(&self, fleet: FleetKind, name: &str) -> StoreResult<Option<String>> {
        let name = name.to_owned();
        self.read(move |conn| owners::holder(conn, fleet, &name))
            .await
    }

    async fn held(&self, fleet: FleetKind) -> StoreResult<Vec<(String, String)>> {
        self.read(move |conn| owners::held(conn, fleet)).await
    }

    async fn release(&self, hold: Hold) -> StoreResult<()> {
        self.ask(false, move |conn| owners::release(conn, &hold))
            .await
    }

    async fn held_since(&self, fleet: FleetKind) -> StoreResult<Vec<crate::store::Holding>> {
        self.read(move |conn| owners::held_since(conn, fleet)).await
    }

    async fn forget(&self, fleet: FleetKind, machine: &str) -> StoreResult<()> {
        let machine = machine.to_owned();
        self.ask(false, move |conn| owners::forget(conn, fleet, &machine))
            .await
    }

    async fn settle(&self, user: &str, day: &str, micros: i64) -> StoreResult<()> {
        let (user, day) = (user.to_owned(), day.to_owned());
        self.ask(false, move |conn| owners::settle(conn, &user, &day, micros))
            .await
    }

    async fn settled(&self, user: &str, day: &str) -> StoreResult<i64> {
        let (user, day) = (user.to_owned(), day.to_owned());
        self.read(move |conn| owners::settled(conn, &user, &day))
            .await
    }
}
