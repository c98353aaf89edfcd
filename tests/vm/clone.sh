#!/usr/bin/env bash
# NFS -> NVMe clones on the real-kernel rig, as its own suite entry: a QEMU VM
# (virtme-ng, Debian's kernel, software emulation) with 5 NVMe namespaces (two of 160 MiB,
# two of 192 MiB whose writes QEMU throttles to 16 MiB/s so a copy lasts long enough to
# be interrupted, one of 160 MiB pre-formatted ext4 `cp-target` that the pool leaves
# alone) and the kernel's NFS server over soft-RoCE RDMA. Inside
# (tests/vm/clone_guest.sh, examples/clone_vm.rs): clones of an NFS volume and of a
# class's dataset checked file by file, the driver SIGKILLed mid-copy, the NFS server
# stopped mid-copy, and the figures (driver vs cp -a vs fio, CPU per GiB).
# Usage: bash tests/vm/clone.sh (alone: its figures want both cores)
# Env: CLONE_SCENARIOS="volume dataset kill stop nfs figures" (a subset to iterate on),
# VENV (virtme-ng's venv, default .cache/vng-venv as tests/vm/run.sh installs it).
set -euo pipefail
. "$(dirname "$0")/../../scripts/lib.sh"
need_root
cd "$REPO_ROOT"
VENV="${VENV:-$REPO_ROOT/.cache/vng-venv}"
install_vm_tools
echo "building the driver and the scenario client (release)"
cargo build --release --quiet --bin gds-csi --example clone_vm
KERNEL=$(ls /boot/vmlinuz-*-amd64 | sort -V | tail -1)
WORK=$(mktemp -d /tmp/gds-clone-vm.XXXXXX)
OUT="$WORK/out"; mkdir -p "$OUT"
SLOW=$((16 * 1024 * 1024))
q=" -device nvme-subsys,id=subsys0,nqn=gds.clone0 -device nvme,serial=clone0,id=nvme0,subsys=subsys0"
ns=0
add_ns() { # size [throttle|cp]
  ns=$((ns + 1))
  local img="$WORK/ns$ns.img" extra=""
  truncate -s "$1" "$img"
  [ "${2:-}" = throttle ] && extra=",throttling.bps-write=$SLOW"
  [ "${2:-}" = cp ] && mkfs.ext4 -q -F -L cp-target "$img"
  q+=" -drive file=$img,if=none,id=ns$ns,format=raw$extra -device nvme-ns,drive=ns$ns,bus=nvme0,nsid=$ns"
}
add_ns 160M; add_ns 160M; add_ns 192M throttle; add_ns 192M throttle; add_ns 160M cp
T0=$SECONDS
set +e
PATH="$VENV/bin:$PATH" timeout 1800 vng --run "$KERNEL" --disable-kvm --memory 2G --cpus 2 --rwdir "$WORK" \
  --qemu-opts="$q" --exec "bash $REPO_ROOT/tests/vm/clone_guest.sh run $OUT $REPO_ROOT/target/release '${CLONE_SCENARIOS:-}'" \
  >"$WORK/console.log" 2>&1
rc=$?
set -e
grep -hE "^(PASS|FAIL|FIGURES|clone scenarios:)" "$OUT/scenarios.log" 2>/dev/null || tail -40 "$WORK/console.log"
echo "clone VM suite: rc=$rc, $((SECONDS - T0)) s wall (boot included); logs in $WORK"
rm -f "$WORK"/*.img
exit $rc
