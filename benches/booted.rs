//! What this server costs on a guest that really boots: the nested real smolvm 1.32.2 engine
//! (`scripts/nested-engine.sh`, a QEMU TCG VM on this host), each figure beside the same work
//! done with the engine's REST API directly, in one run:
//!
//! 1. create to the first command's output: create-machine (no image: the engine's bundled
//!    Alpine) then run-command `echo first`, from sending the create to the command's result,
//!    beside POST machines, POST start and POST exec; 3 of each, in turn, each path first in
//!    every other pair.
//! 2. run-command `true` beside a raw exec of `true` on one running machine with no allow list
//!    (so the command is the one exec request): 40 of each, in turn, after a few of each to
//!    warm up, each path first in its share of the rounds. Beside the difference of medians, each
//!    pair's difference, and the server's own time: the call less the engine requests it made,
//!    as its debug log times them (`fleet/hooks.rs`), which the guest's spread does not reach.
//!    `BOOTED_BENCH_BASELINE=label=path[,label=path]` runs earlier builds in the same rounds,
//!    and in 1 and 3 too (in 1 in turn with this build and the raw API; in 3 on the same
//!    machine, between this build's stream and the raw one, at the same clock offset).
//! 3. streamed output: a run-command with a progress token whose command prints 20 lines about
//!    300 ms apart, each stamped with the guest's clock, from the guest's print to the
//!    notification's arrival; beside the raw exec/stream of the same command. The guest's clock
//!    is not this host's (the QEMU VM's clock comes from an emulated RTC, whole seconds), so its
//!    offset is measured with raw requests of the same stamp just before and just after: two-way
//!    exchanges (a file written with the files API, the guest's reading of its clock on seeing
//!    it, back on a raw exec/stream) and plain raw execs.
//!    And on one clock: this host sends 20 lines 300 ms apart to the guest's busybox `nc`
//!    (the guest reaches this host as 10.0.2.2), which prints each as it arrives; sent to
//!    arrival bounds the latency from above, and an echo over the same path says by how much.
//! 4. the engine requests the server made for each call, seen by a relay between a second
//!    server and the engine (for the figures above the server talks to the engine directly).
//!
//! `BOOTED_BENCH_ONLY=stream` runs 3 alone, on one machine; `BOOTED_BENCH_ONLY=roundtrip` runs 2
//! alone.
//!
//! `BOOTED_BENCH_ONLY=pool` runs only the warm-pool figures: a server with a pool of two
//! (`SMOL_MCP_POOLS`, 1 CPU, 256 MiB), create-machine then run-command `echo first` from the
//! pool (warm) beside the same for a machine of the same size made cold (named, so no pool
//! serves it), 5 of each in turn; and the memory the pool holds: the host memory the engine
//! reports available (`/capacity`) before the pool and once it is full, and the engine's own
//! figures for the source and each ready clone. Written to `target/bench/booted-pool.json`.
//!
//! Run with `scripts/bench-booted.sh` (brings the nested engine up, then
//! `cargo bench --bench booted`). Prints a table and writes the same figures as JSON to
//! `target/bench/booted.json`; the relayed server's debug log goes to
//! `target/bench/booted-server-debug.log`. Not a test: it asserts nothing about the figures.
//! The engine may be shared: only machines this run made are deleted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::nested;
use common::stdio_client::{Client, now_us};

#[path = "booted/bases.rs"]
mod bases;

use serde_json::{Value, json};
use smol_mcp::fleet::exec_stream::SseParser;
use std::io::{Read, Write};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const SERVER: &str = env!("CARGO_BIN_EXE_smol-mcp");
const FIRST_OUTPUT_RUNS: usize = 3;
const ROUND_TRIPS: usize = 40;
const WARM_UPS: usize = 3;
const STREAM_LINES: usize = 20;
const OFFSET_SAMPLES: usize = 5;
const EXCHANGES: usize = 8;
/// Tries of one create-to-output run before the bench gives up: the engine is shared, and a
/// boot beside another one can fail under TCG.
const TRIES: usize = 3;

/// Prints `stamp <n> <seconds.micros> <source>` from a shell builtin where the shell has one (no
/// process to start between the reading and the print). bash and newer busybox ash have
/// `$EPOCHREALTIME`; the busybox ash 1.36.1 of the bundled Alpine answers it empty but sets
/// `$EPOCHSECONDS` to the time in microseconds as it expands it (seen on this guest, where
/// `date +%N` prints nothing); failing both, busybox `adjtimex`, a process apart.
const STAMP_FN: &str = r#"st() { t=$EPOCHREALTIME; m=EPOCHREALTIME; if [ -z "$t" ]; then t=$EPOCHSECONDS; m=EPOCHSECONDS-set-by-EPOCHREALTIME; fi; case $t in *.*) ;; *) t=$(adjtimex | awk '/tv_sec/{s=$2}/tv_usec/{u=$2}END{printf "%d.%06d", s, u}'); m=adjtimex;; esac; echo "stamp $1 $t $m"; }"#;

fn stream_script() -> String {
    format!(
        "{STAMP_FN}; i=0; while [ $i -lt {STREAM_LINES} ]; do st $i; sleep 0.3; i=$((i+1)); done"
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Machines this run made, deleted at the end even when the run panics (the server's own are
/// deleted by it when its session ends cleanly; a panic kills it first).
static MADE: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn made(name: &str) {
    MADE.lock().unwrap().push(name.to_owned());
}

fn gone(name: &str) {
    MADE.lock().unwrap().retain(|n| n != name);
}

struct Leftovers {
    authority: String,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        let names = std::mem::take(&mut *MADE.lock().unwrap_or_else(|e| e.into_inner()));
        for name in names {
            eprintln!("booted bench: deleting {name}, left by this run");
            let Ok(mut s) = std::net::TcpStream::connect(&self.authority) else {
                continue;
            };
            let _ = s.set_read_timeout(Some(Duration::from_secs(120)));
            let _ = write!(
                s,
                "DELETE /api/v1/machines/{name} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                self.authority
            );
            let _ = s.read_to_end(&mut Vec::new());
        }
    }
}

/// create-machine with `args` through `c`: the machine's name, noted for the clean-up.
async fn create_machine(c: &mut Client, args: Value) -> String {
    let created = c.tool_result("create-machine", args).await;
    assert!(ok(&created), "{created}");
    let machine = created["structuredContent"]["machine"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    made(&machine);
    machine
}

fn ok(result: &Value) -> bool {
    result["isError"] == json!(false)
}

/// The server's environment: only what is named here.
fn server_env(runtime: &std::path::Path, url: &str, log: &str) -> Vec<(String, String)> {
    common::stdio_env(runtime, url, log)
}

/// The engine's REST API, spoken to directly.
struct Raw {
    http: reqwest::Client,
    base: String,
}

impl Raw {
    async fn post(&self, path: &str, body: &Value) -> Result<Value, String> {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .map_err(|e| format!("POST {path}: {e}"))?;
        let status = r.status();
        let text = r.text().await.map_err(|e| format!("POST {path}: {e}"))?;
        if !status.is_success() {
            return Err(format!("POST {path}: {status} {text}"));
        }
        serde_json::from_str(&text).map_err(|e| format!("POST {path}: {e}: {text}"))
    }

    async fn exec(&self, machine: &str, argv: &[&str]) -> Result<Value, String> {
        self.post(
            &format!("/api/v1/machines/{machine}/exec"),
            &json!({"command": argv, "timeoutSecs": 30}),
        )
        .await
    }

    async fn delete(&self, machine: &str) {
        let r = self
            .http
            .delete(format!("{}/api/v1/machines/{machine}", self.base))
            .send()
            .await;
        match r {
            Ok(r) if r.status().is_success() || r.status() == 404 => gone(machine),
            Ok(r) => eprintln!("booted bench: delete {machine}: {}", r.status()),
            Err(e) => eprintln!("booted bench: delete {machine}: {e}"),
        }
    }

    async fn machines(&self) -> Vec<Value> {
        let r = self
            .http
            .get(format!("{}/api/v1/machines", self.base))
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap();
        v["machines"].as_array().cloned().unwrap_or_default()
    }
}

#[derive(Clone, Copy, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Stats {
    n: usize,
    min_ms: f64,
    p50_ms: f64,
    p90_ms: f64,
    max_ms: f64,
}

/// Nearest rank, as the other benches take it; the median of 3 is the middle one.
fn stats(samples: &[f64]) -> Stats {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    Stats {
        n: v.len(),
        min_ms: v[0],
        p50_ms: at(0.5),
        p90_ms: at(0.9),
        max_ms: v[v.len() - 1],
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Create to the first command's output.

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct FirstOutput {
    total_ms: f64,
    /// create-machine's answer (server) or create + start (raw).
    ready_ms: f64,
    /// run-command's (server) or the exec's (raw, every try until `first` came back).
    command_ms: f64,
    exec_tries: usize,
}

async fn server_first_output(c: &mut Client) -> Result<FirstOutput, String> {
    let t = Instant::now();
    let created = c.tool_result("create-machine", json!({})).await;
    let ready = t.elapsed();
    if !ok(&created) {
        return Err(format!("create-machine: {created}"));
    }
    let name = created["structuredContent"]["machine"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    made(&name);
    let ran = c
        .tool_result(
            "run-command",
            json!({"name": name, "command": ["echo", "first"]}),
        )
        .await;
    let total = t.elapsed();
    let answer = if ok(&ran) && ran["structuredContent"]["stdout"] == "first\n" {
        Ok(FirstOutput {
            total_ms: ms(total),
            ready_ms: ms(ready),
            command_ms: ms(total - ready),
            exec_tries: 1,
        })
    } else {
        Err(format!("run-command: {ran}"))
    };
    let deleted = c.tool_result("delete-machine", json!({"name": name})).await;
    if ok(&deleted) {
        gone(&name);
    } else {
        eprintln!("booted bench: delete-machine {name}: {deleted}");
    }
    answer
}

async fn raw_first_output(raw: &Raw, name: &str) -> Result<FirstOutput, String> {
    let t = Instant::now();
    let created = raw
        .post(
            "/api/v1/machines",
            &json!({"name": name, "cpus": 2, "memoryMb": 2048, "network": false}),
        )
        .await;
    if created.is_ok() {
        made(name);
    }
    let answer = async {
        created?;
        raw.post(&format!("/api/v1/machines/{name}/start"), &json!({}))
            .await?;
        let ready = t.elapsed();
        // As a client of the raw API would: the first exec after the start may come too soon.
        let mut tries = 0;
        loop {
            tries += 1;
            match raw.exec(name, &["echo", "first"]).await {
                Ok(out) if out["stdout"] == "first\n" => break,
                Ok(_) | Err(_) if t.elapsed() < Duration::from_secs(120) => {
                    tokio::time::sleep(Duration::from_secs(1)).await
                }
                other => return Err(format!("exec: {other:?}")),
            }
        }
        let total = t.elapsed();
        Ok(FirstOutput {
            total_ms: ms(total),
            ready_ms: ms(ready),
            command_ms: ms(total - ready),
            exec_tries: tries,
        })
    }
    .await;
    raw.delete(name).await;
    answer
}

/// Notes a failed try, and gives up after [`TRIES`] of them for one run.
async fn failed_try(what: &str, n: usize, e: String, failures: &mut Vec<String>) {
    eprintln!("booted bench: {what}, try {}: {e}", n + 1);
    failures.push(format!("{what}: {e}"));
    assert!(n + 1 < TRIES, "{what} failed {TRIES} times: {failures:?}");
    tokio::time::sleep(Duration::from_secs(5)).await;
}

async fn server_run(
    c: &mut Client,
    label: &str,
    i: usize,
    failures: &mut Vec<String>,
) -> FirstOutput {
    let what = format!("server ({label}) create to output");
    let mut n = 0;
    let s = loop {
        match server_first_output(c).await {
            Ok(s) => break s,
            Err(e) => failed_try(&what, n, e, failures).await,
        }
        n += 1;
    };
    eprintln!("booted bench: {what} {}: {:.0} ms", i + 1, s.total_ms);
    s
}

async fn raw_run(raw: &Raw, i: usize, failures: &mut Vec<String>) -> FirstOutput {
    let mut n = 0;
    let r = loop {
        let name = format!("bench-raw-{}-{i}-{n}", std::process::id());
        match raw_first_output(raw, &name).await {
            Ok(r) => break r,
            Err(e) => failed_try("raw create to output", n, e, failures).await,
        }
        n += 1;
    };
    eprintln!(
        "booted bench: raw create to output {}: {:.0} ms",
        i + 1,
        r.total_ms
    );
    r
}

async fn first_output(c: &mut Client, earlier: &mut [Baseline], raw: &Raw) -> Value {
    let (mut server, mut direct, mut failures) = (Vec::new(), Vec::new(), Vec::new());
    let mut theirs: Vec<Vec<FirstOutput>> = earlier.iter().map(|_| Vec::new()).collect();
    // In turn, each path first in its share of the runs: this build (0), the raw API (1), then
    // the earlier builds.
    let paths = 2 + earlier.len();
    for i in 0..FIRST_OUTPUT_RUNS {
        for k in 0..paths {
            match (i + k) % paths {
                0 => server.push(server_run(c, "this build", i, &mut failures).await),
                1 => direct.push(raw_run(raw, i, &mut failures).await),
                b => {
                    let Baseline { label, client } = &mut earlier[b - 2];
                    theirs[b - 2].push(server_run(client, label, i, &mut failures).await);
                }
            }
        }
    }
    let totals = |v: &[FirstOutput]| v.iter().map(|s| s.total_ms).collect::<Vec<_>>();
    let (ts, tr) = (stats(&totals(&server)), stats(&totals(&direct)));
    let baselines: Vec<Value> = earlier
        .iter()
        .zip(theirs)
        .map(|(b, runs)| {
            let bs = stats(&totals(&runs));
            json!({"label": b.label, "stats": bs, "runs": runs, "ratioMedian": bs.p50_ms / tr.p50_ms})
        })
        .collect();
    json!({
        "server": {"stats": ts, "runs": server},
        "raw": {"stats": tr, "runs": direct},
        "ratioMedian": ts.p50_ms / tr.p50_ms,
        "baselines": baselines,
        "failedTries": failures,
    })
}

// ---------------------------------------------------------------------------------------------
// 2. run-command round trip beside a raw exec.

/// A stdio server taking part in the round trips: this build, or a baseline named by
/// `BOOTED_BENCH_BASELINE=label=path[,label=path]` (an earlier build, run beside it on the same
/// machine so that the comparison is in one run).
struct Contender {
    label: String,
    client: Client,
    /// This build's debug log, read after each call for the engine requests it made and how
    /// long each took by the server's own clock (`hooks.rs`): the call's time less those is
    /// what the server itself added, free of the guest's spread.
    log: Option<DebugLog>,
}

struct DebugLog {
    path: std::path::PathBuf,
    read: usize,
}

impl DebugLog {
    /// The engine requests logged since the last reading: (operation, milliseconds).
    fn take(&mut self) -> Vec<(String, f64)> {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        let fresh = &text[self.read.min(text.len())..];
        // Only whole lines: a line still being written is read next time.
        let whole = fresh.rfind('\n').map_or(0, |i| i + 1);
        self.read += whole;
        fresh[..whole]
            .lines()
            .filter(|l| l.contains("upstream request"))
            .filter_map(|l| {
                let field = |name: &str| {
                    let at = l.find(&format!(" {name}="))? + name.len() + 2;
                    let value = l[at..].split([' ', ',', '}']).next()?;
                    Some(value.trim_matches('"').to_owned())
                };
                Some((field("operation")?, field("millis")?.parse().ok()?))
            })
            .collect()
    }
}

fn baselines() -> Vec<(String, String)> {
    std::env::var("BOOTED_BENCH_BASELINE")
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|pair| {
            let (label, path) = pair
                .split_once('=')
                .expect("BOOTED_BENCH_BASELINE is label=path[,label=path]");
            (label.to_owned(), path.to_owned())
        })
        .collect()
}

/// An earlier build's stdio server for the create-to-output runs and the streamed lines
/// (`BOOTED_BENCH_BASELINE`), a process apart from its round-trip contender.
struct Baseline {
    label: String,
    client: Client,
}

async fn baseline_servers(url: &str, rt: &std::path::Path) -> Vec<Baseline> {
    let mut all = Vec::new();
    for (label, binary) in baselines() {
        let env = server_env(&rt.join(format!("{label}-first")), url, "warn");
        let mut client = Client::spawn(&binary, &env, Stdio::null()).await.0;
        // Its first local call finds the engine, as this build's does before anything is timed.
        let r = client.tool_result("list-machines", json!({})).await;
        assert!(ok(&r), "{label}: {r}");
        all.push(Baseline { label, client });
    }
    all
}

async fn contenders(url: &str, rt: &std::path::Path, out_dir: &std::path::Path) -> Vec<Contender> {
    let path = out_dir.join("booted-roundtrip-debug.log");
    let stderr = std::fs::File::create(&path).unwrap();
    let mut all = vec![Contender {
        label: "this build".into(),
        client: Client::spawn(
            SERVER,
            &server_env(&rt.join("this"), url, "warn,smol_mcp::fleet::hooks=debug"),
            stderr.into(),
        )
        .await
        .0,
        log: Some(DebugLog { path, read: 0 }),
    }];
    for (label, binary) in baselines() {
        let env = server_env(&rt.join(&label), url, "warn");
        all.push(Contender {
            client: Client::spawn(&binary, &env, Stdio::null()).await.0,
            label,
            log: None,
        });
    }
    all
}

async fn round_trip(raw: &Raw, machine: &str, contenders: &mut [Contender]) -> Value {
    let args = json!({"name": machine, "command": ["true"], "timeoutSecs": 30});
    let server_once = async |c: &mut Client| {
        let t = Instant::now();
        let r = c.tool_result("run-command", args.clone()).await;
        let took = ms(t.elapsed());
        assert!(
            ok(&r) && r["structuredContent"]["exitCode"] == 0,
            "run-command true: {r}"
        );
        took
    };
    let raw_once = async || {
        let t = Instant::now();
        let r = raw.exec(machine, &["true"]).await.unwrap();
        let took = ms(t.elapsed());
        assert_eq!(r["exitCode"], 0, "{r}");
        took
    };
    // Warm-ups: each server sees the machine (a server asks for a machine it has not seen
    // before its first command) and the guest's caches are warm.
    for _ in 0..WARM_UPS {
        for c in contenders.iter_mut() {
            server_once(&mut c.client).await;
        }
        raw_once().await;
    }
    for c in contenders.iter_mut() {
        if let Some(log) = &mut c.log {
            log.take();
        }
    }
    let n = contenders.len();
    let mut times = vec![Vec::new(); n];
    let mut direct = Vec::new();
    let mut own = Vec::new();
    let mut requests: Vec<Vec<String>> = Vec::new();
    for i in 0..ROUND_TRIPS {
        // In turn, each path (the raw exec is slot n) first in its share of the rounds.
        for k in 0..=n {
            let slot = (i + k) % (n + 1);
            if slot == n {
                direct.push(raw_once().await);
                continue;
            }
            let c = &mut contenders[slot];
            let took = server_once(&mut c.client).await;
            times[slot].push(took);
            if let Some(log) = &mut c.log {
                let made = log.take();
                own.push(took - made.iter().map(|(_, ms)| ms).sum::<f64>());
                requests.push(made.into_iter().map(|(op, _)| op).collect());
            }
        }
    }
    let tr = stats(&direct);
    let servers: Vec<Value> = contenders
        .iter()
        .zip(&times)
        .map(|(c, t)| {
            let ts = stats(t);
            let paired: Vec<f64> = t.iter().zip(&direct).map(|(s, r)| s - r).collect();
            json!({
                "label": c.label, "stats": ts, "ms": t,
                "diffP50Ms": ts.p50_ms - tr.p50_ms, "diffP90Ms": ts.p90_ms - tr.p90_ms,
                "pairedDiff": stats(&paired),
            })
        })
        .collect();
    let counts: Vec<usize> = requests.iter().map(Vec::len).collect();
    json!({
        "raw": tr, "rawMs": direct,
        "servers": servers,
        "thisBuild": {
            "ownMs": stats(&own),
            "requestsPerCall": {"min": counts.iter().min(), "max": counts.iter().max()},
            "operations": requests.first(),
        },
    })
}

// ---------------------------------------------------------------------------------------------
// 3. Streamed output latency.

/// `stamp <n> <seconds.micros> <source>` lines in `text` (a notification's `[stdout] ` marks
/// left off): (n, µs since the epoch by the guest's clock, source).
fn stamps(text: &str) -> Vec<(usize, i64, String)> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.trim_start_matches("[stdout] ").split_whitespace();
            if words.next()? != "stamp" {
                return None;
            }
            let n = words.next()?.parse().ok()?;
            let (secs, frac) = words.next()?.split_once('.')?;
            let frac = format!("{frac:0<6}");
            let us = secs.parse::<i64>().ok()? * 1_000_000 + frac.get(..6)?.parse::<i64>().ok()?;
            Some((n, us, words.next().unwrap_or("").to_owned()))
        })
        .collect()
}

/// One reading of the guest's clock from this host: when the host sent what made the guest read
/// it, the reading, and when the reading arrived here (µs since the epoch, each by its clock).
/// Whatever the legs took, guest − received <= offset <= guest − sent (offset: guest − host).
#[derive(Clone, Copy, serde::Serialize)]
struct ClockSample {
    sent: i64,
    guest: i64,
    received: i64,
}

impl ClockSample {
    fn rtt(&self) -> i64 {
        self.received - self.sent
    }
    /// guest − host, taking the reading as made halfway between sending and arrival.
    fn midpoint_offset(&self) -> i64 {
        self.guest - (self.sent + self.received) / 2
    }
}

/// Raw execs of the stamp (sh -c 'st 0'): the offset as a midpoint of the exec's round trip,
/// whose first half (starting sh in the guest) is the longer one.
async fn exec_samples(raw: &Raw, machine: &str) -> (Vec<ClockSample>, String) {
    let script = format!("{STAMP_FN}; st 0");
    let mut samples = Vec::new();
    let mut source = String::new();
    for _ in 0..OFFSET_SAMPLES {
        let sent = now_us();
        let out = raw.exec(machine, &["sh", "-c", &script]).await.unwrap();
        let received = now_us();
        let found = stamps(out["stdout"].as_str().unwrap_or_default());
        let (_, guest, src) = found
            .first()
            .cloned()
            .unwrap_or_else(|| panic!("no stamp in {out}"));
        source = src;
        samples.push(ClockSample {
            sent,
            guest,
            received,
        });
    }
    (samples, source)
}

/// Two-way exchanges in one raw exec/stream: the guest's shell spins on `[ -e FILE ]` (a
/// builtin: no process started), this host writes FILE with the files API, and the guest
/// prints its clock as soon as it sees it; the line comes back on the stream. Both legs are the
/// engine and its agent, neither starts a process, so the midpoint is near the truth and the
/// bounds are tight.
async fn exchanges(raw: &Raw, machine: &str, tag: &str) -> Vec<ClockSample> {
    let go = format!("/tmp/bench-clock-{}-{tag}", std::process::id());
    let script = format!(
        "{STAMP_FN}; rm -f {go}-*; st 0; i=1; while [ $i -le {EXCHANGES} ]; do while [ ! -e {go}-$i ]; do :; done; st $i; i=$((i+1)); done; rm -f {go}-*"
    );
    let response = raw
        .http
        .post(format!(
            "{}/api/v1/machines/{machine}/exec/stream",
            raw.base
        ))
        .json(&json!({"command": ["sh", "-c", script], "timeoutSecs": 120}))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    // The stream is read on a task of its own, so that a line is stamped when it arrives even
    // while the next file is being written.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        let mut response = response;
        let mut parser = SseParser::default();
        while let Some(chunk) = response.chunk().await.unwrap() {
            let at = now_us();
            for event in parser.feed(&chunk) {
                if event.event == "stdout" {
                    for (n, g, _) in stamps(&event.data) {
                        let _ = tx.send((n, g, at));
                    }
                }
            }
        }
    });
    let mut samples = Vec::new();
    let mut sent = None;
    while let Some((n, guest, received)) = rx.recv().await {
        if let Some(sent) = sent.take() {
            samples.push(ClockSample {
                sent,
                guest,
                received,
            });
        }
        if n < EXCHANGES {
            let path = format!("{go}-{}", n + 1).replace('/', "%2F");
            sent = Some(now_us());
            let r = raw
                .http
                .put(format!(
                    "{}/api/v1/machines/{machine}/files/{path}",
                    raw.base
                ))
                .header("content-type", "application/octet-stream")
                .body("x")
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{}", r.status());
        }
    }
    reader.await.unwrap();
    assert_eq!(samples.len(), EXCHANGES, "exchanges");
    samples
}

/// The offset the samples of one moment allow: [max(guest − received), min(guest − sent)],
/// and its middle.
#[derive(Clone, Copy, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Bounds {
    lower_ms: f64,
    upper_ms: f64,
    mid_ms: f64,
}

fn bounds<'a>(samples: impl Iterator<Item = &'a ClockSample> + Clone) -> Bounds {
    let lower = samples.clone().map(|s| s.guest - s.received).max().unwrap();
    let upper = samples.map(|s| s.guest - s.sent).min().unwrap();
    Bounds {
        lower_ms: lower as f64 / 1000.0,
        upper_ms: upper as f64 / 1000.0,
        mid_ms: (lower + upper) as f64 / 2000.0,
    }
}

/// Each stamped line: (n, guest stamp µs, host arrival µs).
type Arrivals = Vec<(usize, i64, i64)>;

async fn server_stream(c: &mut Client, machine: &str) -> (Arrivals, usize, i64) {
    let id = c.id();
    let sent = now_us();
    c.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "run-command",
        "arguments": {"name": machine, "command": ["sh", "-c", stream_script()], "timeoutSecs": 120},
        "_meta": {"progressToken": "bench-stream"}}}))
    .await;
    let (mut arrivals, mut notifications) = (Vec::new(), 0);
    loop {
        let (message, at) = c.next().await;
        if message["id"] == json!(id) {
            assert!(ok(&message["result"]), "streamed run-command: {message}");
            let whole = stamps(
                message["result"]["structuredContent"]["stdout"]
                    .as_str()
                    .unwrap_or_default(),
            );
            assert_eq!(whole.len(), STREAM_LINES, "{message}");
            break;
        }
        if message["method"] != "notifications/progress" {
            continue;
        }
        notifications += 1;
        let text = message["params"]["message"].as_str().unwrap_or_default();
        arrivals.extend(stamps(text).into_iter().map(|(n, g, _)| (n, g, at)));
    }
    (arrivals, notifications, sent)
}

async fn raw_stream(raw: &Raw, machine: &str) -> (Arrivals, i64) {
    let sent = now_us();
    let mut response = raw
        .http
        .post(format!(
            "{}/api/v1/machines/{machine}/exec/stream",
            raw.base
        ))
        .json(&json!({"command": ["sh", "-c", stream_script()], "timeoutSecs": 120}))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    let mut parser = SseParser::default();
    let mut arrivals = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        let at = now_us();
        for event in parser.feed(&chunk) {
            if event.event == "stdout" {
                arrivals.extend(stamps(&event.data).into_iter().map(|(n, g, _)| (n, g, at)));
            }
        }
    }
    (arrivals, sent)
}

/// Guest print to arrival of each line, in ms, taking the guest's clock as `offset_ms` ahead.
fn latencies(arrivals: &Arrivals, offset_ms: f64) -> Vec<f64> {
    arrivals
        .iter()
        .map(|&(_, guest, at)| (at - guest) as f64 / 1000.0 + offset_ms)
        .collect()
}

async fn streamed(c: &mut Client, earlier: &mut [Baseline], raw: &Raw, machine: &str) -> Value {
    let (execs_before, source) = exec_samples(raw, machine).await;
    let exchanged_before = exchanges(raw, machine, "before").await;
    let (server, notifications, server_sent) = server_stream(c, machine).await;
    let mut theirs = Vec::new();
    for b in earlier.iter_mut() {
        let (arrivals, _, _) = server_stream(&mut b.client, machine).await;
        assert_eq!(
            arrivals.len(),
            STREAM_LINES,
            "lines in {}'s notifications",
            b.label
        );
        theirs.push((b.label.clone(), arrivals));
    }
    let (direct, raw_sent) = raw_stream(raw, machine).await;
    let exchanged_after = exchanges(raw, machine, "after").await;
    let (execs_after, _) = exec_samples(raw, machine).await;
    assert_eq!(server.len(), STREAM_LINES, "lines in notifications");
    assert_eq!(direct.len(), STREAM_LINES, "lines in the raw stream");

    // The offset from the readings just before and just after (each moment's bounds from its
    // exchanges and execs together), the two middles averaged; its uncertainty the wider half
    // and half the drift between them. A raw line arrives after it was printed, which may
    // raise the lower end.
    let before = bounds(exchanged_before.iter().chain(&execs_before));
    let after = bounds(exchanged_after.iter().chain(&execs_after));
    let offset = (before.mid_ms + after.mid_ms) / 2.0;
    let half = |b: &Bounds| (b.upper_ms - b.lower_ms) / 2.0;
    let uncertainty = half(&before).max(half(&after)) + (after.mid_ms - before.mid_ms).abs() / 2.0;
    let raw_lines_lower = direct
        .iter()
        .map(|&(_, g, at)| (g - at) as f64 / 1000.0)
        .fold(f64::MIN, f64::max);
    let (low, high) = (
        (offset - uncertainty).max(raw_lines_lower),
        offset + uncertainty,
    );
    // What the plain exec alone would have said (its quickest, as a midpoint).
    let quickest = *execs_before.iter().min_by_key(|s| s.rtt()).unwrap();
    let quickest_exchange = *exchanged_before.iter().min_by_key(|s| s.rtt()).unwrap();

    let gaps: Vec<f64> = server
        .windows(2)
        .map(|w| (w[1].1 - w[0].1) as f64 / 1000.0)
        .collect();
    let at_offset = |o: f64| (stats(&latencies(&server, o)), stats(&latencies(&direct, o)));
    let (s, r) = at_offset(offset);
    let (s_low, r_low) = at_offset(low);
    let (s_high, r_high) = at_offset(high);
    let first_server = server.iter().min_by_key(|l| l.0).unwrap();
    let first_raw = direct.iter().min_by_key(|l| l.0).unwrap();
    // The earlier builds' lines at the same offset: streamed between this build's and the raw
    // stream's, on the same machine.
    let baselines: Vec<Value> = theirs
        .iter()
        .map(|(label, arrivals)| {
            let b = stats(&latencies(arrivals, offset));
            json!({"label": label, "server": b, "diffP50Ms": b.p50_ms - r.p50_ms,
                   "diffP90Ms": b.p90_ms - r.p90_ms})
        })
        .collect();
    json!({
        "lines": STREAM_LINES,
        "notifications": notifications,
        "guestClock": source,
        "lineGapMs": stats(&gaps),
        "offset": {
            "usedMs": offset, "uncertaintyMs": uncertainty, "lowMs": low, "highMs": high,
            "before": before, "after": after, "rawLinesLowerMs": raw_lines_lower,
            "quickestExchangeBeforeRttMs": quickest_exchange.rtt() as f64 / 1000.0,
            "plainExecMidpoint": {"rttMs": quickest.rtt() as f64 / 1000.0,
                                  "offsetMs": quickest.midpoint_offset() as f64 / 1000.0},
            "exchangesBefore": exchanged_before, "exchangesAfter": exchanged_after,
            "execsBefore": execs_before, "execsAfter": execs_after,
        },
        "server": s, "raw": r,
        "diffP50Ms": s.p50_ms - r.p50_ms, "diffP90Ms": s.p90_ms - r.p90_ms,
        "diffMaxMs": s.max_ms - r.max_ms,
        "baselines": baselines,
        "p50AtLowMs": {"server": s_low.p50_ms, "raw": r_low.p50_ms},
        "p50AtHighMs": {"server": s_high.p50_ms, "raw": r_high.p50_ms},
        "firstLineAfterSendMs": {
            "server": (first_server.2 - server_sent) as f64 / 1000.0,
            "raw": (first_raw.2 - raw_sent) as f64 / 1000.0,
        },
    })
}

// ---------------------------------------------------------------------------------------------
// 3b. The same latency on one clock. The guest's clock can only be placed within tens of ms, so
// here the host makes the guest print: it sends each line over TCP (QEMU's user network: the
// nested guests reach this host as 10.0.2.2), the guest's busybox `nc` writes it to its stdout as
// it arrives, and the host notes when it comes back in a notification (or an SSE line). Send to
// arrival, both on this host's clock, is the guest-print-to-arrival latency plus the trigger's
// one-way leg: an upper bound. An echo over the same path (the guest's `nc` writing back what it
// reads) gives that leg's round trip, so the latency lies in [bound − round trip, bound].

/// The guest's side: prints what this host sends. Its stdin is a FIFO opened read-write and
/// never written, so `nc` sees no end of input of its own; and since this host's close does not
/// reach the guest's socket through QEMU's user network and the engine's proxy (seen: `nc`
/// stayed until the exec's timeout), it is killed once the lines have had time to come.
fn printer_script(port: u16) -> String {
    format!(
        "f=/tmp/bench-print-$$; mkfifo $f; nc 10.0.2.2 {port} 0<>$f & p=$!; sleep {}; kill $p; rm -f $f",
        STREAM_LINES * 3 / 10 + 4
    )
}

/// The guest's side of the echo: stdin and stdout one FIFO, so what `nc` reads goes back;
/// killed after the exchanges have had time, as above.
fn echo_script(port: u16) -> String {
    format!(
        "f=/tmp/bench-echo-$$; mkfifo $f; nc 10.0.2.2 {port} 0<>$f 1>&0 & p=$!; sleep {}; kill $p; rm -f $f",
        STREAM_LINES / 10 + 6
    )
}

fn ticks(text: &str) -> Vec<usize> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.trim_start_matches("[stdout] ").split_whitespace();
            (words.next()? == "tick").then_some(())?;
            words.next()?.parse().ok()
        })
        .collect()
}

/// Accepts the guest's connection and sends `tick n` lines 300 ms apart; answers when each was
/// sent (µs since the epoch), by n.
async fn send_ticks(listener: tokio::net::TcpListener) -> Vec<i64> {
    let (mut socket, _) = tokio::time::timeout(Duration::from_secs(120), listener.accept())
        .await
        .expect("the guest did not connect to this host in 120 s")
        .unwrap();
    socket.set_nodelay(true).unwrap();
    let mut sent = Vec::new();
    for n in 0..STREAM_LINES {
        tokio::time::sleep(Duration::from_millis(300)).await;
        sent.push(now_us());
        socket
            .write_all(format!("tick {n}\n").as_bytes())
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    sent
}

async fn host_listener() -> (tokio::net::TcpListener, u16) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

/// Send to arrival of each tick, in ms (ticks that never arrived are left out and counted by
/// the caller).
fn send_to_arrival(sent: &[i64], arrived: &[(usize, i64)]) -> Vec<f64> {
    arrived
        .iter()
        .filter_map(|&(n, at)| Some((at - sent.get(n)?) as f64 / 1000.0))
        .collect()
}

async fn server_ticks(c: &mut Client, machine: &str) -> (Vec<f64>, usize) {
    let (listener, port) = host_listener().await;
    let sender = tokio::spawn(send_ticks(listener));
    let id = c.id();
    c.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "run-command",
        "arguments": {"name": machine, "command": ["sh", "-c", printer_script(port)], "timeoutSecs": 120},
        "_meta": {"progressToken": "bench-ticks"}}}))
    .await;
    let mut arrived = Vec::new();
    loop {
        let (message, at) = c.next().await;
        if message["id"] == json!(id) {
            assert!(ok(&message["result"]), "run-command of nc: {message}");
            break;
        }
        if message["method"] == "notifications/progress" {
            let text = message["params"]["message"].as_str().unwrap_or_default();
            arrived.extend(ticks(text).into_iter().map(|n| (n, at)));
        }
    }
    let sent = sender.await.unwrap();
    (send_to_arrival(&sent, &arrived), arrived.len())
}

async fn raw_ticks(raw: &Raw, machine: &str) -> (Vec<f64>, usize) {
    let (listener, port) = host_listener().await;
    let sender = tokio::spawn(send_ticks(listener));
    let mut response = raw
        .http
        .post(format!(
            "{}/api/v1/machines/{machine}/exec/stream",
            raw.base
        ))
        .json(&json!({"command": ["sh", "-c", printer_script(port)], "timeoutSecs": 120}))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    let mut parser = SseParser::default();
    let mut arrived = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        let at = now_us();
        for event in parser.feed(&chunk) {
            if event.event == "stdout" {
                arrived.extend(ticks(&event.data).into_iter().map(|n| (n, at)));
            }
        }
    }
    let sent = sender.await.unwrap();
    (send_to_arrival(&sent, &arrived), arrived.len())
}

/// Round trips of one line through the guest's `nc` and back, in ms.
async fn echo_round_trips(raw: &Raw, machine: &str) -> Vec<f64> {
    let (listener, port) = host_listener().await;
    let exec = {
        let (http, url) = (
            raw.http.clone(),
            format!("{}/api/v1/machines/{machine}/exec", raw.base),
        );
        let body = json!({"command": ["sh", "-c", echo_script(port)], "timeoutSecs": 120});
        tokio::spawn(async move { http.post(url).json(&body).send().await })
    };
    let (socket, _) = tokio::time::timeout(Duration::from_secs(120), listener.accept())
        .await
        .expect("the guest's echo did not connect in 120 s")
        .unwrap();
    socket.set_nodelay(true).unwrap();
    let (read, mut write) = socket.into_split();
    let mut lines = BufReader::new(read).lines();
    let mut trips = Vec::new();
    for n in 0..STREAM_LINES {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let sent = Instant::now();
        write
            .write_all(format!("echo {n}\n").as_bytes())
            .await
            .unwrap();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("no echo in 30 s")
            .unwrap()
            .expect("the echo closed");
        assert_eq!(line, format!("echo {n}"));
        trips.push(ms(sent.elapsed()));
    }
    drop(write);
    drop(lines);
    let _ = exec.await;
    trips
}

async fn one_clock(c: &mut Client, raw: &Raw, machine: &str) -> Value {
    let echo = stats(&echo_round_trips(raw, machine).await);
    let (server, server_lines) = server_ticks(c, machine).await;
    let (direct, raw_lines) = raw_ticks(raw, machine).await;
    assert_eq!(server_lines, STREAM_LINES, "ticks in notifications");
    assert_eq!(raw_lines, STREAM_LINES, "ticks in the raw stream");
    let (s, r) = (stats(&server), stats(&direct));
    json!({
        "lines": STREAM_LINES,
        "server": s, "raw": r,
        "echoRoundTrip": echo,
        "diffP50Ms": s.p50_ms - r.p50_ms,
        // The latency itself: at most the bound, and at least the bound less the trigger's
        // one-way leg, which is no longer than a round trip of the same path.
        "serverP50AtLeastMs": (s.p50_ms - echo.p50_ms).max(0.0),
        "rawP50AtLeastMs": (r.p50_ms - echo.p50_ms).max(0.0),
    })
}

// ---------------------------------------------------------------------------------------------
// 4. The engine requests behind each call: a relay that notes each HTTP/1.1 request line the
// server sends and when the first byte of its answer comes back.

#[derive(Clone)]
struct Seen {
    at: Instant,
    line: String,
    first_byte: Option<Instant>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// The request in a line the client sent: a body sent without a newline at its end (JSON)
/// runs on into the next request's line, so the method is looked for anywhere in it.
fn request_line(line: &[u8]) -> Option<String> {
    let line = String::from_utf8_lossy(line);
    let line = line.trim_end_matches('\r');
    let rest = line
        .strip_suffix(" HTTP/1.1")
        .or_else(|| line.strip_suffix(" HTTP/1.0"))?;
    let start = ["GET /", "POST /", "PUT /", "DELETE /", "PATCH /", "HEAD /"]
        .iter()
        .filter_map(|m| rest.find(m))
        .min()?;
    Some(rest[start..].to_owned())
}

async fn relay(upstream: String) -> (String, Log) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let log: Log = Arc::default();
    let accepted = log.clone();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let (upstream, log) = (upstream.clone(), accepted.clone());
            tokio::spawn(async move {
                let Ok(outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
                let (mut from_client, mut to_client) = inbound.into_split();
                let (mut from_engine, mut to_engine) = outbound.into_split();
                let waiting: Arc<Mutex<Option<usize>>> = Arc::default();
                let (waiting_up, log_up) = (waiting.clone(), log.clone());
                let up = async move {
                    let (mut buf, mut line) = (vec![0u8; 64 * 1024], Vec::new());
                    while let Ok(n) = from_client.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        for &b in &buf[..n] {
                            if b != b'\n' {
                                if line.len() >= 8192 {
                                    line.drain(..4096);
                                }
                                line.push(b);
                                continue;
                            }
                            if let Some(request) = request_line(&line) {
                                let mut log = log_up.lock().unwrap();
                                log.push(Seen {
                                    at: Instant::now(),
                                    line: request,
                                    first_byte: None,
                                });
                                *waiting_up.lock().unwrap() = Some(log.len() - 1);
                            }
                            line.clear();
                        }
                        if to_engine.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = to_engine.shutdown().await;
                };
                let down = async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = from_engine.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let answered = waiting.lock().unwrap().take();
                        if let Some(i) = answered
                            && let Some(seen) = log.lock().unwrap().get_mut(i)
                        {
                            seen.first_byte = Some(Instant::now());
                        }
                        if to_client.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = to_client.shutdown().await;
                };
                tokio::join!(up, down);
            });
        }
    });
    (url, log)
}

/// What the relay saw since the last call, the machine's name written `{name}`.
fn take_requests(log: &Log, machine: &str) -> Vec<Value> {
    std::mem::take(&mut *log.lock().unwrap())
        .into_iter()
        .map(|s| {
            let line = if machine.is_empty() {
                s.line
            } else {
                s.line.replace(machine, "{name}")
            };
            json!({"request": line,
                   "firstByteMs": s.first_byte.map(|f| ms(f - s.at))})
        })
        .collect()
}

async fn requests_per_call(url: &str, rt: &std::path::Path, out_dir: &std::path::Path) -> Value {
    let (relayed, log) = relay(url.trim_start_matches("http://").to_owned()).await;
    let log_path = out_dir.join("booted-server-debug.log");
    let stderr = std::fs::File::create(&log_path).unwrap();
    let mut c = Client::spawn(
        SERVER,
        &server_env(rt, &relayed, "info,rmcp=warn,smol_mcp=debug"),
        stderr.into(),
    )
    .await
    .0;
    let mut calls = Vec::new();
    let r = c.tool_result("list-machines", json!({})).await;
    assert!(ok(&r), "{r}");
    calls.push(json!({"call": "list-machines (the session's first call)",
                      "requests": take_requests(&log, "")}));
    // With an allow list, as the streaming machine has: its commands' requests are listed.
    let name = create_machine(&mut c, json!({"allowCidrs": ["10.0.2.2/32"]})).await;
    calls
        .push(json!({"call": "create-machine (no image, an allow list: each command below first reads the egress refusals)", "requests": take_requests(&log, &name)}));
    let run = |command: Value| json!({"name": name, "command": command, "timeoutSecs": 30});
    let r = c
        .tool_result("run-command", run(json!(["echo", "first"])))
        .await;
    assert!(ok(&r), "{r}");
    calls.push(json!({"call": "run-command echo first", "requests": take_requests(&log, &name)}));
    for i in 0..3 {
        let r = c.tool_result("run-command", run(json!(["true"]))).await;
        assert!(ok(&r), "{r}");
        calls.push(json!({"call": format!("run-command true ({})", i + 1),
                          "requests": take_requests(&log, &name)}));
    }
    let r = c
        .request(
            "tools/call",
            json!({"name": "run-command", "arguments": run(json!(["echo", "streamed"])),
                   "_meta": {"progressToken": "bench-requests"}}),
        )
        .await;
    assert!(ok(&r["result"]), "{r}");
    calls.push(
        json!({"call": "run-command echo streamed (with a progress token)",
                      "requests": take_requests(&log, &name)}),
    );
    let r = c.tool_result("delete-machine", json!({"name": name})).await;
    if ok(&r) {
        gone(&name);
    }
    calls.push(json!({"call": "delete-machine", "requests": take_requests(&log, &name)}));
    c.close(Duration::from_secs(120)).await;
    json!({"calls": calls, "serverLog": log_path.display().to_string()})
}

// ---------------------------------------------------------------------------------------------

fn host_info() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("unknown cpu")
        .trim()
        .to_owned();
    let load = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    json!({
        "cores": common::cores(),
        "cpu": cpu,
        "loadAverage": load,
    })
}

async fn run(out_dir: &std::path::Path) -> Value {
    let nested = nested::nested();
    let raw = Raw {
        http: nested::rest(),
        base: nested.url.clone(),
    };
    let others: Vec<String> = raw
        .machines()
        .await
        .iter()
        .filter(|m| m["state"] == "running")
        .filter_map(|m| m["name"].as_str().map(str::to_owned))
        .collect();
    let host = host_info();
    eprintln!(
        "booted bench: engine {} ({} other machines running on it)",
        nested.url,
        others.len()
    );
    let rt = tempfile::tempdir().unwrap();
    let mut c = Client::spawn(
        SERVER,
        &server_env(&rt.path().join("a"), &nested.url, "warn"),
        Stdio::inherit(),
    )
    .await
    .0;
    // The session's first local call finds the engine: done before anything is timed.
    let r = c.tool_result("list-machines", json!({})).await;
    assert!(ok(&r), "{r}");

    // BOOTED_BENCH_ONLY=stream: only the streamed-output figures (3), on one machine: the
    // shortest run, for when the nested engine is unsteady. BOOTED_BENCH_ONLY=roundtrip: only
    // the round trips (2), to repeat them for their run-to-run spread.
    let only = std::env::var("BOOTED_BENCH_ONLY").unwrap_or_default();
    let (only_stream, only_trips) = (only == "stream", only == "roundtrip");
    // The earlier builds (BOOTED_BENCH_BASELINE) beside this one in the create-to-output runs
    // and the streamed lines; the round trips run them as contenders of their own.
    let mut earlier = if only_trips {
        Vec::new()
    } else {
        baseline_servers(&nested.url, rt.path()).await
    };
    let first = if only_stream || only_trips {
        Value::Null
    } else {
        first_output(&mut c, &mut earlier, &raw).await
    };

    // A machine with no allow list: a command on it is the one exec request, nothing beside.
    let trips = if only_stream {
        Value::Null
    } else {
        let machine = create_machine(&mut c, json!({})).await;
        eprintln!("booted bench: round trips on {machine}");
        let mut servers = contenders(&nested.url, rt.path(), out_dir).await;
        let trips = round_trip(&raw, &machine, &mut servers).await;
        for s in servers {
            s.client.close(Duration::from_secs(120)).await;
        }
        for s in trips["servers"].as_array().into_iter().flatten() {
            eprintln!(
                "booted bench: run-command p50 {:.1} ms ({}), raw exec p50 {:.1} ms",
                s["stats"]["p50Ms"].as_f64().unwrap_or(f64::NAN),
                s["label"].as_str().unwrap_or(""),
                trips["raw"]["p50Ms"].as_f64().unwrap_or(f64::NAN)
            );
        }
        let r = c
            .tool_result("delete-machine", json!({"name": machine}))
            .await;
        if ok(&r) {
            gone(&machine);
        }
        trips
    };

    let (stream, one_clock) = if only_trips {
        (Value::Null, Value::Null)
    } else {
        // Allowed to reach this host (10.0.2.2 on QEMU's user network), for the one-clock
        // stream.
        let machine = create_machine(&mut c, json!({"allowCidrs": ["10.0.2.2/32"]})).await;
        eprintln!("booted bench: streamed output on {machine}");
        let stream = streamed(&mut c, &mut earlier, &raw, &machine).await;
        eprintln!("booted bench: streamed output on one clock, on {machine}");
        let one_clock = one_clock(&mut c, &raw, &machine).await;
        let r = c
            .tool_result("delete-machine", json!({"name": machine}))
            .await;
        if ok(&r) {
            gone(&machine);
        }
        (stream, one_clock)
    };
    c.close(Duration::from_secs(120)).await;
    for b in earlier {
        b.client.close(Duration::from_secs(120)).await;
    }

    let requests = if only_stream || only_trips {
        Value::Null
    } else {
        eprintln!("booted bench: the requests behind each call, through a relay");
        requests_per_call(&nested.url, &rt.path().join("b"), out_dir).await
    };

    json!({
        "host": host,
        "engine": {"url": nested.url, "smolvm": "1.32.2",
                   "where": "nested in a QEMU TCG VM (scripts/nested-engine.sh)",
                   "otherMachinesRunningAtStart": others},
        "firstOutput": first,
        "roundTrip": trips,
        "stream": stream,
        "streamOneClock": one_clock,
        "requests": requests,
    })
}

// ---------------------------------------------------------------------------------------------
// 5. Warm pools.

const POOL: &str = "smolmcp-bench";

async fn pool_info(raw: &Raw) -> Option<Value> {
    let r = raw
        .http
        .get(format!("{}/api/v1/pools/{POOL}", raw.base))
        .send()
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

async fn available_mb(raw: &Raw) -> f64 {
    nested::host_memory_available_mb(&raw.base).await
}

async fn pool_full(raw: &Raw, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if pool_info(raw)
            .await
            .is_some_and(|p| p["ready"].as_i64() >= Some(2))
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// create-machine then run-command `echo first`: (total ms, the pool the machine came from).
async fn create_and_echo(c: &mut Client, args: Value) -> Result<(f64, Value), String> {
    let t = Instant::now();
    let created = c.tool_result("create-machine", args).await;
    if !ok(&created) {
        return Err(format!("create-machine: {created}"));
    }
    let name = created["structuredContent"]["machine"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    made(&name);
    let ran = c
        .tool_result(
            "run-command",
            json!({"name": name, "command": ["echo", "first"]}),
        )
        .await;
    let total = ms(t.elapsed());
    let pool = created["structuredContent"]["pool"].clone();
    let deleted = c.tool_result("delete-machine", json!({"name": name})).await;
    if ok(&deleted) {
        gone(&name);
    }
    if !ok(&ran) || ran["structuredContent"]["stdout"] != "first\n" {
        return Err(format!("run-command: {ran}"));
    }
    Ok((total, pool))
}

async fn warm_pool() -> Value {
    let nested = nested::nested();
    let raw = Raw {
        http: nested::rest(),
        base: nested.url.clone(),
    };
    let host = host_info();
    let rt = tempfile::tempdir().unwrap();
    let mut env = server_env(&rt.path().join("p"), &nested.url, "warn");
    env.push((
        "SMOL_MCP_POOLS".into(),
        r#"[{"name": "bench", "size": 2, "cpus": 1, "memoryMb": 256}]"#.into(),
    ));
    env.push(("SMOL_MCP_READY_TIMEOUT_SECS".into(), "300".into()));
    let before_mb = available_mb(&raw).await;
    let mut c = Client::spawn(SERVER, &env, Stdio::inherit()).await.0;
    let t = Instant::now();
    let r = c.tool_result("list-machines", json!({})).await;
    assert!(ok(&r), "{r}");
    assert!(
        pool_full(&raw, Duration::from_secs(600)).await,
        "the pool never filled: {:?}",
        pool_info(&raw).await
    );
    let set_up_ms = ms(t.elapsed());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let full_mb = available_mb(&raw).await;
    let held: Vec<Value> = raw
        .machines()
        .await
        .into_iter()
        .filter(|m| m["name"].as_str().is_some_and(|n| n.contains("smolmcp-")))
        .map(|m| {
            json!({"name": m["name"], "state": m["state"], "rssMb": m["rssMb"], "pssMb": m["pssMb"],
                   "privateMemoryMb": m["privateMemoryMb"]})
        })
        .collect();
    eprintln!("booted bench: pool of two set up in {set_up_ms:.0} ms");

    let (mut warm, mut cold, mut failures) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..5 {
        pool_full(&raw, Duration::from_secs(120)).await;
        match create_and_echo(&mut c, json!({"cpus": 1, "memoryMb": 256})).await {
            Ok((total, pool)) if pool == "bench" => warm.push(total),
            Ok((_, pool)) => failures.push(format!("warm {i}: came from {pool}")),
            Err(e) => failures.push(format!("warm {i}: {e}")),
        }
        let args = json!({"name": format!("bench-cold-{i}"), "cpus": 1, "memoryMb": 256});
        match create_and_echo(&mut c, args).await {
            Ok((total, _)) => cold.push(total),
            Err(e) => failures.push(format!("cold {i}: {e}")),
        }
        eprintln!(
            "booted bench: round {i}: warm {:?} ms, cold {:?} ms",
            warm.last(),
            cold.last()
        );
    }
    c.close(Duration::from_secs(120)).await;
    let gone_after_close = pool_info(&raw).await.is_none();
    json!({
        "host": host,
        "engine": {"url": nested.url, "smolvm": "1.32.2",
                   "where": "nested in a QEMU TCG VM (scripts/nested-engine.sh)"},
        "setUpMs": set_up_ms,
        "warm": if warm.is_empty() { Value::Null } else { json!(stats(&warm)) },
        "cold": if cold.is_empty() { Value::Null } else { json!(stats(&cold)) },
        "warmSamplesMs": warm,
        "coldSamplesMs": cold,
        "hostAvailableMb": {"beforePool": before_mb, "poolFull": full_mb},
        "held": held,
        "poolGoneWithTheServer": gone_after_close,
        "failures": failures,
    })
}

fn print_pool(r: &Value) {
    let f = common::figure;
    let (w, c) = (&r["warm"], &r["cold"]);
    println!(
        "warm pool on the nested engine ({} cores, load {}): pool of two set up in {:.1} s",
        r["host"]["cores"],
        r["host"]["loadAverage"].as_str().unwrap_or(""),
        f(&r["setUpMs"]) / 1000.0
    );
    println!();
    println!("| create-machine + run-command `echo first` | median | min | max | n |");
    println!("|---|---|---|---|---|");
    for (label, s) in [("warm (from the pool)", w), ("cold (same size)", c)] {
        println!(
            "| {label} | {:.0} ms | {:.0} ms | {:.0} ms | {} |",
            f(&s["p50Ms"]),
            f(&s["minMs"]),
            f(&s["maxMs"]),
            s["n"]
        );
    }
    println!(
        "\ncold / warm (medians): x{:.1} (goal: at least x10)",
        f(&c["p50Ms"]) / f(&w["p50Ms"])
    );
    let a = &r["hostAvailableMb"];
    println!(
        "host memory available (engine's /capacity): {:.0} MiB before the pool, {:.0} MiB with it \
         full: {:.0} MiB held by the source and two clones",
        f(&a["beforePool"]),
        f(&a["poolFull"]),
        f(&a["beforePool"]) - f(&a["poolFull"])
    );
    for m in r["held"].as_array().into_iter().flatten() {
        println!(
            "  {} ({}): rss {} MiB, pss {} MiB, private {} MiB",
            m["name"].as_str().unwrap_or(""),
            m["state"].as_str().unwrap_or(""),
            m["rssMb"],
            m["pssMb"],
            m["privateMemoryMb"]
        );
    }
    println!(
        "pool deleted when the server ended: {}",
        r["poolGoneWithTheServer"]
    );
    if let Some(failures) = r["failures"].as_array().filter(|f| !f.is_empty()) {
        println!("failures: {failures:?}");
    }
}

fn print_table(r: &Value) {
    let f = common::figure;
    let h = &r["host"];
    println!(
        "smol-mcp on a booted guest: nested (TCG) figures on this host, {} cores ({}), load \
         average {} at start; smolvm 1.32.2 in a QEMU TCG VM, shared ({} other machines running \
         on it at start)",
        h["cores"],
        h["cpu"].as_str().unwrap_or(""),
        h["loadAverage"].as_str().unwrap_or(""),
        r["engine"]["otherMachinesRunningAtStart"]
            .as_array()
            .map_or(0, Vec::len)
    );
    println!();
    println!("| measure | through the server | raw REST API | server vs raw | goal |");
    println!("|---|---|---|---|---|");
    let fo = &r["firstOutput"];
    let w = &fo["raw"]["stats"];
    // This build's row, then an earlier build's (BOOTED_BENCH_BASELINE) for each.
    let first_output_row = |which: String, s: &Value, ratio: &Value, goal: &str| {
        println!(
            "| create to first output{which} (median / min / max of {}) | {:.0} / {:.0} / {:.0} ms | {:.0} / {:.0} / {:.0} ms | x{:.3} ({:+.0} ms) | {goal} |",
            s["n"],
            f(&s["p50Ms"]),
            f(&s["minMs"]),
            f(&s["maxMs"]),
            f(&w["p50Ms"]),
            f(&w["minMs"]),
            f(&w["maxMs"]),
            f(ratio),
            f(&s["p50Ms"]) - f(&w["p50Ms"])
        );
    };
    first_output_row(
        String::new(),
        &fo["server"]["stats"],
        &fo["ratioMedian"],
        "within 5%",
    );
    for b in fo["baselines"].as_array().into_iter().flatten() {
        let which = format!(", {}", b["label"].as_str().unwrap_or(""));
        first_output_row(
            which,
            &b["stats"],
            &b["ratioMedian"],
            "no worse than this build's",
        );
    }
    let split = |runs: &Value, key: &str| {
        runs.as_array()
            .into_iter()
            .flatten()
            .map(|x| format!("{:.0}", f(&x[key])))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "| of which ready (create-machine / create + start), each run | {} ms | {} ms | | |",
        split(&fo["server"]["runs"], "readyMs"),
        split(&fo["raw"]["runs"], "readyMs")
    );
    println!(
        "| of which the command (run-command / exec), each run | {} ms | {} ms (tries: {}) | | |",
        split(&fo["server"]["runs"], "commandMs"),
        split(&fo["raw"]["runs"], "commandMs"),
        split(&fo["raw"]["runs"], "execTries")
    );
    let rt = &r["roundTrip"];
    for sv in rt["servers"].as_array().into_iter().flatten() {
        let (s, w, d) = (&sv["stats"], &rt["raw"], &sv["pairedDiff"]);
        println!(
            "| run-command `true` vs exec `true`, {} (p50 / p90 of {}; min / max), each pair's difference: p50 (min to max) | {:.1} / {:.1} ms ({:.1} / {:.1}) | {:.1} / {:.1} ms ({:.1} / {:.1}) | {:+.1} / {:+.1} ms; pairs {:+.1} ({:+.1} to {:+.1}) | within 2 ms |",
            sv["label"].as_str().unwrap_or(""),
            s["n"],
            f(&s["p50Ms"]),
            f(&s["p90Ms"]),
            f(&s["minMs"]),
            f(&s["maxMs"]),
            f(&w["p50Ms"]),
            f(&w["p90Ms"]),
            f(&w["minMs"]),
            f(&w["maxMs"]),
            f(&sv["diffP50Ms"]),
            f(&sv["diffP90Ms"]),
            f(&d["p50Ms"]),
            f(&d["minMs"]),
            f(&d["maxMs"])
        );
    }
    let tb = &rt["thisBuild"];
    println!(
        "| of this build's run-command, the server's own time: the call less the engine requests it made, by its own clock (p50 / p90 / max of {}); engine requests per call {} to {}: {} | {:.2} / {:.2} / {:.2} ms | | | within 2 ms |",
        tb["ownMs"]["n"],
        tb["requestsPerCall"]["min"],
        tb["requestsPerCall"]["max"],
        tb["operations"],
        f(&tb["ownMs"]["p50Ms"]),
        f(&tb["ownMs"]["p90Ms"]),
        f(&tb["ownMs"]["maxMs"])
    );
    let st = &r["stream"];
    let o = &st["offset"];
    println!(
        "| streamed line, guest print to notification / SSE line, p50 / p90 / max of {} (guest clock offset {:.1} +/- {:.1} ms; p50 at the ends of that) | {:.1} / {:.1} / {:.1} ms (p50 {:.1} to {:.1}) | {:.1} / {:.1} / {:.1} ms (p50 {:.1} to {:.1}) | {:+.1} / {:+.1} / {:+.1} ms | p50 under 50 ms |",
        st["server"]["n"],
        f(&o["usedMs"]),
        f(&o["uncertaintyMs"]),
        f(&st["server"]["p50Ms"]),
        f(&st["server"]["p90Ms"]),
        f(&st["server"]["maxMs"]),
        f(&st["p50AtLowMs"]["server"]),
        f(&st["p50AtHighMs"]["server"]),
        f(&st["raw"]["p50Ms"]),
        f(&st["raw"]["p90Ms"]),
        f(&st["raw"]["maxMs"]),
        f(&st["p50AtLowMs"]["raw"]),
        f(&st["p50AtHighMs"]["raw"]),
        f(&st["diffP50Ms"]),
        f(&st["diffP90Ms"]),
        f(&st["diffMaxMs"])
    );
    for b in st["baselines"].as_array().into_iter().flatten() {
        println!(
            "| streamed line, {}, at the same offset (p50 / p90 / max) | {:.1} / {:.1} / {:.1} ms | {:.1} / {:.1} / {:.1} ms | {:+.1} / {:+.1} ms | |",
            b["label"].as_str().unwrap_or(""),
            f(&b["server"]["p50Ms"]),
            f(&b["server"]["p90Ms"]),
            f(&b["server"]["maxMs"]),
            f(&st["raw"]["p50Ms"]),
            f(&st["raw"]["p90Ms"]),
            f(&st["raw"]["maxMs"]),
            f(&b["diffP50Ms"]),
            f(&b["diffP90Ms"])
        );
    }
    let oc = &r["streamOneClock"];
    println!(
        "| streamed line on one clock: this host sends a line to the guest's `nc`, which prints it; sent to notification / SSE line, p50 / p90 / max of {} (an upper bound: the send's one-way leg is in it; that path's echo round trip p50 {:.1} ms) | {:.1} / {:.1} / {:.1} ms (p50 at least {:.1}) | {:.1} / {:.1} / {:.1} ms (p50 at least {:.1}) | {:+.1} ms | p50 under 50 ms |",
        oc["lines"],
        f(&oc["echoRoundTrip"]["p50Ms"]),
        f(&oc["server"]["p50Ms"]),
        f(&oc["server"]["p90Ms"]),
        f(&oc["server"]["maxMs"]),
        f(&oc["serverP50AtLeastMs"]),
        f(&oc["raw"]["p50Ms"]),
        f(&oc["raw"]["p90Ms"]),
        f(&oc["raw"]["maxMs"]),
        f(&oc["rawP50AtLeastMs"]),
        f(&oc["diffP50Ms"])
    );
    println!(
        "| streamed: request sent to the first line's arrival | {:.0} ms | {:.0} ms | | |",
        f(&st["firstLineAfterSendMs"]["server"]),
        f(&st["firstLineAfterSendMs"]["raw"])
    );
    println!();
    println!(
        "Streamed lines: {} stamped lines in {} progress notifications; lines {:.0} ms apart \
         (median: `sleep 0.3` plus starting it in the guest); guest clock read with {}.",
        st["lines"],
        st["notifications"],
        f(&st["lineGapMs"]["p50Ms"]),
        st["guestClock"].as_str().unwrap_or("")
    );
    println!(
        "Guest clock offset (guest - host), taken with raw requests just before and just after \
         the two streams: {x} two-way exchanges each time (the guest's shell spins on a file \
         test, this host writes the file with the files API, the guest prints its clock and \
         the line comes back on a raw exec/stream: the reading lies between the write's \
         sending and the line's arrival; quickest exchange {:.1} ms) and {n} raw execs of the \
         stamp. Before: [{:.1}, {:.1}] ms, after: [{:.1}, {:.1}] ms; used: the mean of the two \
         middles, {:.1} ms, +/- the wider half and half the drift, {:.1} ms (the raw stream's \
         own lines allow no less than {:.1} ms). A plain raw exec taken as a midpoint (its \
         quickest, round trip {:.1} ms) would say {:.1} ms: its first half, starting sh in the \
         guest, is the longer. server - raw does not depend on the offset.",
        f(&o["quickestExchangeBeforeRttMs"]),
        f(&o["before"]["lowerMs"]),
        f(&o["before"]["upperMs"]),
        f(&o["after"]["lowerMs"]),
        f(&o["after"]["upperMs"]),
        f(&o["usedMs"]),
        f(&o["uncertaintyMs"]),
        f(&o["rawLinesLowerMs"]),
        f(&o["plainExecMidpoint"]["rttMs"]),
        f(&o["plainExecMidpoint"]["offsetMs"]),
        n = OFFSET_SAMPLES,
        x = EXCHANGES
    );
    let failed = fo["failedTries"].as_array().map_or(0, Vec::len);
    if failed > 0 {
        println!(
            "Create to first output: {failed} tries failed and were run again (the engine is \
             shared): {}",
            fo["failedTries"]
        );
    }
    println!();
    println!(
        "Engine requests per call (a second server, through a relay; time to the answer's first byte):"
    );
    for call in r["requests"]["calls"].as_array().into_iter().flatten() {
        let list: Vec<String> = call["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| {
                format!(
                    "{} ({:.1} ms)",
                    q["request"].as_str().unwrap_or(""),
                    f(&q["firstByteMs"])
                )
            })
            .collect();
        println!(
            "- {}: {}",
            call["call"].as_str().unwrap_or(""),
            if list.is_empty() {
                "none".to_owned()
            } else {
                list.join(", ")
            }
        );
    }
}

fn main() {
    let runtime = common::runtime();
    let out_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out_dir).unwrap();
    if std::env::var("BOOTED_BENCH_ONLY").is_ok_and(|v| v == "bases") {
        let _leftovers = Leftovers {
            authority: nested::nested()
                .url
                .trim_start_matches("http://")
                .to_owned(),
        };
        let report = runtime.block_on(bases::bases());
        bases::print(&report);
        let path = out_dir.join("booted-bases.json");
        std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
        println!("\nfigures written to {}", path.display());
        return;
    }
    if std::env::var("BOOTED_BENCH_ONLY").is_ok_and(|v| v == "pool") {
        let report = runtime.block_on(warm_pool());
        print_pool(&report);
        let path = out_dir.join("booted-pool.json");
        std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
        println!("\nfigures written to {}", path.display());
        return;
    }
    let _leftovers = Leftovers {
        authority: nested::nested()
            .url
            .trim_start_matches("http://")
            .to_owned(),
    };
    let report = runtime.block_on(run(&out_dir));
    print_table(&report);
    let path = out_dir.join("booted.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    println!("\nfigures written to {}", path.display());
}
