//! Property tests of the hardening, bounded in cases and time (each test a few seconds in a
//! debug build, whatever PROPTEST_CASES says):
//!
//! - tool arguments: generated argument objects for every tool, valid-looking and hostile,
//!   through the in-process harness against the fake serve. Every call is answered (a result or
//!   a tool error), no ephemeral machine outlives the session, and no request reaches the fake
//!   outside the operations `src/policy/operations.rs` says the server uses.
//! - JSON-RPC framing: generated lines (random bytes, mutated valid messages) into the stdio
//!   binary. Every request line with an id gets exactly one answer, the process stays up, and a
//!   final valid request is answered.
//!
//! - HTTP Host and Origin: generated sets of `Host` and `Origin` headers (well-formed, with
//!   userinfo, paths, bad ports, repeated, random text) on raw requests to the HTTP binary. A
//!   request is served only with exactly one allowed Host and at most one allowed Origin; every
//!   other is refused 400 or 403 with a JSON-RPC body.
//! - HTTP bodies: request bodies sent in generated pieces and pauses, some stopping short. A
//!   body that arrives in time is served; one that stops short is answered 408 within the body
//!   timeout and its connection closed.
//!
//! Failures print the seed; `SMOL_MCP_FUZZ_SEED=<seed>` replays a run. Nothing is persisted
//! (proptest's failure files would land in the source tree).

use crate::common::clients::HttpServer;
use crate::common::fake_serve::FakeServe;
use crate::common::mcp::Harness;
use crate::common::stdio::{StdioServer, server_env};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::Union;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use rmcp::model::CallToolRequestParams;
use serde_json::{Map, Value, json};
use smol_mcp::generated::smolvm::Operation;
use smol_mcp::policy::operations::{Use, classify_local};
use smol_mcp::policy::tools::Tool;
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

/// `smol-mcp-http` on the fake for a fuzz: its log at error only, room for a thousand sessions,
/// and `extra`; the fake and the runtime directory it needs, kept with it.
fn fuzzed_http_server(
    rt: &tokio::runtime::Runtime,
    extra: &[(&str, &str)],
) -> (FakeServe, tempfile::TempDir, HttpServer) {
    let fake = rt.block_on(FakeServe::start());
    let dir = tempfile::tempdir().unwrap();
    let local_url = fake.url();
    let mut env = vec![
        ("SMOL_LOCAL_URL", local_url.as_str()),
        ("SMOL_MCP_LOG", "error"),
        ("SMOL_MCP_HTTP_MAX_SESSIONS", "1000"),
    ];
    env.extend_from_slice(extra);
    let server = rt.block_on(HttpServer::spawn(dir.path(), HTTP_TOKEN, &env));
    (fake, dir, server)
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
        ("name" | "childName", Some("string")) => {
            fixed_or_like(&["fz-a", "fz-b"], "[a-z][a-z0-9-]{0,12}")
        }
        ("image", Some("string")) => prop_oneof![
            Just(json!("alpine")),
            Just(json!("python:3.12-alpine")),
            "[a-z]{1,8}(:[a-z0-9.]{1,5})?".prop_map(Value::from),
            odd_image().prop_map(Value::from),
        ]
        .boxed(),
        // Hostile mount sources (the host's secrets, climbing out of a directory, relative)
        // and malformed cursors, besides the schema's own shapes.
        ("mounts", Some("array")) => {
            let source = prop_oneof![
                proptest::sample::select(vec![
                    "/etc",
                    "/root/.ssh",
                    "~/.ssh",
                    "../../etc",
                    "/tmp/../etc",
                    "relative/dir",
                    "/",
                ])
                .prop_map(str::to_owned),
                "/[a-z]{1,6}(/[a-z.]{1,6}){0,2}",
            ];
            let mount = (
                source,
                "/mnt/[a-z]{1,6}",
                proptest::option::of(any::<bool>()),
            )
                .prop_map(|(source, target, readonly)| match readonly {
                    Some(ro) => json!({"source": source, "target": target, "readonly": ro}),
                    None => json!({"source": source, "target": target}),
                });
            proptest::collection::vec(mount, 0..3)
                .prop_map(Value::Array)
                .boxed()
        }
        ("cursor", Some("string")) => prop_oneof![
            proptest::sample::select(vec![
                "garbage",
                "c:-1:x",
                "",
                "c:0:",
                "j:999999999999999999999:x",
                "\u{0}",
            ])
            .prop_map(Value::from),
            "\\PC{0,24}".prop_map(Value::from),
        ]
        .boxed(),
        ("path", Some("string")) => {
            fixed_or_like(&["/work/a.txt"], "/[a-z]{1,6}(/[a-z.]{1,6}){0,2}")
        }
        ("command", Some("string")) => fixed_or_like(&["echo hi", "exit 3"], "\\PC{0,16}"),
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

/// One of `fixed` or a string matching `pattern`, each of them as likely (as `prop_oneof!` of
/// them all would give).
fn fixed_or_like(fixed: &[&str], pattern: &'static str) -> BoxedStrategy<Value> {
    let mut arms: Vec<BoxedStrategy<Value>> = fixed
        .iter()
        .map(|s| Just(Value::from(*s)).boxed())
        .collect();
    arms.push(pattern.prop_map(Value::from).boxed());
    Union::new(arms).boxed()
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

/// Images that are no reference: URLs, relative paths, `..`, upper case, empty tags, short
/// digests, flags, and arbitrary text.
fn odd_image() -> BoxedStrategy<String> {
    prop_oneof![
        proptest::sample::select(vec![
            "http://evil/",
            "https://registry.example/x",
            "../../x",
            "./image.tar",
            "/images/../../etc/shadow",
            "/",
            "Alpine",
            "alpine:",
            "alpine@sha256:abc",
            "ghcr.io//img",
            "-alpine",
            "--privileged",
            "alpine:3.20 --net=host",
            "a\u{0}b",
            "~/x.tar",
        ])
        .prop_map(str::to_owned),
        "\\PC{1,24}",
        "[a-z]{1,6}(://|/\\.\\./|:/)[a-z]{0,6}",
    ]
    .boxed()
}

/// What may reach the engine as an image, checked apart from the server's own grammar: no
/// scheme, no `.` or `..` segment, no relative or home path, no space or control character,
/// no flag.
fn plausible_image(image: &str) -> bool {
    !image.contains("://")
        && !image.split('/').any(|seg| seg == ".." || seg == ".")
        && !image.starts_with('.')
        && !image.starts_with('-')
        && !image.starts_with('~')
        && !image.chars().any(|c| c.is_whitespace() || c.is_control())
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
        // A tool this server's settings do not offer (keep-changes without mountAllow) is
        // still called, with its whole schema: the server must refuse it as well as any other.
        let whole = smol_mcp::policy::tools::Catalog::of(smol_mcp::process::Mode::Single(
            smol_mcp::fleet::FleetKind::Local,
        ));
        Tool::ALL
            .iter()
            .map(|tool| {
                let listed = listed
                    .iter()
                    .chain(whole.listed.iter())
                    .find(|t| t.name == tool.name())
                    .unwrap_or_else(|| panic!("{} is in no catalog", tool.name()));
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
                let mut args = args.clone();
                // publish-port waits as long as it is told (up to its schema's 600 s) for a
                // listener the fake's guest never has: its wait is tested on its own
                // (tools_local), so here it is not asked to wait.
                if tool == "publish-port" {
                    args.insert("waitSecs".into(), json!(0));
                }
                // So does terminal (up to 60 s for output that a quiet program never writes,
                // past this harness's 20 s for an answer): a wait it would honour is cut to 2 s,
                // while one outside the schema's range is sent as drawn, to be refused.
                if tool == "terminal"
                    && let Some(wait) = args.get("waitMs").and_then(Value::as_u64)
                    && (2_001..=60_000).contains(&wait)
                {
                    args.insert("waitMs".into(), json!(2_000));
                }
                let request = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
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
            let cleanup = h.protocol.policy.shutdown(&h.session).await;
            prop_assert!(cleanup.failed.is_empty(), "{:?}", cleanup.failed);
            let mut left = fake.machine_names();
            left.retain(|name| name.starts_with("mcp-"));
            prop_assert!(left.is_empty(), "ephemeral machines left: {left:?}");
            for request in fake.take_requests() {
                let method = request["method"].as_str().unwrap_or_default();
                let path = request["path"].as_str().unwrap_or_default();
                prop_assert!(
                    allowed.iter().any(|op| matches(method, path, *op)),
                    "{method} {path} is no operation the server uses"
                );
                if let Some(image) = request["body"]["image"].as_str() {
                    prop_assert!(
                        plausible_image(image),
                        "{method} {path} sent the image {image:?}"
                    );
                }
                // No mountAllow here: no mount, of any host directory, reaches the engine.
                let mounts = request["body"]["mounts"].as_array().map_or(0, Vec::len);
                prop_assert!(
                    mounts == 0,
                    "{method} {path} sent mounts: {}",
                    request["body"]
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
    r#"{"jsonrpc":"2.0","id":ID,"method":"tools/call","params":{"name":"list-machines","arguments":{"name":"fz"}}}"#,
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

// ---------------------------------------------------------------------------------------------
// Subscriptions

#[derive(Debug, Clone)]
enum SubscriptionOp {
    /// Which client, which machine (the first three exist), which spelling of its URI.
    Subscribe(usize, usize, usize),
    Unsubscribe(usize, usize, usize),
}

const PER_SESSION: usize = 3;
const IN_ALL: usize = 4;
const MACHINES: [&str; 6] = ["fz-a", "fz-b", "fz-c", "gone-x", "gone-y", "gone-z"];

fn logs_uri(machine: usize, spelling: usize) -> String {
    let name = MACHINES[machine];
    // The name's first letter percent-encoded is the same machine under another URI.
    let name = match spelling {
        0 => name.to_owned(),
        _ => format!("%{:02X}{}", name.as_bytes()[0], &name[1..]),
    };
    format!("smol://machine/local/{name}/logs")
}

/// A refused subscribe's text, its URI (one of several machines and spellings) written `[uri]`.
fn refusal<T: std::fmt::Debug>(answer: &Result<T, rmcp::ServiceError>, uri: &str) -> String {
    match answer {
        Ok(answered) => format!("not refused: {answered:?}"),
        Err(e) => e.to_string().replace(uri, "[uri]"),
    }
}

fn subscription_op() -> impl Strategy<Value = SubscriptionOp> {
    prop_oneof![
        3 => (0..2usize, 0..MACHINES.len(), 0..2usize)
            .prop_map(|(c, m, s)| SubscriptionOp::Subscribe(c, m, s)),
        1 => (0..2usize, 0..MACHINES.len(), 0..2usize)
            .prop_map(|(c, m, s)| SubscriptionOp::Unsubscribe(c, m, s)),
    ]
}

/// Generated subscribe and unsubscribe sequences from two sessions of one process, with
/// maxSubscriptionsPerSession 3 and maxSubscriptions 4: an unknown machine is always refused
/// naming it, each limit is refused naming its key, and the engine is polled by one poller per
/// machine followed, none once the sessions end.
#[test]
#[allow(deprecated)] // resources/subscribe: the session lifecycle's way to follow a log
fn subscription_fuzz_refuses_unknown_machines_names_the_limits_and_polls_once_per_machine() {
    use rmcp::ServiceExt;
    use rmcp::model::{SubscribeRequestParams, UnsubscribeRequestParams};
    use std::collections::BTreeSet;
    let rt = tokio_runtime();
    let ops = proptest::collection::vec(subscription_op(), 1..14);
    let mut runner = runner("subscriptions", 32);
    let result = runner.run(&ops, |ops| {
        rt.block_on(async {
            let fake = FakeServe::start().await;
            for name in &MACHINES[..3] {
                fake.add_machine(name, "running");
            }
            let per_session = PER_SESSION.to_string();
            let in_all = IN_ALL.to_string();
            let h = Harness::start(&[
                ("SMOL_LOCAL_URL", fake.url().as_str()),
                (
                    "SMOL_MCP_MAX_SUBSCRIPTIONS_PER_SESSION",
                    per_session.as_str(),
                ),
                ("SMOL_MCP_MAX_SUBSCRIPTIONS", in_all.as_str()),
            ])
            .await;
            let server = smol_mcp::protocol::server::SmolMcp::new(h.protocol.clone(), "second");
            let client_io = crate::common::mcp::serve_in_memory(server, 1 << 16);
            let second = ().serve(client_io).await.unwrap();
            let clients = [h.client.peer().clone(), second.peer().clone()];
            let mut held: [BTreeSet<String>; 2] = [BTreeSet::new(), BTreeSet::new()];
            for op in &ops {
                match *op {
                    SubscriptionOp::Subscribe(c, m, sp) => {
                        let uri = logs_uri(m, sp);
                        let answer = tokio::time::timeout(
                            ANSWER_WAIT,
                            clients[c].subscribe(SubscribeRequestParams::new(uri.clone())),
                        )
                        .await
                        .map_err(|_| TestCaseError::fail(format!("{op:?}: no answer")))?;
                        let total: usize = held.iter().map(BTreeSet::len).sum();
                        if held[c].contains(&uri) {
                            prop_assert!(answer.is_ok(), "{op:?}: {answer:?}");
                        } else if held[c].len() >= PER_SESSION {
                            prop_assert!(answer.is_err(), "{op:?}: {answer:?}");
                            // Each case that reaches here asserts the same text.
                            insta::allow_duplicates! {
                                insta::assert_snapshot!(refusal(&answer, &uri), @r#"Mcp error: -32602: uri: "[uri]" not followed: this session already follows 3 logs, its limit (maxSubscriptionsPerSession, SMOL_MCP_MAX_SUBSCRIPTIONS_PER_SESSION); unsubscribe from one first"#);
                            }
                        } else if m >= 3 {
                            let err = format!("{answer:?}");
                            prop_assert!(
                                answer.is_err() && err.contains(MACHINES[m]),
                                "{op:?}: {err}"
                            );
                        } else if total >= IN_ALL {
                            prop_assert!(answer.is_err(), "{op:?}: {answer:?}");
                            // Each case that reaches here asserts the same text.
                            insta::allow_duplicates! {
                                insta::assert_snapshot!(refusal(&answer, &uri), @r#"Mcp error: -32602: uri: "[uri]" not followed: this server already holds 4 log subscriptions, its limit (maxSubscriptions, SMOL_MCP_MAX_SUBSCRIPTIONS); unsubscribe from one or end a listen first"#);
                            }
                        } else {
                            prop_assert!(answer.is_ok(), "{op:?}: {answer:?}");
                            held[c].insert(uri);
                        }
                    }
                    SubscriptionOp::Unsubscribe(c, m, sp) => {
                        let uri = logs_uri(m, sp);
                        let answer = clients[c]
                            .unsubscribe(UnsubscribeRequestParams::new(uri.clone()))
                            .await;
                        prop_assert!(answer.is_ok(), "{op:?}: {answer:?}");
                        held[c].remove(&uri);
                    }
                }
                let machines: BTreeSet<String> = held
                    .iter()
                    .flatten()
                    .map(|uri| uri.replace("%66", "f").replace("%67", "g"))
                    .collect();
                prop_assert_eq!(
                    h.protocol.follow.pollers(),
                    machines.len(),
                    "after {:?}",
                    op
                );
            }
            let _ = second.cancel().await;
            let _ = h.client.cancel().await;
            let deadline = tokio::time::Instant::now() + ANSWER_WAIT;
            while h.protocol.follow.pollers() > 0 {
                prop_assert!(
                    tokio::time::Instant::now() < deadline,
                    "pollers left after the sessions ended"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let polled: BTreeSet<String> = fake
                .take_requests()
                .iter()
                .filter_map(|r| r["path"].as_str().map(str::to_owned))
                .filter(|p| p.ends_with("/logs"))
                .collect();
            for path in &polled {
                prop_assert!(
                    !path.contains("gone-"),
                    "an unknown machine was polled: {path}"
                );
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// A client that never reads

/// Generated bursts of requests written by a client that does not read, under a small
/// stdioMaxPendingRequests: the writes stall rather than the server reading on, and once the
/// client reads, every request is answered exactly once.
#[test]
fn never_reading_client_fuzz_stalls_the_writes_and_answers_every_request_once() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let rt = tokio_runtime();
    let burst = (
        1usize..=8,
        1500usize..3000,
        proptest::collection::vec(0..3usize, 1..4),
    );
    let mut runner = runner("never reading", 6);
    let result = runner.run(&burst, |(max_pending, count, kinds)| {
        rt.block_on(async {
            let fake = FakeServe::start().await;
            let dir = tempfile::tempdir().unwrap();
            let max = max_pending.to_string();
            let mut child = tokio::process::Command::new(crate::common::stdio::SERVER)
                .env_clear()
                .envs(server_env(
                    dir.path(),
                    &[
                        ("SMOL_LOCAL_URL", fake.url().as_str()),
                        ("SMOL_MCP_STDIO_MAX_PENDING_REQUESTS", max.as_str()),
                    ],
                ))
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let mut stdin = child.stdin.take().unwrap();
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            let mut payload = String::from(
                "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"fz\",\"version\":\"0\"}}}\n{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n",
            );
            for id in 1..=count {
                // Every other one a tools/list, whose 40 KB answers fill the stdout pipe at once.
                let kind = if id % 2 == 0 { 1 } else { kinds[id % kinds.len()] };
                // Each request padded to about 1 KiB: the payload (1.5 to 3 MB) is many times
                // what the stdin pipe and the server's read buffer hold together, so a finished
                // write can only mean the server read on (without it, 1,500 pings made 75 KB,
                // which a 64 KiB pipe and one read of the codec could take whole).
                let meta = json!({"fuzzPad": "p".repeat(1000)});
                let line = match kind {
                    0 => json!({"jsonrpc": "2.0", "id": id, "method": "ping",
                        "params": {"_meta": meta}}),
                    1 => json!({"jsonrpc": "2.0", "id": id, "method": "tools/list",
                        "params": {"_meta": meta}}),
                    _ => json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                        "params": {"name": "list-machines", "arguments": {}, "_meta": meta}}),
                };
                payload.push_str(&format!("{line}\n"));
            }
            let writer = tokio::spawn(async move {
                let written = stdin.write_all(payload.as_bytes()).await;
                (stdin, written)
            });
            // Not reading: the payload outgrows the stdin pipe and what the server may take
            // on, so the writes stall.
            tokio::time::sleep(Duration::from_millis(500)).await;
            prop_assert!(
                !writer.is_finished(),
                "all {count} requests were read while no answer was (stdioMaxPendingRequests {max_pending})"
            );
            let mut seen = std::collections::HashSet::new();
            while seen.len() < count + 1 {
                let line = tokio::time::timeout(ANSWER_WAIT, lines.next_line())
                    .await
                    .map_err(|_| TestCaseError::fail(format!("{} of {count} answered", seen.len())))?
                    .unwrap()
                    .ok_or_else(|| TestCaseError::fail("stdout closed"))?;
                let answer: Value = serde_json::from_str(&line).unwrap();
                if let Some(id) = answer["id"].as_u64() {
                    prop_assert!(seen.insert(id), "answered twice: {id}");
                }
            }
            let (stdin, written) = writer.await.unwrap();
            prop_assert!(written.is_ok(), "{written:?}");
            drop(stdin);
            let status = tokio::time::timeout(ANSWER_WAIT, child.wait())
                .await
                .unwrap()
                .unwrap();
            prop_assert!(status.success(), "{status}");
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP Host and Origin, and slow bodies

const HTTP_TOKEN: &str = "fuzz-http-token";
const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"fuzz","version":"0"}}}"#;

/// Host values, with PORT for the listener's port. The first three are allowed.
const GOOD_HOSTS: &[&str] = &["127.0.0.1:PORT", "localhost:PORT", "[::1]:PORT"];
const BAD_HOSTS: &[&str] = &[
    "evil.example@127.0.0.1:PORT",
    "evil.example@127.0.0.1",
    "127.0.0.1@evil.example",
    "user:pass@localhost:PORT",
    "127.0.0.1:PORT/mcp",
    "127.0.0.1:PORT?x",
    "127.0.0.1:PORT#x",
    "127.0.0.1:99999",
    "127.0.0.1:",
    "127.0.0.1:PORT:PORT",
    "[::1",
    "[::1]x",
    "[evil.example]:PORT",
    "",
    "evil.example",
    "evil.example:PORT",
    "127.0.0.1.evil.example:PORT",
];
const GOOD_ORIGINS: &[&str] = &["http://127.0.0.1:PORT", "http://localhost:PORT"];
const BAD_ORIGINS: &[&str] = &[
    "http://evil.example",
    "null",
    "http://127.0.0.1:1",
    "https://127.0.0.1:PORT",
    "http://evil.example@127.0.0.1:PORT",
    "",
];

#[derive(Debug, Clone)]
enum HeaderValue {
    Good(usize),
    Bad(usize),
    Random(String),
}

fn header_value(good: usize, bad: usize) -> impl Strategy<Value = HeaderValue> {
    prop_oneof![
        3 => (0..good).prop_map(HeaderValue::Good),
        3 => (0..bad).prop_map(HeaderValue::Bad),
        1 => "[a-zA-Z0-9@:/.\\[\\]_?#%-]{0,24}".prop_map(HeaderValue::Random),
    ]
}

impl HeaderValue {
    /// The text, and whether it is one the listener allows.
    fn text(&self, good: &[&str], bad: &[&str], port: u16) -> (String, bool) {
        let port = port.to_string();
        match self {
            HeaderValue::Good(i) => (good[*i].replace("PORT", &port), true),
            HeaderValue::Bad(i) => (bad[*i].replace("PORT", &port), false),
            HeaderValue::Random(text) => {
                let allowed = good.iter().any(|g| g.replace("PORT", &port) == text.trim());
                (text.clone(), allowed)
            }
        }
    }
}

async fn raw_http(port: u16, request: &[u8], within: Duration) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(request).await.ok()?;
    let mut answer = Vec::new();
    tokio::time::timeout(within, s.read_to_end(&mut answer))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&answer).into_owned())
}

/// A refusal of the guard: 400 or 403, with a JSON-RPC error that names what it refused.
fn json_rpc_refusal(answer: &str, naming: &[&str]) -> Result<(), TestCaseError> {
    let status = answer.get(9..12).unwrap_or_default();
    prop_assert!(status == "400" || status == "403", "{answer}");
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap_or_default())
        .map_err(|e| TestCaseError::fail(format!("not JSON ({e}): {answer}")))?;
    prop_assert_eq!(&body["jsonrpc"], "2.0", "{}", answer);
    let message = body["error"]["message"].as_str().unwrap_or_default();
    prop_assert!(
        naming.iter().any(|n| message.contains(n)),
        "{message} names none of {naming:?}"
    );
    Ok(())
}

#[test]
fn http_host_and_origin_fuzz_serves_only_one_allowed_host_and_origin() {
    let rt = tokio_runtime();
    let (_fake, _dir, server) = fuzzed_http_server(&rt, &[]);
    let port = server.port;
    let cases = (
        proptest::collection::vec(header_value(GOOD_HOSTS.len(), BAD_HOSTS.len()), 0..3),
        proptest::collection::vec(header_value(GOOD_ORIGINS.len(), BAD_ORIGINS.len()), 0..3),
    );
    let mut runner = runner("http host and origin", 96);
    let result = runner.run(&cases, |(hosts, origins)| {
        let hosts: Vec<(String, bool)> = hosts
            .iter()
            .map(|h| h.text(GOOD_HOSTS, BAD_HOSTS, port))
            .collect();
        let origins: Vec<(String, bool)> = origins
            .iter()
            .map(|o| o.text(GOOD_ORIGINS, BAD_ORIGINS, port))
            .collect();
        let mut request = String::from("POST /mcp HTTP/1.1\r\n");
        for (h, _) in &hosts {
            request.push_str(&format!("host: {h}\r\n"));
        }
        for (o, _) in &origins {
            request.push_str(&format!("origin: {o}\r\n"));
        }
        request.push_str(&format!(
            "authorization: Bearer {HTTP_TOKEN}\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\nconnection: close\r\n\
             content-length: {}\r\n\r\n{INITIALIZE}",
            INITIALIZE.len()
        ));
        let host_ok = hosts.len() == 1 && hosts[0].1;
        let origin_ok = origins.len() <= 1 && origins.iter().all(|(_, ok)| *ok);
        let answer = rt
            .block_on(raw_http(port, request.as_bytes(), ANSWER_WAIT))
            .ok_or_else(|| TestCaseError::fail(format!("no answer to {request:?}")))?;
        if host_ok && origin_ok {
            prop_assert!(answer.starts_with("HTTP/1.1 200"), "{request:?}: {answer}");
        } else {
            let naming: &[&str] = if host_ok { &["Origin"] } else { &["Host"] };
            json_rpc_refusal(&answer, naming)
                .map_err(|e| TestCaseError::fail(format!("{request:?}: {e}")))?;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// How a body is sent: its pieces' sizes and the pauses between them, and where it stops.
#[derive(Debug, Clone)]
struct Dribble {
    pieces: Vec<(usize, u64)>,
    /// Some(n): only the first n bytes are sent.
    stop_at: Option<usize>,
}

fn dribble() -> impl Strategy<Value = Dribble> {
    (
        proptest::collection::vec((1usize..64, 0u64..120), 1..6),
        proptest::option::of(0..INITIALIZE.len()),
    )
        .prop_map(|(pieces, stop_at)| Dribble { pieces, stop_at })
}

#[test]
fn http_body_fuzz_serves_bodies_in_time_and_closes_late_ones_with_408() {
    let rt = tokio_runtime();
    let (_fake, _dir, server) =
        fuzzed_http_server(&rt, &[("SMOL_MCP_HTTP_BODY_TIMEOUT_SECS", "2")]);
    let port = server.port;
    let mut runner = runner("http bodies", 16);
    let result = runner.run(&dribble(), |d| {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let body = INITIALIZE.as_bytes();
        let end = d.stop_at.unwrap_or(body.len());
        rt.block_on(async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            let head = format!(
                "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nauthorization: Bearer {HTTP_TOKEN}\r\n\
                 content-type: application/json\r\naccept: application/json, text/event-stream\r\n\
                 connection: close\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await.unwrap();
            let started = std::time::Instant::now();
            let (mut sent, mut pieces) = (0, d.pieces.iter().cycle());
            while sent < end {
                let (size, pause) = pieces.next().copied().unwrap_or((64, 0));
                // Pauses stop once a piece has used its share: what arrives in time must.
                if started.elapsed() < Duration::from_millis(600) {
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                let next = (sent + size).min(end);
                s.write_all(&body[sent..next]).await.unwrap();
                sent = next;
            }
            let mut answer = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(6), s.read_to_end(&mut answer)).await;
            let answer = String::from_utf8_lossy(&answer).into_owned();
            prop_assert!(read.is_ok(), "{d:?}: the connection was not closed: {answer}");
            if d.stop_at.is_some() {
                prop_assert!(answer.starts_with("HTTP/1.1 408"), "{d:?}: {answer}");
                prop_assert!(started.elapsed() >= Duration::from_millis(1500), "{d:?}");
                let body: Value =
                    serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap_or_default())
                        .map_err(|e| TestCaseError::fail(format!("not JSON ({e}): {answer}")))?;
                // Each case that reaches here asserts the same text.
                insta::allow_duplicates! {
                    insta::assert_snapshot!(
                        body["error"]["message"].as_str().unwrap_or_default(),
                        @"request timeout: the body did not arrive within 2 s (httpBodyTimeoutSecs)"
                    );
                }
            } else {
                prop_assert!(answer.starts_with("HTTP/1.1 200"), "{d:?}: {answer}");
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
