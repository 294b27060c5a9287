//! Configuration: environment over file over default. The file is JSON at `$SMOL_MCP_CONFIG`, or
//! `$XDG_CONFIG_HOME/smol-mcp/config.json` (`~/.config/...` without XDG). Every setting is named
//! once, in the `settings!` table below, which gives the `Config` field, the file key, the
//! environment variable, the default, what is accepted and why; the README's table is checked
//! against it. An unknown key in the file, a value of the wrong type and an out-of-range number
//! are errors that name the key and what would be accepted.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// The most virtual CPUs a machine may have, here and in the tools.
pub const MAX_CPUS: u32 = 64;
/// The least memory a machine may have, here and in the tools.
pub const MIN_MEMORY_MB: u32 = 128;
/// The most memory a machine may have, here and in the tools.
pub const MAX_MEMORY_MB: u32 = 262_144;

const DAY: u64 = 86_400;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {message}")]
    File { path: String, message: String },
    #[error("{key} (${var}): {message}")]
    Env {
        key: &'static str,
        var: &'static str,
        message: String,
    },
    /// Values that are each acceptable but not together. Labelled as `Env` is, so that one
    /// setting reads the same whichever check refused it.
    #[error("{key} (${var}): {message}")]
    Conflict {
        key: &'static str,
        var: &'static str,
        message: String,
    },
}

pub use crate::fleet::Secret;

// The serde names are the accepted spellings, in the file and in the environment alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkDefault {
    Open,
    Blocked,
}

/// Which egress an agent may give a machine it creates: any (open, or its own allow list), or
/// only none and `ask`, so that every host a machine reaches is one the user allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentNetwork {
    Any,
    Ask,
}

/// What a session's end does to the temporary (`mcp-`) machines it made: delete them, or keep
/// them stopped or paused for `keptMachineSecs`, for a later session to take back by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionEnd {
    Delete,
    Stop,
    Pause,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetsSetting {
    Auto,
    Local,
    Cloud,
    Both,
}

/// What a setting accepts: checked on every source, shown in errors and in the README.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepts {
    Text,
    NonEmptyText,
    /// An HTTP path such as `/mcp`.
    UrlPath,
    /// A `smolvm serve` address, refused unless it is loopback or a socket (empty: none).
    LocalUrl,
    Whole {
        min: u64,
        max: u64,
    },
    OneOf(&'static [&'static str]),
    /// An array of strings in the file; comma-separated text in either.
    List,
    /// Credential bindings: a JSON list in the file and in the environment.
    Credentials,
    /// Warm pools: a JSON list in the file and in the environment.
    Pools,
    /// An IPv4 or IPv6 address.
    IpAddress,
    /// Empty, or a range of TCP ports `FIRST-LAST` (one port: `PORT`).
    PortRange,
}

impl fmt::Display for Accepts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Accepts::Text => f.write_str("a string"),
            Accepts::NonEmptyText => f.write_str("a non-empty string"),
            Accepts::UrlPath => f.write_str("a path starting with a slash, like /mcp"),
            Accepts::LocalUrl => {
                f.write_str("unix:///abs/path.sock or http://127.0.0.1:PORT (loopback only)")
            }
            Accepts::Whole { min, max } => write!(f, "a whole number from {min} to {max}"),
            Accepts::OneOf(options) => write!(f, "one of {}", options.join(", ")),
            Accepts::List => f.write_str("a list of strings (comma-separated in the environment)"),
            Accepts::Credentials => f.write_str(crate::process::credentials::ACCEPTS),
            Accepts::Pools => f.write_str(crate::process::pools::ACCEPTS),
            Accepts::IpAddress => f.write_str("an IPv4 or IPv6 address, like 127.0.0.1 or ::1"),
            Accepts::PortRange => {
                f.write_str("empty (any free port), or FIRST-LAST within 1-65535, like 20000-20099")
            }
        }
    }
}

/// One setting as the README documents it.
#[derive(Debug)]
pub struct Setting {
    /// The key in the config file.
    pub key: &'static str,
    pub env: &'static str,
    /// The default, spelled as in the environment.
    pub default: &'static str,
    /// How the README shows the default when it is computed rather than this text.
    pub shown_default: Option<&'static str>,
    pub accepts: Accepts,
    /// An empty environment value is the value (rather than "unset").
    pub empty_env_is_a_value: bool,
    /// Why this default.
    pub why: &'static str,
}

impl Setting {
    /// The setting's row in the README's configuration table.
    pub fn readme_row(&self) -> String {
        let default = match (self.shown_default, self.default) {
            (Some(shown), _) => shown.to_owned(),
            (None, "") => "(empty)".to_owned(),
            (None, text) => format!("`{text}`"),
        };
        format!(
            "| `{}` | `{}` | {default} | {} | {} |",
            self.key, self.env, self.accepts, self.why
        )
    }
}

/// Why a value was refused; `None` when "not what the setting accepts" says it all.
struct Rejected(Option<String>);

/// A type a setting can have: how it is read from text (the environment, the defaults) and from
/// the file, where it has a JSON type of its own.
trait Value: Sized {
    type File: DeserializeOwned;
    fn from_text(text: &str, accepts: Accepts) -> Result<Self, Rejected>;
    fn from_file(value: Self::File, accepts: Accepts) -> Result<Self, Rejected>;
    /// The built-in default, which a type may read apart from a value someone gave.
    fn from_default(text: &str, accepts: Accepts) -> Result<Self, Rejected> {
        Self::from_text(text, accepts)
    }
}

macro_rules! whole_numbers {
    ($($t:ty),*) => {$(
        impl Value for $t {
            type File = $t;
            fn from_text(text: &str, accepts: Accepts) -> Result<Self, Rejected> {
                let n: $t = text.trim().parse().map_err(|_| Rejected(None))?;
                Self::from_file(n, accepts)
            }
            fn from_file(value: $t, accepts: Accepts) -> Result<Self, Rejected> {
                match (accepts, u64::try_from(value)) {
                    (Accepts::Whole { min, max }, Ok(n)) if (min..=max).contains(&n) => Ok(value),
                    _ => Err(Rejected(None)),
                }
            }
        }
    )*};
}

whole_numbers!(u16, u32, u64, usize);

fn check_text(text: &str, accepts: Accepts) -> Result<(), Rejected> {
    let ok = match accepts {
        Accepts::Text => true,
        Accepts::NonEmptyText => !text.is_empty(),
        Accepts::UrlPath => text.starts_with('/'),
        Accepts::LocalUrl => {
            // The local API has no authentication: an address anyone else can reach is refused
            // here, at start-up, rather than at the first local call.
            if !text.is_empty() {
                crate::fleet::transport::LocalEndpoint::parse(text)
                    .map_err(|e| Rejected(Some(e.message)))?;
            }
            true
        }
        Accepts::Whole { .. }
        | Accepts::OneOf(_)
        | Accepts::List
        | Accepts::Credentials
        | Accepts::Pools
        | Accepts::IpAddress
        | Accepts::PortRange => false,
    };
    if ok { Ok(()) } else { Err(Rejected(None)) }
}

impl Value for String {
    type File = String;
    fn from_text(text: &str, accepts: Accepts) -> Result<Self, Rejected> {
        check_text(text, accepts)?;
        Ok(text.to_owned())
    }
    fn from_file(value: String, accepts: Accepts) -> Result<Self, Rejected> {
        check_text(&value, accepts)?;
        Ok(value)
    }
}

impl Value for Secret {
    type File = String;
    fn from_text(text: &str, accepts: Accepts) -> Result<Self, Rejected> {
        String::from_text(text, accepts).map(Secret::new)
    }
    fn from_file(value: String, accepts: Accepts) -> Result<Self, Rejected> {
        String::from_file(value, accepts).map(Secret::new)
    }
}

impl Value for PathBuf {
    type File = String;
    fn from_text(text: &str, accepts: Accepts) -> Result<Self, Rejected> {
        String::from_text(text, accepts).map(PathBuf::from)
    }
    fn from_file(value: String, accepts: Accepts) -> Result<Self, Rejected> {
        String::from_file(value, accepts).map(PathBuf::from)
    }
}

impl Value for std::net::IpAddr {
    type File = String;
    fn from_text(text: &str, _: Accepts) -> Result<Self, Rejected> {
        text.trim().parse().map_err(|_| Rejected(None))
    }
    fn from_file(value: String, accepts: Accepts) -> Result<Self, Rejected> {
        Self::from_text(&value, accepts)
    }
}

/// Host TCP ports, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub fn contains(&self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }

    /// How many ports it holds (at least one).
    pub fn count(&self) -> u32 {
        u32::from(self.last - self.first) + 1
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// Unset or empty: no range (any free port).
impl Value for Option<PortRange> {
    type File = String;
    fn from_text(text: &str, _: Accepts) -> Result<Self, Rejected> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let (first, last) = text.split_once('-').unwrap_or((text, text));
        let port = |p: &str| p.trim().parse::<u16>().ok().filter(|&p| p > 0);
        match (port(first), port(last)) {
            (Some(first), Some(last)) if first <= last => Ok(Some(PortRange { first, last })),
            (Some(_), Some(_)) => Err(Rejected(Some("the first port is after the last".into()))),
            _ => Err(Rejected(None)),
        }
    }
    fn from_file(value: String, accepts: Accepts) -> Result<Self, Rejected> {
        Self::from_text(&value, accepts)
    }
}

/// A list in the file: an array of strings, or one comma-separated string as in the environment.
#[derive(Deserialize)]
#[serde(untagged)]
enum ListFile {
    Many(Vec<String>),
    One(String),
}

fn list_items<'a>(items: impl Iterator<Item = &'a str>) -> Vec<String> {
    items
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

impl Value for Vec<String> {
    type File = ListFile;
    fn from_text(text: &str, _: Accepts) -> Result<Self, Rejected> {
        Ok(list_items(text.split(',')))
    }
    fn from_file(value: ListFile, accepts: Accepts) -> Result<Self, Rejected> {
        match value {
            ListFile::One(text) => Self::from_text(&text, accepts),
            ListFile::Many(items) => Ok(list_items(items.iter().map(String::as_str))),
        }
    }
}

/// A list whose absence is not the empty list: unset means a computed default, while an empty
/// list someone gave (`[]` in the file, an empty variable) means none.
impl Value for Option<Vec<String>> {
    type File = ListFile;
    fn from_text(text: &str, accepts: Accepts) -> Result<Self, Rejected> {
        Vec::from_text(text, accepts).map(Some)
    }
    fn from_file(value: ListFile, accepts: Accepts) -> Result<Self, Rejected> {
        Vec::from_file(value, accepts).map(Some)
    }
    fn from_default(text: &str, accepts: Accepts) -> Result<Self, Rejected> {
        if text.is_empty() {
            Ok(None)
        } else {
            Self::from_text(text, accepts)
        }
    }
}

/// Enumerations are read through their serde names, so the file and the environment accept the
/// same spellings.
macro_rules! choices {
    ($($t:ty),*) => {$(
        impl Value for $t {
            type File = $t;
            fn from_text(text: &str, _: Accepts) -> Result<Self, Rejected> {
                let text = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(text);
                <$t>::deserialize(text).map_err(|_| Rejected(None))
            }
            fn from_file(value: $t, _: Accepts) -> Result<Self, Rejected> {
                Ok(value)
            }
        }
    )*};
}

choices!(NetworkDefault, AgentNetwork, SessionEnd, TargetsSetting);

/// Settings that are JSON lists, in the file and in the environment alike (the file may hold the
/// list itself or the same JSON text as the environment).
macro_rules! json_list_settings {
    ($($t:ty => $parse:expr),* $(,)?) => {$(
        impl Value for Vec<$t> {
            type File = serde_json::Value;
            fn from_text(text: &str, accepts: Accepts) -> Result<Self, Rejected> {
                if text.trim().is_empty() {
                    return Ok(Vec::new());
                }
                let value: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| Rejected(Some(format!("not JSON: {e}"))))?;
                Self::from_file(value, accepts)
            }
            fn from_file(value: serde_json::Value, accepts: Accepts) -> Result<Self, Rejected> {
                if let serde_json::Value::String(text) = &value {
                    return Self::from_text(text, accepts);
                }
                let parse = $parse;
                parse(value).map_err(|e| Rejected(Some(e)))
            }
        }
    )*};
}

json_list_settings!(
    // The values named by `fromEnv` are taken from the environment once every setting is read
    // (`crate::process::credentials::capture_values`).
    crate::process::credentials::CredentialBinding => |value| {
        crate::process::credentials::parse(value, &BTreeMap::new())
    },
    crate::process::pools::PoolDef => crate::process::pools::parse,
);

/// Picks one setting's value: the environment, else the file, else the default.
fn pick<T: Value>(
    setting: &Setting,
    env: &BTreeMap<String, String>,
    file: Option<T::File>,
    file_doc: &FileDoc,
) -> Result<T, ConfigError> {
    let from_env = env
        .get(setting.env)
        .filter(|v| !v.is_empty() || setting.empty_env_is_a_value);
    if let Some(text) = from_env {
        return T::from_text(text, setting.accepts).map_err(|Rejected(why)| ConfigError::Env {
            key: setting.key,
            var: setting.env,
            message: why.unwrap_or_else(|| format!("must be {}, not \"{text}\"", setting.accepts)),
        });
    }
    if let Some(value) = file {
        return T::from_file(value, setting.accepts)
            .map_err(|Rejected(why)| file_doc.refused(setting, why));
    }
    T::from_default(setting.default, setting.accepts).map_err(|_| ConfigError::Env {
        key: setting.key,
        var: setting.env,
        message: format!("the built-in default \"{}\" is refused", setting.default),
    })
}

/// Generates, from one row per setting, the `Config` struct, the file's struct and `SETTINGS`.
/// The file key is the field's name in camelCase (`rename_all`); a unit test holds each row's
/// `key` to that.
macro_rules! settings {
    ($(
        $(#[$doc:meta])*
        $field:ident: $ty:ty {
            key: $key:literal,
            env: $env:literal,
            default: $default:literal,
            $(shown_default: $shown:literal,)?
            accepts: $accepts:expr,
            $(empty_env_is_a_value: $empty:literal,)?
            why: $why:literal $(,)?
        }
    ),* $(,)?) => {
        #[derive(Debug, Clone)]
        pub struct Config {
            $($(#[$doc])* pub $field: $ty,)*
        }

        /// The config file: every key optional, an unknown key refused.
        #[derive(Default, Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct FileConfig {
            $(#[serde(default)] $field: Option<<$ty as Value>::File>,)*
        }

        /// Every setting, in the README's order.
        pub const SETTINGS: &[Setting] = &[$(setting!($key, $env, $default, $($shown)?, $accepts, $($empty)?, $why),)*];

        #[cfg(test)]
        const FIELD_NAMES: &[&str] = &[$(stringify!($field)),*];

        impl Config {
            fn pick_all(
                env: &BTreeMap<String, String>,
                file: FileConfig,
                file_doc: &FileDoc,
            ) -> Result<Config, ConfigError> {
                Ok(Config {$(
                    $field: pick::<$ty>(
                        &setting!($key, $env, $default, $($shown)?, $accepts, $($empty)?, $why),
                        env,
                        file.$field,
                        file_doc,
                    )?,
                )*})
            }
        }
    };
}

macro_rules! setting {
    ($key:literal, $env:literal, $default:literal, $($shown:literal)?, $accepts:expr, $($empty:literal)?, $why:literal) => {
        Setting {
            key: $key,
            env: $env,
            default: $default,
            shown_default: or!(None; $(Some($shown))?),
            accepts: $accepts,
            empty_env_is_a_value: or!(false; $($empty)?),
            why: $why,
        }
    };
}

macro_rules! or {
    ($default:expr;) => {
        $default
    };
    ($default:expr; $value:expr) => {
        $value
    };
}

const fn whole(min: u64, max: u64) -> Accepts {
    Accepts::Whole { min, max }
}

const NETWORK: Accepts = Accepts::OneOf(&["open", "blocked"]);

settings! {
    smolvm: String {
        key: "smolvm",
        env: "SMOLVM",
        default: "smolvm",
        accepts: Accepts::NonEmptyText,
        why: "the engine's CLI, found on `PATH`",
    },
    min_smolvm: String {
        key: "minSmolvm",
        env: "SMOL_MCP_MIN_SMOLVM",
        default: "1.32.0",
        accepts: Accepts::Text,
        empty_env_is_a_value: true,
        why: "the line the request shapes were verified against: 1.14.3, for one, refuses exec's `autoStart` field, which every command sends; empty turns the check off",
    },
    local_url: String {
        key: "localUrl",
        env: "SMOL_LOCAL_URL",
        default: "",
        accepts: Accepts::LocalUrl,
        why: "use a serve already running; a non-loopback address is refused at start-up (the local API has no authentication)",
    },
    runtime_dir: PathBuf {
        key: "runtimeDir",
        env: "SMOL_MCP_RUNTIME_DIR",
        default: "",
        shown_default: "`$XDG_RUNTIME_DIR/smol-mcp`, else `/tmp/smol-mcp-<uid>`",
        accepts: Accepts::Text,
        why: "private to the user; holds the socket, the serve log, the ephemeral record and the run ledger",
    },
    machine_prefix: String {
        key: "machinePrefix",
        env: "SMOL_MCP_MACHINE_PREFIX",
        default: "mcp-",
        accepts: Accepts::NonEmptyText,
        why: "names that mark ephemeral machines (an empty prefix would mark every machine)",
    },
    memory_mb: u32 {
        key: "memoryMb",
        env: "SMOL_MCP_MEMORY_MB",
        default: "2048",
        accepts: whole(MIN_MEMORY_MB as u64, MAX_MEMORY_MB as u64),
        why: "enough for a language runtime and a build",
    },
    cpus: u32 {
        key: "cpus",
        env: "SMOL_MCP_CPUS",
        default: "2",
        accepts: whole(1, MAX_CPUS as u64),
        why: "one for the workload, one for the agent's commands",
    },
    network_default: NetworkDefault {
        key: "networkDefault",
        env: "SMOL_MCP_NETWORK_DEFAULT",
        default: "blocked",
        accepts: NETWORK,
        why: "no egress unless asked for",
    },
    run_once_network: NetworkDefault {
        key: "runOnceNetwork",
        env: "SMOL_MCP_RUN_ONCE_NETWORK",
        default: "blocked",
        accepts: NETWORK,
        why: "the same for run-once",
    },
    agent_network: AgentNetwork {
        key: "agentNetwork",
        env: "SMOL_MCP_AGENT_NETWORK",
        default: "any",
        accepts: Accepts::OneOf(&["any", "ask"]),
        why: "ask: the agent may create machines only without egress or with network \"ask\", so only the user widens it (a credential named at create still opens its binding's hosts)",
    },
    ephemeral_ttl_secs: u64 {
        key: "ephemeralTtlSecs",
        env: "SMOL_MCP_EPHEMERAL_TTL_SECS",
        default: "3600",
        accepts: whole(1, 365 * DAY),
        why: "cloud backstop: an orphan costs at most an hour",
    },
    ephemeral_auto_stop_secs: u64 {
        key: "ephemeralAutoStopSecs",
        env: "SMOL_MCP_EPHEMERAL_AUTO_STOP_SECS",
        default: "900",
        accepts: whole(1, 365 * DAY),
        why: "cloud backstop: an idle orphan stops after 15 minutes",
    },
    exec_timeout_secs: u64 {
        key: "execTimeoutSecs",
        env: "SMOL_MCP_EXEC_TIMEOUT_SECS",
        default: "120",
        accepts: whole(1, 7 * DAY),
        why: "long enough for a build step, short enough to notice a hang",
    },
    max_exec_timeout_secs: u64 {
        key: "maxExecTimeoutSecs",
        env: "SMOL_MCP_MAX_EXEC_TIMEOUT_SECS",
        default: "900",
        accepts: whole(1, 7 * DAY),
        why: "the ceiling a call may ask for (at least `execTimeoutSecs`)",
    },
    task_after_millis: u64 {
        key: "taskAfterMillis",
        env: "SMOL_MCP_TASK_AFTER_MILLIS",
        default: "1000",
        accepts: whole(0, 3_600_000),
        why: "a run-command or run-once from a client that declared the tasks extension answers as usual when it ends within this, else becomes a task the client polls; 0 makes every such call a task",
    },
    max_job_secs: u64 {
        key: "maxJobSecs",
        env: "SMOL_MCP_MAX_JOB_SECS",
        default: "3600",
        accepts: whole(1, 7 * DAY),
        why: "a background job's timeoutSecs when it gives none, and the most it may ask for: a long build or test suite, not a service",
    },
    max_running_jobs: usize {
        key: "maxRunningJobs",
        env: "SMOL_MCP_MAX_RUNNING_JOBS",
        default: "16",
        accepts: whole(1, 1024),
        why: "each running job is watched by one exec a poll; a runaway agent cannot start more",
    },
    max_machines_per_session: usize {
        key: "maxMachinesPerSession",
        env: "SMOL_MCP_MAX_MACHINES_PER_SESSION",
        default: "20",
        accepts: whole(0, 10_000),
        why: "machines one session's calls made that still exist (create-machine, run-once, branch-machine); one more is refused before anything is sent. 0: no limit",
    },
    max_machines_per_user: usize {
        key: "maxMachinesPerUser",
        env: "SMOL_MCP_MAX_MACHINES_PER_USER",
        default: "0",
        accepts: whole(0, 100_000),
        why: "with sign-in (authIssuer), the machines one user holds on a fleet, counted across every process sharing the store; one more is refused before anything is sent. 0: no limit",
    },
    max_machines: usize {
        key: "maxMachines",
        env: "SMOL_MCP_MAX_MACHINES",
        default: "0",
        accepts: whole(0, 100_000),
        why: "machines the fleet holds in all, whoever made them; a create that would pass it is refused before anything is sent. 0: no limit",
    },
    cloud_spend_per_session_micros: u64 {
        key: "cloudSpendPerSessionMicros",
        env: "SMOL_MCP_CLOUD_SPEND_PER_SESSION_MICROS",
        default: "0",
        accepts: whole(0, 1_000_000_000_000),
        why: "what the cloud machines a session made may cost (millionths of a dollar, as the cloud's usage reports it) before its next create or command there is refused. 0: no ceiling",
    },
    cloud_spend_per_user_micros: u64 {
        key: "cloudSpendPerUserMicros",
        env: "SMOL_MCP_CLOUD_SPEND_PER_USER_MICROS",
        default: "0",
        accepts: whole(0, 1_000_000_000_000),
        why: "with sign-in, what one user's cloud machines may cost in a UTC day (those that exist, since made; those deleted that day) before their next create or command there is refused. 0: no ceiling",
    },
    cloud_spend_per_day_micros: u64 {
        key: "cloudSpendPerDayMicros",
        env: "SMOL_MCP_CLOUD_SPEND_PER_DAY_MICROS",
        default: "0",
        accepts: whole(0, 1_000_000_000_000),
        why: "what the cloud account may spend in a UTC day (its period cost's growth since the day's first reading) before a create or command there is refused. 0: no ceiling",
    },
    max_tasks: usize {
        key: "maxTasks",
        env: "SMOL_MCP_MAX_TASKS",
        default: "64",
        accepts: whole(1, 4096),
        why: "calls carried on as MCP tasks at once, in the process; each holds a command in a machine, and one more is refused (RATE_LIMITED) rather than queued",
    },
    user_share_percent: u64 {
        key: "userSharePercent",
        env: "SMOL_MCP_USER_SHARE_PERCENT",
        default: "50",
        accepts: whole(1, 100),
        why: "with sign-in, the part of each process-wide bound (maxTasks, maxRunningJobs, httpMaxSessions) one signed-in user may hold, at least one: one more of theirs is refused naming this key, so that no user can use a bound up for all",
    },
    max_parked_reads: usize {
        key: "maxParkedReads",
        env: "SMOL_MCP_MAX_PARKED_READS",
        default: "4",
        accepts: whole(1, 256),
        why: "read-file downloads kept open between pages, each an open engine request; past it the oldest is closed and its next page read anew",
    },
    job_poll_millis: u64 {
        key: "jobPollMillis",
        env: "SMOL_MCP_JOB_POLL_MILLIS",
        default: "1000",
        accepts: whole(50, 60_000),
        why: "how often a running job's files are looked at: how soon its end is seen",
    },
    max_output_bytes: usize {
        key: "maxOutputBytes",
        env: "SMOL_MCP_MAX_OUTPUT_BYTES",
        default: "65536",
        accepts: whole(1, 64 * 1024 * 1024),
        why: "per stream and per page: what fits a model's context",
    },
    max_image_bytes: usize {
        key: "maxImageBytes",
        env: "SMOL_MCP_MAX_IMAGE_BYTES",
        default: "1048576",
        accepts: whole(1, 16 * 1024 * 1024),
        why: "the largest image read-file sends as an image the model sees (held whole, sent as base64, a third larger): a full-HD screenshot as PNG fits; a larger one is refused with its size, or read as bytes with encoding",
    },
    publish_address: std::net::IpAddr {
        key: "publishAddress",
        env: "SMOL_MCP_PUBLISH_ADDRESS",
        default: "127.0.0.1",
        accepts: Accepts::IpAddress,
        why: "where the local engine binds the ports publish-port opens, and the host its URLs name: loopback keeps a service to this host's user; another address (0.0.0.0: every one) is the operator's choice, never an agent's. Given to a serve this server starts (SMOLVM_PUBLISH_ADDR); a serve at localUrl must be started with the same",
    },
    publish_ports: Option<PortRange> {
        key: "publishPorts",
        env: "SMOL_MCP_PUBLISH_PORTS",
        default: "61000-65535",
        accepts: Accepts::PortRange,
        why: "the host ports publish-port may use on the local engine, chosen or asked for (a firewall's opening, say); a port outside it is refused. The default lies above Linux's ephemeral ports (32768-60999), so that no agent can take a port a service of the host's own would listen on; empty allows any port",
    },
    ready_timeout_secs: u64 {
        key: "readyTimeoutSecs",
        env: "SMOL_MCP_READY_TIMEOUT_SECS",
        default: "120",
        accepts: whole(1, DAY),
        why: "a cold image pull and boot",
    },
    serve_start_timeout_secs: u64 {
        key: "serveStartTimeoutSecs",
        env: "SMOL_MCP_SERVE_START_TIMEOUT_SECS",
        default: "60",
        accepts: whole(1, DAY),
        why: "first start of the engine",
    },
    logs_tail: usize {
        key: "logsTail",
        env: "SMOL_MCP_LOGS_TAIL",
        default: "100",
        accepts: whole(1, 1_000_000),
        why: "machine-logs' default page",
    },
    max_subscriptions_per_session: usize {
        key: "maxSubscriptionsPerSession",
        env: "SMOL_MCP_MAX_SUBSCRIPTIONS_PER_SESSION",
        default: "32",
        accepts: whole(1, 100_000),
        why: "logs one session may follow at once (resources/subscribe); one more is refused naming this key: each followed machine costs the engine a request a second",
    },
    max_subscriptions: usize {
        key: "maxSubscriptions",
        env: "SMOL_MCP_MAX_SUBSCRIPTIONS",
        default: "128",
        accepts: whole(1, 100_000),
        why: "log subscriptions of every session and listen of the process together; one more is refused naming this key",
    },
    max_listen_uris: usize {
        key: "maxListenUris",
        env: "SMOL_MCP_MAX_LISTEN_URIS",
        default: "32",
        accepts: whole(1, 100_000),
        why: "logs URIs one subscriptions/listen may name; a listen naming more is refused naming this key",
    },
    stdio_max_pending_requests: usize {
        key: "stdioMaxPendingRequests",
        env: "SMOL_MCP_STDIO_MAX_PENDING_REQUESTS",
        default: "64",
        accepts: whole(1, 65_536),
        why: "requests the stdio server takes on before their answers are written; past it stdin is not read until the client reads answers, so a client that never reads cannot grow the server's memory",
    },
    ledger_max_runs: u64 {
        key: "ledgerMaxRuns",
        env: "SMOL_MCP_LEDGER_MAX_RUNS",
        default: "2000",
        accepts: whole(0, 10_000_000),
        why: "the run ledger keeps the newest this many runs (each at most about 8 KiB of output), pruned when a process first uses it and after every 256 records; 0 keeps no runs (jobs, tasks, keys and spend marks are kept all the same)",
    },
    ledger_max_days: u64 {
        key: "ledgerMaxDays",
        env: "SMOL_MCP_LEDGER_MAX_DAYS",
        default: "30",
        accepts: whole(1, 36_500),
        why: "runs older than this many days leave the run ledger when a process first uses it and after every 256 records",
    },
    store_url: Secret {
        key: "storeUrl",
        env: "SMOL_MCP_STORE_URL",
        default: "",
        shown_default: "the SQLite file `runs.sqlite` in the runtime directory",
        accepts: Accepts::Text,
        why: "a PostgreSQL database (`postgres://user:password@host/db`, or `host=/run/postgresql dbname=smol`) shared by every server process given it: runs, jobs, tasks, keys, spend marks and egress grants, so that processes behind one load balancer answer as one. Reached and migrated at start-up; a schema newer than this server is refused. No TLS built in: a Unix socket, loopback or a tunnel. Never logged",
    },
    /// Secrets an agent may name for a machine and never sees.
    credentials: Vec<crate::process::credentials::CredentialBinding> {
        key: "credentials",
        env: "SMOL_MCP_CREDENTIALS",
        default: "",
        shown_default: "none",
        accepts: Accepts::Credentials,
        why: "secrets an agent names at create (credentials, offered only when some are set) and never sees: the machine gets a placeholder in env, the local engine puts the value into HTTPS requests to hosts only",
    },
    /// Machines the local engine keeps booted for matching creates.
    pools: Vec<crate::process::pools::PoolDef> {
        key: "pools",
        env: "SMOL_MCP_POOLS",
        default: "",
        shown_default: "none",
        accepts: Accepts::Pools,
        why: "local machines kept booted (the engine's clones of one source) for an unnamed create-machine or a run-once of a pool's shape: ready in about a second instead of a boot; set up at the first local call, removed (a source the server made with them) at the process's end",
    },
    cloud_url: String {
        key: "cloudUrl",
        env: "SMOL_CLOUD_URL",
        default: "https://api.smolmachines.com",
        accepts: Accepts::NonEmptyText,
        why: "the service",
    },
    cloud_token: Secret {
        key: "cloudToken",
        env: "SMOL_CLOUD_TOKEN",
        default: "",
        accepts: Accepts::Text,
        why: "no cloud unless configured; never logged",
    },
    targets: TargetsSetting {
        key: "targets",
        env: "SMOL_MCP_TARGETS",
        default: "auto",
        accepts: Accepts::OneOf(&["auto", "local", "cloud", "both"]),
        why: "`both` with a token, else `local`; `cloud` and `both` without a token are refused at start-up",
    },
    http_host: String {
        key: "httpHost",
        env: "SMOL_MCP_HTTP_HOST",
        default: "127.0.0.1",
        accepts: Accepts::NonEmptyText,
        why: "the HTTP transport listens on loopback unless told otherwise (`--host` overrides)",
    },
    http_port: u16 {
        key: "httpPort",
        env: "SMOL_MCP_HTTP_PORT",
        default: "8080",
        accepts: whole(1, 65_535),
        why: "the HTTP transport's port (`--port` overrides)",
    },
    http_path: String {
        key: "httpPath",
        env: "SMOL_MCP_HTTP_PATH",
        default: "/mcp",
        accepts: Accepts::UrlPath,
        why: "the MCP endpoint's path (`--path` overrides)",
    },
    http_session_idle_secs: u64 {
        key: "httpSessionIdleSecs",
        env: "SMOL_MCP_HTTP_SESSION_IDLE_SECS",
        default: "1800",
        accepts: whole(1, 30 * DAY),
        why: "an HTTP session with no request in flight and none arriving for this long is closed and its ephemeral machines deleted; a call, however long, is never cut by it",
    },
    machine_lease_secs: u64 {
        key: "machineLeaseSecs",
        env: "SMOL_MCP_MACHINE_LEASE_SECS",
        default: "1800",
        accepts: whole(1, 30 * DAY),
        why: "an ephemeral machine made by a 2026-07-28 (sessionless) HTTP request belongs to the server: deleted once no tool call has named it for this long, never during a call",
    },
    session_end: SessionEnd {
        key: "sessionEnd",
        env: "SMOL_MCP_SESSION_END",
        default: "delete",
        accepts: Accepts::OneOf(&["delete", "stop", "pause"]),
        why: "what a session's end does to its temporary machines; stop and pause keep them (pause falls back to stop where the engine cannot pause) for a later session to take back by name",
    },
    kept_machine_secs: u64 {
        key: "keptMachineSecs",
        env: "SMOL_MCP_KEPT_MACHINE_SECS",
        default: "86400",
        accepts: whole(1, 30 * DAY),
        why: "a kept machine nobody took back is deleted this long after its session ended, by whichever server process runs then (on cloud `ephemeralTtlSecs` may end it sooner)",
    },
    park_idle_secs: u64 {
        key: "parkIdleSecs",
        env: "SMOL_MCP_PARK_IDLE_SECS",
        default: "0",
        accepts: whole(0, 30 * DAY),
        why: "a temporary machine of this process that no call has named for this long and that runs nothing (no job, no open terminal, no call) is paused, or stopped where it cannot be, freeing its host memory; the next call resumes or starts it and says so (startedMachine). 0: never",
    },
    base_idle_secs: u64 {
        key: "baseIdleSecs",
        env: "SMOL_MCP_BASE_IDLE_SECS",
        default: "604800",
        accepts: whole(0, 365 * DAY),
        why: "a base (branch-machine freezeSource) no branch was made of for this long is deleted, by whichever server process runs then, once no child depends on it. 0: kept until deleted",
    },
    max_bases_per_user: usize {
        key: "maxBasesPerUser",
        env: "SMOL_MCP_MAX_BASES_PER_USER",
        default: "4",
        accepts: whole(0, 1000),
        why: "bases one user (the operator, without sign-in) keeps; a freeze past it is refused before anything is sent. Each holds its memory on the host until deleted",
    },
    max_bases: usize {
        key: "maxBases",
        env: "SMOL_MCP_MAX_BASES",
        default: "16",
        accepts: whole(0, 10_000),
        why: "bases of all users together, counted across every process sharing the machine record",
    },
    mount_allow: Vec<String> {
        key: "mountAllow",
        env: "SMOL_MCP_MOUNT_ALLOW",
        default: "",
        accepts: Accepts::List,
        why: "host directories a local machine may mount, and any machine may get a copy of as its workspace (a source must be one of them or under one, symlinks resolved); empty refuses every mount and workspace, and the tools then offer none: a machine that mounts the host's home has left the sandbox. With sign-in, an entry naming {user} (like /srv/work/{user}) is each signed-in user's own, with their id in its place, and the entries without it are the operator's alone",
    },
    mount_writable: Vec<String> {
        key: "mountWritable",
        env: "SMOL_MCP_MOUNT_WRITABLE",
        default: "",
        accepts: Accepts::List,
        why: "of those, the directories a mount may write to (`readonly: false`); every other mount is read-only. {user} as in mountAllow",
    },
    workspace_max_bytes: u64 {
        key: "workspaceMaxBytes",
        env: "SMOL_MCP_WORKSPACE_MAX_BYTES",
        default: "268435456",
        accepts: whole(1, 4 * 1024 * 1024 * 1024),
        why: "the largest workspace (create-machine `workspace`): the files copied in, and the machine's `/workspace` read back for read-file `changes` and keep-changes (build outputs there count)",
    },
    workspace_total_max_bytes: u64 {
        key: "workspaceTotalMaxBytes",
        env: "SMOL_MCP_WORKSPACE_TOTAL_MAX_BYTES",
        default: "4294967296",
        accepts: whole(1, 1024 * 1024 * 1024 * 1024),
        why: "the most the server's copies of all workspaces take on disk together (each machine's files as given and as last read back, diffs, kept patches); a create with a workspace, a reading or a keep that would pass it is refused before writing",
    },
    workspace_dir: PathBuf {
        key: "workspaceDir",
        env: "SMOL_MCP_WORKSPACE_DIR",
        default: "",
        shown_default: "`$XDG_STATE_HOME/smol-mcp/workspaces`, else `~/.local/state/smol-mcp/workspaces`",
        accepts: Accepts::Text,
        why: "the server's copies of workspaces (what each machine got, what it changed) and the patches of kept ones: on disk, not in the runtime directory's memory",
    },
    http_allowed_hosts: Vec<String> {
        key: "httpAllowedHosts",
        env: "SMOL_MCP_HTTP_ALLOWED_HOSTS",
        default: "",
        accepts: Accepts::List,
        why: "`Host` names accepted; empty on a loopback listener means the loopback names",
    },
    http_allowed_origins: Option<Vec<String>> {
        key: "httpAllowedOrigins",
        env: "SMOL_MCP_HTTP_ALLOWED_ORIGINS",
        default: "",
        shown_default: "the listener's own loopback origins (`http://127.0.0.1:PORT`, `http://localhost:PORT`, `http://[::1]:PORT`) on a loopback listener, else none",
        accepts: Accepts::List,
        empty_env_is_a_value: true,
        why: "a request that carries an `Origin` not listed gets 403 (DNS rebinding, a web page driving the server); a request without one is let through; an empty list allows none",
    },
    http_max_connections: usize {
        key: "httpMaxConnections",
        env: "SMOL_MCP_HTTP_MAX_CONNECTIONS",
        default: "512",
        accepts: whole(1, 65_536),
        why: "connections open at once; one more is answered 503 with `Retry-After` and closed, so idle sockets cannot use up the process's file descriptors (1024 by default)",
    },
    http_header_timeout_secs: u64 {
        key: "httpHeaderTimeoutSecs",
        env: "SMOL_MCP_HTTP_HEADER_TIMEOUT_SECS",
        default: "10",
        accepts: whole(1, 3_600),
        why: "a request's headers must arrive within this, and a keep-alive connection idle this long between requests is closed: a half-sent request holds nothing for long",
    },
    http_body_timeout_secs: u64 {
        key: "httpBodyTimeoutSecs",
        env: "SMOL_MCP_HTTP_BODY_TIMEOUT_SECS",
        default: "30",
        accepts: whole(1, 3_600),
        why: "a request's body must arrive whole within this once its headers have: one that does not is answered 408 and its connection closed (4 MiB, rmcp's largest body, takes under a second even at 100 Mbit/s)",
    },
    http_max_sessions: usize {
        key: "httpMaxSessions",
        env: "SMOL_MCP_HTTP_MAX_SESSIONS",
        default: "256",
        accepts: whole(1, 65_536),
        why: "HTTP sessions open at once; one more `initialize` is answered 503 with `Retry-After`, so a client that opens sessions and never ends them cannot grow the process without bound (each open session holds about 100 KiB)",
    },
    auth_token: Secret {
        key: "authToken",
        env: "SMOL_MCP_AUTH_TOKEN",
        default: "",
        accepts: Accepts::Text,
        why: "the HTTP transport's bearer token, for a server one person uses; without authIssuer it refuses to start without one; never logged",
    },
    auth_issuer: String {
        key: "authIssuer",
        env: "SMOL_MCP_AUTH_ISSUER",
        default: "",
        accepts: Accepts::Text,
        why: "an OAuth 2.1 authorization server (an OpenID provider) whose access tokens sign users in over HTTP, each user then keeping to their own machines and records; its keys come from its metadata (RFC 8414 or OpenID discovery) and are cached. https, or http on loopback",
    },
    auth_resource: String {
        key: "authResource",
        env: "SMOL_MCP_AUTH_RESOURCE",
        default: "",
        shown_default: "`http://httpHost:httpPort` and httpPath",
        accepts: Accepts::Text,
        why: "this server's URL as clients dial it (behind a balancer, the balancer's): the audience an access token must name (RFC 8707) and the `resource` of the protected resource metadata; required with sign-in off loopback",
    },
    auth_scopes: Vec<String> {
        key: "authScopes",
        env: "SMOL_MCP_AUTH_SCOPES",
        default: "",
        accepts: Accepts::List,
        why: "scopes every access token must carry (403 `insufficient_scope` otherwise), listed in the metadata as the ones to ask for",
    },
    auth_user_claim: String {
        key: "authUserClaim",
        env: "SMOL_MCP_AUTH_USER_CLAIM",
        default: "sub",
        accepts: Accepts::NonEmptyText,
        why: "the access token's claim that names a user: `sub`, each person their own, or a tenant claim the issuer adds (`org_id`, say) for a team that shares its machines",
    },
    auth_jwks_url: String {
        key: "authJwksUrl",
        env: "SMOL_MCP_AUTH_JWKS_URL",
        default: "",
        shown_default: "the issuer's `jwks_uri`",
        accepts: Accepts::Text,
        why: "where the issuer's signing keys are, for an issuer whose metadata cannot be read",
    },
}

/// The parsed config file, kept whole so that an error can quote what the file said.
#[derive(Default)]
struct FileDoc {
    path: String,
    raw: serde_json::Map<String, serde_json::Value>,
}

impl FileDoc {
    fn error(&self, message: String) -> ConfigError {
        ConfigError::File {
            path: self.path.clone(),
            message,
        }
    }

    fn refused(&self, setting: &Setting, why: Option<String>) -> ConfigError {
        let key = setting.key;
        self.error(match why {
            Some(why) => format!("\"{key}\": {why}"),
            None => {
                let given = self.raw.get(key).map(|v| v.to_string()).unwrap_or_default();
                format!("\"{key}\" must be {}, not {given}", setting.accepts)
            }
        })
    }

    /// Reads the file; `None` when it is absent and absence is allowed.
    fn read(path: &Path, must_exist: bool) -> Result<Option<(FileDoc, FileConfig)>, ConfigError> {
        let mut doc = FileDoc {
            path: path.display().to_string(),
            raw: serde_json::Map::new(),
        };
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(doc.error(
                    "no such file (SMOL_MCP_CONFIG names it; unset it to use the default location)"
                        .into(),
                ));
            }
            Err(e) => return Err(doc.error(e.to_string())),
        };
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| doc.error(format!("not JSON: {e}")))?;
        let serde_json::Value::Object(raw) = value else {
            return Err(doc.error("must be a JSON object of settings".into()));
        };
        if let Some(unknown) = raw.keys().find(|k| !SETTINGS.iter().any(|s| s.key == *k)) {
            let known: Vec<&str> = SETTINGS.iter().map(|s| s.key).collect();
            return Err(doc.error(format!(
                "unknown key \"{unknown}\" (known keys: {})",
                known.join(", ")
            )));
        }
        doc.raw = raw;
        let file = serde_path_to_error::deserialize(serde_json::Value::Object(doc.raw.clone()))
            .map_err(|e| {
                let key = match e.path().iter().next() {
                    Some(serde_path_to_error::Segment::Map { key }) => key.clone(),
                    _ => String::new(),
                };
                match SETTINGS.iter().find(|s| s.key == key) {
                    Some(setting) => doc.refused(setting, None),
                    None => doc.error(e.into_inner().to_string()),
                }
            })?;
        Ok(Some((doc, file)))
    }
}

/// The path of the config file, whether or not it exists.
pub fn config_path(env: &BTreeMap<String, String>) -> PathBuf {
    if let Some(p) = env.get("SMOL_MCP_CONFIG").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let base = match env.get("XDG_CONFIG_HOME").filter(|p| !p.is_empty()) {
        Some(xdg) => PathBuf::from(xdg),
        None => PathBuf::from(env.get("HOME").cloned().unwrap_or_default()).join(".config"),
    };
    base.join("smol-mcp").join("config.json")
}

impl Config {
    /// Loads from the process environment and the config file it points at.
    pub fn load() -> Result<Config, ConfigError> {
        let env: BTreeMap<String, String> = std::env::vars().collect();
        Config::from_sources(&env, &config_path(&env))
    }

    /// `file` may be absent unless `SMOL_MCP_CONFIG` names it: a file asked for by name and
    /// not found is a typo, not a wish for the defaults.
    pub fn from_sources(
        env: &BTreeMap<String, String>,
        file: &Path,
    ) -> Result<Config, ConfigError> {
        let named = env
            .get("SMOL_MCP_CONFIG")
            .is_some_and(|p| !p.is_empty() && Path::new(p) == file);
        let (doc, file) = FileDoc::read(file, named)?.unwrap_or_default();
        let mut config = Config::pick_all(env, file, &doc)?;
        crate::process::credentials::capture_values(&mut config.credentials, env);
        if config.runtime_dir.as_os_str().is_empty() {
            config.runtime_dir = default_runtime_dir(env);
        }
        if config.workspace_dir.as_os_str().is_empty() {
            config.workspace_dir = default_workspace_dir(env, &config.runtime_dir);
        }
        config.check()?;
        Ok(config)
    }

    /// What no single value can say wrong.
    fn check(&self) -> Result<(), ConfigError> {
        if self.exec_timeout_secs > self.max_exec_timeout_secs {
            return Err(ConfigError::Conflict {
                key: "execTimeoutSecs",
                var: "SMOL_MCP_EXEC_TIMEOUT_SECS",
                message: format!(
                    "the default ({} s) is above the ceiling maxExecTimeoutSecs ({} s)",
                    self.exec_timeout_secs, self.max_exec_timeout_secs
                ),
            });
        }
        // Under agentNetwork "ask" a machine the agent creates without naming a network would
        // otherwise be open by the operator's default: the two settings contradict each other.
        if self.agent_network == AgentNetwork::Ask {
            for (key, var, value) in [
                (
                    "networkDefault",
                    "SMOL_MCP_NETWORK_DEFAULT",
                    self.network_default,
                ),
                (
                    "runOnceNetwork",
                    "SMOL_MCP_RUN_ONCE_NETWORK",
                    self.run_once_network,
                ),
            ] {
                if value == NetworkDefault::Open {
                    return Err(ConfigError::Conflict {
                        key,
                        var,
                        message: "is open, but agentNetwork is ask (only the user widens \
                                  egress): set it to blocked, or agentNetwork to any"
                            .to_owned(),
                    });
                }
            }
        }
        // Without a token every call to the cloud would fail; say so once, before serving.
        if matches!(self.targets, TargetsSetting::Cloud | TargetsSetting::Both)
            && self.cloud_token.is_empty()
        {
            let targets = if self.targets == TargetsSetting::Cloud {
                "cloud"
            } else {
                "both"
            };
            return Err(ConfigError::Conflict {
                key: "targets",
                var: "SMOL_MCP_TARGETS",
                message: format!(
                    "\"{targets}\" needs the cloud token: set SMOL_CLOUD_TOKEN (or cloudToken in \
                     the config file), or use local"
                ),
            });
        }
        Ok(())
    }
}

/// `$XDG_RUNTIME_DIR/smol-mcp`, else a per-user directory under /tmp (a shared `/tmp/smol-mcp`
/// would be refused for every user but its first owner).
fn default_runtime_dir(env: &BTreeMap<String, String>) -> PathBuf {
    match env.get("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("smol-mcp"),
        None => std::env::temp_dir().join(format!("smol-mcp-{}", nix::unistd::getuid())),
    }
}

/// `$XDG_STATE_HOME/smol-mcp/workspaces`, else under `$HOME/.local/state`, else (no home) the
/// runtime directory's.
fn default_workspace_dir(env: &BTreeMap<String, String>, runtime_dir: &Path) -> PathBuf {
    let state = env
        .get("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            env.get("HOME")
                .filter(|d| !d.is_empty())
                .map(|home| Path::new(home).join(".local/state"))
        });
    match state {
        Some(dir) => dir.join("smol-mcp/workspaces"),
        None => runtime_dir.join("workspaces"),
    }
}

/// Environment variables as the settings read them, from pairs: for the tests of the modules
/// that read settings.
#[cfg(test)]
pub(crate) fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    fn error(env_pairs: &[(&str, &str)], file: &Path) -> String {
        Config::from_sources(&env(env_pairs), file)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn defaults() {
        let c = Config::from_sources(
            &env(&[("XDG_RUNTIME_DIR", "/run/user/7")]),
            Path::new("/nonexistent"),
        )
        .unwrap();
        assert_eq!(c.memory_mb, 2048);
        assert_eq!(c.cpus, 2);
        assert_eq!(c.exec_timeout_secs, 120);
        assert_eq!(c.max_output_bytes, 65536);
        assert_eq!(c.machine_prefix, "mcp-");
        assert_eq!(c.network_default, NetworkDefault::Blocked);
        assert_eq!(c.run_once_network, NetworkDefault::Blocked);
        assert_eq!(c.targets, TargetsSetting::Auto);
        assert_eq!(c.runtime_dir, PathBuf::from("/run/user/7/smol-mcp"));
        assert_eq!(c.min_smolvm, "1.32.0");
        assert_eq!(c.http_port, 8080);
        assert!(c.http_allowed_hosts.is_empty());
        assert_eq!(c.http_allowed_origins, None, "unset: the computed default");
        assert_eq!(c.http_max_connections, 512);
        assert_eq!(c.http_header_timeout_secs, 10);
        assert_eq!(c.http_body_timeout_secs, 30);
        assert_eq!(c.http_max_sessions, 256);
        assert!(c.cloud_token.is_empty());
    }

    #[test]
    fn an_empty_origin_list_is_a_value() {
        let c = Config::from_sources(
            &env(&[("SMOL_MCP_HTTP_ALLOWED_ORIGINS", "")]),
            Path::new("/nonexistent"),
        )
        .unwrap();
        assert_eq!(c.http_allowed_origins, Some(vec![]));
        let (_d, path) = with_file(r#"{"httpAllowedOrigins": []}"#);
        let c = Config::from_sources(&env(&[]), &path).unwrap();
        assert_eq!(c.http_allowed_origins, Some(vec![]));
    }

    #[test]
    fn env_beats_file_beats_default() {
        let (_d, path) = with_file(
            r#"{"cpus": 4, "memoryMb": 1024, "networkDefault": "open",
                "httpAllowedHosts": ["a.example", " b.example "], "httpAllowedOrigins": "x, y"}"#,
        );
        let c = Config::from_sources(
            &env(&[("SMOL_MCP_CPUS", "8"), ("SMOL_MCP_MEMORY_MB", "")]),
            &path,
        )
        .unwrap();
        assert_eq!(c.cpus, 8, "env wins");
        assert_eq!(
            c.memory_mb, 1024,
            "an empty env value is unset, so the file wins"
        );
        assert_eq!(c.network_default, NetworkDefault::Open);
        assert_eq!(c.exec_timeout_secs, 120);
        assert_eq!(c.http_allowed_hosts, ["a.example", "b.example"]);
        assert_eq!(c.http_allowed_origins, Some(vec!["x".into(), "y".into()]));
    }

    #[test]
    fn an_empty_minimum_version_from_the_environment_turns_the_check_off() {
        let c = Config::from_sources(
            &env(&[("SMOL_MCP_MIN_SMOLVM", "")]),
            Path::new("/nonexistent"),
        )
        .unwrap();
        assert_eq!(c.min_smolvm, "");
    }

    #[test]
    fn errors_name_the_key_and_what_is_accepted() {
        let (_d, path) = with_file(r#"{"cpu": 4}"#);
        let e = error(&[], &path);
        assert!(
            e.contains("unknown key \"cpu\"") && e.contains("cpus"),
            "{e}"
        );

        let e = error(&[("SMOL_MCP_CPUS", "lots")], Path::new("/x"));
        assert_eq!(
            e,
            "cpus ($SMOL_MCP_CPUS): must be a whole number from 1 to 64, not \"lots\""
        );

        let (_d, path) = with_file(r#"{"networkDefault": "off"}"#);
        let e = error(&[], &path);
        assert!(e.contains("one of open, blocked"), "{e}");

        let (_d, path) = with_file("not json");
        assert!(error(&[], &path).contains("not JSON"));

        let (_d, path) = with_file("[1]");
        assert!(error(&[], &path).contains("a JSON object"));

        let e = error(&[("SMOL_MCP_EXEC_TIMEOUT_SECS", "1000")], Path::new("/x"));
        assert!(e.contains("ceiling"), "{e}");

        // An empty prefix would make every machine ephemeral.
        let (_d, path) = with_file(r#"{"machinePrefix": ""}"#);
        let e = error(&[], &path);
        assert!(
            e.contains("\"machinePrefix\" must be a non-empty string"),
            "{e}"
        );
    }

    #[test]
    fn a_number_given_as_a_string_in_the_file_is_refused() {
        let (_d, path) = with_file(r#"{"cpus": "4"}"#);
        assert_eq!(
            error(&[], &path),
            format!(
                "config file {}: \"cpus\" must be a whole number from 1 to 64, not \"4\"",
                path.display()
            )
        );
        let (_d, path) = with_file(r#"{"machinePrefix": 7}"#);
        let e = error(&[], &path);
        assert!(
            e.contains("\"machinePrefix\" must be a non-empty string, not 7"),
            "{e}"
        );
        let (_d, path) = with_file(r#"{"memoryMb": 4294967296}"#);
        let e = error(&[], &path);
        assert!(e.contains("from 128 to 262144, not 4294967296"), "{e}");
        let (_d, path) = with_file(r#"{"httpAllowedHosts": [1]}"#);
        assert!(error(&[], &path).contains("\"httpAllowedHosts\" must be a list"));
    }

    #[test]
    fn a_config_file_named_by_smol_mcp_config_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("typo.json");
        let vars = env(&[("SMOL_MCP_CONFIG", missing.to_str().unwrap())]);
        let e = Config::from_sources(&vars, &config_path(&vars))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("typo.json") && e.contains("no such file") && e.contains("SMOL_MCP_CONFIG"),
            "{e}"
        );
        // The default location may be absent.
        let vars = env(&[("XDG_CONFIG_HOME", dir.path().to_str().unwrap())]);
        assert!(Config::from_sources(&vars, &config_path(&vars)).is_ok());
    }

    #[test]
    fn a_bad_value_and_a_conflict_label_their_setting_alike() {
        let bad_value = error(&[("SMOL_MCP_CPUS", "lots")], Path::new("/x"));
        let conflict = error(&[("SMOL_MCP_TARGETS", "cloud")], Path::new("/x"));
        let ceiling = error(&[("SMOL_MCP_EXEC_TIMEOUT_SECS", "1000")], Path::new("/x"));
        assert!(
            bad_value.starts_with("cpus ($SMOL_MCP_CPUS): "),
            "{bad_value}"
        );
        assert!(
            conflict.starts_with("targets ($SMOL_MCP_TARGETS): "),
            "{conflict}"
        );
        assert!(
            ceiling.starts_with("execTimeoutSecs ($SMOL_MCP_EXEC_TIMEOUT_SECS): "),
            "{ceiling}"
        );
    }

    #[test]
    fn cloud_targets_need_a_token() {
        for targets in ["cloud", "both"] {
            let e = error(&[("SMOL_MCP_TARGETS", targets)], Path::new("/x"));
            assert!(e.contains("SMOL_CLOUD_TOKEN") && e.contains(targets), "{e}");
            let c = Config::from_sources(
                &env(&[("SMOL_MCP_TARGETS", targets), ("SMOL_CLOUD_TOKEN", "smk")]),
                Path::new("/x"),
            )
            .unwrap();
            assert_ne!(c.targets, TargetsSetting::Auto);
        }
    }

    #[test]
    fn a_non_loopback_local_url_is_refused_at_load() {
        let e = error(
            &[("SMOL_LOCAL_URL", "http://192.0.2.10:8080")],
            Path::new("/x"),
        );
        assert!(
            e.starts_with("localUrl ($SMOL_LOCAL_URL): refusing the non-loopback address")
                && e.contains("no authentication"),
            "{e}"
        );
        let (_d, path) = with_file(r#"{"localUrl": "unix://relative.sock"}"#);
        assert!(error(&[], &path).contains("absolute socket path"));
        let c = Config::from_sources(
            &env(&[("SMOL_LOCAL_URL", "http://127.0.0.1:9")]),
            Path::new("/x"),
        )
        .unwrap();
        assert_eq!(c.local_url, "http://127.0.0.1:9");
    }

    #[test]
    fn machine_sizes_have_the_tools_limits() {
        let e = error(&[("SMOL_MCP_CPUS", "65")], Path::new("/x"));
        assert!(e.contains("from 1 to 64"), "{e}");
        let e = error(&[("SMOL_MCP_MEMORY_MB", "127")], Path::new("/x"));
        assert!(e.contains("from 128 to 262144"), "{e}");
        let c = Config::from_sources(
            &env(&[("SMOL_MCP_CPUS", "64"), ("SMOL_MCP_MEMORY_MB", "262144")]),
            Path::new("/x"),
        )
        .unwrap();
        assert_eq!((c.cpus, c.memory_mb), (MAX_CPUS, MAX_MEMORY_MB));
    }

    #[test]
    fn each_key_is_its_field_in_camel_case() {
        assert_eq!(FIELD_NAMES.len(), SETTINGS.len());
        for (field, setting) in FIELD_NAMES.iter().zip(SETTINGS) {
            let mut camel = String::new();
            let mut upper = false;
            for c in field.chars() {
                match c {
                    '_' => upper = true,
                    c if upper => {
                        camel.extend(c.to_uppercase());
                        upper = false;
                    }
                    c => camel.push(c),
                }
            }
            assert_eq!(camel, setting.key);
            assert!(setting.env.starts_with("SMOL"), "{}", setting.env);
        }
    }

    /// Every setting's bounds and spellings, from every source: the table cannot promise what
    /// the types refuse.
    #[test]
    fn every_setting_accepts_what_it_says() {
        // Ceilings that other settings are checked against, out of the way.
        let base = [
            ("SMOL_MCP_EXEC_TIMEOUT_SECS", "1"),
            ("SMOL_MCP_MAX_EXEC_TIMEOUT_SECS", "604800"),
            ("SMOL_CLOUD_TOKEN", "smk"),
        ];
        let load = |var: &str, value: &str| {
            let mut vars = env(&base);
            vars.insert(var.into(), value.into());
            Config::from_sources(&vars, Path::new("/x"))
        };
        let mut file = serde_json::Map::new();
        for s in SETTINGS {
            match s.accepts {
                Accepts::Whole { min, max } => {
                    for ok in [min, max] {
                        assert!(load(s.env, &ok.to_string()).is_ok(), "{} {ok}", s.key);
                    }
                    // A range from 0 (ledgerMaxRuns) has no number below it to refuse.
                    for bad in min.checked_sub(1).into_iter().chain([max + 1]) {
                        assert!(load(s.env, &bad.to_string()).is_err(), "{} {bad}", s.key);
                    }
                    file.insert(s.key.into(), s.default.parse::<u64>().unwrap().into());
                }
                Accepts::OneOf(options) => {
                    for ok in options {
                        assert!(load(s.env, ok).is_ok(), "{} {ok}", s.key);
                    }
                    assert!(load(s.env, "other").is_err(), "{}", s.key);
                    file.insert(s.key.into(), s.default.into());
                }
                _ => {
                    file.insert(s.key.into(), s.default.into());
                }
            }
        }
        // Every key, with its default, in the file.
        let (_d, path) = with_file(&serde_json::Value::Object(file).to_string());
        Config::from_sources(&env(&base), &path).unwrap();
    }

    #[test]
    fn the_config_file_location() {
        assert_eq!(
            config_path(&env(&[
                ("SMOL_MCP_CONFIG", "/etc/x.json"),
                ("XDG_CONFIG_HOME", "/c")
            ])),
            PathBuf::from("/etc/x.json")
        );
        assert_eq!(
            config_path(&env(&[("XDG_CONFIG_HOME", "/c")])),
            PathBuf::from("/c/smol-mcp/config.json")
        );
        assert_eq!(
            config_path(&env(&[("HOME", "/h")])),
            PathBuf::from("/h/.config/smol-mcp/config.json")
        );
    }

    #[test]
    fn tokens_stay_out_of_debug() {
        let c = Config::from_sources(&env(&[("SMOL_CLOUD_TOKEN", "smk_secret")]), Path::new("/x"))
            .unwrap();
        assert!(!format!("{c:?}").contains("smk_secret"));
        assert_eq!(c.cloud_token.expose(), "smk_secret");
    }

    #[test]
    fn agent_network_ask_refuses_an_open_default() {
        let none = Path::new("/nonexistent/smol-mcp-config.json");
        let e = error(
            &[
                ("SMOL_MCP_AGENT_NETWORK", "ask"),
                ("SMOL_MCP_NETWORK_DEFAULT", "open"),
            ],
            none,
        );
        assert!(
            e.contains("networkDefault") && e.contains("agentNetwork"),
            "{e}"
        );
        let c = Config::from_sources(&env(&[("SMOL_MCP_AGENT_NETWORK", "ask")]), none).unwrap();
        assert_eq!(c.agent_network, AgentNetwork::Ask);
        let e = error(&[("SMOL_MCP_AGENT_NETWORK", "user")], none);
        assert!(e.contains("one of any, ask"), "{e}");
    }
}
