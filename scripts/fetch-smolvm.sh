#!/usr/bin/env bash
# The smolvm engine the tests use: scripts/install-engine.sh (the pinned smolmachines wheel from
# PyPI, sha256-checked, no pip needed) unpacked into .smolvm/<version>/ in this checkout
# (git-ignored) rather than the user's data directory. Prints the smol-vmm binary's path on stdout.
#
#   scripts/fetch-smolvm.sh            # the version the tests use (1.32.2)
#   scripts/fetch-smolvm.sh 1.14.3     # another pinned version (the spec-diff test's older pair)
set -euo pipefail

version="${1:-1.32.2}"
root="$(cd "$(dirname "$0")/.." && pwd)"
exec "$root/scripts/install-engine.sh" --into "$root/.smolvm/$version" "$version"
