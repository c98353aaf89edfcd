#!/usr/bin/env bash
# csi-sanity (the CSI conformance suite) against the real driver binary on a pool of
# real loop devices, with real mkfs and real mounts. Cleans up on any exit.
set -euo pipefail
. "$(dirname "$0")/../scripts/lib.sh"
need_root
install_host_tools
install_csi_sanity
build_driver

# Run once per filesystem: ext4 here, then xfs (SANITY_FS_TYPE=xfs) on devices that
# mkfs.xfs accepts (300 MiB and up since xfsprogs 5.19; CreateVolume rounds up to it).
FS_TYPE=${SANITY_FS_TYPE:-ext4}
VOLUME_SIZE=$((64 * 1024 * 1024))
[ "$FS_TYPE" = xfs ] && VOLUME_SIZE=$((320 * 1024 * 1024))
POOL_SIZE=8
start_workdir sanity

args=()
for i in $(seq 1 "$POOL_SIZE"); do
  args+=(--pool-device "$(make_loop "$WORK/dev$i.img" "$VOLUME_SIZE")")
done
"$GDS_CSI" serve --endpoint "unix://$WORK/csi.sock" --mode all --node-id sanity-node \
  --state-dir "$WORK/state" --allowed-path-root "$WORK" "${args[@]}" 2>"$WORK/driver.log" &
DRIVER_PID=$!
wait_for_ready "$WORK/csi.sock"
RSS_IDLE=$(rss_kib "$DRIVER_PID")

# No GPU here: the GDS gate is on unless the class says otherwise, so the class says so.
printf 'gdsPolicy: disabled\nfsType: %s\n' "$FS_TYPE" >"$WORK/params.yaml"
start=$(date +%s.%N)
set +e
csi-sanity --csi.endpoint "$WORK/csi.sock" \
  --csi.mountdir "$WORK/target" --csi.stagingdir "$WORK/staging" \
  --csi.testvolumeparameters "$WORK/params.yaml" \
  --csi.testvolumesize "$VOLUME_SIZE" -ginkgo.no-color -ginkgo.v "$@" >"$WORK/sanity.out" 2>&1
status=$?
set -e
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
RSS_AFTER=$(rss_kib "$DRIVER_PID")

grep -E "Ran [0-9]+ of [0-9]+ Specs|SUCCESS!|FAIL!|\[FAIL\]" "$WORK/sanity.out" || true
if [ $status -ne 0 ]; then
  echo "--- csi-sanity output (tail) ---"; tail -n 80 "$WORK/sanity.out"
  echo "--- driver log (tail) ---"; tail -n 40 "$WORK/driver.log"
fi
echo "sanity ($FS_TYPE) wall time: ${elapsed}s; driver RSS idle ${RSS_IDLE} KiB, after sanity ${RSS_AFTER} KiB"
leftover=$(grep -c " $WORK" /proc/self/mountinfo || true)
echo "mounts left under the work dir before cleanup: $leftover"
cp "$WORK/sanity.out" "$WORK/driver.log" /tmp/ 2>/dev/null || true
if [ $status -eq 0 ] && [ -z "${SANITY_FS_TYPE:-}" ]; then
  SANITY_FS_TYPE=xfs bash "$0" "$@" || status=$?
fi
exit $status
