//! What a job runs in the machine, and how its answers are read. Neither engine reports a
//! detached command's output or end: smolvm 1.32.2's `background: true` exec spawns it with
//! stdout and stderr on /dev/null and answers `pid=N` (`src/api/handlers/exec.rs`,
//! `vm_exec_background` in `src/agent/client.rs`); the cloud's does the same (facts 3.7). So the
//! command is wrapped in a shell that sends its streams to files and writes its exit status
//! last; the server reads those files by byte offset with ordinary execs. Every script takes
//! the job's paths and numbers as positional parameters, never spliced into its text, so no
//! argument needs quoting.

use crate::fleet::internal::marked_script;
use crate::fleet::{Command, ExecOutput};

/// Where a job's files live in the machine: `<base>.stdout`, `<base>.stderr`, `<base>.exit`.
pub fn base_path(job_id: &str) -> String {
    format!("/tmp/smol-mcp-{job_id}")
}

/// Runs `command` with its stdout and stderr in files and, once it has ended, its exit status
/// in `<base>.exit`. The status is written to a temporary name and renamed, so a reader never
/// sees half of it. stdin is /dev/null: a detached command has no one to read from.
pub fn wrapper(base: &str, command: &Command) -> Command {
    let script = r#"exec >"$0.stdout" 2>"$0.stderr" </dev/null; "$@"; echo $? >"$0.exit.part"; mv -f "$0.exit.part" "$0.exit""#;
    let mut argv = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        marked_script(script),
        base.to_owned(),
    ];
    argv.extend(command.argv());
    Command::Argv(argv)
}

/// How far the files have grown, and the exit status once written: one line per stream (its
/// size, or `-` while the file does not exist), then the status if there is one.
pub fn probe(base: &str) -> Command {
    // The status is read before the sizes: it is written once the streams are closed, so sizes
    // read after it are final. Read after them, a job ending in between was reported ended
    // with its last bytes not yet counted, and a reader took the output as complete.
    // A job killed (by cancel-job or its timeout, from whichever server process) writes no
    // status: the killer's word in `<base>.killed` stands for it.
    let script = r#"e=$(cat "$0.exit" 2>/dev/null); k=$(cat "$0.killed" 2>/dev/null); for s in stdout stderr; do if [ -f "$0.$s" ]; then wc -c <"$0.$s"; else echo -; fi; done; if [ -n "$e" ]; then echo "$e"; elif [ -n "$k" ]; then echo "killed:$k"; fi; true"#;
    Command::Argv(vec![
        "sh".into(),
        "-c".into(),
        marked_script(script),
        base.into(),
    ])
}

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probed {
    /// `None` while the stream's file does not exist (yet, or any more).
    pub stdout_bytes: Option<u64>,
    pub stderr_bytes: Option<u64>,
    pub exit_code: Option<i32>,
    /// Killed without a status: the word the killer wrote (`cancelled`, `timedOut`).
    pub killed: Option<String>,
}

impl Probed {
    pub fn parse(output: &ExecOutput) -> Option<Probed> {
        if output.exit_code != 0 {
            return None;
        }
        let text = String::from_utf8_lossy(&output.stdout);
        let mut lines = text.lines().map(str::trim);
        let size = |line: Option<&str>| -> Option<Option<u64>> {
            match line? {
                "-" => Some(None),
                n => n.parse().ok().map(Some),
            }
        };
        let stdout_bytes = size(lines.next())?;
        let stderr_bytes = size(lines.next())?;
        let (exit_code, killed) = match lines.next() {
            None | Some("") => (None, None),
            Some(line) => match line.strip_prefix("killed:") {
                Some(word) => (None, Some(word.to_owned())),
                None => (Some(line.parse().ok()?), None),
            },
        };
        Some(Probed {
            stdout_bytes,
            stderr_bytes,
            exit_code,
            killed,
        })
    }
}

/// Up to `limit` bytes of each stream from the given offsets: stdout's part on the exec's
/// stdout, stderr's on its stderr, byte for byte.
pub fn read(base: &str, stdout_from: u64, stderr_from: u64, limit: usize) -> Command {
    let script = r#"tail -c +"$1" "$0.stdout" 2>/dev/null | head -c "$3"; tail -c +"$2" "$0.stderr" 2>/dev/null | head -c "$3" >&2; true"#;
    Command::Argv(vec![
        "sh".into(),
        "-c".into(),
        marked_script(script),
        base.into(),
        // tail counts from 1.
        (stdout_from + 1).to_string(),
        (stderr_from + 1).to_string(),
        limit.to_string(),
    ])
}

/// The first and the last `each` bytes of one stream's file: the head on stdout, the tail on
/// stderr (the whole file on stdout, and nothing on stderr, when it is no longer than twice that).
pub fn ends(base: &str, stream: &str, each: usize) -> Command {
    let script = r#"f="$0.$1"; n=$(wc -c <"$f" 2>/dev/null || echo 0); if [ "$n" -le $(($2 * 2)) ]; then cat "$f" 2>/dev/null; else head -c "$2" "$f"; tail -c "$2" "$f" >&2; fi; true"#;
    Command::Argv(vec![
        "sh".into(),
        "-c".into(),
        marked_script(script),
        base.into(),
        stream.into(),
        each.to_string(),
    ])
}

/// The environment variable that marks the processes of one command (a run-command call or a
/// job): children inherit it, so a command and whatever it started can be found again.
pub const RUN_MARKER: &str = "SMOL_MCP_RUN";

/// Kills every process whose environment carries the marker `marker`. Neither engine can
/// cancel an exec or signal a detached one, so this is the only way to end a command early.
/// One `grep` reads every process's environment: a `tr | grep` per process took over 30 s in
/// a busy guest under TCG. Markers have a fixed-length random tail, so a match is the marker.
pub fn kill_marked(marker: &str) -> Command {
    let script = format!(
        "for e in $(grep -l '{RUN_MARKER}={marker}' /proc/[0-9]*/environ 2>/dev/null); do \
           p=${{e#/proc/}}; kill -9 \"${{p%/environ}}\" 2>/dev/null; \
         done; true"
    );
    Command::Argv(vec!["sh".into(), "-c".into(), marked_script(&script)])
}

/// Kills a job as [`kill_marked`] does, its `why` (`cancelled`, `timedOut`) written to
/// `<base>.killed` first: the job's status is never written then, and whichever server process
/// watches the job (another than the killer's, when processes share a store) reads why there.
pub fn kill_job(base: &str, marker: &str, why: &str) -> Command {
    let script = format!(
        "echo \"$1\" >\"$0.killed\"; \
         for e in $(grep -l '{RUN_MARKER}={marker}' /proc/[0-9]*/environ 2>/dev/null); do \
           p=${{e#/proc/}}; kill -9 \"${{p%/environ}}\" 2>/dev/null; \
         done; true"
    );
    Command::Argv(vec![
        "sh".into(),
        "-c".into(),
        marked_script(&script),
        base.into(),
        why.into(),
    ])
}

/// Shared with the terminals' reads (`crate::policy::terminals`).
pub use crate::policy::output::complete_utf8_len;

#[cfg(test)]
mod tests {
    use super::*;

    fn out(stdout: &str, code: i32) -> ExecOutput {
        ExecOutput {
            exit_code: code,
            stdout: stdout.as_bytes().to_vec(),
            stderr: Vec::new(),
            stdout_cut_upstream: false,
            stderr_cut_upstream: false,
        }
    }

    #[test]
    fn a_probe_reads_sizes_and_the_status() {
        assert_eq!(
            Probed::parse(&out("12\n      0\n3\n", 0)),
            Some(Probed {
                stdout_bytes: Some(12),
                stderr_bytes: Some(0),
                exit_code: Some(3),
                killed: None,
            })
        );
        assert_eq!(
            Probed::parse(&out("-\n-\n", 0)),
            Some(Probed {
                stdout_bytes: None,
                stderr_bytes: None,
                exit_code: None,
                killed: None,
            })
        );
        assert_eq!(
            Probed::parse(&out("5\n0\nkilled:cancelled\n", 0)),
            Some(Probed {
                stdout_bytes: Some(5),
                stderr_bytes: Some(0),
                exit_code: None,
                killed: Some("cancelled".into()),
            })
        );
        assert_eq!(Probed::parse(&out("12\n", 0)), None);
        assert_eq!(Probed::parse(&out("12\n0\n", 1)), None);
        assert_eq!(Probed::parse(&out("x\n0\n", 0)), None);
    }

    #[test]
    fn a_cut_character_is_left_for_the_next_read() {
        let e = "é".as_bytes();
        assert_eq!(complete_utf8_len(b"abc"), 3);
        assert_eq!(complete_utf8_len(&[b'a', e[0]]), 1);
        assert_eq!(complete_utf8_len(&[b'a', e[0], e[1]]), 3);
        let euro = "€".as_bytes();
        assert_eq!(complete_utf8_len(&[b'a', euro[0], euro[1]]), 1);
        let emoji = "😀".as_bytes();
        assert_eq!(complete_utf8_len(&emoji[..3]), 0);
        assert_eq!(complete_utf8_len(emoji), 4);
        assert_eq!(complete_utf8_len(b""), 0);
    }

    #[test]
    fn the_scripts_take_their_values_as_parameters() {
        let wrapped = wrapper("/tmp/smol-mcp-job-1", &Command::Shell("echo 'a b'".into()));
        let argv = wrapped.argv();
        assert_eq!(argv[3], "/tmp/smol-mcp-job-1");
        assert_eq!(&argv[4..], ["sh", "-c", "echo 'a b'"]);
        assert!(!argv[2].contains("job-1"));
        let read = read("/tmp/x", 0, 5, 100).argv();
        assert_eq!(&read[3..], ["/tmp/x", "1", "6", "100"]);
    }
}
