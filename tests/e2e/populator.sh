#!/usr/bin/env bash
# Datasets per claim on the kubelet rig (tests/e2e/kubelet-rig.sh: real control plane,
# kubelet, containerd, the chart installed with populator.enabled): a claim whose
# dataSourceRef names a Dataset (a directory beneath the node dataset root) arrives filled
# with it, through the populator's prime claim and fill pod, on the node the scheduler chose.
#
# Cases: two claims naming two Datasets each get their own tree (SHA-256 of every file,
# owners, modes, a symlink); the Dataset's status, read with kubectl mid-copy, moves; the
# fill pod killed mid-copy is replaced and resumes (its first line says how far the last
# got); the populator restarted and the Dataset deleted mid-copy change nothing; a missing Dataset, a claim too small for its Dataset, a nodePath outside the root
# and a symlink planted beneath the root each give the claim an event naming the cause,
# and nothing of the host is copied; deleting the claims removes the fills' objects and
# the volumes. Ends with "N passed, M failed".
set -euo pipefail
DEPLOY=chart
REPO_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# A debug build: it shares the dependencies `cargo test` built. The rig copies it into the
# driver's image beside gds-csi.
(cd "$REPO_ROOT" && cargo build --quiet -p gds-csi-populator)
GDS_CSI_POPULATOR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/debug/gds-csi-populator"
# shellcheck source=tests/e2e/kubelet-rig.sh
. "$REPO_ROOT/tests/e2e/kubelet-rig.sh"

MiB=$((1024 * 1024))
DEVICES=("$(make_loop "$WORK/dev1.img" $((512 * MiB)))" "$(make_loop "$WORK/dev2.img" $((512 * MiB)))")
ROOT=$WORK/datasets
# --- the datasets on the node ----------------------------------------------------------
# alpha: 60,000 small files (a copy of several seconds, to be watched and cut short), a
# 4 MiB file, a symlink and a private directory of another owner; beta: a few files.
python3 - "$ROOT" <<'PY'
import os, sys
root = sys.argv[1]
for d in range(300):
    os.makedirs(f"{root}/alpha/d{d}", exist_ok=True)
    for f in range(200):
        with open(f"{root}/alpha/d{d}/f{f}", "wb") as fh:
            fh.write(os.urandom(1000 + (d * 200 + f) % 2000))
with open(f"{root}/alpha/big", "wb") as fh:
    fh.write(os.urandom(4 << 20))
os.symlink("big", f"{root}/alpha/link")
os.makedirs(f"{root}/alpha/private")
with open(f"{root}/alpha/private/key", "wb") as fh:
    fh.write(b"alpha's own")
os.chown(f"{root}/alpha/private", 1234, 1234)
os.chmod(f"{root}/alpha/private", 0o700)
os.makedirs(f"{root}/beta/x")
for i in range(3):
    with open(f"{root}/beta/x/b{i}", "wb") as fh:
        fh.write(os.urandom(100_000 * (i + 1)))
with open(f"{root}/large", "wb") as fh:
    fh.truncate(0)
    for _ in range(40):
        fh.write(os.urandom(1 << 20))
os.makedirs(f"{root}/largeset")
os.rename(f"{root}/large", f"{root}/largeset/file")
PY
# A symlink beneath the root that leads out of it, and a host file it would expose.
mkdir -p "$WORK/host-secrets" && echo "host secret" >"$WORK/host-secrets/shadow"
ln -s "$WORK/host-secrets" "$ROOT/escape"
tree_digest() { (cd "$1" && find . -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1); }
ALPHA_DIGEST=$(tree_digest "$ROOT/alpha")
BETA_DIGEST=$(tree_digest "$ROOT/beta")

rig_chart_values "${DEVICES[@]}"
helm_set+=(--set populator.enabled=true --set populator.nodeDatasetRoot="$ROOT"
  --set populator.interval=1s --set populator.retryAfter=3s)
check "helm install of the chart with the populator" "$HELM" install gds-csi "$E2E_DIR/../../deploy/helm/gds-csi" \
  --namespace "$NS" --create-namespace "${helm_set[@]}"
check "the node DaemonSet rolls out" "$KUBECTL" -n "$NS" rollout status ds/gds-csi-node --timeout 180s
check "the populator Deployment rolls out" "$KUBECTL" -n "$NS" rollout status deploy/gds-csi-populator --timeout 120s
check "the Dataset CRD is served" "$KUBECTL" get crd datasets.gds-csi.io
[ "$failed" -eq 0 ] || exit 1
# The chart's carving class with gdsPolicy=preferred (this machine has no GPU).
"$KUBECTL" get storageclass nvme-gds -o json | python3 -c '
import json, sys
sc = json.load(sys.stdin)
sc["metadata"] = {"name": "nvme-gds-preferred"}
sc["parameters"]["gdsPolicy"] = "preferred"
print(json.dumps(sc))' | "$KUBECTL" apply -f - >/dev/null
"$KUBECTL" create namespace ml >/dev/null

dataset() { # dataset NAME NODEPATH
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: gds-csi.io/v1alpha1
kind: Dataset
metadata: {name: $1, namespace: ml}
spec: {nodePath: "$2", verify: checksum}
YAML
}
claim() { # claim NAME SIZE DATASET
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1, namespace: ml}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: nvme-gds-preferred
  resources: {requests: {storage: $2}}
  dataSourceRef: {apiGroup: gds-csi.io, kind: Dataset, name: $3}
YAML
}
reader() { # reader NAME CLAIM: prints the tree's digest, the private dir's owner and mode, the link
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: ml}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: $APP_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, 'cd /data && echo digest=\$(find . -type f | sort | xargs sha256sum | sha256sum | cut -d" " -f1) && echo private=\$(stat -c "%u %a" private 2>/dev/null) link=\$(readlink link)']
    volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: $2}}]
YAML
}
status_of() { # status_of DATASET CLAIM FIELD
  "$KUBECTL" -n ml get dataset "$1" -o jsonpath="{.status.claims[?(@.claim==\"$2\")].$3}" 2>/dev/null
}
has_event() { events_of "$1" ml | grep -q "$2"; }
succeeded() { [ "$("$KUBECTL" -n ml get pod "$1" -o jsonpath='{.status.phase}')" = Succeeded ]; }
uid_of() { "$KUBECTL" -n ml get pvc "$1" -o jsonpath='{.metadata.uid}'; }

dataset alpha "$ROOT/alpha"
dataset beta "$ROOT/beta"
claim c-alpha 400Mi alpha
claim c-beta 64Mi beta
reader read-alpha c-alpha
reader read-beta c-beta

# --- progress, read with kubectl mid-copy, and the fill pod killed mid-copy ---------------
copied() { status_of alpha c-alpha copiedBytes; }
total() { status_of alpha c-alpha totalBytes; }
copying() { local c; c=$(copied); [ -n "$c" ] && [ "$c" -gt 0 ] && [ "$c" -lt "$(total)" ]; }
check "the Dataset's status shows c-alpha's copy under way" wait_for 180 copying
first=$(copied)
moved() { local c; c=$(copied); [ -n "$c" ] && [ "$c" -gt "$first" ]; }
check "the status moves while the copy runs ($first bytes, then more)" wait_for 30 moved
populator_ip=$("$KUBECTL" -n "$NS" get pod -l app.kubernetes.io/component=populator -o jsonpath='{.items[0].status.podIP}')
metrics=$(curl -fsS --max-time 10 "http://$populator_ip:9824/metrics" || true)
check "the populator's metrics show the fill's bytes" \
  grep -Eq '^gds_csi_populator_copied_bytes\{.*claim="c-alpha".*\} [1-9]' <<<"$metrics"
listed=$("$KUBECTL" get datasets -n ml)
echo "  kubectl get datasets -n ml:"; sed 's/^/    /' <<<"$listed"
check "kubectl get datasets shows the fill's progress" grep -Eq '^alpha .* [0-9]+% \(' <<<"$listed"
ALPHA_UID=$(uid_of c-alpha)
killed_at=$(copied)
ALPHA_TOTAL=$(total)
check "the fill pod is killed mid-copy ($killed_at of $ALPHA_TOTAL bytes)" \
  "$KUBECTL" -n "$NS" delete pod "populate-$ALPHA_UID" --grace-period=1 --wait=true
resumed() { "$KUBECTL" -n "$NS" logs "populate-$ALPHA_UID" 2>/dev/null | head -1 | grep -q 'resuming after'; }
check "a new fill pod resumes where the killed one stopped (no second full copy)" wait_for 60 resumed
# The populator restarted and the Dataset deleted while the copy goes on: the fill under way
# finishes with the plan its prime claim recorded.
at=$(copied)
check "the populator is restarted mid-copy ($at of $ALPHA_TOTAL bytes)" \
  "$KUBECTL" -n "$NS" delete pod -l app.kubernetes.io/component=populator --wait=true
check "Dataset alpha is deleted mid-copy" "$KUBECTL" -n ml delete dataset alpha --wait=true
check "c-alpha's reader pod runs once the claim is filled" wait_for 240 succeeded read-alpha
check "c-beta's reader pod runs once the claim is filled" wait_for 120 succeeded read-beta
out_alpha=$("$KUBECTL" -n ml logs read-alpha)
out_beta=$("$KUBECTL" -n ml logs read-beta)
check "c-alpha holds Dataset alpha (SHA-256 of every file)" grep -q "digest=$ALPHA_DIGEST" <<<"$out_alpha"
check "c-beta holds Dataset beta, not alpha" grep -q "digest=$BETA_DIGEST" <<<"$out_beta"
check "owners, modes and symlinks are kept (private 1234 700, link -> big)" \
  grep -q "private=1234 700 link=big" <<<"$out_alpha"
dataset alpha "$ROOT/alpha"
alpha_done() { [ "$(status_of alpha c-alpha phase)" = Done ]; }
check "Dataset alpha made again: its status says c-alpha is Done" wait_for 30 alpha_done
check "the claim has the Filled event" has_event c-alpha Filled
node_of_pod=$("$KUBECTL" -n ml get pod read-alpha -o jsonpath='{.spec.nodeName}')
selected=$("$KUBECTL" -n ml get pvc c-alpha -o jsonpath='{.metadata.annotations.volume\.kubernetes\.io/selected-node}')
pv=$("$KUBECTL" -n ml get pvc c-alpha -o jsonpath='{.spec.volumeName}')
pv_node=$("$KUBECTL" get pv "$pv" -o jsonpath='{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}')
check "the volume is on the node the scheduler chose, where the pod ran ($selected)" \
  [ -n "$selected" -a "$node_of_pod|$pv_node" = "$selected|$selected" ]
check "the volume records the Dataset it was filled from" \
  [ "$("$KUBECTL" get pv "$pv" -o jsonpath='{.metadata.annotations.gds-csi\.io/populated-from}')" = ml/alpha ]
no_fill_objects() { [ -z "$("$KUBECTL" -n "$NS" get pods,pvc -l "gds-csi.io/claim-uid=$ALPHA_UID" -o name)" ]; }
check "the prime claim and the fill pod are gone once the claim is bound" wait_for 30 no_fill_objects

# --- bad input: each gives the claim an event naming the cause --------------------------
claim c-missing 64Mi nope
reader read-missing c-missing
check "a missing Dataset: event DatasetNotFound naming it" wait_for 60 has_event c-missing "DatasetNotFound: Dataset ml/nope not found"
dataset largeset "$ROOT/largeset"
claim c-small 16Mi largeset
reader read-small c-small
check "a claim too small for its Dataset: FillFailed saying the size to ask for" \
  wait_for 120 has_event c-small "FillFailed: .*ask for at least"
dataset outside /etc
claim c-outside 64Mi outside
reader read-outside c-outside
check "a nodePath outside the root: InvalidDataset naming the root" \
  wait_for 60 has_event c-outside "InvalidDataset: .*not beneath the node dataset root"
dataset escape "$ROOT/escape"
claim c-escape 64Mi escape
reader read-escape c-escape
check "a symlink planted beneath the root is not followed: FillFailed" \
  wait_for 120 has_event c-escape "FillFailed: .*escape"
check "nothing of the host reached a volume (no claim of the bad Datasets bound)" \
  [ -z "$("$KUBECTL" -n ml get pvc c-missing c-small c-outside c-escape -o jsonpath='{.items[*].spec.volumeName}')" ]

# --- deleting the claims removes every fill object and volume ----------------------------
"$KUBECTL" -n ml delete pod --all --grace-period=0 --force --wait=true >/dev/null 2>&1
check "the claims are deleted (the populator's finalizer released)" \
  "$KUBECTL" -n ml delete pvc --all --wait=true --timeout=120s
nothing_left() {
  [ -z "$("$KUBECTL" -n "$NS" get pods,pvc -l app.kubernetes.io/component=populate -o name)" ] &&
    [ -z "$("$KUBECTL" get pv -o name)" ]
}
check "no prime claim, fill pod or volume is left" wait_for 120 nothing_left

echo "populator e2e wall time: $((SECONDS - start)) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
