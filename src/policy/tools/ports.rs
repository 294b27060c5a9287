//! publish-port: a service in a machine opened to the user. The fleets place the outside side
//! differently (the local engine binds the host port the caller names; the cloud allocates its
//! own and gives an ingress address), which `Capabilities::host_ports` says; what both share is
//! the wait for a listener, looked for inside the guest: the local engine accepts a connect on
//! a published port before anything listens behind it (seen on the nested 1.32.2 engine), so a
//! connect from outside proves nothing.

use super::args;
use super::call::parts::{Cancel, Fleets, Ownership, Waits};
use super::results::PortPublished;
use super::{ToolError, ToolErrorKind};
use crate::fleet::internal::marked_script;
use crate::fleet::{
    Command, ErrorKind, ExecSpec, Fleet, FleetError, HostPorts, Machine, PortMapping,
};
use crate::policy::progress::Progress;
use crate::process::config::{Config, PortRange};
use std::time::{Duration, Instant};

/// The most ports one machine publishes: the cloud's own bound (facts 3.3, "at most 16"), kept
/// locally too, so that an agent cannot hold every port of the operator's range with one machine.
pub const MAX_PUBLISHED_PORTS: usize = 16;
/// How long a publish waits for a listener when the call does not say.
const DEFAULT_WAIT_SECS: u32 = 30;
/// Host ports tried before giving up, when the server chooses them and others hold them.
const HOST_PORT_TRIES: usize = 16;
/// How often the guest's sockets are looked at while waiting.
const LISTEN_POLL: Duration = Duration::from_millis(500);
/// One look at the guest's sockets; an answer slower than this counts as "not yet".
const LISTEN_PROBE_SECS: u64 = 10;

/// A machine's port set is replaced whole: two publishes at once on one machine would each
/// send the set without the other's port. One change at a time in the process.
static PORT_CHANGES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub(super) async fn publish_port(
    (machines, fleets, waits, cancel, progress, config): (
        Ownership<'_>,
        Fleets<'_>,
        Waits<'_>,
        Cancel<'_>,
        &Progress,
        &Config,
    ),
    a: args::PublishArgs,
) -> Result<PortPublished, ToolError> {
    let named = machines.machine(&a.name)?;
    let guest = args::port("port", a.port)?;
    let asked_host = a.host_port.map(|h| args::port("hostPort", h)).transpose()?;
    let wait = Duration::from_secs(u64::from(a.wait_secs.unwrap_or(DEFAULT_WAIT_SECS)));
    let fleet = fleets.reach(a.target).await?;
    let placement = fleet.capabilities().host_ports;
    let range = config.publish_ports;
    match (placement, asked_host) {
        (HostPorts::Fleet, Some(_)) => {
            return Err(ToolError::argument(
                "hostPort",
                "this fleet allocates the outside side itself and answers its address: leave \
                 hostPort out",
            ));
        }
        (HostPorts::Caller, Some(host)) => {
            if let Some(range) = range.filter(|r| !r.contains(host)) {
                return Err(ToolError::argument(
                    "hostPort",
                    format!(
                        "{host} is outside the host ports this server may publish ({range}, \
                         the operator's publishPorts): give one within it, or leave hostPort \
                         out to have a free one chosen"
                    ),
                ));
            }
        }
        _ => {}
    }
    let started_machine = waits.ensure_running(&fleet, &named).await?;

    let machine = {
        let _one_change_at_a_time = PORT_CHANGES.lock().await;
        let current = cancel.run(fleet.get(&named)).await?;
        let already = current.ports.iter().find(|p| p.guest == guest);
        match already {
            // Publishing what is published answers it again: the call is idempotent.
            Some(p) if p.host.is_some() && (asked_host.is_none() || asked_host == p.host) => {
                current
            }
            _ => {
                let at = (cancel, config);
                publish(at, &fleet, &current, guest, asked_host, placement, range).await?
            }
        }
    };

    let listener = if wait.is_zero() {
        Listener::NotLooked
    } else {
        progress
            .during(
                &format!(
                    "waiting for something to listen on port {guest} in {}",
                    named
                ),
                Some(wait),
                Box::pin(wait_for_listener(cancel, &fleet, &named, guest, wait)),
            )
            .await?
    };
    // The cloud names its ingress only once something accepts there (facts 3.13).
    let machine = if placement == HostPorts::Fleet && listener == Listener::Reachable {
        cancel.run(fleet.get(&named)).await?
    } else {
        machine
    };
    let Some(address) = fleet.port_address(&machine, guest) else {
        return Err(FleetError::new(
            ErrorKind::BadResponse,
            format!("publish port {guest} of {}", named),
            "the fleet answered a record without the port it had just published",
        )
        .into());
    };
    let waited = wait.as_secs();
    let listening = listener == Listener::Reachable;
    let heard = match listener {
        Listener::Reachable | Listener::NotLooked => None,
        Listener::LoopbackOnly => Some(format!(
            "a process listens on port {guest} on the guest's loopback only, which the published \
             port does not reach: restart it bound to 0.0.0.0 (for example --host 0.0.0.0)"
        )),
        Listener::Nobody => Some(format!(
            "nothing listened on port {guest} in the guest within {waited} s; the port stays \
             published, so start the service (bound to 0.0.0.0) and open the url"
        )),
        Listener::Unknown(why) => Some(format!(
            "whether something listens could not be seen ({why}); the port is published"
        )),
    };
    let note = match (heard, address.needs) {
        (None, None) => None,
        (Some(heard), None) => Some(heard),
        (None, Some(needs)) => Some(format!("opening it takes {needs}")),
        (Some(heard), Some(needs)) => Some(format!("{heard}; opening it takes {needs}")),
    };
    Ok(PortPublished {
        url: address.url,
        host_port: machine
            .ports
            .iter()
            .find(|p| p.guest == guest)
            .and_then(|p| p.host),
        listening,
        note,
        started_machine,
    })
}

/// Sends the machine's set with `guest` added (or moved to `asked_host`). Where the caller
/// places the host port and none was asked for, a port someone else holds is followed by
/// another, up to [`HOST_PORT_TRIES`].
async fn publish(
    (cancel, config): (Cancel<'_>, &Config),
    fleet: &Fleet,
    current: &Machine,
    guest: u16,
    asked_host: Option<u16>,
    placement: HostPorts,
    range: Option<PortRange>,
) -> Result<Machine, ToolError> {
    let mut set: Vec<PortMapping> = current
        .ports
        .iter()
        .filter(|p| p.guest != guest)
        .map(|p| PortMapping {
            guest: p.guest,
            host: p.host,
        })
        .collect();
    if set.len() >= MAX_PUBLISHED_PORTS {
        return Err(ToolError::new(
            ToolErrorKind::LimitReached,
            format!(
                "port: {} already publishes {MAX_PUBLISHED_PORTS} ports, the most one machine \
                 may; serve more from one port (a reverse proxy), or use another machine",
                current.name
            ),
        ));
    }
    if placement == HostPorts::Fleet {
        set.push(PortMapping { guest, host: None });
        return cancel.run(fleet.set_ports(&current.name, &set)).await;
    }
    let held: Vec<u16> = set.iter().filter_map(|p| p.host).collect();
    let candidates: Vec<u16> = match asked_host {
        Some(host) => vec![host],
        None => host_port_candidates(config, range, &held)?,
    };
    let mut last_refusal = None;
    for host in candidates {
        let mut attempt = set.clone();
        attempt.push(PortMapping {
            guest,
            host: Some(host),
        });
        let sent = cancel
            .run(async { Ok::<_, ToolError>(fleet.set_ports(&current.name, &attempt).await) })
            .await?;
        match sent {
            Ok(machine) => return Ok(machine),
            Err(e) if fleet.is_port_in_use(&e) && asked_host.is_some() => {
                return Err(ToolError::new(
                    ToolErrorKind::Fleet(ErrorKind::Conflict),
                    format!(
                        "hostPort: {host} is held by something else on the host ({}); leave \
                         hostPort out to have a free one chosen",
                        e.message
                    ),
                ));
            }
            Err(e) if fleet.is_port_in_use(&e) => last_refusal = Some(e.message),
            Err(e) => return Err(e.into()),
        }
    }
    let place = match range {
        Some(range) => format!("in the operator's publishPorts ({range})"),
        None => "among the free ports this host offered".to_owned(),
    };
    Err(ToolError::new(
        ToolErrorKind::LimitReached,
        format!(
            "port: no host port {place} was free for {}'s port {guest} after {HOST_PORT_TRIES} \
             tries (last: {}); delete machines that publish ports, or ask the operator for more",
            current.name,
            last_refusal.unwrap_or_else(|| "none left to try".to_owned())
        ),
    ))
}

/// The host ports to try, in order: the operator's range in a random order (no bind tried
/// here: the engine may run where this process's binds say nothing, as a nested engine does,
/// and its 409 is the answer that counts), or ports this host's kernel gives as free now.
fn host_port_candidates(
    config: &Config,
    range: Option<PortRange>,
    held: &[u16],
) -> Result<Vec<u16>, ToolError> {
    use rand::seq::SliceRandom;
    if let Some(range) = range {
        let mut ports: Vec<u16> = (range.first..=range.last)
            .filter(|p| !held.contains(p))
            .collect();
        ports.shuffle(&mut rand::rng());
        ports.truncate(HOST_PORT_TRIES);
        return Ok(ports);
    }
    let address = config.publish_address;
    let mut ports = Vec::new();
    for _ in 0..HOST_PORT_TRIES {
        // Held open until all are found, so that the kernel gives different ones.
        match std::net::TcpListener::bind((address, 0)) {
            Ok(listener) => ports.push(listener),
            Err(e) => {
                return Err(ToolError::new(
                    ToolErrorKind::Fleet(ErrorKind::Refused),
                    format!(
                        "no free port on {address} (publishAddress) to publish on: {e}; is the \
                         address one of this host's?"
                    ),
                ));
            }
        }
    }
    Ok(ports
        .iter()
        .filter_map(|l| l.local_addr().ok().map(|a| a.port()))
        .filter(|p| !held.contains(p))
        .collect())
}

/// What the guest's sockets said about a port.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Listener {
    /// A socket listens on every address (or a non-loopback one): the published port reaches it.
    Reachable,
    /// Only on loopback, where the engine's forward does not arrive.
    LoopbackOnly,
    Nobody,
    /// The call asked not to wait.
    NotLooked,
    /// The guest's socket tables could not be read (no shell or `cat` in the image, say).
    Unknown(String),
}

async fn wait_for_listener(
    cancel: Cancel<'_>,
    fleet: &Fleet,
    machine: &str,
    port: u16,
    wait: Duration,
) -> Result<Listener, ToolError> {
    let deadline = Instant::now() + wait;
    // Both tables: a service bound to `::` is in tcp6 only. `2>/dev/null`: a kernel without
    // IPv6 has no tcp6.
    let mut probe = ExecSpec::new(Command::Shell(marked_script(
        "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null",
    )));
    probe.timeout_secs = Some(LISTEN_PROBE_SECS);
    probe.start_if_stopped = false;
    loop {
        let answer = cancel
            .run(async { Ok::<_, ToolError>(fleet.exec(machine, &probe).await) })
            .await?;
        let seen = match answer {
            Ok(out) if !out.stdout.is_empty() => {
                listener_in(&String::from_utf8_lossy(&out.stdout), port)
            }
            Ok(out) => Listener::Unknown(format!(
                "reading /proc/net/tcp in the guest gave nothing: exit {}, {}",
                out.exit_code,
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) if e.kind == ErrorKind::NotFound => return Err(e.into()),
            Err(e) => Listener::Unknown(e.to_string()),
        };
        if seen == Listener::Reachable || Instant::now() >= deadline {
            return Ok(seen);
        }
        cancel
            .run(async {
                tokio::time::sleep(LISTEN_POLL).await;
                Ok::<_, ToolError>(())
            })
            .await?;
    }
}

/// Reads `/proc/net/tcp` and `tcp6` text (`sl local_address rem_address st ...`, addresses as
/// hex in the kernel's byte order) for a socket in state LISTEN (`0A`) on `port`.
fn listener_in(tables: &str, port: u16) -> Listener {
    let mut loopback_only = false;
    for line in tables.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(state)) = (fields.get(1), fields.get(3)) else {
            continue;
        };
        if *state != "0A" {
            continue;
        }
        let Some((address, hex_port)) = local.split_once(':') else {
            continue;
        };
        if u16::from_str_radix(hex_port, 16).ok() != Some(port) {
            continue;
        }
        if is_loopback_hex(address) {
            loopback_only = true;
        } else {
            return Listener::Reachable;
        }
    }
    if loopback_only {
        Listener::LoopbackOnly
    } else {
        Listener::Nobody
    }
}

/// 127.0.0.0/8, `::1` and `::ffff:127.x.y.z`, as the kernel writes them: each 32-bit word in
/// host (little-endian) byte order, so 127.0.0.1 is `0100007F`.
fn is_loopback_hex(address: &str) -> bool {
    match address.len() {
        8 => address.ends_with("7F") || address.ends_with("7f"),
        32 => {
            let upper = address.to_ascii_uppercase();
            upper == "00000000000000000000000001000000"
                || (upper.starts_with("0000000000000000FFFF0000") && upper.ends_with("7F"))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode";

    fn table(rows: &[(&str, &str)]) -> String {
        let mut text = HEADER.to_owned();
        for (i, (local, state)) in rows.iter().enumerate() {
            text.push_str(&format!(
                "\n   {i}: {local} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000     0        0 1234 1 0000000000000000 100 0 0 10 0"
            ));
        }
        text
    }

    #[test]
    fn a_listener_on_every_address_is_reachable_and_one_on_loopback_is_not() {
        // 8000 is 1F40.
        let any_v4 = table(&[("00000000:1F40", "0A")]);
        assert_eq!(listener_in(&any_v4, 8000), Listener::Reachable);
        assert_eq!(listener_in(&any_v4, 8001), Listener::Nobody);
        let loopback = table(&[("0100007F:1F40", "0A")]);
        assert_eq!(listener_in(&loopback, 8000), Listener::LoopbackOnly);
        let any_v6 = table(&[("00000000000000000000000000000000:1F40", "0A")]);
        assert_eq!(listener_in(&any_v6, 8000), Listener::Reachable);
        let v6_loopback = table(&[("00000000000000000000000001000000:1F40", "0A")]);
        assert_eq!(listener_in(&v6_loopback, 8000), Listener::LoopbackOnly);
        let mapped_loopback = table(&[("0000000000000000FFFF00000100007F:1F40", "0A")]);
        assert_eq!(listener_in(&mapped_loopback, 8000), Listener::LoopbackOnly);
        // The guest's own address (10.0.2.15 is 0F02000A) is reached by the forward.
        let own_address = table(&[("0F02000A:1F40", "0A")]);
        assert_eq!(listener_in(&own_address, 8000), Listener::Reachable);
        // Loopback and everywhere both: reachable.
        let both = table(&[("0100007F:1F40", "0A"), ("00000000:1F40", "0A")]);
        assert_eq!(listener_in(&both, 8000), Listener::Reachable);
    }

    #[test]
    fn only_listening_sockets_count() {
        // 01 is ESTABLISHED: a connection from port 8000 is no service on it.
        let established = table(&[("00000000:1F40", "01")]);
        assert_eq!(listener_in(&established, 8000), Listener::Nobody);
        assert_eq!(listener_in("", 8000), Listener::Nobody);
        assert_eq!(
            listener_in("garbage\n  0: nonsense", 8000),
            Listener::Nobody
        );
    }
}
