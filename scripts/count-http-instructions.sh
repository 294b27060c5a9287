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
load_name=count-http-instructions
# shellcheck source=scripts/lib/http-load.sh
. scripts/lib/http-load.sh
[ "$#" -ge 1 ] || { echo "usage: scripts/count-http-instructions.sh LABEL=BIN [LABEL=BIN ...]" >&2; exit 2; }
load_need valgrind callgrind_control callgrind_annotate wrk curl
mkdir -p target/bench
trap load_cleanup EXIT
load_start_serve
load_call_script "$load_work/call.lua"
work="$load_work"
port=18795
echo "# $(date -u '+%Y-%m-%d %H:%M') UTC, $(git rev-parse --short HEAD), sessionless list-machines under callgrind"
for pair in "$@"; do
  label="${pair%%=*}"
  bin="${pair#*=}"
  [ "$label" != "$pair" ] && [ -x "$bin" ] || { echo "count-http-instructions: $pair is not LABEL=an executable" >&2; exit 2; }
  out="target/bench/callgrind-$label"
  rm -f "$out" "$out".*
  load_start_server "$label" "$port" valgrind --tool=callgrind --callgrind-out-file="$out" "$bin"
  server="$load_server"
  wrk -t1 -c4 -d4s -s "$work/call.lua" "http://127.0.0.1:$port/mcp" >/dev/null
  callgrind_control -z "$server" >/dev/null 2>&1
  run="$(wrk -t1 -c4 -d10s -s "$work/call.lua" "http://127.0.0.1:$port/mcp")"
  callgrind_control -d "$server" >/dev/null 2>&1
  if grep -q "Non-2xx" <<<"$run"; then
    echo "count-http-instructions: $label answered errors:" >&2; echo "$run" >&2; exit 1
  fi
  calls="$(awk '/requests in/ {print $1}' <<<"$run")"
  load_stop_server
  total="$(callgrind_annotate "$out.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')"
  echo "$label: $calls calls counted, $((total / calls)) instructions a call"
done
