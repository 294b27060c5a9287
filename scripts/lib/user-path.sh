# What scripts/check-user-path.sh and scripts/check-package.sh share: a clean home with nothing
# on PATH but the Rust toolchain and the system, the README's marked blocks run as written, and
# the server started from each client entry through the official Python MCP client. Sourced, not
# run; the sourcing script sets `check_name` first.

die() { echo "$check_name: $*" >&2; exit 1; }

# A user's python3 is the system's, not the toolchain's (pyenv's, here): PEP 668 and all.
[ -x /usr/bin/python3 ] || die "/usr/bin/python3 is missing; the user path runs on Debian's own \
python3, so install it from Debian's packages: apt-get install python3 python3-venv"

# The toolchain stays where it is installed (rustup's proxies need their homes); everything the
# user installs goes into the clean home.
cargo_bin="$(dirname "$(command -v cargo)")"
toolchain_env=("RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}" "CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}")

# What a download from PyPI needs of this environment, certificates and proxy, when it is set
# (not PIP_FIND_LINKS and the like: the engine comes from PyPI, as a user's would).
net_env=()
for var in PIP_CERT SSL_CERT_FILE REQUESTS_CA_BUNDLE HTTPS_PROXY https_proxy; do
  if [ -n "${!var:-}" ]; then
    net_env+=("$var=${!var}")
  fi
done

# The engine must come from the README's steps, not from a package already on this host.
for system_engine in /usr/local/lib/python3*/*-packages/smol/smol-vmm \
                     /usr/lib/python3*/*-packages/smol/smol-vmm; do
  if [ -e "$system_engine" ]; then
    die "$system_engine is installed system-wide, and the server would find it in any home; \
the check would prove nothing"
  fi
done

# python3_on PATH: the clean PATH's python3 must be Debian's, or the check follows no user.
python3_on() {
  local found
  found="$(PATH="$1" command -v python3 || true)"
  [ "$found" = /usr/bin/python3 ] || die "python3 on the clean PATH is ${found:-missing}, not \
Debian's /usr/bin/python3; the check would not follow a user's system"
}

# block NAME FILE: the fenced block that follows the line `<!-- user-path: NAME -->` in FILE (the
# README, or docs/install.md), without the list indentation.
block() {
  awk -v marker="<!-- user-path: $1 -->" '
    index($0, marker) { found = 1; next }
    found && /^ *```/ { if (inside) exit; inside = 1; next }
    found && inside { sub(/^  /, ""); print }
  ' "$2"
}

# run_step FILE STEP ENV...: FILE's block for STEP, as written, under `env -i ENV...`.
run_step() {
  local file="$1" step="$2" script
  shift 2
  script="$(block "$step" "$file")"
  [ -n "$script" ] || die "$file has no '$step' block"
  echo "$check_name: $step: $script" >&2
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
    entry="$(block "client $client" README.md)"
    [ -n "$entry" ] || die "README has no '$client' entry"
    .venv/bin/python tests/clients/user_path_check.py "$client" "$entry" "$2" "$1"
  done
}

# stop_and_remove HOME...: a leftover engine must not outlive the check (the server stops its
# engine at exit), nor the homes.
stop_and_remove() {
  local h
  for h in "$@"; do
    pkill -f "$h/" 2>/dev/null || true
    rm -rf "$h"
  done
}
