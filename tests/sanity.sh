#!/usr/bin/env bash
# csi-sanity (the CSI conformance suite) against the real driver binary on a pool of
# real loop devices, with real mkfs and real mounts. Fails on csi-sanity's failure and on
# anything left behind: a mount under the work dir or of a pool device, a loop device
# that cannot be detached. Cleans up on any exit.
set -euo pipefail
. "$(dirname "$0")/../scripts/lib.sh"
need_root
install_host_tools
install_csi_sanity
build_driver

# Run once per filesystem: ext4 here, then xfs (SANITY_FS_TYPE=xfs) on devices that
# mkfs.xfs accepts (300 MiB and up since xfsprogs 5.19; CreateVolume rounds up to it),
# then the partition layout (SANITY_LAYOUT=partition): every volume a GPT partition
# carved from ONE loop device.
FS_TYPE=${SANITY_FS_TYPE:-ext4}
LAYOUT=${SANITY_LAYOUT:-device}
VOLUME_SIZE=$((64 * 1024 * 1024))
[ "$FS_TYPE" = xfs ] && VOLUME_SIZE=$((320 * 1024 * 1024))
POOL_SIZE=8
DEVICE_SIZE=$VOLUME_SIZE
EXPAND_SIZE=$VOLUME_SIZE
if [ "$LAYOUT" = partition ]; then
  # A carved volume really grows: its partition in place, into the free space after it.
  EXPAND_SIZE=$((2 * VOLUME_SIZE))
  # Room for 15 volumes at once (the suite holds at most ~5) plus the GPT's own 2 MiB.
  POOL_SIZE=1
  DEVICE_SIZE=$((16 * VOLUME_SIZE))
fi
start_workdir sanity

args=()
LOOPS=()
for i in $(seq 1 "$POOL_SIZE"); do
  LOOPS+=("$(make_loop "$WORK/dev$i.img" "$DEVICE_SIZE")")
  args+=(--pool-device "${LOOPS[-1]}")
done
# The kill switch of the test-only fault injection is set: the release binary is built
# without the fault-injection feature, so it must ignore it (a build with the feature dies
# at the first CreateVolume and the suite fails).
GDS_CSI_FAULT_KILL_AT=after-allocate \
"$GDS_CSI" serve --endpoint "unix://$WORK/csi.sock" --mode all --node-id sanity-node \
  --state-dir "$WORK/state" --allowed-path-root "$WORK" "${args[@]}" 2>"$WORK/driver.log" &
DRIVER_PID=$!
wait_for_ready "$WORK/csi.sock"
RSS_IDLE=$(rss_kib "$DRIVER_PID")

# Expansion specs grow a volume to --csi.testvolumeexpandsize and expect exactly that
# capacity: a whole-device volume can grow only up to its device, which is VOLUME_SIZE;
# a partition volume grows in place to twice its size.
# The clone specs ("should create volume from an existing source volume", "... source volume
# is not found") run because the driver advertises CLONE_VOLUME: csi-sanity has no flag for them.
# No GPU here: the GDS gate is on unless the class says otherwise, so the class says so.
printf 'gdsPolicy: disabled\nfsType: %s\n' "$FS_TYPE" >"$WORK/params.yaml"
# Snapshots go to a directory store (this kernel has no NFS client); every snapshot spec
# runs because the driver advertises CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS and GET_SNAPSHOT.
printf 'storeDir: %s\n' "$WORK/snapshots" >"$WORK/snapshot-params.yaml"
[ "$LAYOUT" = device ] || printf 'layout: %s\n' "$LAYOUT" >>"$WORK/params.yaml"
start=$(date +%s.%N)
set +e
csi-sanity --csi.endpoint "$WORK/csi.sock" \
  --csi.mountdir "$WORK/target" --csi.stagingdir "$WORK/staging" \
  --csi.testvolumeparameters "$WORK/params.yaml" \
  --csi.testsnapshotparameters "$WORK/snapshot-params.yaml" \
  --csi.testvolumesize "$VOLUME_SIZE" --csi.testvolumeexpandsize "$EXPAND_SIZE" -ginkgo.no-color -ginkgo.v "$@" >"$WORK/sanity.out" 2>&1
status=$?
set -e
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
RSS_AFTER=$(rss_kib "$DRIVER_PID")

grep -E "Ran [0-9]+ of [0-9]+ Specs|SUCCESS!|FAIL!|\[FAIL\]" "$WORK/sanity.out" || true
if [ $status -ne 0 ]; then
  echo "--- csi-sanity output (tail) ---"; tail -n 80 "$WORK/sanity.out"
  echo "--- driver log (tail) ---"; tail -n 40 "$WORK/driver.log"
fi
echo "sanity ($FS_TYPE, layout $LAYOUT) wall time: ${elapsed}s; driver RSS idle ${RSS_IDLE} KiB, after sanity ${RSS_AFTER} KiB"
cp "$WORK/sanity.out" "$WORK/driver.log" /tmp/ 2>/dev/null || true

# Nothing may outlive csi-sanity's own cleanup: no mount under the work dir, none of a pool
# device anywhere, and (after the driver stops and the work dir is torn down) no loop
# device still bound: the kernel defers the detach of a device that is still mounted or
# open (drivers/block/loop.c, loop_clr_fd: autoclear), so a leak elsewhere shows here.
leaks=()
while read -r m; do leaks+=("mount left at $m"); done < <(awk -v d="$WORK/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo)
for dev in "${LOOPS[@]}"; do
  while read -r m; do leaks+=("$dev still mounted at $m"); done < <(findmnt -rn -o TARGET --source "$dev" || true)
done
if [ "$LAYOUT" = partition ]; then
  # Every volume was deleted, so its partition must be gone from the kernel and from the
  # label, and the label must still be one sgdisk finds valid.
  dev=${LOOPS[0]}
  while read -r p; do leaks+=("partition $p left in the kernel"); done < <(partitions_of "$dev")
  entries=$(sgdisk -p "$dev" 2>/dev/null | awk 'f && NF {n++} /^Number/ {f=1} END {print n+0}')
  [ "$entries" -eq 0 ] || leaks+=("$entries partition entries left in the label of $dev")
  # sgdisk -v says "No problems found" even when it had to rebuild a corrupt backup
  # header in memory; its cautions and CRC warnings count too.
  verify=$(sgdisk -v "$dev" 2>&1 || true)
  if ! grep -q "No problems found" <<<"$verify" || grep -Eqi "caution|warning|error|corrupt" <<<"$verify"; then
    leaks+=("sgdisk -v finds problems on $dev: $(tr '\n' ' ' <<<"$verify")")
  fi
fi
kill "$DRIVER_PID" 2>/dev/null || true
wait "$DRIVER_PID" 2>/dev/null || true
DRIVER_PID=
cleanup_dir_and_loops "$WORK"
while read -r dev file; do
  leaks+=("loop device $dev still bound to $file")
done < <(losetup --list --noheadings -O NAME,BACK-FILE | awk -v d="$WORK/" 'index($2, d) == 1')
echo "leaked mounts and loop devices: ${#leaks[@]}"
if [ ${#leaks[@]} -gt 0 ]; then
  printf '  LEAK: %s\n' "${leaks[@]}"
  # Unmount what the check found outside the work dir, so the next run starts clean.
  for dev in "${LOOPS[@]}"; do
    findmnt -rn -o TARGET --source "$dev" 2>/dev/null | sort -r | while read -r m; do umount -l "$m" || true; done
    losetup -d "$dev" 2>/dev/null || true
  done
  [ $status -ne 0 ] || status=1
fi
if [ $status -eq 0 ] && [ -z "${SANITY_FS_TYPE:-}" ] && [ -z "${SANITY_LAYOUT:-}" ]; then
  SANITY_FS_TYPE=xfs bash "$0" "$@" || status=$?
  [ $status -ne 0 ] || SANITY_LAYOUT=partition SANITY_FS_TYPE=ext4 bash "$0" "$@" || status=$?
fi
exit $status
