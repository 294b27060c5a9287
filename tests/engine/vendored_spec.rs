//! The vendored local spec is exactly what the pinned engine's `serve openapi` gives, vendored
//! with the project's own tool.

use crate::common::real_serve::smolvm_binary;
use smol_mcp::spec::{CLOUD_API, LOCAL_API};
use std::path::Path;
use std::process::Command;

const RAW_SHA256: &str = "9a7d9b905d7f26b579ff6521356ac871d55e65b48f2fc7bedf109cd6e28503d0";

fn sha256_hex(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

#[test]
fn serve_openapi_vendors_to_the_committed_spec() {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("raw.json");
    let out = Command::new(smolvm_binary())
        .args(["serve", "openapi"])
        .output()
        .unwrap();
    assert!(out.status.success(), "serve openapi failed: {out:?}");
    std::fs::write(&raw, &out.stdout).unwrap();
    assert_eq!(
        sha256_hex(&raw),
        RAW_SHA256,
        "specs/SOURCES.md records this hash"
    );

    let vendored = dir.path().join("vendored.json");
    let status = Command::new(env!("CARGO_BIN_EXE_smol-spec"))
        .arg("vendor")
        .arg(&raw)
        .arg(&vendored)
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        std::fs::read_to_string(&vendored).unwrap() == LOCAL_API.spec_text,
        "vendoring `serve openapi` no longer reproduces {}",
        LOCAL_API.spec_file
    );
}

#[test]
fn vendoring_the_published_cloud_spec_reproduces_the_committed_one() {
    // The raw published spec is kept beside the checkout (../shared) when it is there; the
    // committed facts-only form must be what the tool makes of it.
    let raw = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/specs/smolfleet-openapi-published.json");
    if !raw.exists() {
        eprintln!("skipped: no raw published cloud spec at {}", raw.display());
        return;
    }
    assert_eq!(
        sha256_hex(&raw),
        "853ec529472a2d2277e88e91a2d63e920f44b12dc4819df45f768c001231492d"
    );
    let text = std::fs::read_to_string(&raw).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rendered = smol_mcp::spec::vendor::render(&smol_mcp::spec::vendor::facts_only(&doc));
    assert!(
        rendered == CLOUD_API.spec_text,
        "the committed cloud spec is not the vendored published one"
    );
}
