//! A tool's definition as `tools/list` shows it: input and output schemas derived from the
//! argument and result types, then simplified for portability (no `type` arrays, no `$defs`, no
//! non-standard formats), and the annotations from the tool table.

use super::Tool;
use crate::fleet::FleetKind;
use crate::process::Mode;
use rmcp::model::{JsonObject, ToolAnnotations};
use schemars::JsonSchema;
use schemars::generate::{Contract, SchemaSettings};
use serde_json::Value;
use std::sync::Arc;

/// The arguments' schema, with `target` an optional property whatever the mode.
pub fn input<T: JsonSchema>() -> JsonObject {
    let mut input = schema::<T>(Contract::Deserialize);
    // A flattened group's own doc would surface as the whole object's description; the tool's
    // description is what says what the arguments are for.
    input.remove("description");
    if let Some(Value::Object(target)) = input
        .get_mut("properties")
        .and_then(|p| p.get_mut("target"))
    {
        target.insert(
            "description".into(),
            Value::String(super::args::TARGET_DESCRIPTION.into()),
        );
    }
    input
}

/// `input` with the optional `idempotencyKey` every creating or changing tool takes.
pub fn with_idempotency_key(tool: Tool, mut input: JsonObject) -> JsonObject {
    use crate::policy::idempotency::{KEY_ARGUMENT, KEY_DESCRIPTION};
    // Listed where a retry could act twice. An idempotent tool takes a key all the same (the
    // call's plumbing takes it out before the arguments are checked), but repeating it changes
    // nothing more, so the catalog does not spend 70 bytes a tool saying so.
    if !tool.changes_machines() || tool.hints().idempotent {
        return input;
    }
    if let Some(Value::Object(props)) = input.get_mut("properties") {
        props.insert(
            KEY_ARGUMENT.into(),
            // Its length and characters are checked with a refusal that says what is accepted
            // (`idempotency::take_key`); the catalog spends no bytes on it ten times over.
            serde_json::json!({
                "type": "string",
                "description": KEY_DESCRIPTION,
            }),
        );
    }
    input
}

/// The result's schema, trimmed of what only repeats: a result object's own description (the
/// tool's description says what the result is) and the numeric bounds of fields this server
/// fills itself. Field descriptions that say what a value means stay.
pub fn output<T: JsonSchema>() -> JsonObject {
    let mut output = schema::<T>(Contract::Serialize);
    // MCP wants an object schema at the top; a result that is one of several objects
    // (run-command's) comes out of schemars as a bare anyOf.
    if !output.contains_key("type") {
        output.insert("type".into(), Value::String("object".into()));
    }
    let mut value = Value::Object(std::mem::take(&mut output));
    trim_output(&mut value);
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

/// Removes `additionalProperties: false` wherever it is (an env map's `additionalProperties`
/// schema stays: it says what the values are).
fn without_closed_objects(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.get("additionalProperties") == Some(&Value::Bool(false)) {
                map.remove("additionalProperties");
            }
            map.values_mut().for_each(without_closed_objects);
        }
        Value::Array(items) => items.iter_mut().for_each(without_closed_objects),
        _ => {}
    }
}

fn trim_output(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.get("type").and_then(Value::as_str) == Some("object") {
                map.remove("description");
            }
            map.remove("minimum");
            map.remove("maximum");
            map.values_mut().for_each(trim_output);
        }
        Value::Array(items) => items.iter_mut().for_each(trim_output),
        _ => {}
    }
}

fn schema<T: JsonSchema>(contract: Contract) -> JsonObject {
    let input = matches!(contract, Contract::Deserialize);
    let mut generator = SchemaSettings::draft2020_12()
        .with(|s| {
            s.inline_subschemas = true;
            s.contract = contract;
            s.meta_schema = None;
        })
        .into_generator();
    let mut value = generator.root_schema_for::<T>().to_value();
    if input {
        simplify(&mut value);
    } else {
        // Results really carry nulls (url locally, pid on cloud): keep them, as `anyOf` with a
        // `null` branch rather than a `type` array, which single-type dialects reject.
        drop_integer_formats(&mut value);
        nullable_as_any_of(&mut value);
    }
    if let Value::Object(map) = &mut value {
        map.remove("title");
        map.remove("$schema");
    }
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

/// Optional fields are optional by being absent from `required`; the `null` alternatives that
/// schemars adds for `Option` only make schemas harder for clients (type arrays are not portable).
fn simplify(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Array(types)) = map.get("type").cloned() {
                let rest: Vec<Value> = types.into_iter().filter(|t| t != "null").collect();
                if rest.len() == 1 {
                    map.insert("type".into(), rest[0].clone());
                } else {
                    map.insert("type".into(), Value::Array(rest));
                }
            }
            for key in ["anyOf", "oneOf"] {
                if let Some(Value::Array(branches)) = map.get(key).cloned() {
                    let rest: Vec<Value> = branches
                        .into_iter()
                        .filter(|b| b.get("type") != Some(&Value::String("null".into())))
                        .collect();
                    if rest.len() == 1 {
                        map.remove(key);
                        if let Value::Object(inner) = rest[0].clone() {
                            for (k, v) in inner {
                                map.entry(k).or_insert(v);
                            }
                        }
                    } else {
                        map.insert(key.into(), Value::Array(rest));
                    }
                }
            }
            if map
                .get("format")
                .and_then(Value::as_str)
                .is_some_and(|f| f.starts_with("uint") || f.starts_with("int"))
            {
                map.remove("format");
            }
            if let Some(Value::Array(options)) = map.get_mut("enum") {
                options.retain(|o| !o.is_null());
            }
            // `#[serde(default)]` on a flag shows as `"default": false`, what an absent boolean
            // means to everyone anyway.
            if map.get("type") == Some(&Value::String("boolean".into()))
                && map.get("default") == Some(&Value::Bool(false))
            {
                map.remove("default");
            }
            for child in map.values_mut() {
                simplify(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(simplify),
        _ => {}
    }
}

fn nullable_as_any_of(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.values_mut().for_each(nullable_as_any_of);
            let Some(Value::Array(types)) = map.get("type").cloned() else {
                return;
            };
            let rest: Vec<Value> = types.into_iter().filter(|t| t != "null").collect();
            if rest.len() != 1 {
                return;
            }
            map.remove("type");
            let mut branch = serde_json::Map::new();
            branch.insert("type".into(), rest[0].clone());
            let keys: Vec<String> = map
                .keys()
                .filter(|k| !matches!(k.as_str(), "description" | "title" | "default"))
                .cloned()
                .collect();
            for k in keys {
                if let Some(v) = map.remove(&k) {
                    branch.insert(k, v);
                }
            }
            map.insert(
                "anyOf".into(),
                serde_json::json!([Value::Object(branch), {"type": "null"}]),
            );
        }
        Value::Array(items) => items.iter_mut().for_each(nullable_as_any_of),
        _ => {}
    }
}

fn drop_integer_formats(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map
                .get("format")
                .and_then(Value::as_str)
                .is_some_and(|f| f.starts_with("uint") || f.starts_with("int"))
            {
                map.remove("format");
            }
            map.values_mut().for_each(drop_integer_formats);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_integer_formats),
        _ => {}
    }
}

/// Removes `target` in a single-fleet mode; requires it when both fleets are served.
fn apply_mode(mut input: JsonObject, mode: Mode) -> JsonObject {
    match mode {
        Mode::Single(_) => {
            if let Some(Value::Object(props)) = input.get_mut("properties") {
                props.remove("target");
            }
        }
        Mode::Both => {
            let required = input
                .entry("required")
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(list) = required
                && !list.iter().any(|v| v == "target")
            {
                list.insert(0, Value::String("target".into()));
            }
        }
    }
    input
}

/// Choices a shared argument type has that one tool refuses, not offered there (its handler
/// still refuses them by name): run-once's machine is gone when the call ends, so nobody is
/// left to ask about its refused hosts (`network: "ask"`).
const CHOICES_NOT_OFFERED: &[(Tool, &str, &str)] = &[(Tool::RunOnce, "network", "ask")];

/// The definition of `tool` for a process serving `mode` with `offers`.
pub fn definition(
    tool: Tool,
    mode: Mode,
    offers: Offers,
    input: JsonObject,
    output: JsonObject,
) -> rmcp::model::Tool {
    let hints = tool.hints();
    // The title once, on the tool: MCP reads it there before the annotations' copy.
    let mut annotations = ToolAnnotations::default();
    // Only what differs from the spec's defaults (readOnly false, destructive true, idempotent
    // false, openWorld true): a client reads the rest as those, and the destructive and
    // idempotent hints mean nothing for a read-only tool. Every hint of every tool costs the
    // model its bytes on every turn.
    annotations.read_only_hint = hints.read_only.then_some(true);
    if !hints.read_only {
        annotations.destructive_hint = (!hints.destructive).then_some(false);
        annotations.idempotent_hint = hints.idempotent.then_some(true);
    }
    annotations.open_world_hint = (!hints.open_world).then_some(false);
    let mut input = apply_mode(input, mode);
    if tool == Tool::ViewState {
        listed_as_outline(&mut input);
    }
    for (which, property, choice) in CHOICES_NOT_OFFERED {
        if *which == tool
            && let Some(Value::Array(choices)) = input
                .get_mut("properties")
                .and_then(|p| p.get_mut(*property))
                .and_then(|p| p.get_mut("enum"))
        {
            choices.retain(|c| c != *choice);
        }
    }
    // The server refuses an unknown argument by name whatever the listed schema says
    // (`args::check_arguments`), in a mount or a port as at the top; the keyword's 29 bytes in
    // every schema bought the model nothing, and the catalog's bytes are spent on every turn.
    input.remove("additionalProperties");
    let mut input = Value::Object(input);
    // Nor is `minimum: 0` on a whole number worth its bytes: a count or an offset is never
    // negative, and a call sending one is refused by name all the same (the checked schema
    // keeps it).
    without_zero_minimum(&mut input);
    without_closed_objects(&mut input);
    fit(&mut input, mode, offers);
    let mut output = Value::Object(output);
    refer_to_records(tool, &mut output);
    // A result's fleet says nothing where only one is served, as the argument is not offered
    // (in each of a result's forms: job-output's report carried it).
    if let Mode::Single(_) = mode {
        let forms: Vec<&mut Value> = match output.get_mut("anyOf") {
            Some(Value::Array(forms)) => forms.iter_mut().collect(),
            _ => vec![&mut output],
        };
        for form in forms {
            if let Some(Value::Object(props)) = form.get_mut("properties") {
                props.remove("target");
            }
        }
    }
    fit(&mut output, mode, offers);
    let output = outline(output);
    let listed = rmcp::model::Tool::new(
        tool.name(),
        worded(tool.description(), mode, offers),
        Arc::new(into_object(input)),
    );
    // view-state's result has a form per view, which the views know (docs/tools.md): no schema
    // is listed for it (see `listed_as_outline`).
    let listed = if tool == Tool::ViewState {
        listed
    } else {
        listed.with_raw_output_schema(Arc::new(into_object(output)))
    };
    let listed = match view_meta(tool, offers) {
        Some(meta) => listed.with_meta(meta),
        None => listed,
    };
    // A tool whose every hint is the spec's default says so by having none: an empty
    // `annotations` object is 17 bytes of nothing on every turn.
    if annotations == ToolAnnotations::default() {
        listed
    } else {
        listed.with_annotations(annotations)
    }
}

/// view-state is listed with `view` alone, whose description names what each view takes: only
/// this server's own views call it (a host keeps it from the model), and every byte of its
/// listing is in the catalog sent on every `tools/list`. Its arguments are checked against the
/// whole schema all the same (`checked_input`).
fn listed_as_outline(input: &mut JsonObject) {
    let Some(Value::Object(properties)) = input.get_mut("properties") else {
        return;
    };
    let others: Vec<String> = properties
        .keys()
        .filter(|k| *k != "view")
        .cloned()
        .collect();
    properties.retain(|k, _| k == "view");
    if let Some(Value::Object(view)) = properties.get_mut("view") {
        view.insert(
            "description".into(),
            Value::String(format!("Then: {}.", others.join(", "))),
        );
    }
}

/// What MCP Apps reads on a tool (`_meta.ui`): the view a host shows beside its calls, or, for
/// view-state, that only views may call it (a host keeps it from the model, as it keeps an
/// elicitation form from the model). Only the current key: the legacy `ui/resourceUri` would
/// cost the catalog another 40 bytes a tool.
fn view_meta(tool: Tool, offers: Offers) -> Option<rmcp::model::MetaObject> {
    if !offers.views {
        return None;
    }
    let ui = match (tool, tool.view()) {
        (Tool::ViewState, _) => serde_json::json!({ "visibility": ["app"] }),
        (_, Some(uri)) => serde_json::json!({ "resourceUri": uri }),
        (_, None) => return None,
    };
    let mut meta = JsonObject::new();
    meta.insert("ui".into(), ui);
    Some(rmcp::model::MetaObject(meta))
}

/// An argument that several tools share word for word (run-once's image, cpus, command...) is
/// described once, at its first tool, and the others point there: the model reads the whole
/// catalog at once, and a repeated description is only repeated cost. One shorter than its
/// pointer stays.
pub fn refer_to_first_mention(tools: &mut [rmcp::model::Tool]) {
    let mut first: Vec<(String, String, String)> = Vec::new();
    for tool in tools.iter_mut() {
        let name = tool.name.to_string();
        let input = Arc::make_mut(&mut tool.input_schema);
        let Some(Value::Object(props)) = input.get_mut("properties") else {
            continue;
        };
        for (arg, schema) in props.iter_mut() {
            let Some(Value::String(text)) = schema.get("description").cloned() else {
                continue;
            };
            let text = &text;
            let Some((_, _, owner)) = first.iter().find(|(a, t, _)| a == arg && t == text) else {
                first.push((arg.clone(), text.clone(), name.clone()));
                continue;
            };
            let pointer = format!("See {owner}.");
            if pointer.len() >= text.len() {
                continue;
            }
            if let Some(schema) = schema.as_object_mut() {
                schema.insert("description".into(), Value::String(pointer));
            }
        }
    }
}

fn into_object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

/// What the operator's settings let work, so that a catalog offers only that (an argument or a
/// tool that could only be refused as configured costs the model its bytes on every turn and
/// invites a call that fails; a call naming one all the same is refused by its handler, saying
/// which setting would turn it on), and the bounds they set that a description states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Offers {
    /// Host directories a machine may get (mountAllow): mounts, workspaces, their changes.
    pub host_dirs: bool,
    /// Credential bindings to name at create (credentials).
    pub credentials: bool,
    /// A command's timeout when it gives none, and the most it may ask for: what
    /// `{execTimeoutSecs}` and `{maxExecTimeoutSecs}` read in a description.
    pub exec_timeout_secs: u64,
    pub max_exec_timeout_secs: u64,
    /// A background job's (`{maxJobSecs}`).
    pub max_job_secs: u64,
    /// How long an unused base is kept (baseIdleSecs; 0: until deleted): `{baseIdle}`.
    pub base_idle_secs: u64,
    /// Views (MCP Apps) for a client that declared it shows them: the tools that have one link
    /// it, and view-state, which only views call, is listed.
    pub views: bool,
}

impl Offers {
    /// Everything, the timeouts at their defaults: what a call's arguments are checked against.
    pub const ALL: Offers = Offers {
        host_dirs: true,
        credentials: true,
        exec_timeout_secs: 120,
        max_exec_timeout_secs: 900,
        max_job_secs: 3600,
        base_idle_secs: 604_800,
        views: true,
    };

    pub fn of(config: &crate::process::config::Config) -> Offers {
        Offers {
            host_dirs: !config.mount_allow.is_empty(),
            credentials: !config.credentials.is_empty(),
            exec_timeout_secs: config.exec_timeout_secs,
            max_exec_timeout_secs: config.max_exec_timeout_secs,
            max_job_secs: config.max_job_secs,
            base_idle_secs: config.base_idle_secs,
            views: false,
        }
    }

    /// The same, for a client that shows views or not.
    pub fn with_views(self, views: bool) -> Offers {
        Offers { views, ..self }
    }

    /// Whether `tool` is offered at all.
    pub fn lists(self, tool: Tool) -> bool {
        match tool {
            Tool::KeepChanges => self.host_dirs,
            Tool::ViewState => self.views,
            _ => true,
        }
    }
}

/// `text` for a catalog serving `mode`: a `{local:...}` or `{cloud:...}` segment is kept (without
/// its braces) only where that fleet is served, so a single-fleet catalog spends none of the
/// model's context on the other fleet; line breaks a doc comment carried become spaces.
pub fn for_fleets(text: &str, mode: Mode) -> String {
    worded(text, mode, Offers::ALL)
}

/// The same, a `{dirs:...}` segment kept only where host directories are offered and a
/// `{creds:...}` one where credentials are. Segments nest.
pub fn worded(text: &str, mode: Mode, offers: Offers) -> String {
    tidy(
        &kept_segments(text, mode, offers)
            .replace("{execTimeoutSecs}", &offers.exec_timeout_secs.to_string())
            .replace(
                "{maxExecTimeoutSecs}",
                &offers.max_exec_timeout_secs.to_string(),
            )
            .replace("{maxJobSecs}", &offers.max_job_secs.to_string())
            .replace("{baseIdle}", &base_idle_words(offers.base_idle_secs)),
    )
}

fn base_idle_words(secs: u64) -> String {
    if secs == 0 {
        "kept until deleted".to_owned()
    } else {
        format!(
            "deleted after {} unused",
            crate::process::keep::duration_words(secs)
        )
    }
}

const MARKERS: [&str; 4] = ["{local:", "{cloud:", "{dirs:", "{creds:"];

fn kept_segments(text: &str, mode: Mode, offers: Offers) -> String {
    let shown = |marker: &str| match marker {
        "{local:" => matches!(mode, Mode::Single(FleetKind::Local) | Mode::Both),
        "{cloud:" => matches!(mode, Mode::Single(FleetKind::Cloud) | Mode::Both),
        "{dirs:" => offers.host_dirs,
        _ => offers.credentials,
    };
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some((at, marker)) = MARKERS
        .into_iter()
        .filter_map(|marker| rest.find(marker).map(|at| (at, marker)))
        .min_by_key(|(at, _)| *at)
    {
        out.push_str(&rest[..at]);
        let inside = &rest[at + marker.len()..];
        let end = closing_brace(inside);
        if shown(marker) {
            out.push_str(&kept_segments(&inside[..end], mode, offers));
        }
        rest = inside.get(end + 1..).unwrap_or("");
    }
    out.push_str(rest);
    out
}

/// Where the segment that starts `text` ends: braces inside it (`smol://runs/{id}`) nest.
fn closing_brace(text: &str) -> usize {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    text.len()
}

/// One space between words, none before punctuation a dropped segment left behind.
fn tidy(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    joined
        .replace(" .", ".")
        .replace(" ,", ",")
        .replace(" ;", ";")
        .replace(" )", ")")
        .replace("( ", "(")
        .trim()
        .to_owned()
}

/// The schema arguments are checked against, its descriptions worded for `mode` (a refusal
/// quotes them) but every property kept: an argument of the other fleet is refused by its
/// handler with the reason, not as unknown.
pub fn worded_for(schema: JsonObject, mode: Mode) -> JsonObject {
    fn word(value: &mut Value, mode: Mode) {
        match value {
            Value::Object(map) => {
                for (key, v) in map.iter_mut() {
                    match v {
                        Value::String(text) if key == "description" => {
                            *text = for_fleets(text, mode);
                        }
                        _ => word(v, mode),
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| word(v, mode)),
            _ => {}
        }
    }
    let mut value = Value::Object(schema);
    word(&mut value, mode);
    into_object(value)
}

/// Every description in `schema` worded for `mode` and `offers`; a property whose whole
/// description belongs to a fleet not served (`mounts` on cloud) or to something not offered
/// (`workspace` without mountAllow) is not offered at all.
fn fit(schema: &mut Value, mode: Mode, offers: Offers) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::String(text)) = map.get("description") {
                let fitted = worded(text, mode, offers);
                map.insert("description".into(), Value::String(fitted));
            }
            if let Some(Value::Object(props)) = map.get_mut("properties") {
                let absent: Vec<String> = props
                    .iter()
                    .filter(|(_, p)| {
                        p.get("description")
                            .and_then(Value::as_str)
                            .is_some_and(|d| !d.is_empty() && worded(d, mode, offers).is_empty())
                    })
                    .map(|(k, _)| k.clone())
                    .collect();
                for key in &absent {
                    props.remove(key);
                }
                if let Some(Value::Array(required)) = map.get_mut("required") {
                    required.retain(|r| !absent.iter().any(|a| r == a));
                }
            }
            map.values_mut().for_each(|v| fit(v, mode, offers));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| fit(v, mode, offers)),
        _ => {}
    }
}

/// The machine record and the job record are spelled out once each (list-machines' items,
/// job-output's report); elsewhere a result names where to find them rather than repeating them: six
/// copies of the machine record were a tenth of the catalog.
fn refer_to_records(tool: Tool, output: &mut Value) {
    use std::sync::OnceLock;
    static MACHINE: OnceLock<Value> = OnceLock::new();
    static JOB: OnceLock<Value> = OnceLock::new();
    let machine = MACHINE.get_or_init(|| Value::Object(self::output::<crate::fleet::Machine>()));
    let job = JOB.get_or_init(|| Value::Object(self::output::<super::results::JobSummary>()));
    if tool != Tool::ListMachines {
        replace_copies(output, machine, "list-machines' record.");
    }
    replace_copies(output, job, "job-output's record, without output.");
    // run-command's background answer is a job's first record, which job-output's answer
    // spells out: here its fields are named, not typed again.
    if tool == Tool::RunCommand
        && let Some(Value::Array(forms)) = output.get_mut("anyOf")
    {
        for form in forms.iter_mut() {
            let is_job = form
                .get("properties")
                .is_some_and(|p| p.get("job").is_some());
            if is_job {
                *form = outline_field(form.take());
            }
        }
    }
    // run-once answers what run-command does for a finished command (no overflow: its machine
    // is gone), with the machine it used: its fields were a second copy of run-command's.
    if tool == Tool::RunOnce {
        *output = serde_json::json!({
            "type": "object",
            "description": "run-command's answer (no overflow), with machine (deleted) and pool.",
        });
    }
}

/// A result's outline: each field's name and type, a nested object or list of objects as the
/// names of its fields. The tool's description says what the result means; the full schema of
/// every nested record cost more than half the catalog, and a model reads the real values in the
/// answer anyway. A description survives only where it points at another tool's record.
fn outline(schema: Value) -> Value {
    let Value::Object(mut map) = schema else {
        return schema;
    };
    if let Some(Value::Array(branches)) = map.remove("anyOf") {
        let branches: Vec<Value> = branches.into_iter().map(outline).collect();
        let mut out = serde_json::Map::new();
        out.insert("type".into(), Value::String("object".into()));
        out.insert("anyOf".into(), Value::Array(branches));
        return Value::Object(out);
    }
    let mut out = serde_json::Map::new();
    out.insert("type".into(), Value::String("object".into()));
    match map.remove("properties") {
        Some(Value::Object(props)) => {
            let fields = props
                .into_iter()
                .map(|(k, v)| (k, outline_field(v)))
                .collect();
            out.insert("properties".into(), Value::Object(fields));
        }
        _ => {
            if let Some(d) = map.remove("description") {
                out.insert("description".into(), d);
            }
        }
    }
    Value::Object(out)
}

fn without_zero_minimum(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.get("minimum") == Some(&Value::from(0)) {
                map.remove("minimum");
            }
            map.values_mut().for_each(without_zero_minimum);
        }
        Value::Array(items) => items.iter_mut().for_each(without_zero_minimum),
        _ => {}
    }
}

fn outline_field(field: Value) -> Value {
    let Value::Object(map) = &field else {
        return field;
    };
    if let Some(Value::Array(branches)) = map.get("anyOf") {
        let rest: Vec<&Value> = branches
            .iter()
            .filter(|b| b.get("type") != Some(&Value::String("null".into())))
            .collect();
        // Nullable as `anyOf` branches of single types, not a type pair: the Inspector flags
        // pairs as unportable (a client mapping schemas onto Gemini's OpenAPI subset rejects them).
        if rest.len() == 1 && rest.len() < branches.len() {
            return serde_json::json!({"anyOf": [outline_field(rest[0].clone()), {"type": "null"}]});
        }
    }
    let names = |object: &Value| {
        object
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.keys().map(String::as_str).collect::<Vec<_>>().join(", "))
    };
    let mut out = serde_json::Map::new();
    if let Some(t) = map.get("type") {
        out.insert("type".into(), t.clone());
    }
    match map.get("type").and_then(Value::as_str) {
        Some("object") => match names(&field) {
            Some(fields) => {
                out.insert("description".into(), Value::String(format!("{{{fields}}}")));
            }
            None => {
                if let Some(d) = map.get("description") {
                    out.insert("description".into(), d.clone());
                }
            }
        },
        Some("array") => match map.get("items") {
            Some(items) if names(items).is_some() => {
                let fields = names(items).unwrap_or_default();
                out.insert(
                    "description".into(),
                    Value::String(format!("[{{{fields}}}]")),
                );
            }
            Some(items) => {
                out.insert("items".into(), outline_field(items.clone()));
            }
            None => {}
        },
        _ => {}
    }
    Value::Object(out)
}

fn replace_copies(schema: &mut Value, record: &Value, reference: &str) {
    if schema == record {
        *schema = serde_json::json!({"type": "object", "description": reference});
        return;
    }
    match schema {
        Value::Object(map) => map
            .values_mut()
            .for_each(|v| replace_copies(v, record, reference)),
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| replace_copies(v, record, reference)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tools::Catalog;

    #[test]
    fn target_follows_the_mode() {
        let single = &Catalog::of(Mode::Single(FleetKind::Local)).listed;
        let both = &Catalog::of(Mode::Both).listed;
        assert_eq!(single.len(), Tool::ALL.len());
        for (s, b) in single.iter().zip(both) {
            assert!(
                s.input_schema["properties"].get("target").is_none(),
                "{}",
                s.name
            );
            assert!(
                b.input_schema["required"]
                    .as_array()
                    .unwrap()
                    .contains(&"target".into()),
                "{}",
                b.name
            );
        }
    }

    #[test]
    fn input_schemas_are_portable_and_outputs_keep_their_nulls() {
        let tools = &Catalog::of(Mode::Both).listed;
        let inputs =
            serde_json::to_string(&tools.iter().map(|t| &t.input_schema).collect::<Vec<_>>())
                .unwrap();
        assert!(!inputs.contains("\"null\""), "no null types in inputs");
        let all = serde_json::to_string(&tools).unwrap();
        assert!(!all.contains("$defs") && !all.contains("$ref"));
        assert!(!all.contains("uint"));
        // A field that may be null says so: job-output's exitCode is null for a lost job.
        let job = tools.iter().find(|t| t.name == "job-output").unwrap();
        let exit_code =
            &job.output_schema.as_ref().unwrap()["anyOf"][0]["properties"]["exitCode"]["anyOf"];
        assert_eq!(
            exit_code,
            &serde_json::json!([{"type": "integer"}, {"type": "null"}]),
            "a lost job's exit code is null"
        );
        // A field that may be unknown and is then left out is not required (pull-image's
        // digest, which the engine may not say).
        let pull = tools.iter().find(|t| t.name == "pull-image").unwrap();
        let pulled = &pull.output_schema.as_ref().unwrap();
        assert_eq!(
            pulled["properties"]["digest"],
            serde_json::json!({"type": "string"})
        );
        assert!(
            pulled
                .get("required")
                .is_none_or(|r| !r.to_string().contains("digest"))
        );
        let outputs =
            serde_json::to_string(&tools.iter().map(|t| &t.output_schema).collect::<Vec<_>>())
                .unwrap();
        assert!(!outputs.contains("\"type\":["), "no type arrays in outputs");
    }

    #[test]
    fn fleet_segments_are_kept_only_where_their_fleet_is_served() {
        let text = "Name{cloud: or mach- id}. {local:Bundled Alpine. }{cloud:Costs money.} smol://runs/{run}.";
        let local = Mode::Single(FleetKind::Local);
        let cloud = Mode::Single(FleetKind::Cloud);
        assert_eq!(
            for_fleets(text, local),
            "Name. Bundled Alpine. smol://runs/{run}."
        );
        assert_eq!(
            for_fleets(text, cloud),
            "Name or mach- id. Costs money. smol://runs/{run}."
        );
        assert_eq!(
            for_fleets(text, Mode::Both),
            "Name or mach- id. Bundled Alpine. Costs money. smol://runs/{run}."
        );
        assert_eq!(for_fleets("{local:only here}", cloud), "");
        assert_eq!(for_fleets("two\nlines", local), "two lines");
        // An unclosed segment runs to the end rather than eating the text before it.
        assert_eq!(for_fleets("kept {cloud:open", local), "kept");
    }

    #[test]
    fn a_property_of_another_fleet_is_not_offered() {
        let mut schema = serde_json::json!({
            "type": "object",
            "properties": {
                "mounts": {"type": "array", "description": "{local:Host directories.}"},
                "image": {"type": "string", "description": "OCI image.{cloud: Required.}"}
            },
            "required": ["mounts", "image"]
        });
        fit(&mut schema, Mode::Single(FleetKind::Cloud), Offers::ALL);
        assert!(schema["properties"].get("mounts").is_none());
        assert_eq!(
            schema["properties"]["image"]["description"],
            "OCI image. Required."
        );
        assert_eq!(schema["required"], serde_json::json!(["image"]));
    }

    #[test]
    fn records_are_spelled_out_once() {
        let local = &Catalog::of(Mode::Single(FleetKind::Local)).listed;
        let schema_of = |name: &str| {
            let tool = local.iter().find(|t| t.name == name).unwrap();
            serde_json::to_value(tool.output_schema.as_ref().unwrap()).unwrap()
        };
        let listed = schema_of("list-machines")["properties"]["machines"]["description"].clone();
        assert!(listed.as_str().unwrap().contains("cpus"), "{listed}");
        let created = schema_of("create-machine");
        assert!(created["properties"]["machine"].get("properties").is_none());
        assert!(
            created["properties"]["machine"]["description"]
                .as_str()
                .unwrap()
                .contains("list-machines")
        );
        assert!(schema_of("cancel-job").get("properties").is_none());
        let job_output = schema_of("job-output");
        assert!(job_output["anyOf"][0]["properties"]["state"].is_object());
        assert!(
            job_output["anyOf"][1]["properties"]["jobs"]["items"]["description"]
                .as_str()
                .unwrap()
                .contains("job-output")
        );
    }
}
