#!/usr/bin/env bash
# Follows the README's "Install and use" section as a new user would, on a clean home directory
# with nothing on PATH but the toolchain and the system: runs the blocks marked
# `<!-- user-path: install -->` and `<!-- user-path: engine -->` as written, then starts the server
# from each client entry marked `<!-- user-path: client NAME -->` (its command, args and env)
# through the official Python MCP client, and lists the local machines, which starts the engine
# the server found in the installed smolmachines package. The clients themselves cannot run here.
#
# Needs network access to PyPI (the engine) and the Python MCP client in .venv (scripts/test.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

home="$(mktemp -d)"
cleanup() {
  # The server stops its engine at exit; a leftover one must not outlive the check either.
  pkill -f "$home/" 2>/dev/null || true
  rm -rf "$home"
}
trap cleanup EXIT

# The toolchain stays where it is installed (rustup's proxies need their homes); everything the
# user installs goes into the clean home.
cargo_bin="$(dirname "$(command -v cargo)")"
python_bin="$(dirname "$(command -v python3)")"
clean_path="$home/.cargo/bin:$cargo_bin:$python_bin:/usr/local/bin:/usr/bin:/bin"
user_env=(env -i "HOME=$home" "PATH=$clean_path" "LANG=C.UTF-8"
  "RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}" "CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}"
  "CARGO_INSTALL_ROOT=$home/.cargo" "CARGO_TARGET_DIR=$root/target")

# The fenced block that follows a marker line, without the list indentation.
block() {
  awk -v marker="<!-- user-path: $1 -->" '
    index($0, marker) { found = 1; next }
    found && /^ *```/ { if (inside) exit; inside = 1; next }
    found && inside { sub(/^  /, ""); print }
  ' README.md
}

for step in install engine; do
  script="$(block "$step")"
  [ -n "$script" ] || { echo "check-user-path: README has no '$step' block" >&2; exit 1; }
  echo "check-user-path: $step: $script" >&2
  "${user_env[@]}" bash -euo pipefail -c "$script" >&2
done

engine="$(ls "$home"/.local/lib/python3*/site-packages/smol/smol-vmm)"
echo "check-user-path: the engine is at $engine, and nothing named smolvm is on PATH" >&2
if PATH="$clean_path" command -v smolvm >/dev/null; then
  echo "check-user-path: smolvm is on the clean PATH; the check would prove nothing" >&2
  exit 1
fi

for client in claude-desktop cursor opencode; do
  entry="$(block "client $client")"
  [ -n "$entry" ] || { echo "check-user-path: README has no '$client' entry" >&2; exit 1; }
  .venv/bin/python tests/clients/user_path_check.py "$client" "$entry" "$clean_path" "$home"
done
