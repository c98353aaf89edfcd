#!/usr/bin/env bash
# End to end on two kubelet nodes: the rig's node (kubelet-node) and a second one in its own
# network, PID and mount namespaces (tests/e2e/second-node.sh), one `helm install` serving both,
# each node with its own pool: node A one 256 MiB drive, node B one 1 GiB drive.
#
# What only two nodes show:
# - capacity: a claim only node B can hold binds there and its pod runs there
#   (WaitForFirstConsumer with CSIStorageCapacity per node); a claim no node can hold stays
#   Pending, the scheduler's event naming the storage;
# - attachment: a filesystem claim in use on node B is never mounted on node A, a raw block
#   claim in use on node A never mapped on node B: a second pod pinned to the other node
#   stays Pending (the volume's node affinity), nothing of the claim there;
# - snapshots across nodes: a claim written on node A, snapshotted into the store both
#   nodes share, restored as a claim whose pod the scheduler puts on node B, bytes compared;
# - each node's own driver, pool, state, device plugin and labels; with a GDS-ready node and
#   one that stops being so (fixture host trees), a pod asking for `gds` goes to the ready one.
set -euo pipefail
DEPLOY=chart
E2E_HERE=$(cd "$(dirname "$0")" && pwd)
# The node-loss controller goes into the driver's image beside gds-csi (a debug build: it
# shares the dependencies `cargo test` built).
(cd "$E2E_HERE/../.." && cargo build --quiet -p gds-csi-node-loss)
GDS_CSI_NODE_LOSS="${CARGO_TARGET_DIR:-$E2E_HERE/../../target}/debug/gds-csi-node-loss"
# shellcheck source=tests/e2e/second-node.sh
. "$E2E_HERE/second-node.sh"
# shellcheck source=tests/e2e/kubelet-rig.sh
. "$E2E_HERE/kubelet-rig.sh"
start_second_node
[ "$failed" -eq 0 ] || exit 1

MiB=$((1024 * 1024))
DEV_A=$(make_loop "$WORK/node-a-d0.img" $((256 * MiB)))
DEV_B=$(make_loop "$WORK/node-b-d0.img" $((1024 * MiB)))
pool=$(node_pool "$NODE" "$DEV_A")
node_pool "$NODE_B" "$DEV_B" >/dev/null
SNAPSHOT_STORE=$WORK/snapshot-store
rig_chart_values "$pool"
helm_set+=(--set storageClasses.nvme.gdsPolicy=disabled --set storageClasses.nvmeWhole.gdsPolicy=disabled
  --set sidecars.provisioner.capacityPollInterval=5s
  --set snapshots.enabled=true --set snapshots.class.storeDir="$SNAPSHOT_STORE"
  # The node-loss controller on node B, the node that stays.
  --set nodeLoss.enabled=true --set nodeLoss.action=recreate --set nodeLoss.gracePeriod=20s
  --set nodeLoss.interval=2s --set "nodeLoss.nodeSelector.kubernetes\.io/hostname=$NODE_B")
check "helm install of the chart (one set of values for both nodes)" "$HELM" install gds-csi \
  "$E2E_DIR/../../deploy/helm/gds-csi" --namespace "$NS" --create-namespace "${helm_set[@]}"
check "the node DaemonSet rolls out on both nodes" "$KUBECTL" -n "$NS" rollout status ds/gds-csi-node --timeout 240s
check "the snapshot-controller Deployment rolls out" \
  "$KUBECTL" -n "$NS" rollout status deploy/gds-csi-snapshot-controller --timeout 120s
plugin_nodes() {
  "$KUBECTL" -n "$NS" get pods -l app.kubernetes.io/component=node -o jsonpath='{.items[*].spec.nodeName}' |
    tr ' ' '\n' | sort | tr '\n' ' '
}
check "one node plugin pod on each node ($(plugin_nodes))" [ "$(plugin_nodes)" = "$NODE $NODE_B " ]
[ "$failed" -eq 0 ] || exit 1

# --- each node its own driver, pool and labels ---------------------------------------------
csinode_keys() { "$KUBECTL" get csinode "$1" -o jsonpath="{.spec.drivers[?(@.name==\"$DRIVER\")].topologyKeys}"; }
node_label() { label_of "$1" "$DRIVER/$2"; }
registered() { [[ "$(csinode_keys "$1")" == *"$DRIVER/node"* ]]; }
for n in "$NODE" "$NODE_B"; do
  check "$n: the kubelet registered the driver (CSINode with topology keys)" wait_for 90 registered "$n"
  check "$n: its topology label names itself ($DRIVER/node=$n)" [ "$(node_label "$n" node)" = "$n" ]
  check "$n: no GDS readiness label (its own checks: no nvidia_fs here)" [ -z "$(node_label "$n" gds-nvme)" ]
  check "$n: its own node plugin's device plugin offers both resources (110 shares each)" \
    wait_for 60 eval '[ "$(resource_of "$n" "$DRIVER/gds")" = 110 ] && [ "$(resource_of "$n" "$DRIVER/gds-compat")" = 110 ]'
done
check "node A's CSIStorageCapacity is its own drive (the carving class, under 256 MiB)" \
  wait_for 90 eval '[ "$(capacity_of "$NODE" nvme-gds)" -gt 200 ] && [ "$(capacity_of "$NODE" nvme-gds)" -lt 256 ]'
check "node B's is its own (under 1024 MiB, over 900)" \
  wait_for 90 eval '[ "$(capacity_of "$NODE_B" nvme-gds)" -gt 900 ] && [ "$(capacity_of "$NODE_B" nvme-gds)" -lt 1024 ]'
# capacity_owners NODE: the owner kinds of NODE's CSIStorageCapacity objects, one a line.
capacity_owners() {
  "$KUBECTL" -n "$NS" get csistoragecapacities -l "csi.storage.k8s.io/managed-by=external-provisioner-$1" \
    -o jsonpath='{range .items[*]}{.metadata.ownerReferences[0].kind}{"\n"}{end}'
}
check "node A's CSIStorageCapacity objects are owned by its node plugin pod (they go with it)" \
  eval '[ -n "$(capacity_owners "$NODE")" ] && [ -z "$(capacity_owners "$NODE" | grep -vx Pod)" ]'

# --- pods -----------------------------------------------------------------------------------
pod() { claim_pod "$@"; }
pod_is() { [ "$(pod_phase "$1")" = "$2" ]; }
pod_node() { "$KUBECTL" get pod "$1" -o jsonpath='{.spec.nodeName}'; }
pv_node() {
  "$KUBECTL" get pv "$("$KUBECTL" get pvc "$1" -o jsonpath='{.spec.volumeName}')" \
    -o jsonpath='{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}'
}

# --- capacity decides the node --------------------------------------------------------------
pvc big nvme-gds 600Mi
pod big-user big 'echo on-b > /data/where && sync && sleep 3600'
check "a 600 MiB claim (only node B's drive holds it) binds" wait_for 120 is_bound big
check "its volume is node B's ($(pv_node big))" [ "$(pv_node big)" = "$NODE_B" ]
check "and its pod runs on node B" wait_for 90 eval '[ "$(pod_node big-user)" = "$NODE_B" ] && pod_is big-user Running'
pvc huge nvme-gds 4Gi
pod huge-user huge 'true'
no_storage() { events_of huge-user | grep -q 'FailedScheduling.*enough free storage'; }
check "a 4 GiB claim no node holds: its pod is unschedulable, the event naming the storage" wait_for 60 no_storage
check "and the claim stays Pending" [ "$(pvc_phase huge)" = Pending ]
events_of huge-user | tail -1 | cut -c1-200 | sed 's/^/     /'
"$KUBECTL" delete pod huge-user --wait=false >/dev/null
"$KUBECTL" delete pvc huge --wait=false >/dev/null

# --- a claim in use on node B is never mounted on node A ----------------------------------
pod big-on-a big 'cat /data/where' "$NODE"
affinity_conflict() { events_of big-on-a | grep -q "FailedScheduling.*didn't match PersistentVolume's node affinity"; }
check "a second pod asking for the claim on node A is not scheduled (volume node affinity)" \
  wait_for 60 affinity_conflict
check "it stays Pending" pod_is big-on-a Pending
big_pv=$("$KUBECTL" get pvc big -o jsonpath='{.spec.volumeName}')
mounts_of_big() { "$@" grep -c "$big_pv" /proc/self/mountinfo || true; }
check "nothing of the claim is mounted on node A" [ "$(mounts_of_big)" -eq 0 ]
check "on node B it is mounted (the pod's volume)" [ "$(mounts_of_big in_node_b)" -ge 1 ]
"$KUBECTL" delete pod big-on-a big-user --wait=false >/dev/null

# --- a raw block claim in use on node A is never mapped on node B --------------------------
"$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: raw, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  volumeMode: Block
  storageClassName: nvme-gds
  resources: {requests: {storage: 32Mi}}
YAML
# raw_pod NAME NODE SCRIPT: a pod on NODE with the claim as /dev/xvda (as root: the device
# node is root's).
raw_pod() {
  app_pod "$1" "$2" "$3" "volumeDevices: [{name: data, devicePath: /dev/xvda}]" \
    "volumes: [{name: data, persistentVolumeClaim: {claimName: raw}}]"
}
raw_pod raw-user "$NODE" 'dd if=/dev/urandom of=/dev/xvda bs=1M count=1 conv=fsync 2>/dev/null &&
  dd if=/dev/xvda bs=1M count=1 2>/dev/null | sha256sum | cut -d" " -f1 && sleep 3600'
raw_written() { pod_is raw-user Running && [ -n "$("$KUBECTL" logs raw-user 2>/dev/null)" ]; }
check "a raw block claim: a pod on node A writes 1 MiB to it" wait_for 120 raw_written
check "its volume is node A's" [ "$(pv_node raw)" = "$NODE" ]
raw_pod raw-on-b "$NODE_B" 'dd if=/dev/xvda bs=1M count=1 2>/dev/null | sha256sum'
raw_conflict() { events_of raw-on-b | grep -q "FailedScheduling.*didn't match PersistentVolume's node affinity"; }
check "a second pod asking for it on node B is not scheduled (volume node affinity)" wait_for 60 raw_conflict
check "it stays Pending" pod_is raw-on-b Pending
raw_pv=$("$KUBECTL" get pvc raw -o jsonpath='{.spec.volumeName}')
maps_of_raw() { "$@" grep -c "$raw_pv" /proc/self/mountinfo || true; }
check "nothing of the claim is mapped on node B" [ "$(maps_of_raw in_node_b)" -eq 0 ]
check "on node A it is (the pod's device)" [ "$(maps_of_raw)" -ge 1 ]
"$KUBECTL" delete pod raw-on-b raw-user --wait=false >/dev/null
"$KUBECTL" delete pvc raw --wait=false >/dev/null

# --- GDS readiness per node: pods asking for `gds` go where GDS works ----------------------
# Neither node can be GDS-ready for the chart's driver (no GPU, no nvidia_fs here): each
# node gets a second driver instance, with its device plugin, whose node checks read a
# fixture host tree of that node's own (tests/e2e/lib.sh), registered with that node's
# kubelet by a registrar running there.
R_DRIVER=readiness.gds-csi.test
R_GDS=$R_DRIVER/gds
# fixture_driver NODE: the instance and its registrar on NODE, nvidia_fs loaded there.
fixture_driver() {
  local host=$WORK/fixture-$1 socket=$KUBELET_DIR/plugins/$R_DRIVER/csi.sock run=()
  [ "$1" = "$NODE" ] || run=("${NODE_B_ENTER[@]}")
  gds_fixture_host "$host"
  gds_fixture_nvidia_fs "$host" load
  "${run[@]}" mkdir -p "$(dirname "$socket")"
  "${run[@]}" "$GDS_CSI" serve --mode node --endpoint "unix://$socket" --node-id "$1" --driver-name "$R_DRIVER" \
    --state-dir "$host/state" --allowed-path-root "$KUBELET_DIR" --log-format json \
    --host-proc "$host/proc" --host-sys "$host/sys" --host-dev "$host/dev" --cufile-json "$host/etc/cufile.json" \
    --udev-data-dir "$host/run/udev/data" --registration-socket "$KUBELET_DIR/plugins_registry/$R_DRIVER-reg.sock" \
    --readiness-interval 1s --gds-device-plugin 2>"$host/driver.log" &
  PIDS+=("$!")
  wait_for 30 "${run[@]}" test -S "$socket"
  "${run[@]}" "$CACHE_BIN/gds-csi-registrar" --csi-address "$socket" --kubelet-registration-path "$socket" \
    --plugin-registration-path "$KUBELET_DIR/plugins_registry" --http-endpoint 127.0.0.1:64455 \
    >"$host/registrar.log" 2>&1 &
  PIDS+=("$!")
}
gds_ready() {
  [ "$(label_of "$1" "$R_DRIVER/gds-nvme")" = true ] && [ "$(resource_of "$1" "$R_GDS" allocatable)" = 110 ]
}
for n in "$NODE" "$NODE_B"; do
  fixture_driver "$n"
  check "$n: GDS-ready by its own checks ($R_DRIVER/gds-nvme=true, 110 $R_GDS shares allocatable)" wait_for 90 gds_ready "$n"
done
gds_fixture_nvidia_fs "$WORK/fixture-$NODE" unload
check "nvidia_fs unloaded on node A: none of node A's $R_GDS shares is allocatable" \
  wait_for 60 eval '[ "$(resource_of "$NODE" "$R_GDS" allocatable)" = 0 ]'
check "node B's still are (its checks are its own)" gds_ready "$NODE_B"
# gds_pod NAME [NODE]: a pod asking for one share of $R_GDS, on NODE if given.
gds_pod() { app_pod "$1" "${2:-}" 'sleep 3600' "resources: {limits: {$R_GDS: 1}}"; }
gds_pod gds-any
check "a pod asking for $R_GDS runs on node B, the GDS-ready one" \
  wait_for 90 eval '[ "$(pod_node gds-any)" = "$NODE_B" ] && pod_is gds-any Running'
gds_pod gds-on-a "$NODE"
insufficient() { events_of gds-on-a | grep -q "FailedScheduling.*Insufficient $R_GDS"; }
check "one that must run on node A is not scheduled (Insufficient $R_GDS)" wait_for 60 insufficient
"$KUBECTL" delete pod gds-any gds-on-a --wait=false >/dev/null

# --- a snapshot on node A restored on node B -----------------------------------------------
pvc snap-src nvme-gds 64Mi
pod snap-writer snap-src 'head -c 4194304 /dev/urandom > /data/blob && sha256sum /data/blob | cut -d" " -f1 && sync' "$NODE"
check "a pod on node A writes 4 MiB of random bytes" wait_for 120 pod_is snap-writer Succeeded
sum=$("$KUBECTL" logs snap-writer 2>/dev/null)
check "its volume is node A's" [ "$(pv_node snap-src)" = "$NODE" ]
"$KUBECTL" delete pod snap-writer >/dev/null
"$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: snap, namespace: default}
spec:
  volumeSnapshotClassName: gds-csi-snapshots
  source: {persistentVolumeClaimName: snap-src}
YAML
# restored_claim NAME: a 64 MiB claim of the carving class restored from VolumeSnapshot snap.
restored_claim() {
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: nvme-gds
  resources: {requests: {storage: 64Mi}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: snap}
YAML
}
snap_ready() { [ "$("$KUBECTL" get volumesnapshot snap -o jsonpath='{.status.readyToUse}')" = true ]; }
check "the VolumeSnapshot is readyToUse (node A's csi-snapshotter and driver)" wait_for 120 snap_ready
restored_claim restored
pod restored-reader restored 'sha256sum /data/blob | cut -d" " -f1' "$NODE_B"
check "a pod on node B reads the restored claim" wait_for 180 pod_is restored-reader Succeeded
check "the restored volume is node B's ($(pv_node restored))" [ "$(pv_node restored)" = "$NODE_B" ]
check "with node A's bytes (SHA-256 $sum)" [ "$("$KUBECTL" logs restored-reader 2>/dev/null)" = "$sum" ]
"$KUBECTL" delete pod restored-reader --wait=false >/dev/null

# --- node A lost for real --------------------------------------------------------------------
# A Deployment's pod uses a claim restored from the snapshot, on node A (node B cordoned
# while it binds). Node A's kubelet stops and its Node object is deleted, as an operator
# does for a dead machine; the node-loss controller (action recreate, 20 s grace) deletes
# the claim and its PV and creates the claim again, which the provisioner fills from its
# dataSource on node B, where the Deployment's new pod runs.
"$KUBECTL" cordon "$NODE_B" >/dev/null
restored_claim precious
"$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: trainer, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: trainer}}
  template:
    metadata: {labels: {app: trainer}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 1
      securityContext: {runAsUser: 1000, runAsGroup: 1000, fsGroup: 2000}
      containers:
      - name: app
        image: $APP_IMAGE
        imagePullPolicy: Never
        command: [sh, -c, 'sha256sum /data/blob | cut -d" " -f1; sleep 3600']
        volumeMounts: [{name: data, mountPath: /data}]
      volumes: [{name: data, persistentVolumeClaim: {claimName: precious}}]
YAML
trainer_on() {
  local p
  p=$("$KUBECTL" get pods -l app=trainer -o jsonpath="{.items[?(@.status.phase==\"Running\")].metadata.name}")
  [ -n "$p" ] && [ "$(pod_node "$p")" = "$1" ] && [ "$("$KUBECTL" logs "$p" 2>/dev/null)" = "$sum" ]
}
check "the trainer runs on node A with the snapshot's bytes" wait_for 180 trainer_on "$NODE"
check "its claim is node A's" [ "$(pv_node precious)" = "$NODE" ]
old_pv=$("$KUBECTL" get pvc precious -o jsonpath='{.spec.volumeName}')
"$KUBECTL" uncordon "$NODE_B" >/dev/null
kill "$KUBELET_PID"; wait "$KUBELET_PID" || true
"$KUBECTL" delete node "$NODE" >/dev/null
check "with node A gone, the claim is re-created and bound again, on node B" \
  wait_for 240 eval '[ "$(pv_node precious)" = "$NODE_B" ]'
check "its old PV is not the new one" [ "$("$KUBECTL" get pvc precious -o jsonpath='{.spec.volumeName}')" != "$old_pv" ]
check "the trainer's new pod runs on node B with the snapshot's bytes" wait_for 180 trainer_on "$NODE_B"
# The pod garbage collector removes a deleted node's pods, the garbage collector their
# objects: no capacity is left offered on a node no provisioner serves.
check "node A's CSIStorageCapacity objects are gone with its node plugin pod" \
  wait_for 180 eval '[ -z "$(capacity_owners "$NODE")" ]'
recreated() { "$KUBECTL" get events -n default --field-selector involvedObject.name=precious -o jsonpath='{.items[*].reason}'; }
echo "     events of the claim: $(recreated)"
# Node A returns after a reboot: its containers and mounts are gone (its drives and the
# driver's state directory are not); its kubelet registers it again, and its provisioner
# deletes the old volume.
reboot_node_a() {
  local task
  for task in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks kill --signal SIGKILL "$task" >/dev/null 2>&1; done
  awk -v d="$KUBELET_DIR/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r | xargs -r umount -l
}
reboot_node_a
start_kubelet
check "node A returns (its kubelet registers it again)" wait_for 120 node_ready
check "and its new node plugin pod publishes node A's capacity again" \
  wait_for 120 eval '[ -n "$(capacity_owners "$NODE")" ]'
old_pv_gone() { ! "$KUBECTL" get pv "$old_pv" >/dev/null 2>&1; }
check "the lost node's old volume is deleted once it is back" wait_for 180 old_pv_gone
old_pv_gone || "$KUBECTL" get pv "$old_pv" -o jsonpath='{.metadata.finalizers} {.status.phase}{"\n"}' | sed 's/^/     /'
"$KUBECTL" delete deployment trainer --wait=false >/dev/null

echo "two nodes: $passed passed, $failed failed ($((SECONDS - start)) s)"
[ "$failed" -eq 0 ]
