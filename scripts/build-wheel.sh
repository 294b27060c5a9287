#!/usr/bin/env bash
# Builds the portable wheel: the two servers in a manylinux_2_28 wheel (any Linux with glibc 2.28
# or newer) for this machine's architecture, with maturin and Zig as its C compiler and linker,
# both from PyPI (scripts/wheel-tools.txt pins them), so no other toolchain is fetched. Then
# checks it as an index would: auditwheel must find it consistent with its manylinux_2_28 tag
# (nothing linked outside the policy's system libraries), and its metadata must carry the
# `mcp-name:` marker the MCP registry looks for in the package's README. Prints the wheel's path
# on stdout, progress on stderr.
#
#   scripts/build-wheel.sh [--out DIR] [--keep-symbols]     # default DIR: target/wheels
#
# --keep-symbols: the servers keep their symbols (rustc's `-C strip=none` on the two binaries
# alone, so every name stays as in the wheel users get), for scripts/startup-order.sh.
#
# The release workflow's Linux jobs (.github/workflows/release.yml) build the same way;
# scripts/check-package.sh runs this one and installs what it makes. Needs a Rust toolchain
# (rustup, for the target's standard library) and python3 with venv; the build's own target
# directory is target/wheel (CARGO_TARGET_DIR overrides it).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

prog=build-wheel
log() { echo "$prog: $*" >&2; }
die() { log "$*"; exit 1; }

out="$root/target/wheels"
rustc_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ -n "${2:-}" ] || die "--out needs a directory"; out="$2"; shift 2 ;;
    --keep-symbols) rustc_args=(-- -C strip=none); shift ;;
    -h|--help) sed -n '2,/^set -euo/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (usage: $0 [--out DIR] [--keep-symbols])" ;;
  esac
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"

case "$(uname -m)" in
  x86_64|amd64) arch=x86_64 ;;
  aarch64|arm64) arch=aarch64 ;;
  *) die "no manylinux wheel is built for $(uname -m) here" ;;
esac
[ "$(uname -s)" = Linux ] || die "this script builds Linux wheels; macOS wheels are the release workflow's"
triple="$arch-unknown-linux-gnu"
tag="manylinux_2_28_$arch"

# The tools, pinned, in a virtualenv of their own (made again when the pins change).
tools="$root/target/wheel-tools"
if ! cmp -s scripts/wheel-tools.txt "$tools/pins.txt" 2>/dev/null; then
  log "installing the pinned build tools into $tools"
  rm -rf "$tools"
  python3 -m venv "$tools"
  "$tools/bin/pip" install --quiet --disable-pip-version-check -r scripts/wheel-tools.txt >&2
  cp scripts/wheel-tools.txt "$tools/pins.txt"
fi
rustup target list --installed 2>/dev/null | grep -qx "$triple" || rustup target add "$triple" >&2

# maturin finds Zig through `python3 -m ziglang` (the ziglang wheel puts no zig on PATH), so the
# tools' python3 comes first on PATH.
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)"
wheel="$out/smol_mcp-$version-py3-none-$tag.whl"
rm -f "$wheel"
started=$SECONDS
log "building $tag with maturin and Zig (a release build: minutes)"
PATH="$tools/bin:$PATH" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/wheel}" \
  maturin build --release --locked --zig --compatibility manylinux_2_28 --target "$triple" \
  --out "$out" ${rustc_args[@]+"${rustc_args[@]}"} >&2
[ -f "$wheel" ] || die "maturin left no $(basename "$wheel") in $out: $(ls "$out")"
log "built $(basename "$wheel") in $((SECONDS - started)) s, $(stat -c %s "$wheel") bytes"

# What an index and a user's pip will see.
report="$("$tools/bin/auditwheel" show "$wheel" 2>&1)" || die "auditwheel could not read the wheel: $report"
echo "$report" | sed "s/^/$prog: auditwheel: /" >&2
echo "$report" | tr '\n' ' ' | grep -q "consistent with the following platform tag: \"$tag\"" \
  || die "auditwheel does not find the wheel consistent with $tag"
if echo "$report" | grep -qi "external shared libraries"; then
  die "the wheel needs shared libraries outside the manylinux policy"
fi
name="$(sed -n 's/^ *"name": "\(io\.github\.[^"]*\)".*/\1/p' server.json | head -n 1)"
[ -n "$name" ] || die "server.json names no io.github.* server"
"$tools/bin/python" - "$wheel" "$name" <<'PY' || die "the wheel's metadata is not what the index needs"
import sys, zipfile
wheel, name = sys.argv[1:3]
with zipfile.ZipFile(wheel) as z:
    metadata = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(metadata).decode()
    scripts = sorted(n.rsplit("/", 1)[1] for n in z.namelist() if ".data/scripts/" in n)
if f"mcp-name: {name}" not in text:
    sys.exit(f"build-wheel: METADATA has no 'mcp-name: {name}' (the README's marker)")
if scripts != ["smol-mcp", "smol-mcp-http"]:
    sys.exit(f"build-wheel: the wheel's scripts are {scripts}, not smol-mcp and smol-mcp-http")
print(f"build-wheel: METADATA carries mcp-name: {name}; scripts {scripts}", file=sys.stderr)
PY
echo "$wheel"
