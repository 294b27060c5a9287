#!/usr/bin/env bash
# The server as a Python package (pyproject.toml: maturin's "bin" bindings), installed as a
# newcomer installs it, on Debian's own python3:
#  0. the portable wheel: manylinux_2_28, built with maturin and Zig and checked by auditwheel
#     (scripts/build-wheel.sh: its own release build, in target/wheel), then installed with pipx
#     (the README's wheel block) and with uv on a PATH with no compiler, each answering a client
#     (scripts/check-wheel.sh);
#  1. the wheel built from the clone: built from this checkout by pip in a virtualenv of Debian's python3 (maturin from
#     PyPI in pip's isolated build environment), then installed from the file into a fresh
#     virtualenv, which brings the engine with it (smolmachines from PyPI); `smol-mcp doctor
#     --quick` there must say the engine was installed with smol-mcp, and one stdio session of the
#     official Python client through that binary lists the local machines (starting that engine);
#  2. the README's one install command, the block marked `<!-- user-path: package -->`, run as
#     written on a clean home with Debian's python3 and pipx, then each client entry of the README
#     through the official Python client, the server found on PATH in ~/.local/bin.
# Prints the figures docs/benchmarks.md records ("check-package: figure: ...", "check-wheel:
# figure: ..."): the wheels' sizes, the portable wheel's build time and its time from the file to
# a first answered tool call, the clone's wheel's install time, and the README command's time.
#
#
#   scripts/check-package.sh [--portable-wheel FILE]
#
# --portable-wheel: step 0 takes this wheel, made by scripts/build-wheel.sh, instead of building
# it (scripts/test.sh builds it beside the other install checks' release build).
#
# Needs network access to PyPI, the Python MCP client in .venv, and Debian's python3,
# python3-venv and pipx (scripts/test.sh installs them). The clone's two builds share
# target/user-path with scripts/check-user-path.sh, so after it they compile nothing but what
# differs; the portable wheel cannot share it (another target triple, Zig's C compiler).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

check_name=check-package
# shellcheck source=scripts/lib/user-path.sh
. scripts/lib/user-path.sh

portable=""
case "${1:-}" in
  "") ;;
  --portable-wheel)
    portable="${2:-}"
    [ -f "$portable" ] || die "--portable-wheel takes a wheel that scripts/build-wheel.sh made, \
not '$portable'" ;;
  *) die "unknown argument $1 (usage: $0 [--portable-wheel FILE])" ;;
esac

command -v pipx >/dev/null || die "pipx is missing; the README installs with it: apt-get install pipx"
/usr/bin/python3 -c 'import ensurepip' 2>/dev/null || die "Debian's python3 has no venv module \
(ensurepip); install it from Debian's packages: apt-get install python3-venv"

work="$(mktemp -d)"
home="$(mktemp -d)"
trap 'stop_and_remove "$work" "$home"' EXIT
# No ~/.cargo/bin here: the package puts nothing there, and cargo itself is the toolchain's.
clean_path="$home/.local/bin:$cargo_bin:/usr/local/bin:/usr/bin:/bin"
python3_on "$clean_path"
user_env=(env -i "HOME=$home" "PATH=$clean_path" "LANG=C.UTF-8" "${toolchain_env[@]}"
  "CARGO_TARGET_DIR=$root/target/user-path" "${net_env[@]}")

# doctor_finds_its_engine BINARY: doctor's engine row names the engine of the package's own
# environment, not one found some other way.
doctor_finds_its_engine() {
  local report
  report="$("${user_env[@]}" SMOLVM_VM_UID_DROP=off "$1" doctor --quick || true)"
  echo "$report" | sed "s/^/$check_name: doctor: /" >&2
  echo "$report" | grep -q "installed with smol-mcp" \
    || die "$1 doctor --quick did not find the engine installed with it"
}

# 0. The portable wheel (manylinux_2_28, built with maturin and Zig and checked by auditwheel:
# scripts/build-wheel.sh), installed where no compiler is reachable, with pipx as the README's
# wheel block says and with uv, and answering (scripts/check-wheel.sh).
if [ -z "$portable" ]; then
  started=$SECONDS
  portable="$(scripts/build-wheel.sh)"
  echo "$check_name: figure: the portable wheel built in $((SECONDS - started)) s:" \
    "${portable##*/}, $(stat -c %s "$portable") bytes" >&2
fi
scripts/check-wheel.sh "$portable"

# 1. The wheel, built and installed from its file.
started=$SECONDS
"${user_env[@]}" /usr/bin/python3 -m venv "$work/build"
"${user_env[@]}" "$work/build/bin/pip" wheel --quiet --disable-pip-version-check --no-deps \
  --wheel-dir "$work/dist" . >&2
wheels=("$work"/dist/smol_mcp-*.whl)
[ -f "${wheels[0]}" ] || die "pip wheel left no smol_mcp wheel in $work/dist"
echo "$check_name: figure: the wheel built in $((SECONDS - started)) s: ${wheels[0]##*/}," \
  "$(stat -c %s "${wheels[0]}") bytes" >&2
listing="$(/usr/bin/python3 -m zipfile -l "${wheels[0]}")"
for binary in smol-mcp smol-mcp-http; do
  echo "$listing" | grep -q "\.data/scripts/$binary " || die "the wheel has no $binary"
done
if echo "$listing" | grep -q "\.data/scripts/smol-spec "; then
  die "the wheel carries smol-spec, a maintainers' report, into users' PATH"
fi
"${user_env[@]}" /usr/bin/python3 -m venv "$work/fresh"
started=$SECONDS
"${user_env[@]}" "$work/fresh/bin/pip" install --quiet --disable-pip-version-check "${wheels[0]}" >&2
echo "$check_name: figure: installed from the file into a fresh virtualenv in" \
  "$((SECONDS - started)) s (smolmachines downloaded from PyPI with it)" >&2
[ -x "$work/fresh/lib/python3"*/site-packages/smol/smol-vmm ] \
  || die "installing the wheel brought no engine (smolmachines) into its virtualenv"
no_smolvm_on "$clean_path"
doctor_finds_its_engine "$work/fresh/bin/smol-mcp"
.venv/bin/python tests/clients/user_path_check.py claude-desktop \
  "{\"mcpServers\": {\"smol\": {\"command\": \"$work/fresh/bin/smol-mcp\"}}}" "$clean_path" "$home"

# 2. The README's one command, then its client entries.
started=$SECONDS
run_step README.md package "${user_env[@]}"
echo "$check_name: figure: the README's package command took $((SECONDS - started)) s" >&2
[ -x "$home/.local/bin/smol-mcp" ] && [ -x "$home/.local/bin/smol-mcp-http" ] \
  || die "the package command left no smol-mcp and smol-mcp-http in ~/.local/bin"
no_smolvm_on "$clean_path"
[ ! -e "$home/.local/share/smol-mcp/engine" ] || die "the clean home has an install-engine.sh \
engine; the check would not tell where the engine came from"
doctor_finds_its_engine smol-mcp
clients "$home" "$clean_path"
