//! The local engine: a `smolvm serve` this server finds or starts on the first local call
//! (never at connect: a client that only uses the cloud never needs smolvm), and stops at exit
//! if it started it.

use super::ephemeral::process_alive;
use crate::config::Config;
use crate::fleet::local::Health;
use crate::fleet::transport::LocalEndpoint;
use crate::fleet::{ErrorKind, FleetError, FleetResult, LocalFleet};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Environment variables passed to the serve; nothing else (no cloud token, no HTTP token).
const PASSED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
];

pub fn serve_env(all: impl Iterator<Item = (String, String)>) -> Vec<(String, String)> {
    all.filter(|(k, _)| PASSED_ENV.contains(&k.as_str()) || k.starts_with("SMOLVM_"))
        .collect()
}

#[derive(Debug)]
pub struct LocalServe {
    pub fleet: std::sync::Arc<LocalFleet>,
    pub version: String,
    /// The serve process, when this server started it.
    child: Option<tokio::process::Child>,
    /// A serve this server adopted from an owner that died (SIGKILL leaves its serve behind):
    /// its pid, stopped at exit like a child.
    adopted: Option<u32>,
    /// Where the owner of the runtime directory's serve is recorded.
    owner_file: Option<PathBuf>,
}

/// Who owns the serve on the runtime directory's socket: the process that started it (or took
/// it over), and the serve's own pid. Written beside the socket, so that a successor can tell a
/// serve whose owner still runs (leave it) from one whose owner was killed (take it over).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ServeOwner {
    owner_pid: u32,
    serve_pid: u32,
}

fn read_owner(path: &std::path::Path) -> Option<ServeOwner> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

fn write_owner(path: &std::path::Path, owner: &ServeOwner) {
    let written = serde_json::to_vec(owner)
        .map_err(std::io::Error::other)
        .and_then(|bytes| {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, path)
        });
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), error = %e, "could not record who owns the local serve");
    }
}

fn unavailable(message: String) -> FleetError {
    FleetError::new(ErrorKind::Unsupported, "local fleet", message)
}

/// Compares dotted versions numerically; a suffix after the digits is ignored (`1.32.2-rc1`).
pub fn version_at_least(found: &str, wanted: &str) -> bool {
    let parts = |v: &str| -> Vec<u64> {
        v.split('.')
            .map(|p| {
                p.chars()
                    .take_while(char::is_ascii_digit)
                    .collect::<String>()
                    .parse()
                    .unwrap_or(0)
            })
            .collect()
    };
    let (f, w) = (parts(found), parts(wanted));
    for i in 0..f.len().max(w.len()) {
        let (a, b) = (
            f.get(i).copied().unwrap_or(0),
            w.get(i).copied().unwrap_or(0),
        );
        if a != b {
            return a > b;
        }
    }
    true
}

fn check_version(health: &Health, wanted: &str) -> FleetResult<()> {
    if wanted.is_empty() || version_at_least(&health.version, wanted) {
        return Ok(());
    }
    Err(unavailable(format!(
        "smolvm serve reports version {} and this server needs at least {wanted}: upgrade smolvm, \
         or set SMOL_MCP_MIN_SMOLVM to accept the older engine (an empty value turns the check off)",
        health.version
    )))
}

impl LocalServe {
    /// Uses the serve at `localUrl` (or the runtime directory's socket) if one answers there;
    /// otherwise starts one.
    pub async fn acquire(config: &Config) -> FleetResult<LocalServe> {
        let endpoint = if config.local_url.is_empty() {
            LocalEndpoint::Unix(config.runtime_dir.join("api.sock"))
        } else {
            LocalEndpoint::parse(&config.local_url)?
        };
        // Only the runtime directory's own serve has an owner to record; one at localUrl is
        // the user's to run and stop.
        let owner_file = config
            .local_url
            .is_empty()
            .then(|| config.runtime_dir.join("serve.owner"));
        let fleet = LocalFleet::new(endpoint.clone())?;
        if let Ok(health) = fleet.health().await
            && health.status == "ok"
        {
            check_version(&health, &config.min_smolvm)?;
            let adopted = owner_file.as_deref().and_then(take_over_if_orphaned);
            tracing::info!(version = %health.version, listen = %endpoint.listen_arg(), adopted = adopted.is_some(), "using a running smolvm serve");
            return Ok(LocalServe {
                fleet: std::sync::Arc::new(fleet),
                version: health.version,
                child: None,
                adopted,
                owner_file: adopted.and(owner_file),
            });
        }
        Self::spawn(config, endpoint, fleet, owner_file).await
    }

    async fn spawn(
        config: &Config,
        endpoint: LocalEndpoint,
        fleet: LocalFleet,
        owner_file: Option<PathBuf>,
    ) -> FleetResult<LocalServe> {
        if let LocalEndpoint::Unix(socket) = &endpoint {
            // A socket file left by a serve that is gone would make the new one fail to bind.
            let _ = std::fs::remove_file(socket);
        }
        let log_path: PathBuf = config.runtime_dir.join("serve.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| unavailable(format!("cannot open {}: {e}", log_path.display())))?;
        let log_err = log
            .try_clone()
            .map_err(|e| unavailable(format!("{}: {e}", log_path.display())))?;
        let listen = endpoint.listen_arg();
        let mut command = tokio::process::Command::new(&config.smolvm);
        command
            .args(["serve", "start", "--listen", &listen])
            .env_clear()
            .envs(serve_env(std::env::vars()))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .kill_on_drop(false);
        let mut child = command.spawn().map_err(|e| {
            unavailable(format!(
                "could not run {} ({e}). The local fleet needs smolvm (SMOLVM names the binary) and \
                 a hypervisor on this host; use the cloud fleet where there is neither",
                config.smolvm
            ))
        })?;
        let deadline = Instant::now() + Duration::from_secs(config.serve_start_timeout_secs);
        loop {
            if let Ok(health) = fleet.health().await {
                tracing::info!(version = %health.version, %listen, pid = child.id(), "started smolvm serve");
                if let (Some(path), Some(serve_pid)) = (&owner_file, child.id()) {
                    let owner = ServeOwner {
                        owner_pid: std::process::id(),
                        serve_pid,
                    };
                    write_owner(path, &owner);
                }
                let serve = LocalServe {
                    fleet: std::sync::Arc::new(fleet),
                    version: health.version.clone(),
                    child: Some(child),
                    adopted: None,
                    owner_file,
                };
                if let Err(e) = check_version(&health, &config.min_smolvm) {
                    serve.stop().await;
                    return Err(e);
                }
                return Ok(serve);
            }
            let exited = child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() >= deadline {
                let _ = child.start_kill();
                let tail = log_tail(&log_path);
                let what = match exited {
                    Some(status) => format!("exited ({status}) without answering /health"),
                    None => format!(
                        "did not answer /health within {} s",
                        config.serve_start_timeout_secs
                    ),
                };
                let hint = if tail.contains("10081") {
                    " Another smolvm serve already holds the guest rollout port 127.0.0.1:10081: \
                     set SMOL_LOCAL_URL to its address, or SMOLVM_GUEST_ROLLOUT_HOST_PORT to a free port."
                } else {
                    ""
                };
                return Err(unavailable(format!(
                    "smolvm serve {what} ({} serve start --listen {listen}).{hint} Its log ends: {tail}",
                    config.smolvm
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn owned(&self) -> bool {
        self.child.is_some() || self.adopted.is_some()
    }

    /// Stops a serve this server started or took over: SIGTERM, then SIGKILL after 10 s.
    /// Machines outlive the serve; the ephemeral ones have been deleted before this runs.
    pub async fn stop(mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                signal(pid, nix::sys::signal::Signal::SIGTERM);
            }
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        } else if let Some(pid) = self.adopted.take() {
            // Not our child: it cannot be waited for, only watched until it is gone.
            signal(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while process_alive(pid) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if process_alive(pid) {
                signal(pid, nix::sys::signal::Signal::SIGKILL);
            }
        } else {
            return;
        }
        if let Some(path) = self.owner_file.take()
            && read_owner(&path).is_some_and(|o| o.owner_pid == std::process::id())
        {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
}

/// A serve whose recorded owner is dead belongs to nobody: this process takes it over (and so
/// stops it at exit). Answers the serve's pid when it did.
fn take_over_if_orphaned(path: &std::path::Path) -> Option<u32> {
    let owner = read_owner(path)?;
    let me = std::process::id();
    if owner.owner_pid == me || process_alive(owner.owner_pid) || !process_alive(owner.serve_pid) {
        return None;
    }
    write_owner(
        path,
        &ServeOwner {
            owner_pid: me,
            serve_pid: owner.serve_pid,
        },
    );
    // Two successors racing for one orphan: the later write stands and the earlier one
    // usually sees it; at worst both stop the serve at exit, as its dead owner would have.
    (read_owner(path)?.owner_pid == me).then(|| {
        tracing::info!(
            serve_pid = owner.serve_pid,
            dead_owner = owner.owner_pid,
            "took over the local serve of a process that died"
        );
        owner.serve_pid
    })
}

fn log_tail(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("note: no packed assets"))
        .collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically() {
        assert!(version_at_least("1.32.2", "1.32.0"));
        assert!(version_at_least("1.32.2-rc1", "1.32.2"));
        assert!(!version_at_least("1.9.0", "1.14.0"));
        assert!(!version_at_least("0.5.20", "1.14.0"));
        assert!(version_at_least("2", "1.99.99"));
    }

    #[test]
    fn the_serve_gets_no_secrets() {
        let env = vec![
            ("PATH".to_string(), "/bin".to_string()),
            ("SMOLVM_VM_UID_DROP".to_string(), "off".to_string()),
            ("SMOL_CLOUD_TOKEN".to_string(), "smk".to_string()),
            ("SMOL_MCP_AUTH_TOKEN".to_string(), "t".to_string()),
            ("AWS_SECRET_ACCESS_KEY".to_string(), "x".to_string()),
        ];
        let kept: Vec<String> = serve_env(env.into_iter())
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(kept, ["PATH", "SMOLVM_VM_UID_DROP"]);
    }
}
