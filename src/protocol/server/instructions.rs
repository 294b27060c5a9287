//! The instructions a client shows its model at connect: which fleets this process serves, what
//! each cannot do, when to ask for egress, and the resources. Written for a model deciding what to
//! call, so each line says when something applies and what to do instead.

use crate::fleet::FleetKind;
use crate::process::Mode;
use crate::process::config::{AgentNetwork, SessionEnd};
use crate::process::credentials::CredentialBinding;

const LOCAL: &str = "- local: smolvm on this host, free. pull-image works only here. branch-machine \
                     locally needs this host to be Linux (KVM) or macOS (Hypervisor.framework). \
                     machine-logs reads what the machine's workload printed.";
const CLOUD: &str = "- cloud: smol cloud; every machine costs money for as long as it exists, so \
                     delete what you no longer need. machine-logs reads the control plane's event \
                     log (created, started, stopped...), not the guest's output: to see a \
                     program's output, run it with run-command or read its log file with \
                     read-file. pull-image is refused: the service pulls the image at create.";

/// What becomes of temporary machines when a session ends, and which are kept now.
#[derive(Debug, Clone)]
pub struct Temporary {
    pub session_end: SessionEnd,
    pub kept_secs: u64,
    /// Machines kept from earlier sessions that a call may take back now.
    pub kept_now: Vec<String>,
}

/// At most this many kept machines are named; the rest are counted.
const KEPT_NAMED: usize = 10;

pub fn instructions(
    mode: Mode,
    credentials: &[CredentialBinding],
    host_dirs: bool,
    agent_network: AgentNetwork,
    temporary: &Temporary,
) -> String {
    let mut text = String::from(
        "This server gives you microVMs (smol machines): Linux machines to run commands and keep \
         files in, so that nothing runs on the user's own computer.\n\n",
    );
    match mode {
        Mode::Both => {
            text.push_str(
                "It serves two fleets, and every tool takes a required target, local or cloud, \
                 with no default: a machine on one fleet is invisible on the other. When the \
                 user picks one fleet for the session (the client may ask at the first tool \
                 call), target disappears from the tools.\n",
            );
            text.push_str(LOCAL);
            text.push('\n');
            text.push_str(CLOUD);
        }
        Mode::Single(kind) => {
            text.push_str(&format!(
                "It serves the {} fleet only; the tools take no target argument (resource URIs \
                 still name it, as smol://machine/{}/...).\n",
                kind.as_str(),
                kind.as_str()
            ));
            text.push_str(match kind {
                FleetKind::Local => LOCAL,
                FleetKind::Cloud => CLOUD,
            });
        }
    }
    text.push_str(
        "\n\n{egress} A command that fails to resolve or reach a host is usually missing \
         egress, not broken; you cannot widen a running machine's egress yourself.\n\n\
         {credentials}{not_set_up}{temporary}\n\n\
         Resources: smol://targets tells which fleets are usable from this host now and what is \
         in the way (read it before choosing a target, or when machines fail to start). \
         smol://machine/{target}/{name}/logs is a machine's log: subscribe to it to hear of new \
         lines, and call machine-logs with the cursor it returned to get only those. \
         smol://machine/{target}/{name}/file{+path} is a file in a machine (the first part of a \
         large one; read-file pages through the rest).",
    );
    text.replace("{egress}", egress_line(mode, agent_network))
        .replace("{credentials}", &credentials_line(mode, credentials))
        .replace(
            "{not_set_up}",
            &not_set_up_line(mode, credentials.is_empty(), host_dirs),
        )
        .replace("{temporary}", &temporary_line(temporary))
}

/// What a session's end does to temporary machines, and how to take back a kept one.
fn temporary_line(temporary: &Temporary) -> String {
    let how = match temporary.session_end {
        SessionEnd::Delete => None,
        SessionEnd::Stop => Some("stopped (disk kept)"),
        SessionEnd::Pause => {
            Some("paused (memory, processes and disk kept; stopped where a pause is impossible)")
        }
    };
    let mut line = match how {
        None => "Machines you create without a name (or with one starting mcp-) are temporary \
                 and deleted when this session ends or they go unused; give another name to keep \
                 one."
            .to_owned(),
        Some(how) => format!(
            "Machines you create without a name (or with one starting mcp-) are temporary: when \
             this session ends they are {how} and kept for {}, then deleted; give another name \
             to keep one for good.",
            crate::process::keep::duration_words(temporary.kept_secs)
        ),
    };
    if !temporary.kept_now.is_empty() {
        line.push_str(
            " A machine kept from an earlier session becomes this session's when any call names \
             it (a command on it starts or resumes it).",
        );
        let named: Vec<&str> = temporary
            .kept_now
            .iter()
            .take(KEPT_NAMED)
            .map(String::as_str)
            .collect();
        line.push_str(&format!(
            " Kept from earlier sessions now: {}",
            named.join(", ")
        ));
        let more = temporary.kept_now.len().saturating_sub(KEPT_NAMED);
        if more > 0 {
            line.push_str(&format!(" and {more} more (list-machines)"));
        }
        line.push('.');
    }
    line
}

/// When to ask for egress, and how: what the operator lets the agent choose at create.
fn egress_line(mode: Mode, agent_network: AgentNetwork) -> &'static str {
    let local = mode != Mode::Single(FleetKind::Cloud);
    match (agent_network, local) {
        (AgentNetwork::Any, true) => {
            "Egress: machines have no network unless you ask for it at create (create-machine \
             or run-once with allowHosts naming the hosts, or network: \"open\"; locally \
             create-machine's network: \"ask\" lets the user allow each host a command was refused), before a \
             command that downloads: package installs (apt, apk, pip, npm), git clone, curl."
        }
        (AgentNetwork::Any, false) => {
            "Egress: machines have no network unless you ask for it at create (create-machine \
             or run-once with allowHosts naming the hosts, or network: \"open\"), before a \
             command that downloads: package installs (apt, apk, pip, npm), git clone, curl."
        }
        (AgentNetwork::Ask, true) => {
            "Egress: only the user widens it here. For a command that downloads (package \
             installs, git clone, curl), create the machine with network: \"ask\": each host a \
             command was refused is put to the user, and after a yes you run the command again. \
             allowHostsFrom gives a new machine the hosts the user allowed an earlier one."
        }
        (AgentNetwork::Ask, false) => {
            "Egress: machines get none here; the operator leaves widening it to the user."
        }
    }
}

/// The secrets the operator set up, by name: what an agent needs to ask for one, and nothing
/// of their values.
/// What the operator has not turned on, and so the tools do not offer: said once here, so that
/// the model tells the user instead of asking them for their files or secrets.
fn not_set_up_line(mode: Mode, no_credentials: bool, host_dirs: bool) -> String {
    let mut missing = Vec::new();
    if !host_dirs {
        missing.push(
            "no host directory is open to machines, so there are no mounts, workspaces or \
             keep-changes (the operator's mountAllow setting opens some): copy files in with \
             write-file",
        );
    }
    if no_credentials && mode != Mode::Single(FleetKind::Cloud) {
        missing
            .push("no secrets are bound for machines to use (the operator's credentials setting)");
    }
    if missing.is_empty() {
        return String::new();
    }
    format!(
        "Not set up on this server: {}. When a task needs one of these, tell the user which \
         setting would allow it.\n\n",
        missing.join("; ")
    )
}

fn credentials_line(mode: Mode, credentials: &[CredentialBinding]) -> String {
    if credentials.is_empty() || mode == Mode::Single(FleetKind::Cloud) {
        return String::new();
    }
    let listed: Vec<String> = credentials
        .iter()
        .map(|b| {
            let holder = match (&b.env, &b.header) {
                (Some(var), _) => format!("${var}"),
                (None, Some(header)) => format!("the {header} header"),
                (None, None) => String::new(),
            };
            format!("{} ({holder}, for {})", b.name, b.hosts.join(", "))
        })
        .collect();
    format!(
        "Credentials (local machines): {}. Name them in credentials when you create a machine \
         (create-machine, run-once): the machine sees a placeholder in the variable, and HTTPS \
         requests to those hosts carry the real value, which you never see. Use the variable as \
         the secret (as in an Authorization header); do not ask the user for these secrets.\n\n",
        listed.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding() -> CredentialBinding {
        CredentialBinding {
            name: "github".into(),
            env: Some("GH_TOKEN".into()),
            hosts: vec!["api.github.com".into()],
            header: None,
            source: crate::process::credentials::ValueSource::File("/nonexistent".into()),
        }
    }

    fn deleted() -> Temporary {
        Temporary {
            session_end: SessionEnd::Delete,
            kept_secs: 86_400,
            kept_now: vec![],
        }
    }

    #[test]
    fn what_the_operator_has_not_set_up_is_said_with_its_setting() {
        let local = Mode::Single(FleetKind::Local);
        let bare = instructions(local, &[], false, AgentNetwork::Any, &deleted());
        assert!(
            bare.contains("Not set up on this server: no host directory")
                && bare.contains("mountAllow")
                && bare.contains("credentials setting"),
            "{bare}"
        );
        let cloud = instructions(
            Mode::Single(FleetKind::Cloud),
            &[],
            true,
            AgentNetwork::Any,
            &deleted(),
        );
        assert!(
            !cloud.contains("Not set up"),
            "cloud takes no credentials: {cloud}"
        );
        let all = instructions(local, &[binding()], true, AgentNetwork::Any, &deleted());
        assert!(!all.contains("Not set up"), "{all}");
    }

    #[test]
    fn kept_machines_are_explained_and_named() {
        let text = instructions(
            Mode::Single(FleetKind::Local),
            &[],
            true,
            AgentNetwork::Any,
            &deleted(),
        );
        assert!(text.contains("deleted when this session ends"), "{text}");
        let kept_now: Vec<String> = (0..12).map(|i| format!("mcp-k{i}")).collect();
        let text = instructions(
            Mode::Single(FleetKind::Local),
            &[],
            true,
            AgentNetwork::Any,
            &Temporary {
                session_end: SessionEnd::Pause,
                kept_secs: 7_200,
                kept_now,
            },
        );
        assert!(text.contains("they are paused"), "{text}");
        assert!(text.contains("kept for 2 hours, then deleted"), "{text}");
        assert!(
            text.contains("mcp-k0, mcp-k1") && text.contains("mcp-k9 and 2 more"),
            "{text}"
        );
        assert!(!text.contains("mcp-k10"), "{text}");
        assert!(
            !text.contains("{temporary}") && !text.contains("  "),
            "{text}"
        );
    }

    #[test]
    fn every_variant_reads_as_prose_and_says_who_widens_egress() {
        for mode in [
            Mode::Both,
            Mode::Single(FleetKind::Local),
            Mode::Single(FleetKind::Cloud),
        ] {
            for agent_network in [AgentNetwork::Any, AgentNetwork::Ask] {
                let text = instructions(mode, &[binding()], true, agent_network, &deleted());
                assert!(!text.contains("  "), "a run of spaces: {text}");
                assert!(
                    !text.contains("{egress}") && !text.contains("{credentials}"),
                    "a placeholder left: {text}"
                );
                let local = mode != Mode::Single(FleetKind::Cloud);
                assert_eq!(
                    text.contains("network: \"ask\""),
                    local,
                    "{mode:?} {agent_network:?}: {text}"
                );
                assert_eq!(
                    text.contains("network: \"open\""),
                    agent_network == AgentNetwork::Any,
                    "{mode:?} {agent_network:?}: {text}"
                );
                assert_eq!(text.contains("Credentials (local machines)"), local);
            }
        }
    }
}
