#!/usr/bin/env bash
# The HTTP hardening benchmarks against the fake serve: builds the release server and runs
# benches/session_memory.rs (sessions opened and ended in rounds, the server's RSS after each)
# and benches/slow_clients.rs (slow-body and slow-header connections beside a client), each
# printing a table and writing target/bench/<name>.json. Their environment knobs are in each
# file's header.
set -euo pipefail
cd "$(dirname "$0")/.."
# 1200 slow connections and the client's own need more descriptors than the usual 1024.
ulimit -n 8192 2>/dev/null || true
cargo bench --locked --bench session_memory "$@"
cargo bench --locked --bench slow_clients "$@"
