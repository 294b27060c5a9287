#!/usr/bin/env bash
# The instructions one sessionless call costs `smol-mcp-http`, counted by callgrind: a figure
# this shared, noisy host repeats to within a percent where calls a second drift by a third
# between two runs of one build. Each build serves the load scripts/bench-http-calls.sh
# measures (sessionless list-machines, the real pinned `smolvm serve` behind, no boots) from
# wrk with 4 connections; the count starts after a warm-up and covers every thread of the
# server, the kernel's share of a call not included.
#
#   scripts/count-http-instructions.sh LABEL=BIN [LABEL=BIN ...]
#
# With a build that has symbols (`cargo build --profile profiling`) the counts stay in
# target/bench/callgrind-LABEL for `callgrind_annotate --inclusive=yes`. Needs valgrind, wrk and
# curl (Debian's packages).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$#" -ge 1 ] || { echo "usage: scripts/count-http-instructions.sh LABEL=BIN [LABEL=BIN ...]" >&2; exit 2; }
for tool in valgrind callgrind_control callgrind_annotate wrk curl; do
  command -v "$tool" >/dev/null || { echo "count-http-instructions: $tool is needed" >&2; exit 1; }
done
engine=".smolvm/1.32.2/smol-vmm"
[ -x "$engine" ] || scripts/fetch-smolvm.sh 1.32.2 >/dev/null
mkdir -p target/bench
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
port=18795
echo "# $(date -u '+%Y-%m-%d %H:%M') UTC, $(git rev-parse --short HEAD), sessionless list-machines under callgrind"
for pair in "$@"; do
  label="${pair%%=*}"
  bin="${pair#*=}"
  [ "$label" != "$pair" ] && [ -x "$bin" ] || { echo "count-http-instructions: $pair is not LABEL=an executable" >&2; exit 2; }
  out="target/bench/callgrind-$label"
  rm -f "$out" "$out".*
  SMOL_MCP_RUNTIME_DIR="$work/rt-$label" SMOL_MCP_AUTH_TOKEN=bench-token \
    SMOL_LOCAL_URL="unix://$work/api.sock" SMOL_MCP_LOG=warn \
    valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" --port "$port" >/dev/null 2>"$work/$label.log" &
  server=$!
  pids+=("$server")
  for _ in $(seq 300); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.2; done
  wrk -t1 -c4 -d4s -s "$work/call.lua" "http://127.0.0.1:$port/mcp" >/dev/null
  callgrind_control -z "$server" >/dev/null 2>&1
  run="$(wrk -t1 -c4 -d10s -s "$work/call.lua" "http://127.0.0.1:$port/mcp")"
  callgrind_control -d "$server" >/dev/null 2>&1
  if grep -q "Non-2xx" <<<"$run"; then
    echo "count-http-instructions: $label answered errors:" >&2; echo "$run" >&2; exit 1
  fi
  calls="$(awk '/requests in/ {print $1}' <<<"$run")"
  kill "$server"; wait "$server" 2>/dev/null || true
  total="$(callgrind_annotate "$out.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')"
  echo "$label: $calls calls counted, $((total / calls)) instructions a call"
done
