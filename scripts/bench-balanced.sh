#!/usr/bin/env bash
# One smol-mcp-http process against three behind HAProxy, in one run (benches/balanced.rs):
# starts the project's PostgreSQL when it is not up (and stops it after), installs HAProxy when
# missing, builds the release server and prints the table. LOAD_CLIENTS and LOAD_CALLS shape it.
set -euo pipefail
cd "$(dirname "$0")/.."
ours=""
if ! scripts/postgres.sh status; then
  ours=1
  scripts/postgres.sh up
fi
trap '[ -z "$ours" ] || scripts/postgres.sh down >/dev/null 2>&1 || true' EXIT
eval "export $(scripts/postgres.sh env)"
scripts/balancer.sh install
cargo bench --locked --bench balanced "$@"
