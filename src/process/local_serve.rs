//! The local engine: a `smolvm serve` this server finds or starts on the first local call
//! (never at connect: a client that only uses the cloud never needs smolvm), and stops at exit
//! if it started it.

use super::ephemeral::process_alive;
use crate::fleet::local::Health;
use crate::fleet::transport::LocalEndpoint;
use crate::fleet::{ErrorKind, FleetError, FleetResult, LocalFleet};
use crate::process::config::Config;
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

/// The host a published port's URL names: the address the engine binds, bracketed when IPv6;
/// for every address (0.0.0.0, ::), this host's name, which others reach it by.
pub fn publish_host(address: std::net::IpAddr) -> String {
    if address.is_unspecified() {
        if let Ok(name) = nix::unistd::gethostname()
            && let Some(name) = name.to_str().filter(|n| !n.is_empty())
        {
            return name.to_owned();
        }
        return "localhost".to_owned();
    }
    match address {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

#[derive(Debug)]
pub struct LocalServe {
    pub fleet: std::sync::Arc<LocalFleet>,
    pub version: String,
    /// Where it listens, as `--listen` takes it (`unix:/run/.../api.sock`, `127.0.0.1:8080`).
    pub listen: String,
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

/// Where the local serve answers: `localUrl`, else the runtime directory's socket.
pub fn local_endpoint(config: &Config) -> FleetResult<LocalEndpoint> {
    if config.local_url.is_empty() {
        Ok(LocalEndpoint::Unix(config.runtime_dir.join("api.sock")))
    } else {
        LocalEndpoint::parse(&config.local_url)
    }
}

impl LocalServe {
    /// Uses the serve at `localUrl` (or the runtime directory's socket) if one answers there;
    /// otherwise starts one.
    pub async fn acquire(
        config: &Config,
        credentials: std::sync::Arc<dyn crate::fleet::CredentialValues>,
    ) -> FleetResult<LocalServe> {
        let endpoint = local_endpoint(config)?;
        // Only the runtime directory's own serve has an owner to record; one at localUrl is
        // the user's to run and stop.
        let owner_file = config
            .local_url
            .is_empty()
            .then(|| config.runtime_dir.join("serve.owner"));
        let fleet = LocalFleet::new(endpoint.clone())?
            .with_credentials(credentials)
            .with_publish_host(publish_host(config.publish_address));
        let health = fleet.health().await;
        if !config.local_url.is_empty() {
            // A serve the user named is theirs: when it does not answer, that is the error.
            // Starting one in its place would delete their socket and write their state.
            match &health {
                Ok(h) if h.status == "ok" => {}
                Ok(h) => {
                    return Err(unavailable(format!(
                        "the serve named by SMOL_LOCAL_URL ({}) answers /health with status {}; \
                         this server uses it as it is and never starts one in its place",
                        config.local_url, h.status
                    )));
                }
                Err(e) => {
                    return Err(unavailable(format!(
                        "the serve named by SMOL_LOCAL_URL ({}) does not answer /health ({}): \
                         start it, or unset SMOL_LOCAL_URL to let this server start an engine of \
                         its own (it never starts one in place of a serve you named)",
                        config.local_url, e.message
                    )));
                }
            }
        }
        if let Ok(health) = health
            && health.status == "ok"
        {
            check_version(&health, &config.min_smolvm)?;
            let adopted = owner_file.as_deref().and_then(take_over_if_orphaned);
            tracing::info!(version = %health.version, listen = %endpoint.listen_arg(), adopted = adopted.is_some(), "using a running smolvm serve");
            return Ok(LocalServe {
                fleet: std::sync::Arc::new(fleet),
                version: health.version,
                listen: endpoint.listen_arg(),
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
        let engine = find_engine(&config.smolvm);
        let mut command = tokio::process::Command::new(&engine);
        command
            .args(["serve", "start", "--listen", &listen])
            .env_clear()
            .envs(serve_env(std::env::vars()))
            // The operator's publishAddress, over any SMOLVM_PUBLISH_ADDR passed through: the
            // URLs publish-port answers name this address.
            .env("SMOLVM_PUBLISH_ADDR", config.publish_address.to_string())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .kill_on_drop(false);
        let mut child = command.spawn().map_err(|e| {
            unavailable(format!(
                "could not run {} ({e}). The local fleet needs the smolvm engine: installing \
                 this server as a package brings it (`pipx install .` in the smol-mcp checkout), \
                 `scripts/install-engine.sh` there installs it alone where this server finds it, \
                 or name the binary with SMOLVM; and a hypervisor on this host. Use the \
                 cloud fleet where there is neither",
                engine.display()
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
                    listen: listen.clone(),
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
                    engine.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the serve this process started or took over has exited (killed, crashed): known
    /// without a request, so the next call starts another rather than failing on a dead
    /// socket. A serve someone else runs cannot be watched this way; a failed call notices it.
    pub fn exited(&mut self) -> bool {
        if let Some(child) = &mut self.child {
            return match child.try_wait() {
                Ok(Some(_)) => true,
                // A killed multi-threaded serve shows its main thread as a zombie while its
                // other threads are still being torn down, and a wait cannot reap it until
                // they are: its sockets already refuse, so it is gone for a call's purposes
                // (seen in CI as a call failing with "connection reset" right after a kill).
                Ok(None) => child.id().is_some_and(dying),
                Err(_) => false,
            };
        }
        self.adopted.is_some_and(|pid| !process_alive(pid))
    }

    /// Whether this process started the serve (rather than finding one that answered).
    pub fn started_here(&self) -> bool {
        self.child.is_some()
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

/// The engine to run. `smolvm` (the default) is looked for on `PATH` and then inside an installed
/// `smolmachines` Python package, which carries the engine as `smol/smol-vmm` but puts nothing on
/// `PATH`; any other value is used as given.
pub fn find_engine(configured: &str) -> PathBuf {
    let found = locate_engine(configured);
    if found.found_by == EngineSource::Package {
        tracing::info!(engine = %found.path.display(), "using the smolvm engine of the installed smolmachines package");
    }
    found.path
}

/// Where the engine was looked for and found, for `smol-mcp doctor` and `smol://targets`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineLocation {
    pub path: PathBuf,
    pub found_by: EngineSource,
}

/// Which way the engine was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineSource {
    /// Named by `SMOLVM` (or the `smolvm` file key).
    Configured,
    /// `smol/smol-vmm` of the `smolmachines` package in the Python environment this server's
    /// binary was installed into (its wheel depends on the engine's).
    InstalledWith,
    /// `smolvm` on `PATH`.
    Path,
    /// `smol/smol-vmm` in an installed `smolmachines` package.
    Package,
    /// Nowhere: the bare name `smolvm`, which will not run.
    NotFound,
}

impl EngineSource {
    pub fn describe(self) -> &'static str {
        match self {
            EngineSource::Configured => "named by SMOLVM",
            EngineSource::InstalledWith => "installed with this server",
            EngineSource::Path => "smolvm on PATH",
            EngineSource::Package => "in the installed smolmachines package",
            EngineSource::NotFound => "not found",
        }
    }
}

/// The engine `find_engine` would run, and which way it was found.
pub fn locate_engine(configured: &str) -> EngineLocation {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let venv = std::env::var_os("VIRTUAL_ENV").map(PathBuf::from);
    let xdg_data_home = std::env::var_os("XDG_DATA_HOME").map(PathBuf::from);
    let installed_in = installed_environment();
    locate_engine_from(
        configured,
        std::env::var_os("PATH").as_deref(),
        home.as_deref(),
        venv.as_deref(),
        xdg_data_home.as_deref(),
        installed_in.as_deref(),
    )
}

/// The environment this server's binary was installed into, `<env>/bin/smol-mcp` (a
/// virtualenv, or pipx's or uv's environment for the tool, whose `~/.local/bin` entry is a
/// link into it), found through the binary's real path.
fn installed_environment() -> Option<PathBuf> {
    let binary = std::env::current_exe().ok()?.canonicalize().ok()?;
    Some(binary.parent()?.parent()?.to_path_buf())
}

fn locate_engine_from(
    configured: &str,
    path: Option<&std::ffi::OsStr>,
    home: Option<&std::path::Path>,
    venv: Option<&std::path::Path>,
    xdg_data_home: Option<&std::path::Path>,
    installed_in: Option<&std::path::Path>,
) -> EngineLocation {
    if configured != "smolvm" {
        return EngineLocation {
            path: PathBuf::from(configured),
            found_by: EngineSource::Configured,
        };
    }
    // The engine that came with this server comes first: it is the one its wheel pins.
    let beside =
        installed_in.and_then(|env| site_packages_engines(&env.join("lib")).into_iter().next());
    if let Some(found) = beside {
        return EngineLocation {
            path: found,
            found_by: EngineSource::InstalledWith,
        };
    }
    let on_path = path
        .map(|p| {
            std::env::split_paths(p)
                .map(|d| d.join("smolvm"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.is_file());
    if let Some(found) = on_path {
        return EngineLocation {
            path: found,
            found_by: EngineSource::Path,
        };
    }
    match packaged_engines(home, venv, xdg_data_home)
        .into_iter()
        .next()
    {
        Some(found) => EngineLocation {
            path: found,
            found_by: EngineSource::Package,
        },
        None => EngineLocation {
            path: PathBuf::from(configured),
            found_by: EngineSource::NotFound,
        },
    }
}

/// Where `scripts/install-engine.sh` unpacks the engine and where the README's virtualenv goes:
/// `$XDG_DATA_HOME/smol-mcp`, else `~/.local/share/smol-mcp`. A client launches the server with
/// an environment of its own (no `VIRTUAL_ENV`, often no shell `PATH`), so the engine must be
/// findable from `HOME` alone.
fn smol_mcp_data_dir(
    home: Option<&std::path::Path>,
    xdg_data_home: Option<&std::path::Path>,
) -> Option<PathBuf> {
    xdg_data_home
        .filter(|d| !d.as_os_str().is_empty())
        .map(PathBuf::from)
        .or_else(|| home.map(|h| h.join(".local/share")))
        .map(|d| d.join("smol-mcp"))
}

/// The engines `scripts/install-engine.sh` unpacked (`engine/<version>/smol-vmm`), the newest
/// release first.
fn installed_engines(data_dir: &std::path::Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(data_dir.join("engine")) else {
        return Vec::new();
    };
    let mut versions: Vec<(String, PathBuf)> = entries
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                e.path().join("smol-vmm"),
            )
        })
        .filter(|(_, engine)| engine.is_file())
        .collect();
    versions.sort_by(|(a, _), (b, _)| {
        if version_at_least(a, b) && a != b {
            std::cmp::Ordering::Less
        } else if a == b {
            std::cmp::Ordering::Equal
        } else {
            std::cmp::Ordering::Greater
        }
    });
    versions.into_iter().map(|(_, engine)| engine).collect()
}

/// `smol/smol-vmm` in each `python3.N/{site,dist}-packages` under `lib`, the newest Python
/// first.
fn site_packages_engines(lib: &std::path::Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(lib) else {
        return Vec::new();
    };
    let mut pythons: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("python3"))
        })
        .collect();
    // By number: `python3.12` before `python3.9`.
    pythons.sort_by_key(|p| {
        std::cmp::Reverse(
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("python3."))
                .and_then(|minor| minor.parse::<u32>().ok())
                .unwrap_or(0),
        )
    });
    pythons
        .iter()
        .flat_map(|python| {
            ["site-packages", "dist-packages"].map(|p| python.join(p).join("smol/smol-vmm"))
        })
        .filter(|engine| engine.is_file())
        .collect()
}

/// `smol/smol-vmm` where the engine is installed: what `scripts/install-engine.sh` unpacked,
/// then the site-packages a `pip install smolmachines` writes to: the README's virtualenv
/// (`~/.local/share/smol-mcp/venv`), an active virtualenv's, the user's (`--user`), pipx's, and
/// the system's.
fn packaged_engines(
    home: Option<&std::path::Path>,
    venv: Option<&std::path::Path>,
    xdg_data_home: Option<&std::path::Path>,
) -> Vec<PathBuf> {
    let data_dir = smol_mcp_data_dir(home, xdg_data_home);
    let mut found = data_dir
        .as_deref()
        .map(installed_engines)
        .unwrap_or_default();
    let mut lib_dirs: Vec<PathBuf> = Vec::new();
    if let Some(data_dir) = &data_dir {
        lib_dirs.push(data_dir.join("venv/lib"));
    }
    if let Some(venv) = venv {
        lib_dirs.push(venv.join("lib"));
    }
    if let Some(home) = home {
        lib_dirs.push(home.join(".local/lib"));
        lib_dirs.push(home.join(".local/share/pipx/venvs/smolmachines/lib"));
        lib_dirs.push(home.join(".local/pipx/venvs/smolmachines/lib"));
    }
    lib_dirs.extend(["/usr/local/lib", "/usr/lib", "/opt/homebrew/lib"].map(PathBuf::from));
    for lib in lib_dirs {
        found.extend(site_packages_engines(&lib));
    }
    // pip --user on macOS: ~/Library/Python/3.12/lib/python/site-packages.
    if let Some(Ok(entries)) = home.map(|h| std::fs::read_dir(h.join("Library/Python"))) {
        for entry in entries.flatten() {
            let engine = entry.path().join("lib/python/site-packages/smol/smol-vmm");
            if engine.is_file() {
                found.push(engine);
            }
        }
    }
    found
}

/// Whether `pid` is a zombie or being reaped (`/proc/<pid>/stat` state Z or X). Only Linux has
/// `/proc`; elsewhere a wait that returned nothing is the answer.
fn dying(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().next());
    matches!(state, Some("Z") | Some("X"))
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

    /// An empty file at `path`, its folders made.
    fn touch(path: &std::path::Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "").unwrap();
    }

    #[test]
    fn versions_compare_numerically() {
        assert!(version_at_least("1.32.2", "1.32.0"));
        assert!(version_at_least("1.32.2-rc1", "1.32.2"));
        assert!(!version_at_least("1.9.0", "1.14.0"));
        assert!(!version_at_least("0.5.20", "1.14.0"));
        assert!(version_at_least("2", "1.99.99"));
    }

    #[test]
    fn the_engine_is_found_in_an_installed_smolmachines_package() {
        let home = tempfile::tempdir().unwrap();
        let packaged = home
            .path()
            .join(".local/lib/python3.11/site-packages/smol/smol-vmm");
        std::fs::create_dir_all(packaged.parent().unwrap()).unwrap();
        std::fs::write(&packaged, "").unwrap();
        let empty_path = std::ffi::OsStr::new("/nonexistent");
        let found = locate_engine_from(
            "smolvm",
            Some(empty_path),
            Some(home.path()),
            None,
            None,
            None,
        );
        assert_eq!(found.path, packaged);
        assert_eq!(found.found_by, EngineSource::Package);
        let configured = locate_engine_from(
            "/opt/smolvm",
            Some(empty_path),
            Some(home.path()),
            None,
            None,
            None,
        );
        assert_eq!(
            configured.path,
            PathBuf::from("/opt/smolvm"),
            "a configured engine is used as given"
        );
        assert_eq!(configured.found_by, EngineSource::Configured);
    }

    /// Installed as a Python package (the wheel depends on smolmachines), the server runs the
    /// engine of its own environment before any other: one on PATH, or another package's.
    #[test]
    fn the_engine_installed_with_the_server_comes_first() {
        let env = tempfile::tempdir().unwrap();
        let beside = env
            .path()
            .join("lib/python3.12/site-packages/smol/smol-vmm");
        touch(&beside);
        touch(&env.path().join("lib/python3.9/site-packages/smol/smol-vmm"));
        let path_dir = tempfile::tempdir().unwrap();
        touch(&path_dir.path().join("smolvm"));
        let home = tempfile::tempdir().unwrap();
        touch(
            &home
                .path()
                .join(".local/lib/python3.11/site-packages/smol/smol-vmm"),
        );
        let with_server_in = |prefix: &std::path::Path| {
            let path = Some(path_dir.path().as_os_str());
            locate_engine_from("smolvm", path, Some(home.path()), None, None, Some(prefix))
        };
        let found = with_server_in(env.path());
        assert_eq!(found.path, beside, "the environment's own, newest Python");
        assert_eq!(found.found_by, EngineSource::InstalledWith);
        let elsewhere = tempfile::tempdir().unwrap();
        let found = with_server_in(elsewhere.path());
        assert_eq!(
            found.found_by,
            EngineSource::Path,
            "an environment without the engine (a cargo install) changes nothing"
        );
        let configured =
            locate_engine_from("/opt/smolvm", None, None, None, None, Some(env.path()));
        assert_eq!(configured.found_by, EngineSource::Configured);
    }

    #[test]
    fn the_installed_engine_and_the_readme_venv_are_found_without_variables() {
        let empty_path = std::ffi::OsStr::new("/nonexistent");
        let find = |home: &std::path::Path, data: Option<&std::path::Path>| {
            locate_engine_from("smolvm", Some(empty_path), Some(home), None, data, None)
        };
        let home = tempfile::tempdir().unwrap();
        let venv = home
            .path()
            .join(".local/share/smol-mcp/venv/lib/python3.11/site-packages/smol/smol-vmm");
        touch(&venv);
        let found = find(home.path(), None);
        assert_eq!(
            found.path, venv,
            "the README's virtualenv, with no VIRTUAL_ENV"
        );
        let older = home
            .path()
            .join(".local/share/smol-mcp/engine/1.9.0/smol-vmm");
        let newer = home
            .path()
            .join(".local/share/smol-mcp/engine/1.32.2/smol-vmm");
        touch(&older);
        touch(&newer);
        let found = find(home.path(), None);
        assert_eq!(
            found.path, newer,
            "install-engine.sh's newest release, by number"
        );
        assert_eq!(found.found_by, EngineSource::Package);
        let data = tempfile::tempdir().unwrap();
        let elsewhere = data.path().join("smol-mcp/engine/1.32.2/smol-vmm");
        touch(&elsewhere);
        let found = find(home.path(), Some(data.path()));
        assert_eq!(
            found.path, elsewhere,
            "XDG_DATA_HOME moves the data directory"
        );
        let mac_home = tempfile::tempdir().unwrap();
        let mac = mac_home
            .path()
            .join("Library/Python/3.12/lib/python/site-packages/smol/smol-vmm");
        touch(&mac);
        let found = find(mac_home.path(), None);
        assert_eq!(found.path, mac, "pip --user on macOS");
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
