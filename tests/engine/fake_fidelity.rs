//! The fake serve against the real one: the same requests to both, the answers compared on
//! status, the body's form (the engine's `{error, code}` JSON, plain text, or empty) and code,
//! and the message where the fake copies it. Only what the real serve answers without booting a
//! guest (guests cannot boot on the CI hosts, and exec or files on a stopped machine make the
//! real serve try for about 30 s): unknown machines on every per-machine route, a machine that
//! never started on the routes that answer at once, the name rule, unknown fields, an oversized
//! upload to an unknown machine. A difference here is a fake to fix.

use crate::common::fake_serve::FakeServe;
use crate::common::nested::json_answer;
use crate::common::real_serve::RealServe;
use serde_json::{Value, json};
use smol_mcp::fleet::transport::LocalEndpoint;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How much of the message the fake must share with the engine.
#[derive(Debug, Clone, Copy)]
enum Message {
    Exact,
    /// The first this many characters (the engine adds serde's position, or a list in its own
    /// order).
    Prefix(usize),
    /// Only the status, form and code.
    Any,
}

#[derive(Debug, PartialEq)]
struct Seen {
    status: u16,
    /// `json`, `text` or `empty`.
    form: &'static str,
    code: Option<String>,
    message: String,
}

async fn ask(endpoint: &LocalEndpoint, method: &str, path: &str, body: Option<Value>) -> Seen {
    let http = endpoint.http_client().unwrap();
    let url = format!("{}{path}", endpoint.base_url());
    let mut request = http.request(method.parse().unwrap(), url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let text = response.text().await.unwrap();
    seen(status, &content_type, &text)
}

fn seen(status: u16, content_type: &str, text: &str) -> Seen {
    if text.is_empty() {
        return Seen {
            status,
            form: "empty",
            code: None,
            message: String::new(),
        };
    }
    if content_type.starts_with("application/json") {
        let v: Value = serde_json::from_str(text).unwrap();
        return Seen {
            status,
            form: "json",
            code: v["code"].as_str().map(str::to_owned),
            message: v["error"].as_str().unwrap_or_default().to_owned(),
        };
    }
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    Seen {
        status,
        form: "text",
        code: None,
        message: text.to_owned(),
    }
}

/// A PUT that declares a body over the engine's upload limit and sends none of it: the answer
/// must come before the body does.
async fn oversized_put(endpoint: &LocalEndpoint, path: &str) -> Seen {
    let LocalEndpoint::Unix(socket) = endpoint else {
        panic!("a Unix socket endpoint");
    };
    let mut stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    let head = format!(
        "PUT {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        100 * 1024 * 1024 + 1
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            answer.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&answer).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if body.len() >= len || n == 0 {
                    return text;
                }
            }
            if n == 0 {
                return text;
            }
        }
    };
    let text = tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .expect("an answer before the body");
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    seen(status, &content_type, body)
}

fn compare(what: &str, real: &Seen, fake: &Seen, message: Message) {
    assert_eq!(
        (real.status, real.form, &real.code),
        (fake.status, fake.form, &fake.code),
        "{what}: real {real:?}, fake {fake:?}"
    );
    match message {
        Message::Exact => assert_eq!(real.message, fake.message, "{what}"),
        Message::Prefix(n) => {
            let cut = |m: &str| m.chars().take(n).collect::<String>();
            assert_eq!(cut(&real.message), cut(&fake.message), "{what}");
        }
        Message::Any => {}
    }
}

#[tokio::test]
async fn the_fake_answers_as_the_real_serve_where_no_guest_is_needed() {
    let real = RealServe::start().await;
    let fake = FakeServe::start().await;
    let endpoints = [real.endpoint.clone(), fake.endpoint()];

    // A machine that never started, on both.
    for endpoint in &endpoints {
        let created = ask(
            endpoint,
            "POST",
            "/api/v1/machines",
            Some(json!({"name": "held", "image": "alpine", "cpus": 1, "memoryMb": 512})),
        )
        .await;
        assert_eq!(created.status, 200, "{created:?}");
    }

    let m = "/api/v1/machines";
    let mut cases: Vec<(String, &str, String, Option<Value>, Message)> = Vec::new();
    let mut case = |what: &str, method: &'static str, path: String, body, message| {
        cases.push((what.to_owned(), method, path, body, message));
    };
    // An unknown machine on every per-machine route.
    for (method, route, body) in [
        ("GET", "", None),
        ("DELETE", "", None),
        ("POST", "/start", None),
        ("POST", "/stop", None),
        ("POST", "/fork", Some(json!({"name": "child"}))),
        ("POST", "/branches", Some(json!({"name": "child"}))),
        ("POST", "/exec", Some(json!({"command": ["true"]}))),
        ("GET", "/files/tmp%2Fa", None),
        ("GET", "/logs?tail=5&follow=false", None),
        ("GET", "/logs?tail=10001&follow=false", None),
        ("POST", "/images/pull", Some(json!({"image": "alpine"}))),
    ] {
        case(
            &format!("unknown machine: {method} {route}"),
            method,
            format!("{m}/nope{route}"),
            body,
            Message::Exact,
        );
    }
    // The body is refused before the machine is looked for.
    case(
        "exec of an empty command, unknown machine",
        "POST",
        format!("{m}/nope/exec"),
        Some(json!({"command": []})),
        Message::Exact,
    );
    case(
        "exec with an unknown field, unknown machine",
        "POST",
        format!("{m}/nope/exec"),
        Some(json!({"command": ["true"], "bogus": 1})),
        Message::Prefix(96),
    );
    // A machine that never started, on the routes that answer without booting it.
    case(
        "exec of an empty command, stopped machine",
        "POST",
        format!("{m}/held/exec"),
        Some(json!({"command": []})),
        Message::Exact,
    );
    for route in ["/logs?tail=5&follow=false", "/logs?tail=10001&follow=false"] {
        case(
            &format!("never-started machine: GET {route}"),
            "GET",
            format!("{m}/held{route}"),
            None,
            Message::Exact,
        );
    }
    for route in ["/fork", "/branches"] {
        case(
            &format!("never-started machine: POST {route}"),
            "POST",
            format!("{m}/held{route}"),
            Some(json!({"name": "child"})),
            Message::Exact,
        );
    }
    case(
        "never-started machine: stop",
        "POST",
        format!("{m}/held/stop"),
        None,
        Message::Any,
    );
    // Create: the name rule, a taken name, an unknown field.
    let too_long = format!("n{}", "x".repeat(128));
    for name in [
        "",
        "dot.ted",
        "-leading",
        "_leading",
        "trailing-",
        "two--dashes",
        "sp ace",
        "ümlaut",
        too_long.as_str(),
        "held",
    ] {
        case(
            &format!("create {name:?}"),
            "POST",
            m.to_owned(),
            Some(json!({"name": name, "image": "alpine"})),
            Message::Exact,
        );
    }
    case(
        "create with an unknown field",
        "POST",
        m.to_owned(),
        Some(json!({"name": "bogus", "image": "alpine", "bogus": 1})),
        Message::Prefix(96),
    );

    for (what, method, path, body, message) in cases {
        let real_seen = ask(&endpoints[0], method, &path, body.clone()).await;
        let fake_seen = ask(&endpoints[1], method, &path, body).await;
        compare(&what, &real_seen, &fake_seen, message);
    }

    // The stop of a machine that never started leaves it as it was, on both.
    for endpoint in &endpoints {
        let got = ask(endpoint, "GET", &format!("{m}/held"), None).await;
        assert_eq!(got.status, 200);
    }
    let state = |endpoint: &LocalEndpoint| {
        let endpoint = endpoint.clone();
        async move {
            let http = endpoint.http_client().unwrap();
            let v = json_answer(http.get(format!("{}/api/v1/machines/held", endpoint.base_url())))
                .await;
            v["state"].clone()
        }
    };
    assert_eq!(state(&endpoints[0]).await, state(&endpoints[1]).await);

    // An upload declaring more than the limit, to an unknown machine: the machine is looked for
    // first, and the answer comes without the body being sent.
    let real_seen = oversized_put(&endpoints[0], &format!("{m}/nope/files/tmp%2Fbig")).await;
    let fake_seen = oversized_put(&endpoints[1], &format!("{m}/nope/files/tmp%2Fbig")).await;
    compare(
        "oversized upload, unknown machine",
        &real_seen,
        &fake_seen,
        Message::Exact,
    );
}
