//! What an engine failure means for the person who can fix it: the local engine's own words
//! for "this host cannot run a guest" are terse (`no boot progress after 30s`) or garbled
//! (`monitor agent: Then log out and log back in...); KvmOpen(Error(13))`), and both the tool
//! errors and `smol-mcp doctor` turn them into the cause and the fix, in the same words.

/// A host that is itself a virtual machine whose KVM cannot run the engine's guests, though
/// `/dev/kvm` opens: nothing short of a boot shows it otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VirtualHost {
    /// KVM is the paravirtual `kvm_pvm` (Pagetable-based Virtual Machine): it runs only
    /// guests whose kernel is built for PVM, and libkrun's is not ("no boot progress").
    Paravirtual,
    /// The CPU says it runs under a hypervisor and offers neither vmx nor svm: no nested
    /// virtualization.
    WithoutNested,
}

/// What `/sys/module` and the text of `/proc/cpuinfo` say of the host, if it is a
/// [`VirtualHost`].
pub fn virtual_host(sys_module: &std::path::Path, cpuinfo: &str) -> Option<VirtualHost> {
    if sys_module.join("kvm_pvm").exists() {
        return Some(VirtualHost::Paravirtual);
    }
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find(|line| line.starts_with("flags"))?
        .split_whitespace()
        .collect();
    let has = |flag: &str| flags.contains(&flag);
    (has("hypervisor") && !has("vmx") && !has("svm")).then_some(VirtualHost::WithoutNested)
}

/// [`virtual_host`] of this host (Linux only: elsewhere there is no KVM to ask about).
pub fn this_virtual_host() -> Option<VirtualHost> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    virtual_host(std::path::Path::new("/sys/module"), &cpuinfo)
}

/// A cause the engine's message points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostCause {
    /// The guest never showed a sign of life: the hypervisor cannot run guests here.
    GuestsCannotBoot,
    /// The same, on a host known to be a virtual machine whose KVM cannot run them.
    OnVirtualHost(VirtualHost),
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
            HostCause::OnVirtualHost(VirtualHost::Paravirtual) => (
                "the local engine could not boot a guest on this host: it is itself a virtual \
                 machine whose KVM is paravirtual (the kvm_pvm module is loaded), where \
                 /dev/kvm opens but runs only guests built for PVM, and the engine's are not",
                "run the server on a host with hardware virtualization (a physical machine with \
                 KVM, or a virtual machine with nested virtualization turned on), or use the \
                 cloud fleet (set SMOL_CLOUD_TOKEN), whose machines run elsewhere; `smol-mcp \
                 doctor` says what this host is",
            ),
            HostCause::OnVirtualHost(VirtualHost::WithoutNested) => (
                "the local engine could not boot a guest on this host: it is itself a virtual \
                 machine without nested virtualization (its CPU reports a hypervisor and neither \
                 vmx nor svm), where /dev/kvm opens but no guest boots",
                "turn on nested virtualization for this virtual machine (its hypervisor's \
                 setting), or run the server on a host with hardware virtualization, or use the \
                 cloud fleet (set SMOL_CLOUD_TOKEN); `smol-mcp doctor` says what this host is",
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
/// whether this process runs as root without `SMOLVM_VM_UID_DROP=off`; `on` is what the host
/// is, when it is a virtual machine that cannot boot guests.
pub fn host_cause(
    message: &str,
    root_with_uid_drop: bool,
    on: Option<VirtualHost>,
) -> Option<HostCause> {
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
    let silent_guest = lower.contains("no boot progress") || lower.contains("did not become ready");
    // A boot process that died before its agent answered is the host's only where the host is
    // known not to boot guests; elsewhere it is as likely the image's own failure.
    let died_early = lower.contains("before the agent was ready");
    match on {
        Some(host) if silent_guest || died_early => Some(HostCause::OnVirtualHost(host)),
        None if silent_guest => Some(HostCause::GuestsCannotBoot),
        _ => None,
    }
}

/// Whether this process runs as root without `SMOLVM_VM_UID_DROP=off`.
pub fn root_with_uid_drop() -> bool {
    nix::unistd::geteuid().is_root()
        && std::env::var("SMOLVM_VM_UID_DROP").map_or(true, |v| v != "off")
}

/// `message` with the cause and the fix appended, when the message is one of the host's.
pub fn with_host_hint(message: &str) -> String {
    match host_cause(message, root_with_uid_drop(), this_virtual_host()) {
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
        assert_eq!(
            host_cause(garbled, true, None),
            Some(HostCause::RootWithUidDrop)
        );
        assert_eq!(host_cause(garbled, false, None), Some(HostCause::KvmDenied));
        assert_eq!(
            host_cause(
                "HTTP 500: vm failed: no boot progress after 30s",
                false,
                None
            ),
            Some(HostCause::GuestsCannotBoot)
        );
        assert_eq!(host_cause("HTTP 500: disk full", true, None), None);
        let refused = "Error: config operation failed: per-VM uid isolation: each VM runs as its \
                       own unprivileged uid, which cannot reach: libkrun /root/.local/share/...";
        assert_eq!(
            host_cause(refused, true, None),
            Some(HostCause::RootWithUidDrop)
        );
        assert!(
            HostCause::RootWithUidDrop
                .explain()
                .1
                .contains("SMOLVM_VM_UID_DROP=off")
        );
    }

    /// What the issue saw on these hosts: the engine's raw monitor text, which named no cause.
    const DIED_EARLY: &str = "start machine m: HTTP 500: no IPv4 host resolver; boot process \
                              exited (code 1) before the agent was ready";

    #[test]
    fn a_virtual_host_that_boots_nothing_is_named_with_what_works_instead() {
        let dir = tempfile::tempdir().unwrap();
        let plain = "processor : 0\nflags\t\t: fpu vme sse2 svm\n";
        let under_hypervisor = "flags\t\t: fpu vme sse2 hypervisor\n";
        let nested = "flags\t\t: fpu hypervisor vmx\n";
        assert_eq!(virtual_host(dir.path(), plain), None);
        assert_eq!(virtual_host(dir.path(), nested), None);
        assert_eq!(
            virtual_host(dir.path(), under_hypervisor),
            Some(VirtualHost::WithoutNested)
        );
        std::fs::create_dir(dir.path().join("kvm_pvm")).unwrap();
        assert_eq!(
            virtual_host(dir.path(), nested),
            Some(VirtualHost::Paravirtual)
        );

        let pvm = Some(VirtualHost::Paravirtual);
        let cause = host_cause(DIED_EARLY, false, pvm);
        assert_eq!(
            cause,
            Some(HostCause::OnVirtualHost(VirtualHost::Paravirtual))
        );
        let (why, fix) = cause.unwrap().explain();
        assert!(
            why.contains("kvm_pvm") && why.contains("virtual machine"),
            "{why}"
        );
        assert!(
            fix.contains("nested virtualization") && fix.contains("cloud"),
            "{fix}"
        );
        assert_eq!(
            host_cause("no boot progress for 30 seconds", false, pvm),
            cause
        );
        // On a host not known to be one, an early death is as likely the image's own.
        assert_eq!(host_cause(DIED_EARLY, false, None), None);
    }
}
