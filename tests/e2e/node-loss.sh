#!/usr/bin/env bash
# The node-loss controller (crates/node-loss) against a real Kubernetes API server:
# etcd, kube-apiserver and kube-controller-manager from tests/e2e/build-tools.sh, no
# kubelet. Node objects, this driver's PVs pinned to them (node affinity on
# <driver>/node, `blk:` handles) and their claims, pre-bound, are written by hand, with
# must-not-touch controls beside them: an NFS volume of this driver (even pinned to the
# lost node) and another driver's volume. The controller runs as a process with the token
# of the chart's ServiceAccount bound to the chart's ClusterRole (rendered with
# nodeLoss.enabled=true), so the RBAC is proven too.
#
# Cases: a deleted node, action report (Event NodeLost on the claim, the metric on
# /metrics, nothing else changed); a node deleted and re-created within the grace period
# (nothing, after the original grace has passed); action recreate (claim deleted and
# re-created unbound with the same name, labels and spec less volumeName, its PV deleted
# and held by the provisioner's finalizer for the node's return),
# waiting while a scheduled pod names the claim; a controller restarted mid-grace acts no
# earlier than a full grace period after its start.
#
# The controller manager runs without its PV and PVC protection controllers, so the
# finalizers they would remove are removed by the controller under test, only when Kubernetes'
# own rule allows it. Ends with "N passed, M failed".
set -euo pipefail
# shellcheck source=tests/e2e/lib.sh
. "$(cd "$(dirname "$0")" && pwd)/lib.sh"
install_host_tools
install_helm
bash "$E2E_DIR/build-tools.sh"
# A debug build: it shares the dependencies `cargo test` built.
if [ -z "${NODE_LOSS_BIN:-}" ]; then
  (cd "$REPO_ROOT" && cargo build --quiet -p gds-csi-node-loss)
  NODE_LOSS_BIN="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/debug/gds-csi-node-loss"
fi
controller_workdir gds-node-loss
start=$SECONDS
METRICS=127.0.0.1:19823

start_control_plane '*,-node-lifecycle-controller,-persistentvolumeclaim-protection-controller,-persistentvolume-protection-controller'
echo "control plane up in $((SECONDS - start)) s"
t_up=$SECONDS

# --- the chart's node-loss RBAC and StorageClasses --------------------------------------
"$KUBECTL" create namespace "$NS" >/dev/null
"$HELM" template gds-csi "$REPO_ROOT/deploy/helm/gds-csi" --namespace "$NS" --set nodeLoss.enabled=true \
  --show-only templates/node-loss.yaml --show-only templates/storageclasses.yaml >"$WORK/chart.yaml"
python3 - "$WORK/chart.yaml" >"$WORK/apply.yaml" <<'PY'
import sys, yaml
keep = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "StorageClass"}
print(yaml.safe_dump_all([d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] in keep]))
PY
"$KUBECTL" apply -f "$WORK/apply.yaml" >/dev/null
check "chart's node-loss ServiceAccount, ClusterRole and binding applied" \
  "$KUBECTL" get -n "$NS" serviceaccount/gds-csi-node-loss clusterrole/gds-csi-node-loss clusterrolebinding/gds-csi-node-loss -o name
write_kubeconfig "$WORK/node-loss.kubeconfig" "$("$KUBECTL" -n "$NS" create token gds-csi-node-loss --duration 1h)"
check "the ServiceAccount may not read secrets (least privilege)" \
  test "$("$KUBECTL" --kubeconfig "$WORK/node-loss.kubeconfig" auth can-i list secrets 2>/dev/null)" = no

# --- objects -----------------------------------------------------------------------------
node() { # NAME
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: $1
  labels: {kubernetes.io/hostname: $1, $DRIVER/node: $1}
YAML
}
# volume NAME NODE DRIVER HANDLE AFFINITY_KEY AFFINITY_VALUE: a claim NAME pre-bound to PV
# pv-NAME (as the external provisioner leaves them), with what the binder and scheduler add.
volume() {
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: $1
  namespace: default
  labels: {app: web, claim: $1}
  annotations:
    team: ml
    volume.kubernetes.io/selected-node: $2
    volume.kubernetes.io/storage-provisioner: $3
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: nvme-gds
  resources: {requests: {storage: 1Gi}}
  volumeName: pv-$1
YAML
  local uid
  uid=$("$KUBECTL" get pvc "$1" -o jsonpath='{.metadata.uid}')
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolume
metadata:
  name: pv-$1
  annotations: {pv.kubernetes.io/provisioned-by: $3}
  finalizers: [external-provisioner.volume.kubernetes.io/finalizer]
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Delete
  storageClassName: nvme-gds
  volumeMode: Filesystem
  csi: {driver: $3, volumeHandle: "$4", fsType: ext4}
  claimRef: {apiVersion: v1, kind: PersistentVolumeClaim, namespace: default, name: $1, uid: $uid}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions: [{key: $5, operator: In, values: ["$6"]}]
YAML
}
for n in node-a node-b node-c node-d; do node "$n"; done
blk() { volume "$1" "$2" "$DRIVER" "blk:dev-0123456789abcdef:0000000$3:$2:part" "$DRIVER/node" "$2"; }
blk data-a node-a 1
blk data-b node-b 2
blk data-c node-c 3
blk data-d node-d 4
# Controls on the lost node: an NFS volume of this driver (pinned there on purpose: the
# handle, not the affinity, tells it apart) and another driver's local volume.
volume nfs-b node-b "$DRIVER" "nfs:d-rdma-20049-4.1:~export:pvc-nfs-b:nfs01.example" "$DRIVER/node" node-b
volume other-b node-b other.csi.example "blk:dev-0123456789abcdef:00000005:node-b" "$DRIVER/node" node-b
claims=(data-a data-b data-c data-d nfs-b other-b)
all_bound() { local c; for c in "${claims[@]}"; do is_bound "$c" || return 1; done; }
check "the binder bound every pre-bound claim" wait_for 30 all_bound
uid_of() { "$KUBECTL" get pvc "$1" -o jsonpath='{.metadata.uid}' 2>/dev/null; }
declare -A UID0
for c in "${claims[@]}"; do UID0[$c]=$(uid_of "$c"); done

# --- the controller -----------------------------------------------------------------------
LOG=$WORK/node-loss.log
start_controller() { # ACTION GRACE
  echo "--- controller: --action $1 --grace-period $2" >>"$LOG"
  KUBECONFIG=$WORK/node-loss.kubeconfig "$NODE_LOSS_BIN" --driver-name "$DRIVER" --action "$1" \
    --grace-period "$2" --interval 1s --api-timeout 5s --metrics-address "$METRICS" >>"$LOG" 2>&1 &
  CTRL_PID=$!
  wait_for 20 curl -sf "http://$METRICS/healthz"
}
stop_controller() { kill "$CTRL_PID" 2>/dev/null || true; wait "$CTRL_PID" 2>/dev/null || true; CTRL_PID=; }
metric() { curl -sf "http://$METRICS/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
passes() { metric 'gds_csi_node_loss_passes_total{outcome="ok"}'; }
recreated_metric() { metric "gds_csi_node_loss_recreated_claims_total{node=\"$1\"}"; }
at_least() { local v; v=$("${@:2}") && [ -n "$v" ] && [ "$v" -ge "$1" ]; } # N COMMAND...: its output >= N
elapsed() { [ "$SECONDS" -ge "$1" ]; }
# after_pass_past DEADLINE: waits until a whole pass has begun and ended after DEADLINE (bash
# SECONDS; the second pass to end after it began after it), so "nothing happened by then" is
# proven, not assumed.
after_pass_past() { wait_for 30 elapsed "$1" && local n && n=$(passes) && wait_for 10 at_least $((n + 2)) passes; }
since_log() { tail -n +"$1" "$LOG" | grep -q -- "$2"; } # LINE TEXT: TEXT logged after line LINE
log_lines() { wc -l <"$LOG"; }
absent_logged() { since_log "$1" "node object is absent.* node=$2 "; } # LINE NODE
events_for() { # CLAIM REASON -> count of events with that reason on the claim
  "$KUBECTL" get events -n default --field-selector "reason=$2,involvedObject.name=$1" -o name | wc -l
}
unchanged() { # CLAIM: same uid, still Bound, its PV there
  [ "$(uid_of "$1")" = "${UID0[$1]}" ] && is_bound "$1" && "$KUBECTL" get pv "pv-$1" -o name >/dev/null 2>&1
}
controls_unchanged() { unchanged data-a && unchanged nfs-b && unchanged other-b; }

# --- report --------------------------------------------------------------------------------
: >"$LOG"
check "controller (action report) serves /healthz" start_controller report 6s
check "controller lists Nodes and PVs with the chart's RBAC (a pass done, on /metrics)" wait_for 10 at_least 1 passes
mark=$(log_lines)
"$KUBECTL" delete node node-b node-d >/dev/null
t_gone=$SECONDS
check "the deletion of node-b and node-d is noticed" wait_for 10 absent_logged "$mark" node-d
node node-d
check "report: Event NodeLost on data-b" wait_for 30 at_least 1 events_for data-b NodeLost
check "report: gds_csi_node_loss_claims{node=node-b,action=report} is 1 on /metrics" \
  test "$(metric 'gds_csi_node_loss_claims{node="node-b",action="report"}')" = 1
after_pass_past $((t_gone + 6 + 1)) || echo "no pass after the grace period (see the checks below)"
check "node-d, back within the grace period: nothing changed past the original grace (no event, claim and PV as they were)" \
  eval 'unchanged data-d && [ "$(events_for data-d NodeLost)" = 0 ]'
check "node-d's return is logged" since_log "$mark" "back before its grace period ended.* node=node-d "
check "report changed nothing else: data-b still Bound to its PV" unchanged data-b
check "report: one Event per claim, not one per pass" test "$(events_for data-b NodeLost)" = 1
check "NFS volume and another driver's volume on node-b: no event, unchanged" \
  eval 'controls_unchanged && [ "$(events_for nfs-b NodeLost)$(events_for other-b NodeLost)" = 00 ]'
stop_controller

# --- recreate, and a restart mid-grace ---------------------------------------------------------
# A pod scheduled to node-b names data-b: Kubernetes' rule keeps that claim while it is there.
"$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: web-b, namespace: default}
spec:
  nodeName: node-b
  containers: [{name: c, image: registry.k8s.io/pause:3.10}]
  volumes: [{name: d, persistentVolumeClaim: {claimName: data-b}}]
YAML
mark=$(log_lines)
check "controller (action recreate) serves /healthz" start_controller recreate 10s
"$KUBECTL" delete node node-c >/dev/null
check "the deletion of node-c is noticed" wait_for 10 absent_logged "$mark" node-c
t_c=$SECONDS
# Half-way through node-c's grace period: a new process starts its clock again, so it
# acts at t_c + 15, not at t_c + 10.
wait_for 10 elapsed $((t_c + 5))
stop_controller
check "controller restarted" start_controller recreate 10s
after_pass_past $((t_c + 10 + 1)) || echo "no pass after the grace period (see the checks below)"
check "restarted mid-grace: nothing done when the first process's grace has passed (data-b, data-c unchanged)" \
  eval 'unchanged data-c && unchanged data-b'
deleting() { [ -n "$("$KUBECTL" get pvc "$1" -o jsonpath='{.metadata.deletionTimestamp}' 2>/dev/null)" ]; }
check "recreate: data-b deleted but kept while pod web-b (scheduled) names it" \
  eval 'wait_for 20 deleting data-b && [ "$(uid_of data-b)" = "${UID0[data-b]}" ]'
check "recreate: the wait names the pod" wait_for 10 grep -q 'pod default/web-b (node node-b) still uses claim data-b' "$LOG"
recreated() { local u; u=$(uid_of "$1"); [ -n "$u" ] && [ "$u" != "${UID0[$1]}" ] && ! deleting "$1"; }
check "recreate: data-c re-created" wait_for 20 recreated data-c
"$KUBECTL" delete pod web-b --grace-period=0 --force >/dev/null 2>&1
check "recreate: data-b re-created once no pod uses it" wait_for 20 recreated data-b
# Deleted, and held only by the provisioner's finalizer: should the node come back under
# its name, its provisioner calls DeleteVolume and the driver frees the volume
# (tests/e2e/run.sh proves that part with a real provisioner and driver).
awaits_node() {
  local got
  got=$("$KUBECTL" get pv "pv-$1" -o jsonpath='{.metadata.deletionTimestamp}|{.metadata.finalizers}')
  [[ "$got" == ?*'|["external-provisioner.volume.kubernetes.io/finalizer"]' ]]
}
check "recreate: the lost nodes' PVs are deleted, held only by the provisioner's finalizer (the node's return frees them)" \
  wait_for 20 eval 'awaits_node data-b && awaits_node data-c'
n=$(passes)
check "recreate: a deleted PV is not acted on again (two passes later, one deletion logged per PV)" \
  eval 'wait_for 10 at_least $((n + 2)) passes && [ "$(grep -c "node lost: deleted the PV" "$LOG")" = 2 ]'
for c in data-b data-c; do
  got=$("$KUBECTL" get pvc "$c" -o json | python3 -c '
import json, sys
p = json.load(sys.stdin)
m, s = p["metadata"], p["spec"]
print(p["status"]["phase"], s.get("volumeName", "-"), s["storageClassName"], s["resources"]["requests"]["storage"],
      ",".join(s["accessModes"]), m["labels"]["app"], m["annotations"].get("team"),
      m["annotations"].get("volume.kubernetes.io/selected-node", "-"))')
  check "recreate: $c is Pending, unbound, same spec, labels and annotations, no selected node ($got)" \
    test "$got" = "Pending - nvme-gds 1Gi ReadWriteOnce web ml -"
done
check "recreate: Event NodeLostRecreated on the new data-b" at_least 1 events_for data-b NodeLostRecreated
check "gds_csi_node_loss_recreated_claims_total is 1 for node-b and for node-c" \
  eval '[ "$(recreated_metric node-b)$(recreated_metric node-c)" = 11 ]'
check "NFS volume, another driver's volume and node-a's: untouched by recreate" controls_unchanged
check "node-d's claim: untouched by recreate" unchanged data-d
stop_controller

echo "node-loss: $((SECONDS - t_up)) s after the control plane came up"
if [ "$failed" -gt 0 ]; then
  echo "--- controller log"; cat "$LOG"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
