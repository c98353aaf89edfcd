#!/usr/bin/env bash
# The cuFile probe with the libcufile the gds-csi image ships, against this GPU node's driver
# (run as root on a GPU machine; issue 16 item 1). No container engine needed: the wheel's
# libraries are laid out as the Dockerfile's cufile stage copies them (/usr/local/lib/gds-csi
# under a scratch root), and the probe is pointed at them (--cufile-library, LD_LIBRARY_PATH
# for libcufile_rdma.so.1), so a system libcufile cannot stand in for it. libcuda is the host
# driver's, as the NVIDIA container runtime injects it into the node pod.
#
# Steps: the nvidia-cufile wheel at the Dockerfile's CUFILE_VERSION; a 1 GiB loop device with
# ext4 (data=ordered); `gds-csi doctor --json --probe` for the node, then for the mounted
# volume without and with its udev database entry. Outputs and a summary in $OUT.
#
#   bash scripts/gpu-proof.sh                  # builds gds-csi (cargo) unless BIN is set
#   BIN=/path/to/gds-csi OUT=/tmp/proof bash scripts/gpu-proof.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$PWD/gpu-proof-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
[ "$(id -u)" -eq 0 ] || { echo "run as root (loop devices, mount)"; exit 2; }

echo "== environment"
uname -r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -4
ls /sys/module/nvidia_fs >/dev/null 2>&1 && echo "nvidia_fs loaded" || echo "nvidia_fs not loaded"

if [ -z "${BIN:-}" ]; then
  (cd "$REPO" && cargo build --release --quiet --bin gds-csi) || exit 1
  BIN=$REPO/target/release/gds-csi
fi
CUFILE_VERSION=$(sed -n 's/^ARG CUFILE_VERSION=//p' "$REPO/Dockerfile")
WORK=$(mktemp -d /tmp/gds-gpu-proof.XXXXXX)
LOOP=
cleanup() {
  umount "$WORK/mnt" 2>/dev/null
  [ -z "$LOOP" ] || losetup -d "$LOOP"
  [ -z "${UDEV_ENTRY:-}" ] || rm -f "$UDEV_ENTRY"
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== nvidia-cufile $CUFILE_VERSION, laid out as the image has it"
python3 -m venv "$WORK/venv" &&
  "$WORK/venv/bin/pip" download --quiet --no-deps --only-binary=:all: -d "$WORK/wheel" \
    "nvidia-cufile==$CUFILE_VERSION" &&
  python3 -m zipfile -e "$WORK"/wheel/nvidia_cufile-*.whl "$WORK/wheel/x" || exit 1
LIBDIR=$WORK/root/usr/local/lib/gds-csi
install -D -m 0644 -t "$LIBDIR" "$(dirname "$(find "$WORK/wheel/x/nvidia" -name libcufile.so.0 | head -1)")"/libcufile*.so*
ls -la "$LIBDIR"; sha256sum "$LIBDIR"/*
export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
DOCTOR=("$BIN" doctor --json --probe --probe-timeout 60s --cufile-library "$LIBDIR/libcufile.so.0")

echo "== 1. node probe (cuFileDriverOpen against the host driver)"
"${DOCTOR[@]}" >"$OUT/node.json"; echo "exit status $?"

truncate -s 1G "$WORK/dev.img"
LOOP=$(losetup --find --show "$WORK/dev.img") || exit 1
mkfs.ext4 -q "$LOOP" && mkdir -p "$WORK/mnt" && mount -o data=ordered "$LOOP" "$WORK/mnt" || exit 1
chmod 777 "$WORK/mnt"
majmin=$(lsblk -dno MAJ:MIN "$LOOP" | tr -d ' ')
UDEV_ENTRY=/run/udev/data/b$majmin
echo "== 2. volume probe, no udev entry for $LOOP ($majmin): expect 5027 at cuFileHandleRegister"
rm -f "$UDEV_ENTRY"
"${DOCTOR[@]}" --path "$WORK/mnt" >"$OUT/volume-no-udev.json"; echo "exit status $?"
echo "== 3. volume probe with $UDEV_ENTRY"
mkdir -p /run/udev/data
printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\nE:ID_FS_UUID=%s\n' "$(blkid -s UUID -o value "$LOOP")" >"$UDEV_ENTRY"
"${DOCTOR[@]}" --path "$WORK/mnt" >"$OUT/volume-udev.json"; echo "exit status $?"

echo "== summary (record in docs/gds-checks.md, 'The image's libcufile on a GPU node')"
for f in node volume-no-udev volume-udev; do
  python3 - "$OUT/$f.json" "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
p = d.get("probe") or {}
keep = {k: p.get(k) for k in ("status", "mode", "stage", "driver_open", "detail") if k in p}
print(f"{sys.argv[2]:15} ready={d.get('ready')} probe={json.dumps(keep)}")
PY
done
