//! The guest shell of both fakes (opt-in: `FakeServe::start_guest_shell`,
//! `FakeCloud::start_guest_shell`): exec really runs its argv as a process on the host, the way
//! the engine runs it in the guest, so a test can watch a command live, be detached, time out,
//! and be killed.
//!
//! What it follows, and where that is written down:
//! - Foreground: stdout and stderr are read as they come (smolvm crates/smolvm-agent/src/process.rs
//!   `wait_with_timeout_cleanup_and_liveness`, search-index id 59937956170): the exit code is the
//!   process's, or 128 + the signal that ended it (`exit_code_from_status`); once the process has
//!   exited its output is awaited at most 5 s more (`READER_JOIN_TIMEOUT`: a descendant left
//!   running may hold the pipes open).
//! - Timeout: the process (here its whole process group) is killed, the output so far is kept,
//!   exit 124 (`TIMEOUT_EXIT_CODE`) and "\ncommand timed out after <ms>ms" appended to stderr (the
//!   agent's words on its normal path, as `fake_serve::TimeoutForm::Command`; the cloud's marker
//!   is the same text, reference/cloud-api-facts.md 3.7).
//! - `stdin`: written, then closed; without it the command's stdin is empty.
//! - Background: spawned detached, stdio /dev/null, its own process group, answered at once with
//!   its pid; its timeout and stdin are ignored and it runs until it exits or its machine stops
//!   (smolvm src/api/handlers/exec.rs `req.background` branch and src/agent/client.rs
//!   `vm_exec_background`, search-index ids 70216742866 and 59930760840; cloud: facts 3.7 [SDK]).
//! - The request's end does not end a foreground command (the engine's streamed exec ignores a
//!   closed client, smolvm 1.32.2's exec.rs): it runs in a task of its own, so a
//!   cancelled call's command is there to be killed by the server's marker kill, as in a guest.
//!
//! What differs from a guest: the command sees the host's environment (its `PATH` above all)
//! plus the request's, and a workdir is a host path. Every process it starts, and everything
//! those start, carries `SMOL_FAKE_GUEST=<fake>/<machine>` in its environment: stopping or
//! deleting the machine kills them all (the guest's processes end with its VM), and so does
//! dropping the fake, so no process outlives a test.

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc::UnboundedSender;

/// The environment variable that marks every process a guest shell started, and their children.
pub const GUEST_TAG_VAR: &str = "SMOL_FAKE_GUEST";
/// The agent's exit code for a command it ended at its timeout (process.rs `TIMEOUT_EXIT_CODE`).
pub const TIMEOUT_EXIT_CODE: i32 = 124;
/// How long output is awaited after the process exited (process.rs `READER_JOIN_TIMEOUT`).
const READER_JOIN_TIMEOUT: Duration = Duration::from_secs(5);
/// What the cloud answers for an executable that does not exist: exit 255 with crun's words
/// (facts 3.7); the local engine runs commands through crun in the image's container too.
pub const NOT_FOUND_EXIT_CODE: i32 = 255;

/// A command as both engines' exec bodies describe it.
#[derive(Debug, Clone, Default)]
pub struct GuestCommand {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: Option<String>,
    pub stdin: Option<Vec<u8>>,
    pub timeout: Option<Duration>,
}

/// Which stream a piece of output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestStream {
    Stdout,
    Stderr,
}

impl GuestStream {
    pub fn event(self) -> &'static str {
        match self {
            GuestStream::Stdout => "stdout",
            GuestStream::Stderr => "stderr",
        }
    }
}

/// How a foreground command ended.
#[derive(Debug, Default, Clone)]
pub struct GuestOutcome {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub timed_out: bool,
}

/// The processes one fake started, by machine.
pub struct GuestShell {
    /// Unique to this fake in this test process: the value of [`GUEST_TAG_VAR`] is
    /// `<tag>/<machine>`.
    tag: String,
    /// Live process groups (leader pid) and their machine.
    running: Mutex<BTreeMap<u32, String>>,
}

impl GuestShell {
    pub fn new() -> Arc<GuestShell> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Arc::new(GuestShell {
            tag: format!(
                "{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::SeqCst)
            ),
            running: Mutex::new(BTreeMap::new()),
        })
    }

    fn machine_tag(&self, machine: &str) -> String {
        format!("{}/{machine}", self.tag)
    }

    /// The pids (each its process group's leader) of the commands still running on a machine.
    pub fn processes(&self, machine: &str) -> Vec<u32> {
        self.running
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, m)| *m == machine)
            .map(|(pid, _)| *pid)
            .collect()
    }

    fn command(&self, machine: &str, cmd: &GuestCommand) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&cmd.argv[0]);
        command
            .args(&cmd.argv[1..])
            .envs(cmd.env.iter().map(|(k, v)| (k, v)))
            .env(GUEST_TAG_VAR, self.machine_tag(machine))
            // Its own group, so a timeout or a stop ends what the command started too.
            .process_group(0)
            .kill_on_drop(true);
        if let Some(dir) = &cmd.workdir {
            command.current_dir(dir);
        }
        command
    }

    fn register(&self, pid: u32, machine: &str) {
        self.running.lock().unwrap().insert(pid, machine.to_owned());
    }

    fn forget(&self, pid: u32) {
        self.running.lock().unwrap().remove(&pid);
    }

    /// Spawns a `background: true` command and answers its pid at once.
    pub fn spawn_background(
        self: &Arc<Self>,
        machine: &str,
        cmd: &GuestCommand,
    ) -> std::io::Result<u32> {
        let mut child = self
            .command(machine, cmd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let pid = child.id().unwrap_or_default();
        self.register(pid, machine);
        // Weak: a running command must not keep the shell (and so itself) alive past the fake.
        let shell = Arc::downgrade(self);
        tokio::spawn(async move {
            let _ = child.wait().await;
            if let Some(shell) = shell.upgrade() {
                shell.forget(pid);
            }
        });
        Ok(pid)
    }

    /// Runs a foreground command to its end or its timeout. Each piece of output is also sent
    /// to `pieces` as it is read (the timeout's words too). The command runs in a task of its
    /// own: dropping this future does not end it.
    pub async fn run(
        self: &Arc<Self>,
        machine: &str,
        cmd: GuestCommand,
        pieces: Option<UnboundedSender<(GuestStream, Vec<u8>)>>,
    ) -> GuestOutcome {
        let spawned = self
            .command(machine, &cmd)
            .stdin(if cmd.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let stderr = if e.kind() == std::io::ErrorKind::NotFound {
                    format!(
                        "executable file '{}' not found in $PATH: No such file or directory",
                        cmd.argv[0]
                    )
                } else {
                    format!("{}: {e}", cmd.argv[0])
                };
                if let Some(pieces) = &pieces {
                    let _ = pieces.send((GuestStream::Stderr, stderr.clone().into_bytes()));
                }
                return GuestOutcome {
                    exit_code: NOT_FOUND_EXIT_CODE,
                    stderr: stderr.into_bytes(),
                    ..GuestOutcome::default()
                };
            }
        };
        let pid = child.id().unwrap_or_default();
        self.register(pid, machine);
        let shell = Arc::downgrade(self);
        let (done, outcome) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let outcome = supervise(child, cmd, pieces).await;
            if let Some(shell) = shell.upgrade() {
                shell.forget(pid);
            }
            let _ = done.send(outcome);
        });
        outcome.await.unwrap_or_else(|_| GuestOutcome {
            // The runtime is ending: the task was dropped, and its command killed with it.
            exit_code: 128 + Signal::SIGKILL as i32,
            ..GuestOutcome::default()
        })
    }

    /// Kills every process started on a machine (its VM stopping or going away).
    pub fn kill_machine(&self, machine: &str) {
        let groups: Vec<u32> = {
            let mut running = self.running.lock().unwrap();
            let groups: Vec<u32> = running
                .iter()
                .filter(|(_, m)| *m == machine)
                .map(|(pid, _)| *pid)
                .collect();
            for pid in &groups {
                running.remove(pid);
            }
            groups
        };
        kill_groups(&groups);
        let tag = format!("{GUEST_TAG_VAR}={}", self.machine_tag(machine));
        kill_tagged(|entry| entry == tag);
    }

    /// Kills every process this shell started, on any machine.
    pub fn kill_all(&self) {
        let groups: Vec<u32> = std::mem::take(&mut *self.running.lock().unwrap())
            .into_keys()
            .collect();
        kill_groups(&groups);
        let prefix = format!("{GUEST_TAG_VAR}={}/", self.tag);
        kill_tagged(|entry| entry.starts_with(&prefix));
    }
}

impl Drop for GuestShell {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Kills the shell's processes when the last handle of the fake holding it is dropped (the
/// server task of the fake may outlive its handles until the test's runtime ends).
pub struct KillOnDrop(pub Arc<GuestShell>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.0.kill_all();
    }
}

fn kill_groups(groups: &[u32]) {
    for pid in groups {
        if let Ok(pid) = i32::try_from(*pid) {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Kills every process whose environment has an entry `matches` accepts, until none is left
/// (one may fork while the last is killed): what left its process group (`setsid`, a
/// double fork) is found this way too.
fn kill_tagged(matches: impl Fn(&str) -> bool) {
    let me = std::process::id();
    for _ in 0..20 {
        let mut found = 0;
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|pid| *pid != me)
            else {
                continue;
            };
            // A zombie's environment reads empty, so a killed process is not found again.
            let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
                continue;
            };
            let tagged = environ
                .split(|b| *b == 0)
                .any(|var| std::str::from_utf8(var).is_ok_and(&matches));
            if tagged && let Ok(pid) = i32::try_from(pid) {
                found += 1;
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        if found == 0 {
            return;
        }
    }
}

/// Reads a pipe in chunks, as the agent's reader threads do, sending each as it comes.
fn read_into(
    mut pipe: impl AsyncRead + Unpin + Send + 'static,
    stream: GuestStream,
    sink: UnboundedSender<(GuestStream, Vec<u8>)>,
) {
    tokio::spawn(async move {
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            match pipe.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sink.send((stream, chunk[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
}

/// Waits for a foreground command, collecting its output, and ends it at its timeout.
async fn supervise(
    mut child: tokio::process::Child,
    cmd: GuestCommand,
    pieces: Option<UnboundedSender<(GuestStream, Vec<u8>)>>,
) -> GuestOutcome {
    let pid = child.id().unwrap_or_default();
    if let (Some(mut stdin), Some(data)) = (child.stdin.take(), cmd.stdin) {
        tokio::spawn(async move {
            let _ = stdin.write_all(&data).await;
        });
    }
    let (sink, mut output) = tokio::sync::mpsc::unbounded_channel();
    if let Some(stdout) = child.stdout.take() {
        read_into(stdout, GuestStream::Stdout, sink.clone());
    }
    if let Some(stderr) = child.stderr.take() {
        read_into(stderr, GuestStream::Stderr, sink);
    }
    let mut outcome = GuestOutcome::default();
    let take = |outcome: &mut GuestOutcome, (stream, bytes): (GuestStream, Vec<u8>)| {
        match stream {
            GuestStream::Stdout => outcome.stdout.extend_from_slice(&bytes),
            GuestStream::Stderr => outcome.stderr.extend_from_slice(&bytes),
        }
        if let Some(pieces) = &pieces {
            let _ = pieces.send((stream, bytes));
        }
    };
    let deadline = cmd.timeout.map(|t| tokio::time::Instant::now() + t);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.ok(),
            Some(piece) = output.recv() => take(&mut outcome, piece),
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)),
                if deadline.is_some() => {
                kill_groups(&[pid]);
                let _ = child.wait().await;
                outcome.timed_out = true;
                break None;
            }
        }
    };
    // The rest of the output, for at most the agent's join window.
    let rest = tokio::time::Instant::now() + READER_JOIN_TIMEOUT;
    while let Ok(Some(piece)) = tokio::time::timeout_at(rest, output.recv()).await {
        take(&mut outcome, piece);
    }
    if outcome.timed_out {
        let millis = cmd.timeout.unwrap_or_default().as_millis();
        let words = format!("\ncommand timed out after {millis}ms").into_bytes();
        take(&mut outcome, (GuestStream::Stderr, words));
        outcome.exit_code = TIMEOUT_EXIT_CODE;
    } else {
        use std::os::unix::process::ExitStatusExt;
        outcome.exit_code = status.map_or(-1, |s| {
            s.code()
                .or_else(|| s.signal().map(|sig| 128 + sig))
                .unwrap_or(-1)
        });
    }
    outcome
}

/// Runs a foreground command for a streamed exec: each piece of output becomes a `stdout` or
/// `stderr` event (each chunk decoded as lossy UTF-8 on its own, as both engines send it), then
/// an `exit` event with `{"exitCode":N}`. A client that stops reading does not end the command
/// (the engine ignores its send errors).
pub fn stream_events(
    shell: &Arc<GuestShell>,
    machine: &str,
    cmd: GuestCommand,
) -> tokio::sync::mpsc::UnboundedReceiver<(String, String)> {
    let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
    let (pieces, mut pieces_rx) = tokio::sync::mpsc::unbounded_channel::<(GuestStream, Vec<u8>)>();
    let shell = shell.clone();
    let machine = machine.to_owned();
    tokio::spawn(async move {
        let forward = async {
            while let Some((stream, bytes)) = pieces_rx.recv().await {
                let text = String::from_utf8_lossy(&bytes).into_owned();
                let _ = events.send((GuestStream::event(stream).to_owned(), text));
            }
        };
        let (outcome, ()) = tokio::join!(shell.run(&machine, cmd, Some(pieces)), forward);
        let _ = events.send((
            "exit".to_owned(),
            format!("{{\"exitCode\":{}}}", outcome.exit_code),
        ));
    });
    receiver
}
