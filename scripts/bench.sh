#!/usr/bin/env bash
# Benchmarks (root): builds release, makes a loop-device pool (one 64 MiB device for the
# volume lifecycle, STORM x 32 MiB for the storm, one 512 MiB for the O_DIRECT reads),
# starts the driver with metrics on, runs examples/bench.rs through the CSI socket and
# prints a markdown table. Every mount and loop device is removed on exit, even on failure.
#
# Usage: scripts/bench.sh [ROUNDS=25] [STORM=64]     (BENCH_ONLY=a,b,d,e,p runs a subset)
# Section p (the partition layout) runs on drivers of its own with their own
# pools, after the rest: PART_ROUNDS (default 100) create/delete samples per layout.
# BENCH_DRIVER=/path/to/gds-csi benches that driver binary instead of building this
# checkout's (an A/B of two builds; the bench client is still this checkout's).
#
#        scripts/bench.sh scale [COUNTS=10,100,1000] [ROUNDS=30]
# The scale benchmark (examples/scale.rs): each call's p50/p99 with COUNTS volumes on the
# node (`layout: partition`, 2 MiB each, on SCALE_DEVICES=8 loop devices whatever the
# count), start-up, RSS and the state's size, and the ratio of the largest count to the
# smallest.
#        scripts/bench.sh scale-nfs [COUNTS=10,100,1000,10000] [ROUNDS=30]
# The same for NFS volumes, in process over the Host double (examples/scale_nfs.rs): no
# root, no NFS server; it benches this checkout's code (BENCH_DRIVER does not apply).
#        scripts/bench.sh storm [N=256]
# N concurrent CreateVolume + NodeStage + NodePublish against the same calls one at a
# time, and the driver's fds and threads before, during and after (examples/scale.rs
# storm; STORM_PER_DEVICE=255 partitions a loop device, devices follow from N; 128 for
# builds whose labels have 128 entries).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
if [ "${1:-}" = scale-nfs ]; then
  (cd "$REPO_ROOT" && cargo build --release --quiet --example scale_nfs)
  WORK=$(mktemp -d /tmp/gds-scale-nfs.XXXXXX)
  trap 'rm -rf "$WORK"' EXIT
  "$TARGET_DIR/release/examples/scale_nfs" "$WORK" "${2:-10,100,1000,10000}" "${3:-30}"
  exit
fi
need_root
install_host_tools
case "${1:-}" in
  scale | storm)
    if [ -n "${BENCH_DRIVER:-}" ]; then GDS_CSI=$BENCH_DRIVER; else build_driver; fi
    (cd "$REPO_ROOT" && cargo build --release --quiet --example scale)
    start_workdir "$1"
    if [ "$1" = scale ]; then
      args=(block "$GDS_CSI" "$WORK" "${2:-10,100,1000}" "${3:-30}" --devices "${SCALE_DEVICES:-8}")
    else
      args=(storm "$GDS_CSI" "$WORK" "${2:-256}" --per-device "${STORM_PER_DEVICE:-255}")
    fi
    if ! "$TARGET_DIR/release/examples/scale" "${args[@]}"; then
      for log in "$WORK"/*/driver.log; do
        echo "--- $log (last 50 lines) ---"; tail -n 50 "$log"
      done
      exit 1
    fi
    exit
    ;;
esac
ROUNDS=${1:-25}
STORM=${2:-64}
if [ -n "${BENCH_DRIVER:-}" ]; then
  GDS_CSI=$BENCH_DRIVER
else
  build_driver dist # the binary the image ships: its RSS is the one a node pays
fi
(cd "$REPO_ROOT" && cargo build --release --quiet --example bench)

start_workdir bench
PART_ROUNDS=${PART_ROUNDS:-100}
want() { [ -z "${BENCH_ONLY:-}" ] || [[ ",$BENCH_ONLY," == *",$1,"* ]]; }

if [ "${BENCH_ONLY:-}" != p ]; then
pool=()
pool+=(--pool-device "$(make_loop "$WORK/life.img" 64M)")
for i in $(seq 1 "$STORM"); do
  pool+=(--pool-device "$(make_loop "$WORK/storm-$i.img" 32M)")
done
# Fully written backing files: a hole would read back as zeros without any I/O and
# flatter the raw-device side of the read comparison.
# The ext4 and the xfs read volumes take turns on this one device.
dd if=/dev/zero of="$WORK/read.img" bs=1M count=512 status=none
pool+=(--pool-device "$(make_loop "$WORK/read.img" 512M)")
echo "pool: $((STORM + 2)) loop devices; work dir $WORK"

METRICS=127.0.0.1:${BENCH_METRICS_PORT:-9808}
"$GDS_CSI" serve --endpoint "unix://$WORK/csi.sock" --mode all --node-id bench-node \
  --state-dir "$WORK/state" --allowed-path-root "$WORK/kubelet" --metrics-address "$METRICS" \
  "${pool[@]}" 2>"$WORK/driver.log" &
DRIVER_PID=$!
wait_for_ready "$WORK/csi.sock"
if ! "$TARGET_DIR/release/examples/bench" "$WORK/csi.sock" "$WORK" "$DRIVER_PID" "$ROUNDS" "$STORM"; then
  echo "--- driver log (last 50 lines) ---"; tail -n 50 "$WORK/driver.log"; exit 1
fi
if [ -n "${BENCH_METRICS_OUT:-}" ]; then
  curl -fsS "http://$METRICS/metrics" >"$BENCH_METRICS_OUT" 2>/dev/null ||
    echo "could not fetch http://$METRICS/metrics" >&2
fi
kill "$DRIVER_PID"; wait "$DRIVER_PID" 2>/dev/null || true; DRIVER_PID=
fi

# part_bench NAME SECTION DEVICE_ARGS...: a driver of its own on that pool, the bench's
# section p against it, the driver stopped.
part_bench() {
  local name=$1 section=$2; shift 2
  "$GDS_CSI" serve --endpoint "unix://$WORK/$name.sock" --mode all --node-id bench-node \
    --state-dir "$WORK/state-$name" --allowed-path-root "$WORK/kubelet" "$@" 2>"$WORK/driver-$name.log" &
  DRIVER_PID=$!
  wait_for_ready "$WORK/$name.sock"
  echo
  if ! BENCH_ONLY=$section "$TARGET_DIR/release/examples/bench" "$WORK/$name.sock" "$WORK" \
      "$DRIVER_PID" "$PART_ROUNDS" "$STORM"; then
    echo "--- driver log (last 50 lines) ---"; tail -n 50 "$WORK/driver-$name.log"; exit 1
  fi
  kill "$DRIVER_PID"; wait "$DRIVER_PID" 2>/dev/null || true; DRIVER_PID=
}
if want p; then
  # p1: a 64 MiB device for whole-device volumes (too small for a 64 MiB partition and
  # its label, so best fit never carves it) and one device for STORM 16 MiB partitions,
  # fully written (the raw side of the read comparison must not read holes).
  dd if=/dev/zero of="$WORK/part1.img" bs=1M count=$((STORM * 16 + 2)) status=none
  part_bench part1 p1 --pool-device "$(make_loop "$WORK/whole.img" 64M)" \
    --pool-device "$(make_loop "$WORK/part1.img" $(((STORM * 16 + 2) * 1024 * 1024)))"
  # p4: four devices with room for STORM/4 16 MiB partitions each, so the creates spread.
  p4=()
  for i in 1 2 3 4; do
    p4+=(--pool-device "$(make_loop "$WORK/part4-$i.img" $(((STORM / 4 * 16 + 2) * 1024 * 1024)))")
  done
  part_bench part4 p4 "${p4[@]}"
fi
echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r)"
