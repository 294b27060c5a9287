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

/// The engine comes through whatever index the user's pip is pointed at, so the script keeps
/// no address of its own, and every pinned wheel has its sha256 for pip's hash-checking mode.
#[test]
fn install_engine_pins_hashes_and_keeps_no_index_address() {
    let script = read("scripts/install-engine.sh");
    let addresses: Vec<&str> = script
        .lines()
        .filter(|line| line.contains("http://") || line.contains("https://"))
        .collect();
    assert!(
        addresses.is_empty(),
        "addresses in install-engine.sh: {addresses:?}"
    );
    assert!(
        script.contains("--require-hashes") && script.contains("--hash=sha256:"),
        "install-engine.sh downloads through pip in hash-checking mode"
    );
    let pins = script
        .split_once("pins='")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(table, _)| table)
        .expect("install-engine.sh has a pins='...' table");
    let rows: Vec<Vec<&str>> = pins
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(rows.len() >= 3, "{rows:?}");
    for row in &rows {
        let [_version, _platform, _floor, sha] = row[..] else {
            panic!("a pin is version, platform, glibc floor, sha256: {row:?}");
        };
        assert!(
            sha.len() == 64 && sha.chars().all(|c| c.is_ascii_hexdigit()),
            "{row:?}"
        );
    }
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

/// What a newcomer sees before scrolling: the install commands for a downloaded wheel and for a
/// clone (the blocks scripts/check-package.sh runs) with the client entries, and the test
/// command.
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
    // The downloaded wheel's command names the file scripts/build-wheel.sh makes of this
    // version: the crate's, with the manylinux tag the build asks for.
    let cargo = read("Cargo.toml");
    let version = between(&cargo, "version = \"", "\"").unwrap();
    let build = read("scripts/build-wheel.sh");
    assert!(
        build.contains("--compatibility manylinux_2_28")
            && build.contains("tag=\"manylinux_2_28_$arch\""),
        "build-wheel.sh builds the manylinux_2_28 wheel"
    );
    let wheel = line_of("<!-- user-path: wheel -->").expect("the wheel block is on it");
    assert!(
        wheel < marker,
        "the downloaded wheel comes first: it needs no compiler"
    );
    assert_eq!(
        first_screen.get(wheel + 2).copied(),
        Some(
            format!("pipx install ./smol_mcp-{version}-py3-none-manylinux_2_28_x86_64.whl")
                .as_str()
        )
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

/// The MCP registry's entry (`server.json`), the Python package, the crate and the README's
/// ownership marker name one server and one version: the registry finds the PyPI release by
/// the entry's version, and decides the package is this server's by the marker in its README.
#[test]
fn server_json_the_package_the_crate_and_the_readme_agree_on_name_and_version() {
    let server: serde_json::Value = serde_json::from_str(&read("server.json")).unwrap();
    let cargo = read("Cargo.toml");
    let version = between(&cargo, "version = \"", "\"").unwrap();
    let pyproject = read("pyproject.toml");
    let package = between(&pyproject, "name = \"", "\"").unwrap();
    // maturin takes the version from Cargo.toml: the Python package declares none of its own.
    assert!(
        pyproject.contains("dynamic = [\"version\"]") && !pyproject.contains("\nversion ="),
        "pyproject.toml must take its version from Cargo.toml"
    );
    assert_eq!(server["version"], version);
    let packages = server["packages"].as_array().unwrap();
    assert!(!packages.is_empty());
    for p in packages {
        assert_eq!(p["registryType"], "pypi", "{p}");
        assert_eq!(p["identifier"], package, "{p}");
        assert_eq!(p["version"], version, "{p}");
    }
    let name = server["name"].as_str().unwrap();
    assert_eq!(name.rsplit('/').next(), Some(package));
    let marker = format!("<!-- mcp-name: {name} -->");
    assert!(
        read("README.md").lines().any(|l| l.trim() == marker),
        "README.md must carry {marker}"
    );
    assert!(
        read("pyproject.toml").contains("readme = \"README.md\""),
        "PyPI's description (where the registry looks) is the README"
    );
}

/// `smol-mcp http --port P`, which the registry's HTTP package entry runs (a launcher runs the
/// package's `smol-mcp`): the same server as `smol-mcp-http`, on the port the flag names,
/// behind its token, and refusing to start without one.
#[tokio::test]
async fn smol_mcp_http_serves_streamable_http_behind_its_token() {
    let fake = crate::common::fake_serve::FakeServe::start().await;
    let url = fake.url();
    let runtime = tempfile::tempdir().unwrap();
    let port = crate::common::real_serve::free_port();
    let mut server = tokio::process::Command::new(crate::common::stdio::SERVER)
        .args(["http", "--port", &port.to_string()])
        .env_clear()
        .envs(crate::common::stdio::server_env(
            runtime.path(),
            &[
                ("SMOL_LOCAL_URL", &url),
                ("SMOL_MCP_AUTH_TOKEN", "http-sub-token"),
            ],
        ))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            start.elapsed().as_secs() < 10,
            "smol-mcp http did not listen on {port}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let endpoint = format!("http://127.0.0.1:{port}/mcp");
    let listed = crate::common::clients::stateless_request_to(
        &endpoint,
        "http-sub-token",
        "tools/list",
        serde_json::json!({}),
        serde_json::json!({}),
    )
    .await;
    let tools = listed["result"]["tools"].as_array().unwrap();
    assert!(tools.iter().any(|t| t["name"] == "run-command"), "{listed}");
    let unauthorized = reqwest::Client::new()
        .post(&endpoint)
        .bearer_auth("not-the-token")
        .json(&serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status(), 401);
    server.start_kill().unwrap();
    server.wait().await.unwrap();

    let refused = tokio::process::Command::new(crate::common::stdio::SERVER)
        .args(["http", "--port", &port.to_string()])
        .env_clear()
        .envs(crate::common::stdio::server_env(
            runtime.path(),
            &[("SMOL_LOCAL_URL", &url)],
        ))
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("SMOL_MCP_AUTH_TOKEN"), "{stderr}");
}

/// The release workflow builds the Linux x86_64 wheel with the script CI runs, checks every
/// wheel with the install check CI runs, covers the platforms a release promises, and publishes
/// by trusted publishing only (an OIDC token, never a stored secret).
#[test]
fn the_release_workflow_builds_checks_and_publishes_as_ci_does() {
    let workflow = read(".github/workflows/release.yml");
    for needed in [
        "scripts/build-wheel.sh",
        "scripts/check-wheel.sh",
        "ubuntu-24.04-arm",
        "musllinux_1_2",
        "macos-15-intel",
        "macos-latest",
        "id-token: write",
        "pypa/gh-action-pypi-publish@release/v1",
        "startsWith(github.ref, 'refs/tags/v')",
    ] {
        assert!(workflow.contains(needed), "release.yml lacks {needed}");
    }
    assert!(
        !workflow.contains("secrets."),
        "publishing uses the job's OIDC token, no stored secret"
    );
    let tools = read("scripts/wheel-tools.txt");
    for pinned in ["maturin==", "ziglang==", "auditwheel==", "uv=="] {
        assert!(
            tools.lines().any(|l| l.starts_with(pinned)),
            "scripts/wheel-tools.txt pins {pinned}"
        );
    }
}
