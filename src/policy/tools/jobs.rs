//! The tools around background jobs (`crate::policy::jobs`): starting one from run-command, reading
//! its output by cursor, cancelling it, listing them.

use super::args;
use super::call::parts::{Cancel, Fleets, JobTable, Ownership, Session, Waits};
use super::results::{JobFiles, JobList, JobOutputAnswer, JobReport, JobStarted, JobSummary};
use crate::fleet::{ErrorKind, FleetKind};
use crate::policy::error::{ToolError, ToolErrorKind};
use crate::policy::jobs::{Cursor, Job, Phase, Start, StartError};
use crate::policy::progress::Progress;
use crate::policy::user::User;
use crate::process::config::Config;
use crate::process::credentials::Supplier;
use crate::store::Store;
use std::sync::Arc;
use std::time::Duration;

/// Which jobs a call may name: its user's, on the fleet its target names.
type Theirs<'c> = (Fleets<'c>, JobTable<'c>, &'c User);

/// How much of the command a listing shows.
const COMMAND_SHOWN_CHARS: usize = 200;

/// What starting a job takes of the call.
pub(super) type Starting<'c> = (
    Ownership<'c>,
    Fleets<'c>,
    Waits<'c>,
    JobTable<'c>,
    Session<'c>,
    &'c User,
    &'c Config,
);

pub(super) async fn start(
    (machines, fleets, waits, jobs, session, user, config): Starting<'_>,
    a: &args::RunCommandArgs,
    spec: crate::fleet::ExecSpec,
) -> Result<JobStarted, ToolError> {
    let named = machines.machine(&a.name)?;
    let fleet = fleets.reach(a.target).await?;
    let machine = waits.machine_to_run_in(&fleet, &named).await?;
    let paused = machine.phase() == crate::fleet::Phase::Paused;
    if paused {
        waits.resume_reported(&fleet, &named).await?;
    }
    let started_machine = paused || machine.phase().boots_on_use();
    let timeout_secs = spec.timeout_secs.unwrap_or(config.max_job_secs);
    let start = Start {
        user,
        fleet,
        machine: &named,
        spec,
        timeout: Duration::from_secs(timeout_secs),
        session: session.keep_open(),
        // The record read just above, before anything of the job ran.
        consumption_before: Some(machine.consumption),
    };
    // Not cancellable once sent: a job the engine started must be known here, or nothing
    // would ever watch or end it.
    let job = jobs.start(start).await.map_err(|e| match e {
        StartError::Fleet(e) => ToolError::from(e),
        StartError::Full(_) | StartError::UserFull(_) => {
            ToolError::new(ToolErrorKind::Fleet(ErrorKind::RateLimited), e.to_string())
        }
        StartError::Refused(_) => ToolError::new(
            ToolErrorKind::Fleet(ErrorKind::Upstream),
            format!(
                "{e}. A job needs sh and a writable /tmp in the machine's image; \
                     run-command without background does not."
            ),
        ),
    })?;
    Ok(JobStarted {
        job: job.id.clone(),
        state: Phase::Running.word().into(),
        machine: job.machine.clone(),
        cursor: Cursor::default().to_string(),
        timeout_secs,
        output_files: files(&job),
        run: job.run_id,
        started_machine,
    })
}

fn files(job: &Job) -> JobFiles {
    JobFiles {
        stdout: job.path("stdout"),
        stderr: job.path("stderr"),
    }
}

fn summary(job: &Job) -> JobSummary {
    let state = job.state();
    let command = match job.command.char_indices().nth(COMMAND_SHOWN_CHARS) {
        Some((cut, _)) => format!("{}...", &job.command[..cut]),
        None => job.command.clone(),
    };
    JobSummary {
        job: job.id.clone(),
        target: job.kind(),
        machine: job.machine.clone(),
        command,
        state: state.phase.word().into(),
        exit_code: state.phase.exit_code(),
        reason: match &state.phase {
            Phase::Lost(reason) => Some(reason.clone()),
            _ => None,
        },
        started_at: chrono::DateTime::<chrono::Utc>::from(job.started)
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        elapsed_secs: job.elapsed().as_secs(),
        stdout_bytes: state.stdout_bytes,
        stderr_bytes: state.stderr_bytes,
        output_files: files(job),
        run: job.run_id,
    }
}

/// The job `id` on the fleet this call may use (taking over the jobs a process that ended left
/// running first, so that an id from before a restart is found).
async fn find(
    (fleets, jobs, user): Theirs<'_>,
    target: Option<FleetKind>,
    id: &str,
) -> Result<Arc<Job>, ToolError> {
    let kind = fleets.kind(target)?;
    jobs.adopt().await;
    // This process's, or one another process sharing the store watches (it was started
    // through that one).
    let found = jobs.find(id).await?;
    match found {
        Some(job) if job.kind() == kind && job.user == user.id() => Ok(job),
        found => {
            if found.is_some_and(|job| job.user != user.id()) {
                tracing::warn!(user = %user, job = %id, "refused a call on another user's job");
            }
            Err(ToolError::new(
                ToolErrorKind::Fleet(ErrorKind::NotFound),
                format!(
                    "job: no job {} on the {} fleet of this server (job-output without a job lists them; an \
                 ended job is forgotten once 100 newer ones have ended, or when the server \
                 restarts)",
                    crate::policy::error::quote(id),
                    kind.as_str()
                ),
            ))
        }
    }
}

/// What reading a job's output takes of the call.
type Reading<'c> = (
    Theirs<'c>,
    Session<'c>,
    Cancel<'c>,
    &'c Progress,
    &'c Config,
    &'c Supplier,
);

pub(super) async fn job_output(
    parts: Reading<'_>,
    a: args::JobOutputArgs,
) -> Result<JobOutputAnswer, ToolError> {
    let Some(id) = a.job.clone() else {
        if a.cursor.is_some() || a.wait_secs.is_some() {
            return Err(ToolError::argument(
                "job",
                "required with cursor or waitSecs: give the job id run-command returned, or \
                 leave all three out for the list of jobs",
            ));
        }
        return list_jobs(parts.0, a.target)
            .await
            .map(JobOutputAnswer::List);
    };
    report(parts, a, id)
        .await
        .map(|r| JobOutputAnswer::Report(Box::new(r)))
}

async fn report(
    (theirs, session, cancel, progress, config, credentials): Reading<'_>,
    a: args::JobOutputArgs,
    id: String,
) -> Result<JobReport, ToolError> {
    let job = find(theirs, a.target, &id).await?;
    if let Some(why) = credentials.unknown_value(&job.machine).await {
        return Err(ToolError::argument("job", why));
    }
    let from = match &a.cursor {
        None => Cursor::default(),
        Some(text) => Cursor::parse(text).ok_or_else(|| {
            ToolError::argument(
                "cursor",
                format!(
                    "{} is not a cursor: give back the cursor a previous job-output answered \
                     (like \"1024:0\"), or leave it out to read from the start",
                    crate::policy::error::quote(text)
                ),
            )
        })?,
    };
    let wait = a.wait_secs.unwrap_or(0);
    if wait > args::MAX_JOB_WAIT_SECS {
        return Err(ToolError::argument(
            "waitSecs",
            format!(
                "{wait} is not accepted: give 0 to {}",
                args::MAX_JOB_WAIT_SECS
            ),
        ));
    }
    // Reading renews a leased machine's lease, like any call naming it.
    session.hold(&job.machine).await;
    if wait > 0 {
        let limit = Duration::from_secs(wait);
        let waiting_for = format!("waiting for job {} to end", job.id);
        cancel
            .run(async {
                let every = Duration::from_millis(config.job_poll_millis);
                let ended = async {
                    if job.is_view() {
                        job.wait_end_looking(limit, every).await;
                    } else {
                        job.wait_end(limit).await;
                    }
                };
                progress
                    .during(&waiting_for, Some(limit), Box::pin(ended))
                    .await;
                Ok::<_, ToolError>(())
            })
            .await?;
    }
    let budget = config.max_output_bytes;
    // A lost job's machine is stopped or gone: reading would start a stopped cloud machine
    // again (and bill it), so nothing is read.
    let (chunk, unavailable) = if let Phase::Lost(reason) = job.state().phase {
        (
            None,
            Some(format!(
                "not read: {reason}. If the machine still exists, its files are at \
                 outputFiles (read-file starts a stopped machine)"
            )),
        )
    } else {
        match cancel
            .run(job.read(from, budget, &credentials.redactor()))
            .await
        {
            Ok(chunk) => (Some(chunk), None),
            Err(e) if e.kind == ToolErrorKind::Cancelled => return Err(e),
            Err(e) => (None, Some(e.message)),
        }
    };
    let summary = summary(&job);
    let usage = match job.state().phase {
        Phase::Lost(_) => None,
        _ => job.cost().await,
    };
    Ok(match chunk {
        Some(chunk) => JobReport {
            usage,
            summary,
            stdout: String::from_utf8_lossy(&chunk.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&chunk.stderr).into_owned(),
            cursor: chunk.next.to_string(),
            more: chunk.more,
            output_unavailable: None,
        },
        None => JobReport {
            usage,
            summary,
            stdout: String::new(),
            stderr: String::new(),
            cursor: from.to_string(),
            more: false,
            output_unavailable: unavailable,
        },
    })
}

/// How long cancel-job waits for the job's end to be recorded before it answers anyway.
const RECORD_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

pub(super) async fn cancel_job(
    (theirs, session, store): (Theirs<'_>, Session<'_>, &dyn Store),
    a: args::JobArgs,
) -> Result<JobSummary, ToolError> {
    let job = find(theirs, a.target, &a.job).await?;
    session.hold(&job.machine).await;
    // Not cancellable: a kill half sent would leave the agent unsure whether the job runs.
    job.cancel().await?;
    // The watcher writes the end (the ledger's row, the job store): answered after it, a read
    // of smol://runs that follows the answer finds the run ended. Bounded: a store that does
    // not answer does not hold the answer up for long. A job another process watches is ended
    // by that one, at its next look, which finds why it was killed beside its files.
    if job.is_view() {
        let deadline = std::time::Instant::now() + RECORD_WAIT;
        while std::time::Instant::now() < deadline {
            let stored = store.jobs().get(&job.id).await;
            if !matches!(&stored, Ok(Some(s)) if s.state == crate::store::JobState::Running) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    } else {
        job.wait_recorded(RECORD_WAIT).await;
    }
    Ok(summary(&job))
}

async fn list_jobs(
    (fleets, jobs, user): Theirs<'_>,
    target: Option<crate::fleet::FleetKind>,
) -> Result<JobList, ToolError> {
    let kind = fleets.kind(target)?;
    jobs.adopt().await;
    // With those other processes sharing the store watch, as the store has them.
    let jobs = jobs.all().await;
    Ok(JobList {
        jobs: jobs
            .iter()
            .filter(|job| job.kind() == kind && job.user == user.id())
            .map(|job| summary(job))
            .collect(),
    })
}
