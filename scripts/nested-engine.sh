#!/usr/bin/env bash
# A real smolvm engine whose guests boot, on hosts that cannot boot them directly.
#
# These hosts are Firecracker VMs whose /dev/kvm is kvm_pvm (paravirtual): the engine's guest
# kernel is not a PVM guest and never boots on it. So the pinned engine runs one level down, in a
# QEMU TCG VM emulating AMD SVM, where a Debian kernel loads kvm_amd and offers a real /dev/kvm.
# The engine comes from the wheel over 9p; its `serve` is forwarded to a loopback TCP port.
#
#   scripts/nested-engine.sh up       # build what is missing, boot, wait for /health (idempotent)
#   scripts/nested-engine.sh down     # stop QEMU, remove the runtime state, keep the cache
#   scripts/nested-engine.sh status   # exit 0 and print the URL if up and healthy
#   scripts/nested-engine.sh env      # export lines for the tests (SMOL_NESTED_*)
#
# State: $SMOL_NESTED_DIR, else target/nested-engine/ (url, qemu.pid, serial.log, env; cache/ is
# the download and build cache that `down` keeps, or $SMOL_NESTED_CACHE). Port:
# $SMOL_NESTED_PORT, else a free one.
# Needs root (apt-get, and the agent rootfs keeps its owners as the engine's own extract would).
set -euo pipefail

VERSION=1.32.2
root="$(cd "$(dirname "$0")/.." && pwd)"
here="$root/scripts/nested"
state="$(realpath -m "${SMOL_NESTED_DIR:-$root/target/nested-engine}")"
# The download and build cache; $SMOL_NESTED_CACHE lets a second engine (scripts/test.sh's for
# the pause test) share the first one's, once that one is up.
cache="$(realpath -m "${SMOL_NESTED_CACHE:-$state/cache}")"
share="$cache/share"          # engine/ and images/: the 9p exports, /smol/... in the outer VM
kdir="$cache/kernel"
HEALTH_TIMEOUT="${SMOL_NESTED_HEALTH_TIMEOUT:-240}"
GUEST_IMAGE_DIR=/smol/images
GUEST_STATE_DIR=/tmp/state
# insmod order: busybox insmod resolves no dependencies, so each module follows what it needs.
MODULES="irqbypass kvm ccp kvm-amd e1000 tun virtio_ring virtio virtio_pci_modern_dev \
virtio_pci_legacy_dev virtio_pci 9pnet 9pnet_virtio netfs fscache 9p"

log() { echo "nested-engine: $*" >&2; }
die() { log "$*"; exit 1; }

qemu_pid() {
  local pid
  pid="$(cat "$state/qemu.pid" 2>/dev/null)" || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  # A stale pidfile's number may belong to another process by now: only ours names our pidfile.
  tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF -- "$state/qemu.pid" || return 1
  echo "$pid"
}

healthy() {
  local url
  qemu_pid > /dev/null || return 1
  url="$(cat "$state/url" 2>/dev/null)" || return 1
  curl -sf --max-time 10 "$url/health" 2>/dev/null | grep -q '"status":"ok"'
}

stop_qemu() {
  local pid
  pid="$(qemu_pid)" || return 0
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    [ -d "/proc/$pid" ] || return 0
    sleep 0.2
  done
  kill -9 "$pid" 2>/dev/null || true
}

clear_runtime() {
  rm -f "$state/url" "$state/qemu.pid" "$state/serial.log" "$state/env"
}

# QEMU 10 from bookworm-backports, not bookworm's 7.2: under 7.2's emulated SVM the outer VM
# died in most booted runs on some hosts (triple faults in kvm_amd, soft lockups, inner guests
# gone within seconds of their start), and an inner start took 17 to 50 s; under 10.0 it takes
# about 8 s. Other Debian releases take their own qemu-system-x86 if it is 10 or newer.
QEMU_MIN_MAJOR=10
qemu_major() {
  qemu-system-x86_64 --version 2>/dev/null | sed -n '1s/.*version \([0-9]*\)\..*/\1/p'
}

ensure_packages() {
  local missing=() p
  for p in busybox-static zstd cpio; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  command -v curl > /dev/null || missing+=(curl)
  command -v python3 > /dev/null || missing+=(python3)
  export DEBIAN_FRONTEND=noninteractive
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -qq >&2
    apt-get install -y -qq "${missing[@]}" >&2
  fi
  [ "$(qemu_major)" -ge "$QEMU_MIN_MAJOR" ] 2>/dev/null && return 0
  local codename
  codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
  if [ "$codename" = bookworm ]; then
    log "installing qemu-system-x86 $QEMU_MIN_MAJOR from bookworm-backports"
    echo 'deb http://deb.debian.org/debian bookworm-backports main' \
      > /etc/apt/sources.list.d/smol-nested-bookworm-backports.list
    apt-get update -qq >&2
    apt-get install -y -qq -t bookworm-backports qemu-system-x86 >&2
  else
    log "installing qemu-system-x86"
    apt-get update -qq >&2
    apt-get install -y -qq qemu-system-x86 >&2
  fi
  [ "$(qemu_major)" -ge "$QEMU_MIN_MAJOR" ] 2>/dev/null \
    || die "QEMU $(qemu_major) is older than $QEMU_MIN_MAJOR: its emulated SVM is not stable enough for the booted suite"
}

# The engine's directory as the outer VM sees it, with the two preparations done here because
# under TCG the engine would spend many minutes on them itself.
prepare_share() {
  local src="$1" dst="$share/engine" sha
  sha="$(cat "$src/.wheel-sha256")"
  mkdir -p "$share/images"
  if [ "$(cat "$dst/.wheel-sha256" 2>/dev/null)" = "$sha" ] \
     && [ -f "$dst/storage-template.ext4" ] && [ -f "$dst/overlay-template.ext4" ]; then
    return 0
  fi
  log "preparing the engine share"
  rm -rf "$dst.tmp"
  mkdir -p "$dst.tmp"
  cp -a "$src/." "$dst.tmp/"
  rm -f "$dst.tmp/.wheel-sha256"
  # The agent rootfs cache is named by this archive's size and mtime. fetch-smolvm.sh leaves the
  # mtime of its unpacking; the wheel records 1980-01-01, and pinning it makes the name the same
  # on every host and every re-fetch, so a cached seed keeps matching.
  touch -d '1980-01-01 00:00:00 UTC' "$dst.tmp/agent-rootfs.tar.zst"
  # 20 + 10 GiB apparent, about 5 MB real: --sparse keeps them so, here, over 9p and on the
  # outer VM's tmpfs. Without them the engine builds them itself, very slowly under TCG.
  zstd -q -d --sparse -f "$dst.tmp/storage-template.ext4.zst" -o "$dst.tmp/storage-template.ext4"
  zstd -q -d --sparse -f "$dst.tmp/overlay-template.ext4.zst" -o "$dst.tmp/overlay-template.ext4"
  echo "$sha" > "$dst.tmp/.wheel-sha256"
  rm -rf "$dst"
  mv "$dst.tmp" "$dst"
}

# Debian's kernel and the modules the outer VM needs, from the package linux-image-amd64 depends
# on. Cached: a re-run asks apt nothing.
prepare_kernel() {
  [ -f "$kdir/.done" ] && return 0
  local pkg work m f rel
  pkg="$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
  if [ -z "$pkg" ]; then
    apt-get update -qq >&2
    pkg="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
  fi
  [ -n "$pkg" ] || die "cannot tell which linux-image package linux-image-amd64 depends on"
  log "fetching the outer kernel ($pkg)"
  work="$(mktemp -d)"
  # apt-get download writes into the working directory; _apt cannot write a mktemp dir, and the
  # warning it prints for that is harmless.
  (cd "$work" && apt-get download -q "$pkg" 2>&1 | grep -v 'unsandboxed' >&2 || true)
  ls "$work"/*.deb > /dev/null 2>&1 || { rm -rf "$work"; die "apt-get download $pkg failed"; }
  dpkg-deb -x "$work"/*.deb "$work/x"
  rel="$(ls "$work/x/lib/modules")"
  rm -rf "$kdir" "$kdir.tmp"
  mkdir -p "$kdir.tmp/modules"
  cp "$work/x/boot/vmlinuz-$rel" "$kdir.tmp/vmlinuz"
  for m in $MODULES; do
    f="$(find "$work/x/lib/modules/$rel" -name "$m.ko" -o -name "$m.ko.xz" -o -name "$m.ko.zst" | head -1)"
    [ -n "$f" ] || { rm -rf "$work"; die "module $m not in $pkg"; }
    case "$f" in
      *.ko.xz) xz -dc "$f" > "$kdir.tmp/modules/$m.ko" ;;
      *.ko.zst) zstd -qdc "$f" > "$kdir.tmp/modules/$m.ko" ;;
      *) cp "$f" "$kdir.tmp/modules/$m.ko" ;;
    esac
  done
  rm -rf "$work"
  echo "$pkg $rel" > "$kdir.tmp/.done"
  mv "$kdir.tmp" "$kdir"
}

seed_name() {
  local a="$share/engine/agent-rootfs.tar.zst"
  printf '%x-%x' "$(stat -c %s "$a")" "$(stat -c %Y "$a")"
}

# The agent rootfs, extracted as the engine would (tar as root keeps the archive's owners), with
# the `.extracted` marker the engine checks.
prepare_seed() {
  local name="$1" dir="$cache/seed"
  [ -f "$dir/$name/.extracted" ] && return 0
  log "extracting the agent rootfs ($name)"
  rm -rf "$dir"
  mkdir -p "$dir/$name.tmp"
  zstd -qdc "$share/engine/agent-rootfs.tar.zst" | tar -C "$dir/$name.tmp" -xf -
  touch "$dir/$name.tmp/.extracted"
  mv "$dir/$name.tmp" "$dir/$name"
}

build_images() {
  local seed="$1" out="$share/images/busybox.tar"
  python3 "$here/busybox-image.py" "$seed" "$out.new"
  # Same bytes, same file: the engine then finds the image it already staged.
  if cmp -s "$out.new" "$out"; then rm -f "$out.new"; else mv "$out.new" "$out"; fi
}

build_initrd() {
  local name="$1" key tree lib
  key="$( { cat "$here/init.sh"; cat "$kdir/.done"; echo "$name $MODULES $GUEST_STATE_DIR";
            sha256sum /bin/busybox "$share/engine/smol-vmm" "$share/engine/libkrun.so"; } | sha256sum)"
  if [ -f "$cache/initrd.img" ] && [ "$(cat "$cache/initrd.key" 2>/dev/null)" = "$key" ]; then
    return 0
  fi
  log "building the initramfs"
  tree="$cache/initrd.d"
  rm -rf "$tree"
  mkdir -p "$tree"/{bin,dev,etc,lib/modules,proc,root,run,smol,sys,tmp,seed,var/tmp}
  cp /bin/busybox "$tree/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [ "$applet" = busybox ] || ln -s busybox "$tree/bin/$applet"
  done
  # The engine expects a usual layout for what it runs by name.
  ln -s bin "$tree/sbin"
  mkdir -p "$tree/usr"
  ln -s ../bin "$tree/usr/bin"
  ln -s ../bin "$tree/usr/sbin"
  # The engine is a glibc binary: its libraries at the paths the host's loader resolves them to.
  for lib in $( { ldd "$share/engine/smol-vmm"; ldd "$share/engine/libkrun.so"; } \
                | awk '/=> \// {print $3} /^[ \t]*\/lib/ {print $1}' | sort -u ) \
             /lib/x86_64-linux-gnu/libgcc_s.so.1; do
    mkdir -p "$tree$(dirname "$lib")"
    cp -L "$lib" "$tree$lib"
  done
  cp "$kdir"/modules/*.ko "$tree/lib/modules/"
  cp "$here/init.sh" "$tree/init"
  chmod 755 "$tree/init"
  cat > "$tree/etc/nested.env" <<EOF
MODULES="$MODULES"
SEED_NAME=$name
STATE_DIR=$GUEST_STATE_DIR
EOF
  printf 'root:x:0:0:root:/root:/bin/sh\n' > "$tree/etc/passwd"
  printf 'root:x:0:\n' > "$tree/etc/group"
  printf '127.0.0.1\tlocalhost\n' > "$tree/etc/hosts"
  cp -a "$cache/seed/$name" "$tree/seed/$name"
  (cd "$tree" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) \
    | zstd -q -T0 -3 > "$cache/initrd.img.tmp"
  mv "$cache/initrd.img.tmp" "$cache/initrd.img"
  echo "$key" > "$cache/initrd.key"
  rm -rf "$tree"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# distinct_free_ports N TAKEN: N free loopback ports, comma-separated, none equal to TAKEN or to
# each other (each probe lets its port go at once, so the same one can come back).
distinct_free_ports() {
  local want="$1" taken="$2" found="" p
  while [ "$(echo "$found" | tr ',' '\n' | grep -c .)" -lt "$want" ]; do
    p="$(free_port)"
    case ",$found,$taken," in *",$p,"*) continue ;; esac
    found="${found:+$found,}$p"
  done
  echo "$found"
}

start_qemu() {
  local port="$1" publish="$2" forwards p
  # The serve, and each port a test publishes from an inner machine (the serve binds published
  # ports on all of the outer VM's addresses, SMOLVM_PUBLISH_ADDR in init.sh), at the same
  # number on this host's loopback.
  forwards="hostfwd=tcp:127.0.0.1:$port-:8080"
  for p in ${publish//,/ }; do
    forwards="$forwards,hostfwd=tcp:127.0.0.1:$p-:$p"
  done
  : > "$state/serial.log"
  # 9>&-: the daemon would otherwise inherit the flock of `up` and hold it for its whole life.
  # No -no-reboot: the outer VM has vanished mid-suite with nothing on its console and plenty of
  # memory left (its heartbeat), as a reset would end it; rebooted instead, its init brings the
  # serve up again within a minute (its machines are lost); the booted tests' watchdog sees
  # the second boot on the console and ends its process, and scripts/test.sh reruns the failed
  # tests on a fresh engine (up to twice). The init's own poweroff still
  # ends QEMU. -d cpu_reset logs each reset's CPU state to qemu.log, to find out why.
  # One vCPU (SMOL_NESTED_CPUS, default 1): with two, the outer VM hung under the booted suite
  # even on QEMU 10 (its console and serve silent from one inner guest's start on, soft lockups
  # of both CPUs under 7.2), as a TLB-flush IPI to a vCPU inside a nested guest that the
  # emulated SVM never delivers would; one vCPU has no IPIs to lose. Measured: an inner start
  # 6.1 s (8.5 with two), booted_guest 386 s (312 to 327 with two).
  qemu-system-x86_64 -name smol-nested-engine \
    -accel tcg,thread=multi -cpu max -smp "${SMOL_NESTED_CPUS:-1}" -m 8192 \
    -kernel "$kdir/vmlinuz" -initrd "$cache/initrd.img" \
    -append "console=ttyS0 quiet panic=-1" \
    -D "$state/qemu.log" -d cpu_reset \
    -virtfs "local,path=$share/engine,mount_tag=smol-engine,security_model=none,readonly=on" \
    -virtfs "local,path=$share/images,mount_tag=smol-images,security_model=none" \
    -device e1000,netdev=n0 -netdev "user,id=n0,$forwards" \
    -display none -monitor none -parallel none -serial "file:$state/serial.log" \
    -daemonize -pidfile "$state/qemu.pid" 9>&-
}

# Polls /health, bounded; a QEMU that exits (the init powers off when the serve dies) ends it early.
wait_healthy() {
  local url="$1" start now last=0 line
  start="$(date +%s)"
  while :; do
    now="$(date +%s)"
    if curl -sf --max-time 5 "$url/health" 2>/dev/null | grep -q '"status":"ok"'; then
      log "healthy after $((now - start)) s"
      return 0
    fi
    qemu_pid > /dev/null || { log "QEMU exited after $((now - start)) s"; return 1; }
    if [ $((now - start)) -ge "$HEALTH_TIMEOUT" ]; then
      log "no /health after $HEALTH_TIMEOUT s"
      return 1
    fi
    if [ $((now - last)) -ge 15 ]; then
      line="$(grep -a 'nested-init:' "$state/serial.log" 2>/dev/null | tail -1 || true)"
      log "waiting for /health ($((now - start)) s) ${line:-(no init output yet)}"
      last="$now"
    fi
    sleep 2
  done
}

cmd_up() {
  mkdir -p "$state"
  exec 9> "$state/.lock"
  flock -w 900 9 || die "another nested-engine.sh holds $state/.lock"
  if healthy; then
    log "already up at $(cat "$state/url")"
    return 0
  fi
  stop_qemu
  clear_runtime
  [ "$(id -u)" = 0 ] || die "needs root (apt-get; the agent rootfs keeps its owners)"

  ensure_packages
  local bin src name port url
  bin="$("$root/scripts/fetch-smolvm.sh" "$VERSION")"
  src="$(dirname "$bin")"
  prepare_share "$src"
  prepare_kernel
  name="$(seed_name)"
  prepare_seed "$name"
  build_images "$cache/seed/$name"
  build_initrd "$name"

  # A free port can be taken between the probe and QEMU's bind: then QEMU refuses to start, and
  # another port is tried (not for a port the caller chose).
  local attempt publish
  for attempt in 1 2 3; do
    port="${SMOL_NESTED_PORT:-$(free_port)}"
    url="http://127.0.0.1:$port"
    publish="$(distinct_free_ports 2 "$port")"
    log "starting QEMU (TCG, emulated SVM), serve forwarded to $url, ports $publish for publishing"
    start_qemu "$port" "$publish" && break
    rm -f "$state/qemu.pid"
    if [ -n "${SMOL_NESTED_PORT:-}" ] || [ "$attempt" = 3 ]; then
      die "QEMU did not start (is 127.0.0.1:$port taken?)"
    fi
  done
  if ! wait_healthy "$url"; then
    log "serial log tail ($state/serial.log):"
    tail -n 40 "$state/serial.log" >&2 || true
    stop_qemu
    rm -f "$state/url" "$state/qemu.pid" "$state/env"
    exit 1
  fi
  cat > "$state/env.tmp" <<EOF
export SMOL_NESTED_URL=$url
export SMOL_NESTED_IMAGE_DIR=$GUEST_IMAGE_DIR
export SMOL_NESTED_BUSYBOX_IMAGE=$GUEST_IMAGE_DIR/busybox.tar
export SMOL_NESTED_HOST_IMAGE_DIR=$share/images
export SMOL_NESTED_PUBLISH_PORTS=$publish
EOF
  mv "$state/env.tmp" "$state/env"
  echo "$url" > "$state/url"
  log "up at $url"
}

cmd_down() {
  [ -d "$state" ] || return 0
  exec 9> "$state/.lock"
  flock -w 900 9 || die "another nested-engine.sh holds $state/.lock"
  stop_qemu
  clear_runtime
}

cmd_status() {
  if healthy; then
    cat "$state/url"
  else
    log "not up"
    return 1
  fi
}

cmd_env() {
  [ -f "$state/env" ] || die "not up (run: scripts/nested-engine.sh up)"
  cat "$state/env"
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  *) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
