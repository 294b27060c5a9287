//! The real engine whose guests boot: smolvm 1.32.2 nested in a QEMU TCG machine
//! (`scripts/nested-engine.sh`), its serve forwarded to a loopback port. scripts/test.sh brings
//! it up before the tests and down after them; a test that needs it and finds none fails,
//! naming the script (it is not skipped).
//!
//! Guests boot one at a time here: under TCG a second boot starves the first of CPU, and the
//! engine gives up on a guest after 30 s without boot progress. So every test of the guest holds
//! [`serial`] while it runs, except one given an engine of its own (the pause test's
//! `SMOL_NESTED_PAUSE_URL`).

use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct Nested {
    /// `http://127.0.0.1:PORT`: what `SMOL_LOCAL_URL` names.
    pub url: String,
    /// The busybox image archive, as the serve sees it (its `--local-image-dir`).
    pub busybox_image: String,
    /// Ports a machine may publish that reach this host's loopback at the same number
    /// (forwarded by QEMU; the serve binds published ports on all of the outer VM's addresses).
    pub publish_ports: Vec<u16>,
}

fn state_dir() -> PathBuf {
    std::env::var_os("SMOL_NESTED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/nested-engine"))
}

/// The nested engine's address and images: from the environment (`SMOL_NESTED_URL`, as
/// `scripts/nested-engine.sh env` prints it), else from the script's state file.
pub fn nested() -> Nested {
    let mut vars: BTreeMap<String, String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("SMOL_NESTED_"))
        .collect();
    if !vars.contains_key("SMOL_NESTED_URL") {
        let env_file = state_dir().join("env");
        let text = std::fs::read_to_string(&env_file).unwrap_or_else(|e| {
            panic!(
                "no nested real engine ({}: {e}): run `scripts/nested-engine.sh up` (scripts/test.sh \
                 does), or set SMOL_NESTED_URL",
                env_file.display()
            )
        });
        for line in text.lines() {
            if let Some((k, v)) = line.trim_start_matches("export ").split_once('=') {
                vars.entry(k.to_owned()).or_insert_with(|| v.to_owned());
            }
        }
    }
    let get = |k: &str| {
        vars.get(k)
            .cloned()
            .unwrap_or_else(|| panic!("{k} missing from the nested engine's environment"))
    };
    let found = Nested {
        url: get("SMOL_NESTED_URL"),
        busybox_image: get("SMOL_NESTED_BUSYBOX_IMAGE"),
        publish_ports: get("SMOL_NESTED_PUBLISH_PORTS")
            .split(',')
            .map(|p| {
                p.parse()
                    .unwrap_or_else(|e| panic!("SMOL_NESTED_PUBLISH_PORTS: {p:?}: {e}"))
            })
            .collect(),
    };
    WATCHDOG.call_once(|| watch(found.url.clone()));
    found
}

static WATCHDOG: std::sync::Once = std::sync::Once::new();
/// How long the serve may leave `/health` unanswered before the test process gives up.
const SILENT_FOR: std::time::Duration = std::time::Duration::from_secs(120);

/// The outer VM has stopped answering under the booted suite (its QEMU still running, its
/// console silent); every test then waits out its own deadline, up to the 900 s of a start.
/// A thread asks `/health` every 10 s, and when the serve has been silent for [`SILENT_FOR`],
/// ends the test process with the console's last lines, so the run fails in minutes and
/// scripts/test.sh can bring the engine up again and rerun the guest's tests.
fn watch(url: String) {
    let Some(addr) = url
        .strip_prefix("http://")
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
    else {
        return;
    };
    let boots_at_start = boots();
    std::thread::spawn(move || {
        let mut last_answer = std::time::Instant::now();
        loop {
            std::thread::sleep(std::time::Duration::from_secs(10));
            if boots() > boots_at_start {
                // The outer VM reset (a triple fault inside kvm_amd under QEMU's emulated SVM,
                // seen in its qemu.log) and booted again: its machines are gone, and a request
                // in flight through the forwarded port may never be answered. scripts/test.sh
                // reruns the guest's tests on a fresh engine.
                eprintln!(
                    "the nested engine's outer VM rebooted during the run: ending the test \
                     process (scripts/test.sh reruns the guest's tests once)"
                );
                end_descendants();
                std::process::exit(98);
            }
            if healthy(addr) {
                last_answer = std::time::Instant::now();
            } else if last_answer.elapsed() >= SILENT_FOR {
                let console =
                    std::fs::read_to_string(state_dir().join("serial.log")).unwrap_or_default();
                let tail: Vec<&str> = console.lines().rev().take(30).collect();
                eprintln!(
                    "the nested engine at {url} has not answered /health for {} s: ending the \
                     test process. Its console, last lines:\n{}",
                    SILENT_FOR.as_secs(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
                end_descendants();
                std::process::exit(97);
            }
        }
    });
}

/// Kills every process this test process started, and theirs: `exit` runs no destructor, so
/// without this a server a test spawned (kill-on-drop) outlives it, holding the pipe of
/// scripts/test.sh's `tee` open so that the run never ends (seen in CI).
fn end_descendants() {
    let me = std::process::id();
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // The parent is the second field after the command, which is in parentheses.
            let ppid = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut ours = vec![me];
    let mut i = 0;
    while i < ours.len() {
        let parent = ours[i];
        ours.extend(
            parents
                .iter()
                .filter(|(_, ppid)| *ppid == parent)
                .map(|(pid, _)| *pid),
        );
        i += 1;
    }
    for pid in ours.into_iter().skip(1) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
}

/// How often the outer VM has booted, as its init says on the console.
fn boots() -> usize {
    std::fs::read_to_string(state_dir().join("serial.log"))
        .map(|log| {
            log.lines()
                .map(str::trim_end)
                .filter(|l| l.starts_with("nested-init: ") && l.ends_with("s mounted"))
                .count()
        })
        .unwrap_or(0)
}

fn healthy(addr: std::net::SocketAddr) -> bool {
    use std::io::{Read, Write};
    let timeout = std::time::Duration::from_secs(10);
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    if stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: engine\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = [0u8; 12];
    stream.read_exact(&mut answer).is_ok() && answer.starts_with(b"HTTP/1.1 200")
}

/// tokio's, not std's: its guard is held across awaits, and it belongs to no runtime (each test
/// has its own).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Held by each test of the guest for its whole run (see the module's note).
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// A raw client of the nested serve's REST API, for what the tools do not show.
pub fn rest() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(600))
        .build()
        .unwrap()
}

/// The JSON body of the answer to `request`, failing the test if it cannot be sent or read.
pub async fn json_answer(request: reqwest::RequestBuilder) -> serde_json::Value {
    request.send().await.unwrap().json().await.unwrap()
}

/// The host memory the engine at `url` reports available (`/capacity`), in MiB; NaN when it
/// says nothing of it.
pub async fn host_memory_available_mb(url: &str) -> f64 {
    let capacity = json_answer(rest().get(format!("{url}/capacity"))).await;
    capacity["host_memory_available_mb"]
        .as_f64()
        .or(capacity["hostMemoryAvailableMb"].as_f64())
        .unwrap_or(f64::NAN)
}
