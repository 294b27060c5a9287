//! The SQLite store's refusals of what it cannot read (PostgreSQL's: tests/shared/store.rs).

use smol_mcp::fleet::FleetKind;
use smol_mcp::process::events::Events;
use smol_mcp::store::sqlite::{FILE_NAME, SqliteStore};
use smol_mcp::store::{JobRecord, RunRetention, ServedEngine, Store};

fn job(id: &str) -> JobRecord {
    JobRecord {
        id: id.into(),
        user: String::new(),
        run_id: None,
        fleet: FleetKind::Local,
        engine: "serve-a".into(),
        machine: "m".into(),
        command: "sleep 100".into(),
        base: "/tmp/j".into(),
        started_ms: chrono::Utc::now().timestamp_millis(),
        timeout_secs: 600,
    }
}

/// A stored job naming no fleet this server knows is refused: not read (get, others) and not
/// taken over, never read as a local job.
#[tokio::test]
async fn a_job_naming_no_known_fleet_is_refused_not_read_as_local() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    let retention = RunRetention {
        max_runs: 100,
        max_days: 30,
    };
    let store = SqliteStore::new(path.clone(), retention, Events::default());
    store.jobs().started(job("known"));
    store.jobs().started(job("strange"));
    store.flush().await;
    // Both as a process that has ended had left them running.
    let mut ended = std::process::Command::new("true").spawn().unwrap();
    let dead = ended.id();
    ended.wait().unwrap();
    let db = rusqlite::Connection::open(&path).unwrap();
    db.execute("UPDATE jobs SET pid = ?1", [dead]).unwrap();
    db.execute("UPDATE jobs SET fleet = 'mars' WHERE id = 'strange'", [])
        .unwrap();
    drop(db);
    let reader = SqliteStore::new(path, retention, Events::default());
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
