# shellcheck shell=bash
# The kubelet node rig, sourced by kubelet.sh and storage-suite.sh with DEPLOY set (chart or
# processes): a real control plane, containerd and runc (Debian's packages), kube-proxy and a
# kubelet registered as $NODE, all on this machine, removed again on exit. No image registry
# is reachable, so every image is built here and imported into containerd: a static pause
# binary, Debian's static busybox, and (chart mode) the driver's image from scripts/image.sh
# plus images of the sidecars. Leaves the node Ready and KUBECONFIG
# set; the caller installs the driver.
# The kubelet refuses a loopback node IP; the node, the API server (which pods reach
# through kube-proxy's rules for the `kubernetes` Service) and kubectl logs use this
# address of its own, on lo, removed again at the end.
NODE_IP=10.244.78.1
export API_IP=$NODE_IP
# shellcheck source=tests/e2e/lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
need_root
install_host_tools
install_container_runtime
e2e_tools etcd kube-apiserver kube-controller-manager kube-scheduler kubectl csi-provisioner \
  kubelet kube-proxy gds-csi-registrar gds-csi-livenessprobe gds-csi-resizer csi-snapshotter snapshot-controller \
  gds-csi-csiclient
if [ "$DEPLOY" = chart ]; then
  install_helm
  RUNTIME_BASE=$(bash "$E2E_DIR/images/runtime-base.sh")
fi
WORK=$(mktemp -d /tmp/gds-kubelet.XXXXXX)
NODE=kubelet-node
# A caller may name the kubelet's root directory (RIG_KUBELET_DIR): Kubernetes' storage
# suite looks for pods' volumes under /var/lib/kubelet, whatever the kubelet says.
KUBELET_DIR=${RIG_KUBELET_DIR:-$WORK/kubelet}
if pgrep -x kubelet >/dev/null; then
  echo "a kubelet already runs on this machine: the rig needs the node to itself" >&2
  exit 1
fi
# Removed at the end only if this run made it.
MADE_KUBELET_DIR=
[ -e "$KUBELET_DIR" ] || MADE_KUBELET_DIR=1
CONTAINERD_SOCK="$WORK/containerd/containerd.sock"
# containerd's task bundles for Kubernetes containers (each one's OCI spec): what
# `gds-csi doctor --pod` reads. The chart gets it as workload.runtimeStateDir unless
# GDS_E2E_RUNTIME_STATE_DIR says otherwise (empty: not mounted, no doctor container).
RUNTIME_TASKS=$WORK/containerd/state/io.containerd.runtime.v2.task/k8s.io
CNI_BRIDGE=gdse2e0
POD_CIDR=10.244.77.0/24
IMAGES=localhost/gds-csi-e2e
PAUSE_IMAGE=$IMAGES/pause:1
APP_IMAGE=$IMAGES/busybox:1
CTR=(ctr --address "$CONTAINERD_SOCK" --namespace k8s.io)
KUBELET_PID=
CONTAINERD_PID=
KUBE_PROXY_PID=
MADE_RUN_UDEV=
# Set by a test that made /run/udev/data (this machine runs no udevd): removed at the end.
MADE_UDEV_DATA=

cleanup() {
  local status=$?
  set +e
  [ "$status" -eq 0 ] && [ "$failed" -eq 0 ] || dump_logs
  # For debugging a failure: leave everything running and say where it is.
  if [ -n "${GDS_E2E_KEEP:-}" ]; then echo "kept $WORK (kubelet $KUBELET_PID, containerd $CONTAINERD_PID)"; return; fi
  # Pods first, while the kubelet can still stop their sandboxes (network namespaces
  # included); then the kubelet, so nothing restarts what is stopped next; then any
  # container it left, containerd, and last mounts and loop devices.
  if [ -n "$KUBELET_PID" ]; then
    "$KUBECTL" delete pods --all --grace-period=1 --timeout=60s >/dev/null 2>&1
    [ "$DEPLOY" != chart ] || "$HELM" uninstall gds-csi -n "$NS" --cascade foreground --wait --timeout 60s >/dev/null 2>&1
    kill "$KUBELET_PID"; wait "$KUBELET_PID"
  fi
  # A script's own nodes go next, their pods deleted above (rig_more_cleanup).
  ! declare -F rig_more_cleanup >/dev/null || rig_more_cleanup
  if [ -n "$CONTAINERD_PID" ]; then
    for task in $("${CTR[@]}" tasks ls -q 2>/dev/null); do
      "${CTR[@]}" tasks kill --signal SIGKILL "$task" >/dev/null 2>&1
    done
    sleep 1
    kill "$CONTAINERD_PID"; wait "$CONTAINERD_PID"
  fi
  if [ -n "$KUBE_PROXY_PID" ]; then
    kill "$KUBE_PROXY_PID"; wait "$KUBE_PROXY_PID"
    "$CACHE_BIN/kube-proxy" --cleanup >/dev/null 2>&1
  fi
  remove_kubelet_iptables_chains
  e2e_stop_all
  local netns
  for netns in /run/netns/*; do
    [ -e "$netns" ] || continue
    grep -qx "${netns##*/}" "$WORK/netns-before" 2>/dev/null || ip netns del "${netns##*/}"
  done
  ip link del "$CNI_BRIDGE" 2>/dev/null
  ip addr del "$NODE_IP/32" dev lo 2>/dev/null
  [ -z "$MADE_UDEV_DATA" ] || rm -rf /run/udev/data
  [ -z "$MADE_RUN_UDEV" ] || rmdir /run/udev
  if [ -n "$MADE_KUBELET_DIR" ]; then
    cleanup_dir_and_loops "$KUBELET_DIR"
  else
    awk -v d="$KUBELET_DIR" '$5 ~ "^"d {print $5}' /proc/self/mountinfo | sort -r | xargs -r umount -l
  fi
  cleanup_dir_and_loops "$WORK"
  # The kubelet's QoS cgroups; rmdir only removes them once empty.
  find /sys/fs/cgroup/*/kubepods -depth -type d -exec rmdir {} + 2>/dev/null
}
trap cleanup EXIT
# The chains the kubelet adds to the host's iptables (kube-proxy --cleanup removes its own).
remove_kubelet_iptables_chains() {
  local cmd table chain
  for cmd in iptables ip6tables; do
    "$cmd" -t filter -D INPUT -j KUBE-FIREWALL 2>/dev/null
    "$cmd" -t filter -D OUTPUT -j KUBE-FIREWALL 2>/dev/null
    for table in filter nat mangle; do
      for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
        "$cmd" -t "$table" -F "$chain" 2>/dev/null && "$cmd" -t "$table" -X "$chain" 2>/dev/null
      done
    done
  done
}
dump_logs() {
  "$KUBECTL" get pods -A -o wide 2>/dev/null
  "$KUBECTL" get events -A 2>/dev/null | tail -20
  local f
  for f in kubelet.log containerd.log kube-proxy.log driver.log registrar.log provisioner.log resizer.log \
    other-driver.log other-resizer.log snapshot-restore.log; do
    [ -e "$WORK/$f" ] && { echo "--- $f"; tail -25 "$WORK/$f"; }
  done
  for f in "$WORK"/pod-logs/"${NS}"_*/*/*.log; do
    [ -e "$f" ] && { echo "--- $f"; tail -15 "$f"; }
  done
}
start=$SECONDS
ls /run/netns > "$WORK/netns-before" 2>/dev/null || true

# --- images, built here -----------------------------------------------------------------
build_image() { python3 "$E2E_DIR/images/build-image.py" "$@"; }
mkdir -p "$WORK/images/pause" "$WORK/images/busybox/bin"
gcc -static -O2 -o "$WORK/images/pause/pause" "$E2E_DIR/images/pause.c"
cp "$(command -v busybox)" "$WORK/images/busybox/bin/busybox"
# Every applet: the External Storage suite's pods run shell commands of all kinds.
for applet in $(busybox --list); do [ "$applet" = busybox ] || ln -s busybox "$WORK/images/busybox/bin/$applet"; done
build_image "$PAUSE_IMAGE" "$WORK/images/pause.tar" --layer "$WORK/images/pause" /pause
build_image "$APP_IMAGE" "$WORK/images/busybox.tar" --layer "$WORK/images/busybox" /bin/sh
# A script sourcing this one may add images of its own (rig_more_images, run here).
! declare -F rig_more_images >/dev/null || rig_more_images
if [ "$DEPLOY" = chart ]; then
  # The driver's image is the archive a user builds (scripts/image.sh); a script that deploys
  # the Dataset populator builds it and names it in GDS_CSI_POPULATOR. Each sidecar binary
  # goes at the path its upstream image uses (the registrar probe runs /csi-node-driver-registrar).
  GDS_CSI=$GDS_CSI GDS_CSI_NODE_LOSS=${GDS_CSI_NODE_LOSS:-} GDS_CSI_POPULATOR=${GDS_CSI_POPULATOR:-} \
    bash "$REPO_ROOT/scripts/image.sh" "$WORK/images/gds-csi.tar" "$IMAGES/gds-csi:e2e" >/dev/null
  mkdir -p "$WORK/images/provisioner" "$WORK/images/registrar" \
    "$WORK/images/livenessprobe" "$WORK/images/resizer" "$WORK/images/snapshotter" "$WORK/images/snapshot-controller"
  cp "$CACHE_BIN/csi-provisioner" "$WORK/images/provisioner/csi-provisioner"
  cp "$CACHE_BIN/gds-csi-registrar" "$WORK/images/registrar/csi-node-driver-registrar"
  cp "$CACHE_BIN/gds-csi-livenessprobe" "$WORK/images/livenessprobe/livenessprobe"
  cp "$CACHE_BIN/gds-csi-resizer" "$WORK/images/resizer/csi-resizer"
  # external-snapshotter's images hold each binary at /<name>, their entrypoint
  # (v8.7.0 cmd/csi-snapshotter/Dockerfile:6-7, cmd/snapshot-controller/Dockerfile:6-7).
  cp "$CACHE_BIN/csi-snapshotter" "$WORK/images/snapshotter/csi-snapshotter"
  cp "$CACHE_BIN/snapshot-controller" "$WORK/images/snapshot-controller/snapshot-controller"
  for part in provisioner:csi-provisioner registrar:csi-node-driver-registrar livenessprobe:livenessprobe; do
    build_image "$IMAGES/${part%%:*}:e2e" "$WORK/images/${part%%:*}.tar" --layer "$RUNTIME_BASE" \
      --layer "$WORK/images/${part%%:*}" --entrypoint "/${part##*:}"
  done
  # The resizer stand-in and external-snapshotter's two are static binaries (build-tools.sh):
  # their images need no base.
  build_image "$IMAGES/resizer:e2e" "$WORK/images/resizer.tar" --layer "$WORK/images/resizer" --entrypoint /csi-resizer
  for part in snapshotter:csi-snapshotter snapshot-controller:snapshot-controller; do
    build_image "$IMAGES/${part%%:*}:e2e" "$WORK/images/${part%%:*}.tar" --layer "$WORK/images/${part%%:*}" \
      --entrypoint "/${part##*:}"
  done
fi

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
# Pods get addresses on a bridge whose gateway is the host, so the kubelet reaches their
# probes and they reach the API server through the Service address.
cat > "$WORK/cni/10-e2e.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "gds-e2e", "plugins": [
  {"type": "bridge", "bridge": "$CNI_BRIDGE", "isGateway": true, "isDefaultGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "dataDir": "$WORK/cni/ipam"}},
  {"type": "loopback"}]}
JSON
# The node plugin's doctor container mounts containerd's task directory HostToContainer
# (`doctor --pod`), which needs it shared or a slave, as every mount is on a systemd host.
mkdir -p "$WORK/containerd/state"
mount --bind "$WORK/containerd/state" "$WORK/containerd/state"
mount --make-rshared "$WORK/containerd/state"
containerd --config "$WORK/containerd/config.toml" >"$WORK/containerd.log" 2>&1 &
CONTAINERD_PID=$!
wait_for 30 "${CTR[@]}" version || { tail -20 "$WORK/containerd.log"; exit 1; }
# Each tar goes once imported: the images share the runtime base, which containerd keeps once.
n_images=0
for image in "$WORK"/images/*.tar; do
  "${CTR[@]}" images import "$image" >/dev/null
  # A script that starts more nodes imports them there too (RIG_KEEP_IMAGES).
  [ -n "${RIG_KEEP_IMAGES:-}" ] || rm "$image"
  n_images=$((n_images + 1))
done
echo "containerd up with $n_images local images in $((SECONDS - start)) s"

# --- control plane, with the kubelet's and kube-proxy's identities ------------------------
ip addr replace "$NODE_IP/32" dev lo
NODE_TOKEN=$(random_token)
PROXY_TOKEN=$(random_token)
# RIG_MORE_TOKENS: the identities of a script's own nodes (token file lines).
start_control_plane '*' "$NODE_TOKEN,system:node:$NODE,$NODE,system:nodes" \
  "$PROXY_TOKEN,system:kube-proxy,kube-proxy," ${RIG_MORE_TOKENS[@]+"${RIG_MORE_TOKENS[@]}"}
echo "control plane up in $((SECONDS - start)) s"

# --- kube-proxy: the `kubernetes` Service's ClusterIP leads to the API server -----------
write_kubeconfig "$WORK/kube-proxy.kubeconfig" "$PROXY_TOKEN"
# --conntrack-max-per-core=0: leave the host's conntrack table size alone.
"$CACHE_BIN/kube-proxy" --kubeconfig "$WORK/kube-proxy.kubeconfig" --hostname-override "$NODE" \
  --proxy-mode iptables --cluster-cidr "$POD_CIDR" --conntrack-max-per-core 0 \
  --bind-address "$NODE_IP" --healthz-bind-address 127.0.0.1:64452 --metrics-bind-address 127.0.0.1:64453 \
  >"$WORK/kube-proxy.log" 2>&1 &
KUBE_PROXY_PID=$!
service_rules() { [[ "$(iptables -t nat -S KUBE-SERVICES)" == *"-d $SERVICE_IP/32"* ]]; }
check "kube-proxy programs the kubernetes Service ($SERVICE_IP) into iptables" wait_for 60 service_rules

# --- the kubelet -------------------------------------------------------------------------
# On a systemd host every mount is shared; here none is. The driver's Bidirectional mount
# of the kubelet dir needs it shared, as it would be on a real node.
mkdir -p "$KUBELET_DIR"
mount --bind "$KUBELET_DIR" "$KUBELET_DIR"
mount --make-rshared "$KUBELET_DIR"
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
# Test-only, on a private address: the API server reads pod logs without client certificates.
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
# The test's disk may be fuller than the default eviction thresholds allow.
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# A running pod's volumes are looked at again (online expansion: NodeExpandVolume) when the
# pod syncs (pkg/kubelet/volumemanager/populator/desired_state_of_world_populator.go:276-285,
# ReprocessPod); every 10 s instead of the default minute keeps the expansion check short.
syncFrequency: 10s
YAML
# start_kubelet: the kubelet, its log appended to (a restarted one's too).
start_kubelet() {
  "$CACHE_BIN/kubelet" --config "$WORK/kubelet.yaml" --kubeconfig "$WORK/kubelet.kubeconfig" \
    --root-dir "$KUBELET_DIR" --hostname-override "$NODE" --node-ip "$NODE_IP" \
    --node-labels nvidia.com/gpu.present=true --v=2 >>"$WORK/kubelet.log" 2>&1 &
  KUBELET_PID=$!
}
start_kubelet
node_ready() { "$KUBECTL" wait "node/$NODE" --for=condition=Ready --timeout=5s; }
check "the kubelet registered $NODE and it is Ready" wait_for 120 node_ready

# rig_chart_values DEVICE...: helm_set gets the values that point the chart at this rig:
# the images imported above, the kubelet and state directories, DEVICEs as the node's pool,
# and no cufile.json mount or NVIDIA runtime class (this node has neither).
rig_chart_values() {
  local devices
  devices=$(IFS=,; echo "$*")
  # The chart mounts the host's udev database read-only; this machine runs no udev.
  [ -d /run/udev ] || { mkdir /run/udev && MADE_RUN_UDEV=1; }
  # The GPU-less install a trial starts from (deploy/values/trial.yaml), with the
  # chart's `required` default kept on its classes: the e2e checks that it refuses here.
  helm_set=(-f "$REPO_ROOT/deploy/values/trial.yaml"
    --set storageClasses.nvme.gdsPolicy=required --set storageClasses.nvmeWhole.gdsPolicy=required
    --set "image.repository=$IMAGES/gds-csi" --set image.tag=e2e --set image.pullPolicy=Never
    --set kubeletDir="$KUBELET_DIR" --set stateDir="$WORK/driver-state"
    --set "node.poolDevices={$devices}"
    --set "workload.runtimeStateDir=${GDS_E2E_RUNTIME_STATE_DIR-$RUNTIME_TASKS}")
  # The resizer's image holds the stand-in (tests/e2e/tools/k8s/resizer): the module proxy
  # refuses github.com/kubernetes-csi/external-resizer at every version (403).
  local sidecar
  for sidecar in sidecars.provisioner:provisioner sidecars.nodeDriverRegistrar:registrar \
    sidecars.livenessProbe:livenessprobe sidecars.resizer:resizer snapshots.sidecar:snapshotter \
    snapshots.controller:snapshot-controller; do
    helm_set+=(--set "${sidecar%%:*}.image.repository=$IMAGES/${sidecar##*:}"
      --set "${sidecar%%:*}.image.tag=e2e" --set "${sidecar%%:*}.image.pullPolicy=Never")
  done
}
