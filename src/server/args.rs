//! The tools' arguments as the model sees them, and the checks the JSON Schema only advertises
//! (rmcp does not enforce `pattern` or ranges). Every refusal names the argument and what would
//! be accepted. Unknown arguments are refused, not dropped.

use super::ToolError;
use crate::fleet::FleetKind;
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;

pub fn parse<T: DeserializeOwned>(args: serde_json::Value) -> Result<T, ToolError> {
    serde_path_to_error::deserialize(args).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let message = if path == "." {
            inner
        } else {
            format!("{path}: {inner}")
        };
        ToolError::new("INVALID_ARGUMENT", message)
    })
}

fn bad(arg: &str, message: impl std::fmt::Display) -> ToolError {
    ToolError::new("INVALID_ARGUMENT", format!("{arg}: {message}"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Any destination.
    Open,
    /// No egress at all.
    Blocked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Text; bytes that are not UTF-8 are refused on write and replaced on read.
    #[default]
    Utf8,
    /// Any bytes, as standard base64.
    Base64,
}

/// A command: an argv array run as is, or a string run with `sh -c`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum CommandArg {
    Argv(Vec<String>),
    Shell(String),
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PortArg {
    /// Port inside the machine, 1 to 65535.
    #[schemars(range(min = 1, max = 65535))]
    pub guest: u32,
    /// Local only: the host port, 1 to 65535; defaults to the guest port. The cloud allocates
    /// its own and reports it on the machine.
    #[schemars(range(min = 1, max = 65535))]
    pub host: Option<u32>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MountArg {
    /// Absolute path of a directory on the host.
    pub source: String,
    /// Absolute path inside the machine.
    pub target: String,
    /// Mount it read-only. Default false.
    #[serde(default)]
    pub readonly: bool,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TargetOnly {
    /// Which fleet: local (smolvm serve on this host, free) or cloud (smol cloud, billed while a machine exists). Required, with no default: a machine on one fleet is invisible on the other.
    pub target: Option<FleetKind>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MachineArgs {
    /// Which fleet: local (smolvm serve on this host, free) or cloud (smol cloud, billed while a machine exists). Required, with no default: a machine on one fleet is invisible on the other.
    pub target: Option<FleetKind>,
    /// The machine's name (or its mach- id on cloud).
    pub name: String,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CreateArgs {
    /// Which fleet: local (smolvm serve on this host, free) or cloud (smol cloud, billed while a machine exists). Required, with no default: a machine on one fleet is invisible on the other.
    pub target: Option<FleetKind>,
    /// OCI image reference, like alpine, python:3.12-alpine or ghcr.io/org/app:tag.
    pub image: String,
    /// Machine name: 1 to 63 letters, digits, dots, underscores or dashes, starting with a letter or digit. Omitted: a generated mcp-<8 hex> name, and the machine is deleted when this session ends. A name with the mcp- prefix is ephemeral the same way; any other name persists.
    pub name: Option<String>,
    /// Virtual CPUs, 1 to 64. Default from the server's configuration (2).
    #[schemars(range(min = 1, max = 64))]
    pub cpus: Option<u32>,
    /// Memory in MiB, 128 to 262144. Default from the server's configuration (2048).
    #[schemars(range(min = 128, max = 262144))]
    pub memory_mb: Option<u32>,
    /// Egress: open or blocked. Default blocked unless the operator configured otherwise. A registry image still has to be pulled, which needs egress on the local fleet: pass open, or allowHosts naming the registry.
    pub network: Option<Network>,
    /// Egress allow-list of host names (like pypi.org); replaces network. Sent as hosts on both fleets.
    pub allow_hosts: Option<Vec<String>>,
    /// Egress allow-list of CIDR ranges (like 10.0.0.0/8); replaces network.
    pub allow_cidrs: Option<Vec<String>>,
    /// TCP ports to publish, at most 16. On cloud a machine with a published port cannot also have blocked egress, and the machine's url reports the ingress address once something listens.
    pub ports: Option<Vec<PortArg>>,
    /// Disk size in GiB, 1 to 16384.
    #[schemars(range(min = 1, max = 16384))]
    pub storage_gb: Option<u32>,
    /// Local only: host directories to mount, at most 16.
    pub mounts: Option<Vec<MountArg>>,
    /// Local only: size in GiB of the writable overlay over the image, 1 to 16384.
    #[schemars(range(min = 1, max = 16384))]
    pub overlay_gb: Option<u32>,
    /// Environment variables of the machine's workload and of every command run in it.
    pub env: Option<BTreeMap<String, String>>,
    /// Create it as a branch source that branch-machine can copy, memory included. Cannot be turned on later on cloud. Default false.
    #[serde(default)]
    pub branchable: bool,
    /// Start it and wait until a command has run (default true). With false the machine is created stopped, ready false, for start-machine later.
    pub start: Option<bool>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StartArgs {
    /// Which fleet: local (smolvm serve on this host, free) or cloud (smol cloud, billed while a machine exists). Required, with no default: a machine on one fleet is invisible on the other.
    pub target: Option<FleetKind>,
    /// The machine's name (or its mach- id on cloud).
    pub name: String,
    /// Wait until a command has run in it before answering. Default true.
    pub wait: Option<bool>,
    /// Local only: start it as a branch source for branch-machine (default: as it was last started). On cloud this is fixed at create.
    pub branchable: Option<bool>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RunCommandArgs {
    /// Which fleet: local (smolvm serve on this host, free) or cloud (smol cloud, billed while a machine exists). Required, with no default: a machine on one fleet is invisible on the other.
    pub target: Option<FleetKind>,
    /// The machine's name (or its mach- id on cloud).
    pub name: String,
    /// An argv array (["python3", "-c", "print(1)"]) run as is, or a string run with sh -c (pipes and redirects work).
    pub command: CommandArg,
    /// Working directory inside the machine (absolute).
    pub workdir: Option<String>,
    /// Extra environment variables for this command.
    pub env: Option<BTreeMap<String, String>>,
    /// Text written to the command's standard input, then closed.
    pub stdin: Option<String>,
    /// Seconds before the command is killed (exit 124, timedOut true). Default and ceiling from the server's configuration (120 and 900).
    #[schemars(range(min = 1))]
    pub timeout_secs: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RunOnceArgs {
    /// Which fleet: local (smolvm serve on this host, free) or cloud (smol cloud, billed while a machine exists). Required, with no default: a machine on one fleet is invisible on the other.
    pub target: Option<FleetKind>,
    /// OCI image reference, like alpine or python:3.12-alpine.
    pub image: String,
    /// An argv array run as is, or a string run with sh -c.
    pub command: CommandArg,
    /// Working directory inside the machine (absolute).
    pub workdir: Option<String>,
    /// Environment variables for the command.
    pub env: Option<BTreeMap<String, String>>,
    /// Text written to the command's standard input, then closed.
    pub stdin: Option<String>,
    /// Seconds before the command is killed. Default and ceiling from the server's configuration.
    #[schemars(range(min = 1))]
    pub timeout_secs: Option<u64>,
    /// Virtual CPUs, 1 to 64.
    #[schemars(range(min = 1, max = 64))]
    pub cpus: Option<u32>,
    /// Memory in MiB, 128 to 262144.
    #[schemars(range(min = 128, max = 262144))]
    pub memory_mb: Option<u32>,
    /// Egress: open or blocked. Default blocked unless the operator configured otherwise.
    pub network: Option<Network>,
    /// Egress allow-list of host names; replaces network.
    pub allow_hosts: Option<Vec<String>>,
    /// Egress allow-list of CIDR ranges; replaces network.
    pub allow_cidrs: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReadFileArgs {
    /// Which fleet: local (smolvm serve on this host, free) or cloud (smol cloud, billed while a machine exists). Required, with no default: a machine on one fleet is invisible on the other.
    pub target: Option<FleetKind>,
    /// The machine's name (or its mach- id on cloud).
    pub name: String,
    /// Absolute path of the file inside the machine.
    pub path: String,
    /// utf8 (default) or base64 for binary files.
    #[serde(default)]
    pub encoding: Encoding,
    /// Byte to start at. Default 0.
    pub offset: Option<u64>,
    /// Bytes to return, at least 1. Default: to the end of the file, or as many as the output budget allows; eof says whether the end was reached.
    #[schemars(range(min = 1))]
    pub length: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WriteFileArgs {
    /// Which fleet: local (smolvm serve on this host, free) or cloud (smol cloud, billed while a machine exists). Required, with no default: a machine on one fleet is invisible on the other.
    pub target: Option<FleetKind>,
    /// The machine's name (or its mach- id on cloud).
    pub name: String,
    /// Absolute path of the file inside the machine; parent directories are created.
    pub path: String,
    /// The file's content (may be empty), in the given encoding. It replaces the whole file.
    pub content: String,
    /// utf8 (default) or base64 for binary content.
    #[serde(default)]
    pub encoding: Encoding,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BranchArgs {
    /// Which fleet: local (smolvm serve on this host, free) or cloud (smol cloud, billed while a machine exists). Required, with no default: a machine on one fleet is invisible on the other.
    pub target: Option<FleetKind>,
    /// The source: a running machine created with branchable true.
    pub name: String,
    /// Name for the new child: same rules as create-machine's name. With the mcp- prefix the child is ephemeral.
    pub child_name: String,
    /// Let the child be branched in turn. Default false.
    #[serde(default)]
    pub branchable: bool,
    /// Wait until a command has run in the child. Default true.
    pub wait: Option<bool>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LogsArgs {
    /// Which fleet: local (smolvm serve on this host, free) or cloud (smol cloud, billed while a machine exists). Required, with no default: a machine on one fleet is invisible on the other.
    pub target: Option<FleetKind>,
    /// The machine's name (or its mach- id on cloud).
    pub name: String,
    /// Lines from the end, 1 to 10000. Ignored when a cursor is given. Default from the server's configuration (100).
    #[schemars(range(min = 1, max = 10000))]
    pub tail: Option<u64>,
    /// The cursor a previous call returned for this machine: only what arrived since is returned.
    pub cursor: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PullArgs {
    /// Which fleet: local (smolvm serve on this host, free) or cloud (smol cloud, billed while a machine exists). Required, with no default: a machine on one fleet is invisible on the other.
    pub target: Option<FleetKind>,
    /// A running machine whose image cache receives the image.
    pub name: String,
    /// OCI image reference to pull.
    pub image: String,
}

// ---- checks ----

pub fn machine_name(arg: &str, name: &str) -> Result<(), ToolError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(bad(
            arg,
            format!(
                "\"{name}\" is not accepted: give 1 to 63 letters, digits, dots, underscores or dashes, starting with a letter or digit"
            ),
        ))
    }
}

/// A reference to an existing machine: a name as above, or a cloud id.
pub fn machine_ref(arg: &str, name: &str) -> Result<(), ToolError> {
    if name.starts_with("mach-")
        && name.len() <= 80
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Ok(());
    }
    machine_name(arg, name)
}

pub fn image(arg: &str, image: &str) -> Result<(), ToolError> {
    if image.is_empty()
        || image.len() > 512
        || image.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(bad(
            arg,
            "give an OCI image reference without spaces, like alpine or python:3.12-alpine",
        ));
    }
    Ok(())
}

pub fn range(arg: &str, value: u64, min: u64, max: u64) -> Result<(), ToolError> {
    if value < min || value > max {
        return Err(bad(
            arg,
            format!("{value} is out of range: give {min} to {max}"),
        ));
    }
    Ok(())
}

pub fn absolute_path(arg: &str, path: &str) -> Result<(), ToolError> {
    if !path.starts_with('/') || path.contains('\0') || path.len() > 4096 {
        return Err(bad(
            arg,
            format!("\"{path}\" is not accepted: give an absolute path, like /workspace/app.py"),
        ));
    }
    Ok(())
}

pub fn env(arg: &str, env: &BTreeMap<String, String>) -> Result<(), ToolError> {
    for (k, v) in env {
        let ok = !k.is_empty()
            && !k.chars().next().is_some_and(|c| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(bad(
                arg,
                format!(
                    "variable name \"{k}\" is not accepted: use letters, digits and underscores, not starting with a digit"
                ),
            ));
        }
        if v.contains('\0') {
            return Err(bad(arg, format!("the value of {k} contains a NUL byte")));
        }
    }
    Ok(())
}

pub fn hosts(arg: &str, hosts: &[String]) -> Result<(), ToolError> {
    for h in hosts {
        let ok = !h.is_empty()
            && h.len() <= 253
            && h.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '*')
            });
        if !ok {
            return Err(bad(
                arg,
                format!(
                    "\"{h}\" is not a host name: give names like pypi.org, without scheme, port or path"
                ),
            ));
        }
    }
    Ok(())
}

pub fn cidrs(arg: &str, cidrs: &[String]) -> Result<(), ToolError> {
    for c in cidrs {
        let parsed = c.split_once('/').and_then(|(ip, prefix)| {
            let ip: std::net::IpAddr = ip.parse().ok()?;
            let prefix: u8 = prefix.parse().ok()?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            (prefix <= max).then_some(())
        });
        if parsed.is_none() {
            return Err(bad(
                arg,
                format!(
                    "\"{c}\" is not a CIDR range: give an address and a prefix length, like 10.0.0.0/8 or 2001:db8::/32"
                ),
            ));
        }
    }
    Ok(())
}

pub fn port(arg: &str, port: u32) -> Result<u16, ToolError> {
    u16::try_from(port)
        .ok()
        .filter(|p| *p >= 1)
        .ok_or_else(|| bad(arg, format!("{port} is not a port: give 1 to 65535")))
}

pub fn command(arg: &str, command: &CommandArg) -> Result<crate::fleet::Command, ToolError> {
    match command {
        CommandArg::Argv(argv) if argv.is_empty() || argv[0].is_empty() => Err(bad(
            arg,
            "an argv array needs at least the program, like [\"ls\", \"-l\"]",
        )),
        CommandArg::Argv(argv) => Ok(crate::fleet::Command::Argv(argv.clone())),
        CommandArg::Shell(s) if s.trim().is_empty() => Err(bad(
            arg,
            "an empty string runs nothing: give a shell command",
        )),
        CommandArg::Shell(s) => Ok(crate::fleet::Command::Shell(s.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_and_mistyped_arguments_name_themselves() {
        let e = parse::<MachineArgs>(json!({"name": "a", "bogus": 1})).unwrap_err();
        assert!(
            e.message.contains("unknown field `bogus`") && e.message.contains("`name`"),
            "{}",
            e.message
        );
        let e = parse::<CreateArgs>(json!({"image": "a", "cpus": "lots"})).unwrap_err();
        assert!(e.message.starts_with("cpus:"), "{}", e.message);
        let e = parse::<CreateArgs>(json!({"image": "a", "network": "off"})).unwrap_err();
        assert!(
            e.message.contains("network") && e.message.contains("open"),
            "{}",
            e.message
        );
    }

    #[test]
    fn checks() {
        assert!(machine_name("name", "web-1.a_b").is_ok());
        assert!(machine_name("name", "-x").is_err());
        assert!(machine_name("name", "has space").is_err());
        assert!(machine_ref("name", "mach-0123456789abcdef0123456789abcdef").is_ok());
        assert!(
            absolute_path("path", "relative/x")
                .unwrap_err()
                .message
                .contains("absolute path")
        );
        assert!(cidrs("allowCidrs", &["10.0.0.0/8".into(), "::1/128".into()]).is_ok());
        assert!(cidrs("allowCidrs", &["10.0.0.0/33".into()]).is_err());
        assert!(hosts("allowHosts", &["https://pypi.org".into()]).is_err());
        assert_eq!(
            port("ports[0].guest", 70000).unwrap_err().message,
            "ports[0].guest: 70000 is not a port: give 1 to 65535"
        );
        assert!(command("command", &CommandArg::Argv(vec![])).is_err());
        assert!(
            env(
                "env",
                &BTreeMap::from([("1X".to_string(), "v".to_string())])
            )
            .is_err()
        );
    }
}
