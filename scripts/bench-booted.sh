#!/usr/bin/env bash
# The booted-guest benchmark: brings up the nested real engine (scripts/nested-engine.sh), then
# runs benches/booted.rs against it, which prints a table and writes target/bench/booted.json.
# An engine that was already up is left up; one this script started is taken down at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
started=0
scripts/nested-engine.sh status > /dev/null 2>&1 || started=1
scripts/nested-engine.sh up
if [ "$started" = 1 ]; then
  trap 'scripts/nested-engine.sh down' EXIT
fi
eval "$(scripts/nested-engine.sh env)"
cargo bench --locked --bench booted "$@"
