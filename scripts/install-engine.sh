#!/usr/bin/env bash
# Installs the smolvm engine the local fleet runs. It ships only inside the `smolmachines` wheel
# on PyPI (as smol/smol-vmm, with the libraries and images it loads beside it), and that wheel
# puts nothing on PATH. This script has pip download the pinned wheel for this platform by name,
# version and sha256 (pip's hash-checking mode, so pip refuses any other file), from whichever
# index this machine's pip is set up for: PyPI, or the mirror or proxy that PIP_INDEX_URL,
# pip.conf or the like name. It keeps no index address of its own. It checks the sha256 again,
# and unpacks the engine into
#
#   ${XDG_DATA_HOME:-$HOME/.local/share}/smol-mcp/engine/<version>/smol-vmm
#
# where the server looks for it. Prints the engine's path on stdout, progress on stderr. Safe to
# re-run: an engine already unpacked from the same wheel is left as it is. It only downloads with
# pip, never installs, so an "externally managed" system python3 is fine; without `python3 -m pip`
# it makes a throwaway virtualenv for pip (python3's venv module).
#
#   scripts/install-engine.sh                  # smolmachines 1.32.2, the version the server pins
#   scripts/install-engine.sh 1.14.3           # another pinned version
#   scripts/install-engine.sh --into DIR [V]   # unpack into DIR instead (scripts/fetch-smolvm.sh)
#
# The download is pip's: it honours pip's configuration and environment (PIP_INDEX_URL,
# PIP_CERT, HTTPS_PROXY and the rest).
set -euo pipefail

prog=install-engine
default_version=1.32.2

# The pinned wheels: version, platform, the glibc floor of its manylinux tag (- for macOS), and
# the sha256 of the wheel file, from PyPI's JSON API (releases.<version>[].digests.sha256) or the
# simple index's #sha256=. PyPI has no macOS x86_64 wheel, and the Linux wheels need glibc.
pins='
1.32.2 linux-x86_64  2.28 81b104e2622aa0b187b6b7054397c391151b83db2638a16d0e54c517684f0dc2
1.32.2 linux-aarch64 2.28 5cdd53c71369f149639f00197ce9deaafd204d2bda03b323b1ae3ee35ba4cf8b
1.32.2 macos-arm64   -    af690651bd2d2e329f3ab15d35acd7037a3a94581b3f79c08d1df867e8ef54f9
1.14.3 linux-x86_64  2.34 d26b0d9b310a0d5483314198a02be3d60a60dfeb5677f11b6703277b2e65ee28
1.14.3 linux-aarch64 2.34 4ce4b78b031af4a45714dc17d84142056e3e5906890fd46c21baea4e06b3bdb4
1.14.3 macos-arm64   -    0efbcc6bf9cc1e8e0ce506c21b03739327200799c2cb521d8d09760159ec151d
'

log() { echo "$prog: $*" >&2; }
die() { log "$*"; exit 1; }
usage() {
  sed -n '2,/^set -euo/s/^# \{0,1\}//p' "$0"
  exit 0
}
usage_error() {
  log "$*"
  echo "usage: $0 [--into DIR] [VERSION]   (--help says more)" >&2
  exit 2
}

version=""
into=""
while [ $# -gt 0 ]; do
  case "$1" in
    --into) [ -n "${2:-}" ] || usage_error "--into needs a directory"
            into="$2"; shift 2 ;;
    --into=*) into="${1#--into=}"; [ -n "$into" ] || usage_error "--into needs a directory"; shift ;;
    -h|--help) usage ;;
    -*) usage_error "unknown option $1" ;;
    *) [ -z "$version" ] || usage_error "one version at most (got $version and $1)"
       version="$1"; shift ;;
  esac
done
version="${version:-$default_version}"

# This machine, in the table's words.
os="$(uname -s)"
arch="$(uname -m)"
case "$os" in
  Linux) os=linux ;;
  Darwin)
    os=macos
    # A shell under Rosetta reports x86_64 on Apple silicon; the arm64 engine runs natively there.
    if [ "$arch" = x86_64 ] && [ "$(sysctl -n hw.optional.arm64 2>/dev/null)" = 1 ]; then
      log "this shell runs under Rosetta on Apple silicon; installing the native arm64 engine"
      arch=arm64
    fi ;;
esac
case "$arch" in
  arm64) [ "$os" = linux ] && arch=aarch64 ;;
  aarch64) [ "$os" = macos ] && arch=arm64 ;;
  amd64) arch=x86_64 ;;
esac
platform="$os-$arch"

sha=""
glibc_floor=""
while read -r pin_version pin_platform pin_floor pin_sha; do
  if [ "$pin_version" = "$version" ] && [ "$pin_platform" = "$platform" ]; then
    sha="$pin_sha"
    glibc_floor="$pin_floor"
  fi
done <<< "$pins"
if [ -z "$sha" ]; then
  pinned="$(awk 'NF { printf "%s  %s %s", sep, $1, $2; sep = "\n" }' <<< "$pins")"
  log "no pinned smolmachines wheel for version $version on $platform ($(uname -s) $(uname -m)); the pinned ones are:"
  echo "$pinned" >&2
  exit 2
fi

if [ -n "$into" ]; then
  dest="$into"
else
  data="${XDG_DATA_HOME:-}"
  # The XDG spec: a relative XDG_DATA_HOME is invalid and ignored.
  case "$data" in /*) ;; *) data="${HOME:?HOME is not set; set it or pass --into DIR}/.local/share" ;; esac
  dest="$data/smol-mcp/engine/$version"
fi
mkdir -p "$(dirname "$dest")"
dest="$(cd "$(dirname "$dest")" && pwd)/$(basename "$dest")"

if [ -x "$dest/smol-vmm" ] && [ "$(cat "$dest/.wheel-sha256" 2>/dev/null)" = "$sha" ]; then
  log "smolmachines $version ($platform) is already installed in $dest"
  echo "$dest/smol-vmm"
  exit 0
fi

command -v python3 > /dev/null || die "needs python3 (pip, to download the wheel, and its standard \
library, to unpack it), and there is none on PATH. Install it from your system's packages: \
Debian/Ubuntu: apt-get install python3 python3-pip; Fedora: dnf install python3 python3-pip; \
macOS: xcode-select --install"

# The wheel's C library floor (manylinux_2_28 means glibc 2.28), checked before a 40 MB download.
if [ "$glibc_floor" != - ]; then
  libc="$(getconf GNU_LIBC_VERSION 2>/dev/null || true)"
  case "$libc" in
    glibc\ *) ;;
    *) die "this engine is built for glibc $glibc_floor or newer, and this system's C library is \
not glibc (musl, as on Alpine?); it cannot run here" ;;
  esac
  have="${libc#glibc }"
  if [ "$(printf '%s\n%s\n' "$glibc_floor" "$have" | sort -V | head -n 1)" != "$glibc_floor" ]; then
    die "this engine needs glibc $glibc_floor or newer; this system has $libc"
  fi
fi

# Everything is written next to the destination, so the last step is a rename on one filesystem.
work="$(mktemp -d "$(dirname "$dest")/.install-engine.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# pip: the system python3's own, or one in a throwaway virtualenv when it has none (Debian's
# python3 without python3-pip, say). Only `pip download` runs, which installs nothing anywhere.
pip=(python3 -m pip)
if ! python3 -m pip --version >/dev/null 2>&1; then
  log "python3 has no pip; making a throwaway virtualenv for one"
  python3 -m venv "$work/pip" >/dev/null 2>&1 || die "python3 has neither pip nor the venv module \
to make a virtualenv with one. Install either from your system's packages: Debian/Ubuntu: \
apt-get install python3-pip (or python3-venv); Fedora: dnf install python3-pip"
  pip=("$work/pip/bin/python" -m pip)
fi

# The requirement with its one allowed hash: in hash-checking mode pip takes no file whose
# sha256 differs, whatever index serves it, and no source distribution.
echo "smolmachines==$version --hash=sha256:$sha" > "$work/requirement.txt"
log "downloading smolmachines $version for $platform with pip (sha256 $sha)"
if ! "${pip[@]}" download --disable-pip-version-check --no-deps --only-binary=:all: \
    --require-hashes --progress-bar off --dest "$work/download" -r "$work/requirement.txt" \
    > "$work/pip.log" 2>&1; then
  sed "s/^/$prog: pip: /" "$work/pip.log" | tail -n 15 >&2
  die "pip could not download smolmachines $version for $platform with the pinned sha256 (its \
words above); nothing was installed"
fi
wheels=("$work"/download/smolmachines-*.whl)
[ -f "${wheels[0]}" ] || die "pip downloaded no smolmachines wheel (its log: $(tail -n 3 "$work/pip.log"))"

python3 - "${wheels[0]}" "$sha" "$work" <<'PY'
import hashlib, os, sys, zipfile

wheel, want, work = sys.argv[1:4]
prog = "install-engine"
engine = os.path.join(work, "engine")

def die(message):
    print(f"{prog}: {message}", file=sys.stderr)
    sys.exit(1)

# pip checked the hash already; checked again here, so that a pip that did not (an old one, a
# wrapper) cannot slip another file through.
digest = hashlib.sha256()
with open(wheel, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        digest.update(chunk)
got = digest.hexdigest()
if got != want:
    die(f"{os.path.basename(wheel)} has sha256 {got}, but the pinned sha256 is {want}; "
        f"refusing it (nothing was installed)")
print(f"{prog}: sha256 {got} matches the pin; unpacking", file=sys.stderr)

# The engine and what it loads beside it: smol/ without the Python SDK's sources.
os.makedirs(engine)
root = os.path.realpath(engine)
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if not name.startswith("smol/") or name.endswith("/") or name.endswith(".py"):
            continue
        target = os.path.realpath(os.path.join(engine, name[len("smol/"):]))
        if not target.startswith(root + os.sep):
            die(f"the wheel has an entry outside smol/: {name}")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(info) as src, open(target, "wb") as dst:
            while True:
                chunk = src.read(1 << 20)
                if not chunk:
                    break
                dst.write(chunk)
        # Executables (the engine, its libraries) keep their x bits; the rest is plain data.
        os.chmod(target, 0o755 if (info.external_attr >> 16) & 0o111 else 0o644)
if not os.path.isfile(os.path.join(engine, "smol-vmm")):
    die(f"{os.path.basename(wheel)} has no smol/smol-vmm; it is not the engine's wheel")
PY

chmod +x "$work/engine/smol-vmm"
# An engine that cannot run here (a missing system library, say) is not installed at all.
if ! ran="$("$work/engine/smol-vmm" --version 2>&1)"; then
  die "the unpacked engine does not run on this system ($platform): $(tail -n 3 <<< "$ran")"
fi
log "the engine runs: $(grep -m1 '^smolvm' <<< "$ran" || tail -n 1 <<< "$ran")"
echo "$sha" > "$work/engine/.wheel-sha256"
# Whatever is there (an older unpack, another wheel's) is moved aside into the work directory,
# which goes at exit, and the new engine renamed into its place.
if [ -e "$dest" ]; then
  mv "$dest" "$work/old"
fi
mv "$work/engine" "$dest"
log "installed smolmachines $version ($platform) in $dest"
echo "$dest/smol-vmm"
