#!/usr/bin/env bash
# What the chart's sidecars cost as the cluster grows: a real kube-apiserver holding COUNTS
# Node objects (no kubelets), each with CLAIMS claims of this driver naming PVs pinned to it
# and PODS Pod objects on it. Against it run one node's external-provisioner as the chart
# runs it (distributed mode, capacity tracking, the driver beside it) and the
# snapshot-controller (distributed snapshotting), the only ones whose caches hold the whole
# cluster (docs/design.md "At 1,000 and 5,000 nodes"; the resizer the
# chart runs is upstream's and is not built here: the rig's stands in for its API calls only).
# Printed per count: each one's RSS once synced and after a minute at rest, the time to sync,
# and the API requests the server answered in a minute at rest with both running, beside the
# same minute without them (apiserver_request_total, the benchmark's two reads included in
# both). A benchmark, not a check: scripts/test.sh does not run it.
#
#   bash tests/e2e/sidecar-scale.sh [COUNTS=100,1000,3000] [CLAIMS=4] [PODS=10]
set -euo pipefail
# shellcheck source=tests/e2e/lib.sh
. "$(cd "$(dirname "$0")" && pwd)/lib.sh"
install_host_tools
bash "$E2E_DIR/build-tools.sh"
COUNTS=${1:-100,1000,3000}
CLAIMS=${2:-4}
PODS=${3:-10}
build_driver
controller_workdir gds-sidecar-scale
# No node lifecycle (no kubelets here) and no PV binder: the claims stay as written (each
# naming its PV), rather than its rate-limited binding writes going on through the minutes
# measured at rest.
start_control_plane '*,-node-lifecycle-controller,-persistentvolume-binder-controller'
wait_for 60 "$KUBECTL" get --raw /readyz
apply_chart
"$KUBECTL" apply -f "$E2E_DIR/../../deploy/helm/gds-csi/charts/snapshot-crds/crds/" >/dev/null
write_kubeconfig "$WORK/snapshot-controller.kubeconfig" "$("$KUBECTL" -n "$NS" create serviceaccount snapshot-scale \
  >/dev/null && "$KUBECTL" create clusterrolebinding snapshot-scale --clusterrole cluster-admin \
  --serviceaccount "$NS:snapshot-scale" >/dev/null && "$KUBECTL" -n "$NS" create token snapshot-scale --duration 2h)"
# The driver of the measured node: no pool (capacity 0), enough for GetCapacity.
"$GDS_CSI" serve --endpoint "unix://$WORK/csi.sock" --mode all --node-id gpu-00000 --state-dir "$WORK/state" \
  --allowed-path-root "$WORK" 2>"$WORK/driver.log" &
PIDS+=($!)
wait_for_socket "$WORK/csi.sock"

# objects FROM TO: Nodes FROM..TO-1 with their claims, PVs and pods, in one List.
objects() {
  python3 - "$DRIVER" "$1" "$2" "$CLAIMS" "$PODS" <<'PY' | "$KUBECTL" create -f - >/dev/null
import json, sys
driver, lo, hi, claims, pods = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
items = []
for i in range(lo, hi):
    node = f"gpu-{i:05d}"
    items.append({"apiVersion": "v1", "kind": "Node",
                  "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node, driver + "/node": node}}})
    for c in range(claims):
        name = f"{node}-c{c}"
        items.append({"apiVersion": "v1", "kind": "PersistentVolume",
                      "metadata": {"name": f"pv-{name}", "annotations": {"pv.kubernetes.io/provisioned-by": driver},
                                   "finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"]},
                      "spec": {"capacity": {"storage": "1Ti"}, "accessModes": ["ReadWriteOnce"],
                               "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "nvme-gds",
                               "claimRef": {"namespace": "default", "name": name},
                               "csi": {"driver": driver, "volumeHandle": f"blk:dev-0123456789abcdef:{i:08x}{c:02x}:{node}:part",
                                       "fsType": "ext4"},
                               "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                                   {"key": driver + "/node", "operator": "In", "values": [node]}]}]}}}})
        items.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                      "metadata": {"name": name, "namespace": "default",
                                   "annotations": {"volume.kubernetes.io/selected-node": node,
                                                   "volume.kubernetes.io/storage-provisioner": driver}},
                      "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "nvme-gds",
                               "resources": {"requests": {"storage": "1Ti"}}, "volumeName": f"pv-{name}"}})
    for p in range(pods):
        vols = [{"name": "data", "persistentVolumeClaim": {"claimName": f"{node}-c{p % claims}"}}] if claims else []
        items.append({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": f"{node}-p{p}", "namespace": "default", "labels": {"app": "trainer"}},
                      "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.example/train:1",
                               "command": ["python", "train.py"], "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                               "volumes": vols}})
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
PY
}

rss_mib() { awk -v k="$(rss_kib "$1")" 'BEGIN {printf "%.1f", k / 1024}'; }
# requests: the API server's answered requests so far (every verb and resource).
requests() {
  "$KUBECTL" get --raw /metrics | awk '/^apiserver_request_total\{/ {s += $NF} END {printf "%.0f", s}'
}
# at_rest: requests answered in 60 s.
at_rest() { local a; a=$(requests); sleep 60; echo $(($(requests) - a)); }

made=0
rows=()
IFS=, read -r -a counts <<<"$COUNTS"
for count in "${counts[@]}"; do
  t=$SECONDS
  in_batches 200 "$made" "$count" objects
  made=$count
  echo "$count nodes, $((count * CLAIMS)) claims and PVs, $((count * PODS)) pods created in $((SECONDS - t)) s" >&2
  quiet=$(at_rest)
  t=$SECONDS
  : >"$WORK/provisioner.log"
  start_provisioner gpu-00000 "$WORK/csi.sock" "$WORK/provisioner.log"
  prov=${PIDS[-1]}
  "$CACHE_BIN/snapshot-controller" --kubeconfig "$WORK/snapshot-controller.kubeconfig" \
    --enable-distributed-snapshotting=true --feature-gates=CSIVolumeGroupSnapshot=false \
    --leader-election=false --v=2 >"$WORK/snapshot-controller.log" 2>&1 &
  PIDS+=($!)
  snap=$!
  # Synced: the provisioner has published this node's capacity (after its informers' first
  # LIST), the snapshot-controller started its workers.
  synced() {
    [ -n "$("$KUBECTL" -n "$NS" get csistoragecapacities -l csi.storage.k8s.io/managed-by=external-provisioner-gpu-00000 -o name)" ] &&
      grep -q "Starting snapshot controller" "$WORK/snapshot-controller.log"
  }
  wait_for 600 synced
  sync_s=$((SECONDS - t))
  sleep 10
  prov_rss=$(rss_mib "$prov")
  snap_rss=$(rss_mib "$snap")
  busy=$(at_rest)
  prov_rss_later=$(rss_mib "$prov")
  snap_rss_later=$(rss_mib "$snap")
  kill "$prov" "$snap"
  wait "$prov" "$snap" 2>/dev/null || true
  "$KUBECTL" -n "$NS" delete csistoragecapacities --all >/dev/null
  rows+=("$count $sync_s $prov_rss $prov_rss_later $snap_rss $snap_rss_later $quiet $busy")
done

echo "external-provisioner (one node's) and snapshot-controller against a real API server; $CLAIMS claims and $PODS pods a node"
echo "| nodes | objects | synced in s | provisioner RSS MiB (synced / a minute later) | snapshot-controller RSS MiB | requests in a minute at rest: control plane alone / with both | provisioner RSS / first |"
echo "|---|---|---|---|---|---|---|"
read -r _ _ prov_0 _ _ _ _ _ <<<"${rows[0]}"
for row in "${rows[@]}"; do
  read -r n s pr pl sr sl q b <<<"$row"
  echo "| $n | $((n * (1 + 2 * CLAIMS + PODS))) | $s | $pr / $pl | $sr / $sl | $q / $b | $(awk -v a="$pr" -v b="$prov_0" 'BEGIN {printf "%.2f", a/b}') |"
done
