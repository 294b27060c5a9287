//! `smol-spec`: the spec tools. `vendor` writes the facts-only form of an OpenAPI document;
//! `diff` reports what a new smolvm release (or cloud spec) changes for this server.
//!
//! Exit codes: 0 done (for `diff`: nothing needs a decision), 1 something needs a decision, 2
//! bad usage or a failure.

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use smol_mcp::app::spec_diff::{Api, Report, diff, read_request_snapshots};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

#[derive(Parser)]
#[command(name = "smol-spec", version, about = "The spec tools of smol-mcp")]
struct Cli {
    #[command(subcommand)]
    command: Tool,
}

#[derive(Subcommand)]
enum Tool {
    /// Write (or print) the facts-only form of an OpenAPI document, as `specs/` holds it
    Vendor {
        /// The raw OpenAPI document (`smol-vmm serve openapi` output, a published spec)
        #[arg(value_name = "RAW.json")]
        raw: PathBuf,
        /// Where to write the vendored form; `-` prints it
        #[arg(value_name = "OUT.json|-")]
        out: String,
    },
    /// What a new smolvm release (or cloud spec) changes for this server
    ///
    /// Exits 0 when nothing needs a decision, 1 when something does (unknown operations,
    /// breaking changes, stale overrides), 2 on bad usage or when the inputs cannot be read.
    Diff(DiffArgs),
}

#[derive(Args)]
#[command(group = clap::ArgGroup::new("candidate").required(true).multiple(true))]
struct DiffArgs {
    /// A smolvm engine binary: its `serve openapi`, and its release from `--version`
    #[arg(
        long,
        value_name = "BIN",
        group = "candidate",
        conflicts_with = "local_spec"
    )]
    smolvm: Option<PathBuf>,
    /// A raw local spec file instead of a binary
    #[arg(long, value_name = "RAW.json", group = "candidate")]
    local_spec: Option<PathBuf>,
    /// The candidate's release name (default: what `--smolvm BIN --version` prints)
    #[arg(long, value_name = "NAME")]
    release: Option<String>,
    /// A raw cloud spec file
    #[arg(long, value_name = "RAW.json", group = "candidate")]
    cloud_spec: Option<PathBuf>,
    /// Output format
    #[arg(long, value_enum, default_value_t = Format::Md)]
    format: Format,
    /// The request snapshots (`local_requests__*.snap`, `cloud_requests__*.snap`): they show
    /// which request fields this server sends, so which changes break it
    #[arg(long, value_name = "DIR", default_value = "tests/snapshots")]
    snapshots: PathBuf,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// Markdown, for reading
    Md,
    /// The reports as a JSON list
    Json,
}

fn read_json(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

fn vendor(raw: &Path, out: &str) -> anyhow::Result<()> {
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
fn from_binary(bin: &Path) -> anyhow::Result<(serde_json::Value, String)> {
    let shown = bin.display();
    let spec = Command::new(bin)
        .args(["serve", "openapi"])
        .output()
        .with_context(|| format!("running {shown} serve openapi"))?;
    if !spec.status.success() {
        bail!(
            "{shown} serve openapi failed: {}",
            String::from_utf8_lossy(&spec.stderr).trim()
        );
    }
    let version = Command::new(bin)
        .arg("--version")
        .output()
        .with_context(|| format!("running {shown} --version"))?;
    let release = String::from_utf8_lossy(&version.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    let doc = serde_json::from_slice(&spec.stdout).context("serve openapi did not print JSON")?;
    Ok((doc, release))
}

fn report(
    api: Api,
    doc: &serde_json::Value,
    release: Option<String>,
    snapshots: &Path,
) -> anyhow::Result<Report> {
    let texts = read_request_snapshots(snapshots, api)?;
    Ok(diff(api, doc, release, &texts)?)
}

/// The reports, and whether any needs a decision.
fn run_diff(args: DiffArgs) -> anyhow::Result<bool> {
    // Judged against no snapshot, every request change would look breaking: refuse instead.
    if !args.snapshots.is_dir() {
        bail!(
            "no request snapshots directory at {}: the report reads there which request fields \
             this server sends; run it from the checkout or give --snapshots DIR",
            args.snapshots.display()
        );
    }
    let mut reports = Vec::new();
    if let Some(bin) = &args.smolvm {
        let (doc, found) = from_binary(bin)?;
        let release = args.release.clone().unwrap_or(found);
        reports.push(report(Api::Local, &doc, Some(release), &args.snapshots)?);
    }
    if let Some(path) = &args.local_spec {
        let doc = read_json(path)?;
        reports.push(report(
            Api::Local,
            &doc,
            args.release.clone(),
            &args.snapshots,
        )?);
    }
    if let Some(path) = &args.cloud_spec {
        reports.push(report(
            Api::Cloud,
            &read_json(path)?,
            None,
            &args.snapshots,
        )?);
    }
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&reports)?),
        Format::Md => {
            let text: Vec<String> = reports.iter().map(Report::markdown).collect();
            print!("{}", text.join("\n"));
        }
    }
    Ok(reports.iter().any(|r| r.needs_decision))
}

fn main() -> ExitCode {
    // Usage errors exit 2; --help and --version exit 0.
    let cli = Cli::parse();
    let result = match cli.command {
        Tool::Vendor { raw, out } => vendor(&raw, &out).map(|()| false),
        Tool::Diff(args) => run_diff(args),
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
