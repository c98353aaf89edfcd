# shellcheck shell=bash
# A second kubelet node beside the kubelet rig's, sourced by a two-node test before
# kubelet-rig.sh (which then keeps its image archives and registers this node's identity),
# started with start_second_node once the rig's node is Ready.
#
# The node is kept apart as a real one is: its own network namespace (its node IP on a veth
# pair to the host, its pods' bridge and CIDR, its kube-proxy's iptables), its own PID
# namespace with its own /proc (a hostPID pod there, such as the storage suite's host-exec
# pod entering /proc/1/ns/mnt, reaches this node and not the rig's) and its own mount
# namespace, in which its kubelet, containerd and every container run. There, the
# per-node paths the chart's hostPath volumes name are this node's own directories mounted
# over the rig's: the kubelet root, containerd's root and state, the CNI config, the pod
# logs (a kubelet removes log directories of pods it does not run), the driver's state
# directory and the pool directory (POOL_DIR, symlinks to this node's loop
# devices). So one `helm install` with one set of values serves both nodes, each with its
# own state and drives, as on a cluster. The API server, /sys and the rest of /dev are
# shared, as the kernel is.
NODE_B=kubelet-node-b
NODE_B_IP=10.244.79.2
NODE_B_GATEWAY=10.244.79.1
NODE_B_NETNS=gdse2e-b
NODE_B_POD_CIDR=10.244.76.0/24
# The pool devices' directory on each node (node.poolDevices names paths below it).
POOL_DIR=/dev/gds-e2e-pool
NODE_B_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
# Read by kubelet-rig.sh: this node's identity, and the image archives kept for it.
# shellcheck disable=SC2034
RIG_MORE_TOKENS=("$NODE_B_TOKEN,system:node:$NODE_B,$NODE_B,system:nodes")
# shellcheck disable=SC2034
RIG_KEEP_IMAGES=1
# The node's init (PID 1 of its PID namespace, this shell's pid for it) and the nsenter
# processes its daemons run under (this shell's children, waited for at cleanup).
NODE_B_INIT=
NODE_B_PIDS=()
MADE_POOL_DIR=
# The kubelet's cgroups of this node, below the rig node's (cgroupRoot).
NODE_B_CGROUP=gds-e2e-node-b

# in_node_b COMMAND...: runs COMMAND in the second node's namespaces.
NODE_B_ENTER=()
in_node_b() { "${NODE_B_ENTER[@]}" "$@"; }
node_b_ctr() { in_node_b ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }

# node_pool NODE DEVICE...: POOL_DIR on NODE (the rig's or this one's) holds d0, d1, ...
# linking to DEVICEs; prints the paths, comma-separated, for node.poolDevices.
node_pool() {
  local node=$1 i=0 dev paths=()
  shift
  for dev in "$@"; do
    if [ "$node" = "$NODE_B" ]; then in_node_b ln -sfn "$dev" "$POOL_DIR/d$i"; else ln -sfn "$dev" "$POOL_DIR/d$i"; fi
    paths+=("$POOL_DIR/d$i")
    i=$((i + 1))
  done
  (IFS=,; echo "${paths[*]}")
}

# The network: a veth pair, the node's address on its end, the host routing its pods' CIDR.
node_b_network() {
  ip netns add "$NODE_B_NETNS"
  ip link add gdse2e-vh type veth peer name gdse2e-vb netns "$NODE_B_NETNS"
  ip addr add "$NODE_B_GATEWAY/30" dev gdse2e-vh
  ip link set gdse2e-vh up
  ip route add "$NODE_B_POD_CIDR" via "$NODE_B_IP"
  ip -n "$NODE_B_NETNS" link set lo up
  ip -n "$NODE_B_NETNS" addr add "$NODE_B_IP/30" dev gdse2e-vb
  ip -n "$NODE_B_NETNS" link set gdse2e-vb up
  ip -n "$NODE_B_NETNS" route add default via "$NODE_B_GATEWAY"
  ip netns exec "$NODE_B_NETNS" sysctl -qw net.ipv4.ip_forward=1
}

# The mount namespace, kept in a file (a private mount, as a namespace file needs), with
# this node's directories over the rig's.
node_b_mounts() {
  mkdir -p "$NODE_B_DIR/ns" "$NODE_B_DIR/kubelet" "$NODE_B_DIR/containerd/state" "$NODE_B_DIR/cni" \
    "$NODE_B_DIR/driver-state" "$WORK/driver-state" "$NODE_B_DIR/pod-logs" "$WORK/pod-logs"
  mount --bind "$NODE_B_DIR/ns" "$NODE_B_DIR/ns"
  mount --make-private "$NODE_B_DIR/ns"
  touch "$NODE_B_DIR/ns/mnt"
  unshare --mount="$NODE_B_DIR/ns/mnt" --propagation private true
  [ -d "$POOL_DIR" ] || { mkdir "$POOL_DIR" && MADE_POOL_DIR=1; }
  cp "$WORK/containerd/config.toml" "$NODE_B_DIR/containerd/"
  sed -e "s|$CNI_BRIDGE|gdse2e1|" -e "s|$POD_CIDR|$NODE_B_POD_CIDR|" "$WORK/cni/10-e2e.conflist" \
    >"$NODE_B_DIR/cni/10-e2e.conflist"
  # The rig node's own mounts there (copies, private) go first: a path must show one
  # mount, this node's, to containerd's propagation check.
  in_node_b umount -R "$KUBELET_DIR"
  in_node_b umount -R "$WORK/containerd/state"
  local pair
  for pair in kubelet:"$KUBELET_DIR" containerd:"$WORK/containerd" cni:"$WORK/cni" \
    driver-state:"$WORK/driver-state" pod-logs:"$WORK/pod-logs"; do
    in_node_b mount --bind "$NODE_B_DIR/${pair%%:*}" "${pair#*:}"
  done
  in_node_b mount --make-rshared "$KUBELET_DIR"
  # The kubelet's device plugin directory is /var/lib/kubelet/device-plugins whatever its
  # root directory (k8s.io/kubelet v0.34.3
  # pkg/apis/deviceplugin/v1beta1/constants.go:30 `DevicePluginPath`): this node's own too.
  local plugins=/var/lib/kubelet/device-plugins
  if [[ "$plugins/" != "$KUBELET_DIR/"* ]]; then
    mkdir -p "$plugins" "$NODE_B_DIR/device-plugins"
    in_node_b mount --bind "$NODE_B_DIR/device-plugins" "$plugins"
  fi
  in_node_b mount --bind "$WORK/containerd/state" "$WORK/containerd/state"
  in_node_b mount --make-rshared "$WORK/containerd/state"
  in_node_b mount -t tmpfs -o size=1m,mode=0755 gds-e2e-pool "$POOL_DIR"
}

# The PID namespace: its init mounts the namespace's /proc in the node's mount namespace
# and reaps the processes it inherits (bash reaps every child it is given) until it is
# killed, which kills everything of the node.
node_b_init() {
  local ready=$NODE_B_DIR/init-ready unshare_pid
  rm -f "$ready"
  "${NODE_B_ENTER[@]}" unshare --pid --fork bash -c \
    'mount -t proc proc /proc && : >"$1" && while :; do sleep 3600 & wait $!; done' node-b-init "$ready" \
    2>>"$NODE_B_DIR/init.log" &
  unshare_pid=$!
  NODE_B_PIDS+=("$unshare_pid")
  wait_for 10 test -e "$ready" || return 1
  NODE_B_INIT=$(pgrep -P "$unshare_pid")
  NODE_B_ENTER=(nsenter --target "$NODE_B_INIT" --mount --net --pid --)
}

# node_b_daemon LOG COMMAND...: COMMAND in the background in the node's namespaces.
node_b_daemon() {
  local log=$1
  shift
  "${NODE_B_ENTER[@]}" "$@" >>"$log" 2>&1 &
  NODE_B_PIDS+=("$!")
}

# start_second_node: the node's namespaces, containerd with the rig's images, kube-proxy and
# the kubelet, Ready.
start_second_node() {
  NODE_B_DIR=$WORK/node-b
  NODE_B_ENTER=(nsenter --mount="$NODE_B_DIR/ns/mnt" --net="/run/netns/$NODE_B_NETNS" --)
  node_b_network
  node_b_mounts
  node_b_init || { echo "node B's PID namespace did not start" >&2; return 1; }
  node_b_daemon "$NODE_B_DIR/containerd.log" containerd --config "$WORK/containerd/config.toml"
  wait_for 30 node_b_ctr version || { tail -20 "$NODE_B_DIR/containerd.log"; return 1; }
  local image
  for image in "$WORK"/images/*.tar; do node_b_ctr images import "$image" >/dev/null; done
  rm -f "$WORK"/images/*.tar
  node_b_daemon "$NODE_B_DIR/kube-proxy.log" "$CACHE_BIN/kube-proxy" --kubeconfig "$WORK/kube-proxy.kubeconfig" \
    --hostname-override "$NODE_B" --proxy-mode iptables --cluster-cidr "$NODE_B_POD_CIDR" --conntrack-max-per-core 0 \
    --bind-address "$NODE_B_IP" --healthz-bind-address 127.0.0.1:64452 --metrics-bind-address 127.0.0.1:64453
  local cg
  for cg in /sys/fs/cgroup/*/; do
    mkdir -p "$cg$NODE_B_CGROUP"
    # A v1 cpuset child starts with no CPUs or memory nodes: give it its parent's.
    [ ! -e "${cg}cpuset.cpus" ] || { cat "${cg}cpuset.cpus" >"$cg$NODE_B_CGROUP/cpuset.cpus"
      cat "${cg}cpuset.mems" >"$cg$NODE_B_CGROUP/cpuset.mems"; }
  done
  write_kubeconfig "$NODE_B_DIR/kubelet.kubeconfig" "$NODE_B_TOKEN"
  sed -e "s|^address: .*|address: $NODE_B_IP|" "$WORK/kubelet.yaml" >"$NODE_B_DIR/kubelet.yaml"
  echo "cgroupRoot: /$NODE_B_CGROUP" >>"$NODE_B_DIR/kubelet.yaml"
  node_b_daemon "$NODE_B_DIR/kubelet.log" "$CACHE_BIN/kubelet" --config "$NODE_B_DIR/kubelet.yaml" \
    --kubeconfig "$NODE_B_DIR/kubelet.kubeconfig" --root-dir "$KUBELET_DIR" --hostname-override "$NODE_B" \
    --node-ip "$NODE_B_IP" --node-labels nvidia.com/gpu.present=true --v=2
  node_b_ready() { "$KUBECTL" wait "node/$NODE_B" --for=condition=Ready --timeout=5s; }
  check "the second kubelet registered $NODE_B (own network, PID and mount namespaces) and it is Ready" \
    wait_for 120 node_b_ready
}

rig_more_cleanup() {
  [ -n "${NODE_B_DIR:-}" ] || return 0
  # Its init killed, the kernel kills every process of the node (kubelet, containerd, its
  # shims and containers, kube-proxy).
  [ -z "$NODE_B_INIT" ] || kill -KILL "$NODE_B_INIT"
  [ ${#NODE_B_PIDS[@]} -eq 0 ] || wait "${NODE_B_PIDS[@]}" 2>/dev/null
  # Every mount of the node lives in its namespace: it goes with the namespace file.
  umount "$NODE_B_DIR/ns/mnt" 2>/dev/null
  umount "$NODE_B_DIR/ns" 2>/dev/null
  ip route del "$NODE_B_POD_CIDR" 2>/dev/null
  ip link del gdse2e-vh 2>/dev/null
  ip netns del "$NODE_B_NETNS" 2>/dev/null
  [ -z "$MADE_POOL_DIR" ] || rm -rf "$POOL_DIR"
  find /sys/fs/cgroup/*/"$NODE_B_CGROUP" -depth -type d -exec rmdir {} + 2>/dev/null
  return 0
}
