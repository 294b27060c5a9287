//! The commands this server runs in a machine for its own ends (readiness probes, the job
//! wrapper and its probes and reads, the kill of a cancelled command) carry one mark in their
//! text. The local engine logs every exec's command line in the machine's engine log ("running
//! command", seen on the real 1.32.2 guest), so without the mark those would read there as the
//! agent's commands; with it, machine-logs leaves them out.

/// The word every internal command carries.
pub const MARK: &str = "smol-mcp-internal";

/// A shell script of the server's own, marked. The mark is a no-op (`:`), so the script runs
/// as written; its positional parameters are untouched.
pub fn marked_script(script: &str) -> String {
    format!(": {MARK}; {script}")
}

/// Whether a line of the engine's log records one of this server's own commands.
pub fn is_internal_record(line: &str) -> bool {
    line.contains(MARK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_scripts_are_recognised_and_others_are_not() {
        let script = marked_script("echo $0");
        assert!(script.starts_with(": smol-mcp-internal; "));
        assert!(is_internal_record(&format!(
            r#"{{"message":"running command","command":["sh","-c",{script:?}]}}"#
        )));
        assert!(!is_internal_record(
            r#"{"message":"running command","command":["sh","-c","make test"]}"#
        ));
    }
}
