#!/usr/bin/env bash
# Follows the way without pipx (docs/install.md: `cargo install`, then the engine apart) as a new
# user would, on a clean home directory with nothing on PATH but the Rust toolchain and the
# system, whose python3 is Debian's own (/usr/bin/python3, externally managed), not the
# toolchain's: runs docs/install.md's blocks marked `<!-- user-path: install -->` and
# `<!-- user-path: engine -->` as written, then starts the server from each README client entry
# marked `<!-- user-path: client NAME -->` (its command, args and env) through the official
# Python MCP client, and lists the local machines, which starts the engine the server found
# where the engine block put it (~/.local/share/smol-mcp/engine/<version>/). Then the same again
# in a second clean home with the `<!-- user-path: engine-venv -->` block (the engine from pip in
# a virtualenv at ~/.local/share/smol-mcp/venv) instead of the engine block, and no VIRTUAL_ENV
# set. The clients themselves cannot run here. The README's own way, the package, is
# scripts/check-package.sh's.
#
# Needs network access to PyPI (the engine), the Python MCP client in .venv (scripts/test.sh), and
# Debian's python3 and python3-venv (`apt-get install python3 python3-venv`; scripts/test.sh
# installs them).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

check_name=check-user-path
# shellcheck source=scripts/lib/user-path.sh
. scripts/lib/user-path.sh

home="$(mktemp -d)"
venv_home="$(mktemp -d)"
trap 'stop_and_remove "$home" "$venv_home"' EXIT

clean_path_in() { echo "$1/.cargo/bin:$cargo_bin:/usr/local/bin:/usr/bin:/bin"; }
clean_path="$(clean_path_in "$home")"
python3_on "$clean_path"
user_env=(env -i "HOME=$home" "PATH=$clean_path" "LANG=C.UTF-8" "${toolchain_env[@]}"
  "CARGO_INSTALL_ROOT=$home/.cargo" "CARGO_TARGET_DIR=$root/target/user-path")

# The virtualenv way needs Debian's venv module; said now rather than after the build.
venv_block="$(block engine-venv docs/install.md)"
if [ -n "$venv_block" ] && ! /usr/bin/python3 -c 'import ensurepip' 2>/dev/null; then
  die "Debian's python3 has no venv module (ensurepip), which the engine-venv block needs; \
install it from Debian's packages: apt-get install python3-venv"
fi

started=$SECONDS
run_step docs/install.md install "${user_env[@]}"
echo "check-user-path: cargo install took $((SECONDS - started)) s" >&2
for binary in smol-mcp smol-mcp-http; do
  [ -x "$home/.cargo/bin/$binary" ] || die "the install block left no $binary in ~/.cargo/bin"
done
[ ! -e "$home/.cargo/bin/smol-spec" ] || die "the install block put smol-spec, a maintainers' \
report, on the user's PATH"
# The stdio server's memory at rest as installed: peak RSS (VmHWM) after initialize and
# tools/list, the median of five fresh processes, within 10 MiB (docs/benchmarks.md). Above it,
# the order of start-up's functions (src/bin/startup-order.txt) has most likely gone stale:
# scripts/startup-order.sh writes it again.
rss_kib="$("${user_env[@]}" /usr/bin/python3 scripts/lib/rss-at-rest.py "$home/.cargo/bin/smol-mcp")"
echo "check-user-path: the installed stdio server's peak RSS after initialize and tools/list: \
$rss_kib KiB (median of 5)" >&2
[ "$rss_kib" -le 10240 ] || die "the installed stdio server holds $rss_kib KiB at rest, over \
10 MiB: run scripts/startup-order.sh (its start-up order has likely gone stale)"
run_step docs/install.md engine "${user_env[@]}" "${net_env[@]}"

engines=("$home"/.local/share/smol-mcp/engine/*/smol-vmm)
[ -x "${engines[0]}" ] || die "the engine block left no engine in \
~/.local/share/smol-mcp/engine/<version>/smol-vmm, where scripts/install-engine.sh puts it"
echo "check-user-path: the engine is at ${engines[*]}, and nothing named smolvm is on PATH" >&2
no_smolvm_on "$clean_path"
clients "$home" "$clean_path"

# The virtualenv way, in a home of its own: the server from step 1 (copied, not built again), the
# engine from the engine-venv block, which the server finds without VIRTUAL_ENV (env -i sets none).
if [ -z "$venv_block" ]; then
  echo "check-user-path: docs/install.md has no 'engine-venv' block; no virtualenv home checked" >&2
  exit 0
fi
venv_path="$(clean_path_in "$venv_home")"
mkdir -p "$venv_home/.cargo/bin"
cp -a "$home/.cargo/bin/." "$venv_home/.cargo/bin/"
venv_env=(env -i "HOME=$venv_home" "PATH=$venv_path" "LANG=C.UTF-8" "${net_env[@]}")
run_step docs/install.md engine-venv "${venv_env[@]}"

engines=("$venv_home"/.local/share/smol-mcp/venv/lib/python3*/site-packages/smol/smol-vmm)
[ -x "${engines[0]}" ] || die "the engine-venv block left no engine in \
~/.local/share/smol-mcp/venv/lib/python3*/site-packages/smol/smol-vmm"
[ ! -e "$venv_home/.local/share/smol-mcp/engine" ] || die "the engine-venv home has an \
install-engine.sh engine too; the check would not tell the two ways apart"
echo "check-user-path: the virtualenv's engine is at ${engines[*]}, no VIRTUAL_ENV is set, and \
nothing named smolvm is on PATH" >&2
no_smolvm_on "$venv_path"
clients "$venv_home" "$venv_path"
