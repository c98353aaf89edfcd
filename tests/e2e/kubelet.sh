#!/usr/bin/env bash
# End to end, stage two: a real kubelet with containerd and runc (Debian's packages) on
# this machine, registered with the real control plane, so pods really run and the
# kubelet itself drives NodeStageVolume/NodePublishVolume through the plugin watcher.
# No image registry is reachable: the pause and workload images are built here (a static
# pause binary, Debian's static busybox) and imported into containerd.
#
# Scenario: a class with gdsPolicy=required is refused on this GPU-less node with an
# event that names the failed GDS checks; with gdsPolicy=preferred a pod writes a file,
# is deleted (unpublish + unstage), and a second pod on the same node reads it back
# from the same filesystem; deleting the claim returns the device to the pool.
set -euo pipefail
. "$(cd "$(dirname "$0")" && pwd)/lib.sh"
need_root
install_host_tools
install_container_runtime
e2e_tools etcd kube-apiserver kube-controller-manager kube-scheduler kubectl csi-provisioner \
  kubelet gds-csi-registrar
WORK=$(mktemp -d /tmp/gds-kubelet.XXXXXX)
NODE=kubelet-node
KUBELET_DIR="$WORK/kubelet"
CONTAINERD_SOCK="$WORK/containerd/containerd.sock"
CNI_BRIDGE=gdse2e0
# The kubelet refuses a loopback node IP, and the API server reaches it (logs) there:
# an address of its own, on lo, removed again at the end.
NODE_IP=10.244.78.1
PAUSE_IMAGE=localhost/gds-csi-e2e/pause:1
APP_IMAGE=localhost/gds-csi-e2e/busybox:1
CTR=(ctr --address "$CONTAINERD_SOCK" --namespace k8s.io)
KUBELET_PID=
CONTAINERD_PID=

cleanup() {
  set +e
  [ $failed -eq 0 ] || dump_logs
  # For debugging a failure: leave everything running and say where it is.
  if [ -n "${GDS_E2E_KEEP:-}" ]; then echo "kept $WORK (kubelet $KUBELET_PID, containerd $CONTAINERD_PID)"; return; fi
  # Pods first, while the kubelet can still stop their sandboxes (network namespaces
  # included); then the kubelet, so nothing restarts what is stopped next; then any
  # container it left, containerd, and last mounts and loop devices.
  if [ -n "$KUBELET_PID" ]; then
    "$KUBECTL" delete pods --all --grace-period=1 --timeout=60s >/dev/null 2>&1
    kill "$KUBELET_PID"; wait "$KUBELET_PID"
  fi
  if [ -n "$CONTAINERD_PID" ]; then
    for task in $("${CTR[@]}" tasks ls -q 2>/dev/null); do
      "${CTR[@]}" tasks kill --signal SIGKILL "$task" >/dev/null 2>&1
    done
    sleep 1
    kill "$CONTAINERD_PID"; wait "$CONTAINERD_PID"
  fi
  e2e_stop_all
  local netns
  for netns in $(ls /run/netns 2>/dev/null); do
    grep -qx "$netns" "$WORK/netns-before" 2>/dev/null || ip netns del "$netns"
  done
  ip link del "$CNI_BRIDGE" 2>/dev/null
  ip addr del "$NODE_IP/32" dev lo 2>/dev/null
  cleanup_dir_and_loops "$WORK"
  # The kubelet's QoS cgroups; rmdir only removes them once empty.
  find /sys/fs/cgroup/*/kubepods -depth -type d -exec rmdir {} + 2>/dev/null
}
trap cleanup EXIT
dump_logs() {
  "$KUBECTL" get pods -A -o wide 2>/dev/null
  "$KUBECTL" get events -A 2>/dev/null | tail -20
  local f
  for f in kubelet.log containerd.log driver.log registrar.log provisioner.log; do
    echo "--- $f"; tail -25 "$WORK/$f" 2>/dev/null
  done
}
start=$SECONDS
ls /run/netns > "$WORK/netns-before" 2>/dev/null || true

# --- images, built here -----------------------------------------------------------------
mkdir -p "$WORK/images/pause" "$WORK/images/busybox/bin"
gcc -static -O2 -o "$WORK/images/pause/pause" "$E2E_DIR/images/pause.c"
cp "$(command -v busybox)" "$WORK/images/busybox/bin/busybox"
for applet in sh cat echo grep sync sleep; do ln -s busybox "$WORK/images/busybox/bin/$applet"; done
python3 "$E2E_DIR/images/build-image.py" "$PAUSE_IMAGE" "$WORK/images/pause" "$WORK/images/pause.tar" /pause
python3 "$E2E_DIR/images/build-image.py" "$APP_IMAGE" "$WORK/images/busybox" "$WORK/images/busybox.tar" /bin/sh

# --- containerd with its own root, state, socket and CNI config -------------------------
mkdir -p "$WORK/containerd" "$WORK/cni"
cat > "$WORK/containerd/config.toml" <<TOML
version = 2
root = "$WORK/containerd/root"
state = "$WORK/containerd/state"
[grpc]
  address = "$CONTAINERD_SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # This machine withholds CAP_SYS_RESOURCE even from root, so runc cannot lower a
  # container's oom_score_adj (the sandbox asks for -998); clamp instead of failing.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$WORK/cni"
TOML
# Pods get an address on a private bridge; nothing here needs to route to them.
cat > "$WORK/cni/10-e2e.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "gds-e2e", "plugins": [
  {"type": "bridge", "bridge": "$CNI_BRIDGE", "isGateway": false, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.77.0/24"}]], "dataDir": "$WORK/cni/ipam"}},
  {"type": "loopback"}]}
JSON
containerd --config "$WORK/containerd/config.toml" >"$WORK/containerd.log" 2>&1 &
CONTAINERD_PID=$!
wait_for 30 "${CTR[@]}" version || { tail -20 "$WORK/containerd.log"; exit 1; }
"${CTR[@]}" images import "$WORK/images/pause.tar" >/dev/null
"${CTR[@]}" images import "$WORK/images/busybox.tar" >/dev/null
echo "containerd up with local images in $((SECONDS - start)) s"

# --- control plane, with the kubelet's node identity -----------------------------------
NODE_TOKEN=$(random_token)
start_control_plane '*' "$NODE_TOKEN,system:node:$NODE,$NODE,system:nodes"
apply_chart
# The chart's class with gdsPolicy=preferred: this machine has no GPU, so a required
# class can never publish here; preferred publishes in compat mode and says so.
"$KUBECTL" get storageclass nvme-gds -o json | python3 -c '
import json, sys
sc = json.load(sys.stdin)
sc["metadata"] = {"name": "nvme-gds-preferred"}
sc["parameters"]["gdsPolicy"] = "preferred"
print(json.dumps(sc))' | "$KUBECTL" apply -f - >/dev/null
echo "control plane up in $((SECONDS - start)) s"

# --- the node plugin, its registrar and provisioner, as the chart's DaemonSet runs them ---
MiB=$((1024 * 1024))
mkdir -p "$KUBELET_DIR/plugins/$DRIVER" "$KUBELET_DIR/plugins_registry"
SOCKET="$KUBELET_DIR/plugins/$DRIVER/csi.sock"
POOL_ARGS=(--pool-device "$(make_loop "$WORK/dev1.img" $((64 * MiB)))"
  --pool-device "$(make_loop "$WORK/dev2.img" $((64 * MiB)))")
start_plugin() { # appends to driver.log, so a restarted plugin's calls count too
  "$GDS_CSI" serve --mode all --endpoint "unix://$SOCKET" --node-id "$NODE" --driver-name "$DRIVER" \
    --state-dir "$WORK/driver-state" --allowed-path-root "$KUBELET_DIR" --log-format json \
    "${POOL_ARGS[@]}" 2>>"$WORK/driver.log" &
  PLUGIN_PID=$!
  PIDS+=($PLUGIN_PID)
  wait_for_socket "$SOCKET"
}
start_plugin
"$CACHE_BIN/gds-csi-registrar" --csi-address "$SOCKET" --kubelet-registration-path "$SOCKET" \
  --plugin-registration-path "$KUBELET_DIR/plugins_registry" >"$WORK/registrar.log" 2>&1 &
PIDS+=($!)
start_provisioner "$NODE" "$SOCKET" "$WORK/provisioner.log"
PROVISIONER_PID=$!

# --- the kubelet -------------------------------------------------------------------------
ip addr replace "$NODE_IP/32" dev lo
write_kubeconfig "$WORK/kubelet.kubeconfig" "$NODE_TOKEN"
cat > "$WORK/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
cgroupDriver: cgroupfs
# This machine's cgroups are v1 (hybrid); 1.34 still runs there when told to.
failCgroupV1: false
failSwapOn: false
address: $NODE_IP
port: 64450
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 64451
podLogsDir: $WORK/pod-logs
# Loopback only and test-only: the API server reads pod logs without client certificates.
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
# The test's disk may be fuller than the default eviction thresholds allow.
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
YAML
"$CACHE_BIN/kubelet" --config "$WORK/kubelet.yaml" --kubeconfig "$WORK/kubelet.kubeconfig" \
  --root-dir "$KUBELET_DIR" --hostname-override "$NODE" --node-ip "$NODE_IP" \
  --node-labels nvidia.com/gpu.present=true --v=2 >"$WORK/kubelet.log" 2>&1 &
KUBELET_PID=$!

node_ready() { "$KUBECTL" wait "node/$NODE" --for=condition=Ready --timeout=5s; }
check "the kubelet registered $NODE and it is Ready" wait_for 120 node_ready
csinode_driver() {
  "$KUBECTL" get csinode "$NODE" -o jsonpath="{.spec.drivers[?(@.name==\"$DRIVER\")].topologyKeys}" | grep -q "$DRIVER/node"
}
check "the kubelet's plugin watcher registered the driver (CSINode with topology keys)" wait_for 60 csinode_driver
node_label() { "$KUBECTL" get node "$NODE" -o jsonpath="{.metadata.labels.gds\.csi\.gds-csi\.io/$1}"; }
check "the kubelet labelled the node from NodeGetInfo ($DRIVER/node=$NODE)" [ "$(node_label node)" = "$NODE" ]
check "the node's GDS label says no GDS here ($DRIVER/gds-nvme=false)" [ "$(node_label gds-nvme)" = false ]
check "CSIStorageCapacity shows the node's pool (128 MiB)" wait_for 60 has_capacity "$NODE" 128
echo "kubelet node ready in $((SECONDS - start)) s"

# pod NAME CLAIM SCRIPT: a run-once busybox pod on $NODE with CLAIM at /data. It runs as
# an unprivileged user and writes through fsGroup, which the kubelet applies because the
# CSIDriver says fsGroupPolicy: File (a fresh ext4 root is root-owned, mode 755).
pod() {
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  nodeSelector: {kubernetes.io/hostname: $NODE}
  restartPolicy: Never
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  securityContext: {runAsUser: 1000, runAsGroup: 1000, fsGroup: 2000}
  containers:
  - name: app
    image: $APP_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, '$3']
    volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: $2}}]
YAML
}
pvc() { # NAME CLASS
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: $2
  resources: {requests: {storage: 32Mi}}
YAML
}
pod_phase() { "$KUBECTL" get pod "$1" -o jsonpath='{.status.phase}'; }
pod_succeeded() { [ "$(pod_phase "$1")" = Succeeded ]; }
pod_gone() { ! "$KUBECTL" get pod "$1" >/dev/null 2>&1; }
events_of() { "$KUBECTL" get events -n default --field-selector "involvedObject.name=$1" -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}'; }
# called METHOD...: each METHOD succeeded at least once (the driver logs JSON, as in the chart).
called() {
  local m
  for m in "$@"; do grep '"message":"call"' "$WORK/driver.log" | grep -q "\"method\":\"$m\"" || return 1; done
}
mounted_under() { grep -c " ${1//\//\\/}" /proc/self/mountinfo || true; }

# --- gdsPolicy=required on a node without GDS: refused, with the reason -----------------
pvc gated nvme-gds
pod gated gated 'true'
refused() { events_of gated | tr '\n' ' ' | grep -q "FailedMount.*FailedPrecondition.*nvidia_fs.module"; }
check "gdsPolicy=required: the kubelet reports FailedMount naming the failed GDS check" wait_for 120 refused
events_of gated | grep FailedMount | head -1 | cut -c1-400 | sed 's/^/     /'
check "the refused pod never started" [ "$(pod_phase gated)" = Pending ]
"$KUBECTL" delete pod gated --wait=false >/dev/null
check "deleting the refused pod unstages its volume" wait_for 90 pod_gone gated
"$KUBECTL" delete pvc gated --wait=false >/dev/null

# --- gdsPolicy=preferred: write, delete the pod, read back from a new pod ----------------
TOKEN=$(random_token)
pvc data nvme-gds-preferred
# The writer stays running after writing, so its mounts can be looked at.
pod writer data "echo $TOKEN > /data/token && sync && cat /data/token && exec sleep 3600"
logs_are() { [ "$("$KUBECTL" logs "$1" 2>&1)" = "$2" ]; }
check "writer pod (uid 1000, fsGroup 2000) runs on $NODE and wrote its token (kubectl logs)" wait_for 120 logs_are writer "$TOKEN"
if ! logs_are writer "$TOKEN"; then "$KUBECTL" describe pod writer | tail -20; "$KUBECTL" logs writer; exit 1; fi
pv=$("$KUBECTL" get pvc data -o jsonpath='{.spec.volumeName}')
handle=$("$KUBECTL" get pv "$pv" -o jsonpath='{.spec.csi.volumeHandle}')
check "the kubelet called NodeStageVolume and NodePublishVolume" called NodeStageVolume NodePublishVolume
check "the volume is mounted at the kubelet's staging path" [ "$(mounted_under "$KUBELET_DIR/plugins/kubernetes.io/csi/$DRIVER/")" -ge 1 ]
check "and bind-mounted into the writer pod's volume directory" [ "$(mounted_under "$KUBELET_DIR/pods/")" -ge 1 ]

# A DaemonSet rollout or a crash: the plugin dies while the volume is in use. The pod
# keeps its mount, and the new process must still unpublish and unstage it.
kill -KILL "$PLUGIN_PID"
wait "$PLUGIN_PID" 2>/dev/null || true
start_plugin
# The provisioner exits when it loses the plugin's socket; in the DaemonSet the kubelet
# restarts that container, here the test does.
kill "$PROVISIONER_PID" 2>/dev/null || true
wait "$PROVISIONER_PID" 2>/dev/null || true
start_provisioner "$NODE" "$SOCKET" "$WORK/provisioner.log"
PROVISIONER_PID=$!
still_running() {
  [ "$("$KUBECTL" get pod writer -o jsonpath='{.status.phase}/{.status.containerStatuses[0].restartCount}')" = Running/0 ] &&
    [ "$(mounted_under "$KUBELET_DIR/pods/")" -ge 1 ]
}
check "the writer keeps running, mounts intact, across a SIGKILL and restart of the plugin" still_running

"$KUBECTL" delete pod writer --wait=false >/dev/null
unstaged() {
  [ "$(mounted_under "$KUBELET_DIR/plugins/kubernetes.io/csi/$DRIVER/")" -eq 0 ] &&
    [ "$(mounted_under "$KUBELET_DIR/pods/")" -eq 0 ]
}
check "deleting the writer pod unpublishes and unstages (no mounts left)" wait_for 60 unstaged
check "the kubelet called NodeUnpublishVolume and NodeUnstageVolume" called NodeUnpublishVolume NodeUnstageVolume

pod reader data "cat /data/token && grep -qx $TOKEN /data/token"
check "a new pod on the same node reads the file back" wait_for 120 pod_succeeded reader
check "kubectl logs shows the reader read the writer's token" logs_are reader "$TOKEN"
check "mkfs ran once for the two pods (restage kept the filesystem)" \
  [ "$(grep "formatting fresh device" "$WORK/driver.log" | grep -c "$handle")" -eq 1 ]

# --- delete: the device returns to the pool ---------------------------------------------
"$KUBECTL" delete pod reader >/dev/null
"$KUBECTL" delete pvc data --wait=false >/dev/null
pv_gone() { ! "$KUBECTL" get pv "$pv" >/dev/null 2>&1; }
check "PV deleted after the claim" wait_for 60 pv_gone
check "no mounts left under the kubelet directory" wait_for 30 unstaged
check "the node's capacity is back to 128 MiB" wait_for 60 has_capacity "$NODE" 128

echo "kubelet e2e wall time: $((SECONDS - start)) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
