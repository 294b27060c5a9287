//! `server.json` as the MCP registry checks it before a publish (scripts/check-server-json.py,
//! with the pinned `jsonschema` of `.venv`): the repository's entry passes, and entries the
//! registry would refuse fail, each naming what is wrong.

use crate::common::clients::{python, repo};

/// A change that makes an entry the registry refuses.
type Breaks = fn(&mut serde_json::Value);

fn check(server_json: &std::path::Path, readme: &std::path::Path) -> (bool, String) {
    let out = std::process::Command::new(python())
        .arg(repo().join("scripts/check-server-json.py"))
        .arg(server_json)
        .arg(readme)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_registry_entry_is_valid_and_a_broken_one_is_refused_by_name() {
    let entry = repo().join("server.json");
    let readme = repo().join("README.md");
    let (ok, text) = check(&entry, &readme);
    assert!(ok, "{text}");

    let good: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&entry).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let broken: [(&str, Breaks); 4] = [
        ("version", |v| v["version"] = "latest".into()),
        ("transport.url", |v| {
            v["packages"][1]["transport"]["url"] = "http://127.0.0.1:{port}/mcp".into()
        }),
        ("name", |v| v["name"] = "smol-mcp".into()),
        ("description", |v| v["description"] = "x".repeat(101).into()),
    ];
    for (what, breaks) in broken {
        let mut entry = good.clone();
        breaks(&mut entry);
        let path = dir.path().join("server.json");
        std::fs::write(&path, entry.to_string()).unwrap();
        let (ok, text) = check(&path, &readme);
        assert!(!ok && text.contains(what), "{what}: {text}");
    }
    // The README without its marker: the registry could not tie the PyPI package to the entry.
    let unmarked = dir.path().join("README.md");
    let text = std::fs::read_to_string(&readme).unwrap();
    std::fs::write(
        &unmarked,
        text.replace(
            "mcp-name: io.github.smol-machines/smol-mcp",
            "mcp-name: other",
        ),
    )
    .unwrap();
    let (ok, text) = check(&entry, &unmarked);
    assert!(!ok && text.contains("README"), "{text}");
}
