#!/usr/bin/env bash
# End to end, stage two: a real kubelet with containerd and runc (Debian's packages) and
# kube-proxy on this machine, registered with the real control plane, so pods really run
# and the kubelet itself drives NodeStage/NodePublish through its plugin watcher.
# The rig (images built here, containerd, control plane, kubelet) is tests/e2e/kubelet-rig.sh.
#
# usage: kubelet.sh [chart|processes]
#   chart (default)  `helm install` of deploy/helm/gds-csi: the node DaemonSet runs the
#                    driver, the external-provisioner, the resizer, the csi-snapshotter, the
#                    registrar and the liveness probe as pods (and the snapshot-controller),
#                    with the chart's privileges, mounts and probes.
#   processes        the same parts as host processes, for debugging the driver alone.
#
# Scenario: a class with gdsPolicy=required is refused on this GPU-less node with an
# event that names the failed GDS checks; with gdsPolicy=preferred a pod writes a file,
# survives a SIGKILL of the driver, is deleted (unpublish + unstage); (chart) the chart is
# uninstalled and installed again with the claim bound; a second pod on the same node
# reads the file back from the same filesystem; deleting the claim returns the device.
# Expansion: a carved claim grows while a pod uses it (the resizer's ControllerExpandVolume
# grows the partition, the kubelet's NodeExpandVolume the mounted ext4), with a second
# driver and resizer on another node id beside it, as every other node of a cluster runs.
# Snapshots (chart): a VolumeSnapshot of a written claim (the chart's snapshot-controller and
# this node's csi-snapshotter), the claim and its volume deleted, the snapshot restored by the
# driver of that other node id, which shares only the store directory, and compared byte for
# byte (SHA-256); then restored again as a claim on this node.
# GPU workloads without privileged mode: the driver's device plugin registers
# <driver>/gds and <driver>/gds-compat with the kubelet; pods under the baseline Pod Security
# level that ask for one see, from inside, the udev database read-only with their volume's
# entry, a cufile.json with compat mode as the resource says, and no device of the host's
# /dev but its nvidia-fs nodes (none here); a restarted kubelet gets them registered again.
set -euo pipefail
DEPLOY=${1:-chart}
case $DEPLOY in chart | processes) ;; *) echo "usage: $0 [chart|processes]" >&2; exit 2 ;; esac
# shellcheck source=tests/e2e/kubelet-rig.sh
. "$(cd "$(dirname "$0")" && pwd)/kubelet-rig.sh"

# --- the driver: the chart's DaemonSet, or the same parts as host processes ----------------
MiB=$((1024 * 1024))
# Sparse; 512 MiB each leaves room for the xfs claim of the expansion check (mkfs.xfs wants 300 MiB).
DEVICES=("$(make_loop "$WORK/dev1.img" $((512 * MiB)))" "$(make_loop "$WORK/dev2.img" $((512 * MiB)))")
SOCKET="$KUBELET_DIR/plugins/$DRIVER/csi.sock"
SNAPSHOT_STORE=$WORK/snapshot-store
# The node's cufile.json, as NVIDIA writes it (comments, compat mode allowed): the driver's
# checks read it, and the device plugin hands pods a copy with compat mode per resource.
NODE_CUFILE=$WORK/cufile.json
cat >"$NODE_CUFILE" <<'JSON'
{
    // the node's own settings
    "logging": { "level": "ERROR" },
    "properties": {
        "max_direct_io_size_kb": 8192,
        /* allow compat mode, this will enable use of cuFile posix read/writes */
        "allow_compat_mode": true
    }
}
JSON
if [ "$DEPLOY" = chart ]; then
  rig_chart_values "${DEVICES[@]}"
  helm_set+=(--set sidecars.provisioner.capacityPollInterval=5s
    # NFS enabled, as a cluster with both backends runs it: the node pods join the host
    # network and the chart adds the NFS class (Immediate binding). The server is a
    # TEST-NET address: this kernel has no NFS client, so an NFS CreateVolume can only
    # get as far as the mount, which is what shows where the claim went.
    --set nfs.enabled=true --set nfs.server=192.0.2.1 --set nfs.share=/export/gds
    --set sidecars.provisioner.nodeDeploymentBaseDelay=1s --set mountTimeout=20s
    # Snapshots on, with a store directory on this host: the chart mounts it into the
    # driver container at the same path, and the other node id's driver below sees it too.
    --set snapshots.enabled=true --set snapshots.class.storeDir="$SNAPSHOT_STORE"
    --set cufile.mount=true --set cufile.hostPath="$NODE_CUFILE")
  check "helm install of the chart" "$HELM" install gds-csi "$E2E_DIR/../../deploy/helm/gds-csi" \
    --namespace "$NS" --create-namespace "${helm_set[@]}"
  check "the node DaemonSet rolls out (every container ready, probes passing)" \
    "$KUBECTL" -n "$NS" rollout status ds/gds-csi-node --timeout 180s
  check "the snapshot-controller Deployment rolls out" \
    "$KUBECTL" -n "$NS" rollout status deploy/gds-csi-snapshot-controller --timeout 120s
  # The csi-snapshotter exits unless the driver offers CREATE_DELETE_SNAPSHOT (external-snapshotter
  # v8.7.0 cmd/csi-snapshotter/main.go:234-242) and then logs this as it starts its controller
  # (pkg/sidecar-controller/snapshot_controller_base.go:175); a rollout does not wait for that.
  snapshotter_started() {
    "$KUBECTL" -n "$NS" logs ds/gds-csi-node -c csi-snapshotter 2>/dev/null | grep -q 'Starting CSI snapshotter'
  }
  check "the csi-snapshotter sidecar found the driver's snapshot capability and started" wait_for 60 snapshotter_started
  [ "$failed" -eq 0 ] || exit 1
  plugin_pod() { "$KUBECTL" -n "$NS" get pods -l app.kubernetes.io/component=node -o jsonpath='{.items[0].metadata.name}'; }
  # What Prometheus (the chart's scrape annotations) and the kubelet's liveness probe reach.
  pod_ip=$("$KUBECTL" -n "$NS" get pod "$(plugin_pod)" -o jsonpath='{.status.podIP}')
  metrics=$(curl -fsS --max-time 10 "http://$pod_ip:9809/metrics" || true)
  check "the driver's metrics answer on the pod's metrics port (pool of 2 devices)" \
    grep -qx 'gds_csi_pool_devices{state="total"} 2' <<<"$metrics"
  check "the livenessprobe sidecar's /healthz answers ok (CSI Probe)" \
    [ "$(curl -fsS --max-time 10 "http://$pod_ip:9818/healthz")" = ok ]
  REGISTRAR_HEALTH=$pod_ip:9821
  # The node check deploy/README.md tells operators to run (kubectl exec: API server ->
  # kubelet -> containerd's streaming server).
  # Exit status 1 is "not GDS-ready"; kubectl exec passes it on and says so on stderr (a
  # failure of kubectl itself would also exit 1, but without that line or the report).
  doctor_rc=0
  doctor=$("$KUBECTL" -n "$NS" exec ds/gds-csi-node -c gds-csi -- gds-csi doctor 2>&1) || doctor_rc=$?
  echo "$doctor" | head -3 | sed 's/^/     /'
  doctor_not_ready() {
    [ "$doctor_rc" -eq 1 ] && grep -q "NOT GDS-ready" <<<"$doctor" &&
      grep -q "command terminated with exit code 1" <<<"$doctor"
  }
  check "gds-csi doctor runs in the driver container, finds this node not GDS-ready and exits 1 (got $doctor_rc)" \
    doctor_not_ready
  doctor_json_rc=0
  doctor_json=$("$KUBECTL" -n "$NS" exec ds/gds-csi-node -c gds-csi -- gds-csi doctor --json 2>/dev/null) ||
    doctor_json_rc=$?
  doctor_json_not_ready() {
    [ "$doctor_json_rc" -eq 1 ] && python3 -c '
import json, sys
d = json.loads(sys.argv[1])
assert d["ready"] is False and d["backend"] == "nvme" and any(f.startswith("nvidia_fs.module") for f in d["failed"]), d
' "$doctor_json"
  }
  check "gds-csi doctor --json says ready: false, names nvidia_fs.module and exits 1 (got $doctor_json_rc)" \
    doctor_json_not_ready
  # Which of the probe's pod pieces are missing here: the image brings libcufile (as the
  # Dockerfile's does) and the chart the node's cufile.json (cufile.mount), while this node
  # has no NVIDIA runtime (no libcuda, no /dev/nvidia*) and runs no udev (empty /run/udev).
  pod_pieces_named() {
    local note
    note=$(grep -m1 'missing:' <<<"$doctor") &&
      [[ "$note" == *"libcuda.so.1"* && "$note" == *"/dev/nvidiactl"* && "$note" == *"udev database"* &&
        "$note" != *"cufile.json"* && "$note" != *"libcufile.so.0"* ]] &&
      "$KUBECTL" -n "$NS" exec ds/gds-csi-node -c gds-csi -- test -f /usr/local/lib/gds-csi/libcufile.so.0
  }
  check "doctor in the pod names the missing pieces (libcuda, /dev/nvidia*, udev), not libcufile (in the image) or cufile.json (mounted)" \
    pod_pieces_named
  driver_log() { cat "$WORK"/pod-logs/"${NS}"_gds-csi-node-*/gds-csi/*.log; }
  # A container of the node pod, by the id containerd knows its task by: signals go to
  # this run's own containers only, never to a same-named process of another run here.
  container_id() {
    "$KUBECTL" -n "$NS" get pod "$(plugin_pod)" \
      -o jsonpath="{.status.containerStatuses[?(@.name==\"$1\")].containerID}" |
      sed 's|^containerd://||'
  }
  container_pid() {
    local id
    id=$(container_id "$1")
    [ -n "$id" ] && "${CTR[@]}" tasks ls | awk -v id="$id" '$1 == id { print $2 }'
  }
  # The node pod's resizer (the stand-in at /csi-resizer in its image), as the host sees it.
  owner_resizer() { container_pid csi-resizer; }
  plugin_back() {
    [ "$("$KUBECTL" -n "$NS" get pod "$(plugin_pod)" \
      -o jsonpath='{.status.containerStatuses[?(@.name=="gds-csi")].restartCount}')" -ge 1 ] &&
      "$KUBECTL" -n "$NS" rollout status ds/gds-csi-node --timeout 5s
  }
  # SIGKILL the driver container's main process, as the host sees it; the kubelet
  # restarts it, and the provisioner container, which exits when it loses the socket.
  restart_plugin() {
    "${CTR[@]}" tasks kill --signal SIGKILL "$(container_id gds-csi)" && wait_for 120 plugin_back
  }
else
  apply_chart
  mkdir -p "$KUBELET_DIR/plugins/$DRIVER" "$KUBELET_DIR/plugins_registry"
  start_plugin() { # appends to driver.log, so a restarted plugin's calls count too
    "$GDS_CSI" serve --mode all --endpoint "unix://$SOCKET" --node-id "$NODE" --driver-name "$DRIVER" \
      --state-dir "$WORK/driver-state" --allowed-path-root "$KUBELET_DIR" --log-format json \
      --pool-device "${DEVICES[0]}" --pool-device "${DEVICES[1]}" --cufile-json "$NODE_CUFILE" \
      --gds-device-plugin 2>>"$WORK/driver.log" &
    PLUGIN_PID=$!
    PIDS+=("$PLUGIN_PID")
    wait_for_socket "$SOCKET"
  }
  start_plugin
  "$CACHE_BIN/gds-csi-registrar" --csi-address "$SOCKET" --kubelet-registration-path "$SOCKET" \
    --plugin-registration-path "$KUBELET_DIR/plugins_registry" --http-endpoint 127.0.0.1:64454 \
    >"$WORK/registrar.log" 2>&1 &
  REGISTRAR_HEALTH=127.0.0.1:64454
  PIDS+=($!)
  start_provisioner "$NODE" "$SOCKET" "$WORK/provisioner.log"
  PROVISIONER_PID=$!
  "$CACHE_BIN/gds-csi-resizer" --csi-address "$SOCKET" --kubeconfig "$WORK/sa.kubeconfig" >"$WORK/resizer.log" 2>&1 &
  OWNER_RESIZER=$!
  PIDS+=("$OWNER_RESIZER")
  owner_resizer() { echo "$OWNER_RESIZER"; }
  driver_log() { cat "$WORK/driver.log"; }
  restart_plugin() {
    kill -KILL "$PLUGIN_PID"
    wait "$PLUGIN_PID" 2>/dev/null || true
    start_plugin
    # The provisioner exits when it loses the plugin's socket; in the DaemonSet the kubelet
    # restarts that container, here the test does.
    kill "$PROVISIONER_PID" 2>/dev/null || true
    wait "$PROVISIONER_PID" 2>/dev/null || true
    start_provisioner "$NODE" "$SOCKET" "$WORK/provisioner.log"
    PROVISIONER_PID=$!
  }
fi
# The chart's class with gdsPolicy=preferred: this machine has no GPU, so a required
# class can never publish here; preferred publishes in compat mode and says so.
"$KUBECTL" get storageclass nvme-gds -o json | python3 -c '
import json, sys
sc = json.load(sys.stdin)
sc["metadata"] = {"name": "nvme-gds-preferred"}
sc["parameters"]["gdsPolicy"] = "preferred"
print(json.dumps(sc))' | "$KUBECTL" apply -f - >/dev/null

csinode_keys() { "$KUBECTL" get csinode "$NODE" -o jsonpath="{.spec.drivers[?(@.name==\"$DRIVER\")].topologyKeys}"; }
csinode_driver() { [[ "$(csinode_keys)" == *"$DRIVER/node"* ]]; }
check "the kubelet's plugin watcher registered the driver (CSINode with topology keys)" wait_for 60 csinode_driver
# What the registrar container's liveness probe reads (--http-endpoint; 200 while its
# registration socket answers GetInfo).
check "the registrar's /healthz answers 200 ($REGISTRAR_HEALTH)" \
  curl -fsS --max-time 10 -o /dev/null "http://$REGISTRAR_HEALTH/healthz"
node_label() { label_of "$NODE" "$DRIVER/$1"; }
check "the kubelet labelled the node from NodeGetInfo ($DRIVER/node=$NODE)" [ "$(node_label node)" = "$NODE" ]
# Not ready is no label at all: a "false" label could never become "true" (the kubelet
# refuses to change a topology label's value).
check "the node has no GDS label here (no $DRIVER/gds-nvme: not ready)" [ -z "$(node_label gds-nvme)" ]
if [ "$DEPLOY" = chart ]; then
  # The chart's --registration-socket names the registrar's socket as the driver container
  # sees it (through its kubelet-dir mount): what its readiness watcher relinks.
  reg_socket_seen() {
    "$KUBECTL" -n "$NS" exec ds/gds-csi-node -c gds-csi -- test -S "$KUBELET_DIR/plugins_registry/$DRIVER-reg.sock"
  }
  check "the driver container sees the registrar's socket at its --registration-socket path" reg_socket_seen
fi
check "CSIStorageCapacity shows the node's pool (1024 MiB)" wait_for 60 has_capacity "$NODE" 1024
# What the carving class (nvme-gds, layout partition) offers on blank devices: the same
# figure must come back once its claims are deleted (a GPT label stays, its space is free).
part_published() { [ "$(capacity_of "$NODE" nvme-gds)" -gt 0 ]; }
check "CSIStorageCapacity shows the carving class too" wait_for 60 part_published
part_capacity=$(capacity_of "$NODE" nvme-gds)
echo "node and driver ready in $((SECONDS - start)) s"

# pod NAME CLAIM SCRIPT: claim_pod (tests/e2e/lib.sh) on $NODE.
pod() { claim_pod "$1" "$2" "$3" "$NODE"; }
pod_succeeded() { [ "$(pod_phase "$1")" = Succeeded ]; }
pod_gone() { ! "$KUBECTL" get pod "$1" >/dev/null 2>&1; }
# called METHOD...: each METHOD succeeded at least once (the driver logs JSON, as in the chart).
called() {
  local m
  # One grep over a captured log: grep -q in a pipeline would end it early, and under
  # pipefail the writer's SIGPIPE would read as "not found".
  local log m
  log=$(driver_log)
  for m in "$@"; do grep -q "\"message\":\"call\",\"method\":\"$m\"" <<<"$log" || return 1; done
}
# Mount points, as the host sees them, of this driver's volumes: staged (the kubelet's
# globalmount) and published (a pod's kubernetes.io~csi volume directory).
staged_mounts() {
  awk -v d="$KUBELET_DIR/plugins/kubernetes.io/csi/$DRIVER/" 'index($5, d) == 1' /proc/self/mountinfo | wc -l
}
published_mounts() {
  awk -v d="$KUBELET_DIR/pods/" 'index($5, d) == 1 && $5 ~ /\/volumes\/kubernetes.io~csi\//' /proc/self/mountinfo | wc -l
}

if [ "$DEPLOY" = chart ]; then
  # --- NFS enabled: each backend's claims reach only the provisioner meant for them ---
  # (issue 16 item 4). The chart runs no central provisioner, which would act on every
  # claim of the driver, NVMe ones included.
  # The one Deployment is the snapshot-controller (snapshots.enabled), which provisions nothing.
  no_central() {
    [ "$("$KUBECTL" -n "$NS" get deployments,statefulsets \
      -o jsonpath='{range .items[*]}{.metadata.name}={.spec.template.spec.containers[*].name};{end}')" = \
      "gds-csi-snapshot-controller=snapshot-controller;" ]
  }
  check "nfs.enabled: no central provisioner workload, only the node DaemonSet (and the snapshot-controller)" no_central
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: shared, namespace: default}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: nfs-rdma-gds
  resources: {requests: {storage: 1Gi}}
YAML
  selected_node() { "$KUBECTL" get pvc "$1" -o jsonpath='{.metadata.annotations.volume\.kubernetes\.io/selected-node}'; }
  nfs_taken() { [ "$(selected_node shared)" = "$NODE" ]; }
  check "an NFS claim (Immediate) is taken by the node's own provisioner (selected-node=$NODE)" wait_for 60 nfs_taken
  # No NVMe claim exists yet: any CreateVolume in the driver's log is this claim's.
  nfs_create_tried() {
    local log
    log=$(driver_log)
    grep -q '"method":"CreateVolume"' <<<"$log" && [[ "$(events_of shared)" == *ProvisioningFailed*"rpc error"* ]]
  }
  check "its CreateVolume reached this node's driver, which got as far as mounting the share (no NFS client here)" \
    wait_for 90 nfs_create_tried
  events_of shared | grep ProvisioningFailed | head -1 | cut -c1-300 | sed 's/^/     /'
  "$KUBECTL" delete pvc shared --wait=false >/dev/null
fi

# --- gdsPolicy=required on a node without GDS: refused, with the reason -----------------
pvc gated nvme-gds 32Mi
pod gated gated 'true'
refused() { [[ "$(events_of gated)" =~ FailedMount.*FailedPrecondition.*nvidia_fs\.module ]]; }
check "gdsPolicy=required: the kubelet reports FailedMount naming the failed GDS check" wait_for 120 refused
events_of gated | grep FailedMount | head -1 | cut -c1-400 | sed 's/^/     /'
check "the refused pod never started" [ "$(pod_phase gated)" = Pending ]
# NodeStage succeeded before the gate refused NodePublish: the volume is staged, not published.
staged_only() { [ "$(staged_mounts)" -eq 1 ] && [ "$(published_mounts)" -eq 0 ]; }
check "the refused pod's volume is staged, not published" staged_only
"$KUBECTL" delete pod gated --wait=false >/dev/null
check "the refused pod is deleted" wait_for 90 pod_gone gated
gated_unstaged() { [ "$(staged_mounts)" -eq 0 ] && called NodeUnstageVolume; }
check "deleting the refused pod unstages its volume (NodeUnstageVolume ran, no staging mount left)" \
  wait_for 60 gated_unstaged
"$KUBECTL" delete pvc gated --wait=false >/dev/null

# --- gdsPolicy=preferred: write, delete the pod, read back from a new pod ----------------
TOKEN=$(random_token)
pvc data nvme-gds-preferred 32Mi
# The writer stays running after writing, so its mounts can be looked at.
pod writer data "echo $TOKEN > /data/token && sync && cat /data/token && exec sleep 3600"
logs_are() { [ "$("$KUBECTL" logs "$1" 2>&1)" = "$2" ]; }
check "writer pod (uid 1000, fsGroup 2000) runs on $NODE and wrote its token (kubectl logs)" wait_for 120 logs_are writer "$TOKEN"
if ! logs_are writer "$TOKEN"; then "$KUBECTL" describe pod writer | tail -20; "$KUBECTL" logs writer; exit 1; fi
pv=$("$KUBECTL" get pvc data -o jsonpath='{.spec.volumeName}')
# With NFS enabled too, the NVMe claim went to its selected node's provisioner only: it
# was never refused as exhausted and handed back to the scheduler (what a central NFS
# provisioner answering NVMe claims caused).
never_bounced() { ! events_of data | grep -q 'ResourceExhausted\|ProvisioningFailed'; }
check "the NVMe claim was provisioned at the first try (no ProvisioningFailed, no ResourceExhausted)" never_bounced
check "the kubelet called NodeStageVolume and NodePublishVolume" called NodeStageVolume NodePublishVolume
check "the volume is mounted at the kubelet's staging path" [ "$(staged_mounts)" -ge 1 ]
check "and bind-mounted into the writer pod's volume directory" [ "$(published_mounts)" -ge 1 ]
# The filesystem's identity, to tell a kept filesystem from a second mkfs later on.
data_dev=$(awk -v d="$KUBELET_DIR/plugins/kubernetes.io/csi/$DRIVER/" 'index($5, d) == 1 {print $(NF - 1); exit}' /proc/self/mountinfo)
superblock() { dumpe2fs -h "$data_dev" 2>/dev/null | grep -E '^Filesystem (UUID|created):'; }
first_superblock=$(superblock)
# nvme-gds carves: the filesystem is on a partition (<pool device>p<N>) of a pool device.
in_pool() {
  [ -n "$first_superblock" ] || return 1
  local d
  for d in "${DEVICES[@]}"; do [[ "$data_dev" =~ ^${d}p[0-9]+$ ]] && return 0; done
  return 1
}
check "the staged filesystem is ext4 on a partition of one of the pool's devices ($data_dev)" in_pool
# Published in compat mode (no GPU here): the gate's mark, which NodeGetVolumeStats reports,
# is kept in the state dir, so the restarted plugin below still has it.
handle=$("$KUBECTL" get pv "$pv" -o jsonpath='{.spec.csi.volumeHandle}')
compat_marked() {
  python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if "compat mode" in d["volumes"].get(sys.argv[2], "") else 1)' "$WORK/driver-state/gds-compat.json" "$handle"
}
check "the gate's compat mark for $handle is in <state-dir>/gds-compat.json" compat_marked

# A DaemonSet rollout or a crash: the plugin dies while the volume is in use. The pod
# keeps its mount, and the new process must still unpublish and unstage it.
if [ "$DEPLOY" = chart ]; then
  restarts() { "$KUBECTL" -n "$NS" get pods -o jsonpath='{range .items[*].status.containerStatuses[*]}{.restartCount}{"\n"}{end}' | paste -sd+ | bc; }
  check "no node plugin container restarted so far (liveness probes pass)" [ "$(restarts)" -eq 0 ]
fi
check "the driver comes back after a SIGKILL while the volume is in use" restart_plugin
still_running() {
  [ "$("$KUBECTL" get pod writer -o jsonpath='{.status.phase}/{.status.containerStatuses[0].restartCount}')" = Running/0 ] &&
    [ "$(published_mounts)" -ge 1 ]
}
check "the writer keeps running, mounts intact, across a SIGKILL and restart of the plugin" still_running
check "the compat mark survives the SIGKILL and restart" compat_marked

"$KUBECTL" delete pod writer --wait=false >/dev/null
unstaged() {
  [ "$(staged_mounts)" -eq 0 ] && [ "$(published_mounts)" -eq 0 ]
}
check "deleting the writer pod unpublishes and unstages (no mounts left)" wait_for 60 unstaged
check "the kubelet called NodeUnpublishVolume and NodeUnstageVolume" called NodeUnpublishVolume NodeUnstageVolume

if [ "$DEPLOY" = chart ]; then
  # Uninstall and reinstall while a claim is bound (a botched upgrade, a migration): the
  # claim, its PV and the data on the device must survive; the node state is on the host.
  check "helm uninstall with a claim still bound" "$HELM" uninstall gds-csi -n "$NS" --wait --timeout 120s
  no_capacity_objects() { [ -z "$("$KUBECTL" -n "$NS" get csistoragecapacities -o name)" ]; }
  check "the DaemonSet's CSIStorageCapacity objects are garbage-collected with it" wait_for 60 no_capacity_objects
  # With no driver left, spec.drivers is gone and a jsonpath filter errors instead of
  # printing nothing: read the list from JSON.
  csinode_drivers() {
    "$KUBECTL" get csinode "$NODE" -o json |
      python3 -c 'import json, sys; print(" ".join(d["name"] for d in json.load(sys.stdin)["spec"].get("drivers") or []))'
  }
  driver_gone() { local names; names=$(csinode_drivers) && [[ " $names " != *" $DRIVER "* ]]; }
  check "the kubelet deregistered the driver (CSINode lists no driver)" wait_for 60 driver_gone
  check "the claim is still Bound" is_bound data
  check "helm install again" "$HELM" install gds-csi "$E2E_DIR/../../deploy/helm/gds-csi" --namespace "$NS" "${helm_set[@]}"
  check "the node DaemonSet rolls out again" "$KUBECTL" -n "$NS" rollout status ds/gds-csi-node --timeout 180s
  check "the reinstalled driver registers again" wait_for 60 csinode_driver
fi

pod reader data "cat /data/token && grep -qx $TOKEN /data/token"
check "a new pod on the same node reads the file back" wait_for 120 pod_succeeded reader
check "kubectl logs shows the reader read the writer's token" logs_are reader "$TOKEN"
check "the same filesystem, not a new mkfs (superblock UUID and creation time unchanged)" \
  [ "$(superblock)" = "$first_superblock" ]

# --- a clone (issue 15): a claim whose dataSource is `data` holds the writer's file -------
# A clone is copied only from a source nothing has staged (src/volume/block/clone/): the reader
# is deleted first and its volume unstaged.
"$KUBECTL" delete pod reader >/dev/null
check "the reader's volume is unstaged" wait_for 60 unstaged
pvc data-clone nvme-gds-preferred 32Mi data
pod clone-reader data-clone "cat /data/token && grep -qx $TOKEN /data/token && busybox stat -c \"%u %g\" /data/token"
check "the clone claim (dataSource: PersistentVolumeClaim data) is Bound" wait_for 120 is_bound data-clone
clone_pv=$("$KUBECTL" get pvc data-clone -o jsonpath='{.spec.volumeName}')
clone_node=$("$KUBECTL" get pv "$clone_pv" -o jsonpath='{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}')
check "the clone's PV has the source's node affinity ($NODE)" [ "$clone_node" = "$NODE" ]
check "a pod on the clone reads the writer's token (the kubelet's NodeStage filled it)" wait_for 180 pod_succeeded clone-reader
if ! pod_succeeded clone-reader; then events_of clone-reader | tail -5; fi
clone_logs() { "$KUBECTL" logs clone-reader 2>&1; }
check "kubectl logs shows the token read from the clone" [ "$(clone_logs | head -1)" = "$TOKEN" ]
# Owner as the writer left it (uid 1000; the group is the pod's fsGroup, 2000).
owner_kept() { [ "$(clone_logs | tail -1)" = "1000 2000" ]; }
check "the copy keeps the file's owner (uid 1000, gid 2000)" owner_kept
"$KUBECTL" delete pod clone-reader >/dev/null
"$KUBECTL" delete pvc data-clone --wait=false >/dev/null
clone_pv_gone() { ! "$KUBECTL" get pv "$clone_pv" >/dev/null 2>&1; }
check "the clone's PV is deleted after its claim" wait_for 60 clone_pv_gone

# --- delete: the device returns to the pool ---------------------------------------------
"$KUBECTL" delete pvc data --wait=false >/dev/null
pv_gone() { ! "$KUBECTL" get pv "$pv" >/dev/null 2>&1; }
check "PV deleted after the claim" wait_for 60 pv_gone
check "no mounts left under the kubelet directory" wait_for 30 unstaged
check "the carving class's capacity is back to ${part_capacity} MiB" wait_for 60 has_capacity "$NODE" "$part_capacity" nvme-gds

# --- snapshots: taken on the claim's node, restored on another node id --------------------
# (chart mode; called below while the other node id's driver runs.) A pod writes 4 MiB of
# random bytes and their SHA-256; a VolumeSnapshot of the claim must reach readyToUse
# through the snapshot-controller (distributed: it labels the content with the volume's
# node) and this node's csi-snapshotter sidecar (--node-deployment); the claim and its
# volume are deleted, and the driver of another node id, which shares only the store
# directory, restores the snapshot (CreateVolume from it, NodeStage fills it, NodePublish)
# through the CSI client (tests/e2e/tools/snapshotter/csiclient): the bytes must match.
# Then a claim with the snapshot as its dataSource is restored on this node through the
# provisioner, and deleting the VolumeSnapshot (deletionPolicy Delete) empties the store.
snapshot_and_restore() {
  local snap_start=$SECONDS
  pvc snap-src nvme-gds-preferred 64Mi
  pod snap-writer snap-src 'head -c 4194304 /dev/urandom > /data/blob && sha256sum /data/blob | cut -d" " -f1 | tee /data/blob.sha256 && sync'
  check "a pod writes 4 MiB of random bytes into a claim (snap-src) and their SHA-256" wait_for 120 pod_succeeded snap-writer
  local sum
  sum=$("$KUBECTL" logs snap-writer 2>/dev/null)
  check "the writer printed a SHA-256 ($sum)" [ "${#sum}" -eq 64 ]
  local src_pv
  src_pv=$("$KUBECTL" get pvc snap-src -o jsonpath='{.spec.volumeName}')
  "$KUBECTL" delete pod snap-writer >/dev/null
  check "the writer's volume is unstaged" wait_for 60 unstaged
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: snap, namespace: default}
spec:
  volumeSnapshotClassName: gds-csi-snapshots
  source: {persistentVolumeClaimName: snap-src}
YAML
  snap_ready() { [ "$("$KUBECTL" get volumesnapshot snap -o jsonpath='{.status.readyToUse}')" = true ]; }
  check "the VolumeSnapshot is readyToUse" wait_for 120 snap_ready
  "$KUBECTL" get volumesnapshot snap -o jsonpath='{.status}' | cut -c1-300 | sed 's/^/     /'; echo
  local content snap_id
  content=$("$KUBECTL" get volumesnapshot snap -o jsonpath='{.status.boundVolumeSnapshotContentName}')
  snap_id=$("$KUBECTL" get volumesnapshotcontent "$content" -o jsonpath='{.status.snapshotHandle}')
  # The label the node's sidecar selects by (external-snapshotter v8.7.0
  # pkg/common-controller/snapshot_controller.go:762-772, cmd/csi-snapshotter/main.go:156-163).
  check "the snapshot-controller labelled its content managed-by=$NODE (the volume's node)" \
    [ "$("$KUBECTL" get volumesnapshotcontent "$content" -o jsonpath='{.metadata.labels.snapshot\.storage\.kubernetes\.io/managed-by}')" = "$NODE" ]
  check "this node's driver took it (CreateSnapshot), into the store directory ($snap_id)" \
    eval 'called CreateSnapshot && [[ "$snap_id" == snap:dir:* ]] && [ -n "$(find "$SNAPSHOT_STORE" -type f)" ]'
  check "its restore size is the claim's 64Mi" \
    [ "$("$KUBECTL" get volumesnapshot snap -o jsonpath='{.status.restoreSize}')" = 64Mi ]
  echo "     snapshot ready $((SECONDS - snap_start)) s after the claim was made"

  # The claim and its volume go: the partition returns to the pool.
  "$KUBECTL" delete pvc snap-src --wait=false >/dev/null
  src_pv_gone() { ! "$KUBECTL" get pv "$src_pv" >/dev/null 2>&1; }
  check "the source claim's PV is deleted (DeleteVolume)" wait_for 60 src_pv_gone
  check "its space is free again: the carving class's capacity is ${part_capacity} MiB" \
    wait_for 60 has_capacity "$NODE" "$part_capacity" nvme-gds
  check "the snapshot outlives its source: still readyToUse" snap_ready

  # Another node: the driver of node id other-node (its own pool device, its own state),
  # asked as that node's provisioner and kubelet would ask it.
  local listed
  listed=$("$CACHE_BIN/gds-csi-csiclient" "$OTHER/csi.sock" list-snapshot "$snap_id" 2>&1) || true
  check "the other node's driver finds the snapshot by its id (ListSnapshots: $listed)" \
    eval '[[ "$listed" == "$snap_id "*" true" ]]'
  mkdir -p "$OTHER/staging/restored" "$OTHER/pods/restored"
  local restored_id restore_start=$SECONDS
  restored_id=$("$CACHE_BIN/gds-csi-csiclient" "$OTHER/csi.sock" restore snap-restored $((64 * MiB)) other-node \
    "$snap_id" "$OTHER/staging/restored" "$OTHER/pods/restored/mount" layout=partition gdsPolicy=preferred \
    2>"$WORK/snapshot-restore.log") || true
  check "the other node's driver restores it: CreateVolume from the snapshot, NodeStage, NodePublish ($restored_id)" \
    [ -n "$restored_id" ]
  echo "     restored on other-node in $((SECONDS - restore_start)) s"
  local back
  back=$(sha256sum "$OTHER/pods/restored/mount/blob" 2>/dev/null | cut -d" " -f1)
  check "on other-node the restored file has the writer's bytes (SHA-256 $back)" [ "$back" = "$sum" ]
  check "and the writer's own SHA-256 file" [ "$(cat "$OTHER/pods/restored/mount/blob.sha256" 2>/dev/null)" = "$sum" ]
  on_other_device() { awk -v d="$OTHER/staging/restored" '$5 == d {print $(NF - 1)}' /proc/self/mountinfo | grep -q "^${OTHER_DEVICE}p"; }
  check "on a partition of the other node's own device ($OTHER_DEVICE)" on_other_device
  check "released there: NodeUnpublish, NodeUnstage, DeleteVolume" \
    "$CACHE_BIN/gds-csi-csiclient" "$OTHER/csi.sock" release "$restored_id" "$OTHER/staging/restored" "$OTHER/pods/restored/mount"

  # The same snapshot as a claim's dataSource on this node, through the provisioner.
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: snap-restored, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: nvme-gds-preferred
  resources: {requests: {storage: 64Mi}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: snap}
YAML
  pod snap-reader snap-restored "sha256sum /data/blob | cut -d\" \" -f1"
  check "a claim restored from the VolumeSnapshot on $NODE holds the writer's bytes" wait_for 120 logs_are snap-reader "$sum"
  if ! logs_are snap-reader "$sum"; then events_of snap-restored | tail -3; events_of snap-reader | tail -3; fi
  "$KUBECTL" delete pod snap-reader --wait=false >/dev/null
  "$KUBECTL" delete pvc snap-restored --wait=false >/dev/null

  # The same snapshot imported by its id (a pre-provisioned content, Retain), labelled for a
  # node as docs/user-guide.md says: that node's sidecar answers it (ListSnapshots by id).
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotContent
metadata:
  name: imported-content
  labels: {snapshot.storage.kubernetes.io/managed-by: $NODE}
spec:
  driver: $DRIVER
  deletionPolicy: Retain
  source: {snapshotHandle: "$snap_id"}
  volumeSnapshotRef: {name: imported, namespace: default}
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: imported, namespace: default}
spec:
  source: {volumeSnapshotContentName: imported-content}
YAML
  imported_ready() { [ "$("$KUBECTL" get volumesnapshot imported -o jsonpath='{.status.readyToUse}')" = true ]; }
  check "a snapshot imported by its id, its content labelled managed-by=$NODE, is readyToUse" wait_for 60 imported_ready
  check "with the source's restore size" \
    [ "$("$KUBECTL" get volumesnapshot imported -o jsonpath='{.status.restoreSize}')" = 64Mi ]
  "$KUBECTL" delete volumesnapshot imported --wait=false >/dev/null
  imported_gone() { ! "$KUBECTL" get volumesnapshotcontent imported-content >/dev/null 2>&1; }
  "$KUBECTL" delete volumesnapshotcontent imported-content --wait=false >/dev/null
  check "the import removed (Retain): its content is gone" wait_for 60 imported_gone
  check "and the snapshot is still on the store" [ -n "$(find "$SNAPSHOT_STORE" -type f)" ]

  "$KUBECTL" delete volumesnapshot snap --wait=false >/dev/null
  content_gone() { ! "$KUBECTL" get volumesnapshotcontent "$content" >/dev/null 2>&1; }
  check "deleting the VolumeSnapshot deletes its content (DeleteSnapshot)" wait_for 60 content_gone
  store_empty() { [ -z "$(find "$SNAPSHOT_STORE" -type f)" ]; }
  check "and the snapshot's files in the store" wait_for 30 store_empty
  check "the restored claim's space returns: the carving class's capacity is ${part_capacity} MiB again" \
    wait_for 90 has_capacity "$NODE" "$part_capacity" nvme-gds
  echo "     snapshots: $((SECONDS - snap_start)) s"
}

# --- expansion (issue 13): a carved claim grows while a pod uses it -----------------------
# The resizer is the stand-in for external-resizer (tests/e2e/tools/k8s/resizer): the chart's
# csi-resizer sidecar, or a process beside the driver. Beside them, what every other node of
# a cluster runs: a driver of the same name on another node id (no devices) with its own
# resizer, which sees the same claim; asked about this node's volume, that driver must
# answer Aborted (the one code that leaves the claim's status alone: deploy/README.md).
# Its one pool device takes the snapshot restored on that node below.
OTHER=$WORK/other-node
mkdir -p "$OTHER"
OTHER_DEVICE=$(make_loop "$WORK/other-dev.img" $((256 * MiB)))
"$GDS_CSI" serve --mode all --node-id other-node --driver-name "$DRIVER" --endpoint "unix://$OTHER/csi.sock" \
  --state-dir "$OTHER/state" --allowed-path-root "$OTHER" --log-format json --pool-device "$OTHER_DEVICE" \
  2>"$WORK/other-driver.log" &
OTHER_DRIVER_PID=$!
PIDS+=("$OTHER_DRIVER_PID")
wait_for_socket "$OTHER/csi.sock"
# A fresh token: a reinstall of the chart (above) made the node ServiceAccount anew.
write_kubeconfig "$WORK/resizer.kubeconfig" "$("$KUBECTL" -n "$NS" create token gds-csi-node --duration 2h)"
"$CACHE_BIN/gds-csi-resizer" --csi-address "$OTHER/csi.sock" --kubeconfig "$WORK/resizer.kubeconfig" \
  >"$WORK/other-resizer.log" 2>&1 &
OTHER_RESIZER_PID=$!
PIDS+=("$OTHER_RESIZER_PID")
# xfs: this machine withholds CAP_SYS_RESOURCE from every process (CapBnd lacks bit 24), and
# the kernel grows a mounted ext4 only with it (fs/ext4/resize.c ext4_resize_begin), so here
# only xfs can grow online (xfs_growfs needs CAP_SYS_ADMIN, which the node pod has); the
# driver's refusal for ext4 is checked by tests/expand_root.rs.
"$KUBECTL" get storageclass nvme-gds-preferred -o json | python3 -c '
import json, sys
sc = json.load(sys.stdin)
sc["metadata"] = {"name": "nvme-gds-xfs"}
sc["parameters"]["csi.storage.k8s.io/fstype"] = "xfs"
print(json.dumps(sc))' | "$KUBECTL" apply -f - >/dev/null
GROW_TOKEN=$(random_token)
pvc grow nvme-gds-xfs 320Mi
pod grower grow "echo $GROW_TOKEN > /data/token && sync && cat /data/token && exec sleep 3600"
check "a pod writes to a 320Mi xfs claim of the carving class (layout: partition)" wait_for 120 logs_are grower "$GROW_TOKEN"
grow_pv=$("$KUBECTL" get pvc grow -o jsonpath='{.spec.volumeName}')
# The pod's view of its filesystem: 1K-blocks of /data.
df_kib() { "$KUBECTL" exec grower -- df -k /data | awk 'NR == 2 {print $2}'; }
# The partition under the staged filesystem (the only staged volume now), and its PARTUUID.
grow_dev=$(awk -v d="$KUBELET_DIR/plugins/kubernetes.io/csi/$DRIVER/" 'index($5, d) == 1 {print $(NF - 1); exit}' /proc/self/mountinfo)
partuuid() { blkid -p -s PART_ENTRY_UUID -o value "$grow_dev"; }
df_before=$(df_kib)
uuid_before=$(partuuid)
echo "     before: $grow_dev $(blockdev --getsize64 "$grow_dev") bytes, df ${df_before} KiB"
# The owning node's resizer is held (SIGSTOP) until the other node's resizer has asked its
# driver: the race between them is then decided, and what the other's answer leaves is seen.
owner_pid=$(owner_resizer)
check "this node's resizer is found by its container's task" test -n "$owner_pid" || exit 1
pvc_json() { "$KUBECTL" get pvc grow -o json; }
kill -STOP "$owner_pid"
"$KUBECTL" patch pvc grow -p '{"spec":{"resources":{"requests":{"storage":"400Mi"}}}}' >/dev/null
other_asked() { grep '"call failed"' "$WORK/other-driver.log" | grep -q '"ControllerExpandVolume"'; }
check "with this node's resizer held, the other node's resizer asks its driver (ControllerExpandVolume refused)" \
  wait_for 30 other_asked
# What the refusal left: the claim as the other resizer marked it before asking
# (ControllerResizeInProgress), no error condition, the PV and the partition unchanged.
left_alone() {
  pvc_json | python3 -c '
import json, sys
st = json.load(sys.stdin)["status"]
assert st["capacity"]["storage"] == "320Mi", st
assert st.get("allocatedResourceStatuses", {}).get("storage") == "ControllerResizeInProgress", st
assert not [c for c in st.get("conditions") or [] if c["type"] in ("ControllerResizeError", "NodeResizeError")], st' &&
    [ "$("$KUBECTL" get pv "$grow_pv" -o jsonpath='{.spec.capacity.storage}')" = 320Mi ] &&
    [ "$(blockdev --getsize64 "$grow_dev")" -eq $((320 * MiB)) ]
}
check "the other node's answer leaves the claim alone: no error condition, PV and partition still 320 MiB" left_alone
events_of grow | grep VolumeResizeFailed | head -1 | cut -c1-300 | sed 's/^/     /'
kill -CONT "$owner_pid"
grow_start=$SECONDS
# Done: status capacity 400Mi (the kubelet's write after NodeExpandVolume), no resize status
# or resize condition left (the resizer's FileSystemResizePending, NodeResizePending).
grown() {
  pvc_json | python3 -c '
import json, sys
st = json.load(sys.stdin)["status"]
assert st["capacity"]["storage"] == "400Mi", st
assert "storage" not in (st.get("allocatedResourceStatuses") or {}), st
assert not [c for c in st.get("conditions") or [] if c["type"] in ("Resizing", "FileSystemResizePending", "ControllerResizeError", "NodeResizeError")], st'
}
check "the claim grows to 400Mi online: status capacity 400Mi, no resize status or condition left" wait_for 180 grown
echo "     grown in $((SECONDS - grow_start)) s (the kubelet looks again at each pod sync, every 10 s here)"
check "the PV's capacity is 400Mi (what ControllerExpandVolume answered)" \
  [ "$("$KUBECTL" get pv "$grow_pv" -o jsonpath='{.spec.capacity.storage}')" = 400Mi ]
grown_in_place() { [ "$(blockdev --getsize64 "$grow_dev")" -eq $((400 * MiB)) ] && [ "$(partuuid)" = "$uuid_before" ]; }
check "the partition grew in place to 400 MiB (same device $grow_dev, same PARTUUID)" grown_in_place
df_after=$(df_kib)
echo "     after: df ${df_after} KiB"
check "df in the pod grows by more than 64 MiB (${df_before} -> ${df_after} KiB)" \
  [ "${df_after:-0}" -gt $((${df_before:-0} + 64 * 1024)) ]
check "the file written before the grow reads back after it" \
  [ "$("$KUBECTL" exec grower -- cat /data/token)" = "$GROW_TOKEN" ]
check "ControllerExpandVolume and NodeExpandVolume succeeded in this node's driver" \
  called ControllerExpandVolume NodeExpandVolume
resize_events() {
  local ev
  ev=$(events_of grow)
  [[ "$ev" == *"Resizing: External resizer is resizing volume $grow_pv"* &&
    "$ev" == *"FileSystemResizeRequired: "* && "$ev" == *"FileSystemResizeSuccessful: "* ]]
}
check "the claim's events: Resizing and FileSystemResizeRequired (resizer), FileSystemResizeSuccessful (kubelet)" \
  wait_for 30 resize_events
# The other node's driver grew nothing and answered only Aborted, naming the owner.
other_answers() {
  python3 - "$WORK/other-driver.log" "$NODE" <<'PY'
import sys
lines = [l for l in open(sys.argv[1]) if '"ControllerExpandVolume"' in l]
ok = [l for l in lines if '"message":"call","method":"ControllerExpandVolume"' in l]
refused = [l for l in lines if '"call failed"' in l]
assert not ok, ok
assert all("Aborted" in l and sys.argv[2] in l for l in refused), refused
print(len(refused))
PY
}
other_refused=$(other_answers) || other_refused=0
check "the other node's driver expanded nothing and answered only Aborted naming $NODE (asked ${other_refused} times)" \
  [ "$other_refused" -ge 1 ]
kill "$OTHER_RESIZER_PID"
"$KUBECTL" delete pod grower --wait=false >/dev/null
check "the grower pod is deleted" wait_for 90 pod_gone grower
"$KUBECTL" delete pvc grow --wait=false >/dev/null
check "the grown claim's space returns: the carving class's capacity is ${part_capacity} MiB again" \
  wait_for 90 has_capacity "$NODE" "$part_capacity" nvme-gds
[ "$DEPLOY" != chart ] || snapshot_and_restore
kill "$OTHER_DRIVER_PID"

# --- GPU workloads without privileged mode: the device plugin (src/gds/workload) -------------
# The driver serves a kubelet device plugin with two resources. A pod that lists one in its
# limits gets, through the kubelet and containerd, /dev/nvidia-fs* (none on this machine),
# the host's /run/udev/data read-only and the resource's cufile.json read-only, named by
# CUFILE_ENV_PATH_JSON. The pods run in a namespace where the baseline Pod Security level is
# enforced: no privileged container, no hostPath. GDS does not work on this GPU-less node,
# so the resource for `required` (compat mode off) has no allocatable share here and a pod
# asking for it is not scheduled; the pods ask for the compat resource and mount a
# `preferred` claim. (GDS-ready nodes are shown at the end, with a fixture host.)
GDS_RES=$DRIVER/gds
COMPAT_RES=$DRIVER/gds-compat
WL_NS=gds-workload
node_count() { resource_of "$NODE" "$@"; } # RESOURCE capacity|allocatable
offered() { [ "$(node_count "$GDS_RES" "$1")" = "$2" ] && [ "$(node_count "$COMPAT_RES" "$1")" = "$2" ]; }
compat_allocatable() { [ "$(node_count "$COMPAT_RES" allocatable)" = 110 ]; }
check "the kubelet lists both resources, 110 shares each ($GDS_RES, $COMPAT_RES)" wait_for 60 offered capacity 110
# This machine runs no udevd: the test plays its part, with an empty database first.
[ -d /run/udev ] || { mkdir /run/udev && MADE_RUN_UDEV=1; }
if [ -d /run/udev/data ]; then
  echo "     /run/udev/data exists (udevd runs here): its entries are udevd's"
  check "with the host's udev database, every $COMPAT_RES share is allocatable" wait_for 60 compat_allocatable
else
  check "without a udev database on the host no share is allocatable (the devices are unhealthy)" \
    wait_for 60 offered allocatable 0
  # One grep over the captured log (see called: grep -q in a pipeline under pipefail).
  said_why() {
    local log
    log=$(driver_log)
    grep -q 'GDS workload resource unhealthy.*no udev database at /run/udev/data' <<<"$log"
  }
  check "and the driver's log says why (no udev database at /run/udev/data)" said_why
  mkdir /run/udev/data
  MADE_UDEV_DATA=1
  check "/run/udev/data made: every $COMPAT_RES share becomes allocatable" wait_for 60 compat_allocatable
fi
check "GDS does not work here: no $GDS_RES share is allocatable" [ "$(node_count "$GDS_RES" allocatable)" = 0 ]
not_ready_said() {
  local log
  log=$(driver_log)
  grep 'GDS workload resource unhealthy' <<<"$log" | grep -F "\"$GDS_RES\"" | grep -q 'GDS does not work on this node'
}
check "and the driver's log says why ($GDS_RES: GDS does not work on this node, with the failed checks)" not_ready_said
if [ "$DEPLOY" = chart ]; then
  # The command the release's notes print (helm get notes), run as printed.
  notes_columns=$("$HELM" get notes gds-csi -n "$NS" | sed -n "s/^ *kubectl get nodes -o custom-columns='\\(.*\\)'$/\\1/p")
  notes_says() {
    local out
    out=$("$KUBECTL" get nodes -o "custom-columns=$notes_columns" --no-headers) && grep -qx "$NODE  *0" <<<"$out"
  }
  check "the command the chart's notes print shows the node with 0 GDS shares (not GDS-ready)" wait_for 60 notes_says
fi

"$KUBECTL" create namespace "$WL_NS" >/dev/null
"$KUBECTL" label namespace "$WL_NS" pod-security.kubernetes.io/enforce=baseline >/dev/null
# wl_pod NAME RESOURCE UID: a pod on $NODE that mounts the claim `workload` at /data, asks
# for one share of RESOURCE and sleeps; not privileged, no privilege escalation.
wl_pod() {
  "$KUBECTL" apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: $WL_NS}
spec:
  nodeSelector: {kubernetes.io/hostname: $NODE}
  restartPolicy: Never
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  securityContext: {runAsUser: $3, runAsGroup: $3, fsGroup: 2000, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: app
    image: $APP_IMAGE
    imagePullPolicy: Never
    command: [sleep, "3600"]
    securityContext: {privileged: false, allowPrivilegeEscalation: false}
    resources: {limits: {$2: 1}}
    volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: workload}}]
YAML
}
privileged_refused() {
  local out
  out=$("$KUBECTL" -n "$WL_NS" run refused --image "$APP_IMAGE" --restart Never \
    --overrides '{"spec": {"containers": [{"name": "refused", "image": "'"$APP_IMAGE"'", "securityContext": {"privileged": true}}]}}' 2>&1) &&
    return 1
  [[ "$out" == *"violates PodSecurity \"baseline"* ]]
}
check "the namespace enforces Pod Security baseline: a privileged pod is refused" privileged_refused
"$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: workload, namespace: $WL_NS}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: nvme-gds-preferred
  resources: {requests: {storage: 32Mi}}
YAML
# Root in the pod (not privileged): a refused write then proves a read-only mount, not
# file permissions.
wl_pod gds-app "$GDS_RES" 0 >/dev/null
gds_unschedulable() { events_of gds-app "$WL_NS" | grep -q "FailedScheduling.*Insufficient $GDS_RES"; }
check "a pod asking for $GDS_RES: 1 is not scheduled where GDS does not work (Insufficient $GDS_RES)" \
  wait_for 60 gds_unschedulable
"$KUBECTL" -n "$WL_NS" delete pod gds-app --wait=false >/dev/null
wl_pod root-app "$COMPAT_RES" 0 >/dev/null
wl_running() { [ "$("$KUBECTL" -n "$WL_NS" get pod "$1" -o jsonpath='{.status.phase}')" = Running ]; }
check "a non-privileged pod asking for $COMPAT_RES: 1 runs on a claim" wait_for 120 wl_running root-app
if ! wl_running root-app; then "$KUBECTL" -n "$WL_NS" describe pod root-app | tail -15; fi
in_pod() { "$KUBECTL" -n "$WL_NS" exec "$1" -- sh -c "$2"; }
# The volume's block device, as the pod's own mount table names it (major:minor).
vol_dev=$(in_pod root-app 'awk '\''$5 == "/data" {print $3}'\'' /proc/self/mountinfo' 2>/dev/null || true)
staged_dev=$(awk -v d="$KUBELET_DIR/plugins/kubernetes.io/csi/$DRIVER/" 'index($5, d) == 1 {print $3; exit}' /proc/self/mountinfo)
same_dev() { [ -n "$vol_dev" ] && [ "$vol_dev" = "$staged_dev" ]; }
check "the pod's /data is the staged volume's device ($vol_dev; the host's staging mount: $staged_dev)" same_dev
# udevd's entry for it, as udevd writes one for a filesystem (only where udevd does not run).
if [ -n "$MADE_UDEV_DATA" ] && [ -n "$vol_dev" ]; then
  printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n' >"/run/udev/data/b$vol_dev"
fi
mount_opts() { in_pod "$1" "awk '\$5 == \"$2\" {print \$6}' /proc/self/mountinfo"; }
udev_ro() { [[ "$(mount_opts root-app /run/udev/data)" == ro,* ]]; }
check "in the pod: /run/udev/data is mounted read-only" udev_ro
udev_write_refused() {
  local out
  out=$(in_pod root-app 'id -u; touch /run/udev/data/written-by-pod 2>&1' 2>&1) || true
  [[ "$out" == 0$'\n'*"Read-only file system"* ]] && [ ! -e /run/udev/data/written-by-pod ]
}
check "in the pod: a write there fails as root (Read-only file system)" udev_write_refused
check "in the pod: the volume's udev entry b$vol_dev is there (E:ID_FS_USAGE=filesystem)" \
  in_pod root-app "grep -qx E:ID_FS_USAGE=filesystem /run/udev/data/b$vol_dev"
cufile_of() { in_pod "$1" 'echo "$CUFILE_ENV_PATH_JSON"; cat "$CUFILE_ENV_PATH_JSON"'; }
# cufile_is POD true|false: CUFILE_ENV_PATH_JSON names /etc/gds-csi/cufile.json, which holds
# allow_compat_mode as asked and the node's own max_direct_io_size_kb (8192).
cufile_is() {
  cufile_of "$1" | python3 -c '
import json, sys
path, text = sys.stdin.read().split("\n", 1)
c = json.loads(text)
assert path == "/etc/gds-csi/cufile.json", path
assert c["properties"]["allow_compat_mode"] is (sys.argv[1] == "true"), c
assert c["properties"]["max_direct_io_size_kb"] == 8192, c' "$2"
}
check "in the pod: \$CUFILE_ENV_PATH_JSON has \"allow_compat_mode\": true and the node's settings" cufile_is root-app true
cufile_ro() { [[ "$(mount_opts root-app /etc/gds-csi/cufile.json)" == ro,* ]]; }
check "in the pod: the cufile.json is mounted read-only" cufile_ro
# What the container runtime puts in every container's /dev (runc's default devices and
# links, the pts/shm/mqueue mounts, the kubelet's termination-log), plus the node's
# nvidia-fs nodes: nothing else of the host's /dev.
host_nvfs=$(find /dev -maxdepth 1 -name 'nvidia-fs[0-9]*' -printf '%f\n' | sort | tr '\n' ' ')
echo "     nvidia-fs nodes on this host: ${host_nvfs:-none}"
only_default_dev() {
  local listing
  listing=$(in_pod root-app 'ls -A /dev') || return 1
  echo "     pod /dev: $(echo "$listing" | tr '\n' ' ')"
  python3 -c '
import sys
allowed = set("null zero full random urandom tty ptmx pts shm mqueue fd stdin stdout stderr core console termination-log".split())
nvfs, seen = set(sys.argv[1].split()), set(sys.argv[2].split())
assert nvfs <= seen, f"nvidia-fs nodes missing: {sorted(nvfs - seen)}"
extra = seen - allowed - nvfs
assert not extra, f"host devices in the pod: {sorted(extra)}"' "$host_nvfs" "$listing"
}
check "in the pod: /dev holds the runtime's default nodes and the node's nvidia-fs ones (${host_nvfs:-none}), nothing else" \
  only_default_dev
not_privileged() {
  [ "$(in_pod root-app "awk '/^CapEff/ {print \$2}' /proc/self/status")" != 000001ffffffffff ] &&
    [ "$("$KUBECTL" -n "$WL_NS" get pod root-app -o jsonpath='{.spec.containers[0].securityContext.privileged}')" = false ]
}
check "the pod is not privileged (privileged: false, not every capability)" not_privileged

# What cuFile in the pod will see, from its node: gds-csi doctor --pod reads the OCI spec
# containerd handed runc for the pod's container (src/gds/doctor/pod.rs), in the node
# plugin as an operator runs it (chart), or as a host process.
doctor_pod() { # NAMESPACE/NAME: the JSON report on stdout, the doctor's exit status
  if [ "$DEPLOY" = chart ]; then
    "$KUBECTL" -n "$NS" exec ds/gds-csi-node -c doctor -- gds-csi doctor --pod "$1" --json 2>&1
  else
    "$GDS_CSI" doctor --pod "$1" --json --runtime-state-dir "$RUNTIME_TASKS" \
      --kubelet-dir "$KUBELET_DIR" --driver-name "$DRIVER" --state-dir "$WORK/driver-state" 2>&1
  fi
}
wl_pv=$("$KUBECTL" -n "$WL_NS" get pvc workload -o jsonpath='{.spec.volumeName}')
# pod_findings JSON LABEL EXPECTED...: the container LABEL's findings, each `id=status`
# and optionally `~text` the finding's summary, evidence or remedy must hold.
pod_findings() {
  python3 -c '
import json, sys
text, label, *expected = sys.argv[1:]
d = json.loads(text[text.index("{"):text.rindex("}") + 1])
containers = {c["container"]: c for c in d.get("containers", [])}
if "containers" not in d:
    containers = {"this container": {"findings": d["findings"]}}
assert label in containers, f"no {label} in {sorted(containers)}"
found = {f["id"]: f for f in containers[label]["findings"]}
for e in expected:
    if "~" in e:
        fid, needle = e.split("~", 1)
        f = found[fid]
        assert needle in " ".join([f["summary"], f["evidence"], f.get("remedy") or ""]), f"{fid}: {needle!r} not in {f}"
    else:
        fid, status = e.split("=")
        assert found[fid]["status"] == status, f"{fid}: {found[fid]}"
' "$@"
}
doctor_rc=0
doctor_out=$(doctor_pod "$WL_NS/root-app") || doctor_rc=$?
echo "$doctor_out" | grep -o '"summary": "[^"]*"' | sed 's/^/     /' || true
# The claim's class is `preferred` and this node has no GDS path, so the driver published it
# in compat mode: the container's cufile.json allows compat mode, so its reads go through
# host memory, which the doctor says as a warning (exit 0). (A container whose cufile.json
# turned compat off would fail every read of it: the doctor's unit tests, src/gds/doctor.)
doctor_sees_the_resource() {
  [ "$doctor_rc" -eq 0 ] && pod_findings "$doctor_out" "$WL_NS/root-app/app" \
    pod.nvidia_fs=warn pod.host_devices=pass pod.udev=pass pod.cufile_json=pass pod.volume=pass \
    pod.compat_policy=warn "pod.compat_policy~$wl_pv" \
    "pod.udev~b$vol_dev" "pod.cufile_json~/etc/gds-csi/cufile.json (CUFILE_ENV_PATH_JSON): allow_compat_mode true" \
    "pod.volume~$wl_pv at /data (device $vol_dev)" "pod.nvidia_fs~nvidia_fs is not loaded"
}
check "doctor --pod $WL_NS/root-app from the node: udev entry b$vol_dev, compat allowed, no host device, $wl_pv, no nvidia_fs; its reads go through host memory (a warning, exit $doctor_rc)" \
  doctor_sees_the_resource
missing_pod() {
  local out rc=0
  out=$(doctor_pod "$WL_NS/no-such-pod") || rc=$?
  [ "$rc" -ne 0 ] && [[ "$out" == *"no running container of pod $WL_NS/no-such-pod on this node"* ]]
}
check "doctor --pod of a pod not on the node: an error saying so, not an empty report" missing_pod
if [ "$DEPLOY" = chart ]; then
  # The node plugin itself is privileged: the same findings say what it holds.
  plugin_out=$(doctor_pod "$NS/$(plugin_pod)") || true
  privileged_named() {
    pod_findings "$plugin_out" "$NS/$(plugin_pod)/gds-csi" pod.host_devices=warn \
      "pod.host_devices~CAP_SYS_ADMIN" "pod.host_devices~every device" "pod.host_devices~the host's /dev mounted"
  }
  check "doctor --pod on the privileged node plugin: CAP_SYS_ADMIN, every device, the host's /dev named" privileged_named
  # containerd's task directory holds every container's rootfs with their copies of the
  # volumes' mounts: the doctor container sees it, the driver's own mount table never does.
  tasks_only_in_doctor() {
    local driver_view doctor_view
    driver_view=$("$KUBECTL" -n "$NS" exec ds/gds-csi-node -c gds-csi -- cat /proc/self/mountinfo) &&
      doctor_view=$("$KUBECTL" -n "$NS" exec ds/gds-csi-node -c doctor -- cat /proc/self/mountinfo) &&
      [[ "$driver_view" != *"$RUNTIME_TASKS"* ]] && [[ "$doctor_view" == *"$RUNTIME_TASKS"* ]]
  }
  check "containerd's task directory is in the doctor container's mount table, not in the driver's" tasks_only_in_doctor

  # The same from inside a container of the driver's image that asks for the resource:
  # gds-csi workload-read checks what it was given and reads a file of the claim through
  # cuFile. No GPU here: the read cannot happen and the path it names is "none".
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: read-check, namespace: $WL_NS}
spec:
  nodeSelector: {kubernetes.io/hostname: $NODE}
  restartPolicy: Never
  automountServiceAccountToken: false
  securityContext: {runAsUser: 1000, runAsGroup: 1000, fsGroup: 2000, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: check
    image: $IMAGES/gds-csi:e2e
    imagePullPolicy: Never
    command: [sh, -c, 'dd if=/dev/urandom of=/data/read-check.bin bs=1M count=4 oflag=direct 2>/dev/null && gds-csi workload-read /data/read-check.bin --json --timeout 10s; echo "exit=\$?"']
    securityContext: {privileged: false, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
    resources: {limits: {$COMPAT_RES: 1}}
    volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: workload}}]
YAML
  wl_done() { [ "$("$KUBECTL" -n "$WL_NS" get pod "$1" -o jsonpath='{.status.phase}')" = Succeeded ]; }
  check "a pod of the driver's image asking for $COMPAT_RES runs gds-csi workload-read on the claim" wait_for 120 wl_done read-check
  read_out=$("$KUBECTL" -n "$WL_NS" logs read-check 2>&1 || true)
  read_names_all() {
    [[ "$read_out" == *'"cufile_path": "none"'* && "$read_out" == *"exit=1"* ]] &&
      pod_findings "$read_out" "this container" pod.nvidia_fs=warn pod.host_devices=pass pod.udev=pass \
        pod.cufile_json=pass "pod.udev~b$vol_dev" "pod.cufile_json~allow_compat_mode true" "pod.volume~/data (device $vol_dev)"
  }
  check "workload-read from inside: the same findings (udev entry, compat allowed, no host device), no GPU so path none, exit 1" \
    read_names_all
  read_names_all || echo "$read_out" | tail -40 | sed 's/^/     /'
  "$KUBECTL" -n "$WL_NS" delete pod read-check --wait=false >/dev/null
fi

# The same resource as a non-root user (uid 1000): the same cufile.json and udev database.
"$KUBECTL" -n "$WL_NS" delete pod root-app --wait=false >/dev/null
wl_gone() { ! "$KUBECTL" -n "$WL_NS" get pod "$1" >/dev/null 2>&1; }
check "the first pod is deleted" wait_for 90 wl_gone root-app
wl_pod compat-app "$COMPAT_RES" 1000 >/dev/null
check "a pod asking for $COMPAT_RES: 1 (uid 1000) runs on the same claim" wait_for 120 wl_running compat-app
check "in that pod: \$CUFILE_ENV_PATH_JSON has \"allow_compat_mode\": true" cufile_is compat-app true
check "and uid 1000 reads the volume's udev entry" in_pod compat-app "grep -qx E:ID_FS_USAGE=filesystem /run/udev/data/b$vol_dev"
compat_doctor_rc=0
compat_doctor=$(doctor_pod "$WL_NS/compat-app") || compat_doctor_rc=$?
compat_pod_reads() {
  [ "$compat_doctor_rc" -eq 0 ] && pod_findings "$compat_doctor" "$WL_NS/compat-app/app" \
    pod.cufile_json=pass pod.compat_policy=warn "pod.cufile_json~allow_compat_mode true"
}
check "doctor --pod $WL_NS/compat-app: compat allowed, the volume's reads go through host memory (a warning, exit $compat_doctor_rc)" \
  compat_pod_reads

# The kubelet restarts (an upgrade, a crash): it removes every socket in its device plugin
# directory at start; the driver must serve and register both resources again by itself.
registrations() {
  local log
  log=$(driver_log)
  grep -c '"registered with the kubelet"' <<<"$log"
}
before=$(registrations)
kill "$KUBELET_PID"
wait "$KUBELET_PID" || true
restart_at=$SECONDS
start_kubelet
check "the kubelet restarts and its node is Ready again" wait_for 120 node_ready
registered_again() { [ "$(registrations)" -ge $((before + 2)) ] && offered capacity 110 && compat_allocatable; }
check "the driver registers both resources with the new kubelet ($COMPAT_RES allocatable 110 again)" wait_for 90 registered_again
echo "     registered again $((SECONDS - restart_at)) s after the kubelet was restarted"
check "the running pod kept running across the kubelet's restart" wl_running compat-app
"$KUBECTL" -n "$WL_NS" delete pod compat-app --wait=false >/dev/null
check "the compat pod is deleted" wait_for 90 wl_gone compat-app
wl_pod compat-again "$COMPAT_RES" 0 >/dev/null
check "a new pod asking for $COMPAT_RES is admitted through the new registration and runs" wait_for 120 wl_running compat-again
check "and gets its cufile.json (compat mode allowed)" cufile_is compat-again true
"$KUBECTL" delete namespace "$WL_NS" --wait=false >/dev/null
wl_pv_gone() { [ -z "$("$KUBECTL" get pv -o jsonpath="{.items[?(@.spec.claimRef.namespace==\"$WL_NS\")].metadata.name}")" ]; }
check "the workload namespace goes, with its claim and volume" wait_for 120 wl_pv_gone
[ -z "$MADE_UDEV_DATA" ] || rm -f "/run/udev/data/b$vol_dev"

# --- GDS readiness that follows the node ---------------------------------------------------
# A second instance of the driver, with the stand-in registrar, as host processes in both
# modes: its node checks read a fixture host tree (this machine has no GPU and no nvidia_fs),
# where "loading nvidia_fs" is writing the files the checks read. The kubelet must label the
# node without the driver or the registrar restarting: the driver's readiness watcher relinks
# the registration socket and the kubelet registers it again (src/gds/readiness). Its device
# plugin's `gds` resource (compat mode off) follows the same checks: allocatable only while
# GDS works, so pods asking for it go to GDS-ready nodes only.
WATCHED_DRIVER=readiness.gds-csi.test
R_HOST=$WORK/readiness-host
R_SOCKET=$KUBELET_DIR/plugins/$WATCHED_DRIVER/csi.sock
R_HEALTH=127.0.0.1:64455
gds_fixture_host "$R_HOST"
mkdir -p "$(dirname "$R_SOCKET")"
"$GDS_CSI" serve --mode node --endpoint "unix://$R_SOCKET" --node-id "$NODE" --driver-name "$WATCHED_DRIVER" \
  --state-dir "$WORK/readiness-state" --allowed-path-root "$KUBELET_DIR" --log-format json \
  --host-proc "$R_HOST/proc" --host-sys "$R_HOST/sys" --host-dev "$R_HOST/dev" \
  --cufile-json "$R_HOST/etc/cufile.json" --udev-data-dir "$R_HOST/run/udev/data" \
  --registration-socket "$KUBELET_DIR/plugins_registry/$WATCHED_DRIVER-reg.sock" --readiness-interval 1s \
  --gds-device-plugin 2>"$WORK/readiness-driver.log" &
R_DRIVER_PID=$!
PIDS+=("$R_DRIVER_PID")
wait_for_socket "$R_SOCKET"
"$CACHE_BIN/gds-csi-registrar" --csi-address "$R_SOCKET" --kubelet-registration-path "$R_SOCKET" \
  --plugin-registration-path "$KUBELET_DIR/plugins_registry" --http-endpoint "$R_HEALTH" \
  >"$WORK/readiness-registrar.log" 2>&1 &
R_REGISTRAR_PID=$!
PIDS+=("$R_REGISTRAR_PID")
r_label() { label_of "$NODE" "$WATCHED_DRIVER/gds-nvme"; }
r_keys() { "$KUBECTL" get csinode "$NODE" -o jsonpath="{.spec.drivers[?(@.name==\"$WATCHED_DRIVER\")].topologyKeys}"; }
r_registered() { [[ "$(r_keys)" == *"$WATCHED_DRIVER/node"* ]]; }
check "a second driver (fixture GDS host without nvidia_fs) registers with the kubelet" wait_for 60 r_registered
r_not_ready() { [ -z "$(r_label)" ] && [[ "$(r_keys)" != *gds-nvme* ]]; }
check "not ready: no $WATCHED_DRIVER/gds-nvme label, no gds-nvme topology key" r_not_ready
R_GDS=$WATCHED_DRIVER/gds
r_gds_is() { [ "$(node_count "$R_GDS" capacity)" = 110 ] && [ "$(node_count "$R_GDS" allocatable)" = "$1" ]; }
check "and its device plugin's $R_GDS: 110 shares, none allocatable" wait_for 60 r_gds_is 0
# r_pod NAME: a pod on the node asking for one share of $R_GDS, printing the compat setting
# of the cufile.json it was given. (The fixture's nvidia-fs node is a plain file, which the
# device plugin does not hand out.)
r_pod() {
  app_pod "$1" "$NODE" 'grep -o "\"allow_compat_mode\": *[a-z]*" "$CUFILE_ENV_PATH_JSON"; sleep 3600' \
    "resources: {limits: {$R_GDS: 1}}"
}
r_unschedulable() { events_of "$1" | grep -q "FailedScheduling.*Insufficient $R_GDS"; }
r_pod r-before
check "a pod asking for $R_GDS is not scheduled (Insufficient $R_GDS)" wait_for 60 r_unschedulable r-before
registrations() { grep -c "registered with the kubelet" "$WORK/readiness-registrar.log"; }
first_registrations=$(registrations)
# nvidia_fs loaded after the driver started, with the NVMe driver registered with it.
gds_fixture_nvidia_fs "$R_HOST" load
flip=$SECONDS
r_ready() { [ "$(r_label)" = true ] && [[ "$(r_keys)" == *"$WATCHED_DRIVER/gds-nvme"* ]]; }
check "nvidia_fs loaded later: the kubelet labels the node $WATCHED_DRIVER/gds-nvme=true" wait_for 60 r_ready
echo "     label changed $((SECONDS - flip)) s after the flip (watcher interval 1s)"
check "its $R_GDS shares become allocatable (110)" wait_for 60 r_gds_is 110
r_running() { [ "$(pod_phase "$1")" = Running ] && [[ "$("$KUBECTL" logs "$1" 2>/dev/null)" == *'"allow_compat_mode": false'* ]]; }
check "the waiting pod is scheduled and runs, its cufile.json with compat mode off" wait_for 90 r_running r-before
same_processes() {
  kill -0 "$R_DRIVER_PID" && kill -0 "$R_REGISTRAR_PID" &&
    [ "$(registrations)" -gt "$first_registrations" ] &&
    curl -fsS --max-time 10 -o /dev/null "http://$R_HEALTH/healthz"
}
check "by a new registration through the same driver and registrar processes (registrar /healthz 200)" same_processes
relinked() { grep -q "registration socket relinked" "$WORK/readiness-driver.log"; }
check "the driver's log says it relinked the registration socket" relinked
# Unloaded again: the CSINode's keys follow; the label is the kubelet's and stays.
ready_registrations=$(registrations)
gds_fixture_nvidia_fs "$R_HOST" unload
r_key_dropped() {
  [ "$(registrations)" -gt "$ready_registrations" ] && r_registered && [[ "$(r_keys)" != *gds-nvme* ]]
}
check "nvidia_fs unloaded: re-registered, the CSINode's topology keys drop gds-nvme" wait_for 60 r_key_dropped
check "while the kubelet keeps the label (it never removes one; the publish gate still refuses)" \
  [ "$(r_label)" = true ]
check "but no $R_GDS share is allocatable any more" wait_for 60 r_gds_is 0
r_pod r-after
check "so a new pod asking for it is not scheduled (Insufficient $R_GDS)" wait_for 60 r_unschedulable r-after
check "the pod that got its share before keeps running" r_running r-before
"$KUBECTL" delete pod r-before r-after --wait=false >/dev/null
kill "$R_REGISTRAR_PID" "$R_DRIVER_PID"

echo "kubelet e2e wall time: $((SECONDS - start)) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
