//! Each signed-in user's own machines, in process against the fake serve and the SQLite store:
//! every machine-naming tool reaches only its holder's machine (a table a new tool cannot skip),
//! a create racing for another's name gives the racer nothing while its claim is in the store,
//! one user's creates at once stop at their limit, completion offers only their names; and who
//! holds each machine is forgotten once the machine is gone from its fleet (a session's end, a
//! lease's, an orphan sweep or a delete behind the server's back took it), so that the holdings
//! stay bounded by the machines that exist; a name held within the hour (a create still under
//! way) is kept, and a claim never made is forgotten after it even if a machine has its name.

use crate::common::fake_serve::FakeServe;
use smol_mcp::fleet::FleetKind;
use smol_mcp::protocol::Protocol;
use smol_mcp::store::{Hold, MachineClaim};

#[tokio::test]
async fn who_held_a_machine_gone_from_its_fleet_is_forgotten_after_an_hour() {
    let fake = FakeServe::start().await;
    fake.add_machine("live-box", "running");
    let runtime = tempfile::tempdir().unwrap();
    let protocol = signed_in_server(&fake, runtime.path(), &[]).await;
    let policy = &protocol.policy;
    let owners = policy.store.owners();
    for name in ["live-box", "gone-box"] {
        assert!(matches!(
            owners
                .claim(Hold::new(FleetKind::Local, name, "alice"), 0)
                .await
                .unwrap(),
            MachineClaim::Claimed { .. }
        ));
        owners
            .made(Hold::new(FleetKind::Local, name, "alice"))
            .await
            .unwrap();
    }
    // A claim left in the making (its process died, or could not let it go) on the name of a
    // machine that exists: that machine is not the claimer's.
    fake.add_machine("raced-box", "running");
    assert!(matches!(
        owners
            .claim(Hold::new(FleetKind::Local, "raced-box", "bob"), 0)
            .await
            .unwrap(),
        MachineClaim::Claimed { .. }
    ));
    let now = chrono::Utc::now().timestamp_millis();
    assert_eq!(
        policy.forget_gone_owners_once(now).await,
        0,
        "held within the hour: perhaps a create under way"
    );
    assert_eq!(policy.forget_gone_owners_once(now + 2 * 3_600_000).await, 2);
    assert!(
        owners
            .held_since(FleetKind::Local)
            .await
            .unwrap()
            .iter()
            .all(|h| h.machine != "raced-box")
    );
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

use crate::common::mcp::{call_as, naming, signed_in_server};
use serde_json::{Value, json};
use smol_mcp::policy::tools::Tool;
use smol_mcp::policy::user::User;
use std::sync::Arc;

/// The engine's requests that touched machine `name` (its own path, not the create of a name).
fn touching(requests: &[Value], name: &str) -> Vec<String> {
    let own = format!("/api/v1/machines/{name}");
    requests
        .iter()
        .filter_map(|r| {
            let path = r["path"].as_str()?;
            (path == own || path.starts_with(&format!("{own}/")))
                .then(|| format!("{} {path}", r["method"].as_str().unwrap_or("")))
        })
        .collect()
}

/// A signed-in server on the fake engine holding the operator's `op-box` and alice's
/// `alice-box`.
async fn operator_and_alice() -> (FakeServe, tempfile::TempDir, Arc<Protocol>) {
    let fake = FakeServe::start().await;
    fake.add_machine("op-box", "running");
    let runtime = tempfile::tempdir().unwrap();
    let protocol = signed_in_server(&fake, runtime.path(), &[]).await;
    call_as(
        &protocol.policy,
        "alice",
        Tool::CreateMachine,
        json!({"name": "alice-box"}),
    )
    .await
    .unwrap();
    (fake, runtime, protocol)
}

fn refused_as_missing(answer: &Result<Value, String>, tool: Tool, name: &str) {
    let text = answer
        .as_ref()
        .err()
        .unwrap_or_else(|| panic!("{} on {name} was let through: {answer:?}", tool.name()));
    // A create of a name in use is refused as taken (a user's) or by the engine (the
    // operator's, which the store does not hold): either says only that the name is in use.
    let refused = if tool == Tool::CreateMachine {
        text.contains("is taken on this fleet") || text.contains("already exists")
    } else {
        text.starts_with("NOT_FOUND")
    };
    assert!(
        refused && text.contains(name),
        "{} on {name}: {text}",
        tool.name()
    );
}

/// Every machine-naming tool of the table, as the holder, another user and the operator: only
/// the holder reaches a user's machine, only the operator reaches the operator's, and the
/// engine hears nothing of a refused call.
#[tokio::test]
async fn every_machine_naming_tool_reaches_only_its_holders_machine() {
    let (fake, _runtime, protocol) = operator_and_alice().await;
    let policy = &protocol.policy;
    fake.take_requests();
    let mut named = 0;
    for tool in Tool::ALL.iter().copied() {
        for (user, name) in [("bob", "alice-box"), ("bob", "op-box"), ("", "alice-box")] {
            let Some(args) = naming(tool, name) else {
                continue;
            };
            named += 1;
            let answer = call_as(policy, user, tool, args).await;
            refused_as_missing(&answer, tool, name);
        }
        let Some(args) = naming(tool, "alice-box") else {
            continue;
        };
        // The holder is not refused as if the machine did not exist (the tool may still
        // fail for its own reasons against the fake).
        if tool != Tool::CreateMachine && tool != Tool::DeleteMachine {
            let answer = call_as(policy, "alice", tool, args).await;
            if let Err(text) = &answer {
                assert!(
                    !text.contains("no machine \"alice-box\""),
                    "{}: {text}",
                    tool.name()
                );
            }
        }
    }
    assert!(named >= 14 * 3, "the table named machines in {named} calls");
    let requests = fake.take_requests();
    // Only alice's own calls reached her machine; none reached the operator's.
    assert_eq!(touching(&requests, "op-box"), Vec::<String>::new());
    let operator_after = call_as(
        policy,
        "",
        Tool::RunCommand,
        naming(Tool::RunCommand, "op-box").unwrap(),
    )
    .await;
    assert!(operator_after.is_ok(), "{operator_after:?}");
}

/// The finding of the fifth hardening round: a signed-in user sends create-machine with the
/// name of the operator's machine and, while the engine takes its time to answer "already
/// exists", fires every machine-naming tool at that name. The claim of the name is in the
/// store all that while (read in the loop), and gives the racer nothing: every call answers
/// NOT_FOUND and the engine sees no request on the operator's machine but the operator's.
#[tokio::test]
async fn a_create_racing_for_the_operators_machine_gives_the_racer_nothing() {
    let fake = FakeServe::start().await;
    fake.add_machine("op-box", "running");
    fake.add_machine("op-other", "running");
    fake.state.lock().unwrap().create_delay = Some(std::time::Duration::from_millis(1500));
    let runtime = tempfile::tempdir().unwrap();
    let protocol = signed_in_server(&fake, runtime.path(), &[]).await;
    let policy = protocol.policy.clone();
    for target in ["op-box", "op-other"] {
        let racer = {
            let policy = policy.clone();
            tokio::spawn(async move {
                call_as(&policy, "bob", Tool::CreateMachine, json!({"name": target})).await
            })
        };
        let mut while_claimed = 0;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while !racer.is_finished() && tokio::time::Instant::now() < deadline {
            let claimed = policy
                .store
                .owners()
                .held_since(FleetKind::Local)
                .await
                .unwrap()
                .iter()
                .any(|h| h.machine == target && !h.made);
            for tool in Tool::ALL
                .iter()
                .copied()
                .filter(|t| *t != Tool::CreateMachine)
            {
                let Some(args) = naming(tool, target) else {
                    continue;
                };
                let answer = call_as(&policy, "bob", tool, args).await;
                refused_as_missing(&answer, tool, target);
            }
            if claimed {
                while_claimed += 1;
            }
        }
        let created = racer.await.unwrap();
        let text = created.unwrap_err();
        assert!(text.contains("already exists"), "{text}");
        assert!(
            while_claimed > 0,
            "no round of calls ran while bob's claim of {target} was in the store"
        );
        assert_eq!(
            policy
                .store
                .owners()
                .holder(FleetKind::Local, target)
                .await
                .unwrap(),
            None
        );
    }
    let requests = fake.take_requests();
    assert_eq!(
        touching(&requests, "op-box"),
        Vec::<String>::new(),
        "bob reached the operator's machine"
    );
    assert_eq!(touching(&requests, "op-other"), Vec::<String>::new());
    // The operator's machines are still theirs, and still there.
    let ran = call_as(
        &policy,
        "",
        Tool::RunCommand,
        naming(Tool::RunCommand, "op-box").unwrap(),
    )
    .await;
    assert!(ran.is_ok(), "{ran:?}");
    let listed = call_as(&policy, "", Tool::ListMachines, json!({}))
        .await
        .unwrap();
    assert_eq!(listed["machines"].as_array().unwrap().len(), 2, "{listed}");
}

/// `maxMachinesPerUser` 2 and ten creates at once by one user: two are made, eight refused
/// before anything is sent, whichever finishes first; another user is not counted with them.
#[tokio::test]
async fn ten_creates_at_once_by_one_user_make_only_their_limit() {
    let fake = FakeServe::start().await;
    fake.state.lock().unwrap().create_delay = Some(std::time::Duration::from_millis(300));
    let runtime = tempfile::tempdir().unwrap();
    let protocol = signed_in_server(
        &fake,
        runtime.path(),
        &[("SMOL_MCP_MAX_MACHINES_PER_USER", "2")],
    )
    .await;
    let policy = protocol.policy.clone();
    let calls = (0..10).map(|i| {
        let policy = policy.clone();
        async move {
            call_as(
                &policy,
                "carol",
                Tool::CreateMachine,
                json!({"name": format!("carol-{i}")}),
            )
            .await
        }
    });
    let answers = futures::future::join_all(calls).await;
    let made = answers.iter().filter(|a| a.is_ok()).count();
    assert_eq!(made, 2, "{answers:?}");
    for refusal in answers.iter().filter_map(|a| a.as_ref().err()) {
        // The count in the words is every claim in the store at that moment, racing
        // refusals not yet let go among them.
        assert!(
            refusal.starts_with(
                "LIMIT_REACHED: your machines on the local fleet (existing or being made): "
            ) && refusal.contains("this server allows 2 a user (maxMachinesPerUser)"),
            "{refusal}"
        );
    }
    let creates = fake
        .take_requests()
        .iter()
        .filter(|r| r["method"] == "POST" && r["path"] == "/api/v1/machines")
        .count();
    assert_eq!(creates, 2, "a refused create sent nothing");
    // Another user's creates are their own count.
    call_as(
        &policy,
        "dave",
        Tool::CreateMachine,
        json!({"name": "dave-0"}),
    )
    .await
    .unwrap();
    // And a refused create let its claim go: a third name after a delete is made.
    let first = answers.iter().position(|a| a.is_ok()).unwrap();
    call_as(
        &policy,
        "carol",
        Tool::DeleteMachine,
        json!({"name": format!("carol-{first}")}),
    )
    .await
    .unwrap();
    call_as(
        &policy,
        "carol",
        Tool::CreateMachine,
        json!({"name": "carol-again"}),
    )
    .await
    .unwrap();
}

/// One user's claims are taken one at a time: of ten at once, each sees all those before it,
/// so the names they answer with count 1 to 10, each once.
#[tokio::test]
async fn one_users_claims_each_see_every_claim_before_them() {
    let fake = FakeServe::start().await;
    let runtime = tempfile::tempdir().unwrap();
    let protocol = signed_in_server(&fake, runtime.path(), &[]).await;
    let store = protocol.policy.store.clone();
    let claims = (0..10).map(|i| {
        let store = store.clone();
        async move {
            store
                .owners()
                .claim(Hold::new(FleetKind::Local, format!("n-{i}"), "erin"), 0)
                .await
                .unwrap()
        }
    });
    let mut counts: Vec<usize> = futures::future::join_all(claims)
        .await
        .into_iter()
        .map(|claim| match claim {
            MachineClaim::Claimed { theirs } => theirs.len(),
            MachineClaim::Held(who) => panic!("held by {who}"),
        })
        .collect();
    counts.sort_unstable();
    assert_eq!(counts, (1..=10).collect::<Vec<_>>());
    // None is anyone's machine until made.
    assert_eq!(
        store
            .owners()
            .holder(FleetKind::Local, "n-3")
            .await
            .unwrap(),
        None
    );
    assert!(
        store
            .owners()
            .held(FleetKind::Local)
            .await
            .unwrap()
            .is_empty()
    );
    store
        .owners()
        .made(Hold::new(FleetKind::Local, "n-3", "erin"))
        .await
        .unwrap();
    assert_eq!(
        store
            .owners()
            .holder(FleetKind::Local, "n-3")
            .await
            .unwrap()
            .as_deref(),
        Some("erin")
    );
}

/// completion/complete offers a signed-in user only their own machines' names.
#[tokio::test]
async fn completion_offers_only_the_users_own_machines() {
    let (_fake, _runtime, protocol) = operator_and_alice().await;
    call_as(
        &protocol.policy,
        "bob",
        Tool::CreateMachine,
        json!({"name": "bob-box"}),
    )
    .await
    .unwrap();
    let offered = |user: User| {
        let protocol = protocol.clone();
        async move {
            let request: rmcp::model::CompleteRequestParams = serde_json::from_value(json!({
                "ref": {"type": "ref/resource", "uri": smol_mcp::protocol::resources::LOGS_TEMPLATE},
                "argument": {"name": "name", "value": ""}
            }))
            .unwrap();
            smol_mcp::protocol::resources::complete(&protocol, &request, &user)
                .await
                .unwrap()
                .completion
                .values
        }
    };
    assert_eq!(offered(User::signed_in("bob")).await, ["bob-box"]);
    assert_eq!(offered(User::signed_in("alice")).await, ["alice-box"]);
    assert_eq!(offered(User::operator()).await, ["op-box"]);
}

/// With sign-in, host directories are each user's: a `mountAllow` entry naming `{user}` is
/// the signed-in user's own directory, and the entries without it are the operator's alone;
/// a mount (or a workspace) of another user's directory is refused before anything is sent.
#[tokio::test]
async fn host_directories_are_each_users_own_under_sign_in() {
    let fake = FakeServe::start().await;
    let runtime = tempfile::tempdir().unwrap();
    let homes = tempfile::tempdir().unwrap();
    let root = homes.path().canonicalize().unwrap();
    for dir in ["users/alice", "users/bob", "shared"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    let per_user = format!("{}/users/{{user}}", root.display());
    let shared = format!("{}/shared", root.display());
    let allow = format!("{per_user},{shared}");
    let protocol = signed_in_server(
        &fake,
        runtime.path(),
        &[
            ("SMOL_MCP_MOUNT_ALLOW", allow.as_str()),
            ("SMOL_MCP_MOUNT_WRITABLE", per_user.as_str()),
        ],
    )
    .await;
    let policy = &protocol.policy;
    let mount = |source: &std::path::Path, readonly: bool| json!({"mounts": [{"source": source.display().to_string(), "target": "/data", "readonly": readonly}]});
    let alice_dir = root.join("users/alice");
    let bob_dir = root.join("users/bob");
    call_as(
        policy,
        "alice",
        Tool::CreateMachine,
        mount(&alice_dir, false),
    )
    .await
    .unwrap();
    call_as(policy, "bob", Tool::CreateMachine, mount(&bob_dir, true))
        .await
        .unwrap();
    fake.take_requests();
    for (user, dir, readonly) in [
        ("bob", &alice_dir, true),
        ("bob", &alice_dir.join("."), true),
        ("bob", &bob_dir.join("../alice"), true),
        ("bob", &root.join("shared"), true),
        ("", &alice_dir, true),
    ] {
        let text = call_as(policy, user, Tool::CreateMachine, mount(dir, readonly))
            .await
            .unwrap_err();
        assert!(
            text.starts_with("INVALID_ARGUMENT: mounts[0].source:")
                && text.contains("not in a directory the operator allows mounting"),
            "{user:?} {}: {text}",
            dir.display()
        );
        assert!(!text.contains("users/alice,"), "{text}");
    }
    // The workspace is held to the same directories.
    let text = call_as(
        policy,
        "bob",
        Tool::CreateMachine,
        json!({"workspace": alice_dir.display().to_string()}),
    )
    .await
    .unwrap_err();
    assert!(text.starts_with("INVALID_ARGUMENT: workspace:"), "{text}");
    // The operator's own entry stays theirs.
    call_as(
        policy,
        "",
        Tool::CreateMachine,
        mount(&root.join("shared"), true),
    )
    .await
    .unwrap();
    let creates: Vec<Value> = fake
        .take_requests()
        .into_iter()
        .filter(|r| r["method"] == "POST" && r["path"] == "/api/v1/machines")
        .collect();
    assert_eq!(
        creates.len(),
        1,
        "a refused create sent nothing: {creates:?}"
    );
    // An id that cannot be one directory's name reaches none.
    let text = call_as(policy, "../bob", Tool::CreateMachine, mount(&bob_dir, true))
        .await
        .unwrap_err();
    assert!(
        text.contains("your user id cannot name a directory"),
        "{text}"
    );
}

/// With sign-in, an event about a machine (an orphan deleted, a kept machine taken back) is
/// heard only by the user who holds it (the operator: one no user holds); an event about no
/// machine, by everyone.
#[tokio::test]
async fn a_machines_events_reach_only_its_holder() {
    use smol_mcp::process::events::ServerEvent;
    use smol_mcp::protocol::server::notify::Audience;
    let (_fake, _runtime, protocol) = operator_and_alice().await;
    let about = |machine: &str| {
        ServerEvent::info("orphansDeleted", format!("deleted machine {machine}"))
            .with("fleet", "local")
            .with("machine", machine.to_owned())
    };
    let general = ServerEvent::info("localServe", "started a serve");
    let hears = |user: User, event: ServerEvent| {
        let audience = Audience::new(protocol.policy.clone(), user);
        async move { audience.hears(&event).await }
    };
    assert!(hears(User::signed_in("alice"), about("alice-box")).await);
    assert!(!hears(User::signed_in("bob"), about("alice-box")).await);
    assert!(!hears(User::operator(), about("alice-box")).await);
    assert!(hears(User::operator(), about("op-box")).await);
    assert!(!hears(User::signed_in("bob"), about("op-box")).await);
    for user in [User::operator(), User::signed_in("bob")] {
        assert!(hears(user, general.clone()).await);
    }
}

/// The machines view (view-state, for a client that shows views) lists only its user's
/// machines under sign-in, as list-machines does: alice her own, bob none, neither the
/// operator's.
#[tokio::test]
async fn the_machines_view_shows_only_its_users_machines() {
    use smol_mcp::policy::tools::{Caller, Scope};
    use smol_mcp::protocol::server::consent::SealedViews;
    let (_fake, _runtime, protocol) = operator_and_alice().await;
    let policy = &protocol.policy;
    for (user, expected) in [("alice", vec!["alice-box"]), ("bob", vec![])] {
        let who = User::signed_in(user);
        let seal = Arc::new(SealedViews::new(policy.store.clone(), who.clone()));
        let caller = Caller::new(
            format!("session-of-{user}"),
            Scope::Process(policy.process.mode),
            tokio_util::sync::CancellationToken::new(),
        )
        .for_user(who)
        .with_views(Some(seal));
        let listed = smol_mcp::policy::tools::call(
            policy,
            caller,
            Tool::ViewState,
            json!({"view": "machines"}),
        )
        .await
        .unwrap()
        .structured;
        let names: Vec<&str> = listed["machines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, expected, "{user}: {listed}");
    }
}
