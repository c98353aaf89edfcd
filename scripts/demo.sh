#!/usr/bin/env bash
# The local end-to-end demo: builds the driver, makes a pool of three loop devices,
# starts the plugin, and runs examples/demo.rs through the CSI socket. Cleans up on exit.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root
ensure_cargo
install_host_tools
echo "building the driver and the demo client (cargo, release; about ten minutes on a cold 2-core machine)"
build_with_progress --release --bin gds-csi --example demo
build_driver

start_workdir demo

pool=()
for size in 64M 128M 256M; do
  pool+=(--pool-device "$(make_loop "$WORK/dev-$size.img" "$size")")
done
echo "pool: ${pool[*]}"
# The driver log outlives the demo (the work dir does not).
LOG=$(mktemp /tmp/gds-demo-driver.XXXXXX.log)
"$GDS_CSI" serve --endpoint "unix://$WORK/csi.sock" --mode all --node-id demo-node \
  --state-dir "$WORK/state" --allowed-path-root "$WORK/kubelet" "${pool[@]}" 2>"$LOG" &
# shellcheck disable=SC2034 # stop_driver_and_clean (scripts/lib.sh) stops it
DRIVER_PID=$!
wait_for_ready "$WORK/csi.sock"
echo "GDS is off in this demo (its class says gdsPolicy: disabled): this machine has no GPU to read"
echo "into. On a GPU node, gdsPolicy: required publishes only where a cuFile read proves GDS works."
if ! "$TARGET_DIR/release/examples/demo" "$WORK/csi.sock" "$WORK"; then
  echo "--- driver log ($LOG) ---"; cat "$LOG"; exit 1
fi
echo "driver log: $LOG ($(grep -c 'call' "$LOG") calls logged, $(grep -c 'formatting fresh device' "$LOG") mkfs)"
echo "next: a cluster. bash scripts/image.sh writes the driver's image; then helm install with"
echo "  deploy/values/trial.yaml (no GPU) or deploy/values/gpu-nvme.yaml (docs/operations.md)."
