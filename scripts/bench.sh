#!/usr/bin/env bash
# The benchmark: fetches the pinned engine, builds the release server and runs benches/overhead.rs,
# which prints a table and writes target/bench/overhead.json.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-smolvm.sh 1.32.2 >/dev/null
cargo bench --locked --bench overhead "$@"
