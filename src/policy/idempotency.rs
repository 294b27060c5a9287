//! Idempotency keys: a call that creates or changes something, made again with the key it was
//! first made with, answers with the first call's answer (or waits for it while it runs) and
//! does nothing again; the same key with other arguments is refused, naming both calls.
//!
//! Why: a client that gives up waiting (its own timeout, a dropped connection) cannot know
//! whether its create or its command happened; without a key its retry makes a second machine
//! or runs the command twice. With a key, the work runs to its end whatever becomes of the
//! request that started it, and any repeat within a day gets its answer.
//!
//! A key is claimed in the store before the work starts (one SQLite statement, so two
//! processes sharing the file never both run it) and answered there when it succeeds; a failed
//! call frees its key for a retry. A restarted process therefore honours the keys of the one
//! before it. Without a store, repeats made while the first call runs still join it.

use crate::policy::error::{ToolError, ToolErrorKind};
use crate::store::{KeyClaim, KeyRecord, Store};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The argument every creating or changing tool takes.
pub const KEY_ARGUMENT: &str = "idempotencyKey";
/// What the catalog says of it (once, at its first tool; the others refer to it).
pub const KEY_DESCRIPTION: &str = "Your UUID: a retry within 24 h gets the first answer, \
     acting once.";
pub const KEY_MAX_CHARS: usize = 128;
/// How often a repeat checks on a first call that runs in another process.
const POLL: Duration = Duration::from_millis(200);
/// An environment value shorter than this is not looked for in a kept answer (as the run
/// ledger does: "1" or "on" would blank every digit and word of it).
const REDACT_MIN_BYTES: usize = 4;

/// The answer a keyed call gave (the tool's answer as JSON), or its error.
pub type Outcome = Result<Value, ToolError>;

/// How a keyed call's work ended. `last: false` when its answer is not the call's last word: it
/// puts a question to the user (a 2026-07-28 input-required result), and the call comes again
/// with the user's answer, which a kept answer would never let through. Such an answer is not
/// kept and the key is freed.
pub struct Ended {
    pub outcome: Outcome,
    pub last: bool,
}

/// The keyed calls running in this process, by key. Bounded by the calls themselves: an entry
/// lives while its call runs.
#[derive(Default)]
pub struct Keys {
    running: Mutex<HashMap<String, Running>>,
}

struct Running {
    call: Described,
    done: watch::Receiver<Option<Outcome>>,
}

/// A call as a key names it: its tool, a fingerprint of its arguments and one of each argument.
/// No value is kept: a refusal of a key reused with other arguments names the arguments that
/// differ, never what either call gave (a command, stdin, a file's content, an environment).
#[derive(Debug, Clone)]
pub struct Described {
    pub tool: String,
    pub fingerprint: String,
    /// Each argument's own fingerprint, by name.
    pub arguments: BTreeMap<String, String>,
    /// The call's environment values with what replaces them, longest first: a kept answer is
    /// stored without them, as the run ledger keeps runs. In memory only, never compared.
    env_values: Vec<(String, String)>,
}

impl PartialEq for Described {
    fn eq(&self, other: &Described) -> bool {
        self.tool == other.tool && self.fingerprint == other.fingerprint
    }
}

impl Described {
    /// `answer` as the key's record keeps it: without the call's environment values, looked
    /// for in each string of the answer (in the JSON text a value holding a quote or a
    /// backslash is escaped, and would not be found).
    fn kept_answer(&self, answer: &Value) -> String {
        let mut kept = answer.clone();
        crate::policy::output::rewrite_strings(&mut kept, &|text| {
            let mut out: Option<String> = None;
            for (value, name) in &self.env_values {
                let current = out.as_deref().unwrap_or(text);
                if current.contains(value.as_str()) {
                    out = Some(current.replace(value.as_str(), name));
                }
            }
            out
        });
        kept.to_string()
    }
}

impl Described {
    /// The ledger's record of `key` claimed for this call by process `pid`, not yet answered.
    fn claim(&self, key: &str, pid: u32, started_ms: i64) -> KeyRecord {
        KeyRecord {
            key: key.to_owned(),
            pid,
            holder: None,
            pid_started: crate::process::ephemeral::process_started(pid),
            tool: self.tool.clone(),
            fingerprint: self.fingerprint.clone(),
            arguments: serde_json::to_string(&self.arguments).unwrap_or_default(),
            started_ms,
            answer: None,
            answer_dropped: false,
        }
    }
}

/// Takes the key out of a call's arguments (the tool's own arguments are checked without it),
/// checked: `None` when the call has none.
pub fn take_key(args: &mut Value) -> Result<Option<String>, ToolError> {
    let Some(given) = args.as_object_mut().and_then(|a| a.remove(KEY_ARGUMENT)) else {
        return Ok(None);
    };
    let refuse = |why: &str| {
        ToolError::argument(
            KEY_ARGUMENT,
            format!(
                "{why}; give 1 to {KEY_MAX_CHARS} printable ASCII characters without spaces \
                 (a UUID is a good key), or leave it out"
            ),
        )
    };
    let Value::String(key) = given else {
        return Err(refuse("expected a string"));
    };
    if key.is_empty() || key.chars().count() > KEY_MAX_CHARS {
        return Err(refuse(&format!("{} characters", key.chars().count())));
    }
    if !key.chars().all(|c| c.is_ascii_graphic()) {
        return Err(refuse(
            "it holds a space, a control or a non-ASCII character",
        ));
    }
    Ok(Some(key))
}

/// `tool`'s call with `args` (its key taken out) as a key names it.
pub fn describe(tool: &'static str, args: &Value) -> Described {
    let arguments = match args {
        Value::Object(map) => map
            .iter()
            .map(|(name, value)| (name.clone(), digest(&canonical(value))))
            .collect(),
        _ => BTreeMap::new(),
    };
    let mut env_values: Vec<(String, String)> = args
        .get("env")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(name, value)| Some((value.as_str()?.to_owned(), format!("[${name}]"))))
        .filter(|(value, _)| value.len() >= REDACT_MIN_BYTES)
        .collect();
    env_values.sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
    Described {
        tool: tool.to_owned(),
        fingerprint: digest(&format!("{tool}\n{}", canonical(args))),
        arguments,
        env_values,
    }
}

/// The first 16 bytes of `text`'s SHA-256, in hex.
fn digest(text: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, text.as_bytes()).as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// JSON with every object's keys in order, so that the same arguments always print the same.
fn canonical(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::from(k.as_str()), canonical(&map[k])))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(canonical).collect();
            format!("[{}]", items.join(","))
        }
        other => other.to_string(),
    }
}

/// " N s ago", of a call started at `started_ms`.
fn ago(started_ms: i64) -> String {
    let secs = (chrono::Utc::now().timestamp_millis() - started_ms).max(0) / 1000;
    format!(" {secs} s ago")
}

/// The refusal of a key already naming another call: `first_arguments` is `None` when its
/// record does not read as argument fingerprints (a record of an earlier release).
fn mismatch(
    key: &str,
    first_tool: &str,
    first_arguments: Option<&BTreeMap<String, String>>,
    first_ms: Option<i64>,
    this: &Described,
) -> ToolError {
    let mut differ: Vec<String> = Vec::new();
    if first_tool != this.tool {
        differ.push("the tool".into());
    }
    match first_arguments {
        Some(first) => {
            let names: std::collections::BTreeSet<&String> =
                first.keys().chain(this.arguments.keys()).collect();
            differ.extend(
                names
                    .into_iter()
                    .filter(|n| first.get(*n) != this.arguments.get(*n))
                    .cloned(),
            );
        }
        None => differ.push("the arguments".into()),
    }
    if differ.is_empty() {
        differ.push("the arguments".into());
    }
    let when = first_ms
        .map(|ms| format!(", made{}", ago(ms)))
        .unwrap_or_default();
    ToolError::argument(
        KEY_ARGUMENT,
        format!(
            "\"{key}\" already names another call, of {first_tool}{when}; this call of \
             {} differs from it in {}. A key names one call: use a new key for this one.",
            this.tool,
            differ.join(", ")
        ),
    )
}

impl Keys {
    /// Runs `work` once for `key`: the first call with it runs `work` (to its end, even if
    /// `caller_ct` is cancelled); a repeat with the same call waits for that and answers the
    /// same; a call of another shape is refused. `caller_ct` ends only this caller's wait.
    ///
    /// A first call that runs in another live process is waited for at most `longest`, the
    /// longest any call can rightly take: past that it is stuck, and holding on to its repeat
    /// would only add a waiter nothing ever ends.
    pub async fn once<W>(
        self: &Arc<Self>,
        store: &Arc<dyn Store>,
        key: String,
        call: Described,
        longest: Duration,
        caller_ct: CancellationToken,
        work: W,
    ) -> Outcome
    where
        W: Future<Output = Ended> + Send + 'static,
    {
        let joined = {
            let Ok(mut running) = self.running.lock() else {
                return Err(ToolError::new(
                    ToolErrorKind::Internal,
                    "the idempotency keys' lock was poisoned",
                ));
            };
            match running.get(&key) {
                Some(first) if first.call != call => {
                    let first = &first.call;
                    return Err(mismatch(
                        &key,
                        &first.tool,
                        Some(&first.arguments),
                        None,
                        &call,
                    ));
                }
                Some(first) => first.done.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    running.insert(
                        key.clone(),
                        Running {
                            call: call.clone(),
                            done: rx.clone(),
                        },
                    );
                    let keys = self.clone();
                    let store = store.clone();
                    tokio::spawn(
                        async move {
                            let outcome = lead(&store, &key, &call, longest, work).await;
                            if let Ok(mut running) = keys.running.lock() {
                                running.remove(&key);
                            }
                            let _ = tx.send(Some(outcome));
                        }
                        .in_current_span(),
                    );
                    rx
                }
            }
        };
        wait(joined, caller_ct).await
    }
}

async fn wait(mut done: watch::Receiver<Option<Outcome>>, ct: CancellationToken) -> Outcome {
    tokio::select! {
        ended = done.wait_for(Option::is_some) => match ended {
            Ok(outcome) => outcome.clone().unwrap_or_else(|| Err(lost())),
            Err(_) => Err(lost()),
        },
        _ = ct.cancelled() => Err(ToolError::new(
            ToolErrorKind::Cancelled,
            "the client cancelled this call; the work its idempotencyKey names goes on, and a \
             repeat with the same key and arguments answers with its result",
        )),
    }
}

fn lost() -> ToolError {
    ToolError::new(
        ToolErrorKind::Internal,
        "the call this idempotencyKey names ended without an answer",
    )
}

/// The first call in this process with a key: claims it in the store, then runs the work, or
/// answers as the call that holds it (elsewhere, or before) did.
async fn lead<W>(
    store: &Arc<dyn Store>,
    key: &str,
    call: &Described,
    longest: Duration,
    work: W,
) -> Outcome
where
    W: Future<Output = Ended>,
{
    let record = call.claim(
        key,
        std::process::id(),
        chrono::Utc::now().timestamp_millis(),
    );
    let waiting_since = tokio::time::Instant::now();
    loop {
        let claim = store.keys().claim(record.clone()).await.map_err(|e| {
            ToolError::new(
                ToolErrorKind::StoreUnavailable,
                format!(
                    "idempotencyKey \"{key}\" could not be claimed, so the call was not run \
                     (it could not be kept from running twice): {e}. Repeat it shortly with the \
                     same key, or without a key to run it unguarded."
                ),
            )
        })?;
        match claim {
            KeyClaim::Claimed => break,
            KeyClaim::Taken(first) => {
                if first.tool != call.tool || first.fingerprint != call.fingerprint {
                    let arguments: Option<BTreeMap<String, String>> =
                        serde_json::from_str(&first.arguments).ok();
                    return Err(mismatch(
                        key,
                        &first.tool,
                        arguments.as_ref(),
                        Some(first.started_ms),
                        call,
                    ));
                }
                if let Some(answer) = &first.answer {
                    return serde_json::from_str(answer).map_err(|e| {
                        ToolError::new(
                            ToolErrorKind::Internal,
                            format!("the answer kept for this idempotencyKey does not read: {e}"),
                        )
                    });
                }
                if first.answer_dropped {
                    return Err(ToolError::new(
                        ToolErrorKind::Fleet(crate::fleet::ErrorKind::Conflict),
                        format!(
                            "the call idempotencyKey \"{key}\" names (started{}) succeeded, but its answer \
                             is no longer kept (the ledger keeps the newest {} MiB of answers): \
                             it took effect once and is not run again. Check (list-machines, \
                             smol://runs), then use a new key if more is needed.",
                            ago(first.started_ms),
                            crate::store::KEY_ANSWERS_MAX_BYTES / (1024 * 1024)
                        ),
                    ));
                }
                if !store.keys().holder_alive(&first).await {
                    return Err(ToolError::new(
                        ToolErrorKind::Fleet(crate::fleet::ErrorKind::Conflict),
                        format!(
                            "the call idempotencyKey \"{key}\" names was cut off when its server \
                             process ({}) ended, before it answered: whether it took effect is \
                             unknown. Check (list-machines, smol://runs), then \
                             repeat it with a new key if it is still needed.",
                            first.pid
                        ),
                    ));
                }
                // Another live process runs it: its answer (or its failure, which frees the
                // key) shows in the ledger.
                if waiting_since.elapsed() >= longest {
                    return Err(ToolError::new(
                        ToolErrorKind::Fleet(crate::fleet::ErrorKind::Timeout),
                        format!(
                            "the call idempotencyKey \"{key}\" names still runs in server \
                             process {} after {} s here, longer than any call should take: it \
                             may be stuck, and whether it takes effect is unknown. Repeat with \
                             the same key later for its answer, or check (list-machines, \
                             smol://runs) and use a new key.",
                            first.pid,
                            waiting_since.elapsed().as_secs()
                        ),
                    ));
                }
                tokio::time::sleep(POLL).await;
            }
        }
    }
    let Ended { outcome, last } = work.await;
    match &outcome {
        Ok(answer) if last => store.keys().answered(key, call.kept_answer(answer)),
        _ => store.keys().released(key),
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn store_in(runtime: &std::path::Path) -> Arc<dyn Store> {
        let vars = std::collections::BTreeMap::from([(
            "SMOL_MCP_RUNTIME_DIR".to_owned(),
            runtime.display().to_string(),
        )]);
        let config = crate::process::config::Config::from_sources(
            &vars,
            std::path::Path::new("/nonexistent"),
        )
        .unwrap();
        crate::store::open(&config, crate::process::events::Events::default())
    }

    /// A repeat of `call` with `key` that must be refused within 5 s without its work running.
    async fn refused_repeat(
        store: &Arc<dyn Store>,
        key: &str,
        call: Described,
        longest: Duration,
    ) -> ToolError {
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ran_in_work = ran.clone();
        let work = async move {
            ran_in_work.store(true, std::sync::atomic::Ordering::SeqCst);
            Ended {
                outcome: Ok(json!({})),
                last: true,
            }
        };
        let keys = Arc::new(Keys::default());
        let ct = CancellationToken::new();
        let waited = keys.once(store, key.into(), call, longest, ct, work);
        let outcome = tokio::time::timeout(Duration::from_secs(5), waited)
            .await
            .expect("the repeat still waited after 5 s");
        assert!(
            !ran.load(std::sync::atomic::Ordering::SeqCst),
            "the work ran"
        );
        outcome.unwrap_err()
    }

    #[tokio::test]
    async fn a_repeat_whose_answer_was_dropped_is_told_so_and_not_run_again() {
        let runtime = tempfile::tempdir().unwrap();
        let store = store_in(runtime.path());
        let call = describe("create-machine", &json!({"name": "m"}));
        let started_ms = chrono::Utc::now().timestamp_millis() - 90_000;
        let record = call.claim("k-2", std::process::id(), started_ms);
        assert_eq!(store.keys().claim(record).await, Ok(KeyClaim::Claimed));
        store.flush().await;
        // As the store's pruning leaves an answer past its byte budget.
        let db = rusqlite::Connection::open(runtime.path().join(crate::store::sqlite::FILE_NAME))
            .unwrap();
        db.execute(
            "UPDATE idempotency_keys SET answer_dropped = 1 WHERE key = 'k-2'",
            [],
        )
        .unwrap();

        let e = refused_repeat(&store, "k-2", call, Duration::from_secs(60)).await;
        assert_eq!(
            e.kind,
            ToolErrorKind::Fleet(crate::fleet::ErrorKind::Conflict),
            "{e}"
        );
        assert!(e.message.contains("no longer kept"), "{e}");
        assert!(e.message.contains("(started 9"), "{e}");
    }

    #[tokio::test]
    async fn a_first_call_stuck_in_another_live_process_is_waited_for_only_so_long() {
        let runtime = tempfile::tempdir().unwrap();
        let store = store_in(runtime.path());
        let call = describe("create-machine", &json!({"name": "m"}));
        // Process 1 is alive wherever this runs, and is not this one.
        let held = call.claim("k-1", 1, chrono::Utc::now().timestamp_millis());
        assert_eq!(store.keys().claim(held).await, Ok(KeyClaim::Claimed));

        let started = std::time::Instant::now();
        let longest = Duration::from_millis(700);
        let e = refused_repeat(&store, "k-1", call, longest).await;
        assert!(started.elapsed() >= longest, "{:?}", started.elapsed());
        assert_eq!(
            e.kind,
            ToolErrorKind::Fleet(crate::fleet::ErrorKind::Timeout),
            "{e}"
        );
        assert!(e.message.contains("still runs in server process 1"), "{e}");
    }

    /// A holder that ended but is not reaped (a zombie), or a pid now another process's, is
    /// dead: the repeat is told at once (it waited the longest call's time, about 23 minutes).
    #[tokio::test]
    async fn a_key_held_by_a_zombie_or_a_reused_pid_is_answered_at_once() {
        let runtime = tempfile::tempdir().unwrap();
        let store = store_in(runtime.path());
        let call = describe("create-machine", &json!({"name": "m"}));
        let mut zombie = std::process::Command::new("true").spawn().unwrap();
        let zombie_pid = zombie.id();
        // Not waited for, so not reaped: once it has exited it is a zombie.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(format!("/proc/{zombie_pid}/stat"))
            .is_ok_and(|stat| !stat.contains(") Z"))
        {
            assert!(std::time::Instant::now() < deadline, "never a zombie");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!crate::process::ephemeral::process_alive(zombie_pid));
        let held = call.claim(
            "k-zombie",
            zombie_pid,
            chrono::Utc::now().timestamp_millis(),
        );
        assert_eq!(store.keys().claim(held).await, Ok(KeyClaim::Claimed));
        let e = refused_repeat(&store, "k-zombie", call.clone(), Duration::from_secs(60)).await;
        assert!(e.message.contains("was cut off"), "{e}");
        zombie.wait().unwrap();

        // Process 1 lives, but it is not the process that started when the record says.
        let mut reused = call.claim("k-reused", 1, chrono::Utc::now().timestamp_millis());
        reused.pid_started = reused.pid_started.map(|t| t + 1);
        assert!(reused.pid_started.is_some(), "this host has /proc");
        assert_eq!(store.keys().claim(reused).await, Ok(KeyClaim::Claimed));
        let e = refused_repeat(&store, "k-reused", call, Duration::from_secs(60)).await;
        assert!(e.message.contains("was cut off"), "{e}");
    }

    #[test]
    fn a_key_is_taken_out_of_the_arguments_and_checked() {
        let mut args = json!({"name": "m", "idempotencyKey": "k-1"});
        assert_eq!(take_key(&mut args).unwrap().as_deref(), Some("k-1"));
        assert_eq!(args, json!({"name": "m"}));
        assert_eq!(take_key(&mut json!({"name": "m"})).unwrap(), None);
        for bad in [
            json!(""),
            json!("has space"),
            json!(7),
            json!("x".repeat(129)),
        ] {
            let e = take_key(&mut json!({ "idempotencyKey": bad })).unwrap_err();
            assert!(e.message.starts_with("idempotencyKey: "), "{}", e.message);
            assert!(e.message.contains("UUID"), "{}", e.message);
        }
    }

    #[test]
    fn the_same_arguments_in_any_order_are_the_same_call() {
        let a = describe("run-command", &json!({"name": "m", "command": ["a", "b"]}));
        let b = describe("run-command", &json!({"command": ["a", "b"], "name": "m"}));
        assert_eq!(a, b);
        let c = describe("run-command", &json!({"command": ["a"], "name": "m"}));
        assert_ne!(a.fingerprint, c.fingerprint);
        let d = describe("run-once", &json!({"name": "m", "command": ["a", "b"]}));
        assert_ne!(a.fingerprint, d.fingerprint);
    }

    #[test]
    fn a_refusal_names_the_arguments_that_differ_and_no_value() {
        let first = describe(
            "run-command",
            &json!({"name": "m", "command": "make secret-target", "stdin": "first input",
                    "env": {"TOKEN": "s3cret-value"}}),
        );
        let this = describe(
            "run-command",
            &json!({"name": "n", "command": "make secret-target", "stdin": "other input",
                    "env": {"TOKEN": "other-value"}}),
        );
        let e = mismatch("k", &first.tool, Some(&first.arguments), None, &this);
        insta::assert_snapshot!(e.message, @r#"idempotencyKey: "k" already names another call, of run-command; this call of run-command differs from it in env, name, stdin. A key names one call: use a new key for this one."#);
        let unreadable = mismatch("k", "create-machine", None, Some(0), &this);
        assert!(
            unreadable
                .message
                .contains("differs from it in the tool, the arguments."),
            "{}",
            unreadable.message
        );
    }

    #[test]
    fn a_kept_answer_holds_no_environment_value() {
        let call = describe(
            "run-command",
            &json!({"name": "m", "command": "echo $TOKEN", "env": {"TOKEN": "s3cret-value", "ON": "1"}}),
        );
        let kept = call.kept_answer(&json!({"stdout": "s3cret-value 1\n"}));
        assert_eq!(kept, r#"{"stdout":"[$TOKEN] 1\n"}"#);
        // A value with a quote in it, escaped in the JSON text, is found in the string.
        let quoted = describe(
            "run-command",
            &json!({"name": "m", "command": "true", "env": {"PASS": "pa\"ss-word"}}),
        );
        let kept = quoted.kept_answer(&json!({"stdout": ["said pa\"ss-word"]}));
        assert_eq!(kept, r#"{"stdout":["said [$PASS]"]}"#);
        let record = call.claim("k", 1, 0);
        assert!(!record.arguments.contains("s3cret") && !record.arguments.contains("echo"));
    }
}
