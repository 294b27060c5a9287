//! `smol-spec`: the spec tools.
//!
//!     smol-spec vendor RAW.json OUT.json|-
//!         write (or print) the facts-only form of an OpenAPI document
//!     smol-spec diff [--smolvm BIN | --local-spec RAW.json] [--release NAME] [--cloud-spec RAW.json] [--format md|json]
//!         what a new smolvm release (or cloud spec) changes for this server; exits 1 when
//!         something needs a decision (unknown operations, breaking changes, stale overrides)

use anyhow::{Context, bail};
use smol_mcp::spec_diff::{Api, Report, diff};
use std::process::{Command, ExitCode};

const USAGE: &str = "usage:\n  smol-spec vendor RAW.json OUT.json|-\n  smol-spec diff [--smolvm BIN | --local-spec RAW.json] [--release NAME] [--cloud-spec RAW.json] [--format md|json]";

fn read_json(path: &str) -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    serde_json::from_str(&text).with_context(|| format!("{path} is not JSON"))
}

fn vendor(raw: &str, out: &str) -> anyhow::Result<()> {
    let doc = read_json(raw)?;
    let rendered = smol_mcp::spec::vendor::render(&smol_mcp::spec::vendor::facts_only(&doc));
    if out == "-" {
        print!("{rendered}");
    } else {
        std::fs::write(out, rendered).with_context(|| format!("writing {out}"))?;
    }
    Ok(())
}

/// The engine's own `serve openapi`, and its release from `--version` (the spec's info.version
/// is not the release).
fn from_binary(bin: &str) -> anyhow::Result<(serde_json::Value, String)> {
    let spec = Command::new(bin)
        .args(["serve", "openapi"])
        .output()
        .with_context(|| format!("running {bin} serve openapi"))?;
    if !spec.status.success() {
        bail!(
            "{bin} serve openapi failed: {}",
            String::from_utf8_lossy(&spec.stderr).trim()
        );
    }
    let version = Command::new(bin)
        .arg("--version")
        .output()
        .with_context(|| format!("running {bin} --version"))?;
    let release = String::from_utf8_lossy(&version.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    let doc = serde_json::from_slice(&spec.stdout).context("serve openapi did not print JSON")?;
    Ok((doc, release))
}

fn run_diff(args: &[String]) -> anyhow::Result<bool> {
    let mut smolvm = None;
    let mut local_spec = None;
    let mut cloud_spec = None;
    let mut release = None;
    let mut format = "md".to_owned();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .with_context(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--smolvm" => smolvm = Some(value()?),
            "--local-spec" => local_spec = Some(value()?),
            "--cloud-spec" => cloud_spec = Some(value()?),
            "--release" => release = Some(value()?),
            "--format" => format = value()?,
            other => bail!(
                "unknown argument {other} (accepted: --smolvm, --local-spec, --release, --cloud-spec, --format)\n{USAGE}"
            ),
        }
    }
    if format != "md" && format != "json" {
        bail!("--format takes md or json, not {format}");
    }
    let mut reports: Vec<Report> = Vec::new();
    match (smolvm, local_spec) {
        (Some(_), Some(_)) => bail!("give --smolvm or --local-spec, not both"),
        (Some(bin), None) => {
            let (doc, found) = from_binary(&bin)?;
            reports.push(diff(
                Api::Local,
                &doc,
                Some(release.clone().unwrap_or(found)),
            ));
        }
        (None, Some(path)) => reports.push(diff(Api::Local, &read_json(&path)?, release.clone())),
        (None, None) => {}
    }
    if let Some(path) = cloud_spec {
        reports.push(diff(Api::Cloud, &read_json(&path)?, None));
    }
    if reports.is_empty() {
        bail!("nothing to compare: give --smolvm, --local-spec or --cloud-spec\n{USAGE}");
    }
    if format == "json" {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        let text: Vec<String> = reports.iter().map(Report::markdown).collect();
        print!("{}", text.join("\n"));
    }
    Ok(reports.iter().any(|r| r.needs_decision))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("vendor") if args.len() == 3 => vendor(&args[1], &args[2]).map(|()| false),
        Some("diff") => run_diff(&args[1..]),
        _ => Err(anyhow::anyhow!("{USAGE}")),
    };
    match result {
        Ok(false) => ExitCode::SUCCESS,
        Ok(true) => ExitCode::from(1),
        Err(e) => {
            eprintln!("smol-spec: {e:#}");
            ExitCode::from(2)
        }
    }
}
