//! Whether each fleet this process serves can be used from this host now, and what to do when
//! it cannot: the facts behind the `smol://targets` resource and `smol-mcp doctor`, gathered in
//! one place so that the two never disagree.

use crate::fleet::diagnosis::{HostCause, VirtualHost};
use crate::fleet::{CloudFleet, FleetApi, FleetError, FleetKind, LocalFleet};
use crate::process::config::Config;
use crate::process::local_serve::{EngineSource, local_endpoint, locate_engine, version_at_least};
use crate::process::{Mode, ephemeral::ensure_runtime_dir};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How long `<engine> --version` may take: the engine answers at once (a few milliseconds),
/// so anything slower is an engine that does not run here.
const ENGINE_VERSION_TIMEOUT: Duration = Duration::from_secs(5);

/// Every served fleet, whether it is usable, and the fleets this process does not serve.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Targets {
    /// `local`, `cloud` or `both`: what `SMOL_MCP_TARGETS` resolved to.
    pub mode: &'static str,
    /// At least one served fleet is usable.
    pub usable: bool,
    pub fleets: Vec<FleetFacts>,
    /// Fleets not served by this process, and how to add them.
    pub not_served: Vec<NotServed>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NotServed {
    pub target: &'static str,
    pub how: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "target", rename_all = "camelCase")]
pub enum FleetFacts {
    Local(Box<LocalFacts>),
    Cloud(CloudFacts),
}

impl FleetFacts {
    pub fn usable(&self) -> bool {
        match self {
            FleetFacts::Local(l) => l.usable,
            FleetFacts::Cloud(c) => c.usable,
        }
    }

    pub fn problems(&self) -> &[Problem] {
        match self {
            FleetFacts::Local(l) => &l.problems,
            FleetFacts::Cloud(c) => &c.problems,
        }
    }

    pub fn kind(&self) -> FleetKind {
        match self {
            FleetFacts::Local(_) => FleetKind::Local,
            FleetFacts::Cloud(_) => FleetKind::Cloud,
        }
    }
}

/// Something in the way, and what to do about it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    pub what: String,
    pub fix: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalFacts {
    pub usable: bool,
    pub engine: EngineFacts,
    /// A serve already answering where this server looks for one (`localUrl`, else the runtime
    /// directory's socket); without one the server starts the engine on the first local call.
    pub serve: ServeFacts,
    /// This host's hypervisor; absent for a named serve, whose host may be another one.
    pub hypervisor: Option<HypervisorFacts>,
    pub runtime_dir: RuntimeDirFacts,
    pub running_as_root: bool,
    /// `SMOLVM_VM_UID_DROP=off` in this process's environment (the engine refuses to start
    /// as root without it).
    pub uid_drop_off: bool,
    /// What `smol-mcp doctor` saw when it booted a test machine; never gathered for the
    /// resource (a read must not boot a machine).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot: Option<BootFacts>,
    /// Whether this host resolves Docker Hub's registry, which the engine's image pulls need:
    /// `smol-mcp doctor` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registry: Option<RegistryFacts>,
    /// The secrets the operator set up for machines (names, where they go; never a value).
    pub credentials: Vec<CredentialFacts>,
    pub problems: Vec<Problem>,
}

/// One credential binding as an agent may name it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialFacts {
    pub name: String,
    /// The machine's variable that holds the placeholder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// The request header set to the value, for a binding without a variable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    pub hosts: Vec<String>,
    /// Whether the server has a value to supply now, and if not what the operator must set.
    pub value: String,
}

fn credential_facts(config: &Config) -> Vec<CredentialFacts> {
    let supplier =
        crate::process::credentials::Supplier::new(config.credentials.clone(), &config.runtime_dir);
    config
        .credentials
        .iter()
        .map(|b| CredentialFacts {
            name: b.name.clone(),
            env: b.env.clone(),
            header: b.header.clone(),
            hosts: b.hosts.clone(),
            value: match supplier.check_value(b) {
                Ok(()) => format!("set ({})", b.source_words()),
                Err(why) => why,
            },
        })
        .collect()
}

/// Whether the registry images come from by default resolves from this host. A machine needs
/// none without an image, so its absence only limits which machines can be made.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistryFacts {
    pub host: &'static str,
    pub resolves: bool,
    pub detail: String,
}

/// The registry an image without a host (`alpine`, `python:3.12`) comes from.
pub const DEFAULT_REGISTRY: &str = "registry-1.docker.io";

/// Looks `DEFAULT_REGISTRY` up as the engine would, on this host, for at most 5 s.
pub async fn registry_facts() -> RegistryFacts {
    let lookup = async {
        tokio::net::lookup_host((DEFAULT_REGISTRY, 443))
            .await
            .map(|addrs| addrs.count())
    };
    let (resolves, detail) = match tokio::time::timeout(Duration::from_secs(5), lookup).await {
        Ok(Ok(found)) if found > 0 => (
            true,
            format!("{DEFAULT_REGISTRY} resolves from this host: images can be pulled"),
        ),
        Ok(Ok(_)) => (false, format!("{DEFAULT_REGISTRY} has no address here")),
        Ok(Err(e)) => (
            false,
            format!("{DEFAULT_REGISTRY} does not resolve here ({e})"),
        ),
        Err(_) => (
            false,
            format!("looking up {DEFAULT_REGISTRY} took over 5 s"),
        ),
    };
    let detail = if resolves {
        detail
    } else {
        format!(
            "{detail}: create-machine with an image will fail to pull (the machine's network \
             setting does not change that); without image, machines boot the engine's bundled \
             Alpine and need no registry. Fix the host's DNS or proxy to pull images"
        )
    };
    RegistryFacts {
        host: DEFAULT_REGISTRY,
        resolves,
        detail,
    }
}

/// A real boot: a machine from the engine's bundled rootfs (no registry), one command in it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BootFacts {
    pub booted: bool,
    /// From the call to the command's output, the engine's start included when it was needed.
    pub secs: f64,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineFacts {
    /// What would be run, when found.
    pub path: Option<String>,
    /// `SMOLVM`, `PATH`, `smolmachines package`, or `not found`.
    pub found_by: &'static str,
    /// The engine's release, from its `--version` or from the serve's `/health`.
    pub version: Option<String>,
    /// The floor (`SMOL_MCP_MIN_SMOLVM`); empty when the check is off.
    pub minimum: String,
    pub version_ok: bool,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServeFacts {
    pub url: String,
    /// Named by `localUrl` (`SMOL_LOCAL_URL`): the user's serve, which may run on another
    /// host (a VM, a forwarded port), so this host's engine and KVM say nothing of it.
    pub named: bool,
    pub answering: bool,
    pub version: Option<String>,
    /// Why it did not answer, when it did not.
    pub error: Option<String>,
    /// What the serve says of itself in `/health`.
    pub nested_virt: Option<bool>,
    pub uptime_secs: Option<i64>,
    pub machines: Option<u64>,
    pub running_machines: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HypervisorFacts {
    /// `KVM` (Linux), `Hypervisor.framework` (macOS), or `none` elsewhere.
    pub kind: &'static str,
    pub present: bool,
    pub usable: bool,
    /// The device opens, but this host is itself a virtual machine that boots no guests as far
    /// as it shows (`VirtualHost`): usable to the engine, and likely to fail at the first boot.
    pub on_virtual_host: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeDirFacts {
    pub path: String,
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CloudFacts {
    pub usable: bool,
    pub url: String,
    /// Whether `SMOL_CLOUD_TOKEN` is set; the token itself is never shown.
    pub token_set: bool,
    pub account: AccountFacts,
    pub problems: Vec<Problem>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AccountFacts {
    pub answering: bool,
    pub tenant_id: Option<String>,
    pub status: Option<String>,
    pub plan: Option<String>,
    /// Why the account did not answer.
    pub error: Option<String>,
}

/// What of the host the facts are read from; tests point the KVM device at a file of their own.
#[derive(Debug, Clone)]
pub struct Host {
    pub kvm_device: PathBuf,
    /// The host is a virtual machine whose KVM opens and boots none of the engine's guests.
    pub virtual_host: Option<VirtualHost>,
}

impl Host {
    pub fn this_host() -> Host {
        Host {
            kvm_device: PathBuf::from("/dev/kvm"),
            virtual_host: crate::fleet::diagnosis::this_virtual_host(),
        }
    }
}

/// Gathers the facts of every fleet `mode` serves. `cloud` is the process's cloud fleet (the
/// account is asked through it, as tools ask it), `None` when no token is configured.
pub async fn gather(
    config: &Config,
    mode: Mode,
    cloud: Option<Result<Arc<CloudFleet>, FleetError>>,
    host: &Host,
) -> Targets {
    let serves = |kind| match mode {
        Mode::Both => true,
        Mode::Single(k) => k == kind,
    };
    let mut fleets = Vec::new();
    let mut not_served = Vec::new();
    if serves(FleetKind::Local) {
        fleets.push(FleetFacts::Local(Box::new(local_facts(config, host).await)));
    } else {
        not_served.push(NotServed {
            target: "local",
            how: "set SMOL_MCP_TARGETS=both (or local) to serve the local fleet too".into(),
        });
    }
    if serves(FleetKind::Cloud) {
        fleets.push(FleetFacts::Cloud(cloud_facts(config, cloud).await));
    } else {
        not_served.push(NotServed {
            target: "cloud",
            how: if config.cloud_token.is_empty() {
                "set SMOL_CLOUD_TOKEN (and SMOL_CLOUD_URL if it is not the default) to serve the \
                 cloud fleet too"
                    .into()
            } else {
                "set SMOL_MCP_TARGETS=both (or auto) to serve the cloud fleet too".into()
            },
        });
    }
    Targets {
        mode: match mode {
            Mode::Both => "both",
            Mode::Single(k) => k.as_str(),
        },
        usable: fleets.iter().any(FleetFacts::usable),
        fleets,
        not_served,
    }
}

async fn local_facts(config: &Config, host: &Host) -> LocalFacts {
    let serve = serve_facts(config).await;
    if serve.named {
        return named_serve_facts(config, serve);
    }
    let mut problems = Vec::new();
    let minimum = config.min_smolvm.clone();
    let engine = engine_facts(config, &serve, &minimum).await;
    if !serve.answering {
        match engine.found_by {
            "not found" if config.smolvm != "smolvm" => problems.push(Problem {
                what: format!("SMOLVM names {}, which is not a file", config.smolvm),
                fix: "point SMOLVM at the engine binary (an installed smolmachines package has \
                      it as smol/smol-vmm in its site-packages), or unset SMOLVM to let the \
                      server find it on PATH or in the package"
                    .into(),
            }),
            "not found" => problems.push(Problem {
                what: "the smolvm engine was not found: not on PATH, not in an installed \
                       smolmachines package, and SMOLVM is not set"
                    .into(),
                fix: "install the server as a package, which brings its engine (`pipx \
                      install .` from the smol-mcp checkout), or run \
                      `scripts/install-engine.sh` from the checkout (it fetches \
                      the pinned smolmachines wheel with python3 alone and unpacks the engine \
                      into ~/.local/share/smol-mcp/engine, where this server finds it), or pip \
                      install smolmachines into ~/.local/share/smol-mcp/venv, or set SMOLVM to \
                      the engine binary"
                    .into(),
            }),
            _ if engine.version.is_none() => problems.push(Problem {
                what: format!(
                    "the engine at {} ({}) does not run",
                    engine.path.as_deref().unwrap_or("?"),
                    engine.found_by
                ),
                fix: "point SMOLVM at a working smolvm binary (the smolmachines package's \
                      smol/smol-vmm), or reinstall the package"
                    .into(),
            }),
            _ => {}
        }
    }
    if let Some(version) = &engine.version
        && !engine.version_ok
    {
        problems.push(Problem {
            what: format!("the engine is {version}, older than the {minimum} this server needs"),
            fix: "upgrade it (`scripts/install-engine.sh` in the smol-mcp checkout installs the pinned release), or set \
                  SMOL_MCP_MIN_SMOLVM to accept it (empty turns the check off)"
                .into(),
        });
    }
    let hypervisor = hypervisor_facts(host).await;
    if !hypervisor.usable {
        problems.push(Problem {
            what: format!("{}: {}", hypervisor.kind, hypervisor.detail),
            fix: hypervisor_fix(&hypervisor),
        });
    }
    let runtime_dir = runtime_dir_facts(config, &mut problems);
    let running_as_root = nix::unistd::geteuid().is_root();
    let uid_drop_off = std::env::var("SMOLVM_VM_UID_DROP").is_ok_and(|v| v == "off");
    // A serve already running was started with whatever it needed; only a serve this server
    // starts inherits this process's environment.
    if running_as_root && !uid_drop_off && !serve.answering {
        problems.push(Problem {
            what: format!(
                "running as root without SMOLVM_VM_UID_DROP=off: {}; installed under a home \
                 directory the engine refuses to start (that user cannot reach libkrun either), \
                 elsewhere it starts but every create fails within seconds",
                HostCause::RootWithUidDrop.explain().0
            ),
            fix: HostCause::RootWithUidDrop.explain().1.into(),
        });
    }
    LocalFacts {
        usable: problems.is_empty(),
        engine,
        serve,
        hypervisor: Some(hypervisor),
        runtime_dir,
        running_as_root,
        uid_drop_off,
        boot: None,
        registry: None,
        credentials: credential_facts(config),
        problems,
    }
}

fn runtime_dir_facts(config: &Config, problems: &mut Vec<Problem>) -> RuntimeDirFacts {
    let facts = match ensure_runtime_dir(&config.runtime_dir) {
        Ok(()) => RuntimeDirFacts {
            path: config.runtime_dir.display().to_string(),
            ok: true,
            detail: "private to this user (mode 0700)".into(),
        },
        Err(e) => RuntimeDirFacts {
            path: config.runtime_dir.display().to_string(),
            ok: false,
            detail: e.to_string(),
        },
    };
    if !facts.ok {
        problems.push(Problem {
            what: format!("the runtime directory: {}", facts.detail),
            fix: "set SMOL_MCP_RUNTIME_DIR to a directory of your own".into(),
        });
    }
    facts
}

/// The facts of a serve the user named: its own answer, not this host's. The engine binary,
/// `/dev/kvm` and root's uid-drop setting here belong to a serve this server would start, and
/// it starts none in place of a named one.
fn named_serve_facts(config: &Config, serve: ServeFacts) -> LocalFacts {
    let mut problems = Vec::new();
    let minimum = config.min_smolvm.clone();
    if !serve.answering {
        problems.push(Problem {
            what: format!(
                "the serve named by SMOL_LOCAL_URL ({}) does not answer /health: {}",
                config.local_url,
                serve.error.as_deref().unwrap_or("no answer")
            ),
            fix: "start that serve (or fix the address), or unset SMOL_LOCAL_URL to let this \
                  server start an engine of its own; it never starts one in place of a serve \
                  you named"
                .into(),
        });
    }
    let version_ok = match &serve.version {
        Some(v) => minimum.is_empty() || version_at_least(v, &minimum),
        None => false,
    };
    if let Some(version) = &serve.version
        && !version_ok
    {
        problems.push(Problem {
            what: format!(
                "the serve at {} is smolvm {version}, older than the {minimum} this server needs",
                serve.url
            ),
            fix: "upgrade the engine behind that serve, or set SMOL_MCP_MIN_SMOLVM to accept it \
                  (empty turns the check off)"
                .into(),
        });
    }
    let engine = EngineFacts {
        path: None,
        found_by: "SMOL_LOCAL_URL",
        version: serve.version.clone(),
        minimum,
        version_ok,
    };
    let runtime_dir = runtime_dir_facts(config, &mut problems);
    LocalFacts {
        usable: problems.is_empty(),
        engine,
        serve,
        hypervisor: None,
        runtime_dir,
        running_as_root: nix::unistd::geteuid().is_root(),
        uid_drop_off: std::env::var("SMOLVM_VM_UID_DROP").is_ok_and(|v| v == "off"),
        boot: None,
        registry: None,
        credentials: credential_facts(config),
        problems,
    }
}

async fn serve_facts(config: &Config) -> ServeFacts {
    let endpoint = local_endpoint(config);
    let url = match &endpoint {
        Ok(e) => e.listen_arg(),
        Err(_) => config.local_url.clone(),
    };
    let health = match endpoint.and_then(LocalFleet::new) {
        Ok(fleet) => fleet.health().await.map_err(|e| e.message),
        Err(e) => Err(e.message),
    };
    let answer = health.as_ref().ok();
    ServeFacts {
        url,
        named: !config.local_url.is_empty(),
        answering: answer.is_some_and(|h| h.status == "ok"),
        version: answer.map(|h| h.version.clone()),
        error: match &health {
            Ok(h) if h.status != "ok" => Some(format!("status {}", h.status)),
            Ok(_) => None,
            Err(e) => Some(e.clone()),
        },
        nested_virt: answer.map(|h| h.nested_virt),
        uptime_secs: answer.and_then(|h| h.uptime_secs),
        machines: answer.and_then(|h| h.machines.map(|m| m.0)),
        running_machines: answer.and_then(|h| h.machines.map(|m| m.1)),
    }
}

async fn engine_facts(config: &Config, serve: &ServeFacts, minimum: &str) -> EngineFacts {
    let location = locate_engine(&config.smolvm);
    let found_by = match location.found_by {
        EngineSource::Configured if !location.path.is_file() => "not found",
        EngineSource::Configured => "SMOLVM",
        EngineSource::InstalledWith => "installed with smol-mcp",
        EngineSource::Path => "PATH",
        EngineSource::Package => "smolmachines package",
        EngineSource::NotFound => "not found",
    };
    let path = (found_by != "not found").then(|| location.path.display().to_string());
    // The serve's own answer is the engine that will be used, when one runs.
    let version = match (&serve.version, &path) {
        (Some(v), _) => Some(v.clone()),
        (None, Some(_)) => engine_version(&location.path).await,
        (None, None) => None,
    };
    let version_ok = match &version {
        Some(v) => minimum.is_empty() || version_at_least(v, minimum),
        None => false,
    };
    EngineFacts {
        path,
        found_by,
        version,
        minimum: minimum.to_owned(),
        version_ok,
    }
}

/// `smolvm 1.32.2` from `<engine> --version`; `None` when it does not run or answers otherwise.
async fn engine_version(engine: &Path) -> Option<String> {
    let run = tokio::process::Command::new(engine)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(ENGINE_VERSION_TIMEOUT, run)
        .await
        .ok()?
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("smolvm ").map(str::to_owned))
}

#[cfg(target_os = "linux")]
async fn hypervisor_facts(host: &Host) -> HypervisorFacts {
    let device = &host.kvm_device;
    let present = device.exists();
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(device);
    let (usable, detail) = match (&opened, present) {
        // An open device is all a host shows without booting a guest: a paravirtual KVM opens
        // and still cannot boot one ("no boot progress" at the first start). What the host is
        // is said, and the boot left to say the rest (doctor tries one).
        (Ok(_), _) => (
            true,
            match host.virtual_host {
                Some(on) => format!(
                    "{}: {}",
                    device.display(),
                    HostCause::OnVirtualHost(on).explain().0
                ),
                None => format!(
                    "{} opens read-write (whether guests boot shows at the first start)",
                    device.display()
                ),
            },
        ),
        (Err(_), false) => (false, format!("{} does not exist", device.display())),
        (Err(e), true) => (
            false,
            format!("{} cannot be opened read-write: {e}", device.display()),
        ),
    };
    HypervisorFacts {
        kind: "KVM",
        present,
        usable,
        on_virtual_host: usable && host.virtual_host.is_some(),
        detail,
    }
}

#[cfg(target_os = "macos")]
async fn hypervisor_facts(_host: &Host) -> HypervisorFacts {
    let out = tokio::process::Command::new("sysctl")
        .args(["-n", "kern.hv_support"])
        .output()
        .await;
    let supported = out
        .as_ref()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "1");
    HypervisorFacts {
        kind: "Hypervisor.framework",
        present: supported,
        usable: supported,
        on_virtual_host: false,
        detail: if supported {
            "kern.hv_support is 1".into()
        } else {
            "kern.hv_support is not 1: this Mac cannot run guests".into()
        },
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
async fn hypervisor_facts(_host: &Host) -> HypervisorFacts {
    HypervisorFacts {
        kind: "none",
        present: false,
        usable: false,
        on_virtual_host: false,
        detail: "smolvm runs guests on Linux (KVM) and macOS (Hypervisor.framework) only".into(),
    }
}

fn hypervisor_fix(h: &HypervisorFacts) -> String {
    match (h.kind, h.present) {
        ("KVM", false) => "enable virtualization (VT-x/AMD-V) in the firmware and load kvm_intel \
                           or kvm_amd; in a virtual machine, turn on nested virtualization; \
                           otherwise use the cloud fleet"
            .into(),
        ("KVM", true) => "give this user read-write access to /dev/kvm (usually: add it to the \
                          kvm group, `sudo usermod -aG kvm $USER`, and log in again); otherwise \
                          use the cloud fleet"
            .into(),
        _ => "use the cloud fleet (set SMOL_CLOUD_TOKEN): this host cannot run guests".into(),
    }
}

async fn cloud_facts(
    config: &Config,
    cloud: Option<Result<Arc<CloudFleet>, FleetError>>,
) -> CloudFacts {
    let mut problems = Vec::new();
    let token_set = !config.cloud_token.is_empty();
    let mut account = AccountFacts {
        answering: false,
        tenant_id: None,
        status: None,
        plan: None,
        error: None,
    };
    match cloud {
        None => problems.push(Problem {
            what: "SMOL_CLOUD_TOKEN is not set".into(),
            fix: "set SMOL_CLOUD_TOKEN to a smol cloud API key (smk_...) in the server's \
                  environment"
                .into(),
        }),
        Some(Err(e)) => {
            account.error = Some(e.to_string());
            problems.push(Problem {
                what: format!("the cloud client could not be built: {e}"),
                fix: "check SMOL_CLOUD_URL".into(),
            });
        }
        Some(Ok(fleet)) => match fleet.account().await {
            Ok(a) => {
                account.answering = true;
                if a.status != "active" {
                    problems.push(Problem {
                        what: format!(
                            "the account {} is {}, not active: it cannot create machines",
                            a.tenant_id, a.status
                        ),
                        fix: "settle the account's billing with smol cloud".into(),
                    });
                }
                account.tenant_id = Some(a.tenant_id);
                account.status = Some(a.status);
                account.plan = a.plan;
            }
            Err(e) => {
                account.error = Some(e.to_string());
                problems.push(Problem {
                    what: format!("the account did not answer: {e}"),
                    fix: "check SMOL_CLOUD_TOKEN (an unknown or revoked key answers 401) and \
                          SMOL_CLOUD_URL, and that this host reaches the service"
                        .into(),
                });
            }
        },
    }
    CloudFacts {
        usable: problems.is_empty(),
        url: config.cloud_url.clone(),
        token_set,
        account,
        problems,
    }
}

/// The facts for the configured fleets, as `smol-mcp doctor` gathers them before it boots
/// anything.
pub async fn doctor_facts(config: &Config) -> Targets {
    let mode = crate::process::resolve_mode(config);
    let cloud = (!config.cloud_token.is_empty()).then(|| {
        CloudFleet::new(
            &config.cloud_url,
            config.cloud_token.expose(),
            crate::fleet::Backstop {
                ttl_secs: config.ephemeral_ttl_secs,
                auto_stop_secs: config.ephemeral_auto_stop_secs,
            },
        )
        .map(Arc::new)
    });
    gather(config, mode, cloud, &Host::this_host()).await
}

impl Targets {
    /// Adds what a real boot showed to the local fleet's facts: a failed boot makes the fleet
    /// unusable whatever the static checks said.
    pub fn with_boot(mut self, boot: BootFacts, problem: Option<Problem>) -> Targets {
        for fleet in &mut self.fleets {
            if let FleetFacts::Local(local) = fleet {
                if !boot.booted {
                    local.usable = false;
                }
                if let Some(p) = problem.clone() {
                    local.problems.push(p);
                }
                local.boot = Some(boot.clone());
            }
        }
        self.usable = self.fleets.iter().any(FleetFacts::usable);
        self
    }

    /// Adds whether this host resolves the default registry to the local fleet's facts (a
    /// warning, not a problem: machines without an image need none).
    pub fn with_registry(mut self, registry: RegistryFacts) -> Targets {
        for fleet in &mut self.fleets {
            if let FleetFacts::Local(local) = fleet {
                local.registry = Some(registry.clone());
            }
        }
        self
    }

    /// The local fleet's facts, when it is served.
    pub fn local(&self) -> Option<&LocalFacts> {
        self.fleets.iter().find_map(|f| match f {
            FleetFacts::Local(l) => Some(l.as_ref()),
            FleetFacts::Cloud(_) => None,
        })
    }
}
