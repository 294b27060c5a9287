//! With sign-in, who holds each machine is forgotten once the machine is gone from its fleet
//! (a session's end, a lease's, an orphan sweep or a delete behind the server's back took it),
//! so that the holdings stay bounded by the machines that exist; a name held within the hour
//! (a create still under way) is kept. In process, against the fake serve and the SQLite store.

use crate::common::fake_serve::FakeServe;
use crate::common::mcp::config;
use smol_mcp::fleet::FleetKind;
use smol_mcp::protocol::Protocol;
use smol_mcp::store::MachineClaim;

#[tokio::test]
async fn who_held_a_machine_gone_from_its_fleet_is_forgotten_after_an_hour() {
    let fake = FakeServe::start().await;
    fake.add_machine("live-box", "running");
    let runtime = tempfile::tempdir().unwrap();
    let url = fake.url();
    let protocol = Protocol::start(config(
        &[
            ("SMOL_LOCAL_URL", url.as_str()),
            ("SMOL_MCP_AUTH_ISSUER", "https://id.example"),
        ],
        &runtime.path().join("rt"),
    ))
    .unwrap();
    let policy = &protocol.policy;
    let owners = policy.store.owners();
    for name in ["live-box", "gone-box"] {
        assert_eq!(
            owners.claim(FleetKind::Local, name, "alice").await.unwrap(),
            MachineClaim::Claimed
        );
    }
    let now = chrono::Utc::now().timestamp_millis();
    assert_eq!(
        policy.forget_gone_owners_once(now).await,
        0,
        "held within the hour: perhaps a create under way"
    );
    assert_eq!(policy.forget_gone_owners_once(now + 2 * 3_600_000).await, 1);
    assert_eq!(
        owners.holder(FleetKind::Local, "gone-box").await.unwrap(),
        None
    );
    assert_eq!(
        owners
            .holder(FleetKind::Local, "live-box")
            .await
            .unwrap()
            .as_deref(),
        Some("alice")
    );
}
