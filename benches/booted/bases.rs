//! Bases (`BOOTED_BENCH_ONLY=bases`): set up once, fork many, beside the engine doing the same on
//! its REST API in the same run, on the nested engine.
//!
//! - The setup a base saves: create-machine with a workspace (a generated project of
//!   `PROJECT_FILES` files) and a setup command (a build of the project: every file hashed
//!   into `/root/build.out`), to the output of the first command after it. Twice.
//! - Making a base of that machine: branch-machine `freezeSource` with one child, to its answer.
//! - One child of the base to its first output (branch-machine, then run-command `echo first`),
//!   beside the raw engine's fork of a frozen source of its own (POST branches, then exec), in
//!   turn, `CHILD_RUNS` of each; and four children in one call to the last one's first output,
//!   beside four raw forks one after another (as the server makes them) to the last exec.
//! - Host memory per extra child: the engine's `/capacity` available before and with the four
//!   children, and each child's own figures as the engine reports them.
//!
//! - With `BOOTED_BENCH_TOOLCHAIN=1`, the setup of a real toolchain and a first build: a cold
//!   create, then Zig 0.13.0 installed from its PyPI wheel (`ziglang`, 81 MB, pinned by its
//!   sha256, fetched here by pip and served to the guest from this host, which it reaches as
//!   10.0.2.2, since no registry is reachable from the guest) and a C file built with `zig cc`
//!   (the first build compiles musl and compiler-rt into the machine's cache: minutes under
//!   TCG), to the next command's output, once; then that machine made a base, and children of
//!   it to their first output, and one child's rebuild of the changed file (from the cache its
//!   base kept).
//!
//! Writes `target/bench/booted-bases.json`. Asserts nothing about the figures.

use super::{Client, Raw, gone, made, ms, ok, server_env, stats};
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::{Duration, Instant};

const PROJECT_FILES: usize = 400;
const ZIG_WHEEL: &str =
    "ziglang-0.13.0-py3-none-manylinux_2_12_x86_64.manylinux2010_x86_64.musllinux_1_1_x86_64.whl";
const ZIG_WHEEL_SHA256: &str = "3ce0c9f16547e5d61b32e0d226926e9a2552ef4b91fccf7ab5ea1a623a77824b";
/// The toolchain's install: the wheel from this host, unpacked under /opt/zig.
const ZIG_INSTALL: &str = "wget -q -O /root/zig.whl http://10.0.2.2:PORT/zig.whl && mkdir -p /opt/zig \
     && cd /opt/zig && unzip -q /root/zig.whl && rm /root/zig.whl && /opt/zig/ziglang/zig version";
/// The project's first build; `CHANGE` appends a line first (a child's rebuild).
const ZIG_BUILD: &str = "cd /root && [ -f hello.c ] || printf '#include <stdio.h>\\nint main(void){puts(\"built\");return 0;}\\n' > hello.c; \
     CHANGE /opt/zig/ziglang/zig cc -target x86_64-linux-musl -O1 -o hello hello.c && ./hello";
const CHILD_RUNS: usize = 3;
const SETUP: &str = "cd /workspace && find . -type f -not -path './.git/*' | sort | xargs md5sum \
     > /root/build.out && wc -l < /root/build.out";

fn project(dir: &std::path::Path) {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    for i in 0..PROJECT_FILES {
        let body: String = (0..200).map(|j| format!("line {i} {j}\n")).collect();
        std::fs::write(dir.join(format!("src/part{i:03}.txt")), body).unwrap();
    }
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    git(&["init", "--quiet", "--initial-branch", "main"]);
    git(&[
        "-c",
        "user.name=bench",
        "-c",
        "user.email=bench@example.invalid",
        "add",
        ".",
    ]);
    git(&[
        "-c",
        "user.name=bench",
        "-c",
        "user.email=bench@example.invalid",
        "commit",
        "--quiet",
        "-m",
        "project",
    ]);
}

/// create-machine with the workspace, the setup, and the next command's output.
async fn cold_with_setup(c: &mut Client, repo: &str) -> Result<(f64, String), String> {
    let t = Instant::now();
    let created = c
        .tool_result(
            "create-machine",
            json!({"cpus": 1, "memoryMb": 256, "branchable": true, "workspace": repo}),
        )
        .await;
    if !ok(&created) {
        return Err(format!("create-machine: {created}"));
    }
    let name = created["structuredContent"]["machine"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    made(&name);
    let setup = c
        .tool_result("run-command", json!({"name": name, "command": SETUP}))
        .await;
    let first = c
        .tool_result(
            "run-command",
            json!({"name": name, "command": ["echo", "first"]}),
        )
        .await;
    let total = ms(t.elapsed());
    if !ok(&setup) || !ok(&first) || first["structuredContent"]["stdout"] != "first\n" {
        return Err(format!("setup {setup} then {first}"));
    }
    Ok((total, name))
}

/// branch-machine of `source` into `count` children (`freeze`: as a base), each then running
/// `echo first` at once: the time to the last output, and the children.
async fn children_of(
    c: &mut Client,
    source: &str,
    child: &str,
    count: usize,
    freeze: bool,
) -> Result<(f64, Vec<String>), String> {
    let t = Instant::now();
    let mut args = json!({"name": source, "childName": child, "count": count});
    if freeze {
        args["freezeSource"] = json!(true);
    }
    let branched = c.tool_result("branch-machine", args).await;
    if !ok(&branched) {
        return Err(format!("branch-machine: {branched}"));
    }
    let children: Vec<String> = if count == 1 {
        vec![child.to_owned()]
    } else {
        serde_json::from_value(branched["structuredContent"]["children"].clone()).unwrap()
    };
    for name in &children {
        made(name);
    }
    // One client: the commands go out in turn, each answered in about a round trip.
    for name in &children {
        let first = c
            .tool_result(
                "run-command",
                json!({"name": name, "command": ["echo", "first"]}),
            )
            .await;
        if first["structuredContent"]["stdout"] != "first\n" {
            return Err(format!("{name}: {first}"));
        }
    }
    Ok((ms(t.elapsed()), children))
}

/// The raw engine: `count` forks of `source` one after another, each then exec `echo first`.
async fn raw_forks(
    raw: &Raw,
    source: &str,
    child: &str,
    count: usize,
) -> Result<(f64, Vec<String>), String> {
    let t = Instant::now();
    let mut children = Vec::new();
    for i in 0..count {
        let name = if count == 1 {
            child.to_owned()
        } else {
            format!("{child}-{i}")
        };
        raw.post(
            &format!("/api/v1/machines/{source}/branches"),
            &json!({"name": name}),
        )
        .await?;
        made(&name);
        children.push(name);
    }
    for name in &children {
        let out = raw.exec(name, &["echo", "first"]).await?;
        if out["stdout"] != "first\n" {
            return Err(format!("{name}: {out}"));
        }
    }
    Ok((ms(t.elapsed()), children))
}

async fn delete_all(c: &mut Client, names: &[String]) {
    for name in names {
        let r = c.tool_result("delete-machine", json!({"name": name})).await;
        if ok(&r) {
            gone(name);
        }
    }
}

async fn machine_memory(raw: &Raw, names: &[String]) -> Vec<Value> {
    raw.machines()
        .await
        .into_iter()
        .filter(|m| {
            m["name"]
                .as_str()
                .is_some_and(|n| names.iter().any(|x| x == n))
        })
        .map(|m| {
            json!({"name": m["name"], "state": m["state"], "rssMb": m["rssMb"],
                   "pssMb": m["pssMb"], "privateMemoryMb": m["privateMemoryMb"]})
        })
        .collect()
}

/// A raw frozen source of the engine's own, set up as the server's base was (bare, one CPU,
/// 256 MiB, started branchable, a file written), for the raw forks.
async fn raw_frozen_source(raw: &Raw, name: &str) -> Result<(), String> {
    raw.post(
        "/api/v1/machines",
        &json!({"name": name, "cpus": 1, "memoryMb": 256}),
    )
    .await?;
    made(name);
    raw.post(
        &format!("/api/v1/machines/{name}/start?forkable=true"),
        &json!({"branchable": true}),
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while raw.exec(name, &["true"]).await.is_err() {
        if Instant::now() > deadline {
            return Err(format!("{name} never ran a command"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    raw.exec(name, &["sh", "-c", "echo prepared > /root/prepared"])
        .await?;
    let first = format!("{name}-first");
    raw.post(
        &format!("/api/v1/machines/{name}/branches"),
        &json!({"name": first, "freezeSource": true}),
    )
    .await?;
    made(&first);
    raw.delete(&first).await;
    Ok(())
}

/// The Zig wheel under `dir` (fetched by pip once, then kept), checked against its sha256.
fn zig_wheel(dir: &std::path::Path) -> Result<(), String> {
    let served = dir.join("zig.whl");
    if !served.exists() {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let out = std::process::Command::new("python3")
            .args(["-m", "pip", "download", "ziglang==0.13.0", "--no-deps"])
            .args([
                "--only-binary",
                ":all:",
                "--platform",
                "manylinux_2_12_x86_64",
                "-d",
            ])
            .arg(dir)
            .output()
            .map_err(|e| format!("pip: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "pip download: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        std::fs::rename(dir.join(ZIG_WHEEL), &served).map_err(|e| e.to_string())?;
    }
    let sum = std::process::Command::new("sha256sum")
        .arg(&served)
        .output()
        .map_err(|e| format!("sha256sum: {e}"))?;
    let text = String::from_utf8_lossy(&sum.stdout);
    if text.split_whitespace().next() != Some(ZIG_WHEEL_SHA256) {
        let _ = std::fs::remove_file(&served);
        return Err(format!("the wheel's sha256 is not the pinned one: {text}"));
    }
    Ok(())
}

/// Serves `dir` over HTTP on all of this host's addresses (the guest reaches it as 10.0.2.2).
async fn serve_dir(dir: &std::path::Path) -> Result<(tokio::process::Child, u16), String> {
    let port = std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let child = tokio::process::Command::new("python3")
        .args([
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "0.0.0.0",
            "--directory",
        ])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("python3 -m http.server: {e}"))?;
    for _ in 0..50 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok((child, port));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("the wheel's HTTP server never listened".into())
}

/// `command` in `name` as a background job, followed to its end: its stdout, or why not.
async fn job(c: &mut Client, name: &str, command: &str) -> Result<String, String> {
    let started = c
        .tool_result(
            "run-command",
            json!({"name": name, "command": command, "background": true, "timeoutSecs": 3600}),
        )
        .await;
    if !ok(&started) {
        return Err(format!("run-command: {started}"));
    }
    let id = started["structuredContent"]["job"].clone();
    let mut stdout = String::new();
    let mut cursor = Value::Null;
    loop {
        let mut args = json!({"job": id, "waitSecs": 60});
        if !cursor.is_null() {
            args["cursor"] = cursor.clone();
        }
        let read = c.tool_result("job-output", args).await;
        if !ok(&read) {
            return Err(format!("job-output: {read}"));
        }
        let r = &read["structuredContent"];
        stdout.push_str(r["stdout"].as_str().unwrap_or(""));
        cursor = r["cursor"].clone();
        if r["state"] != "running" && r["more"] != true {
            if r["exitCode"] != 0 {
                return Err(format!("{command}: {r}"));
            }
            return Ok(stdout);
        }
    }
}

/// The toolchain setup and its base (`BOOTED_BENCH_TOOLCHAIN=1`): see the module's comment.
async fn toolchain(c: &mut Client, port: u16, failures: &mut Vec<String>) -> Value {
    let install = ZIG_INSTALL.replace("PORT", &port.to_string());
    let t = Instant::now();
    let created = c
        .tool_result(
            "create-machine",
            json!({"cpus": 1, "memoryMb": 512, "branchable": true, "allowCidrs": ["10.0.2.2/32"]}),
        )
        .await;
    if !ok(&created) {
        failures.push(format!("toolchain create: {created}"));
        return Value::Null;
    }
    let created_ms = ms(t.elapsed());
    let name = created["structuredContent"]["machine"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    made(&name);
    let installed = job(c, &name, &install).await;
    let installed_ms = ms(t.elapsed());
    let built = match &installed {
        Ok(_) => job(c, &name, &ZIG_BUILD.replace("CHANGE", "")).await,
        Err(e) => Err(e.clone()),
    };
    let built_ms = ms(t.elapsed());
    let first = c
        .tool_result(
            "run-command",
            json!({"name": name, "command": ["echo", "first"]}),
        )
        .await;
    let cold_ms = ms(t.elapsed());
    match (&installed, &built) {
        (Ok(version), Ok(out)) if out.trim() == "built" && ok(&first) => {
            eprintln!(
                "booted bench: zig {} installed and first build: {cold_ms:.0} ms to the next output",
                version.trim()
            );
        }
        _ => {
            failures.push(format!("toolchain setup: {installed:?} then {built:?}"));
            delete_all(c, &[name]).await;
            return Value::Null;
        }
    }
    let making = children_of(c, &name, "bench-zig-first", 1, true).await;
    let making_ms = match making {
        Ok((total, children)) => {
            delete_all(c, &children).await;
            Some(total)
        }
        Err(e) => {
            failures.push(format!("toolchain base: {e}"));
            None
        }
    };
    let mut child = Vec::new();
    let mut rebuild = None;
    for i in 0..CHILD_RUNS {
        match children_of(c, &name, &format!("bench-zig-child-{i}"), 1, false).await {
            Ok((total, names)) => {
                child.push(total);
                if i == 0 {
                    let t = Instant::now();
                    let change = ZIG_BUILD.replace(
                        "CHANGE",
                        "echo 'int changed(void){return 1;}' >> hello.c &&",
                    );
                    rebuild = match job(c, &names[0], &change).await {
                        Ok(out) if out.trim() == "built" => Some(ms(t.elapsed())),
                        other => {
                            failures.push(format!("a child's rebuild: {other:?}"));
                            None
                        }
                    };
                }
                delete_all(c, &names).await;
            }
            Err(e) => failures.push(format!("toolchain child {i}: {e}")),
        }
        eprintln!("booted bench: toolchain child {i}: {:?} ms", child.last());
    }
    delete_all(c, &[name]).await;
    json!({
        "toolchain": "zig 0.13.0 from its PyPI wheel (81 MB, 341 MB unpacked), served from this host",
        "createdMs": created_ms,
        "installedMs": installed_ms,
        "firstBuildDoneMs": built_ms,
        "coldWithSetupMs": cold_ms,
        "makingTheBaseMs": making_ms,
        "childOfTheBase": if child.is_empty() { Value::Null } else { json!(stats(&child)) },
        "childRebuildMs": rebuild,
        "samples": child,
    })
}

pub async fn bases() -> Value {
    let nested = super::nested::nested();
    let raw = Raw {
        http: super::nested::rest(),
        base: nested.url.clone(),
    };
    let host = super::host_info();
    let rt = tempfile::tempdir().unwrap();
    let repo = rt.path().join("project");
    project(&repo);
    let repo_text = repo.display().to_string();
    let mut env = server_env(&rt.path().join("s"), &nested.url, "warn");
    env.push(("SMOL_MCP_READY_TIMEOUT_SECS".into(), "300".into()));
    env.push((
        "SMOL_MCP_MOUNT_ALLOW".into(),
        rt.path().display().to_string(),
    ));
    env.push((
        "SMOL_MCP_WORKSPACE_DIR".into(),
        rt.path().join("copies").display().to_string(),
    ));
    let mut c = Client::spawn(super::SERVER, &env, Stdio::inherit()).await.0;
    let r = c.tool_result("list-machines", json!({})).await;
    assert!(ok(&r), "{r}");
    let mut failures: Vec<String> = Vec::new();

    // The setup a base saves, twice; the second machine becomes the base.
    let mut cold = Vec::new();
    let mut set_up = None;
    for i in 0..2 {
        match cold_with_setup(&mut c, &repo_text).await {
            Ok((total, name)) => {
                eprintln!("booted bench: cold create + workspace + setup {i}: {total:.0} ms");
                cold.push(total);
                if let Some(old) = set_up.replace(name) {
                    delete_all(&mut c, &[old]).await;
                }
            }
            Err(e) => failures.push(format!("cold {i}: {e}")),
        }
    }
    let Some(base) = set_up else {
        c.close(Duration::from_secs(120)).await;
        return json!({"host": host, "failures": failures});
    };
    let making = match children_of(&mut c, &base, "bench-base-first", 1, true).await {
        Ok((total, children)) => {
            delete_all(&mut c, &children).await;
            Some(total)
        }
        Err(e) => {
            failures.push(format!("making the base: {e}"));
            None
        }
    };
    eprintln!("booted bench: base made (first child included) in {making:?} ms");
    let raw_source = "bench-raw-frozen";
    if let Err(e) = raw_frozen_source(&raw, raw_source).await {
        failures.push(format!("raw frozen source: {e}"));
    }

    let (mut child, mut raw_child) = (Vec::new(), Vec::new());
    for i in 0..CHILD_RUNS {
        let name = format!("bench-child-{i}");
        let ours = children_of(&mut c, &base, &name, 1, false).await;
        let theirs = raw_forks(&raw, raw_source, &format!("bench-raw-child-{i}"), 1).await;
        for (samples, answer, what) in [
            (&mut child, ours, "child"),
            (&mut raw_child, theirs, "raw fork"),
        ] {
            match answer {
                Ok((total, names)) => {
                    samples.push(total);
                    delete_all(&mut c, &names).await;
                }
                Err(e) => failures.push(format!("{what} {i}: {e}")),
            }
        }
        eprintln!(
            "booted bench: round {i}: child of the base {:?} ms, raw fork {:?} ms",
            child.last(),
            raw_child.last()
        );
    }

    let before_mb = super::available_mb(&raw).await;
    let four = children_of(&mut c, &base, "bench-four", 4, false).await;
    let (four_ms, four_held, with_four_mb) = match four {
        Ok((total, names)) => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let with_four = super::available_mb(&raw).await;
            let held = machine_memory(&raw, &names).await;
            delete_all(&mut c, &names).await;
            (Some(total), held, Some(with_four))
        }
        Err(e) => {
            failures.push(format!("four children: {e}"));
            (None, Vec::new(), None)
        }
    };
    let raw_four = match raw_forks(&raw, raw_source, "bench-raw-four", 4).await {
        Ok((total, names)) => {
            delete_all(&mut c, &names).await;
            Some(total)
        }
        Err(e) => {
            failures.push(format!("four raw forks: {e}"));
            None
        }
    };
    let toolchain_figures = if std::env::var("BOOTED_BENCH_TOOLCHAIN").is_ok_and(|v| v == "1") {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench/zig");
        match zig_wheel(&dir) {
            Ok(()) => match serve_dir(&dir).await {
                Ok((_server, port)) => toolchain(&mut c, port, &mut failures).await,
                Err(e) => {
                    failures.push(e);
                    Value::Null
                }
            },
            Err(e) => {
                failures.push(e);
                Value::Null
            }
        }
    } else {
        Value::Null
    };
    let base_memory = machine_memory(&raw, &[base.clone(), raw_source.to_owned()]).await;
    for name in [base.as_str(), raw_source] {
        let r = c.tool_result("delete-machine", json!({"name": name})).await;
        if ok(&r) {
            gone(name);
        } else {
            failures.push(format!("delete {name}: {r}"));
        }
    }
    c.close(Duration::from_secs(120)).await;
    json!({
        "host": host,
        "engine": {"url": nested.url, "smolvm": "1.32.2",
                   "where": "nested in a QEMU TCG VM (scripts/nested-engine.sh)"},
        "projectFiles": PROJECT_FILES,
        "coldWithSetup": if cold.is_empty() { Value::Null } else { json!(stats(&cold)) },
        "makingTheBaseMs": making,
        "childOfTheBase": if child.is_empty() { Value::Null } else { json!(stats(&child)) },
        "rawFork": if raw_child.is_empty() { Value::Null } else { json!(stats(&raw_child)) },
        "fourChildrenMs": four_ms,
        "fourRawForksMs": raw_four,
        "hostAvailableMb": {"beforeFour": before_mb, "withFour": with_four_mb},
        "children": four_held,
        "bases": base_memory,
        "samples": {"cold": cold, "child": child, "rawFork": raw_child},
        "toolchain": toolchain_figures,
        "failures": failures,
    })
}

pub fn print(r: &Value) {
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    println!(
        "bases on the nested engine ({} cores, load {}), a project of {} files",
        r["host"]["cores"],
        r["host"]["loadAverage"].as_str().unwrap_or(""),
        r["projectFiles"]
    );
    println!();
    println!("| to the first command's output | median | min | max | n |");
    println!("|---|---|---|---|---|");
    for (label, s) in [
        ("cold create + workspace + setup", &r["coldWithSetup"]),
        (
            "a child of the base (branch-machine + run-command)",
            &r["childOfTheBase"],
        ),
        (
            "a raw fork of a frozen source (POST branches + exec)",
            &r["rawFork"],
        ),
    ] {
        println!(
            "| {label} | {:.0} ms | {:.0} ms | {:.0} ms | {} |",
            f(&s["p50Ms"]),
            f(&s["minMs"]),
            f(&s["maxMs"]),
            s["n"]
        );
    }
    println!(
        "\nmaking the base (branch-machine freezeSource, its first child included): {:.0} ms",
        f(&r["makingTheBaseMs"])
    );
    println!(
        "four children in one call, to the last output: {:.0} ms; four raw forks in turn: {:.0} ms",
        f(&r["fourChildrenMs"]),
        f(&r["fourRawForksMs"])
    );
    let (child, fork, cold) = (
        f(&r["childOfTheBase"]["p50Ms"]),
        f(&r["rawFork"]["p50Ms"]),
        f(&r["coldWithSetup"]["p50Ms"]),
    );
    println!(
        "child / raw fork: x{:.2} (goal: within x1.5); cold + setup / child: x{:.1} (goal: at least x10)",
        child / fork,
        cold / child
    );
    let a = &r["hostAvailableMb"];
    println!(
        "host memory available (engine's /capacity): {:.0} MiB before four children, {:.0} MiB \
         with them: {:.1} MiB a child",
        f(&a["beforeFour"]),
        f(&a["withFour"]),
        (f(&a["beforeFour"]) - f(&a["withFour"])) / 4.0
    );
    for m in r["children"]
        .as_array()
        .into_iter()
        .chain(r["bases"].as_array())
        .flatten()
    {
        println!(
            "  {} ({}): rss {} MiB, pss {} MiB, private {} MiB",
            m["name"].as_str().unwrap_or(""),
            m["state"].as_str().unwrap_or(""),
            m["rssMb"],
            m["pssMb"],
            m["privateMemoryMb"]
        );
    }
    let z = &r["toolchain"];
    if z.is_object() {
        println!(
            "\nset up a toolchain and build once ({}), once:",
            z["toolchain"].as_str().unwrap_or("")
        );
        println!(
            "  cold create {:.0} ms, toolchain installed at {:.0} ms, first build done at {:.0} ms, \
             next output at {:.0} ms",
            f(&z["createdMs"]),
            f(&z["installedMs"]),
            f(&z["firstBuildDoneMs"]),
            f(&z["coldWithSetupMs"])
        );
        let zc = &z["childOfTheBase"];
        println!(
            "  base made in {:.0} ms; a child to its first output: median {:.0} ms (min {:.0}, \
             max {:.0}, n {}); a child's rebuild of a changed file: {:.0} ms",
            f(&z["makingTheBaseMs"]),
            f(&zc["p50Ms"]),
            f(&zc["minMs"]),
            f(&zc["maxMs"]),
            zc["n"],
            f(&z["childRebuildMs"])
        );
        println!(
            "  cold + toolchain + first build / child: x{:.0} (goal: at least x10); against the \
             raw fork above: x{:.2}",
            f(&z["coldWithSetupMs"]) / f(&zc["p50Ms"]),
            f(&zc["p50Ms"]) / f(&r["rawFork"]["p50Ms"])
        );
    }
    if let Some(failures) = r["failures"].as_array().filter(|f| !f.is_empty()) {
        println!("failures: {failures:?}");
    }
}
