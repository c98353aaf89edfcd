#!/usr/bin/env bash
# What the node-loss controller costs as the cluster grows: a real kube-apiserver holding
# COUNTS Node objects, each with one of this driver's local PVs (as the provisioner leaves
# them) and, beside every tenth node, one NFS PV and one of another driver, no kubelets. At
# each count the controller (`--action report`, a grace period no test reaches, one pass a
# second) runs ROUNDS passes; printed per count: the pass time (median and p90 of the
# controller's own per-pass log lines), the controller's RSS after them, the bytes of the two
# lists a pass makes (its only requests while no node is missing), and the ratio of each to
# the first count. A benchmark, not a check: scripts/test.sh does not run it.
#
#   bash tests/e2e/node-loss-scale.sh [COUNTS=100,1000,5000] [ROUNDS=30]
set -euo pipefail
# shellcheck source=tests/e2e/lib.sh
. "$(cd "$(dirname "$0")" && pwd)/lib.sh"
install_host_tools
bash "$E2E_DIR/build-tools.sh"
COUNTS=${1:-100,1000,5000}
ROUNDS=${2:-30}
(cd "$REPO_ROOT" && cargo build --release --quiet -p gds-csi-node-loss)
NODE_LOSS_BIN="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/gds-csi-node-loss"
controller_workdir gds-node-loss-scale
METRICS=127.0.0.1:19833
start_control_plane '*,-node-lifecycle-controller'

# objects FROM TO: Nodes FROM..TO-1 and their PVs, created in batches of one List each.
objects() {
  python3 - "$DRIVER" "$1" "$2" <<'PY' | "$KUBECTL" create -f - >/dev/null
import json, sys
driver, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def pv(name, node, csi_driver, handle):
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": csi_driver},
                         "finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"]},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "nvme-gds",
                     "csi": {"driver": csi_driver, "volumeHandle": handle, "fsType": "ext4"},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": driver + "/node", "operator": "In", "values": [node]}]}]}}}}
items = []
for i in range(lo, hi):
    node = f"gpu-{i:05d}"
    items.append({"apiVersion": "v1", "kind": "Node",
                  "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node, driver + "/node": node}}})
    items.append(pv(f"pv-{node}", node, driver, f"blk:dev-0123456789abcdef:{i:08x}:{node}:part"))
    if i % 10 == 0:
        items.append(pv(f"pv-nfs-{node}", node, driver, f"nfs:d-rdma-20049-4.1:~export:pvc-{node}:nfs01"))
        items.append(pv(f"pv-other-{node}", node, "other.csi.example", f"blk:dev-0:{i:08x}:{node}"))
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
PY
}

pass_times() { # the controller's per-pass log lines since LINE, in ms
  tail -n +"$1" "$WORK/controller.log" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        f = json.loads(line)["fields"]
    except (ValueError, KeyError):
        continue
    if f.get("message") == "pass":
        print(f["elapsed_ms"])'
}
percentile() { sort -n | awk -v p="$1" '{v[NR]=$1} END {i=int((NR-1)*p+0.5)+1; printf "%.2f", v[i]}'; }
list_kib() { "$KUBECTL" get --raw "$1" | wc -c | awk '{printf "%.0f", $1/1024}'; }

made=0
rows=()
IFS=, read -r -a counts <<<"$COUNTS"
for count in "${counts[@]}"; do
  t=$SECONDS
  in_batches 500 "$made" "$count" objects
  made=$count
  echo "$count nodes and their PVs created in $((SECONDS - t)) s" >&2
  : >"$WORK/controller.log"
  RUST_LOG=info,gds_csi_node_loss=debug "$NODE_LOSS_BIN" --driver-name "$DRIVER" --action report \
    --grace-period 24h --interval 1s --api-timeout 30s --metrics-address "$METRICS" \
    --log-format json >>"$WORK/controller.log" 2>&1 &
  CTRL_PID=$!
  # The first passes warm the connection: measured are the ROUNDS after five.
  wait_for 120 eval '[ "$(pass_times 1 | wc -l)" -ge 5 ]'
  from_line=$(($(wc -l <"$WORK/controller.log") + 1))
  wait_for $((ROUNDS * 10)) eval '[ "$(pass_times '"$from_line"' | wc -l)" -ge '"$ROUNDS"' ]'
  p50=$(pass_times "$from_line" | percentile 0.5)
  p90=$(pass_times "$from_line" | percentile 0.9)
  rss=$(awk '/^VmRSS/ {printf "%.1f", $2/1024}' "/proc/$CTRL_PID/status")
  kill "$CTRL_PID"; wait "$CTRL_PID" 2>/dev/null || true; CTRL_PID=
  nodes_kib=$(list_kib "/api/v1/nodes")
  pvs_kib=$(list_kib "/api/v1/persistentvolumes")
  rows+=("$count $p50 $p90 $rss $nodes_kib $pvs_kib")
done

echo "node-loss controller, one pass a second, $ROUNDS passes per count (release build, this machine)"
echo "| nodes | pass p50 ms | pass p90 ms | RSS MiB | Node list KiB (full objects; a pass asks metadata only) | PV list KiB | p50 / first | RSS / first |"
echo "|---|---|---|---|---|---|---|---|"
read -r _ p50_0 _ rss_0 _ _ <<<"${rows[0]}"
for row in "${rows[@]}"; do
  read -r n p50 p90 rss nk pk <<<"$row"
  echo "| $n | $p50 | $p90 | $rss | $nk | $pk | $(awk -v a="$p50" -v b="$p50_0" 'BEGIN {printf "%.2f", a/b}') | $(awk -v a="$rss" -v b="$rss_0" 'BEGIN {printf "%.2f", a/b}') |"
done
