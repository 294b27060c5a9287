//! A stand-in for the smol cloud control plane on wiremock: one stateful responder that follows
//! the service as it really behaves (reference/cloud-api-facts.md), quirks included: machines are
//! created stopped, start may answer an empty 202, error bodies are plain text, the record
//! rewrites the image reference, exec answers 200 whatever the exit code and starts a stopped
//! machine, files live under a path suffix. It records every request for snapshot tests.

use base64::Engine as _;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

pub const TOKEN: &str = "smk_test_token";

pub type CloudExecHook = Arc<dyn Fn(&Value) -> Value + Send + Sync>;

#[derive(Default)]
pub struct CloudState {
    pub requests: Vec<Value>,
    pub machines: BTreeMap<String, Value>,
    pub files: BTreeMap<(String, String), Vec<u8>>,
    pub events: BTreeMap<String, Vec<Value>>,
    pub exec_hook: Option<CloudExecHook>,
    pub deleted: Vec<String>,
    next_id: u64,
    next_request: u64,
    /// Quirks of older or other control planes, switched on per test.
    pub files_route_missing: bool,
    pub branches_route_missing: bool,
    pub delete_ignores_include_usage: bool,
    /// The account's status (`active` when unset).
    pub account_status: Option<String>,
}

#[derive(Clone)]
pub struct FakeCloud {
    pub server: Arc<MockServer>,
    pub state: Arc<Mutex<CloudState>>,
}

struct Responder(Arc<Mutex<CloudState>>);

pub fn record(id: &str, name: &str, state: &str) -> Value {
    json!({
        "id": id, "name": name, "state": state,
        "source": {"type": "image", "reference": "alpine:3.20"},
        "resources": {"cpus": 2, "memoryMb": 2048, "diskGb": null},
        "network": {"mode": "allowCidrs", "cidrs": ["192.0.2.0/24"]},
        "env": {}, "ephemeral": false, "ports": [], "url": null,
        "ready": state == "started", "branchable": false,
        "createdAt": "2026-09-08T14:47:37Z", "updatedAt": "2026-09-08T14:47:37Z"
    })
}

impl FakeCloud {
    pub async fn start() -> FakeCloud {
        let server = MockServer::start().await;
        let state = Arc::new(Mutex::new(CloudState::default()));
        Mock::given(any())
            .respond_with(Responder(state.clone()))
            .mount(&server)
            .await;
        FakeCloud {
            server: Arc::new(server),
            state,
        }
    }

    pub fn url(&self) -> String {
        self.server.uri()
    }

    pub fn take_requests(&self) -> Vec<Value> {
        std::mem::take(&mut self.state.lock().unwrap().requests)
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut CloudState) -> R) -> R {
        f(&mut self.state.lock().unwrap())
    }

    /// Adds a machine record and returns its id.
    pub fn add_machine(&self, name: &str, state: &str) -> String {
        self.with(|st| {
            let id = st.new_id();
            st.machines.insert(id.clone(), record(&id, name, state));
            id
        })
    }
}

impl CloudState {
    fn new_id(&mut self) -> String {
        self.next_id += 1;
        format!("mach-{:032x}", 0xabc0_0000_u64 + self.next_id)
    }

    fn event(&mut self, id: &str, message: &str) {
        let list = self.events.entry(id.to_owned()).or_default();
        let n = list.len() + 1;
        list.push(json!({
            "id": format!("ev-{n}"), "level": "info", "message": message,
            "createdAt": format!("2026-09-08T14:47:{:02}Z", 37 + n)
        }));
    }
}

fn text(status: u16, body: &str) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .insert_header("content-type", "text/plain; charset=utf-8")
        .set_body_string(body)
}

fn json_answer(status: u16, body: Value) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(body)
}

fn envelope(request: &Request) -> Value {
    let header = |name: &str| {
        request
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let content_type = header("content-type");
    let body = if request.body.is_empty() {
        Value::Null
    } else if content_type.as_deref() == Some("application/json") {
        serde_json::from_slice(&request.body).unwrap_or(Value::Null)
    } else {
        json!({"octets": request.body.len(), "utf8": String::from_utf8_lossy(&request.body)})
    };
    json!({
        "method": request.method.as_str(),
        "path": request.url.path(),
        "query": request.url.query(),
        "headers": {
            "authorization": header("authorization"),
            "content-type": content_type,
            "accept": header("accept"),
        },
        "body": body,
    })
}

/// What exec answers by default: `echo` echoes; `sh -c 'exit N'` exits N; `base64 < 'p'` and
/// `... base64 -d > 'p'` read and write the fake's files, as the fallback file path does.
fn default_exec(st: &mut CloudState, id: &str, body: &Value) -> Value {
    let argv: Vec<String> = match &body["command"] {
        Value::Array(a) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        Value::String(s) => vec!["sh".into(), "-c".into(), s.clone()],
        _ => vec![],
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let unquote = |s: &str| s.trim().trim_matches('\'').to_owned();
    let (code, stdout, stderr): (i32, Vec<u8>, Vec<u8>) = match argv
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["echo", rest @ ..] => (0, format!("{}\n", rest.join(" ")).into_bytes(), vec![]),
        ["sh", "-c", script] if script.starts_with("exit ") => {
            (script[5..].trim().parse().unwrap_or(1), vec![], vec![])
        }
        ["sh", "-c", script] if script.starts_with("base64 < ") => {
            let path = unquote(&script["base64 < ".len()..]);
            match st
                .files
                .get(&(id.to_owned(), path.trim_start_matches('/').to_owned()))
            {
                Some(bytes) => (0, b64.encode(bytes).into_bytes(), vec![]),
                None => (
                    1,
                    vec![],
                    format!("sh: can't open {path}: No such file or directory\n").into_bytes(),
                ),
            }
        }
        ["sh", "-c", script] if script.contains("base64 -d > ") => {
            let path = unquote(script.rsplit("base64 -d > ").next().unwrap_or_default());
            let data = b64
                .decode(body["stdin"].as_str().unwrap_or_default())
                .unwrap_or_default();
            st.files.insert(
                (id.to_owned(), path.trim_start_matches('/').to_owned()),
                data,
            );
            (0, vec![], vec![])
        }
        _ => (0, b"ok\n".to_vec(), vec![]),
    };
    exec_answer(code, &stdout, &stderr)
}

pub fn exec_answer(code: i32, stdout: &[u8], stderr: &[u8]) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD;
    json!({
        "stdout": String::from_utf8_lossy(stdout), "stderr": String::from_utf8_lossy(stderr),
        "exitCode": code, "durationMs": 12, "machineId": "",
        "stdoutTruncated": false, "stderrTruncated": false,
        "stdoutB64": b64.encode(stdout), "stderrB64": b64.encode(stderr)
    })
}

impl Respond for Responder {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let mut st = self.0.lock().unwrap();
        st.requests.push(envelope(request));
        st.next_request += 1;
        let request_id = format!("req-{:04}", st.next_request);
        let answer = route(&mut st, request);
        answer.insert_header("x-request-id", request_id.as_str())
    }
}

fn route(st: &mut CloudState, request: &Request) -> ResponseTemplate {
    // Any path, existing or not, answers 401 with an empty body without the key.
    let auth = request
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    if auth != Some(&format!("Bearer {TOKEN}")) {
        return ResponseTemplate::new(401);
    }
    let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    let path = request.url.path().to_owned();
    let query = request.url.query().unwrap_or_default().to_owned();
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(4, '/').collect();
    match (request.method.as_str(), parts.as_slice()) {
        ("GET", ["v1", "account"]) => json_answer(
            200,
            json!({
                "tenantId": "tenant-test", "status": st.account_status.clone().unwrap_or("active".into()), "effectiveMaxCpus": 16,
                "effectiveMaxMemoryMb": 65536, "effectiveMaxMachines": 20,
                "periodUsage": {"tenantId": "tenant-test", "from": "2026-11-01T00:00:00Z", "to": "2026-11-29T00:00:00Z",
                                "totalUptimeSeconds": 157, "cpuHours": 0.08, "memoryGbHours": 0.09, "machineCount": 90},
                "periodCost": {"cpuMicros": 10, "memoryMicros": 20, "execMicros": 0, "totalMicros": 1810, "amountDueMicros": 0},
                "plan": {"name": "Standard", "rateBaseHourMicros": 40000}
            }),
        ),
        ("GET", ["v1", "machines"]) => {
            json_answer(200, Value::Array(st.machines.values().cloned().collect()))
        }
        ("POST", ["v1", "machines"]) => {
            let Some(source) = body.get("source") else {
                return text(
                    422,
                    "Failed to deserialize the JSON body into the target type: missing field `source`",
                );
            };
            let name = body["name"].as_str().unwrap_or("generated-name").to_owned();
            if st.machines.values().any(|m| m["name"] == json!(name)) {
                return text(409, &format!("machine name '{name}' already exists"));
            }
            if body["network"]["mode"] == json!("allowCidrs")
                && body["network"]["cidrs"]
                    .as_array()
                    .is_none_or(Vec::is_empty)
                && body["network"]["hosts"]
                    .as_array()
                    .is_none_or(Vec::is_empty)
            {
                return text(
                    400,
                    "allowCidrs network mode requires at least one CIDR or host",
                );
            }
            let id = st.new_id();
            let mut rec = record(&id, &name, "stopped");
            let reference = source["reference"].as_str().unwrap_or_default();
            // The service resolves the reference itself and records what it resolved to.
            rec["source"] = json!({"type": "smolmachine", "reference": format!("registry.smolmachines.com/library/{reference}"), "arch": "amd64"});
            for (key, target) in [
                ("network", "network"),
                ("env", "env"),
                ("ttlSeconds", "ttlSeconds"),
                ("autoStopSeconds", "autoStopSeconds"),
                ("branchable", "branchable"),
                ("labels", "labels"),
            ] {
                if let Some(v) = body.get(key) {
                    rec[target] = v.clone();
                }
            }
            if let Some(r) = body.get("resources") {
                rec["resources"] = r.clone();
            }
            if let Some(ports) = body["ports"].as_array() {
                rec["ports"] = Value::Array(
                    ports
                        .iter()
                        .map(|p| json!({"port": p["port"], "hostPort": null}))
                        .collect(),
                );
            }
            st.machines.insert(id.clone(), rec.clone());
            st.event(&id, "machine created");
            json_answer(201, rec)
        }
        (method, ["v1", "machines", id, rest @ ..]) => {
            let id = id.to_string();
            let rest = rest.first().copied().unwrap_or_default().to_owned();
            // Usage keeps answering for 30 days after a delete.
            let usage_of_deleted = method == "GET" && rest == "usage" && st.deleted.contains(&id);
            if !st.machines.contains_key(&id) && !usage_of_deleted {
                return text(404, "machine not found");
            }
            machine_route(st, method, &id, &rest, &query, &body, request)
        }
        _ => text(404, "not found"),
    }
}

fn machine_route(
    st: &mut CloudState,
    method: &str,
    id: &str,
    rest: &str,
    query: &str,
    body: &Value,
    request: &Request,
) -> ResponseTemplate {
    let rec = st.machines.get(id).cloned().unwrap_or(Value::Null);
    let set_state = |st: &mut CloudState, state: &str| {
        let m = st.machines.get_mut(id).unwrap();
        m["state"] = json!(state);
        m["ready"] = json!(state == "started");
    };
    match (method, rest) {
        ("GET", "") => json_answer(200, rec),
        ("DELETE", "") => {
            st.machines.remove(id);
            st.deleted.push(id.to_owned());
            if query.contains("includeUsage=true") && !st.delete_ignores_include_usage {
                json_answer(
                    200,
                    json!({
                        "machineId": id, "from": "2026-11-01T00:00:00Z", "to": "2026-11-29T00:00:00Z",
                        "usage": {"totalUptimeSeconds": 157, "cpuHours": 0.08, "memoryGbHours": 0.09},
                        "cost": {"cpuMicros": 30, "memoryMicros": 36, "execMicros": 0, "baseMicros": 1744, "totalMicros": 1810}
                    }),
                )
            } else {
                ResponseTemplate::new(204)
            }
        }
        ("GET", "usage") => json_answer(
            200,
            json!({
                "machineId": id, "usage": {"totalUptimeSeconds": 160},
                "cost": {"cpuMicros": 30, "memoryMicros": 36, "execMicros": 0, "totalMicros": 1812}
            }),
        ),
        ("POST", "start") => {
            set_state(st, "started");
            st.event(id, "machine started");
            // The detached form: accepted, empty body.
            ResponseTemplate::new(202)
        }
        ("POST", "stop") => {
            set_state(st, "stopped");
            st.event(id, "machine stopped");
            json_answer(200, st.machines[id].clone())
        }
        ("POST", "exec") => {
            if rec["state"] != json!("started") {
                set_state(st, "started");
                st.event(id, "auto-started for exec");
            }
            let mut answer = match st.exec_hook.clone() {
                Some(hook) => hook(body),
                None => default_exec(st, id, body),
            };
            answer["machineId"] = json!(id);
            if query.contains("output=text") {
                let obj = answer.as_object_mut().unwrap();
                obj.remove("stdoutB64");
                obj.remove("stderrB64");
            }
            json_answer(200, answer)
        }
        ("GET", "events") => json_answer(
            200,
            Value::Array(st.events.get(id).cloned().unwrap_or_default()),
        ),
        ("POST", "branches") if st.branches_route_missing => text(404, "not found"),
        ("POST", "branches") | ("POST", "fork") => {
            if rec["branchable"] != json!(true) || rec["state"] != json!("started") {
                let name = rec["name"].as_str().unwrap_or(id);
                return text(
                    409,
                    &format!(
                        "machine '{name}' is not branchable, recreate it with `branchable: true`, start it, and branch the new machine"
                    ),
                );
            }
            let child_id = st.new_id();
            let child_name = body["name"].as_str().unwrap_or("child");
            let mut child = record(&child_id, child_name, "started");
            child["branchable"] = body.get("branchable").cloned().unwrap_or(json!(false));
            st.machines.insert(child_id, child.clone());
            json_answer(201, child)
        }
        (method, files) if files.starts_with("files/") => {
            if st.files_route_missing {
                return ResponseTemplate::new(404);
            }
            let suffix = percent_encoding::percent_decode_str(&files["files/".len()..])
                .decode_utf8_lossy()
                .into_owned();
            if rec["state"] != json!("started") {
                set_state(st, "started");
            }
            match method {
                "PUT" => {
                    st.files
                        .insert((id.to_owned(), suffix), request.body.clone());
                    ResponseTemplate::new(204)
                }
                "GET" => match st.files.get(&(id.to_owned(), suffix.clone())) {
                    Some(bytes) => ResponseTemplate::new(200)
                        .insert_header("content-type", "application/octet-stream")
                        .set_body_bytes(bytes.clone()),
                    None => text(404, &format!("file not found: {suffix}")),
                },
                _ => ResponseTemplate::new(405),
            }
        }
        _ => text(404, "not found"),
    }
}
