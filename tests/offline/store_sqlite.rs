//! The SQLite store: the store's contract (tests/common/store_contract.rs), each "process" a
//! store of its own on one file, and its refusals of what it cannot read (PostgreSQL's:
//! tests/shared/store.rs).

use crate::common::store_contract;
use smol_mcp::fleet::FleetKind;
use smol_mcp::process::events::Events;
use smol_mcp::store::sqlite::{FILE_NAME, SqliteStore};
use smol_mcp::store::{RunRetention, ServedEngine, Store};
use std::sync::Arc;

/// A file in a directory of its own (kept while the closure lives); each call of the closure
/// opens one more store on it.
async fn file_backing() -> crate::common::store_contract::Backing {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    Box::new(move || {
        let path = dir.path().join(FILE_NAME);
        Box::pin(async move {
            let retention = RunRetention {
                max_runs: 2000,
                max_days: 30,
            };
            let store: Arc<dyn Store> =
                Arc::new(SqliteStore::new(path, retention, Events::default()));
            store
        })
    })
}

crate::store_contract_tests!(file_backing);

/// The machine record in a runtime directory of its own; each call opens it once more.
async fn record_file_backing() -> crate::common::record_contract::RecordBacking {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    Box::new(move || {
        let record = smol_mcp::process::ephemeral::Record::new(dir.path());
        Box::pin(async move { record })
    })
}

crate::record_contract_tests!(record_file_backing);

/// A stored job naming no fleet this server knows is refused: not read (get, others) and not
/// taken over, never read as a local job; one in a state this server does not know, or with a
/// negative timeout, is not read either.
#[tokio::test]
async fn a_job_naming_no_known_fleet_is_refused_not_read_as_local() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    let retention = RunRetention {
        max_runs: 100,
        max_days: 30,
    };
    let store = SqliteStore::new(path.clone(), retention, Events::default());
    store_contract::four_jobs(&store).await;
    // Both as a process that has ended had left them running.
    let mut ended = std::process::Command::new("true").spawn().unwrap();
    let dead = ended.id();
    ended.wait().unwrap();
    let db = rusqlite::Connection::open(&path).unwrap();
    db.execute("UPDATE jobs SET pid = ?1", [dead]).unwrap();
    db.execute("UPDATE jobs SET fleet = 'mars' WHERE id = 'strange'", [])
        .unwrap();
    db.execute("UPDATE jobs SET state = 'dormant' WHERE id = 'odd'", [])
        .unwrap();
    db.execute(
        "UPDATE jobs SET timeout_secs = -1 WHERE id = 'negative'",
        [],
    )
    .unwrap();
    drop(db);
    let reader = SqliteStore::new(path, retention, Events::default());
    store_contract::only_the_known_job_is_read(&reader).await;
    let served = vec![ServedEngine {
        fleet: FleetKind::Local,
        engine: "serve-a".into(),
    }];
    let taken: Vec<String> = reader
        .jobs()
        .take_over(served)
        .await
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(taken, ["known"]);
}
