//! The shell a job runs in its machine, run by this host's real `sh` the way the engine's
//! detached exec runs it (smolvm 1.32.2 `vm_exec_background`: stdio on /dev/null, env and
//! workdir given, nothing waits for it): the wrapper sends each stream to its file and the exit
//! status last, the probe reads sizes and status, a read starts at any byte offset and is byte
//! exact, the ends are the head and the tail, and the marker kill ends the command and its
//! children before the status is written.

use smol_mcp::fleet::{Command, ExecOutput};
use smol_mcp::policy::jobs::guest;
use std::process::Stdio;
use std::time::{Duration, Instant};

fn run(command: &Command) -> ExecOutput {
    let argv = command.argv();
    let out = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    ExecOutput {
        exit_code: out.status.code().unwrap_or(-1),
        stdout: out.stdout,
        stderr: out.stderr,
        stdout_cut_upstream: false,
        stderr_cut_upstream: false,
    }
}

fn detach(command: &Command, marker: &str) {
    let argv = command.argv();
    let child = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env(guest::RUN_MARKER, marker)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Reaped as it ends, so that a killed one is gone from /proc.
    let mut child = child;
    std::thread::spawn(move || child.wait());
}

fn base(tag: &str) -> String {
    let dir = std::env::temp_dir().join(format!("smol-job-scripts-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("job").display().to_string()
}

fn probe_until(base: &str, done: impl Fn(&guest::Probed) -> bool) -> guest::Probed {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = guest::Probed::parse(&run(&guest::probe(base))).expect("a probe parses");
        if done(&seen) {
            return seen;
        }
        assert!(Instant::now() < deadline, "still {seen:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_job_writes_its_streams_and_then_its_status() {
    let base = base("status");
    let before = guest::Probed::parse(&run(&guest::probe(&base))).unwrap();
    assert_eq!(before.stdout_bytes, None, "no files before the start");
    let script = "printf 'héllo\\n'; printf 'warn\\n' >&2; sleep 0.3; printf 'more\\n'; exit 3";
    detach(
        &guest::wrapper(&base, &Command::Shell(script.into())),
        "m-status",
    );
    let running = probe_until(&base, |p| p.stdout_bytes == Some(7));
    assert_eq!(
        running.exit_code, None,
        "no status while it runs: {running:?}"
    );
    let ended = probe_until(&base, |p| p.exit_code.is_some());
    assert_eq!(
        ended,
        guest::Probed {
            stdout_bytes: Some(12),
            stderr_bytes: Some(5),
            exit_code: Some(3),
            killed: None,
        }
    );
    let whole = run(&guest::read(&base, 0, 0, 1000));
    assert_eq!(whole.stdout, "héllo\nmore\n".as_bytes());
    assert_eq!(whole.stderr, b"warn\n");
    // From inside the é (byte 2): byte exact, the reader decides what to do with a cut.
    let middle = run(&guest::read(&base, 2, 4, 3));
    assert_eq!(middle.stdout, &"héllo\nmore\n".as_bytes()[2..5]);
    assert_eq!(middle.stderr, b"\n");
    let past = run(&guest::read(&base, 12, 5, 10));
    assert!(past.stdout.is_empty() && past.stderr.is_empty());
}

#[test]
fn argv_words_reach_the_command_unquoted() {
    let base = base("argv");
    let argv = vec![
        "printf".to_owned(),
        "%s|".to_owned(),
        "a b".to_owned(),
        "$HOME".to_owned(),
        "'q'".to_owned(),
        "`x`".to_owned(),
    ];
    detach(&guest::wrapper(&base, &Command::Argv(argv)), "m-argv");
    probe_until(&base, |p| p.exit_code == Some(0));
    let out = run(&guest::read(&base, 0, 0, 100));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "a b|$HOME|'q'|`x`|");
}

#[test]
fn a_missing_program_ends_with_127_and_says_so_in_stderr() {
    let base = base("missing");
    detach(
        &guest::wrapper(&base, &Command::Argv(vec!["no-such-program-here".into()])),
        "m-missing",
    );
    let ended = probe_until(&base, |p| p.exit_code.is_some());
    assert_eq!(ended.exit_code, Some(127));
    let out = run(&guest::read(&base, 0, 0, 1000));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no-such-program-here"),
        "{out:?}"
    );
}

#[test]
fn the_ends_are_the_head_and_the_tail() {
    let base = base("ends");
    let script = "i=0; while [ $i -lt 1000 ]; do echo \"line $i\"; i=$((i+1)); done";
    detach(
        &guest::wrapper(&base, &Command::Shell(script.into())),
        "m-ends",
    );
    probe_until(&base, |p| p.exit_code == Some(0));
    let ends = run(&guest::ends(&base, "stdout", 64));
    assert_eq!(ends.stdout.len(), 64);
    assert!(ends.stdout.starts_with(b"line 0\nline 1\n"));
    assert_eq!(ends.stderr.len(), 64);
    assert!(ends.stderr.ends_with(b"line 998\nline 999\n"));
    // A short stream comes whole on stdout.
    let short = run(&guest::ends(&base, "stderr", 64));
    assert!(
        short.stdout.is_empty() && short.stderr.is_empty(),
        "{short:?}"
    );
}

#[test]
fn the_marker_kill_ends_the_command_and_its_children_before_a_status() {
    let base = base("kill");
    let marker = format!("m-kill-{}", std::process::id());
    // A child in the background and a grandchild: all carry the marker.
    let script = "sleep 60 & sh -c 'sleep 61'; echo never";
    detach(
        &guest::wrapper(&base, &Command::Shell(script.into())),
        &marker,
    );
    probe_until(&base, |p| p.stdout_bytes.is_some());
    let marked = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| {
                let path = e.ok()?.path().join("environ");
                let env = std::fs::read(path).ok()?;
                env.split(|b| *b == 0)
                    .any(|kv| kv == format!("{}={marker}", guest::RUN_MARKER).as_bytes())
                    .then_some(())
            })
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while marked() < 3 {
        assert!(
            Instant::now() < deadline,
            "only {} marked processes",
            marked()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let kill = run(&guest::kill_marked(&marker));
    assert_eq!(kill.exit_code, 0, "{kill:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while marked() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} marked processes left",
            marked()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = guest::Probed::parse(&run(&guest::probe(&base))).unwrap();
    assert_eq!(
        after.exit_code, None,
        "killed before it could write a status"
    );
    assert_eq!(after.stdout_bytes, Some(0));
}

/// A job killed with why (cancel-job through any server process sharing the store) writes no
/// status; the probe reads the killer's word instead, so the process watching it ends it so.
#[test]
fn a_job_killed_with_why_is_probed_as_killed_for_that_reason() {
    let base = base("kill-why");
    let marker = format!("m-kill-why-{}", std::process::id());
    detach(
        &guest::wrapper(
            &base,
            &Command::Shell("echo started; sleep 60; echo never".into()),
        ),
        &marker,
    );
    let running = probe_until(&base, |p| p.stdout_bytes == Some(8));
    assert_eq!(running.killed, None);
    let kill = run(&guest::kill_job(&base, &marker, "cancelled"));
    assert_eq!(kill.exit_code, 0, "{kill:?}");
    let killed = probe_until(&base, |p| p.killed.is_some());
    assert_eq!(killed.killed.as_deref(), Some("cancelled"));
    assert_eq!(killed.exit_code, None, "no status of its own");
    std::thread::sleep(Duration::from_millis(300));
    let after = guest::Probed::parse(&run(&guest::probe(&base))).unwrap();
    assert_eq!(after.stdout_bytes, Some(8), "its output stopped: {after:?}");
}
