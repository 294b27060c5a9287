//! The parts of a tool call a handler asks for, by naming their types in its signature (as rmcp
//! hands a tool `Parameters<T>` and whatever else it names through `FromContextPart`). The run
//! table gives each handler the parts its first parameter names and its typed arguments:
//!
//! ```text
//! async fn machine_logs(
//!     (machines, fleets, cancel, config): (Ownership<'_>, Fleets<'_>, Cancel<'_>, &Config),
//!     a: args::LogsArgs,
//! ) -> Result<results::Logs, ToolError>
//! ```
//!
//! A handler holds nothing else: `Call`'s fields and methods are private to `call`, and only
//! this module makes parts, so what a tool touches is what its signature says. A helper asks
//! its caller for the parts it uses in the same way.

use super::{Call, owners};
use crate::fleet::{
    Capabilities, CreateSpec, Fleet, FleetKind, Machine, Phase, PoolLease, PulledImage,
};
use crate::policy::consent::{Board, Consent, PriorAnswer, Questions, ViewSeal};
use crate::policy::error::ToolError;
use crate::policy::jobs::{Job, SessionHoldRef, Start, StartError};
use crate::policy::ledger::Ledger;
use crate::policy::progress::Progress;
use crate::policy::reads::ParkedReads;
use crate::policy::terminals::Terminals;
use crate::policy::user::User;
use crate::process::bases::{BaseRefused, PendingBase};
use crate::process::config::Config;
use crate::process::credentials::Supplier;
use crate::process::ephemeral::RecordError;
use crate::process::made::{MachineSlot, MadeBySession};
use crate::process::workspaces::Workspaces;
use crate::store::Store;
use std::future::Future;
use std::sync::Arc;

mod sealed {
    /// Parts are made here only: a type elsewhere cannot become one and so get at the call.
    pub trait Sealed {}
}

/// A part of a tool call that a handler receives by naming its type.
pub trait Part<'c>: sealed::Sealed + Sized {
    fn of(call: &'c Call<'c>) -> Self;
}

/// A handler that names several parts names them as a tuple.
macro_rules! tuple_parts {
    ($($part:ident),+) => {
        impl<$($part: sealed::Sealed),+> sealed::Sealed for ($($part,)+) {}
        impl<'c, $($part: Part<'c>),+> Part<'c> for ($($part,)+) {
            fn of(call: &'c Call<'c>) -> Self {
                ($($part::of(call),)+)
            }
        }
    };
}
tuple_parts!(A);
tuple_parts!(A, B);
tuple_parts!(A, B, C);
tuple_parts!(A, B, C, D);
tuple_parts!(A, B, C, D, E);
tuple_parts!(A, B, C, D, E, F);
tuple_parts!(A, B, C, D, E, F, G);
tuple_parts!(A, B, C, D, E, F, G, H);

/// Parts that are a piece of the process or the policy as it is, read-only or with their own
/// locks: the settings, the user, the progress channel, the run ledger, ...
macro_rules! plain_parts {
    ($($part:ty => |$call:ident| $get:expr;)+) => {
        $(
            impl sealed::Sealed for &$part {}
            impl<'c> Part<'c> for &'c $part {
                fn of($call: &'c Call<'c>) -> Self {
                    $get
                }
            }
        )+
    };
}
plain_parts! {
    // The process's settings.
    Config => |call| call.config();
    // Who the call is made for: the machines, runs and jobs it may see are theirs.
    User => |call| &call.caller.user;
    // Where the call's waits and streamed output are reported (a progress token).
    Progress => |call| &call.caller.progress;
    // Every command run, recorded in the store.
    Ledger => |call| &call.policy.ledger;
    // read-file downloads paused between pages.
    ParkedReads => |call| &call.policy.reads;
    // The programs behind a PTY that agents drive.
    Terminals => |call| &call.policy.terminals;
    // The user's answers about egress and the questions open.
    Questions => |call| &call.policy.questions;
    // The questions put to a view for its person to answer.
    Board => |call| &call.policy.board;
    // The credential bindings and the values they are supplied (and redacted by).
    Supplier => |call| &call.policy.process.credentials;
    // Which machines have a workspace, and the server's copies of them.
    Arc<Workspaces> => |call| &call.policy.process.workspaces;
    // What outlives a call (runs, jobs, grants): a handler naming it writes or reads records.
    dyn Store => |call| &*call.policy.store;
}

/// Declares a part that is a view of the call: a copyable handle whose methods are the part.
macro_rules! view_part {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub struct $name<'c> {
            call: &'c Call<'c>,
        }
        impl sealed::Sealed for $name<'_> {}
        impl<'c> Part<'c> for $name<'c> {
            fn of(call: &'c Call<'c>) -> Self {
                $name { call }
            }
        }
    };
}

view_part!(
    /// The fleet a call goes to, by its `target`, and what that fleet can do.
    Fleets
);

impl<'c> Fleets<'c> {
    /// The fleet `target` names, reached (the local engine started if need be, the wait
    /// reported).
    pub async fn reach(&self, target: Option<FleetKind>) -> Result<Fleet, ToolError> {
        self.call.fleet(target).await
    }

    /// Which fleet `target` means here, without reaching it.
    pub fn kind(&self, target: Option<FleetKind>) -> Result<FleetKind, ToolError> {
        self.call.fleet_kind(target)
    }

    /// What the fleet `target` names can do, known without reaching it.
    pub fn capabilities(
        &self,
        target: Option<FleetKind>,
    ) -> Result<&'static Capabilities, ToolError> {
        self.call.capabilities(target)
    }

    /// What a fleet of `kind` can do.
    pub fn capabilities_of(&self, kind: FleetKind) -> &'static Capabilities {
        self.call.process().capabilities(kind)
    }

    /// The engine the machines of `kind` are recorded under.
    pub fn engine(&self, kind: FleetKind) -> String {
        self.call.process().engine(kind)
    }
}

view_part!(
    /// The client's cancellation of the call.
    Cancel
);

impl Cancel<'_> {
    /// Runs `work` unless the client cancels first; dropping `work` cancels its HTTP request.
    pub async fn run<T, E: Into<ToolError>>(
        &self,
        work: impl Future<Output = Result<T, E>>,
    ) -> Result<T, ToolError> {
        self.call.cancellable(work).await
    }
}

view_part!(
    /// Whose machines a call may act on: the machines its arguments name, as the ownership
    /// check passed them, and the listings its user may see.
    Ownership
);

impl Ownership<'_> {
    /// The machine `named`: the ownership check passed it for this call before the handler
    /// ran.
    pub fn machine(&self, named: &owners::MachineRef) -> Result<owners::Owned, ToolError> {
        self.call.machine(named)
    }

    /// The machines of a listing this call's user may see.
    pub async fn only_theirs(
        &self,
        kind: FleetKind,
        machines: Vec<Machine>,
    ) -> Result<Vec<Machine>, ToolError> {
        self.call.only_theirs(kind, machines).await
    }

    /// Whether this server keeps its users apart (sign-in is on).
    pub fn users_apart(&self) -> bool {
        self.call.users_apart()
    }
}

view_part!(
    /// Bringing a machine up for what comes next, each wait reported to the client and ended
    /// by its cancellation.
    Waits
);

impl Waits<'_> {
    /// A paused machine resumed, a stopped one waited for until it runs commands: whether the
    /// call started or resumed it (`startedMachine`).
    pub async fn ensure_running(&self, fleet: &Fleet, machine: &str) -> Result<bool, ToolError> {
        self.call.ensure_running(fleet, machine).await
    }

    /// Until a command runs in the machine, or the readiness deadline.
    pub async fn wait_ready(&self, fleet: &Fleet, machine: &str) -> Result<(), ToolError> {
        self.call.wait_ready(fleet, machine).await
    }

    /// Starts a machine, telling the client what it waits for: on the local fleet the first
    /// start pulls the image and boots the guest (docs/tools.md: Egress), which can take minutes.
    pub async fn start_reported(
        &self,
        fleet: &Fleet,
        machine: &str,
        branchable: Option<bool>,
        image: Option<&str>,
    ) -> Result<Machine, ToolError> {
        let waiting_for = match image {
            Some(image) => format!(
                "waiting for machine {machine} to start (pulling {image} if not cached, then booting)"
            ),
            None => format!("waiting for machine {machine} to start"),
        };
        self.call
            .reported(&waiting_for, fleet.start(machine, branchable))
            .await
    }

    pub async fn resume_reported(
        &self,
        fleet: &Fleet,
        machine: &str,
    ) -> Result<Machine, ToolError> {
        self.call.resume_reported(fleet, machine).await
    }

    /// Pulls an image into a machine's cache, telling the client how long it has waited.
    pub async fn pull_reported(
        &self,
        fleet: &Fleet,
        machine: &str,
        image: &str,
    ) -> Result<PulledImage, ToolError> {
        let waiting_for = format!("waiting for {image} to be pulled into machine {machine}");
        self.call
            .reported(&waiting_for, fleet.pull_image(machine, image))
            .await
    }

    /// The machine a command, file or terminal is for, read from the fleet; a base refused.
    pub async fn machine_to_run_in(
        &self,
        fleet: &Fleet,
        machine: &str,
    ) -> Result<Machine, ToolError> {
        self.call.machine_to_run_in(fleet, machine).await
    }

    /// What the machine's state leaves for a command; a base refused.
    pub async fn phase(&self, fleet: &Fleet, machine: &str) -> Result<Phase, ToolError> {
        self.call.phase(fleet, machine).await
    }
}

view_part!(
    /// Making and deleting machines: the operator's limits and spend ceilings, the user's
    /// claim on a name, warm pools, and the create itself.
    Making
);

impl<'c> Making<'c> {
    /// The limits on machines (and on cloud, on spend) before `name` is made; the slot holds
    /// its place in the counts until its create answers.
    pub async fn admit_machine(
        &self,
        fleet: &Fleet,
        name: &str,
    ) -> Result<MachineSlot<'c>, ToolError> {
        self.call.admit_machine(fleet, name).await
    }

    /// The spend ceilings before a create or a command on a metered fleet.
    pub async fn admit_spend(&self, fleet: &Fleet) -> Result<(), ToolError> {
        self.call.admit_spend(fleet).await
    }

    pub async fn lease_warm(
        &self,
        fleet: &Fleet,
        spec: &CreateSpec,
        slot: &MachineSlot<'_>,
    ) -> Option<(String, PoolLease)> {
        self.call.lease_warm(fleet, spec, slot).await
    }

    pub async fn create_reported(
        &self,
        fleet: &Fleet,
        spec: &CreateSpec,
        slot: &MachineSlot<'_>,
    ) -> Result<Machine, ToolError> {
        self.call.create_reported(fleet, spec, slot).await
    }

    /// The fleet made `machine` for this call: its user holds it from now on.
    pub async fn hold_made(&self, fleet: &Fleet, name: &str, id: &str) -> Result<(), ToolError> {
        self.call.hold_made(fleet, name, id).await
    }

    /// Deletes a machine whatever the client does meanwhile, and forgets it.
    pub async fn delete_quietly(
        &self,
        fleet: &Fleet,
        name: &str,
        id: &str,
    ) -> Result<(), ToolError> {
        self.call.delete_quietly(fleet, name, id).await
    }

    /// After a delete: the name is free again, and what the machine cost is its user's.
    pub async fn released(&self, kind: FleetKind, name: &str, cost_micros: Option<i64>) {
        self.call.released(kind, name, cost_micros).await
    }
}

view_part!(
    /// What the process records of the machines calls make: the ephemeral record a session's
    /// end cleans up, the machines each session made, and the bases.
    Records
);

impl<'c> Records<'c> {
    /// Records `name` as this session's before its create is sent: whether it was known.
    pub async fn remember(
        &self,
        kind: FleetKind,
        name: &str,
        parent: Option<&str>,
    ) -> Result<bool, RecordError> {
        let session = self.call.session();
        self.call
            .process()
            .remember(kind, name, session, parent)
            .await
    }

    pub async fn remember_created(&self, kind: FleetKind, name: &str, id: &str) {
        let session = self.call.session();
        self.call
            .process()
            .remember_created(kind, name, id, session)
            .await
    }

    pub async fn forget(&self, kind: FleetKind, name_or_id: &str) {
        self.call.process().forget(kind, name_or_id).await
    }

    /// The machines each session made (what the limits per session count).
    pub fn made(&self) -> &'c MadeBySession {
        &self.call.policy.process.made
    }

    pub async fn bases(
        &self,
        kind: FleetKind,
    ) -> Vec<(String, String, crate::process::bases::BaseInfo)> {
        self.call.process().bases(kind).await
    }

    pub async fn base_to_be_made(
        &self,
        kind: FleetKind,
        name: &str,
        id: &str,
        made_from: String,
    ) -> Result<PendingBase, BaseRefused> {
        let user = self.call.caller.user.id();
        self.call
            .process()
            .base_to_be_made(kind, name, id, user, made_from)
            .await
    }

    pub async fn base_not_made(&self, pending: PendingBase) {
        self.call.process().base_not_made(pending).await
    }

    pub async fn base_branched(&self, kind: FleetKind, name: &str) {
        self.call.process().base_branched(kind, name).await
    }
}

view_part!(
    /// The session the call is made in: who owns the machines it makes, and the machines it
    /// holds while it runs.
    Session
);

impl Session<'_> {
    /// Who owns the machines this call makes: its session, or the process's lease holder.
    pub fn id(&self) -> &str {
        self.call.session()
    }

    /// Marks `name` as used by this call until it ends (the lease reaper leaves it alone).
    pub async fn hold(&self, name: &str) {
        self.call.hold(name).await
    }

    /// When an ephemeral machine this call makes goes, in words.
    pub fn ephemeral_end(&self) -> String {
        self.call.ephemeral_end()
    }

    /// Keeps the session open while a job it starts runs (HTTP sessions only).
    pub fn keep_open(&self) -> Option<SessionHoldRef> {
        self.call.caller.session_hold.clone()
    }
}

view_part!(
    /// Background jobs: this process's and, with a shared store, those its siblings watch.
    JobTable
);

impl JobTable<'_> {
    /// Takes over the jobs processes that ended left running (once).
    pub async fn adopt(&self) {
        self.call.policy.adopt_jobs().await;
    }

    /// The job `id` this process watches, or one another process sharing the store does.
    pub async fn find(&self, id: &str) -> Result<Option<Arc<Job>>, ToolError> {
        let policy = self.call.policy;
        match policy.jobs.get(id) {
            Some(job) => Ok(Some(job)),
            None => {
                policy
                    .jobs
                    .of_another(&policy.process, &policy.ledger, id)
                    .await
            }
        }
    }

    /// Every job this process and the processes sharing its store watch.
    pub async fn all(&self) -> Vec<Arc<Job>> {
        let policy = self.call.policy;
        let mut jobs = policy.jobs.list();
        jobs.extend(policy.jobs.of_others(&policy.process, &policy.ledger).await);
        jobs
    }

    /// The jobs this process watches.
    pub fn here(&self) -> Vec<Arc<Job>> {
        self.call.policy.jobs.list()
    }

    pub async fn start(&self, start: Start<'_>) -> Result<Arc<Job>, StartError> {
        let policy = self.call.policy;
        policy
            .jobs
            .start(&policy.process, &policy.ledger, start)
            .await
    }

    /// The jobs in `machine` end before it stops.
    pub async fn machine_stopping(&self, kind: FleetKind, machine: &str) {
        self.call.policy.jobs.machine_stopping(kind, machine).await
    }
}

view_part!(
    /// Who can answer for the user when a machine asks about its egress: a client that shows
    /// a form, or this server's views.
    Asking
);

impl<'c> Asking<'c> {
    pub fn consent(&self) -> Option<&'c Arc<dyn Consent>> {
        self.call.caller.consent.as_ref()
    }

    /// The user's answer carried by a call made again after its input-required result.
    pub fn prior_answer(&self) -> Option<&'c PriorAnswer> {
        self.call.caller.prior_answer.as_ref()
    }

    /// Present when the client shows this server's views (MCP Apps).
    pub fn views(&self) -> Option<Arc<dyn ViewSeal>> {
        self.call.caller.views.clone()
    }
}
