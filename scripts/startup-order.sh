#!/usr/bin/env bash
# Writes src/bin/startup-order.txt: the functions the stdio server runs from spawn through
# initialize, tools/list and 50 list-machines (the real pinned `smolvm serve` behind it), as
# callgrind sees them run, by their mangled names, for each of the two builds users run:
#  1. `cargo install`'s (the default linker, rust-lld, takes the list: --symbol-ordering-file);
#  2. the portable wheel's (scripts/build-wheel.sh: maturin and Zig, whose linker takes a script
#     that build.rs writes from the list). maturin's cargo gives every crate other metadata, so
#     the same function has another name there (another hash); hence names of its own.
# Each linker skips the names its build does not have. Laid out together, those functions touch
# few pages: the kernel maps the pages around every page of code a process touches, so code that
# start-up touches scattered over the binary is what its memory at rest was made of
# (docs/benchmarks.md: 11.0 MiB linked in the default order, 7.6 MiB in this one).
#
#   scripts/startup-order.sh            # rewrite the file from this tree's two release builds
#   scripts/startup-order.sh --check    # say how many of its names each build still has
#
# STARTUP_ORDER_BIN=PATH and STARTUP_ORDER_WHEEL_BIN=PATH take those builds (release, symbols
# kept) instead of building them.
#
# Names go stale when a function is renamed or moved, or a dependency changes version; the
# linker skips names it does not find, so a stale file costs memory, not correctness, and CI's
# checks of the servers' memory (scripts/check-user-path.sh, scripts/check-wheel.sh) say when to
# run this again. Needs valgrind (Debian's package). Builds each with its symbols kept (rustc's
# `-C strip=none` on the binaries alone, the same profile: the same mangled names as the builds
# users install; another profile would hash them differently).
set -euo pipefail
cd "$(dirname "$0")/.."
load_name=startup-order
# shellcheck source=scripts/lib/http-load.sh
. scripts/lib/http-load.sh
mode="${1:-write}"
case "$mode" in write|--check) ;; *) load_die "unknown argument $mode (usage: $0 [--check])" ;; esac
load_need valgrind python3 nm
order=src/bin/startup-order.txt

install_bin="${STARTUP_ORDER_BIN:-}"
if [ -z "$install_bin" ]; then
  echo "$load_name: building cargo install's release binary with its symbols (minutes)" >&2
  cargo rustc --release --locked --quiet --bin smol-mcp -- -C strip=none >&2
  install_bin=target/release/smol-mcp
fi
wheel_bin="${STARTUP_ORDER_WHEEL_BIN:-}"
if [ -z "$wheel_bin" ]; then
  echo "$load_name: building the portable wheel with its symbols (minutes)" >&2
  wheels="$(mktemp -d)"
  scripts/build-wheel.sh --keep-symbols --out "$wheels" >/dev/null
  rm -rf "$wheels"
  wheel_bin="${CARGO_TARGET_DIR:-target/wheel}/$(uname -m)-unknown-linux-gnu/release/smol-mcp"
fi
for bin in "$install_bin" "$wheel_bin"; do
  nm "$bin" >/dev/null 2>&1 || load_die "$bin has no symbols (build it with -C strip=none)"
done

if [ "$mode" = --check ]; then
  wanted="$(grep -v '^#' "$order" | sort -u)"
  for bin in "$install_bin" "$wheel_bin"; do
    have="$(nm --defined-only "$bin" | awk '{print $3}' | sort -u)"
    found="$(comm -12 <(echo "$have") <(echo "$wanted") | wc -l)"
    echo "$order: $found of its $(wc -l <<<"$wanted") names are in $bin"
  done
  exit 0
fi

trap load_cleanup EXIT
load_start_serve
# trace BINARY OUT: the functions of BINARY that callgrind saw run, in the order it first names
# them, one per line in OUT.
trace() {
  local bin="$1" out="$2" calls="$load_work/callgrind.out" abs_bin count
  rm -f "$calls"*
  SMOL_LOCAL_URL="unix://$load_work/api.sock" SMOL_MCP_RUNTIME_DIR="$load_work/rt" \
    HOME="$load_work" XDG_CONFIG_HOME="$load_work/config" SMOL_MCP_LOG=error \
    python3 - "$calls" "$bin" <<'PY'
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
  # callgrind writes `ob=` (the object) before the `fn=` lines of its functions; only the
  # server's own binary's functions are kept.
  abs_bin="$(readlink -f "$bin")"
  awk -v bin="$abs_bin" '
    /^ob=/ { ob = substr($0, 4); sub(/^\([0-9]+\) /, "", ob) }
    /^fn=/ && ob == bin { f = substr($0, 4); sub(/^\([0-9]+\) /, "", f); if (!(f in seen)) { seen[f] = 1; print f } }
  ' "$calls"* > "$out"
  count="$(wc -l < "$out")"
  [ "$count" -gt 100 ] || load_die "callgrind named only $count of $bin's functions; $order left as it was"
}
trace "$install_bin" "$load_work/install.names"
trace "$wheel_bin" "$load_work/wheel.names"
{
  echo "# The functions the stdio server runs from spawn through initialize, tools/list and 50"
  echo "# list-machines, in cargo install's build and then in the portable wheel's (names the"
  echo "# first has are not repeated); written by scripts/startup-order.sh, read by build.rs."
  echo "# Do not edit."
  cat "$load_work/install.names"
  grep -vxF -f "$load_work/install.names" "$load_work/wheel.names" || true
} > "$order.new"
mv "$order.new" "$order"
echo "$load_name: $order names $(grep -vc '^#' "$order") functions ($(wc -l < "$load_work/install.names")" \
  "in cargo install's build, $(wc -l < "$load_work/wheel.names") in the wheel's)" >&2
