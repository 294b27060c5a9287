//! The store's contract: what every backend answers alike, run against SQLite (tests/offline,
//! a file in a temporary directory) and PostgreSQL (tests/shared, a database of the test's
//! own). A "process" is a store of its own on the same file or database, as a second server
//! process would open; what only one backend can show (PostgreSQL's instance slots and dead
//! instances, a process that has really ended) stays in that backend's own tests.
//!
//! Each function is one area: every kind of record is written by one process and read by
//! another, claims are raced by several at once, and limits and expiry are gone past.

use futures::future::BoxFuture;
use smol_mcp::fleet::FleetKind;
use smol_mcp::store::{
    EgressGrant, HeldName, Hold, JobEnd, JobRecord, JobState, KeyClaim, KeyRecord, MachineClaim,
    NewRun, REQUEST_STATES_MAX, RunCommand, RunEnd, RunOutcome, SpendReading, Store, StreamRecord,
    Taken, TaskRecord,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Opens one more process's store on the backend under test (the same file or database).
pub type Open<'a> = &'a (dyn Fn() -> BoxFuture<'static, Arc<dyn Store>> + Sync);

pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

pub fn key_claim(key: &str) -> KeyRecord {
    KeyRecord {
        key: key.into(),
        pid: std::process::id(),
        holder: None,
        pid_started: smol_mcp::process::ephemeral::process_started(std::process::id()),
        tool: "create-machine".into(),
        fingerprint: "f".into(),
        arguments: "{}".into(),
        started_ms: now_ms(),
        answer: None,
        answer_dropped: false,
    }
}

pub fn job(id: &str, engine: &str) -> JobRecord {
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

/// The operator's `echo hi` on `box`, begun now in `/w` with `A` in its environment.
pub fn new_run() -> NewRun {
    NewRun {
        pid: std::process::id(),
        user: String::new(),
        tool: "run-command",
        fleet: FleetKind::Local,
        machine: "box".into(),
        command: RunCommand::Shell("echo hi".into()),
        workdir: Some("/w".into()),
        env_names: vec!["A".into()],
        started_ms: now_ms(),
    }
}

async fn processes(open: Open<'_>, n: usize) -> Vec<Arc<dyn Store>> {
    let mut stores = Vec::new();
    for _ in 0..n {
        stores.push(open().await);
    }
    stores
}

/// Runs: ids grow and never meet between processes, a run's end, output and cost are read back
/// by another process, pages go newest first, and each user reads only their own.
pub async fn runs(open: Open<'_>) {
    let [a, b]: [Arc<dyn Store>; 2] = processes(open, 2).await.try_into().ok().unwrap();
    let run = new_run();
    let started = run.started_ms;
    let first = a.runs().begin(run.clone()).unwrap();
    let alices = b
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
    assert!(
        ![first, third].contains(&alices),
        "two processes' ids never meet"
    );
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

    let theirs = b.runs().page(None, 10, "alice").await.unwrap();
    assert_eq!(
        theirs.runs.iter().map(|r| r.id).collect::<Vec<_>>(),
        [alices]
    );
    assert!(
        b.runs().get(first, "alice").await.unwrap().is_none(),
        "not alice's"
    );
    assert!(
        b.runs().get(alices, "").await.unwrap().is_none(),
        "not the operator's"
    );
    // flush waits 2 s at most for what was queued (a read must not hang on a slow disk): on a
    // loaded host another process's writes may land later, and are read once they have.
    let mut page = b.runs().page(None, 10, "").await.unwrap();
    for _ in 0..100 {
        if page.runs.len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        page = b.runs().page(None, 10, "").await.unwrap();
    }
    let ids: Vec<i64> = page.runs.iter().map(|r| r.id).collect();
    assert_eq!(ids, [third, first], "newest first");
    assert!(!page.more);
    let older = b.runs().page(Some(third), 1, "").await.unwrap();
    assert_eq!(older.runs.iter().map(|r| r.id).collect::<Vec<_>>(), [first]);
    assert!(!older.more);
    assert!(b.runs().page(None, 1, "").await.unwrap().more);
    let detail = b.runs().get(first, "").await.unwrap().unwrap();
    assert_eq!(detail.summary.outcome, "exited");
    assert_eq!(detail.summary.exit_code, Some(0));
    assert_eq!(detail.stdout.unwrap().head, "hi\n");
    assert_eq!(detail.usage.as_deref(), Some("{\"cpuMs\":1}"));
    assert_eq!(detail.env_names, "[\"A\"]");
    assert!(b.runs().get(12345, "").await.unwrap().is_none());
}

/// Jobs: one process's job, its end and its exit are read by another.
pub async fn jobs(open: Open<'_>) {
    let [a, b]: [Arc<dyn Store>; 2] = processes(open, 2).await.try_into().ok().unwrap();
    a.jobs().started(job("j1", "serve-a"));
    a.jobs().started(job("j2", "serve-a"));
    a.jobs().ended(JobEnd {
        id: "j2".into(),
        state: JobState::Exited,
        exit_code: Some(3),
        reason: None,
        ended_ms: now_ms(),
    });
    a.flush().await;
    let running = b.jobs().get("j1").await.unwrap().unwrap();
    assert_eq!(running.record.machine, "m");
    assert_eq!(running.state, JobState::Running);
    let ended = b.jobs().get("j2").await.unwrap().unwrap();
    assert_eq!((ended.state, ended.exit_code), (JobState::Exited, Some(3)));
    assert!(b.jobs().get("j3").await.unwrap().is_none());
}

/// Writes the jobs `known`, `strange`, `odd` and `negative`, all running: a test then spoils
/// all but `known` behind the store's back (see [`only_the_known_job_is_read`]).
pub async fn four_jobs(writer: &dyn Store) {
    for id in ["known", "strange", "odd", "negative"] {
        writer.jobs().started(job(id, "serve-a"));
    }
    writer.flush().await;
}

/// Of [`four_jobs`], only `known` is read, by its id and among other processes' jobs: the
/// rest were spoiled (a fleet no server knows, a state it does not know, a negative timeout).
pub async fn only_the_known_job_is_read(reader: &dyn Store) {
    assert!(reader.jobs().get("known").await.unwrap().is_some());
    assert!(reader.jobs().get("strange").await.unwrap().is_none());
    assert!(reader.jobs().get("odd").await.unwrap().is_none());
    assert!(reader.jobs().get("negative").await.unwrap().is_none());
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

/// Tasks: created, answered and ended by one process, read by another; a cancel asked through
/// one is wanted by the other; the holder of a task this process runs lives.
pub async fn tasks(open: Open<'_>) {
    let [a, b]: [Arc<dyn Store>; 2] = processes(open, 2).await.try_into().ok().unwrap();
    a.tasks().created(TaskRecord {
        id: "t1".into(),
        pid: std::process::id(),
        holder: None,
        client: String::new(),
        detail: Some("{\"task\":1}".into()),
        tool: "run-command".into(),
        created_ms: now_ms(),
        ttl_ms: 60_000,
        outcome: None,
    });
    a.flush().await;
    assert!(!a.tasks().cancel_wanted("t1").await, "no one asked yet");
    a.tasks().answered_as("t1", "{\"task\":2}".into());
    b.tasks().cancel_asked("t1");
    a.flush().await;
    b.flush().await;
    assert!(
        a.tasks().cancel_wanted("t1").await,
        "b asked a to cancel it"
    );
    assert!(!a.tasks().cancel_wanted("t2").await, "no such task");
    a.tasks().ended("t1", "completed");
    a.flush().await;
    let task = b.tasks().get("t1").await.unwrap().unwrap();
    assert_eq!(task.outcome.as_deref(), Some("completed"));
    assert_eq!(task.detail.as_deref(), Some("{\"task\":2}"));
    assert_eq!(task.tool, "run-command");
    assert!(b.tasks().holder_alive(&task).await);
    assert!(b.tasks().get("t2").await.unwrap().is_none());
}

/// Egress grants: every destination a user allowed a machine, by any process, oldest first and
/// each once; another fleet's machine of that name and another user's grants are apart.
pub async fn egress_grants(open: Open<'_>) {
    let [a, b]: [Arc<dyn Store>; 2] = processes(open, 2).await.try_into().ok().unwrap();
    let grant = |user: &str, destinations: &[&str], granted_ms| EgressGrant {
        user: user.into(),
        fleet: FleetKind::Local,
        engine: "e".into(),
        machine: "box".into(),
        destinations: destinations.iter().map(|d| (*d).to_owned()).collect(),
        granted_ms,
    };
    let now = now_ms();
    a.egress_grants()
        .add(grant("", &["pypi.org", "github.com"], now));
    b.egress_grants()
        .add(grant("", &["pypi.org", "crates.io"], now + 1));
    a.egress_grants()
        .add(grant("bob", &["evil.example"], now + 2));
    a.flush().await;
    b.flush().await;
    let operators = b
        .egress_grants()
        .for_machine(Hold::new(FleetKind::Local, "box", ""));
    assert_eq!(
        operators.await.unwrap(),
        ["pypi.org", "github.com", "crates.io"]
    );
    let bobs = a
        .egress_grants()
        .for_machine(Hold::new(FleetKind::Local, "box", "bob"));
    assert_eq!(bobs.await.unwrap(), ["evil.example"]);
    let cloud = a
        .egress_grants()
        .for_machine(Hold::new(FleetKind::Cloud, "box", ""));
    assert!(cloud.await.unwrap().is_empty());
}

/// The day's spend mark is the day's first reading, by whichever process, even when three
/// race for it; a new day has a mark of its own.
pub async fn spend(open: Open<'_>) {
    let stores = processes(open, 3).await;
    let reading = |day: &str, micros| SpendReading {
        day: day.into(),
        period_total_micros: micros,
    };
    assert_eq!(
        stores[0]
            .spend()
            .day_mark(reading("2026-12-05", 100))
            .await
            .unwrap(),
        100
    );
    assert_eq!(
        stores[1]
            .spend()
            .day_mark(reading("2026-12-05", 250))
            .await
            .unwrap(),
        100
    );
    let raced = futures::future::join_all(
        stores
            .iter()
            .zip([1000, 1001, 1002])
            .map(|(store, micros)| store.spend().day_mark(reading("2026-12-06", micros))),
    )
    .await;
    let marks: Vec<i64> = raced.into_iter().map(Result::unwrap).collect();
    assert!(marks.iter().all(|m| *m == marks[0]), "one mark: {marks:?}");
    assert!([1000, 1001, 1002].contains(&marks[0]));
}

/// Idempotency keys: three processes racing for 40 keys claim each once; an answer given
/// through one replays from another; a released key is free again; a key whose call is older
/// than a day names it no longer.
pub async fn keys(open: Open<'_>) {
    let stores = processes(open, 3).await;
    let keys: Vec<String> = (0..40).map(|i| format!("race-{i}")).collect();
    let mut claims = Vec::new();
    for store in &stores {
        for key in &keys {
            let (store, key) = (store.clone(), key.clone());
            claims.push(tokio::spawn(async move {
                let claim = store.keys().claim(key_claim(&key)).await.unwrap();
                (key, claim)
            }));
        }
    }
    let mut won = BTreeMap::<String, usize>::new();
    for claim in claims {
        let (key, claim) = claim.await.unwrap();
        *won.entry(key).or_default() += usize::from(claim == KeyClaim::Claimed);
    }
    assert_eq!(won.len(), keys.len());
    assert!(
        won.values().all(|n| *n == 1),
        "each key claimed once: {won:?}"
    );

    let (a, b) = (&stores[0], &stores[1]);
    assert_eq!(
        a.keys().claim(key_claim("k1")).await.unwrap(),
        KeyClaim::Claimed
    );
    a.keys().answered("k1", "{\"ok\":1}".into());
    a.flush().await;
    match b.keys().claim(key_claim("k1")).await.unwrap() {
        KeyClaim::Taken(held) => {
            assert_eq!(held.answer.as_deref(), Some("{\"ok\":1}"));
            assert!(b.keys().holder_alive(&held).await, "its holder lives");
        }
        claimed => panic!("a key held by another call was claimed: {claimed:?}"),
    }
    assert_eq!(
        a.keys().claim(key_claim("k2")).await.unwrap(),
        KeyClaim::Claimed
    );
    a.keys().released("k2");
    a.flush().await;
    assert!(b.keys().get("k2").await.unwrap().is_none(), "released");
    assert_eq!(
        b.keys().claim(key_claim("k2")).await.unwrap(),
        KeyClaim::Claimed
    );

    let day_old = KeyRecord {
        started_ms: now_ms() - 25 * 3_600_000,
        ..key_claim("old")
    };
    assert_eq!(a.keys().claim(day_old).await.unwrap(), KeyClaim::Claimed);
    assert_eq!(
        b.keys().claim(key_claim("old")).await.unwrap(),
        KeyClaim::Claimed,
        "a key's call older than a day names it no longer"
    );
}

/// Three processes, each for another user, claim the same 30 names at once: each name is held
/// by one user and won once; a release by a user who does not hold a name leaves it held; a
/// cloud machine answers to its id too; a user's deleted machines' cost adds up by day.
pub async fn machine_names(open: Open<'_>) {
    let stores = processes(open, 3).await;
    let names: Vec<String> = (0..30).map(|i| format!("box-{i}")).collect();
    let mut claims = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        for name in &names {
            let (store, name, user) = (store.clone(), name.clone(), format!("user-{i}"));
            claims.push(tokio::spawn(async move {
                let owners = store.owners();
                let claim = owners
                    .claim(Hold::new(FleetKind::Local, &name, &user), 0)
                    .await
                    .unwrap();
                if matches!(claim, MachineClaim::Claimed { .. }) {
                    owners
                        .made(Hold::new(FleetKind::Local, &name, &user))
                        .await
                        .unwrap();
                }
                (name, user, claim)
            }));
        }
    }
    let mut holders = BTreeMap::<String, BTreeSet<String>>::new();
    let mut won = BTreeMap::<String, usize>::new();
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
                    "{name}: held by its claimer before it claimed"
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
            "{name} won {:?} times",
            won.get(name)
        );
    }
    let owners = |i: usize| stores[i].owners();
    let held = owners(0).held(FleetKind::Local).await.unwrap();
    assert_eq!(held.len(), names.len());
    assert!(owners(0).held(FleetKind::Cloud).await.unwrap().is_empty());
    let (name, holder) = held[0].clone();
    let stranger = if holder == "user-0" {
        "user-1"
    } else {
        "user-0"
    };
    owners(1)
        .release(Hold::new(FleetKind::Local, &name, stranger))
        .await
        .unwrap();
    let now_held = owners(2).holder(FleetKind::Local, &name).await.unwrap();
    assert_eq!(
        now_held,
        Some(holder.clone()),
        "a stranger's release frees nothing"
    );
    owners(1)
        .release(Hold::new(FleetKind::Local, &name, &holder))
        .await
        .unwrap();
    assert_eq!(
        owners(2).holder(FleetKind::Local, &name).await.unwrap(),
        None
    );

    let web = owners(0)
        .claim(Hold::new(FleetKind::Cloud, "web", "user-2"), 0)
        .await
        .unwrap();
    let mine = vec![HeldName {
        name: "web".into(),
        made: false,
    }];
    assert_eq!(web, MachineClaim::Claimed { theirs: mine });
    let making = owners(1).holder(FleetKind::Cloud, "web").await.unwrap();
    assert_eq!(making, None, "in the making: no one's machine yet");
    let again = owners(1)
        .claim(Hold::new(FleetKind::Cloud, "web", "user-2"), 0)
        .await
        .unwrap();
    assert_eq!(
        again,
        MachineClaim::Held("user-2".into()),
        "held, not claimed anew"
    );
    owners(2)
        .made(Hold::new(FleetKind::Cloud, "web", "user-2"))
        .await
        .unwrap();
    owners(0)
        .alias("mach-1", Hold::new(FleetKind::Cloud, "web", "user-2"))
        .await
        .unwrap();
    let by_id = owners(1).holder(FleetKind::Cloud, "mach-1").await.unwrap();
    assert_eq!(by_id.as_deref(), Some("user-2"));
    let listed = owners(1).held(FleetKind::Cloud).await.unwrap();
    assert_eq!(
        listed,
        [("web".to_owned(), "user-2".to_owned())],
        "listed once, by name"
    );
    let since = owners(1).held_since(FleetKind::Cloud).await.unwrap();
    assert!(since.iter().any(|h| h.machine == "web"), "{since:?}");
    owners(1)
        .release(Hold::new(FleetKind::Cloud, "mach-1", "user-2"))
        .await
        .unwrap();
    assert_eq!(
        owners(2).holder(FleetKind::Cloud, "web").await.unwrap(),
        None
    );

    owners(0)
        .claim(Hold::new(FleetKind::Local, "gone", "user-1"), 0)
        .await
        .unwrap();
    owners(0)
        .made(Hold::new(FleetKind::Local, "gone", "user-1"))
        .await
        .unwrap();
    owners(1).forget(FleetKind::Local, "gone").await.unwrap();
    assert_eq!(
        owners(2).holder(FleetKind::Local, "gone").await.unwrap(),
        None
    );

    for (i, store) in stores.iter().enumerate() {
        let micros = 100 + i64::try_from(i).unwrap();
        store
            .owners()
            .settle("user-0", "2026-12-05", micros)
            .await
            .unwrap();
    }
    assert_eq!(
        owners(0).settled("user-0", "2026-12-05").await.unwrap(),
        303
    );
    assert_eq!(owners(0).settled("user-0", "2026-12-06").await.unwrap(), 0);
    assert_eq!(owners(0).settled("user-1", "2026-12-05").await.unwrap(), 0);
}

/// One user's claims through three processes at once are taken one at a time: each answers
/// with every name the user held before it (the counts 1 to 12 each once); none is the user's
/// machine until made; a claim in the making older than the cut-off is not counted.
pub async fn one_users_claims(open: Open<'_>) {
    let stores = processes(open, 3).await;
    let mut claims = Vec::new();
    for i in 0..12 {
        let store = stores[i % 3].clone();
        claims.push(tokio::spawn(async move {
            let name = format!("u-{i}");
            store
                .owners()
                .claim(Hold::new(FleetKind::Local, &name, "erin"), 0)
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
        .made(Hold::new(FleetKind::Local, "u-0", "erin"))
        .await
        .unwrap();
    let later = now_ms() + 3_600_000;
    let claim = stores[1]
        .owners()
        .claim(Hold::new(FleetKind::Local, "u-new", "erin"), later);
    let MachineClaim::Claimed { mut theirs } = claim.await.unwrap() else {
        panic!("u-new was held");
    };
    theirs.sort_by(|a, b| a.name.cmp(&b.name));
    let held = |name: &str, made| HeldName {
        name: name.into(),
        made,
    };
    assert_eq!(theirs, [held("u-0", true), held("u-new", false)]);
}

/// Sealed requestStates: a nonce is taken once among the processes, even raced; one signed-in
/// user takes at most half the bound while another still takes theirs; a nonce past its
/// lifetime is gone, and taken anew.
pub async fn request_states(open: Open<'_>) {
    let stores = processes(open, 3).await;
    let life = 600_000;
    let raced = futures::future::join_all(
        stores
            .iter()
            .map(|s| s.request_states().take("aa01", life, "")),
    )
    .await;
    let mut raced: Vec<Taken> = raced.into_iter().map(Result::unwrap).collect();
    raced.sort_by_key(|t| *t != Taken::Now);
    assert_eq!(raced, [Taken::Now, Taken::Before, Taken::Before]);

    let half = usize::try_from(REQUEST_STATES_MAX / 2).unwrap();
    for chunk in (0..half).collect::<Vec<_>>().chunks(256) {
        let takes = chunk.iter().map(|i| {
            let store = &stores[i % 3];
            async move {
                store
                    .request_states()
                    .take(&format!("b{i:04x}"), life, "bob")
                    .await
            }
        });
        for taken in futures::future::join_all(takes).await {
            assert_eq!(taken.unwrap(), Taken::Now);
        }
    }
    let past = stores[1].request_states().take("b-past", life, "bob").await;
    assert_eq!(past.unwrap(), Taken::Full, "bob has taken half of all");
    let carol = stores[2].request_states().take("c0", life, "carol").await;
    assert_eq!(carol.unwrap(), Taken::Now, "carol is not held back by bob");

    assert_eq!(
        stores[0]
            .request_states()
            .take("d0", 50, "dan")
            .await
            .unwrap(),
        Taken::Now
    );
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let anew = stores[1].request_states().take("d0", 50, "dan").await;
    assert_eq!(
        anew.unwrap(),
        Taken::Now,
        "past its lifetime the nonce is gone"
    );
}

/// What a backend's test file gives the contract: a fresh file or database for each test, and
/// how to open one more process's store on it (the closure keeps the backing alive).
pub type Backing = Box<dyn Fn() -> BoxFuture<'static, Arc<dyn Store>> + Send + Sync>;

/// A test of each area against the backing `$backing().await` makes.
#[macro_export]
macro_rules! store_contract_tests {
    ($backing:path) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn contract_runs() {
            $crate::common::store_contract::runs(&*$backing().await).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn contract_jobs() {
            $crate::common::store_contract::jobs(&*$backing().await).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn contract_tasks() {
            $crate::common::store_contract::tasks(&*$backing().await).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn contract_egress_grants() {
            $crate::common::store_contract::egress_grants(&*$backing().await).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn contract_spend() {
            $crate::common::store_contract::spend(&*$backing().await).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn contract_keys() {
            $crate::common::store_contract::keys(&*$backing().await).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn contract_machine_names() {
            $crate::common::store_contract::machine_names(&*$backing().await).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn contract_one_users_claims() {
            $crate::common::store_contract::one_users_claims(&*$backing().await).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn contract_request_states() {
            $crate::common::store_contract::request_states(&*$backing().await).await;
        }
    };
}
