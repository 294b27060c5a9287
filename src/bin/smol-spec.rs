//! `smol-spec`: vendors an OpenAPI document into its facts-only form.
//!
//!     smol-spec vendor RAW.json OUT.json    write the facts-only form of RAW to OUT
//!     smol-spec vendor RAW.json -           print it

use anyhow::{Context, bail};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["vendor", raw, out] => {
            let text = std::fs::read_to_string(raw).with_context(|| format!("reading {raw}"))?;
            let doc: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{raw} is not JSON"))?;
            let rendered =
                smol_mcp::spec::vendor::render(&smol_mcp::spec::vendor::facts_only(&doc));
            if *out == "-" {
                print!("{rendered}");
            } else {
                std::fs::write(out, rendered).with_context(|| format!("writing {out}"))?;
            }
            Ok(())
        }
        _ => bail!("usage: smol-spec vendor RAW.json OUT.json|-"),
    }
}
