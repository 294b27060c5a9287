//! The MCP resources: `smol://targets` (which fleets this host can use now), and two templates
//! over machines, `smol://machine/{target}/{name}/logs` and `smol://machine/{target}/{name}/file{+path}`,
//! with completions for their arguments and log following (`follow`).
//!
//! The target segment is always there, in single-fleet mode too: a URI then means the same on
//! every server, and one naming a fleet this server does not serve gets an error that says so.
//! Reads go through the tools (machine-logs, read-file), so a resource and a tool call answer
//! alike: the same argument checks, readiness waits and bounded memory.

use crate::fleet::FleetKind;
use crate::policy::error::quote;
use crate::policy::tools::{self, Tool, ToolError, ToolErrorKind};
use crate::policy::user::User;
use crate::process::Mode;
use crate::process::targets;
use crate::protocol::{Protocol, follow};
use crate::store::{RunDetail, RunSummary, StreamRecord};
use base64::Engine as _;
use rmcp::ErrorData;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, CompletionInfo, MetaObject, Reference, Resource,
    ResourceContents, ResourceTemplate,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

pub const TARGETS_URI: &str = "smol://targets";
pub const LOGS_TEMPLATE: &str = "smol://machine/{target}/{name}/logs";
pub const FILE_TEMPLATE: &str = "smol://machine/{target}/{name}/file{+path}";
pub const RUNS_URI: &str = "smol://runs";
pub const RUN_TEMPLATE: &str = "smol://runs/{id}";
const MACHINE_PREFIX: &str = "smol://machine/";

/// How many machine names a completion offers at most (the spec's limit is 100).
const MAX_COMPLETIONS: usize = 100;

/// A resource URI, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceUri {
    Targets,
    Logs {
        kind: FleetKind,
        name: String,
    },
    File {
        kind: FleetKind,
        name: String,
        path: String,
    },
    /// A page of the run ledger: runs older than `before` (the newest when `None`).
    Runs {
        before: Option<i64>,
        limit: usize,
    },
    Run {
        id: i64,
    },
}

impl ResourceUri {
    /// Reads a URI this server offers. Unknown shapes are "not found" (-32002); a known shape
    /// with a bad segment names the segment and what it accepts.
    pub fn parse(uri: &str, mode: Mode) -> Result<ResourceUri, ErrorData> {
        if uri == TARGETS_URI {
            return Ok(ResourceUri::Targets);
        }
        if let Some(runs) = parse_runs(uri)? {
            return Ok(runs);
        }
        let unknown = || {
            ErrorData::resource_not_found(
                format!(
                    "no resource {}: this server offers {TARGETS_URI}, {LOGS_TEMPLATE}, \
                     {FILE_TEMPLATE}, {RUNS_URI} and {RUN_TEMPLATE}",
                    quote(uri)
                ),
                // SEP-2164: the error SHOULD carry the URI asked for, so that a client reading
                // several can tell which one is missing.
                Some(serde_json::json!({ "uri": uri })),
            )
        };
        let rest = uri.strip_prefix(MACHINE_PREFIX).ok_or_else(unknown)?;
        let mut parts = rest.splitn(3, '/');
        let (Some(target), Some(name), Some(what)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(unknown());
        };
        let kind = target_kind(target, mode)?;
        let name = percent_decode(name);
        tools::grammar::machine_ref("name", &name).map_err(argument_error)?;
        if what == "logs" {
            return Ok(ResourceUri::Logs { kind, name });
        }
        let Some(path) = what.strip_prefix("file") else {
            return Err(unknown());
        };
        let path = percent_decode(path);
        tools::grammar::absolute_path("path", &path).map_err(argument_error)?;
        Ok(ResourceUri::File { kind, name, path })
    }
}

/// `smol://runs`, `smol://runs?before=ID&limit=N` and `smol://runs/{id}`; `None` for other URIs.
fn parse_runs(uri: &str) -> Result<Option<ResourceUri>, ErrorData> {
    let Some(rest) = uri.strip_prefix(RUNS_URI) else {
        return Ok(None);
    };
    let id = |what: &str, text: &str| {
        text.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
            ErrorData::invalid_params(
                format!(
                    "{what}: {} is not a run id; give the id of a run as smol://runs lists it \
                     (a whole number)",
                    quote(text)
                ),
                None,
            )
        })
    };
    if let Some(text) = rest.strip_prefix('/') {
        return Ok(Some(ResourceUri::Run {
            id: id("id", text)?,
        }));
    }
    let query = match rest {
        "" => "",
        _ => match rest.strip_prefix('?') {
            Some(query) => query,
            None => return Ok(None),
        },
    };
    let (mut before, mut limit) = (None, crate::policy::ledger::PAGE_DEFAULT);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "before" => before = Some(id("before", value)?),
            "limit" => {
                limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=crate::policy::ledger::PAGE_MAX).contains(n))
                    .ok_or_else(|| {
                        ErrorData::invalid_params(
                            format!(
                                "limit: {} is not accepted: give 1 to {}",
                                quote(value),
                                crate::policy::ledger::PAGE_MAX
                            ),
                            None,
                        )
                    })?
            }
            other => {
                return Err(ErrorData::invalid_params(
                    format!(
                        "{}: smol://runs takes only before (a run id: the runs older than it) \
                         and limit (1 to {})",
                        quote(other),
                        crate::policy::ledger::PAGE_MAX
                    ),
                    None,
                ));
            }
        }
    }
    Ok(Some(ResourceUri::Runs { before, limit }))
}

/// The URI of a machine's logs, as `follow` and clients name it.
pub fn logs_uri(kind: FleetKind, name: &str) -> String {
    format!("{MACHINE_PREFIX}{}/{name}/logs", kind.as_str())
}

fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

fn served(mode: Mode) -> Vec<FleetKind> {
    match mode {
        Mode::Both => FleetKind::ALL.to_vec(),
        Mode::Single(kind) => vec![kind],
    }
}

fn target_kind(target: &str, mode: Mode) -> Result<FleetKind, ErrorData> {
    let kind = match FleetKind::parse(target) {
        Some(kind) => kind,
        None => {
            let other = target;
            return Err(ErrorData::invalid_params(
                format!(
                    "target: {} is not a fleet; give local or cloud",
                    quote(other)
                ),
                None,
            ));
        }
    };
    match mode {
        Mode::Single(served) if served != kind => Err(ErrorData::invalid_params(
            format!(
                "target: this server serves only the {} fleet, so {} machines cannot be read \
                 here; use smol://machine/{}/...",
                served.as_str(),
                kind.as_str(),
                served.as_str()
            ),
            None,
        )),
        _ => Ok(kind),
    }
}

fn argument_error(e: ToolError) -> ErrorData {
    ErrorData::invalid_params(e.message, None)
}

/// A tool's error as a protocol error: a missing machine or file is "resource not found".
fn tool_error(e: ToolError) -> ErrorData {
    match e.kind {
        ToolErrorKind::Fleet(crate::fleet::ErrorKind::NotFound) => {
            ErrorData::resource_not_found(e.to_string(), None)
        }
        ToolErrorKind::InvalidArgument => ErrorData::invalid_params(e.to_string(), None),
        _ => ErrorData::internal_error(e.to_string(), None),
    }
}

/// The resources; the run ledger's only while it is on.
pub fn list(protocol: &Protocol) -> Vec<Resource> {
    let mut resources = vec![
        Resource::new(TARGETS_URI, "targets")
            .with_title("Fleets usable from this host")
            .with_description(
                "For each fleet this server serves, whether it can be used now and what is in \
                 the way: locally the smolvm engine (where it was found, its version against the \
                 floor), KVM or Hypervisor.framework, the runtime directory; on cloud the URL, \
                 whether a token is set and whether the account answers. Read it before choosing \
                 a target, or when machines fail to start.",
            )
            .with_mime_type("application/json"),
    ];
    if protocol.policy.ledger.keeps_runs() {
        resources.push(
            Resource::new(RUNS_URI, "runs")
                .with_title("Commands run, newest first")
                .with_description(format!(
                    "The run ledger: every command run-command and run-once ran through this \
                     server, kept across restarts, newest first: tool, fleet, machine, command, \
                     start and end, outcome, exit code, bytes of output. {} a page; `next` is the \
                     URI of the page after (smol://runs?before=ID, with &limit=N up to {}). Read \
                     smol://runs/{{id}} for a run's output.",
                    crate::policy::ledger::PAGE_DEFAULT,
                    crate::policy::ledger::PAGE_MAX
                ))
                .with_mime_type("application/json"),
        );
    }
    resources
}

pub fn templates(mode: Mode) -> Vec<ResourceTemplate> {
    let targets: Vec<&str> = served(mode).into_iter().map(FleetKind::as_str).collect();
    let targets = targets.join(" or ");
    vec![
        ResourceTemplate::new(LOGS_TEMPLATE, "machine-logs")
            .with_title("A machine's log")
            .with_description(format!(
                "The newest lines of a machine's log (target: {targets}): the guest console \
                 locally, the control plane's event log on cloud. Subscribe to it to be told \
                 when new lines arrive; machine-logs with its cursor returns only those."
            ))
            .with_mime_type("text/plain"),
        ResourceTemplate::new(FILE_TEMPLATE, "machine-file")
            .with_title("A file in a machine")
            .with_description(format!(
                "A file in a machine (target: {targets}; path is absolute, e.g. \
                 smol://machine/{}/box/file/etc/hostname): text when its bytes are UTF-8, else a \
                 base64 blob. Only the first part of a large file is returned, with a note; page \
                 through the rest with the read-file tool.",
                served(mode)[0].as_str()
            )),
        ResourceTemplate::new(RUN_TEMPLATE, "run")
            .with_title("One command run")
            .with_description(
                "One run from the run ledger (ids come from smol://runs): the command, its \
                 working directory and environment variable names (never their values), start, \
                 end, outcome, exit code, and the head and tail of its stdout and stderr.",
            )
            .with_mime_type("application/json"),
    ]
}

/// The arguments of a tool call for `name` on `kind`: `target` only where the tools take one.
fn tool_args(mode: Mode, kind: FleetKind, name: &str) -> serde_json::Map<String, Value> {
    let mut args = serde_json::Map::new();
    if mode == Mode::Both {
        args.insert("target".into(), json!(kind.as_str()));
    }
    args.insert("name".into(), json!(name));
    args
}

/// Reads one resource.
pub async fn read(
    protocol: &Arc<Protocol>,
    session: &str,
    user: &User,
    ct: CancellationToken,
    uri: &str,
) -> Result<Vec<ResourceContents>, ErrorData> {
    match ResourceUri::parse(uri, protocol.mode())? {
        ResourceUri::Targets => {
            let facts = targets::gather(
                protocol.config(),
                protocol.mode(),
                protocol.process().cloud(),
                &targets::Host::this_host(),
            )
            .await;
            let text = serde_json::to_string_pretty(&facts)
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
            Ok(vec![
                ResourceContents::text(text, uri).with_mime_type("application/json"),
            ])
        }
        ResourceUri::Logs { kind, name } => {
            let args = tool_args(protocol.mode(), kind, &name);
            let answer = tools::call(
                &protocol.policy,
                caller(protocol.mode(), session, user, ct),
                Tool::MachineLogs,
                Value::Object(args),
            )
            .await
            .map_err(tool_error)?;
            let lines: Vec<&str> = answer.structured["lines"]
                .as_array()
                .map(|l| l.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut meta = serde_json::Map::new();
            for key in ["cursor", "truncated", "gap"] {
                if let Some(v) = answer.structured.get(key) {
                    meta.insert(key.into(), v.clone());
                }
            }
            Ok(vec![
                ResourceContents::text(lines.join("\n"), uri).with_meta(MetaObject(meta)),
            ])
        }
        ResourceUri::File { kind, name, path } => {
            read_file(protocol, session, user, ct, uri, kind, &name, &path).await
        }
        ResourceUri::Runs { before, limit } => {
            let crate::store::RunPage { runs, more } = protocol
                .policy
                .ledger
                .page(before, limit, user)
                .await
                .map_err(ledger_error)?;
            let next = match runs.last() {
                Some(oldest) if more => {
                    json!(format!("{RUNS_URI}?before={}&limit={limit}", oldest.id))
                }
                _ => Value::Null,
            };
            let page = json!({
                "runs": runs.iter().map(run_summary_json).collect::<Vec<_>>(),
                "next": next,
                "droppedRecords": protocol.policy.ledger.dropped(),
            });
            json_contents(&page, uri)
        }
        ResourceUri::Run { id } => {
            match protocol
                .policy
                .ledger
                .run(id, user)
                .await
                .map_err(ledger_error)?
            {
                Some(run) => json_contents(&run_detail_json(&run), uri),
                None => Err(ErrorData::resource_not_found(
                    format!(
                        "no run {id} in the run ledger (it may have been pruned); smol://runs lists \
                     the runs kept"
                    ),
                    Some(json!({ "uri": uri })),
                )),
            }
        }
    }
}

/// A run's start or end as RFC 3339 text.
fn run_time(ms: i64) -> Value {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| Value::from(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)))
        .unwrap_or(Value::Null)
}

fn run_command_json(run: &RunSummary) -> Value {
    if run.command_kind == "argv" {
        serde_json::from_str(&run.command).unwrap_or_else(|_| Value::from(run.command.clone()))
    } else {
        Value::from(run.command.clone())
    }
}

/// A run as `smol://runs` lists it.
fn run_summary_json(run: &RunSummary) -> Value {
    json!({
        "id": run.id.to_string(),
        "uri": format!("smol://runs/{}", run.id),
        "tool": run.tool,
        "fleet": run.fleet,
        "machine": run.machine,
        "command": run_command_json(run),
        "startedAt": run_time(run.started_ms),
        "endedAt": run.ended_ms.map_or(Value::Null, run_time),
        "durationMs": run.ended_ms.map(|end| end - run.started_ms),
        "outcome": run.outcome,
        "exitCode": run.exit_code,
        "timedOut": run.timed_out,
        "stdoutBytes": run.stdout_bytes,
        "stderrBytes": run.stderr_bytes,
    })
}

/// A run as `smol://runs/{id}` shows it.
fn run_detail_json(run: &RunDetail) -> Value {
    let mut value = run_summary_json(&run.summary);
    let stream = |s: &Option<StreamRecord>| {
        s.as_ref().map_or(Value::Null, |s| {
            json!({
                "bytes": s.bytes,
                "head": s.head,
                "tail": s.tail,
                "droppedBytes": s.dropped,
            })
        })
    };
    if let Value::Object(map) = &mut value {
        map.insert("workdir".into(), json!(run.workdir));
        map.insert(
            "envNames".into(),
            serde_json::from_str(&run.env_names).unwrap_or(Value::Array(vec![])),
        );
        map.insert("error".into(), json!(run.error));
        map.insert("stdout".into(), stream(&run.stdout));
        map.insert("stderr".into(), stream(&run.stderr));
        map.insert(
            "usage".into(),
            run.usage
                .as_deref()
                .and_then(|u| serde_json::from_str(u).ok())
                .unwrap_or(Value::Null),
        );
    }
    value
}

fn ledger_error(e: crate::policy::ledger::LedgerError) -> ErrorData {
    ErrorData::internal_error(e.to_string(), None)
}

fn json_contents(value: &Value, uri: &str) -> Result<Vec<ResourceContents>, ErrorData> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
    Ok(vec![
        ResourceContents::text(text, uri).with_mime_type("application/json"),
    ])
}

/// A resource read runs its tool in the process's scope: its URI names the fleet. It makes no
/// machine and reports no progress.
fn caller(mode: Mode, session: &str, user: &User, ct: CancellationToken) -> tools::Caller {
    tools::Caller::new(session, tools::Scope::Process(mode), ct).for_user(user.clone())
}

/// The first `maxOutputBytes` of a file, read through read-file (one page in memory, whatever
/// the file's size), as text when they are UTF-8 and as a blob otherwise.
#[allow(clippy::too_many_arguments)]
async fn read_file(
    protocol: &Arc<Protocol>,
    session: &str,
    user: &User,
    ct: CancellationToken,
    uri: &str,
    kind: FleetKind,
    name: &str,
    path: &str,
) -> Result<Vec<ResourceContents>, ErrorData> {
    let limit = protocol.config().max_output_bytes;
    let mut args = tool_args(protocol.mode(), kind, name);
    args.insert("path".into(), json!(path));
    args.insert("encoding".into(), json!("base64"));
    args.insert("length".into(), json!(limit));
    let answer = tools::call(
        &protocol.policy,
        caller(protocol.mode(), session, user, ct),
        Tool::ReadFile,
        Value::Object(args),
    )
    .await
    .map_err(tool_error)?;
    let page = answer.page.unwrap_or_default();
    let mut bytes = base64::engine::general_purpose::STANDARD
        .decode(page.trim())
        .map_err(|e| ErrorData::internal_error(format!("read-file's page: {e}"), None))?;
    let size = answer.structured["size"].as_u64().unwrap_or(0);
    let mut truncated = answer.structured["eof"] == json!(false);
    // A cut through the middle of a character is still text: keep the whole characters.
    let text = match std::str::from_utf8(&bytes) {
        Ok(_) => true,
        Err(e) if truncated && e.error_len().is_none() => {
            bytes.truncate(e.valid_up_to());
            true
        }
        Err(_) => false,
    };
    truncated = truncated || (bytes.len() as u64) < size;
    let mut meta = serde_json::Map::new();
    meta.insert("size".into(), json!(size));
    meta.insert("bytes".into(), json!(bytes.len()));
    meta.insert("truncated".into(), json!(truncated));
    let meta = MetaObject(meta);
    let first = if text {
        ResourceContents::text(String::from_utf8_lossy(&bytes).into_owned(), uri)
    } else {
        ResourceContents::blob(
            base64::engine::general_purpose::STANDARD.encode(&bytes),
            uri,
        )
        .with_mime_type("application/octet-stream")
    }
    .with_meta(meta);
    let mut contents = vec![first];
    if truncated {
        contents.push(ResourceContents::text(
            format!(
                "Truncated: this is the first {} of {size} bytes of {path}. Read the rest with \
                 the read-file tool (name {name}, path {path}, offset {}), page by page.",
                bytes.len(),
                bytes.len()
            ),
            uri,
        ));
    }
    Ok(contents)
}

/// completion/complete for the template arguments: `target` from the served fleets, `name`
/// from the user's machines on the fleet already chosen (or on each served fleet when none is).
pub async fn complete(
    protocol: &Arc<Protocol>,
    request: &CompleteRequestParams,
    user: &User,
) -> Result<CompleteResult, ErrorData> {
    let Reference::Resource(template) = &request.r#ref else {
        return Ok(CompleteResult::default());
    };
    if template.uri != LOGS_TEMPLATE && template.uri != FILE_TEMPLATE {
        return Err(ErrorData::invalid_params(
            format!(
                "ref.uri: {} is not one of this server's templates ({LOGS_TEMPLATE}, \
                 {FILE_TEMPLATE})",
                quote(&template.uri)
            ),
            None,
        ));
    }
    let prefix = request.argument.value.as_str();
    let values: Vec<String> = match request.argument.name.as_str() {
        "target" => served(protocol.mode())
            .into_iter()
            .map(|k| k.as_str().to_owned())
            .filter(|t| t.starts_with(prefix))
            .collect(),
        "name" => {
            let chosen = request
                .context
                .as_ref()
                .and_then(|c| c.arguments.as_ref())
                .and_then(|a| a.get("target"));
            let kinds: Vec<FleetKind> = match chosen.map(String::as_str) {
                Some(t) => vec![target_kind(t, protocol.mode())?],
                None => served(protocol.mode()),
            };
            let mut names = Vec::new();
            for kind in kinds {
                // A fleet that cannot be reached has no names to offer; completion is a hint.
                // Under sign-in, only the user's own: a name is the first step to a machine.
                if let Ok(fleet) = protocol.process().fleet(kind).await
                    && let Ok(machines) = fleet.list().await
                {
                    let machines = tools::users_machines(&protocol.policy, user, kind, machines)
                        .await
                        .map_err(tool_error)?;
                    names.extend(
                        machines
                            .into_iter()
                            .map(|m| m.name)
                            .filter(|n| n.starts_with(prefix)),
                    );
                }
            }
            names.sort();
            names.dedup();
            names
        }
        _ => Vec::new(),
    };
    let total = values.len();
    let values: Vec<String> = values.into_iter().take(MAX_COMPLETIONS).collect();
    let mut info =
        CompletionInfo::new(values).map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
    info.total = u32::try_from(total).ok();
    info.has_more = Some(total > MAX_COMPLETIONS);
    Ok(CompleteResult::new(info))
}

/// One session's log subscriptions (resources/subscribe); dropped with the session, which
/// unsubscribes them all.
#[derive(Default)]
pub struct SessionSubscriptions {
    following: Mutex<HashMap<String, follow::Following>>,
}

impl SessionSubscriptions {
    pub async fn subscribe(
        &self,
        protocol: &Arc<Protocol>,
        uri: &str,
        peer: rmcp::Peer<rmcp::RoleServer>,
        user: &User,
    ) -> Result<(), ErrorData> {
        let (kind, name) = followable(uri, protocol.mode())?;
        let held = match self.following.lock() {
            Ok(f) if f.contains_key(uri) => return Ok(()),
            Ok(f) => f.len(),
            Err(_) => 0,
        };
        let limit = protocol.config().max_subscriptions_per_session;
        if held >= limit {
            return Err(ErrorData::invalid_params(
                format!(
                    "uri: {} not followed: this session already follows {held} logs, its limit \
                     (maxSubscriptionsPerSession, SMOL_MCP_MAX_SUBSCRIPTIONS_PER_SESSION); \
                     unsubscribe from one first",
                    quote(uri)
                ),
                None,
            ));
        }
        machine_exists(protocol, kind, &name, uri, user).await?;
        let f = protocol
            .follow
            .follow(
                protocol.process(),
                kind,
                &name,
                uri,
                follow::Subscriber::Session(peer),
            )
            .await?;
        if let Ok(mut following) = self.following.lock() {
            // Subscribing twice is one subscription: a guard replaced here unsubscribes.
            following.insert(uri.to_owned(), f);
        }
        Ok(())
    }

    pub fn unsubscribe(&self, uri: &str) {
        if let Ok(mut following) = self.following.lock() {
            following.remove(uri);
        }
    }
}

/// Refuses to follow a machine the fleet says does not exist: a poller for a name that never
/// appears would cost the engine a request a second for nothing. A fleet that cannot answer
/// now is not a refusal; the poller tries again as it would for a log not there yet.
/// That the machine of a log to follow exists and is the user's (another user's answers as
/// one that does not exist).
async fn machine_exists(
    protocol: &Arc<Protocol>,
    kind: FleetKind,
    name: &str,
    uri: &str,
    user: &User,
) -> Result<(), ErrorData> {
    let theirs = tools::user_sees(&protocol.policy, user, kind, name)
        .await
        .map_err(tool_error)?;
    let found = if !theirs {
        tracing::warn!(%user, machine = %name, "refused to follow the log of a machine this user does not hold");
        Err(crate::fleet::FleetError::new(
            crate::fleet::ErrorKind::NotFound,
            name,
            "not this user's",
        ))
    } else {
        match protocol.process().fleet(kind).await {
            Ok(fleet) => fleet.get(name).await.map(|_| ()),
            Err(e) => Err(e),
        }
    };
    match found {
        Err(e) if e.kind == crate::fleet::ErrorKind::NotFound => {
            Err(ErrorData::resource_not_found(
                format!(
                    "uri: {} not followed: there is no machine {} on the {} fleet; \
                     list-machines gives the names",
                    quote(uri),
                    quote(name),
                    kind.as_str()
                ),
                Some(json!({ "uri": uri })),
            ))
        }
        Err(e) => {
            tracing::debug!(%uri, error = %e, "following a log whose machine could not be looked up");
            Ok(())
        }
        Ok(()) => Ok(()),
    }
}

/// The machine behind a logs URI; only logs can be followed.
pub fn followable(uri: &str, mode: Mode) -> Result<(FleetKind, String), ErrorData> {
    match ResourceUri::parse(uri, mode)? {
        ResourceUri::Logs { kind, name } => Ok((kind, name)),
        _ => Err(ErrorData::invalid_params(
            format!(
                "uri: only logs can be subscribed to ({LOGS_TEMPLATE}); {} does not change \
                 by itself",
                quote(uri)
            ),
            None,
        )),
    }
}

/// subscriptions/listen (2026-07-28): follows the accepted logs URIs until the listen ends.
/// rmcp has acknowledged the listen before this runs, so a refusal (too many URIs, an unknown
/// machine, the process's limit) is the listen's final answer, an error naming what was wrong.
pub async fn listen(
    protocol: &Arc<Protocol>,
    context: rmcp::service::SubscriptionContext,
    user: &User,
) -> Result<(), ErrorData> {
    let uris = context
        .accepted()
        .resource_subscriptions
        .clone()
        .unwrap_or_default();
    let limit = protocol.config().max_listen_uris;
    if uris.len() > limit {
        return Err(ErrorData::invalid_params(
            format!(
                "resourceSubscriptions: {} logs URIs in one listen; the limit is {limit} \
                 (maxListenUris, SMOL_MCP_MAX_LISTEN_URIS)",
                uris.len()
            ),
            None,
        ));
    }
    let mut following = Vec::new();
    for uri in uris {
        if let Ok((kind, name)) = followable(&uri, protocol.mode()) {
            machine_exists(protocol, kind, &name, &uri, user).await?;
            following.push(
                protocol
                    .follow
                    .follow(
                        protocol.process(),
                        kind,
                        &name,
                        &uri,
                        follow::Subscriber::Listen(context.sink().clone()),
                    )
                    .await?,
            );
        }
    }
    context.cancelled().await;
    drop(following);
    Ok(())
}

/// Which of the URIs a listen asked for can be followed: logs URIs of a served fleet.
pub fn accepted_filter(
    requested: &rmcp::model::SubscriptionFilter,
    mode: Mode,
) -> rmcp::model::SubscriptionFilter {
    let uris: Vec<String> = requested
        .resource_subscriptions
        .iter()
        .flatten()
        .filter(|uri| followable(uri, mode).is_ok())
        .cloned()
        .collect();
    let mut filter = rmcp::model::SubscriptionFilter::new();
    if !uris.is_empty() {
        filter.resource_subscriptions = Some(uris);
    }
    filter
}
