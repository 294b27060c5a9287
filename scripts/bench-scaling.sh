#!/usr/bin/env bash
# One smol-mcp-http process against three behind HAProxy, each held to the same CPU quota, on
# one PostgreSQL store and the real smolvm serve (benches/scaling.rs): starts the project's
# PostgreSQL when it is not up (and stops it after), installs HAProxy when missing, fetches the
# pinned engine when missing, builds the release server and prints the table. As root (the
# cgroups, the engine). LOAD_CLIENTS, LOAD_CALLS, SCALING_USERS, SERVER_CPU_QUOTA_PERCENT and
# SCALING_PERIOD_US shape it.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench-scaling: run as root (cgroups, smolvm serve)" >&2; exit 1; }
[ -x .smolvm/1.32.2/smol-vmm ] || [ -n "${SMOLVM_BIN:-}" ] || scripts/fetch-smolvm.sh >/dev/null
ours=""
if ! scripts/postgres.sh status; then
  ours=1
  scripts/postgres.sh up
fi
trap '[ -z "$ours" ] || scripts/postgres.sh down >/dev/null 2>&1 || true' EXIT
eval "export $(scripts/postgres.sh env)"
scripts/balancer.sh install
cargo bench --locked --bench scaling "$@"
