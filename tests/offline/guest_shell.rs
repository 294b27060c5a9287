//! The fakes' guest shell (`FakeServe::start_guest_shell`, `FakeCloud::start_guest_shell`):
//! exec really runs the command as a host process, the way the engine runs it in the guest,
//! driven here through the fleets as the server drives them.

use crate::common::fake_cloud::{FakeCloud, TOKEN};
use crate::common::fake_serve::FakeServe;
use smol_mcp::fleet::{Backstop, CloudFleet, Command, ExecSpec, FleetApi, LocalFleet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BACKSTOP: Backstop = Backstop {
    ttl_secs: 3600,
    auto_stop_secs: 900,
};

async fn local() -> (FakeServe, LocalFleet) {
    let fake = FakeServe::start_guest_shell().await;
    fake.add_machine("m1", "running");
    let fleet = LocalFleet::new(fake.endpoint()).unwrap();
    (fake, fleet)
}

async fn cloud() -> (FakeCloud, Arc<CloudFleet>, String) {
    let fake = FakeCloud::start_guest_shell().await;
    let id = fake.add_machine("w", "started");
    let fleet = CloudFleet::new(&format!("{}/", fake.url()), TOKEN, BACKSTOP).unwrap();
    (fake, Arc::new(fleet), id)
}

fn shell(script: &str) -> ExecSpec {
    ExecSpec::new(Command::Shell(script.into()))
}

/// Runs `script`, which prints "first" and sleeps 2 s before it goes on, streamed on `machine`:
/// its first piece must come while it runs, not with the rest at the end. Answers the whole.
async fn streamed_first_line_early(
    fleet: Arc<dyn FleetApi>,
    machine: &str,
    script: &str,
) -> smol_mcp::fleet::ExecOutput {
    let (sender, mut pieces) = tokio::sync::mpsc::unbounded_channel();
    let running = {
        let (machine, spec) = (machine.to_owned(), shell(script));
        tokio::spawn(async move { fleet.exec_streamed(&machine, &spec, &sender).await })
    };
    let first = pieces.recv().await.unwrap();
    assert_eq!(first.text, "first\n");
    let first_seen = Instant::now();
    let out = running.await.unwrap().unwrap();
    assert!(
        first_seen.elapsed() >= Duration::from_millis(1500),
        "the first line came while it ran, not with the rest at the end"
    );
    out
}

/// Whether a process is alive (signal 0 reaches it, and it is not a zombie awaiting its reaper).
fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state is the field after the parenthesised command name.
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().next());
    !matches!(state, None | Some("Z" | "X"))
}

/// Waits (at most 10 s) until `condition` holds.
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

/// The pid a background answer reports.
fn reported_pid(stdout: &[u8]) -> u32 {
    let text = String::from_utf8(stdout.to_vec()).unwrap();
    text.strip_prefix("pid=")
        .and_then(|t| t.strip_suffix('\n'))
        .unwrap_or_else(|| panic!("not the engine's pid=<n>\\n answer: {text:?}"))
        .parse()
        .unwrap()
}

/// A background command that records its shell's pid, then appends a line every 50 ms.
fn ticking(dir: &Path) -> ExecSpec {
    let mut spec = shell(&format!(
        "echo $$ > '{0}/pid'; while :; do echo tick >> '{0}/ticks'; sleep 0.05; done",
        dir.display()
    ));
    spec.background = true;
    spec
}

#[tokio::test]
async fn local_a_real_shell_runs_with_its_exit_code_and_both_streams() {
    let (_fake, fleet) = local().await;
    let out = fleet
        .exec(
            "m1",
            &shell("printf 'out\\377'; printf 'err\\n' >&2; exit 3"),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 3);
    assert_eq!(out.stdout, b"out\xff", "bytes exact through stdoutB64");
    assert_eq!(out.stderr, b"err\n");
    let missing = fleet
        .exec(
            "m1",
            &ExecSpec::new(Command::Argv(vec!["no-such-program-here".into()])),
        )
        .await
        .unwrap();
    assert_eq!(missing.exit_code, 255);
    assert_eq!(
        String::from_utf8_lossy(&missing.stderr),
        "executable file 'no-such-program-here' not found in $PATH: No such file or directory"
    );
}

#[tokio::test]
async fn local_env_workdir_and_stdin_apply() {
    let (_fake, fleet) = local().await;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = shell("pwd; echo \"$GREETING\"; cat");
    spec.workdir = Some(dir.path().display().to_string());
    spec.env.insert("GREETING".into(), "hello there".into());
    spec.stdin = Some("from stdin\n".into());
    let out = fleet.exec("m1", &spec).await.unwrap();
    assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let real = dir.path().canonicalize().unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("{}\nhello there\nfrom stdin\n", real.display())
    );
}

#[tokio::test]
async fn local_a_background_command_keeps_running_after_the_answer_and_stop_kills_it() {
    let (fake, fleet) = local().await;
    let dir = tempfile::tempdir().unwrap();
    let asked = Instant::now();
    let out = fleet.exec("m1", &ticking(dir.path())).await.unwrap();
    assert!(asked.elapsed() < Duration::from_secs(5), "answered at once");
    assert_eq!(out.exit_code, 0);
    assert!(out.stderr.is_empty());
    let pid = reported_pid(&out.stdout);
    assert_eq!(fake.guest_processes("m1"), [pid]);
    let ticks = dir.path().join("ticks");
    eventually("it has ticked three times", || lines(&ticks) >= 3).await;
    assert_eq!(
        std::fs::read_to_string(dir.path().join("pid"))
            .unwrap()
            .trim(),
        pid.to_string(),
        "the answer's pid is the command's"
    );
    fleet.stop("m1").await.unwrap();
    eventually("the stop killed it", || !alive(pid)).await;
    assert!(fake.guest_processes("m1").is_empty());
    let after = lines(&ticks);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(lines(&ticks), after, "nothing ticks after the stop");
}

#[tokio::test]
async fn local_delete_kills_background_and_foreground_commands() {
    let (fake, fleet) = local().await;
    let dir = tempfile::tempdir().unwrap();
    let out = fleet.exec("m1", &ticking(dir.path())).await.unwrap();
    let background = reported_pid(&out.stdout);
    // A foreground command in flight, with a child of its own (the sleep).
    let running = {
        let fleet = fleet.clone();
        tokio::spawn(async move { fleet.exec("m1", &shell("sleep 60; echo done")).await })
    };
    eventually("both run", || fake.guest_processes("m1").len() == 2).await;
    let foreground = fake
        .guest_processes("m1")
        .into_iter()
        .find(|p| *p != background)
        .unwrap();
    fleet.delete("m1").await.unwrap();
    eventually("the delete killed both", || {
        !alive(background) && !alive(foreground)
    })
    .await;
    let ended = running.await.unwrap().unwrap();
    assert_eq!(ended.exit_code, 137, "killed by SIGKILL");
    assert!(ended.stdout.is_empty());
}

#[tokio::test]
async fn local_a_timeout_kills_the_command_and_answers_124_with_the_output_so_far() {
    let (fake, fleet) = local().await;
    let mut spec = shell("echo partial; sleep 30; echo never");
    spec.timeout_secs = Some(1);
    let asked = Instant::now();
    let out = fleet.exec("m1", &spec).await.unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(4),
        "ended at its timeout, its sleep killed with it (else the pipe is awaited 5 s more)"
    );
    assert_eq!(out.exit_code, 124);
    assert_eq!(out.stdout, b"partial\n");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "\ncommand timed out after 1000ms"
    );
    assert!(
        out.timed_out(Duration::ZERO, None),
        "the server reads it as a timeout by its words alone"
    );
    assert!(fake.guest_processes("m1").is_empty());
}

#[tokio::test]
async fn local_a_streamed_command_sends_its_output_as_it_comes() {
    let (_fake, fleet) = local().await;
    let out = streamed_first_line_early(
        Arc::new(fleet),
        "m1",
        "echo first; sleep 2; echo second >&2; exit 5",
    )
    .await;
    assert_eq!(out.exit_code, 5);
    assert_eq!(out.stdout, b"first\n");
    assert_eq!(out.stderr, b"second\n");
}

#[tokio::test]
async fn dropping_the_fake_kills_what_it_started() {
    let (fake, fleet) = local().await;
    let dir = tempfile::tempdir().unwrap();
    let out = fleet.exec("m1", &ticking(dir.path())).await.unwrap();
    let pid = reported_pid(&out.stdout);
    assert!(alive(pid));
    drop(fake);
    eventually("dropping the fake killed it", || !alive(pid)).await;
}

#[tokio::test]
async fn cloud_a_string_runs_through_a_shell_with_cwd_env_and_stdin() {
    let (_fake, fleet, id) = cloud().await;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = shell("pwd; echo \"$GREETING\"; cat; echo oops >&2; exit 7");
    spec.workdir = Some(dir.path().display().to_string());
    spec.env.insert("GREETING".into(), "hello there".into());
    spec.stdin = Some("from stdin\n".into());
    let out = fleet.exec(&id, &spec).await.unwrap();
    assert_eq!(out.exit_code, 7);
    let real = dir.path().canonicalize().unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("{}\nhello there\nfrom stdin\n", real.display())
    );
    assert_eq!(out.stderr, b"oops\n");
}

#[tokio::test]
async fn cloud_background_keeps_running_until_stop_and_delete_kill_it() {
    let (fake, fleet, id) = cloud().await;
    let dir = tempfile::tempdir().unwrap();
    let out = fleet.exec(&id, &ticking(dir.path())).await.unwrap();
    assert_eq!(out.exit_code, 0);
    let pid = reported_pid(&out.stdout);
    assert_eq!(fake.guest_processes(&id), [pid]);
    let ticks = dir.path().join("ticks");
    eventually("it has ticked three times", || lines(&ticks) >= 3).await;
    fleet.stop(&id).await.unwrap();
    eventually("the stop killed it", || !alive(pid)).await;
    // The next exec starts the machine again (facts 3.7); delete ends what runs then.
    let again = tempfile::tempdir().unwrap();
    let out = fleet.exec(&id, &ticking(again.path())).await.unwrap();
    let second = reported_pid(&out.stdout);
    eventually("it ticks", || lines(&again.path().join("ticks")) >= 1).await;
    fleet.delete(&id).await.unwrap();
    eventually("the delete killed it", || !alive(second)).await;
    assert!(fake.guest_processes(&id).is_empty());
}

#[tokio::test]
async fn cloud_a_timeout_answers_124_saying_so() {
    let (_fake, fleet, id) = cloud().await;
    let mut spec = shell("echo partial; sleep 30");
    spec.timeout_secs = Some(1);
    let out = fleet.exec(&id, &spec).await.unwrap();
    assert_eq!(out.exit_code, 124);
    assert_eq!(out.stdout, b"partial\n");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("command timed out"),
        "facts 3.7: stderr contains `command timed out`"
    );
    assert!(out.timed_out(Duration::ZERO, None));
}

#[tokio::test]
async fn cloud_a_streamed_command_sends_its_output_as_it_comes() {
    let (_fake, fleet, id) = cloud().await;
    let out =
        streamed_first_line_early(fleet, &id, "echo first; sleep 2; echo second; exit 4").await;
    assert_eq!(out.exit_code, 4);
    assert_eq!(out.stdout, b"first\nsecond\n");
}

/// The server's own kill of a cancelled run-command (a second exec finding the processes that
/// carry the call's marker in their environment) really ends the command the guest shell runs:
/// the shell is faithful enough for the server's cancellation path.
#[tokio::test]
async fn a_cancelled_run_command_is_really_killed_by_the_servers_marker_kill() {
    let (fake, _fleet) = local().await;
    let h = crate::common::mcp::Harness::on_fake(&fake, &[]).await;
    let args =
        serde_json::json!({"name": "m1", "command": "sleep 60; echo never", "timeoutSecs": 120});
    let handle = h.start_call("run-command", args).await;
    eventually("the command runs", || {
        !fake.guest_processes("m1").is_empty()
    })
    .await;
    let running = fake.guest_processes("m1");
    handle.cancel(Some("test".into())).await.unwrap();
    eventually("the marker kill ended it", || {
        running.iter().all(|pid| !alive(*pid))
    })
    .await;
}
