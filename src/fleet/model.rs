//! The one machine vocabulary both fleets are translated into. Nothing here knows about HTTP or
//! either API's field names; `local.rs` and `cloud.rs` translate to and from it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The fleet a machine lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FleetKind {
    Local,
    Cloud,
}

impl FleetKind {
    /// Every fleet a process may serve.
    pub const ALL: [FleetKind; 2] = [FleetKind::Local, FleetKind::Cloud];

    pub fn as_str(self) -> &'static str {
        match self {
            FleetKind::Local => "local",
            FleetKind::Cloud => "cloud",
        }
    }

    /// The fleet `name` names (`as_str`'s word), if any.
    pub fn parse(name: &str) -> Option<FleetKind> {
        FleetKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }
}

/// A machine as the tools report it, whichever fleet answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
    /// What other calls take{cloud: (the mach- id on cloud)}.
    pub id: String,
    pub name: String,
    #[schemars(with = "String")]
    pub state: MachineState,
    pub cpus: Option<u32>,
    pub memory_mb: Option<u32>,
    /// open, blocked, or allow(host,...,cidr,...).
    #[schemars(with = "String")]
    pub network: MachineNetwork,
    pub image: Option<String>,
    /// {cloud:The ingress address of the first published port.}
    pub url: Option<String>,
    pub pid: Option<i64>,
    /// RFC 3339, UTC.
    pub created_at: Option<String>,
    pub branchable: bool,
    pub ports: Vec<PublishedPort>,
    /// Whether the fleet itself reports the machine as serving (cloud `ready`); `None` locally.
    #[serde(skip)]
    pub upstream_ready: Option<bool>,
    /// What the engine reports the machine has used (its counters) and holds now; read around
    /// a run to say what the run cost, not shown with the record.
    #[serde(skip)]
    pub consumption: Consumption,
}

/// A machine's consumption as its fleet reports it: counters since its boot (CPU, egress), what
/// it holds now (memory, disk), and on cloud what it has cost so far. `None`: not reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Consumption {
    pub cpu_millis: Option<i64>,
    pub rss_mb: Option<i64>,
    pub disk_used_mb: Option<i64>,
    pub egress_bytes: Option<i64>,
    /// Millionths of a dollar (cloud; a lower bound while the machine runs: the cloud samples
    /// CPU and memory every few minutes).
    pub cost_micros: Option<i64>,
}

impl Machine {
    /// Both APIs use more than one word for "the VM is up".
    pub fn is_running(&self) -> bool {
        self.phase() == Phase::Running
    }

    /// What the state means for the next command (see [`MachineState::phase`]).
    pub fn phase(&self) -> Phase {
        self.state.phase()
    }
}

/// A machine's state as its fleet words it. The local engine has more states than the fake
/// used to show (`failed`, `unreachable`, `frozen`, `paused`, `pausing`, `starting`, `stopping`:
/// every one is in the 1.32.2 binary, `strings smol-vmm`); the cloud documents none of its own.
/// A word this server does not know is kept as the fleet said it ([`MachineState::Other`]) and
/// shown so: a listing must not fail on an engine's new word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineState {
    Running,
    Started,
    Stopped,
    Created,
    Failed,
    Exited,
    Crashed,
    Paused,
    Pausing,
    Frozen,
    Unreachable,
    Starting,
    Stopping,
    Other(String),
}

impl MachineState {
    const KNOWN: [MachineState; 13] = [
        MachineState::Running,
        MachineState::Started,
        MachineState::Stopped,
        MachineState::Created,
        MachineState::Failed,
        MachineState::Exited,
        MachineState::Crashed,
        MachineState::Paused,
        MachineState::Pausing,
        MachineState::Frozen,
        MachineState::Unreachable,
        MachineState::Starting,
        MachineState::Stopping,
    ];

    /// The word as the fleet says it.
    pub fn word(&self) -> &str {
        match self {
            MachineState::Running => "running",
            MachineState::Started => "started",
            MachineState::Stopped => "stopped",
            MachineState::Created => "created",
            MachineState::Failed => "failed",
            MachineState::Exited => "exited",
            MachineState::Crashed => "crashed",
            MachineState::Paused => "paused",
            MachineState::Pausing => "pausing",
            MachineState::Frozen => "frozen",
            MachineState::Unreachable => "unreachable",
            MachineState::Starting => "starting",
            MachineState::Stopping => "stopping",
            MachineState::Other(word) => word,
        }
    }

    /// The state a fleet's `word` names.
    pub fn of(word: &str) -> MachineState {
        MachineState::KNOWN
            .into_iter()
            .find(|state| state.word() == word)
            .unwrap_or_else(|| MachineState::Other(word.to_owned()))
    }

    /// What the state leaves of the guest for the next command.
    pub fn phase(&self) -> Phase {
        match self {
            MachineState::Running | MachineState::Started => Phase::Running,
            // Nothing runs: the next command, read or write boots the machine (the engine's
            // `ensure_running`, and the cloud's auto-start), so a result says it started one.
            MachineState::Stopped
            | MachineState::Created
            | MachineState::Failed
            | MachineState::Exited
            | MachineState::Crashed => Phase::Stopped,
            // Saved whole (1.32.2 pause): resumed, not booted, before the next command.
            MachineState::Paused => Phase::Paused,
            // A branch source kept as a base (`freezeSource`): it runs nothing more.
            MachineState::Frozen => Phase::Frozen,
            // The VM and its memory are there, its vCPUs held while a pause is under way: a
            // command does not boot it, so a result does not say it started one.
            MachineState::Pausing => Phase::Suspended,
            // The VM process is there but its agent does not answer: it is not stopped, and a
            // command may fail until it answers again.
            MachineState::Unreachable => Phase::Unreachable,
            MachineState::Starting | MachineState::Stopping | MachineState::Other(_) => {
                Phase::Other
            }
        }
    }
}

impl From<String> for MachineState {
    fn from(word: String) -> MachineState {
        MachineState::of(&word)
    }
}

impl From<&str> for MachineState {
    fn from(word: &str) -> MachineState {
        MachineState::of(word)
    }
}

impl std::fmt::Display for MachineState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.word())
    }
}

impl Serialize for MachineState {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.word())
    }
}

/// A machine state read for what the next operation finds (see [`Machine::phase`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Running,
    Stopped,
    /// Memory, processes and disk saved (a pause): the next operation resumes it.
    Paused,
    Suspended,
    /// Kept as the base of branches (`freezeSource`): its memory is the instant every child
    /// starts from, so it runs nothing more. On the 1.32.2 engine a command or file read is 409
    /// after a 3 s probe (its default text says "retry", which never helps), `resume` is a
    /// 200 that changes nothing and `start` is 409 (docs/bases-engine.md): nothing but a
    /// branch, a listing or a delete is sent to it.
    Frozen,
    Unreachable,
    /// Starting, stopping, or a word this server does not know (the cloud documents none of its
    /// states): read as before these states were known, not running and started by the next
    /// command.
    Other,
}

impl Phase {
    /// Whether the next command, read or write boots the machine, so that its result says it
    /// started one: not for a suspended or unreachable machine, whose VM is still there.
    pub fn boots_on_use(self) -> bool {
        matches!(self, Phase::Stopped | Phase::Other)
    }
}

/// Which of a machine's logs is read. The cloud has one, its control plane's event log, for
/// either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogSource {
    /// What the machine's workload (its image's own command) printed, kept across restarts.
    #[default]
    Workload,
    /// The engine's log of the machine: its kernel and guest agent (boot milestones, one
    /// record per command), this boot only.
    Engine,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PublishedPort {
    pub guest: u16,
    /// The outside port, once placed.
    pub host: Option<u16>,
}

/// Egress policy, as asked for at create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Egress {
    Open,
    Blocked,
    /// Only these destinations. Both empty: an allow list in force that allows nothing yet (a
    /// `network: "ask"` machine, which the engine lets grow while it runs; `Blocked` has no
    /// list, and cannot take one live).
    Allow {
        hosts: Vec<String>,
        cidrs: Vec<String>,
    },
}

/// A machine's network as its fleet reports it. Shown (and serialized) as one word or list:
/// `open`, `blocked`, `allow(host,...,cidr,...)`, or the fleet's own word for a mode this server
/// does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineNetwork {
    Known(Egress),
    /// A mode this server does not know, in the fleet's word (`unknown` when it gave none).
    Other(String),
}

impl MachineNetwork {
    /// The egress policy, when the fleet reported one this server knows.
    pub fn egress(&self) -> Option<&Egress> {
        match self {
            MachineNetwork::Known(egress) => Some(egress),
            MachineNetwork::Other(_) => None,
        }
    }
}

impl std::fmt::Display for MachineNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MachineNetwork::Known(egress) => f.write_str(&egress.describe()),
            MachineNetwork::Other(word) => f.write_str(word),
        }
    }
}

impl Serialize for MachineNetwork {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Compared as shown (`open`, `allow(a,b)`).
impl PartialEq<&str> for MachineNetwork {
    fn eq(&self, shown: &&str) -> bool {
        match self {
            MachineNetwork::Known(egress) => egress.describe() == *shown,
            MachineNetwork::Other(word) => word == shown,
        }
    }
}

impl From<Egress> for MachineNetwork {
    fn from(egress: Egress) -> Self {
        MachineNetwork::Known(egress)
    }
}

impl Egress {
    /// The reading every machine view uses.
    pub fn describe(&self) -> String {
        match self {
            Egress::Open => "open".to_owned(),
            Egress::Blocked => "blocked".to_owned(),
            Egress::Allow { hosts, cidrs } if hosts.is_empty() && cidrs.is_empty() => {
                "allow(none)".to_owned()
            }
            Egress::Allow { hosts, cidrs } => {
                let all: Vec<&str> = hosts.iter().chain(cidrs).map(String::as_str).collect();
                format!("allow({})", all.join(","))
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    pub guest: u16,
    /// Local only; defaults to the guest port. The cloud allocates its own.
    pub host: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub source: String,
    pub target: String,
    pub readonly: bool,
}

/// A branch to make: `child`, a copy of the running branchable machine `source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BranchSpec<'a> {
    pub source: &'a str,
    pub child: &'a str,
    /// The child can be branched in turn.
    pub branchable: bool,
    /// The source stays paused as an unchanging base for later branches (it runs nothing more).
    pub freeze_source: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateSpec {
    pub name: String,
    /// `None`: the local engine's own bundled Alpine root file system, booted with no pull.
    pub image: Option<String>,
    pub cpus: u32,
    pub memory_mb: u32,
    pub egress: Egress,
    pub ports: Vec<PortMapping>,
    /// Host directories; a fleet without a host file system refuses them.
    pub mounts: Vec<Mount>,
    pub storage_gb: Option<u32>,
    /// The writable overlay over the image; a fleet with one disk refuses it.
    pub overlay_gb: Option<u32>,
    pub env: BTreeMap<String, String>,
    pub branchable: bool,
    /// The machine belongs to a session and is deleted when it ends; a fleet that bills gives it
    /// a backstop of its own for a session that dies without cleaning up.
    pub ephemeral: bool,
    /// Credential bindings: the workload sees placeholders, the engine sends the values.
    pub credentials: Vec<CredentialBindingSpec>,
}

impl CreateSpec {
    /// A spec with defaults for everything but the name and image.
    pub fn new(name: impl Into<String>, image: impl Into<String>) -> Self {
        CreateSpec {
            image: Some(image.into()),
            ..Self::bare(name)
        }
    }

    /// A spec for a machine of the local engine's bundled root file system (no image).
    pub fn bare(name: impl Into<String>) -> Self {
        CreateSpec {
            name: name.into(),
            image: None,
            cpus: 2,
            memory_mb: 2048,
            egress: Egress::Blocked,
            ports: Vec::new(),
            mounts: Vec::new(),
            storage_gb: None,
            overlay_gb: None,
            env: BTreeMap::new(),
            branchable: false,
            ephemeral: false,
            credentials: Vec::new(),
        }
    }
}

/// A command: an argv array run as is, or a string run with `sh -c`.
// Also the tools' `command` argument, as it comes (untagged: an array or a string). A string is
// run with `sh -c` on both fleets, so that it means the same thing everywhere.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Command {
    Argv(Vec<String>),
    Shell(String),
}

impl Command {
    pub fn argv(&self) -> Vec<String> {
        match self {
            Command::Argv(argv) => argv.clone(),
            Command::Shell(script) => vec!["sh".into(), "-c".into(), script.clone()],
        }
    }
}

/// Which of a command's output streams a piece came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

impl OutputStream {
    pub fn as_str(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        }
    }
}

/// A piece of a running command's output, as the fleet's stream delivered it (text: both
/// engines decode output as UTF-8 before streaming it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputChunk {
    pub stream: OutputStream,
    pub text: String,
}

/// Where a streamed exec hands each piece of output as it arrives. Unbounded: the engine caps
/// a streamed command's output (11 MiB locally), and the reader on the other end only batches.
pub type OutputSender = tokio::sync::mpsc::UnboundedSender<OutputChunk>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecSpec {
    pub command: Command,
    pub workdir: Option<String>,
    pub env: BTreeMap<String, String>,
    pub stdin: Option<String>,
    pub timeout_secs: Option<u64>,
    /// Detach the command and answer at once with `pid=N` on stdout (both engines' `background`
    /// exec field); its output goes nowhere and neither engine reports its end, so a job
    /// redirects it to files itself (`crate::policy::jobs`).
    pub background: bool,
    /// Start the machine for the command if it is stopped (both engines do by default). A job's
    /// own looks at a machine turn it off locally, so that a machine stopped under a job stays
    /// stopped; the cloud API has no such switch.
    pub start_if_stopped: bool,
}

impl ExecSpec {
    pub fn new(command: Command) -> Self {
        ExecSpec {
            command,
            workdir: None,
            env: BTreeMap::new(),
            stdin: None,
            timeout_secs: None,
            background: false,
            start_if_stopped: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Upstream cut the stream before answering (the cloud's 1 MiB text cap, when no byte-exact
    /// copy came with it).
    pub stdout_cut_upstream: bool,
    pub stderr_cut_upstream: bool,
}

impl ExecOutput {
    /// Whether the fleet ended the command at its timeout. The engine says so in three ways,
    /// all exit 124 (smolvm 1.32.2's guest agent, `strings usr/local/bin/smolvm-agent` in
    /// `agent-rootfs.tar.zst`): "command timed out after Nms" on stderr on the normal path (the
    /// cloud's marker too), "container timed out after ..." on the fresh-container path, and no
    /// text at all when the command runs directly in the VM. A bare 124 is also what a command
    /// that exits 124 on its own gives (`timeout(1)`, a script), so without a marker it counts
    /// only if the call lasted at least the requested timeout: `elapsed` is measured by the
    /// caller around the whole request, which can only make it longer than the engine's clock.
    pub fn timed_out(&self, elapsed: std::time::Duration, requested_secs: Option<u64>) -> bool {
        if self.exit_code != 124 {
            return false;
        }
        let stderr = String::from_utf8_lossy(&self.stderr);
        if TIMEOUT_MARKERS.iter().any(|m| stderr.contains(m)) {
            return true;
        }
        requested_secs.is_some_and(|secs| elapsed >= std::time::Duration::from_secs(secs))
    }
}

/// The stderr markers of a fleet-side timeout (see [`ExecOutput::timed_out`]).
const TIMEOUT_MARKERS: &[&str] = &["command timed out", "container timed out after"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogPage {
    pub lines: Vec<String>,
    /// Why the page is empty when the log is not there to read (a machine whose workload never
    /// wrote one), for the agent.
    pub note: Option<String>,
    /// Pass back to get only what arrived since.
    pub cursor: String,
    /// The cursor's place is no longer in what the fleet returns: lines between it and this
    /// page may be missing.
    pub gap: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deleted {
    pub deleted: String,
    /// {cloud:What the machine cost, in millionths of a dollar.}
    pub usage_micros: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PulledImage {
    pub reference: String,
    // Left out when the engine does not say (rather than null): each null form cost the
    // catalog's schema 20 bytes on every turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub digest: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "i64")]
    pub size: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub architecture: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub os: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "i64")]
    pub layer_count: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub machine_id: String,
    pub uptime_seconds: Option<i64>,
    pub total_micros: Option<i64>,
    pub amount_due_micros: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Account {
    pub tenant_id: String,
    pub status: String,
    pub period_uptime_seconds: Option<i64>,
    pub period_total_micros: Option<i64>,
    pub period_amount_due_micros: Option<i64>,
    pub plan: Option<String>,
}

/// An outbound connection (TCP `connect`) or datagram (UDP `sendto`) the machine's egress policy
/// refused, as the engine recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressDenial {
    /// When it was refused, as the engine stamped it (its own clock, whole seconds cut down);
    /// `None` when the engine could not place it in time. Two reads of the same refusal carry
    /// the same stamp, which is what matches them.
    pub at: Option<std::time::SystemTime>,
    /// The same moment on this host's clock: the middle of the second the stamp names, moved
    /// by how far the engine's clock was from ours when it answered (the answer's `Date`
    /// header, also whole seconds), so within about a second of the truth either way. The
    /// engine may run on another clock: the nested engine's QEMU guest was seen up to a second
    /// off, enough to move a refusal out of the command that made it.
    pub on_this_host: Option<std::time::SystemTime>,
    /// `connect` (TCP), `sendto` (UDP) or `resolve` (a DNS name outside allowHosts).
    pub operation: String,
    /// Where the guest tried to go, as the engine gives it: `ip:port` (`[v6]:port`), or the
    /// name for `resolve`.
    pub dest: String,
}

/// Seconds since the Unix epoch as RFC 3339 UTC (the local API's `createdAt` is epoch seconds,
/// the cloud's is already RFC 3339). `None` outside chrono's range of years.
pub fn epoch_to_rfc3339(secs: i64) -> Option<String> {
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_seconds_render_as_utc() {
        assert_eq!(epoch_to_rfc3339(0).unwrap(), "1970-01-01T00:00:00Z");
        assert_eq!(
            epoch_to_rfc3339(1_788_878_857).unwrap(),
            "2026-09-08T14:47:37Z"
        );
        assert_eq!(
            epoch_to_rfc3339(951_782_400).unwrap(),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(epoch_to_rfc3339(i64::MAX), None);
    }

    #[test]
    fn egress_reads_hosts_first() {
        let allow = Egress::Allow {
            hosts: vec!["pypi.org".into()],
            cidrs: vec!["10.0.0.0/8".into()],
        };
        assert_eq!(allow.describe(), "allow(pypi.org,10.0.0.0/8)");
    }

    #[test]
    fn every_form_of_the_engines_timeout_is_a_timeout_and_an_early_124_is_not() {
        use std::time::Duration;
        let early = Duration::from_millis(200);
        let late = Duration::from_secs(2);
        let mut out = ExecOutput {
            exit_code: 124,
            stdout: vec![],
            stderr: b"\ncommand timed out after 2000ms".to_vec(),
            stdout_cut_upstream: false,
            stderr_cut_upstream: false,
        };
        assert!(out.timed_out(early, Some(2)), "the normal path's marker");
        out.stderr = b"container timed out after 2s".to_vec();
        assert!(
            out.timed_out(early, Some(2)),
            "the fresh-container path's marker"
        );
        out.stderr = Vec::new();
        assert!(out.timed_out(late, Some(2)), "a bare 124 at the timeout");
        assert!(!out.timed_out(early, Some(2)), "a bare 124 well before it");
        assert!(!out.timed_out(late, None), "no timeout was asked for");
        out.stderr = b"timeout(1) said so".to_vec();
        assert!(!out.timed_out(early, Some(2)));
        out.exit_code = 1;
        out.stderr = b"command timed out after 2000ms".to_vec();
        assert!(!out.timed_out(late, Some(2)), "only exit 124");
    }

    #[test]
    fn every_engine_state_has_a_phase() {
        let mut m = Machine {
            id: "m".into(),
            name: "m".into(),
            state: MachineState::Other(String::new()),
            cpus: None,
            memory_mb: None,
            network: Egress::Blocked.into(),
            image: None,
            url: None,
            pid: None,
            created_at: None,
            branchable: false,
            ports: vec![],
            upstream_ready: None,
            consumption: Consumption::default(),
        };
        for (state, phase) in [
            ("running", Phase::Running),
            ("started", Phase::Running),
            ("stopped", Phase::Stopped),
            ("created", Phase::Stopped),
            ("failed", Phase::Stopped),
            ("frozen", Phase::Frozen),
            // Saved and its VM stopped (1.32.2's pause): resumed, not booted.
            ("paused", Phase::Paused),
            ("pausing", Phase::Suspended),
            ("unreachable", Phase::Unreachable),
            ("starting", Phase::Other),
            ("stopping", Phase::Other),
        ] {
            m.state = state.into();
            assert_eq!(m.phase(), phase, "{state}");
            assert_eq!(m.state.word(), state, "shown as the fleet words it");
            assert!(
                !matches!(m.state, MachineState::Other(_)),
                "{state} is known"
            );
            assert_eq!(
                m.phase().boots_on_use(),
                !matches!(
                    phase,
                    Phase::Running
                        | Phase::Paused
                        | Phase::Suspended
                        | Phase::Frozen
                        | Phase::Unreachable
                ),
                "{state}"
            );
            assert_eq!(m.is_running(), phase == Phase::Running, "{state}");
        }
        // A word no fleet has said before: kept and shown as said, read as not running.
        m.state = "hibernating".into();
        assert_eq!(m.state, MachineState::Other("hibernating".into()));
        assert_eq!(m.phase(), Phase::Other);
        assert_eq!(
            serde_json::to_value(&m).unwrap()["state"],
            serde_json::json!("hibernating")
        );
    }
}

/// A value that must never be logged or echoed: its `Debug` says only whether it is empty.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            f.write_str("\"\"")
        } else {
            f.write_str("<redacted>")
        }
    }
}

/// A credential binding as a machine is created with it: what the engine needs to give the
/// workload a placeholder and to put the value into requests to `hosts`. The value itself
/// never travels in a create; it is supplied before each start ([`crate::fleet::CredentialValues`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialBindingSpec {
    pub name: String,
    pub env: Option<String>,
    pub hosts: Vec<String>,
    pub header: Option<String>,
}

/// A warm pool to set up on a fleet: `source` is a running machine started branchable whose
/// workload declared its branchpoint; the fleet keeps `ready` clones of it booted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSetup {
    pub pool: String,
    pub source: String,
    pub ready: u32,
    pub lease_ttl_secs: u64,
    /// Freeze the source once its checkpoint is taken (it keeps its memory, uses no CPU, and
    /// cannot be resumed).
    pub freeze_source: bool,
}

/// A pool as its fleet reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStatus {
    pub source: String,
    pub desired: u32,
    pub ready: u32,
}

/// A lease on one warm machine of a pool: the machine is the lease holder's until the lease is
/// completed (or expires unheartbeated, when the fleet deletes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolLease {
    pub pool: String,
    pub id: String,
    pub machine: String,
    pub state: String,
}
