//! The PostgreSQL store: what one process writes another reads, the schema's migrations and
//! its refusal, and each claim two processes race for won once. A "process" here is a store
//! of its own (an instance of its own in the database), as a second server process would be;
//! a dead one is an instance row whose process has ended on this host, or whose heartbeat is
//! older than the store's bound on another.

use super::database::TestDatabase;
use smol_mcp::fleet::FleetKind;
use smol_mcp::process::config::Secret;
use smol_mcp::process::events::Events;
use smol_mcp::store::postgres::PgStore;
use smol_mcp::store::{
    EgressGrant, JobRecord, KeyClaim, KeyRecord, MachineClaim, NewRun, RunCommand, RunEnd,
    RunOutcome, RunRetention, ServedEngine, SpendReading, Store, StoreUnavailable, StreamRecord,
    TaskRecord,
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

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn key_claim(key: &str) -> KeyRecord {
    KeyRecord {
        key: key.into(),
        pid: std::process::id(),
        holder: None,
        pid_started: None,
        tool: "create-machine".into(),
        fingerprint: "f".into(),
        arguments: "{}".into(),
        started_ms: now_ms(),
        answer: None,
        answer_dropped: false,
    }
}

fn job(id: &str, engine: &str) -> JobRecord {
    JobRecord {
        id: id.into(),
        user: String::new(),
        run_id: None,
        fleet: FleetKind::Local,
        engine: engine.into(),
        machine: "m".into(),
        command: "sleep 100".into(),
        base: "/tmp/j".into(),
        started_ms: now_ms(),
        timeout_secs: 600,
    }
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

#[tokio::test]
async fn what_one_process_writes_another_reads() {
    let db = TestDatabase::new().await;
    let (a, b) = (ready_store(&db).await, ready_store(&db).await);
    assert_ne!(a.instance(), b.instance());

    let started = now_ms();
    let run = NewRun {
        pid: std::process::id(),
        user: String::new(),
        tool: "run-command",
        fleet: FleetKind::Local,
        machine: "box".into(),
        command: RunCommand::Shell("echo hi".into()),
        workdir: Some("/w".into()),
        env_names: vec!["A".into()],
        started_ms: started,
    };
    let first = a.runs().begin(run.clone()).unwrap();
    let second = b
        .runs()
        .begin(NewRun {
            user: "alice".into(),
            ..run.clone()
        })
        .unwrap();
    let third = a.runs().begin(run).unwrap();
    assert!(
        third > first,
        "one process's ids grow: {first} then {third}"
    );
    assert_ne!(first % 64, second % 64, "two processes' ids never meet");
    assert!(
        third < (1 << 53),
        "ids stay exact in a JavaScript client: {third}"
    );
    a.runs().end(RunEnd {
        id: first,
        ended_ms: started + 5,
        outcome: RunOutcome::Exited,
        exit_code: Some(0),
        timed_out: Some(false),
        error: None,
        stdout: Some(StreamRecord {
            bytes: 3,
            dropped: 0,
            head: "hi\n".into(),
            tail: String::new(),
        }),
        stderr: None,
    });
    a.runs().cost(first, "{\"cpuMs\":1}".into());
    a.flush().await;
    b.flush().await;

    // Each user's runs are their own: alice's one, the operator's two.
    let theirs = b.runs().page(None, 10, "alice").await.unwrap();
    assert_eq!(
        theirs.runs.iter().map(|r| r.id).collect::<Vec<_>>(),
        [second]
    );
    assert!(b.runs().get(first, "alice").await.unwrap().is_none());
    let page = b.runs().page(None, 10, "").await.unwrap();
    assert_eq!(page.runs.len(), 2);
    assert!(!page.more);
    let ids: Vec<i64> = page.runs.iter().map(|r| r.id).collect();
    let mut newest_first = ids.clone();
    newest_first.sort_by(|x, y| y.cmp(x));
    assert_eq!(ids, newest_first);
    let older = b.runs().page(Some(ids[0]), 1, "").await.unwrap();
    assert_eq!(older.runs.len(), 1);
    assert!(!older.more);
    let detail = b.runs().get(first, "").await.unwrap().unwrap();
    assert_eq!(detail.summary.outcome, "exited");
    assert_eq!(detail.summary.exit_code, Some(0));
    assert_eq!(detail.stdout.unwrap().head, "hi\n");
    assert_eq!(detail.usage.as_deref(), Some("{\"cpuMs\":1}"));
    assert_eq!(detail.env_names, "[\"A\"]");
    assert!(b.runs().get(12345, "").await.unwrap().is_none());

    a.tasks().created(TaskRecord {
        id: "t1".into(),
        pid: 7,
        holder: None,
        client: "session-1".into(),
        detail: Some("{\"task\":1}".into()),
        tool: "run-command".into(),
        created_ms: now_ms(),
        ttl_ms: 60_000,
        outcome: None,
    });
    a.tasks().ended("t1", "completed");
    a.egress_grants().add(EgressGrant {
        user: String::new(),
        fleet: FleetKind::Local,
        engine: "e".into(),
        machine: "box".into(),
        destinations: vec!["pypi.org".into(), "github.com".into()],
        granted_ms: now_ms(),
    });
    a.egress_grants().add(EgressGrant {
        user: String::new(),
        fleet: FleetKind::Local,
        engine: "e".into(),
        machine: "box".into(),
        destinations: vec!["pypi.org".into(), "crates.io".into()],
        granted_ms: now_ms() + 1,
    });
    a.flush().await;
    let task = b.tasks().get("t1").await.unwrap().unwrap();
    assert_eq!(task.outcome.as_deref(), Some("completed"));
    assert_eq!(task.pid, 7);
    assert_eq!(task.client, "session-1");
    assert_eq!(task.holder, a.instance(), "run by a");
    assert!(b.tasks().holder_alive(&task).await);
    a.tasks().answered_as("t1", "{\"task\":2}".into());
    b.tasks().cancel_asked("t1");
    a.flush().await;
    b.flush().await;
    assert_eq!(
        b.tasks()
            .get("t1")
            .await
            .unwrap()
            .unwrap()
            .detail
            .as_deref(),
        Some("{\"task\":2}")
    );
    assert!(
        a.tasks().cancel_wanted("t1").await,
        "b asked a to cancel it"
    );
    assert_eq!(
        b.egress_grants()
            .for_machine(FleetKind::Local, "box", "")
            .await
            .unwrap(),
        ["pypi.org", "github.com", "crates.io"]
    );
    assert!(
        b.egress_grants()
            .for_machine(FleetKind::Cloud, "box", "")
            .await
            .unwrap()
            .is_empty()
    );

    // The day's spend mark is the first reading of the day, by either process.
    let day = |micros| SpendReading {
        day: "2026-12-05".into(),
        period_total_micros: micros,
    };
    assert_eq!(a.spend().day_mark(day(100)).await.unwrap(), 100);
    assert_eq!(b.spend().day_mark(day(250)).await.unwrap(), 100);
    let next = SpendReading {
        day: "2026-12-06".into(),
        period_total_micros: 300,
    };
    assert_eq!(b.spend().day_mark(next).await.unwrap(), 300);

    // A key answered by one process replays from the other.
    assert_eq!(
        a.keys().claim(key_claim("k1")).await.unwrap(),
        KeyClaim::Claimed
    );
    a.keys().answered("k1", "{\"ok\":1}".into());
    a.flush().await;
    match b.keys().claim(key_claim("k1")).await.unwrap() {
        KeyClaim::Taken(held) => {
            assert_eq!(held.answer.as_deref(), Some("{\"ok\":1}"));
            assert_eq!(held.holder, a.instance());
            assert!(b.keys().holder_alive(&held).await, "a is alive");
        }
        claimed => panic!("b claimed a key a holds: {claimed:?}"),
    }
    // A key released by a failed call is free for the other.
    assert_eq!(
        a.keys().claim(key_claim("k2")).await.unwrap(),
        KeyClaim::Claimed
    );
    a.keys().released("k2");
    a.flush().await;
    assert_eq!(
        b.keys().claim(key_claim("k2")).await.unwrap(),
        KeyClaim::Claimed
    );
    // Only its holder answers or releases a key.
    a.keys().released("k2");
    a.keys().answered("k2", "\"a's\"".into());
    a.flush().await;
    let held = b.keys().get("k2").await.unwrap().unwrap();
    assert_eq!(held.holder, b.instance());
    assert_eq!(held.answer, None);
}

#[tokio::test]
async fn two_processes_racing_for_keys_and_spend_marks_win_each_once() {
    let db = TestDatabase::new().await;
    let stores = [
        ready_store(&db).await,
        ready_store(&db).await,
        ready_store(&db).await,
    ];
    let keys: Vec<String> = (0..40).map(|i| format!("race-{i}")).collect();
    let mut claims = Vec::new();
    for store in &stores {
        for key in &keys {
            let (store, key) = (store.clone(), key.clone());
            claims.push(tokio::spawn(async move {
                let claim = store.keys().claim(key_claim(&key)).await.unwrap();
                (key, store.instance().unwrap(), claim)
            }));
        }
    }
    let mut winners = std::collections::BTreeMap::<String, Vec<String>>::new();
    let mut taken = 0;
    for claim in claims {
        let (key, instance, claim) = claim.await.unwrap();
        match claim {
            KeyClaim::Claimed => winners.entry(key).or_default().push(instance),
            KeyClaim::Taken(held) => {
                taken += 1;
                assert_ne!(held.holder.as_deref(), Some(instance.as_str()));
            }
        }
    }
    assert_eq!(winners.len(), keys.len(), "every key is claimed");
    for (key, won) in &winners {
        assert_eq!(won.len(), 1, "{key} was claimed by {won:?}");
    }
    assert_eq!(taken, keys.len() * 2);

    let marks = futures::future::join_all(stores.iter().enumerate().map(|(i, s)| {
        s.spend().day_mark(SpendReading {
            day: "2026-12-05".into(),
            period_total_micros: 1000 + i64::try_from(i).unwrap(),
        })
    }))
    .await;
    let marks: Vec<i64> = marks.into_iter().map(Result::unwrap).collect();
    assert!(marks.iter().all(|m| *m == marks[0]), "one mark: {marks:?}");
}

/// Three processes, each for another user, claim the same 30 machine names at once: each name
/// is held by exactly one user, and every claim answers that user; a release by a user who
/// does not hold a name leaves it held, the holder's frees it; a user's deleted machines' cost
/// adds up by day.
#[tokio::test]
async fn users_racing_for_machine_names_each_get_a_name_once() {
    let db = TestDatabase::new().await;
    let stores = [
        ready_store(&db).await,
        ready_store(&db).await,
        ready_store(&db).await,
    ];
    let names: Vec<String> = (0..30).map(|i| format!("box-{i}")).collect();
    let mut claims = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        for name in &names {
            let (store, name, user) = (store.clone(), name.clone(), format!("user-{i}"));
            claims.push(tokio::spawn(async move {
                let holder = store
                    .owners()
                    .claim(FleetKind::Local, &name, &user, 0)
                    .await
                    .unwrap();
                if matches!(holder, MachineClaim::Claimed { .. }) {
                    store
                        .owners()
                        .made(FleetKind::Local, &name, &user)
                        .await
                        .unwrap();
                }
                (name, user, holder)
            }));
        }
    }
    let mut holders =
        std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
    let mut won = std::collections::BTreeMap::<String, usize>::new();
    for claim in claims {
        let (name, user, claim) = claim.await.unwrap();
        let holder = match claim {
            MachineClaim::Claimed { .. } => {
                *won.entry(name.clone()).or_default() += 1;
                user
            }
            MachineClaim::Held(holder) => {
                assert_ne!(
                    holder, user,
                    "{name}: held by its own claimer before it claimed"
                );
                holder
            }
        };
        holders.entry(name).or_default().insert(holder);
    }
    for name in &names {
        assert_eq!(
            holders[name].len(),
            1,
            "{name} answered {:?}",
            holders[name]
        );
        assert_eq!(
            won.get(name),
            Some(&1),
            "{name} was won {:?} times",
            won.get(name)
        );
    }
    let held = stores[0].owners().held(FleetKind::Local).await.unwrap();
    assert_eq!(held.len(), names.len());
    assert!(
        stores[0]
            .owners()
            .held(FleetKind::Cloud)
            .await
            .unwrap()
            .is_empty()
    );

    let (name, holder) = held[0].clone();
    let stranger = if holder == "user-0" {
        "user-1"
    } else {
        "user-0"
    };
    stores[1]
        .owners()
        .release(FleetKind::Local, &name, stranger)
        .await
        .unwrap();
    assert_eq!(
        stores[2]
            .owners()
            .holder(FleetKind::Local, &name)
            .await
            .unwrap(),
        Some(holder.clone())
    );
    stores[1]
        .owners()
        .release(FleetKind::Local, &name, &holder)
        .await
        .unwrap();
    assert_eq!(
        stores[2]
            .owners()
            .holder(FleetKind::Local, &name)
            .await
            .unwrap(),
        None
    );

    // A cloud machine answers to its id too: held with its name, freed with it by either.
    assert_eq!(
        stores[0]
            .owners()
            .claim(FleetKind::Cloud, "web", "user-2", 0)
            .await
            .unwrap(),
        MachineClaim::Claimed {
            theirs: vec![smol_mcp::store::HeldName {
                name: "web".into(),
                made: false
            }]
        }
    );
    assert_eq!(
        stores[1]
            .owners()
            .holder(FleetKind::Cloud, "web")
            .await
            .unwrap(),
        None,
        "in the making: no one's machine yet"
    );
    assert_eq!(
        stores[1]
            .owners()
            .claim(FleetKind::Cloud, "web", "user-2", 0)
            .await
            .unwrap(),
        MachineClaim::Held("user-2".into()),
        "claimed again by its holder: held, not claimed anew"
    );
    stores[2]
        .owners()
        .made(FleetKind::Cloud, "web", "user-2")
        .await
        .unwrap();
    stores[0]
        .owners()
        .alias(FleetKind::Cloud, "mach-1", "web", "user-2")
        .await
        .unwrap();
    assert_eq!(
        stores[1]
            .owners()
            .holder(FleetKind::Cloud, "mach-1")
            .await
            .unwrap()
            .as_deref(),
        Some("user-2")
    );
    assert_eq!(
        stores[1].owners().held(FleetKind::Cloud).await.unwrap(),
        [("web".to_owned(), "user-2".to_owned())],
        "a machine is listed once, by its name"
    );
    stores[1]
        .owners()
        .release(FleetKind::Cloud, "mach-1", "user-2")
        .await
        .unwrap();
    assert_eq!(
        stores[2]
            .owners()
            .holder(FleetKind::Cloud, "web")
            .await
            .unwrap(),
        None
    );

    for (i, store) in stores.iter().enumerate() {
        store
            .owners()
            .settle("user-0", "2026-12-05", 100 + i64::try_from(i).unwrap())
            .await
            .unwrap();
    }
    assert_eq!(
        stores[0]
            .owners()
            .settled("user-0", "2026-12-05")
            .await
            .unwrap(),
        303
    );
    assert_eq!(
        stores[0]
            .owners()
            .settled("user-0", "2026-12-06")
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        stores[0]
            .owners()
            .settled("user-1", "2026-12-05")
            .await
            .unwrap(),
        0
    );
}

/// One user's claims through three processes at once are taken one at a time: each answers
/// with every name the user held before it (so `maxMachinesPerUser` counts them all), the
/// counts 1 to 12 each once; none is the user's machine until made, and a claim older than
/// the cut-off that was never made is not counted.
#[tokio::test]
async fn one_users_claims_through_three_processes_each_see_all_before_them() {
    let db = TestDatabase::new().await;
    let stores = [
        ready_store(&db).await,
        ready_store(&db).await,
        ready_store(&db).await,
    ];
    let mut claims = Vec::new();
    for i in 0..12 {
        let store = stores[i % 3].clone();
        claims.push(tokio::spawn(async move {
            store
                .owners()
                .claim(FleetKind::Local, &format!("u-{i}"), "erin", 0)
                .await
                .unwrap()
        }));
    }
    let mut counts = Vec::new();
    for claim in claims {
        match claim.await.unwrap() {
            MachineClaim::Claimed { theirs } => counts.push(theirs.len()),
            MachineClaim::Held(who) => panic!("held by {who}"),
        }
    }
    counts.sort_unstable();
    assert_eq!(counts, (1..=12).collect::<Vec<_>>());
    assert!(
        stores[1]
            .owners()
            .held(FleetKind::Local)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        stores[2]
            .owners()
            .holder(FleetKind::Local, "u-0")
            .await
            .unwrap(),
        None
    );
    stores[0]
        .owners()
        .made(FleetKind::Local, "u-0", "erin")
        .await
        .unwrap();
    // Claims in the making from before the cut-off (now + 1 h: all of them) are not counted;
    // the made one is, and the new claim itself.
    let later = now_ms() + 3_600_000;
    match stores[1]
        .owners()
        .claim(FleetKind::Local, "u-new", "erin", later)
        .await
        .unwrap()
    {
        MachineClaim::Claimed { mut theirs } => {
            theirs.sort_by(|a, b| a.name.cmp(&b.name));
            assert_eq!(
                theirs,
                [
                    smol_mcp::store::HeldName {
                        name: "u-0".into(),
                        made: true
                    },
                    smol_mcp::store::HeldName {
                        name: "u-new".into(),
                        made: false
                    }
                ]
            );
        }
        other => panic!("{other:?}"),
    }
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

    let run = NewRun {
        pid: std::process::id(),
        user: String::new(),
        tool: "run-command",
        fleet: FleetKind::Local,
        machine: "box".into(),
        command: RunCommand::Shell("echo hi".into()),
        workdir: None,
        env_names: Vec::new(),
        started_ms: now_ms(),
    };
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
    let records: Vec<Record> = stores
        .iter()
        .map(|s| Record::in_book(s.machine_record().unwrap()))
        .collect();
    dead_instance(&db, "i-dead-owner", &hostname(), 0).await;
    dead_instance(&db, "i-live-owner", "elsewhere", 0).await;
    for i in 0..20 {
        records[0]
            .add(machine(&format!("mcp-dead-{i}"), Some("i-dead-owner")))
            .unwrap();
    }
    records[0]
        .add(machine("mcp-live", Some("i-live-owner")))
        .unwrap();
    // Written by one, read by another.
    assert_eq!(records[2].entries().unwrap().len(), 21);
    assert_eq!(
        records[1]
            .orphaned(FleetKind::Local, "serve-a")
            .unwrap()
            .len(),
        20,
        "the live owner's machine is no orphan"
    );
    // Three processes sweeping at once: each orphan is claimed by one, on the blocking
    // threads a sweep's callers would be on.
    let claims: Vec<_> = records
        .iter()
        .cloned()
        .map(|r| {
            tokio::task::spawn_blocking(move || {
                r.claim_orphans(FleetKind::Local, "serve-a").unwrap()
            })
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
            .unwrap()
            .is_empty(),
        "claimed machines belong to live processes now"
    );
    // A machine removed by one is gone for all.
    records[1].remove(FleetKind::Local, "mcp-live").unwrap();
    assert_eq!(records[2].entries().unwrap().len(), 20);
}

/// A stored job naming no fleet this server knows is refused: not read (get, others) and not
/// taken over, never read as a local job. (SQLite: tests/offline/store_sqlite.rs.)
#[tokio::test]
async fn a_job_naming_no_known_fleet_is_refused_not_read_as_local() {
    let db = TestDatabase::new().await;
    let writer = ready_store(&db).await;
    writer.jobs().started(job("known", "serve-a"));
    writer.jobs().started(job("strange", "serve-a"));
    writer.flush().await;
    db.client()
        .await
        .execute("UPDATE jobs SET fleet = 'mars' WHERE id = 'strange'", &[])
        .await
        .unwrap();
    let reader = ready_store(&db).await;
    assert!(reader.jobs().get("known").await.unwrap().is_some());
    assert!(reader.jobs().get("strange").await.unwrap().is_none());
    let others: Vec<String> = reader
        .jobs()
        .others(100)
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.record.id)
        .collect();
    assert_eq!(others, ["known"]);
}
