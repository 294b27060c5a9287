//! The instructions a client shows its model at connect: which fleets this process serves, what
//! each cannot do, when to ask for egress, and the resources. Written for a model deciding what to
//! call, so each line says when something applies and what to do instead.

use crate::fleet::FleetKind;
use crate::process::Mode;
use crate::process::credentials::CredentialBinding;

const LOCAL: &str = "- local: smolvm on this host, free. pull-image works only here. branch-machine \
                     locally needs this host to be Linux (KVM) or macOS (Hypervisor.framework). \
                     machine-logs reads the guest's console.";
const CLOUD: &str = "- cloud: smol cloud; every machine costs money for as long as it exists, so \
                     delete what you no longer need. machine-logs reads the control plane's event \
                     log (created, started, stopped...), not the guest's output: to see a \
                     program's output, run it with run-command or read its log file with \
                     read-file. pull-image is refused: the service pulls the image at create.";

pub fn instructions(mode: Mode, credentials: &[CredentialBinding]) -> String {
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
        "\n\nEgress: machines have no network unless you ask for it. Ask (create-machine or \
         run-once with allowHosts naming the hosts, or network: \"open\") before a command that \
         downloads: package installs (apt, apk, pip, npm), git clone, curl. Locally, creating a \
         machine from a registry image also needs egress to the registry, or the start fails. A \
         command that fails to resolve or reach a host is usually missing egress, not broken.\n\n\
         {credentials}Machines you create without a name are temporary and deleted when this session ends \
         or they go unused; give a name to keep one.\n\n\
         Resources: smol://targets tells which fleets are usable from this host now and what is \
         in the way (read it before choosing a target, or when machines fail to start). \
         smol://machine/{target}/{name}/logs is a machine's log: subscribe to it to hear of new \
         lines, and call machine-logs with the cursor it returned to get only those. \
         smol://machine/{target}/{name}/file{+path} is a file in a machine (the first part of a \
         large one; read-file pages through the rest).",
    );
    text.replace("{credentials}", &credentials_line(mode, credentials))
}

/// The secrets the operator set up, by name: what an agent needs to ask for one, and nothing
/// of their values.
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
        "Credentials (local machines): {}. Name them in credentials when you create a machine          (create-machine, run-once): the machine sees a placeholder in the variable, and HTTPS          requests to those hosts carry the real value, which you never see. Use the variable as          the secret (as in an Authorization header); do not ask the user for these secrets.\n\n",
        listed.join("; ")
    )
}
