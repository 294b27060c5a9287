//! `generated/` is a readable mirror of what build.rs writes to OUT_DIR (nothing compiles from
//! it). This test fails when the two differ; `UPDATE_GENERATED=1 cargo test --test offline
//! generated_in_sync` rewrites the mirror.

use std::path::Path;

macro_rules! out_file {
    ($name:literal) => {
        ($name, include_str!(concat!(env!("OUT_DIR"), "/", $name)))
    };
}

const FILES: [(&str, &str); 6] = [
    out_file!("smolvm_client.rs"),
    out_file!("smolvm_operations.rs"),
    out_file!("smolvm.effective.json"),
    out_file!("smolcloud_client.rs"),
    out_file!("smolcloud_operations.rs"),
    out_file!("smolcloud.effective.json"),
];

#[test]
fn generated_mirror_matches_the_build() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("generated");
    let update = std::env::var("UPDATE_GENERATED").is_ok_and(|v| v == "1");
    let mut stale = Vec::new();
    for (name, built) in FILES {
        let path = dir.join(name);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != built {
            if update {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, built).unwrap();
            } else {
                stale.push(name);
            }
        }
    }
    assert!(
        stale.is_empty(),
        "generated/ is out of sync with build.rs for {stale:?}; regenerate it with \
         `UPDATE_GENERATED=1 cargo test --test generated_in_sync` and review the diff"
    );
}
