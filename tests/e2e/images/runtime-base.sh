#!/usr/bin/env bash
# The gds-csi image's runtime stage, built without a container engine: Debian bookworm
# (minbase) plus the packages the Dockerfile installs and NVIDIA's packaged libcufile from
# the same nvidia-cufile wheel (its CUFILE_VERSION), as one uncompressed layer tarball.
# The e2e test's images of the driver and of the sidecars stand on it. Cached, keyed by
# the package list; prints the tarball's path.
set -euo pipefail
CACHE="${GDS_CSI_CACHE_IMAGES:-$HOME/.cache/gds-csi/images}"
# Keep in step with the Dockerfile's runtime stage (tests/helm.sh compares the two lists).
PACKAGES=e2fsprogs,xfsprogs,nfs-common,util-linux,mdadm,ca-certificates,libibverbs1,librdmacm1,ibverbs-providers
CUFILE_VERSION=$(sed -n 's/^ARG CUFILE_VERSION=//p' "$(dirname "$0")/../../../Dockerfile")
[ -n "$CUFILE_VERSION" ] || { echo "no ARG CUFILE_VERSION in the Dockerfile" >&2; exit 1; }
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
OUT="$CACHE/runtime-$SUITE-$(echo "$PACKAGES cufile-$CUFILE_VERSION" | sha256sum | cut -c1-12).tar"
if [ -s "$OUT" ]; then echo "$OUT"; exit 0; fi

command -v debootstrap >/dev/null ||
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
mkdir -p "$CACHE"
ROOTFS=$(mktemp -d "$CACHE/rootfs.XXXXXX")
WHEEL=$(mktemp -d "$CACHE/wheel.XXXXXX")
trap 'rm -rf "$ROOTFS" "$WHEEL"' EXIT
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 ||
  { tail -20 "$ROOTFS.log" >&2; exit 1; }
rm -f "$ROOTFS.log"
# The Dockerfile's cufile stage: the wheel's libcufile.so.0 and libcufile_rdma.so.1,
# unmodified, in /usr/local/lib/gds-csi on the loader path, with the wheel's licence.
python3 -m venv "$WHEEL/venv"
"$WHEEL/venv/bin/pip" download --quiet --no-deps --only-binary=:all: -d "$WHEEL" "nvidia-cufile==$CUFILE_VERSION"
python3 -m zipfile -e "$WHEEL"/nvidia_cufile-*.whl "$WHEEL/x"
lib=$(dirname "$(find "$WHEEL/x/nvidia" -name libcufile.so.0 | head -n1)")
install -D -m 0644 -t "$ROOTFS/usr/local/lib/gds-csi" "$lib"/libcufile*.so*
install -D -m 0644 "$(find "$WHEEL/x" -path '*nvidia_cufile-*.dist-info*' -name License.txt | head -n1)" \
  "$ROOTFS/usr/share/doc/gds-csi/cufile-License.txt"
echo /usr/local/lib/gds-csi > "$ROOTFS/etc/ld.so.conf.d/gds-csi-cufile.conf"
chroot "$ROOTFS" /sbin/ldconfig
# What the Dockerfile's `rm -rf /var/lib/apt/lists/*` leaves out, plus the .deb cache;
# /dev is the runtime's to fill.
rm -rf "${ROOTFS:?}"/var/lib/apt/lists/* "${ROOTFS:?}"/var/cache/apt/archives/*.deb "${ROOTFS:?}"/dev/*
tar --numeric-owner -C "$ROOTFS" -cf "$OUT.partial" .
mv "$OUT.partial" "$OUT"
echo "$OUT"
