#!/usr/bin/env bash
# The GDS gate and `gds-csi doctor` on a real GPU node (run as root). Used on an H200 with
# libcufile and /etc/cufile.json, no nvidia_fs and no udev daemon; results in docs/gds-lab-notes.md.
#
# Steps: three 1 GiB loop devices as the pool; `gds-csi serve` on a unix socket; the client
# (tests/gds_gate.rs `h200_flow`) creates, stages (mkfs.ext4, mount data=ordered) and publishes a
# volume per gdsPolicy (preferred, required, disabled) and times NodePublish; then
# `gds-csi doctor --json --probe --path <staged mount>` runs twice: without the udev database
# entry for the loop device (expect volume.udev to fail and cuFileHandleRegister 5027), and
# after writing /run/udev/data/b7:<minor> (expect registration to succeed, in compat mode).
#
# BIN_DIR: where gds-csi and the gds_gate test binary are (default: build them with cargo).
# OUT: where outputs go (default: ./h200-out).
set -uo pipefail
OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1

echo "== environment"
uname -a; nvidia-smi -L 2>&1 | head -4
ls ~/.cargo/bin 2>&1 | head -3; which cargo || echo "no cargo"
ldconfig -p | grep -i cufile || echo "libcufile not in ldconfig"
ls -la /etc/cufile.json /run/udev 2>&1; ls /sys/module/nvidia_fs 2>&1 | head -2
ls /proc/driver/nvidia/gpus 2>&1

if [ -z "${BIN_DIR:-}" ]; then
  cargo build --release --bin gds-csi && cargo test --release --test gds_gate --no-run
  BIN_DIR=$(mktemp -d); cp target/release/gds-csi "$BIN_DIR/"
  # shellcheck disable=SC2010 # the newest test binary; cargo's names are plain
  cp "$(ls -t target/release/deps/gds_gate-* | grep -v '\.d$' | head -1)" "$BIN_DIR/gds_gate"
fi
GDS_CSI=$BIN_DIR/gds-csi
FLOW=$BIN_DIR/gds_gate
# The probe loads libcufile.so.0 from the loader path; find one if ldconfig does not know it.
if ! ldconfig -p | grep -q 'libcufile.so.0'; then
  lib=$(find / -xdev -name 'libcufile.so.0' 2>/dev/null | head -1)
  [ -n "$lib" ] && { LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; export LD_LIBRARY_PATH; }
  echo "libcufile: ${lib:-none found}"
fi

WORK=$(mktemp -d /tmp/gds-h200.XXXXXX)
LOOPS=()
DRIVER_PID=
cleanup() {
  [ -n "$DRIVER_PID" ] && kill "$DRIVER_PID" 2>/dev/null && wait "$DRIVER_PID" 2>/dev/null
  awk -v d="$WORK" '$5 ~ "^"d {print $5}' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null
  for d in "${LOOPS[@]}"; do losetup -d "$d" 2>/dev/null; done
  rm -f /run/udev/data/b7:* 2>/dev/null
}
trap cleanup EXIT

pool=()
for i in 1 2 3; do
  truncate -s 1G "$WORK/dev$i.img"
  d=$(losetup --find --show "$WORK/dev$i.img") || { echo "losetup failed"; exit 1; }
  LOOPS+=("$d"); pool+=(--pool-device "$d")
done
echo "== pool: ${LOOPS[*]}"
RUST_LOG=info "$GDS_CSI" serve --endpoint "unix://$WORK/csi.sock" --mode all --node-id h200 \
  --state-dir "$WORK/state" --allowed-path-root "$WORK/kubelet" --probe-timeout 60s \
  "${pool[@]}" 2>"$OUT/driver.log" &
DRIVER_PID=$!
for _ in $(seq 100); do [ -S "$WORK/csi.sock" ] && break; sleep 0.1; done

echo "== CSI flow (create, stage, publish per gdsPolicy)"
GDS_H200_SOCKET=$WORK/csi.sock GDS_H200_WORK=$WORK "$FLOW" --ignored --exact h200_flow --nocapture \
  --test-threads 1 2>&1 | tee "$OUT/flow.txt"
STAGED=$(cat "$WORK/staged-path" 2>/dev/null)
[ -n "$STAGED" ] || { echo "no staged volume; driver log:"; tail -50 "$OUT/driver.log"; exit 1; }
majmin=$(awk -v m="$STAGED" '$5 == m {print $3}' /proc/self/mountinfo | head -1)
src=$(awk -v m="$STAGED" '$5 == m {for (i = 6; i < NF; i++) if ($i == "-") {print $(i + 2); exit}}' /proc/self/mountinfo)
uuid=$(blkid -s UUID -o value "$src")
echo "staged at $STAGED (dev $majmin, uuid $uuid)"

echo "== doctor 1: no udev database entry"
mkdir -p /run/udev/data; rm -f "/run/udev/data/b$majmin"
echo "+ gds-csi doctor --json --probe --path $STAGED"
"$GDS_CSI" doctor --json --probe --path "$STAGED" >"$OUT/doctor-1.json"; echo "exit status $?"
"$GDS_CSI" doctor --probe --path "$STAGED" >"$OUT/doctor-1.txt"; echo "exit status $?"

echo "== doctor 2: with /run/udev/data/b$majmin"
printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\nE:ID_FS_UUID=%s\n' "$uuid" >"/run/udev/data/b$majmin"
cat "/run/udev/data/b$majmin"
"$GDS_CSI" doctor --json --probe --path "$STAGED" >"$OUT/doctor-2.json"; echo "exit status $?"
"$GDS_CSI" doctor --probe --path "$STAGED" >"$OUT/doctor-2.txt"; echo "exit status $?"
echo "== node only, no probe"
"$GDS_CSI" doctor; echo "exit status $?"
echo "== done"
