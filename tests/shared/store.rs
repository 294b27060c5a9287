//! The PostgreSQL store: what one process writes another reads, the schema's migrations and
//! its refusal, and each claim two processes race for won once. A "process" here is a store
//! of its own (an instance of its own in the database), as a second server process would be;
//! a dead one is an instance row whose process has ended on this host, or whose heartbeat is
//! older than the store's bound on another.

use super::database::TestDatabase;
use crate::common::store_contract::{self, job, key_claim, new_run, now_ms};
use smol_mcp::fleet::FleetKind;
use smol_mcp::process::config::Secret;
use smol_mcp::process::events::Events;
use smol_mcp::store::postgres::PgStore;
use smol_mcp::store::{
    KeyClaim, KeyRecord, Lifecycle, RunEnd, RunOutcome, RunRetention, ServedEngine, Sharing, Store,
    StoreUnavailable, TaskRecord,
};
use std::sync::Arc;

fn retention() -> RunRetention {
    RunRetention {
        max_runs: 2000,
        max_days: 30,
    }
}

async fn ready_store(db: &TestDatabase) -> Arc<PgStore> {
    let store = Arc::new(PgStore::new(
        &Secret::new(db.url.clone()),
        retention(),
        Events::default(),
    ));
    store.ready().await.expect("the store opens");
    store
}

/// An instance row for a process that is not running: on this host with a pid that has
/// ended, or on another host not heard from for `silent_secs`.
async fn dead_instance(db: &TestDatabase, id: &str, host: &str, silent_secs: i64) {
    let mut ended = std::process::Command::new("true").spawn().unwrap();
    let pid = i64::from(ended.id());
    ended.wait().unwrap();
    db.client()
        .await
        .execute(
            "INSERT INTO instances (id, slot, host, pid, pid_started, started_ms, heartbeat_ms) \
             VALUES ($1, 63, $2, $3, NULL, 0, \
             (extract(epoch from clock_timestamp()) * 1000)::bigint - $4::bigint * 1000)",
            &[&id, &host, &pid, &silent_secs],
        )
        .await
        .unwrap();
}

async fn give_jobs_to(db: &TestDatabase, owner: &str) {
    db.client()
        .await
        .execute("UPDATE jobs SET owner = $1", &[&owner])
        .await
        .unwrap();
}

/// The machine record of `store`'s process.
fn record_of(store: &PgStore) -> smol_mcp::process::ephemeral::Record {
    match store.sharing() {
        Sharing::Hosts { machine_record, .. } => {
            smol_mcp::process::ephemeral::Record::in_book(machine_record)
        }
        Sharing::OneHost => panic!("a database is shared by hosts"),
    }
}

/// Another connection holding the machine record's table locked against every change, until
/// it sends ROLLBACK.
async fn record_table_locked(db: &TestDatabase) -> tokio_postgres::Client {
    let other = db.client().await;
    other
        .batch_execute("BEGIN; LOCK TABLE ephemeral_machines IN EXCLUSIVE MODE")
        .await
        .unwrap();
    other
}

/// A database of its own; each call of the closure opens one more process's store on it.
async fn database_backing() -> crate::common::store_contract::Backing {
    let db = Arc::new(TestDatabase::new().await);
    Box::new(move || {
        let db = db.clone();
        Box::pin(async move {
            let store: Arc<dyn Store> = ready_store(&db).await;
            store
        })
    })
}

crate::store_contract_tests!(database_backing);

/// The machine record in a database of its own; each call opens one more process's store.
async fn record_database_backing() -> crate::common::record_contract::RecordBacking {
    let db = Arc::new(TestDatabase::new().await);
    Box::new(move || {
        let db = db.clone();
        Box::pin(async move { record_of(&*ready_store(&db).await) })
    })
}

crate::record_contract_tests!(record_database_backing);

/// What the contract does not say, since only a database has instances: each process writes
/// as an instance of its own, and a task's and a key's holder is that instance; only a key's
/// holder answers or releases it (on one host's file, a pid: the test's "processes" share it).
#[tokio::test]
async fn records_name_the_instance_that_wrote_them() {
    let db = TestDatabase::new().await;
    let (a, b) = (ready_store(&db).await, ready_store(&db).await);
    assert_ne!(a.instance(), b.instance());
    a.tasks().created(TaskRecord {
        id: "t1".into(),
        pid: 7,
        holder: None,
        client: "session-1".into(),
        detail: None,
        tool: "run-command".into(),
        created_ms: now_ms(),
        ttl_ms: 60_000,
        outcome: None,
    });
    a.flush().await;
    let task = b.tasks().get("t1").await.unwrap().unwrap();
    assert_eq!((task.pid, task.client.as_str()), (7, "session-1"));
    assert_eq!(task.holder, a.instance(), "run by a");

    assert_eq!(
        a.keys().claim(key_claim("k1")).await.unwrap(),
        KeyClaim::Claimed
    );
    match b.keys().claim(key_claim("k1")).await.unwrap() {
        KeyClaim::Taken(held) => assert_eq!(held.holder, a.instance()),
        claimed => panic!("b claimed a key a holds: {claimed:?}"),
    }
    assert_eq!(
        b.keys().claim(key_claim("k2")).await.unwrap(),
        KeyClaim::Claimed
    );
    a.keys().released("k2");
    a.keys().answered("k2", "\"a's\"".into());
    a.flush().await;
    let held = b.keys().get("k2").await.unwrap().unwrap();
    assert_eq!(held.holder, b.instance());
    assert_eq!(held.answer, None, "only its holder answers a key");
}

/// Each process takes the lowest run-id slot no live process holds (a dead one's is free
/// again), so that no two live processes make the same id; and a run's end is written only by
/// the process that owns the run, never onto another's row of the same id.
#[tokio::test]
async fn live_processes_hold_distinct_slots_and_only_a_runs_owner_ends_it() {
    let db = TestDatabase::new().await;
    let first = ready_store(&db).await;
    // Slot 2 was held by a process not heard from for a minute (dead), slot 1 is held by one
    // alive elsewhere.
    let client = db.client().await;
    for (id, slot, silent_secs) in [("i-gone", 2, 60_i64), ("i-alive", 1, 0)] {
        client
            .execute(
                "INSERT INTO instances (id, slot, host, pid, pid_started, started_ms, \
                 heartbeat_ms) VALUES ($1, $2, 'elsewhere', 1, NULL, 0, \
                 (extract(epoch from clock_timestamp()) * 1000)::bigint - $3::bigint * 1000)",
                &[&id, &slot, &silent_secs],
            )
            .await
            .unwrap();
    }
    let mut stores = futures::future::join_all((0..4).map(|_| ready_store(&db))).await;
    stores.insert(0, first);
    let mut slots: Vec<i32> = Vec::new();
    for store in &stores {
        let row = client
            .query_one(
                "SELECT slot FROM instances WHERE id = $1",
                &[&store.instance()],
            )
            .await
            .unwrap();
        slots.push(row.get(0));
    }
    slots.sort_unstable();
    assert_eq!(
        slots,
        [0, 2, 3, 4, 5],
        "the lowest slots no live process holds, each once (a dead one's again)"
    );

    let run = new_run();
    let (a, b) = (&stores[0], &stores[1]);
    let id = a.runs().begin(run).unwrap();
    a.flush().await;
    let end = |outcome| RunEnd {
        id,
        ended_ms: now_ms(),
        outcome,
        exit_code: Some(9),
        timed_out: Some(false),
        error: None,
        stdout: None,
        stderr: None,
    };
    b.runs().end(end(RunOutcome::Exited));
    b.runs().cost(id, "{\"cpuMs\":99}".into());
    b.flush().await;
    let detail = a.runs().get(id, "").await.unwrap().unwrap();
    assert_eq!(
        detail.summary.outcome, "running",
        "another process ended a's run"
    );
    assert_eq!(detail.usage, None);
    a.runs().end(end(RunOutcome::Exited));
    a.flush().await;
    let detail = b.runs().get(id, "").await.unwrap().unwrap();
    assert_eq!(detail.summary.outcome, "exited");
}

#[tokio::test]
async fn a_dead_processs_jobs_are_taken_over_once_and_a_live_ones_never() {
    let db = TestDatabase::new().await;
    let writer = ready_store(&db).await;
    for i in 0..30 {
        writer
            .jobs()
            .started(job(&format!("dead-here-{i}"), "serve-a"));
    }
    writer.jobs().started(job("other-engine", "serve-b"));
    writer.flush().await;
    // The jobs' owner ended on this host (its pid is gone): dead at once.
    dead_instance(&db, "i-dead-here", &hostname(), 0).await;
    give_jobs_to(&db, "i-dead-here").await;
    // One more of a process elsewhere not heard from for a minute, and one heard from now.
    dead_instance(&db, "i-silent", "elsewhere", 60).await;
    dead_instance(&db, "i-live", "elsewhere", 0).await;
    let client = db.client().await;
    for (id, owner) in [("silent-1", "i-silent"), ("live-1", "i-live")] {
        writer.jobs().started(job(id, "serve-a"));
        writer.flush().await;
        client
            .execute("UPDATE jobs SET owner = $2 WHERE id = $1", &[&id, &owner])
            .await
            .unwrap();
    }

    let takers = [
        ready_store(&db).await,
        ready_store(&db).await,
        ready_store(&db).await,
    ];
    let served = vec![ServedEngine {
        fleet: FleetKind::Local,
        engine: "serve-a".into(),
    }];
    let taken =
        futures::future::join_all(takers.iter().map(|t| t.jobs().take_over(served.clone()))).await;
    let mut all: Vec<String> = taken.iter().flatten().map(|j| j.id.clone()).collect();
    all.sort();
    let mut expected: Vec<String> = (0..30).map(|i| format!("dead-here-{i}")).collect();
    expected.push("silent-1".into());
    expected.sort();
    assert_eq!(
        all, expected,
        "each dead job once, none of another engine or a live owner"
    );
    // Whoever took a job owns it now: no one takes it again.
    let again =
        futures::future::join_all(takers.iter().map(|t| t.jobs().take_over(served.clone()))).await;
    assert!(again.iter().all(Vec::is_empty), "{again:?}");
    // A job let go is anyone's again.
    let holder = takers
        .iter()
        .zip(&taken)
        .find(|(_, t)| !t.is_empty())
        .unwrap();
    holder.0.jobs().let_go(&holder.1[0].id);
    holder.0.flush().await;
    let other = takers
        .iter()
        .find(|t| t.instance() != holder.0.instance())
        .unwrap();
    let retaken = other.jobs().take_over(served).await;
    assert_eq!(retaken.len(), 1);
    assert_eq!(retaken[0].id, holder.1[0].id);
}

#[tokio::test]
async fn a_key_held_by_a_dead_process_is_known_dead() {
    let db = TestDatabase::new().await;
    let store = ready_store(&db).await;
    dead_instance(&db, "i-gone", &hostname(), 0).await;
    dead_instance(&db, "i-far-live", "elsewhere", 0).await;
    dead_instance(&db, "i-far-silent", "elsewhere", 60).await;
    let held_by = |holder: &str| KeyRecord {
        holder: Some(holder.into()),
        ..key_claim("k")
    };
    assert!(!store.keys().holder_alive(&held_by("i-gone")).await);
    assert!(store.keys().holder_alive(&held_by("i-far-live")).await);
    assert!(!store.keys().holder_alive(&held_by("i-far-silent")).await);
    assert!(!store.keys().holder_alive(&held_by("i-never-was")).await);
    let me = store.instance().unwrap();
    assert!(store.keys().holder_alive(&held_by(&me)).await);
}

#[tokio::test]
async fn processes_starting_together_migrate_once_and_a_newer_schema_is_refused() {
    let db = TestDatabase::new().await;
    let stores: Vec<PgStore> = (0..4)
        .map(|_| PgStore::new(&Secret::new(db.url.clone()), retention(), Events::default()))
        .collect();
    let opened = futures::future::join_all(stores.iter().map(|s| s.ready())).await;
    assert!(opened.iter().all(Result::is_ok), "{opened:?}");
    let client = db.client().await;
    let versions: Vec<i32> = client
        .query("SELECT version FROM smol_mcp_schema ORDER BY version", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let all: Vec<i32> =
        (1..=i32::try_from(smol_mcp::store::postgres::SCHEMA_VERSION).unwrap()).collect();
    assert_eq!(versions, all, "each migration once");

    client
        .execute(
            "INSERT INTO smol_mcp_schema (version, applied_ms) VALUES (99, 0)",
            &[],
        )
        .await
        .unwrap();
    let newer = PgStore::new(&Secret::new(db.url.clone()), retention(), Events::default());
    let refused = newer.ready().await.unwrap_err();
    let StoreUnavailable::Broken { reason, .. } = &refused else {
        panic!("{refused:?}");
    };
    assert!(
        reason.contains(&format!(
            "version 99, newer than this server knows (up to {})",
            smol_mcp::store::postgres::SCHEMA_VERSION
        )),
        "{reason}"
    );
    // A store that could not open refuses what a limit asks, rather than letting it through.
    assert!(newer.keys().claim(key_claim("k")).await.is_err());
}

/// A database whose schema stops before migration 8, its machine record the one document
/// every create and delete rewrote (`text`, when given).
async fn before_the_record_had_rows(db: &TestDatabase, text: Option<&str>) {
    let client = db.client().await;
    client
        .batch_execute(
            "DELETE FROM smol_mcp_schema WHERE version = 8; DROP TABLE ephemeral_machines; \
             DELETE FROM documents WHERE name = 'ephemeral-machines'",
        )
        .await
        .unwrap();
    if let Some(text) = text {
        client
            .execute(
                "INSERT INTO documents (name, body) VALUES ('ephemeral-machines', $1)",
                &[&text],
            )
            .await
            .unwrap();
    }
}

/// Migration 8 moves the machine record's document into rows, in the order it was written,
/// and drops the document; a document that is no machine record stops the migration (the
/// server refuses to start) with the way to reset it, as every change of it was refused before.
#[tokio::test]
async fn an_older_machine_record_moves_into_rows_and_a_broken_one_is_refused_with_its_reset() {
    let db = TestDatabase::new().await;
    ready_store(&db).await;
    let mut cloud = machine("mcp-second", Some("i-elsewhere"));
    cloud.fleet = FleetKind::Cloud;
    cloud.id = "mach-9".into();
    let written = vec![
        machine("mcp-first", None),
        cloud,
        machine("mcp-third", None),
    ];
    before_the_record_had_rows(&db, Some(&serde_json::to_string(&written).unwrap())).await;

    let store = ready_store(&db).await;
    let record = record_of(&store);
    assert_eq!(record.entries().await.unwrap(), written);
    assert_eq!(record.entries_named("mach-9").await.unwrap(), written[1..2]);
    let client = db.client().await;
    let documents = client
        .query(
            "SELECT 1 FROM documents WHERE name = 'ephemeral-machines'",
            &[],
        )
        .await
        .unwrap();
    assert!(documents.is_empty(), "the document is gone once moved");

    before_the_record_had_rows(&db, Some("{\"machines\": [")).await;
    let refused = PgStore::new(&Secret::new(db.url.clone()), retention(), Events::default())
        .ready()
        .await
        .unwrap_err();
    let StoreUnavailable::Broken { reason, .. } = &refused else {
        panic!("{refused:?}");
    };
    assert!(
        reason.contains("bringing its schema up to version 8 failed")
            && reason.contains("not a valid machine record")
            && reason.contains("DELETE FROM documents WHERE name = 'ephemeral-machines'"),
        "{reason}"
    );
    // Reset as the refusal says, the next start migrates.
    client
        .execute(
            "DELETE FROM documents WHERE name = 'ephemeral-machines'",
            &[],
        )
        .await
        .unwrap();
    let store = ready_store(&db).await;
    assert!(record_of(&store).entries().await.unwrap().is_empty());
}

#[tokio::test]
async fn an_unreachable_or_wrong_database_is_refused_without_its_password() {
    let wrong_password =
        super::database::server_url().replacen("smol:", "smol:not-the-password-7f3a", 1);
    let cases = [
        (
            "postgres://smol:hunter2-secret@127.0.0.1:1/db".to_owned(),
            "could not connect",
        ),
        (wrong_password, "could not connect"),
        (
            "postgres://smol:x@/db?sslmode=require&host=/tmp".to_owned(),
            "sslmode=require",
        ),
        (
            "not a url at all =".to_owned(),
            "storeUrl is not a PostgreSQL connection URL",
        ),
    ];
    for (url, expected) in cases {
        let store = PgStore::new(&Secret::new(url.clone()), retention(), Events::default());
        let refused = store.ready().await.unwrap_err().to_string();
        assert!(refused.contains(expected), "{url}: {refused}");
        for secret in ["hunter2-secret", "not-the-password-7f3a"] {
            assert!(
                !refused.contains(secret),
                "the password is shown: {refused}"
            );
        }
    }
}

fn hostname() -> String {
    nix::unistd::gethostname().unwrap().into_string().unwrap()
}

fn machine(name: &str, owner: Option<&str>) -> smol_mcp::process::ephemeral::Entry {
    smol_mcp::process::ephemeral::Entry {
        fleet: FleetKind::Local,
        name: name.into(),
        id: name.into(),
        owner_pid: 4_194_303,
        owner: owner.map(str::to_owned),
        session: "s".into(),
        parent: None,
        recorded_at: 0,
        lease: None,
        engine: Some("serve-a".into()),
        kept_until: None,
        base: None,
    }
}

#[tokio::test]
async fn the_machine_record_is_shared_and_a_dead_processs_machines_are_claimed_once() {
    use smol_mcp::process::ephemeral::Record;
    let db = TestDatabase::new().await;
    let stores = [
        ready_store(&db).await,
        ready_store(&db).await,
        ready_store(&db).await,
    ];
    let records: Vec<Record> = stores.iter().map(|s| record_of(s)).collect();
    dead_instance(&db, "i-dead-owner", &hostname(), 0).await;
    dead_instance(&db, "i-live-owner", "elsewhere", 0).await;
    for i in 0..20 {
        records[0]
            .add(machine(&format!("mcp-dead-{i}"), Some("i-dead-owner")))
            .await
            .unwrap();
    }
    records[0]
        .add(machine("mcp-live", Some("i-live-owner")))
        .await
        .unwrap();
    // Written by one, read by another.
    assert_eq!(records[2].entries().await.unwrap().len(), 21);
    assert_eq!(
        records[1]
            .orphaned(FleetKind::Local, "serve-a")
            .await
            .unwrap()
            .len(),
        20,
        "the live owner's machine is no orphan"
    );
    // Three processes sweeping at once: each orphan is claimed by one.
    let claims: Vec<_> = records
        .iter()
        .cloned()
        .map(|r| {
            tokio::spawn(async move { r.claim_orphans(FleetKind::Local, "serve-a").await.unwrap() })
        })
        .collect();
    let mut claimed = Vec::new();
    for (claim, store) in claims.into_iter().zip(&stores) {
        for entry in claim.await.unwrap() {
            assert_eq!(entry.owner, store.instance(), "claimed as the claimer's");
            claimed.push(entry.name);
        }
    }
    claimed.sort();
    let mut expected: Vec<String> = (0..20).map(|i| format!("mcp-dead-{i}")).collect();
    expected.sort();
    assert_eq!(claimed, expected, "each orphan claimed once");
    assert!(
        records[0]
            .orphaned(FleetKind::Local, "serve-a")
            .await
            .unwrap()
            .is_empty(),
        "claimed machines belong to live processes now"
    );
    // A machine removed by one is gone for all.
    records[1]
        .remove(FleetKind::Local, "mcp-live")
        .await
        .unwrap();
    assert_eq!(records[2].entries().await.unwrap().len(), 20);
}

/// A sweep and a sibling's watch that find nothing to claim or adopt lock nothing: with the
/// record's table locked by another transaction they answer at once, where a lock of the
/// whole record would wait for it (every process sweeps every few seconds, and a lock of the
/// whole record holds up every create and delete). One that finds an orphan claims it once
/// the lock is let go.
#[tokio::test]
async fn a_sweep_that_finds_nothing_locks_nothing() {
    use std::time::Duration;
    let db = TestDatabase::new().await;
    let store = ready_store(&db).await;
    let record = record_of(&store);
    let me = store.instance();
    record
        .add(machine("mcp-mine", me.as_deref()))
        .await
        .unwrap();
    let holder = record_table_locked(&db).await;
    let quick = Duration::from_secs(3);
    let claimed = tokio::time::timeout(quick, record.claim_orphans(FleetKind::Local, "serve-a"))
        .await
        .expect("a sweep with nothing to claim waited on the record's lock");
    assert!(claimed.unwrap().is_empty());
    let adopted = tokio::time::timeout(quick, record.adopt_leased(1, "s", 0))
        .await
        .expect("a watch with nothing to adopt waited on the record's lock");
    assert!(adopted.unwrap().is_empty());
    holder.batch_execute("ROLLBACK").await.unwrap();

    dead_instance(&db, "i-gone", "elsewhere", 0).await;
    record
        .add(machine("mcp-orphan", Some("i-gone")))
        .await
        .unwrap();
    let claimed = record
        .claim_orphans(FleetKind::Local, "serve-a")
        .await
        .unwrap();
    assert_eq!(
        claimed.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        ["mcp-orphan"]
    );
}

/// A stored job naming no fleet this server knows is refused: not read (get, others) and not
/// taken over, never read as a local job; one in a state this server does not know, or with a
/// negative timeout, is not read either. (SQLite: tests/offline/store_sqlite.rs.)
#[tokio::test]
async fn a_job_naming_no_known_fleet_is_refused_not_read_as_local() {
    let db = TestDatabase::new().await;
    let writer = ready_store(&db).await;
    store_contract::four_jobs(&*writer).await;
    let raw = db.client().await;
    raw.execute("UPDATE jobs SET fleet = 'mars' WHERE id = 'strange'", &[])
        .await
        .unwrap();
    raw.execute("UPDATE jobs SET state = 'dormant' WHERE id = 'odd'", &[])
        .await
        .unwrap();
    raw.execute(
        "UPDATE jobs SET timeout_secs = -1 WHERE id = 'negative'",
        &[],
    )
    .await
    .unwrap();
    let reader = ready_store(&db).await;
    store_contract::only_the_known_job_is_read(&*reader).await;
}

/// A shared document waited on in the database (its row locked by another process) holds no
/// thread of the runtime: on a runtime of one thread, a ticker beside the waiting change goes
/// on ticking, and the change is made once the lock is let go. (The documents were served by a
/// thread of their own that the caller's thread waited on, up to 15 s, doing nothing else.)
#[tokio::test(flavor = "current_thread")]
async fn a_document_waiting_on_the_database_holds_no_thread() {
    let db = TestDatabase::new().await;
    let store = ready_store(&db).await;
    let Sharing::Hosts { machine_setups, .. } = store.sharing() else {
        panic!("a database is shared by hosts");
    };
    machine_setups
        .update(&mut |_| Some("{\"before\":1}".to_owned()))
        .await
        .unwrap();
    let mut other = db.client().await;
    let holder = other.transaction().await.unwrap();
    holder
        .query_one(
            "SELECT body FROM documents WHERE name = 'machine-setups' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    let change = tokio::spawn(async move {
        machine_setups
            .update(&mut |_| Some("{\"after\":1}".to_owned()))
            .await
            .map(|()| machine_setups)
    });
    let ticking = std::time::Instant::now();
    for _ in 0..10 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let ticked = ticking.elapsed();
    assert!(
        ticked < std::time::Duration::from_secs(2),
        "ten ticks of 20 ms took {ticked:?}: the waiting change held the thread"
    );
    assert!(!change.is_finished(), "the change waits for the row's lock");
    holder.rollback().await.unwrap();
    let machine_setups = change.await.unwrap().unwrap();
    assert_eq!(
        machine_setups.read().await.unwrap().as_deref(),
        Some("{\"after\":1}")
    );
}

/// Each statement is prepared once on each of the store's connections, however often it runs
/// (tokio-postgres prepares a statement given as text anew on every use: a round trip more and
/// the database's parse and plan each time); and a kept statement whose result the schema
/// changed under it (a newer server's migration) is prepared again, the call answered all the
/// same.
#[tokio::test]
async fn a_statement_is_prepared_once_per_connection_and_again_when_its_result_changes() {
    use smol_mcp::store::{Hold, MachineClaim};
    let db = TestDatabase::new().await;
    let store = ready_store(&db).await;
    let Sharing::Hosts { machine_setups, .. } = store.sharing() else {
        panic!("a database is shared by hosts");
    };
    let record = record_of(&store);
    let me = store.instance();
    // What a create and a delete ask of the store, as the server asks it.
    let round = async |n: usize| {
        let name = format!("mcp-round-{n}");
        let hold = || Hold::new(FleetKind::Local, &name, "erin");
        let claim = store.owners().claim(hold(), 0).await.unwrap();
        assert!(matches!(claim, MachineClaim::Claimed { .. }), "{name} held");
        let id = store.runs().begin(new_run()).unwrap();
        record.add(machine(&name, me.as_deref())).await.unwrap();
        store.owners().made(hold()).await.unwrap();
        store.runs().end(RunEnd {
            id,
            ended_ms: now_ms(),
            outcome: RunOutcome::Exited,
            exit_code: Some(0),
            timed_out: Some(false),
            error: None,
            stdout: None,
            stderr: None,
        });
        assert_eq!(
            store
                .owners()
                .holder(FleetKind::Local, &name)
                .await
                .unwrap(),
            Some("erin".to_owned())
        );
        record.remove(FleetKind::Local, &name).await.unwrap();
        store.owners().release(hold()).await.unwrap();
        store.flush().await;
        assert!(
            !store
                .runs()
                .page(None, 5, "")
                .await
                .unwrap()
                .runs
                .is_empty()
        );
        machine_setups
            .update(&mut |_| Some(format!("{{\"round\":{n}}}")))
            .await
            .unwrap();
        assert!(machine_setups.read().await.unwrap().is_some());
    };
    round(0).await;
    let first = store.statements_prepared();
    assert!(first > 0, "the store prepared no statement at all");
    for n in 1..=10 {
        round(n).await;
    }
    assert_eq!(
        store.statements_prepared(),
        first,
        "ten more rounds of the same calls prepared their statements again"
    );

    db.client()
        .await
        .batch_execute("ALTER TABLE documents ALTER COLUMN body TYPE varchar")
        .await
        .unwrap();
    assert_eq!(
        machine_setups.read().await.unwrap().as_deref(),
        Some("{\"round\":10}"),
        "a read whose kept statement's result type changed was refused"
    );
    assert!(store.statements_prepared() > first);
}

/// A read with no record of its own waiting to be written does not wait for the writer: with
/// the writer held up (a key's claim waiting on another process's uncommitted claim of that
/// key), a read answers at once. Every read used to queue a turn of the writer's queue and
/// wait for it, behind whatever the writer was doing (up to 2 s). A read after a record still
/// sees it.
#[tokio::test]
async fn a_read_with_nothing_to_write_first_does_not_wait_for_the_writer() {
    use std::time::Duration;
    let db = TestDatabase::new().await;
    let store = ready_store(&db).await;
    let mut other = db.client().await;
    let holder = other.transaction().await.unwrap();
    holder
        .execute(
            "INSERT INTO idempotency_keys (key, owner, pid, tool, fingerprint, arguments, \
             started_ms) VALUES ('held', 'i-other', 1, 'create-machine', 'f', '{}', $1)",
            &[&now_ms()],
        )
        .await
        .unwrap();
    let claiming = {
        let store = store.clone();
        tokio::spawn(async move { store.keys().claim(key_claim("held")).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!claiming.is_finished(), "the claim waits for the other's");
    let read = tokio::time::timeout(Duration::from_secs(1), store.runs().page(None, 5, ""))
        .await
        .expect("a read with nothing to write first waited for the writer");
    assert!(read.unwrap().runs.is_empty());
    holder.rollback().await.unwrap();
    assert_eq!(claiming.await.unwrap(), Ok(KeyClaim::Claimed));

    let id = store.runs().begin(new_run()).unwrap();
    let run = store.runs().get(id, "").await.unwrap();
    assert_eq!(
        run.map(|r| r.summary.id),
        Some(id),
        "a read missed its own record"
    );
}

/// A change of the machine record given up while it waits for a lock (its caller's deadline)
/// leaves nothing locked: its transaction (BEGIN sent with its first statements) is rolled
/// back once the lock it waited for is let go, so another process's change of the whole record
/// goes on, and the process's own next change runs on a connection outside any transaction.
#[tokio::test]
async fn a_change_given_up_while_waiting_for_a_lock_leaves_nothing_locked() {
    use std::time::Duration;
    let db = TestDatabase::new().await;
    let first = ready_store(&db).await;
    let (mine, theirs) = (record_of(&first), record_of(&*ready_store(&db).await));
    let me = first.instance();
    // Its statements prepared: the next change sends its BEGIN with them at once.
    mine.add(machine("mcp-warm", me.as_deref())).await.unwrap();
    mine.remove(FleetKind::Local, "mcp-warm").await.unwrap();
    let holder = record_table_locked(&db).await;
    let given_up = tokio::time::timeout(
        Duration::from_millis(300),
        mine.add(machine("mcp-given-up", me.as_deref())),
    )
    .await;
    assert!(given_up.is_err(), "the change did not wait for the lock");
    holder.batch_execute("ROLLBACK").await.unwrap();

    let whole = tokio::time::timeout(
        Duration::from_secs(5),
        theirs.keep(FleetKind::Local, |_| true, |_| 1),
    )
    .await
    .expect("a change of the whole record waited on a change given up");
    assert!(whole.unwrap().is_empty(), "the given-up change was kept");
    mine.add(machine("mcp-after", me.as_deref())).await.unwrap();
    let names: Vec<String> = theirs
        .entries()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["mcp-after"]);
}
