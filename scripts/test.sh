#!/usr/bin/env bash
# The whole test suite (what .ci/run calls). Needs root: the node tests use real loop
# devices, mkfs and mounts. Installs what it needs (Debian packages, csi-sanity, helm,
# the nvidia-cufile wheel, containerd and runc) from the package registries on first use.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
need_root
cd "$REPO_ROOT" || exit 1
ensure_cargo
ensure_rust_lints
ensure_go
install_host_tools
# A test that cannot run here (no root, no block device, no C compiler) fails instead of
# reporting ok (tests/common/mod.rs `skip`).
export GDS_CSI_NO_SKIP=1
# One build of each target: incremental state only costs disk (several GiB) here.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
echo "disk free for the build: $(df -h --output=avail "$REPO_ROOT" | tail -1 | tr -d ' ')"

suites_passed=0
suites_failed=0
failed_names=()
# Each suite's output is kept, so the end of the run can repeat the last lines of every
# failed one: a reader of a long log's tail sees why, not only which.
SUITE_LOGS=$REPO_ROOT/target/test-logs
rm -rf "$SUITE_LOGS"; mkdir -p "$SUITE_LOGS"
suite() {
  local name=$1; shift
  echo
  echo "=== $name"
  local start=$SECONDS log
  log=$SUITE_LOGS/$((suites_passed + suites_failed + 1)).log
  # Through a process substitution, not a pipe: a daemon a suite leaked holding the pipe
  # would otherwise keep the run waiting on tee.
  if "$@" > >(tee "$log") 2>&1; then
    suites_passed=$((suites_passed + 1)); echo "=== $name: ok ($((SECONDS - start)) s)"
  else
    suites_failed=$((suites_failed + 1)); failed_names+=("$name"); failed_logs+=("$log")
    echo "=== $name: FAILED ($((SECONDS - start)) s; disk free $(df -h --output=avail "$REPO_ROOT" | tail -1 | tr -d ' '))"
  fi
}
failed_logs=()

suite "cargo fmt --check" cargo fmt --all -- --check
# Every target with every feature (the kill points and tests/faults.rs need fault-injection),
# then the code that only the product's features build (the binary, the library, and
# what only compiles without fault-injection: src/runtime/faults.rs's no-op, tests/kill_points_off.rs),
# which reuses the first pass's dependencies.
suite "cargo clippy -D warnings (--all-features)" cargo clippy --workspace --all-targets --all-features --quiet -- -D warnings
suite "cargo clippy -D warnings (the product's features)" cargo clippy --workspace --lib --bins --test kill_points_off --quiet -- -D warnings
# shellcheck disable=SC2046 # one argument per tracked script
suite "shellcheck on every script" shellcheck -x -S warning $(git ls-files '*.sh')
# Unit tests, in-process tests and the root tests on real loop devices, on the product's
# features (tests/faults.rs needs fault-injection and is left out here; kill_points_off.rs
# proves that this build ignores GDS_CSI_FAULT_KILL_AT).
suite "cargo test" cargo test --workspace --quiet -- --skip bad_inputs_are_rejected --skip socket_is_created --skip secrets_never_reach
suite "kill points (real binary built with fault-injection, loop devices)" cargo test --quiet --features fault-injection --test faults -- --nocapture
# cargo-mutants over the data-safety lines the last change touched (bounded; scripts/mutants.sh).
suite "mutants in the changed data-safety lines" bash scripts/mutants.sh diff
suite "hostile input, socket mode, secrets in logs" cargo test --quiet --test security -- --nocapture
suite "csi-sanity on loop devices" bash tests/sanity.sh
suite "end to end on a real Kubernetes control plane" bash tests/e2e/run.sh
suite "node-loss controller on a real API server (report, recreate, restart mid-grace, controls)" bash tests/e2e/node-loss.sh
suite "end to end: helm install on a real kubelet node (containerd, runc, kube-proxy)" bash tests/e2e/kubelet.sh
suite "Datasets per claim on the kubelet node (populator, fill pod killed mid-copy, bad input)" bash tests/e2e/populator.sh
# Kubernetes' own External Storage suite against the chart on the kubelet node: one test of
# each thing the classes promise (the full run: bash tests/e2e/storage-suite.sh).
suite "Kubernetes' External Storage e2e suite (CI tier) on the kubelet node" bash tests/e2e/storage-suite.sh ci
suite "helm chart" bash tests/helm.sh
suite "Grafana dashboard: every query against Prometheus scraping a driver" bash tests/e2e/dashboard.sh
# A QEMU VM (software emulation) with real NVMe namespaces and NFS v4.1 over soft-RoCE RDMA:
# csi-sanity on both backends and the scenarios of examples/vm_scenarios.rs.
suite "VM rig: NVMe + NFS over RDMA (csi-sanity x2, scenarios)" bash tests/vm/run.sh
suite "VM rig: md RAID0 stripes on 4 throttled NVMe drives (csi-sanity, scenarios, fio)" \
  env FIO_SHARE=0 bash tests/vm/stripe.sh
# Every scenario but the figures: those time the copies against fio and cp (benchmarks,
# docs/benchmarks.md), minutes of a VM under TCG that assert nothing the others do not.
# `bash tests/vm/clone.sh` and `bash tests/vm/snapshot.sh` alone run them too.
suite "VM rig: NFS -> NVMe clones (file by file, SIGKILL and server stop mid-copy)" \
  env CLONE_SCENARIOS="volume dataset kill stop nfs populate" bash tests/vm/clone.sh
suite "VM rig: snapshots to an NFS-over-RDMA store (restore compared, live freeze, SIGKILL, server stop)" \
  env SNAPSHOT_SCENARIOS="restore live kill restore-kill delete stop" bash tests/vm/snapshot.sh
suite "cuFile probe against the real library (no GPU)" env CARGO_TARGET_DIR="$REPO_ROOT/target" bash crates/gds-check/tests/cufile-wheel.sh
# Unoptimized targets with overflow checks: half the build of optimized ones, which a
# 6 s run per target does not win back in executions.
suite "fuzzing every parser (6 s each, overflow checks)" env FUZZ_SECONDS=6 FUZZ_DEV=1 bash scripts/fuzz.sh

echo
for i in "${!failed_names[@]}"; do
  echo "=== the last lines of ${failed_names[$i]} (all of it: ${failed_logs[$i]})"
  grep -v '^\s*$' "${failed_logs[$i]}" | tail -25
done
if [ ${#failed_names[@]} -gt 0 ]; then echo "failed suites: ${failed_names[*]}"; fi
echo "suites: $suites_passed passed, $suites_failed failed"
[ "$suites_failed" -eq 0 ]
