#!/usr/bin/env bash
# Builds the real Kubernetes parts the e2e test runs, at pinned versions, from the Go
# module proxy, into .cache/bin. Skips what is already built at the pinned version, and
# Go's build cache makes a rebuild after a version bump incremental.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN="${GDS_CSI_CACHE_BIN:-$HOME/.cache/gds-csi/bin}"
mkdir -p "$BIN"
K8S_VERSION=v1.34.3        # tools/k8s/go.mod pins the same release
ETCD_VERSION=v3.6.8        # tools/etcd/go.mod
PROVISIONER_VERSION=v5.3.0 # tools/provisioner/go.mod

stamp_ok() { [ -x "$BIN/$1" ] && [ "$(cat "$BIN/.$1.version" 2>/dev/null)" = "$2" ]; }
stamp() { echo "$2" > "$BIN/.$1.version"; }

if ! stamp_ok kube-apiserver "$K8S_VERSION"; then
  echo "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl $K8S_VERSION"
  (cd "$HERE/tools/k8s" && go build -o "$BIN/" k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do stamp "$b" "$K8S_VERSION"; done
fi
# The kubelet and the registration helper are built in the same module, so they share
# the release pin and most of the build cache with the control plane.
REGISTRAR_STAMP="$K8S_VERSION-$(sha256sum "$HERE/tools/k8s/registrar/main.go" | cut -c1-12)"
if ! stamp_ok kubelet "$K8S_VERSION" || ! stamp_ok gds-csi-registrar "$REGISTRAR_STAMP"; then
  echo "building kubelet $K8S_VERSION and the registration helper"
  (cd "$HERE/tools/k8s" && go build -o "$BIN/" k8s.io/kubernetes/cmd/kubelet &&
    go build -o "$BIN/gds-csi-registrar" ./registrar)
  stamp kubelet "$K8S_VERSION"
  stamp gds-csi-registrar "$REGISTRAR_STAMP"
fi
if ! stamp_ok etcd "$ETCD_VERSION"; then
  echo "building etcd $ETCD_VERSION"
  (cd "$HERE/tools/etcd" && go build -o "$BIN/etcd" go.etcd.io/etcd/server/v3)
  stamp etcd "$ETCD_VERSION"
fi
if ! stamp_ok csi-provisioner "$PROVISIONER_VERSION"; then
  echo "building csi-provisioner $PROVISIONER_VERSION"
  (cd "$HERE/tools/provisioner" && go build -o "$BIN/csi-provisioner" github.com/kubernetes-csi/external-provisioner/v5/cmd/csi-provisioner)
  stamp csi-provisioner "$PROVISIONER_VERSION"
fi
