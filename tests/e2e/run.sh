#!/usr/bin/env bash
# End to end on a real Kubernetes control plane on this machine: etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler (built from the Go module proxy at pinned
# versions), two simulated nodes each with its own gds-csi plugin on its own loop-device
# pool and its own external-provisioner in distributed mode (--node-deployment).
# There is no kubelet: Node and CSINode objects are written as a kubelet and
# node-driver-registrar would write them, so scheduling, provisioning, binding, capacity
# tracking and deletion are real; NodeStage/NodePublish are not exercised here.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../../scripts/lib.sh"
need_root
install_host_tools
build_start=$SECONDS
bash "$HERE/build-tools.sh"
build_driver
echo "tools ready in $((SECONDS - build_start)) s"
for t in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl csi-provisioner; do
  [ -x "$CACHE_BIN/$t" ] || { echo "missing $t" >&2; exit 1; }
done
KUBECTL="$CACHE_BIN/kubectl"
DRIVER=gds.csi.gds-csi.io
NS=gds-csi
WORK=$(mktemp -d /tmp/gds-e2e.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  cleanup_dir_and_loops "$WORK"
}
trap cleanup EXIT
start=$SECONDS
passed=0; failed=0
check() { # check NAME COMMAND...
  if "${@:2}"; then passed=$((passed + 1)); echo "ok   - $1"; else failed=$((failed + 1)); echo "FAIL - $1"; fi
}
wait_for() { # wait_for SECONDS COMMAND...
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 1
  done
}

# --- control plane ---------------------------------------------------------------
mkdir -p "$WORK/pki"
openssl genrsa -out "$WORK/pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$WORK/pki/sa.key" -pubout -out "$WORK/pki/sa.pub" 2>/dev/null
ADMIN_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "$ADMIN_TOKEN,admin,admin,system:masters" > "$WORK/pki/tokens.csv"
API=https://127.0.0.1:64430

"$CACHE_BIN/etcd" --data-dir "$WORK/etcd" --listen-client-urls http://127.0.0.1:23790 \
  --advertise-client-urls http://127.0.0.1:23790 --listen-peer-urls http://127.0.0.1:23800 \
  --initial-advertise-peer-urls http://127.0.0.1:23800 --initial-cluster default=http://127.0.0.1:23800 \
  >"$WORK/etcd.log" 2>&1 &
PIDS+=($!)
"$CACHE_BIN/kube-apiserver" --etcd-servers http://127.0.0.1:23790 --bind-address 127.0.0.1 \
  --advertise-address 127.0.0.1 --secure-port 64430 --cert-dir "$WORK/pki" \
  --token-auth-file "$WORK/pki/tokens.csv" --authorization-mode Node,RBAC \
  --service-account-key-file "$WORK/pki/sa.pub" --service-account-signing-key-file "$WORK/pki/sa.key" \
  --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range 192.0.2.0/24 \
  --enable-priority-and-fairness=false >"$WORK/apiserver.log" 2>&1 &
PIDS+=($!)
cat > "$WORK/admin.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: $API, insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: $ADMIN_TOKEN}}]
contexts: [{name: e2e, context: {cluster: e2e, user: admin}}]
current-context: e2e
KC
export KUBECONFIG="$WORK/admin.kubeconfig"
wait_for 90 "$KUBECTL" get --raw /readyz || { tail -30 "$WORK/apiserver.log"; exit 1; }
# No kubelet: the node lifecycle controller would taint the nodes not-ready.
"$CACHE_BIN/kube-controller-manager" --kubeconfig "$KUBECONFIG" --controllers '*,-nodelifecycle' \
  --service-account-private-key-file "$WORK/pki/sa.key" --leader-elect=false \
  --bind-address 127.0.0.1 --secure-port 0 >"$WORK/controller-manager.log" 2>&1 &
PIDS+=($!)
"$CACHE_BIN/kube-scheduler" --kubeconfig "$KUBECONFIG" --leader-elect=false \
  --bind-address 127.0.0.1 --secure-port 0 >"$WORK/scheduler.log" 2>&1 &
PIDS+=($!)
echo "control plane up in $((SECONDS - start)) s"

# --- the rendered chart: namespace, CSIDriver, RBAC, StorageClass ----------------------
"$KUBECTL" create namespace "$NS" >/dev/null
python3 - "$HERE/../../deploy/manifests/gds-csi.yaml" > "$WORK/chart.yaml" <<'PY'
import sys, yaml
keep = {"CSIDriver", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "StorageClass"}
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") in keep]
print(yaml.safe_dump_all(docs))
PY
"$KUBECTL" apply -f "$WORK/chart.yaml" >/dev/null
check "rendered CSIDriver, RBAC and StorageClass applied" "$KUBECTL" get "csidriver/$DRIVER" storageclass/nvme-gds -o name

# --- two nodes, each with a plugin, a pool and a provisioner ---------------------------
SA_TOKEN=$("$KUBECTL" -n "$NS" create token gds-csi-node --duration 2h)
cat > "$WORK/sa.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: $API, insecure-skip-tls-verify: true}}]
users: [{name: sa, user: {token: $SA_TOKEN}}]
contexts: [{name: e2e, context: {cluster: e2e, user: sa}}]
current-context: e2e
KC
MiB=$((1024 * 1024))
declare -A POOL=( [node-a]="64 64" [node-b]="128" )
for node in node-a node-b; do
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: $node
  # What the kubelet writes from NodeGetInfo's topology (no GPU here: GDS not ready).
  labels: {kubernetes.io/hostname: $node, nvidia.com/gpu.present: "true", $DRIVER/node: $node,
           $DRIVER/gds-nvme: "false", $DRIVER/gds-nfs-rdma: "false"}
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
  drivers: [{name: $DRIVER, nodeID: $node, topologyKeys: [$DRIVER/node, $DRIVER/gds-nvme, $DRIVER/gds-nfs-rdma]}]
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
  NODE_NAME=$node NAMESPACE=$NS "$CACHE_BIN/csi-provisioner" --csi-address "$WORK/$node/csi.sock" \
    --kubeconfig "$WORK/sa.kubeconfig" --node-deployment=true --node-deployment-immediate-binding=false \
    --feature-gates=Topology=true --strict-topology --immediate-topology=false --enable-capacity=true \
    --capacity-ownerref-level=-1 --capacity-poll-interval=5s --leader-election=false \
    --extra-create-metadata --default-fstype=ext4 --v=3 >"$WORK/$node/provisioner.log" 2>&1 &
  PIDS+=($!)
done

# capacity_of NODE: MiB that node's CSIStorageCapacity objects report.
capacity_of() {
  "$KUBECTL" -n "$NS" get csistoragecapacities -o json | python3 -c '
import json, sys
units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
def quantity(s):
    for suffix, mult in units.items():
        if s.endswith(suffix):
            return int(float(s[:-2]) * mult)
    return int(s or 0)
node, key = sys.argv[1], sys.argv[2]
items = json.load(sys.stdin)["items"]
print(sum(quantity(i.get("capacity", "0")) for i in items
          if i["nodeTopology"]["matchLabels"].get(key) == node) >> 20)' "$1" "$DRIVER/node"
}
has_capacity() { [ "$(capacity_of "$1")" = "$2" ]; }
check "CSIStorageCapacity shows node-a's pool (128 MiB)" wait_for 60 has_capacity node-a 128
check "CSIStorageCapacity shows node-b's pool (128 MiB)" wait_for 60 has_capacity node-b 128

# --- a PVC and a Pod: scheduled, provisioned on the chosen node, bound ------------------
pvc_and_pod() { # NAME SIZE
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: nvme-gds
  resources: {requests: {storage: $2}}
---
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  nodeSelector: {nvidia.com/gpu.present: "true"}
  containers: [{name: app, image: registry.invalid/none, volumeMounts: [{name: data, mountPath: /data}]}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: $1}}]
YAML
}
pvc_phase() { "$KUBECTL" get pvc "$1" -o jsonpath='{.status.phase}'; }
is_bound() { [ "$(pvc_phase "$1")" = Bound ]; }
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
check "the volume handle names that node" [ "${handle##*:}" = "$node" ]
check "CreateVolume ran on that node's plugin" grep -q "CreateVolume" "$WORK/$node/driver.log"
check "node-b's capacity dropped to 0" wait_for 30 has_capacity node-b 0

# --- a PVC larger than any free device stays pending with a clear event ----------------
pvc_and_pod huge 1Gi
sleep 10
check "PVC huge stays Pending" [ "$(pvc_phase huge)" = Pending ]
events=$("$KUBECTL" get events -n default --field-selector involvedObject.name=huge -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}')
echo "$events" | sed 's/^/     /' | head -5
check "an event says why" grep -qiE "storage|capacity|OutOfRange|device" <<<"$events"

# --- deleting the PVC deletes the volume; the device returns to the pool ----------------
"$KUBECTL" delete pod data huge --grace-period=0 --force >/dev/null 2>&1 || true
"$KUBECTL" delete pvc data huge --wait=false >/dev/null
pv_gone() { ! "$KUBECTL" get pv "$pv" >/dev/null 2>&1; }
check "PV deleted after the PVC" wait_for 60 pv_gone
check "DeleteVolume ran on $node" grep -q "DeleteVolume" "$WORK/$node/driver.log"
check "node-b's capacity is back to 128 MiB" wait_for 60 has_capacity node-b 128

echo "e2e wall time: $((SECONDS - start)) s (tool build/check $((start - build_start)) s)"
echo "$passed passed, $failed failed"
if [ "$failed" -ne 0 ]; then
  for f in "$WORK"/node-*/provisioner.log; do echo "--- $f"; tail -15 "$f"; done
fi
[ "$failed" -eq 0 ]
