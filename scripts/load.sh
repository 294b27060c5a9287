#!/usr/bin/env bash
# The load run: fetches the pinned engine, builds the release server and runs benches/load.rs,
# which prints a table and writes target/bench/load.json. LOAD_SESSIONS and LOAD_CALLS shape it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-smolvm.sh 1.32.2 >/dev/null
cargo bench --locked --bench load "$@"
