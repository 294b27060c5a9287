#!/usr/bin/env bash
# Calls a second through `smol-mcp-http`, measured from outside by wrk, for two builds of the
# server side by side in one run: sessionless (2026-07-28) list-machines with the static token,
# the real pinned `smolvm serve` behind both (no machine boots), the builds alternated A B A B
# so that the host's drift falls on both.
#
#   scripts/bench-http-calls.sh BEFORE_BIN AFTER_BIN [SECONDS] [CONNECTIONS]
#
# ROUNDS (default 2) pairs are run. BEFORE_BIN and AFTER_BIN are smol-mcp-http binaries (release builds: `cargo build --release`
# in a checkout of each). Prints one line a round and the median of each build; needs wrk
# (Debian's package) and the engine scripts/fetch-smolvm.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
before="${1:?the smol-mcp-http binary of the build before}"
after="${2:?the smol-mcp-http binary of the build after}"
secs="${3:-10}"
conns="${4:-20}"
command -v wrk >/dev/null || { echo "bench-http-calls: wrk is needed (apt-get install wrk)" >&2; exit 1; }
engine=".smolvm/1.32.2/smol-vmm"
[ -x "$engine" ] || scripts/fetch-smolvm.sh 1.32.2 >/dev/null
work="$(mktemp -d)"
serve_pid=""
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
SMOLVM_VM_UID_DROP=off "$engine" serve start --listen "unix://$work/api.sock" \
  --state-dir "$work/state" --guest-rollout-port "$((20000 + RANDOM % 10000))" >/dev/null 2>"$work/serve.log" &
serve_pid=$!
for _ in $(seq 100); do [ -S "$work/api.sock" ] && break; sleep 0.1; done
cat > "$work/call.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["authorization"] = "Bearer bench-token"
wrk.headers["content-type"] = "application/json"
wrk.headers["accept"] = "application/json, text/event-stream"
wrk.headers["mcp-protocol-version"] = "2026-07-28"
wrk.headers["mcp-method"] = "tools/call"
wrk.headers["mcp-name"] = "list-machines"
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list-machines","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"wrk","version":"0"}}}}'
LUA
port=18791
round() {
  local label="$1" bin="$2"
  SMOL_MCP_RUNTIME_DIR="$work/rt-$label" SMOL_MCP_AUTH_TOKEN=bench-token \
    SMOL_LOCAL_URL="unix://$work/api.sock" SMOL_MCP_LOG=warn \
    "$bin" --port "$port" >/dev/null 2>"$work/$label.log" &
  server_pid=$!
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
  # A warm-up, then the measured run.
  wrk -t2 -c"$conns" -d2s -s "$work/call.lua" "http://127.0.0.1:$port/mcp" >/dev/null
  local out rate p50 p99
  out="$(wrk -t2 -c"$conns" -d"${secs}s" --latency -s "$work/call.lua" "http://127.0.0.1:$port/mcp")"
  rate="$(awk '/^Requests\/sec/ {print $2}' <<<"$out")"
  p50="$(awk '$1 == "50%" {print $2}' <<<"$out")"
  p99="$(awk '$1 == "99%" {print $2}' <<<"$out")"
  if grep -q "Non-2xx" <<<"$out"; then
    echo "bench-http-calls: $label answered errors:" >&2; echo "$out" >&2; exit 1
  fi
  echo "$label $rate $p50 $p99"
  kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""
}
echo "# $(date -u +%Y-%m-%d) wrk -c$conns -d${secs}s, sessionless list-machines, real smolvm serve 1.32.2 behind"
echo "# build calls/s p50 p99"
results=()
for _ in $(seq "${ROUNDS:-2}"); do
  results+=("$(round before "$before")")
  echo "${results[-1]}"
  results+=("$(round after "$after")")
  echo "${results[-1]}"
done
printf '%s\n' "${results[@]}" | awk '
  { rate[$1] += $2; n[$1]++ }
  END { printf "mean calls/s: before %.0f, after %.0f, after/before %.3f\n",
        rate["before"]/n["before"], rate["after"]/n["after"],
        (rate["after"]/n["after"]) / (rate["before"]/n["before"]) }'
