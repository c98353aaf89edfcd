#!/usr/bin/env bash
# The driver's image without a container engine or a registry: Debian bookworm with the
# packages and NVIDIA's libcufile the Dockerfile's runtime stage installs
# (tests/e2e/images/runtime-base.sh, debootstrap), plus gds-csi, gds-csi-node-loss and
# gds-csi-populator, written as one image archive (an OCI image layout with docker's
# manifest.json beside it) that `docker load -i`, `podman load -i` and
# `ctr -n k8s.io images import` take. The kubelet end-to-end test runs the image this writes.
#
#   bash scripts/image.sh [OUT.tar] [NAME:TAG]     root; default target/gds-csi-image.tar,
#                                                  gds-csi:<chart appVersion>
# GDS_CSI, GDS_CSI_NODE_LOSS, GDS_CSI_POPULATOR: binaries to use instead of a fresh build
# (the profile `dist` the Dockerfile builds); a missing one is left out of the image.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root
cd "$REPO_ROOT"
VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' deploy/helm/gds-csi/Chart.yaml)
OUT=${1:-$REPO_ROOT/target/gds-csi-image.tar}
NAME=${2:-gds-csi:$VERSION}
if [ -z "${GDS_CSI:-}" ]; then
  echo "building gds-csi, gds-csi-node-loss and gds-csi-populator (cargo, profile dist; minutes on a cold machine)"
  cargo build --profile dist --locked -p gds-csi -p gds-csi-node-loss -p gds-csi-populator
  GDS_CSI=$TARGET_DIR/dist/gds-csi
  GDS_CSI_NODE_LOSS=$TARGET_DIR/dist/gds-csi-node-loss
  GDS_CSI_POPULATOR=$TARGET_DIR/dist/gds-csi-populator
fi
echo "the runtime base (debootstrap and the nvidia-cufile wheel, cached after the first run)"
BASE=$(bash tests/e2e/images/runtime-base.sh)
LAYER=$(mktemp -d)
trap 'rm -rf "$LAYER"' EXIT
install -D -m 0755 "$GDS_CSI" "$LAYER/usr/local/bin/gds-csi"
for extra in "${GDS_CSI_NODE_LOSS:-}:gds-csi-node-loss" "${GDS_CSI_POPULATOR:-}:gds-csi-populator"; do
  [ -z "${extra%%:*}" ] || install -D -m 0755 "${extra%%:*}" "$LAYER/usr/local/bin/${extra##*:}"
done
mkdir -p "$(dirname "$OUT")"
python3 tests/e2e/images/build-image.py "$NAME" "$OUT" --layer "$BASE" --layer "$LAYER" \
  --entrypoint /usr/local/bin/gds-csi serve
echo "wrote $OUT ($NAME, $(du -h "$OUT" | cut -f1))"
echo "load it: docker load -i $OUT | podman load -i $OUT | ctr -n k8s.io images import $OUT"
echo "then push $NAME to your registry (named there; else docker tag first) and install the chart with"
echo "  --set image.repository=${NAME%:*} --set image.tag=${NAME##*:}"
