//! Credential bindings: secrets an operator declares, that an agent names and never sees. The
//! local engine (1.32.2) gives the workload a placeholder in the binding's environment variable
//! and puts the real value into HTTPS requests to the binding's hosts only, on the host side;
//! the value reaches the engine through `PUT /machines/{name}/credential-values`, held in its
//! memory and applied at the machine's next boot. So this server keeps, per engine, which
//! machines were made with which bindings (`machines.json` in the runtime directory, changed
//! under a lock and written whole and renamed, as the ephemeral record is, since every server
//! process of the user shares it; it also keeps which machines ask the user about refused
//! egress, the other thing the engine does not tell back), and supplies the values before every
//! start it causes ([`Supplier`], which the local fleet asks).
//!
//! A value comes from an environment variable or a file of the server's, never from a tool
//! argument, and is never logged, echoed or written: [`Supplier::redact`] replaces every value
//! this process has read wherever output leaves the server.

use crate::fleet::{CredentialBindingSpec, CredentialValues, ErrorKind, FleetError, Secret};
use crate::process::redaction::Redactor;
use crate::process::shared_file;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Where a binding's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueSource {
    /// An environment variable of the server's, read when the configuration is loaded.
    Env { var: String, value: Option<Secret> },
    /// A file of the server's, read each time the value is supplied (so a rotated token is
    /// taken without a restart). Surrounding white space is dropped.
    File(PathBuf),
}

/// One binding as the operator declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialBinding {
    pub name: String,
    /// The workload's variable that holds the placeholder; `None` with `header`.
    pub env: Option<String>,
    /// Where the engine sends the value: lowercase host names, or `*.` and a name of at least
    /// two labels for its subdomains.
    pub hosts: Vec<String>,
    /// Set this request header to the value on every request to `hosts`, instead of replacing
    /// the placeholder where the workload puts it.
    pub header: Option<String>,
    pub source: ValueSource,
}

/// The bindings as the configuration file and `SMOL_MCP_CREDENTIALS` spell them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BindingFile {
    name: String,
    #[serde(default)]
    env: Option<String>,
    hosts: Vec<String>,
    #[serde(default)]
    header: Option<String>,
    #[serde(default)]
    from_env: Option<String>,
    #[serde(default)]
    from_file: Option<String>,
}

/// What the setting accepts, for its error messages and the README.
pub const ACCEPTS: &str = "a JSON list of bindings, each {\"name\", \"env\" (the workload's \
     variable), \"hosts\" (where the value may go), and \"fromEnv\" (a variable of the server's) \
     or \"fromFile\" (a file of the server's); \"header\" instead of \"env\" sets that request \
     header to the value}";

/// Headers the engine refuses to set (routing and framing, cookies).
const PROTECTED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    "proxy-connection",
    "cookie",
];

fn is_binding_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A lowercase DNS name, or `*.` and one of at least two labels (the engine's own rule).
fn is_binding_host(host: &str) -> bool {
    let (name, wildcard) = match host.strip_prefix("*.") {
        Some(rest) => (rest, true),
        None => (host, false),
    };
    let labels: Vec<&str> = name.split('.').collect();
    let label_ok = |l: &&str| {
        (1..=63).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let is_ip = name.parse::<std::net::IpAddr>().is_ok();
    name.len() <= 253
        && !is_ip
        && labels.iter().all(label_ok)
        && labels.len() >= if wildcard { 2 } else { 1 }
        && labels
            .last()
            .is_some_and(|l| l.bytes().any(|b| !b.is_ascii_digit()))
}

/// Reads and checks the bindings: each refusal names the binding and what would be accepted.
/// `env` is the server's environment, from which `fromEnv` values are taken now.
pub fn parse(
    value: serde_json::Value,
    env: &BTreeMap<String, String>,
) -> Result<Vec<CredentialBinding>, String> {
    let files: Vec<BindingFile> = serde_json::from_value(value).map_err(|e| e.to_string())?;
    let mut bindings = Vec::new();
    let mut names = HashSet::new();
    let mut vars = HashSet::new();
    for file in files {
        let name = file.name;
        let label = format!("binding {name:?}");
        if !is_binding_name(&name) {
            return Err(format!(
                "{label}: a name is 1 to 64 letters, digits, '_', '.' or '-'"
            ));
        }
        if !names.insert(name.clone()) {
            return Err(format!("{label} is declared twice"));
        }
        match (&file.env, &file.header) {
            (None, None) => {
                return Err(format!(
                    "{label}: give \"env\" (the workload's variable that holds the placeholder) \
                     or \"header\" (a request header set to the value)"
                ));
            }
            (Some(var), _) if !is_env_name(var) => {
                return Err(format!(
                    "{label}: env {var:?} is not a variable name (a letter or '_', then \
                     letters, digits or '_')"
                ));
            }
            (Some(var), _) if !vars.insert(var.clone()) => {
                return Err(format!("{label}: env {var:?} is bound twice"));
            }
            _ => {}
        }
        if let Some(header) = &file.header {
            let lower = header
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
            if header.is_empty() || !lower || PROTECTED_HEADERS.contains(&header.as_str()) {
                return Err(format!(
                    "{label}: header {header:?} must be a lowercase header name other than \
                     {}",
                    PROTECTED_HEADERS.join(", ")
                ));
            }
        }
        if file.hosts.is_empty() {
            return Err(format!(
                "{label}: \"hosts\" is empty; a value is never sent anywhere by default"
            ));
        }
        if let Some(bad) = file.hosts.iter().find(|h| !is_binding_host(h)) {
            return Err(format!(
                "{label}: host {bad:?} must be a lowercase DNS name (api.example.com), or *. \
                 and a name of two labels or more (*.example.com); no scheme, port or IP"
            ));
        }
        let source = match (file.from_env, file.from_file) {
            (Some(var), None) => {
                let value = env
                    .get(&var)
                    .filter(|v| !v.trim().is_empty())
                    .map(|v| Secret::new(v.trim()));
                ValueSource::Env { var, value }
            }
            (None, Some(path)) if Path::new(&path).is_absolute() => {
                ValueSource::File(PathBuf::from(path))
            }
            (None, Some(path)) => {
                return Err(format!(
                    "{label}: fromFile {path:?} must be an absolute path"
                ));
            }
            _ => {
                return Err(format!(
                    "{label}: give one of \"fromEnv\" (a variable of the server's) or \
                     \"fromFile\" (an absolute path); a value never comes from a tool argument"
                ));
            }
        };
        bindings.push(CredentialBinding {
            name,
            env: file.env,
            hosts: file.hosts,
            header: file.header,
            source,
        });
    }
    Ok(bindings)
}

/// Takes the values of `fromEnv` bindings from the server's environment (read once, at load).
pub fn capture_values(bindings: &mut [CredentialBinding], env: &BTreeMap<String, String>) {
    for binding in bindings {
        if let ValueSource::Env { var, value } = &mut binding.source {
            *value = env
                .get(var.as_str())
                .filter(|v| !v.trim().is_empty())
                .map(|v| Secret::new(v.trim()));
        }
    }
}

impl CredentialBinding {
    /// What the engine is told at create: everything but the value.
    pub fn spec(&self) -> CredentialBindingSpec {
        CredentialBindingSpec {
            name: self.name.clone(),
            env: self.env.clone(),
            hosts: self.hosts.clone(),
            header: self.header.clone(),
        }
    }

    /// Where the operator puts the value, for messages.
    pub fn source_words(&self) -> String {
        match &self.source {
            ValueSource::Env { var, .. } => format!("${var} in the server's environment"),
            ValueSource::File(path) => format!("the file {}", path.display()),
        }
    }

    /// The value, or why there is none and what the operator must do.
    fn value(&self) -> Result<Secret, String> {
        match &self.source {
            ValueSource::Env { value: Some(v), .. } => Ok(v.clone()),
            ValueSource::Env { var, .. } => Err(format!(
                "credential {} has no value: set {var} in the environment the MCP client \
                 starts this server with, then restart the server",
                self.name
            )),
            ValueSource::File(path) => match std::fs::read_to_string(path) {
                Ok(text) if !text.trim().is_empty() => Ok(Secret::new(text.trim())),
                Ok(_) => Err(format!(
                    "credential {} has no value: the file {} is empty; put the value in it",
                    self.name,
                    path.display()
                )),
                Err(e) => Err(format!(
                    "credential {} has no value: the file {} cannot be read ({e}); put the \
                     value in it, readable by the server's user",
                    self.name,
                    path.display()
                )),
            },
        }
    }
}

/// What this server set up on a machine that the engine does not tell back.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Setup {
    /// The credential bindings it was made with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    credentials: Vec<String>,
    /// Made with `network: "ask"`: refused egress is put to the user.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    asks_egress: bool,
    /// binding -> a fingerprint of each value supplied to the machine (never the value): a
    /// machine keeps what it was given (in its files, in what a server echoed to it), so a
    /// process must know every one of them to redact its output.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    supplied: BTreeMap<String, Vec<String>>,
}

/// Fingerprints kept per binding of a machine; past it the oldest is dropped and the machine
/// is taken as holding a value no process can know ([`LOST_PRINT`]).
const PRINTS_PER_BINDING: usize = 8;

/// Stands for a fingerprint dropped past [`PRINTS_PER_BINDING`]: it matches no value.
const LOST_PRINT: &str = "lost";

/// PBKDF2 rounds of a value's fingerprint: a file anyone can read would otherwise let a guess
/// at a short value be checked at the speed of one hash.
const PRINT_ROUNDS: u32 = 20_000;

/// Which machines of one engine were set up how, kept across restarts: an engine forgets values
/// at its own restart, and a restarted server must still know what to supply before a
/// machine's next start, and whom to ask.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
struct BoundFile {
    /// engine -> machine -> its setup
    engines: BTreeMap<String, BTreeMap<String, Setup>>,
    /// The salt of every fingerprint in the file (hex), made with the first one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    salt: String,
}

/// The bindings of this process and the machines made with them; the local fleet asks it for
/// the values to supply before it starts a machine.
#[derive(Debug)]
pub struct Supplier {
    bindings: Vec<CredentialBinding>,
    /// The local engine the machines are on, as the ephemeral record names engines; set when
    /// the process first reaches its local fleet (no machine can be made before).
    engine: std::sync::OnceLock<String>,
    /// Every value read so far, longest first, with what replaces it in output.
    seen: Mutex<Vec<(Secret, String)>>,
    /// `seen` ready to search output with, made again when a value is first seen.
    redactor: Mutex<Arc<Redactor>>,
    /// salt and fingerprint of each value seen, as computed once (they are slow on purpose).
    prints: Mutex<Vec<(String, Secret, String)>>,
    /// Which machines were made with which bindings: `machines.json` in the runtime directory
    /// (changed under `machines.lock`: other server processes of the user change it too, and a
    /// change made on a copy read earlier would undo theirs), or a document of the store the
    /// processes of several hosts share.
    setups: Arc<dyn shared_file::SharedDocument>,
}

impl Supplier {
    pub fn new(bindings: Vec<CredentialBinding>, runtime_dir: &Path) -> Supplier {
        let supplier = Supplier {
            bindings,
            setups: Arc::new(shared_file::FileDocument::new(
                runtime_dir.join("machines.json"),
                runtime_dir.join("machines.lock"),
            )),
            engine: std::sync::OnceLock::new(),
            seen: Mutex::new(Vec::new()),
            redactor: Mutex::new(Arc::new(Redactor::default())),
            prints: Mutex::new(Vec::new()),
        };
        // Every value is known before anything is answered: output can carry one from the
        // start (a machine a previous process made and supplied is still running), so a file's
        // value is read now too, not first at a boot this process causes. A file unreadable
        // now is read again when a value is supplied, and its error said then.
        for binding in &supplier.bindings {
            match &binding.source {
                ValueSource::Env { value: Some(v), .. } => supplier.saw(&binding.name, v),
                ValueSource::File(_) => {
                    if let Ok(value) = binding.value() {
                        supplier.saw(&binding.name, &value);
                    }
                }
                ValueSource::Env { value: None, .. } => {}
            }
        }
        supplier
    }

    /// Keeps the record of which machines were set up how in `document` (a store several
    /// hosts' processes share) rather than in the runtime directory's file.
    pub fn shared_in(mut self, document: Arc<dyn shared_file::SharedDocument>) -> Supplier {
        self.setups = document;
        self
    }

    /// The engine whose machines this supplier keeps (the first one set stays).
    pub fn set_engine(&self, engine: String) {
        let _ = self.engine.set(engine);
    }

    pub fn bindings(&self) -> &[CredentialBinding] {
        &self.bindings
    }

    /// The bindings `names` name, or an error naming the unknown one and the configured ones.
    pub fn resolve(&self, names: &[String]) -> Result<Vec<&CredentialBinding>, String> {
        let mut found = Vec::new();
        for name in names {
            match self.bindings.iter().find(|b| &b.name == name) {
                Some(b) if !found.iter().any(|f: &&CredentialBinding| f.name == b.name) => {
                    found.push(b)
                }
                Some(_) => return Err(format!("{name:?} is named twice")),
                None if self.bindings.is_empty() => {
                    return Err(format!(
                        "{name:?} is not a credential of this server: it has none (the \
                         operator declares them in the server's configuration, credentials)"
                    ));
                }
                None => {
                    let known: Vec<&str> = self.bindings.iter().map(|b| b.name.as_str()).collect();
                    return Err(format!(
                        "{name:?} is not a credential of this server; its credentials are {}",
                        known.join(", ")
                    ));
                }
            }
        }
        Ok(found)
    }

    /// Whether `binding` has a value to supply now; the error names what the operator must do.
    pub fn check_value(&self, binding: &CredentialBinding) -> Result<(), String> {
        let value = binding.value()?;
        self.saw(&binding.name, &value);
        Ok(())
    }

    fn saw(&self, name: &str, value: &Secret) {
        // A poisoned lock is taken anyway: a value left out would leave output unredacted.
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.iter().any(|(v, _)| v == value) {
            return;
        }
        seen.push((value.clone(), format!("[credential {name}]")));
        seen.sort_by_key(|(v, _)| std::cmp::Reverse(v.expose().len()));
        let redactor = Redactor::new(
            seen.iter()
                .map(|(v, label)| (v.expose().as_bytes().to_vec(), label.clone())),
        );
        *self.redactor.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(redactor);
    }

    /// Every value this process has read, to search output with (at every cut the server
    /// makes, [`crate::process::redaction`]).
    pub fn redactor(&self) -> Arc<Redactor> {
        self.redactor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `text` with every value this process has read replaced by `[credential NAME]`.
    pub fn redact(&self, text: &str) -> Option<String> {
        self.redactor().text(text)
    }

    /// Every value read so far with what replaces it, for the run ledger's own redaction.
    pub fn values_to_redact(&self) -> Vec<(String, String)> {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(v, label)| (v.expose().to_owned(), label.clone()))
            .collect()
    }

    /// Whether any value is known (so that output needs looking at).
    pub fn has_values(&self) -> bool {
        !self.redactor().is_empty()
    }

    /// `f` of the record as it is now; `None` (logged) when it cannot be read.
    async fn read_bound<T>(&self, f: impl FnOnce(&BoundFile) -> T) -> Option<T> {
        let file = match self.setups.read().await {
            Ok(text) => text
                .and_then(|t| serde_json::from_str::<BoundFile>(&t).ok())
                .unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %e, "could not read the record of which machines have credential bindings");
                return None;
            }
        };
        Some(f(&file))
    }

    /// `f` on the record read afresh under its lock, written back (before the lock is let go)
    /// when it changed it. Without the lock, None: the change is not made, and said.
    async fn change_bound<T: Send>(&self, f: impl FnOnce(&mut BoundFile) -> T + Send) -> Option<T> {
        let mut f = Some(f);
        let mut answer = None;
        let changed = self
            .setups
            .update(&mut |text| {
                let mut file = text
                    .and_then(|t| serde_json::from_str::<BoundFile>(t).ok())
                    .unwrap_or_default();
                let before = file.clone();
                answer = f.take().map(|f| f(&mut file));
                (file != before)
                    .then(|| serde_json::to_string_pretty(&file).ok())
                    .flatten()
            })
            .await;
        if let Err(e) = changed {
            tracing::warn!(error = %e, "could not record which machines have credential bindings");
            return None;
        }
        answer
    }

    /// Changes what is recorded of `machine`; an empty setup is forgotten.
    async fn update(&self, machine: &str, change: impl FnOnce(&mut Setup) + Send) {
        let Some(engine) = self.engine.get().cloned() else {
            return;
        };
        self.change_bound(|file| {
            let machines = file.engines.entry(engine.clone()).or_default();
            let mut setup = machines.get(machine).cloned().unwrap_or_default();
            change(&mut setup);
            if setup == Setup::default() {
                machines.remove(machine);
            } else {
                machines.insert(machine.to_owned(), setup);
            }
            if machines.is_empty() {
                file.engines.remove(&engine);
            }
        })
        .await;
    }

    async fn setup(&self, machine: &str) -> Setup {
        let Some(engine) = self.engine.get() else {
            return Setup::default();
        };
        self.read_bound(|file| {
            file.engines
                .get(engine)
                .and_then(|m| m.get(machine))
                .cloned()
                .unwrap_or_default()
        })
        .await
        .unwrap_or_default()
    }

    /// `machine` is made (or branched) with the bindings `names` (none: without bindings).
    pub async fn bind(&self, machine: &str, names: &[String]) {
        self.update(machine, |setup| setup.credentials = names.to_vec())
            .await;
    }

    /// `child` is branched from `source` (running, or a base): it has its bindings, holds
    /// every value the source was given, and asks the user about refused egress if the source
    /// did (its allow list is the source's, which only the user widens).
    pub async fn branched(&self, source: &str, child: &str) {
        let from = self.setup(source).await;
        self.update(child, |setup| {
            setup.credentials = from.credentials;
            setup.supplied = from.supplied;
            setup.asks_egress = from.asks_egress;
        })
        .await;
    }

    /// Whether any machine is recorded as given a value (so a call naming one must reach its
    /// fleet, which names the engine, before [`Supplier::unknown_value`] can say).
    pub async fn has_supplied(&self) -> bool {
        self.read_bound(|file| {
            file.engines
                .values()
                .flat_map(|machines| machines.values())
                .any(|setup| !setup.supplied.is_empty())
        })
        .await
        .unwrap_or(false)
    }

    /// `machine` is made to ask the user about refused egress, or not.
    pub async fn set_asks_egress(&self, machine: &str, asks: bool) {
        self.update(machine, |setup| setup.asks_egress = asks).await;
    }

    /// Whether `machine` was made with `network: "ask"`.
    pub async fn asks_egress(&self, machine: &str) -> bool {
        self.setup(machine).await.asks_egress
    }

    /// `machine` is gone: nothing more to supply or ask for it.
    pub async fn forget_machine(&self, machine: &str) {
        self.update(machine, |setup| *setup = Setup::default())
            .await;
    }

    /// The bindings `machine` was made with, if any.
    pub async fn bound_to(&self, machine: &str) -> Vec<String> {
        self.setup(machine).await.credentials
    }

    /// Why this process cannot hide every credential value `machine` holds, when it cannot: a
    /// value supplied to it (by this process or an earlier one) that this process has not
    /// read, because the binding's value changed since (or its source is gone). Its output
    /// could then carry that value in clear, so what would show output is refused.
    pub async fn unknown_value(&self, machine: &str) -> Option<String> {
        let setup = self.setup(machine).await;
        if setup.supplied.is_empty() {
            return None;
        }
        let salt = self.read_bound(|file| file.salt.clone()).await?;
        let known: Vec<String> = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(value, _)| self.print(&salt, value))
            .collect();
        let unknown: Vec<&str> = setup
            .supplied
            .iter()
            .filter(|(_, prints)| prints.iter().any(|p| !known.contains(p)))
            .map(|(name, _)| name.as_str())
            .collect();
        if unknown.is_empty() {
            return None;
        }
        Some(format!(
            "machine {machine} was given a value of credential {} that this server does not have \
             now (the value changed, or its source went, since it was supplied): the machine may \
             hold it, and its output could not be redacted, so nothing that shows its output or \
             files is served. Put the earlier value back where the operator keeps it and restart \
             the server, or delete the machine (stop-machine and list-machines still work)",
            unknown.join(", ")
        ))
    }

    /// `value`'s fingerprint under `salt`, computed once per process.
    fn print(&self, salt: &str, value: &Secret) -> String {
        let mut prints = self.prints.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, _, print)) = prints.iter().find(|(s, v, _)| s == salt && v == value) {
            return print.clone();
        }
        let mut out = [0u8; 32];
        ring::pbkdf2::derive(
            ring::pbkdf2::PBKDF2_HMAC_SHA256,
            std::num::NonZeroU32::new(PRINT_ROUNDS).unwrap_or(std::num::NonZeroU32::MIN),
            salt.as_bytes(),
            value.expose().as_bytes(),
            &mut out,
        );
        let print: String = out.iter().map(|b| format!("{b:02x}")).collect();
        prints.push((salt.to_owned(), value.clone(), print.clone()));
        print
    }

    /// `values` are being supplied to `machine`: their fingerprints are kept with it.
    async fn record_supplied(&self, machine: &str, values: &[(String, Secret)]) {
        // The salt exists after the first value: one stat reads it; the lock only makes it.
        let known = self
            .read_bound(|file| file.salt.clone())
            .await
            .filter(|salt| !salt.is_empty());
        let salt = match known {
            Some(salt) => Some(salt),
            None => {
                self.change_bound(|file| {
                    if file.salt.is_empty() {
                        let mut bytes = [0u8; 16];
                        rand::Rng::fill(&mut rand::rng(), &mut bytes[..]);
                        file.salt = bytes.iter().map(|b| format!("{b:02x}")).collect();
                    }
                    file.salt.clone()
                })
                .await
            }
        };
        let Some(salt) = salt else {
            return;
        };
        let prints: Vec<(String, String)> = values
            .iter()
            .map(|(name, value)| (name.clone(), self.print(&salt, value)))
            .collect();
        self.update(machine, |setup| {
            for (name, print) in prints {
                let kept = setup.supplied.entry(name).or_default();
                if !kept.contains(&print) {
                    kept.push(print);
                }
                if kept.len() > PRINTS_PER_BINDING {
                    kept.remove(0);
                    kept[0] = LOST_PRINT.to_owned();
                }
            }
        })
        .await;
    }
}

#[async_trait::async_trait]
impl CredentialValues for Supplier {
    async fn values_for(&self, machine: &str) -> Option<Result<Vec<(String, Secret)>, FleetError>> {
        let names = self.bound_to(machine).await;
        if names.is_empty() {
            return None;
        }
        let mut values = Vec::new();
        for name in &names {
            let Some(binding) = self.bindings.iter().find(|b| &b.name == name) else {
                return Some(Err(FleetError::new(
                    ErrorKind::Refused,
                    format!("start machine {machine}"),
                    format!(
                        "machine {machine} was made with credential {name}, which this \
                         server's configuration no longer declares: declare it again \
                         (credentials), or delete the machine"
                    ),
                )));
            };
            match binding.value() {
                Ok(value) => {
                    self.saw(name, &value);
                    values.push((name.clone(), value));
                }
                Err(why) => {
                    return Some(Err(FleetError::new(
                        ErrorKind::Refused,
                        format!("start machine {machine}"),
                        why,
                    )));
                }
            }
        }
        // Kept before the engine has them: a fingerprint too many only refuses more.
        self.record_supplied(machine, &values).await;
        Some(Ok(values))
    }

    async fn forget(&self, machine: &str) {
        self.bind(machine, &[]).await;
    }
}

/// The supplier of a process, shared by its local fleet and its policy.
pub type Shared = Arc<Supplier>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::config::env;
    use serde_json::json;

    #[test]
    fn bindings_are_checked_as_the_engine_would_and_name_what_is_wrong() {
        let ok = parse(
            json!([{"name": "gh", "env": "GH_TOKEN", "hosts": ["api.github.com", "*.example.com"], "fromEnv": "MY_GH"}]),
            &env(&[("MY_GH", "s3cret-value")]),
        )
        .unwrap();
        assert_eq!(ok[0].hosts, ["api.github.com", "*.example.com"]);
        assert_eq!(
            ok[0].source,
            ValueSource::Env {
                var: "MY_GH".into(),
                value: Some(Secret::new("s3cret-value"))
            }
        );
        let refused = |binding: serde_json::Value, words: &str| {
            let e = parse(json!([binding]), &env(&[])).unwrap_err();
            assert!(e.contains(words), "{e}");
        };
        refused(
            json!({"name": "a b", "env": "X", "hosts": ["a.com"], "fromEnv": "V"}),
            "a name is 1 to 64",
        );
        refused(
            json!({"name": "a", "env": "1X", "hosts": ["a.com"], "fromEnv": "V"}),
            "not a variable name",
        );
        refused(
            json!({"name": "a", "hosts": ["a.com"], "fromEnv": "V"}),
            "give \"env\"",
        );
        refused(
            json!({"name": "a", "env": "X", "hosts": [], "fromEnv": "V"}),
            "is empty",
        );
        for host in [
            "*.com",
            "API.example.com",
            "10.0.0.1",
            "api.example.com:443",
            "https://a.com",
        ] {
            refused(
                json!({"name": "a", "env": "X", "hosts": [host], "fromEnv": "V"}),
                "must be a lowercase DNS name",
            );
        }
        refused(
            json!({"name": "a", "env": "X", "hosts": ["a.com"]}),
            "give one of \"fromEnv\"",
        );
        refused(
            json!({"name": "a", "env": "X", "hosts": ["a.com"], "fromFile": "rel/path"}),
            "absolute",
        );
        refused(
            json!({"name": "a", "header": "Cookie", "hosts": ["a.com"], "fromEnv": "V"}),
            "lowercase header",
        );
        refused(
            json!({"name": "a", "env": "X", "hosts": ["a.com"], "fromEnv": "V", "value": "x"}),
            "unknown field",
        );
        let twice = parse(
            json!([{"name": "a", "env": "X", "hosts": ["a.com"], "fromEnv": "V"}, {"name": "a", "env": "Y", "hosts": ["a.com"], "fromEnv": "V"}]),
            &env(&[]),
        )
        .unwrap_err();
        assert!(twice.contains("declared twice"), "{twice}");
    }

    #[tokio::test]
    async fn values_are_supplied_per_machine_and_redacted_once_read() {
        let dir = tempfile_dir();
        let secret_file = dir.join("token");
        std::fs::write(&secret_file, "file-value-123\n").unwrap();
        let bindings = parse(
            json!([
                {"name": "a", "env": "A", "hosts": ["a.com"], "fromEnv": "A_SRC"},
                {"name": "b", "env": "B", "hosts": ["b.com"], "fromFile": secret_file.display().to_string()},
                {"name": "c", "env": "C", "hosts": ["c.com"], "fromEnv": "UNSET"}
            ]),
            &env(&[("A_SRC", "env-value-456")]),
        )
        .unwrap();
        let supplier = Supplier::new(bindings, &dir);
        supplier.set_engine("engine-1".into());
        assert!(supplier.values_for("plain").await.is_none());
        supplier.bind("m", &["a".into(), "b".into()]).await;
        let values = supplier.values_for("m").await.unwrap().unwrap();
        assert_eq!(values[0].0, "a");
        assert_eq!(values[1].1.expose(), "file-value-123");
        // Kept across a new process on the same runtime directory and engine only.
        let again = Supplier::new(supplier.bindings.clone(), &dir);
        again.set_engine("engine-1".into());
        assert_eq!(again.bound_to("m").await, ["a", "b"]);
        let other = Supplier::new(supplier.bindings.clone(), &dir);
        other.set_engine("engine-2".into());
        assert!(other.bound_to("m").await.is_empty());
        // A missing value names the binding and what to set.
        supplier.bind("n", &["c".into()]).await;
        let e = supplier.values_for("n").await.unwrap().unwrap_err();
        assert!(
            e.message.contains("credential c has no value: set UNSET"),
            "{}",
            e.message
        );
        assert!(!format!("{e:?}").contains("env-value-456"));
        // Output carrying a value is redacted, whichever binding it came from.
        assert_eq!(
            supplier
                .redact("x env-value-456 y file-value-123")
                .as_deref(),
            Some("x [credential a] y [credential b]")
        );
        assert_eq!(supplier.redact("nothing here"), None);
        supplier.forget("m").await;
        assert!(supplier.values_for("m").await.is_none());
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A machine keeps the fingerprints of the values it was given, a branch child its
    /// source's; past eight a binding the oldest is dropped and the machine counts as holding
    /// one no process knows. A process knowing every one serves it; one that does not, not.
    #[tokio::test]
    async fn a_machine_given_a_value_this_process_does_not_know_is_named() {
        let dir = tempfile_dir();
        let file = dir.join("token");
        std::fs::write(&file, "rotating-value-0\n").unwrap();
        let bindings = parse(
            json!([{"name": "r", "env": "R", "hosts": ["r.com"], "fromFile": file.display().to_string()}]),
            &env(&[]),
        )
        .unwrap();
        let supplier = Supplier::new(bindings.clone(), &dir);
        supplier.set_engine("engine-1".into());
        supplier.bind("m", &["r".into()]).await;
        supplier.values_for("m").await.unwrap().unwrap();
        assert_eq!(
            supplier.unknown_value("m").await,
            None,
            "its value is known"
        );
        supplier.branched("m", "kid").await;
        // A new process after a rotation knows only the new value.
        std::fs::write(&file, "rotating-value-1\n").unwrap();
        let next = Supplier::new(bindings.clone(), &dir);
        next.set_engine("engine-1".into());
        for machine in ["m", "kid"] {
            let why = next.unknown_value(machine).await.expect("an unknown value");
            assert!(
                why.contains("credential r") && why.contains("delete the machine"),
                "{why}"
            );
        }
        let record = std::fs::read_to_string(dir.join("machines.json")).unwrap();
        assert!(!record.contains("rotating-value"), "{record}");
        // The process that saw both serves both.
        next.values_for("m").await.unwrap().unwrap();
        assert!(
            next.unknown_value("m").await.is_some(),
            "the first value is still unknown here"
        );
        supplier.values_for("m").await.unwrap().unwrap();
        assert_eq!(
            supplier.unknown_value("m").await,
            None,
            "this one read both"
        );
        // Nine values in all: the first one's place is lost, whoever asks.
        for n in 2..9 {
            std::fs::write(&file, format!("rotating-value-{n}\n")).unwrap();
            supplier.values_for("m").await.unwrap().unwrap();
        }
        let why = supplier
            .unknown_value("m")
            .await
            .expect("a lost fingerprint");
        assert!(why.contains("credential r"), "{why}");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Two server processes of one user share machines.json: what each records stays, whatever
    /// the order (each used to write back the copy it read first, undoing the other's), and a
    /// change made by one is seen by the other's next look.
    #[tokio::test]
    async fn processes_sharing_the_record_keep_each_others_machines() {
        let dir = tempfile_dir();
        let bindings = parse(
            json!([{"name": "gh", "env": "GH", "hosts": ["api.github.com"], "fromEnv": "V"}]),
            &env(&[("V", "shared-record-value-1")]),
        )
        .unwrap();
        let open = || {
            let s = Supplier::new(bindings.clone(), &dir);
            s.set_engine("engine-1".into());
            s
        };
        let (first, second) = (open(), open());
        assert!(
            first.bound_to("a").await.is_empty(),
            "read before the other writes"
        );
        first.bind("a", &["gh".into()]).await;
        second.bind("b", &["gh".into()]).await;
        first.set_asks_egress("c", true).await;
        assert_eq!(
            second.bound_to("a").await,
            vec!["gh".to_string()],
            "seen by the other"
        );
        assert!(second.asks_egress("c").await);
        second.values_for("b").await.unwrap().unwrap();
        first.forget_machine("a").await;
        let third = open();
        assert!(third.bound_to("a").await.is_empty());
        assert_eq!(third.bound_to("b").await, vec!["gh".to_string()]);
        assert!(third.asks_egress("c").await);
        assert!(third.has_supplied().await, "b's fingerprint stayed");
        // At once, from tasks standing for processes: every machine recorded.
        let writers = (0..4).map(|t| {
            let s = Supplier::new(bindings.clone(), &dir);
            s.set_engine("engine-1".into());
            async move {
                for n in 0..25 {
                    s.bind(&format!("t{t}-{n}"), &["gh".into()]).await;
                }
            }
        });
        futures::future::join_all(writers).await;
        let last = open();
        for t in 0..4 {
            for n in 0..25 {
                assert_eq!(
                    last.bound_to(&format!("t{t}-{n}")).await.len(),
                    1,
                    "t{t}-{n}"
                );
            }
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("smol-mcp-cred-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
