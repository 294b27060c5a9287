//! Property tests of the hardening, bounded in cases and time (each test a few seconds in a
//! debug build, whatever PROPTEST_CASES says):
//!
//! - tool arguments: generated argument objects for every tool, valid-looking and hostile,
//!   through the in-process harness against the fake serve. Every call is answered (a result or
//!   a tool error), no ephemeral machine outlives the session, and no request reaches the fake
//!   outside the operations `src/operations.rs` says the server uses.
//! - JSON-RPC framing: generated lines (random bytes, mutated valid messages) into the stdio
//!   binary. Every request line with an id gets exactly one answer, the process stays up, and a
//!   final valid request is answered.
//!
//! Failures print the seed; `SMOL_MCP_FUZZ_SEED=<seed>` replays a run. Nothing is persisted
//! (proptest's failure files would land in the source tree).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::fake_serve::FakeServe;
use common::mcp::Harness;
use common::stdio::{StdioServer, server_env};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::Union;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use rmcp::model::CallToolRequestParams;
use serde_json::{Map, Value, json};
use smol_mcp::generated::smolvm::Operation;
use smol_mcp::operations::{Use, classify_local};
use smol_mcp::tools::Tool;
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

const ANSWER_WAIT: Duration = Duration::from_secs(20);

/// A runner with its own case count, no persistence, and a printed seed.
fn runner(name: &str, cases: u32) -> TestRunner {
    let seed = std::env::var("SMOL_MCP_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("{name}: seed {seed} (replay with SMOL_MCP_FUZZ_SEED={seed})");
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 64,
        max_shrink_time: 20_000,
        max_global_rejects: 1024,
        verbose: 0,
        rng_seed: RngSeed::Fixed(seed),
        ..Config::default()
    })
}

fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Tool arguments

fn hostile() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        prop_oneof![
            Just(json!(0)),
            Just(json!(-1)),
            Just(json!(0.5)),
            Just(json!(-0.0)),
            Just(json!(1e308)),
            Just(json!(i64::MIN)),
            Just(json!(u64::MAX)),
        ],
        "\\PC{0,24}".prop_map(Value::from),
        prop_oneof![
            Just(json!("")),
            Just(json!(" ")),
            Just(json!("../../etc/passwd")),
            Just(json!("a/b")),
            Just(json!("a\u{0}b")),
            Just(json!("line\nbreak")),
            Just(json!("\u{202e}rtl\u{fffd}")),
            Just(json!("%2e%2e%2f")),
            Just(json!("?x=1#y")),
            Just(json!("mcp-not-mine")),
        ],
        (1usize..=100_000).prop_map(|n| Value::String("x".repeat(n))),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("\\PC{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

/// A value of the shape the schema asks for, picked to make calls meet: a few machine names,
/// paths and commands recur.
fn valid_looking(key: &str, schema: &Value) -> BoxedStrategy<Value> {
    let branches = schema["oneOf"]
        .as_array()
        .or_else(|| schema["anyOf"].as_array());
    if let Some(branches) = branches {
        let each: Vec<BoxedStrategy<Value>> =
            branches.iter().map(|b| valid_looking(key, b)).collect();
        return Union::new(each).boxed();
    }
    if let Some(value) = schema.get("const") {
        return Just(value.clone()).boxed();
    }
    if let Some(values) = schema["enum"].as_array() {
        return proptest::sample::select(values.clone()).boxed();
    }
    match (key, schema["type"].as_str()) {
        ("name" | "childName", Some("string")) => prop_oneof![
            Just(json!("fz-a")),
            Just(json!("fz-b")),
            "[a-z][a-z0-9-]{0,12}".prop_map(Value::from),
        ]
        .boxed(),
        ("image", Some("string")) => prop_oneof![
            Just(json!("alpine")),
            Just(json!("python:3.12-alpine")),
            "[a-z]{1,8}(:[a-z0-9.]{1,5})?".prop_map(Value::from),
        ]
        .boxed(),
        ("path", Some("string")) => prop_oneof![
            Just(json!("/work/a.txt")),
            "/[a-z]{1,6}(/[a-z.]{1,6}){0,2}".prop_map(Value::from),
        ]
        .boxed(),
        ("command", Some("string")) => prop_oneof![
            Just(json!("echo hi")),
            Just(json!("exit 3")),
            "\\PC{0,16}".prop_map(Value::from),
        ]
        .boxed(),
        (_, Some("string")) => "\\PC{0,64}".prop_map(Value::from).boxed(),
        (_, Some("boolean")) => any::<bool>().prop_map(Value::from).boxed(),
        (_, Some("integer")) => {
            let min = schema["minimum"].as_i64().unwrap_or(0);
            let max = schema["maximum"].as_i64().unwrap_or(min + 1000);
            (min..=max).prop_map(Value::from).boxed()
        }
        (_, Some("array")) => {
            let item = valid_looking("", &schema["items"]);
            proptest::collection::vec(item, 0..3)
                .prop_map(Value::Array)
                .boxed()
        }
        (_, Some("object")) => proptest::collection::btree_map("[A-Z_]{1,8}", "\\PC{0,16}", 0..3)
            .prop_map(|m| json!(m))
            .boxed(),
        _ => hostile(),
    }
}

/// Argument objects for one tool: half of them of the schema's shapes throughout (so that calls
/// get past the argument checks and reach the fake), half with some hostile values and now and
/// then an unknown key.
fn arguments(schema: &Map<String, Value>) -> BoxedStrategy<Map<String, Value>> {
    prop_oneof![arguments_of(schema, false), arguments_of(schema, true)].boxed()
}

fn arguments_of(
    schema: &Map<String, Value>,
    hostile_too: bool,
) -> BoxedStrategy<Map<String, Value>> {
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut fields: Vec<BoxedStrategy<Option<(String, Value)>>> = Vec::new();
    for (key, property) in properties {
        let value = if hostile_too {
            prop_oneof![3 => valid_looking(key, property), 1 => hostile()].boxed()
        } else {
            valid_looking(key, property)
        };
        let present = if required.contains(&key.as_str()) {
            0.95
        } else {
            0.5
        };
        let key = key.clone();
        fields.push(
            proptest::option::weighted(present, value)
                .prop_map(move |v| v.map(|v| (key.clone(), v)))
                .boxed(),
        );
    }
    if hostile_too {
        fields.push(proptest::option::weighted(0.2, ("[a-zA-Z_]{1,10}", hostile())).boxed());
    }
    fields
        .prop_map(|fields| fields.into_iter().flatten().collect())
        .boxed()
}

/// Does a recorded request match an operation's method and path template?
fn matches(method: &str, path: &str, op: Operation) -> bool {
    if !op.method().eq_ignore_ascii_case(method) {
        return false;
    }
    let template: Vec<&str> = op.path().split('/').collect();
    let actual: Vec<&str> = path.split('/').collect();
    template.len() == actual.len()
        && template.iter().zip(&actual).all(|(t, a)| {
            if t.starts_with('{') && t.ends_with('}') {
                !a.is_empty()
            } else {
                t == a
            }
        })
}

#[test]
fn tool_arguments_fuzz_answers_every_call_leaks_nothing_and_stays_in_the_operations_table() {
    let rt = tokio_runtime();
    let allowed: Vec<Operation> = Operation::ALL
        .iter()
        .copied()
        .filter(|op| classify_local(*op) != Use::Omitted)
        .collect();
    // The schemas, as a client sees them.
    let schemas: Vec<Map<String, Value>> = rt.block_on(async {
        let fake = FakeServe::start().await;
        let h = Harness::start(&[("SMOL_LOCAL_URL", fake.url().as_str())]).await;
        let listed = h.client.list_all_tools().await.unwrap();
        Tool::ALL
            .iter()
            .map(|tool| {
                let listed = listed
                    .iter()
                    .find(|t| t.name == tool.name())
                    .unwrap_or_else(|| panic!("{} is not listed", tool.name()));
                (*listed.input_schema).clone()
            })
            .collect()
    });
    let one_call = Union::new(
        schemas
            .iter()
            .enumerate()
            .map(|(i, schema)| arguments(schema).prop_map(move |a| (i, a)).boxed()),
    );
    let calls = proptest::collection::vec(one_call, 1..=6);

    // Per tool: calls that succeeded and calls refused, printed to show what was exercised.
    let tally = RefCell::new(std::collections::BTreeMap::<&str, (u32, u32)>::new());
    let mut runner = runner("tool arguments", 128);
    let result = runner.run(&calls, |calls| {
        rt.block_on(async {
            let fake = FakeServe::start().await;
            // Machines the generated names meet (named ones: they stay after the session).
            for name in ["fz-a", "fz-b"] {
                fake.add_machine(name, "running");
                fake.push_log(name, "ready");
            }
            let h = Harness::start(&[("SMOL_LOCAL_URL", fake.url().as_str())]).await;
            for (i, args) in &calls {
                let tool = Tool::ALL[*i].name();
                let request =
                    CallToolRequestParams::new(tool.to_owned()).with_arguments(args.clone());
                match tokio::time::timeout(ANSWER_WAIT, h.client.call_tool(request)).await {
                    Err(_) => {
                        return Err(TestCaseError::fail(format!("{tool}: no answer")));
                    }
                    Ok(Err(e)) => {
                        return Err(TestCaseError::fail(format!("{tool}: protocol error {e}")));
                    }
                    Ok(Ok(result)) => {
                        let mut tally = tally.borrow_mut();
                        let entry = tally.entry(tool).or_insert((0, 0));
                        if result.is_error == Some(true) {
                            entry.1 += 1;
                        } else {
                            entry.0 += 1;
                        }
                    }
                }
            }
            // The session ends as the stdio binary ends one at EOF.
            let cleanup = h.backend.shutdown(&h.session).await;
            prop_assert!(cleanup.failed.is_empty(), "{:?}", cleanup.failed);
            let left: Vec<String> = fake
                .state
                .lock()
                .unwrap()
                .machines
                .keys()
                .filter(|name| name.starts_with("mcp-"))
                .cloned()
                .collect();
            prop_assert!(left.is_empty(), "ephemeral machines left: {left:?}");
            for request in fake.take_requests() {
                let method = request["method"].as_str().unwrap_or_default();
                let path = request["path"].as_str().unwrap_or_default();
                prop_assert!(
                    allowed.iter().any(|op| matches(method, path, *op)),
                    "{method} {path} is no operation the server uses"
                );
            }
            Ok(())
        })
    });
    eprintln!(
        "tool arguments: (succeeded, refused) per tool: {:?}",
        tally.borrow()
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// JSON-RPC framing

/// Valid messages to mutate; `ID` becomes the line's id. Cancellations name an id no request
/// uses, so no answer is withheld on their account.
const TEMPLATES: &[&str] = &[
    r#"{"jsonrpc":"2.0","id":ID,"method":"ping"}"#,
    r#"{"jsonrpc":"2.0","id":ID,"method":"tools/list","params":{}}"#,
    r#"{"jsonrpc":"2.0","id":"s-ID","method":"tools/list"}"#,
    r#"{"jsonrpc":"2.0","id":ID,"method":"tools/call","params":{"name":"list-machines","arguments":{}}}"#,
    r#"{"jsonrpc":"2.0","id":ID,"method":"tools/call","params":{"name":"get-machine","arguments":{"name":"fz"}}}"#,
    r#"{"jsonrpc":"2.0","id":ID,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"fz","version":"0"}}}"#,
    r#"{"jsonrpc":"2.0","id":ID,"method":"resources/list"}"#,
    r#"{"jsonrpc":"2.0","id":ID,"result":{}}"#,
    r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"fz","progress":1}}"#,
    r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}"#,
];

const TOKENS: &[&str] = &[
    "\"", "{", "}", "[", "]", ",", ":", "null", "\\ud800", "NaN", "1e999", "\\u0000", "\n", "\r",
    "\u{feff}", "[[[[[[[[", "-", "0.5",
];

#[derive(Debug, Clone)]
enum Mutation {
    Set(Index, u8),
    Delete(Index, usize),
    Insert(Index, Vec<u8>),
    Token(Index, &'static str),
    Truncate(Index),
}

impl Mutation {
    fn apply(&self, line: &mut Vec<u8>) {
        if line.is_empty() {
            if let Mutation::Insert(_, bytes) = self {
                line.extend_from_slice(bytes);
            }
            return;
        }
        match self {
            Mutation::Set(at, byte) => {
                let at = at.index(line.len());
                line[at] = *byte;
            }
            Mutation::Delete(at, len) => {
                let at = at.index(line.len());
                let end = (at + len).min(line.len());
                line.drain(at..end);
            }
            Mutation::Insert(at, bytes) => {
                let at = at.index(line.len() + 1);
                line.splice(at..at, bytes.iter().copied());
            }
            Mutation::Token(at, token) => {
                let at = at.index(line.len() + 1);
                line.splice(at..at, token.bytes());
            }
            Mutation::Truncate(at) => line.truncate(at.index(line.len())),
        }
    }
}

#[derive(Debug, Clone)]
enum Line {
    Random(Vec<u8>),
    Mutated(usize, Vec<Mutation>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        (any::<Index>(), 1usize..8).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (any::<Index>(), proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<Index>(), proptest::sample::select(TOKENS)).prop_map(|(i, t)| Mutation::Token(i, t)),
        any::<Index>().prop_map(Mutation::Truncate),
    ]
}

fn line() -> impl Strategy<Value = Line> {
    prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..64).prop_map(Line::Random),
        3 => (
            0..TEMPLATES.len(),
            proptest::collection::vec(mutation(), 0..4)
        )
            .prop_map(|(t, m)| Line::Mutated(t, m)),
    ]
}

/// What an answer's id is compared by: rmcp answers `1.0` as `1`.
fn id_key(id: &Value) -> Option<String> {
    match id {
        Value::String(s) => Some(format!("s:{s}")),
        Value::Number(n) => n.as_f64().map(|f| format!("n:{f}")),
        _ => None,
    }
}

/// The id a line must be answered with: a JSON object with a method and a string or number id
/// is a request (notifications, responses and unreadable lines are not counted here).
fn request_id(line: &[u8]) -> Option<String> {
    let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(line) else {
        return None;
    };
    if !message.contains_key("method") {
        return None;
    }
    id_key(message.get("id")?)
}

struct Session {
    server: StdioServer,
    /// Per id: requests sent minus answers received.
    owed: HashMap<String, i64>,
    next_id: u64,
}

impl Session {
    /// Reads answers until `until` and every request sent so far are answered (rmcp answers
    /// concurrent requests in any order); fails on an answer beyond what was asked.
    async fn collect(&mut self, until: &str) -> Result<(), TestCaseError> {
        let mut seen_until = false;
        while !seen_until || self.owed.values().any(|n| *n > 0) {
            let Some(message) = self.server.maybe_message(ANSWER_WAIT).await else {
                let owed: Vec<(&String, &i64)> =
                    self.owed.iter().filter(|(_, n)| **n > 0).collect();
                return Err(TestCaseError::fail(format!(
                    "no answer in {ANSWER_WAIT:?}: {until} answered: {seen_until}; unanswered: {owed:?}"
                )));
            };
            let Some(id) = message.get("id").and_then(id_key) else {
                continue;
            };
            if let Some(owed) = self.owed.get_mut(&id) {
                *owed -= 1;
                prop_assert!(*owed >= 0, "a second answer for {id}: {message}");
            }
            seen_until |= id == until;
        }
        Ok(())
    }
}

#[test]
fn framing_fuzz_answers_every_request_once_and_keeps_serving() {
    let rt = tokio_runtime();
    let fake = rt.block_on(FakeServe::start());
    let dir = tempfile::tempdir().unwrap();
    let server = rt.block_on(StdioServer::spawn(server_env(
        dir.path(),
        // rmcp logs every "method not found" at warn.
        &[
            ("SMOL_LOCAL_URL", fake.url().as_str()),
            ("SMOL_MCP_LOG", "error"),
        ],
    )));
    let session = RefCell::new(Session {
        server,
        owed: HashMap::new(),
        next_id: 10_000,
    });
    let lines = proptest::collection::vec(line(), 1..8);

    let mut runner = runner("framing", 128);
    let result = runner.run(&lines, |lines| {
        let mut session = session.borrow_mut();
        let mut payload = Vec::new();
        for line in &lines {
            match line {
                Line::Random(bytes) => payload.extend_from_slice(bytes),
                Line::Mutated(template, mutations) => {
                    session.next_id += 1;
                    let mut bytes = TEMPLATES[*template]
                        .replace("ID", &session.next_id.to_string())
                        .into_bytes();
                    for m in mutations {
                        m.apply(&mut bytes);
                    }
                    payload.extend_from_slice(&bytes);
                }
            }
            payload.push(b'\n');
        }
        // What the server reads are the newline-separated pieces, whatever the generator meant.
        for piece in payload.split(|b| *b == b'\n') {
            if let Some(id) = request_id(piece) {
                *session.owed.entry(id).or_default() += 1;
            }
        }
        session.next_id += 1;
        let end = format!("end-{}", session.next_id);
        payload.extend_from_slice(
            format!(r#"{{"jsonrpc":"2.0","id":"{end}","method":"ping"}}"#).as_bytes(),
        );
        payload.push(b'\n');
        rt.block_on(async {
            session.server.send_raw(&payload).await;
            session.collect(&format!("s:{end}")).await?;
            prop_assert!(
                session.server.child.try_wait().unwrap().is_none(),
                "the server exited"
            );
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    // A last request after all the cases, and nothing owed.
    let mut session = session.into_inner();
    rt.block_on(async {
        session
            .server
            .send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":\"last\",\"method\":\"tools/list\"}\n")
            .await;
        session.collect("s:last").await.unwrap();
    });
    let unanswered: Vec<(&String, &i64)> = session.owed.iter().filter(|(_, n)| **n != 0).collect();
    assert!(unanswered.is_empty(), "unanswered requests: {unanswered:?}");
    session.server.close_stdin();
    let status = rt
        .block_on(async { tokio::time::timeout(ANSWER_WAIT, session.server.child.wait()).await })
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
}
