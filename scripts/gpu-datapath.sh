#!/usr/bin/env bash
# The GPU data path, measured: a file on a volume read into GPU memory (a) with cuFileRead, (b) with
# pread into host memory + cuMemcpyHtoD, and (c) raw O_DIRECT into host memory (the ceiling).
# Prints a table (medians, ratios vs (b)); see docs/benchmarks.md. Run as root (drop_caches, mounts).
#
#   scripts/gpu-datapath.sh [DIR_ON_VOLUME] [SIZE]
#
# DIR_ON_VOLUME: a directory on a mounted volume (a real GDS node: the staging or publish path of a
#   gds-csi volume). The test file gpu-datapath.bin is written there and removed afterwards.
#   Without it (or with "-"), the script makes its own: a loop-device pool, `gds-csi serve`, and
#   the CSI client tests/gds_gate.rs `h200_flow` create and stage ext4 (data=ordered) volumes; the
#   first (smallest device, SIZE + 1 GiB) is used, and its udev database entry is written
#   (/run/udev/data/b7:N) so cuFileHandleRegister works without a udev daemon.
# SIZE: bytes of the test file, with K/M/G suffix (default 4G).
#
# Environment: RUNS (3), CHUNK (16M, the read request size), MODES
#   (cufile,cpu-pinned,cpu-pageable,odirect,odirect-mt), THREADS (4, for odirect-mt), BIN_DIR (gpu-read and, for the loop mode, gds-csi and
#   the gds_gate test binary; default: built with cargo), OUT (./gpu-datapath-out),
#   LOOP_DIRECT_IO (on: the loop devices read their backing files with O_DIRECT, so reads reach the
#   disk), KEEP=1 keeps the test file, WRITE_UDEV=1 writes the udev entry in DIR mode too (a node
#   without udevd; never needed where udevd runs).
set -uo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${1:--}
SIZE=${2:-4G}
RUNS=${RUNS:-3}
CHUNK=${CHUNK:-16M}
MODES=${MODES:-cufile,cpu-pinned,cpu-pageable,odirect,odirect-mt}
THREADS=${THREADS:-4}
OUT=${OUT:-$PWD/gpu-datapath-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/run.log") 2>&1

if [ "$(id -u)" -ne 0 ]; then echo "$0 needs root (drop_caches; loop devices and mounts)"; exit 1; fi

to_bytes() {
  local s=${1%[bB]} s2
  s2=${s%[iI]}; [ "$s2" != "$s" ] && s=${s2%[bB]}
  case "$s" in
    *[kK]) echo $(( ${s%?} << 10 )) ;; *[mM]) echo $(( ${s%?} << 20 )) ;;
    *[gG]) echo $(( ${s%?} << 30 )) ;; *) echo "$s" ;;
  esac
}
SIZE_B=$(to_bytes "$SIZE")

echo "== machine"
uname -r
nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv,noheader 2>&1 | head -8
nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -1
echo "compilers: $(for c in gcc cc nvcc; do printf '%s=%s ' "$c" "$(command -v $c || echo none)"; done)"
ls -d /usr/local/cuda* 2>/dev/null | tr '\n' ' '; echo
[ -r /usr/local/cuda/version.json ] && grep -A1 '"cuda"' /usr/local/cuda/version.json | grep version | head -1
if [ -d /sys/module/nvidia_fs ]; then
  echo "nvidia_fs loaded: $(cat /sys/module/nvidia_fs/version 2>/dev/null)"
  cat /proc/driver/nvidia-fs/modules 2>/dev/null | head -5
else
  echo "nvidia_fs: not loaded (cuFile can only run in compat mode)"
fi
echo "cufile.json: ${CUFILE_ENV_PATH_JSON:-/etc/cufile.json} $( [ -r "${CUFILE_ENV_PATH_JSON:-/etc/cufile.json}" ] && echo present || echo absent)"
nproc; grep MemTotal /proc/meminfo

# libcufile from the loader path, else the CUDA toolkit's directory.
if ! ldconfig -p | grep -q 'libcufile.so.0'; then
  lib=$(ls /usr/local/cuda*/targets/*/lib/libcufile.so.0 /usr/local/cuda*/lib64/libcufile.so.0 2>/dev/null | head -1)
  [ -z "$lib" ] && lib=$(find / -xdev -name 'libcufile.so.0' 2>/dev/null | head -1)
  [ -n "$lib" ] && { LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; export LD_LIBRARY_PATH; }
  echo "libcufile: ${lib:-none found}"
else
  echo "libcufile: $(ldconfig -p | grep 'libcufile.so.0' | head -1 | awk '{print $NF}')"
fi

if [ -z "${BIN_DIR:-}" ]; then
  BIN_DIR=$(mktemp -d)
  (cd "$REPO_ROOT/tools/gpu-read" && CARGO_TARGET_DIR="$REPO_ROOT/target/gpu-read" cargo build --release --quiet) || exit 1
  cp "$REPO_ROOT/target/gpu-read/release/gpu-read" "$BIN_DIR/"
  if [ "$DIR" = "-" ]; then
    (cd "$REPO_ROOT" && cargo build --release --quiet --bin gds-csi && cargo test --release --quiet --test gds_gate --no-run) || exit 1
    cp "$REPO_ROOT/target/release/gds-csi" "$BIN_DIR/"
    # shellcheck disable=SC2010 # the newest test binary; cargo's names are plain
    cp "$(ls -t "$REPO_ROOT"/target/release/deps/gds_gate-* | grep -v '\.d$' | head -1)" "$BIN_DIR/gds_gate"
  fi
fi
GPU_READ=$BIN_DIR/gpu-read

WORK=$(mktemp -d /tmp/gpu-datapath.XXXXXX)
LOOPS=()
DRIVER_PID=
UDEV_WRITTEN=
TESTFILE=
cleanup() {
  [ -n "$TESTFILE" ] && [ -z "${KEEP:-}" ] && rm -f "$TESTFILE"
  [ -n "$DRIVER_PID" ] && kill "$DRIVER_PID" 2>/dev/null && wait "$DRIVER_PID" 2>/dev/null
  awk -v d="$WORK" '$5 ~ "^"d {print $5}' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null
  for d in "${LOOPS[@]}"; do losetup -d "$d" 2>/dev/null; done
  [ -n "$UDEV_WRITTEN" ] && rm -f "$UDEV_WRITTEN"
  rm -rf "$WORK"
}
trap cleanup EXIT

# The udev database entry cuFileHandleRegister needs (5027 without it, even in compat mode).
udev_entry() {
  local majmin=$1 src=$2 f
  f=/run/udev/data/b$majmin
  if [ -e "$f" ]; then echo "udev database: $f present"; return; fi
  mkdir -p /run/udev/data
  printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\nE:ID_FS_UUID=%s\n' \
    "$(blkid -s TYPE -o value "$src")" "$(blkid -s UUID -o value "$src")" >"$f"
  UDEV_WRITTEN=$f
  echo "udev database: wrote $f:"; sed 's/^/  /' "$f"
}

if [ "$DIR" = "-" ]; then
  echo "== staging an ext4 volume with gds-csi on a loop device"
  pool=()
  gib=$(( (SIZE_B >> 30) + 1 ))
  for i in 1 2 3; do
    truncate -s "$(( gib + i - 1 ))G" "$WORK/dev$i.img"
    d=$(losetup --find --show --direct-io="${LOOP_DIRECT_IO:-on}" "$WORK/dev$i.img" 2>/dev/null ||
        losetup --find --show "$WORK/dev$i.img") || { echo "losetup failed"; exit 1; }
    LOOPS+=("$d"); pool+=(--pool-device "$d")
  done
  losetup --list -O NAME,SIZELIMIT,DIO,BACK-FILE | grep -F "$WORK"
  echo "backing files on: $(df -h --output=source,fstype "$WORK" | tail -1)"
  "$BIN_DIR/gds-csi" serve --endpoint "unix://$WORK/csi.sock" --mode all --node-id gpu-datapath \
    --state-dir "$WORK/state" --allowed-path-root "$WORK/kubelet" --probe-timeout 60s \
    "${pool[@]}" 2>"$OUT/driver.log" &
  DRIVER_PID=$!
  for _ in $(seq 100); do [ -S "$WORK/csi.sock" ] && break; sleep 0.1; done
  GDS_H200_SOCKET=$WORK/csi.sock GDS_H200_WORK=$WORK timeout 300 "$BIN_DIR/gds_gate" --ignored --exact \
    h200_flow --nocapture --test-threads 1 >"$OUT/flow.txt" 2>&1
  DIR=$(cat "$WORK/staged-path" 2>/dev/null)
  [ -n "$DIR" ] || { echo "no staged volume; flow:"; tail -30 "$OUT/flow.txt"; echo "driver log:"; tail -30 "$OUT/driver.log"; exit 1; }
  grep -E 'staged:|NodePublishVolume (OK|Failed)' "$OUT/flow.txt" | cut -c1-200
  majmin=$(awk -v m="$DIR" '$5 == m {print $3}' /proc/self/mountinfo | head -1)
  src=$(awk -v m="$DIR" '$5 == m {for (i = 6; i < NF; i++) if ($i == "-") {print $(i + 2); exit}}' /proc/self/mountinfo)
  udev_entry "$majmin" "$src"
else
  [ -d "$DIR" ] || { echo "$DIR: not a directory"; exit 1; }
  majmin=$(findmnt -n -o MAJ:MIN -T "$DIR" | tr -d ' ')
  src=$(findmnt -n -o SOURCE -T "$DIR")
  if [ -n "${WRITE_UDEV:-}" ]; then udev_entry "$majmin" "$src"
  elif [ ! -e "/run/udev/data/b$majmin" ]; then
    echo "warning: /run/udev/data/b$majmin missing: cuFileHandleRegister will fail with 5027 (WRITE_UDEV=1 writes it)"
  fi
fi
echo "== volume"
findmnt -T "$DIR" -o TARGET,SOURCE,FSTYPE,OPTIONS | cut -c1-200
df -h "$DIR" | tail -1
[ -n "$src" ] && [ -b "$src" ] && echo "device $src ($majmin): $(cat /sys/dev/block/$majmin/queue/read_ahead_kb 2>/dev/null) KiB read-ahead"

TESTFILE=$DIR/gpu-datapath.bin
echo "== write $SIZE"
"$GPU_READ" write "$TESTFILE" "$SIZE_B" || exit 1
echo "== read into the GPU (page cache dropped before every read)"
echo "+ gpu-read bench $TESTFILE --runs $RUNS --chunk $CHUNK --threads $THREADS --modes $MODES"
cd "$OUT" || exit 1 # cufile.log lands here
"$GPU_READ" bench "$TESTFILE" --runs "$RUNS" --chunk "$CHUNK" --threads "$THREADS" --modes "$MODES"
rc=$?
if [ -s "$OUT/cufile.log" ]; then echo "== cufile.log (last lines)"; tail -8 "$OUT/cufile.log"; fi
exit $rc
