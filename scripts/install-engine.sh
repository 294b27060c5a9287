#!/usr/bin/env bash
# Installs the smolvm engine the local fleet runs. It ships only inside the `smolmachines` wheel
# on PyPI (as smol/smol-vmm, with the libraries and images it loads beside it), and that wheel
# puts nothing on PATH. This script downloads the pinned wheel for this platform straight from
# PyPI with python3's standard library (no pip, no virtualenv: an "externally managed" system
# python3 is fine), checks its sha256 against the table below, and unpacks the engine into
#
#   ${XDG_DATA_HOME:-$HOME/.local/share}/smol-mcp/engine/<version>/smol-vmm
#
# where the server looks for it. Prints the engine's path on stdout, progress on stderr. Safe to
# re-run: an engine already unpacked from the same wheel is left as it is.
#
#   scripts/install-engine.sh                  # smolmachines 1.32.2, the version the server pins
#   scripts/install-engine.sh 1.14.3           # another pinned version
#   scripts/install-engine.sh --into DIR [V]   # unpack into DIR instead (scripts/fetch-smolvm.sh)
#
# The download honours HTTPS_PROXY/https_proxy (and NO_PROXY), and SSL_CERT_FILE/SSL_CERT_DIR for
# the certificates to trust, as python3's urllib does.
set -euo pipefail

prog=install-engine
default_version=1.32.2

# The pinned wheels: version, platform, sha256 of the wheel file, its URL on PyPI. From PyPI's
# JSON API (https://pypi.org/pypi/smolmachines/json: releases.<version>[].digests.sha256 and
# url; the simple index https://pypi.org/simple/smolmachines/ gives the same #sha256=). PyPI has
# no macOS x86_64 wheel, and the Linux wheels need glibc (manylinux_2_28, 1.14.3 manylinux_2_34).
pins='
1.32.2 linux-x86_64  81b104e2622aa0b187b6b7054397c391151b83db2638a16d0e54c517684f0dc2 https://files.pythonhosted.org/packages/31/23/2c35aaef4499dd5a9737a505166c074309af1c949f9507a5307c4d2d3511/smolmachines-1.32.2-cp39-abi3-manylinux_2_28_x86_64.whl
1.32.2 linux-aarch64 5cdd53c71369f149639f00197ce9deaafd204d2bda03b323b1ae3ee35ba4cf8b https://files.pythonhosted.org/packages/a5/44/dc733c4a971b1eb2e6d1f13efd843687e175706204680575e60765fbf78d/smolmachines-1.32.2-cp39-abi3-manylinux_2_28_aarch64.whl
1.32.2 macos-arm64   af690651bd2d2e329f3ab15d35acd7037a3a94581b3f79c08d1df867e8ef54f9 https://files.pythonhosted.org/packages/7e/34/bc2e334f424aef28cb623e0af08d274e4e17429a762c113631e150e04b0f/smolmachines-1.32.2-cp39-abi3-macosx_11_0_arm64.whl
1.14.3 linux-x86_64  d26b0d9b310a0d5483314198a02be3d60a60dfeb5677f11b6703277b2e65ee28 https://files.pythonhosted.org/packages/ad/67/69ee6bf4cd3560433c55410900d3d12d7727d62827490b3aecfa6d041858/smolmachines-1.14.3-cp39-abi3-manylinux_2_34_x86_64.whl
1.14.3 linux-aarch64 4ce4b78b031af4a45714dc17d84142056e3e5906890fd46c21baea4e06b3bdb4 https://files.pythonhosted.org/packages/1c/c0/60892c07f2575e05cf0735dcc26fd489ef9d62c5c4e4311c8006656c868e/smolmachines-1.14.3-cp39-abi3-manylinux_2_34_aarch64.whl
1.14.3 macos-arm64   0efbcc6bf9cc1e8e0ce506c21b03739327200799c2cb521d8d09760159ec151d https://files.pythonhosted.org/packages/7b/eb/fa883fa5ff95bab4403242f684d62b3e747b8dae9ebb6fa0b07f8dcc2a39/smolmachines-1.14.3-cp39-abi3-macosx_11_0_arm64.whl
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
url=""
while read -r pin_version pin_platform pin_sha pin_url; do
  if [ "$pin_version" = "$version" ] && [ "$pin_platform" = "$platform" ]; then
    sha="$pin_sha"
    url="$pin_url"
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

command -v python3 > /dev/null || die "needs python3 (only its standard library, to download and \
unpack the wheel), and there is none on PATH. Install it from your system's packages: \
Debian/Ubuntu: apt-get install python3; Fedora: dnf install python3; macOS: xcode-select --install"

# Everything is written next to the destination, so the last step is a rename on one filesystem.
work="$(mktemp -d "$(dirname "$dest")/.install-engine.XXXXXX")"
trap 'rm -rf "$work"' EXIT

log "downloading smolmachines $version for $platform from $url"
python3 - "$url" "$sha" "$work" <<'PY'
import hashlib, os, ssl, sys, urllib.error, urllib.request, zipfile

url, want, work = sys.argv[1:4]
prog = "install-engine"
wheel = os.path.join(work, url.rsplit("/", 1)[1])
engine = os.path.join(work, "engine")

def die(message):
    print(f"{prog}: {message}", file=sys.stderr)
    sys.exit(1)

# The wheel's C library floor (manylinux_2_28 means glibc 2.28), checked before a 40 MB download.
tag = os.path.basename(wheel)
if "manylinux_" in tag:
    need = tuple(int(n) for n in tag.split("manylinux_", 1)[1].split("_")[:2])
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc = ""
    if not libc.startswith("glibc "):
        die(f"this engine is built for glibc {need[0]}.{need[1]} or newer, and this system's C "
            f"library is not glibc (musl, as on Alpine?); it cannot run here")
    have = tuple(int(n) for n in libc.split()[1].split(".")[:2])
    if have < need:
        die(f"this engine needs glibc {need[0]}.{need[1]} or newer; this system has {libc}")

digest = hashlib.sha256()
try:
    # urlopen reads HTTPS_PROXY/NO_PROXY from the environment, and the default SSL context
    # OpenSSL's default certificates, which SSL_CERT_FILE and SSL_CERT_DIR override.
    request = urllib.request.Request(url, headers={"User-Agent": "smol-mcp-install-engine"})
    with urllib.request.urlopen(request, timeout=60) as response, open(wheel, "wb") as out:
        total = int(response.headers.get("Content-Length") or 0)
        done, shown = 0, -1
        tty = sys.stderr.isatty()
        while True:
            chunk = response.read(1 << 20)
            if not chunk:
                break
            out.write(chunk)
            digest.update(chunk)
            done += len(chunk)
            if tty and total:
                percent = done * 100 // total
                if percent != shown:
                    shown = percent
                    print(f"\r{prog}: {done / 1e6:.1f} of {total / 1e6:.1f} MB ({percent}%)",
                          end="", file=sys.stderr, flush=True)
        if tty and total:
            print(file=sys.stderr)
except urllib.error.URLError as e:
    reason = getattr(e, "reason", e)
    proxy = urllib.request.getproxies().get("https")
    hint = f" (through the proxy {proxy}, from HTTPS_PROXY)" if proxy else ""
    if isinstance(reason, ssl.SSLCertVerificationError):
        hint += ("; if a proxy or your network re-signs HTTPS, point SSL_CERT_FILE at a bundle "
                 "with its certificate")
    die(f"cannot download {url}: {reason}{hint}")
except OSError as e:
    die(f"cannot download {url}: {e}")
if total and done != total:
    die(f"the download of {url} stopped after {done} of {total} bytes")

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
