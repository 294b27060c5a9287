#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod asker;
pub mod balancer;
pub mod clients;
pub mod conformance;
pub mod fake_cloud;
pub mod fake_serve;
pub mod fake_stream;
pub mod guest_shell;
pub mod mcp;
pub mod nested;
pub mod oidc;
pub mod real_serve;
pub mod record_contract;
pub mod sessionless;
pub mod stdio;
pub mod store_contract;

/// How many tools a server offers with neither host directories nor credentials set up (the
/// tests' usual servers): keep-changes is not offered there.
pub fn offered_without_settings() -> usize {
    let bare = smol_mcp::policy::tools::schema::Offers {
        host_dirs: false,
        credentials: false,
        views: false,
        ..smol_mcp::policy::tools::schema::Offers::ALL
    };
    smol_mcp::policy::tools::Tool::ALL
        .iter()
        .filter(|tool| bare.lists(**tool))
        .count()
}

/// The session an HTTP initialize opened, as its answer names it in `mcp-session-id`.
pub fn session_id(response: &reqwest::Response) -> String {
    response.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned()
}

/// The session an HTTP initialize opened (answered 200), its answer read to the end.
pub async fn opened_session(init: reqwest::Response) -> String {
    assert_eq!(init.status(), 200);
    let session = session_id(&init);
    init.text().await.unwrap();
    session
}

/// Polls `done` every 20 ms until it holds, failing the test naming `what` once `limit` has
/// passed without it; answers how long it took.
pub async fn until(
    what: &str,
    limit: std::time::Duration,
    mut done: impl FnMut() -> bool,
) -> std::time::Duration {
    let start = std::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < limit,
            "{what} did not happen within {limit:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// The body of the answer to `request`, failing the test if it cannot be sent or read.
pub async fn text_answer(request: reqwest::RequestBuilder) -> String {
    request.send().await.unwrap().text().await.unwrap()
}

/// A JSON-RPC answer refused as invalid params (-32602), its message saying `says`.
pub fn assert_invalid_params(answer: &serde_json::Value, says: &str) {
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains(says), "{answer}");
}

/// The items of a JSON array of strings, failing the test on anything else.
pub fn strings(array: &serde_json::Value) -> Vec<&str> {
    array
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item.as_str().unwrap())
        .collect()
}

/// Runs the host's git in `dir` as a user would (a user's identity for the commits it makes),
/// and answers its trimmed output; a failure fails the test, with what git said.
pub fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "User")
        .env("GIT_AUTHOR_EMAIL", "user@example.com")
        .env("GIT_COMMITTER_NAME", "User")
        .env("GIT_COMMITTER_EMAIL", "user@example.com")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A whole file from a fleet's stream, and the size its answer declared.
pub async fn read_all(stream: smol_mcp::fleet::FileStream) -> (Option<u64>, Vec<u8>) {
    use futures::StreamExt;
    let size = stream.size;
    let mut bytes = Vec::new();
    let mut chunks = stream.chunks;
    while let Some(chunk) = chunks.next().await {
        bytes.extend_from_slice(&chunk.unwrap());
    }
    (size, bytes)
}

/// A process's stderr with the tracing timestamp that starts a line
/// (`2026-12-04T13:03:02.146568Z`) written `[time]`, so that a refusal it logs can be pinned
/// whole; a line that starts with anything else is left as it is.
pub fn without_timestamps(stderr: &str) -> String {
    stderr
        .lines()
        .map(|line| match line.split_once(' ') {
            Some((stamp, rest)) if chrono::DateTime::parse_from_rfc3339(stamp).is_ok() => {
                format!("[time] {rest}")
            }
            _ => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}
