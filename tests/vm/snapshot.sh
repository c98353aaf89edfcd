#!/usr/bin/env bash
# CSI snapshots on the real-kernel rig, as its own suite entry: a QEMU VM (virtme-ng,
# Debian's kernel, software emulation) with 8 NVMe namespaces and the kernel's NFS server
# over soft-RoCE RDMA exporting the snapshot store. The namespaces, told apart by size so
# that smallest-fit allocation puts each volume where its scenario needs it:
#   4 x 160 MiB   the written source and the restores the figures time;
#   1 x 256 MiB   the volume a steady writer writes while it is snapshotted;
#   1 x 224 MiB   a source whose reads QEMU throttles (4 MiB/s), so a snapshot of it lasts
#                 long enough to be interrupted (SIGKILL, NFS server stopped);
#   2 x 192 MiB   restore targets whose writes QEMU throttles (8 MiB/s), so a restore
#                 lasts long enough to be interrupted (SIGKILL, DeleteSnapshot).
# Inside (tests/vm/snapshot_guest.sh, examples/snapshot_vm.rs): snapshot, restore and
# compare; a snapshot under a steady writer (the freeze time); SIGKILL mid-snapshot and
# mid-restore (bytes moved after the kill); the NFS server stopped mid-snapshot;
# DeleteSnapshot during a restore; the figures (lines starting with FIGURES).
# Usage: bash tests/vm/snapshot.sh (alone: its figures want both cores)
# Env: SNAPSHOT_SCENARIOS="restore live kill restore-kill stop delete figures" (a subset),
# VENV (virtme-ng's venv, default .cache/vng-venv as tests/vm/run.sh installs it),
# CARGO_TARGET_DIR (where the release build goes; default target/).
set -euo pipefail
. "$(dirname "$0")/../../scripts/lib.sh"
need_root
cd "$REPO_ROOT"
VENV="${VENV:-$REPO_ROOT/.cache/vng-venv}"
install_vm_tools
echo "building the driver and the scenario client (release)"
cargo build --release --quiet --bin gds-csi --example snapshot_vm
BIN="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release"
KERNEL=$(ls /boot/vmlinuz-*-amd64 | sort -V | tail -1)
WORK=$(mktemp -d /tmp/gds-snapshot-vm.XXXXXX)
OUT="$WORK/out"; mkdir -p "$OUT"
SLOW_READ=$((4 * 1024 * 1024))
SLOW_WRITE=$((8 * 1024 * 1024))
q=" -device nvme-subsys,id=subsys0,nqn=gds.snap0 -device nvme,serial=snap0,id=nvme0,subsys=subsys0"
ns=0
add_ns() { # size [slow-read|slow-write]
  ns=$((ns + 1))
  local img="$WORK/ns$ns.img" extra=""
  truncate -s "$1" "$img"
  [ "${2:-}" = slow-read ] && extra=",throttling.bps-read=$SLOW_READ"
  [ "${2:-}" = slow-write ] && extra=",throttling.bps-write=$SLOW_WRITE"
  q+=" -drive file=$img,if=none,id=ns$ns,format=raw$extra -device nvme-ns,drive=ns$ns,bus=nvme0,nsid=$ns"
}
add_ns 160M; add_ns 160M; add_ns 160M; add_ns 160M
add_ns 256M
add_ns 224M slow-read
add_ns 192M slow-write; add_ns 192M slow-write
T0=$SECONDS
set +e
PATH="$VENV/bin:$PATH" timeout 1800 vng --run "$KERNEL" --disable-kvm --memory 2G --cpus 2 --rwdir "$WORK" \
  --qemu-opts="$q" \
  --exec "NS_COUNT=$ns bash $REPO_ROOT/tests/vm/snapshot_guest.sh run $OUT $BIN '${SNAPSHOT_SCENARIOS:-}'" \
  >"$WORK/console.log" 2>&1
rc=$?
set -e
grep -hE "^(PASS|FAIL|FIGURES|snapshot scenarios:)" "$OUT/scenarios.log" 2>/dev/null || tail -40 "$OUT/setup.log" "$WORK/console.log"
echo "snapshot VM suite: rc=$rc, $((SECONDS - T0)) s wall (boot included); logs in $WORK"
rm -f "$WORK"/*.img
exit $rc
