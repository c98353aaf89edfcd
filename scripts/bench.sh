#!/usr/bin/env bash
# Benchmarks (root): builds release, makes a loop-device pool (one 64 MiB device for the
# volume lifecycle, STORM x 32 MiB for the storm, one 512 MiB for the O_DIRECT reads),
# starts the driver with metrics on, runs examples/bench.rs through the CSI socket and
# prints a markdown table. Every mount and loop device is removed on exit, even on failure.
#
# Usage: scripts/bench.sh [ROUNDS=25] [STORM=64]     (BENCH_ONLY=a,b,d,e runs a subset)
# BENCH_DRIVER=/path/to/gds-csi benches that driver binary instead of building this
# checkout's (an A/B of two builds; the bench client is still this checkout's).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root
install_host_tools
ROUNDS=${1:-25}
STORM=${2:-64}
if [ -n "${BENCH_DRIVER:-}" ]; then
  GDS_CSI=$BENCH_DRIVER
else
  build_driver
fi
(cd "$REPO_ROOT" && cargo build --release --quiet --example bench)

start_workdir bench

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
if ! "$REPO_ROOT/target/release/examples/bench" "$WORK/csi.sock" "$WORK" "$DRIVER_PID" "$ROUNDS" "$STORM"; then
  echo "--- driver log (last 50 lines) ---"; tail -n 50 "$WORK/driver.log"; exit 1
fi
if [ -n "${BENCH_METRICS_OUT:-}" ]; then
  curl -fsS "http://$METRICS/metrics" >"$BENCH_METRICS_OUT" 2>/dev/null ||
    echo "could not fetch http://$METRICS/metrics" >&2
fi
echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r)"
