#!/usr/bin/env bash
# The gds-csi image's runtime stage, built without a container engine: Debian bookworm
# (minbase) plus the packages the Dockerfile installs, as one uncompressed layer tarball.
# The e2e test's images of the driver and of the sidecars stand on it. Cached, keyed by
# the package list; prints the tarball's path.
set -euo pipefail
CACHE="${GDS_CSI_CACHE_IMAGES:-$HOME/.cache/gds-csi/images}"
# Keep in step with the Dockerfile's runtime stage.
PACKAGES=e2fsprogs,xfsprogs,nfs-common,util-linux,ca-certificates
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
OUT="$CACHE/runtime-$SUITE-$(echo "$PACKAGES" | sha256sum | cut -c1-12).tar"
if [ -s "$OUT" ]; then echo "$OUT"; exit 0; fi

command -v debootstrap >/dev/null ||
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
mkdir -p "$CACHE"
ROOTFS=$(mktemp -d "$CACHE/rootfs.XXXXXX")
trap 'rm -rf "$ROOTFS"' EXIT
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 ||
  { tail -20 "$ROOTFS.log" >&2; exit 1; }
rm -f "$ROOTFS.log"
# What the Dockerfile's `rm -rf /var/lib/apt/lists/*` leaves out, plus the .deb cache;
# /dev is the runtime's to fill.
rm -rf "${ROOTFS:?}"/var/lib/apt/lists/* "${ROOTFS:?}"/var/cache/apt/archives/*.deb "${ROOTFS:?}"/dev/*
tar --numeric-owner -C "$ROOTFS" -cf "$OUT.partial" .
mv "$OUT.partial" "$OUT"
echo "$OUT"
