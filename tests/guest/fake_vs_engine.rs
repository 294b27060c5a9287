//! The fake serve against the real engine with a booted guest: the same requests to both, the
//! answers compared on what the server reads (status, the form of the body, the fields it
//! takes), so that a fake drifting from the engine fails here. The fake runs in guest-shell
//! mode (its exec really runs the command on this host); the engine is the nested 1.32.2
//! (`scripts/nested-engine.sh`), on a bare machine (exec directly in the VM).

use crate::common::fake_serve::FakeServe;
use crate::common::nested::{json_answer, nested, serial};
use serde_json::{Value, json};
use smol_mcp::fleet::transport::LocalEndpoint;

/// One request of a scenario; `{m}` in the path is the machine's name.
struct Step {
    what: &'static str,
    method: &'static str,
    path: &'static str,
    body: Option<Value>,
    /// The JSON fields whose values must agree (besides the status and the body's form).
    fields: &'static [&'static str],
}

/// `host_port`: a loopback port free on this host (the fake binds there) and, as far as can be
/// known, in the outer VM (whose serve holds 8080).
fn steps(host_port: u16) -> Vec<Step> {
    let ports = "/api/v1/machines/{m}/ports";
    let exec = "/api/v1/machines/{m}/exec";
    vec![
        Step {
            what: "a command's streams and exit code",
            method: "POST",
            path: exec,
            body: Some(
                json!({"command": ["sh", "-c", "echo hi; echo err >&2; exit 3"], "timeoutSecs": 30}),
            ),
            fields: &["exitCode", "stdout", "stderr", "stdoutB64", "stderrB64"],
        },
        Step {
            what: "stdin",
            method: "POST",
            path: exec,
            body: Some(json!({"command": ["cat"], "stdin": "piped", "timeoutSecs": 30})),
            fields: &["exitCode", "stdout"],
        },
        Step {
            what: "env and workdir",
            method: "POST",
            path: exec,
            body: Some(
                json!({"command": ["sh", "-c", "echo $A; pwd"], "env": [{"name": "A", "value": "1"}], "workdir": "/tmp", "timeoutSecs": 30}),
            ),
            fields: &["exitCode", "stdout"],
        },
        Step {
            what: "a timeout, and its wording",
            method: "POST",
            path: exec,
            body: Some(json!({"command": ["sleep", "5"], "timeoutSecs": 1})),
            fields: &["exitCode", "stdout", "stderr"],
        },
        Step {
            what: "a streamed command's frames",
            method: "POST",
            path: "/api/v1/machines/{m}/exec/stream",
            body: Some(
                json!({"command": ["sh", "-c", "echo a; echo b >&2; echo c; exit 2"], "timeoutSecs": 30}),
            ),
            fields: &["stdout", "stderr", "exit"],
        },
        Step {
            what: "a streamed timeout",
            method: "POST",
            path: "/api/v1/machines/{m}/exec/stream",
            body: Some(json!({"command": ["sleep", "5"], "timeoutSecs": 1})),
            fields: &["stdout", "stderr", "exit"],
        },
        Step {
            what: "an exec without autoStart on a machine not started",
            method: "POST",
            path: "/api/v1/machines/{c}/exec",
            body: Some(json!({"command": ["true"], "autoStart": false})),
            fields: &["code", "error"],
        },
        Step {
            what: "a streamed exec without autoStart on a machine not started",
            method: "POST",
            path: "/api/v1/machines/{c}/exec/stream",
            body: Some(json!({"command": ["true"], "autoStart": false})),
            fields: &["code", "error"],
        },
        Step {
            what: "the engine log's framing",
            method: "GET",
            path: "/api/v1/machines/{m}/logs?source=console&tail=2",
            body: None,
            fields: &["frames"],
        },
        Step {
            what: "a bare machine's empty workload log",
            method: "GET",
            path: "/api/v1/machines/{m}/logs?source=workload&tail=5",
            body: None,
            fields: &["frames"],
        },
        Step {
            what: "an empty command",
            method: "POST",
            path: exec,
            body: Some(json!({"command": []})),
            fields: &["code"],
        },
        Step {
            what: "an unknown exec field",
            method: "POST",
            path: exec,
            body: Some(json!({"command": ["true"], "timeout": 5})),
            fields: &[],
        },
        Step {
            what: "a detached command",
            method: "POST",
            path: exec,
            body: Some(json!({"command": ["sleep", "1"], "background": true})),
            fields: &["exitCode"],
        },
        Step {
            what: "an upload",
            method: "PUT",
            path: "/api/v1/machines/{m}/files/tmp%2Fcompared.txt",
            body: Some(Value::String("abc".into())),
            fields: &["size"],
        },
        Step {
            what: "its download",
            method: "GET",
            path: "/api/v1/machines/{m}/files/tmp%2Fcompared.txt",
            body: None,
            fields: &[],
        },
        Step {
            what: "a missing file",
            method: "GET",
            path: "/api/v1/machines/{m}/files/no%2Fsuch%2Ffile",
            body: None,
            fields: &["code"],
        },
        Step {
            what: "a branch of a machine not started branchable",
            method: "POST",
            path: "/api/v1/machines/{m}/branches",
            body: Some(json!({"name": "compare-branch-refused"})),
            fields: &["code", "error"],
        },
        Step {
            what: "an unknown machine",
            method: "POST",
            path: "/api/v1/machines/no-such-machine/exec",
            body: Some(json!({"command": ["true"]})),
            fields: &["code"],
        },
        Step {
            what: "the health answer",
            method: "GET",
            path: "/health",
            body: None,
            fields: &["status", "version"],
        },
        Step {
            what: "published ports: a mapping without a host",
            method: "PUT",
            path: ports,
            body: Some(json!({"ports": [{"guest": 8000}]})),
            fields: &[],
        },
        Step {
            what: "published ports: a host port of 0",
            method: "PUT",
            path: ports,
            body: Some(json!({"ports": [{"host": 0, "guest": 8000, "protocol": "tcp"}]})),
            fields: &["code", "error"],
        },
        Step {
            what: "published ports: set live on a running machine",
            method: "PUT",
            path: ports,
            body: Some(json!({"ports": [{"host": host_port, "guest": 8000, "protocol": "tcp"}]})),
            fields: &["ports", "state"],
        },
        Step {
            what: "published ports: all removed",
            method: "PUT",
            path: ports,
            body: Some(json!({"ports": []})),
            fields: &["ports"],
        },
    ]
}

/// An answer as the server reads it: the status, the body's form (JSON with its top-level
/// keys, text, or empty), and the compared fields.
#[derive(Debug, PartialEq)]
struct Seen {
    status: u16,
    form: String,
    fields: Vec<(String, Value)>,
}

async fn ask(client: &reqwest::Client, base: &str, machine: &str, step: &Step) -> Seen {
    let path = step
        .path
        .replace("{m}", machine)
        .replace("{c}", &not_started(machine));
    let url = format!("{base}{path}");
    let mut request = match step.method {
        "GET" => client.get(&url),
        "POST" => client.post(&url),
        "PUT" => client.put(&url),
        other => panic!("{other}"),
    };
    request = match &step.body {
        Some(Value::String(raw)) => request
            .header("content-type", "application/octet-stream")
            .body(raw.clone()),
        Some(json) => request.json(json),
        None => request,
    };
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let event_stream = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let text = response.text().await.unwrap();
    if event_stream {
        return sse_seen(step, status, &text);
    }
    let (form, fields) = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(map)) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let fields = step
                .fields
                .iter()
                .map(|f| ((*f).to_owned(), map.get(*f).cloned().unwrap_or(Value::Null)))
                .collect();
            (format!("json {keys:?}"), fields)
        }
        _ if text.is_empty() => ("empty".to_owned(), Vec::new()),
        _ => (
            format!("text {:?}", text.chars().take(40).collect::<String>()),
            Vec::new(),
        ),
    };
    Seen {
        status,
        form,
        fields,
    }
}

/// A second machine, created and never started.
fn not_started(machine: &str) -> String {
    format!("{machine}-cold")
}

/// An event stream as the server reads it: the kinds of its frames (each once: how output is
/// cut into frames, and how stdout and stderr interleave, is the guest's timing) and whether
/// the exit comes last, the data of each kind joined (a frame's `data:` lines joined by newlines, as the SSE rules say), and the
/// number of frames when asked for.
fn sse_seen(step: &Step, status: u16, text: &str) -> Seen {
    let mut kinds: Vec<String> = Vec::new();
    let mut data: std::collections::BTreeMap<String, String> = Default::default();
    let mut frames = 0u64;
    for frame in text.split("\n\n").filter(|f| !f.trim().is_empty()) {
        let mut kind = "message".to_owned();
        let mut lines = Vec::new();
        for line in frame.lines() {
            if let Some(k) = line.strip_prefix("event:") {
                kind = k.trim().to_owned();
            } else if let Some(d) = line.strip_prefix("data:") {
                lines.push(d.strip_prefix(' ').unwrap_or(d));
            }
        }
        if lines.is_empty() {
            continue; // a keep-alive comment
        }
        frames += 1;
        if kinds.last() != Some(&kind) {
            kinds.push(kind.clone());
        }
        data.entry(kind).or_default().push_str(&lines.join("\n"));
    }
    let fields = step
        .fields
        .iter()
        .map(|f| {
            let value = if *f == "frames" {
                json!(frames)
            } else {
                data.get(*f).map_or(Value::Null, |d| json!(d))
            };
            ((*f).to_owned(), value)
        })
        .collect();
    // The order of stdout and stderr frames is the guest's timing (the fake's host shell and
    // the guest interleave them differently from run to run); that the exit comes last is not.
    let exit_last = kinds.last().is_some_and(|k| k == "exit");
    kinds.sort();
    kinds.dedup();
    Seen {
        status,
        form: format!("sse {kinds:?}, exit last: {exit_last}"),
        fields,
    }
}

/// The refusals of an egress-events answer as the server reads them: each distinct
/// (operation, destination), and whether every stamp is whole seconds in UTC as the engine's
/// virtio-net writer stamps them (the server places them on its clock by that form).
fn refusals_seen(answer: &Value) -> (Vec<(String, String)>, bool) {
    let events = answer["events"].as_array().cloned().unwrap_or_default();
    let whole_seconds = events.iter().all(|e| {
        e["timestamp"].as_str().is_some_and(|t| {
            t.len() == 20 && t.ends_with('Z') && chrono::DateTime::parse_from_rfc3339(t).is_ok()
        })
    });
    let mut distinct: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["operation"].as_str().unwrap_or("").to_owned(),
                e["dest"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    distinct.sort();
    distinct.dedup();
    (distinct, whole_seconds)
}

/// The parts of an answer that differ between the two by nature, not by drift: a detached
/// command's pid, and what follows the common prefix of a plain-text refusal (serde's list of
/// expected fields).
fn comparable(step: &Step, mut seen: Seen) -> Seen {
    if step.what == "a detached command" {
        seen.fields.retain(|(k, _)| k == "exitCode");
    }
    if seen.form.starts_with("text") {
        seen.form = seen.form.chars().take(30).collect();
    }
    // A machine's whole record: the fake's holds the fields the server reads, not the engine's
    // every runtime figure; the fields compared are the step's.
    if step.what.starts_with("published ports") && seen.form.contains("\"ports\"") {
        seen.form = "json MachineInfo".to_owned();
    }
    seen
}

#[tokio::test]
async fn the_fake_answers_as_the_engine_does_on_a_booted_guest() {
    let _one_at_a_time = serial().await;
    let engine = nested().url;
    let http = reqwest::Client::new();
    let machine = format!("compare-{}", std::process::id());
    let created = http
        .post(format!("{engine}/api/v1/machines"))
        .json(&json!({"name": machine, "cpus": 1, "memoryMb": 256, "network": true, "allowedHosts": ["example.org"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        created.status().as_u16(),
        200,
        "{}",
        created.text().await.unwrap()
    );
    let started = http
        .post(format!("{engine}/api/v1/machines/{machine}/start"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        started.status().as_u16(),
        200,
        "{}",
        started.text().await.unwrap()
    );

    let cold = http
        .post(format!("{engine}/api/v1/machines"))
        .json(&json!({"name": not_started(&machine), "cpus": 1, "memoryMb": 256}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        cold.status().as_u16(),
        200,
        "{}",
        cold.text().await.unwrap()
    );

    let fake = FakeServe::start_guest_shell().await;
    fake.add_machine(&machine, "running");
    fake.add_machine(&not_started(&machine), "created");
    {
        let mut st = fake.state.lock().unwrap();
        st.engine_logs.insert(
            machine.clone(),
            ["boot", "ready", "running command"]
                .map(|m| json!({"level": "INFO", "message": m}).to_string())
                .to_vec(),
        );
    }
    // What the guest's wget below is refused, the fake records at each command.
    fake.deny_on_exec(&machine, "connect", "1.1.1.1:80");
    fake.deny_on_exec(&machine, "resolve", "example.com");
    // 1.32.2 answers a missing file 404 (its spec, and this engine); the fake answers the older
    // source's 500 unless told, and the server reads both as NOT_FOUND.
    fake.state.lock().unwrap().missing_file_404 = true;
    let fake_client = fake.endpoint().http_client().unwrap();
    let fake_base = fake.endpoint().base_url();
    let engine_client = LocalEndpoint::parse(&engine)
        .unwrap()
        .http_client()
        .unwrap();

    let host_port = crate::common::real_serve::free_port();
    let mut drift = Vec::new();
    for step in steps(host_port) {
        let real = comparable(&step, ask(&engine_client, &engine, &machine, &step).await);
        let faked = comparable(&step, ask(&fake_client, &fake_base, &machine, &step).await);
        eprintln!("{}: {real:?}", step.what);
        if real != faked {
            drift.push(format!(
                "{}: the engine {real:?}\n    the fake   {faked:?}",
                step.what
            ));
        }
    }
    // Refusals: a connect outside the allow-list and a name outside it, refused at lookup.
    let wget = http
        .post(format!("{engine}/api/v1/machines/{machine}/exec"))
        .json(&json!({"command": ["sh", "-c", "wget -q -T 3 -O /dev/null http://1.1.1.1/; wget -q -T 3 -O /dev/null http://example.com/"], "timeoutSecs": 30}))
        .send()
        .await
        .unwrap();
    assert_eq!(wget.status().as_u16(), 200);
    let events_path = format!("/api/v1/machines/{machine}/egress-events");
    let real = json_answer(engine_client.get(format!("{engine}{events_path}"))).await;
    let faked = json_answer(fake_client.get(format!("{fake_base}{events_path}"))).await;
    eprintln!("egress refusals: {real}");
    if refusals_seen(&real) != refusals_seen(&faked) {
        drift.push(format!(
            "egress refusals: the engine {:?}\n    the fake   {:?}",
            refusals_seen(&real),
            refusals_seen(&faked)
        ));
    }
    for name in [machine.clone(), not_started(&machine)] {
        let _ = http
            .delete(format!("{engine}/api/v1/machines/{name}"))
            .send()
            .await;
    }
    assert!(
        drift.is_empty(),
        "the fake drifted from the engine:\n{}",
        drift.join("\n")
    );
}
