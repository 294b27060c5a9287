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
load_name=profile-http
# shellcheck source=scripts/lib/http-load.sh
. scripts/lib/http-load.sh
bin="${1:-target/profiling/smol-mcp-http}"
secs="${SECS:-8}"
[ -x "$bin" ] || load_die "no $bin (cargo build --profile profiling --bin smol-mcp-http)"
load_need perf wrk curl
trap load_cleanup EXIT
load_start_serve
port=18793
load_start_server profiled "$port" "$bin"
server="$load_server"
load_call_script "$load_work/call.lua"
work="$load_work"
wrk -t2 -c20 -d"$((secs + 4))s" -s "$work/call.lua" "http://127.0.0.1:$port/mcp" >"$work/wrk.txt" &
wrk_pid=$!
load_pids+=("$wrk_pid")
sleep 2
mkdir -p target/bench
perf record -q -F 499 --call-graph dwarf,16384 -p "$server" -o target/bench/perf-http.data -- sleep "$secs" 2>/dev/null
wait "$wrk_pid" || true
echo "# $(date -u '+%Y-%m-%d %H:%M') UTC, $(git rev-parse --short HEAD), $bin under wrk -c20 ($(awk '/^Requests\/sec/ {print $2}' "$work/wrk.txt") calls/s while sampled)"
echo "## own time (self), top 40"
perf report -i target/bench/perf-http.data --no-children --sort symbol --stdio -g none --percent-limit 0.5 2>/dev/null \
  | grep -v '^#' | grep -v '^$' | sed 's/  *-  *-  *$//' | cut -c1-160 | head -40
echo "## time under (children): the server's own frames and its libraries', top 40"
perf report -i target/bench/perf-http.data --children --sort symbol --stdio -g none --percent-limit 1 2>/dev/null \
  | grep -E '\] <?(smol_mcp|rmcp|hyper|reqwest|serde_json)' | grep -v '(inlined)' \
  | sed 's/  *-  *-  *$//' | cut -c1-160 | head -40
