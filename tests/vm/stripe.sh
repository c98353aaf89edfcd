#!/usr/bin/env bash
# The stripe layout on the real-kernel rig, as its own suite entry: a QEMU VM
# with Debian's kernel (md, raid0) and 4 pool NVMe drives throttled by QEMU to a fixed
# bandwidth each, plus a foreign md array. Inside (tests/vm/stripe_guest.sh): csi-sanity
# with `layout: stripe`, then examples/stripe_vm.rs (fio figures on 1, 2 and 4 drives, the
# scenarios). Exits non-zero on any failure. Root; needs the vng venv of tests/vm/run.sh,
# fio (installed from Debian here) and mdadm (from PATH, or MDADM_DIR pointing at a
# folder holding an mdadm binary).
# Usage: bash tests/vm/stripe.sh (alone: it wants both cores)
# FIO_SHARE=0 leaves out the fio figures no verdict reads (the members read with md's share
# of a request). FIO_CHUNKS="128K 512K 1M" adds the default chunk against others (4-drive stripes, fio at
# iodepth 1 and 8); off by default.
set -euo pipefail
. "$(dirname "$0")/../../scripts/lib.sh"
need_root
cd "$REPO_ROOT"
VENV="${VENV:-$REPO_ROOT/.cache/vng-venv}"
# mdadm: from PATH, else Debian's package unpacked under .cache (not installed: its
# initramfs and udev hooks have no business on the build machine).
if [ -z "${MDADM_DIR:-}" ]; then
  if command -v mdadm >/dev/null; then
    MDADM_DIR=$(dirname "$(command -v mdadm)")
  else
    MDADM_DIR="$REPO_ROOT/.cache/mdadm/sbin"
    if [ ! -x "$MDADM_DIR/mdadm" ]; then
      d=$(mktemp -d); (cd "$d" && apt-get download -qq mdadm && dpkg -x mdadm_*.deb root)
      mkdir -p "$REPO_ROOT/.cache/mdadm" && cp -a "$d/root/sbin" "$REPO_ROOT/.cache/mdadm/" && rm -rf "$d"
    fi
  fi
fi
# QEMU, the kernel and fio (run in the guest, which shares this root read-only).
install_vm_tools
install_csi_sanity
cargo build --quiet --bin gds-csi --example stripe_vm
KERNEL=$(ls /boot/vmlinuz-*-amd64 | sort -V | tail -1)
WORK=$(mktemp -d /tmp/gds-stripe-vm.XXXXXX)
OUT="$WORK/out"; mkdir -p "$OUT"
BPS=$((100 * 1024 * 1024))   # each pool drive: 100 MiB/s read and write
q=""
for i in 0 1 2 3; do
  truncate -s 256M "$WORK/pool$i.img"
  q+=" -device nvme,serial=pool$i,id=nvme$i"
  q+=" -drive file=$WORK/pool$i.img,if=none,id=p$i,format=raw,throttling.bps-read=$BPS,throttling.bps-write=$BPS"
  q+=" -device nvme-ns,drive=p$i,bus=nvme$i,nsid=1"
done
truncate -s 32M "$WORK/f1.img"; truncate -s 32M "$WORK/f2.img"
q+=" -device nvme,serial=foreign,id=nvmef"
q+=" -drive file=$WORK/f1.img,if=none,id=f1,format=raw -device nvme-ns,drive=f1,bus=nvmef,nsid=1"
q+=" -drive file=$WORK/f2.img,if=none,id=f2,format=raw -device nvme-ns,drive=f2,bus=nvmef,nsid=2"
T0=$SECONDS
set +e
PATH="$VENV/bin:$PATH" timeout 2100 vng --run "$KERNEL" --disable-kvm --memory 2G --cpus 2 --rwdir "$WORK" \
  --qemu-opts="$q" --exec "FIO_CHUNKS='${FIO_CHUNKS:-}' FIO_SHARE='${FIO_SHARE:-1}' bash $REPO_ROOT/tests/vm/stripe_guest.sh run $OUT $REPO_ROOT/target/debug $MDADM_DIR $CACHE_BIN" \
  >"$WORK/console.log" 2>&1
rc=$?
set -e
cat "$OUT/sanity.summary" 2>/dev/null || echo "csi-sanity stripe: no summary"
cat "$OUT/scenarios.log" 2>/dev/null || tail -30 "$WORK/console.log"
echo "stripe VM suite: rc=$rc, $((SECONDS - T0)) s wall (boot included); logs in $WORK"
rm -f "$WORK"/*.img
exit $rc
