#!/usr/bin/env bash
# The real-kernel rig: a QEMU VM (virtme-ng, Debian's kernel, software emulation) with
# 2 NVMe controllers and 8 namespaces of 4 sizes, an NFS v4.1 server exporting over
# soft-RoCE RDMA (port 20049), and the driver built here. Inside it runs csi-sanity
# against the NVMe backend and against the NFS backend, then the scenarios of
# examples/vm_scenarios.rs, then csi-sanity with layout: partition and the partition
# scenario (examples/vm_scenarios/partition.rs). Exits non-zero on any failure. Root;
# Debian 12. GDS_VM_ONLY=nfs-sanity (or partition-sanity): only that csi-sanity run.
# docs/testing.md ("The VM rig") describes what it runs and why.
set -euo pipefail
. "$(dirname "$0")/../../scripts/lib.sh"
need_root
cd "$REPO_ROOT"
T0=$SECONDS

VENV="$REPO_ROOT/.cache/vng-venv"
install_vm_tools
install_csi_sanity
echo "building the driver and the scenario client (release)"
cargo build --release --quiet --bin gds-csi --example vm_scenarios

KERNEL=$(ls /boot/vmlinuz-*-amd64 | sort -V | tail -1)
WORK=$(mktemp -d /tmp/gds-vm.XXXXXX)
trap 'rm -rf "$WORK"/*.img' EXIT
OUT="$WORK/out"
mkdir -p "$OUT"

# Namespaces: 4 x 64 MiB (csi-sanity creates volumes of exactly --csi.testvolumesize),
# 96 and 128 MiB, 80 MiB pre-formatted with a foreign ext4 (must never be allocated),
# and one more 64 MiB. Two controllers, each in its own subsystem.
qemu_opts=""
ns=0
add_ns() { # controller size [foreign]
  ns=$((ns + 1))
  local img="$WORK/ns$ns.img"
  truncate -s "$2" "$img"
  if [ "${3:-}" = foreign ]; then
    mkfs.ext4 -q -F -L foreign-data -U 0f0f0f0f-1111-2222-3333-444444444444 "$img"
  fi
  local nsid=$(( (ns - 1) % 4 + 1 ))
  qemu_opts+=" -drive file=$img,if=none,id=ns$ns,format=raw -device nvme-ns,drive=ns$ns,bus=nvme$1,nsid=$nsid"
}
qemu_opts+=" -device nvme-subsys,id=subsys0,nqn=gds.subsys0 -device nvme,serial=gds0,id=nvme0,subsys=subsys0"
qemu_opts+=" -device nvme-subsys,id=subsys1,nqn=gds.subsys1 -device nvme,serial=gds1,id=nvme1,subsys=subsys1"
add_ns 0 64M; add_ns 0 64M; add_ns 0 96M; add_ns 0 80M foreign
add_ns 1 64M; add_ns 1 64M; add_ns 1 128M; add_ns 1 64M

echo "booting $KERNEL (software emulation) with 2 NVMe controllers, $ns namespaces"
export PATH="$VENV/bin:$PATH"
set +e
timeout 1140 vng --run "$KERNEL" --disable-kvm --memory 2G --cpus 2 --rwdir "$WORK" \
  --qemu-opts="$qemu_opts" \
  --exec "GDS_VM_ONLY=${GDS_VM_ONLY:-} bash $REPO_ROOT/tests/vm/guest.sh run $OUT $CACHE_BIN" 2>&1 | tee "$WORK/console.log"
rc=${PIPESTATUS[0]}
set -e
echo
echo "=== summary"
grep -hE "^csi-sanity (nvme|nfs|nvme-partition):|sgdisk -v" "$WORK/console.log" || echo "csi-sanity: no summary (see $WORK/console.log)"
for f in scenarios scenarios-partition; do
  grep -hE "^(PASS|FAIL) " "$OUT/$f.out" 2>/dev/null | sed 's/^/  /' || true
  grep -hE "^scenarios:" "$OUT/$f.out" 2>/dev/null | sed "s/^scenarios:/$f:/" || true
done
echo "outputs: $OUT (csi-sanity outputs, driver log), console: $WORK/console.log"
echo "vm rig wall time: $((SECONDS - T0)) s; result: $([ "$rc" -eq 0 ] && echo PASS || echo "FAIL (rc $rc)")"
exit "$rc"
