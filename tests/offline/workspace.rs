//! The workspace's host side with the host's real git: a repository or a plain directory
//! copied, changes made in the copy seen as a machine would leave them, kept as a branch or a
//! patch; every refusal, with the user's repository (refs, HEAD, index, working tree) compared
//! byte for byte before and after; and a copy whose `.git` a guest rewrote to run commands,
//! which never run.

use smol_mcp::workspace::{self, Change, Kept, OriginKind, Unbounded, WorkspaceError};
use std::path::Path;

pub use crate::common::git;
use std::process::Command;

/// A repository with two commits on `main`, a second branch, and an ignored build directory.
pub fn repository(dir: &Path) {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    git(dir, &["init", "--quiet", "--initial-branch", "main"]);
    std::fs::write(dir.join("README"), "hello\n").unwrap();
    std::fs::write(dir.join("src/lib.rs"), "fn one() {}\n").unwrap();
    std::fs::write(dir.join(".gitignore"), "target/\n").unwrap();
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "first"]);
    std::fs::write(dir.join("old.txt"), "to be deleted\n").unwrap();
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "second"]);
    git(dir, &["branch", "other"]);
    std::fs::create_dir_all(dir.join("target")).unwrap();
    std::fs::write(dir.join("target/out"), "built").unwrap();
}

/// Everything of the user's repository a keep or a refusal must leave as it was.
pub fn snapshot(dir: &Path) -> (String, String, String, Vec<u8>, String) {
    (
        git(dir, &["for-each-ref", "--format=%(refname) %(objectname)"]),
        std::fs::read_to_string(dir.join(".git/HEAD")).unwrap(),
        git(
            dir,
            &[
                "status",
                "--porcelain=v1",
                "--untracked-files=all",
                "--ignored",
            ],
        ),
        std::fs::read(dir.join(".git/index")).unwrap(),
        git(dir, &["stash", "list"]),
    )
}

pub fn without_ref(refs: &str, name: &str) -> String {
    refs.lines()
        .filter(|l| !l.starts_with(&format!("{name} ")))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_repository_s_changes_come_back_as_a_branch_and_nothing_else_of_it_moves() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("project");
    repository(&repo);
    let head = git(&repo, &["rev-parse", "HEAD"]);
    let origin = workspace::inspect(&repo).unwrap();
    assert_eq!(
        origin.kind,
        OriginKind::Git {
            head: head.clone(),
            branch: "main".into()
        }
    );
    let ws = workspace::seed(&origin, &tmp.path().join("ws"), 1 << 20, &Unbounded).unwrap();
    assert_eq!(ws.base, head, "the copy starts at the user's own commit");
    let tree = ws.tree().to_path_buf();
    assert_eq!(
        std::fs::read_to_string(tree.join("src/lib.rs")).unwrap(),
        "fn one() {}\n"
    );
    assert!(!tree.join("target").exists(), "only the commit's files");
    // git works in the machine's copy, and finds it clean.
    assert_eq!(git(&tree, &["status", "--porcelain"]), "");
    assert_eq!(git(&tree, &["rev-parse", "HEAD"]), head);
    assert!(
        workspace::changes(&ws, &Unbounded)
            .unwrap()
            .files
            .is_empty()
    );

    // What a machine does: edit, add, delete, a binary file, an executable, a build output,
    // and a commit of its own in its copy's .git (which the host never reads).
    std::fs::write(tree.join("src/lib.rs"), "fn one() {}\nfn two() {}\n").unwrap();
    std::fs::write(tree.join("NEW.md"), "new\n").unwrap();
    std::fs::remove_file(tree.join("old.txt")).unwrap();
    std::fs::write(tree.join("logo.bin"), [0u8, 159, 146, 150, 0, 1, 2]).unwrap();
    std::fs::write(tree.join("run.sh"), "#!/bin/sh\n").unwrap();
    Command::new("chmod")
        .arg("755")
        .arg(tree.join("run.sh"))
        .status()
        .unwrap();
    std::fs::create_dir_all(tree.join("target")).unwrap();
    std::fs::write(tree.join("target/out"), "ignored").unwrap();
    git(&tree, &["add", "."]);
    git(&tree, &["commit", "--quiet", "-m", "the guest's own"]);

    let changes = workspace::changes(&ws, &Unbounded).unwrap();
    let listed: Vec<(String, Change, u64, bool)> = changes
        .files
        .iter()
        .map(|f| (f.path.clone(), f.change, f.bytes, f.binary))
        .collect();
    assert_eq!(
        listed,
        [
            ("NEW.md".to_owned(), Change::Added, 4, false),
            ("logo.bin".to_owned(), Change::Added, 7, true),
            ("old.txt".to_owned(), Change::Deleted, 14, false),
            ("run.sh".to_owned(), Change::Added, 10, false),
            ("src/lib.rs".to_owned(), Change::Modified, 24, false),
        ]
    );
    let diff = std::fs::read_to_string(&changes.diff).unwrap();
    assert_eq!(diff.len() as u64, changes.diff_bytes);
    assert!(diff.contains("+fn two() {}"), "{diff}");
    assert!(diff.contains("-to be deleted"), "{diff}");
    assert!(
        diff.contains("Binary files /dev/null and b/logo.bin differ"),
        "{diff}"
    );
    assert!(!diff.contains("ignored"), "build output stays out: {diff}");

    let before = snapshot(&repo);
    let kept = workspace::keep(
        &ws,
        "smol/try-1",
        "Add two()",
        &tmp.path().join("unused.patch"),
        &Unbounded,
    )
    .unwrap();
    let Kept::Branch { branch, commit } = kept else {
        panic!("a repository's changes are a branch")
    };
    assert_eq!(branch, "smol/try-1");
    let after = snapshot(&repo);
    assert_eq!(
        without_ref(&after.0, "refs/heads/smol/try-1"),
        before.0,
        "no other ref moved"
    );
    assert_eq!(after.4, before.4, "stashes");
    assert_eq!(after.1, before.1, "HEAD");
    assert_eq!(after.2, before.2, "working tree");
    assert_eq!(after.3, before.3, "index");
    assert!(after.0.contains(&format!("refs/heads/smol/try-1 {commit}")));
    assert_eq!(git(&repo, &["rev-parse", &format!("{commit}^")]), head);
    assert_eq!(
        git(&repo, &["log", "-1", "--format=%s", &commit]),
        "Add two()"
    );
    // The user's review and merge, as the README shows it.
    let stat = git(&repo, &["diff", "--stat", "main", "smol/try-1"]);
    assert!(stat.contains("5 files changed"), "{stat}");
    git(&repo, &["merge", "--quiet", "--ff-only", "smol/try-1"]);
    assert_eq!(
        std::fs::read_to_string(repo.join("src/lib.rs")).unwrap(),
        "fn one() {}\nfn two() {}\n"
    );
    assert_eq!(
        std::fs::read(repo.join("logo.bin")).unwrap(),
        [0u8, 159, 146, 150, 0, 1, 2]
    );
    assert!(!repo.join("old.txt").exists());
    assert_eq!(git(&repo, &["fsck", "--no-progress"]), "");

    // The same branch name again: refused, nothing written.
    let before = snapshot(&repo);
    let err = workspace::keep(
        &ws,
        "smol/try-1",
        "again",
        &tmp.path().join("p"),
        &Unbounded,
    )
    .unwrap_err();
    assert!(matches!(err, WorkspaceError::BranchExists { .. }), "{err}");
    assert!(
        err.to_string().contains("give another branch name"),
        "{err}"
    );
    assert_eq!(snapshot(&repo), before);
    let err =
        workspace::keep(&ws, "bad..name", "x", &tmp.path().join("p"), &Unbounded).unwrap_err();
    assert!(matches!(err, WorkspaceError::BadBranchName { .. }), "{err}");
    assert_eq!(snapshot(&repo), before);
}

#[test]
fn a_repository_that_cannot_be_a_workspace_is_refused_saying_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("project");
    repository(&repo);

    std::fs::write(repo.join("README"), "changed\n").unwrap();
    std::fs::write(repo.join("untracked.txt"), "new\n").unwrap();
    let before = snapshot(&repo);
    let err = workspace::inspect(&repo).unwrap_err();
    assert!(matches!(err, WorkspaceError::Dirty { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("README")
            && text.contains("untracked.txt")
            && text.contains("commit or stash"),
        "{text}"
    );
    assert_eq!(snapshot(&repo), before, "looking changed nothing");
    git(&repo, &["checkout", "--quiet", "--", "README"]);
    std::fs::remove_file(repo.join("untracked.txt")).unwrap();

    let err = workspace::inspect(&repo.join("src")).unwrap_err();
    assert!(
        matches!(err, WorkspaceError::NotRepositoryRoot { .. }),
        "{err}"
    );

    let head = git(&repo, &["rev-parse", "HEAD"]);
    git(&repo, &["checkout", "--quiet", &head]);
    let err = workspace::inspect(&repo).unwrap_err();
    assert!(matches!(err, WorkspaceError::Detached { .. }), "{err}");
    assert!(err.to_string().contains("check out the branch"), "{err}");
    git(&repo, &["checkout", "--quiet", "main"]);

    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    git(&empty, &["init", "--quiet"]);
    let err = workspace::inspect(&empty).unwrap_err();
    assert!(matches!(err, WorkspaceError::Unborn { .. }), "{err}");

    let err = workspace::inspect(&tmp.path().join("nowhere")).unwrap_err();
    assert!(matches!(err, WorkspaceError::NotADirectory { .. }), "{err}");

    let origin = workspace::inspect(&repo).unwrap();
    let err = workspace::seed(&origin, &tmp.path().join("ws"), 10, &Unbounded).unwrap_err();
    assert!(matches!(err, WorkspaceError::TooLarge { .. }), "{err}");
    assert!(err.to_string().contains("workspaceMaxBytes"), "{err}");

    let ws = workspace::seed(&origin, &tmp.path().join("ws2"), 1 << 20, &Unbounded).unwrap();
    let before = snapshot(&repo);
    let err =
        workspace::keep(&ws, "smol/none", "x", &tmp.path().join("p"), &Unbounded).unwrap_err();
    assert!(matches!(err, WorkspaceError::NoChanges), "{err}");
    assert_eq!(snapshot(&repo), before);
}

#[test]
fn a_guest_written_git_config_never_runs_on_the_host() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("project");
    repository(&repo);
    let ws = workspace::seed(
        &workspace::inspect(&repo).unwrap(),
        &tmp.path().join("ws"),
        1 << 20,
        &Unbounded,
    )
    .unwrap();
    let tree = ws.tree().to_path_buf();
    let ran = tmp.path().join("ran");
    let payload = format!("#!/bin/sh\ntouch {}\n", ran.display());
    let hook = tree.join(".git/hooks/pre-commit");
    std::fs::write(&hook, &payload).unwrap();
    Command::new("chmod")
        .arg("755")
        .arg(&hook)
        .status()
        .unwrap();
    std::fs::write(tree.join("evil.sh"), &payload).unwrap();
    Command::new("chmod")
        .arg("755")
        .arg(tree.join("evil.sh"))
        .status()
        .unwrap();
    let config = tree.join(".git/config");
    let mut text = std::fs::read_to_string(&config).unwrap();
    let evil = tree.join("evil.sh").display().to_string();
    text.push_str(&format!(
        "[core]\n\tfsmonitor = {evil}\n\thooksPath = {}\n[diff]\n\texternal = {evil}\n",
        tree.join(".git/hooks").display()
    ));
    std::fs::write(&config, text).unwrap();
    // And one in a subdirectory, where a git walking up from a path would find it.
    std::fs::create_dir_all(tree.join("src/.git")).unwrap();
    std::fs::write(
        tree.join("src/.git/config"),
        format!("[core]\n\tfsmonitor = {evil}\n"),
    )
    .unwrap();
    std::fs::write(tree.join("src/lib.rs"), "changed\n").unwrap();

    let changes = workspace::changes(&ws, &Unbounded).unwrap();
    assert!(changes.files.iter().any(|f| f.path == "src/lib.rs"));
    workspace::keep(&ws, "smol/safe", "safe", &tmp.path().join("p"), &Unbounded).unwrap();
    assert!(!ran.exists(), "a command the guest planted ran on the host");
}

#[test]
fn a_plain_directory_s_changes_come_back_as_a_patch_the_user_applies() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("notes");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(dir.join("sub/b.txt"), "beta\n").unwrap();
    std::fs::write(dir.join("gone.txt"), "bye\n").unwrap();
    let origin = workspace::inspect(&dir).unwrap();
    assert_eq!(origin.kind, OriginKind::Plain);
    let ws = workspace::seed(&origin, &tmp.path().join("ws"), 1 << 20, &Unbounded).unwrap();
    let tree = ws.tree().to_path_buf();
    assert!(
        !tree.join(".git").exists(),
        "a plain directory's copy has no repository"
    );
    std::fs::write(tree.join("a.txt"), "alpha\nomega\n").unwrap();
    std::fs::write(tree.join("sub/c.bin"), [0u8, 1, 2, 255]).unwrap();
    std::fs::remove_file(tree.join("gone.txt")).unwrap();
    let changes = workspace::changes(&ws, &Unbounded).unwrap();
    assert_eq!(changes.files.len(), 3, "{:?}", changes.files);

    let before: Vec<(String, Vec<u8>)> = ["a.txt", "sub/b.txt", "gone.txt"]
        .iter()
        .map(|p| (p.to_string(), std::fs::read(dir.join(p)).unwrap()))
        .collect();
    let patch = tmp.path().join("out/notes.patch");
    let kept = workspace::keep(&ws, "ignored", "m", &patch, &Unbounded).unwrap();
    assert_eq!(
        kept,
        Kept::Patch {
            path: patch.clone()
        }
    );
    for (path, bytes) in &before {
        assert_eq!(
            &std::fs::read(dir.join(path)).unwrap(),
            bytes,
            "{path} untouched"
        );
    }
    // The user applies it in the directory.
    let applied = Command::new("git")
        .arg("apply")
        .arg(&patch)
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("a.txt")).unwrap(),
        "alpha\nomega\n"
    );
    assert_eq!(
        std::fs::read(dir.join("sub/c.bin")).unwrap(),
        [0u8, 1, 2, 255]
    );
    assert!(!dir.join("gone.txt").exists());
}

/// An executable file of `body`.
fn executable(path: &Path, body: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, body).unwrap();
    Command::new("chmod").arg("755").arg(path).status().unwrap();
}

/// What ran of the planted commands: the markers they left, by name.
fn markers(marks: &Path) -> Vec<String> {
    let mut ran: Vec<String> = std::fs::read_dir(marks)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    ran.sort();
    ran
}

/// Every object file of a repository, by path: what a refused keep must not add to.
pub fn object_files(repo: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![repo.join(".git/objects")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                found.push(path.display().to_string());
            }
        }
    }
    found.sort();
    found
}

/// The hooks git runs, each planted in the repository's hooks and in a `core.hooksPath`.
const HOOKS: &[&str] = &[
    "applypatch-msg",
    "pre-applypatch",
    "post-applypatch",
    "pre-commit",
    "pre-merge-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-rebase",
    "post-checkout",
    "post-merge",
    "pre-push",
    "pre-receive",
    "update",
    "proc-receive",
    "post-receive",
    "post-update",
    "reference-transaction",
    "push-to-checkout",
    "pre-auto-gc",
    "post-rewrite",
    "post-index-change",
    "fsmonitor-watchman",
];

#[test]
fn nothing_a_users_repository_configures_runs_on_the_host() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("project");
    repository(&repo);
    let marks = tmp.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let bin = tmp.path().join("bin");
    // Each planted command leaves a marker named for what it was planted as, then does what
    // its caller expects (a filter passes its input through), so that nothing fails for
    // another reason than the command not running.
    let passes = |name: &str| {
        let path = bin.join(name);
        executable(
            &path,
            &format!("#!/bin/sh\ntouch {}/{name}\ncat\n", marks.display()),
        );
        path.display().to_string()
    };
    let exits = |name: &str| {
        let path = bin.join(name);
        executable(
            &path,
            &format!("#!/bin/sh\ntouch {}/{name}\nexit 0\n", marks.display()),
        );
        path.display().to_string()
    };

    // A submodule whose own configuration names a filter its attributes use.
    let sub_source = tmp.path().join("sub-source");
    std::fs::create_dir_all(&sub_source).unwrap();
    git(
        &sub_source,
        &["init", "--quiet", "--initial-branch", "main"],
    );
    std::fs::write(sub_source.join("s.txt"), "sub\n").unwrap();
    std::fs::write(sub_source.join(".gitattributes"), "* filter=subevil\n").unwrap();
    git(&sub_source, &["add", "."]);
    git(&sub_source, &["commit", "--quiet", "-m", "sub"]);
    git(
        &repo,
        &[
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "--quiet",
            "add",
            &sub_source.display().to_string(),
            "sub",
        ],
    );
    // Files whose attributes name every kind of driver, committed before any is defined.
    for name in ["a.txt", "b.txt", "c.txt", "d.txt"] {
        std::fs::write(repo.join(name), "x\n").unwrap();
    }
    std::fs::write(
        repo.join(".gitattributes"),
        "a.txt filter=cleaner\nb.txt filter=proc\nc.txt filter=included\n\
         d.txt filter=conditional\n* diff=conv merge=merger\n",
    )
    .unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "--quiet", "-m", "drivers"]);
    std::fs::create_dir_all(repo.join(".git/info")).unwrap();
    std::fs::write(
        repo.join(".git/info/attributes"),
        "README filter=infoattr\n",
    )
    .unwrap();

    let hooks_path = tmp.path().join("hooks");
    for hook in HOOKS {
        executable(
            &repo.join(".git/hooks").join(hook),
            &format!("#!/bin/sh\ntouch {}/hook-{hook}\nexit 0\n", marks.display()),
        );
        executable(
            &hooks_path.join(hook),
            &format!(
                "#!/bin/sh\ntouch {}/hookspath-{hook}\nexit 0\n",
                marks.display()
            ),
        );
    }
    let included = tmp.path().join("included.config");
    std::fs::write(
        &included,
        format!(
            "[filter \"included\"]\n\tclean = {}\n\tsmudge = {}\n\trequired = true\n",
            passes("included-clean"),
            passes("included-smudge")
        ),
    )
    .unwrap();
    let conditional = tmp.path().join("conditional.config");
    std::fs::write(
        &conditional,
        format!(
            "[filter \"conditional\"]\n\tclean = {}\n\trequired = true\n[core]\n\tfsmonitor = {}\n",
            passes("conditional-clean"),
            exits("conditional-fsmonitor")
        ),
    )
    .unwrap();
    let mut config = std::fs::read_to_string(repo.join(".git/config")).unwrap();
    config.push_str(&format!(
        "[filter \"cleaner\"]\n\tclean = {}\n\tsmudge = {}\n\trequired = true\n\
         [filter \"infoattr\"]\n\tclean = {}\n\trequired = true\n\
         [filter \"proc\"]\n\tprocess = {}\n\trequired = true\n\
         [diff \"conv\"]\n\ttextconv = {}\n\
         [merge \"merger\"]\n\tdriver = {}\n\
         [diff]\n\texternal = {}\n\
         [core]\n\tfsmonitor = {}\n\tpager = {}\n\tsshCommand = {}\n\taskPass = {}\n\
         \teditor = {}\n\thooksPath = {}\n\talternateRefsCommand = {}\n\
         [sequence]\n\teditor = {}\n\
         [pager]\n\tstatus = {}\n\tlog = {}\n\
         [credential]\n\thelper = !{}\n\
         [commit]\n\tgpgSign = true\n[tag]\n\tgpgSign = true\n\
         [gpg]\n\tprogram = {}\n[log]\n\tshowSignature = true\n\
         [status]\n\tsubmoduleSummary = true\n\
         [remote \"origin\"]\n\turl = ssh://example.invalid/x\n\tuploadpack = {}\n\
         [uploadpack]\n\tpackObjectsHook = {}\n\
         [include]\n\tpath = {}\n\
         [includeIf \"gitdir:{}/\"]\n\tpath = {}\n",
        passes("clean"),
        passes("smudge"),
        passes("infoattr-clean"),
        exits("process"),
        passes("textconv"),
        exits("merge-driver"),
        exits("diff-external"),
        exits("fsmonitor"),
        passes("pager"),
        exits("ssh"),
        exits("askpass"),
        exits("editor"),
        hooks_path.display(),
        exits("alternate-refs"),
        exits("sequence-editor"),
        passes("pager-status"),
        passes("pager-log"),
        exits("credential"),
        exits("gpg"),
        exits("uploadpack"),
        exits("pack-objects-hook"),
        included.display(),
        repo.join(".git").display(),
        conditional.display(),
    ));
    std::fs::write(repo.join(".git/config"), config).unwrap();
    // The submodule's own configuration, which a status recursing into it reads.
    let sub_config = repo.join(".git/modules/sub/config");
    let mut text = std::fs::read_to_string(&sub_config).unwrap();
    text.push_str(&format!(
        "[filter \"subevil\"]\n\tclean = {}\n\trequired = true\n[core]\n\tfsmonitor = {}\n",
        passes("sub-clean"),
        exits("sub-fsmonitor")
    ));
    std::fs::write(&sub_config, text).unwrap();
    // Stat data that no longer matches the index, so that git reads the files' content (through
    // any filter) to know whether they changed.
    for path in ["a.txt", "b.txt", "c.txt", "d.txt", "README", "sub/s.txt"] {
        Command::new("touch")
            .args(["-d", "2030-01-01 00:00:00"])
            .arg(repo.join(path))
            .status()
            .unwrap();
    }

    let head = git(&repo, &["rev-parse", "HEAD"]);
    let origin = workspace::inspect(&repo)
        .unwrap_or_else(|e| panic!("{e}; planted commands that ran: {:?}", markers(&marks)));
    assert_eq!(
        origin.kind,
        OriginKind::Git {
            head: head.clone(),
            branch: "main".into()
        },
        "the repository is clean and on main"
    );
    let ws = workspace::seed(&origin, &tmp.path().join("ws"), 1 << 20, &Unbounded).unwrap();
    assert_eq!(ws.base, head);
    assert_eq!(
        std::fs::read_to_string(ws.tree().join("a.txt")).unwrap(),
        "x\n"
    );
    std::fs::write(ws.tree().join("a.txt"), "y\n").unwrap();
    let changes = workspace::changes(&ws, &Unbounded).unwrap();
    assert_eq!(
        changes
            .files
            .iter()
            .map(|f| f.path.as_str())
            .collect::<Vec<_>>(),
        ["a.txt"]
    );
    let kept = workspace::keep(
        &ws,
        "smol/planted",
        "kept",
        &tmp.path().join("p"),
        &Unbounded,
    )
    .unwrap();
    let Kept::Branch { commit, .. } = kept else {
        panic!("a repository's changes are a branch")
    };
    assert_eq!(
        git(&repo, &["rev-parse", "refs/heads/smol/planted"]),
        commit
    );
    assert_eq!(
        markers(&marks),
        Vec::<String>::new(),
        "planted commands ran"
    );

    // The plants are live: the user's own git runs them (and fails on the failing process
    // filter, which is required).
    Command::new("git")
        .arg("-C")
        .arg(&repo)
        .args(["status", "--porcelain"])
        .output()
        .unwrap();
    assert!(
        markers(&marks).contains(&"clean".to_owned()),
        "{:?}",
        markers(&marks)
    );
}

#[test]
fn a_sha256_repository_is_copied_and_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("project");
    std::fs::create_dir_all(&repo).unwrap();
    git(
        &repo,
        &[
            "init",
            "--quiet",
            "--object-format=sha256",
            "--initial-branch",
            "main",
        ],
    );
    std::fs::write(repo.join("README"), "hello\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "--quiet", "-m", "first"]);
    let origin = workspace::inspect(&repo).unwrap();
    let ws = workspace::seed(&origin, &tmp.path().join("ws"), 1 << 20, &Unbounded).unwrap();
    assert_eq!(ws.base.len(), 64);
    std::fs::write(ws.tree().join("README"), "changed\n").unwrap();
    let kept = workspace::keep(&ws, "smol/sha", "m", &tmp.path().join("p"), &Unbounded).unwrap();
    assert!(matches!(kept, Kept::Branch { .. }), "{kept:?}");
    assert_eq!(git(&repo, &["fsck", "--no-progress"]), "");
}

#[test]
fn a_branch_name_git_reads_as_something_else_is_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("project");
    repository(&repo);
    git(&repo, &["tag", "v1"]);
    let ws = workspace::seed(
        &workspace::inspect(&repo).unwrap(),
        &tmp.path().join("ws"),
        1 << 20,
        &Unbounded,
    )
    .unwrap();
    std::fs::write(ws.tree().join("README"), "changed\n").unwrap();
    let before = (snapshot(&repo), object_files(&repo));
    let long = "a".repeat(300);
    let short_hex = git(&repo, &["rev-parse", "--short=8", "HEAD"]);
    for branch in [
        "@",
        "HEAD",
        "head",
        "refs/heads/main",
        "refs/x",
        "-x",
        "a..b",
        "a@{1}",
        "a\\b",
        "a\u{7}b",
        "a\nb",
        "",
        long.as_str(),
        "main/x",
        "v1",
        "ORIG_HEAD",
        "FETCH_HEAD",
        short_hex.as_str(),
        "a b",
        "a/",
        "a.lock",
    ] {
        let err = workspace::keep(&ws, branch, "m", &tmp.path().join("p"), &Unbounded).unwrap_err();
        assert!(
            matches!(err, WorkspaceError::BadBranchName { .. }),
            "{branch:?}: {err}"
        );
        assert!(
            err.to_string().contains("letters, digits"),
            "{branch:?}: says what is accepted: {err}"
        );
        assert_eq!(
            (snapshot(&repo), object_files(&repo)),
            before,
            "{branch:?}: nothing written"
        );
    }
    for message in ["a\0b", "a\u{1b}[31mred"] {
        let err = workspace::keep(&ws, "smol/ok", message, &tmp.path().join("p"), &Unbounded)
            .unwrap_err();
        assert!(
            matches!(err, WorkspaceError::BadMessage { .. }),
            "{message:?}: {err}"
        );
        assert_eq!((snapshot(&repo), object_files(&repo)), before);
    }
    // A name of 200 bytes, and a message with lines and tabs, are kept.
    let longest = format!("smol/{}", "b".repeat(195));
    let kept = workspace::keep(
        &ws,
        &longest,
        "title\n\n\tbody",
        &tmp.path().join("p"),
        &Unbounded,
    )
    .unwrap();
    assert!(matches!(kept, Kept::Branch { .. }), "{kept:?}");
}

#[test]
fn a_git_directory_outside_the_directory_given_is_refused_naming_nothing_of_it() {
    let tmp = tempfile::tempdir().unwrap();
    let elsewhere = tmp.path().join("elsewhere-secret");
    repository(&elsewhere);
    std::fs::write(elsewhere.join("secret-plans.txt"), "x\n").unwrap();
    let allowed = tmp.path().join("allowed");
    // A `.git` file naming the outside repository's git directory.
    let linked = allowed.join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    std::fs::write(
        linked.join(".git"),
        format!("gitdir: {}\n", elsewhere.join(".git").display()),
    )
    .unwrap();
    // A `.git` symlink to it.
    let symlinked = allowed.join("symlinked");
    std::fs::create_dir_all(&symlinked).unwrap();
    std::os::unix::fs::symlink(elsewhere.join(".git"), symlinked.join(".git")).unwrap();
    // A linked worktree of the outside repository.
    let worktree = allowed.join("worktree");
    git(
        &elsewhere,
        &[
            "worktree",
            "add",
            "--quiet",
            "-b",
            "wt",
            &worktree.display().to_string(),
        ],
    );
    for dir in [&linked, &symlinked, &worktree] {
        let err = workspace::inspect(dir).unwrap_err();
        assert!(
            matches!(err, WorkspaceError::GitDirOutside { .. }),
            "{}: {err}",
            dir.display()
        );
        let text = err.to_string();
        assert!(
            !text.contains("elsewhere") && !text.contains("secret"),
            "names the outside repository: {text}"
        );
        assert!(text.contains(&dir.display().to_string()), "{text}");
    }
    // The repository's own root is still a workspace.
    std::fs::remove_file(elsewhere.join("secret-plans.txt")).unwrap();
    workspace::inspect(&elsewhere).unwrap();
}

/// The bytes of the files under `dir`.
pub fn disk_use(dir: &Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            let meta = path.symlink_metadata().unwrap();
            if meta.is_dir() {
                pending.push(path);
            } else {
                total += meta.len();
            }
        }
    }
    total
}

/// `len` bytes no compressor shrinks, different for each `seed`.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

#[test]
fn readings_of_a_copy_leave_the_disk_use_of_one() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("project");
    repository(&repo);
    let ws = workspace::seed(
        &workspace::inspect(&repo).unwrap(),
        &tmp.path().join("ws"),
        64 << 20,
        &Unbounded,
    )
    .unwrap();
    let big = 8 << 20;
    let mut after_first = 0;
    for reading in 0..6u64 {
        // What a machine leaves between readings: the large file rewritten, or as it was.
        if reading != 3 {
            std::fs::write(ws.tree().join("big.bin"), noise(reading, big)).unwrap();
        }
        let changes = workspace::changes(&ws, &Unbounded).unwrap();
        assert!(changes.files.iter().any(|f| f.path == "big.bin"));
        let used = disk_use(&ws.root);
        if reading == 0 {
            after_first = used;
        }
        assert!(
            used <= after_first + (1 << 20),
            "reading {reading}: {used} bytes, after the first {after_first}"
        );
    }
    // What the readings reclaimed is not what a keep needs.
    let kept = workspace::keep(&ws, "smol/big", "big", &tmp.path().join("p"), &Unbounded).unwrap();
    let Kept::Branch { commit, .. } = kept else {
        panic!("a repository's changes are a branch")
    };
    assert_eq!(
        git(&repo, &["cat-file", "-s", &format!("{commit}:big.bin")]),
        big.to_string()
    );
    assert!(disk_use(&ws.root) <= after_first + (1 << 20));
}
