//! Each signed-in user's own machines. With OAuth sign-in (`authIssuer`) a machine a user made
//! is held by that user in the store (`crate::store::OwnerRepository`), and every tool call
//! naming a machine is checked against it before anything is sent: another user's machine
//! answers as a machine that does not exist would, and the attempt is logged. A machine no user
//! holds is the operator's (stdio, the static token), which is what every machine made before
//! sign-in is. Without sign-in nothing is checked and nothing is written: one user, no cost.
//!
//! Names are one namespace per fleet (the engine's): a name another user holds is refused as
//! taken, without saying whose.

pub(super) mod owned;
pub use owned::Owned;

use super::Call;
use crate::fleet::{ErrorKind, Fleet, FleetKind, Machine};
use crate::policy::Policy;
use crate::policy::error::{ToolError, ToolErrorKind, quote};
use crate::policy::tools::{Tool, grammar};
use crate::policy::user::User;
use crate::store::{HeldName, Hold, MachineClaim, StoreUnavailable};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;

fn store_error(e: StoreUnavailable) -> ToolError {
    ToolError::new(
        ToolErrorKind::StoreUnavailable,
        format!("which user holds the machine cannot be read: {e}"),
    )
}

/// A machine a call's arguments name to act on, which should exist (its name, or on the cloud
/// its `mach-` id), as the client gave it. No handler can read it (its words are private to
/// this module): the ownership check ([`Call::check_owner`], which the dispatch runs before
/// any handler) turns it into an [`Owned`], and [`Call::machine`] hands a handler only that.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineRef(String);

impl<'de> Deserialize<'de> for MachineRef {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        grammar::machine_ref("name", &name).map_err(|refused| grammar::refusal("name", refused))?;
        Ok(MachineRef(name))
    }
}

impl JsonSchema for MachineRef {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("MachineRef")
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string"})
    }
}

/// A machine a call's arguments name: one to act on, which the ownership check opens before
/// the tool runs, or the new name of one the tool makes (claimed when it is made).
#[derive(Debug, Clone, Copy)]
pub enum Named<'a> {
    Existing(&'a MachineRef),
    New(&'a str),
}

/// The answer to a name this user may not see: the words of a machine that does not exist.
fn not_found(argument: &str, name: &str, kind: FleetKind) -> ToolError {
    ToolError::new(
        ToolErrorKind::Fleet(ErrorKind::NotFound),
        format!(
            "{argument}: no machine {} on the {} fleet (list-machines gives the names)",
            quote(name),
            kind.as_str()
        ),
    )
}

/// Whether `user` may see machine `name`: they hold it, or (the operator) no user does; with
/// sign-in off, every machine.
pub async fn user_sees(
    policy: &Policy,
    user: &User,
    kind: FleetKind,
    name: &str,
) -> Result<bool, ToolError> {
    if policy.process.config.auth_issuer.is_empty() {
        return Ok(true);
    }
    let holder = policy
        .store
        .owners()
        .holder(kind, name)
        .await
        .map_err(store_error)?;
    Ok(holder.as_deref().unwrap_or("") == user.id())
}

/// The machines of a listing `user` may see: those made for them, or (the operator) those
/// made for no user; with sign-in off, all. A listing, a completion and a resource show no
/// other.
pub async fn users_machines(
    policy: &Policy,
    user: &User,
    kind: FleetKind,
    machines: Vec<Machine>,
) -> Result<Vec<Machine>, ToolError> {
    if policy.process.config.auth_issuer.is_empty() {
        return Ok(machines);
    }
    let held: std::collections::HashMap<String, String> = policy
        .store
        .owners()
        .held(kind)
        .await
        .map_err(store_error)?
        .into_iter()
        .collect();
    Ok(machines
        .into_iter()
        .filter(|m| held.get(&m.name).map_or("", String::as_str) == user.id())
        .collect())
}

impl Call<'_> {
    /// Whether this server keeps its users apart (sign-in is on).
    pub(super) fn users_apart(&self) -> bool {
        !self.config().auth_issuer.is_empty()
    }

    pub(super) async fn sees(&self, kind: FleetKind, name: &str) -> Result<bool, ToolError> {
        user_sees(self.policy, &self.caller.user, kind, name).await
    }

    /// Before the handler: the machines the arguments name pass the ownership check (or the
    /// call ends here: no lease renewed, nothing sent about them), are held for the call, and
    /// are refused if the fleet keeps them or they hold a credential value this process cannot
    /// redact.
    pub(in crate::policy::tools) async fn admit(
        &self,
        tool: Tool,
        target: Option<FleetKind>,
        named: [Option<Named<'_>>; 2],
    ) -> Result<(), ToolError> {
        let mut names: [Option<String>; 2] = [None, None];
        for (slot, named) in names.iter_mut().zip(named) {
            *slot = match named {
                Some(Named::Existing(machine)) => {
                    Some(self.check_owner(tool, target, machine).await?.to_string())
                }
                Some(Named::New(name)) => Some(name.to_owned()),
                None => None,
            };
        }
        let [name, child] = [names[0].as_deref(), names[1].as_deref()];
        // Every machine the call names: its lease is renewed and the reaper waits for the call.
        for held in [name, child].into_iter().flatten() {
            self.hold(held).await;
        }
        self.refuse_kept(target, [name, child]).await?;
        self.refuse_unknown_values(tool, target, [name, child])
            .await
    }

    /// The ownership check of the machine a call names to act on, before the tool sends
    /// anything: another user's machine (or, for the operator, a user's) answers as one that
    /// does not exist, and the attempt is logged. What passes is kept by the call for its
    /// handler ([`Call::machine`]). A new name is claimed when the tool makes it
    /// ([`Call::claim_name`]), not here.
    pub(super) async fn check_owner(
        &self,
        tool: Tool,
        target: Option<FleetKind>,
        named: &MachineRef,
    ) -> Result<Owned, ToolError> {
        let name = named.0.as_str();
        // Before the check: a refused call's span names what it tried (the grammar allows no
        // character that could break a log line).
        if name.len() <= grammar::MAX_NAME_LEN {
            tracing::Span::current().record("machine", name);
        }
        // A target this server does not serve is refused by the tool itself, in its words,
        // before it could reach any machine.
        let checked = match self.fleet_kind(target) {
            Ok(kind) if self.users_apart() => Some(kind),
            _ => None,
        };
        if let Some(kind) = checked
            && !self.sees(kind, name).await?
        {
            tracing::warn!(
                user = %self.caller.user,
                tool = tool.name(),
                machine = %name,
                "refused a call on a machine this user does not hold"
            );
            return Err(not_found("name", name, kind));
        }
        let owned = Owned::passed(name);
        self.owned().keep(owned.clone());
        Ok(owned)
    }

    /// The machine `named`, for the handler: the ownership check passed it for this call.
    /// Anything else is the server's own mistake (a tool whose machine the dispatch did not
    /// check), refused rather than acted on.
    pub(super) fn machine(&self, named: &MachineRef) -> Result<Owned, ToolError> {
        self.owned().named(&named.0).ok_or_else(|| {
            ToolError::new(
                ToolErrorKind::Internal,
                format!(
                    "machine {} was not checked for this user before the tool ran",
                    quote(&named.0)
                ),
            )
        })
    }

    /// Claims `name` for this call's user before it is made (a signed-in user only: the
    /// operator's machines are the unheld ones), and counts it against their limit
    /// (`maxMachinesPerUser`) with every other name they hold or are making, in any process.
    /// Refused when another holds it, or past the limit. A claim in the making gives no call
    /// the machine until [`Call::hold_made`], and is let go if the call fails
    /// ([`Call::release_claims`]).
    pub(super) async fn claim_name(&self, fleet: &Fleet, name: &str) -> Result<(), ToolError> {
        if !self.users_apart() {
            return Ok(());
        }
        let kind = fleet.kind();
        let owners = self.policy.store.owners();
        let user = self.caller.user.id();
        if user.is_empty() {
            // The operator holds by not holding: a name a user's machine has is taken. One
            // being made is raced for at the fleet, which answers the loser "already exists".
            return match owners.holder(kind, name).await.map_err(store_error)? {
                Some(_) => Err(taken(name)),
                None => Ok(()),
            };
        }
        let pending_after = chrono::Utc::now().timestamp_millis() - crate::policy::HELD_AT_LEAST_MS;
        match owners
            .claim(Hold::new(kind, name, user), pending_after)
            .await
            .map_err(store_error)?
        {
            MachineClaim::Claimed { theirs } => {
                self.claimed(kind, name);
                self.within_user_limit(fleet, &theirs).await
            }
            MachineClaim::Held(holder) if holder == user => Ok(()),
            MachineClaim::Held(_) => {
                tracing::warn!(user = %self.caller.user, machine = %name, "refused a name another user holds");
                Err(taken(name))
            }
        }
    }

    /// The fleet made `machine` for this call: a signed-in user holds it from now on (on a
    /// fleet whose machines answer to an id of their own as well, by either word), and it is
    /// no longer this call's to let go if the call fails later. An error means the machine is
    /// no one's: the caller deletes it.
    pub(super) async fn hold_made(
        &self,
        fleet: &Fleet,
        name: &str,
        id: &str,
    ) -> Result<(), ToolError> {
        if !self.users_apart() || self.caller.user.is_operator() {
            return Ok(());
        }
        let (kind, user) = (fleet.kind(), self.caller.user.id());
        let owners = self.policy.store.owners();
        let hold = Hold::new(kind, name, user);
        owners.made(hold.clone()).await.map_err(store_error)?;
        self.unclaimed(kind, name);
        if fleet.capabilities().ids_apart_from_names && id != name {
            owners.alias(id, hold).await.map_err(store_error)?;
        }
        Ok(())
    }

    /// Lets go of one name this call claimed and will not make (a warm machine came instead).
    pub(super) async fn release_claim(&self, kind: FleetKind, name: &str) {
        if !self.unclaimed(kind, name) {
            return;
        }
        if let Err(e) = self
            .policy
            .store
            .owners()
            .release(Hold::new(kind, name, self.caller.user.id()))
            .await
        {
            tracing::warn!(machine = %name, error = %e, "could not let go of a machine's name");
        }
    }

    /// Lets go of the names this call claimed: it failed, and what it claimed them for was not
    /// made (or was deleted by its own clean-up).
    pub(super) async fn release_claims(&self) {
        for (kind, name) in self.take_claims() {
            if let Err(e) = self
                .policy
                .store
                .owners()
                .release(Hold::new(kind, name.as_str(), self.caller.user.id()))
                .await
            {
                tracing::warn!(machine = %name, error = %e, "could not let go of a machine's name");
            }
        }
    }

    /// After a delete: the name is free again, and on a metered fleet what the machine cost is
    /// added to its user's day.
    pub(super) async fn released(&self, kind: FleetKind, name: &str, cost_micros: Option<i64>) {
        if !self.users_apart() || self.caller.user.is_operator() {
            return;
        }
        let owners = self.policy.store.owners();
        let user = self.caller.user.id();
        if let Err(e) = owners.release(Hold::new(kind, name, user)).await {
            tracing::warn!(machine = %name, error = %e, "could not let go of a deleted machine's name");
        }
        if let Some(cost) = cost_micros.filter(|c| *c > 0)
            && let Err(e) = owners.settle(user, &today(), cost).await
        {
            tracing::warn!(machine = %name, error = %e, "could not record what a deleted machine cost its user");
        }
    }

    /// The machines of a listing this call's user may see.
    pub(super) async fn only_theirs(
        &self,
        kind: FleetKind,
        machines: Vec<Machine>,
    ) -> Result<Vec<Machine>, ToolError> {
        users_machines(self.policy, &self.caller.user, kind, machines).await
    }

    /// A signed-in user's limit (`maxMachinesPerUser`), over `theirs`: every name they held
    /// when this call's claim was taken, the claim included, made or being made by any call
    /// in any process. Names held for machines deleted behind the server's back do not count.
    async fn within_user_limit(&self, fleet: &Fleet, theirs: &[HeldName]) -> Result<(), ToolError> {
        let limit = self.config().max_machines_per_user;
        if limit == 0 || theirs.len() <= limit {
            return Ok(());
        }
        let existing = self.cancellable(fleet.list()).await?;
        let counted = theirs
            .iter()
            .filter(|held| !held.made || existing.iter().any(|m| m.name == held.name))
            .count();
        if counted <= limit {
            return Ok(());
        }
        Err(ToolError::new(
            ToolErrorKind::LimitReached,
            format!(
                "your machines on the {} fleet (existing or being made): {}; this server \
                 allows {limit} a user (maxMachinesPerUser): delete one (delete-machine) \
                 or reuse one (run-command) first",
                fleet.kind().as_str(),
                counted - 1
            ),
        ))
    }

    /// Before a create or a command on a metered fleet: what the signed-in user's machines
    /// cost today (those that exist, by the cloud's usage figures, and those deleted this UTC
    /// day), against `cloudSpendPerUserMicros`.
    pub(super) async fn admit_user_spend(&self, fleet: &Fleet) -> Result<(), ToolError> {
        let limit = self.config().cloud_spend_per_user_micros;
        if limit == 0
            || !fleet.capabilities().metered
            || !self.users_apart()
            || self.caller.user.is_operator()
        {
            return Ok(());
        }
        let user = self.caller.user.id();
        let owners = self.policy.store.owners();
        let held = owners.held(fleet.kind()).await.map_err(store_error)?;
        let existing = self.cancellable(fleet.list()).await?;
        let theirs: Vec<&Machine> = existing
            .iter()
            .filter(|m| held.iter().any(|(n, u)| *n == m.name && u == user))
            .collect();
        let costs =
            futures::future::join_all(theirs.iter().map(|m| fleet.consumption(&m.id))).await;
        let mut spent = owners.settled(user, &today()).await.map_err(store_error)?;
        for (machine, cost) in theirs.iter().zip(costs) {
            match cost {
                Ok(cost) => spent = spent.saturating_add(cost.cost_micros.unwrap_or(0)),
                Err(e) if e.kind == ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(ToolError::new(
                        ToolErrorKind::Fleet(e.kind),
                        format!(
                            "cloudSpendPerUserMicros: the cost of machine {} could not be read, \
                             so the ceiling cannot be checked: {}",
                            machine.name, e.message
                        ),
                    ));
                }
            }
        }
        if u64::try_from(spent).unwrap_or(0) >= limit {
            return Err(ToolError::new(
                ToolErrorKind::LimitReached,
                format!(
                    "your cloud machines have cost {} today (those that exist, since made; those \
                     deleted today) and this server allows {} a user a day \
                     (cloudSpendPerUserMicros): nothing more is made or run on cloud for you \
                     until tomorrow (UTC)",
                    super::dollars(spent),
                    super::dollars(i64::try_from(limit).unwrap_or(i64::MAX))
                ),
            ));
        }
        Ok(())
    }
}

fn taken(name: &str) -> ToolError {
    ToolError::argument(
        "name",
        format!(
            "{} is taken on this fleet: choose another name, or leave name out for a temporary machine",
            quote(name)
        ),
    )
}

fn today() -> String {
    chrono::Utc::now().format("%Y-%m-%d").to_string()
}
