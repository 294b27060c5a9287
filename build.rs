//! Generates the raw smolvm and smol cloud clients from the vendored specs.
//!
//! Thin on purpose: every transformation lives in `src/spec/` (shared with the library's
//! vendoring tool and spec-diff report). This file loads, calls those steps, runs progenitor and
//! writes to OUT_DIR. Nothing here writes into the source tree; `generated/` is refreshed by
//! `UPDATE_GENERATED=1 cargo test --test offline generated_in_sync`.

#[path = "src/spec/mod.rs"]
#[allow(dead_code)]
mod spec;

use std::path::{Path, PathBuf};

fn main() {
    if let Err(message) = run() {
        // cargo shows a failed build script's stderr; the message names the override or step.
        eprintln!("error: {message}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let out = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| e.to_string())?);
    println!("cargo::rerun-if-changed=src/spec");
    for api in spec::VENDORED_APIS {
        generate(&out, api)?;
    }
    order_startup_functions(&out)?;
    Ok(())
}

/// The stdio server's start-up functions laid out together (src/bin/startup-order.txt, written
/// by scripts/startup-order.sh): the kernel maps the pages around each page of code a process
/// touches, so start-up's code spread over the binary made most of its memory at rest (11.0 MiB
/// linked in the default order, 7.6 in this one; docs/benchmarks.md). Only a release build of
/// `smol-mcp` for x86_64 Linux (the file names the functions of the two such builds users run,
/// `cargo install`'s and the portable wheel's), and only for a linker known to take the order:
/// - rust-lld, rustc's default on x86_64 Linux since 1.90, takes the list itself
///   (`--symbol-ordering-file`);
/// - the wheel's Zig (`zig cc`, which refuses that option; its linker is LLD) takes a linker
///   script that puts those functions' sections (rustc gives each function one) first in `.text`.
///
/// Any other configured linker (mold and gold take no such script) keeps the default order.
fn order_startup_functions(out: &Path) -> Result<(), String> {
    const ORDER: &str = "src/bin/startup-order.txt";
    println!("cargo::rerun-if-changed={ORDER}");
    println!("cargo::rerun-if-env-changed=RUSTC_LINKER");
    let env = |name: &str| std::env::var(name).unwrap_or_default();
    let path = Path::new(&env("CARGO_MANIFEST_DIR")).join(ORDER);
    if env("TARGET") != "x86_64-unknown-linux-gnu" || env("PROFILE") != "release" || !path.is_file()
    {
        return Ok(());
    }
    let flags = env("CARGO_ENCODED_RUSTFLAGS");
    let configured_linker = env("RUSTC_LINKER");
    let linker_flags = ["linker", "-fuse-ld"].iter().any(|f| flags.contains(f));
    // cargo-zigbuild, inside maturin, names its linker wrappers `zigcc-<target>-<hash>.sh`.
    let zig = Path::new(&configured_linker)
        .file_name()
        .is_some_and(|name| name.to_string_lossy().starts_with("zigcc-"));
    // `-Wl,` splits its argument at commas: a path with one keeps the default order.
    let script = out.join("startup-order.ld");
    if zig && !linker_flags && !script.to_string_lossy().contains(',') {
        let names = std::fs::read_to_string(&path).map_err(|e| format!("{ORDER}: {e}"))?;
        std::fs::write(&script, startup_section_script(&names))
            .map_err(|e| format!("{}: {e}", script.display()))?;
        println!(
            "cargo::rustc-link-arg-bin=smol-mcp=-Wl,-T,{}",
            script.display()
        );
        return Ok(());
    }
    let rustc_minor = std::process::Command::new(env("RUSTC"))
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let version = text.split_whitespace().nth(1)?.to_owned();
            version.split('.').nth(1)?.parse::<u32>().ok()
        });
    let default_linker =
        configured_linker.is_empty() && !linker_flags && rustc_minor.is_some_and(|m| m >= 90);
    if default_linker && !path.to_string_lossy().contains(',') {
        println!(
            "cargo::rustc-link-arg-bin=smol-mcp=-Wl,--symbol-ordering-file={}",
            path.display()
        );
        // Names the build no longer has (a stale order) are skipped, not reported one by one.
        println!("cargo::rustc-link-arg-bin=smol-mcp=-Wl,--no-warn-symbol-ordering");
    }
    Ok(())
}

/// A linker script that lays the named functions' sections out first in `.text`, in the file's
/// order, and the rest of `.text` after them; LLD's `OVERWRITE_SECTIONS` keeps the rest of its
/// default layout. Within `.text` rather than in an output section of their own, where valgrind
/// (scripts/startup-order.sh's callgrind) does not look for function names. Each build's linker
/// finds the names of its own build (the file lists both builds', as scripts/startup-order.sh
/// says). Names a linker script could misread (callgrind's recursion marks such as `'2`, its
/// `(below main)`) are left out: mangled names are made of letters, digits, `_`, `.` and `$`
/// only, none of them a glob.
fn startup_section_script(names: &str) -> String {
    let mut script = String::from("OVERWRITE_SECTIONS\n{\n  .text :\n  {\n");
    let mut seen = std::collections::BTreeSet::new();
    let wanted = names.lines().map(str::trim).filter(|name| {
        // Not callgrind's bare addresses (`0x...`) either.
        name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.$".contains(c))
    });
    // LLVM names the section of a function it takes for cold (`#[cold]`, as std's and
    // hashbrown's growth paths are) `.text.unlikely.<name>`.
    for name in wanted {
        if seen.insert(name) {
            script.push_str(&format!("    *(.text.{name} .text.unlikely.{name})\n"));
        }
    }
    script.push_str("    *(.text .text.*)\n  }\n}\n");
    script
}

fn generate(out: &Path, api: spec::VendoredApi) -> Result<(), String> {
    println!("cargo::rerun-if-changed={}", api.spec_file);
    println!("cargo::rerun-if-changed={}", api.overrides_file);
    let vendored: serde_json::Value = serde_json::from_str(api.spec_text)
        .map_err(|e| format!("{} is not JSON: {e}", api.spec_file))?;
    let effective = spec::effective(&vendored, api.overrides_text).map_err(|e| e.to_string())?;

    let openapi: openapiv3::OpenAPI = serde_json::from_value(effective.kept.clone())
        .map_err(|e| format!("{}: the effective spec is not OpenAPI 3.0: {e}", api.name))?;
    let mut settings = progenitor::GenerationSettings::default();
    settings
        .with_interface(progenitor::InterfaceStyle::Builder)
        .with_tag(progenitor::TagStyle::Merged)
        // Ordered maps keep request bodies (env, labels) byte-stable from run to run.
        .with_map_type("::std::collections::BTreeMap");
    let tokens = progenitor::Generator::new(&settings)
        .generate_tokens(&openapi)
        .map_err(|e| format!("{}: progenitor: {e}", api.name))?;
    let file = syn::parse2::<syn::File>(tokens)
        .map_err(|e| format!("{}: generated code does not parse: {e}", api.name))?;
    let client = format!(
        "// generated by build.rs from {} with progenitor: do not edit.\n\n{}",
        api.spec_file,
        prettyplease::unparse(&file)
    );

    let write = |name: String, text: &str| {
        std::fs::write(out.join(&name), text).map_err(|e| format!("writing {name}: {e}"))
    };
    write(format!("{}_client.rs", api.name), &client)?;
    write(
        format!("{}_operations.rs", api.name),
        &spec::operations::operation_enum_source(&effective.full, &effective.overrides, api.name),
    )?;
    write(
        format!("{}.effective.json", api.name),
        &spec::vendor::render(&effective.kept),
    )?;
    Ok(())
}
