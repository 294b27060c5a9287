//! Configuration: environment over file over default. The file is JSON at `$SMOL_MCP_CONFIG`, or
//! `$XDG_CONFIG_HOME/smol-mcp/config.json` (`~/.config/...` without XDG). An unknown key in the
//! file, a value of the wrong type and an out-of-range number are errors that name the key, its
//! environment variable and what would be accepted.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// The largest machine a call or the configuration may ask for.
pub const MAX_CPUS: u32 = 64;
pub const MIN_MEMORY_MB: u32 = 128;
pub const MAX_MEMORY_MB: u32 = 262_144;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {message}")]
    File { path: String, message: String },
    #[error("{key} ({source_name}): {message}")]
    Value {
        key: &'static str,
        source_name: String,
        message: String,
    },
}

/// A value that must never be logged or echoed.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("\"\"")
        } else {
            f.write_str("<redacted>")
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkDefault {
    Open,
    Blocked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetsSetting {
    Auto,
    Local,
    Cloud,
    Both,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub smolvm: String,
    pub min_smolvm: String,
    pub local_url: String,
    pub runtime_dir: PathBuf,
    pub machine_prefix: String,
    pub memory_mb: u32,
    pub cpus: u32,
    pub network_default: NetworkDefault,
    pub run_once_network: NetworkDefault,
    pub ephemeral_ttl_secs: u64,
    pub ephemeral_auto_stop_secs: u64,
    pub exec_timeout_secs: u64,
    pub max_exec_timeout_secs: u64,
    pub max_output_bytes: usize,
    pub ready_timeout_secs: u64,
    pub serve_start_timeout_secs: u64,
    pub logs_tail: usize,
    pub cloud_url: String,
    pub cloud_token: Secret,
    pub targets: TargetsSetting,
    pub http_host: String,
    pub http_port: u16,
    pub http_path: String,
    pub http_session_idle_secs: u64,
    pub http_allowed_hosts: Vec<String>,
    pub http_allowed_origins: Vec<String>,
    pub auth_token: Secret,
}

#[derive(Clone, Copy)]
enum Kind {
    Text,
    /// A whole number from 1 to the bound.
    Positive(u64),
    Choice(&'static [&'static str]),
}

/// Every key: its name in the file, its environment variable, its default and its kind. The
/// README's configuration table is this table.
pub struct Key {
    pub name: &'static str,
    pub env: &'static str,
    pub default: &'static str,
    kind: Kind,
}

const fn key(name: &'static str, env: &'static str, default: &'static str, kind: Kind) -> Key {
    Key {
        name,
        env,
        default,
        kind,
    }
}

const NETWORK: Kind = Kind::Choice(&["open", "blocked"]);
const U32: u64 = u32::MAX as u64;
const DAY: u64 = 86_400;

pub const KEYS: &[Key] = &[
    key("smolvm", "SMOLVM", "smolvm", Kind::Text),
    key("minSmolvm", "SMOL_MCP_MIN_SMOLVM", "1.32.0", Kind::Text),
    key("localUrl", "SMOL_LOCAL_URL", "", Kind::Text),
    key("runtimeDir", "SMOL_MCP_RUNTIME_DIR", "", Kind::Text),
    key(
        "machinePrefix",
        "SMOL_MCP_MACHINE_PREFIX",
        "mcp-",
        Kind::Text,
    ),
    key(
        "memoryMb",
        "SMOL_MCP_MEMORY_MB",
        "2048",
        Kind::Positive(U32),
    ),
    key("cpus", "SMOL_MCP_CPUS", "2", Kind::Positive(256)),
    key(
        "networkDefault",
        "SMOL_MCP_NETWORK_DEFAULT",
        "blocked",
        NETWORK,
    ),
    key(
        "runOnceNetwork",
        "SMOL_MCP_RUN_ONCE_NETWORK",
        "blocked",
        NETWORK,
    ),
    key(
        "ephemeralTtlSecs",
        "SMOL_MCP_EPHEMERAL_TTL_SECS",
        "3600",
        Kind::Positive(365 * DAY),
    ),
    key(
        "ephemeralAutoStopSecs",
        "SMOL_MCP_EPHEMERAL_AUTO_STOP_SECS",
        "900",
        Kind::Positive(365 * DAY),
    ),
    key(
        "execTimeoutSecs",
        "SMOL_MCP_EXEC_TIMEOUT_SECS",
        "120",
        Kind::Positive(7 * DAY),
    ),
    key(
        "maxExecTimeoutSecs",
        "SMOL_MCP_MAX_EXEC_TIMEOUT_SECS",
        "900",
        Kind::Positive(7 * DAY),
    ),
    key(
        "maxOutputBytes",
        "SMOL_MCP_MAX_OUTPUT_BYTES",
        "65536",
        Kind::Positive(64 * 1024 * 1024),
    ),
    key(
        "readyTimeoutSecs",
        "SMOL_MCP_READY_TIMEOUT_SECS",
        "120",
        Kind::Positive(DAY),
    ),
    key(
        "serveStartTimeoutSecs",
        "SMOL_MCP_SERVE_START_TIMEOUT_SECS",
        "60",
        Kind::Positive(DAY),
    ),
    key(
        "logsTail",
        "SMOL_MCP_LOGS_TAIL",
        "100",
        Kind::Positive(1_000_000),
    ),
    key(
        "cloudUrl",
        "SMOL_CLOUD_URL",
        "https://api.smolmachines.com",
        Kind::Text,
    ),
    key("cloudToken", "SMOL_CLOUD_TOKEN", "", Kind::Text),
    key(
        "targets",
        "SMOL_MCP_TARGETS",
        "auto",
        Kind::Choice(&["auto", "local", "cloud", "both"]),
    ),
    key("httpHost", "SMOL_MCP_HTTP_HOST", "127.0.0.1", Kind::Text),
    key(
        "httpPort",
        "SMOL_MCP_HTTP_PORT",
        "8080",
        Kind::Positive(65_535),
    ),
    key("httpPath", "SMOL_MCP_HTTP_PATH", "/mcp", Kind::Text),
    key(
        "httpSessionIdleSecs",
        "SMOL_MCP_HTTP_SESSION_IDLE_SECS",
        "1800",
        Kind::Positive(30 * DAY),
    ),
    key(
        "httpAllowedHosts",
        "SMOL_MCP_HTTP_ALLOWED_HOSTS",
        "",
        Kind::Text,
    ),
    key(
        "httpAllowedOrigins",
        "SMOL_MCP_HTTP_ALLOWED_ORIGINS",
        "",
        Kind::Text,
    ),
    key("authToken", "SMOL_MCP_AUTH_TOKEN", "", Kind::Text),
];

/// Keys for which an empty environment value means "empty" rather than "unset": an empty
/// minimum version turns the check off (the reference server could only do that in the file).
const EMPTY_IS_A_VALUE: &[&str] = &["minSmolvm"];

/// Where the value of one key came from, for error messages.
#[derive(Clone)]
enum Origin {
    Default,
    File(String),
    Env(&'static str),
}

impl Origin {
    fn describe(&self, key: &Key) -> String {
        match self {
            Origin::Default => format!("default of {}", key.name),
            Origin::File(path) => format!("\"{}\" in {path}", key.name),
            Origin::Env(var) => format!("${var}"),
        }
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

    pub fn from_sources(
        env: &BTreeMap<String, String>,
        file: &Path,
    ) -> Result<Config, ConfigError> {
        let file_label = file.display().to_string();
        let file_values = match std::fs::read_to_string(file) {
            Ok(text) => parse_file(&text, &file_label)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => {
                return Err(ConfigError::File {
                    path: file_label,
                    message: e.to_string(),
                });
            }
        };
        let mut values: BTreeMap<&'static str, (String, Origin)> = BTreeMap::new();
        for k in KEYS {
            let from_env = env
                .get(k.env)
                .filter(|v| !v.is_empty() || EMPTY_IS_A_VALUE.contains(&k.name));
            let chosen = if let Some(v) = from_env {
                (v.clone(), Origin::Env(k.env))
            } else if let Some(v) = file_values.get(k.name) {
                (v.clone(), Origin::File(file_label.clone()))
            } else {
                (k.default.to_owned(), Origin::Default)
            };
            values.insert(k.name, chosen);
        }
        Reader { values }.build(env)
    }
}

/// The file's values as text, each checked against its key's kind later with the rest.
fn parse_file(text: &str, path: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let err = |message: String| ConfigError::File {
        path: path.to_owned(),
        message,
    };
    let doc: serde_json::Value =
        serde_json::from_str(text).map_err(|e| err(format!("not JSON: {e}")))?;
    let serde_json::Value::Object(map) = doc else {
        return Err(err("must be a JSON object of settings".into()));
    };
    let mut out = BTreeMap::new();
    for (name, value) in map {
        let Some(k) = KEYS.iter().find(|k| k.name == name) else {
            let known: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
            return Err(err(format!(
                "unknown key \"{name}\" (known keys: {})",
                known.join(", ")
            )));
        };
        let text = match (&value, k.kind) {
            (serde_json::Value::String(s), _) => s.clone(),
            (serde_json::Value::Number(n), Kind::Positive(_)) => n.to_string(),
            (serde_json::Value::Array(items), Kind::Text)
                if matches!(k.name, "httpAllowedHosts" | "httpAllowedOrigins") =>
            {
                items
                    .iter()
                    .filter_map(|v| v.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            }
            _ => {
                return Err(err(format!(
                    "\"{name}\" must be {}, not {value}",
                    expected(k.kind)
                )));
            }
        };
        out.insert(name, text);
    }
    Ok(out)
}

fn expected(kind: Kind) -> String {
    match kind {
        Kind::Text => "a string".into(),
        Kind::Positive(max) => format!("a whole number from 1 to {max}"),
        Kind::Choice(options) => format!("one of {}", options.join(", ")),
    }
}

struct Reader {
    values: BTreeMap<&'static str, (String, Origin)>,
}

impl Reader {
    fn raw(&self, name: &'static str) -> Result<(&Key, &str, &Origin), ConfigError> {
        let k = KEYS
            .iter()
            .find(|k| k.name == name)
            .ok_or_else(|| ConfigError::Value {
                key: "config",
                source_name: name.into(),
                message: "no such key".into(),
            })?;
        let (v, origin) = self.values.get(name).ok_or_else(|| ConfigError::Value {
            key: k.name,
            source_name: k.env.into(),
            message: "missing".into(),
        })?;
        Ok((k, v.as_str(), origin))
    }

    fn text(&self, name: &'static str) -> Result<String, ConfigError> {
        Ok(self.raw(name)?.1.to_owned())
    }

    fn number(&self, name: &'static str) -> Result<u64, ConfigError> {
        let (k, v, origin) = self.raw(name)?;
        let Kind::Positive(max) = k.kind else {
            return Err(ConfigError::Value {
                key: k.name,
                source_name: origin.describe(k),
                message: "not a number key".into(),
            });
        };
        match v.trim().parse::<u64>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(ConfigError::Value {
                key: k.name,
                source_name: origin.describe(k),
                message: format!("\"{v}\" is not accepted: give {}", expected(k.kind)),
            }),
        }
    }

    fn choice(&self, name: &'static str) -> Result<&str, ConfigError> {
        let (k, v, origin) = self.raw(name)?;
        match k.kind {
            Kind::Choice(options) if options.contains(&v) => Ok(v),
            _ => Err(ConfigError::Value {
                key: k.name,
                source_name: origin.describe(k),
                message: format!("\"{v}\" is not accepted: give {}", expected(k.kind)),
            }),
        }
    }

    fn network(&self, name: &'static str) -> Result<NetworkDefault, ConfigError> {
        Ok(match self.choice(name)? {
            "open" => NetworkDefault::Open,
            _ => NetworkDefault::Blocked,
        })
    }

    fn list(&self, name: &'static str) -> Result<Vec<String>, ConfigError> {
        Ok(self
            .text(name)?
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect())
    }

    fn build(&self, env: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
        let runtime_dir = match self.text("runtimeDir")? {
            dir if !dir.is_empty() => PathBuf::from(dir),
            _ => default_runtime_dir(env),
        };
        let prefix = self.text("machinePrefix")?;
        if prefix.is_empty() {
            return Err(ConfigError::Value {
                key: "machinePrefix",
                source_name: "SMOL_MCP_MACHINE_PREFIX".into(),
                message: "must not be empty: an empty prefix would make every machine ephemeral"
                    .into(),
            });
        }
        let http_path = self.text("httpPath")?;
        if !http_path.starts_with('/') {
            return Err(ConfigError::Value {
                key: "httpPath",
                source_name: "SMOL_MCP_HTTP_PATH".into(),
                message: format!("\"{http_path}\" must start with a slash, like /mcp"),
            });
        }
        let config = Config {
            smolvm: self.text("smolvm")?,
            min_smolvm: self.text("minSmolvm")?,
            local_url: self.text("localUrl")?,
            runtime_dir,
            machine_prefix: prefix,
            memory_mb: self.number("memoryMb")? as u32,
            cpus: self.number("cpus")? as u32,
            network_default: self.network("networkDefault")?,
            run_once_network: self.network("runOnceNetwork")?,
            ephemeral_ttl_secs: self.number("ephemeralTtlSecs")?,
            ephemeral_auto_stop_secs: self.number("ephemeralAutoStopSecs")?,
            exec_timeout_secs: self.number("execTimeoutSecs")?,
            max_exec_timeout_secs: self.number("maxExecTimeoutSecs")?,
            max_output_bytes: self.number("maxOutputBytes")? as usize,
            ready_timeout_secs: self.number("readyTimeoutSecs")?,
            serve_start_timeout_secs: self.number("serveStartTimeoutSecs")?,
            logs_tail: self.number("logsTail")? as usize,
            cloud_url: self.text("cloudUrl")?,
            cloud_token: Secret::new(self.text("cloudToken")?),
            targets: match self.choice("targets")? {
                "local" => TargetsSetting::Local,
                "cloud" => TargetsSetting::Cloud,
                "both" => TargetsSetting::Both,
                _ => TargetsSetting::Auto,
            },
            http_host: self.text("httpHost")?,
            http_port: self.number("httpPort")? as u16,
            http_path,
            http_session_idle_secs: self.number("httpSessionIdleSecs")?,
            http_allowed_hosts: self.list("httpAllowedHosts")?,
            http_allowed_origins: self.list("httpAllowedOrigins")?,
            auth_token: Secret::new(self.text("authToken")?),
        };
        if config.exec_timeout_secs > config.max_exec_timeout_secs {
            return Err(ConfigError::Value {
                key: "execTimeoutSecs",
                source_name: "SMOL_MCP_EXEC_TIMEOUT_SECS".into(),
                message: format!(
                    "the default ({} s) is above the ceiling maxExecTimeoutSecs ({} s)",
                    config.exec_timeout_secs, config.max_exec_timeout_secs
                ),
            });
        }
        Ok(config)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn with_file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, text).unwrap();
        (dir, path)
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
    }

    #[test]
    fn env_beats_file_beats_default() {
        let (_d, path) = with_file(r#"{"cpus": 4, "memoryMb": "1024", "networkDefault": "open"}"#);
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
        let e = Config::from_sources(&env(&[]), &path)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown key \"cpu\"") && e.contains("cpus"),
            "{e}"
        );

        let e = Config::from_sources(&env(&[("SMOL_MCP_CPUS", "lots")]), Path::new("/x"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cpus") && e.contains("$SMOL_MCP_CPUS") && e.contains("whole number"),
            "{e}"
        );

        let (_d, path) = with_file(r#"{"networkDefault": "off"}"#);
        let e = Config::from_sources(&env(&[]), &path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("one of open, blocked"), "{e}");

        let (_d, path) = with_file("not json");
        assert!(
            Config::from_sources(&env(&[]), &path)
                .unwrap_err()
                .to_string()
                .contains("not JSON")
        );

        let e = Config::from_sources(
            &env(&[("SMOL_MCP_EXEC_TIMEOUT_SECS", "1000")]),
            Path::new("/x"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("ceiling"), "{e}");
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
}
