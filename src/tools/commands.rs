//! The tools that run commands: in an existing machine, or once in a throwaway one.

use super::args;
use super::call::random_hex;
use super::lifecycle::{base_spec, with_egress_hint};
use super::output::head_tail;
use super::provisional::Provisional;
use super::results::{self, Overflow};
use super::{Call, Tool, ToolError};
use crate::fleet::{ExecOutput, ExecSpec};

fn exec_spec(call: &Call<'_>, fields: &args::CommandFields) -> Result<ExecSpec, ToolError> {
    let mut spec = ExecSpec::new(args::command("command", &fields.command)?);
    if let Some(w) = &fields.workdir {
        args::absolute_path("workdir", w)?;
    }
    spec.workdir = fields.workdir.clone();
    if let Some(env) = &fields.env {
        args::env("env", env)?;
        spec.env = env.clone();
    }
    spec.stdin = fields.stdin.clone();
    let config = &call.backend.config;
    let secs = fields.timeout_secs.unwrap_or(config.exec_timeout_secs);
    if secs == 0 || secs > config.max_exec_timeout_secs {
        return Err(ToolError::argument(
            "timeoutSecs",
            format!(
                "{secs} is not accepted: give 1 to {} (this server's ceiling, maxExecTimeoutSecs)",
                config.max_exec_timeout_secs
            ),
        ));
    }
    spec.timeout_secs = Some(secs);
    Ok(spec)
}

/// Each stream's head and tail within the output budget, and whether anything was left out.
struct Shaped {
    stdout: super::output::Shaped,
    stderr: super::output::Shaped,
    truncated: bool,
}

fn shape(output: &ExecOutput, budget: usize) -> Shaped {
    let stdout = head_tail(&output.stdout, budget);
    let stderr = head_tail(&output.stderr, budget);
    let truncated = stdout.dropped > 0
        || stderr.dropped > 0
        || output.stdout_cut_upstream
        || output.stderr_cut_upstream;
    Shaped {
        stdout,
        stderr,
        truncated,
    }
}

pub(super) async fn run_command(
    call: &Call<'_>,
    a: args::RunCommandArgs,
) -> Result<results::CommandRun, ToolError> {
    args::machine_ref("name", &a.name)?;
    let spec = exec_spec(call, &a.run)?;
    let fleet = call.fleet(a.target).await?;
    let started_machine = call.is_stopped(&fleet, &a.name).await?;
    let output = call.cancellable(fleet.exec(&a.name, &spec)).await?;
    let mut shaped = shape(&output, call.backend.config.max_output_bytes);
    let mut overflow = Vec::new();
    if shaped.stdout.dropped > 0 || shaped.stderr.dropped > 0 {
        let stamp = random_hex();
        for (stream, bytes, part) in [
            ("stdout", &output.stdout, &mut shaped.stdout),
            ("stderr", &output.stderr, &mut shaped.stderr),
        ] {
            if part.dropped == 0 {
                continue;
            }
            let path = format!("/tmp/smol-mcp-{stamp}.{stream}");
            match call
                .cancellable(fleet.write_file(&a.name, &path, bytes.clone()))
                .await
            {
                Ok(_) => {
                    part.text.push_str(&format!(
                        "\n[the whole {stream}, {} bytes, is in the machine at {path}]",
                        bytes.len()
                    ));
                    overflow.push(Overflow {
                        stream: stream.into(),
                        path,
                        bytes: bytes.len() as u64,
                    });
                }
                Err(e) => {
                    tracing::warn!(%path, error = %e.message, "could not write the whole stream into the machine")
                }
            }
        }
    }
    Ok(results::CommandRun {
        stdout: shaped.stdout.text,
        stderr: shaped.stderr.text,
        exit_code: output.exit_code,
        timed_out: output.timed_out(),
        truncated: shaped.truncated,
        overflow,
        started_machine,
    })
}

pub(super) async fn run_once(
    call: &Call<'_>,
    a: args::RunOnceArgs,
) -> Result<results::RunOnce, ToolError> {
    let config = &call.backend.config;
    let name = format!("{}once-{}", config.machine_prefix, random_hex());
    let mut spec = base_spec(call, &a.machine, name.clone(), config.run_once_network)?;
    spec.ephemeral = true;
    let exec = exec_spec(call, &a.run)?;
    let fleet = call.fleet(a.target).await?;
    let mut machine = Provisional::begin(call, &fleet, &name, true)?;
    let result = async {
        let created = call
            .cancellable(fleet.create(&spec))
            .await
            .map_err(|e| with_egress_hint(e, &spec.egress, Tool::RunOnce))?;
        machine.created(&created.id);
        call.cancellable(fleet.start(machine.id(), Some(false)))
            .await
            .map_err(|e| with_egress_hint(e, &spec.egress, Tool::RunOnce))?;
        call.wait_ready(&fleet, machine.id()).await?;
        call.cancellable(fleet.exec(machine.id(), &exec)).await
    }
    .await;
    // Whatever happened, the machine goes (a cancelled call included).
    if let Err(e) = machine.abandon().await {
        tracing::warn!(machine = %name, error = %e.message, "run-once could not delete its machine; it stays recorded for the session's clean-up");
    }
    let output = result?;
    let shaped = shape(&output, config.max_output_bytes);
    Ok(results::RunOnce {
        truncated: shaped.truncated,
        timed_out: output.timed_out(),
        stdout: shaped.stdout.text,
        stderr: shaped.stderr.text,
        exit_code: output.exit_code,
        machine: name,
    })
}
