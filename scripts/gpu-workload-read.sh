#!/usr/bin/env bash
# `gds-csi workload-read` on a real GPU machine, through the files the driver's device
# plugin hands a container (run as root). Used on an H200 with libcufile and
# /etc/cufile.json, no nvidia_fs, no udev daemon and no kubelet; results in
# docs/gds-lab-notes.md ("A workload container's read").
#
# For each resource (gds-compat, then gds): `examples/workload_allocate` prints the
# plugin's Allocate answer (the resource's cufile.json made from the node's, the udev
# database, the node's nvidia-fs nodes, CUFILE_ENV_PATH_JSON); this script plays the
# container runtime with it (a private mount namespace where each mount is bound read-only
# at its container path, the variables set), and runs `gds-csi workload-read` on a file of
# an ext4 volume on a loop device, whose udev entry it writes as udevd would.
# Expected without nvidia_fs: gds-compat reads in compat mode; gds (compat off) cannot
# read and says compat would have worked.
#
# BIN_DIR: where gds-csi and workload_allocate are (default: build them with cargo).
# OUT: where outputs go (default: ./gpu-workload-out).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-workload-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1

echo "== environment"
nvidia-smi -L 2>&1 | head -2
ls -la /etc/cufile.json 2>&1; ls /sys/module/nvidia_fs 2>&1 | head -1; ls -d /run/udev/data 2>&1

if [ -z "${BIN_DIR:-}" ]; then
  cargo build --release --bin gds-csi --example workload_allocate || exit 1
  BIN_DIR=$(mktemp -d)
  cp target/release/gds-csi target/release/examples/workload_allocate "$BIN_DIR/"
fi
if ! ldconfig -p | grep -q 'libcufile.so.0'; then
  lib=$(find / -xdev -name 'libcufile.so.0' 2>/dev/null | head -1)
  [ -n "$lib" ] && { LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; export LD_LIBRARY_PATH; }
  echo "libcufile: ${lib:-none found}"
fi

WORK=$(mktemp -d /tmp/gds-workload.XXXXXX)
LOOP=
MADE_UDEV=
MADE_ETC=
cleanup() {
  umount "$WORK/vol" 2>/dev/null
  [ -n "$LOOP" ] && losetup -d "$LOOP" 2>/dev/null
  [ -n "$MADE_UDEV" ] && rm -f "$MADE_UDEV"
  [ -n "$MADE_ETC" ] && rm -rf /etc/gds-csi
  rm -rf "$WORK"
}
trap cleanup EXIT

truncate -s 1G "$WORK/vol.img"
LOOP=$(losetup --find --show "$WORK/vol.img") || { echo "losetup failed"; exit 1; }
mkfs.ext4 -q "$LOOP" && mkdir "$WORK/vol" && mount -o data=ordered "$LOOP" "$WORK/vol" || exit 1
dd if=/dev/urandom of="$WORK/vol/read.bin" bs=1M count=16 oflag=direct status=none || exit 1
majmin=$(awk -v m="$WORK/vol" '$5 == m {print $3}' /proc/self/mountinfo | head -1)
# udevd's entry for a filesystem (this machine runs no udevd).
mkdir -p /run/udev/data
if [ ! -e "/run/udev/data/b$majmin" ]; then
  printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n' >"/run/udev/data/b$majmin"
  MADE_UDEV=/run/udev/data/b$majmin
fi
[ -d /etc/gds-csi ] || { mkdir /etc/gds-csi && MADE_ETC=1; }
echo "volume: $LOOP ($majmin) at $WORK/vol, file read.bin 16 MiB"

for res in gds-compat gds; do
  echo
  echo "== resource $res: the device plugin's Allocate answer"
  "$BIN_DIR/workload_allocate" "$res" /etc/cufile.json "$WORK/state/workload" /dev /run/udev/data \
    >"$OUT/allocate-$res.json" || exit 1
  cat "$OUT/allocate-$res.json"
  # The runtime's part: bind each mount read-only where the answer says, set the variables.
  binds=$(python3 -c '
import json, shlex, sys
a = json.load(open(sys.argv[1]))
for m in a["mounts"]:
    h, c = shlex.quote(m["host_path"]), shlex.quote(m["container_path"])
    print(f"[ -d {h} ] || touch {c}; mount --bind {h} {c} && mount -o remount,bind,ro {c} || exit 1;")
print("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in a["envs"].items()) + ";")' "$OUT/allocate-$res.json")
  echo "+ unshare -m: $binds gds-csi workload-read $WORK/vol/read.bin"
  unshare -m --propagation private sh -c "$binds cat \"\$CUFILE_ENV_PATH_JSON\" >'$OUT/container-cufile-$res.json';
    exec '$BIN_DIR/gds-csi' workload-read '$WORK/vol/read.bin' --json" >"$OUT/workload-read-$res.json"
  echo "exit status $?"
  unshare -m --propagation private sh -c "$binds exec '$BIN_DIR/gds-csi' workload-read '$WORK/vol/read.bin'" \
    >"$OUT/workload-read-$res.txt"
  head -4 "$OUT/workload-read-$res.txt"
  python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
r = d["read"]
print("cuFile path:", d["cufile_path"], "| compat_allowed:", d["compat_allowed"], "| mode:", r["mode"],
      "| read:", (r.get("read") or {}).get("returned"), "bytes, match:", (r.get("read") or {}).get("matches"))
for f in d["findings"]:
    print("  [%s] %s: %s (%s)" % (f["status"], f["id"], f["summary"], f["evidence"]))' "$OUT/workload-read-$res.json"
done
