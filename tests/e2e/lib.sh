# shellcheck shell=bash
# Shared by the e2e scripts: tools, a real control plane, the rendered chart, checks.
# Sourced, not run. Every process started here goes into PIDS, which e2e_stop_all ends.
E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib.sh
. "$E2E_DIR/../../scripts/lib.sh"
KUBECTL="$CACHE_BIN/kubectl"
DRIVER=gds.csi.gds-csi.io
NS=gds-csi
# Where the API server listens; tests/e2e/kubelet.sh moves it to its node's address.
API_IP=${API_IP:-127.0.0.1}
API=https://$API_IP:64430
# The Service range; the `kubernetes` Service, which in-cluster clients dial, gets its first address.
SERVICE_CIDR=10.96.0.0/24
SERVICE_IP=10.96.0.1
PIDS=()
passed=0
failed=0

check() { # check NAME COMMAND...
  if "${@:2}"; then passed=$((passed + 1)); echo "ok   - $1"; else failed=$((failed + 1)); echo "FAIL - $1"; fi
}

# succeeded METHOD LOG: the driver's text log records METHOD answered OK at least once
# (`call method=M`; a refusal is logged as `call failed method=M`, which does not match).
succeeded() { grep -qE "(^|[[:space:]])call method=$1( |\$)" "$2"; }

wait_for() { # wait_for SECONDS COMMAND...
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 1
  done
}

# e2e_tools TOOL...: builds (or finds cached) the pinned Kubernetes parts and the driver.
e2e_tools() {
  local build_start=$SECONDS
  bash "$E2E_DIR/build-tools.sh"
  build_driver
  local t
  for t in "$@"; do
    [ -x "$CACHE_BIN/$t" ] || { echo "missing $t" >&2; return 1; }
  done
  echo "tools ready in $((SECONDS - build_start)) s"
}

# Newest first, each waited for: a client before the API server, the API server before its
# etcd (stopped together, it hung in its shutdown for minutes, its in-flight requests waiting
# on the gone etcd). Whatever is left 30 s after the first signal gets SIGKILL.
e2e_stop_all() {
  local i killer
  [ ${#PIDS[@]} -gt 0 ] || return 0
  (sleep 30; kill -KILL "${PIDS[@]}") >/dev/null 2>&1 &
  killer=$!
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    kill "${PIDS[i]}" 2>/dev/null || true
    wait "${PIDS[i]}" 2>/dev/null || true
  done
  kill "$killer" 2>/dev/null || true
  wait "$killer" 2>/dev/null || true
}

# controller_workdir NAME: WORK, a temporary directory that goes on exit with the control
# plane and the controller under test (its pid in CTRL_PID, when one runs).
controller_workdir() {
  WORK=$(mktemp -d "/tmp/$1.XXXXXX")
  CTRL_PID=
  trap controller_cleanup EXIT
}
controller_cleanup() {
  [ -z "$CTRL_PID" ] || kill "$CTRL_PID" 2>/dev/null || true
  e2e_stop_all
  rm -rf "$WORK"
}

# write_kubeconfig FILE TOKEN
write_kubeconfig() {
  cat > "$1" <<KC
apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: $API, certificate-authority: $WORK/pki/ca.crt}}]
users: [{name: user, user: {token: $2}}]
contexts: [{name: e2e, context: {cluster: e2e, user: user}}]
current-context: e2e
KC
}

random_token() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

# The cluster's CA and the API server's certificate for every name a client may use:
# the loopback or node address, and the `kubernetes` Service's ClusterIP, which is what
# pods' in-cluster clients dial. The controller manager publishes the CA to every
# namespace (kube-root-ca.crt), so pods verify the server as in a real cluster.
make_pki() {
  local pki=$WORK/pki
  mkdir -p "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 1 \
    -subj /CN=gds-csi-e2e-ca 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" \
    -subj /CN=kube-apiserver 2>/dev/null
  printf '%s\n' "subjectAltName=IP:$API_IP,IP:$SERVICE_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" \
    "extendedKeyUsage=serverAuth" > "$pki/apiserver.ext"
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 1 -extfile "$pki/apiserver.ext" -out "$pki/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
}

# start_control_plane CONTROLLERS [TOKEN_LINE...]: etcd, kube-apiserver (Node and RBAC
# authorization) on $API_IP, kube-controller-manager running CONTROLLERS, kube-scheduler.
# Exports KUBECONFIG as the admin. TOKEN_LINEs ("token,user,uid,groups") add API users.
start_control_plane() {
  local controllers=$1; shift
  local admin_token
  admin_token=$(random_token)
  make_pki
  { echo "$admin_token,admin,admin,system:masters"; printf '%s\n' "$@"; } > "$WORK/pki/tokens.csv"

  "$CACHE_BIN/etcd" --data-dir "$WORK/etcd" --listen-client-urls http://127.0.0.1:23790 \
    --advertise-client-urls http://127.0.0.1:23790 --listen-peer-urls http://127.0.0.1:23800 \
    --initial-advertise-peer-urls http://127.0.0.1:23800 --initial-cluster default=http://127.0.0.1:23800 \
    >"$WORK/etcd.log" 2>&1 &
  PIDS+=($!)
  "$CACHE_BIN/kube-apiserver" --etcd-servers http://127.0.0.1:23790 --bind-address "$API_IP" \
    --advertise-address "$API_IP" --secure-port 64430 \
    --tls-cert-file "$WORK/pki/apiserver.crt" --tls-private-key-file "$WORK/pki/apiserver.key" \
    --token-auth-file "$WORK/pki/tokens.csv" --authorization-mode Node,RBAC \
    --service-account-key-file "$WORK/pki/sa.pub" --service-account-signing-key-file "$WORK/pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range "$SERVICE_CIDR" \
    --kubelet-preferred-address-types InternalIP --allow-privileged=true \
    --enable-priority-and-fairness=false >"$WORK/apiserver.log" 2>&1 &
  PIDS+=($!)
  write_kubeconfig "$WORK/admin.kubeconfig" "$admin_token"
  export KUBECONFIG="$WORK/admin.kubeconfig"
  wait_for 90 "$KUBECTL" get --raw /readyz || { tail -30 "$WORK/apiserver.log"; return 1; }
  "$CACHE_BIN/kube-controller-manager" --kubeconfig "$KUBECONFIG" --controllers "$controllers" \
    --service-account-private-key-file "$WORK/pki/sa.key" --root-ca-file "$WORK/pki/ca.crt" \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port 0 >"$WORK/controller-manager.log" 2>&1 &
  PIDS+=($!)
  "$CACHE_BIN/kube-scheduler" --kubeconfig "$KUBECONFIG" --leader-elect=false \
    --bind-address 127.0.0.1 --secure-port 0 >"$WORK/scheduler.log" 2>&1 &
  PIDS+=($!)
}

# apply_chart: the namespace and the rendered chart's CSIDriver, RBAC and StorageClasses,
# plus a kubeconfig ($WORK/sa.kubeconfig) holding the node ServiceAccount's token, so the
# sidecars run with exactly the chart's RBAC.
apply_chart() {
  "$KUBECTL" create namespace "$NS" >/dev/null
  python3 - "$E2E_DIR/../../deploy/manifests/gds-csi.yaml" > "$WORK/chart.yaml" <<'PY'
import sys, yaml
keep = {"CSIDriver", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "StorageClass"}
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") in keep]
print(yaml.safe_dump_all(docs))
PY
  "$KUBECTL" apply -f "$WORK/chart.yaml" >/dev/null
  write_kubeconfig "$WORK/sa.kubeconfig" "$("$KUBECTL" -n "$NS" create token gds-csi-node --duration 2h)"
}

# start_provisioner NODE SOCKET LOG: external-provisioner in distributed mode, as the
# chart's DaemonSet runs it next to each node plugin.
start_provisioner() {
  NODE_NAME=$1 NAMESPACE=$NS "$CACHE_BIN/csi-provisioner" --csi-address "$2" \
    --kubeconfig "$WORK/sa.kubeconfig" --node-deployment=true --node-deployment-immediate-binding=true \
    --node-deployment-base-delay=1s \
    --feature-gates=Topology=true --strict-topology --immediate-topology=false --enable-capacity=true \
    --capacity-ownerref-level=-1 --capacity-poll-interval=5s --leader-election=false \
    --extra-create-metadata --v=3 >>"$3" 2>&1 &
  PIDS+=($!)
}

# app_pod NAME NODE SCRIPT [CONTAINER [SPEC]]: a run-once busybox pod running SCRIPT on NODE
# (where the scheduler puts it when empty), in namespace POD_NS (default), with the one-line
# YAML fields CONTAINER added to its container (volumeMounts, volumeDevices, resources) and
# SPEC to its spec (volumes, securityContext), `;` between two fields.
app_pod() {
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: ${POD_NS:-default}}
spec:
  ${2:+nodeSelector: {kubernetes.io/hostname: $2\}}
  restartPolicy: Never
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  $(printf '%s' "${5:-}" | sed 's/; */\n  /g')
  containers:
  - name: app
    image: $APP_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, '$3']
    $(printf '%s' "${4:-}" | sed 's/; */\n    /g')
YAML
}

# claim_pod NAME CLAIM SCRIPT [NODE]: an app_pod with CLAIM at /data. It runs as an
# unprivileged user and writes through fsGroup, which the kubelet applies because the
# CSIDriver says fsGroupPolicy: File (a fresh ext4 root is root-owned, mode 755).
claim_pod() {
  app_pod "$1" "${4:-}" "$3" "volumeMounts: [{name: data, mountPath: /data}]" \
    "securityContext: {runAsUser: 1000, runAsGroup: 1000, fsGroup: 2000}; volumes: [{name: data, persistentVolumeClaim: {claimName: $2}}]"
}
pod_phase() { "$KUBECTL" get pod "$1" -o jsonpath='{.status.phase}'; }
# label_of NODE KEY: the node's label KEY, empty when it has none.
label_of() {
  "$KUBECTL" get node "$1" -o json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["metadata"]["labels"].get(sys.argv[1], ""))' "$2"
}
# resource_of NODE RESOURCE [capacity|allocatable]: the node's count of an extended resource.
resource_of() {
  "$KUBECTL" get node "$1" -o json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["status"][sys.argv[2]].get(sys.argv[1], "0"))' \
      "$2" "${3:-capacity}"
}
# in_batches SIZE FROM TO COMMAND...: COMMAND A B for each [A, B) of at most SIZE in [FROM, TO)
# (the scale benchmarks create their objects so, one apply a batch).
in_batches() {
  local size=$1 from=$2 to=$3 at; shift 3
  for ((at = from; at < to; at += size)); do
    "$@" "$at" $((at + size < to ? at + size : to))
  done
}
# events_of NAME [NAMESPACE]: the reasons and messages of the events of object NAME.
events_of() { "$KUBECTL" get events -n "${2:-default}" --field-selector "involvedObject.name=$1" -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}'; }

pvc() { # NAME CLASS SIZE [SOURCE_CLAIM: a clone of that claim, its dataSource]
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: $2
  resources: {requests: {storage: $3}}${4:+
  dataSource: {kind: PersistentVolumeClaim, name: $4\}}
YAML
}
pvc_phase() { "$KUBECTL" get pvc "$1" -o jsonpath='{.status.phase}'; }
is_bound() { [ "$(pvc_phase "$1")" = Bound ]; }

# capacity_of NODE [CLASS [FIELD]]: MiB that node's CSIStorageCapacity objects report for
# CLASS (default nvme-gds-whole) in FIELD (capacity, or maximumVolumeSize: the largest).
capacity_of() {
  "$KUBECTL" -n "$NS" get csistoragecapacities -o json | python3 -c '
import json, sys
units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
def quantity(s):
    for suffix, mult in units.items():
        if s.endswith(suffix):
            return int(float(s[:-2]) * mult)
    return int(s or 0)
node, key, cls, field = sys.argv[1:5]
values = [quantity(i.get(field, "0")) for i in json.load(sys.stdin)["items"]
          if i["nodeTopology"]["matchLabels"].get(key) == node and i["storageClassName"] == cls]
print((max(values, default=0) if field == "maximumVolumeSize" else sum(values)) >> 20)' \
    "$1" "$DRIVER/node" "${2:-nvme-gds-whole}" "${3:-capacity}"
}
has_capacity() { [ "$(capacity_of "$1" "${3:-nvme-gds-whole}")" = "$2" ]; } # NODE MIB [CLASS]

# gds_fixture_host DIR: the files the GDS node checks read on a GPU node (the GPU driver,
# cufile.json with compat mode off, IOMMU passthrough, a 5.15 kernel, an empty udev
# database), under DIR: this machine has no GPU. nvidia_fs is not loaded yet.
gds_fixture_host() {
  mkdir -p "$1/proc/driver/nvidia/gpus/0000:18:00.0" "$1/proc/sys/kernel" "$1/dev" "$1/sys/module" \
    "$1/etc" "$1/run/udev/data"
  echo "Model: NVIDIA H200" >"$1/proc/driver/nvidia/gpus/0000:18:00.0/information"
  : >"$1/dev/nvidia0"
  echo "BOOT_IMAGE=/vmlinuz ro iommu=pt" >"$1/proc/cmdline"
  echo "5.15.0-100-generic" >"$1/proc/sys/kernel/osrelease"
  cat >"$1/etc/cufile.json" <<'JSON'
{ "logging": { "level": "ERROR" },
  "properties": { "allow_compat_mode": false, "max_direct_io_size_kb": 16384 },
  "denylist": { "drivers": [], "devices": [], "mounts": [], "filesystems": [] } }
JSON
}

# gds_fixture_nvidia_fs DIR load|unload: nvidia_fs loaded (with the NVMe driver registered)
# or unloaded in the fixture host DIR. Its device node is a plain file, which the device
# plugin does not hand out to containers.
gds_fixture_nvidia_fs() {
  if [ "$2" = load ]; then
    mkdir -p "$1/sys/module/nvidia_fs" "$1/proc/driver/nvidia-fs"
    echo "2.20.5" >"$1/sys/module/nvidia_fs/version"
    echo "version: 2.20" >"$1/proc/driver/nvidia-fs/version"
    echo "nvme: 1" >"$1/proc/driver/nvidia-fs/modules"
    : >"$1/dev/nvidia-fs0"
  else
    rm -rf "$1/sys/module/nvidia_fs" "$1/proc/driver/nvidia-fs" "$1/dev/nvidia-fs0"
  fi
}
