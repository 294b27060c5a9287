//! What every tool call shares: the fleet it goes to, cancellation by the client, waiting until a
//! machine runs commands, and deleting a machine whatever the client does meanwhile.

pub mod owners;
pub mod parts;

use super::Tool;
use crate::fleet::{
    Capabilities, Command, CreateSpec, ErrorKind, ExecSpec, Feature, Fleet, FleetKind, Machine,
    Phase,
};
use crate::policy::Policy;
use crate::policy::error::{ToolError, ToolErrorKind};
use crate::policy::jobs::SessionHoldRef;
use crate::policy::progress::Progress;
use crate::process::config::Config;
use crate::process::made::MachineSlot;
use crate::process::{Mode, Process};
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const READY_PROBE_TIMEOUT_SECS: u64 = 10;
const CLEANUP_DEADLINE: Duration = Duration::from_secs(120);

/// Who a tool call is made for: the owner of the ephemeral machines it makes (a session, or the
/// process's lease holder), the fleets it may name, the client's cancellation, and where its
/// waits are reported.
pub struct Caller {
    pub owner: String,
    /// The user the call is made for: the machines, runs and jobs it may see are theirs.
    pub user: crate::policy::user::User,
    pub scope: Scope,
    pub ct: CancellationToken,
    pub progress: Progress,
    /// Keeps the caller's session open while a job it starts runs (HTTP sessions only).
    pub session_hold: Option<SessionHoldRef>,
    /// Who answers for the user when a machine asks about its egress (a client that can show
    /// a form); `None` when no one can be asked.
    pub consent: Option<Arc<dyn crate::policy::consent::Consent>>,
    /// The user's answer carried by a call made again after its input-required result.
    pub prior_answer: Option<crate::policy::consent::PriorAnswer>,
    /// Present when the client shows this server's views (MCP Apps): view-state answers only
    /// then, and an egress answer from a view is opened with it.
    pub views: Option<Arc<dyn crate::policy::consent::ViewSeal>>,
    /// An explicit stop (tasks/cancel): it ends even a call with an idempotency key, whose
    /// work a cancelled request (`ct`, a dropped connection) leaves running.
    pub stop: CancellationToken,
}

impl Caller {
    /// A caller that reports no progress, holds no session open and has no one to ask.
    pub fn new(owner: impl Into<String>, scope: Scope, ct: CancellationToken) -> Caller {
        Caller {
            owner: owner.into(),
            user: crate::policy::user::User::operator(),
            scope,
            ct,
            progress: Progress::none(),
            session_hold: None,
            consent: None,
            prior_answer: None,
            views: None,
            stop: CancellationToken::new(),
        }
    }

    pub fn for_user(mut self, user: crate::policy::user::User) -> Caller {
        self.user = user;
        self
    }

    pub fn with_views(
        mut self,
        views: Option<Arc<dyn crate::policy::consent::ViewSeal>>,
    ) -> Caller {
        self.views = views;
        self
    }

    pub fn with_stop(mut self, stop: CancellationToken) -> Caller {
        self.stop = stop;
        self
    }

    pub fn with_progress(mut self, progress: Progress) -> Caller {
        self.progress = progress;
        self
    }

    pub fn with_session_hold(mut self, hold: Option<SessionHoldRef>) -> Caller {
        self.session_hold = hold;
        self
    }

    pub fn with_consent(
        mut self,
        consent: Option<Arc<dyn crate::policy::consent::Consent>>,
        prior_answer: Option<crate::policy::consent::PriorAnswer>,
    ) -> Caller {
        self.consent = consent;
        self.prior_answer = prior_answer;
        self
    }
}

/// One tool call as its handler sees it: who made it (`Caller`, as the protocol built it) and
/// what the call itself learns as it runs.
pub struct Call<'a> {
    policy: &'a Arc<Policy>,
    caller: Caller,
    /// The fleet this call went to, once chosen, and once reached.
    used: OnceLock<FleetKind>,
    reached: OnceLock<Fleet>,
    /// The machine names this call uses, which the lease reaper must leave alone until it ends.
    held: std::sync::Mutex<Vec<String>>,
    /// The names this call claimed for its user (`owners`), let go if it fails.
    claims: std::sync::Mutex<Vec<(FleetKind, String)>>,
    /// The machines the ownership check passed for this call, which its handler may act on.
    owned: owners::owned::KeptOwned,
}

/// Which fleets a call may name: those of the process, or the one its session chose when
/// asked at its first tool call (`crate::protocol::server::fleet_choice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Process(Mode),
    Chosen(FleetKind),
}

impl Scope {
    /// The tool catalog a client in this scope sees.
    pub fn mode(self) -> Mode {
        match self {
            Scope::Process(mode) => mode,
            Scope::Chosen(kind) => Mode::Single(kind),
        }
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if let Ok(held) = self.held.lock() {
            self.process().release(&held);
        }
    }
}

fn limit(message: String) -> ToolError {
    ToolError::new(ToolErrorKind::LimitReached, message)
}

/// A spend ceiling that cannot be checked refuses rather than lets the work through.
fn spend_unknown(kind: ToolErrorKind, setting: &str, why: String) -> ToolError {
    ToolError::new(
        kind,
        format!(
            "{why}, so this server cannot tell whether its spend ceiling ({setting}) is reached: \
             nothing was made or run on cloud. Retry shortly; if it persists, the operator can \
             look at the server's log."
        ),
    )
}

/// Micros as dollars, the way a person reads them ($0.0418 for 41,800).
fn dollars(micros: i64) -> String {
    format!("${:.4} ({micros} micros)", micros as f64 / 1_000_000.0)
}

pub(super) fn random_hex() -> String {
    format!("{:08x}", rand::random::<u32>())
}

impl<'a> Call<'a> {
    /// The process this call runs in: its fleets, record and leases.
    fn process(&self) -> &Process {
        &self.policy.process
    }

    /// The process's settings.
    fn config(&self) -> &Config {
        &self.policy.process.config
    }

    pub(super) fn new(policy: &'a Arc<Policy>, caller: Caller) -> Self {
        caller.progress.redacting(&policy.process.credentials);
        Call {
            policy,
            caller,
            used: OnceLock::new(),
            reached: OnceLock::new(),
            held: std::sync::Mutex::new(Vec::new()),
            claims: std::sync::Mutex::new(Vec::new()),
            owned: Default::default(),
        }
    }

    /// After the handler: a fleet that stopped answering is looked for again next time, the
    /// fleet's own words are added to its error, and a failed call lets go of the names it
    /// claimed.
    pub(super) async fn finish<T>(&self, result: Result<T, ToolError>) -> Result<T, ToolError> {
        let result = self.after(result).await;
        if result.is_err() {
            self.release_claims().await;
        }
        result
    }

    /// The machines the ownership check passed for this call.
    fn owned(&self) -> &owners::owned::KeptOwned {
        &self.owned
    }

    fn claimed(&self, kind: FleetKind, name: &str) {
        if let Ok(mut claims) = self.claims.lock() {
            claims.push((kind, name.to_owned()));
        }
    }

    /// `name` is no longer this call's claim to let go (made, or let go already): whether it
    /// was.
    fn unclaimed(&self, kind: FleetKind, name: &str) -> bool {
        self.claims.lock().is_ok_and(|mut claims| {
            let before = claims.len();
            claims.retain(|(k, n)| !(*k == kind && n == name));
            claims.len() != before
        })
    }

    fn take_claims(&self) -> Vec<(FleetKind, String)> {
        self.claims
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default()
    }

    /// Who owns the machines this call makes: its session, or the process's lease holder.
    fn session(&self) -> &str {
        &self.caller.owner
    }

    /// When an ephemeral machine this call makes goes: with the session, or, for a sessionless
    /// (2026-07-28) HTTP request, when its lease runs out.
    fn ephemeral_end(&self) -> String {
        if self.process().is_lease_session(self.session()) {
            format!(
                "once no call has used it for {} s (the lease of a client without a session)",
                self.config().machine_lease_secs
            )
        } else if self.config().session_end == crate::process::config::SessionEnd::Delete {
            "when this session ends".to_owned()
        } else {
            format!(
                "once it has been kept {} past this session's end (sessionEnd {})",
                crate::process::keep::duration_words(self.config().kept_machine_secs),
                match self.config().session_end {
                    crate::process::config::SessionEnd::Pause => "pause",
                    _ => "stop",
                }
            )
        }
    }

    /// Marks `name` as used by this call until it ends, renewing its lease if it has one. A
    /// machine kept from an earlier session (`sessionEnd`) becomes this session's own.
    async fn hold(&self, name: &str) {
        let newly = match self.held.lock() {
            Ok(mut held) if !held.iter().any(|n| n == name) => {
                held.push(name.to_owned());
                true
            }
            _ => false,
        };
        if newly {
            self.process().take_back(name, self.session()).await;
            self.process().hold(&[name.to_owned()]).await;
        }
    }

    /// After the call: a fleet that stopped answering is looked for again next time, and the
    /// fleet adds to its own error what the agent should know of it.
    async fn after<T>(&self, mut result: Result<T, ToolError>) -> Result<T, ToolError> {
        if let Err(e) = &mut result {
            if e.is(ErrorKind::Transport)
                && let Some(kind) = self.used.get()
            {
                self.process().lost_touch(*kind).await;
            }
            if let (ToolErrorKind::Fleet(kind), Some(fleet)) = (e.kind, self.reached.get()) {
                fleet.explain(kind, &mut e.message);
            }
        }
        result
    }

    /// What the fleet `target` names can do, known without reaching it.
    fn capabilities(&self, target: Option<FleetKind>) -> Result<&'static Capabilities, ToolError> {
        Ok(self.process().capabilities(self.fleet_kind(target)?))
    }

    /// A machine its fleet keeps for its own use (a warm pool's source or ready clone) is
    /// refused by every tool, before the tool sends anything about it: a process run or a file
    /// written in a ready clone would be in the machine the next lease hands out.
    async fn refuse_kept(
        &self,
        target: Option<FleetKind>,
        names: [Option<&str>; 2],
    ) -> Result<(), ToolError> {
        // A target this server does not serve is refused by the tool itself, in its words.
        let Ok(capabilities) = self.capabilities(target) else {
            return Ok(());
        };
        for (argument, name) in ["name", "childName"].into_iter().zip(names) {
            let Some(name) = name else { continue };
            let prefixes = capabilities.kept_name_prefixes;
            if !prefixes.iter().any(|prefix| name.starts_with(prefix)) {
                continue;
            }
            let fleet = self.fleet(target).await?;
            if let Some(why) = self.cancellable(fleet.kept(name)).await? {
                return Err(ToolError::argument(argument, why));
            }
        }
        Ok(())
    }

    /// Refuses a call that could show output or files of a named machine holding a credential
    /// value this process does not know (supplied before the value changed): it could not be
    /// redacted. Stopping, deleting and describing the machine stay open.
    async fn refuse_unknown_values(
        &self,
        tool: Tool,
        target: Option<FleetKind>,
        names: [Option<&str>; 2],
    ) -> Result<(), ToolError> {
        let credentials = &self.process().credentials;
        if matches!(
            tool,
            Tool::StopMachine | Tool::DeleteMachine | Tool::ListMachines
        ) || names.iter().all(Option::is_none)
            || !credentials.has_supplied().await
        {
            return Ok(());
        }
        // A fleet that supplies no values has none of them (a wrong target is refused where the
        // fleet is asked for).
        let Ok(kind) = self.fleet_kind(target) else {
            return Ok(());
        };
        if !self
            .process()
            .capabilities(kind)
            .offers(Feature::Credentials)
        {
            return Ok(());
        }
        // Reaching the fleet names its engine, under which the machines are recorded.
        self.fleet(target).await?;
        for (argument, name) in ["name", "childName"].into_iter().zip(names) {
            let Some(name) = name else {
                continue;
            };
            if let Some(why) = credentials.unknown_value(name).await {
                return Err(ToolError::argument(argument, why));
            }
        }
        Ok(())
    }

    /// The fleet a call goes to: its `target` when both fleets are served, else the one fleet.
    async fn fleet(&self, target: Option<FleetKind>) -> Result<Fleet, ToolError> {
        let kind = self.fleet_kind(target)?;
        let _ = self.used.set(kind);
        let fleet = match self.process().reaching_waits_for(kind) {
            // Only an engine's start takes long enough (more than a second) to be reported.
            Some((what, limit)) => {
                self.caller
                    .progress
                    .during(what, Some(limit), Box::pin(self.process().fleet(kind)))
                    .await?
            }
            None => self.process().fleet(kind).await?,
        };
        let _ = self.reached.set(fleet.clone());
        Ok(fleet)
    }

    /// Which fleet `target` means here, without reaching it.
    fn fleet_kind(&self, target: Option<FleetKind>) -> Result<FleetKind, ToolError> {
        let mode = match self.caller.scope {
            Scope::Chosen(chosen) => {
                return match target {
                    None => Ok(chosen),
                    Some(kind) if kind == chosen => Ok(kind),
                    Some(kind) => Err(ToolError::argument(
                        "target",
                        format!(
                            "{} is not reachable in this session: it was set to the {} fleet \
                             at its first tool call. Leave target out (or give {}); for the \
                             {} fleet, start another session",
                            kind.as_str(),
                            chosen.as_str(),
                            chosen.as_str(),
                            kind.as_str()
                        ),
                    )),
                };
            }
            Scope::Process(mode) => mode,
        };
        match (mode, target) {
            (Mode::Both, Some(kind)) => Ok(kind),
            (Mode::Both, None) => Err(ToolError::argument(
                "target",
                "required: this server reaches both fleets, so every call names local or cloud",
            )),
            (Mode::Single(kind), None) => Ok(kind),
            (Mode::Single(kind), Some(_)) => Err(ToolError::argument(
                "target",
                format!(
                    "not an argument on this server, which serves only the {} fleet",
                    kind.as_str()
                ),
            )),
        }
    }

    /// Runs `work` unless the client cancels first; dropping `work` cancels its HTTP request.
    async fn cancellable<T, E: Into<ToolError>>(
        &self,
        work: impl Future<Output = Result<T, E>>,
    ) -> Result<T, ToolError> {
        tokio::select! {
            result = work => result.map_err(Into::into),
            _ = self.caller.ct.cancelled() => Err(ToolError::cancelled()),
        }
    }

    /// Runs a fleet call the client can cancel, telling it meanwhile what it waits for.
    async fn reported<T: Send, E: Into<ToolError> + Send>(
        &self,
        waiting_for: &str,
        work: impl Future<Output = Result<T, E>> + Send,
    ) -> Result<T, ToolError> {
        let work = self.cancellable(work);
        self.caller
            .progress
            .during(waiting_for, None, Box::pin(work))
            .await
    }

    /// Creates a machine, telling the client what it waits for: the cloud pulls the image at
    /// create (facts 3.4), so this can take a while there.
    async fn create_reported(
        &self,
        fleet: &Fleet,
        spec: &CreateSpec,
        slot: &MachineSlot<'_>,
    ) -> Result<Machine, ToolError> {
        let waiting_for = format!(
            "waiting for the {} fleet to create machine {} from {}",
            fleet.kind().as_str(),
            spec.name,
            spec.image
                .as_deref()
                .unwrap_or("the engine's bundled Alpine root file system")
        );
        let machine = self.reported(&waiting_for, fleet.create(spec)).await?;
        slot.fill(&machine.id);
        if let Err(e) = self.hold_made(fleet, &machine.name, &machine.id).await {
            // Made, but held by no one: gone again rather than left the operator's.
            let _ = self.delete_quietly(fleet, &machine.name, &machine.id).await;
            return Err(e);
        }
        Ok(machine)
    }

    /// A machine of the operator's warm pool that holds what `spec` asks for, leased: `None`
    /// when no pool holds it, none is set up yet, or none has a machine ready (the caller then
    /// makes it cold). Only the local engine keeps pools.
    async fn lease_warm(
        &self,
        fleet: &Fleet,
        spec: &CreateSpec,
        slot: &MachineSlot<'_>,
    ) -> Option<(String, crate::fleet::PoolLease)> {
        if !fleet.capabilities().offers(Feature::WarmPools) {
            return None;
        }
        let pool = self.process().pools.matching(spec)?.clone();
        match self
            .cancellable(fleet.lease(&pool.engine_pool(), &spec.env))
            .await
        {
            Ok(lease) => {
                slot.fill(&lease.machine);
                // The pool's machine becomes this user's (its clone's name is the engine's),
                // and the name claimed for a cold create is not needed.
                if let Err(e) = self.hold_made(fleet, &lease.machine, &lease.machine).await {
                    tracing::warn!(machine = %lease.machine, error = %e.message, "a leased machine could not be held for its user; making one cold");
                    let _ = self
                        .delete_quietly(fleet, &lease.machine, &lease.machine)
                        .await;
                    return None;
                }
                self.release_claim(fleet.kind(), &spec.name).await;
                Some((pool.name, lease))
            }
            Err(e) => {
                tracing::info!(pool = %pool.name, error = %e.message, "no warm machine to lease; making one cold");
                None
            }
        }
    }

    /// Before anything is sent to make the machine `name`: the operator's limits on machines
    /// (this session's that still exist, and the fleet's in all) and, on cloud, on spend.
    /// Refused with the limit, the count and the setting that raises it. Admitted, the machine
    /// holds a slot in both counts until its create answers ([`MachineSlot::fill`]) or fails
    /// (the slot dropped), so that creates sent at once cannot all pass one count.
    async fn admit_machine(&self, fleet: &Fleet, name: &str) -> Result<MachineSlot<'_>, ToolError> {
        let config = self.config();
        let (per_session, in_all) = (config.max_machines_per_session, config.max_machines);
        let kind = fleet.kind();
        // Before the counts: a name another user holds is refused, and this user's limit
        // counts the name once it is theirs.
        self.claim_name(fleet, name).await?;
        let made = &self.process().made;
        let slot = {
            let _turn = self
                .cancellable(async { Ok::<_, ToolError>(made.admission().await) })
                .await?;
            // A create admitted before this one and not yet answered counts, unless the
            // listing already shows its machine.
            let pending = |machines: Option<&Vec<Machine>>, names: Vec<String>| {
                names
                    .iter()
                    .filter(|n| machines.is_none_or(|ms| !ms.iter().any(|m| &m.name == *n)))
                    .count()
            };
            // The fleet is listed only when a limit needs it: for the limit in all, and for
            // this session's only near it (a machine deleted behind the server's back still
            // counts in what the session made until a list shows it gone).
            let mut listed: Option<Vec<Machine>> = None;
            if in_all > 0 {
                let machines = self.cancellable(fleet.list()).await?;
                let held = machines.len()
                    + pending(Some(&machines), made.pending(self.session(), kind).in_all);
                if held >= in_all {
                    return Err(limit(format!(
                        "the {} fleet's machines (existing or being made): {held}; this server \
                         allows {in_all} in all (maxMachines): delete one (delete-machine; \
                         list-machines shows them) first",
                        kind.as_str(),
                    )));
                }
                listed = Some(machines);
            }
            if per_session > 0 {
                let mine = |machines: Option<&Vec<Machine>>| {
                    let existing = made
                        .of(self.session())
                        .machines
                        .iter()
                        .filter(|(k, id)| {
                            *k == kind && machines.is_none_or(|ms| ms.iter().any(|m| m.id == *id))
                        })
                        .count();
                    existing + pending(machines, made.pending(self.session(), kind).of_session)
                };
                let mut count = mine(listed.as_ref());
                if count >= per_session && listed.is_none() {
                    let machines = self.cancellable(fleet.list()).await?;
                    count = mine(Some(&machines));
                }
                if count >= per_session {
                    return Err(limit(format!(
                        "this session's machines (still existing or being made): {count}; \
                         this server allows {per_session} a session (maxMachinesPerSession): \
                         delete one (delete-machine) or reuse one (run-command) first"
                    )));
                }
            }
            made.reserve(self.session(), kind, name)
        };
        self.admit_spend(fleet).await?;
        Ok(slot)
    }

    /// Before a create or a command on cloud: the operator's spend ceilings, per session (what
    /// the cloud machines this session made have cost, by the cloud's usage figures) and per UTC
    /// day (the growth of the account's period cost since the day's first reading).
    async fn admit_spend(&self, fleet: &Fleet) -> Result<(), ToolError> {
        let config = self.config();
        let (per_session, per_day) = (
            config.cloud_spend_per_session_micros,
            config.cloud_spend_per_day_micros,
        );
        self.admit_user_spend(fleet).await?;
        if !fleet.capabilities().metered || (per_session == 0 && per_day == 0) {
            return Ok(());
        }
        if per_session > 0 {
            let made = self.process().made.of(self.session());
            let machines: Vec<&String> = made
                .machines
                .iter()
                .filter(|(kind, _)| *kind == fleet.kind())
                .map(|(_, id)| id)
                .collect();
            let costs = self
                .cancellable(async {
                    Ok::<_, ToolError>(
                        futures::future::join_all(machines.iter().map(|id| fleet.consumption(id)))
                            .await,
                    )
                })
                .await?;
            let mut live: i64 = 0;
            for (id, cost) in machines.iter().zip(costs) {
                match cost {
                    Ok(cost) => live = live.saturating_add(cost.cost_micros.unwrap_or(0)),
                    // Deleted behind the server's back: its bill settled without it.
                    Err(e) if e.kind == crate::fleet::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(spend_unknown(
                            ToolErrorKind::Fleet(e.kind),
                            "cloudSpendPerSessionMicros",
                            format!("the cost of machine {id} could not be read: {}", e.message),
                        ));
                    }
                }
            }
            let spent = live.saturating_add(made.settled_micros);
            if u64::try_from(spent).unwrap_or(0) >= per_session {
                return Err(limit(format!(
                    "the cloud machines this session made have cost {} (the cloud's usage \
                     figures) and this server allows {} a session \
                     (cloudSpendPerSessionMicros): nothing more is made or run on cloud in this \
                     session",
                    dollars(spent),
                    dollars(i64::try_from(per_session).unwrap_or(i64::MAX))
                )));
            }
        }
        if per_day > 0 {
            let account = self.cancellable(fleet.account()).await?;
            let Some(total) = account.period_total_micros else {
                return Err(spend_unknown(
                    ToolErrorKind::Fleet(crate::fleet::ErrorKind::BadResponse),
                    "cloudSpendPerDayMicros",
                    "the cloud account did not report its period cost".to_owned(),
                ));
            };
            let day = chrono::Utc::now().format("%Y-%m-%d").to_string();
            let mark = self
                .policy
                .store
                .spend()
                .day_mark(crate::store::SpendReading {
                    day,
                    period_total_micros: total,
                })
                .await
                .map_err(|e| {
                    spend_unknown(
                        ToolErrorKind::StoreUnavailable,
                        "cloudSpendPerDayMicros",
                        format!(
                            "today's first reading of the account's cost could not be kept: {e}"
                        ),
                    )
                })?;
            // A new billing period started today: the total restarted from zero.
            let spent = if total >= mark { total - mark } else { total };
            if u64::try_from(spent).unwrap_or(0) >= per_day {
                return Err(limit(format!(
                    "the cloud account has spent {} today (UTC, by its period cost) and this \
                     server allows {} a day (cloudSpendPerDayMicros): nothing more is made or \
                     run on cloud until tomorrow (UTC)",
                    dollars(spent),
                    dollars(i64::try_from(per_day).unwrap_or(i64::MAX))
                )));
            }
        }
        Ok(())
    }

    /// Resumes a paused machine, telling the client what it waits for.
    async fn resume_reported(&self, fleet: &Fleet, machine: &str) -> Result<Machine, ToolError> {
        let waiting_for = format!("waiting for paused machine {machine} to resume");
        self.reported(&waiting_for, fleet.resume(machine)).await
    }

    /// Brings a machine up for what comes next: a paused one is resumed, a stopped (or
    /// starting) one waited for until it runs commands. Answers whether the call started or
    /// resumed it (`startedMachine`).
    async fn ensure_running(&self, fleet: &Fleet, machine: &str) -> Result<bool, ToolError> {
        match self.phase(fleet, machine).await? {
            Phase::Running => Ok(false),
            Phase::Paused => {
                self.resume_reported(fleet, machine).await?;
                self.wait_ready(fleet, machine).await?;
                Ok(true)
            }
            other => {
                self.wait_ready(fleet, machine).await?;
                Ok(other.boots_on_use())
            }
        }
    }

    /// Waits until a command runs in the machine: an `echo` of a nonce, once a second, until the
    /// nonce comes back, the machine is gone, the deadline passes, or the client cancels.
    async fn wait_ready(&self, fleet: &Fleet, machine: &str) -> Result<(), ToolError> {
        let limit = Duration::from_secs(self.config().ready_timeout_secs);
        self.caller
            .progress
            .during(
                &format!("waiting for machine {machine} to run commands"),
                Some(limit),
                Box::pin(self.probe_until_ready(fleet, machine)),
            )
            .await
    }

    async fn probe_until_ready(&self, fleet: &Fleet, machine: &str) -> Result<(), ToolError> {
        let nonce = format!("ready-{}", random_hex());
        let limit = self.config().ready_timeout_secs;
        let deadline = Instant::now() + Duration::from_secs(limit);
        // `echo`, not a shell: an image without one still answers. The mark keeps the probe out
        // of the machine's engine log as machine-logs shows it.
        let mut probe = ExecSpec::new(Command::Argv(vec![
            "echo".into(),
            nonce.clone(),
            crate::fleet::internal::MARK.into(),
        ]));
        probe.timeout_secs = Some(READY_PROBE_TIMEOUT_SECS);
        let mut last;
        loop {
            // The probe boots a stopped machine inside the call, so it may take as long as the
            // whole wait (facts 3.7); the wait's own deadline is the one that bounds it.
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_secs(1));
            let attempt = async {
                match tokio::time::timeout(left, fleet.exec(machine, &probe)).await {
                    Ok(answer) => Ok::<_, ToolError>(answer),
                    Err(_) => Ok(Err(crate::fleet::FleetError::new(
                        ErrorKind::Timeout,
                        format!("exec in {machine}"),
                        format!("no answer within {} s", left.as_secs()),
                    ))),
                }
            };
            match self.cancellable(attempt).await? {
                Ok(out) if String::from_utf8_lossy(&out.stdout).contains(&nonce) => return Ok(()),
                Ok(out) => {
                    last = format!(
                        "exit {}, stderr {:?}",
                        out.exit_code,
                        String::from_utf8_lossy(&out.stderr).trim()
                    )
                }
                Err(e) if e.kind == ErrorKind::NotFound => return Err(e.into()),
                Err(e) => last = e.to_string(),
            }
            if Instant::now() >= deadline {
                return Err(ToolError::new(
                    ToolErrorKind::NotReady,
                    format!(
                        "machine {machine} did not run a command within {limit} s (last attempt: {last})"
                    ),
                ));
            }
            self.cancellable(async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok::<_, ToolError>(())
            })
            .await?;
        }
    }

    /// Deletes a machine whatever the client does meanwhile (clean-up is not cancellable), and
    /// forgets it in the ephemeral record once it is gone.
    async fn delete_quietly(&self, fleet: &Fleet, name: &str, id: &str) -> Result<(), ToolError> {
        let kind = fleet.kind();
        match tokio::time::timeout(CLEANUP_DEADLINE, fleet.delete(id)).await {
            Ok(Ok(deleted)) => {
                self.process().forget(kind, name).await;
                self.process().made.deleted(kind, id, deleted.usage_micros);
                self.released(kind, name, deleted.usage_micros).await;
                Ok(())
            }
            Ok(Err(e)) if e.kind == ErrorKind::NotFound => {
                self.process().forget(kind, name).await;
                Ok(())
            }
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(ToolError::new(
                ToolErrorKind::Fleet(ErrorKind::Timeout),
                format!(
                    "deleting {name} took longer than {} s",
                    CLEANUP_DEADLINE.as_secs()
                ),
            )),
        }
    }

    /// What the machine's state means for the next operation: a stopped (or failed) one is
    /// booted by it, which the result reports as `startedMachine`; a suspended or unreachable
    /// one is not booted, but is not running commands either.
    /// What the machine's state leaves for a command, read or write; a base is refused here,
    /// at once, rather than after the engine's probe and a wait for readiness that never ends.
    async fn phase(&self, fleet: &Fleet, machine: &str) -> Result<Phase, ToolError> {
        Ok(self.machine_to_run_in(fleet, machine).await?.phase())
    }

    /// The machine a command, file or terminal is for, read from the fleet; a base is refused
    /// (the one place that refusal is decided).
    async fn machine_to_run_in(&self, fleet: &Fleet, machine: &str) -> Result<Machine, ToolError> {
        let m = self.cancellable(fleet.get(machine)).await?;
        if m.phase() == Phase::Frozen {
            return Err(base_runs_nothing(machine));
        }
        Ok(m)
    }
}

/// The refusal of a command, file or terminal in a base (a frozen branch source).
pub fn base_runs_nothing(machine: &str) -> ToolError {
    ToolError::new(
        ToolErrorKind::Fleet(ErrorKind::Conflict),
        format!(
            "{machine} is a base (frozen by branch-machine freezeSource): it runs nothing more, \
             so commands, files and terminals are refused. branch-machine {machine} makes \
             children that run, each starting from the base as it was frozen; delete-machine \
             removes the base once its children are gone"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ephemeral_machine_goes_with_its_session_or_its_lease() {
        let runtime = std::env::temp_dir().join(format!("smol-mcp-call-test-{}", random_hex()));
        let mut vars = std::collections::BTreeMap::new();
        vars.insert(
            "SMOL_MCP_RUNTIME_DIR".to_owned(),
            runtime.display().to_string(),
        );
        vars.insert("SMOL_MCP_MACHINE_LEASE_SECS".to_owned(), "77".to_owned());
        let config = crate::process::config::Config::from_sources(
            &vars,
            std::path::Path::new("/nonexistent"),
        )
        .unwrap();
        let policy = Policy::start(config).unwrap();
        let scope = Scope::Process(policy.process.mode);
        let in_session = Call::new(
            &policy,
            Caller::new("a-session", scope, CancellationToken::new()),
        );
        assert_eq!(in_session.ephemeral_end(), "when this session ends");
        let leased = Call::new(
            &policy,
            Caller::new(
                policy.process.lease_session(),
                scope,
                CancellationToken::new(),
            ),
        );
        let end = leased.ephemeral_end();
        assert!(end.contains("77 s") && end.contains("lease"), "{end}");
        let _ = std::fs::remove_dir_all(runtime);
    }
}
