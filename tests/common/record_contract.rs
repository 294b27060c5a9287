//! The machine record's contract: what every book keeping it (the runtime directory's file,
//! the shared database's rows) does alike. Each test is given a way to open the record as one
//! more process would, on one backing; the file's "processes" share this test's pid, so what
//! depends on whose pid an entry names (a sweep's claims between processes) is tested on the
//! database alone (tests/shared/store.rs).

use futures::future::BoxFuture;
use smol_mcp::fleet::FleetKind;
use smol_mcp::process::ephemeral::{BaseBound, BaseMark, CLAIMED, Entry, Lease, Record};
use std::collections::BTreeSet;

/// What a backing gives the contract: one more process's record on the same book each call.
pub type RecordBacking = Box<dyn Fn() -> BoxFuture<'static, Record> + Send + Sync>;

/// An entry of `name` on `fleet`, owned by this process's `session`, made on engine `e1`.
pub fn entry(fleet: FleetKind, name: &str, session: &str) -> Entry {
    Entry {
        fleet,
        name: name.into(),
        id: name.into(),
        owner_pid: std::process::id(),
        owner: None,
        session: session.into(),
        parent: None,
        recorded_at: 1,
        lease: None,
        engine: Some("e1".into()),
        kept_until: None,
        base: None,
    }
}

fn names(entries: &[Entry]) -> Vec<String> {
    entries.iter().map(|e| e.name.clone()).collect()
}

async fn processes(open: &RecordBacking, n: usize) -> Vec<Record> {
    let mut records = Vec::new();
    for _ in 0..n {
        records.push(open().await);
    }
    records
}

/// One machine's life as another process reads it: recorded in order, a name taken once, its
/// id and parent after the create, its lease renewed by name or id on either fleet, removed by
/// id; a machine of the same name on the other fleet is another machine.
pub async fn one_machines_life(open: &RecordBacking) {
    let [a, b] = <[Record; 2]>::try_from(processes(open, 2).await).unwrap();
    let mut child = entry(FleetKind::Local, "m-child", "s1");
    child.parent = Some("m-parent".into());
    child.lease = Some(Lease {
        last_used: 100,
        secs: 60,
    });
    assert!(!a.add_new(child.clone()).await.unwrap(), "a new name");
    assert!(
        a.add_new(child.clone()).await.unwrap(),
        "a name recorded already"
    );
    a.add(entry(FleetKind::Cloud, "m-child", "s1"))
        .await
        .unwrap();
    a.add(entry(FleetKind::Local, "m-later", "s1"))
        .await
        .unwrap();
    assert_eq!(
        names(&b.entries().await.unwrap()),
        ["m-child", "m-child", "m-later"],
        "in the order recorded"
    );

    let mut created = child.clone();
    created.id = "mach-123".into();
    created.parent = None;
    b.set_created(&created).await.unwrap();
    let local = |entries: Vec<Entry>| {
        entries
            .into_iter()
            .find(|e| e.fleet == FleetKind::Local && e.name == "m-child")
            .unwrap()
    };
    let read = local(a.entries().await.unwrap());
    assert_eq!(read.id, "mach-123");
    assert_eq!(read.parent.as_deref(), Some("m-parent"), "the parent stays");

    b.renew(&["mach-123".to_owned()], 150).await.unwrap();
    let read = local(a.entries_named("m-child").await.unwrap());
    assert_eq!(read.lease.unwrap().last_used, 150, "renewed by its id");
    b.renew(&["m-child".to_owned()], 120).await.unwrap();
    let read = local(a.entries_named("mach-123").await.unwrap());
    assert_eq!(
        read.lease.unwrap().last_used,
        150,
        "a lease never goes back"
    );
    assert_eq!(
        a.entries_named("m-child").await.unwrap().len(),
        2,
        "a name on either fleet"
    );

    a.remove(FleetKind::Local, "mach-123").await.unwrap();
    let left = b.entries().await.unwrap();
    assert_eq!(
        left.iter()
            .map(|e| (e.fleet, e.name.as_str()))
            .collect::<Vec<_>>(),
        [(FleetKind::Cloud, "m-child"), (FleetKind::Local, "m-later")]
    );
    a.remove(FleetKind::Local, "never-recorded").await.unwrap();
    assert_eq!(b.entries().await.unwrap().len(), 2);
}

/// Three processes, many calls each at once, creating, renewing and deleting machines of their
/// own while all race for one name: nothing written is lost, nothing removed comes back, and
/// the contested name is won once.
pub async fn concurrent_writers_lose_nothing(open: &RecordBacking) {
    let records = processes(open, 3).await;
    let mut calls = Vec::new();
    for (p, record) in records.iter().enumerate() {
        for i in 0..12 {
            let record = record.clone();
            calls.push(tokio::spawn(async move {
                let name = format!("m-{p}-{i}");
                let mut fresh = entry(FleetKind::Local, &name, &format!("s{p}"));
                fresh.lease = Some(Lease {
                    last_used: 1,
                    secs: 600,
                });
                assert!(!record.add_new(fresh.clone()).await.unwrap());
                let won = !record
                    .add_new(entry(FleetKind::Local, "contested", &name))
                    .await
                    .unwrap();
                let mut created = fresh.clone();
                created.id = format!("id-{p}-{i}");
                record.set_created(&created).await.unwrap();
                record.renew(&[created.id.clone()], 50).await.unwrap();
                if i % 3 == 0 {
                    record.remove(FleetKind::Local, &name).await.unwrap();
                }
                won
            }));
        }
    }
    let mut winners = 0;
    for call in calls {
        winners += usize::from(call.await.unwrap());
    }
    assert_eq!(winners, 1, "the contested name is recorded by one call");
    let entries = records[0].entries().await.unwrap();
    let kept: BTreeSet<String> = entries
        .iter()
        .filter(|e| e.name != "contested")
        .map(|e| e.name.clone())
        .collect();
    let expected: BTreeSet<String> = (0..3)
        .flat_map(|p| {
            (0..12)
                .filter(|i| i % 3 != 0)
                .map(move |i| format!("m-{p}-{i}"))
        })
        .collect();
    assert_eq!(kept, expected, "every create kept, every delete made");
    for e in entries.iter().filter(|e| e.name != "contested") {
        assert!(e.id.starts_with("id-"), "{e:?}: its create's id");
        assert_eq!(e.lease.map(|l| l.last_used), Some(50), "{e:?}: renewed");
    }
}

/// Changes of the whole record beside changes of single machines: bases counted against their
/// bounds while machines come and go (the last place taken once), a session's machines kept
/// and one taken back by one of two sessions asking at once, and an orphan of a dead process
/// claimed for deletion.
pub async fn whole_record_changes_beside_single_ones(open: &RecordBacking) {
    let records = processes(open, 3).await;
    let mark = |name: &str, user: &str| {
        let mut e = entry(FleetKind::Local, name, "");
        e.base = Some(BaseMark {
            user: user.into(),
            made_at: 1,
            last_used: 1,
            made_from: "alpine".into(),
        });
        e.kept_until = Some(u64::MAX);
        e
    };
    records[0]
        .add(entry(FleetKind::Local, "b-old", "s"))
        .await
        .unwrap();
    let mut calls = Vec::new();
    for (p, record) in records.iter().enumerate() {
        for i in 0..4 {
            let record = record.clone();
            let base = mark(&format!("b-{p}-{i}"), &format!("u{i}"));
            calls.push(tokio::spawn(async move {
                let churn = entry(FleetKind::Local, &format!("c-{p}-{i}"), "s");
                record.add(churn).await.unwrap();
                let marked = record.mark_base(base, 10, 5).await.unwrap();
                record
                    .remove(FleetKind::Local, &format!("c-{p}-{i}"))
                    .await
                    .unwrap();
                marked
            }));
        }
    }
    let mut marked = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(was) => {
                assert!(was.is_none(), "a base not recorded before");
                marked += 1;
            }
            Err(BaseBound::Server(5)) => {}
            Err(other) => panic!("refused for {other:?}"),
        }
    }
    assert_eq!(marked, 5, "bases up to the server's bound, none past it");
    let bases = records[1].bases(FleetKind::Local).await.unwrap();
    assert_eq!(bases.len(), 5);
    let entries = records[2].entries().await.unwrap();
    assert!(
        entries.iter().all(|e| !e.name.starts_with("c-")),
        "every machine removed beside the bases is gone: {:?}",
        names(&entries)
    );
    // A base already recorded (its name taken) is marked in place, and put back when asked.
    let was = records[0]
        .mark_base(mark("b-old", "u9"), 10, 6)
        .await
        .unwrap()
        .unwrap();
    let as_recorded = |e: &Entry| (e.name.clone(), e.session.clone(), e.base.clone());
    assert_eq!(
        was.as_ref().map(as_recorded),
        Some(("b-old".to_owned(), "s".to_owned(), None))
    );
    let marked_old = records[2].entries_named("b-old").await.unwrap();
    assert_eq!(
        marked_old[0].base.as_ref().map(|b| b.user.as_str()),
        Some("u9")
    );
    records[1]
        .unmark_base(FleetKind::Local, "b-old", was.clone())
        .await
        .unwrap();
    let old = records[2].entries_named("b-old").await.unwrap();
    assert_eq!(
        old.iter().map(as_recorded).collect::<Vec<_>>(),
        [as_recorded(&was.unwrap())]
    );

    // Kept at a session's end, then asked back by two sessions at once: one has it.
    for name in ["k-1", "k-2"] {
        records[0]
            .add(entry(FleetKind::Local, name, "ending"))
            .await
            .unwrap();
    }
    let kept = records[1]
        .keep(
            FleetKind::Local,
            |e| e.session == "ending",
            |_| u64::MAX - 1,
        )
        .await
        .unwrap();
    assert_eq!(names(&kept), ["k-1", "k-2"]);
    let asks: Vec<_> = ["s-a", "s-b"]
        .into_iter()
        .zip([records[0].clone(), records[2].clone()])
        .map(|(session, record)| {
            tokio::spawn(async move {
                record
                    .take_back("k-1", std::process::id(), session, None, 10)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut taken = Vec::new();
    for ask in asks {
        taken.extend(ask.await.unwrap());
    }
    assert_eq!(taken.len(), 1, "taken back once: {taken:?}");
    let now = records[1].entries_named("k-1").await.unwrap();
    assert_eq!(now[0].session, taken[0].session);
    assert_eq!(now[0].kept_until, None);

    // A machine whose process has ended is claimed for deletion, once.
    let mut ended = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = ended.id();
    ended.wait().unwrap();
    let mut orphan = entry(FleetKind::Local, "o-1", "gone");
    orphan.owner_pid = dead_pid;
    records[0].add(orphan).await.unwrap();
    let orphans = records[1].orphaned(FleetKind::Local, "e1").await.unwrap();
    assert_eq!(names(&orphans), ["o-1"]);
    let claimed = records[1]
        .claim_orphans(FleetKind::Local, "e1")
        .await
        .unwrap();
    assert_eq!(names(&claimed), ["o-1"]);
    let read = records[2].entries_named("o-1").await.unwrap();
    assert_eq!(read[0].session, CLAIMED);
    assert_eq!(read[0].owner_pid, std::process::id());
}

/// A test of each part of the contract against the backing `$backing().await` makes.
#[macro_export]
macro_rules! record_contract_tests {
    ($backing:path) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn record_contract_one_machines_life() {
            $crate::common::record_contract::one_machines_life(&$backing().await).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn record_contract_concurrent_writers_lose_nothing() {
            $crate::common::record_contract::concurrent_writers_lose_nothing(&$backing().await)
                .await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn record_contract_whole_record_changes_beside_single_ones() {
            $crate::common::record_contract::whole_record_changes_beside_single_ones(
                &$backing().await,
            )
            .await;
        }
    };
}
