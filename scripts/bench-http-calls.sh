#!/usr/bin/env bash
# Calls a second through `smol-mcp-http`, measured from outside by wrk, for several builds of
# the server side by side in one run, and the engine's own rate in the same run: sessionless
# (2026-07-28) list-machines with the static token, the real pinned `smolvm serve` behind
# every build (no machine boots), the builds alternated round by round so that the host's
# drift falls on all of them.
#
#   scripts/bench-http-calls.sh LABEL=BIN [LABEL=BIN ...]
#
# BIN is a smol-mcp-http binary (a release build: `cargo build --release` in a checkout of
# each). Settings, from the environment:
#   ROUNDS       rounds, each measuring every build once (default 2)
#   SECS         seconds a measured run lasts (default 10)
#   CONNECTIONS  wrk's connections (default 20)
#   RAW=0        leaves out the engine's own rate (`GET /api/v1/machines` on the serve's
#                socket, through socat, the request list-machines sends), measured by default
# Prints one line a run (calls/s, p50, p95, p99) and, at the end, each build's mean, its ratio
# to the first build and to the engine's own rate. Needs wrk and socat (Debian's packages)
# and the engine scripts/fetch-smolvm.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
load_name=bench-http-calls
# shellcheck source=scripts/lib/http-load.sh
. scripts/lib/http-load.sh
[ "$#" -ge 1 ] || { echo "usage: scripts/bench-http-calls.sh LABEL=BIN [LABEL=BIN ...]" >&2; exit 2; }
secs="${SECS:-10}"
conns="${CONNECTIONS:-20}"
raw="${RAW:-1}"
load_need wrk socat curl
labels=()
bins=()
for pair in "$@"; do
  label="${pair%%=*}"
  bin="${pair#*=}"
  [ "$label" != "$pair" ] && [ -x "$bin" ] || { echo "bench-http-calls: $pair is not LABEL=an executable" >&2; exit 2; }
  [ "$label" != raw ] || { echo "bench-http-calls: the label raw is the engine's own" >&2; exit 2; }
  labels+=("$label")
  bins+=("$bin")
done
trap load_cleanup EXIT
load_start_serve
# wrk's own summary has no p95; its `done` hook prints it in microseconds.
percentiles='
done = function(summary, latency, requests)
  io.write(string.format("p %d %d %d\n", latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end'
load_call_script "$load_work/call.lua" "$percentiles"
printf 'wrk.method = "GET"\n%s\n' "$percentiles" > "$load_work/raw.lua"
port=18791
raw_port=18792
measure() {
  local label="$1" script="$2" url="$3" out rate p
  wrk -t2 -c"$conns" -d2s -s "$script" "$url" >/dev/null
  out="$(wrk -t2 -c"$conns" -d"${secs}s" -s "$script" "$url")"
  if grep -q "Non-2xx" <<<"$out"; then
    echo "bench-http-calls: $label answered errors:" >&2; echo "$out" >&2; exit 1
  fi
  rate="$(awk '/^Requests\/sec/ {print $2}' <<<"$out")"
  p="$(awk '$1 == "p" {printf "%.2f %.2f %.2f", $2/1000, $3/1000, $4/1000}' <<<"$out")"
  echo "$label $rate $p"
}
round() {
  local label="$1" bin="$2"
  load_start_server "$label" "$port" "$bin"
  measure "$label" "$load_work/call.lua" "http://127.0.0.1:$port/mcp"
  load_stop_server
}
raw_round() {
  socat "TCP-LISTEN:$raw_port,reuseaddr,fork,bind=127.0.0.1" "UNIX-CONNECT:$load_work/api.sock" &
  load_server=$!
  load_pids+=("$load_server")
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$raw_port/api/v1/machines" && break; sleep 0.1; done
  measure raw "$load_work/raw.lua" "http://127.0.0.1:$raw_port/api/v1/machines"
  load_stop_server
}
echo "# $(date -u '+%Y-%m-%d %H:%M') UTC, wrk -c$conns -d${secs}s, sessionless list-machines, real smolvm serve 1.32.2 behind, $(nproc) cores"
echo "# build calls/s p50 p95 p99 (ms)"
results=()
for _ in $(seq "${ROUNDS:-2}"); do
  for i in "${!labels[@]}"; do
    results+=("$(round "${labels[$i]}" "${bins[$i]}")")
    echo "${results[-1]}"
  done
  if [ "$raw" = 1 ]; then
    results+=("$(raw_round)")
    echo "${results[-1]}"
  fi
done
printf '%s\n' "${results[@]}" | awk -v first="${labels[0]}" -v order="${labels[*]}" '
  { rate[$1] += $2; p95[$1] += $4; n[$1]++ }
  END {
    k = split(order, names, " ")
    for (i = 1; i <= k; i++) {
      l = names[i]; m = rate[l] / n[l]
      line = sprintf("%s: mean %.0f calls/s, mean p95 %.2f ms, %.3f of %s", l, m, p95[l] / n[l], m / (rate[first] / n[first]), first)
      if (n["raw"]) line = line sprintf(", %.3f of raw", m / (rate["raw"] / n["raw"]))
      print line
    }
    if (n["raw"]) printf "raw: mean %.0f calls/s, mean p95 %.2f ms\n", rate["raw"] / n["raw"], p95["raw"] / n["raw"]
  }'
