#!/usr/bin/env bash
# Runs inside the VM booted by tests/vm/run.sh (virtme-ng: the host's root is shared
# read-only, this repository included). Sets up NVMe, an NFS server over soft-RoCE
# RDMA, starts the driver, then runs csi-sanity on both backends and the scenarios.
#
#   guest.sh run OUT_DIR [BIN]    the whole rig (what run.sh calls); GDS_VM_ONLY=nfs-sanity
#                                 or partition-sanity runs only that csi-sanity run
#                                 (run.sh passes it through)
#   guest.sh nfs-stop | nfs-start | restart-driver | kill-driver   helpers for the scenarios
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
W=/run/gds                       # the driver's world: state, kubelet dirs, socket
EXP=/run/exp                     # the NFS export (tmpfs)
SERVER=192.0.2.1
DRIVER="$REPO/target/release/gds-csi"
SCENARIOS="$REPO/target/release/examples/vm_scenarios"
# Tools the host built (csi-sanity): run.sh passes where lib.sh keeps them.
export PATH="${3:-$REPO/.cache/bin}:/usr/sbin:/sbin:$PATH"

log() { echo "[guest $(date +%T)] $*"; }

start_driver() {
  local before; before=$(grep -c "pool ready" "$W/driver.log" 2>/dev/null)
  "$DRIVER" serve --endpoint "unix://$W/csi.sock" --mode all --node-id vm-node \
    --state-dir "$W/state" --allowed-path-root "$W" --nvme-discover \
    --mount-timeout 20s --command-timeout 60s --log-format text >>"$W/driver.log" 2>&1 &
  echo $! >"$W/driver.pid"
  for _ in $(seq 1 200); do
    [ "$(grep -c "pool ready" "$W/driver.log")" -gt "${before:-0}" ] && [ -S "$W/csi.sock" ] && return 0
    sleep 0.1
  done
  log "driver did not come up"; tail -20 "$W/driver.log"; return 1
}

kill_driver() {
  local pid; pid=$(cat "$W/driver.pid")
  kill -9 "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
}

nfs_start() {
  rpc.nfsd 8
  echo "rdma 20049" >/proc/fs/nfsd/portlist 2>/dev/null || true
}

nfs_stop() { rpc.nfsd 0; }

case "${1:-}" in
  nfs-stop) nfs_stop; exit ;;
  nfs-start) nfs_start; exit ;;
  kill-driver) kill_driver; exit ;;
  restart-driver) kill_driver; start_driver; exit ;;
  run) OUT=$2 ;;
  *) echo "usage: $0 run OUT_DIR | nfs-stop | nfs-start | kill-driver | restart-driver" >&2; exit 2 ;;
esac

fail=0
mkdir -p "$W" "$EXP"
mount -t tmpfs tmpfs "$W"
mkdir -p "$W/state"

log "NVMe"
modprobe nvme
nvme_count() { local found=(/sys/block/nvme*); if [ -e "${found[0]}" ]; then echo "${#found[@]}"; else echo 0; fi; }
for _ in $(seq 1 100); do [ "$(nvme_count)" -ge 8 ] && break; sleep 0.1; done
for b in /sys/block/nvme*; do
  n=$(basename "$b")
  echo "  $n $(( $(cat "$b/size") * 512 / 1048576 )) MiB wwid=$(cat "$b/wwid") transport=$(cat "$b/device/transport" 2>/dev/null)"
done

log "NFS v4.1 over soft-RoCE"
modprobe rdma_rxe
ip link set lo up
ip link add veth0 type veth peer name veth1
ip addr add 192.0.2.1/24 dev veth0; ip addr add 192.0.2.2/24 dev veth1
ip link set veth0 up; ip link set veth1 up
rdma link add rxe0 type rxe netdev veth0
modprobe nfsd; modprobe rpcrdma
mount -t nfsd nfsd /proc/fs/nfsd
mount -t tmpfs tmpfs /var/lib/nfs
mkdir -p /var/lib/nfs/v4recovery; touch /var/lib/nfs/etab /var/lib/nfs/rmtab /var/lib/nfs/xtab
mount -t tmpfs tmpfs "$EXP"
# Short lease and grace times: the scenarios stop and restart the server.
echo 10 >/proc/fs/nfsd/nfsv4leasetime; echo 10 >/proc/fs/nfsd/nfsv4gracetime
rpcbind -w
exportfs -o rw,sync,no_subtree_check,insecure,no_root_squash,fsid=0 "*:$EXP"
rpc.mountd
nfs_start
echo "  portlist: $(tr '\n' ' ' </proc/fs/nfsd/portlist)"
rdma link show | sed 's/^/  /'
# One mount by hand first: loads the client's RDMA transport (slow under emulation)
# and shows the negotiated options.
mkdir -p /run/warm && mount -t nfs -o rdma,port=20049,vers=4.1 "$SERVER:/" /run/warm &&
  echo "  warm-up mount: $(awk '$5 == "/run/warm" {print $(NF)}' /proc/self/mountinfo | tr ',' '\n' | grep -E '^(vers|proto|port)=' | tr '\n' ',')" &&
  umount /run/warm

# udevd (virtme-ng's init starts it) is what the partition layout's disk lock is for.
log "udevd: $(pgrep -a systemd-udevd | head -1 || echo 'not running')"
log "driver"
start_driver || exit 1
grep -E "device not in the pool|not clean|pool ready" "$W/driver.log" | sed 's/^/  /'

sanity() {
  local name=$1; shift
  local out="$OUT/sanity-$name.out"
  local start=$SECONDS
  csi-sanity --csi.endpoint "$W/csi.sock" --csi.mountdir "$W/target" --csi.stagingdir "$W/staging" \
    -ginkgo.no-color -ginkgo.v "$@" >"$out" 2>&1
  local rc=$?
  echo "csi-sanity $name: $(grep -E 'Ran [0-9]+ of [0-9]+ Specs' "$out" | tail -1) $(grep -E '^(SUCCESS|FAIL)!' "$out" | tail -1) ($((SECONDS - start)) s)"
  if [ $rc -ne 0 ]; then
    grep -E "^\s*\[FAIL\]" "$out" | sort -u | head -20
    fail=1
  fi
}

finish() {
  cp "$W/driver.log" "$OUT/driver.log" 2>/dev/null
  kill_driver
  log "guest done: $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
  exit $fail
}

# The VM has no GPU: the GDS gate is on unless the class says otherwise, so the class says so.
if [ -z "${GDS_VM_ONLY:-}" ]; then
  log "csi-sanity: NVMe backend (--nvme-discover, 64 MiB namespaces)"
  printf 'gdsPolicy: disabled\n' >"$W/nvme-params.yaml"
  # Expansion specs expect exactly --csi.testvolumeexpandsize back: a whole namespace grows
  # only up to itself (the 64 MiB one best fit hands out).
  # Snapshots to a directory store (every snapshot spec runs: the driver advertises them).
  printf 'storeDir: %s\n' "$W/snapshots" >"$W/dir-store.yaml"
  sanity nvme --csi.testvolumesize $((64 << 20)) --csi.testvolumeexpandsize $((64 << 20)) \
    --csi.testvolumeparameters "$W/nvme-params.yaml" --csi.testsnapshotparameters "$W/dir-store.yaml"
fi
if [ "${GDS_VM_ONLY:-}" != partition-sanity ]; then
  log "csi-sanity: NFS backend (server $SERVER, NFS v4.1 over RDMA)"
  printf 'server: %s\nshare: /\ngdsPolicy: disabled\n' "$SERVER" >"$W/nfs-params.yaml"
  # Every spec runs, the clone ones too: NFS -> NFS clones copy the source's directory on
  # the export at CreateVolume (src/volume/nfs/clone.rs).
  # Snapshots to the same server over RDMA, a directory of the export as the store.
  printf 'storeServer: %s\nstoreShare: /\nstorePath: snapshots\n' "$SERVER" >"$W/nfs-store.yaml"
  sanity nfs --csi.testvolumesize $((64 << 20)) --csi.testvolumeparameters "$W/nfs-params.yaml" \
    --csi.testsnapshotparameters "$W/nfs-store.yaml"
  [ "${GDS_VM_ONLY:-}" = nfs-sanity ] && finish
fi

if [ -n "${GDS_VM_ONLY:-}" ]; then
  :
elif [ -x "$SCENARIOS" ]; then
  log "scenarios"
  GUEST_HELPER="${BASH_SOURCE[0]}" DRIVER_LOG="$W/driver.log" NFS_SERVER=$SERVER NFS_EXPORT_DIR=$EXP \
    "$SCENARIOS" "$W/csi.sock" "$W" 2>&1 | tee "$OUT/scenarios.out"
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
else
  echo "scenarios: $SCENARIOS not built"; fail=1
fi

# Last, since it leaves GPT labels on the namespaces it carves: csi-sanity with
# layout: partition, every volume a GPT partition of a real NVMe namespace under Debian's
# kernel (which has a GPT parser); then the kernel re-reads each carved namespace's table
# and sgdisk must find our label valid.
partition_sanity() {
  log "csi-sanity: NVMe backend, layout: partition (16 MiB partitions)"
  printf 'gdsPolicy: disabled\nlayout: partition\n' >"$W/part-params.yaml"
  printf 'storeDir: %s\n' "$W/snapshots" >"$W/dir-store.yaml"
  sanity nvme-partition --csi.testvolumesize $((16 << 20)) --csi.testvolumeexpandsize $((32 << 20)) \
    --csi.testvolumeparameters "$W/part-params.yaml" --csi.testsnapshotparameters "$W/dir-store.yaml"
  local d verify
  for d in /dev/nvme*n*; do
    [[ "$d" =~ n[0-9]+$ ]] || continue
    [ "$(blkid -p -o value -s PTTYPE "$d" 2>/dev/null)" = gpt ] || continue
    blockdev --rereadpt "$d" || { echo "rereadpt $d failed"; fail=1; }
    verify=$(sgdisk -v "$d" 2>&1)
    if grep -q "No problems found" <<<"$verify" && ! grep -Eqi "caution|warning|error|corrupt" <<<"$verify"; then
      echo "  $d: our label re-read by the kernel, sgdisk -v clean"
    else
      echo "  $d: sgdisk -v: $(tr '\n' ' ' <<<"$verify")"; fail=1
    fi
  done
}
# Every label write and BLKPG call holds the disk's BSD lock (systemd's block device
# locking convention, src/disk/gpt/wholedisk.rs), so udevd neither probes nor re-reads a
# disk while the driver changes it. On 2026-11-30, before that, this run failed 7 of 42
# specs here (BLKPG EBUSY, partitions missing right after a carve).
partition_sanity
[ "${GDS_VM_ONLY:-}" = partition-sanity ] && finish

# The partition scenario: carved volumes written, their partitions dropped
# with partx -d, the driver restarted (start-up re-sync), restaged, checksums compared.
if [ -x "$SCENARIOS" ]; then
  log "scenarios: partition layout"
  GUEST_HELPER="${BASH_SOURCE[0]}" DRIVER_LOG="$W/driver.log" NFS_SERVER=$SERVER NFS_EXPORT_DIR=$EXP \
    "$SCENARIOS" "$W/csi.sock" "$W" partition 2>&1 | tee "$OUT/scenarios-partition.out"
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
fi

finish
