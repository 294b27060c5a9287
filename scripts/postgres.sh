#!/usr/bin/env bash
# A real PostgreSQL server for the tests of the shared store, from Debian's packages.
#
#   scripts/postgres.sh up       # install the package when missing, make the cluster once, start it (idempotent)
#   scripts/postgres.sh down     # stop it and remove its cluster
#   scripts/postgres.sh status   # exit 0 when it answers
#   scripts/postgres.sh env      # export line for the tests: SMOL_TEST_PG_URL
#
# The cluster lives in $SMOL_PG_DIR, else target/postgres/, and listens on 127.0.0.1 at
# $SMOL_PG_PORT (else 55432) and on a Unix socket in that directory. Role `smol` with a password
# made at `up` (in the directory, mode 600; never printed but by `env`) may create databases: each
# test makes one of its own and drops it. fsync is off: a test's database outlives no crash.
# PostgreSQL refuses to run as root; as root the server runs as the package's `postgres` user.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
state="$(realpath -m "${SMOL_PG_DIR:-$root/target/postgres}")"
port="${SMOL_PG_PORT:-55432}"
data="$state/data"

log() { echo "postgres: $*" >&2; }
die() { log "$*"; exit 1; }

bin_dir() {
  local d
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  [ -n "$d" ] && [ -x "$d/postgres" ] || return 1
  echo "$d"
}

# As the server's user: root cannot run it.
as_server() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

answers() {
  local bin
  bin="$(bin_dir)" || return 1
  "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" 2>/dev/null
}

install_package() {
  if bin_dir >/dev/null; then return; fi
  [ "$(id -u)" -eq 0 ] || die "PostgreSQL is not installed; as root this script installs Debian's postgresql"
  log "installing Debian's postgresql"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
  bin_dir >/dev/null || die "the postgresql package installed no server"
}

up() {
  install_package
  local bin
  bin="$(bin_dir)"
  if answers; then
    log "already up on 127.0.0.1:$port"
    return
  fi
  mkdir -p "$state"
  if [ "$(id -u)" -eq 0 ]; then chown postgres: "$state"; fi
  chmod 700 "$state"
  if [ ! -s "$data/PG_VERSION" ]; then
    local password
    password="$(head -c 18 /dev/urandom | base64 | tr -d '/+=')"
    local pwfile="$state/password"
    ( umask 077; printf '%s\n' "$password" > "$pwfile" )
    if [ "$(id -u)" -eq 0 ]; then chown postgres: "$pwfile"; fi
    # The superuser is `smol` itself: the tests make and drop databases of their own.
    as_server "$bin/initdb" -D "$data" -U smol --pwfile="$pwfile" \
      --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C >"$state/initdb.log" 2>&1 \
      || { cat "$state/initdb.log" >&2; die "initdb failed"; }
  fi
  as_server "$bin/pg_ctl" -D "$data" -l "$state/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $state -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
    start >/dev/null \
    || { tail -n 30 "$state/server.log" >&2; die "the server did not start"; }
  answers || die "the server started but does not answer on 127.0.0.1:$port"
  log "up on 127.0.0.1:$port (cluster in $state)"
}

down() {
  local bin
  if bin="$(bin_dir)" && [ -s "$data/postmaster.pid" ]; then
    as_server "$bin/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$state"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) answers ;;
  env)
    answers || die "not up (scripts/postgres.sh up)"
    echo "SMOL_TEST_PG_URL=postgres://smol:$(cat "$state/password")@127.0.0.1:$port/postgres"
    ;;
  *) die "usage: $0 up|down|status|env" ;;
esac
