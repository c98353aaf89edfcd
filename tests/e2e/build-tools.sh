#!/usr/bin/env bash
# Builds the real Kubernetes parts the e2e test runs, at pinned versions, from the Go
# module proxy, into ~/.cache/gds-csi/bin. Skips what is already built at the pinned version, and
# Go's build cache makes a rebuild after a version bump incremental.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN="${GDS_CSI_CACHE_BIN:-$HOME/.cache/gds-csi/bin}"
mkdir -p "$BIN"
K8S_VERSION=v1.34.3        # tools/k8s/go.mod pins the same release
ETCD_VERSION=v3.6.8        # tools/etcd/go.mod
PROVISIONER_VERSION=v6.4.0 # tools/provisioner/go.mod; the chart's sidecars.provisioner tag
SNAPSHOTTER_VERSION=v8.7.0 # tools/snapshotter/go.mod; the chart's snapshots.sidecar and .controller tags

# What Kubernetes' own build stamps in: without it the binaries say v0.0.0, and helm
# refuses a chart's kubeVersion range against such an API server.
K8S_LDFLAGS=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitTreeState=clean"
  K8S_LDFLAGS+=" -X $pkg.gitMajor=$(echo "${K8S_VERSION#v}" | cut -d. -f1) -X $pkg.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
done
K8S_STAMP="$K8S_VERSION-versioned"

stamp_ok() { [ -x "$BIN/$1" ] && [ "$(cat "$BIN/.$1.version" 2>/dev/null)" = "$2" ]; }
stamp() { echo "$2" > "$BIN/.$1.version"; }
# Each build says how long it took: the README's cold build times come from these lines.
timed() { local t0=$SECONDS; "$@"; echo "built in $((SECONDS - t0)) s"; }

if ! stamp_ok kube-apiserver "$K8S_STAMP"; then
  echo "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl $K8S_VERSION"
  build() {
    (cd "$HERE/tools/k8s" && go build -ldflags "$K8S_LDFLAGS" -o "$BIN/" k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
  }
  timed build
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do stamp "$b" "$K8S_STAMP"; done
fi
# The node side (kubelet, kube-proxy) and the stand-ins for node-driver-registrar and
# livenessprobe, which the module proxy does not serve, are built in the same module:
# they share the release pin and most of the build cache with the control plane.
NODE_STAMP="$K8S_STAMP-$(cat "$HERE"/tools/k8s/{registrar,livenessprobe}/main.go | sha256sum | cut -c1-12)"
if ! stamp_ok kubelet "$NODE_STAMP" || ! stamp_ok kube-proxy "$NODE_STAMP"; then
  echo "building kubelet and kube-proxy $K8S_VERSION, and the registrar and livenessprobe helpers"
  build() {
    (cd "$HERE/tools/k8s" && go build -ldflags "$K8S_LDFLAGS" -o "$BIN/" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy &&
      go build -o "$BIN/gds-csi-registrar" ./registrar && go build -o "$BIN/gds-csi-livenessprobe" ./livenessprobe)
  }
  timed build
  for b in kubelet kube-proxy; do stamp "$b" "$NODE_STAMP"; done
fi
# The stand-in for external-resizer (the module proxy refuses it too), stamped on its own
# so that adding it did not change the kubelet's stamp; static, so its image needs no base.
RESIZER_STAMP="$K8S_VERSION-static-$(sha256sum <"$HERE/tools/k8s/resizer/main.go" | cut -c1-12)"
if ! stamp_ok gds-csi-resizer "$RESIZER_STAMP"; then
  echo "building the resizer helper"
  build() { (cd "$HERE/tools/k8s" && CGO_ENABLED=0 go build -o "$BIN/gds-csi-resizer" ./resizer); }
  timed build
  stamp gds-csi-resizer "$RESIZER_STAMP"
fi
# Kubernetes' External Storage e2e suite (tests/e2e/storage-suite.sh): e2e.test linking only
# that suite (tools/k8s/storagesuite), the ginkgo runner that runs it in parallel, and
# agnhost, the suite's test image, static so its image needs only busybox beside it.
SUITE_STAMP="$K8S_STAMP-$(sha256sum <"$HERE/tools/k8s/storagesuite/suite_test.go" | cut -c1-12)"
if [ -n "${GDS_E2E_STORAGE_SUITE:-}" ] && { ! stamp_ok e2e-storage.test "$SUITE_STAMP" || ! stamp_ok agnhost "$K8S_VERSION" || ! stamp_ok ginkgo "$K8S_VERSION"; }; then
  echo "building e2e.test (External Storage suite), ginkgo and agnhost $K8S_VERSION"
  build() {
    (cd "$HERE/tools/k8s" && go test -c -ldflags "$K8S_LDFLAGS" -o "$BIN/e2e-storage.test" ./storagesuite &&
      CGO_ENABLED=0 go build -o "$BIN/agnhost" k8s.io/kubernetes/test/images/agnhost &&
      go build -o "$BIN/ginkgo" github.com/onsi/ginkgo/v2/ginkgo)
  }
  timed build
  stamp e2e-storage.test "$SUITE_STAMP"
  stamp agnhost "$K8S_VERSION"
  stamp ginkgo "$K8S_VERSION"
fi
if ! stamp_ok etcd "$ETCD_VERSION"; then
  echo "building etcd $ETCD_VERSION"
  build() { (cd "$HERE/tools/etcd" && go build -o "$BIN/etcd" go.etcd.io/etcd/server/v3); }
  timed build
  stamp etcd "$ETCD_VERSION"
fi
if ! stamp_ok csi-provisioner "$PROVISIONER_VERSION"; then
  echo "building csi-provisioner $PROVISIONER_VERSION"
  build() { (cd "$HERE/tools/provisioner" && go build -o "$BIN/csi-provisioner" github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner); }
  timed build
  stamp csi-provisioner "$PROVISIONER_VERSION"
fi
# external-snapshotter's csi-snapshotter and snapshot-controller, and the small CSI client
# the e2e restores a snapshot on another node id with (tools/snapshotter/csiclient), in one
# module: the client's gRPC and CSI spec are the snapshotter's. Static, as upstream builds
# them for its distroless/static images, so their images need no base.
SNAPSHOTTER_STAMP="$SNAPSHOTTER_VERSION-static-$(sha256sum <"$HERE/tools/snapshotter/csiclient/main.go" | cut -c1-12)"
if ! stamp_ok csi-snapshotter "$SNAPSHOTTER_STAMP" || ! stamp_ok snapshot-controller "$SNAPSHOTTER_STAMP" ||
  ! stamp_ok gds-csi-csiclient "$SNAPSHOTTER_STAMP"; then
  echo "building csi-snapshotter and snapshot-controller $SNAPSHOTTER_VERSION, and the CSI client"
  build() {
    # The version their release builds stamp in (what each logs at start).
    (cd "$HERE/tools/snapshotter" && export CGO_ENABLED=0 &&
      go build -ldflags "-X main.version=$SNAPSHOTTER_VERSION" -o "$BIN/" \
        github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter \
        github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller &&
      go build -o "$BIN/gds-csi-csiclient" ./csiclient)
  }
  timed build
  for b in csi-snapshotter snapshot-controller gds-csi-csiclient; do stamp "$b" "$SNAPSHOTTER_STAMP"; done
fi
