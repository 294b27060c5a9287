//! The floors of src/ (the table in docs/architecture.md), kept by the compiler: for each floor
//! but the top one, the library is checked (`cargo check --lib`) with a root that declares only
//! the modules of that floor and the floors below it. A use of a higher floor, however it is
//! written (an import, an inline path, a macro's expansion, a re-export), then does not resolve
//! and fails the check; `#[cfg(test)]` code, which may use anything, is not compiled by it.
//! The package is checked where it stands, through links (target/floors/package), in a target
//! directory of its own; layering.rs keeps what no compiler does: no circles of files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// Module name to floor, from the rows `| N | `a`, `b` | ... |` between the `floors:` markers.
fn floors_from(doc: &str) -> BTreeMap<String, u32> {
    let table = doc
        .split("<!-- floors: begin")
        .nth(1)
        .expect("no <!-- floors: begin --> marker");
    let table = table.split("<!-- floors: end").next().unwrap_or_default();
    let mut floors = BTreeMap::new();
    for cells in table
        .lines()
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
    {
        if let (Some(Ok(floor)), Some(modules)) = (cells.get(1).map(|c| c.parse()), cells.get(2)) {
            for module in modules.split(',').map(|m| m.trim().trim_matches('`')) {
                floors.insert(module.to_owned(), floor);
            }
        }
    }
    floors
}

#[test]
fn each_floor_compiles_without_the_floors_above_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let floors = floors_from(&doc);
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    // What a module reaches through the crate root itself (a re-export there) would escape the
    // check, so the root holds its modules and nothing else.
    let stray: Vec<&str> = lib
        .lines()
        .filter(|l| !(l.is_empty() || l.starts_with("//") || l.starts_with("pub mod ")))
        .collect();
    assert!(
        stray.is_empty(),
        "src/lib.rs holds more than its modules: {stray:?}"
    );
    let declared: BTreeSet<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
        .collect();
    let placed: BTreeSet<&str> = floors.keys().map(String::as_str).collect();
    assert_eq!(
        declared, placed,
        "src/lib.rs's modules against the floors table"
    );

    let work = root.join("target/floors");
    let package = work.join("package");
    let _ = std::fs::remove_dir_all(&package);
    std::fs::create_dir_all(package.join("src")).unwrap();
    let link_all = |from: &Path, to: &Path, except: &[&str]| {
        for entry in std::fs::read_dir(from).unwrap().map(Result::unwrap) {
            let name = entry.file_name();
            if !except.iter().any(|e| name == *e) {
                std::os::unix::fs::symlink(entry.path(), to.join(&name)).unwrap();
            }
        }
    };
    link_all(root, &package, &["src", "target", ".git"]);
    link_all(&root.join("src"), &package.join("src"), &["lib.rs"]);

    let failures = floors_that_reach_up(&package, &work.join("target"), &floors, &["--locked"]);
    assert!(
        failures.is_empty(),
        "a floor uses one above it (what a lower floor needs from a higher one is a trait or a \
         type of the lower floor; see docs/architecture.md):\n{}",
        failures.join("\n")
    );
}

/// Checks `package` once for each floor but the top one, its root declaring the modules of that
/// floor and those below; a line for each floor that does not compile so, with its errors.
fn floors_that_reach_up(
    package: &Path,
    target: &Path,
    floors: &BTreeMap<String, u32>,
    flags: &[&str],
) -> Vec<String> {
    let mut by_floor: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
    for (module, floor) in floors {
        by_floor.entry(*floor).or_default().push(module);
    }
    let top = by_floor.keys().max().copied().unwrap_or_default();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let (mut modules, mut failures) = (Vec::new(), Vec::new());
    for (floor, on_it) in by_floor.range(..top) {
        modules.extend(on_it.iter().map(|m| format!("pub mod {m};\n")));
        // Lints are clippy's business; what is left unused without the floors above is expected.
        let root_file = format!("#![allow(warnings)]\n{}", modules.concat());
        std::fs::write(package.join("src/lib.rs"), root_file).unwrap();
        let out = Command::new(&cargo)
            .args(["check", "--lib", "--offline", "--message-format=short"])
            .args(flags)
            .current_dir(package)
            .env("CARGO_TARGET_DIR", target)
            .output()
            .unwrap();
        if !out.status.success() {
            let errors = String::from_utf8_lossy(&out.stderr);
            let errors: Vec<&str> = errors.lines().filter(|l| l.contains("error")).collect();
            failures.push(format!("floor {floor} ({on_it:?}):\n{}", errors.join("\n")));
        }
    }
    failures
}

/// The check on a package of its own: an upward use fails it, a downward one does not.
#[test]
fn the_floor_check_fails_on_an_upward_use_and_only_then() {
    let package = tempfile::tempdir().unwrap();
    let dir = package.path();
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let manifest =
        "[package]\nname = \"floors-self-check\"\nversion = \"0.0.0\"\nedition = \"2024\"\n";
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    let floors = floors_from(
        "<!-- floors: begin\n| 1 | `low` | |\n| 2 | `mid` | |\n| 3 | `high` | |\n<!-- floors: end",
    );
    let check = |low: &str| {
        std::fs::write(dir.join("src/low.rs"), low).unwrap();
        std::fs::write(dir.join("src/mid.rs"), "pub fn m() { crate::low::f() }").unwrap();
        std::fs::write(dir.join("src/high.rs"), "pub fn g() { crate::mid::m() }").unwrap();
        floors_that_reach_up(dir, &dir.join("target"), &floors, &[])
    };
    assert_eq!(check("pub fn f() {}"), Vec::<String>::new());
    let up =
        check("pub fn f() {}\nmacro_rules! m { () => { crate::high::g() } }\npub fn h() { m!() }");
    assert_eq!(up.len(), 2, "{up:?}");
    assert!(
        up[0].starts_with("floor 1") && up[0].contains("high"),
        "{up:?}"
    );
    assert!(
        up[1].starts_with("floor 2") && up[1].contains("high"),
        "{up:?}"
    );
}
