//! The store as a PostgreSQL database several server processes share (`storeUrl`), on one
//! host or many. Each process registers itself as an *instance* with a heartbeat; every record
//! a process owns (a run, a job, a task, a key) names its instance, and a process is dead when
//! its heartbeat is older than [`STALE`] (or, on this very host, when its pid has ended):
//! a pid names nothing on another host. Times compared between processes are the database's.
//!
//! As with the file, a call never waits on the database for a write nothing depends on: writes
//! go on a bounded queue to one writer task, which commits what is queued in one transaction;
//! what a limit waits on (a key's claim, a day's spend mark, a dead process's jobs) is one
//! statement that decides under PostgreSQL's row locks, answered once committed, so two
//! processes racing for a claim never both win it. Unlike the file, the database is reached
//! and its schema brought up to date at start-up ([`PgStore::ready`]): a server refuses to
//! start on a database it cannot use or whose schema is newer than it knows.

mod connection;
mod documents;
mod instances;
mod machines;
mod repositories;
mod schema;
mod writes;

use crate::process::config::Secret;
use crate::process::events::{Events, ServerEvent};
use crate::store::api::{Backend, Lifecycle, RunRetention, Sharing, StoreResult, StoreUnavailable};
use connection::{Connection, Prepared, connect, connection, said, shown};
pub use instances::STALE;
use instances::{InstanceRow, Me, heartbeat};
use schema::NOW_MS;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OnceCell, mpsc, oneshot};
use tokio_postgres::Client;
use writes::{Write, Writer};

/// Writes waiting for the writer; beyond this a write is dropped rather than a call held up.
const QUEUE: usize = 1024;
/// The most records one transaction commits.
const BATCH: usize = 256;
/// How long a read waits for the writes queued before it to be written.
const FLUSH_WAIT: Duration = Duration::from_secs(2);
/// Records written between two prunings.
const PRUNE_EVERY: u64 = 256;
/// As many processes as may share one database at once: each takes the lowest run-id slot no
/// live instance holds (see [`crate::store::records::RUN_ID_SLOTS`]).
const SLOTS: i64 = crate::store::records::RUN_ID_SLOTS;

/// The schema version this server brings a database to (and the newest it runs on).
pub const SCHEMA_VERSION: usize = schema::MIGRATIONS.len();

/// The database store. It connects at [`PgStore::ready`].
pub struct PgStore {
    config: Result<tokio_postgres::Config, String>,
    /// The database as messages name it: host, port, database and user, never the password.
    shown: String,
    retention: RunRetention,
    events: Events,
    queue: mpsc::Sender<Write>,
    receiver: Mutex<Option<mpsc::Receiver<Write>>>,
    opened: OnceCell<Result<Arc<Opened>, String>>,
    dropped: AtomicU64,
    last_id: AtomicI64,
    announced: AtomicBool,
    /// This process as the database knows it: its instance id (random, never reused) and
    /// its host's name (liveness by pid is only asked of instances on this host).
    me: Me,
    /// The documents' connection, made when first asked for.
    documents: std::sync::OnceLock<Arc<documents::Documents>>,
    /// Statements prepared by every connection of this store.
    prepared: Arc<AtomicU64>,
    /// Records queued and not yet written (or given up on): a read waits for the writer only
    /// when there are some, not a turn of the writer's queue on every read.
    unwritten: Arc<AtomicU64>,
}

/// Registers this process as an instance in the lowest slot no live instance holds (one
/// heard from within [`STALE`]), one registration at a time: two processes sharing the
/// database never share a slot, so never make the same run id. Refused when all are held.
async fn register(
    client: &mut Client,
    instance: &str,
    host: &str,
    pid: u32,
    pid_started: Option<i64>,
) -> Result<i64, String> {
    let refused =
        |e: tokio_postgres::Error| format!("could not register this process: {}", said(&e));
    let transaction = client.transaction().await.map_err(refused)?;
    transaction
        .execute("SELECT pg_advisory_xact_lock($1)", &[&SLOT_LOCK])
        .await
        .map_err(refused)?;
    let free = transaction
        .query_opt(
            &format!(
                "SELECT n::bigint FROM generate_series(0, {last}) AS n WHERE n NOT IN \
                 (SELECT slot FROM instances WHERE heartbeat_ms >= {NOW_MS} - $1) \
                 ORDER BY n LIMIT 1",
                last = SLOTS - 1
            ),
            &[&instances::stale_ms()],
        )
        .await
        .map_err(refused)?;
    let Some(free) = free else {
        return Err(format!(
            "all {SLOTS} instance slots of the database are held by live server processes: \
             at most {SLOTS} may share one store"
        ));
    };
    let slot: i64 = free.get(0);
    transaction
        .execute(
            &format!(
                "INSERT INTO instances (id, slot, host, pid, pid_started, started_ms, \
                 heartbeat_ms) VALUES ($1, $2, $3, $4, $5, {NOW_MS}, {NOW_MS})"
            ),
            &[
                &instance,
                &i32::try_from(slot).unwrap_or(0),
                &host,
                &i64::from(pid),
                &pid_started,
            ],
        )
        .await
        .map_err(refused)?;
    transaction.commit().await.map_err(refused)?;
    Ok(slot)
}

/// The advisory lock the registrations take turns under (apart from the migrations' and the
/// claims').
const SLOT_LOCK: i64 = 0x736d_6f6c_736c_6f74;

/// This process's registration and its read connection, once ready.
struct Opened {
    instance: String,
    slot: i64,
    /// The key every process seals MCP requestStates with (see [`Store::sealing_key`]).
    sealing_key: Vec<u8>,
    me: Me,
    reader: Mutex<Option<Arc<Connection>>>,
    /// A connection of its own for the claims one user's creates take one at a time: each is a
    /// transaction under an advisory lock, which the shared read connection cannot hold.
    claimer: tokio::sync::Mutex<Option<Connection>>,
}

impl PgStore {
    /// The store at `url` (a `postgres://` URL or key=value connection string); nothing is
    /// reached until [`PgStore::ready`].
    pub fn new(url: &Secret, retention: RunRetention, events: Events) -> PgStore {
        let config = url
            .expose()
            .parse::<tokio_postgres::Config>()
            .map_err(|e| format!("storeUrl is not a PostgreSQL connection URL: {}", said(&e)))
            .and_then(|config| {
                // No TLS is built in: a password sent in clear to another host is worse than
                // a refusal. A Unix socket or loopback needs none; across hosts, a tunnel.
                if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
                    Err(
                        "storeUrl asks for TLS (sslmode=require), which this build does not \
                         speak: reach the database over a Unix socket or loopback, or through \
                         a TLS tunnel on this host"
                            .to_owned(),
                    )
                } else {
                    Ok(config)
                }
            });
        let shown = config
            .as_ref()
            .map_or_else(|_| "storeUrl".to_owned(), shown);
        let (queue, receiver) = mpsc::channel(QUEUE);
        PgStore {
            config,
            shown,
            retention,
            events,
            queue,
            receiver: Mutex::new(Some(receiver)),
            opened: OnceCell::new(),
            dropped: AtomicU64::new(0),
            last_id: AtomicI64::new(0),
            announced: AtomicBool::new(false),
            me: Me {
                instance: format!("i-{:032x}", rand::random::<u128>()),
                host: nix::unistd::gethostname()
                    .ok()
                    .and_then(|h| h.into_string().ok())
                    .unwrap_or_default(),
            },
            documents: std::sync::OnceLock::new(),
            prepared: Arc::new(AtomicU64::new(0)),
            unwritten: Arc::new(AtomicU64::new(0)),
        }
    }

    fn documents(&self) -> Arc<documents::Documents> {
        self.documents
            .get_or_init(|| {
                Arc::new(documents::Documents::new(
                    self.config.clone(),
                    self.prepared.clone(),
                ))
            })
            .clone()
    }

    /// How many statements this store's connections have prepared so far: each statement once
    /// per connection, however often it is run.
    pub fn statements_prepared(&self) -> u64 {
        self.prepared.load(Ordering::Relaxed)
    }

    /// The instance id this process writes as, once ready.
    pub fn instance(&self) -> Option<String> {
        self.opened().map(|o| o.instance.clone())
    }

    fn opened(&self) -> Option<&Arc<Opened>> {
        self.opened.get().and_then(|o| o.as_ref().ok())
    }

    fn unusable(&self, reason: impl Into<String>) -> StoreUnavailable {
        StoreUnavailable::Broken {
            path: self.shown.clone(),
            reason: reason.into(),
        }
    }

    /// Why the store cannot be used now, if it cannot.
    fn broken(&self) -> Option<StoreUnavailable> {
        match self.opened.get() {
            Some(Ok(_)) => None,
            Some(Err(reason)) => Some(self.unusable(reason.clone())),
            None => Some(self.unusable("it is not connected yet")),
        }
    }

    /// Connects, brings the schema up to date, registers this process and starts its writer
    /// and heartbeat; once per process, the answer kept.
    async fn open(&self) -> Result<Arc<Opened>, String> {
        let config = self.config.clone()?;
        let mut client = connect(&config).await?;
        schema::migrate(&mut client)
            .await
            .map_err(|e| format!("{e}"))?;
        let instance = self.me.instance.clone();
        let host = self.me.host.clone();
        let pid = std::process::id();
        let pid_started =
            crate::process::ephemeral::process_started(pid).and_then(|t| i64::try_from(t).ok());
        let slot = register(&mut client, &instance, &host, pid, pid_started).await?;
        // The first process to start writes the key; every later one reads that one.
        let offered: Vec<u8> = rand::random::<[u8; 32]>().to_vec();
        client
            .execute(
                "INSERT INTO server_secrets (name, value) VALUES ('request_state_key', $1) \
                 ON CONFLICT (name) DO NOTHING",
                &[&offered],
            )
            .await
            .map_err(|e| format!("could not agree on the requestState key: {}", said(&e)))?;
        let sealing_key: Vec<u8> = client
            .query_one(
                "SELECT value FROM server_secrets WHERE name = 'request_state_key'",
                &[],
            )
            .await
            .map_err(|e| format!("could not read the requestState key: {}", said(&e)))?
            .get(0);
        let receiver = self
            .receiver
            .lock()
            .map_err(|_| "its queue was poisoned".to_owned())?
            .take()
            .ok_or_else(|| "its writer was started before".to_owned())?;
        let opened = Arc::new(Opened {
            instance: instance.clone(),
            slot,
            sealing_key,
            me: self.me.clone(),
            reader: Mutex::new(None),
            claimer: tokio::sync::Mutex::new(None),
        });
        let writer = WriterTask {
            config: config.clone(),
            client: Some(Connection::new(client, &self.prepared)),
            instance: instance.clone(),
            opened: opened.clone(),
            prepared: self.prepared.clone(),
            unwritten: self.unwritten.clone(),
            retention: self.retention,
            shown: self.shown.clone(),
        };
        tokio::spawn(writer.run(receiver));
        tokio::spawn(heartbeat(config, instance));
        tracing::info!(database = %self.shown, slot, "the store is the shared database");
        Ok(opened)
    }

    /// Queues `write`, or says why it was not.
    fn queue(&self, write: Write) -> StoreResult<()> {
        if let Some(Err(reason)) = self.opened.get() {
            return Err(self.unusable(reason.clone()));
        }
        let record = write.is_record();
        if record {
            self.unwritten.fetch_add(1, Ordering::AcqRel);
        }
        let sent = self.queue.try_send(write);
        if record && sent.is_err() {
            self.unwritten.fetch_sub(1, Ordering::AcqRel);
        }
        match sent {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if dropped.is_power_of_two() {
                    tracing::warn!(
                        dropped,
                        database = %self.shown,
                        "the store's writer is behind (a slow or unreachable database?); records dropped so far"
                    );
                }
                Err(StoreUnavailable::QueueFull { queue: QUEUE })
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(self.unusable("its writer has ended")),
        }
    }

    fn record(&self, write: Write) {
        let _ = self.queue(write);
    }

    /// Queues an ask and waits for its answer, written.
    async fn ask<T>(&self, make: impl FnOnce(writes::Answer<T>) -> Write) -> StoreResult<T> {
        if let Some(broken) = self.broken() {
            return Err(broken);
        }
        let (answer, answered) = oneshot::channel();
        self.queue(make(answer))?;
        match answered.await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(reason)) => Err(self.unusable(reason)),
            Err(_) => Err(self.unusable("its writer has ended")),
        }
    }

    async fn flush_queued(&self) {
        if self.opened().is_none() || self.unwritten.load(Ordering::Acquire) == 0 {
            return;
        }
        let (done, flushed) = oneshot::channel();
        if self.queue(Write::Flush(done)).is_ok() {
            let _ = tokio::time::timeout(FLUSH_WAIT, flushed).await;
        }
    }

    /// The read connection, connecting (again) when it has none or lost it.
    async fn reader(&self) -> StoreResult<Arc<Connection>> {
        let opened = match self.opened.get() {
            Some(Ok(opened)) => opened,
            _ => return Err(self.broken().unwrap_or_else(|| self.unusable("unknown"))),
        };
        let kept = opened.reader.lock().ok().and_then(|r| r.clone());
        if let Some(client) = kept.filter(|c| !c.is_closed()) {
            return Ok(client);
        }
        let config = self.config.clone().map_err(|e| self.unusable(e))?;
        let client = Arc::new(
            connection(&config, &self.prepared)
                .await
                .map_err(|e| self.unusable(e))?,
        );
        if let Ok(mut reader) = opened.reader.lock() {
            *reader = Some(client.clone());
        }
        Ok(client)
    }

    /// Runs `claim` on the claims' connection (made again when it was lost or abandoned),
    /// after the writes queued so far are written; `claim` makes its own transaction.
    async fn on_claimer<T>(
        &self,
        claim: impl AsyncFnOnce(&Connection) -> Result<T, tokio_postgres::Error>,
    ) -> StoreResult<T> {
        self.flush_queued().await;
        let opened = match self.opened.get() {
            Some(Ok(opened)) => opened.clone(),
            _ => return Err(self.broken().unwrap_or_else(|| self.unusable("unknown"))),
        };
        let mut kept = opened.claimer.lock().await;
        if kept.as_ref().is_none_or(Connection::is_closed) {
            let config = self.config.clone().map_err(|e| self.unusable(e))?;
            *kept = Some(
                connection(&config, &self.prepared)
                    .await
                    .map_err(|e| self.unusable(e))?,
            );
        }
        let Some(connection) = kept.as_ref() else {
            return Err(self.unusable("no connection for claims"));
        };
        claim(connection).await.map_err(|e| self.unusable(said(&e)))
    }

    /// Runs `read` on the read connection after the writes queued so far are written.
    async fn read<T>(
        &self,
        read: impl AsyncFnOnce(&Prepared<'_, Client>) -> Result<T, tokio_postgres::Error>,
    ) -> StoreResult<T> {
        self.flush_queued().await;
        let client = self.reader().await?;
        read(&client.prepared())
            .await
            .map_err(|e| self.unusable(said(&e)))
    }

    /// Tells the clients, once, that a run goes unrecorded and why.
    fn announce(&self, why: &StoreUnavailable) {
        if !self.announced.swap(true, Ordering::Relaxed) {
            self.events.publish(
                ServerEvent::warning(
                    "ledgerUnavailable",
                    format!(
                        "the run ledger cannot be used, so runs are not recorded (the tools \
                         work as before): {why}"
                    ),
                )
                .with("path", self.shown.clone())
                .with("reason", why.to_string()),
            );
        }
    }
}

impl Backend for PgStore {}

impl Lifecycle for PgStore {
    fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
    fn flush(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(self.flush_queued())
    }
    fn is_shared(&self) -> bool {
        true
    }
    fn sealing_key(&self) -> StoreResult<Vec<u8>> {
        match self.opened.get() {
            Some(Ok(opened)) => Ok(opened.sealing_key.clone()),
            _ => Err(self
                .broken()
                .unwrap_or_else(|| self.unusable("it is not connected yet"))),
        }
    }
    fn sharing(&self) -> Sharing {
        let documents = self.documents();
        Sharing::Hosts {
            machine_record: Arc::new(machines::MachineBook::new(
                documents.clone(),
                self.me.clone(),
            )),
            machine_setups: Arc::new(documents::DocumentBook {
                documents,
                name: "machine-setups",
            }),
        }
    }
    fn ready(&self) -> futures::future::BoxFuture<'_, StoreResult<()>> {
        Box::pin(async {
            match self.opened.get_or_init(|| self.open()).await {
                Ok(_) => Ok(()),
                Err(reason) => Err(self.unusable(reason.clone())),
            }
        })
    }
}

/// The writer: one connection, the queue read in order.
struct WriterTask {
    config: tokio_postgres::Config,
    client: Option<Connection>,
    instance: String,
    opened: Arc<Opened>,
    prepared: Arc<AtomicU64>,
    unwritten: Arc<AtomicU64>,
    retention: RunRetention,
    shown: String,
}

impl WriterTask {
    async fn run(mut self, mut receiver: mpsc::Receiver<Write>) {
        let mut failures: u64 = 0;
        let mut since_prune: u64 = PRUNE_EVERY;
        while let Some(first) = receiver.recv().await {
            let mut records = Vec::new();
            let mut next = Some(first);
            // The records queued now go in one transaction; an ask or a flush ends the batch
            // and is done after it, so it sees everything queued before it.
            while let Some(write) = next.take() {
                if !write.is_record() {
                    next = Some(write);
                    break;
                }
                records.push(write);
                if records.len() >= BATCH {
                    break;
                }
                next = receiver.try_recv().ok();
            }
            if !records.is_empty() {
                since_prune += records.len() as u64;
                let written = self.write_records(&records).await;
                self.unwritten
                    .fetch_sub(records.len() as u64, Ordering::AcqRel);
                if let Err(e) = written {
                    failures += 1;
                    if failures.is_power_of_two() {
                        tracing::warn!(error = %e, failures, database = %self.shown, "could not write to the store; records lost");
                    }
                }
            }
            if let Some(ask) = next {
                self.answer(ask).await;
            }
            if since_prune >= PRUNE_EVERY {
                since_prune = 0;
                if let Err(e) = self.prune().await {
                    tracing::warn!(error = %e, "could not prune the store");
                }
            }
        }
    }

    async fn client(&mut self) -> Result<&mut Connection, String> {
        if self.client.as_ref().is_none_or(Connection::is_closed) {
            self.client = Some(connection(&self.config, &self.prepared).await?);
        }
        self.client
            .as_mut()
            .ok_or_else(|| "no connection".to_owned())
    }

    fn who(&self) -> Writer<'_> {
        Writer {
            instance: &self.instance,
            pid: i64::from(std::process::id()),
        }
    }

    async fn write_records(&mut self, records: &[Write]) -> Result<(), String> {
        let instance = self.instance.clone();
        let Connection {
            client, statements, ..
        } = self.client().await?;
        let mut transaction = client.transaction().await.map_err(|e| said(&e))?;
        let who = Writer {
            instance: &instance,
            pid: i64::from(std::process::id()),
        };
        let mut first_error = None;
        for record in records {
            // A record that fails is lost, the others of its batch kept: a savepoint each.
            let savepoint = transaction.savepoint("record").await.map_err(|e| said(&e));
            let Ok(savepoint) = savepoint else {
                return Err("could not open a savepoint".to_owned());
            };
            match who.record(&statements.on(&savepoint), record).await {
                Ok(()) => savepoint.commit().await.map_err(|e| said(&e))?,
                Err(e) => {
                    first_error.get_or_insert(said(&e));
                    savepoint.rollback().await.map_err(|e| said(&e))?;
                }
            }
        }
        transaction.commit().await.map_err(|e| said(&e))?;
        first_error.map_or(Ok(()), Err)
    }

    async fn answer(&mut self, ask: Write) {
        match ask {
            Write::Flush(done) => {
                let _ = done.send(());
            }
            Write::ClaimKey(claim, answer) => {
                let answered = self
                    .asked(async |who, db| who.claim_key(db, &claim).await)
                    .await;
                let _ = answer.send(answered);
            }
            Write::DayMark(reading, answer) => {
                let answered = self
                    .asked(async |who, db| who.day_mark(db, &reading).await)
                    .await;
                let _ = answer.send(answered);
            }
            Write::TakeOver(served, answer) => {
                let opened = self.opened.clone();
                let dead = match self.client().await {
                    Ok(db) => dead_instances(&db.prepared(), &opened)
                        .await
                        .map_err(|e| said(&e)),
                    Err(e) => Err(e),
                };
                let answered = match dead {
                    Ok(dead) => {
                        self.asked(async |who, db| who.take_over(db, &served, &dead).await)
                            .await
                    }
                    Err(e) => Err(e),
                };
                let _ = answer.send(answered);
            }
            record => {
                let _ = self.write_records(std::slice::from_ref(&record)).await;
                self.unwritten.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    async fn asked<T>(
        &mut self,
        ask: impl AsyncFnOnce(&Writer<'_>, &Prepared<'_, Client>) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, String> {
        self.client().await?;
        let who = self.who();
        let Some(db) = self.client.as_ref() else {
            return Err("no connection".to_owned());
        };
        ask(&who, &db.prepared()).await.map_err(|e| said(&e))
    }

    /// Runs past the settings' bounds, and every other table past its own; runs a dead
    /// process left open (not a running job's) are marked interrupted; instances dead for a
    /// day go.
    async fn prune(&mut self) -> Result<(), String> {
        let retention = self.retention;
        let opened = self.opened.clone();
        let db = self.client().await?.prepared();
        let dead = dead_instances(&db, &opened).await.map_err(|e| said(&e))?;
        let day_ms: i64 = 86_400_000;
        let run_days = i64::try_from(retention.max_days).unwrap_or(i64::MAX / day_ms);
        let keep_runs = i64::try_from(retention.max_runs).unwrap_or(i64::MAX);
        let statements: [(
            String,
            Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>>,
        ); 10] = [
            (
                format!("DELETE FROM runs WHERE started_ms < {NOW_MS} - $1"),
                vec![Box::new(run_days.saturating_mul(day_ms))],
            ),
            (
                "DELETE FROM runs WHERE id <= \
                 (SELECT id FROM runs ORDER BY id DESC OFFSET $1 LIMIT 1)"
                    .to_owned(),
                vec![Box::new(keep_runs)],
            ),
            (
                format!(
                    "UPDATE runs SET outcome = 'interrupted', ended_ms = {NOW_MS} \
                     WHERE outcome = 'running' AND (owner = ANY($1) OR NOT EXISTS \
                     (SELECT 1 FROM instances WHERE instances.id = runs.owner)) AND id NOT IN \
                     (SELECT run_id FROM jobs WHERE state = 'running' AND run_id IS NOT NULL)"
                ),
                vec![Box::new(dead.clone())],
            ),
            (
                format!("DELETE FROM jobs WHERE started_ms < {NOW_MS} - $1"),
                vec![Box::new(30 * day_ms)],
            ),
            (
                format!("DELETE FROM egress_grants WHERE granted_ms < {NOW_MS} - $1"),
                vec![Box::new(365 * day_ms)],
            ),
            (
                "DELETE FROM egress_grants WHERE id <= \
                 (SELECT id FROM egress_grants ORDER BY id DESC OFFSET $1 LIMIT 1)"
                    .to_owned(),
                vec![Box::new(100_000_i64)],
            ),
            (
                format!("DELETE FROM tasks WHERE created_ms + ttl_ms < {NOW_MS} - $1"),
                vec![Box::new(0_i64)],
            ),
            (
                format!("DELETE FROM idempotency_keys WHERE started_ms < {NOW_MS} - $1"),
                vec![Box::new(day_ms)],
            ),
            (
                "UPDATE idempotency_keys SET answer = NULL, answer_dropped = true WHERE key IN \
                 (SELECT key FROM (SELECT key, SUM(octet_length(answer)) \
                    OVER (ORDER BY started_ms DESC, key) AS newer_bytes \
                  FROM idempotency_keys WHERE answer IS NOT NULL) newer WHERE newer_bytes > $1)"
                    .to_owned(),
                vec![Box::new(crate::store::KEY_ANSWERS_MAX_BYTES)],
            ),
            (
                format!("DELETE FROM instances WHERE heartbeat_ms < {NOW_MS} - $1"),
                vec![Box::new(day_ms)],
            ),
        ];
        for (statement, values) in &statements {
            let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = values
                .iter()
                .map(|v| v.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync))
                .collect();
            db.execute(statement.as_str(), &params)
                .await
                .map_err(|e| said(&e))?;
        }
        db.execute(
            "DELETE FROM idempotency_keys WHERE key NOT IN \
             (SELECT key FROM idempotency_keys ORDER BY started_ms DESC, key LIMIT $1)",
            &[&100_000_i64],
        )
        .await
        .map_err(|e| said(&e))?;
        Ok(())
    }
}

/// The instances other than this one that are dead: not heard from for [`STALE`], or on this
/// host with their process gone.
async fn dead_instances(
    db: &Prepared<'_, Client>,
    me: &Opened,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let rows = db
        .query(
            &instances::instances_query("WHERE id <> $2"),
            &[&instances::stale_ms(), &me.instance],
        )
        .await?;
    Ok(rows
        .iter()
        .filter(|row| instance_dead(row, me))
        .map(|row| row.get(0))
        .collect())
}

fn instance_dead(row: &tokio_postgres::Row, me: &Opened) -> bool {
    InstanceRow::of(row).dead(&me.me)
}
