#!/usr/bin/env bash
# The node image's libcufile (the nvidia-cufile wheel the Dockerfile installs, CUFILE_VERSION)
# against a GPU node's driver: the gate's probe (`gds-probe --run`, strict, then compat allowed)
# on an ext4 volume mounted data=ordered on a loop device, once with the image's library and
# once with the host's, in the same run. Run as root on the GPU machine; results in
# docs/gds-lab-notes.md.
#
# CARRY: a folder with gds-probe (release build of crates/gds-check) and the wheel's lib/
#        (libcufile.so.0, libcufile_rdma.so.1), e.g. made by `scripts/gpu-image-cufile.sh --pack DIR`.
set -uo pipefail
if [ "${1:-}" = --pack ]; then
  dir=$2; version=$(sed -n 's/^ARG CUFILE_VERSION=//p' "$(dirname "$0")/../Dockerfile")
  mkdir -p "$dir/lib" && tmp=$(mktemp -d) || exit 1
  pip download --quiet --no-deps "nvidia-cufile==$version" -d "$tmp" &&
    python3 -m zipfile -e "$tmp"/nvidia_cufile-*.whl "$tmp/x" &&
    cp "$(find "$tmp/x" -name libcufile.so.0)" "$(find "$tmp/x" -name libcufile_rdma.so.1)" "$dir/lib/" &&
    cargo build --release -p gds-check --bin gds-probe && cp target/release/gds-probe "$dir/" &&
    echo "$version" >"$dir/cufile-version" && rm -rf "$tmp" && echo "packed $version into $dir"
  exit
fi
CARRY=${CARRY:?folder with gds-probe and lib/}
WORK=$(mktemp -d /tmp/gds-img.XXXXXX)
LOOP=
cleanup() {
  umount "$WORK/vol" 2>/dev/null
  [ -n "$LOOP" ] && losetup -d "$LOOP"
  [ -n "${majmin:-}" ] && rm -f "/run/udev/data/b$majmin"
}
trap cleanup EXIT
echo "== environment"
uname -r; nvidia-smi -L 2>&1 | head -2
grep -h 'version' /proc/driver/nvidia/version 2>&1 | head -1
host_lib=$(ldconfig -p | awk '/libcufile.so.0 /{print $NF; exit}')
[ -n "$host_lib" ] || host_lib=$(find / -xdev -name libcufile.so.0 -not -path "$CARRY/*" 2>/dev/null | head -1)
echo "image libcufile: $(cat "$CARRY/cufile-version" 2>/dev/null) at $CARRY/lib; host libcufile: ${host_lib:-none}"
ls /sys/module/nvidia_fs >/dev/null 2>&1 && echo "nvidia_fs loaded" || echo "nvidia_fs not loaded"

truncate -s 512M "$WORK/dev.img" && LOOP=$(losetup --find --show "$WORK/dev.img") || exit 1
mkfs.ext4 -q "$LOOP" && mkdir -p "$WORK/vol" && mount -o data=ordered "$LOOP" "$WORK/vol" || exit 1
majmin=$(lsblk -dno MAJ:MIN "$LOOP" | tr -d ' ')
mkdir -p /run/udev/data
printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\nE:ID_FS_UUID=%s\n' "$(blkid -s UUID -o value "$LOOP")" \
  >"/run/udev/data/b$majmin"
probe() {
  echo "== gds-probe --run with $1"
  local start=$SECONDS
  # The image's libcufile_rdma.so.1 sits beside libcufile.so.0, as in the image's /usr/lib.
  LD_LIBRARY_PATH=$(dirname "$1") "$CARRY/gds-probe" --run --timeout-s 60 --backend nvme \
    --library "$1" --path "$WORK/vol" | tail -1
  echo "exit status ${PIPESTATUS[0]} ($((SECONDS - start)) s)"
}
probe "$CARRY/lib/libcufile.so.0"
[ -n "$host_lib" ] && probe "$host_lib"
echo "== done"
