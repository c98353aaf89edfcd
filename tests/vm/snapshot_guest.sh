#!/usr/bin/env bash
# Inside the VM (tests/vm/snapshot.sh boots it): NVMe namespaces, the kernel's NFS server
# exporting a tmpfs over soft-RoCE RDMA (NFS v4.1, port 20049) that holds the snapshot store
# (`snaps/` below the export), a dataset on a tmpfs that the scenarios write into volumes,
# the driver, then the snapshot scenarios and figures (examples/snapshot_vm.rs).
#
#   snapshot_guest.sh run OUT_DIR BIN_DIR [SCENARIOS]   the whole run
#   snapshot_guest.sh kill-driver | start-driver | nfs-stop | nfs-start   for the scenarios
set -uo pipefail
W=/run/gds
EXP=/run/exp
DATA=/run/data
STATE=/run/gds-rig     # what the subcommands need: the driver's pid and binary
export PATH="/usr/sbin:/sbin:$PATH"
log() { echo "[guest $(date +%T)] $*"; }

start_driver() {
  local bin before
  bin=$(cat "$STATE/bin")
  before=$(grep -c "pool ready" "$W/driver.log" 2>/dev/null)
  "$bin/gds-csi" serve --endpoint "unix://$W/csi.sock" --mode all --node-id vm-node \
    --state-dir "$W/state" --allowed-path-root "$W" --nvme-discover \
    --mount-timeout 20s --command-timeout 60s --snapshot-stall-limit 15s \
    --log-format text >>"$W/driver.log" 2>&1 &
  echo $! >"$STATE/driver.pid"
  for _ in $(seq 1 300); do
    [ "$(grep -c "pool ready" "$W/driver.log")" -gt "${before:-0}" ] && [ -S "$W/csi.sock" ] && return 0
    sleep 0.1
  done
  log "driver did not come up"; tail -20 "$W/driver.log"; return 1
}

kill_driver() {
  local pid; pid=$(cat "$STATE/driver.pid")
  kill -9 "$pid" 2>/dev/null
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  log "driver $pid SIGKILLed"
}

nfs_start() {
  rpc.nfsd 8
  echo "rdma 20049" >/proc/fs/nfsd/portlist 2>/dev/null || true
  log "nfsd started: $(tr '\n' ' ' </proc/fs/nfsd/portlist)"
}

nfs_stop() { rpc.nfsd 0; log "nfsd stopped (threads: $(cat /proc/fs/nfsd/threads))"; }

case "${1:-}" in
  kill-driver) kill_driver; exit ;;
  start-driver) start_driver; exit ;;
  nfs-stop) nfs_stop; exit ;;
  nfs-start) nfs_start; exit ;;
  run) OUT=$2; BIN=$3; SCENARIOS=${4:-} ;;
  *) echo "usage: $0 run OUT BIN [SCENARIOS] | kill-driver | start-driver | nfs-stop | nfs-start" >&2; exit 2 ;;
esac

exec > >(tee "$OUT/setup.log") 2>&1
log "booted"
mkdir -p "$W" "$STATE" "$EXP" "$DATA"
mount -t tmpfs tmpfs "$W" && mount -t tmpfs tmpfs "$STATE" && mount -t tmpfs tmpfs "$DATA" && mkdir -p "$W/state"
echo "$BIN" >"$STATE/bin"
modprobe nvme
NS_WANT=${NS_COUNT:-7}
for _ in $(seq 1 100); do [ "$(ls -d /sys/block/nvme* 2>/dev/null | wc -l)" -ge "$NS_WANT" ] && break; sleep 0.1; done
log "NVMe: $(cd /sys/block && echo nvme*)"

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
mkdir -p "$EXP/snaps"
# Short lease and grace times: a scenario stops and restarts the server.
echo 10 >/proc/fs/nfsd/nfsv4leasetime; echo 10 >/proc/fs/nfsd/nfsv4gracetime
rpcbind -w
exportfs -o rw,sync,no_subtree_check,insecure,no_root_squash,fsid=0 "*:$EXP"
rpc.mountd
nfs_start

log "dataset on a tmpfs (written into the volumes by the scenarios)"
D="$DATA"
for a in 0 1; do
  for b in 0 1 2 3 4 5 6 7 8 9; do
    mkdir -p "$D/l$a/m$b"
    for c in 0 1 2 3 4 5 6 7 8 9; do
      head -c $(( (RANDOM % 64 + 1) * 1024 + RANDOM % 1000 )) /dev/urandom >"$D/l$a/m$b/f$c.dat"
    done
  done
done
head -c $((8 << 20)) /dev/urandom >"$D/big0.bin"
head -c $(((8 << 20) + 4097)) /dev/urandom >"$D/big1.bin"
truncate -s 16M "$D/sparse.img" && printf 'middle' | dd of="$D/sparse.img" bs=1 seek=$((8 << 20)) conv=notrunc status=none
: >"$D/empty"
echo odd >"$D/sp ace & \$dollar"; echo odd >"$D/ünïcødé"; echo odd >"$D/quote'single"; echo odd >"$D/-leading-dash"
ln "$D/big0.bin" "$D/l0/big0.link"
ln -s /etc/passwd "$D/outside"
ln -s l0/m0/f0.dat "$D/inside"
chown 1234:4321 "$D/l1/m1/f1.dat" && chmod 640 "$D/l1/m1/f1.dat"
chown 5:5 "$D/l1/m2" && chmod 0750 "$D/l1/m2" && chmod 0700 "$D/l1/m3"
chmod 4755 "$D/l0/m0/f1.dat"
echo "  $(find "$D" | wc -l) entries, $(du -sb "$D" | cut -f1) bytes apparent, $(du -s -B1 "$D" | cut -f1) allocated"

start_driver || exit 1
fail=0
log "snapshot scenarios: ${SCENARIOS:-all}"
start=$SECONDS
[ -n "$SCENARIOS" ] && export SNAPSHOT_SCENARIOS="$SCENARIOS"
GUEST_HELPER="${BASH_SOURCE[0]}" DRIVER_PID_FILE="$STATE/driver.pid" DRIVER_LOG="$W/driver.log" \
  timeout 1500 "$BIN/examples/snapshot_vm" "$W/csi.sock" "$W" "$EXP" "$DATA" 2>&1 | tee "$OUT/scenarios.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
echo "scenarios: $((SECONDS - start)) s"
cp "$W/driver.log" "$OUT/driver.log"
kill_driver
log "guest done: $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
exit $fail
