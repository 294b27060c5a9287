//! What an engine failure means for the person who can fix it: the local engine's own words
//! for "this host cannot run a guest" are terse (`no boot progress after 30s`) or garbled
//! (`monitor agent: Then log out and log back in...); KvmOpen(Error(13))`), and both the tool
//! errors and `smol-mcp doctor` turn them into the cause and the fix, in the same words.

/// A cause the engine's message points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostCause {
    /// The guest never showed a sign of life: the hypervisor cannot run guests here.
    GuestsCannotBoot,
    /// `/dev/kvm` refused the VM's process (EACCES, errno 13) while the server runs as root
    /// without `SMOLVM_VM_UID_DROP=off`: the engine drops each VM to a user of its own, which
    /// has no access to it.
    RootWithUidDrop,
    /// `/dev/kvm` refused this user.
    KvmDenied,
}

impl HostCause {
    /// Why, in a sentence, and what to do.
    pub fn explain(self) -> (&'static str, &'static str) {
        match self {
            HostCause::GuestsCannotBoot => (
                "the local engine could not boot a guest on this host: its hypervisor cannot run \
                 guests (no KVM, or a paravirtual or nested KVM without nested virtualization; \
                 on macOS, no Hypervisor.framework)",
                "run the server on a host with hardware virtualization (or turn on nested \
                 virtualization for this VM), or use the cloud fleet; `smol-mcp doctor` boots a \
                 test machine and says whether guests boot here",
            ),
            HostCause::RootWithUidDrop => (
                "the engine runs as root and drops each VM to a user of its own, which cannot \
                 open /dev/kvm (KvmOpen error 13)",
                "set SMOLVM_VM_UID_DROP=off in the server's environment (the `env` of its MCP \
                 client entry), or run the server as a user in the kvm group",
            ),
            HostCause::KvmDenied => (
                "this user cannot open /dev/kvm (KvmOpen error 13)",
                "add the user to the kvm group (`sudo usermod -aG kvm $USER`) and log in again",
            ),
        }
    }
}

/// The cause behind an engine message, if it is one of the host's. `root_with_uid_drop` says
/// whether this process runs as root without `SMOLVM_VM_UID_DROP=off`.
pub fn host_cause(message: &str, root_with_uid_drop: bool) -> Option<HostCause> {
    let lower = message.to_lowercase();
    // libkrun's KvmOpen(Error(13)) comes wrapped in the engine's advice for a user outside the
    // kvm group ("Then log out and log back in"), whoever the user is.
    // The engine's own refusal to start as root when that user cannot reach its files either.
    if lower.contains("per-vm uid isolation") {
        return Some(HostCause::RootWithUidDrop);
    }
    if lower.contains("kvmopen(error(13))") || lower.contains("log out and log back in") {
        return Some(if root_with_uid_drop {
            HostCause::RootWithUidDrop
        } else {
            HostCause::KvmDenied
        });
    }
    if lower.contains("no boot progress") || lower.contains("did not become ready") {
        return Some(HostCause::GuestsCannotBoot);
    }
    None
}

/// Whether this process runs as root without `SMOLVM_VM_UID_DROP=off`.
pub fn root_with_uid_drop() -> bool {
    nix::unistd::geteuid().is_root()
        && std::env::var("SMOLVM_VM_UID_DROP").map_or(true, |v| v != "off")
}

/// `message` with the cause and the fix appended, when the message is one of the host's.
pub fn with_host_hint(message: &str) -> String {
    match host_cause(message, root_with_uid_drop()) {
        Some(cause) => {
            let (why, fix) = cause.explain();
            format!("{message}\nCause: {why}.\nFix: {fix}.")
        }
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engines_words_name_their_cause() {
        let garbled = "start machine m: HTTP 500: monitor agent: Then log out and log back in...); \
                       KvmOpen(Error(13))";
        assert_eq!(host_cause(garbled, true), Some(HostCause::RootWithUidDrop));
        assert_eq!(host_cause(garbled, false), Some(HostCause::KvmDenied));
        assert_eq!(
            host_cause("HTTP 500: vm failed: no boot progress after 30s", false),
            Some(HostCause::GuestsCannotBoot)
        );
        assert_eq!(host_cause("HTTP 500: disk full", true), None);
        let refused = "Error: config operation failed: per-VM uid isolation: each VM runs as its \
                       own unprivileged uid, which cannot reach: libkrun /root/.local/share/...";
        assert_eq!(host_cause(refused, true), Some(HostCause::RootWithUidDrop));
        assert!(
            HostCause::RootWithUidDrop
                .explain()
                .1
                .contains("SMOLVM_VM_UID_DROP=off")
        );
    }
}
