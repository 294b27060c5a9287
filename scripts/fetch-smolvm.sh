#!/usr/bin/env bash
# Fetches the smolvm engine from the `smolmachines` wheel on PyPI at a pinned version, checks the
# wheel's sha256, and unpacks the `smol-vmm` binary (the smolvm CLI) with its libraries into
# .smolvm/<version>/ (git-ignored). Prints the binary's path on stdout.
#
#   scripts/fetch-smolvm.sh            # the version the tests use (1.32.2)
#   scripts/fetch-smolvm.sh 1.14.3     # another pinned version (the spec-diff test's older pair)
set -euo pipefail

version="${1:-1.32.2}"
# Pinned wheels for linux x86_64: version -> sha256 of the wheel file pip downloads.
case "$version" in
  1.32.2) sha=81b104e2622aa0b187b6b7054397c391151b83db2638a16d0e54c517684f0dc2 ;;
  1.14.3) sha=d26b0d9b310a0d5483314198a02be3d60a60dfeb5677f11b6703277b2e65ee28 ;;
  *) echo "fetch-smolvm: no pinned sha256 for smolmachines $version (pinned: 1.32.2, 1.14.3)" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.smolvm/$version"
if [ -x "$dest/smol-vmm" ] && [ "$(cat "$dest/.wheel-sha256" 2>/dev/null)" = "$sha" ]; then
  echo "$dest/smol-vmm"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$work" "smolmachines==$version" >&2
wheel="$(ls "$work"/smolmachines-"$version"-*.whl)"
got="$(sha256sum "$wheel" | cut -d' ' -f1)"
if [ "$got" != "$sha" ]; then
  echo "fetch-smolvm: $(basename "$wheel") has sha256 $got, expected $sha; refusing it" >&2
  exit 1
fi

rm -rf "$dest.tmp"
mkdir -p "$dest.tmp"
python3 - "$wheel" "$dest.tmp" <<'PY'
import sys, zipfile, os
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        # The engine and what it loads; the Python SDK files are not needed.
        if not name.startswith("smol/") or name.endswith(".py") or name.endswith("/"):
            continue
        target = os.path.join(out, name[len("smol/"):])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(info) as src, open(target, "wb") as dst:
            dst.write(src.read())
PY
chmod +x "$dest.tmp/smol-vmm"
echo "$sha" > "$dest.tmp/.wheel-sha256"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "$dest/smol-vmm"
