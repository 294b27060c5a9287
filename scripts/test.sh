#!/usr/bin/env bash
# The test command: installs what the tests need, then runs every test. The tests are five
# binaries by what they need (docs/testing.md): `offline` nothing, `engine` the pinned engine,
# `clients` the outside MCP clients, `guest` the nested engine whose guests boot, `shared` a
# real PostgreSQL (scripts/postgres.sh, Debian's postgresql) and HAProxy (scripts/balancer.sh).
#  - the pinned smolvm engine (scripts/fetch-smolvm.sh), for `engine` (and two modules of
#    `clients`), and the same engine nested in a QEMU TCG machine whose guests boot
#    (scripts/nested-engine.sh, Debian's qemu-system-x86 and kernel), for `guest`;
#  - the pinned Python MCP client (tests/clients/requirements.txt) in .venv, for `clients`;
#  - the pinned TypeScript SDK, Inspector CLI and OpenID provider (oidc-provider, for the
#    sign-in tests) and playwright-core (the views' browser test) (tests/clients/package.json),
#    with npm; what builds the views (scripts/views/package.json), with npm; Debian's chromium;
#  - the pinned official MCP conformance suite and the Node 22 it runs on (tests/conformance/
#    package.json), with npm, for tests/clients/conformance.rs.
#  - Debian's own python3, python3-venv and pipx (apt-get), for scripts/check-user-path.sh and
#    scripts/check-package.sh, which follow the install ways on the system's python3 rather than
#    the toolchain's.
# Safe to re-run. A fresh clone needs a Rust toolchain, python3 with venv and pip, Node.js with
# npm, and access to crates.io, PyPI and the npm registry.
set -euo pipefail
cd "$(dirname "$0")/.."
# A step of the run, said on stderr and, under .ci/run, kept for the timeline it prints last.
mark() {
  echo "test.sh: ${SECONDS} s in, $*" >&2
  [ -z "${SMOL_CI_TIMELINE:-}" ] || echo "$(date +%s) $*" >> "$SMOL_CI_TIMELINE"
}
# Each test target's count and time, from cargo's log, for the timeline.
target_times() {
  awk '
    /^     Running / {
      t = ($2 == "unittests") ? $3 : $2
      sub(/^(tests|src)\//, "", t); sub(/\/main\.rs$/, "", t); sub(/\.rs$/, "", t) }
    /^test result: .* 0 passed; 0 failed;/ { t = "" }
    /^test result: / && t != "" {
      sub(/^test result: /, ""); sub(/; 0 ignored; 0 measured; [0-9]+ filtered out;/, ";")
      print "  " t ": " $0; t = "" }
  ' "$1"
}
# docs/architecture.md's names and counts against the tree: python3 alone, a second, so a stale
# page fails the run before anything is installed or built (and with --self-check below).
scripts/check-architecture.py
# The guest's tests run on a machine nested two levels down under emulation, where things die
# that never die on hardware: the outer VM (a reset or hang in QEMU's emulated SVM) or one inner
# guest (the engine finds its agent gone mid-command: "connection closed", "restarting agent VM",
# a job lost). So when the only failed target is the guest's (`guest`: tests/guest/main.rs), the
# engine is brought up again and the tests that failed are run once more by name (the whole
# target when its process was ended), and once again if some fail again; each rerun is announced
# with the engine's own account of what died. A test that fails three times, or any failure
# elsewhere, fails the run.
booted_targets='guest'
engine_died() {
  local boots
  boots="$(grep -c 'nested-init: .*s mounted' target/nested-engine/serial.log 2>/dev/null || true)"
  [ "${boots:-0}" -gt 1 ] || ! scripts/nested-engine.sh status >/dev/null 2>&1
}
# "target test" for each failed test, or "target *" for a target whose process ended early.
failed_tests() {
  awk '
    # A target is named by its file (tests/x.rs) or its folder (tests/x/main.rs); its tests by
    # their module path (booted_guest::name), which `--exact` takes as it is.
    /^     Running / { t = "" }
    /^     Running tests\/.*\.rs / {
      t = $2; sub(/^tests\//, "", t); sub(/\/main\.rs$/, "", t); sub(/\.rs$/, "", t) }
    /^test .* \.\.\. FAILED$/ && t != "" { print t, $2; named[t] = 1 }
    /`--test [a-z0-9_]+`/ {
      match($0, /`--test [a-z0-9_]+`/); f = substr($0, RSTART + 8, RLENGTH - 9); bad[f] = 1 }
    # A process ended by other than a test failure (101), by an exit or a signal: the tests it
    # had not reported yet never ran, so the whole target is run again.
    /process didn.t exit successfully: .*deps\/[a-z0-9_]+-[0-9a-f]+.* \((exit status|signal): [0-9]+/ \
      && $0 !~ /exit status: 101\)/ {
      match($0, /deps\/[a-z0-9_]+-/); ended[substr($0, RSTART + 5, RLENGTH - 6)] = 1 }
    END { for (f in bad) if (!(f in named) || (f in ended)) print f, "*" }
  ' "$1" | sort -u
}
# `scripts/test.sh --self-check`: the rerun's parsing above, on a log made up in the form cargo
# 1.95 prints (a test failure, a target ended by an exit, one ended by a signal, a failure in a
# target that is not the guest's), without building or running anything; then that the
# architecture page's check still catches a claim broken (scripts/check-architecture.py).
if [ "${1:-}" = --self-check ]; then
  made_up="$(mktemp)"
  trap 'rm -f "$made_up"' EXIT
  cat > "$made_up" <<'LOG'
     Running tests/clients/main.rs (target/debug/deps/clients-1f2ce472e43769b6)

running 2 tests
test stdio::python_client_lists_the_tools ... FAILED
test tasks::a_task_is_polled_to_its_result ... ok
error: test failed, to rerun pass `--test clients`
     Running tests/guest/main.rs (target/debug/deps/guest-e104e862b3457461)

running 4 tests
test booted_guest::b_ok ... ok
test booted_guest::c_fails ... FAILED
test fake_vs_engine::the_fake_answers_as_the_engine_does_on_a_booted_guest ... ok
test booted_guest::a_fails ... FAILED

failures:
    booted_guest::a_fails
    booted_guest::c_fails

test result: FAILED. 2 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.15s

error: test failed, to rerun pass `--test guest`
     Running tests/offline/main.rs (target/debug/deps/offline-1c53737824453f4e)

running 2 tests
test layering::f_ok ... ok
error: test failed, to rerun pass `--test offline`

Caused by:
  process didn't exit successfully: `/work/target/debug/deps/offline-1c53737824453f4e` (exit status: 97)
note: test exited abnormally; to see the full output pass --no-capture to the harness.
     Running tests/engine/main.rs (target/debug/deps/engine-5a557a1b770c9e55)

running 1 test
test real_serve::health ... FAILED
error: test failed, to rerun pass `--test engine`

Caused by:
  process didn't exit successfully: `/work/target/debug/deps/engine-5a557a1b770c9e55` (signal: 9, SIGKILL: kill)
error: 4 targets failed:
    `--test clients`
    `--test guest`
    `--test offline`
    `--test engine`
LOG
  expected='clients stdio::python_client_lists_the_tools
engine *
engine real_serve::health
guest booted_guest::a_fails
guest booted_guest::c_fails
offline *'
  got="$(failed_tests "$made_up")"
  if [ "$got" != "$expected" ]; then
    printf 'test.sh --self-check: the rerun parsing found\n%s\nnot\n%s\n' "$got" "$expected" >&2
    exit 1
  fi
  echo "test.sh --self-check: the rerun parsing reads the test binaries' log"
  scripts/check-architecture.py --self-check
  exit 0
fi
# What runs beside the tests is stopped with them, whichever way they end.
nested_ours=""
postgres_ours=""
pause_ours=""
user_path_pid=""
build_pid=""
on_exit() {
  local status=$?
  if [ -n "$build_pid" ]; then
    kill "$build_pid" 2>/dev/null || true
  fi
  if [ -n "$user_path_pid" ]; then
    kill -- "-$user_path_pid" 2>/dev/null || kill "$user_path_pid" 2>/dev/null || true
  fi
  if [ -n "$nested_ours" ]; then
    # On a failure the outer VM's console (the serve's own log among it) is shown before it goes.
    if [ "$status" -ne 0 ]; then
      echo "--- the nested engine's console, last lines:" >&2
      tail -n 60 target/nested-engine/serial.log >&2 2>/dev/null || true
    fi
    scripts/nested-engine.sh down >/dev/null 2>&1 || true
  fi
  if [ -n "$pause_ours" ]; then
    pause_engine down >/dev/null 2>&1 || true
  fi
  if [ -n "$postgres_ours" ]; then
    scripts/postgres.sh down >/dev/null 2>&1 || true
  fi
  exit "$status"
}
trap on_exit EXIT
# The tests' build begins now, beside the downloads and the engines' boot below (which wait on
# the network and on one emulated CPU: a core left idle for minutes), and is waited for before
# the tests run.
build_log="$(mktemp)"
# Niced a little: the engines' boot has deadlines of its own, the build none.
nice -n 10 cargo test --locked --no-run "$@" >"$build_log" 2>&1 &
build_pid=$!
mark "the tests' build begins, beside the downloads and the engines' boot"
scripts/fetch-smolvm.sh 1.32.2 >/dev/null
scripts/fetch-smolvm.sh 1.14.3 >/dev/null   # the older engine the spec-diff test compares with
if ! .venv/bin/python -c 'import mcp' 2>/dev/null \
   || ! .venv/bin/pip freeze 2>/dev/null | grep -qx -f <(grep -v '^#' tests/clients/requirements.txt); then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r tests/clients/requirements.txt
fi
# The pinned TypeScript SDK and Inspector CLI (tests/clients/package-lock.json), for the same,
# and the OpenID provider the sign-in tests start (oidc-provider).
if ! node -e 'const v=(p)=>require("./tests/clients/node_modules/"+p+"/package.json").version;
    process.exit(v("@modelcontextprotocol/sdk")==="1.32.2" && v("@modelcontextprotocol/inspector")==="2.12.0"
      && v("oidc-provider")==="9.13.3" && v("playwright-core")==="1.64.1" ? 0 : 1)' 2>/dev/null; then
  # `npm ci`, which installs the lock as it is and never rewrites it (`npm install` may, leaving
  # the tree dirty); it refuses a lock that has fallen out of step with package.json.
  (cd tests/clients && npm ci --no-audit --no-fund --loglevel=error)
fi
# What builds the MCP Apps views and the test host's page (scripts/views/package-lock.json:
# @modelcontextprotocol/ext-apps, esbuild), for tests/clients/views.rs and tests/guest/apps.rs.
if ! node -e 'const v=(p)=>require("./scripts/views/node_modules/"+p+"/package.json").version;
    process.exit(v("@modelcontextprotocol/ext-apps")==="2.0.4" && v("esbuild")==="0.28.2" ? 0 : 1)' 2>/dev/null; then
  (cd scripts/views && npm ci --no-audit --no-fund --loglevel=error)
fi
# The browser the views are shown in (tests/guest/apps.rs): Debian's Chromium, which the pinned
# playwright-core drives (no browser download of Playwright's own).
if ! dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q 'install ok installed'; then
  echo "test.sh: installing chromium from Debian's packages for the views' browser test" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
fi
# The pinned conformance suite, and Node 22 from the npm package `node` (the suite calls
# fs.globSync, which older Node lacks; the host's own node may be older).
if ! node -e 'const v=(p)=>require("./tests/conformance/node_modules/"+p+"/package.json").version;
    process.exit(v("@modelcontextprotocol/conformance")==="0.2.0-alpha.12" && v("node")==="22.23.3" ? 0 : 1)' 2>/dev/null \
   || ! tests/conformance/node_modules/.bin/node --version >/dev/null 2>&1; then
  (cd tests/conformance && npm ci --no-audit --no-fund --loglevel=error)
fi
# The install ways on a clean home (scripts/check-engine-index.sh: the engine through pip from
# an index of our own, and a changed wheel refused; scripts/check-user-path.sh: cargo install
# and the engine apart; then scripts/check-package.sh: the portable wheel, and the README's
# `pipx install .`), only with the whole suite: arguments select some tests, and these are not
# among them. They run beside the tests at the lowest priority, in target directories of their
# own (no lock shared with the tests' builds). Their two release builds run side by side: the
# portable wheel's (scripts/build-wheel.sh, Zig's linker, target/wheel) beside cargo install's
# (target/user-path, which the clone's wheel then shares). Each ends in fat-LTO links on one
# core, and one after the other they were the run's last 8 to 15 minutes, on one core, after
# the tests had ended. The checks themselves stay one after the other: each starts engines on
# the default guest-rollout port, as a user's would. Their log is shown at the end.
user_path_log="$(mktemp)"
wheel_log="$(mktemp)"
wheel_path="$(mktemp)"
if [ "$#" -eq 0 ]; then
  # They run on Debian's own python3 (and make virtualenvs with it, and pipx), not the
  # toolchain's: python3, python3-venv and pipx from Debian's packages, installed when missing.
  missing=()
  for p in python3 python3-venv pipx; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "test.sh: installing ${missing[*]} from Debian's packages for the install checks" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq "${missing[@]}" >&2
  fi
  started=$SECONDS
  # A session of its own (so that it can be stopped whole) is an autogroup of its own when the
  # kernel groups sessions (sched_autogroup_enabled), and autogroups share the CPU equally
  # whatever their processes' nice: the group itself is niced (seen: at nice 19 alone the
  # build took half the CPU from the tests' build).
  export -f mark
  setsid bash -c 'echo 19 > /proc/self/autogroup 2>/dev/null || true
    { built=0; nice -n 19 scripts/build-wheel.sh >"$2" 2>"$1" || built=$?
      mark "the portable wheel'"'"'s build ended, status $built"; exit "$built"; } &
    wheel=$!
    # A failed check ends the wheel'"'"'s build with it (the whole session, this shell too).
    nice -n 19 scripts/check-engine-index.sh && nice -n 19 scripts/check-user-path.sh \
      || kill -- "-$$"
    mark "check-engine-index.sh and check-user-path.sh passed"
    built=0
    wait "$wheel" || built=$?
    echo "test.sh: scripts/build-wheel.sh, run beside them, ended with status $built:"
    cat "$1"
    [ "$built" -eq 0 ] || exit 1
    exec nice -n 19 scripts/check-package.sh --portable-wheel "$(cat "$2")"' \
    _ "$wheel_log" "$wheel_path" >"$user_path_log" 2>&1 &
  user_path_pid=$!
  echo "test.sh: scripts/check-engine-index.sh, check-user-path.sh, then check-package.sh, and build-wheel.sh, run beside the tests (log at the end)" >&2
fi
# A real PostgreSQL from Debian's packages for the shared store's tests (`shared`), stopped and
# removed at the end unless it was already up (a developer's).
if ! scripts/postgres.sh status; then
  postgres_ours=1
  scripts/postgres.sh up
fi
eval "export $(scripts/postgres.sh env)"
# HAProxy from Debian's packages for the balancer's tests (`shared`), which start and stop it
# themselves (scripts/balancer.sh) in front of the processes each starts.
scripts/balancer.sh install
# The real engine with guests that boot, nested in QEMU (the `guest` tests use it); one outer
# VM for the whole run, taken down at the end unless it was already up (a developer's).
if ! scripts/nested-engine.sh status >/dev/null 2>&1; then
  nested_ours=1
  scripts/nested-engine.sh up
fi
eval "$(scripts/nested-engine.sh env)"
export SMOL_NESTED_URL SMOL_NESTED_IMAGE_DIR SMOL_NESTED_BUSYBOX_IMAGE SMOL_NESTED_HOST_IMAGE_DIR SMOL_NESTED_PUBLISH_PORTS
# A second nested engine, for the pause test alone (tests/guest/booted_guest.rs): under TCG the
# engine's save of a paused machine keeps one emulated CPU busy for 11 to 16 minutes, which on
# the first engine would hold every other guest test up for as long. On an outer VM of its own
# it runs beside them, on the core QEMU leaves mostly idle. Its cache is the first engine's
# (built by now), so it only boots. Whole runs only; otherwise the test uses the first engine.
pause_engine() {
  SMOL_NESTED_DIR="$PWD/target/nested-pause" SMOL_NESTED_CACHE="$PWD/target/nested-engine/cache" \
    scripts/nested-engine.sh "$@"
}
pause_engine_up() {
  if ! pause_engine status >/dev/null 2>&1; then
    pause_ours=1
    pause_engine up
  fi
  SMOL_NESTED_PAUSE_URL="$(pause_engine status)"
  export SMOL_NESTED_PAUSE_URL
}
if [ "$#" -eq 0 ]; then
  pause_engine_up
fi
mark "the services and nested engines are up"
built=0
wait "$build_pid" || built=$?
build_pid=""
cat "$build_log"
rm -f "$build_log"
[ "$built" -eq 0 ] || exit 1
log="$(mktemp)"
# Where the run's time goes, for CI's 45 minutes: the tests' own lines say how long each target
# ran, these say when the build and the targets began and ended.
mark "the tests' build ended; the tests begin"
record_targets() {
  local line
  while IFS= read -r line; do mark "$line"; done < <(target_times "$1")
}
first_pass=0
cargo test --locked --no-fail-fast "$@" 2>&1 | tee "$log" || first_pass=$?
record_targets "$log"
if [ "$first_pass" -ne 0 ]; then
  for attempt in 1 2; do
    # Every failed target as cargo names it (`--test x`, `--lib`, `--bin x`, `--doc`).
    targets="$(grep -oE '`--(test|lib|bin|bench|doc|example)[^`]*`' "$log" | tr -d '`' | sort -u)"
    others="$(echo "$targets" | grep -vxE -- "--test ($booted_targets)|" || true)"
    failed="$(failed_tests "$log" | grep -E "^($booted_targets) " || true)"
    if [ -n "$others" ] || [ -z "$failed" ]; then
      rm -f "$log"
      exit 1
    fi
    if engine_died; then why="the outer VM died or rebooted"; else why="the outer VM lived"; fi
    mark "rerun $attempt of the guest's failed tests begins ($why)"
    echo "test.sh: only the guest's tests failed ($why); rerun $attempt of 2 on a fresh nested engine, of:" >&2
    echo "$failed" | sed 's/^/  /' >&2
    echo "test.sh: what the engine logged of its guests' deaths:" >&2
    grep -aE 'restarting agent VM|connection closed|no boot progress|before the agent was ready|Kernel panic|soft lockup' \
      target/nested-engine/serial.log 2>/dev/null | cut -c1-300 | tail -n 20 >&2 || true
    tail -n 20 target/nested-engine/qemu.log >&2 2>/dev/null || true
    scripts/nested-engine.sh down >/dev/null 2>&1 || true
    scripts/nested-engine.sh up
    eval "$(scripts/nested-engine.sh env)"
    if [ -n "${SMOL_NESTED_PAUSE_URL:-}" ] && echo "$failed" | grep -qE ' (booted_guest::a_paused_|\*$)'; then
      pause_engine down >/dev/null 2>&1 || true
      pause_engine_up
    fi
    : > "$log"
    ok=1
    for target in $(echo "$failed" | cut -d' ' -f1 | sort -u); do
      names=()
      if ! echo "$failed" | grep -qx "$target \*"; then
        mapfile -t names < <(echo "$failed" | sed -n "s/^$target //p")
        names=(-- --exact "${names[@]}")
      fi
      cargo test --locked --no-fail-fast --test "$target" "${names[@]}" 2>&1 | tee -a "$log" || ok=0
    done
    record_targets "$log"
    [ "$ok" = 1 ] && break
    if [ "$attempt" = 2 ]; then
      rm -f "$log"
      exit 1
    fi
  done
fi
rm -f "$log"
mark "the tests ended"
if [ -n "$user_path_pid" ]; then
  user_path_status=0
  wait "$user_path_pid" || user_path_status=$?
  user_path_pid=""
  mark "the install checks ended after $((SECONDS - started)) s, status $user_path_status"
  cat "$user_path_log" >&2
  rm -f "$user_path_log" "$wheel_log" "$wheel_path"
  [ "$user_path_status" -eq 0 ] || exit 1
fi
