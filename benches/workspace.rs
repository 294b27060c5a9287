//! The workspace's host side on a repository of 10,000 files: how long the server takes to
//! look at the user's repository, make its copy, compare a copy with its base (unchanged, then
//! with 20 files edited, 5 added and 5 deleted), and keep the changes as a branch. The host's
//! real git; the machine's side (the copy reaching the guest, and coming back) is not here.
//!
//! Run with `cargo bench --bench workspace`; `WORKSPACE_BENCH_FILES=N` for another size. Prints
//! a table and writes the figures as JSON to `target/bench/workspace.json`. Not a test: it
//! asserts nothing about the figures.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use smol_mcp::workspace;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "Bench")
        .env("GIT_AUTHOR_EMAIL", "bench@example.com")
        .env("GIT_COMMITTER_NAME", "Bench")
        .env("GIT_COMMITTER_EMAIL", "bench@example.com")
        .status()
        .unwrap();
    assert!(status.success(), "git {args:?}");
}

/// `files` source-like files of about 1.5 KiB in 100 directories, committed.
fn repository(dir: &Path, files: usize) -> u64 {
    let mut bytes = 0u64;
    for i in 0..files {
        let sub = dir.join(format!("module{:03}", i % 100));
        std::fs::create_dir_all(&sub).unwrap();
        let text: String = (0..40)
            .map(|line| format!("fn item_{i}_{line}() -> u64 {{ {line} }}\n"))
            .collect();
        bytes += text.len() as u64;
        std::fs::write(sub.join(format!("file{i:05}.rs")), text).unwrap();
    }
    git(dir, &["init", "--quiet", "--initial-branch", "main"]);
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "a large project"]);
    bytes
}

fn timed<T>(what: &str, figures: &mut Vec<(String, f64)>, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    println!("{what:<44} {ms:>9.1} ms");
    figures.push((what.to_owned(), ms));
    out
}

fn main() {
    let files: usize = std::env::var("WORKSPACE_BENCH_FILES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("project");
    std::fs::create_dir_all(&repo).unwrap();
    let bytes = repository(&repo, files);
    println!(
        "workspace bench: {files} files, {:.1} MiB, git {}",
        bytes as f64 / 1048576.0,
        String::from_utf8_lossy(
            &Command::new("git")
                .arg("--version")
                .output()
                .unwrap()
                .stdout
        )
        .trim()
    );
    let mut figures = Vec::new();
    let origin = timed("inspect (a clean repository's root)", &mut figures, || {
        workspace::inspect(&repo).unwrap()
    });
    let ws = timed(
        "seed (clone, check out, the guest's .git)",
        &mut figures,
        || {
            workspace::seed(
                &origin,
                &tmp.path().join("ws"),
                u64::MAX,
                &workspace::Unbounded,
            )
            .unwrap()
        },
    );
    let unchanged = timed("changes, none", &mut figures, || {
        workspace::changes(&ws, &workspace::Unbounded).unwrap()
    });
    assert!(unchanged.files.is_empty());
    let tree = ws.tree().to_path_buf();
    for i in 0..20 {
        let path = tree.join(format!("module{:03}/file{i:05}.rs", i % 100));
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("fn added() {}\n");
        std::fs::write(path, text).unwrap();
    }
    for i in 0..5 {
        std::fs::write(tree.join(format!("new{i}.rs")), "fn new() {}\n").unwrap();
        std::fs::remove_file(tree.join(format!(
            "module{:03}/file{:05}.rs",
            (100 + i) % 100,
            100 + i
        )))
        .unwrap();
    }
    let changed = timed("changes, 30 files", &mut figures, || {
        workspace::changes(&ws, &workspace::Unbounded).unwrap()
    });
    assert_eq!(changed.files.len(), 30, "{:?}", changed.files.len());
    timed("keep as a new branch", &mut figures, || {
        workspace::keep(
            &ws,
            "smol/bench",
            "bench",
            &tmp.path().join("p"),
            &workspace::Unbounded,
        )
        .unwrap()
    });
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).unwrap();
    let json = serde_json::json!({
        "files": files,
        "bytes": bytes,
        "ms": figures.iter().map(|(k, v)| (k.clone(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(),
    });
    std::fs::write(out.join("workspace.json"), json.to_string()).unwrap();
}
