//! The words an argument may be, each a type whose deserialization refuses what its grammar
//! does not accept: a new machine's name, a reference to a machine, an image, host names, CIDR
//! ranges, environment variables, absolute paths. A handler holding one of these holds a checked value; no
//! handler checks them again. Each refusal is the one the grammar's check writes (the argument,
//! what was sent, what is accepted), whichever tool the argument came to.
//!
//! The schema states a new machine's name by its pattern (its length, at most 128, is in the
//! refusal): it is the one word a model makes up. The others it copies from somewhere (a machine's name from list-machines,
//! an image, a host, a range, a variable name) and their descriptions say what they are; their
//! patterns would cost the catalog, which every turn pays for, more than they would tell a
//! model (an OCI reference's or an IPv6 range's runs to hundreds of bytes).

use crate::policy::error::{RefusedArgument, ToolError, quote};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;
use std::collections::BTreeMap;

thread_local! {
    /// The refusal a grammar check made in the deserialization under way on this thread, as
    /// the check made it: serde's error carries only text, and loses the path inside
    /// `#[serde(flatten)]` groups (an image or an env inside run-once), so `args::parse` takes
    /// the argument and the words from here rather than from serde's message.
    static REFUSED: std::cell::RefCell<Option<RefusedArgument>> =
        const { std::cell::RefCell::new(None) };
}

/// A grammar check's refusal as serde's error; the refusal itself is kept for
/// [`take_refusal`].
pub(super) fn refusal<E: serde::de::Error>(arg: &str, refused: ToolError) -> E {
    let refused = refused.refused.unwrap_or_else(|| RefusedArgument {
        argument: arg.to_owned(),
        words: refused.message,
    });
    let error = E::custom(format!("{}: {}", refused.argument, refused.words));
    REFUSED.with(|slot| *slot.borrow_mut() = Some(refused));
    error
}

/// The refusal a grammar check made on this thread since the last call, if one did.
pub fn take_refusal() -> Option<RefusedArgument> {
    REFUSED.with(|slot| slot.borrow_mut().take())
}

/// Declares a checked word: the type, what it holds, the argument its check names when serde
/// lost the path, the check, and its schema.
macro_rules! grammar {
    (
        $(#[$doc:meta])*
        $name:ident($inner:ty), deref $target:ty, arg $arg:literal, check $check:path,
        schema $schema:tt
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name($inner);

        impl $name {
            pub fn into_inner(self) -> $inner {
                self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = $target;
            fn deref(&self) -> &$target {
                &self.0
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let value = <$inner>::deserialize(deserializer)?;
                $check($arg, &value).map_err(|refused| refusal($arg, refused))?;
                Ok($name(value))
            }
        }

        impl JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }
            fn schema_name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!($schema)
            }
        }
    };
}

grammar! {
    /// A name for a machine that does not exist yet (create-machine's name, branch-machine's
    /// childName).
    MachineName(String), deref str, arg "name", check machine_name,
    schema {"type": "string", "pattern": NAME_PATTERN}
}

grammar! {
    /// A machine whose egress grants a new machine carries (`allowHostsFrom`): its name, or on
    /// the cloud its `mach-` id. It may be gone; its grants are its user's own (the machine a
    /// call acts on is `owners::MachineRef`, which only the ownership check opens).
    GrantsOf(String), deref str, arg "name", check machine_ref,
    schema {"type": "string"}
}

grammar! {
    /// An image: an OCI reference, or locally an archive's absolute path.
    ImageRef(String), deref str, arg "image", check image,
    schema {"type": "string"}
}

grammar! {
    /// Host names a machine may reach.
    HostNames(Vec<String>), deref [String], arg "allowHosts", check hosts,
    schema {"type": "array", "items": {"type": "string"}}
}

grammar! {
    /// CIDR ranges a machine may reach.
    CidrRanges(Vec<String>), deref [String], arg "allowCidrs", check cidrs,
    schema {"type": "array", "items": {"type": "string"}}
}

grammar! {
    /// Environment variables: names of letters, digits and underscores, values without NUL.
    EnvVars(BTreeMap<String, String>), deref BTreeMap<String, String>, arg "env", check env,
    schema {"type": "object", "additionalProperties": {"type": "string"}}
}

grammar! {
    /// An absolute path (in a machine, or a host directory to mount).
    AbsolutePath(String), deref str, arg "workdir", check absolute_path,
    schema {"type": "string"}
}

/// The words held as text read as that text.
macro_rules! text {
    ($($name:ident),+) => {$(
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<$name> for String {
            fn from(word: $name) -> String {
                word.0
            }
        }
    )+};
}

text!(MachineName, GrantsOf, ImageRef, AbsolutePath);

/// A new machine's name as the schema states it: a letter or digit, then letters, digits and
/// underscores, each dash followed by one of them (so none at the end and no two in a row).
pub const NAME_PATTERN: &str = r"^[A-Za-z0-9](-?\w)*$";

/// The longest machine name the engine accepts.
pub const MAX_NAME_LEN: usize = 128;

/// smolvm's own rule for resource names (`validate_resource_name` in its `src/api/validation.rs`):
/// 1 to 128 ASCII letters, digits, `_` or `-`, starting with a letter or digit, not ending with
/// `-`, no `--`. The cloud publishes no rule of its own, so the same rule holds there and a name
/// means the same on both fleets.
pub fn machine_name(arg: &str, name: &str) -> Result<(), ToolError> {
    let why = if name.is_empty() || name.len() > MAX_NAME_LEN {
        Some(format!("it has {} bytes", name.len()))
    } else if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        Some("it does not start with a letter or digit".to_owned())
    } else if name.ends_with('-') {
        Some("it ends with a dash".to_owned())
    } else if name.contains("--") {
        Some("it has two dashes in a row".to_owned())
    } else {
        name.chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_')))
            .map(|c| format!("{c:?} is not allowed"))
    };
    match why {
        None => Ok(()),
        Some(why) => Err(ToolError::argument(
            arg,
            format!(
                "{} is not accepted ({why}): give 1 to {MAX_NAME_LEN} letters, digits, underscores or \
                 dashes, starting with a letter or digit, with no dash at the end and no two in a row",
                quote(name)
            ),
        )),
    }
}

/// A reference to an existing machine: a name as above, or a cloud id.
pub fn machine_ref(arg: &str, name: &str) -> Result<(), ToolError> {
    if name.starts_with("mach-")
        && name.len() <= 80
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Ok(());
    }
    machine_name(arg, name)
}

/// An image is an OCI reference (the distribution spec's grammar: `[host[:port]/]path[:tag]`
/// `[@algorithm:hex]`), or the local form smolvm 1.32.2's serve takes when started with
/// `--local-image-dir`: an absolute path to an archive, which it checks against that
/// directory. Anything else (a URL, a relative path, `..`) would reach the engine as a name
/// to pull or a file to open, so it is refused here with what is accepted.
pub fn image(arg: &str, image: &str) -> Result<(), ToolError> {
    let accepted = "give an OCI image reference, like alpine, alpine:3.20, \
                    python:3.12-alpine, ghcr.io/org/img:tag or ghcr.io/org/img@sha256:<64 hex>, \
                    or locally an absolute path to an image archive in the serve's \
                    --local-image-dir, like /images/app.tar";
    let shown = crate::policy::error::quote(image);
    if image.is_empty() || image.len() > 512 {
        return Err(ToolError::argument(
            arg,
            format!("{shown} is not accepted: 1 to 512 characters; {accepted}"),
        ));
    }
    // The engine takes a name ending like an archive for a file, even without a slash, and
    // looks for it in its own working directory.
    let archive_name = [".tar", ".tar.gz", ".tgz"]
        .iter()
        .any(|suffix| image.ends_with(suffix));
    let fits = if image.starts_with('/') {
        local_image_path(image)
    } else {
        !archive_name && oci_reference(image)
    };
    if !fits {
        return Err(ToolError::argument(
            arg,
            format!("{shown} is not an image reference; {accepted}"),
        ));
    }
    Ok(())
}

fn local_image_path(path: &str) -> bool {
    path.len() > 1
        && !path.ends_with('/')
        && path
            .split('/')
            .skip(1)
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        && !path.chars().any(|c| c.is_control() || c.is_whitespace())
}

/// The reference grammar of the OCI distribution spec (`reference.go` in
/// distribution/reference): lowercase path components joined by `.`, `_`, `__` or dashes,
/// an optional registry host (with a dot or a port, or `localhost`) before them, a tag of at
/// most 128 word characters, dots and dashes, and a digest.
fn oci_reference(reference: &str) -> bool {
    let (rest, digest) = match reference.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (reference, None),
    };
    if let Some(digest) = digest
        && !oci_digest(digest)
    {
        return false;
    }
    // A tag is after the last colon that comes after the last slash (a colon before it is a
    // registry's port).
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(tag) = tag {
        let mut chars = tag.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if !first_ok
            || tag.len() > 128
            || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        {
            return false;
        }
    }
    let mut components: Vec<&str> = name.split('/').collect();
    if components.len() > 1 {
        let first = components[0];
        if first.contains('.') || first.contains(':') || first == "localhost" {
            if !registry_host(first) {
                return false;
            }
            components.remove(0);
        }
    }
    !components.is_empty() && components.iter().all(|c| path_component(c))
}

fn path_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        // A separator: `.`, `_`, `__` or any run of dashes, between alphanumerics.
        let start = i;
        match bytes[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if i < bytes.len() && bytes[i] == b'_' {
                    i += 1;
                }
            }
            b'-' => {
                while i < bytes.len() && bytes[i] == b'-' {
                    i += 1;
                }
            }
            _ => return false,
        }
        if i == start || i >= bytes.len() || !alnum(bytes[i]) {
            return false;
        }
    }
    true
}

fn registry_host(host: &str) -> bool {
    let (name, port) = match host.rsplit_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (host, None),
    };
    if let Some(port) = port
        && (port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()))
    {
        return false;
    }
    !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

fn oci_digest(digest: &str) -> bool {
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return false;
    };
    let algorithm_ok = !algorithm.is_empty()
        && algorithm.split(['+', '.', '_', '-']).all(|part| {
            part.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
                && part.bytes().all(|b| b.is_ascii_alphanumeric())
        });
    let hex_len_ok = match algorithm {
        "sha256" => hex.len() == 64,
        "sha512" => hex.len() == 128,
        _ => hex.len() >= 32,
    };
    algorithm_ok && hex_len_ok && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A call's environment: at most this many variables,
pub const MAX_ENV_VARS: usize = 256;
/// names of at most this many bytes,
pub const MAX_ENV_NAME_BYTES: usize = 128;
/// each `NAME=value` at most Linux's limit on one string of a process's environment
/// (MAX_ARG_STRLEN, 32 pages: an execve with a longer one fails with E2BIG),
pub const MAX_ENV_ENTRY_BYTES: usize = 128 * 1024;
/// and at most this much in all (Linux gives a process's arguments and environment together a
/// quarter of its stack limit, 2 MiB under the usual 8 MiB).
pub const MAX_ENV_BYTES: usize = 1024 * 1024;

pub fn env(arg: &str, env: &BTreeMap<String, String>) -> Result<(), ToolError> {
    if env.len() > MAX_ENV_VARS {
        return Err(ToolError::argument(
            arg,
            format!(
                "{} variables are too many: give at most {MAX_ENV_VARS} (write more into a file \
                 in the machine with write-file and source it)",
                env.len()
            ),
        ));
    }
    let total: usize = env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    if total > MAX_ENV_BYTES {
        return Err(ToolError::argument(
            arg,
            format!(
                "{total} bytes in all are too many: give at most {MAX_ENV_BYTES} (write large \
                 values into a file in the machine with write-file instead)"
            ),
        ));
    }
    for (k, v) in env {
        if k.len() > MAX_ENV_NAME_BYTES {
            return Err(ToolError::argument(
                arg,
                format!(
                    "a variable name of {} bytes is too long: give at most {MAX_ENV_NAME_BYTES}",
                    k.len()
                ),
            ));
        }
        if k.len() + v.len() + 2 > MAX_ENV_ENTRY_BYTES {
            return Err(ToolError::argument(
                arg,
                format!(
                    "{} takes {} bytes: a process's environment takes at most \
                     {MAX_ENV_ENTRY_BYTES} a variable (its name, =, its value and the NUL that \
                     ends it); write the value into a file in the machine with write-file instead",
                    quote(k),
                    k.len() + v.len() + 2
                ),
            ));
        }
        let ok = !k.is_empty()
            && !k.chars().next().is_some_and(|c| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(ToolError::argument(
                arg,
                format!(
                    "variable name {} is not accepted: use letters, digits and underscores, not starting with a digit",
                    quote(k)
                ),
            ));
        }
        if v.contains('\0') {
            return Err(ToolError::argument(
                arg,
                format!("the value of {} contains a NUL byte", quote(k)),
            ));
        }
    }
    Ok(())
}

pub fn hosts(arg: &str, hosts: &[String]) -> Result<(), ToolError> {
    for h in hosts {
        let ok = !h.is_empty()
            && h.len() <= 253
            && h.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '*')
            });
        if !ok {
            return Err(ToolError::argument(
                arg,
                format!(
                    "{} is not a host name: give names like pypi.org, without scheme, port or path",
                    quote(h)
                ),
            ));
        }
    }
    Ok(())
}

pub fn cidrs(arg: &str, cidrs: &[String]) -> Result<(), ToolError> {
    for c in cidrs {
        let parsed = c.split_once('/').and_then(|(ip, prefix)| {
            let ip: std::net::IpAddr = ip.parse().ok()?;
            let prefix: u8 = prefix.parse().ok()?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            (prefix <= max).then_some(())
        });
        if parsed.is_none() {
            return Err(ToolError::argument(
                arg,
                format!(
                    "{} is not a CIDR range: give an address and a prefix length, like 10.0.0.0/8 or 2001:db8::/32",
                    quote(c)
                ),
            ));
        }
    }
    Ok(())
}

pub fn absolute_path(arg: &str, path: &str) -> Result<(), ToolError> {
    if !path.starts_with('/') || path.contains('\0') || path.len() > 4096 {
        return Err(ToolError::argument(
            arg,
            format!(
                "{} is not accepted: give an absolute path, like /workspace/app.py",
                quote(path)
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks() {
        assert!(machine_name("name", "web-1_a").is_ok());
        assert!(machine_name("name", &"x".repeat(128)).is_ok());
        for refused in ["web.1", "a-", "a--b", "_a", "", "ü", "a/b"] {
            assert!(machine_name("name", refused).is_err(), "{refused}");
        }
        assert!(machine_name("name", &"x".repeat(129)).is_err());
        let huge = machine_name("name", &"x y".repeat(1 << 20))
            .unwrap_err()
            .message;
        assert!(huge.len() < 300, "a bad value is quoted short: {huge}");
        assert!(machine_name("name", "-x").is_err());
        assert!(machine_name("name", "has space").is_err());
        assert!(machine_ref("name", "mach-0123456789abcdef0123456789abcdef").is_ok());
        assert!(
            absolute_path("path", "relative/x")
                .unwrap_err()
                .message
                .contains("absolute path")
        );
        assert!(cidrs("allowCidrs", &["10.0.0.0/8".into(), "::1/128".into()]).is_ok());
        assert!(cidrs("allowCidrs", &["10.0.0.0/33".into()]).is_err());
        assert!(hosts("allowHosts", &["https://pypi.org".into()]).is_err());
        assert!(
            env(
                "env",
                &BTreeMap::from([("1X".to_string(), "v".to_string())])
            )
            .is_err()
        );
    }

    #[test]
    fn images_are_oci_references_or_absolute_archive_paths() {
        let digest = "0123456789abcdef".repeat(4);
        for good in [
            "alpine".to_owned(),
            "alpine:3.20".to_owned(),
            "python:3.12-alpine".to_owned(),
            "library/alpine:latest".to_owned(),
            "ghcr.io/org/img:tag".to_owned(),
            format!("ghcr.io/org/img@sha256:{digest}"),
            format!("localhost:5000/a/b__c/d-e.f:V1_x@sha256:{digest}"),
            "registry.example.com:443/team/app".to_owned(),
            "a".to_owned(),
            "/images/app.tar".to_owned(),
        ] {
            assert!(image("image", &good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "http://evil/",
            "../../x",
            "./x.tar",
            "x.tar/../y",
            "/images/../etc/shadow",
            "/images/./x",
            "/images/",
            "/",
            "Alpine",
            "alpine:",
            ":3.20",
            "alpine@sha256:abc",
            "alpine@sha256",
            "ghcr.io//img",
            "-alpine",
            "alpine-",
            "a..b",
            "a___b",
            "alpine:3.20 --privileged",
            "alpine\n",
            "ghcr.io:/img",
            "ghcr.io:99999x/img",
            "-bad.io/img",
            "app.tar",
            "org/app.tgz",
        ] {
            let err = image("image", bad).unwrap_err();
            assert!(err.message.contains("image"), "{bad}: {}", err.message);
            assert!(
                err.message.contains("alpine:3.20"),
                "{bad}: {}",
                err.message
            );
        }
        assert!(image("image", &"a".repeat(513)).is_err());
    }

    /// A pattern read as the schema's ECMA-262 dialect reads it: `\w` is ASCII only.
    fn schema_pattern(pattern: &str) -> regex::Regex {
        regex::RegexBuilder::new(pattern)
            .unicode(false)
            .build()
            .unwrap()
    }

    proptest::proptest! {
        /// What the schema's pattern says of a name is what the check does, both ways.
        #[test]
        fn the_name_pattern_states_the_name_check(name in "[A-Za-z0-9_.\\-]{1,12}") {
            let stated = schema_pattern(NAME_PATTERN).is_match(&name);
            proptest::prop_assert_eq!(stated, machine_name("name", &name).is_ok(), "{}", name);
        }
    }

    #[test]
    fn the_catalog_states_the_patterns() {
        let create = crate::policy::tools::checked_input(
            crate::policy::tools::Tool::CreateMachine,
            crate::process::Mode::Both,
        );
        let name = &create["properties"]["name"];
        assert_eq!(name["pattern"], NAME_PATTERN);
    }
}
