#!/usr/bin/env bash
# HAProxy from Debian's packages in front of smol-mcp-http processes (scripts/balancer/haproxy.cfg).
#
#   scripts/balancer.sh up LISTEN_PORT BACKEND_PORT...   # install when missing, render, start (replaces one running)
#   scripts/balancer.sh down                             # stop it
#   scripts/balancer.sh status                           # exit 0 while it runs
#   scripts/balancer.sh install                          # only install Debian's haproxy when missing
#
# State (the rendered file, the pid, its log): $SMOL_BALANCER_DIR, else target/balancer/.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
state="$(realpath -m "${SMOL_BALANCER_DIR:-$root/target/balancer}")"

log() { echo "balancer: $*" >&2; }
die() { log "$*"; exit 1; }

install_package() {
  command -v haproxy >/dev/null && return
  [ "$(id -u)" -eq 0 ] || die "HAProxy is not installed; as root this script installs Debian's haproxy"
  log "installing Debian's haproxy"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq haproxy >&2
}

running() {
  [ -s "$state/haproxy.pid" ] && kill -0 "$(head -n 1 "$state/haproxy.pid")" 2>/dev/null
}

down() {
  if running; then
    kill "$(head -n 1 "$state/haproxy.pid")" 2>/dev/null || true
    for _ in $(seq 50); do running || break; sleep 0.1; done
  fi
  rm -f "$state/haproxy.pid"
}

up() {
  [ "$#" -ge 2 ] || die "usage: $0 up LISTEN_PORT BACKEND_PORT..."
  install_package
  local listen="$1"; shift
  mkdir -p "$state"
  local servers="" i=0
  for port in "$@"; do
    i=$((i + 1))
    servers+="    server smol$i 127.0.0.1:$port"$'\n'
  done
  awk -v listen="127.0.0.1:$listen" -v servers="$servers" '
    { gsub(/@LISTEN@/, listen) }
    /^@SERVERS@$/ { printf "%s", servers; next }
    { print }' "$root/scripts/balancer/haproxy.cfg" > "$state/haproxy.cfg"
  haproxy -c -q -f "$state/haproxy.cfg" || die "the rendered configuration does not check: $state/haproxy.cfg"
  down
  haproxy -D -p "$state/haproxy.pid" -f "$state/haproxy.cfg" 2>"$state/haproxy.log" \
    || { cat "$state/haproxy.log" >&2; die "HAProxy did not start"; }
  for _ in $(seq 50); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$listen") 2>/dev/null; then
      log "up on 127.0.0.1:$listen in front of $# processes"
      return
    fi
    sleep 0.1
  done
  die "HAProxy does not listen on 127.0.0.1:$listen"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  status) running ;;
  install) install_package ;;
  *) die "usage: $0 up LISTEN_PORT BACKEND_PORT... | down | status | install" ;;
esac
