#!/usr/bin/env bash
# Installs a built wheel as a user without any compiler would, and checks that it answers: on a
# PATH of the system's commands less every compiler and linker (no cc, ld, rustc or cargo), in a
# clean home, with the system's python3, first with pipx (the README's wheel block, as written)
# and then with `uv tool install` (uv from PyPI, pinned in scripts/wheel-tools.txt); each time
# `smol-mcp doctor --quick`, then one session of the official Python MCP client through the
# installed binary, which lists the local machines (starting the engine installed with it).
# Prints "check-wheel: figure: ..." lines: from the wheel file to a first answered tool call.
#
#   scripts/check-wheel.sh WHEEL [--no-engine]
#
# --no-engine: for the platforms the engine has no wheel for (musllinux, macOS x86_64), whose
# wheels the release workflow builds without the engine dependency: the client session lists
# the tools and calls none, and doctor may find no engine.
#
# scripts/check-package.sh runs it on the wheel of scripts/build-wheel.sh; the release workflow
# (.github/workflows/release.yml) on each platform's wheel. Needs pipx, python3 with venv, and the
# Python MCP client in .venv (tests/clients/requirements.txt).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

check_name=check-wheel
die() { echo "$check_name: $*" >&2; exit 1; }

wheel="${1:-}"
[ -f "$wheel" ] || die "usage: $0 WHEEL [--no-engine] (no wheel file at '${wheel}')"
wheel="$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")"
engine=1
case "${2:-}" in
  "") ;;
  --no-engine) engine=0 ;;
  *) die "unknown option $2 (usage: $0 WHEEL [--no-engine])" ;;
esac
command -v pipx >/dev/null || die "pipx is missing; the README installs with it (apt-get install pipx)"
[ -x .venv/bin/python ] || die "no .venv with the Python MCP client: python3 -m venv .venv && \
.venv/bin/pip install -r tests/clients/requirements.txt"

# uv, pinned, from PyPI (the build tools' virtualenv has it when build-wheel.sh ran here).
uv="$root/target/wheel-tools/bin/uv"
if [ ! -x "$uv" ]; then
  uv="$root/target/check-wheel-uv/bin/uv"
  if [ ! -x "$uv" ]; then
    python3 -m venv "$root/target/check-wheel-uv"
    "$root/target/check-wheel-uv/bin/pip" install --quiet --disable-pip-version-check \
      "$(grep -x 'uv==.*' scripts/wheel-tools.txt)" >&2
  fi
fi

work="$(mktemp -d)"
pipx_home="$work/pipx-home"
uv_home="$work/uv-home"
mkdir -p "$pipx_home" "$uv_home"
cleanup() {
  # A server's engine must not outlive the check, nor the homes.
  pkill -f "$work/" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The system's commands, less every compiler and linker; pipx and uv beside them.
no_compiler="$work/no-compiler"
mkdir -p "$no_compiler"
for command in /usr/bin/* /bin/*; do
  name="${command##*/}"
  case "$name" in
    cc|c++|c89*|c99*|cpp*|gcc*|g++*|clang*|ld|ld.*|lld*|as|gold|rustc|rustdoc|rust-*|cargo*|rustup) continue ;;
    zig|tcc|xcrun|*-gcc*|*-g++*|*-cc|*-c++|*-cpp*|*-ld|*-ld.*|*-as) continue ;;
  esac
  [ -e "$no_compiler/$name" ] || ln -s "$command" "$no_compiler/$name"
done
ln -sf "$(command -v pipx)" "$no_compiler/pipx"
ln -sf "$uv" "$no_compiler/uv"
for compiler in cc gcc c++ g++ clang ld as rustc cargo rustup zig; do
  if PATH="$no_compiler" command -v "$compiler" >/dev/null; then
    die "$compiler is on the compiler-free PATH ($(PATH="$no_compiler" command -v "$compiler"))"
  fi
done
PATH="$no_compiler" command -v python3 >/dev/null || die "the system has no python3 in /usr/bin"

# What a download from an index needs of this environment, when it is set.
net_env=()
for var in PIP_INDEX_URL PIP_CERT SSL_CERT_FILE REQUESTS_CA_BUNDLE HTTPS_PROXY https_proxy UV_INDEX_URL; do
  if [ -n "${!var:-}" ]; then
    net_env+=("$var=${!var}")
  fi
done
# user HOME: a clean user of that home on the compiler-free PATH; uv kept to the system python3.
user() {
  local h="$1"
  shift
  env -i "HOME=$h" "PATH=$h/.local/bin:$no_compiler" "LANG=C.UTF-8" \
    "UV_PYTHON_DOWNLOADS=never" ${net_env[@]+"${net_env[@]}"} "$@"
}

# The README's wheel block, as written, with the wheel's own file name in it.
block="$(awk '
  index($0, "<!-- user-path: wheel -->") { found = 1; next }
  found && /^ *```/ { if (inside) exit; inside = 1; next }
  found && inside { print }
' README.md)"
[ -n "$block" ] || die "README.md has no 'user-path: wheel' block"
case "$block" in
  *"${wheel##*/}"*) ;;
  *) die "the README's wheel block names another file than ${wheel##*/}: $block" ;;
esac

answer() {
  local h="$1" how="$2" since="$3" report
  [ -x "$h/.local/bin/smol-mcp" ] && [ -x "$h/.local/bin/smol-mcp-http" ] \
    || die "$how left no smol-mcp and smol-mcp-http in ~/.local/bin"
  if [ "$engine" = 1 ]; then
    .venv/bin/python tests/clients/user_path_check.py claude-desktop \
      '{"mcpServers": {"smol": {"command": "smol-mcp"}}}' "$h/.local/bin:$no_compiler" "$h"
  else
    .venv/bin/python tests/clients/user_path_check.py claude-desktop \
      '{"mcpServers": {"smol": {"command": "smol-mcp"}}}' "$h/.local/bin:$no_compiler" "$h" --tools-only
  fi
  echo "$check_name: figure: $how: from the wheel file to a first answered tool call in" \
    "$(python3 -c "import time; print(f'{time.time() - $since:.1f}')") s" >&2
  report="$(user "$h" SMOLVM_VM_UID_DROP=off smol-mcp doctor --quick || true)"
  echo "$report" | sed "s/^/$check_name: doctor: /" >&2
  if [ "$engine" = 1 ]; then
    echo "$report" | grep -q "installed with smol-mcp" \
      || die "$how: doctor --quick did not find the engine installed with the wheel"
  fi
}

since="$(python3 -c "import time; print(time.time())")"
(cd "$(dirname "$wheel")" && user "$pipx_home" bash -euo pipefail -c "$block" >&2) \
  || die "the README's wheel block failed on a PATH without compilers: $block"
answer "$pipx_home" "pipx install (the README's wheel block)" "$since"

# The stdio server's memory at rest, as for the `cargo install`ed server (scripts/check-user-path.sh):
# within 10 MiB. Held where build.rs lays start-up's functions out together for the wheel's linker
# (x86_64 glibc); printed only on other Linux wheels, and not measured without /proc (macOS).
if [ -r /proc/self/status ]; then
  rss_kib="$(user "$pipx_home" python3 "$root/scripts/lib/rss-at-rest.py" "$pipx_home/.local/bin/smol-mcp")"
  echo "$check_name: figure: the wheel's stdio server's peak RSS after initialize and tools/list:" \
    "$rss_kib KiB (median of 5)" >&2
  case "${wheel##*/}" in
    *-manylinux_*_x86_64.whl)
      [ "$rss_kib" -le 10240 ] || die "the wheel's stdio server holds $rss_kib KiB at rest, over \
10 MiB: run scripts/startup-order.sh (its start-up order has likely gone stale)" ;;
  esac
fi

since="$(python3 -c "import time; print(time.time())")"
(cd "$(dirname "$wheel")" && user "$uv_home" uv tool install --quiet "./${wheel##*/}" >&2) \
  || die "uv tool install failed on a PATH without compilers"
answer "$uv_home" "uv tool install" "$since"
echo "$check_name: ${wheel##*/} installed with pipx and with uv where no compiler is reachable, and answered" >&2
