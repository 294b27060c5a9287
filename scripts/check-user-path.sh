#!/usr/bin/env bash
# Follows the README's "Install and use" section as a new user would, on a clean home directory
# with nothing on PATH but the Rust toolchain and the system, whose python3 is Debian's own
# (/usr/bin/python3, externally managed), not the toolchain's: runs the blocks marked
# `<!-- user-path: install -->` and `<!-- user-path: engine -->` as written, then starts the server
# from each client entry marked `<!-- user-path: client NAME -->` (its command, args and env)
# through the official Python MCP client, and lists the local machines, which starts the engine
# the server found where the engine block put it (~/.local/share/smol-mcp/engine/<version>/).
# When the README also has a block marked `<!-- user-path: engine-venv -->` (the engine from pip
# in a virtualenv at ~/.local/share/smol-mcp/venv), the same again in a second clean home with
# that block instead of the engine block, and no VIRTUAL_ENV set. The clients themselves cannot
# run here.
#
# Needs network access to PyPI (the engine), the Python MCP client in .venv (scripts/test.sh), and
# Debian's python3 and python3-venv (`apt-get install python3 python3-venv`; scripts/test.sh
# installs them).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

die() { echo "check-user-path: $*" >&2; exit 1; }

home="$(mktemp -d)"
venv_home="$(mktemp -d)"
cleanup() {
  # The server stops its engine at exit; a leftover one must not outlive the check either.
  local h
  for h in "$home" "$venv_home"; do
    pkill -f "$h/" 2>/dev/null || true
    rm -rf "$h"
  done
}
trap cleanup EXIT

# A user's python3 is the system's, not the toolchain's (pyenv's, here): PEP 668 and all.
[ -x /usr/bin/python3 ] || die "/usr/bin/python3 is missing; the user path runs on Debian's own \
python3, so install it from Debian's packages: apt-get install python3 python3-venv"

# The toolchain stays where it is installed (rustup's proxies need their homes); everything the
# user installs goes into the clean home.
cargo_bin="$(dirname "$(command -v cargo)")"
clean_path_in() { echo "$1/.cargo/bin:$cargo_bin:/usr/local/bin:/usr/bin:/bin"; }
clean_path="$(clean_path_in "$home")"
user_python="$(PATH="$clean_path" command -v python3 || true)"
[ "$user_python" = /usr/bin/python3 ] || die "python3 on the clean PATH is ${user_python:-missing}, \
not Debian's /usr/bin/python3; the check would not follow a user's system"
user_env=(env -i "HOME=$home" "PATH=$clean_path" "LANG=C.UTF-8"
  "RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}" "CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}"
  "CARGO_INSTALL_ROOT=$home/.cargo" "CARGO_TARGET_DIR=$root/target/user-path")
# What a download from PyPI needs of this environment, certificates and proxy, when it is set
# (not PIP_FIND_LINKS and the like: the engine comes from PyPI, as a user's would).
net_env=()
for var in PIP_CERT SSL_CERT_FILE REQUESTS_CA_BUNDLE HTTPS_PROXY https_proxy; do
  if [ -n "${!var:-}" ]; then
    net_env+=("$var=${!var}")
  fi
done

# The engine must come from the README's blocks, not from a package already on this host.
for system_engine in /usr/local/lib/python3*/*-packages/smol/smol-vmm \
                     /usr/lib/python3*/*-packages/smol/smol-vmm; do
  if [ -e "$system_engine" ]; then
    die "$system_engine is installed system-wide, and the server would find it in any home; \
the check would prove nothing"
  fi
done

# The fenced block that follows a marker line, without the list indentation.
block() {
  awk -v marker="<!-- user-path: $1 -->" '
    index($0, marker) { found = 1; next }
    found && /^ *```/ { if (inside) exit; inside = 1; next }
    found && inside { sub(/^  /, ""); print }
  ' README.md
}

# run_step STEP ENV...: the README's block for STEP, as written, under `env -i ENV...`.
run_step() {
  local step="$1" script
  shift
  script="$(block "$step")"
  [ -n "$script" ] || die "README has no '$step' block"
  echo "check-user-path: $step: $script" >&2
  "$@" bash -euo pipefail -c "$script" >&2
}

# no_smolvm_on PATH: the engine is found by the server, not as `smolvm` on PATH.
no_smolvm_on() {
  if PATH="$1" command -v smolvm > /dev/null; then
    die "smolvm is on the clean PATH ($(PATH="$1" command -v smolvm)); the check would prove nothing"
  fi
}

# clients HOME PATH: the server started from each client entry, listing the local machines.
clients() {
  local client entry
  for client in claude-desktop cursor opencode; do
    entry="$(block "client $client")"
    [ -n "$entry" ] || die "README has no '$client' entry"
    .venv/bin/python tests/clients/user_path_check.py "$client" "$entry" "$2" "$1"
  done
}

# The virtualenv way needs Debian's venv module; said now rather than after the build.
venv_block="$(block engine-venv)"
if [ -n "$venv_block" ] && ! /usr/bin/python3 -c 'import ensurepip' 2>/dev/null; then
  die "Debian's python3 has no venv module (ensurepip), which the engine-venv block needs; \
install it from Debian's packages: apt-get install python3-venv"
fi

started=$SECONDS
run_step install "${user_env[@]}"
echo "check-user-path: cargo install took $((SECONDS - started)) s" >&2
run_step engine "${user_env[@]}" "${net_env[@]}"

engines=("$home"/.local/share/smol-mcp/engine/*/smol-vmm)
[ -x "${engines[0]}" ] || die "the engine block left no engine in \
~/.local/share/smol-mcp/engine/<version>/smol-vmm, where scripts/install-engine.sh puts it"
echo "check-user-path: the engine is at ${engines[*]}, and nothing named smolvm is on PATH" >&2
no_smolvm_on "$clean_path"
clients "$home" "$clean_path"

# The virtualenv way, in a home of its own: the server from step 1 (copied, not built again), the
# engine from the engine-venv block, which the server finds without VIRTUAL_ENV (env -i sets none).
if [ -z "$venv_block" ]; then
  echo "check-user-path: README has no 'engine-venv' block; no virtualenv home checked" >&2
  exit 0
fi
venv_path="$(clean_path_in "$venv_home")"
mkdir -p "$venv_home/.cargo/bin"
cp -a "$home/.cargo/bin/." "$venv_home/.cargo/bin/"
venv_env=(env -i "HOME=$venv_home" "PATH=$venv_path" "LANG=C.UTF-8" "${net_env[@]}")
run_step engine-venv "${venv_env[@]}"

engines=("$venv_home"/.local/share/smol-mcp/venv/lib/python3*/site-packages/smol/smol-vmm)
[ -x "${engines[0]}" ] || die "the engine-venv block left no engine in \
~/.local/share/smol-mcp/venv/lib/python3*/site-packages/smol/smol-vmm"
[ ! -e "$venv_home/.local/share/smol-mcp/engine" ] || die "the engine-venv home has an \
install-engine.sh engine too; the check would not tell the two ways apart"
echo "check-user-path: the virtualenv's engine is at ${engines[*]}, no VIRTUAL_ENV is set, and \
nothing named smolvm is on PATH" >&2
no_smolvm_on "$venv_path"
clients "$venv_home" "$venv_path"
