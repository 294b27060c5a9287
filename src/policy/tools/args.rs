//! The tools' arguments as the model sees them, and the checks the JSON Schema only advertises
//! (rmcp does not enforce `pattern` or ranges). Every refusal names the argument and what would
//! be accepted. Unknown arguments are refused, not dropped.

use super::grammar::{
    AbsolutePath, CidrRanges, EnvVars, GrantsOf, HostNames, ImageRef, MachineName,
};
use super::owners::{MachineRef, Named};
use super::tool::Tool;
use crate::fleet::FleetKind;
use crate::policy::error::{ToolError, quote};
use crate::process::Mode;
use crate::process::config::{MAX_CPUS, MAX_MEMORY_MB, MIN_MEMORY_MB};
use rmcp::model::JsonObject;
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Bounds an argument's schema states and its check enforces, one number each (the machine's
/// size comes from the settings' own: `MAX_CPUS`, `MIN_MEMORY_MB`, `MAX_MEMORY_MB`).
pub const MAX_DISK_GB: u32 = 16_384;
pub const MAX_LOG_TAIL: u64 = 10_000;
pub const MAX_JOB_WAIT_SECS: u64 = 300;

/// The description of every tool's `target` argument, written once: `schema::input` puts it on
/// the property, which the argument structs leave undocumented.
pub const TARGET_DESCRIPTION: &str = "Which fleet: local (this host, free) or cloud (billed while a machine exists). Required: a machine on one fleet is invisible on the other.";

/// The arguments of a call to `tool`, checked against the tool's own input schema first so that
/// a refusal is in the schema's words (the argument, what was sent, what is accepted) rather
/// than serde's.
pub fn parse<T: DeserializeOwned>(
    tool: Tool,
    input: Option<&JsonObject>,
    mode: Mode,
    args: Value,
) -> Result<T, ToolError> {
    if let Some(schema) = input {
        check_arguments(tool, mode, schema, &args)?;
    }
    // Nothing a deserialization elsewhere on this thread left is read as this one's.
    let _ = super::grammar::take_refusal();
    serde_path_to_error::deserialize(args).map_err(|e| {
        // The schema check passed, so this is a rule the schema cannot state: a grammar
        // (`grammar.rs`), named by its argument's path, or by the argument its type names
        // when serde lost the path inside a flattened group.
        let path = e.path().to_string();
        let path_known = path != "." && !path.contains('?');
        match super::grammar::take_refusal() {
            Some(refused) => ToolError::argument(
                if path_known { &path } else { &refused.argument },
                refused.words,
            ),
            None => ToolError::argument(
                if path == "." { "arguments" } else { &path },
                e.into_inner(),
            ),
        }
    })
}

fn check_arguments(
    tool: Tool,
    mode: Mode,
    schema: &JsonObject,
    args: &Value,
) -> Result<(), ToolError> {
    let Value::Object(given) = args else {
        return Err(ToolError::argument(
            "arguments",
            "give an object of named arguments",
        ));
    };
    let empty = serde_json::Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    for (name, value) in given {
        let Some(property) = properties.get(name) else {
            // With one fleet, `target` is refused on its own terms (Call::fleet_kind).
            let known: Vec<&str> = properties
                .keys()
                .map(String::as_str)
                .filter(|k| mode == Mode::Both || *k != "target")
                .collect();
            // An empty list would read as a message cut short.
            let accepted = if known.is_empty() {
                "it takes no arguments".to_owned()
            } else {
                format!("its arguments are {}", known.join(", "))
            };
            return Err(ToolError::argument(
                &quote_name(name),
                format!("not an argument of {}; {accepted}", tool.name()),
            ));
        };
        check_value(name, property, value, false)?;
    }
    for name in required(schema) {
        if !given.contains_key(name) {
            let what = properties
                .get(name)
                .and_then(|p| p.get("description"))
                .and_then(Value::as_str)
                .map_or_else(|| describe(&properties[name]), str::to_owned);
            return Err(ToolError::argument(
                name,
                format!("required, and missing: {what}"),
            ));
        }
    }
    Ok(())
}

fn required(schema: &serde_json::Map<String, Value>) -> impl Iterator<Item = &str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// An argument name as the agent sent it, short and printable.
fn quote_name(name: &str) -> String {
    if name.len() <= 64 && name.chars().all(|c| c.is_ascii_graphic()) {
        name.to_owned()
    } else {
        quote(name)
    }
}

fn shown(value: &Value) -> String {
    const MAX_CHARS: usize = 80;
    match value {
        Value::String(s) => quote(s),
        // JSON text is already printable: quoting it again would escape its own quotes.
        other => {
            let text = other.to_string();
            if text.chars().count() <= MAX_CHARS {
                text
            } else {
                let prefix: String = text.chars().take(MAX_CHARS).collect();
                format!("{prefix}... ({} bytes)", text.len())
            }
        }
    }
}

/// The JSON Schema type name of `value`.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Whether `value` is what `schema` accepts at `path`; `nested` values have no `null` leniency.
fn check_value(path: &str, schema: &Value, value: &Value, nested: bool) -> Result<(), ToolError> {
    // An optional argument given as null is the same as leaving it out.
    if value.is_null() && !nested {
        return Ok(());
    }
    let refuse = || {
        ToolError::argument(
            path,
            format!(
                "{} is not accepted: give {}",
                shown(value),
                describe(schema)
            ),
        )
    };
    for key in ["anyOf", "oneOf"] {
        if let Some(branches) = schema.get(key).and_then(Value::as_array) {
            if branches
                .iter()
                .any(|b| check_value(path, b, value, true).is_ok())
            {
                return Ok(());
            }
            // A value of the one branch's type is wrong inside (["ls", 1]): that branch's
            // refusal names the item at fault, where the whole value would hide it.
            let same_type: Vec<&Value> = branches
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some(json_type(value)))
                .collect();
            return match same_type.as_slice() {
                [branch] => check_value(path, branch, value, true),
                _ => Err(refuse()),
            };
        }
    }
    if let Some(constant) = schema.get("const") {
        return if constant == value {
            Ok(())
        } else {
            Err(refuse())
        };
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        return Err(refuse());
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") if !value.is_string() => Err(refuse()),
        Some("boolean") if !value.is_boolean() => Err(refuse()),
        Some("integer") => check_integer(path, schema, value, refuse),
        Some("array") => {
            let Value::Array(items) = value else {
                return Err(refuse());
            };
            let item_schema = schema.get("items").unwrap_or(&Value::Null);
            for (i, item) in items.iter().enumerate() {
                check_value(&format!("{path}[{i}]"), item_schema, item, true)?;
            }
            Ok(())
        }
        Some("object") => {
            let Value::Object(map) = value else {
                return Err(refuse());
            };
            check_object(path, schema, map)
        }
        _ => Ok(()),
    }
}

fn check_integer(
    path: &str,
    schema: &Value,
    value: &Value,
    refuse: impl Fn() -> ToolError,
) -> Result<(), ToolError> {
    let Some(n) = value
        .as_i64()
        .map(i128::from)
        .or(value.as_u64().map(i128::from))
    else {
        return Err(refuse());
    };
    let (min, max) = bounds(schema);
    let below = min.is_some_and(|m| n < m);
    let above = max.is_some_and(|m| n > m);
    // Without a stated bound the type still has one (u32, u64): serde reports it below.
    if below || above || n < 0 {
        return Err(ToolError::argument(
            path,
            format!("{n} is out of range: give {}", range_text(min, max)),
        ));
    }
    Ok(())
}

fn check_object(
    path: &str,
    schema: &Value,
    map: &serde_json::Map<String, Value>,
) -> Result<(), ToolError> {
    let properties = schema.get("properties").and_then(Value::as_object);
    for (key, item) in map {
        let at = format!("{path}.{}", quote_name(key));
        match (
            properties.and_then(|p| p.get(key)),
            schema.get("additionalProperties"),
        ) {
            (Some(property), _) => check_value(&at, property, item, false)?,
            (None, Some(Value::Bool(false))) => {
                let known: Vec<&str> = properties
                    .map(|p| p.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                return Err(ToolError::argument(
                    &at,
                    format!("not accepted here; the fields are {}", known.join(", ")),
                ));
            }
            (None, Some(extra @ Value::Object(_))) => check_value(&at, extra, item, true)?,
            (None, _) => {}
        }
    }
    if let Some(schema) = schema.as_object() {
        for name in required(schema) {
            if !map.contains_key(name) {
                return Err(ToolError::argument(
                    &format!("{path}.{name}"),
                    "required, and missing",
                ));
            }
        }
    }
    Ok(())
}

/// An integer schema's `minimum` and `maximum`.
fn bounds(schema: &Value) -> (Option<i128>, Option<i128>) {
    let bound = |key| schema.get(key).and_then(Value::as_i64).map(i128::from);
    (bound("minimum"), bound("maximum"))
}

fn range_text(min: Option<i128>, max: Option<i128>) -> String {
    match (min, max) {
        (Some(min), Some(max)) => format!("{min} to {max}"),
        (Some(min), None) => format!("{min} or more"),
        (None, Some(max)) => format!("0 to {max}"),
        (None, None) => "a whole number of 0 or more".to_owned(),
    }
}

/// What a schema accepts, in words.
fn describe(schema: &Value) -> String {
    for key in ["anyOf", "oneOf"] {
        if let Some(branches) = schema.get(key).and_then(Value::as_array) {
            let each: Vec<String> = branches.iter().map(describe).collect();
            return each.join(" or ");
        }
    }
    if let Some(constant) = schema.get("const") {
        return constant.to_string();
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        let each: Vec<String> = options.iter().map(Value::to_string).collect();
        return format!("one of {}", each.join(", "));
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => "a string".to_owned(),
        Some("boolean") => "true or false".to_owned(),
        Some("integer") => {
            let (min, max) = bounds(schema);
            format!("a whole number, {}", range_text(min, max))
        }
        Some("array") => match schema.get("items") {
            Some(items) => format!("an array, each item {}", describe(items)),
            None => "an array".to_owned(),
        },
        Some("object") => "an object".to_owned(),
        _ => "a JSON value".to_owned(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogSourceArg {
    Workload,
    Engine,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    Open,
    Blocked,
    // Blocked, with an allow list only the user grows (create-machine; the tools' words say
    // so, and a doc comment here would be repeated in every schema that takes a network).
    Ask,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    #[default]
    Utf8,
    Base64,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PortArg {
    #[schemars(range(min = 1, max = 65535))]
    pub guest: u32,
    /// {local:Defaults to guest.}
    #[schemars(range(min = 1, max = 65535))]
    pub host: Option<u32>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MountArg {
    pub source: AbsolutePath,
    pub target: AbsolutePath,
    pub readonly: Option<bool>,
}

/// Declares a tool's arguments. Every tool takes `target` (the fleet; its description is
/// written once, as TARGET_DESCRIPTION) and refuses unknown arguments. A struct that flattens a
/// shared group (`MachineBase`, `CommandFields`) is marked `flattening`: serde cannot combine
/// `deny_unknown_fields` with `flatten`, so there the schema alone says so and
/// `check_arguments` enforces it.
macro_rules! tool_arguments {
    (pub struct $name:ident { $($fields:tt)* }) => {
        #[derive(Debug, Clone, Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        pub struct $name {
            pub target: Option<FleetKind>,
            $($fields)*
        }

        impl Targeted for $name {
            fn target(&self) -> Option<FleetKind> {
                self.target
            }
        }
    };
    (flattening pub struct $name:ident { $($fields:tt)* }) => {
        #[derive(Debug, Clone, Deserialize, JsonSchema)]
        #[serde(rename_all = "camelCase")]
        #[schemars(deny_unknown_fields)]
        pub struct $name {
            pub target: Option<FleetKind>,
            $($fields)*
        }

        impl Targeted for $name {
            fn target(&self) -> Option<FleetKind> {
                self.target
            }
        }
    };
}

tool_arguments! {
    pub struct TargetOnly {

    }
}

tool_arguments! {
    pub struct ListArgs {
        /// Just this machine{cloud: (or mach- id)}.
        pub name: Option<MachineRef>,
    }
}

tool_arguments! {
    pub struct MachineArgs {
        /// Machine name{cloud: or mach- id}.
        pub name: MachineRef,
    }
}

/// What a new machine is made of: shared by create-machine and run-once.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineBase {
    /// OCI image, like python:3.12-alpine. {local:Omitted: the bundled Alpine (no registry).}{cloud: Required on cloud.}
    pub image: Option<ImageRef>,
    /// Virtual CPUs.
    #[schemars(range(min = 1, max = MAX_CPUS))]
    pub cpus: Option<u32>,
    /// Memory in MiB.
    #[schemars(range(min = MIN_MEMORY_MB, max = MAX_MEMORY_MB))]
    pub memory_mb: Option<u32>,
    /// Egress, blocked by default.{local: ask: refused hosts go to the user; only a yes widens it.}
    pub network: Option<Network>,
    /// Host names it may reach (like pypi.org).
    pub allow_hosts: Option<HostNames>,
    /// CIDR ranges it may reach (like 10.0.0.0/8).
    pub allow_cidrs: Option<CidrRanges>,
    /// {local:{creds:Secrets by name (see instructions); it sees placeholders only.}}
    pub credentials: Option<Vec<String>>,
    /// {dirs:Host dir the operator allows, copied to /workspace (git: its commit). See keep-changes.}
    pub workspace: Option<AbsolutePath>,
}

/// A command to run: shared by run-command and run-once.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandFields {
    /// An argv run as is, or a string for sh -c (pipes, redirects).
    pub command: crate::fleet::Command,
    /// Absolute working directory.
    pub workdir: Option<AbsolutePath>,
    /// Extra environment variables.
    pub env: Option<EnvVars>,
    /// Given on standard input, then closed.
    pub stdin: Option<String>,
    /// Seconds until killed (exit 124): default {execTimeoutSecs}, most {maxExecTimeoutSecs}.
    #[schemars(range(min = 1))]
    pub timeout_secs: Option<u64>,
}

tool_arguments! {
    flattening pub struct CreateArgs {
        #[serde(flatten)]
        pub machine: MachineBase,
        /// Omitted: ephemeral.
        pub name: Option<MachineName>,
        /// A base to fork: all its setup.
        pub base: Option<MachineRef>,
        /// TCP ports to publish, at most 16.{cloud: On cloud they need egress that is not blocked; the machine's url is the ingress once something listens.}
        pub ports: Option<Vec<PortArg>>,
        /// Disk size in GiB.
        #[schemars(range(min = 1, max = MAX_DISK_GB))]
        pub storage_gb: Option<u32>,
        /// {local:A machine (even deleted) whose user-allowed hosts it gets too.}
        pub allow_hosts_from: Option<GrantsOf>,
        /// {local:{dirs:Host dirs (absolute source) mounted at target, at most 16, as the operator allows (readonly: false too).}}
        pub mounts: Option<Vec<MountArg>>,
        /// {local:Writable layer over the image, GiB.}
        #[schemars(range(min = 1, max = MAX_DISK_GB))]
        pub overlay_gb: Option<u32>,
        /// For the workload and every command.
        pub env: Option<EnvVars>,
        /// Let branch-machine copy it.{cloud: Cannot be turned on later.}
        #[serde(default)]
        pub branchable: bool,
        /// False: left stopped.
        pub start: Option<bool>,
    }
}

tool_arguments! {
    pub struct StartArgs {
        /// Machine name{cloud: or mach- id}.
        pub name: MachineRef,
        /// False: answer at once, boot under way.
        pub wait: Option<bool>,
        /// {local:Start it copyable by branch-machine. Omitted: as last started.}
        pub branchable: Option<bool>,
    }
}

tool_arguments! {
    flattening pub struct RunCommandArgs {
        /// Machine name{cloud: or mach- id}.
        pub name: MachineRef,
        #[serde(flatten)]
        pub run: CommandFields,
        /// Return at once with a job id. No stdin; timeout default and most {maxJobSecs}.
        pub background: Option<bool>,
        /// Also answer what it cost (slower).
        pub usage: Option<bool>,
    }
}

tool_arguments! {
    flattening pub struct RunOnceArgs {
        #[serde(flatten)]
        pub machine: MachineBase,
        #[serde(flatten)]
        pub run: CommandFields,
    }
}

tool_arguments! {
    pub struct ReadFileArgs {
        /// Machine name{cloud: or mach- id}.
        pub name: MachineRef,
        /// Absolute path in the machine.
        pub path: AbsolutePath,
        /// utf8 (default) or base64 for bytes.
        pub encoding: Option<Encoding>,
        /// Byte to start at. Default 0.
        pub offset: Option<u64>,
        /// Bytes to return. Default and most: a page.
        #[schemars(range(min = 1))]
        pub length: Option<u64>,
        /// {dirs:With path /workspace: its changes there (files, sizes, unified diff).}
        pub changes: Option<bool>,
    }
}

tool_arguments! {
    pub struct WriteFileArgs {
        /// Machine name{cloud: or mach- id}.
        pub name: MachineRef,
        /// Absolute path in the machine.
        pub path: AbsolutePath,
        /// The whole content, in encoding.
        pub content: String,
        /// utf8 (default) or base64 for bytes.
        #[serde(default)]
        pub encoding: Encoding,
    }
}

tool_arguments! {
    pub struct BranchArgs {
        /// The running, branchable source, or a base.
        pub name: MachineRef,
        /// Starting mcp-: ephemeral.
        pub child_name: MachineName,
        /// Let the child be branched in turn.
        #[serde(default)]
        pub branchable: bool,
        /// Wait until they run commands (default).
        pub wait: Option<bool>,
        /// 1 to 8 children, named childName-1...; all or none.
        #[schemars(range(min = 1, max = MAX_CHILDREN))]
        pub count: Option<u64>,
        /// Per child, in order: variables in /etc/smol/branch-env.
        pub env: Option<Vec<EnvVars>>,
        /// Make the source a base (runs nothing more; {baseIdle}).
        pub freeze_source: Option<bool>,
    }
}

/// The children one branch-machine call makes at most.
pub const MAX_CHILDREN: u64 = 8;

tool_arguments! {
    pub struct KeepArgs {
        /// Machine name{cloud: or mach- id}.
        pub name: MachineRef,
        /// Commit message.
        pub message: String,
        /// New branch; default smol/<name>.
        pub branch: Option<String>,
        /// Also delete its source's other children.
        pub delete_siblings: Option<bool>,
    }
}

tool_arguments! {
    pub struct LogsArgs {
        /// Machine name{cloud: or mach- id}.
        pub name: MachineRef,
        /// Lines from the end (without cursor).
        #[schemars(range(min = 1, max = MAX_LOG_TAIL))]
        pub tail: Option<u64>,
        /// The last answer's: only what came since.
        pub cursor: Option<String>,
        /// {local:workload (default) or engine (this boot's agent log).}
        pub source: Option<LogSourceArg>,
    }
}

tool_arguments! {
    pub struct JobOutputArgs {
        /// From run-command; omitted: the list of jobs.
        pub job: Option<String>,
        /// The last answer's; omitted: from the start.
        pub cursor: Option<String>,
        /// Wait up to this for the end (under your call timeout, often 60 s).
        #[schemars(range(min = 0, max = MAX_JOB_WAIT_SECS))]
        pub wait_secs: Option<u64>,
    }
}

tool_arguments! {
    pub struct JobArgs {
        /// From run-command.
        pub job: String,
    }
}

tool_arguments! {
    pub struct StopArgs {
        /// Machine name.
        pub name: MachineRef,
        /// {local:Keep memory and processes (started branchable only); the next call resumes it.}{cloud:Refused: the cloud has no pause.}
        #[serde(default)]
        pub pause: bool,
    }
}

tool_arguments! {
    pub struct PublishArgs {
        /// Machine name.
        pub name: MachineRef,
        /// Guest TCP port; the service must bind 0.0.0.0.
        #[schemars(range(min = 1, max = 65535))]
        pub port: u32,
        /// {local:Omitted: a free one.}{cloud:Refused: the cloud picks.}
        #[schemars(range(min = 1, max = 65535))]
        pub host_port: Option<u32>,
        /// Wait for a listener, s (default 30; 0: none).
        #[schemars(range(min = 0, max = 600))]
        pub wait_secs: Option<u32>,
    }
}

tool_arguments! {
    pub struct TerminalArgs {
        /// Machine name.
        pub name: MachineRef,
        /// Omitted: open one.
        pub terminal: Option<String>,
        /// Program (default sh): argv, or a string for sh -c.
        pub command: Option<crate::fleet::Command>,
        /// Typed as is.
        pub input: Option<String>,
        /// Then pressed: enter, tab, escape, up, down, ctrl-c...
        pub keys: Option<Vec<String>>,
        /// With rows, resizes an open one.
        #[schemars(range(min = 10, max = 500))]
        pub cols: Option<u32>,
        /// Screen height.
        #[schemars(range(min = 2, max = 200))]
        pub rows: Option<u32>,
        /// Default: after the last read.
        pub cursor: Option<u64>,
        /// Most ms to wait (default 2000).
        #[schemars(range(min = 0, max = 60000))]
        pub wait_ms: Option<u32>,
        /// Keep escape sequences.
        #[serde(default)]
        pub raw: bool,
        /// End it and its program.
        #[serde(default)]
        pub close: bool,
        /// Also the painted screen.
        #[serde(default)]
        pub screen: bool,
    }
}

/// Which view a `view-state` call serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ViewName {
    Machines,
    Egress,
    Terminal,
}

/// The person's answer to an egress question, as the egress view sends it: the question's id,
/// its state as listed, and the destinations allowed (the rest are declined).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ViewAnswer {
    pub question: String,
    pub state: String,
    pub allowed: Vec<String>,
}

tool_arguments! {
    pub struct ViewArgs {
        /// Which.
        pub view: ViewName,
        /// terminal: its machine.
        pub name: Option<MachineRef>,
        /// terminal: its id.
        pub terminal: Option<String>,
        /// terminal: wait until it prints past this.
        pub after: Option<u64>,
        /// terminal: typed.
        pub input: Option<String>,
        /// terminal: pressed.
        pub keys: Option<Vec<String>>,
        /// egress: {question, state, allowed}.
        #[schemars(with = "Option<serde_json::Map<String, serde_json::Value>>")]
        pub answer: Option<ViewAnswer>,
    }
}

tool_arguments! {
    pub struct PullArgs {
        /// A running machine.
        pub name: MachineRef,
        /// OCI image reference.
        pub image: ImageRef,
    }
}

/// What the call's plumbing reads of a tool's parsed arguments, so that nothing reads the wire's
/// JSON beside the parse: the machines a call names (each held for the call's length: its lease
/// renewed, the reaper waiting) and its command's timeout (a task's TTL follows it).
/// Every tool's arguments name the fleet they go to (`target`).
pub trait Targeted {
    fn target(&self) -> Option<FleetKind>;
}

pub trait CallArgs: Targeted {
    /// The machines the call names: `name`, and `childName` for a branch.
    fn machines(&self) -> [Option<Named<'_>>; 2] {
        [None, None]
    }

    fn timeout_secs(&self) -> Option<u64> {
        None
    }
}

impl CallArgs for TargetOnly {}
impl CallArgs for ListArgs {
    fn machines(&self) -> [Option<Named<'_>>; 2] {
        [self.name.as_ref().map(Named::Existing), None]
    }
}
impl CallArgs for JobOutputArgs {}
impl CallArgs for JobArgs {}
impl CallArgs for ViewArgs {
    fn machines(&self) -> [Option<Named<'_>>; 2] {
        [self.name.as_ref().map(Named::Existing), None]
    }
}

/// Tools whose arguments name one machine, and nothing else the plumbing reads.
macro_rules! names_a_machine {
    ($($args:ty),+) => {$(
        impl CallArgs for $args {
            fn machines(&self) -> [Option<Named<'_>>; 2] {
                [Some(Named::Existing(&self.name)), None]
            }
        }
    )+};
}

names_a_machine!(
    MachineArgs,
    StartArgs,
    ReadFileArgs,
    WriteFileArgs,
    LogsArgs,
    PullArgs,
    PublishArgs,
    TerminalArgs,
    StopArgs,
    KeepArgs
);

impl CallArgs for CreateArgs {
    fn machines(&self) -> [Option<Named<'_>>; 2] {
        match &self.base {
            // A child of the base: the base is checked as branch-machine's source is.
            Some(base) => [
                Some(Named::Existing(base)),
                self.name.as_deref().map(Named::New),
            ],
            None => [self.name.as_deref().map(Named::New), None],
        }
    }
}

impl CallArgs for RunCommandArgs {
    fn machines(&self) -> [Option<Named<'_>>; 2] {
        [Some(Named::Existing(&self.name)), None]
    }

    fn timeout_secs(&self) -> Option<u64> {
        self.run.timeout_secs
    }
}

impl CallArgs for RunOnceArgs {
    fn timeout_secs(&self) -> Option<u64> {
        self.run.timeout_secs
    }
}

impl CallArgs for BranchArgs {
    fn machines(&self) -> [Option<Named<'_>>; 2] {
        [
            Some(Named::Existing(&self.name)),
            Some(Named::New(&self.child_name)),
        ]
    }
}

// ---- checks ----

pub fn range(arg: &str, value: u64, min: u64, max: u64) -> Result<(), ToolError> {
    if value < min || value > max {
        return Err(ToolError::argument(
            arg,
            format!("{value} is out of range: give {min} to {max}"),
        ));
    }
    Ok(())
}

pub fn port(arg: &str, port: u32) -> Result<u16, ToolError> {
    u16::try_from(port)
        .ok()
        .filter(|p| *p >= 1)
        .ok_or_else(|| ToolError::argument(arg, format!("{port} is not a port: give 1 to 65535")))
}

pub fn command(
    arg: &str,
    command: &crate::fleet::Command,
) -> Result<crate::fleet::Command, ToolError> {
    use crate::fleet::Command;
    match command {
        Command::Argv(argv) if argv.is_empty() || argv[0].is_empty() => Err(ToolError::argument(
            arg,
            "an argv array needs at least the program, like [\"ls\", \"-l\"]",
        )),
        Command::Shell(s) if s.trim().is_empty() => Err(ToolError::argument(
            arg,
            "an empty string runs nothing: give a shell command",
        )),
        valid => Ok(valid.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tools::Catalog;
    use serde_json::json;

    fn refusal(tool: Tool, args: serde_json::Value) -> String {
        let catalog = Catalog::of(crate::process::Mode::Both);
        match tool {
            Tool::CreateMachine => {
                parse::<CreateArgs>(tool, Some(&catalog.input(tool)), catalog.mode, args)
                    .map(|_| ())
            }
            Tool::DeleteMachine => {
                parse::<MachineArgs>(tool, Some(&catalog.input(tool)), catalog.mode, args)
                    .map(|_| ())
            }
            Tool::RunCommand => {
                parse::<RunCommandArgs>(tool, Some(&catalog.input(tool)), catalog.mode, args)
                    .map(|_| ())
            }
            _ => Ok(()),
        }
        .unwrap_err()
        .message
    }

    #[test]
    fn refusals_are_in_the_schemas_words() {
        let unknown = refusal(Tool::CreateMachine, json!({"image": "a", "bogus": 1}));
        assert!(
            unknown.starts_with("bogus: not an argument of create-machine; its arguments are ")
                && unknown.contains("image"),
            "{unknown}"
        );
        assert_eq!(
            refusal(Tool::CreateMachine, json!({"image": "a", "cpus": "2"})),
            "cpus: \"2\" is not accepted: give a whole number, 1 to 64"
        );
        assert_eq!(
            refusal(Tool::CreateMachine, json!({"image": "a", "cpus": 65})),
            "cpus: 65 is out of range: give 1 to 64"
        );
        assert_eq!(
            refusal(Tool::CreateMachine, json!({"image": "a", "network": "off"})),
            "network: \"off\" is not accepted: give one of \"open\", \"blocked\", \"ask\""
        );
        let missing = refusal(Tool::DeleteMachine, json!({}));
        assert!(
            missing.starts_with("name: required, and missing: Machine name"),
            "{missing}"
        );
        assert_eq!(
            refusal(
                Tool::CreateMachine,
                json!({"image": "a", "ports": [{"guest": 80, "hots": 1}]})
            ),
            "ports[0].hots: not accepted here; the fields are guest, host"
        );
        assert_eq!(
            refusal(Tool::RunCommand, json!({"name": "m", "command": 7})),
            "command: 7 is not accepted: give an array, each item a string or a string"
        );
        assert_eq!(
            refusal(Tool::RunCommand, json!({"name": "m", "command": ["a", 1]})),
            "command[1]: 1 is not accepted: give a string"
        );
        assert_eq!(
            refusal(
                Tool::RunCommand,
                json!({"name": "m", "command": {"a": "b"}})
            ),
            r#"command: {"a":"b"} is not accepted: give an array, each item a string or a string"#
        );
        assert_eq!(
            refusal(
                Tool::RunCommand,
                json!({"name": "m", "command": "x", "env": {"A": 1}})
            ),
            "env.A: 1 is not accepted: give a string"
        );
    }

    #[test]
    fn a_tool_without_arguments_says_so() {
        let catalog = Catalog::of(Mode::Single(FleetKind::Local));
        let refused = parse::<TargetOnly>(
            Tool::ListMachines,
            Some(&serde_json::Map::new()),
            catalog.mode,
            json!({"bogus": 1}),
        )
        .unwrap_err()
        .message;
        assert_eq!(
            refused,
            "bogus: not an argument of list-machines; it takes no arguments"
        );
        // With both fleets `target` is its one argument, and it is listed.
        let catalog = Catalog::of(Mode::Both);
        let refused = parse::<TargetOnly>(
            Tool::ListMachines,
            Some(&catalog.input(Tool::ListMachines)),
            catalog.mode,
            json!({"bogus": 1}),
        )
        .unwrap_err()
        .message;
        assert_eq!(
            refused,
            "bogus: not an argument of list-machines; its arguments are name, target"
        );
    }

    #[test]
    fn checks() {
        assert_eq!(
            port("ports[0].guest", 70000).unwrap_err().message,
            "ports[0].guest: 70000 is not a port: give 1 to 65535"
        );
        assert!(command("command", &crate::fleet::Command::Argv(vec![])).is_err());
    }
}
