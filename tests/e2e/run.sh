#!/usr/bin/env bash
# End to end on a real Kubernetes control plane on this machine: etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler (built from the Go module proxy at pinned
# versions), two simulated nodes each with its own gds-csi plugin on its own loop-device
# pool and its own external-provisioner in distributed mode (--node-deployment).
# Stage one: there is no kubelet here. Node and CSINode objects are written as a kubelet and
# node-driver-registrar would write them, so scheduling, provisioning, binding, capacity
# tracking and deletion are real. Stage two, tests/e2e/kubelet.sh, runs a real kubelet
# with containerd and runc, so NodeStage/NodePublish are driven by Kubernetes too.
set -euo pipefail
# shellcheck source=tests/e2e/lib.sh
. "$(cd "$(dirname "$0")" && pwd)/lib.sh"
need_root
install_host_tools
e2e_tools etcd kube-apiserver kube-controller-manager kube-scheduler kubectl csi-provisioner
WORK=$(mktemp -d /tmp/gds-e2e.XXXXXX)
cleanup() {
  e2e_stop_all
  cleanup_dir_and_loops "$WORK"
}
trap cleanup EXIT
start=$SECONDS

# No kubelet: the node lifecycle controller would taint the nodes not-ready.
start_control_plane '*,-nodelifecycle'
echo "control plane up in $((SECONDS - start)) s"
apply_chart
check "rendered CSIDriver, RBAC and StorageClass applied" "$KUBECTL" get "csidriver/$DRIVER" storageclass/nvme-gds -o name
# The GDS workload examples (deploy/examples/) as the API server admits them (the nvidia
# RuntimeClass they name is what the GPU Operator installs).
printf 'apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: nvidia\nhandler: nvidia\n' |
  "$KUBECTL" apply -f - >/dev/null
# The snapshot example's kinds: the CRDs the chart's snapshot-crds subchart installs.
check "the snapshot CRDs the chart ships are accepted and established" bash -c '
  "$0" apply -f "$1" >/dev/null &&
  "$0" wait --for=condition=Established --timeout=60s -f "$1" >/dev/null' \
  "$KUBECTL" "$E2E_DIR/../../deploy/helm/gds-csi/charts/snapshot-crds/crds/"
check "GDS workload pod template, read job and snapshot example pass a server-side dry run" \
  "$KUBECTL" apply --dry-run=server -f "$E2E_DIR/../../deploy/examples/"

# --- two nodes, each with a plugin, a pool and a provisioner ---------------------------
MiB=$((1024 * 1024))
declare -A POOL=( [node-a]="64 64" [node-b]="128" )
declare -A PROVISIONER_PID=()
for node in node-a node-b; do
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: $node
  # What the kubelet writes from NodeGetInfo's topology: no GPU here, so GDS is not ready
  # and NodeGetInfo reports only $DRIVER/node (a readiness key appears only when true).
  labels: {kubernetes.io/hostname: $node, nvidia.com/gpu.present: "true", $DRIVER/node: $node}
YAML
  "$KUBECTL" patch node "$node" --subresource=status --type=merge -p \
    '{"status":{"conditions":[{"type":"Ready","status":"True","reason":"E2E","message":"simulated"}],"capacity":{"cpu":"8","memory":"16Gi","pods":"110"},"allocatable":{"cpu":"8","memory":"16Gi","pods":"110"}}}' >/dev/null
  # Admission taints a new node not-ready until its kubelet reports; this node has none.
  "$KUBECTL" taint nodes "$node" node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: CSINode
metadata: {name: $node}
spec:
  drivers: [{name: $DRIVER, nodeID: $node, topologyKeys: [$DRIVER/node]}]
YAML
  args=()
  i=0
  for size in ${POOL[$node]}; do
    i=$((i + 1))
    args+=(--pool-device "$(make_loop "$WORK/$node-dev$i.img" $((size * MiB)))")
  done
  mkdir -p "$WORK/$node"
  "$GDS_CSI" serve --endpoint "unix://$WORK/$node/csi.sock" --mode all --node-id "$node" \
    --state-dir "$WORK/$node/state" --allowed-path-root "$WORK/$node" "${args[@]}" 2>"$WORK/$node/driver.log" &
  PIDS+=($!)
  wait_for_socket "$WORK/$node/csi.sock"
  start_provisioner "$node" "$WORK/$node/csi.sock" "$WORK/$node/provisioner.log"
  PROVISIONER_PID[$node]=${PIDS[-1]}
done

# Capacity checks without a class are for nvme-gds-whole (layout: device); the partition
# class nvme-gds has its own section below.
check "CSIStorageCapacity shows node-a's pool (128 MiB)" wait_for 60 has_capacity node-a 128
check "CSIStorageCapacity shows node-b's pool (128 MiB)" wait_for 60 has_capacity node-b 128

# --- a PVC and a Pod: scheduled, provisioned on the chosen node, bound ------------------
pvc_and_pod() { # NAME SIZE [CLASS [NODE]]
  pvc "$1" "${3:-nvme-gds-whole}" "$2"
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  nodeSelector: {nvidia.com/gpu.present: "true"${4:+, kubernetes.io/hostname: $4}}
  containers: [{name: app, image: registry.invalid/none, volumeMounts: [{name: data, mountPath: /data}]}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: $1}}]
YAML
}
pvc_and_pod data 100Mi
check "PVC data is bound" wait_for 90 is_bound data
if ! is_bound data; then
  "$KUBECTL" describe pod data | tail -15; tail -20 "$WORK/scheduler.log"
  for f in "$WORK"/node-*/provisioner.log; do echo "--- $f"; tail -20 "$f"; done
  exit 1
fi
pod_scheduled() { [ -n "$("$KUBECTL" get pod data -o jsonpath='{.spec.nodeName}')" ]; }
check "pod data is scheduled" wait_for 60 pod_scheduled
node=$("$KUBECTL" get pod data -o jsonpath='{.spec.nodeName}')
pv=$("$KUBECTL" get pvc data -o jsonpath='{.spec.volumeName}')
affinity=$("$KUBECTL" get pv "$pv" -o jsonpath="{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}")
handle=$("$KUBECTL" get pv "$pv" -o jsonpath='{.spec.csi.volumeHandle}')
echo "     pod on $node, PV $pv affinity $affinity, handle $handle"
check "the scheduler placed the pod on the node with a fitting device (node-b)" [ "$node" = node-b ]
check "the PV has that node's affinity" [ "$affinity" = "$node" ]
# blk:<device>:<id>:<node>[:part]
check "the volume handle names that node" [ "$(cut -d: -f4 <<<"$handle")" = "$node" ]
check "CreateVolume succeeded on that node's plugin" succeeded CreateVolume "$WORK/$node/driver.log"
check "node-b's capacity dropped to 0" wait_for 30 has_capacity node-b 0

# --- a PVC larger than any free device stays pending with a clear event ----------------
pvc_and_pod huge 1Gi
huge_events() { "$KUBECTL" get events -n default --field-selector involvedObject.name=huge -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}'; }
says_why() { grep -qiE "storage|capacity|OutOfRange|device" <<<"$(huge_events)"; }
check "an event says why" wait_for 60 says_why
huge_events | sed 's/^/     /' | head -5
check "PVC huge stays Pending" [ "$(pvc_phase huge)" = Pending ]

# --- deleting the PVC deletes the volume; the device returns to the pool ----------------
"$KUBECTL" delete pod data huge --grace-period=0 --force >/dev/null 2>&1 || true
"$KUBECTL" delete pvc data huge --wait=false >/dev/null
pv_gone() { ! "$KUBECTL" get pv "$pv" >/dev/null 2>&1; }
check "PV deleted after the PVC" wait_for 60 pv_gone
check "DeleteVolume succeeded on $node" succeeded DeleteVolume "$WORK/$node/driver.log"
check "node-b's capacity is back to 128 MiB" wait_for 60 has_capacity node-b 128

# --- a clone (issue 15): a claim whose dataSource is another claim of the driver -------
# The clone's pod goes where the source's volume is, as a user must say: the scheduler
# does not know that a clone of a local volume can be made only on its source's node (on
# another node the driver answers ResourceExhausted and external-provisioner 6.4.0
# reschedules, checkError's ProvisioningReschedule, but nothing makes the scheduler pick
# the source's node next: on 2026-12-01 a clone pod naming no node was not Bound within
# 180 s here; its cause was not pinned down, the logs were not kept).
pvc_and_pod src 40Mi nvme-gds-whole node-a
check "source claim src is bound (on node-a)" wait_for 90 is_bound src
pv_of() { "$KUBECTL" get pvc "$1" -o jsonpath='{.spec.volumeName}'; }
affinity_of() { "$KUBECTL" get pv "$1" -o jsonpath="{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}"; }
src_pv=$(pv_of src)
src_node=$(affinity_of "$src_pv")
pvc clone nvme-gds-whole 40Mi src
"$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: clone, namespace: default}
spec:
  nodeSelector: {nvidia.com/gpu.present: "true", kubernetes.io/hostname: $src_node}
  containers: [{name: app, image: registry.invalid/none, volumeMounts: [{name: data, mountPath: /data}]}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: clone}}]
YAML
check "the clone claim (dataSource: PersistentVolumeClaim src) is Bound" wait_for 120 is_bound clone
if ! is_bound clone; then
  "$KUBECTL" get events -n default --field-selector involvedObject.name=clone | tail -8
  for f in "$WORK"/node-*/provisioner.log; do echo "--- $f"; grep -i clone "$f" | tail -8; done
  exit 1
fi
clone_pv=$(pv_of clone)
src_handle=$("$KUBECTL" get pv "$src_pv" -o jsonpath='{.spec.csi.volumeHandle}')
clone_handle=$("$KUBECTL" get pv "$clone_pv" -o jsonpath='{.spec.csi.volumeHandle}')
echo "     source $src_handle on $(affinity_of "$src_pv"), clone $clone_handle on $(affinity_of "$clone_pv")"
check "the source's PV is on node-a" [ "$(affinity_of "$src_pv")" = node-a ]
check "the clone's PV has the source's node affinity (node-a)" [ "$(affinity_of "$clone_pv")" = node-a ]
check "the clone's volume handle names node-a" [ "$(cut -d: -f4 <<<"$clone_handle")" = node-a ]
distinct_clone() { [ -n "$clone_handle" ] && [ "$clone_handle" != "$src_handle" ]; }
check "the clone is another volume than its source" distinct_clone
# What CreateVolume got as volume_content_source: the clone's record names its source.
clone_source() {
  python3 -c 'import glob, json, sys
records = [json.load(open(p)) for p in glob.glob(sys.argv[1] + "/*.json")]
print((next(r["record"] for r in records if r["id"] == sys.argv[2]).get("source") or {}).get("of", {}).get("volume", ""))' \
    "$WORK/node-a/state/volumes" "$clone_handle"
}
check "node-a's driver recorded the clone's source as the source claim's volume" [ "$(clone_source)" = "$src_handle" ]
"$KUBECTL" delete pod src clone --grace-period=0 --force >/dev/null 2>&1 || true
"$KUBECTL" delete pvc clone src --wait=false >/dev/null
both_pvs_gone() { ! "$KUBECTL" get pv "$src_pv" >/dev/null 2>&1 && ! "$KUBECTL" get pv "$clone_pv" >/dev/null 2>&1; }
check "both PVs deleted after their claims" wait_for 60 both_pvs_gone
check "node-a's capacity is back to 128 MiB" wait_for 60 has_capacity node-a 128

# --- layout: partition: two claims carved from node-b's one device -------------------
part_free() { capacity_of node-b nvme-gds; }
has_part_capacity() { [ "$(part_free)" -gt 0 ]; }
check "CSIStorageCapacity for nvme-gds (partition) on node-b shows free space" wait_for 60 has_part_capacity
free0=$(part_free)
pvc_and_pod p1 24Mi nvme-gds node-b
pvc_and_pod p2 40Mi nvme-gds node-b
both_bound() { is_bound p1 && is_bound p2; }
check "PVCs p1 (24Mi) and p2 (40Mi) of class nvme-gds are bound" wait_for 90 both_bound
both_bound || "$KUBECTL" get pvc,pod -o wide 2>&1 | sed 's/^/     /'
handle_of() { "$KUBECTL" get pv "$("$KUBECTL" get pvc "$1" -o jsonpath='{.spec.volumeName}')" -o jsonpath='{.spec.csi.volumeHandle}'; }
h1=$(handle_of p1 2>/dev/null || true)
h2=$(handle_of p2 2>/dev/null || true)
echo "     handles $h1 $h2"
is_part_on_b() { [ "${1%%:*}:$(cut -d: -f4,5 <<<"$1")" = blk:node-b:part ]; }
both_parts() { is_part_on_b "$h1" && is_part_on_b "$h2"; }
same_device() { [ -n "$h1" ] && [ "$(cut -d: -f2 <<<"$h1")" = "$(cut -d: -f2 <<<"$h2")" ]; }
distinct() { [ -n "$h1" ] && [ "$h1" != "$h2" ]; }
check "both are partitions (:part) on node-b" both_parts
check "both handles name the same pool device" same_device
check "the two volumes are distinct" distinct
fell() { [ "$(part_free)" -le $((free0 - 64)) ]; }
check "nvme-gds capacity on node-b fell by at least 64 MiB (from $free0 MiB)" wait_for 60 fell
free1=$(part_free)
max1=$(capacity_of node-b nvme-gds maximumVolumeSize)
echo "     nvme-gds on node-b: $free0 MiB free before, $free1 MiB with both claims, maximumVolumeSize $max1 MiB"
max_fits() { [ "$max1" -gt 0 ] && [ "$max1" -le "$free1" ]; }
check "maximumVolumeSize is reported and fits in the rest" max_fits
"$KUBECTL" delete pod p1 p2 --grace-period=0 --force >/dev/null 2>&1 || true
"$KUBECTL" delete pvc p1 p2 --wait=false --ignore-not-found >/dev/null
back() { [ "$(part_free)" = "$free0" ]; }
check "after deleting both, nvme-gds capacity on node-b is back to $free0 MiB" wait_for 60 back

# --- a lost node's volume, freed when the node comes back ------------------------------
# What the node-loss controller's `recreate` leaves (tests/e2e/node-loss.sh): the claim
# gone, the PV deleted but held by the provisioner's finalizer, the node's provisioner not
# running. When it runs again (the node back under its name), it calls DeleteVolume and the
# driver frees the volume.
pvc_and_pod lost 24Mi nvme-gds node-b
check "PVC lost (a partition) is bound on node-b" wait_for 90 is_bound lost
lost_pv=$("$KUBECTL" get pvc lost -o jsonpath='{.spec.volumeName}')
deletes() { grep -cE "(^|[[:space:]])call method=DeleteVolume( |\$)" "$WORK/node-b/driver.log"; }
# shellcheck disable=SC2034 # read in the checks' eval
deletes0=$(deletes)
kill "${PROVISIONER_PID[node-b]}" && wait "${PROVISIONER_PID[node-b]}" 2>/dev/null || true
"$KUBECTL" delete pod lost --grace-period=0 --force >/dev/null 2>&1 || true
"$KUBECTL" delete pvc lost --wait=false >/dev/null
"$KUBECTL" delete pv "$lost_pv" --wait=false >/dev/null
"$KUBECTL" patch pv "$lost_pv" --type=json \
  -p '[{"op":"replace","path":"/metadata/finalizers","value":["external-provisioner.volume.kubernetes.io/finalizer"]}]' >/dev/null
released() { [ "$("$KUBECTL" get pv "$lost_pv" -o jsonpath='{.status.phase}')" = Released ]; }
check "with node-b's provisioner gone, the deleted PV stays (Released, the provisioner's finalizer)" \
  eval 'wait_for 30 released && [ "$(deletes)" = "$deletes0" ]'
start_provisioner node-b "$WORK/node-b/csi.sock" "$WORK/node-b/provisioner.log"
lost_pv_gone() { ! "$KUBECTL" get pv "$lost_pv" >/dev/null 2>&1; }
check "node-b's provisioner back: DeleteVolume frees the volume and the PV goes" \
  eval 'wait_for 60 lost_pv_gone && [ "$(deletes)" -gt "$deletes0" ]'
check "nvme-gds capacity on node-b is back to $free0 MiB" wait_for 60 back

echo "e2e wall time: $((SECONDS - start)) s"
echo "$passed passed, $failed failed"
if [ "$failed" -ne 0 ]; then
  for f in "$WORK"/node-*/provisioner.log; do echo "--- $f"; tail -15 "$f"; done
fi
[ "$failed" -eq 0 ]
