#!/bin/sh
# /init of the outer QEMU VM that scripts/nested-engine.sh builds: loads kvm_amd on QEMU's emulated
# SVM, mounts the 9p share and runs the pinned smolvm engine's `serve` as root. It stays PID 1 (ash
# reaps the engine's reparented VM processes) and powers off if the serve exits, so QEMU ends and
# `up` reports at once instead of waiting out its timeout.
export PATH=/bin
# shellcheck source=/dev/null
. /etc/nested.env

say() { echo "nested-init: $(cut -d' ' -f1 /proc/uptime)s $*"; }
die() { say "FATAL: $*"; sleep 1; poweroff -f; }

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
# The engine's state dir: on tmpfs, which keeps the sparse disk images sparse.
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
say "mounted"

# Order matters: busybox insmod resolves no dependencies.
for m in $MODULES; do
  insmod "/lib/modules/$m.ko" || die "insmod $m failed"
done
[ -c /dev/kvm ] || die "no /dev/kvm after kvm_amd (is -cpu max with SVM given?)"
say "modules loaded, /dev/kvm present (npt=$(cat /sys/module/kvm_amd/parameters/npt 2>/dev/null))"

# QEMU user networking: 10.0.2.2 is the host, 10.0.2.3 its DNS forwarder.
ip link set lo up
ip link set eth0 up || die "no eth0"
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
echo "nameserver 10.0.2.3" > /etc/resolv.conf

# Two exports, two cache modes. The engine never changes while the VM runs: cache=loose, so its
# 41 MB binary and libraries are read over 9p once. The images are written by the host at any
# time (tests add their own): cache=mmap keeps no page cache, so a rewritten archive is read anew
# rather than served stale, and the engine's digest of it is the file's.
mkdir -p /smol/engine /smol/images
mount -t 9p -o trans=virtio,version=9p2000.L,cache=loose,msize=512000 smol-engine /smol/engine \
  || die "9p mount of the engine failed"
mount -t 9p -o trans=virtio,version=9p2000.L,cache=mmap,msize=512000 smol-images /smol/images \
  || die "9p mount of the images failed"
[ -x /smol/engine/smol-vmm ] || die "no /smol/engine/smol-vmm in the share"
say "share mounted"

# The agent rootfs was extracted on the host and shipped in this initramfs: extracting it here
# under TCG takes minutes. The engine looks for it under <state-dir>/.cache/smolvm/rootfs/ by the
# archive's size-hex-mtime-hex name, with `.extracted` marking it complete.
mkdir -p "$STATE_DIR/.cache/smolvm/rootfs"
if [ -d "/seed/$SEED_NAME" ]; then
  mv "/seed/$SEED_NAME" "$STATE_DIR/.cache/smolvm/rootfs/$SEED_NAME" || die "seeding the agent rootfs failed"
fi
say "agent rootfs seeded as $SEED_NAME"

export HOME=/root
export SMOLVM_VM_UID_DROP=off
# The tests' own servers run on the host, which QEMU's user network shows the guests as
# 10.0.2.2, a private address that a serve's egress floor refuses whatever a machine's allow
# list says (1.32.2: "egress floor set to strict (multi-tenant serve default)", seen on this
# nested engine). The metadata floor keeps cloud metadata and loopback refused and lets a
# machine reach the private addresses its allow list names.
export SMOLVM_EGRESS_FLOOR=metadata
# A machine's published ports bind loopback by default, which this host cannot reach through
# QEMU's user network: on every address instead, so that scripts/nested-engine.sh can forward
# the ports it names (SMOL_NESTED_PUBLISH_PORTS) to this host's loopback.
export SMOLVM_PUBLISH_ADDR=0.0.0.0
cd /tmp || die "no /tmp"
# A heartbeat on the console every 20 s. The serve has stopped answering under the booted suite
# with nothing on the console (QEMU still running): the last heartbeats say whether this kernel
# still ran then, and what was left of memory and of the tmpfs that holds the machines' disks.
(
  while sleep 20; do
    mem="$(awk '/^MemAvailable/ {print int($2/1024)}' /proc/meminfo)"
    tmp="$(df -m /tmp | awk 'NR==2 {print $3 "/" $2}')"
    procs="$(ls /proc | grep -c '^[0-9]')"
    say "heartbeat: available ${mem} MiB, /tmp ${tmp} MiB, load $(cut -d' ' -f1-3 /proc/loadavg), ${procs} processes"
  done
) &
say "starting smol-vmm serve"
/smol/engine/smol-vmm --state-dir "$STATE_DIR" serve start \
  --listen 0.0.0.0:8080 --local-image-dir /smol/images
say "smol-vmm serve exited with status $?"
sleep 1
poweroff -f
