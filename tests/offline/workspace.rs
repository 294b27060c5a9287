//! The workspace's host side with the host's real git: a repository or a plain directory
//! copied, changes made in the copy seen as a machine would leave them, kept as a branch or a
//! patch; every refusal, with the user's repository (refs, HEAD, index, working tree) compared
//! byte for byte before and after; and a copy whose `.git` a guest rewrote to run commands,
//! which never run.

use smol_mcp::workspace::{self, Change, Kept, OriginKind, WorkspaceError};
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
    let ws = workspace::seed(&origin, &tmp.path().join("ws"), 1 << 20).unwrap();
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
    assert!(workspace::changes(&ws).unwrap().files.is_empty());

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

    let changes = workspace::changes(&ws).unwrap();
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
    let err = workspace::keep(&ws, "smol/try-1", "again", &tmp.path().join("p")).unwrap_err();
    assert!(matches!(err, WorkspaceError::BranchExists { .. }), "{err}");
    assert!(
        err.to_string().contains("give another branch name"),
        "{err}"
    );
    assert_eq!(snapshot(&repo), before);
    let err = workspace::keep(&ws, "bad..name", "x", &tmp.path().join("p")).unwrap_err();
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
    let err = workspace::seed(&origin, &tmp.path().join("ws"), 10).unwrap_err();
    assert!(matches!(err, WorkspaceError::TooLarge { .. }), "{err}");
    assert!(err.to_string().contains("workspaceMaxBytes"), "{err}");

    let ws = workspace::seed(&origin, &tmp.path().join("ws2"), 1 << 20).unwrap();
    let before = snapshot(&repo);
    let err = workspace::keep(&ws, "smol/none", "x", &tmp.path().join("p")).unwrap_err();
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

    let changes = workspace::changes(&ws).unwrap();
    assert!(changes.files.iter().any(|f| f.path == "src/lib.rs"));
    workspace::keep(&ws, "smol/safe", "safe", &tmp.path().join("p")).unwrap();
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
    let ws = workspace::seed(&origin, &tmp.path().join("ws"), 1 << 20).unwrap();
    let tree = ws.tree().to_path_buf();
    assert!(
        !tree.join(".git").exists(),
        "a plain directory's copy has no repository"
    );
    std::fs::write(tree.join("a.txt"), "alpha\nomega\n").unwrap();
    std::fs::write(tree.join("sub/c.bin"), [0u8, 1, 2, 255]).unwrap();
    std::fs::remove_file(tree.join("gone.txt")).unwrap();
    let changes = workspace::changes(&ws).unwrap();
    assert_eq!(changes.files.len(), 3, "{:?}", changes.files);

    let before: Vec<(String, Vec<u8>)> = ["a.txt", "sub/b.txt", "gone.txt"]
        .iter()
        .map(|p| (p.to_string(), std::fs::read(dir.join(p)).unwrap()))
        .collect();
    let patch = tmp.path().join("out/notes.patch");
    let kept = workspace::keep(&ws, "ignored", "m", &patch).unwrap();
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
