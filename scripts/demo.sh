#!/usr/bin/env bash
# The local end-to-end demo: builds the driver, makes a pool of three loop devices,
# starts the plugin, and runs examples/demo.rs through the CSI socket. Cleans up on exit.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root
install_host_tools
build_driver
(cd "$REPO_ROOT" && cargo build --release --quiet --example demo)

start_workdir demo

pool=()
for size in 64M 128M 256M; do
  pool+=(--pool-device "$(make_loop "$WORK/dev-$size.img" "$size")")
done
echo "pool: ${pool[*]}"
"$GDS_CSI" serve --endpoint "unix://$WORK/csi.sock" --mode all --node-id demo-node \
  --state-dir "$WORK/state" --allowed-path-root "$WORK/kubelet" "${pool[@]}" 2>"$WORK/driver.log" &
# shellcheck disable=SC2034 # stop_driver_and_clean (scripts/lib.sh) stops it
DRIVER_PID=$!
wait_for_ready "$WORK/csi.sock"
if ! "$TARGET_DIR/release/examples/demo" "$WORK/csi.sock" "$WORK"; then
  echo "--- driver log ---"; cat "$WORK/driver.log"; exit 1
fi
echo "driver log: $(grep -c 'call' "$WORK/driver.log") calls logged, $(grep -c 'formatting fresh device' "$WORK/driver.log") mkfs"
