//! The blocked-egress report: a command that fails on a local machine whose egress is
//! allow-listed carries the egress the engine refused while it ran (`blockedEgress`), read from
//! `GET /api/v1/machines/{name}/egress-events`. Against the fake serve through an MCP client,
//! and the route itself against the real 1.32.2 serve (which answers it without booting).

use crate::common::clients;
use crate::common::fake_serve::FakeServe;
use crate::common::mcp::Harness;
use crate::common::real_serve::RealServe;
use serde_json::{Value, json};
use smol_mcp::fleet::transport::LocalEndpoint;
use smol_mcp::fleet::{CreateSpec, Egress, ErrorKind, FleetApi, LocalFleet};
use std::time::{Duration, SystemTime};

async fn setup() -> (FakeServe, Harness) {
    let fake = FakeServe::start().await;
    let h = Harness::on_fake(&fake, &[]).await;
    (fake, h)
}

/// `at` as the engine stamps a refusal: RFC 3339 with microseconds.
fn stamp(at: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(at).to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// The egress-events requests among those the fake recorded.
fn events_requests(requests: &[Value]) -> Vec<&Value> {
    requests
        .iter()
        .filter(|r| r["path"].as_str().unwrap().ends_with("/egress-events"))
        .collect()
}

async fn create(h: &Harness, name: &str, egress: Value) -> Value {
    let mut args = json!({"name": name, "image": "alpine"});
    args.as_object_mut()
        .unwrap()
        .extend(egress.as_object().unwrap().clone());
    h.ok("create-machine", args).await
}

#[tokio::test]
async fn a_failed_command_reports_the_refusals_of_its_run_grouped_and_counted() {
    let (fake, h) = setup().await;
    let created = create(&h, "allowed", json!({"allowHosts": ["pypi.org"]})).await;
    assert_eq!(created["machine"]["network"], "allow(pypi.org)");
    let now = SystemTime::now();
    // Refusals before the command and after it (by the clock), and one the engine could not
    // place in time: none of them is the command's.
    fake.push_egress_denial(
        "allowed",
        &stamp(now - Duration::from_secs(60)),
        "connect",
        "10.9.9.9:22",
    );
    fake.push_egress_denial("allowed", "", "connect", "10.8.8.8:22");
    // Refused first, but once: listed after the destination refused twice.
    fake.deny_on_exec("allowed", "sendto", "[2001:db8::1]:123");
    fake.deny_on_exec("allowed", "connect", "151.101.0.223:443");
    fake.deny_on_exec("allowed", "connect", "151.101.0.223:443");
    fake.take_requests();

    let failed = h
        .ok(
            "run-command",
            json!({"name": "allowed", "command": "exit 7"}),
        )
        .await;
    assert_eq!(failed["exitCode"], 7);
    assert_eq!(
        failed["blockedEgress"],
        json!([
            {"host": "151.101.0.223", "port": 443, "operation": "connect", "count": 2},
            {"host": "2001:db8::1", "port": 123, "operation": "sendto", "count": 1},
        ])
    );
    let requests = fake.take_requests();
    let asked = events_requests(&requests);
    // The readiness probe ran on the machine moments before, so a baseline was read first.
    assert_eq!(asked.len(), 2, "{requests:#?}");
    for a in &asked {
        assert_eq!(a["method"], "GET");
        assert_eq!(a["path"], "/api/v1/machines/allowed/egress-events");
        assert_eq!(a["query"], "limit=1000");
    }

    // The first run's refusals, stamped well before the next one (commands back to back fall
    // within the clock slack of each other), and one stamped after it (a clock an hour ahead):
    // none is the next command's; the same destinations refused again count for it alone.
    let first_run = fake
        .state
        .lock()
        .unwrap()
        .egress_events
        .remove("allowed")
        .unwrap();
    for event in first_run {
        let at = event["timestamp"].as_str().unwrap();
        let earlier = match chrono::DateTime::parse_from_rfc3339(at) {
            Ok(t) => stamp(SystemTime::from(t) - Duration::from_secs(30)),
            Err(_) => String::new(),
        };
        fake.push_egress_denial(
            "allowed",
            &earlier,
            event["operation"].as_str().unwrap(),
            event["dest"].as_str().unwrap(),
        );
    }
    fake.push_egress_denial(
        "allowed",
        &stamp(SystemTime::now() + Duration::from_secs(3600)),
        "connect",
        "10.7.7.7:22",
    );
    let timed_out = h
        .ok(
            "run-command",
            json!({"name": "allowed", "command": "sleep 5", "timeoutSecs": 1}),
        )
        .await;
    assert_eq!(timed_out["timedOut"], true, "{timed_out}");
    assert_eq!(
        timed_out["blockedEgress"],
        json!([
            {"host": "151.101.0.223", "port": 443, "operation": "connect", "count": 2},
            {"host": "2001:db8::1", "port": 123, "operation": "sendto", "count": 1},
        ]),
        "a timeout is a failure too, and earlier runs' refusals stay out"
    );
}

/// The engine stamps refusals in whole seconds and gives them no id: a command right after
/// another on the same machine shares its second, and only the baseline read before it keeps
/// the earlier command's refusals (a name refused at lookup among them) out of its report.
#[tokio::test]
async fn back_to_back_commands_each_report_only_their_own_refusals() {
    let (fake, h) = setup().await;
    create(&h, "twice", json!({"allowHosts": ["pypi.org"]})).await;
    fake.deny_on_exec("twice", "resolve", "example.com");
    let first = h
        .ok("run-command", json!({"name": "twice", "command": "exit 1"}))
        .await;
    assert_eq!(
        first["blockedEgress"],
        json!([{"host": "example.com", "operation": "resolve", "count": 1}])
    );
    fake.state.lock().unwrap().denials_on_exec.clear();
    fake.deny_on_exec("twice", "connect", "1.1.1.1:443");
    let second = h
        .ok("run-command", json!({"name": "twice", "command": "exit 1"}))
        .await;
    assert_eq!(
        second["blockedEgress"],
        json!([{"host": "1.1.1.1", "port": 443, "operation": "connect", "count": 1}]),
        "the first command's refusal, stamped in the same second, is not the second's"
    );
}

/// An engine on another clock (a serve elsewhere; the nested engine's QEMU guest was seen most
/// of a second off, and a refusal at the start of a short command fell out of its report): the
/// stamps are placed by the answer's `Date`, not read as this host's time.
#[tokio::test]
async fn an_engine_on_another_clock_still_reports_the_commands_own_refusals() {
    let (fake, h) = setup().await;
    fake.state.lock().unwrap().engine_clock_behind = Duration::from_secs(3);
    create(&h, "late", json!({"allowHosts": ["pypi.org"]})).await;
    fake.deny_on_exec("late", "resolve", "example.com");
    let first = h
        .ok("run-command", json!({"name": "late", "command": "exit 1"}))
        .await;
    assert_eq!(
        first["blockedEgress"],
        json!([{"host": "example.com", "operation": "resolve", "count": 1}]),
        "{first}"
    );
    fake.state.lock().unwrap().denials_on_exec.clear();
    fake.deny_on_exec("late", "connect", "1.1.1.1:443");
    let second = h
        .ok("run-command", json!({"name": "late", "command": "exit 1"}))
        .await;
    assert_eq!(
        second["blockedEgress"],
        json!([{"host": "1.1.1.1", "port": 443, "operation": "connect", "count": 1}]),
        "{second}"
    );
}

#[tokio::test]
async fn a_blocked_run_once_machine_is_asked_before_it_is_deleted() {
    let (fake, h) = setup().await;
    fake.deny_on_exec("*", "connect", "93.184.215.14:80");
    let failed = h
        .ok(
            "run-once",
            json!({"image": "alpine", "allowHosts": ["pypi.org"], "command": "exit 1"}),
        )
        .await;
    assert_eq!(failed["exitCode"], 1);
    assert_eq!(
        failed["blockedEgress"],
        json!([{"host": "93.184.215.14", "port": 80, "operation": "connect", "count": 1}])
    );
    let requests = fake.take_requests();
    let position = |wanted: &dyn Fn(&Value) -> bool| requests.iter().position(wanted).unwrap();
    let asked = position(&|r| r["path"].as_str().unwrap().ends_with("/egress-events"));
    let deleted = position(&|r| r["method"] == "DELETE");
    assert!(asked < deleted, "{requests:#?}");
}

#[tokio::test]
async fn a_command_that_succeeds_carries_no_report_and_asks_nothing() {
    let (fake, h) = setup().await;
    create(&h, "blocked", json!({})).await;
    fake.deny_on_exec("blocked", "connect", "1.1.1.1:443");
    fake.take_requests();
    let done = h
        .ok("run-command", json!({"name": "blocked", "command": "true"}))
        .await;
    assert_eq!(done["exitCode"], 0);
    assert!(done.get("blockedEgress").is_none(), "{done}");
    assert!(events_requests(&fake.take_requests()).is_empty());

    let once = h
        .ok("run-once", json!({"image": "alpine", "command": "true"}))
        .await;
    assert!(once.get("blockedEgress").is_none(), "{once}");
    assert!(events_requests(&fake.take_requests()).is_empty());
}

#[tokio::test]
async fn an_open_machine_gets_no_report_and_no_events_request() {
    let (fake, h) = setup().await;
    create(&h, "open", json!({"network": "open"})).await;
    fake.deny_on_exec("*", "connect", "1.1.1.1:443");
    fake.take_requests();
    let failed = h
        .ok("run-command", json!({"name": "open", "command": "exit 2"}))
        .await;
    assert_eq!(failed["exitCode"], 2);
    assert!(failed.get("blockedEgress").is_none(), "{failed}");
    assert!(events_requests(&fake.take_requests()).is_empty());

    let once = h
        .ok(
            "run-once",
            json!({"image": "alpine", "network": "open", "command": "exit 2"}),
        )
        .await;
    assert!(once.get("blockedEgress").is_none(), "{once}");
    assert!(events_requests(&fake.take_requests()).is_empty());
}

#[tokio::test]
async fn nothing_refused_in_the_run_leaves_the_field_out() {
    let (fake, h) = setup().await;
    create(&h, "quiet", json!({"allowHosts": ["pypi.org"]})).await;
    fake.push_egress_denial(
        "quiet",
        &stamp(SystemTime::now() - Duration::from_secs(60)),
        "connect",
        "1.1.1.1:443",
    );
    let failed = h
        .ok("run-command", json!({"name": "quiet", "command": "exit 1"}))
        .await;
    assert!(failed.get("blockedEgress").is_none(), "{failed}");
    // A baseline (the readiness probe ran moments before) and the report.
    assert_eq!(events_requests(&fake.take_requests()).len(), 2);
}

/// A blocked machine has no network at all: its guest sees "Network unreachable" and the
/// engine records nothing (the real 1.32.2 guest), so it is not asked.
#[tokio::test]
async fn a_blocked_machine_is_not_asked() {
    let (fake, h) = setup().await;
    create(&h, "sealed", json!({})).await;
    fake.take_requests();
    let failed = h
        .ok(
            "run-command",
            json!({"name": "sealed", "command": "exit 1"}),
        )
        .await;
    assert!(failed.get("blockedEgress").is_none(), "{failed}");
    assert!(events_requests(&fake.take_requests()).is_empty());
}

#[tokio::test]
async fn a_failing_events_route_leaves_the_result_intact() {
    let (fake, h) = setup().await;
    create(&h, "broken", json!({"allowCidrs": ["10.0.0.0/8"]})).await;
    fake.deny_on_exec("*", "connect", "1.1.1.1:443");
    fake.state.lock().unwrap().egress_events_fail = true;
    fake.set_exec(|request| {
        if request["command"][0] == "echo" {
            return crate::common::fake_serve::default_exec(request);
        }
        crate::common::fake_serve::exec_response(5, b"partial\n", b"curl: (7) failed\n")
    });
    fake.take_requests();
    let failed = h
        .ok(
            "run-command",
            json!({"name": "broken", "command": "curl https://1.1.1.1"}),
        )
        .await;
    assert_eq!(failed["exitCode"], 5);
    assert_eq!(failed["stdout"], "partial\n");
    assert_eq!(failed["stderr"], "curl: (7) failed\n");
    assert_eq!(failed["timedOut"], false);
    assert!(failed.get("blockedEgress").is_none(), "{failed}");
    assert_eq!(
        events_requests(&fake.take_requests()).len(),
        2,
        "it was asked (a baseline, then the report), and failed"
    );
    // The same run with the route answering: the report is there.
    fake.state.lock().unwrap().egress_events_fail = false;
    let once = h
        .ok(
            "run-once",
            json!({"image": "alpine", "allowCidrs": ["10.0.0.0/8"], "command": "curl https://1.1.1.1"}),
        )
        .await;
    assert_eq!(once["exitCode"], 5);
    assert_eq!(
        once["blockedEgress"],
        json!([{"host": "1.1.1.1", "port": 443, "operation": "connect", "count": 1}])
    );
}

// ---- the route against the real serve --------------------------------------------------------

/// The answer to a GET, as status, content type and body (JSON compared as values: the fake's
/// keys come out sorted).
async fn get(endpoint: &LocalEndpoint, path: &str) -> (u16, String, Value) {
    let http = endpoint.http_client().unwrap();
    let response = http
        .get(format!("{}{path}", endpoint.base_url()))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_owned())
        .unwrap_or_default();
    let text = response.text().await.unwrap();
    let body = match content_type.as_str() {
        "application/json" => serde_json::from_str(&text).unwrap(),
        _ => Value::String(text),
    };
    (status, content_type, body)
}

/// Where the real serve keeps a machine's files: the directory under its state dir whose `name`
/// file holds the machine's name (the directory itself is named by a hash).
fn machine_dir(serve: &RealServe, name: &str) -> std::path::PathBuf {
    let vms = serve.dir.path().join("state/.cache/smolvm/vms");
    std::fs::read_dir(&vms)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|dir| std::fs::read_to_string(dir.join("name")).is_ok_and(|n| n.trim() == name))
        .unwrap_or_else(|| panic!("no directory of {name} under {}", vms.display()))
}

#[tokio::test]
async fn the_route_answers_as_the_real_serve_and_reads_as_the_engine_records() {
    let real = RealServe::start().await;
    let fake = FakeServe::start().await;
    let endpoints = [real.endpoint.clone(), fake.endpoint()];
    for endpoint in &endpoints {
        let fleet = LocalFleet::new(endpoint.clone()).unwrap();
        let mut spec = CreateSpec::new("held", "alpine");
        spec.cpus = 1;
        spec.memory_mb = 512;
        spec.egress = Egress::Allow {
            hosts: vec!["pypi.org".into()],
            cidrs: vec![],
        };
        fleet.create(&spec).await.unwrap();
        // A machine that never booted has no refusals; an unknown one is NOT_FOUND.
        assert!(fleet.egress_denials("held", 200).await.unwrap().is_empty());
        let unknown = fleet.egress_denials("nope", 200).await.unwrap_err();
        assert_eq!(unknown.kind, ErrorKind::NotFound);
        assert_eq!(unknown.upstream_code.as_deref(), Some("NOT_FOUND"));
    }
    let m = "/api/v1/machines";
    for path in [
        format!("{m}/nope/egress-events"),
        format!("{m}/held/egress-events"),
        format!("{m}/held/egress-events?limit=0"),
        format!("{m}/held/egress-events?limit=abc"),
        format!("{m}/held/egress-events?limit=-1"),
    ] {
        let real_seen = get(&endpoints[0], &path).await;
        let fake_seen = get(&endpoints[1], &path).await;
        assert_eq!(real_seen, fake_seen, "{path}");
    }

    // The engine reads the refusals libkrun logs into the machine's `egress-denials.log`
    // ("egress policy denied connect to <addr>" / "... sendto <addr>", smol-machines/libkrun
    // src/devices/src/virtio/vsock/muxer.rs, the address as nix's `SockaddrStorage` prints it).
    // Lines in the logger's `[<time> LEVEL target] message` form carry their time; a line
    // without it is an event with an empty timestamp.
    let first = SystemTime::now() - Duration::from_secs(3);
    let second = SystemTime::now();
    let log = format!(
        "[{} WARN  devices::virtio::vsock::muxer] egress policy denied connect to 151.101.0.223:443\n\
         [{} WARN  devices::virtio::vsock::muxer] egress policy denied sendto [2001:db8::1]:123\n\
         egress policy denied connect to 10.0.0.1:22\n",
        stamp(first),
        stamp(second),
    );
    std::fs::write(machine_dir(&real, "held").join("egress-denials.log"), log).unwrap();
    fake.push_egress_denial("held", &stamp(first), "connect", "151.101.0.223:443");
    fake.push_egress_denial("held", &stamp(second), "sendto", "[2001:db8::1]:123");
    fake.push_egress_denial("held", "", "connect", "10.0.0.1:22");
    for path in [
        format!("{m}/held/egress-events"),
        format!("{m}/held/egress-events?limit=2"),
    ] {
        let real_seen = get(&endpoints[0], &path).await;
        assert_eq!(real_seen.0, 200);
        assert_eq!(real_seen, get(&endpoints[1], &path).await, "{path}");
    }

    let fleet = LocalFleet::new(real.endpoint.clone()).unwrap();
    let denials = fleet.egress_denials("held", 200).await.unwrap();
    let read: Vec<(Option<SystemTime>, &str, &str)> = denials
        .iter()
        .map(|d| (d.at, d.operation.as_str(), d.dest.as_str()))
        .collect();
    // Microseconds survive the round trip; the time is the one logged.
    let micros = |t: SystemTime| {
        let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        SystemTime::UNIX_EPOCH + Duration::from_micros(since.as_micros() as u64)
    };
    assert_eq!(
        read,
        [
            (Some(micros(first)), "connect", "151.101.0.223:443"),
            (Some(micros(second)), "sendto", "[2001:db8::1]:123"),
            (None, "connect", "10.0.0.1:22"),
        ]
    );
    // The newest are kept.
    let newest = fleet.egress_denials("held", 1).await.unwrap();
    assert_eq!(newest.len(), 1);
    assert_eq!(newest[0].dest, "10.0.0.1:22");
}

// ---- under real MCP clients --------------------------------------------------------------------

fn failing_calls() -> Value {
    json!([
        {"tool": "create-machine", "args": {"image": "alpine", "name": "clients", "allowHosts": ["pypi.org"]}},
        {"tool": "run-command", "args": {"name": "clients", "command": "pip install requests"}},
        {"tool": "run-once", "args": {"image": "alpine", "allowHosts": ["pypi.org"], "command": "pip install requests"}},
        {"tool": "delete-machine", "args": {"name": "clients"}}
    ])
}

fn check_failing_calls(report: &Value) {
    let calls = report["calls"].as_array().unwrap();
    for (i, call) in calls.iter().enumerate() {
        assert_eq!(call["isError"], false, "call {i}: {}", call["text"]);
    }
    for call in &calls[1..3] {
        assert_eq!(call["structured"]["exitCode"], 1, "{call}");
        assert_eq!(
            call["structured"]["blockedEgress"],
            json!([{"host": "151.101.0.223", "port": 443, "operation": "connect", "count": 1}]),
            "{call}"
        );
    }
}

fn pip_fails(fake: &FakeServe) {
    fake.deny_on_exec("*", "connect", "151.101.0.223:443");
    fake.set_exec(|request| {
        if request["command"][0] == "echo" {
            return crate::common::fake_serve::default_exec(request);
        }
        crate::common::fake_serve::exec_response(1, b"", b"ERROR: Could not find a version\n")
    });
}

/// The TypeScript SDK validates every structured result against the tool's output schema: a
/// result carrying blockedEgress passes it.
#[tokio::test]
async fn the_typescript_sdk_over_stdio_gets_the_report() {
    let fake = FakeServe::start().await;
    pip_fails(&fake);
    let rt = tempfile::tempdir().unwrap();
    let env = crate::common::stdio::server_env(rt.path(), &[("SMOL_LOCAL_URL", &fake.url())]);
    let plan = json!({
        "server": crate::common::stdio::SERVER, "env": clients::env_object(env), "calls": failing_calls()
    });
    check_failing_calls(&clients::run_node("ts_plan.mjs", &plan).await);
}

/// The Python client in its default mode (2026-07-28) over HTTP.
#[tokio::test]
async fn the_python_client_over_http_gets_the_report() {
    let fake = FakeServe::start().await;
    pip_fails(&fake);
    let rt = tempfile::tempdir().unwrap();
    let token = "egress-http-token";
    let mut server =
        clients::HttpServer::spawn(rt.path(), token, &[("SMOL_LOCAL_URL", &fake.url())]).await;
    let plan = json!({"url": server.url, "token": token, "mode": "auto", "calls": failing_calls()});
    check_failing_calls(&clients::run_python("tool_plan.py", &plan).await);
    server.child.start_kill().unwrap();
    server.child.wait().await.unwrap();
}
