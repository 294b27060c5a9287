#!/usr/bin/env bash
# scripts/install-engine.sh fetches the engine the way a user's machine fetches packages: through
# pip, from whatever index pip is pointed at, taking only the pinned sha256. Checked here on a
# clean home with Debian's python3, against a package index of our own on loopback (PEP 503's
# simple layout, as a company mirror or a caching proxy serves it):
#  1. the index serves the real wheel: install-engine.sh installs from it (PIP_INDEX_URL), the
#     index's log shows the wheel was fetched from it, and the engine runs;
#  2. the index serves a wheel of the same name whose bytes differ: install-engine.sh refuses it,
#     says so, and installs nothing.
# The real wheel for the mirror comes from PyPI once, by pip and by hash.
#
# Needs network access to PyPI and Debian's python3 with pip or venv (scripts/test.sh installs
# python3-venv).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

check_name=check-engine-index
# shellcheck source=scripts/lib/user-path.sh
. scripts/lib/user-path.sh

work="$(mktemp -d)"
server_pid=""
cleanup() {
  [ -z "$server_pid" ] || kill "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

version="$(sed -n 's/^default_version=//p' scripts/install-engine.sh)"
sha="$(awk -v v="$version" '$1 == v && $2 == "linux-x86_64" { print $4 }' scripts/install-engine.sh)"
[ -n "$version" ] && [ -n "$sha" ] || die "no pinned linux-x86_64 wheel found in scripts/install-engine.sh"

# The mirror's files: the real wheel, fetched from PyPI by hash.
mkdir -p "$work/mirror/files" "$work/mirror/simple/smolmachines"
echo "smolmachines==$version --hash=sha256:$sha" > "$work/requirement.txt"
/usr/bin/python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --require-hashes --dest "$work/mirror/files" -r "$work/requirement.txt" >&2
wheels=("$work"/mirror/files/smolmachines-*.whl)
wheel="${wheels[0]##*/}"
[ -f "$work/mirror/files/$wheel" ] || die "pip downloaded no smolmachines wheel for the mirror"

# write_index: the simple index page, linking the file with the sha256 of what is there now.
write_index() {
  local digest
  digest="$(sha256sum "$work/mirror/files/$wheel" | cut -d' ' -f1)"
  printf '<!DOCTYPE html><html><body><a href="../../files/%s#sha256=%s">%s</a></body></html>\n' \
    "$wheel" "$digest" "$wheel" > "$work/mirror/simple/smolmachines/index.html"
}
write_index

# The index on a free loopback port, its requests logged.
/usr/bin/python3 - "$work/mirror" "$work/port" > "$work/access.log" 2>&1 <<'PY' &
import functools, http.server, sys
root, port_file = sys.argv[1:3]
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
with open(port_file, "w") as f:
    f.write(str(server.server_address[1]))
sys.stderr.flush()
server.serve_forever()
PY
server_pid=$!
for _ in $(seq 50); do
  [ -s "$work/port" ] && break
  sleep 0.1
done
[ -s "$work/port" ] || die "the loopback index did not start: $(cat "$work/access.log")"
index="http://127.0.0.1:$(cat "$work/port")/simple/"

# install_from_index DEST: install-engine.sh on a clean home, its pip pointed at the mirror
# alone (plain HTTP on loopback, hence trusted-host), nothing cached from earlier downloads.
install_from_index() {
  env -i "HOME=$work/home" "PATH=/usr/local/bin:/usr/bin:/bin" "LANG=C.UTF-8" \
    "PIP_INDEX_URL=$index" "PIP_TRUSTED_HOST=127.0.0.1" "PIP_NO_CACHE_DIR=1" \
    scripts/install-engine.sh --into "$1" "$version"
}
mkdir -p "$work/home"

# 1. The real wheel, from the mirror.
if ! installed="$(install_from_index "$work/engine" 2> "$work/install.log")"; then
  cat "$work/install.log" >&2
  die "install-engine.sh did not install the engine from the loopback index $index"
fi
sed "s/^/$check_name: install: /" "$work/install.log" >&2
grep -q "GET /files/$wheel " "$work/access.log" \
  || die "install-engine.sh installed an engine, but not from the loopback index (its log: $(cat "$work/access.log"))"
"$installed" --version | grep -q "^smolvm $version" \
  || die "the engine installed from the loopback index does not run as smolvm $version"
echo "$check_name: the engine came from the index pip was pointed at ($index) and runs" >&2

# 2. Another file under the wheel's name: the same bytes with one more at the end.
printf 'x' >> "$work/mirror/files/$wheel"
write_index
if install_from_index "$work/tampered" > /dev/null 2> "$work/tampered.log"; then
  cat "$work/tampered.log" >&2
  die "install-engine.sh installed a wheel whose sha256 is not the pinned one"
fi
grep -qi "hash" "$work/tampered.log" || { cat "$work/tampered.log" >&2; \
  die "install-engine.sh refused the changed wheel without saying its hash does not match"; }
[ ! -e "$work/tampered" ] || die "install-engine.sh left $work/tampered behind after refusing the wheel"
echo "$check_name: a wheel of the same name with other bytes was refused, nothing installed:" >&2
grep -i "hash\|refus\|nothing" "$work/tampered.log" | sed "s/^/$check_name:   /" | head -n 6 >&2
