#!/usr/bin/env bash
# The test command: installs what the tests need, then runs every test.
#  - the pinned smolvm engine (scripts/fetch-smolvm.sh), for the real-serve tests;
#  - the pinned Python MCP client (tests/clients/requirements.txt) in .venv, for the end-to-end tests;
#  - the pinned TypeScript SDK and Inspector CLI (tests/clients/package.json), with npm;
#  - the pinned official MCP conformance suite and the Node 22 it runs on (tests/conformance/
#    package.json), with npm, for tests/conformance.rs.
# Safe to re-run. A fresh clone needs a Rust toolchain, python3 with venv and pip, Node.js with
# npm, and access to crates.io, PyPI and the npm registry.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-smolvm.sh 1.32.2 >/dev/null
scripts/fetch-smolvm.sh 1.14.3 >/dev/null   # the older engine the spec-diff test compares with
if ! .venv/bin/python -c 'import mcp' 2>/dev/null \
   || ! .venv/bin/pip freeze 2>/dev/null | grep -qx -f <(grep -v '^#' tests/clients/requirements.txt); then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r tests/clients/requirements.txt
fi
# The pinned TypeScript SDK and Inspector CLI (tests/clients/package-lock.json), for the same.
if ! node -e 'const v=(p)=>require("./tests/clients/node_modules/"+p+"/package.json").version;
    process.exit(v("@modelcontextprotocol/sdk")==="1.32.2" && v("@modelcontextprotocol/inspector")==="2.12.0" ? 0 : 1)' 2>/dev/null; then
  # `npm install` rather than `npm ci`: the lock lacks optional platform packages of other
  # operating systems, which `npm ci` refuses; the pinned versions are the lock's either way.
  (cd tests/clients && npm install --no-audit --no-fund --loglevel=error)
fi
# The pinned conformance suite, and Node 22 from the npm package `node` (the suite calls
# fs.globSync, which older Node lacks; the host's own node may be older).
if ! node -e 'const v=(p)=>require("./tests/conformance/node_modules/"+p+"/package.json").version;
    process.exit(v("@modelcontextprotocol/conformance")==="0.2.0-alpha.12" && v("node")==="22.23.3" ? 0 : 1)' 2>/dev/null \
   || ! tests/conformance/node_modules/.bin/node --version >/dev/null 2>&1; then
  (cd tests/conformance && npm install --no-audit --no-fund --loglevel=error)
fi
cargo test --locked "$@"
# The README's user path on a clean home (a release build of the server, the engine from PyPI).
# Only with the whole suite: arguments select some tests, and this is not one of them.
if [ "$#" -eq 0 ]; then
  scripts/check-user-path.sh
fi
