#!/usr/bin/env bash
# Kubernetes' own External Storage e2e suite (test/e2e/storage/external, what production
# CSI drivers run in their CI) against the chart, installed with helm on the kubelet rig
# (tests/e2e/kubelet-rig.sh: real control plane, kubelet, containerd, runc). One driver
# definition per StorageClass the chart ships (tests/e2e/storage-suite/*.yaml) says which
# capabilities the suite may rely on; the suite copies the chart's class for each test.
#
# usage: storage-suite.sh [full|ci]
#   full (default)  every External Storage test our classes can run, on two kubelet nodes
#                   (tests/e2e/second-node.sh), each with its own pool of the same shape:
#                   the scheduler spreads the tests' pods over both, and the topology tests
#                   that need a second node (a pod whose node the class's allowedTopologies
#                   exclude stays unscheduled) run
#   ci              the tier scripts/test.sh runs: one test of each thing the classes
#                   promise (CI_TESTS), in the CI time budget, on one node
# GDS_SUITE_NODES=1|2 overrides the number of nodes.
# Prints every test run with its state and ends with `External.Storage: N passed, M failed,
# K skipped`; the runner's log and the JSON report are left in target/storage-suite/.
set -euo pipefail
TIER=${1:-full}
case $TIER in full | ci) ;; *) echo "usage: $0 [full|ci]" >&2; exit 2 ;; esac
# The suite's host-exec pods reach the node through PID 1's mount namespace
# (test/e2e/storage/utils/host_exec.go: nsenter --mount=/rootfs/proc/1/ns/mnt). This
# machine's PID 1 withholds its namespaces even from root, so the rig runs in a PID and
# mount namespace of its own whose PID 1 is this script, as a node's systemd would be.
[ "$$" = 1 ] || exec unshare --pid --fork --mount-proc bash "$0" "$@"
NODES=${GDS_SUITE_NODES:-$([ "$TIER" = full ] && echo 2 || echo 1)}
case $NODES in 1 | 2) ;; *) echo "GDS_SUITE_NODES must be 1 or 2" >&2; exit 2 ;; esac
DEPLOY=chart
RIG_KUBELET_DIR=/var/lib/kubelet
export GDS_E2E_STORAGE_SUITE=1
HERE=$(cd "$(dirname "$0")" && pwd)

# The images the suite's pods use, under the names it asks for (test/utils/image/manifest.go,
# registry.k8s.io/e2e-test-images/...): busybox, the default test image; agnhost, for
# host-exec and subPath pods (the static binary on the busybox layer). Where a test names
# nginx or jessie-dnsutils it replaces the command with a shell script
# (testsuites/volumes.go), so the busybox layer serves that name too. jessie-dnsutils is
# Debian for the tests that need GNU dd (`oflag=nocache`, storage/utils/utils.go): the
# driver image's Debian bookworm base stands in for it.
SUITE_REGISTRY=registry.k8s.io/e2e-test-images
rig_more_images() {
  local name
  for name in busybox:1.37.0-1 nginx:1.14-4; do
    build_image "$SUITE_REGISTRY/$name" "$WORK/images/suite-${name%%:*}.tar" --layer "$WORK/images/busybox" /bin/sh
  done
  build_image "$SUITE_REGISTRY/jessie-dnsutils:1.7" "$WORK/images/suite-jessie.tar" --layer "$RUNTIME_BASE" /bin/sh
  mkdir -p "$WORK/images/agnhost"
  cp "$CACHE_BIN/agnhost" "$WORK/images/agnhost/agnhost"
  build_image "$SUITE_REGISTRY/agnhost:2.56" "$WORK/images/suite-agnhost.tar" --layer "$WORK/images/busybox" \
    --layer "$WORK/images/agnhost" --entrypoint /agnhost pause
}
if [ "$NODES" = 2 ]; then
  # shellcheck source=tests/e2e/second-node.sh
  . "$HERE/second-node.sh"
fi
# shellcheck source=tests/e2e/kubelet-rig.sh
. "$HERE/kubelet-rig.sh"
[ "$NODES" = 1 ] || start_second_node
[ "$failed" -eq 0 ] || exit 1

# --- the chart, on a pool shaped for both classes -----------------------------------------
GiB=$((1 << 30))
# node_devices PREFIX: two large namespaces (sparse) for the carving class and eight of
# exactly 1 GiB for the whole-namespace class: a partition of 1 GiB or more (the partition
# class's smallest claim) does not fit a 1 GiB namespace, and each of the whole class's
# claims asks for 1 GiB.
node_devices() {
  local i
  for i in 1 2; do make_loop "$WORK/$1carve$i.img" $((48 * GiB)); done
  for i in 1 2 3 4 5 6 7 8; do make_loop "$WORK/$1whole$i.img" "$GiB"; done
}
mapfile -t DEVICES < <(node_devices "")
if [ "$NODES" = 1 ]; then
  rig_chart_values "${DEVICES[@]}"
else
  # One set of values for both nodes: each node's POOL_DIR links to its own devices.
  mapfile -t DEVICES_B < <(node_devices node-b-)
  node_pool "$NODE_B" "${DEVICES_B[@]}" >/dev/null
  rig_chart_values "$(node_pool "$NODE" "${DEVICES[@]}")"
fi
# gdsPolicy preferred: this node has no GPU; volumes publish in compat mode and say so.
helm_set+=(--set storageClasses.nvme.gdsPolicy=preferred --set storageClasses.nvmeWhole.gdsPolicy=preferred
  --set sidecars.provisioner.capacityPollInterval=5s --set sidecars.provisioner.nodeDeploymentBaseDelay=1s
  --set snapshots.enabled=true --set snapshots.class.storeDir="$WORK/snapshot-store")
check "helm install of the chart" "$HELM" install gds-csi "$HERE/../../deploy/helm/gds-csi" \
  --namespace "$NS" --create-namespace "${helm_set[@]}"
check "the node DaemonSet rolls out" "$KUBECTL" -n "$NS" rollout status ds/gds-csi-node --timeout 240s
csinode_driver() {
  [[ "$("$KUBECTL" get csinode "$1" -o jsonpath="{.spec.drivers[?(@.name==\"$DRIVER\")].name}")" == "$DRIVER" ]]
}
check "the kubelet registered the driver" wait_for 60 csinode_driver "$NODE"
[ "$NODES" = 1 ] || check "node B's kubelet registered the driver" wait_for 60 csinode_driver "$NODE_B"
[ "$failed" -eq 0 ] || exit 1
echo "node and chart ready in $((SECONDS - start)) s"

# --- the suite ------------------------------------------------------------------------------
# Left out of every tier, each for its reason (docs/testing.md, "Kubernetes' External
# Storage suite"): Windows patterns; [Disruptive] (restarts the kubelet over SSH, which this
# rig has none of); [Serial] volume limits (attach limits: the driver reports none); growing
# a mounted ext4 (the kubelet grows a volume after staging it), which needs
# CAP_SYS_RESOURCE, withheld here even from root (the xfs definition runs those tests); a clone of a raw block volume a pod is writing, which the
# driver refuses by design (no filesystem to freeze for a point-in-time copy); pre-provisioned
# snapshots: the suite's VolumeSnapshotContent carries no managed-by label, and with
# distributed snapshotting only a node's sidecar serves a content, the one its label names
# (external-snapshotter v8.7.0 cmd/csi-snapshotter/main.go:156-163; the controller labels
# only the contents it creates, pkg/common-controller/snapshot_controller.go:762-772), so
# nothing would ever answer it (docs/user-guide.md says to label an imported snapshot).
SKIP='\[Feature:Windows\]|\[Disruptive\]|\[Serial\]|\[Testpattern: Pre-provisioned Snapshot'
SKIP+='|\[Driver: gds-csi-partition\] \[Testpattern: Dynamic PV \(default fs\)(\(allowExpansion\))?\] volume-expand (should resize|Verify if offline)'
SKIP+='|\[Driver: gds-csi-partition\] \[Testpattern: Generic Ephemeral-volume \(default fs\).*\] ephemeral should support expansion'
SKIP+='|\[Testpattern: Dynamic PV \(block volmode\)\] multiVolume \[Slow\] should concurrently access the volume and its clone'
# A whole-namespace volume is as large as its namespace, and the rig's whole class has only
# 1 GiB ones: no claim larger than its 1 GiB snapshot can be placed.
SKIP+='|\[Driver: gds-csi-whole\] \[Testpattern: Dynamic PV \(default fs\)\] provisioning should provision correct filesystem size when restoring snapshot to larger size pvc'
# Every test of the two chart classes; of the xfs class, the expansion tests.
FOCUS='External.Storage (\[Driver: gds-csi-(partition|whole)\]|\[Driver: gds-csi-partition-xfs\].*(volume-expand|should support expansion))'
if [ "$TIER" = ci ]; then
  # One test of each thing the classes promise, chosen to fit the CI budget: a clone, raw
  # block, xfs, capacity, topology, online expansion, fsGroup, exec, ReadWriteOncePod (its
  # first pod publishes once, a second waits until the first is deleted, then runs), a
  # snapshot (taken, its fields checked, restored and read, deleted).
  CI_TESTS=(
    '\[Driver: gds-csi-partition\] \[Testpattern: Dynamic PV \(default fs\)\] provisioning should provision storage with pvc data source$'
    '\[Driver: gds-csi-partition\] \[Testpattern: Dynamic PV \(block volmode\)\] volumes should store data'
    '\[Driver: gds-csi-partition\] \[Testpattern: Dynamic PV \(xfs\)\] \[Slow\] volumes should store data'
    '\[Driver: gds-csi-partition\] \[Testpattern: Dynamic PV \(default fs\)\] capacity provides storage capacity information'
    '\[Driver: gds-csi-partition\] \[Testpattern: Dynamic PV \(delayed binding\)\] topology should provision a volume and schedule a pod with AllowedTopologies'
    '\[Driver: gds-csi-partition-xfs\] \[Testpattern: Dynamic PV \(default fs\)\(allowExpansion\)\] volume-expand should resize volume when PVC is edited while pod is using it'
    '\[Driver: gds-csi-whole\] \[Testpattern: Dynamic PV \(default fs\)\] fsgroupchangepolicy \(OnRootMismatch\)\[LinuxOnly\], pod created with an initial fsgroup, new pod fsgroup applied to volume contents'
    '\[Driver: gds-csi-whole\] \[Testpattern: Dynamic PV \(default fs\)\] volumes should allow exec of files on the volume'
    '\[Driver: gds-csi-partition\] \[Testpattern: Dynamic PV \(default fs\)\] read-write-once-pod.* should block a second pod from using an in-use ReadWriteOncePod volume on the same node'
    '\[Driver: gds-csi-partition\] \[Testpattern: Ephemeral Snapshot \(delete policy\)\] snapshottable.* should check snapshot fields, check restore correctly works, check deletion \(ephemeral\)'
  )
  FOCUS="External.Storage ($(IFS='|'; echo "${CI_TESTS[*]}"))"
fi
# GDS_SUITE_FOCUS narrows a run to the tests it matches (a regular expression over their names).
FOCUS="$FOCUS${GDS_SUITE_FOCUS:+.*($GDS_SUITE_FOCUS)}"
# The tests mostly wait (pods, claims, polls): more processes than cores keep the node
# busy. The CI tier runs all of its tests at once.
PROCS=${GDS_SUITE_PROCS:-6}
[ "$TIER" = full ] || PROCS=${GDS_SUITE_PROCS:-8}
REPORT=$WORK/storage-suite.json
suite_rc=0
(cd "$WORK" && "$CACHE_BIN/ginkgo" --procs "$PROCS" --timeout 2h --no-color --output-dir "$WORK" \
  --json-report storage-suite.json \
  --focus "$FOCUS" --skip "$SKIP" "$CACHE_BIN/e2e-storage.test" -- \
  --kubeconfig "$KUBECONFIG" --node-os-distro debian --allowed-not-ready-nodes 0 \
  --repo-root "$HERE/storage-suite" --storage.testdriver "$HERE/storage-suite/partition.yaml" \
  --storage.testdriver "$HERE/storage-suite/whole.yaml" --storage.testdriver "$HERE/storage-suite/partition-xfs.yaml") >"$WORK/storage-suite.log" 2>&1 || suite_rc=$?
# Each test run, by name and state; the counts. No report: the runner died (counted as a
# failure below).
[ -s "$REPORT" ] || echo '[]' >"$REPORT"
# Kept after the rig is gone: the runner's log and the report.
OUT=$REPO_ROOT/target/storage-suite
mkdir -p "$OUT"
cp "$WORK/storage-suite.log" "$REPORT" "$OUT/"
python3 - "$REPORT" <<'PY'
import json, re, sys
# The External Storage tests (the binary's few others, all filtered out, are not counted).
specs = [s for r in json.load(open(sys.argv[1])) for s in r.get("SpecReports") or []
         if s.get("LeafNodeType") == "It" and "[Driver: " in " ".join(s["ContainerHierarchyTexts"])]
counts = {"passed": 0, "failed": 0, "skipped": 0}
per_class = {}
for s in sorted(specs, key=lambda s: " ".join(s["ContainerHierarchyTexts"] + [s["LeafNodeText"]])):
    name = " ".join(s["ContainerHierarchyTexts"] + [s["LeafNodeText"]]).removeprefix("External Storage ")
    state = s["State"]
    kind = "passed" if state == "passed" else "skipped" if state in ("skipped", "pending") else "failed"
    counts[kind] += 1
    driver = re.search(r"\[Driver: ([^\]]+)\]", name)
    cls = per_class.setdefault(driver.group(1) if driver else "?", {"passed": 0, "failed": 0, "skipped": 0})
    cls[kind] += 1
    if kind != "skipped":
        print(f"{state:7} {name}")
    if kind == "failed":
        msg = (s.get("Failure") or {}).get("Message", "").strip().splitlines()
        print("        " + (msg[0] if msg else "(no message)"))
for cls, c in sorted(per_class.items()):
    print(f"{cls}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")
print(f"skipped: {counts['skipped']} (not claimed by the definitions, left out above, or outside the tier)")
with open(sys.argv[1] + ".counts", "w") as f:
    f.write(f"{counts['passed']} {counts['failed']} {counts['skipped']}\n")
PY
read -r n_passed n_failed n_skipped <"$REPORT.counts"
if [ "$suite_rc" -ne 0 ] && [ "$n_failed" -eq 0 ]; then
  # The runner failed outside any test (suite setup, a timeout): count it as a failure.
  tail -40 "$WORK/storage-suite.log"
  n_failed=1
fi
[ "$n_failed" -eq 0 ] || { failed=$((failed + 1)); grep -E '^\s*\[FAIL\]|^  \[FAILED\]' "$WORK/storage-suite.log" | head -40; }
echo "runner log and JSON report: $OUT"
echo "storage suite wall time: $((SECONDS - start)) s"
echo "External.Storage: $n_passed passed, $n_failed failed, $n_skipped skipped"
[ "$n_failed" -eq 0 ]
