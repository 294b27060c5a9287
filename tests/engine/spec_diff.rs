//! The spec-diff report: on a real pair (the smolvm 1.14.3 engine from PyPI against the vendored
//! 1.32.2), and on small hand-made pairs, one kind of change each.

use serde_json::{Value, json};
use smol_mcp::app::spec_diff::{
    Api, Classification, OperationStatus, Report, SentFields, diff_specs, read_request_snapshots,
    sent_fields,
};
use smol_mcp::spec::overrides::Overrides;
use smol_mcp::spec::{CLOUD_API, LOCAL_API};
use std::path::PathBuf;
use std::process::Command;

const SMOL_SPEC: &str = env!("CARGO_BIN_EXE_smol-spec");

fn older_engine() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".smolvm/1.14.3/smol-vmm");
    assert!(
        path.exists(),
        "no smolvm 1.14.3 at {}: run scripts/test.sh",
        path.display()
    );
    path
}

#[test]
fn the_real_pair_1_14_3_against_the_vendored_1_32_2() {
    let out = Command::new(SMOL_SPEC)
        .args(["diff", "--smolvm"])
        .arg(older_engine())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "an older engine needs decisions: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let markdown = String::from_utf8(out.stdout).unwrap();
    assert!(
        markdown.contains("candidate release: smolvm 1.14.3"),
        "the release comes from --version"
    );
    assert!(
        markdown
            .contains("`info.version`: 0.5.2 (reported, not trusted: smolvm 1.14.3 says 0.5.2)"),
        "the note is about the release checked"
    );
    insta::assert_snapshot!("real_pair_1_14_3_markdown", markdown);

    let out = Command::new(SMOL_SPEC)
        .args(["diff", "--format", "json", "--smolvm"])
        .arg(older_engine())
        .output()
        .unwrap();
    let reports: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let report = &reports[0];
    assert_eq!(report["parity"]["paths"], 35, "1.14.3 serves 35 paths");
    let exec = report["operations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["operationId"] == "exec_command")
        .unwrap();
    assert!(
        exec["changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["field"] == "autoStart" && c["breaking"] == true),
        "1.14.3 does not take autoStart, which every exec sends: {exec}"
    );
}

#[test]
fn the_vendored_spec_against_itself_needs_nothing() {
    let raw = LOCAL_API.spec_text;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("same.json");
    std::fs::write(&path, raw).unwrap();
    let out = Command::new(SMOL_SPEC)
        .args(["diff", "--release", "smolvm 1.32.2", "--local-spec"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("nothing needs a decision"));
    assert!(
        text.contains("53 operations on 44 paths: 26 called, 27 omitted on purpose, 0 unknown"),
        "{text}"
    );
}

#[test]
fn bad_usage_is_exit_2_with_the_reason() {
    let out = Command::new(SMOL_SPEC)
        .args(["diff", "--bogus"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unexpected argument '--bogus'"));

    let out = Command::new(SMOL_SPEC)
        .args(["diff", "--release", "x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "nothing to compare");
}

#[test]
fn help_and_version_exit_0() {
    for args in [
        &["--help"][..],
        &["--version"],
        &["diff", "--help"],
        &["vendor", "--help"],
    ] {
        let out = Command::new(SMOL_SPEC).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
    }
    let out = Command::new(SMOL_SPEC)
        .args(["diff", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("--snapshots <DIR>") && help.contains("request fields"),
        "{help}"
    );
}

#[test]
fn a_missing_snapshots_directory_is_exit_2_not_a_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(SMOL_SPEC)
        .args(["diff", "--local-spec"])
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(LOCAL_API.spec_file))
        .arg("--snapshots")
        .arg(dir.path().join("nowhere"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "no report without snapshots");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no request snapshots directory") && err.contains("nowhere"),
        "{err}"
    );

    let out = Command::new(SMOL_SPEC)
        .args(["diff", "--local-spec"])
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(LOCAL_API.spec_file))
        .arg("--snapshots")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no local_requests__*.snap"), "{err}");
}

// ---- hand-made pairs ----

fn spec(paths: Value, schemas: Value) -> Value {
    json!({"openapi": "3.1.0", "info": {"version": "0.5.2"}, "paths": paths, "components": {"schemas": schemas}})
}

fn exec_op(body_schema: Value, params: Value) -> Value {
    json!({"post": {"operationId": "exec_command", "parameters": params,
        "requestBody": {"content": {"application/json": {"schema": body_schema}}},
        "responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ExecResponse"}}}}}}})
}

fn exec_response(props: Value, required: Value) -> Value {
    json!({"ExecResponse": {"type": "object", "properties": props, "required": required}})
}

fn base() -> Value {
    spec(
        json!({"/api/v1/machines/{id}/exec": exec_op(
            json!({"type": "object", "required": ["command"], "properties": {
                "command": {"type": "array", "items": {"type": "string"}},
                "workdir": {"type": ["string", "null"]},
                "mode": {"type": "string", "enum": ["a", "b"]}}}),
            json!([{"in": "path", "name": "id", "required": true, "schema": {"type": "string"}}]))}),
        exec_response(
            json!({"exitCode": {"type": "integer"}, "stdout": {"type": "string"}}),
            json!(["exitCode", "stdout"]),
        ),
    )
}

fn report(candidate: Value) -> Report {
    diff_specs(
        Api::Local,
        &base(),
        &candidate,
        None,
        &SentFields::new(),
        None,
    )
}

fn changes(r: &Report) -> Vec<(String, String, String, bool)> {
    r.operations
        .iter()
        .flat_map(|o| {
            o.changes.iter().map(|c| {
                (
                    c.place.clone(),
                    c.field.clone(),
                    c.change.to_string(),
                    c.breaking,
                )
            })
        })
        .collect()
}

fn with_body(f: impl FnOnce(&mut Value)) -> Value {
    let mut s = base();
    f(s.pointer_mut(
        "/paths/~1api~1v1~1machines~1{id}~1exec/post/requestBody/content/application~1json/schema",
    )
    .unwrap());
    s
}

#[test]
fn an_identical_pair_has_no_changes() {
    let r = report(base());
    assert!(r.operations.is_empty());
    assert!(!r.needs_decision);
    assert_eq!((r.parity.called, r.parity.unknown), (1, 0));
}

#[test]
fn the_version_note_quotes_the_checked_document_not_the_baseline() {
    let mut candidate = base();
    candidate["info"]["version"] = json!("4.5.6");
    let r = diff_specs(
        Api::Local,
        &base(),
        &candidate,
        None,
        &SentFields::new(),
        Some("smolvm 9.8.7".into()),
    );
    let markdown = r.markdown();
    let line = markdown
        .lines()
        .find(|l| l.starts_with("- candidate `info.version`"))
        .unwrap();
    assert_eq!(
        line,
        "- candidate `info.version`: 4.5.6 (reported, not trusted: smolvm 9.8.7 says 4.5.6)"
    );

    candidate["info"].as_object_mut().unwrap().remove("version");
    let r = diff_specs(
        Api::Local,
        &base(),
        &candidate,
        None,
        &SentFields::new(),
        None,
    );
    assert!(
        r.markdown()
            .contains("`info.version`: none (reported, not trusted: the release is not known)"),
        "{}",
        r.markdown()
    );
}

#[test]
fn operations_added_and_removed_are_classified() {
    let mut candidate = base();
    candidate["paths"]["/api/v1/pools"] =
        json!({"get": {"operationId": "list_pools", "responses": {}}});
    candidate["paths"]["/api/v1/brand-new"] =
        json!({"post": {"operationId": "brand_new", "responses": {}}});
    let r = report(candidate);
    let added: Vec<(&str, &Classification)> = r
        .operations
        .iter()
        .map(|o| (o.operation_id.as_str(), &o.classification))
        .collect();
    assert!(matches!(added[0], ("brand_new", Classification::Unknown)));
    assert!(matches!(
        added[1],
        ("list_pools", Classification::Omitted { .. })
    ));
    assert!(r.needs_decision, "an unknown operation needs a decision");
    assert_eq!(r.parity.unknown, 1);

    let mut gone = base();
    gone["paths"] = json!({});
    let r = report(gone);
    assert_eq!(r.operations[0].status, OperationStatus::Removed);
    assert!(
        r.operations[0].changes[0].breaking,
        "a used operation that vanished breaks the server"
    );
    assert!(
        matches!(&r.operations[0].classification, Classification::Used { tools } if tools.contains(&"run-command".to_string()))
    );
}

#[test]
fn request_field_changes() {
    let removed = report(with_body(|b| {
        b["properties"].as_object_mut().unwrap().remove("workdir");
    }));
    assert_eq!(
        changes(&removed),
        [(
            "request body".into(),
            "workdir".into(),
            "removed".into(),
            true
        )]
    );

    let renamed = report(with_body(|b| {
        let props = b["properties"].as_object_mut().unwrap();
        let v = props.remove("workdir").unwrap();
        props.insert("cwd".into(), v);
    }));
    assert_eq!(
        changes(&renamed),
        [(
            "request body".into(),
            "workdir".into(),
            "renamed?".into(),
            true
        )]
    );

    let retyped = report(with_body(|b| {
        b["properties"]["mode"]["type"] = json!("integer")
    }));
    assert!(changes(&retyped).contains(&(
        "request body".into(),
        "mode".into(),
        "type".into(),
        true
    )));

    let required = report(with_body(|b| b["required"] = json!(["command", "mode"])));
    assert_eq!(
        changes(&required),
        [(
            "request body".into(),
            "mode".into(),
            "required".into(),
            true
        )]
    );

    let not_nullable = report(with_body(|b| {
        b["properties"]["workdir"]["type"] = json!("string")
    }));
    assert_eq!(
        changes(&not_nullable),
        [(
            "request body".into(),
            "workdir".into(),
            "nullable".into(),
            true
        )]
    );

    let enum_shrunk = report(with_body(|b| {
        b["properties"]["mode"]["enum"] = json!(["a", "c"])
    }));
    let c = &enum_shrunk.operations[0].changes[0];
    assert_eq!((c.change.as_str(), c.breaking), ("enum", true));
    assert!(
        c.detail.contains("added [\"c\"]") && c.detail.contains("removed [\"b\"]"),
        "{}",
        c.detail
    );

    let optional_added = report(with_body(|b| {
        b["properties"]["user"] = json!({"type": "string"})
    }));
    assert_eq!(
        changes(&optional_added),
        [("request body".into(), "user".into(), "added".into(), false)]
    );
    assert!(!optional_added.needs_decision);
}

#[test]
fn parameter_and_response_changes() {
    let mut param = base();
    param["paths"]["/api/v1/machines/{id}/exec"]["post"]["parameters"]
        .as_array_mut()
        .unwrap()
        .push(
            json!({"in": "query", "name": "wait", "required": true, "schema": {"type": "boolean"}}),
        );
    assert_eq!(
        changes(&report(param)),
        [(
            "query parameter wait".into(),
            String::new(),
            "added".into(),
            true
        )]
    );

    let mut response = base();
    response["components"]["schemas"] =
        exec_response(json!({"exitCode": {"type": "string"}}), json!(["exitCode"]));
    let c = changes(&report(response));
    assert!(
        c.contains(&(
            "response 200".into(),
            "stdout".into(),
            "removed".into(),
            true
        )),
        "{c:?}"
    );
    assert!(
        c.contains(&(
            "response 200".into(),
            "exitCode".into(),
            "type".into(),
            true
        )),
        "{c:?}"
    );
}

#[test]
fn override_statuses() {
    let overrides = Overrides::parse(&json!({"api": "smolvm", "omissions": [], "fixes": [
        {"id": "still-wrong", "reason": "r", "evidence": "e", "patches": [
            {"op": "replace", "pointer": "/components/schemas/ExecResponse/required", "expect": ["exitCode", "stdout"], "value": ["exitCode"]}]},
        {"id": "fixed-upstream", "reason": "r", "evidence": "e", "patches": [
            {"op": "replace", "pointer": "/info/version", "expect": "0.0.1", "value": "0.5.2"}]},
        {"id": "changed-otherwise", "reason": "r", "evidence": "e", "patches": [
            {"op": "replace", "pointer": "/paths/~1api~1v1~1machines~1{id}~1exec/post/operationId", "expect": "exec", "value": "run"}]}
    ]}).to_string()).unwrap();
    let r = diff_specs(
        Api::Local,
        &base(),
        &base(),
        Some(&overrides),
        &SentFields::new(),
        None,
    );
    let statuses: Vec<(&str, &str)> = r
        .overrides
        .iter()
        .map(|o| (o.id.as_str(), o.status.as_str()))
        .collect();
    assert_eq!(
        statuses,
        [
            ("still-wrong", "applies"),
            ("fixed-upstream", "no longer needed"),
            ("changed-otherwise", "no longer matches")
        ]
    );
    assert!(r.needs_decision, "stale overrides need a decision");
}

#[test]
fn only_fields_this_server_sends_make_a_request_change_breaking() {
    let sent: SentFields = [(
        ("POST".to_string(), "/api/v1/machines/{id}/exec".to_string()),
        ["command".to_string(), "workdir".to_string()]
            .into_iter()
            .collect(),
    )]
    .into_iter()
    .collect();
    let candidate = with_body(|b| {
        let props = b["properties"].as_object_mut().unwrap();
        props.remove("workdir");
        props.remove("mode");
        props.insert("cpu".into(), json!({"type": "integer"}));
    });
    let r = diff_specs(Api::Local, &base(), &candidate, None, &sent, None);
    let c = changes(&r);
    assert!(
        c.contains(&(
            "request body".into(),
            "workdir".into(),
            "removed".into(),
            true
        )),
        "{c:?}"
    );
    assert!(
        c.contains(&(
            "request body".into(),
            "mode".into(),
            "removed".into(),
            false
        )),
        "not sent, not breaking: {c:?}"
    );
}

fn snapshots_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots")
}

#[test]
fn every_request_snapshot_feeds_the_report() {
    let count = |prefix: &str| {
        std::fs::read_dir(snapshots_dir())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with(prefix)
            })
            .count()
    };
    let local = read_request_snapshots(&snapshots_dir(), Api::Local).unwrap();
    let cloud = read_request_snapshots(&snapshots_dir(), Api::Cloud).unwrap();
    assert_eq!(count("local_requests__"), local.len());
    assert_eq!(count("cloud_requests__"), cloud.len());
    assert_eq!((local.len(), cloud.len()), (12, 13));
    let spec: Value = serde_json::from_str(LOCAL_API.spec_text).unwrap();
    let sent = sent_fields(&spec, &local);
    let exec = &sent[&("POST".to_string(), "/api/v1/machines/{id}/exec".to_string())];
    for field in [
        "autoStart",
        "background",
        "command",
        "env",
        "env[].name",
        "stdin",
        "timeoutSecs",
        "workdir",
    ] {
        assert!(exec.contains(field), "{field} in {exec:?}");
    }
    let start = &sent[&(
        "POST".to_string(),
        "/api/v1/machines/{name}/start".to_string(),
    )];
    assert!(
        start.contains("?forkable") && start.contains("branchable"),
        "{start:?}"
    );
    let egress_events = &sent[&(
        "GET".to_string(),
        "/api/v1/machines/{name}/egress-events".to_string(),
    )];
    assert!(egress_events.contains("?limit"), "{egress_events:?}");
    let files = sent.keys().filter(|(_, p)| p.contains("/files/")).count();
    assert_eq!(files, 2, "download and upload");
}

#[test]
fn the_published_cloud_spec_against_itself_needs_nothing() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(CLOUD_API.spec_file);
    let out = Command::new(SMOL_SPEC)
        .args(["diff", "--format", "json", "--cloud-spec"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let reports: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let parity = &reports[0]["parity"];
    assert_eq!(parity["operations"], 58);
    assert_eq!(
        parity["unknown"], 0,
        "the published files route is accounted for by its override"
    );
    assert_eq!(parity["called"], 9);
}
