//! The fake engine's fork pools and leases (`/api/v1/pools`), driven over its socket as the
//! real smolvm 1.32.2 answered them (facts: the pools findings): fill, acquire and refill, no
//! worker ready, idempotent replay, heartbeat, expiry, complete, a deleted worker, resize,
//! delete.

use crate::common::fake_serve::FakeServe;
use serde_json::{Value, json};
use std::time::Duration;

struct Api(reqwest::Client);

impl Api {
    fn new(fake: &FakeServe) -> Api {
        let http = reqwest::Client::builder().unix_socket(fake.socket.clone());
        Api(http.build().unwrap())
    }

    /// Status and body (JSON, or the text as a string); `Value::Null` sends no body.
    async fn call(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let url = format!("http://smolvm.local/api/v1/{path}");
        let mut request = self.0.request(method.parse().unwrap(), url);
        if !body.is_null() {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, body)
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call("POST", path, body).await
    }

    /// A lease on pool p1 under this key.
    async fn acquire(&self, key: &str) -> Value {
        let body = json!({ "idempotencyKey": key });
        self.post("pools/p1/leases", body).await.1
    }
}

fn machine(fake: &FakeServe, name: &str) -> Option<Value> {
    fake.state.lock().unwrap().machines.get(name).cloned()
}

/// Status and `error` of an answer.
fn err(answer: &(u16, Value)) -> (u16, String) {
    let message = answer.1["error"].as_str().unwrap_or_default();
    (answer.0, message.to_owned())
}

/// The named fields of an answer.
fn pick(v: &Value, keys: &[&str]) -> Value {
    keys.iter().map(|k| (k.to_string(), v[k].clone())).collect()
}

#[tokio::test]
async fn pool_fills_leases_refills_and_deletes() {
    let fake = FakeServe::start().await;
    let api = Api::new(&fake);
    fake.add_machine("stopped", "stopped");
    let create = |src: &str, n: u64| json!({"name": "p1", "source": src, "desiredReady": n});
    assert_eq!(api.post("pools", create("nope", 2)).await.0, 404);
    let refused = api.post("pools", create("stopped", 2)).await;
    let words = "golden machine 'stopped' is not running";
    assert_eq!(err(&refused), (409, words.to_owned()));
    fake.add_forkable("src");
    assert_eq!(api.post("pools", create("src", 0)).await.0, 400);
    let (status, pool) = api.post("pools", create("src", 2)).await;
    assert_eq!(status, 200, "{pool}");
    let shown = pick(&pool, &["ready", "golden", "leaseTtlSecs", "active"]);
    let want = json!({"ready": 2, "golden": "src", "leaseTtlSecs": 300, "active": 0});
    assert_eq!(shown, want);
    let sent = fake.take_requests().pop().unwrap();
    assert_eq!(sent["body"], create("src", 2));

    // Acquire: an active lease on a `pool-p1-` worker no longer held; the pool refills.
    let ask = json!({"idempotencyKey": "k1", "env": ["JOB=42"], "ttlSecs": 60});
    let (status, lease) = api.post("pools/p1/leases", ask.clone()).await;
    assert_eq!(
        (status, &lease["state"]),
        (200, &json!("active")),
        "{lease}"
    );
    let id = lease["id"].as_str().unwrap();
    let worker = lease["machine"].as_str().unwrap();
    assert!(id.starts_with("lease-") && id.len() == 22, "{id}");
    assert!(worker.starts_with("pool-p1-") && worker.len() == 16);
    let created = lease["createdAt"].as_u64().unwrap();
    assert_eq!(lease["expiresAt"].as_u64(), Some(created + 60));
    let info = api
        .call("GET", &format!("machines/{worker}"), Value::Null)
        .await;
    let shown = pick(&info.1, &["forkpointHeld", "parentMachine"]);
    assert_eq!(
        shown,
        json!({"forkpointHeld": false, "parentMachine": "src"})
    );
    let shown = pick(&fake.pool("p1").unwrap(), &["ready", "active"]);
    assert_eq!(shown, json!({"ready": 2, "active": 1}));
    // Later execs on the worker see the lease's env.
    fake.set_exec(|r| json!({"exitCode": 0, "stdout": r["env"].to_string(), "stderr": ""}));
    let exec = json!({"command": ["sh", "-c", "echo $JOB"]});
    let out = api.post(&format!("machines/{worker}/exec"), exec).await;
    assert_eq!(out.1["stdout"], r#"[{"name":"JOB","value":"42"}]"#);

    // Replay: the same lease; the key with another body: 409; no key: 422 text; TTL 10: 400.
    let replay = api.post("pools/p1/leases", ask.clone()).await;
    assert_eq!(replay, (200, lease.clone()));
    let other = json!({"idempotencyKey": "k1", "env": ["JOB=43"], "ttlSecs": 60});
    let conflict = api.post("pools/p1/leases", other).await;
    let words = "idempotencyKey was already used with a different assignment, payload, or TTL";
    assert_eq!(err(&conflict), (409, words.to_owned()));
    let (status, text) = api.post("pools/p1/leases", json!({})).await;
    assert_eq!(status, 422);
    let text = text.as_str().unwrap();
    assert!(text.contains("missing field `idempotencyKey`"), "{text}");
    let short = json!({"idempotencyKey": "k9", "ttlSecs": 10});
    assert_eq!(api.post("pools/p1/leases", short).await.0, 400);

    // Heartbeat: expiresAt = now + the lease's TTL.
    let lease_path = |id: &str, what: &str| format!("pools/p1/leases/{id}/{what}");
    let later = json!(created + 31);
    fake.state.lock().unwrap().leases.get_mut(id).unwrap().info["expiresAt"] = later;
    let beat = api.post(&lease_path(id, "heartbeat"), Value::Null).await;
    assert_eq!(beat.0, 200);
    assert!(
        beat.1["expiresAt"].as_u64() >= Some(created + 60),
        "{beat:?}"
    );

    // Complete deletes the worker; again is the same lease; a heartbeat then is 409.
    let done = api.post(&lease_path(id, "complete"), Value::Null).await;
    assert_eq!((done.0, &done.1["state"]), (200, &json!("completed")));
    assert!(machine(&fake, worker).is_none());
    let again = api.post(&lease_path(id, "complete"), Value::Null).await;
    assert_eq!(again, done);
    let late = api.post(&lease_path(id, "heartbeat"), Value::Null).await;
    let words = format!("fork lease '{id}' is no longer active");
    assert_eq!(err(&late), (409, words));
    let unknown = api
        .call("GET", "pools/p1/leases/lease-x", Value::Null)
        .await;
    let words = "fork lease 'lease-x' not found".to_owned();
    assert_eq!(err(&unknown), (404, words));

    // Deleting a leased worker fails its lease.
    let second = api.acquire("k2").await;
    let path = format!("machines/{}", second["machine"].as_str().unwrap());
    assert_eq!(api.call("DELETE", &path, Value::Null).await.0, 200);
    let failed = fake.lease(second["id"].as_str().unwrap()).unwrap();
    let shown = pick(&failed, &["state", "error"]);
    let want = json!({"state": "failed", "error": "leased worker process exited"});
    assert_eq!(shown, want);

    // A lease past expiresAt expires, its worker deleted; complete is then 409.
    let third = api.acquire("k3").await;
    let id3 = third["id"].as_str().unwrap();
    fake.state.lock().unwrap().leases.get_mut(id3).unwrap().info["expiresAt"] = json!(1);
    assert_eq!(fake.lease(id3).unwrap()["state"], "expired");
    assert!(machine(&fake, third["machine"].as_str().unwrap()).is_none());
    let expired = api.post(&lease_path(id3, "complete"), Value::Null).await;
    let words = format!("fork lease '{id3}' is 'expired', not active");
    assert_eq!(err(&expired), (409, words));

    // Delete: refused while a lease is active, then forced; every worker goes, the source stays.
    let fourth = api.acquire("k4").await;
    let busy = api.call("DELETE", "pools/p1", Value::Null).await;
    let words = "fork pool 'p1' has active leases; complete them or use force=true";
    assert_eq!(err(&busy), (409, words.to_owned()));
    let gone = api.call("DELETE", "pools/p1?force=true", Value::Null).await;
    assert_eq!(gone, (200, json!({"deleted": "p1"})));
    assert!(fake.pool("p1").is_none() && fake.lease(fourth["id"].as_str().unwrap()).is_none());
    let names: Vec<String> = fake.machine_names();
    assert_eq!(names, ["src", "stopped"]);
    assert_eq!(api.call("GET", "pools/p1", Value::Null).await.0, 404);
}

#[tokio::test]
async fn an_empty_pool_answers_503_until_its_refill_is_ready() {
    let fake = FakeServe::start().await;
    let api = Api::new(&fake);
    fake.add_forkable("src");
    let body = json!({"name": "p", "golden": "src", "desiredReady": 1, "freezeSource": true});
    assert_eq!(api.post("pools", body).await.0, 200);
    assert_eq!(machine(&fake, "src").unwrap()["state"], "frozen");
    fake.state.lock().unwrap().pool_fill_delay = Some(Duration::from_millis(300));
    let acquire = |key: &str, wait: u64| json!({"idempotencyKey": key, "waitSecs": wait});
    assert_eq!(api.post("pools/p/leases", acquire("a", 0)).await.0, 200);
    assert_eq!(fake.pool("p").unwrap()["provisioning"], 1);
    let none = api.post("pools/p/leases", acquire("b", 0)).await;
    let words = json!({"error": "fork pool 'p' has no clean worker ready", "code": "UNAVAILABLE"});
    assert_eq!(none, (503, words));
    // The key of a 503 was not used: with waitSecs it gets the refill once ready.
    let (status, lease) = api.post("pools/p/leases", acquire("b", 5)).await;
    assert_eq!((status, &lease["state"]), (200, &json!("active")));

    // Resize: down to none at once, up after the fill delay; over 256 is 400.
    let size = |n: u64| json!({ "desiredReady": n });
    let pool = api.call("PUT", "pools/p/size", size(0)).await.1;
    let counts = pick(&pool, &["ready", "provisioning"]);
    assert_eq!(counts, json!({"ready": 0, "provisioning": 0}));
    assert_eq!(api.call("PUT", "pools/p/size", size(257)).await.0, 400);
    let pool = api.call("PUT", "pools/p/size", size(2)).await.1;
    assert_eq!(pool["provisioning"], 2);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let list = api.call("GET", "pools", Value::Null).await.1;
    assert_eq!(list["pools"][0]["ready"], 2);

    // A source not started forkable is accepted, but its pool never fills (findings h1).
    fake.add_machine("plain", "running");
    let body = json!({"name": "q", "source": "plain", "desiredReady": 1});
    let (status, pool) = api.post("pools", body).await;
    assert_eq!(status, 200);
    let counts = pick(&pool, &["ready", "provisioning"]);
    assert_eq!(counts, json!({"ready": 0, "provisioning": 1}));
}
