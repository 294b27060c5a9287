#!/usr/bin/env bash
# Writes src/bin/startup-order.txt: the functions the stdio server runs from spawn through
# initialize, tools/list and 50 list-machines (the real pinned `smolvm serve` behind it), as
# callgrind sees them run, by their mangled names. build.rs hands the file to the linker
# (rust-lld's --symbol-ordering-file) so that those functions lie together in the binary's text:
# the kernel maps the pages around every page of code a process touches, so code that start-up
# touches scattered over the binary is what its memory at rest was made of (docs/benchmarks.md:
# 11.0 MiB linked in the default order, 7.6 MiB in this one).
#
#   scripts/startup-order.sh            # rewrite the file from this tree's release build
#   scripts/startup-order.sh --check    # say how many of its names this tree's build still has
#
# STARTUP_ORDER_BIN=PATH takes that build (release, symbols kept) instead of building one.
#
# Names go stale when a function is renamed or moved, or a dependency changes version; the
# linker skips names it does not find, so a stale file costs memory, not correctness, and CI's
# check of the installed server's memory (scripts/check-user-path.sh) says when to run this
# again. Needs valgrind (Debian's package). Builds the release binary with its symbols kept
# (`cargo rustc --release -- -C strip=none`: same profile, so the same mangled names as the
# build users install; another profile would hash them differently).
set -euo pipefail
cd "$(dirname "$0")/.."
load_name=startup-order
# shellcheck source=scripts/lib/http-load.sh
. scripts/lib/http-load.sh
mode="${1:-write}"
case "$mode" in write|--check) ;; *) load_die "unknown argument $mode (usage: $0 [--check])" ;; esac
load_need valgrind python3 nm
order=src/bin/startup-order.txt

bin="${STARTUP_ORDER_BIN:-}"
if [ -z "$bin" ]; then
  echo "$load_name: building the release binary with its symbols (minutes)" >&2
  cargo rustc --release --locked --quiet --bin smol-mcp -- -C strip=none >&2
  bin=target/release/smol-mcp
fi
nm "$bin" >/dev/null 2>&1 || load_die "$bin has no symbols (build it with -C strip=none)"

if [ "$mode" = --check ]; then
  have="$(nm --defined-only "$bin" | awk '{print $3}' | sort -u)"
  wanted="$(grep -v '^#' "$order" | sort -u)"
  total="$(wc -l <<<"$wanted")"
  found="$(comm -12 <(echo "$have") <(echo "$wanted") | wc -l)"
  echo "$order: $found of $total names are in this tree's build"
  exit 0
fi

trap load_cleanup EXIT
load_start_serve
trace="$load_work/callgrind.out"
SMOL_LOCAL_URL="unix://$load_work/api.sock" SMOL_MCP_RUNTIME_DIR="$load_work/rt" \
  HOME="$load_work" XDG_CONFIG_HOME="$load_work/config" SMOL_MCP_LOG=error \
  python3 - "$trace" "$bin" <<'PY'
import json, subprocess, sys
trace, binary = sys.argv[1:3]
server = subprocess.Popen(
    ["valgrind", "--tool=callgrind", "--demangle=no", "--compress-strings=no",
     "--callgrind-out-file=" + trace, binary],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
def call(id, method, params):
    server.stdin.write(json.dumps({"jsonrpc": "2.0", "id": id, "method": method, "params": params}) + "\n")
    server.stdin.flush()
    while True:
        line = server.stdout.readline()
        if not line:
            sys.exit(f"startup-order: the server ended before answering {method}")
        message = json.loads(line)
        if message.get("id") == id:
            if "error" in message or message.get("result", {}).get("isError"):
                sys.exit(f"startup-order: {method} failed: {line.strip()}")
            return
call(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "startup-order", "version": "0"}})
server.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
call(2, "tools/list", {})
for n in range(50):
    call(3 + n, "tools/call", {"name": "list-machines", "arguments": {}})
server.stdin.close()
server.wait(timeout=120)
PY

# callgrind writes `ob=` (the object) before the `fn=` lines of its functions; only the server's
# own binary's functions are kept, in the order callgrind first names them.
abs_bin="$(readlink -f "$bin")"
{
  echo "# The functions the stdio server runs from spawn through initialize, tools/list and 50"
  echo "# list-machines; written by scripts/startup-order.sh, read by build.rs. Do not edit."
  awk -v bin="$abs_bin" '
    /^ob=/ { ob = substr($0, 4); sub(/^\([0-9]+\) /, "", ob) }
    /^fn=/ && ob == bin { f = substr($0, 4); sub(/^\([0-9]+\) /, "", f); if (!(f in seen)) { seen[f] = 1; print f } }
  ' "$trace"*
} > "$order.new"
count="$(grep -vc '^#' "$order.new")"
[ "$count" -gt 100 ] || load_die "callgrind named only $count of the server's functions; $order left as it was"
mv "$order.new" "$order"
echo "$load_name: $order names $count functions" >&2
