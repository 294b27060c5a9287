//! The Python package (pyproject.toml) against what the rest of the repository pins and builds:
//! the engine it depends on is the one the scripts fetch, it carries the two servers and nothing
//! else, and the README's first screen gives its install command and the test command.
//! scripts/check-package.sh builds and installs it; these keep it from drifting in between.

use std::path::Path;

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The value of the first line `prefix...suffix` in `text`, between the two.
fn between<'a>(text: &'a str, prefix: &str, suffix: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|line| line.trim().strip_prefix(prefix)?.strip_suffix(suffix))
}

#[test]
fn the_package_depends_on_the_engine_the_scripts_pin() {
    let pyproject = read("pyproject.toml");
    let dependencies = between(&pyproject, "dependencies = [", "]")
        .expect("pyproject.toml has a one-line dependencies list");
    let pinned_by_package: Vec<&str> = dependencies
        .split(',')
        .map(|d| d.trim().trim_matches('"'))
        .collect();
    let install_engine = read("scripts/install-engine.sh");
    let fetch_smolvm = read("scripts/fetch-smolvm.sh");
    let installed = between(&install_engine, "default_version=", "")
        .expect("install-engine.sh has default_version=");
    let fetched = between(&fetch_smolvm, "version=\"${1:-", "}\"")
        .expect("fetch-smolvm.sh has version=\"${1:-V}\"");
    assert_eq!(
        installed, fetched,
        "install-engine.sh and fetch-smolvm.sh pin different engines"
    );
    assert_eq!(
        pinned_by_package,
        vec![format!("smolmachines=={installed}")],
        "the package must depend on exactly the engine the tests run ({installed})"
    );
}

#[test]
fn the_package_carries_the_two_servers_and_nothing_else() {
    let pyproject = read("pyproject.toml");
    assert!(
        pyproject.contains("bindings = \"bin\""),
        "the wheel holds binaries (maturin's bin bindings)"
    );
    let targets: Vec<(&str, &str)> = pyproject
        .split("[[tool.maturin.targets]]")
        .skip(1)
        .map(|table| {
            (
                between(table, "name = \"", "\"").expect("a target has a name"),
                between(table, "kind = \"", "\"").expect("a target has a kind"),
            )
        })
        .collect();
    assert_eq!(
        targets,
        vec![("smol-mcp", "bin"), ("smol-mcp-http", "bin")],
        "the wheel's targets"
    );
    let cargo = read("Cargo.toml");
    for (name, _) in &targets {
        assert!(
            cargo.contains(&format!("[[bin]]\nname = \"{name}\"")),
            "{name} is not a binary of Cargo.toml"
        );
    }
}

/// What a newcomer sees before scrolling: the package's install command (the block
/// scripts/check-package.sh runs) with the client entries, and the test command.
#[test]
fn the_readmes_first_screen_has_the_install_and_the_test_command() {
    let readme = read("README.md");
    let first_screen: Vec<&str> = readme.lines().take(70).collect();
    let line_of = |text: &str| first_screen.iter().position(|l| l.trim() == text);
    let marker = line_of("<!-- user-path: package -->").expect("the package block is on it");
    assert_eq!(
        first_screen.get(marker + 2).copied(),
        Some("pipx install .")
    );
    assert!(
        line_of("<!-- user-path: client claude-desktop -->").is_some(),
        "the client entries are on it"
    );
    let development = line_of("## Development").expect("a Development section is on it");
    assert_eq!(
        first_screen.get(development + 3).copied(),
        Some("scripts/test.sh")
    );
}
