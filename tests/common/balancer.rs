//! scripts/balancer.sh (HAProxy from Debian's packages) with its state in `dir`, for the tests
//! and the benchmarks that put server processes behind it.

use std::path::Path;

/// Runs `scripts/balancer.sh args...` with its state in `dir`; a failure fails the caller, with
/// what the script said.
pub fn run(dir: &Path, args: &[String]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/balancer.sh");
    let out = std::process::Command::new(script)
        .args(args)
        .env("SMOL_BALANCER_DIR", dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/balancer.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
