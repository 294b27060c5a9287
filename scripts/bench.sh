#!/usr/bin/env bash
# The benchmark: fetches the pinned engine, builds the release server as `cargo install` does
# (in target/installed: a bench build would switch on the features the test dependencies ask
# for, aws-lc among them, and measure a bigger binary than a user runs) and runs
# benches/overhead.rs against it, which prints a table and writes target/bench/overhead.json.
# SMOL_MCP_BENCH_BASELINE=label=path[,label=path] sets other builds beside it in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-smolvm.sh 1.32.2 >/dev/null
CARGO_TARGET_DIR=target/installed cargo build --locked --release --bin smol-mcp
SMOL_MCP_BENCH_SERVER="$PWD/target/installed/release/smol-mcp" \
  cargo bench --locked --bench overhead "$@"
