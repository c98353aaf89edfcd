# shellcheck shell=bash
# Shared helpers for the test and demo scripts: tool installs and loop-device pools.
# Sourced, not run. Everything made here is recorded so cleanup can undo it.

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Outside the checkout, so a fresh clone on the same machine (CI) reuses built tools.
CACHE_BIN="${GDS_CSI_CACHE_BIN:-$HOME/.cache/gds-csi/bin}"
CSI_SANITY_VERSION=v5.6.0
HELM_VERSION=v3.19.0
HELM="$CACHE_BIN/helm"
export PATH="$CACHE_BIN:$PATH"
# Where cargo puts what it builds.
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO_ROOT/target}

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "$0 needs root (loop devices, mkfs, mount)" >&2
    exit 1
  fi
}

# Debian packages the driver and its tests call.
install_host_tools() {
  local missing=()
  command -v mkfs.xfs >/dev/null || missing+=(xfsprogs)
  command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
  command -v losetup >/dev/null || missing+=(util-linux)
  command -v sfdisk >/dev/null || missing+=(fdisk)
  # tests/partition_*.rs: sgdisk checks the driver's GPT labels independently.
  command -v sgdisk >/dev/null || missing+=(gdisk)
  command -v bc >/dev/null || missing+=(bc)
  command -v openssl >/dev/null || missing+=(openssl)
  command -v shellcheck >/dev/null || missing+=(shellcheck)
  command -v python3 >/dev/null || missing+=(python3)
  # tests/helm.sh's structural checks parse the rendered YAML.
  python3 -c 'import yaml' 2>/dev/null || missing+=(python3-yaml)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# version_at_least HAVE WANT: dotted versions, numerically.
version_at_least() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

# ensure_cargo: a cargo and rustc of at least the workspace's rust-version. Debian 12's own
# rustc is 1.63; its rustc-web and cargo-web (bookworm security updates) are new enough.
ensure_cargo() {
  local want have
  want=$(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' "$REPO_ROOT/Cargo.toml" | head -n1)
  have=$(cargo --version 2>/dev/null | awk '{print $2}' || true)
  if [ -n "$have" ] && version_at_least "$have" "$want"; then return 0; fi
  echo "Rust $want or newer is needed (found: ${have:-no cargo}); installing Debian's rustc-web and cargo-web"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rustc-web cargo-web >/dev/null ||
    { echo "could not install rustc-web/cargo-web: install Rust $want or newer (https://rustup.rs) and retry" >&2; exit 1; }
  hash -r
  have=$(cargo --version 2>/dev/null | awk '{print $2}' || true)
  if [ -z "$have" ] || ! version_at_least "$have" "$want"; then
    # bookworm's own rustc-web is 1.85; bookworm-security carries the newer one.
    echo "Debian's rustc-web here is ${have:-missing}, older than $want: add bookworm-security to the apt" \
      "sources (a standard Debian 12 install has it) or install Rust from https://rustup.rs, then retry" >&2
    exit 1
  fi
}

# ensure_go: a Go toolchain as new as the test tools' go.mod files ask (tests/e2e/tools),
# for the tools built with `go install` (csi-sanity, helm, the e2e's Kubernetes parts).
# Debian 12 has Go 1.19: the toolchain comes from the Go module proxy then (the module
# golang.org/toolchain, as Go's own GOTOOLCHAIN downloads it), into the cache.
ensure_go() {
  local want have dir zip
  want=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$REPO_ROOT"/tests/e2e/tools/*/go.mod | sort -V | tail -n1)
  have=$(go env GOVERSION 2>/dev/null | sed 's/^go//' || true)
  if [ -n "$have" ] && version_at_least "$have" "$want"; then return 0; fi
  dir="$HOME/.cache/gds-csi/go$want"
  if [ ! -x "$dir/bin/go" ]; then
    echo "Go $want or newer is needed (found: ${have:-no go}); fetching go$want from the Go module proxy"
    command -v curl >/dev/null || { apt-get update -qq && apt-get install -y -qq curl >/dev/null; }
    zip=$(mktemp --suffix .zip)
    curl -fsSL -o "$zip" "https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-go$want.linux-amd64.zip" ||
      { rm -f "$zip"; echo "could not fetch Go $want: install it (https://go.dev/dl) and retry" >&2; exit 1; }
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    python3 -m zipfile -e "$zip" "$dir.tmp" && rm -f "$zip"
    mv "$dir.tmp/golang.org/toolchain@v0.0.1-go$want.linux-amd64" "$dir" && rm -rf "$dir.tmp"
    chmod -R u+x "$dir/bin" "$dir/pkg/tool"
  fi
  export PATH="$dir/bin:$PATH"
}

# ensure_rust_lints: the test suite's fmt and clippy steps need rustfmt and clippy of the
# toolchain: Debian's rustfmt-web and rust-web-clippy go with its cargo-web; for any other
# cargo (rustup's) the command to run is said at once, before anything runs.
ensure_rust_lints() {
  cargo fmt --version >/dev/null 2>&1 && cargo clippy --version >/dev/null 2>&1 && return 0
  if [ "$(command -v cargo)" = /usr/bin/cargo ] && dpkg-query -W -f='${Status}' cargo-web 2>/dev/null | grep -q installed; then
    echo "installing Debian's rustfmt-web and rust-web-clippy (for the Rust of cargo-web)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rustfmt-web rust-web-clippy >/dev/null
    cargo fmt --version >/dev/null 2>&1 && cargo clippy --version >/dev/null 2>&1 && return 0
  fi
  echo "scripts/test.sh needs rustfmt and clippy for $(cargo --version): rustup component add rustfmt clippy (https://rustup.rs)" >&2
  exit 1
}

# The container runtime the kubelet e2e test runs pods with, and what it builds its
# local images from (a static pause binary, Debian's static busybox).
install_container_runtime() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v busybox >/dev/null || missing+=(busybox-static)
  [ -e /usr/lib/x86_64-linux-gnu/libc.a ] || missing+=(libc6-dev)
  command -v gcc >/dev/null || missing+=(gcc)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# What the VM rig (tests/vm/*.sh) runs on the host, whose root the guest shares: the host
# tools, QEMU, Debian's kernel, the NFS server, soft-RoCE tools, fio, and virtme-ng (PyPI)
# in $VENV (default .cache/vng-venv).
install_vm_tools() {
  local missing=() venv="${VENV:-$REPO_ROOT/.cache/vng-venv}"
  install_host_tools
  command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
  ls /boot/vmlinuz-*-amd64 >/dev/null 2>&1 || missing+=(linux-image-amd64)
  command -v rpc.nfsd >/dev/null || missing+=(nfs-kernel-server)
  command -v mount.nfs >/dev/null || missing+=(nfs-common)
  command -v rdma >/dev/null || missing+=(rdma-core iproute2)
  command -v nvme >/dev/null || missing+=(nvme-cli)
  command -v fio >/dev/null || missing+=(fio)
  python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
  # virtme-ng builds the guest's initramfs from a busybox ("initramfs is needed, and no
  # busybox was found" without it, on a machine where nothing installed one before).
  command -v busybox >/dev/null || missing+=(busybox-static)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  if [ ! -x "$venv/bin/vng" ]; then
    echo "installing virtme-ng (PyPI) in $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q virtme-ng
  fi
}

install_csi_sanity() {
  if [ ! -x "$CACHE_BIN/csi-sanity" ]; then
    echo "installing csi-sanity $CSI_SANITY_VERSION"
    GOBIN="$CACHE_BIN" go install "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$CSI_SANITY_VERSION"
  fi
}

helm_module_version() { go version -m "$HELM" 2>/dev/null | awk '$1 == "mod" && $2 == "helm.sh/helm/v3" { print $3 }'; }

install_helm() {
  if [ "$(helm_module_version)" != "$HELM_VERSION" ]; then
    echo "installing helm $HELM_VERSION"
    GOBIN="$CACHE_BIN" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  fi
}

# build_with_progress CARGO-BUILD-ARGS...: cargo build in the checkout, saying every 20
# crates how far it got instead of a line per crate; errors and warnings as cargo prints them.
build_with_progress() {
  (cd "$REPO_ROOT" && cargo build "$@" 2>&1) | awk '
    /^ *(Compiling|Downloaded|Downloading|Updating|Locking|Adding|Blocking)/ {
      if ($1 == "Compiling" && ++n % 20 == 0) { printf "  %d crates compiled\n", n; fflush() }
      next
    }
    { print; fflush() }'
  return "${PIPESTATUS[0]}"
}

# build_driver [PROFILE]: the driver built with PROFILE (release; `dist` is the image's).
build_driver() {
  local profile=${1:-release}
  (cd "$REPO_ROOT" && cargo build --profile "$profile" --quiet --bin gds-csi)
  # shellcheck disable=SC2034 # read by the scripts that source this file
  GDS_CSI="$TARGET_DIR/$profile/gds-csi"
}

# make_loop FILE BYTES: a loop device over a sparse file of exactly BYTES. Runs in
# command substitutions, so cleanup finds the devices by their backing files.
make_loop() {
  truncate -s "$2" "$1"
  losetup --find --show "$1"
}

# partitions_of DEV: the kernel's partitions of a block device (names, one a line).
partitions_of() {
  local name; name=$(basename "$1")
  for p in /sys/block/"$name"/"$name"*; do [ -e "$p/partition" ] && basename "$p"; done
  return 0
}

# Unmount everything under DIR (deepest first), then detach our loop devices.
cleanup_dir_and_loops() {
  local dir=$1
  if [ -n "$dir" ] && [ -d "$dir" ]; then
    awk -v d="$dir" '$5 ~ "^"d {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
  fi
  if [ -n "$dir" ]; then
    # A plain loop device keeps its partitions after losetup -d (src/disk/gpt/mod.rs):
    # drop them first, so the next user of the device finds it clean.
    losetup --list --noheadings -O NAME,BACK-FILE | awk -v d="$dir/" 'index($2, d) == 1 {print $1}' |
      while read -r dev; do
        [ -z "$(partitions_of "$dev")" ] || partx -d "$dev" 2>/dev/null || true
        losetup -d "$dev" 2>/dev/null || true
      done
    rm -rf "$dir"
  fi
}

# start_workdir NAME: a fresh $WORK, torn down on any exit together with the driver whose
# pid the caller puts in $DRIVER_PID.
start_workdir() {
  WORK=$(mktemp -d "/tmp/gds-$1.XXXXXX")
  DRIVER_PID=
  trap stop_driver_and_clean EXIT
}

stop_driver_and_clean() {
  if [ -n "${DRIVER_PID:-}" ]; then
    kill "$DRIVER_PID" 2>/dev/null || true
    wait "$DRIVER_PID" 2>/dev/null || true
  fi
  cleanup_dir_and_loops "$WORK"
}

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

wait_for_socket() {
  for _ in $(seq 1 100); do
    [ -S "$1" ] && return 0
    sleep 0.1
  done
  echo "driver socket $1 did not appear" >&2
  return 1
}

# wait_for_ready SOCKET [SECONDS]: until the driver answers Probe ready (its pool scanned),
# as the sidecars wait; a socket that exists still answers Unavailable while the scan runs.
wait_for_ready() {
  "$GDS_CSI" probe --endpoint "unix://$1" --timeout "${2:-60}s"
}
