#!/usr/bin/env bash
# Where a call's time goes in `smol-mcp-http`: perf samples the server while wrk drives it with
# the load scripts/bench-http-calls.sh measures (sessionless list-machines, the real pinned
# `smolvm serve` behind, no boots), and prints the top frames by their own time and by the
# time under them. The samples stay in target/bench/perf-http.data for `perf report`.
#
#   scripts/profile-http.sh [BIN]
#
# BIN defaults to the profiling build (`cargo build --profile profiling --bin smol-mcp-http`:
# the release build with its symbols). SECS (default 8) is how long perf samples. Needs perf,
# wrk and curl; perf needs kernel.perf_event_paranoid <= 1 or root.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/profiling/smol-mcp-http}"
secs="${SECS:-8}"
[ -x "$bin" ] || { echo "profile-http: no $bin (cargo build --profile profiling --bin smol-mcp-http)" >&2; exit 2; }
for tool in perf wrk curl; do
  command -v "$tool" >/dev/null || { echo "profile-http: $tool is needed" >&2; exit 1; }
done
engine=".smolvm/1.32.2/smol-vmm"
[ -x "$engine" ] || scripts/fetch-smolvm.sh 1.32.2 >/dev/null
work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
SMOLVM_VM_UID_DROP=off "$engine" serve start --listen "unix://$work/api.sock" \
  --state-dir "$work/state" --guest-rollout-port "$((20000 + RANDOM % 10000))" >/dev/null 2>"$work/serve.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$work/api.sock" ] && break; sleep 0.1; done
port=18793
SMOL_MCP_RUNTIME_DIR="$work/rt" SMOL_MCP_AUTH_TOKEN=bench-token \
  SMOL_LOCAL_URL="unix://$work/api.sock" SMOL_MCP_LOG=warn \
  "$bin" --port "$port" >/dev/null 2>"$work/server.log" &
server=$!
pids+=("$server")
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
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
wrk -t2 -c20 -d"$((secs + 4))s" -s "$work/call.lua" "http://127.0.0.1:$port/mcp" >"$work/wrk.txt" &
pids+=($!)
sleep 2
mkdir -p target/bench
perf record -q -F 499 --call-graph dwarf,16384 -p "$server" -o target/bench/perf-http.data -- sleep "$secs" 2>/dev/null
wait "${pids[-1]}" || true
echo "# $(date -u '+%Y-%m-%d %H:%M') UTC, $(git rev-parse --short HEAD), $bin under wrk -c20 ($(awk '/^Requests\/sec/ {print $2}' "$work/wrk.txt") calls/s while sampled)"
echo "## own time (self), top 40"
perf report -i target/bench/perf-http.data --no-children --sort symbol --stdio -g none --percent-limit 0.5 2>/dev/null \
  | grep -v '^#' | grep -v '^$' | sed 's/  *-  *-  *$//' | cut -c1-160 | head -40
echo "## time under (children): the server's own frames and its libraries', top 40"
perf report -i target/bench/perf-http.data --children --sort symbol --stdio -g none --percent-limit 1 2>/dev/null \
  | grep -E '\] <?(smol_mcp|rmcp|hyper|reqwest|serde_json)' | grep -v '(inlined)' \
  | sed 's/  *-  *-  *$//' | cut -c1-160 | head -40
