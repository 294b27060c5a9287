//! The workspace tools end to end against the fake serve in guest-root mode (a machine's disk
//! is a host directory its commands and the files routes share, so the workspace's own tar
//! commands really run): a repository in, a change made by a command, the diff seen, the
//! change kept as a branch of the user's repository; three children of one base, one kept and
//! its siblings deleted in the same call; and each refusal with the user's repository compared
//! before and after.

use crate::common::fake_serve::FakeServe;
use crate::common::mcp::Harness;
use crate::workspace::{disk_use, git, noise, object_files, repository, snapshot, without_ref};
use serde_json::json;
use std::path::Path;

struct Setup {
    fake: FakeServe,
    h: Harness,
    tmp: tempfile::TempDir,
}

/// A repository at `<tmp>/projects/app`, `projects` allowed, the server's copies in `copies`.
fn workspace_env(tmp: &tempfile::TempDir) -> (String, String) {
    let projects = tmp.path().join("projects");
    repository(&projects.join("app"));
    (
        projects.display().to_string(),
        tmp.path().join("copies").display().to_string(),
    )
}

impl Setup {
    async fn new() -> Setup {
        Setup::with(&[]).await
    }

    async fn with(extra: &[(&str, &str)]) -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let (allow, store) = workspace_env(&tmp);
        let fake = FakeServe::start_guest_root().await;
        let url = fake.url();
        let mut env = vec![
            ("SMOL_LOCAL_URL", url.as_str()),
            ("SMOL_MCP_MOUNT_ALLOW", allow.as_str()),
            ("SMOL_MCP_WORKSPACE_DIR", store.as_str()),
        ];
        env.extend_from_slice(extra);
        let h = Harness::start(&env).await;
        Setup { fake, h, tmp }
    }

    fn repo(&self) -> std::path::PathBuf {
        self.tmp.path().join("projects/app")
    }
}

fn file_changes(answer: &serde_json::Value) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = answer["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_owned(),
                f["change"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    files.sort();
    files
}

#[tokio::test]
async fn a_repository_goes_in_a_command_changes_it_and_the_change_comes_back_as_a_branch() {
    let s = Setup::new().await;
    let repo = s.repo();
    let head = git(&repo, &["rev-parse", "HEAD"]);
    let before = snapshot(&repo);
    let created =
        s.h.ok(
            "create-machine",
            json!({"name": "fixer", "workspace": repo.display().to_string()}),
        )
        .await;
    assert_eq!(created["workspace"]["path"], "/workspace");
    assert_eq!(created["workspace"]["base"], head.as_str());
    assert_eq!(created["workspace"]["branch"], "main");
    let disk = s.fake.disk("fixer");
    assert_eq!(
        std::fs::read_to_string(disk.join("workspace/src/lib.rs")).unwrap(),
        "fn one() {}\n"
    );
    assert!(
        !disk.join("workspace/target").exists(),
        "the commit's files only, not the user's ignored build output"
    );
    assert!(
        disk.join("workspace/.git").is_dir(),
        "git works in the machine"
    );
    assert!(
        std::fs::read_dir(disk.join("var/tmp"))
            .unwrap()
            .next()
            .is_none(),
        "the archive's parts are removed"
    );

    let changes_of = json!({"name": "fixer", "path": "/workspace", "changes": true});
    let unchanged = s.h.call("read-file", changes_of.clone()).await;
    assert!(!unchanged.is_error, "{}", unchanged.text);
    assert_eq!(unchanged.structured["changes"]["files"], json!([]));
    assert_eq!(unchanged.structured["size"], 0);
    assert_eq!(unchanged.structured["eof"], true);

    s.h.ok(
        "run-command",
        json!({"name": "fixer", "command":
            "cd /workspace && echo 'fn two() {}' >> src/lib.rs && rm old.txt \
             && printf 'new\\n' > NEW.md && printf 'a\\000b' > blob.bin \
             && mkdir -p target && echo junk > target/out"}),
    )
    .await;
    let changes = s.h.call("read-file", changes_of.clone()).await;
    assert!(!changes.is_error, "{}", changes.text);
    assert_eq!(
        file_changes(&changes.structured["changes"]),
        vec![
            ("NEW.md".into(), "added".into()),
            ("blob.bin".into(), "added".into()),
            ("old.txt".into(), "deleted".into()),
            ("src/lib.rs".into(), "modified".into()),
        ],
        "ignored build output is not a change"
    );
    let blob = changes.structured["changes"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "blob.bin")
        .unwrap()
        .clone();
    assert_eq!(blob["binary"], true);
    assert_eq!(blob["bytes"], 3);
    let diff = &changes.blocks[1];
    assert!(diff.contains("+fn two() {}"), "{diff}");
    assert!(diff.contains("-to be deleted"), "{diff}");
    assert!(
        diff.contains("Binary files"),
        "binary files are named: {diff}"
    );
    assert_eq!(
        diff.len() as u64,
        changes.structured["size"].as_u64().unwrap()
    );
    assert_eq!(
        changes.structured["changes"]["base"],
        created["workspace"]["base"]
    );

    // Paged: small pages put together are the whole diff.
    let mut paged = String::new();
    let mut offset = 0u64;
    loop {
        let mut args = changes_of.clone();
        args["offset"] = json!(offset);
        args["length"] = json!(100);
        let page = s.h.call("read-file", args).await;
        assert!(!page.is_error, "{}", page.text);
        paged.push_str(&page.blocks[1]);
        if page.structured["eof"] == true {
            break;
        }
        offset += page.structured["bytes"].as_u64().unwrap();
    }
    assert_eq!(&paged, diff);
    // Readings at once (each replaces the copy whole) all answer the same.
    let readings =
        futures::future::join_all((0..6).map(|_| s.h.call("read-file", changes_of.clone()))).await;
    for reading in &readings {
        assert!(!reading.is_error, "{}", reading.text);
        assert_eq!(&reading.blocks[1], diff);
    }

    let kept =
        s.h.ok(
            "keep-changes",
            json!({"name": "fixer", "message": "Add two() and NEW.md"}),
        )
        .await;
    assert_eq!(kept["branch"], "smol/fixer");
    let commit = kept["commit"].as_str().unwrap();
    assert!(
        kept["review"]
            .as_str()
            .unwrap()
            .contains("merge smol/fixer"),
        "{kept}"
    );
    assert_eq!(git(&repo, &["rev-parse", "smol/fixer"]), commit);
    assert_eq!(git(&repo, &["rev-parse", "smol/fixer^"]), head);
    assert_eq!(
        git(&repo, &["show", "smol/fixer:src/lib.rs"]),
        "fn one() {}\nfn two() {}"
    );
    assert_eq!(
        git(&repo, &["log", "-1", "--format=%s", "smol/fixer"]),
        "Add two() and NEW.md"
    );
    // Nothing else of the user's repository moved: the new branch is all that is new.
    let after = snapshot(&repo);
    assert_eq!(without_ref(&after.0, "refs/heads/smol/fixer"), before.0);
    assert_eq!(
        (&after.1, &after.2, &after.3, &after.4),
        (&before.1, &before.2, &before.3, &before.4)
    );
    // The user merges it.
    git(&repo, &["merge", "--quiet", "--ff-only", "smol/fixer"]);
    assert!(repo.join("NEW.md").exists());

    // Deleting the machine removes the server's copy.
    s.h.ok("delete-machine", json!({"name": "fixer"})).await;
    let copies = s.tmp.path().join("copies");
    assert!(!copies.join("machines/local/fixer").exists());
    assert_eq!(
        std::fs::read_dir(copies.join("seeds")).unwrap().count(),
        0,
        "no machine names the seed any more"
    );
}

#[tokio::test]
async fn three_children_of_one_base_try_at_once_and_one_is_kept() {
    let s = Setup::new().await;
    let repo = s.repo();
    s.h.ok(
        "create-machine",
        json!({"name": "base", "branchable": true, "workspace": repo.display().to_string()}),
    )
    .await;
    s.fake.take_requests();
    let branched =
        s.h.ok(
            "branch-machine",
            json!({"name": "base", "childName": "try", "count": 3, "freezeSource": true,
                   "env": [{"VARIANT": "a"}, {"VARIANT": "b"}, {"VARIANT": "c d"}]}),
        )
        .await;
    assert_eq!(branched["children"], json!(["try-1", "try-2", "try-3"]));
    let forks: Vec<serde_json::Value> = s
        .fake
        .take_requests()
        .into_iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("/base/branches"))
        })
        .map(|r| r["body"].clone())
        .collect();
    assert_eq!(forks.len(), 3, "{forks:?}");
    assert_eq!(
        forks
            .iter()
            .map(|b| b.get("freezeSource").cloned())
            .collect::<Vec<_>>(),
        vec![None, None, Some(json!(true))],
        "the source is frozen with its last child"
    );
    let source_state = s.fake.state.lock().unwrap().machines["base"]["state"].clone();
    assert_eq!(source_state, "frozen", "the frozen base runs nothing more");

    // Each child edits differently, by its own variable, and runs a test of its edit: at once.
    let edits = [
        (
            "try-1",
            r#"echo "$VARIANT" > /workspace/README && test "$(cat /workspace/README)" = a"#,
        ),
        (
            "try-2",
            r#"echo "$VARIANT" > /workspace/README && test "$(cat /workspace/README)" = b"#,
        ),
        (
            "try-3",
            r#"echo "fn c() {} // $VARIANT" > /workspace/src/lib.rs && grep -q 'c d' /workspace/src/lib.rs"#,
        ),
    ];
    let runs = edits.iter().map(|(name, edit)| {
        s.h.call(
            "run-command",
            json!({"name": name, "command": format!(". /etc/smol/branch-env && {edit}")}),
        )
    });
    for (answer, (name, _)) in futures::future::join_all(runs).await.iter().zip(&edits) {
        assert!(!answer.is_error, "{name}: {}", answer.text);
        assert_eq!(answer.structured["exitCode"], 0, "{name}: {}", answer.text);
    }
    let mut seen = Vec::new();
    for (name, _) in &edits {
        let changes =
            s.h.call(
                "read-file",
                json!({"name": name, "path": "/workspace", "changes": true}),
            )
            .await;
        assert!(!changes.is_error, "{}", changes.text);
        seen.push((
            file_changes(&changes.structured["changes"]),
            changes.blocks[1].clone(),
            changes.structured["changes"]["base"].clone(),
        ));
    }
    assert_eq!(seen[0].0, vec![("README".into(), "modified".into())]);
    assert!(seen[0].1.contains("+a") && !seen[0].1.contains("+b"));
    assert!(seen[1].1.contains("+b") && !seen[1].1.contains("+a"));
    assert_eq!(seen[2].0, vec![("src/lib.rs".into(), "modified".into())]);
    assert!(seen[2].1.contains("+fn c() {} // c d"), "{}", seen[2].1);
    let head = git(&repo, &["rev-parse", "HEAD"]);
    assert!(
        seen.iter().all(|(_, _, base)| base == head.as_str()),
        "one base for all three"
    );

    let kept =
        s.h.ok(
            "keep-changes",
            json!({"name": "try-2", "message": "b wins", "branch": "try/b",
                   "deleteSiblings": true}),
        )
        .await;
    assert_eq!(kept["branch"], "try/b");
    let mut deleted: Vec<String> = serde_json::from_value(kept["deleted"].clone()).unwrap();
    deleted.sort();
    assert_eq!(deleted, vec!["try-1".to_owned(), "try-3".to_owned()]);
    let machines = s.fake.state.lock().unwrap().machines.clone();
    assert!(!machines.contains_key("try-1") && !machines.contains_key("try-3"));
    assert!(machines.contains_key("try-2") && machines.contains_key("base"));
    assert_eq!(git(&repo, &["show", "try/b:README"]), "b");
    let copies = s.tmp.path().join("copies/machines/local");
    assert!(!copies.join("try-1").exists() && !copies.join("try-3").exists());
}

#[tokio::test]
async fn a_fan_out_is_all_or_none_and_bounded() {
    let s = Setup::new().await;
    s.h.ok("create-machine", json!({"name": "src", "branchable": true}))
        .await;
    let too_many =
        s.h.err(
            "branch-machine",
            json!({"name": "src", "childName": "k", "count": 9}),
        )
        .await;
    assert!(
        too_many.contains("count: 9 is out of range: give 1 to 8"),
        "{too_many}"
    );
    let uneven =
        s.h.err(
            "branch-machine",
            json!({"name": "src", "childName": "k", "count": 2, "env": [{"A": "1"}]}),
        )
        .await;
    assert!(uneven.contains("env: 1 objects for 2 children"), "{uneven}");
    // The third name is taken: the two made before it go again.
    s.h.ok("create-machine", json!({"name": "k-3"})).await;
    let taken =
        s.h.err(
            "branch-machine",
            json!({"name": "src", "childName": "k", "count": 3}),
        )
        .await;
    assert!(taken.contains("deleted again: k-1, k-2"), "{taken}");
    let machines = s.fake.state.lock().unwrap().machines.clone();
    assert!(!machines.contains_key("k-1") && !machines.contains_key("k-2"));
    assert!(
        machines.contains_key("k-3"),
        "the machine that held the name is left"
    );
}

#[tokio::test]
async fn each_refusal_names_what_to_do_and_leaves_the_users_repository_as_it_was() {
    let s = Setup::new().await;
    let repo = s.repo();
    let machines_before = s.fake.state.lock().unwrap().machines.len();

    std::fs::write(repo.join("README"), "edited, not committed\n").unwrap();
    let dirty_before = snapshot(&repo);
    let dirty =
        s.h.err(
            "create-machine",
            json!({"workspace": repo.display().to_string()}),
        )
        .await;
    assert!(dirty.contains("uncommitted changes (README)"), "{dirty}");
    assert!(dirty.contains("commit or stash them first"), "{dirty}");
    assert_eq!(
        snapshot(&repo),
        dirty_before,
        "the dirty repository as it was"
    );
    git(&repo, &["checkout", "--quiet", "--", "README"]);
    let before = snapshot(&repo);

    let outside =
        s.h.err("create-machine", json!({"workspace": "/etc"}))
            .await;
    assert!(
        outside.contains("workspace: /etc is not in a directory the operator allows"),
        "{outside}"
    );

    let inside =
        s.h.err(
            "create-machine",
            json!({"workspace": repo.join("src").display().to_string()}),
        )
        .await;
    assert!(inside.contains("give the repository's root"), "{inside}");

    let stopped =
        s.h.err(
            "create-machine",
            json!({"workspace": repo.display().to_string(), "start": false}),
        )
        .await;
    assert!(
        stopped.contains("start: false cannot go with workspace"),
        "{stopped}"
    );
    assert_eq!(
        s.fake.state.lock().unwrap().machines.len(),
        machines_before,
        "no refusal made a machine"
    );
    assert_eq!(
        std::fs::read_dir(s.tmp.path().join("copies/seeds"))
            .map(|d| d.count())
            .unwrap_or(0),
        0,
        "no refusal left a copy behind"
    );

    s.h.ok("create-machine", json!({"name": "plain"})).await;
    let none =
        s.h.err(
            "read-file",
            json!({"name": "plain", "path": "/workspace", "changes": true}),
        )
        .await;
    assert!(none.contains("plain has no workspace"), "{none}");
    let elsewhere =
        s.h.err(
            "read-file",
            json!({"name": "plain", "path": "/etc", "changes": true}),
        )
        .await;
    assert!(
        elsewhere.contains("changes: only /workspace"),
        "{elsewhere}"
    );
    let page_past_budget =
        s.h.err(
            "read-file",
            json!({"name": "plain", "path": "/workspace", "changes": true, "length": 1u64 << 30}),
        )
        .await;
    assert!(
        page_past_budget.contains("length: 1073741824 is over the"),
        "a diff's page is bounded as a file's: {page_past_budget}"
    );

    s.h.ok(
        "create-machine",
        json!({"name": "w", "workspace": repo.display().to_string()}),
    )
    .await;
    let nothing =
        s.h.err("keep-changes", json!({"name": "w", "message": "nothing"}))
            .await;
    assert!(nothing.contains("nothing to keep"), "{nothing}");
    s.h.ok(
        "run-command",
        json!({"name": "w", "command": "echo x >> /workspace/README"}),
    )
    .await;
    let exists =
        s.h.err(
            "keep-changes",
            json!({"name": "w", "message": "m", "branch": "other"}),
        )
        .await;
    assert!(exists.contains("branch: other exists"), "{exists}");
    let bad =
        s.h.err(
            "keep-changes",
            json!({"name": "w", "message": "m", "branch": "a..b"}),
        )
        .await;
    assert!(bad.contains("not a valid branch name"), "{bad}");
    let lonely =
        s.h.err(
            "keep-changes",
            json!({"name": "w", "message": "m", "deleteSiblings": true}),
        )
        .await;
    assert!(lonely.contains("no siblings"), "{lonely}");
    let empty =
        s.h.err("keep-changes", json!({"name": "w", "message": "  "}))
            .await;
    assert!(empty.contains("message:"), "{empty}");
    assert_eq!(snapshot(&repo), before, "no refusal touched the repository");

    // Last, as checking out changes the index's stat data: a detached HEAD refused, the
    // repository as it was while detached.
    let head = git(&repo, &["rev-parse", "HEAD"]);
    git(&repo, &["checkout", "--quiet", "--detach", &head]);
    let detached_before = snapshot(&repo);
    let detached =
        s.h.err(
            "create-machine",
            json!({"workspace": repo.display().to_string()}),
        )
        .await;
    assert!(detached.contains("a detached HEAD"), "{detached}");
    assert_eq!(
        snapshot(&repo),
        detached_before,
        "the detached repository as it was"
    );
}

#[tokio::test]
async fn a_plain_directory_comes_back_as_a_patch_the_user_applies() {
    let s = Setup::new().await;
    let dir = s.tmp.path().join("projects/notes");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("todo.txt"), "one\n").unwrap();
    s.h.ok(
        "create-machine",
        json!({"name": "n", "workspace": dir.display().to_string()}),
    )
    .await;
    s.h.ok(
        "run-command",
        json!({"name": "n", "command": "echo two >> /workspace/todo.txt"}),
    )
    .await;
    let kept =
        s.h.ok("keep-changes", json!({"name": "n", "message": "two"}))
            .await;
    let patch = kept["patch"].as_str().unwrap();
    assert!(
        Path::new(patch).starts_with(s.tmp.path().join("copies")),
        "{patch}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("todo.txt")).unwrap(),
        "one\n"
    );
    let applied = std::process::Command::new("git")
        .arg("-C")
        .arg(&dir)
        .args(["apply", patch])
        .status()
        .unwrap();
    assert!(applied.success());
    assert_eq!(
        std::fs::read_to_string(dir.join("todo.txt")).unwrap(),
        "one\ntwo\n"
    );
}

/// The same loop on the cloud fleet, against the fake cloud with a disk per machine: what the
/// server sends for it is pinned (the create, the archive's parts written with the files route,
/// the guest's tar commands, the archive read back), and the change lands as a branch.
#[tokio::test]
async fn on_cloud_the_workspace_goes_by_the_files_route_and_the_bodies_are_pinned() {
    use crate::common::fake_cloud::FakeCloud;
    let tmp = tempfile::tempdir().unwrap();
    let (allow, store) = workspace_env(&tmp);
    let repo = tmp.path().join("projects/app");
    let cloud = FakeCloud::start_guest_root().await;
    let h = Harness::on_fake_cloud(
        &cloud,
        &[
            ("SMOL_MCP_MOUNT_ALLOW", allow.as_str()),
            ("SMOL_MCP_WORKSPACE_DIR", store.as_str()),
        ],
    )
    .await;
    let created = h
        .ok(
            "create-machine",
            json!({"name": "fixer", "image": "alpine:3.20", "workspace": repo.display().to_string()}),
        )
        .await;
    let id = created["machine"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        std::fs::read_to_string(cloud.disk(&id).join("workspace/README")).unwrap(),
        "hello\n"
    );
    h.ok(
        "run-command",
        json!({"name": "fixer", "command": "echo cloud >> /workspace/README"}),
    )
    .await;
    let changes = h
        .call(
            "read-file",
            json!({"name": "fixer", "path": "/workspace", "changes": true}),
        )
        .await;
    assert!(!changes.is_error, "{}", changes.text);
    assert_eq!(
        file_changes(&changes.structured["changes"]),
        vec![("README".into(), "modified".into())]
    );
    let kept = h
        .ok(
            "keep-changes",
            json!({"name": "fixer", "message": "from the cloud"}),
        )
        .await;
    assert_eq!(git(&repo, &["show", "smol/fixer:README"]), "hello\ncloud");

    let sent: Vec<serde_json::Value> = cloud
        .take_requests()
        .into_iter()
        .filter(|r| {
            let path = r["path"].as_str().unwrap_or_default();
            let readiness = r["body"]["command"]
                .as_str()
                .is_some_and(|c| c.starts_with("echo ready-"))
                || r["body"]["command"][1]
                    .as_str()
                    .is_some_and(|a| a.starts_with("ready-"));
            (r["method"] != "GET" || path.contains("/files/"))
                && !readiness
                && !path.ends_with("/usage")
        })
        .map(|r| {
            let mut body = match &r["body"] {
                serde_json::Value::Object(o) if o.contains_key("octets") => {
                    json!("<archive bytes>")
                }
                serde_json::Value::Object(_) => {
                    serde_json::from_str(&r["body"].to_string().replace(&id, "MACHINE")).unwrap()
                }
                other => other.clone(),
            };
            if body["env"]["SMOL_MCP_RUN"].is_string() {
                body["env"]["SMOL_MCP_RUN"] = json!("RUN-MARKER");
            }
            let entry = json!({
                "method": r["method"],
                "path": r["path"].as_str().unwrap().replace(&id, "MACHINE"),
                "body": body,
            });
            serde_json::from_str(&without_archive_names(&entry.to_string())).unwrap()
        })
        .collect();
    insta::assert_json_snapshot!("workspace_cloud_requests", sent);
    assert!(kept["commit"].is_string());
}

/// The bounds an operator sets: a workspace larger than `workspaceMaxBytes` is refused before
/// any machine exists, and a fan-out that would pass `maxMachinesPerSession` is refused at the
/// child that would, the children made before it deleted again.
#[tokio::test]
async fn a_workspace_past_its_bound_and_a_fan_out_past_the_session_limit_are_refused() {
    let s = Setup::with(&[
        ("SMOL_MCP_WORKSPACE_MAX_BYTES", "16"),
        ("SMOL_MCP_MAX_MACHINES_PER_SESSION", "3"),
    ])
    .await;
    let (fake, h) = (&s.fake, &s.h);
    let big = h
        .err(
            "create-machine",
            json!({"workspace": s.repo().display().to_string()}),
        )
        .await;
    assert!(
        big.contains("over the 16 a workspace may (workspaceMaxBytes)"),
        "{big}"
    );
    assert!(fake.has_no_machines(), "no machine made");

    h.ok("create-machine", json!({"name": "src", "branchable": true}))
        .await;
    let over = h
        .err(
            "branch-machine",
            json!({"name": "src", "childName": "c", "count": 3}),
        )
        .await;
    assert!(over.starts_with("LIMIT_REACHED"), "{over}");
    assert!(over.contains("maxMachinesPerSession"), "{over}");
    assert!(over.contains("deleted again: c-1, c-2"), "{over}");
    let machines = fake.state.lock().unwrap().machines.clone();
    assert_eq!(machines.keys().collect::<Vec<_>>(), ["src"], "all or none");
    // Within the limit the same fan-out is made.
    let two = h
        .ok(
            "branch-machine",
            json!({"name": "src", "childName": "c", "count": 2}),
        )
        .await;
    assert_eq!(two["children"], json!(["c-1", "c-2"]));
}

/// What an operation on the copies leaves only while it runs (`<what>-<8 hex>`): none may be
/// left once a call has answered, refused or not.
fn scratch_left(copies: &Path) -> Vec<String> {
    let mut left = Vec::new();
    let mut pending = vec![copies.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if smol_mcp::workspace::is_scratch(&name) {
                left.push(entry.path().display().to_string());
            }
            if entry.file_type().is_ok_and(|t| t.is_dir()) && name != "tree" && name != "base.git" {
                pending.push(entry.path());
            }
        }
    }
    left
}

/// workspaceTotalMaxBytes bounds the server's copies of all workspaces together: a create with
/// a workspace, a reading and a keep that would pass it are refused (LIMIT_REACHED, before
/// they write, nothing left half-made), the disk under the copies never holds more, and a
/// machine deleted gives its room back. What an ended process left is swept at start-up.
#[tokio::test]
async fn the_copies_of_all_workspaces_together_stay_within_their_bound() {
    // One unit: a 4 MiB file no compressor shrinks. Making a machine's copy sets aside three
    // (the server's repository, the files, the machine's repository) and leaves one (the
    // server's repository); a reading sets aside the archive and the files read back, gives
    // back the archive and the files it replaced, then sets aside their objects, and leaves
    // the files read back.
    const UNIT: usize = 4 << 20;
    let bound = (UNIT as u64) * 9 / 2;
    let tmp = tempfile::tempdir().unwrap();
    let (allow, store) = workspace_env(&tmp);
    let repo = tmp.path().join("projects/app");
    std::fs::write(repo.join("data.bin"), noise(7, UNIT)).unwrap();
    git(&repo, &["add", "data.bin"]);
    git(&repo, &["commit", "--quiet", "-m", "data"]);
    let copies = std::path::PathBuf::from(&store);
    // What a process ended during a reading left, an hour and more ago, and what one under way
    // now has (young): the first is swept at start-up, the second kept.
    let ended = copies.join("machines/local/gone/tree-0123abcd");
    let under_way = copies.join("machines/local/gone/incoming.tgz-89abcdef");
    std::fs::create_dir_all(ended.join("src")).unwrap();
    std::fs::write(ended.join("src/big"), vec![1u8; 4096]).unwrap();
    std::fs::write(&under_way, "x").unwrap();
    let touched = std::process::Command::new("touch")
        .args(["-d", "2 hours ago"])
        .arg(&ended)
        .status()
        .unwrap();
    assert!(touched.success());

    let fake = FakeServe::start_guest_root().await;
    let url = fake.url();
    let bound_text = bound.to_string();
    let h = Harness::start(&[
        ("SMOL_LOCAL_URL", url.as_str()),
        ("SMOL_MCP_MOUNT_ALLOW", allow.as_str()),
        ("SMOL_MCP_WORKSPACE_DIR", store.as_str()),
        ("SMOL_MCP_WORKSPACE_TOTAL_MAX_BYTES", bound_text.as_str()),
    ])
    .await;
    // What a server does at start-up (the in-process harness starts none of its tasks).
    h.protocol.process().sweep_orphans_at_start().await;
    let workspace = repo.display().to_string();
    let within = |when: &str| {
        let used = disk_use(&copies);
        assert!(used <= bound, "{when}: {used} bytes on disk, over {bound}");
        let left = scratch_left(&copies);
        assert!(
            left.iter().all(|p| p.ends_with("incoming.tgz-89abcdef")),
            "{when}: {left:?}"
        );
        used
    };

    h.ok(
        "create-machine",
        json!({"name": "a", "workspace": workspace}),
    )
    .await;
    assert!(!ended.exists(), "what an ended process left is swept");
    assert!(under_way.exists(), "what may be under way is not");
    let one = within("one copy");
    assert!(
        one > UNIT as u64 && one < 2 * UNIT as u64,
        "a copy as made keeps only its base: {one}"
    );
    h.ok(
        "create-machine",
        json!({"name": "b", "workspace": workspace}),
    )
    .await;
    within("two copies");
    let full = h
        .err(
            "create-machine",
            json!({"name": "c", "workspace": workspace}),
        )
        .await;
    assert!(full.starts_with("LIMIT_REACHED"), "{full}");
    assert!(full.contains("workspaceTotalMaxBytes"), "{full}");
    assert!(full.contains("nothing of them was written"), "{full}");
    assert!(
        !fake.has_machine("c"),
        "refused before any machine was made"
    );
    let seeds = std::fs::read_dir(copies.join("seeds")).unwrap().count();
    assert_eq!(seeds, 2, "the refused create's copy is gone");
    within("a create refused");

    let changes_of = json!({"name": "a", "path": "/workspace", "changes": true});
    let unchanged = h.ok("read-file", changes_of.clone()).await;
    assert_eq!(unchanged["changes"]["files"], json!([]));
    within("a reading");

    // A machine that writes another unit into its workspace: reading it back (a keep reads it
    // too) would pass the bound.
    h.ok(
        "run-command",
        json!({"name": "a", "command": "head -c 4194304 /dev/urandom > /workspace/more.bin"}),
    )
    .await;
    let grown = h.err("read-file", changes_of.clone()).await;
    assert!(grown.starts_with("LIMIT_REACHED"), "{grown}");
    assert!(grown.contains("workspaceTotalMaxBytes"), "{grown}");
    within("a larger reading refused");
    let keep = h
        .err("keep-changes", json!({"name": "a", "message": "more"}))
        .await;
    assert!(keep.starts_with("LIMIT_REACHED"), "{keep}");
    within("a keep refused");
    assert!(
        git(&repo, &["branch", "--list", "smol/a"])
            .trim()
            .is_empty(),
        "nothing kept"
    );

    // Back to one unit: with b's copy beside it the reading still does not fit (the files it
    // replaces are counted until they are gone); b deleted, it does.
    h.ok(
        "run-command",
        json!({"name": "a", "command": "rm /workspace/more.bin && echo x >> /workspace/README"}),
    )
    .await;
    let beside_b = h.err("read-file", changes_of.clone()).await;
    assert!(beside_b.starts_with("LIMIT_REACHED"), "{beside_b}");
    within("a reading beside b refused");
    h.ok("delete-machine", json!({"name": "b"})).await;
    within("b deleted");
    let changed = h.ok("read-file", changes_of).await;
    assert_eq!(
        file_changes(&changed["changes"]),
        [("README".to_owned(), "modified".to_owned())]
    );
    within("a reading once b is gone");
    let kept = h
        .ok("keep-changes", json!({"name": "a", "message": "readme"}))
        .await;
    assert_eq!(kept["branch"], "smol/a");
    within("a keep");
}

/// A reading's archive in the machine has a name of its own (`smol-workspace-out-<8 hex>.tgz`):
/// the same name for every reading here, so the pinned requests do not change with it.
fn without_archive_names(text: &str) -> String {
    const STEM: &str = "smol-workspace-out-";
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(STEM) {
        out.push_str(&rest[..at + STEM.len()]);
        rest = &rest[at + STEM.len()..];
        let hex = rest.chars().take_while(char::is_ascii_hexdigit).count();
        assert_eq!(hex, 8, "{text}");
        out.push_str("RANDOM");
        rest = &rest[hex..];
    }
    out.push_str(rest);
    out
}

/// run-once with a workspace: the command runs in the copy (its workdir `/workspace` unless
/// given), and the machine and the server's copy are gone afterwards.
#[tokio::test]
async fn run_once_runs_in_the_workspace_and_leaves_nothing() {
    let s = Setup::new().await;
    let ran =
        s.h.ok(
            "run-once",
            json!({"workspace": s.repo().display().to_string(), "command": "cat README && ls"}),
        )
        .await;
    assert_eq!(ran["exitCode"], 0, "{ran}");
    assert!(
        ran["stdout"].as_str().unwrap().starts_with("hello\n"),
        "{ran}"
    );
    assert!(ran["stdout"].as_str().unwrap().contains("src"), "{ran}");
    assert!(s.fake.has_no_machines(), "the machine went");
    let seeds = s.tmp.path().join("copies/seeds");
    assert_eq!(
        std::fs::read_dir(&seeds).map(|d| d.count()).unwrap_or(0),
        0,
        "nor is a copy left"
    );
}

#[tokio::test]
async fn keep_changes_refuses_a_branch_or_message_git_would_misread_before_writing_anything() {
    let s = Setup::new().await;
    let repo = s.repo();
    s.h.ok(
        "create-machine",
        json!({"name": "w", "workspace": repo.display().to_string()}),
    )
    .await;
    s.h.ok(
        "run-command",
        json!({"name": "w", "command": "echo x >> /workspace/README"}),
    )
    .await;
    let before = (snapshot(&repo), object_files(&repo));
    let long = "a".repeat(300);
    for branch in ["@", "HEAD", "refs/heads/main", long.as_str(), "main/x"] {
        let bad =
            s.h.err(
                "keep-changes",
                json!({"name": "w", "message": "m", "branch": branch}),
            )
            .await;
        assert!(
            bad.contains("branch: ") && bad.contains("not a valid branch name"),
            "{branch}: {bad}"
        );
        assert_eq!(
            (snapshot(&repo), object_files(&repo)),
            before,
            "{branch}: nothing written"
        );
    }
    let nul =
        s.h.err(
            "keep-changes",
            json!({"name": "w", "message": "a\u{0}b", "branch": "smol/ok"}),
        )
        .await;
    assert!(
        nul.contains("message: ") && nul.contains("U+0000"),
        "an argument's refusal, not the server's failure: {nul}"
    );
    assert_eq!((snapshot(&repo), object_files(&repo)), before);
    let kept =
        s.h.ok(
            "keep-changes",
            json!({"name": "w", "message": "m", "branch": "smol/ok"}),
        )
        .await;
    assert_eq!(kept["branch"], "smol/ok");
}

/// keep-changes writes into the user's repository only while it is still a directory the
/// operator allows: a server started again with another `mountAllow` refuses to keep a
/// machine's changes into a repository outside it, and writes nothing there.
#[tokio::test]
async fn keep_changes_writes_only_where_mount_allow_still_allows() {
    let s = Setup::new().await;
    let repo = s.repo();
    s.h.ok(
        "create-machine",
        json!({"name": "kept-out", "workspace": repo.display().to_string()}),
    )
    .await;
    s.h.ok(
        "run-command",
        json!({"name": "kept-out", "command": "cd /workspace && echo more >> README"}),
    )
    .await;
    let before = snapshot(&repo);
    let elsewhere = s.tmp.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let url = s.fake.url();
    let store = s.tmp.path().join("copies").display().to_string();
    let allow = elsewhere.display().to_string();
    let next =
        s.h.next_process(&[
            ("SMOL_LOCAL_URL", url.as_str()),
            ("SMOL_MCP_MOUNT_ALLOW", allow.as_str()),
            ("SMOL_MCP_WORKSPACE_DIR", store.as_str()),
        ])
        .await;
    let text = next
        .err(
            "keep-changes",
            json!({"name": "kept-out", "message": "more", "branch": "smol/out"}),
        )
        .await;
    assert!(
        text.starts_with("INVALID_ARGUMENT: name:")
            && text.contains("not in a directory the operator allows mounting"),
        "{text}"
    );
    assert_eq!(
        snapshot(&repo),
        before,
        "nothing written into the repository"
    );
}
