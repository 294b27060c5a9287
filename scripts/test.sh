#!/usr/bin/env bash
# The test command: installs what the tests need (the pinned smolvm engine) and runs every test.
# Safe to re-run; a fresh clone needs nothing else than a Rust toolchain, python3 with pip and
# network access to PyPI and crates.io.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-smolvm.sh 1.32.2 >/dev/null
cargo test --locked "$@"
