//! The local fleet: `smolvm serve` on this host, through the generated smolvm client.

use super::model::{
    CreateSpec, Deleted, Egress, ExecOutput, ExecSpec, LogPage, Machine, PublishedPort,
    PulledImage, epoch_to_rfc3339,
};
use super::upstream::{map_error, within};
use crate::error::{ErrorKind, FleetError, FleetResult};
use crate::generated::smolvm::{self, types};
use crate::transport::LocalEndpoint;
use base64::Engine as _;
use futures::TryStreamExt;
use std::time::Duration;

// Deadlines per call. Start and branch may pull and boot; exec adds its own timeout.
const DEFAULT: Duration = Duration::from_secs(60);
const START: Duration = Duration::from_secs(300);
const STOP_DELETE: Duration = Duration::from_secs(120);
const LOGS: Duration = Duration::from_secs(15);
const PULL: Duration = Duration::from_secs(600);
const HEALTH: Duration = Duration::from_secs(2);
/// What an exec without its own timeout may take, and the slack added to one that has one.
const EXEC_DEFAULT_SECS: u64 = 120;
const EXEC_SLACK: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct LocalFleet {
    client: smolvm::Client,
    endpoint: LocalEndpoint,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub status: String,
    /// The release (`1.32.2`), unlike the spec's `info.version`.
    pub version: String,
}

impl LocalFleet {
    pub fn new(endpoint: LocalEndpoint) -> FleetResult<Self> {
        let client = smolvm::Client::new_with_client(&endpoint.base_url(), endpoint.http_client()?);
        Ok(LocalFleet { client, endpoint })
    }

    pub fn endpoint(&self) -> &LocalEndpoint {
        &self.endpoint
    }

    pub async fn health(&self) -> FleetResult<Health> {
        let ctx = "health";
        within(ctx, HEALTH, async {
            match self.client.health().send().await {
                Ok(r) => {
                    let h = r.into_inner();
                    Ok(Health {
                        status: h.status,
                        version: h.version,
                    })
                }
                Err(e) => Err(map_error(ctx, e).await),
            }
        })
        .await
    }

    pub async fn list(&self) -> FleetResult<Vec<Machine>> {
        let ctx = "list machines";
        within(ctx, DEFAULT, async {
            match self.client.list_machines().send().await {
                Ok(r) => Ok(r.into_inner().machines.into_iter().map(view).collect()),
                Err(e) => Err(map_error(ctx, e).await),
            }
        })
        .await
    }

    pub async fn get(&self, name: &str) -> FleetResult<Machine> {
        let ctx = format!("get machine {name}");
        within(&ctx, DEFAULT, async {
            match self.client.get_machine().name(name).send().await {
                Ok(r) => Ok(view(r.into_inner())),
                Err(e) => Err(map_error(&ctx, e).await),
            }
        })
        .await
    }

    pub async fn create(&self, spec: &CreateSpec) -> FleetResult<Machine> {
        let ctx = format!("create machine {}", spec.name);
        let body = create_body(spec);
        within(&ctx, DEFAULT, async {
            match self.client.create_machine().body(body).send().await {
                Ok(r) => Ok(view(r.into_inner())),
                Err(e) => Err(map_error(&ctx, e).await),
            }
        })
        .await
    }

    /// Starts a machine. Locally, branchability is chosen at start: a machine started without
    /// it cannot be branched until it is stopped and started again with it.
    pub async fn start(&self, name: &str, branchable: bool) -> FleetResult<Machine> {
        let ctx = format!("start machine {name}");
        let body = types::StartMachineRequest {
            branchable: branchable.then_some(true),
            ..Default::default()
        };
        let mut request = self.client.start_machine().name(name).body(body);
        if branchable {
            // 1.32.2 documents `branchable` in the body; the `forkable` query is what the
            // engine's own refusal names ("start it with --forkable") and what earlier
            // releases read. Both ask for the same thing.
            request = request.forkable(true);
        }
        within(&ctx, START, async {
            match request.send().await {
                Ok(r) => Ok(view(r.into_inner())),
                Err(e) => Err(map_error(&ctx, e).await),
            }
        })
        .await
    }

    pub async fn stop(&self, name: &str) -> FleetResult<Machine> {
        let ctx = format!("stop machine {name}");
        within(&ctx, STOP_DELETE, async {
            match self.client.stop_machine().name(name).send().await {
                Ok(r) => Ok(view(r.into_inner())),
                Err(e) => Err(map_error(&ctx, e).await),
            }
        })
        .await
    }

    pub async fn delete(&self, name: &str) -> FleetResult<Deleted> {
        let ctx = format!("delete machine {name}");
        within(&ctx, STOP_DELETE, async {
            match self.client.delete_machine().name(name).send().await {
                Ok(r) => Ok(Deleted {
                    deleted: r.into_inner().deleted,
                    usage_micros: None,
                }),
                Err(e) => Err(map_error(&ctx, e).await),
            }
        })
        .await
    }

    pub async fn exec(&self, name: &str, spec: &ExecSpec) -> FleetResult<ExecOutput> {
        let ctx = format!("exec in {name}");
        let limit =
            Duration::from_secs(spec.timeout_secs.unwrap_or(EXEC_DEFAULT_SECS)) + EXEC_SLACK;
        let body = types::ExecRequest {
            // 1.32.2 starts a stopped machine for the command, as the cloud does.
            auto_start: true,
            background: None,
            command: spec.command.argv(),
            env: spec
                .env
                .iter()
                .map(|(name, value)| types::EnvVar {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
            secrets: Default::default(),
            stdin: spec.stdin.clone(),
            timeout_secs: spec.timeout_secs.map(clamp_i64),
            user: None,
            workdir: spec.workdir.clone(),
        };
        within(&ctx, limit, async {
            match self.client.exec_command().id(name).body(body).send().await {
                Ok(r) => {
                    let out = r.into_inner();
                    Ok(ExecOutput {
                        exit_code: out.exit_code,
                        stdout: exact_bytes(&out.stdout_b64, out.stdout),
                        stderr: exact_bytes(&out.stderr_b64, out.stderr),
                        stdout_cut_upstream: false,
                        stderr_cut_upstream: false,
                    })
                }
                Err(e) => Err(map_error(&ctx, e).await),
            }
        })
        .await
    }

    pub async fn read_file(&self, name: &str, path: &str) -> FleetResult<Vec<u8>> {
        let ctx = format!("read {path} in {name}");
        within(&ctx, DEFAULT, async {
            let response = match self.client.download_file().id(name).path(path).send().await {
                Ok(r) => r,
                Err(e) => return Err(map_error(&ctx, e).await),
            };
            // A directory answers a JSON listing under the same 200 (override
            // local-download-returns-bytes); a file is octet-stream.
            let is_listing = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/json"));
            let bytes = collect(&ctx, response.into_inner()).await?;
            if is_listing {
                return Err(FleetError::new(
                    ErrorKind::Invalid,
                    ctx.clone(),
                    format!("{path} is a directory; read-file reads files"),
                ));
            }
            Ok(bytes)
        })
        .await
    }

    pub async fn write_file(&self, name: &str, path: &str, bytes: Vec<u8>) -> FleetResult<u64> {
        let ctx = format!("write {path} in {name}");
        let len = bytes.len() as u64;
        within(&ctx, DEFAULT + transfer_time(len), async {
            match self
                .client
                .upload_file()
                .id(name)
                .path(path)
                .body(bytes)
                .send()
                .await
            {
                Ok(r) => Ok(u64::try_from(r.into_inner().size).unwrap_or(len)),
                Err(e) => Err(map_error(&ctx, e).await),
            }
        })
        .await
    }

    pub async fn branch(
        &self,
        source: &str,
        child: &str,
        branchable: bool,
    ) -> FleetResult<Machine> {
        let ctx = format!("branch machine {source} into {child}");
        let body = types::ForkRequest {
            branchable: branchable.then_some(true),
            env: Vec::new(),
            freeze_source: None,
            hold: None,
            labels: Default::default(),
            name: child.to_owned(),
            ports: Vec::new(),
            ready_timeout_secs: None,
            secrets: Default::default(),
            share_weights: None,
            wait_ready: None,
        };
        within(&ctx, START, async {
            match self
                .client
                .branch_machine()
                .name(source)
                .body(body)
                .send()
                .await
            {
                Ok(r) => Ok(view(r.into_inner())),
                Err(e) => Err(map_error(&ctx, e).await),
            }
        })
        .await
    }

    /// The guest console. Without a usable cursor: the last `tail` lines. With one: whatever
    /// arrived since. The cursor counts lines from the start of the log, so resuming after a
    /// tailed page never re-delivers lines (the reference server's cursor counted the page).
    pub async fn logs(
        &self,
        name: &str,
        tail: usize,
        cursor: Option<&str>,
    ) -> FleetResult<LogPage> {
        let ctx = format!("logs of {name}");
        let lines = within(&ctx, LOGS, async {
            // tail=0 asks for the whole log without following it.
            match self
                .client
                .stream_logs()
                .id(name)
                .follow(false)
                .tail(0u64)
                .send()
                .await
            {
                Ok(r) => {
                    let bytes = collect(&ctx, r.into_inner()).await?;
                    Ok(sse_data_lines(&String::from_utf8_lossy(&bytes)))
                }
                Err(e) => Err(map_error(&ctx, e).await),
            }
        })
        .await?;
        Ok(page_by_line_count(lines, tail, cursor))
    }

    pub async fn pull_image(&self, name: &str, image: &str) -> FleetResult<PulledImage> {
        let ctx = format!("pull {image} into {name}");
        let body = types::PullImageRequest {
            image: image.to_owned(),
            no_proxy: None,
            oci_platform: None,
            proxy: None,
        };
        within(&ctx, PULL, async {
            match self.client.pull_image().id(name).body(body).send().await {
                Ok(r) => {
                    let i = r.into_inner().image;
                    Ok(PulledImage {
                        reference: i.reference,
                        digest: Some(i.digest),
                        size: Some(i.size),
                        architecture: Some(i.architecture),
                        os: Some(i.os),
                        layer_count: i64::try_from(i.layer_count).ok(),
                    })
                }
                Err(e) => Err(map_error(&ctx, e).await),
            }
        })
        .await
    }
}

fn clamp_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn clamp_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Time allowed to move `len` bytes, on top of the base deadline (at least 1 MiB/s).
pub(crate) fn transfer_time(len: u64) -> Duration {
    Duration::from_secs(len / (1024 * 1024))
}

pub(crate) fn create_body(spec: &CreateSpec) -> types::CreateMachineRequest {
    let (network, hosts, cidrs) = match &spec.egress {
        Egress::Open => (true, None, None),
        Egress::Blocked => (false, None, None),
        Egress::Allow { hosts, cidrs } => (
            false,
            (!hosts.is_empty()).then(|| hosts.clone()),
            (!cidrs.is_empty()).then(|| cidrs.clone()),
        ),
    };
    types::CreateMachineRequest {
        name: Some(spec.name.clone()),
        image: Some(spec.image.clone()),
        cpus: Some(clamp_i32(spec.cpus)),
        memory_mb: Some(clamp_i32(spec.memory_mb)),
        network: Some(network),
        allowed_hosts: hosts,
        allowed_cidrs: cidrs,
        cmd: spec.cmd.clone().unwrap_or_default(),
        env: spec
            .env
            .iter()
            .map(|(name, value)| types::EnvVar {
                name: name.clone(),
                value: value.clone(),
            })
            .collect(),
        ports: spec
            .ports
            .iter()
            .map(|p| types::PortSpec {
                guest: i32::from(p.guest),
                host: i32::from(p.host.unwrap_or(p.guest)),
                protocol: None,
            })
            .collect(),
        mounts: spec
            .mounts
            .iter()
            .map(|m| types::MountSpec {
                source: m.source.clone(),
                target: m.target.clone(),
                readonly: m.readonly.then_some(true),
                staged: None,
            })
            .collect(),
        storage_gb: spec.storage_gb.map(i64::from),
        overlay_gb: spec.overlay_gb.map(i64::from),
        ..Default::default()
    }
}

fn view(info: types::MachineInfo) -> Machine {
    let hosts = info.allowed_hosts.unwrap_or_default();
    let cidrs = info.allowed_cidrs.unwrap_or_default();
    let network = if !hosts.is_empty() || !cidrs.is_empty() {
        Egress::Allow { hosts, cidrs }
    } else if info.network {
        Egress::Open
    } else {
        Egress::Blocked
    };
    Machine {
        id: info.name.clone(),
        name: info.name,
        state: info.state,
        cpus: u32::try_from(info.cpus).ok(),
        memory_mb: u32::try_from(info.memory_mb).ok(),
        network: network.describe(),
        image: info.image,
        url: None,
        pid: info.pid.map(i64::from),
        created_at: Some(epoch_to_rfc3339(info.created_at)),
        branchable: info.branchable || info.forkable,
        ports: info
            .ports
            .into_iter()
            .filter_map(|p| {
                Some(PublishedPort {
                    guest: u16::try_from(p.guest).ok()?,
                    host: u16::try_from(p.host).ok(),
                })
            })
            .collect(),
        upstream_ready: None,
    }
}

/// The b64 twin is byte-exact; the text field is a lossy UTF-8 rendering.
fn exact_bytes(b64: &str, text: String) -> Vec<u8> {
    match base64::engine::general_purpose::STANDARD.decode(b64) {
        Ok(bytes) if !bytes.is_empty() || text.is_empty() => bytes,
        _ => text.into_bytes(),
    }
}

async fn collect(ctx: &str, stream: progenitor_client::ByteStream) -> FleetResult<Vec<u8>> {
    let mut out = Vec::new();
    let mut inner = stream.into_inner();
    while let Some(chunk) = inner
        .try_next()
        .await
        .map_err(|e| super::upstream::transport(ctx, &e))?
    {
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// The `data:` lines of a server-sent-event body, each without its prefix and one leading space.
pub(crate) fn sse_data_lines(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|data| data.strip_prefix(' ').unwrap_or(data).to_owned())
        .collect()
}

pub(crate) fn page_by_line_count(lines: Vec<String>, tail: usize, cursor: Option<&str>) -> LogPage {
    let total = lines.len();
    let since = cursor
        .and_then(|c| c.strip_prefix("n:"))
        .and_then(|n| n.parse::<usize>().ok());
    let lines = match since {
        // The log was rotated or the engine restarted below the cursor: everything is new.
        Some(k) if k > total => lines,
        Some(k) => lines.into_iter().skip(k).collect(),
        None => lines.into_iter().skip(total.saturating_sub(tail)).collect(),
    };
    LogPage {
        lines,
        cursor: format!("n:{total}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbered(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("line {i}")).collect()
    }

    #[test]
    fn a_tailed_page_then_its_cursor_never_repeats_lines() {
        let first = page_by_line_count(numbered(10), 3, None);
        assert_eq!(first.lines, ["line 8", "line 9", "line 10"]);
        assert_eq!(first.cursor, "n:10");
        let next = page_by_line_count(numbered(12), 3, Some(&first.cursor));
        assert_eq!(next.lines, ["line 11", "line 12"]);
        assert_eq!(next.cursor, "n:12");
    }

    #[test]
    fn a_rotated_log_or_a_foreign_cursor() {
        assert_eq!(
            page_by_line_count(numbered(2), 5, Some("n:9")).lines.len(),
            2
        );
        assert_eq!(
            page_by_line_count(numbered(5), 2, Some("e:ev-1")).lines,
            ["line 4", "line 5"]
        );
    }

    #[test]
    fn sse_data_lines_lose_one_space() {
        assert_eq!(
            sse_data_lines("event: log\ndata: boot\ndata:  two spaces\n: comment\n\ndata:x\n"),
            ["boot", " two spaces", "x"]
        );
    }
}
