#!/usr/bin/env bash
# Checks for the Helm chart in deploy/helm/gds-csi and the rendered manifests
# in deploy/manifests/. No cluster needed.
#
# Installs helm at a pinned version from the Go module proxy into
# ~/.cache/gds-csi/bin (skipped when the cached binary already is that version), then:
# helm lint --strict, helm template with defaults and with NFS enabled,
# structural checks on the output, what each Kubernetes version gets (no flags
# at all, older releases, a cluster's API list), values.schema.json against
# values.yaml and against misspelt values, and a diff of deploy/manifests/
# against a fresh render (run scripts/render-manifests.sh after changing the chart).
# Ends with "N passed, M failed"; exits non-zero on any failure. Nothing is skipped: a
# check that cannot run fails. Not done: validating the rendered objects against Kubernetes'
# OpenAPI schemas (kubeconform is not installable here and needs them from the network);
# the structural checks stand in.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
. "$ROOT/scripts/lib.sh"
CHART=deploy/helm/gds-csi
KUBE_VERSION=1.34.3 # the kubelet e2e's release
DRIVER=gds.csi.gds-csi.io
NFS_SET=(--set nfs.enabled=true --set nfs.server=nfs.example.internal --set nfs.share=/export/gds)

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok   - $1"; }
fail() { failed=$((failed + 1)); echo "FAIL - $1"; [[ $# -gt 1 ]] && printf '%s\n' "$2" | sed 's/^/       /' | head -40; return 0; }
finish() { echo "$passed passed, $failed failed"; [[ $failed -eq 0 ]]; exit $?; }

# --- helm, pinned --------------------------------------------------------
if ! install_helm; then
  fail "install helm $HELM_VERSION"
  finish
fi
if [[ "$(helm_module_version)" == "$HELM_VERSION" ]]; then
  pass "helm $HELM_VERSION available"
else
  fail "helm binary is not $HELM_VERSION (got '$(helm_module_version)')"
  finish
fi
export HELM

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --- lint --------------------------------------------------------------------
if out=$("$HELM" lint --strict "$CHART" --kube-version "$KUBE_VERSION" 2>&1); then
  pass "helm lint --strict (defaults)"
else
  fail "helm lint --strict (defaults)" "$out"
fi
if out=$("$HELM" lint --strict "$CHART" --kube-version "$KUBE_VERSION" "${NFS_SET[@]}" 2>&1); then
  pass "helm lint --strict (nfs enabled)"
else
  fail "helm lint --strict (nfs enabled)" "$out"
fi

# --- template ----------------------------------------------------------------
render() { "$HELM" template gds-csi "$CHART" --namespace gds-csi --kube-version "$KUBE_VERSION" "$@"; }

if render >"$tmp/default.yaml" 2>"$tmp/err"; then
  pass "helm template (defaults)"
else
  fail "helm template (defaults)" "$(cat "$tmp/err")"
fi
if render "${NFS_SET[@]}" >"$tmp/nfs.yaml" 2>"$tmp/err"; then
  pass "helm template (nfs enabled)"
else
  fail "helm template (nfs enabled)" "$(cat "$tmp/err")"
fi
render --set storageClasses.nvme.fsType=xfs --set node.nvmeDiscover=true \
  --set 'node.poolDevices={/dev/nvme1n1,/dev/nvme2n1}' --set cufile.mount=false \
  --set node.readOnlyRootFilesystem=false --set kubeletDir=/var/lib/k0s/kubelet >"$tmp/variant.yaml" 2>"$tmp/err" \
  && pass "helm template (xfs, discovery, pool devices, no cufile, k0s kubelet dir)" \
  || fail "helm template (xfs, discovery, pool devices, no cufile)" "$(cat "$tmp/err")"

# sidecars.resizer.enabled=false drops the resizer container and its RBAC, nothing else.
if render --set sidecars.resizer.enabled=false >"$tmp/noresizer.yaml" 2>"$tmp/err"; then
  if ! grep -qE 'csi-resizer|name: [a-z0-9-]*external-resizer' "$tmp/noresizer.yaml" && grep -q 'name: csi-resizer' "$tmp/default.yaml" \
    && [ "$(grep -c 'name: csi-provisioner' "$tmp/noresizer.yaml")" = "$(grep -c 'name: csi-provisioner' "$tmp/default.yaml")" ]; then
    pass "sidecars.resizer.enabled=false: no resizer container, no resizer RBAC"
  else
    fail "sidecars.resizer.enabled=false" "$(grep -n 'resizer' "$tmp/noresizer.yaml")"
  fi
else
  fail "helm template (resizer disabled)" "$(cat "$tmp/err")"
fi

# The node plugin's state dir is unique per driver name: two releases must never share
# one (the driver refuses a state dir another process holds). The default driver name
# keeps /var/lib/gds-csi, so an upgrade finds its state; an explicit stateDir wins.
state_dir_of() { # file -> the --state-dir argument, the hostPath and the mountPath
  grep -oE -- '--state-dir=[^" ]+' "$1" | head -1
  grep -A2 -E '^        - name: state-dir$' "$1" | grep -oE '^ +path: .+' | sed 's/^ *//' | head -1
  grep -A1 -E '^            - name: state-dir$' "$1" | grep -oE 'mountPath: .+' | head -1
}
if render --set driverName=gds2.example.com >"$tmp/renamed.yaml" 2>"$tmp/err" \
  && render --set stateDir=/srv/gds-state >"$tmp/explicit.yaml" 2>>"$tmp/err"; then
  want_default=$'--state-dir=/var/lib/gds-csi\npath: /var/lib/gds-csi\nmountPath: /var/lib/gds-csi'
  want_renamed=$'--state-dir=/var/lib/gds-csi-gds2.example.com\npath: /var/lib/gds-csi-gds2.example.com\nmountPath: /var/lib/gds-csi-gds2.example.com'
  want_explicit=$'--state-dir=/srv/gds-state\npath: /srv/gds-state\nmountPath: /srv/gds-state'
  if [[ "$(state_dir_of "$tmp/default.yaml")" == "$want_default" \
     && "$(state_dir_of "$tmp/renamed.yaml")" == "$want_renamed" \
     && "$(state_dir_of "$tmp/explicit.yaml")" == "$want_explicit" ]]; then
    pass "stateDir: /var/lib/gds-csi by default, per driver name otherwise, explicit wins"
  else
    fail "stateDir per driver name" "$(state_dir_of "$tmp/default.yaml"; state_dir_of "$tmp/renamed.yaml"; state_dir_of "$tmp/explicit.yaml")"
  fi
else
  fail "helm template (driverName / stateDir variants)" "$(cat "$tmp/err")"
fi

# Values the driver would reject must fail at render time: values.schema.json refuses
# each value on its own, naming it; the chart's own checks what takes two values.
expect_render_error() { # description, expected message, args...
  local desc=$1 msg=$2; shift 2
  if out=$(render "$@" 2>&1); then
    fail "$desc: render should fail"
  elif grep -qF -- "$msg" <<<"$out"; then
    pass "$desc"
  else
    fail "$desc: wrong error" "$out"
  fi
}
expect_render_error "nfs enabled without server is rejected" "nfs.server is required" --set nfs.enabled=true --set nfs.share=/x
expect_render_error "nfs enabled without share is rejected" "nfs.share is required" --set nfs.enabled=true --set nfs.server=s
expect_render_error "fsType other than ext4/xfs is rejected" \
  "'/storageClasses/nvme/fsType': value must be one of 'ext4', 'xfs'" --set storageClasses.nvme.fsType=btrfs
expect_render_error "unknown gdsPolicy is rejected" \
  "'/storageClasses/nvme/gdsPolicy': value must be one of 'required', 'preferred', 'disabled'" \
  --set storageClasses.nvme.gdsPolicy=always
expect_render_error "unknown layout is rejected" \
  "'/storageClasses/nvme/layout': value must be one of 'partition', 'device', 'stripe'" --set storageClasses.nvme.layout=lvm
expect_render_error "nvme-gds-whole: fsType other than ext4/xfs is rejected" \
  "'/storageClasses/nvmeWhole/fsType': value must be one of" --set storageClasses.nvmeWhole.fsType=btrfs
expect_render_error "unknown onDelete is rejected" \
  "'/nfs/onDelete': value must be one of 'delete', 'retain', 'archive'" --set nfs.onDelete=shred

# --- structure of the rendered objects (python3 + PyYAML) -----------------------
# install_host_tools installs python3-yaml; without it this suite fails, it never skips.
if ! python3 -c 'import yaml' 2>/dev/null; then
  fail "the structural checks need python3 with PyYAML (apt-get install python3-yaml)"
else
  if out=$(python3 - "$tmp/default.yaml" "$tmp/nfs.yaml" "$tmp/variant.yaml" "$DRIVER" 2>&1 <<'PY'
import sys, yaml

default_f, nfs_f, variant_f, driver = sys.argv[1:5]
errors = []

def load(path):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    seen = set()
    for d in docs:
        for k in ("apiVersion", "kind", "metadata"):
            if k not in d:
                errors.append(f"{path}: object without {k}: {str(d)[:80]}")
        key = (d.get("kind"), d.get("metadata", {}).get("namespace"), d.get("metadata", {}).get("name"))
        if key in seen:
            errors.append(f"{path}: duplicate {key}")
        seen.add(key)
        if d.get("kind") not in ("CSIDriver", "ClusterRole", "ClusterRoleBinding", "StorageClass") \
                and d["metadata"].get("namespace") != "gds-csi":
            errors.append(f"{path}: {key} is not in the release namespace")
    return docs

def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    if len(found) != 1:
        errors.append(f"expected one {kind} {name or ''}, found {len(found)}")
        return {}
    return found[0]

def check(cond, msg):
    if not cond:
        errors.append(msg)

def container(pod_spec, name):
    for c in pod_spec.get("containers", []):
        if c["name"] == name:
            return c
    errors.append(f"no container {name}")
    return {"args": [], "env": [], "volumeMounts": []}

def images(docs):
    for d in docs:
        if d["kind"] in ("DaemonSet", "Deployment"):
            for c in d["spec"]["template"]["spec"]["containers"]:
                yield c["image"]

d = load(default_f)
n = load(nfs_f)
v = load(variant_f)

# CSIDriver
cd = one(d, "CSIDriver", driver).get("spec", {})
check(cd.get("attachRequired") is False, "CSIDriver attachRequired must be false")
check(cd.get("podInfoOnMount") is True, "CSIDriver podInfoOnMount must be true")
check(cd.get("fsGroupPolicy") == "File", "CSIDriver fsGroupPolicy must be File")
check(cd.get("storageCapacity") is True, "CSIDriver storageCapacity must be true")
check(cd.get("volumeLifecycleModes") == ["Persistent"], "CSIDriver volumeLifecycleModes must be [Persistent]")

# Node DaemonSet
ds = one(d, "DaemonSet")
pod = ds.get("spec", {}).get("template", {}).get("spec", {})
check(pod.get("nodeSelector") == {"nvidia.com/gpu.present": "true"}, "node nodeSelector default")
check(pod.get("hostNetwork") is False, "node hostNetwork must be off without NFS")
drv = container(pod, "gds-csi")
for a in ("serve", "--mode=all", "--endpoint=unix:///csi/csi.sock", "--node-id=$(NODE_ID)",
          f"--driver-name={driver}", "--state-dir=/var/lib/gds-csi", "--host-sys=/host/sys",
          "--allowed-path-root=/var/lib/kubelet",
          "--host-dev=/host/dev", "--host-proc=/host/proc", "--cufile-json=/etc/cufile.json",
          "--metrics-address=0.0.0.0:9809", "--socket-mode=0660", "--mount-timeout=60s",
          "--command-timeout=300s"):
    check(a in drv["args"], f"driver arg {a} missing")
check("--nvme-discover" not in drv["args"], "--nvme-discover must be off by default")
# Readiness labels that follow the node: the driver relinks the registrar's socket, which
# it must see at the path the registrar creates it (registration-dir's hostPath) through
# its kubelet-dir mount.
check("--readiness-interval=30s" in drv["args"], "driver arg --readiness-interval=30s missing")
check(f"--registration-socket=/var/lib/kubelet/plugins_registry/{driver}-reg.sock" in drv["args"],
      f"driver must be given the registrar's socket: {drv['args']}")
check({x["name"]: x for x in pod.get("volumes", [])}.get("registration-dir", {}).get("hostPath", {}).get("path")
      == "/var/lib/kubelet/plugins_registry", "registration dir hostPath")
env = {e["name"]: e for e in drv.get("env", [])}
check(env.get("NODE_ID", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName",
      "NODE_ID must come from spec.nodeName")
check(drv.get("securityContext", {}).get("privileged") is True, "driver must be privileged")
mounts = {m["mountPath"]: m for m in drv["volumeMounts"]}
check(mounts.get("/var/lib/kubelet", {}).get("mountPropagation") == "Bidirectional",
      "kubelet dir must be Bidirectional")
for p in ("/host/dev", "/host/sys", "/run/udev", "/host/proc/driver", "/etc/cufile.json"):
    check(mounts.get(p, {}).get("readOnly") is True, f"{p} must be mounted read-only")
check(mounts.get("/dev", {}).get("name") == "host-dev",
      "the host's /dev must be mounted at /dev (partition and md nodes appear after the container starts)")
check("/var/lib/gds-csi" in mounts, "state dir must be mounted")
# The md RAID0 check reads the host's udev rules where the driver is told they are.
rules = ["/etc/udev/rules.d", "/usr/lib/udev/rules.d", "/lib/udev/rules.d"]
for rules_dir in rules:
    m = mounts.get("/host" + rules_dir, {})
    check(m.get("readOnly") is True, f"host {rules_dir} must be mounted read-only at /host{rules_dir}")
    check({x["name"]: x for x in pod.get("volumes", [])}.get(m.get("name"), {}).get("hostPath", {}).get("path")
          == rules_dir, f"the mount at /host{rules_dir} must be the host's {rules_dir}")
check("--udev-rules-dir=/host/etc/udev/rules.d,/run/udev/rules.d,/host/usr/lib/udev/rules.d,/host/lib/udev/rules.d"
      in drv["args"], f"driver must be given the mounted udev rules dirs, /etc first: {drv['args']}")
check(not mounts.get("/var/lib/gds-csi", {}).get("readOnly"), "state dir must be writable")
# The GDS device plugin, on by default: its sockets in the kubelet's device plugin directory,
# which the kubelet keeps at /var/lib/kubelet/device-plugins whatever its root directory;
# here inside the kubelet-dir mount, so no mount of its own (it would propagate back to the
# host through the Bidirectional one). What it hands the kubelet are host paths: the udev
# database at /run/udev/data (run-udev at its host path) and the state dir.
for a in ("--gds-device-plugin", "--device-plugin-dir=/var/lib/kubelet/device-plugins", "--gds-device-shares=110"):
    check(a in drv["args"], f"driver arg {a} missing")
check("/var/lib/kubelet/device-plugins" not in mounts, "no device-plugins mount inside the kubelet-dir mount")
check(mounts.get("/run/udev", {}).get("name") == "run-udev", "the udev database at the host's path")
vols = {x["name"]: x for x in pod.get("volumes", [])}
check(vols.get("state-dir", {}).get("hostPath", {}).get("path") == "/var/lib/gds-csi", "state dir must be a hostPath")
check(vols.get("socket-dir", {}).get("hostPath", {}).get("path") == f"/var/lib/kubelet/plugins/{driver}",
      "socket dir path")
prov = container(pod, "csi-provisioner")
for a in ("--node-deployment=true", "--enable-capacity=true", "--capacity-ownerref-level=0",
          "--feature-gates=Topology=true", "--strict-topology", "--immediate-topology=false",
          "--node-deployment-immediate-binding=true"):
    check(a in prov["args"], f"node provisioner arg {a} missing")
penv = {e["name"]: e for e in prov.get("env", [])}
check(penv.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName",
      "NODE_NAME must come from spec.nodeName")
for e in ("NAMESPACE", "POD_NAME"):
    check(e in penv, f"node provisioner env {e} missing (capacity ownerref)")
reg = container(pod, "node-driver-registrar")
check(f"--kubelet-registration-path=/var/lib/kubelet/plugins/{driver}/csi.sock" in reg["args"],
      "registrar registration path")
# The registrar's health is its /healthz (--http-endpoint), not the exec probe with
# --mode=kubelet-registration-probe, a no-op since node-driver-registrar v2.9.0.
check("--http-endpoint=:9821" in reg["args"], "registrar must serve /healthz (--http-endpoint=:9821)")
reg_ports = {p.get("name"): p.get("containerPort") for p in reg.get("ports", [])}
reg_probe = reg.get("livenessProbe", {}).get("httpGet", {})
check(reg_probe.get("path") == "/healthz" and reg_ports.get(reg_probe.get("port")) == 9821,
      f"registrar liveness probe must GET /healthz on its --http-endpoint port: {reg.get('livenessProbe')}")
for doc in d + n:
    if "kubelet-registration-probe" in yaml.safe_dump(doc):
        errors.append(f"{doc['kind']} {doc['metadata']['name']} still uses --mode=kubelet-registration-probe")
container(pod, "liveness-probe")
# doctor --pod reads containerd's task directory, which holds every container's rootfs and
# their copies of the kubelet's mounts: only the doctor container sees it, read-only.
tasks = "/run/containerd/io.containerd.runtime.v2.task/k8s.io"
check(tasks not in mounts and "GDS_CSI_RUNTIME_STATE_DIR" not in env,
      "the driver container must not mount containerd's task directory")
doc = container(pod, "doctor")
dmounts = {m["mountPath"]: m for m in doc.get("volumeMounts", [])}
denv = {e["name"]: e.get("value") for e in doc.get("env", [])}
check(dmounts.get(tasks, {}).get("mountPropagation") == "HostToContainer"
      and denv.get("GDS_CSI_RUNTIME_STATE_DIR") == tasks, f"doctor: containerd's tasks at {tasks}, HostToContainer")
check(all(m.get("readOnly") is True for m in dmounts.values()), f"doctor: every mount read-only: {dmounts}")
check(doc.get("securityContext", {}).get("readOnlyRootFilesystem") is True, "doctor: read-only root filesystem")
for c in pod.get("containers", []):
    if c["name"] != "gds-csi":
        sc = c.get("securityContext", {})
        check(not sc.get("privileged"), f"sidecar {c['name']} must not be privileged")
        check(sc.get("capabilities", {}).get("drop") == ["ALL"], f"sidecar {c['name']} must drop all capabilities")
    check("resources" in c and "requests" in c["resources"] and "limits" in c["resources"],
          f"container {c['name']} needs requests and limits")

# Images pinned
for img in list(images(d)) + list(images(n)):
    tag = img.rsplit(":", 1)[-1] if ":" in img.rsplit("/", 1)[-1] else ""
    check(tag and tag != "latest", f"image {img} is not pinned")
for want in ("registry.k8s.io/sig-storage/csi-provisioner:v6.", "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.",
             "registry.k8s.io/sig-storage/livenessprobe:v2."):
    check(any(i.startswith(want) for i in images(d)), f"no image {want}*")

# RBAC
cr = one(d, "ClusterRole", "gds-csi-external-provisioner")
res = {r: set(rule["verbs"]) for rule in cr.get("rules", []) for r in rule["resources"]}
for r in ("persistentvolumes", "persistentvolumeclaims", "storageclasses", "events", "csinodes", "nodes",
          "volumeattachments"):
    check(r in res, f"ClusterRole lacks {r}")
check(res.get("volumeattachments") == {"get", "list", "watch"}, "volumeattachments must be read-only")
check("secrets" not in res, "no secrets access")
roles = {r["metadata"]["name"]: r for r in d if r["kind"] == "Role"}
rres = {x for r in roles.values() for rule in r["rules"] for x in rule["resources"]}
check({"csistoragecapacities", "pods"} <= rres, "node Role needs csistoragecapacities and pods")
check("leases" not in rres, "no leases without the NFS controller")
# Expansion: a resizer per node (no leader election: each asks its own driver), its RBAC.
rsz = container(pod, "csi-resizer")
check("--leader-election=false" in rsz["args"] and "--csi-address=/csi/csi.sock" in rsz["args"],
      f"node resizer args {rsz['args']}")
check(any(i.startswith("registry.k8s.io/sig-storage/csi-resizer:v2.") for i in images(d)), "no csi-resizer v2 image")
rcr = one(d, "ClusterRole", "gds-csi-external-resizer")
rres_ = {r: set(rule["verbs"]) for rule in rcr.get("rules", []) for r in rule["resources"]}
check("patch" in rres_.get("persistentvolumes", set()) and "patch" in rres_.get("persistentvolumeclaims/status", set()),
      f"resizer ClusterRole must patch PVs and PVC status: {rres_}")
check("secrets" not in rres_, "resizer: no secrets access")
rcrb = one(d, "ClusterRoleBinding", "gds-csi-external-resizer")
check([s_["name"] for s_ in rcrb.get("subjects", [])] == ["gds-csi-node"], "resizer binding: the node account only")
check("leases" not in rres_, "resizer: no leases (no leader election)")
# Why per node (deploy/README.md, "Volume expansion"): each resizer reaches only the driver
# in its own pod, which grows its own node's volumes and answers Aborted for the others;
# a central resizer would ask a driver that holds no volume's partition.
for docs, label in ((d, "defaults"), (n, "nfs enabled")):
    for w in [x for x in docs if x["kind"] in ("DaemonSet", "Deployment", "StatefulSet")]:
        for c in w["spec"]["template"]["spec"]["containers"]:
            if "csi-resizer" not in c["image"]:
                continue
            where = f"{label}: {w['metadata']['name']}/{c['name']}"
            check(w["kind"] == "DaemonSet", f"{where}: a resizer outside the node DaemonSet")
            check({"name": "socket-dir", "mountPath": "/csi"} in c.get("volumeMounts", []),
                  f"{where}: the resizer must share the node driver's socket dir")
            check("--leader-election=false" in c["args"], f"{where}: a per-node resizer without leader election")

# StorageClasses, defaults
scs = {s["metadata"]["name"]: s for s in d if s["kind"] == "StorageClass"}
check(set(scs) == {"nvme-gds", "nvme-gds-whole"}, f"default StorageClasses: {sorted(scs)}")
# nvme-gds carves exact-size GPT partitions; nvme-gds-whole hands out whole namespaces.
for name, layout, grows in (("nvme-gds", "partition", True), ("nvme-gds-whole", "device", False)):
    nv = scs.get(name, {})
    check(nv.get("provisioner") == driver, f"{name} provisioner")
    check(nv.get("volumeBindingMode") == "WaitForFirstConsumer", f"{name} must be WaitForFirstConsumer")
    check(nv.get("allowVolumeExpansion") is grows, f"{name} allowVolumeExpansion must be {grows}")
    check(nv.get("parameters") == {"csi.storage.k8s.io/fstype": "ext4", "gdsPolicy": "required", "layout": layout},
          f"{name} parameters {nv.get('parameters')}")
check(not [x for x in d if x["kind"] == "Deployment"], "no Deployment without nfs.enabled")

# NFS enabled: the per-node provisioners are the driver's only ones, for both backends, so a
# claim of one backend can never reach a provisioner meant for the other. Claims of a
# WaitForFirstConsumer class go to the selected node's provisioner only; Immediate claims (the
# NFS class, an NVMe class that binds at once) are taken by one node's provisioner whose node
# the class admits (--node-deployment-immediate-binding).
for docs, label in ((d, "defaults"), (n, "nfs enabled")):
    check(not [x for x in docs if x["kind"] in ("Deployment", "StatefulSet")],
          f"{label}: no central controller workload (it would act on every claim of the driver)")
    for w in [x for x in docs if x["kind"] in ("DaemonSet", "Deployment", "StatefulSet")]:
        for c in w["spec"]["template"]["spec"]["containers"]:
            if "csi-provisioner" in c["image"]:
                check("--node-deployment=true" in c["args"],
                      f"{label}: {w['metadata']['name']}/{c['name']} provisions without --node-deployment")
nprov = container(one(n, "DaemonSet").get("spec", {}).get("template", {}).get("spec", {}), "csi-provisioner")
check("--node-deployment-immediate-binding=true" in nprov["args"],
      "nfs enabled: node provisioners take Immediate (NFS) claims")
check("--node-deployment-base-delay=20s" in nprov["args"], "nfs enabled: --node-deployment-base-delay from values")
# The same provisioners serve NFS claims: a --default-fstype would reach NFS CreateVolume
# as fs_type "ext4", which the driver refuses (found by tests/e2e/kubelet.sh).
check(not any(a.startswith("--default-fstype") for a in nprov["args"] + prov["args"]),
      "node provisioners must not set --default-fstype (NFS claims would get fs_type ext4)")
check("--node-deployment-immediate-binding=true" in prov["args"]
      and "--node-deployment-base-delay=20s" in prov["args"],
      "defaults: node provisioners take Immediate claims too (an NVMe class pinned by allowedTopologies)")
nroles = {x for r in n if r["kind"] == "Role" for rule in r["rules"] for x in rule["resources"]}
check("leases" not in nroles, "nfs enabled: no leader-election Role (no central provisioner)")
crb = one(n, "ClusterRoleBinding", "gds-csi-external-provisioner")
check([s_["name"] for s_ in crb.get("subjects", [])] == ["gds-csi-node"], "ClusterRoleBinding binds the node account only")
ncr = one(n, "ClusterRole", "gds-csi-external-provisioner")
nres = {r: set(rule["verbs"]) for rule in ncr.get("rules", []) for r in rule["resources"]}
check("update" in nres.get("persistentvolumeclaims", set()),
      "node provisioners may update PVCs (selected-node annotation for Immediate claims)")
nscs = {s["metadata"]["name"]: s for s in n if s["kind"] == "StorageClass"}
nfs = nscs.get("nfs-rdma-gds", {})
check(nfs.get("volumeBindingMode") == "Immediate", "nfs-rdma-gds binds Immediately")
check(nfs.get("mountOptions") == ["rdma", "port=20049", "vers=4.1"], f"nfs mountOptions {nfs.get('mountOptions')}")
check(nfs.get("parameters", {}).get("server") == "nfs.example.internal", "nfs server parameter")
check(nfs.get("parameters", {}).get("share") == "/export/gds", "nfs share parameter")
check(nfs.get("parameters", {}).get("gdsPolicy") == "required", "nfs gdsPolicy")
check(nfs.get("parameters", {}).get("onDelete") == "delete", "nfs onDelete")
nds = one(n, "DaemonSet")
check(nds.get("spec", {}).get("template", {}).get("spec", {}).get("hostNetwork") is True,
      "node DaemonSet joins the host network with NFS")

# Variant
vds = one(v, "DaemonSet")
vdrv = container(vds["spec"]["template"]["spec"], "gds-csi")
for a in ("--nvme-discover", "--pool-device=/dev/nvme1n1", "--pool-device=/dev/nvme2n1",
          "--allowed-path-root=/var/lib/k0s/kubelet",
          f"--registration-socket=/var/lib/k0s/kubelet/plugins_registry/{driver}-reg.sock"):
    check(a in vdrv["args"], f"variant: driver arg {a} missing")
vmounts = {m["mountPath"]: m for m in vdrv["volumeMounts"]}
check(vmounts.get("/var/lib/k0s/kubelet", {}).get("mountPropagation") == "Bidirectional",
      "variant: the kubelet dir is mounted at its host path")
check(not any(a.startswith("--cufile-json") for a in vdrv["args"]), "variant: no --cufile-json without the mount")
# The kubelet's device plugin directory is outside this kubelet dir: mounted on its own.
check("--device-plugin-dir=/var/lib/kubelet/device-plugins" in vdrv["args"],
      "variant: the device plugin directory stays /var/lib/kubelet/device-plugins")
vvols = {x["name"]: x for x in vds["spec"]["template"]["spec"].get("volumes", [])}
check(vmounts.get("/var/lib/kubelet/device-plugins", {}).get("name") == "device-plugins"
      and vvols.get("device-plugins", {}).get("hostPath") == {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"},
      "variant: /var/lib/kubelet/device-plugins mounted at its host path")
check(not vmounts.get("/var/lib/kubelet/device-plugins", {}).get("mountPropagation"),
      "variant: the device-plugins mount needs no propagation")
check("/etc/cufile.json" not in {m["mountPath"] for m in vdrv["volumeMounts"]}, "variant: no cufile mount")
vsc = {s["metadata"]["name"]: s for s in v if s["kind"] == "StorageClass"}
check(vsc.get("nvme-gds", {}).get("parameters", {}).get("csi.storage.k8s.io/fstype") == "xfs", "variant: xfs")

if errors:
    print("\n".join(errors))
    sys.exit(1)
PY
); then
    pass "rendered objects have the required shape (CSIDriver, DaemonSet, Deployment, RBAC, StorageClasses)"
  else
    fail "rendered objects have the required shape" "$out"
  fi
fi

# workload.devicePlugin.enabled=false: no device plugin flag and no device-plugins mount,
# with the default kubelet dir or another.
if render --set workload.devicePlugin.enabled=false --set kubeletDir=/var/lib/k0s/kubelet >"$tmp/no-dp.yaml" 2>"$tmp/err"; then
  if ! grep -qE -- '--gds-device-plugin|device-plugin' "$tmp/no-dp.yaml" && grep -q -- '--gds-device-plugin' "$tmp/default.yaml"; then
    pass "workload.devicePlugin.enabled=false: no device plugin flag, no device-plugins mount"
  else
    fail "workload.devicePlugin.enabled=false" "$(grep -n 'device-plugin' "$tmp/no-dp.yaml")"
  fi
else
  fail "helm template (device plugin disabled)" "$(cat "$tmp/err")"
fi
expect_render_error "workload.devicePlugin.shares must be at least 1" \
  "'/workload/devicePlugin/shares': minimum: got 0, want 1" --set workload.devicePlugin.shares=0

# StorageClasses can be switched off. Rendered to a file first: a render error must fail
# here, not read as "no StorageClass found".
if ! render --set storageClasses.nvme.create=false --set storageClasses.nvmeWhole.create=false "${NFS_SET[@]}" --set storageClasses.nfs.create=false \
    >"$tmp/no-sc.yaml" 2>"$tmp/err"; then
  fail "helm template (storageClasses.*.create=false)" "$(cat "$tmp/err")"
elif ! grep -q '^kind: DaemonSet' "$tmp/no-sc.yaml"; then
  fail "storageClasses.*.create=false: the render holds no DaemonSet" "$(head -20 "$tmp/no-sc.yaml")"
elif grep -q '^kind: StorageClass' "$tmp/no-sc.yaml"; then
  fail "storageClasses.*.create=false renders no StorageClass"
else
  pass "storageClasses.*.create=false renders no StorageClass"
fi

# --- chart conventions ---------------------------------------------------------------
if python3 -c 'import yaml' 2>/dev/null; then
  render "${NFS_SET[@]}" --set imageRegistry=mirror.example.com/k8s --set logLevel=debug \
    --set sidecars.logLevel=5 --set revisionHistoryLimit=3 --set seLinuxMount=true \
    --set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true >"$tmp/conv.yaml" 2>"$tmp/err" \
    || fail "helm template (conventions variant)" "$(cat "$tmp/err")"
  render --set serviceAccount.create=false --set serviceAccount.name.node=existing-sa >"$tmp/sa.yaml" 2>"$tmp/err" \
    || fail "helm template (existing ServiceAccount)" "$(cat "$tmp/err")"
  if out=$(python3 - "$tmp/default.yaml" "$tmp/nfs.yaml" "$tmp/conv.yaml" "$tmp/sa.yaml" 2>&1 <<'PY'
import sys, yaml
default, nfs, conv, sa = ([x for x in yaml.safe_load_all(open(f)) if x] for f in sys.argv[1:5])
errors = []
def check(cond, msg):
    if not cond: errors.append(msg)
def kinds(docs, kind): return [x for x in docs if x["kind"] == kind]
def pods(docs): return [x for x in docs if x["kind"] in ("DaemonSet", "Deployment")]
def arg(c, prefix): return [a for a in c.get("args", []) if a.startswith(prefix)]
for w in pods(default) + pods(nfs):
    name, spec = w["metadata"]["name"], w["spec"]["template"]["spec"]
    check(spec.get("securityContext", {}).get("seccompProfile") == {"type": "RuntimeDefault"},
          f"{name}: pod seccompProfile RuntimeDefault")
    check(w["spec"].get("revisionHistoryLimit") == 10, f"{name}: revisionHistoryLimit 10")
    cs = {c["name"]: c for c in spec["containers"]}
    check("liveness-probe" in cs, f"{name}: a liveness-probe sidecar")
    check(cs["gds-csi"].get("livenessProbe", {}).get("httpGet", {}).get("port") == "healthz",
          f"{name}: the driver's livenessProbe uses the sidecar's healthz")
    env = {e["name"]: e.get("value") for e in cs["gds-csi"].get("env", [])}
    check(env.get("RUST_LOG") == "info", f"{name}: driver RUST_LOG from logLevel")
    for c in spec["containers"]:
        for p in c.get("ports", []):
            check(len(p["name"]) <= 15, f"{name}/{c['name']}: port name {p['name']} longer than 15 (IANA_SVC_NAME)")
    prov = cs.get("csi-provisioner", {})
    check("--http-endpoint=:9820" in prov.get("args", []) and
          any(p.get("name") == "prov-metrics" and p.get("containerPort") == 9820 for p in prov.get("ports", [])),
          f"{name}: the provisioner's metrics endpoint on a named port")
    for c in spec["containers"]:
        if c["name"] not in ("gds-csi", "doctor"):
            check(arg(c, "--v=") == ["--v=2"], f"{name}/{c['name']}: --v from sidecars.logLevel")
for w in pods(conv):
    name, spec = w["metadata"]["name"], w["spec"]["template"]["spec"]
    check(w["spec"].get("revisionHistoryLimit") == 3, f"{name}: revisionHistoryLimit override")
    for c in spec["containers"]:
        check(c["image"].startswith("mirror.example.com/k8s/"), f"{name}/{c['name']}: imageRegistry override: {c['image']}")
        if c["name"] == "gds-csi":
            check({"name": "RUST_LOG", "value": "debug"} in c["env"], f"{name}: logLevel override")
        elif c["name"] != "doctor":
            check(arg(c, "--v=") == ["--v=5"], f"{name}/{c['name']}: sidecars.logLevel override")
every_metrics_port = ["metrics", "prov-metrics", "resizer-metrics"]
for docs, label in ((default, "defaults"), (conv, "conventions")):
    svcs = [x for x in kinds(docs, "Service") if x["metadata"]["name"].endswith("-metrics")]
    check(len(svcs) == 1 and [p["targetPort"] for p in svcs[0]["spec"]["ports"]] == every_metrics_port,
          f"{label}: metrics Service over the driver's, the provisioner's and the resizer's metrics")
    declared = {p["name"] for w in pods(docs) for c in w["spec"]["template"]["spec"]["containers"]
                for p in c.get("ports", []) if p["name"].endswith("metrics")}
    check(declared <= set(every_metrics_port), f"{label}: a metrics port no Service lists: {declared}")
for m in kinds(conv, "ServiceMonitor"):
    check([e["port"] for e in m["spec"]["endpoints"]] == every_metrics_port, "the ServiceMonitor scrapes every metrics port")
for m in kinds(conv, "PodMonitor"):
    check([e["port"] for e in m["spec"]["podMetricsEndpoints"]] == every_metrics_port, "the PodMonitor scrapes every metrics port")
check(not kinds(default, "ServiceMonitor") and not kinds(default, "PodMonitor"), "no monitors by default")
check(len(kinds(conv, "ServiceMonitor")) == 1 and len(kinds(conv, "PodMonitor")) == 1, "ServiceMonitor and PodMonitor when enabled")
check("seLinuxMount" not in kinds(default, "CSIDriver")[0]["spec"], "seLinuxMount off by default")
check(kinds(conv, "CSIDriver")[0]["spec"].get("seLinuxMount") is True, "seLinuxMount when enabled")
check(not kinds(sa, "ServiceAccount"), "serviceAccount.create=false renders no ServiceAccount")
check([x for x in kinds(sa, "DaemonSet")][0]["spec"]["template"]["spec"]["serviceAccountName"] == "existing-sa",
      "serviceAccount.name.node is used")
check(any(s["name"] == "existing-sa" for b in kinds(sa, "ClusterRoleBinding") + kinds(sa, "RoleBinding") for s in b["subjects"]),
      "RBAC binds the named ServiceAccount")
if errors:
    print("\n".join(errors)); sys.exit(1)
PY
); then
    pass "chart conventions: seccomp, logLevel, serviceAccount.create/name, metrics Service and monitors, seLinuxMount, imageRegistry, revisionHistoryLimit, liveness sidecars"
  else
    fail "chart conventions" "$out"
  fi
fi
# --- the Grafana dashboard ------------------------------------------------------------
# Off by default; on, a ConfigMap with the sidecar's label (configurable) whose JSON is the
# chart's file byte for byte; the monitors give every series the node label it filters by.
if python3 -c 'import yaml' 2>/dev/null; then
  render --set dashboard.enabled=true >"$tmp/dash.yaml" 2>"$tmp/err" || fail "helm template (dashboard)" "$(cat "$tmp/err")"
  render --set dashboard.enabled=true --set dashboard.label=grafana_dashboard_gds --set dashboard.labelValue=gpu \
    --set dashboard.namespace=monitoring --set dashboard.annotations.grafana_folder=Storage \
    >"$tmp/dash2.yaml" 2>"$tmp/err" || fail "helm template (dashboard, overrides)" "$(cat "$tmp/err")"
  if out=$(python3 - "$tmp/default.yaml" "$tmp/dash.yaml" "$tmp/dash2.yaml" "$tmp/conv.yaml" "$CHART/dashboards/gds-csi.json" 2>&1 <<'PY'
import json, sys, yaml
default, dash, dash2, conv = ([x for x in yaml.safe_load_all(open(f)) if x] for f in sys.argv[1:5])
source = open(sys.argv[5]).read()
errors = []
def check(cond, msg):
    if not cond: errors.append(msg)
def cms(docs): return [x for x in docs if x["kind"] == "ConfigMap"]
check(not cms(default), "no dashboard ConfigMap by default")
for docs, key, value, ns, ann in ((dash, "grafana_dashboard", "1", "gds-csi", None),
                                  (dash2, "grafana_dashboard_gds", "gpu", "monitoring", {"grafana_folder": "Storage"})):
    c = cms(docs)
    check(len(c) == 1, f"dashboard.enabled: one ConfigMap, got {len(c)}")
    if len(c) != 1:
        continue
    m = c[0]["metadata"]
    check(m["labels"].get(key) == value, f"ConfigMap label {key}={value!r}: {m['labels']}")
    check(m["namespace"] == ns, f"ConfigMap namespace {ns}: {m['namespace']}")
    check(m.get("annotations") == ann, f"ConfigMap annotations {ann}: {m.get('annotations')}")
    text = c[0]["data"].get("gds-csi.json", "")
    check(text.strip() == source.strip(), "the ConfigMap's gds-csi.json is dashboards/gds-csi.json")
    try:
        j = json.loads(text)
    except ValueError as e:
        errors.append(f"the dashboard is not valid JSON: {e}")
        continue
    names = [v["name"] for v in j.get("templating", {}).get("list", [])]
    check(names == ["datasource", "node"], f"template variables datasource and node: {names}")
    targets = [t for p in j["panels"] for t in p.get("targets", [])]
    check(targets and all(t.get("datasource", {}).get("uid") == "${datasource}" for t in targets) and
          all(p.get("datasource", {}).get("uid") == "${datasource}" for p in j["panels"] if p["type"] != "row"),
          "every panel and query reads ${datasource}")
    check(all('node=~"$node"' in t["expr"] for t in targets), "every query filters by node=~\"$node\"")
    check(len({p["id"] for p in j["panels"]}) == len(j["panels"]), "panel ids are unique")
for mon in [x for x in conv if x["kind"] in ("ServiceMonitor", "PodMonitor")]:
    eps = mon["spec"].get("endpoints") or mon["spec"].get("podMetricsEndpoints")
    check(all({"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in e.get("relabelings", [])
              for e in eps), f"{mon['kind']}: every endpoint sets the node label")
if errors:
    print("\n".join(errors)); sys.exit(1)
PY
); then
    pass "dashboard: off by default; on, a ConfigMap with the sidecar's label (overridable) holding the chart's JSON; monitors set node"
  else
    fail "dashboard" "$out"
  fi
else
  fail "dashboard checks need python3-yaml"
fi
expect_render_error "schema: dashboard.labelValue must be a label value" "labelValue" \
  --set dashboard.enabled=true --set 'dashboard.labelValue=not a value'
expect_render_error "values.schema.json rejects unknown top-level keys" "additional properties" --set nosuchkey=1
expect_render_error "values.schema.json checks types" "revisionHistoryLimit" --set revisionHistoryLimit=many
# NOTES.txt is never in `helm template` output: render it through a copy of the chart.
cp -r "$CHART" "$tmp/notes-chart"
printf 'notes: |\n{{ include "gds-csi/templates/NOTES.txt" . | indent 2 }}\n' >"$tmp/notes-chart/templates/notes-check.yaml"
notes=$("$HELM" template gds-csi "$tmp/notes-chart" --namespace gds-csi --kube-version "$KUBE_VERSION" \
  --show-only templates/notes-check.yaml 2>&1)
if grep -qF -- "kubectl get nodes -L $DRIVER/gds-nvme" <<<"$notes" && grep -qF "gds-csi doctor" <<<"$notes"; then
  pass "NOTES.txt shows GDS readiness labels and how to run doctor"
else
  fail "NOTES.txt shows GDS readiness labels and how to run doctor" "$notes"
fi
if grep -qF "$DRIVER/gds: 1" <<<"$notes" && grep -qF "$DRIVER/gds-compat: 1" <<<"$notes"; then
  pass "NOTES.txt names the GDS workload resources a pod asks for"
else
  fail "NOTES.txt names the GDS workload resources a pod asks for" "$notes"
fi

# --- Kubernetes versions (Chart.yaml says which feature needs which) --------------------
# Without a cluster helm assumes Kubernetes v1.20.0 (a helm built without release ldflags)
# and knows only group/versions; a cluster's discovery (or --api-versions, listing kinds)
# is what the chart's API checks read.
render_at() { "$HELM" template gds-csi "$CHART" --namespace gds-csi --kube-version "$@"; }
# Exactly what a reviewer or a GitOps tool without a cluster runs.
if out=$("$HELM" template gds-csi "$CHART" 2>&1); then
  if grep -q '^kind: DaemonSet' <<<"$out" && grep -qx '  storageCapacity: true' <<<"$out"; then
    pass "helm template with no cluster and no flags renders (DaemonSet, CSIDriver with storageCapacity)"
  else
    fail "helm template with no flags: no DaemonSet or no storageCapacity" "$(head -40 <<<"$out")"
  fi
else
  fail "helm template with no cluster and no flags" "$out"
fi
if out=$("$HELM" lint --strict "$CHART" 2>&1); then
  pass "helm lint --strict with no flags (helm's own Kubernetes version)"
else
  fail "helm lint --strict with no flags" "$out"
fi
expect_error() { # description, expected message, helm template args...
  local desc=$1 msg=$2; shift 2
  if out=$("$HELM" template gds-csi "$CHART" "$@" 2>&1); then
    fail "$desc: render should fail"
  elif grep -qF -- "$msg" <<<"$out"; then
    pass "$desc"
  else
    fail "$desc: wrong error" "$out"
  fi
}
expect_error "Chart.yaml kubeVersion refuses Kubernetes 1.19" "chart requires kubeVersion" --kube-version 1.19.16
# A cluster that lists its kinds but not CSIStorageCapacity v1 (1.23 serves only v1beta1).
expect_error "a cluster without storage.k8s.io/v1 CSIStorageCapacity is refused, naming it" \
  "does not serve storage.k8s.io/v1 CSIStorageCapacity" --kube-version 1.23.17 \
  --api-versions v1/Pod --api-versions storage.k8s.io/v1beta1/CSIStorageCapacity
expect_error "seLinuxMount=true is refused for Kubernetes 1.27" "seLinuxMount=true needs Kubernetes >= 1.28" \
  --kube-version 1.27.16 --set seLinuxMount=true
if render_at 1.28.0 --set seLinuxMount=true 2>"$tmp/err" | grep -qx '  seLinuxMount: true'; then
  pass "seLinuxMount=true renders for Kubernetes 1.28"
else
  fail "seLinuxMount=true for Kubernetes 1.28" "$(cat "$tmp/err")"
fi
# Below 1.34 (or where the v1 API is not served) the sidecars' VolumeAttributesClass gate
# is off; below 1.32 the resizer's RecoverVolumeExpansionFailure gate too.
versions_ok=true
for v in 1.31.0 1.32.0 1.33.0; do
  render_at "$v" >"$tmp/k$v.yaml" 2>"$tmp/err" || { versions_ok=false; fail "helm template --kube-version $v" "$(cat "$tmp/err")"; }
done
cluster_apis=(--api-versions v1/Pod --api-versions storage.k8s.io/v1/CSIStorageCapacity)
render_at 1.34.3 "${cluster_apis[@]}" >"$tmp/k-novac.yaml" 2>"$tmp/err" \
  || { versions_ok=false; fail "helm template for a 1.34 cluster without the VolumeAttributesClass v1 API" "$(cat "$tmp/err")"; }
render_at 1.34.3 "${cluster_apis[@]}" --api-versions storage.k8s.io/v1/VolumeAttributesClass >"$tmp/k-vac.yaml" 2>"$tmp/err" \
  || { versions_ok=false; fail "helm template for a 1.34 cluster that lists its APIs" "$(cat "$tmp/err")"; }
if $versions_ok && python3 -c 'import yaml' 2>/dev/null; then
  if out=$(python3 - "$tmp" 2>&1 <<'PY'
import sys, yaml
tmp = sys.argv[1]
vac_off = "--feature-gates=Topology=true,VolumeAttributesClass=false"
full = ("--feature-gates=Topology=true", [], True)
want = {  # render -> (provisioner gates, resizer gates, resizer may read VolumeAttributesClasses)
    "k1.31.0": (vac_off, ["--feature-gates=RecoverVolumeExpansionFailure=false,VolumeAttributesClass=false"], False),
    "k1.32.0": (vac_off, ["--feature-gates=VolumeAttributesClass=false"], False),
    "k1.33.0": (vac_off, ["--feature-gates=VolumeAttributesClass=false"], False),
    "k-novac": (vac_off, ["--feature-gates=VolumeAttributesClass=false"], False),
    "k-vac": full,
    "default": full,
}
errors = []
for name, (prov_gates, rsz_gates, vac_rule) in want.items():
    docs = [d for d in yaml.safe_load_all(open(f"{tmp}/{name}.yaml")) if d]
    cs = {c["name"]: c for d in docs if d["kind"] == "DaemonSet" for c in d["spec"]["template"]["spec"]["containers"]}
    gates = lambda c: [a for a in cs[c]["args"] if a.startswith("--feature-gates")]
    if gates("csi-provisioner") != [prov_gates]:
        errors.append(f"{name}: provisioner {gates('csi-provisioner')}, want {prov_gates}")
    if gates("csi-resizer") != rsz_gates:
        errors.append(f"{name}: resizer {gates('csi-resizer')}, want {rsz_gates}")
    rules = [r for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-external-resizer")
             for r in d["rules"]]
    if any("volumeattributesclasses" in r["resources"] for r in rules) != vac_rule:
        errors.append(f"{name}: resizer RBAC on volumeattributesclasses should be {vac_rule}")
if errors:
    print("\n".join(errors)); sys.exit(1)
PY
); then
    pass "VolumeAttributesClass gates off below 1.34 or without the v1 API, RecoverVolumeExpansionFailure off below 1.32"
  else
    fail "sidecar feature gates by Kubernetes version" "$out"
  fi
elif $versions_ok; then
  fail "the version checks need python3 with PyYAML"
fi
notes_at() { "$HELM" template gds-csi "$tmp/notes-chart" --kube-version "$1" --show-only templates/notes-check.yaml 2>&1; }
notes131=$(notes_at 1.31.0)
notes133=$(notes_at 1.33.0)
if grep -qF "VolumeAttributesClass=false" <<<"$notes133" && ! grep -qF "RecoverVolumeExpansionFailure" <<<"$notes133" \
  && grep -qF "RecoverVolumeExpansionFailure=false" <<<"$notes131" && grep -qF "VolumeAttributesClass=false" <<<"$notes131" \
  && ! grep -qE "VolumeAttributesClass|RecoverVolumeExpansionFailure" <<<"$notes"; then
  pass "NOTES.txt says which sidecar gates are off for the target (1.31, 1.33) and nothing on 1.34"
else
  fail "NOTES.txt on the gates turned off" "1.33:"$'\n'"$notes133"$'\n'"1.31:"$'\n'"$notes131"
fi

# --- values.schema.json -------------------------------------------------------------
# A misspelt or malformed value fails the install, naming it, instead of being ignored.
expect_render_error "schema: fsType ext3 is refused, naming the value" \
  "'/storageClasses/nvme/fsType': value must be one of 'ext4', 'xfs'" --set storageClasses.nvme.fsType=ext3
expect_render_error "schema: a misspelt key is refused (storageClasses.nvme.fstype)" \
  "'/storageClasses/nvme': additional properties 'fstype' not allowed" --set storageClasses.nvme.fstype=xfs
expect_render_error "schema: a misspelt key is refused (node.poolDevice)" \
  "'/node': additional properties 'poolDevice' not allowed" --set node.poolDevice=/dev/nvme1n1
expect_render_error "schema: a timeout that is not a duration is refused" "'/mountTimeout'" --set mountTimeout=20
expect_render_error "schema: layout stripe needs extraParameters.stripeCount" \
  "'/storageClasses/nvme/extraParameters': missing property 'stripeCount'" --set storageClasses.nvme.layout=stripe
expect_render_error "schema: extraParameters may not repeat a parameter the chart sets" \
  "invalid propertyName 'gdsPolicy'" --set storageClasses.nvme.extraParameters.gdsPolicy=disabled
if render --set storageClasses.nvme.layout=stripe --set storageClasses.nvme.extraParameters.stripeCount=4 \
  2>"$tmp/err" | grep -qx '  stripeCount: "4"'; then
  pass "schema: layout stripe with stripeCount renders"
else
  fail "layout stripe with stripeCount" "$(cat "$tmp/err")"
fi
# The values the kubelet e2e rigs install with (tests/e2e/kubelet-rig.sh rig_chart_values,
# kubelet.sh, storage-suite.sh).
e2e_set=(--set image.repository=localhost/gds-csi-e2e/gds-csi --set image.tag=e2e --set image.pullPolicy=Never
  --set kubeletDir=/tmp/gds-kubelet.x/kubelet --set stateDir=/tmp/gds-kubelet.x/driver-state --set cufile.mount=false
  --set gds.runtimeClassName= --set 'node.poolDevices={/dev/loop1,/dev/loop2}'
  --set sidecars.provisioner.capacityPollInterval=5s --set sidecars.provisioner.nodeDeploymentBaseDelay=1s
  --set nfs.enabled=true --set nfs.server=192.0.2.1 --set nfs.share=/export/gds --set mountTimeout=20s
  --set storageClasses.nvme.gdsPolicy=preferred --set storageClasses.nvmeWhole.gdsPolicy=preferred
  --set snapshots.enabled=true --set snapshots.class.storeDir=/tmp/gds-kubelet.x/snapshot-store)
for sidecar in sidecars.provisioner:provisioner sidecars.nodeDriverRegistrar:registrar \
  sidecars.livenessProbe:livenessprobe sidecars.resizer:resizer snapshots.sidecar:snapshotter \
  snapshots.controller:snapshot-controller; do
  e2e_set+=(--set "${sidecar%%:*}.image.repository=localhost/gds-csi-e2e/${sidecar##*:}"
    --set "${sidecar%%:*}.image.tag=e2e" --set "${sidecar%%:*}.image.pullPolicy=Never")
done
if out=$(render "${e2e_set[@]}" 2>&1); then
  if grep -qF -- '--pool-device=/dev/loop2' <<<"$out" && grep -qF 'image: localhost/gds-csi-e2e/resizer:e2e' <<<"$out" \
    && grep -qF 'image: localhost/gds-csi-e2e/snapshotter:e2e' <<<"$out" \
    && grep -qF 'image: localhost/gds-csi-e2e/snapshot-controller:e2e' <<<"$out" \
    && ! grep -q 'runtimeClassName' <<<"$out"; then
    pass "the e2e rigs' values pass the schema and render"
  else
    fail "the e2e rigs' values render without their effect" "$(grep -nE 'pool-device|image:|runtimeClassName' <<<"$out")"
  fi
else
  fail "the e2e rigs' values" "$out"
fi
# Every key of values.yaml has its schema entry, at every depth, so a value added later
# without one fails here. Maps the schema leaves open (labels, resources.requests, ...)
# are not walked; every object it spells out must refuse unknown keys. The checker is
# first shown a values file with a key the schema lacks, which it must report.
schema_check() { # values file -> problems, one a line; exit status 1 when any
  python3 - "$1" "$CHART/values.schema.json" <<'PY'
import json, sys, yaml
values = yaml.safe_load(open(sys.argv[1]))
schema = json.load(open(sys.argv[2]))
problems = []

def resolve(node):
    while "$ref" in node:
        node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return node

def properties(node):
    """The properties a schema node spells out (through $ref and allOf), or None for an open map."""
    node = resolve(node)
    found = None
    if "properties" in node:
        if node.get("additionalProperties") is not False:
            problems.append(f"schema object {sorted(node['properties'])} accepts unknown keys")
        found = dict(node["properties"])
    for part in node.get("allOf", []):
        more = properties(part)
        if more is not None:
            found = {**(found or {}), **more}
    return found

def walk(value, node, path):
    node = resolve(node)
    if isinstance(value, dict):
        props = properties(node)
        if props is None:
            if "properties" not in node and node.get("type") not in ("object", ["object", "null"]) and "allOf" not in node:
                problems.append(f"{path or '.'}: a map in values.yaml, not an object in the schema")
            return
        for key, sub in value.items():
            if key not in props:
                problems.append(f"{path}.{key}: no entry in values.schema.json")
            else:
                walk(sub, props[key], f"{path}.{key}")
    elif isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            walk(item, node["items"], f"{path}[{i}]")

walk(values, schema, "")
print("\n".join(problems))
sys.exit(1 if problems else 0)
PY
}
python3 -c 'import sys, yaml; v = yaml.safe_load(open(sys.argv[1])); v["node"]["newValue"] = 1; yaml.safe_dump(v, open(sys.argv[2], "w"))' \
  "$CHART/values.yaml" "$tmp/values-extra.yaml"
if out=$(schema_check "$tmp/values-extra.yaml"); then
  fail "the values/schema key check misses a key the schema lacks (node.newValue)"
elif [[ "$out" == ".node.newValue: no entry in values.schema.json" ]]; then
  pass "the values/schema key check reports a key the schema lacks (node.newValue)"
else
  fail "the values/schema key check on node.newValue" "$out"
fi
if out=$(schema_check "$CHART/values.yaml"); then
  pass "every value in values.yaml has its values.schema.json entry, objects refuse unknown keys"
else
  fail "values.yaml and values.schema.json differ" "$out"
fi

# --- the cuFile probe inside the node pod -------------------------------------------------
if python3 -c 'import yaml' 2>/dev/null; then
  render --set gds.runtimeClassName= >"$tmp/noruntime.yaml" 2>"$tmp/err" || fail "helm template (no runtime class)" "$(cat "$tmp/err")"
  if out=$(python3 - "$tmp/default.yaml" "$tmp/noruntime.yaml" 2>&1 <<'PY'
import sys, yaml
default, noruntime = ([x for x in yaml.safe_load_all(open(f)) if x] for f in sys.argv[1:3])
errors = []
def check(cond, msg):
    if not cond: errors.append(msg)
def node(docs): return [x for x in docs if x["kind"] == "DaemonSet"][0]["spec"]["template"]["spec"]
spec = node(default)
check(spec.get("runtimeClassName") == "nvidia", "node pods use the nvidia RuntimeClass (libcuda, /dev/nvidia*)")
check("runtimeClassName" not in node(noruntime), "gds.runtimeClassName empty: no runtimeClassName")
drv = [c for c in spec["containers"] if c["name"] == "gds-csi"][0]
env = {e["name"]: e.get("value") for e in drv["env"]}
check(env.get("NVIDIA_VISIBLE_DEVICES") == "all", "NVIDIA_VISIBLE_DEVICES=all")
check("compute" in (env.get("NVIDIA_DRIVER_CAPABILITIES") or "").split(","), "NVIDIA_DRIVER_CAPABILITIES has compute (libcuda)")
mounts = {m["mountPath"]: m for m in drv["volumeMounts"]}
vols = {v["name"]: v for v in spec["volumes"]}
for path, host, typ in (("/run/udev", "/run/udev", "Directory"), ("/etc/cufile.json", "/etc/cufile.json", "File")):
    m = mounts.get(path, {})
    check(m.get("readOnly") is True, f"{path} mounted read-only")
    hp = vols.get(m.get("name"), {}).get("hostPath", {})
    check(hp.get("path") == host and hp.get("type") == typ, f"{path} from the host's {host} ({typ}): {hp}")
check("--cufile-json=/etc/cufile.json" in drv["args"], "--cufile-json points at the mounted file")
if errors:
    print("\n".join(errors)); sys.exit(1)
PY
); then
    pass "node pod gets libcuda and devices (runtime class, NVIDIA_* env), the host's /run/udev and cufile.json"
  else
    fail "node pod cuFile environment" "$out"
  fi
fi
if grep -q 'nvidia-cufile==' Dockerfile && grep -q 'libcufile' Dockerfile && grep -q 'ldconfig' Dockerfile; then
  pass "the image ships NVIDIA's packaged libcufile on the loader path"
else
  fail "the image ships NVIDIA's packaged libcufile on the loader path"
fi

# The kubelet e2e's driver image is the Dockerfile's runtime stage built without a
# container engine (tests/e2e/images/runtime-base.sh): the same Debian packages, and the
# same libcufile, taken from the nvidia-cufile version the Dockerfile pins.
docker_pkgs=$(sed -n '/apt-get install/,/rm -rf/p' Dockerfile | tr -s ' \\&' '\n' |
  grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -vxE 'apt-get|install|rm|rf' | sort | tr '\n' ' ')
e2e_pkgs=$(sed -n 's/^PACKAGES=//p' tests/e2e/images/runtime-base.sh | tr ',' '\n' | sort | tr '\n' ' ')
if [[ -n "$docker_pkgs" && "$docker_pkgs" == "$e2e_pkgs" ]] &&
  grep -q 'ARG CUFILE_VERSION' tests/e2e/images/runtime-base.sh Dockerfile &&
  grep -q 'nvidia-cufile==$CUFILE_VERSION' tests/e2e/images/runtime-base.sh &&
  grep -q 'libcufile\*.so\*' tests/e2e/images/runtime-base.sh; then
  pass "the e2e image has the Dockerfile's runtime packages and its libcufile ($e2e_pkgs)"
else
  fail "the e2e image and the Dockerfile's runtime stage differ" "Dockerfile: $docker_pkgs"$'\n'"e2e:        $e2e_pkgs"
fi

# --- node-loss controller (opt-in) ------------------------------------------------------------
# Off: nothing of it renders. On: its Deployment (one replica, Recreate, unprivileged), its
# ServiceAccount, and a ClusterRole granting exactly what it calls; the rest of the chart is
# the same as with it off.
if python3 -c 'import yaml' 2>/dev/null; then
  if render --set nodeLoss.enabled=true --set nodeLoss.action=recreate --set 'nodeLoss.storageClasses={nvme-gds}' \
      >"$tmp/nodeloss.yaml" 2>"$tmp/err" &&
    render --set nodeLoss.enabled=true --set serviceAccount.create=false --set serviceAccount.name.nodeLoss=existing-nl \
      >"$tmp/nodeloss-sa.yaml" 2>>"$tmp/err"; then
    if out=$(python3 - "$tmp/default.yaml" "$tmp/nodeloss.yaml" "$tmp/nodeloss-sa.yaml" "$DRIVER" 2>&1 <<'PY'
import sys, yaml
default, on, sa = ([x for x in yaml.safe_load_all(open(f)) if x] for f in sys.argv[1:4])
driver = sys.argv[4]
errors = []
def check(cond, msg):
    if not cond: errors.append(msg)
def ours(d): return d["metadata"]["name"].endswith("node-loss") or d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "node-loss"
check(not [d for d in default if ours(d)], "nodeLoss off by default: nothing of it renders")
check(sorted((d["kind"], d["metadata"]["name"]) for d in on if ours(d)) ==
      [("ClusterRole", "gds-csi-node-loss"), ("ClusterRoleBinding", "gds-csi-node-loss"),
       ("Deployment", "gds-csi-node-loss"), ("ServiceAccount", "gds-csi-node-loss")],
      f"nodeLoss on: {[(d['kind'], d['metadata']['name']) for d in on if ours(d)]}")
check([d for d in on if not ours(d)] == default, "nodeLoss on changes nothing else in the chart")
dep = next((d for d in on if d["kind"] == "Deployment"), {})
spec = dep.get("spec", {})
pod = spec.get("template", {}).get("spec", {})
check(spec.get("replicas") == 1 and spec.get("strategy") == {"type": "Recreate"},
      "node-loss: one replica, replaced with Recreate (never two at once)")
check(pod.get("serviceAccountName") == "gds-csi-node-loss", "node-loss: its own ServiceAccount")
check(pod.get("securityContext", {}).get("runAsNonRoot") is True
      and pod.get("securityContext", {}).get("seccompProfile") == {"type": "RuntimeDefault"},
      "node-loss pod: runAsNonRoot, seccomp RuntimeDefault")
cs = pod.get("containers", [])
check(len(cs) == 1, "node-loss: one container")
c = cs[0] if cs else {}
driver_image = next(x for d in default if d["kind"] == "DaemonSet" for x in d["spec"]["template"]["spec"]["containers"] if x["name"] == "gds-csi")["image"]
check(c.get("image") == driver_image and c.get("command") == ["/usr/local/bin/gds-csi-node-loss"],
      f"node-loss runs the driver's image's gds-csi-node-loss: {c.get('image')} {c.get('command')}")
for a in (f"--driver-name={driver}", "--action=recreate", "--grace-period=30m", "--interval=30s",
          "--api-timeout=30s", "--metrics-address=0.0.0.0:9823", "--storage-class=nvme-gds"):
    check(a in c.get("args", []), f"node-loss arg {a} missing: {c.get('args')}")
ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
check(ports == {"metrics": 9823}, f"node-loss: /metrics on a port named metrics (the metrics Service takes it in): {ports}")
probe = c.get("livenessProbe", {}).get("httpGet", {})
check(probe == {"path": "/healthz", "port": "metrics"}, f"node-loss liveness probe: {probe}")
sc = c.get("securityContext", {})
check(not sc.get("privileged") and sc.get("allowPrivilegeEscalation") is False and sc.get("readOnlyRootFilesystem") is True
      and sc.get("capabilities") == {"drop": ["ALL"]}, f"node-loss container unprivileged: {sc}")
check("requests" in c.get("resources", {}) and "limits" in c.get("resources", {}), "node-loss: requests and limits")
cr = next((d for d in on if d["kind"] == "ClusterRole" and ours(d)), {})
rules = {}
for r in cr.get("rules", []):
    for res in r["resources"]:
        rules.setdefault((tuple(r["apiGroups"]), res), set()).update(r["verbs"])
want = {((""), "nodes"): {"get", "list", "watch"},
        ((""), "persistentvolumes"): {"get", "list", "watch", "delete", "patch"},
        ((""), "persistentvolumeclaims"): {"get", "list", "watch", "create", "delete", "patch"},
        ((""), "pods"): {"get", "list", "watch"},
        ((""), "events"): {"create", "patch"}}
check({(g[0], r): v for (g, r), v in rules.items()} == want, f"node-loss ClusterRole grants exactly what it calls: {rules}")
crb = next((d for d in on if d["kind"] == "ClusterRoleBinding" and ours(d)), {})
check(crb.get("subjects") == [{"kind": "ServiceAccount", "name": "gds-csi-node-loss", "namespace": "gds-csi"}]
      and crb.get("roleRef", {}).get("name") == "gds-csi-node-loss", f"node-loss binding: {crb.get('subjects')}")
check(not [d for d in sa if d["kind"] == "ServiceAccount"], "serviceAccount.create=false: no node-loss ServiceAccount")
sdep = next((d for d in sa if d["kind"] == "Deployment"), {})
check(sdep.get("spec", {}).get("template", {}).get("spec", {}).get("serviceAccountName") == "existing-nl",
      "serviceAccount.name.nodeLoss is used")
check(any(s["name"] == "existing-nl" for d in sa if d["kind"] == "ClusterRoleBinding" for s in d["subjects"]),
      "the node-loss ClusterRole is bound to serviceAccount.name.nodeLoss")
if errors:
    print("\n".join(errors)); sys.exit(1)
PY
); then
      pass "nodeLoss: off by default; on, a Deployment (1 replica, Recreate, unprivileged) with exactly its RBAC, nothing else changed"
    else
      fail "nodeLoss Deployment and RBAC" "$out"
    fi
  else
    fail "helm template (nodeLoss enabled)" "$(cat "$tmp/err")"
  fi
fi
expect_render_error "schema: nodeLoss.action other than report/recreate is refused" \
  "'/nodeLoss/action': value must be one of 'report', 'recreate'" --set nodeLoss.action=delete
expect_render_error "schema: nodeLoss.gracePeriod must be a duration" "'/nodeLoss/gracePeriod'" --set nodeLoss.gracePeriod=30

# --- Dataset populator (opt-in) ----------------------------------------------------------------
# Off: nothing of it renders. On: its Deployment (one replica, Recreate, unprivileged), its
# ServiceAccount, a ClusterRole and a Role in its namespace granting exactly what it calls,
# and the Dataset CRD; the rest of the chart is the same as with it off.
if python3 -c 'import yaml' 2>/dev/null; then
  if render --set populator.enabled=true --set populator.nodeDatasetRoot=/srv/datasets --include-crds \
      >"$tmp/populator.yaml" 2>"$tmp/err" && render --include-crds >"$tmp/default-crds.yaml" 2>>"$tmp/err"; then
    if out=$(python3 - "$tmp/default.yaml" "$tmp/populator.yaml" "$tmp/default-crds.yaml" "$DRIVER" 2>&1 <<'PY'
import sys, yaml
default, on, default_crds = ([x for x in yaml.safe_load_all(open(f)) if x] for f in sys.argv[1:4])
driver = sys.argv[4]
errors = []
def check(cond, msg):
    if not cond: errors.append(msg)
def ours(d): return d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "populator"
def crd(d): return d["kind"] == "CustomResourceDefinition" and d["metadata"]["name"] == "datasets.gds-csi.io"
check(not [d for d in default_crds if ours(d) or crd(d)], "populator off by default: nothing of it renders, no CRD")
check(sorted((d["kind"], d["metadata"]["name"]) for d in on if ours(d)) ==
      [("ClusterRole", "gds-csi-populator"), ("ClusterRoleBinding", "gds-csi-populator"),
       ("Deployment", "gds-csi-populator"), ("Role", "gds-csi-populator"), ("RoleBinding", "gds-csi-populator"),
       ("ServiceAccount", "gds-csi-populator")],
      f"populator on: {[(d['kind'], d['metadata']['name']) for d in on if ours(d)]}")
check([d for d in on if not ours(d) and d["kind"] != "CustomResourceDefinition"] == default,
      "populator on changes nothing else in the chart")
c = next((d for d in on if crd(d)), {})
v = (c.get("spec", {}).get("versions") or [{}])[0]
check(c.get("spec", {}).get("scope") == "Namespaced" and v.get("subresources") == {"status": {}}
      and [x["name"] for x in v.get("additionalPrinterColumns", [])] == ["Node Path", "NFS Server", "Filling", "Filled", "Progress", "Age"],
      "the Dataset CRD: namespaced, a status subresource, progress columns")
dep = next((d for d in on if d["kind"] == "Deployment" and ours(d)), {})
spec = dep.get("spec", {})
pod = spec.get("template", {}).get("spec", {})
check(spec.get("replicas") == 1 and spec.get("strategy") == {"type": "Recreate"}, "populator: one replica, Recreate")
check(pod.get("securityContext", {}).get("runAsNonRoot") is True, "populator pod: runAsNonRoot")
c = (pod.get("containers") or [{}])[0]
driver_image = next(x for d in default if d["kind"] == "DaemonSet" for x in d["spec"]["template"]["spec"]["containers"] if x["name"] == "gds-csi")["image"]
check(c.get("image") == driver_image and c.get("command") == ["/usr/local/bin/gds-csi-populator"],
      f"populator runs the driver's image's gds-csi-populator: {c.get('image')} {c.get('command')}")
for a in (f"--driver-name={driver}", f"--image={driver_image}", "--node-dataset-root=/srv/datasets",
          "--state-dir=/var/lib/gds-csi", "--interval=2s", "--retry-after=30s", "--metrics-address=0.0.0.0:9824"):
    check(a in c.get("args", []), f"populator arg {a} missing: {c.get('args')}")
ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
check(ports == {"metrics": 9824}, f"populator: /metrics on a port named metrics (the metrics Service takes it in): {ports}")
check(c.get("livenessProbe", {}).get("httpGet") == {"path": "/healthz", "port": "metrics"}, "populator liveness probe")
sc = c.get("securityContext", {})
check(not sc.get("privileged") and sc.get("allowPrivilegeEscalation") is False and sc.get("capabilities") == {"drop": ["ALL"]},
      f"populator container unprivileged: {sc}")
def grants(kind):
    r = next((d for d in on if d["kind"] == kind and ours(d)), {})
    out = {}
    for rule in r.get("rules", []):
        for res in rule["resources"]:
            out.setdefault((rule["apiGroups"][0], res), set()).update(rule["verbs"])
    return out
check(grants("ClusterRole") == {("", "persistentvolumeclaims"): {"get", "list", "patch"},
                                ("", "persistentvolumes"): {"get", "patch"},
                                ("storage.k8s.io", "storageclasses"): {"get"},
                                ("gds-csi.io", "datasets"): {"get", "list"},
                                ("gds-csi.io", "datasets/status"): {"patch"},
                                ("", "events"): {"create"}},
      f"populator ClusterRole grants exactly what it calls: {grants('ClusterRole')}")
check(grants("Role") == {("", "persistentvolumeclaims"): {"create", "delete"}, ("", "pods"): {"get", "create", "delete"},
                         ("", "pods/log"): {"get"}},
      f"populator Role (its namespace only): {grants('Role')}")
if errors:
    print("\n".join(errors)); sys.exit(1)
PY
); then
      pass "populator: off by default; on, a Deployment (1 replica, Recreate, unprivileged), exactly its RBAC and the Dataset CRD, nothing else changed"
    else
      fail "populator Deployment, RBAC and CRD" "$out"
    fi
  else
    fail "helm template (populator enabled)" "$(cat "$tmp/err")"
  fi
fi
expect_render_error "schema: populator.nodeDatasetRoot must be absolute" "'/populator/nodeDatasetRoot'" \
  --set populator.nodeDatasetRoot=srv/datasets

# --- snapshots (opt-in) --------------------------------------------------------------------
# Off: nothing of it renders, CRDs included. On: the csi-snapshotter sidecar in the node
# DaemonSet in its per-node mode, the snapshot-controller with distributed snapshotting, the
# RBAC of each, the provisioner's rules for restores, the CRDs (--include-crds: Helm installs
# a chart's crds/ at install), the class, and the store directories mounted into the driver.
SNAP_SET=(--set snapshots.enabled=true --set snapshots.class.storeDir=/var/lib/gds-snapshots/
  --set 'snapshots.hostStoreDirs={/mnt/snap-a,/var/lib/gds-snapshots}')
if python3 -c 'import yaml' 2>/dev/null; then
  if render --include-crds >"$tmp/snap-off.yaml" 2>"$tmp/err" &&
    render --include-crds "${SNAP_SET[@]}" >"$tmp/snap-on.yaml" 2>>"$tmp/err" &&
    render --include-crds "${SNAP_SET[@]}" --set snapshots.installCRDs=false --set snapshots.controller.enabled=false \
      >"$tmp/snap-bare.yaml" 2>>"$tmp/err" &&
    render --include-crds --set snapshots.installCRDs=true >"$tmp/snap-crds-only.yaml" 2>>"$tmp/err" &&
    render "${SNAP_SET[@]}" --set snapshots.controller.replicas=2 >"$tmp/snap-ha.yaml" 2>>"$tmp/err" &&
    render --set snapshots.enabled=true --set snapshots.class.storeServer=nfs.example.internal \
      --set snapshots.class.storeShare=/export/snaps --set snapshots.class.storePath=team-a \
      --set snapshots.class.storeVers=4.2 --set snapshots.class.storePort=2049 --set snapshots.class.storeProto=tcp \
      --set snapshots.class.checksums=true --set snapshots.class.deletionPolicy=Retain \
      --set snapshots.class.isDefaultClass=true >"$tmp/snap-nfs.yaml" 2>>"$tmp/err"; then
    chart_snap_tag=$(awk '$1 == "sidecar:" {f = 1} f && $1 == "tag:" {print $2; exit}' "$CHART/values.yaml")
    if out=$(python3 - "$tmp/default.yaml" "$tmp/snap-off.yaml" "$tmp/snap-on.yaml" "$tmp/snap-bare.yaml" \
      "$tmp/snap-crds-only.yaml" "$tmp/snap-ha.yaml" "$tmp/snap-nfs.yaml" "$DRIVER" "$chart_snap_tag" 2>&1 <<'PY'
import sys, yaml
default, off, on, bare, crds_only, ha, nfs = ([x for x in yaml.safe_load_all(open(f)) if x] for f in sys.argv[1:8])
driver, tag = sys.argv[8:10]
errors = []
def check(cond, msg):
    if not cond: errors.append(msg)
def kinds(docs): return sorted((d["kind"], d["metadata"]["name"]) for d in docs)
def pod(docs, kind, name):
    return next((d["spec"]["template"]["spec"] for d in docs if d["kind"] == kind and d["metadata"]["name"] == name), {})
def container(spec, name): return next((c for c in spec.get("containers", []) if c["name"] == name), None)
def rules(docs, name):
    out = {}
    for d in docs:
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name:
            for r in d["rules"]:
                for res in r["resources"]:
                    out.setdefault((r["apiGroups"][0], res), set()).update(r["verbs"])
    return out
SNAP = "snapshot.storage.k8s.io"
check(off == default, "snapshots off (the default): --include-crds renders the same as without (no CRDs), nothing of snapshots")
check(not [d for d in default if SNAP in d.get("apiVersion", "") or "snapshot" in d["metadata"]["name"]],
      "snapshots off: no snapshot object")
check(container(pod(default, "DaemonSet", "gds-csi-node"), "csi-snapshotter") is None, "snapshots off: no csi-snapshotter container")
check(not [k for k in rules(default, "gds-csi-external-provisioner") if k[0] == SNAP], "snapshots off: the provisioner gets no snapshot rules")
new = [x for x in kinds(on) if x not in kinds(default)]
check(new == sorted([("ClusterRole", "gds-csi-external-snapshotter"), ("ClusterRole", "gds-csi-snapshot-controller"),
                     ("ClusterRoleBinding", "gds-csi-external-snapshotter"), ("ClusterRoleBinding", "gds-csi-snapshot-controller"),
                     ("CustomResourceDefinition", f"volumesnapshotclasses.{SNAP}"),
                     ("CustomResourceDefinition", f"volumesnapshotcontents.{SNAP}"),
                     ("CustomResourceDefinition", f"volumesnapshots.{SNAP}"),
                     ("Deployment", "gds-csi-snapshot-controller"), ("ServiceAccount", "gds-csi-snapshot-controller"),
                     ("VolumeSnapshotClass", "gds-csi-snapshots")]), f"snapshots on adds: {new}")
for d in on:
    if d["kind"] == "CustomResourceDefinition":
        served = [v["name"] for v in d["spec"]["versions"] if v["served"] and v.get("storage")]
        check(d["spec"]["group"] == SNAP and served == ["v1"], f"CRD {d['metadata']['name']}: v1 served and stored: {served}")
node = pod(on, "DaemonSet", "gds-csi-node")
snap = container(node, "csi-snapshotter") or {}
check(snap.get("image") == f"registry.k8s.io/sig-storage/csi-snapshotter:{tag}", f"csi-snapshotter image: {snap.get('image')}")
for a in ("--csi-address=/csi/csi.sock", "--node-deployment=true", "--leader-election=false",
          "--feature-gates=CSIVolumeGroupSnapshot=false", "--timeout=60s"):
    check(a in snap.get("args", []), f"csi-snapshotter arg {a} missing: {snap.get('args')}")
env = {e["name"]: e for e in snap.get("env", [])}
check(env.get("NODE_NAME", {}).get("valueFrom") == {"fieldRef": {"fieldPath": "spec.nodeName"}},
      "csi-snapshotter: NODE_NAME from spec.nodeName (what --node-deployment selects contents by)")
check({"name": "socket-dir", "mountPath": "/csi"} in snap.get("volumeMounts", []), "csi-snapshotter: the CSI socket")
sc = snap.get("securityContext", {})
check(not sc.get("privileged") and sc.get("capabilities") == {"drop": ["ALL"]}, f"csi-snapshotter unprivileged: {sc}")
drv = container(node, "gds-csi") or {}
vols = {v["name"]: v for v in node.get("volumes", [])}
stores = sorted((m["mountPath"], vols[m["name"]].get("hostPath", {}).get("path"), vols[m["name"]].get("hostPath", {}).get("type"))
                for m in drv.get("volumeMounts", []) if m["name"].startswith("snapshot-store"))
check(stores == [("/mnt/snap-a", "/mnt/snap-a", "DirectoryOrCreate"), ("/var/lib/gds-snapshots", "/var/lib/gds-snapshots", "DirectoryOrCreate")],
      f"the class's storeDir and hostStoreDirs, each once, mounted at the host's path into the driver: {stores}")
check(not [m for c in node["containers"] if c["name"] != "gds-csi" for m in c.get("volumeMounts", []) if m["name"].startswith("snapshot-store")],
      "only the driver container mounts the store")
ctl = pod(on, "Deployment", "gds-csi-snapshot-controller")
cc = container(ctl, "snapshot-controller") or {}
check(cc.get("image") == f"registry.k8s.io/sig-storage/snapshot-controller:{tag}", f"snapshot-controller image: {cc.get('image')}")
for a in ("--enable-distributed-snapshotting=true", "--feature-gates=CSIVolumeGroupSnapshot=false", "--leader-election=false"):
    check(a in cc.get("args", []), f"snapshot-controller arg {a} missing: {cc.get('args')}")
check(ctl.get("serviceAccountName") == "gds-csi-snapshot-controller" and ctl.get("securityContext", {}).get("runAsNonRoot") is True,
      "snapshot-controller: its own ServiceAccount, non-root")
cr = rules(on, "gds-csi-snapshot-controller")
check(cr.get(("", "nodes")) == {"get", "list", "watch"}, f"snapshot-controller reads nodes (distributed snapshotting): {cr.get(('', 'nodes'))}")
check({"create", "delete", "patch"} <= cr.get((SNAP, "volumesnapshotcontents"), set())
      and {"update", "patch"} <= cr.get((SNAP, "volumesnapshots/status"), set()), f"snapshot-controller manages contents: {cr}")
sr = rules(on, "gds-csi-external-snapshotter")
check(sr == {("", "events"): {"list", "watch", "create", "update", "patch"},
             (SNAP, "volumesnapshotclasses"): {"get", "list", "watch"},
             (SNAP, "volumesnapshotcontents"): {"get", "list", "watch", "update", "patch"},
             (SNAP, "volumesnapshotcontents/status"): {"update", "patch"}}, f"csi-snapshotter ClusterRole: {sr}")
crb = next((d for d in on if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == "gds-csi-external-snapshotter"), {})
check(crb.get("subjects") == [{"kind": "ServiceAccount", "name": "gds-csi-node", "namespace": "gds-csi"}],
      f"the csi-snapshotter's role is bound to the node pods' ServiceAccount: {crb.get('subjects')}")
pr = rules(on, "gds-csi-external-provisioner")
check(pr.get((SNAP, "volumesnapshots")) == {"get", "list", "watch", "update"} and pr.get((SNAP, "volumesnapshotcontents")) == {"get", "list"},
      f"the provisioner reads snapshots to restore them: {pr}")
cls = next((d for d in on if d["kind"] == "VolumeSnapshotClass"), {})
check(cls.get("apiVersion") == f"{SNAP}/v1" and cls.get("driver") == driver and cls.get("deletionPolicy") == "Delete"
      and cls.get("parameters") == {"storeDir": "/var/lib/gds-snapshots/"} and not cls["metadata"].get("annotations"),
      f"VolumeSnapshotClass (storeDir): {cls}")
# The cluster has its own controller and CRDs: only the sidecar side.
check(not [d for d in bare if d["kind"] in ("CustomResourceDefinition",) or d["metadata"]["name"] == "gds-csi-snapshot-controller"],
      "installCRDs=false, controller.enabled=false: no CRDs, no snapshot-controller or its RBAC")
check(container(pod(bare, "DaemonSet", "gds-csi-node"), "csi-snapshotter") is not None
      and any(d["kind"] == "VolumeSnapshotClass" for d in bare), "and still the sidecar and the class")
check([d["kind"] for d in crds_only if d not in default] == ["CustomResourceDefinition"] * 3,
      "installCRDs=true alone: the three CRDs and nothing else")
hc = container(pod(ha, "Deployment", "gds-csi-snapshot-controller"), "snapshot-controller") or {}
check("--leader-election=true" in hc.get("args", []) and
      any(d["kind"] == "Role" and d["metadata"]["name"] == "gds-csi-snapshot-controller-leaderelection" for d in ha),
      "controller.replicas=2: leader election, with its leases Role")
ncls = next((d for d in nfs if d["kind"] == "VolumeSnapshotClass"), {})
check(ncls.get("parameters") == {"storeServer": "nfs.example.internal", "storeShare": "/export/snaps", "storePath": "team-a",
                                 "storeProto": "tcp", "storePort": "2049", "storeVers": "4.2", "checksums": "true"}
      and ncls.get("deletionPolicy") == "Retain"
      and ncls["metadata"].get("annotations") == {"snapshot.storage.kubernetes.io/is-default-class": "true"},
      f"VolumeSnapshotClass (NFS store, checksums, Retain, default): {ncls}")
check(not [m for m in container(pod(nfs, "DaemonSet", "gds-csi-node"), "gds-csi")["volumeMounts"] if m["name"].startswith("snapshot-store")],
      "an NFS store mounts no host directory")
if errors:
    print("\n".join(errors)); sys.exit(1)
PY
); then
      pass "snapshots: off by default (no CRDs); on, the per-node csi-snapshotter, the distributed snapshot-controller, RBAC, CRDs, class, store mounts"
    else
      fail "snapshots chart parts" "$out"
    fi
  else
    fail "helm template (snapshots)" "$(cat "$tmp/err")"
  fi
fi
if out=$("$HELM" lint --strict "$CHART" --kube-version "$KUBE_VERSION" "${SNAP_SET[@]}" 2>&1); then
  pass "helm lint --strict (snapshots enabled)"
else
  fail "helm lint --strict (snapshots enabled)" "$out"
fi
expect_render_error "snapshots enabled without a store is rejected" "snapshots.class needs a store" --set snapshots.enabled=true
expect_render_error "snapshots: storeDir and an NFS store at once are rejected" "not both" \
  --set snapshots.enabled=true --set snapshots.class.storeDir=/s --set snapshots.class.storeServer=n --set snapshots.class.storeShare=/e
expect_render_error "snapshots: storeServer without storeShare is rejected" "storeShare is required with storeServer" \
  --set snapshots.enabled=true --set snapshots.class.storeServer=n
expect_render_error "schema: a relative storeDir is refused" "'/snapshots/class/storeDir'" \
  --set snapshots.enabled=true --set snapshots.class.storeDir=snaps
expect_render_error "schema: deletionPolicy other than Delete/Retain is refused" "'/snapshots/class/deletionPolicy'" \
  --set snapshots.class.deletionPolicy=Keep
# The example: a class of this driver with store parameters only, a snapshot of it, and a
# claim restored from that snapshot.
if python3 -c 'import yaml' 2>/dev/null; then
  if out=$(python3 - deploy/examples/snapshot-restore.yaml "$DRIVER" 2>&1 <<'PY'
import sys, yaml
docs = {d["kind"]: d for d in yaml.safe_load_all(open(sys.argv[1])) if d}
cls, snap, pvc = docs["VolumeSnapshotClass"], docs["VolumeSnapshot"], docs["PersistentVolumeClaim"]
known = {"storeDir", "storeServer", "storeShare", "storePath", "storeProto", "storePort", "storeVers", "checksums"}
assert cls["driver"] == sys.argv[2] and set(cls["parameters"]) <= known, cls
assert ("storeDir" in cls["parameters"]) != ("storeServer" in cls["parameters"]), cls["parameters"]
assert snap["spec"]["volumeSnapshotClassName"] == cls["metadata"]["name"], snap
assert pvc["spec"]["dataSource"] == {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
                                     "name": snap["metadata"]["name"]}, pvc
PY
  ); then
    pass "deploy/examples/snapshot-restore.yaml: a class of this driver with a store, its snapshot, a claim restored from it"
  else
    fail "deploy/examples/snapshot-restore.yaml" "$out"
  fi
fi
# The e2e builds the release the chart deploys (tests/e2e/build-tools.sh, tools/snapshotter).
snap_tags="$(awk '$1 == "sidecar:" {f = 1} f && $1 == "tag:" {print $2; exit}' "$CHART/values.yaml")"
snap_tags+="/$(awk '$1 == "controller:" {f = 1} f && $1 == "tag:" {print $2; exit}' "$CHART/values.yaml")"
snap_tags+="/$(sed -n 's/^SNAPSHOTTER_VERSION=\(v[0-9.]*\).*/\1/p' tests/e2e/build-tools.sh)"
snap_tags+="/$(sed -n 's|^[[:space:]]*github.com/kubernetes-csi/external-snapshotter/v8 \(v[0-9.]*\)$|\1|p' tests/e2e/tools/snapshotter/go.mod)"
snap_tag=${snap_tags%%/*}
if [[ "$snap_tag" =~ ^v8\.[0-9]+\.[0-9]+$ && "$snap_tags" == "$snap_tag/$snap_tag/$snap_tag/$snap_tag" ]]; then
  pass "the chart's csi-snapshotter and snapshot-controller and the e2e's build are one 8.x release ($snap_tags)"
else
  fail "csi-snapshotter / snapshot-controller / build-tools / go.mod versions differ: $snap_tags"
fi

# --- GDS workload examples are least-privilege --------------------------------------------
if python3 -c 'import yaml' 2>/dev/null; then
  if out=$(python3 - deploy/examples/gds-workload-pod.yaml deploy/examples/gds-read-job.yaml 2>&1 <<'PY'
import sys, yaml
errors = []
def check(cond, msg):
    if not cond: errors.append(msg)
for f in sys.argv[1:]:
    docs = [d for d in yaml.safe_load_all(open(f)) if d]
    pods = [d["spec"] if d["kind"] == "Pod" else d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Pod", "Job")]
    check(len(pods) == 1, f"{f}: one pod spec")
    for spec in pods:
        check(not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), f"{f}: no host namespaces")
        check(spec.get("securityContext", {}).get("runAsNonRoot") is True, f"{f}: runAsNonRoot")
        check(spec.get("securityContext", {}).get("seccompProfile") == {"type": "RuntimeDefault"}, f"{f}: seccomp RuntimeDefault")
        check(spec.get("runtimeClassName") == "nvidia", f"{f}: nvidia runtime class")
        vols = {v["name"]: v for v in spec["volumes"]}
        check(not any("hostPath" in v for v in vols.values()), f"{f}: no hostPath volume")
        for c in spec["containers"]:
            sc = c.get("securityContext", {})
            check(not sc.get("privileged") and sc.get("allowPrivilegeEscalation") is False, f"{f}: not privileged")
            check(sc.get("capabilities") == {"drop": ["ALL"]}, f"{f}: drops every capability, adds none")
            limits = c.get("resources", {}).get("limits", {})
            check("nvidia.com/gpu" in limits, f"{f}: requests a GPU")
            check(limits.get("gds.csi.gds-csi.io/gds") == 1, f"{f}: asks for the driver's gds resource (compat off, class nvme-gds is required)")
            check(any("persistentVolumeClaim" in vols[m["name"]] for m in c["volumeMounts"]), f"{f}: the data volume is a PVC")
            if f.endswith("gds-read-job.yaml"):
                cmd = " ".join(c.get("command", []) + c.get("args", []))
                check("gds-csi workload-read /data/" in cmd and "--require-gds" in cmd, f"{f}: runs workload-read on a file of the claim, GDS required")
if errors:
    print("\n".join(errors)); sys.exit(1)
PY
); then
    pass "GDS workload examples: unprivileged, no capabilities, no hostPath, what cuFile needs through the driver's gds resource"
  else
    fail "GDS workload examples are least-privilege" "$out"
  fi
fi

# --- sidecars current, and the e2e runs what the chart names ------------------------------
# The provisioner the kubelet e2e builds (tests/e2e/build-tools.sh, from the Go module
# proxy) must be the release the chart deploys. The registrar and livenessprobe are not on
# the proxy (their v2 tags have no /v2 module path), so the e2e runs stand-ins
# (tests/e2e/tools/k8s/{registrar,livenessprobe}); those two tags must be a released pair.
chart_tag() { awk -v k="$1:" '$1 == k {f = 1} f && $1 == "tag:" {print $2; exit}' "$CHART/values.yaml"; }
prov_tag=$(chart_tag provisioner)
e2e_prov=$(sed -n 's/^PROVISIONER_VERSION=\(v[0-9.]*\).*/\1/p' tests/e2e/build-tools.sh)
e2e_mod=$(sed -n 's|^require github.com/kubernetes-csi/external-provisioner/v[0-9]* \(v[0-9.]*\)$|\1|p' \
  tests/e2e/tools/provisioner/go.mod)
if [[ -n "$prov_tag" && "$prov_tag" == "$e2e_prov" && "$prov_tag" == "$e2e_mod" && "$prov_tag" == v6.* ]]; then
  pass "the e2e builds the chart's external-provisioner ($prov_tag, the 6.x line)"
else
  fail "chart provisioner '$prov_tag', e2e build-tools '$e2e_prov', go.mod '$e2e_mod': must be one 6.x release"
fi
# Released together (node-driver-registrar and livenessprobe tags of one release wave).
pair="$(chart_tag nodeDriverRegistrar)/$(chart_tag livenessProbe)"
case $pair in
  v2.18.0/v2.20.0 | v2.17.0/v2.19.0 | v2.16.0/v2.18.0) pass "registrar and livenessprobe tags are a released pair ($pair)" ;;
  *) fail "registrar/livenessprobe '$pair' are not a released pair (v2.18.0/v2.20.0 is the newest)" ;;
esac

# --- NOTES.txt previewed without a cluster (scripts/chart-notes.sh) ------------------------
notes=$(bash scripts/chart-notes.sh 2>"$tmp/err") || fail "chart-notes.sh" "$(cat "$tmp/err")"
if grep -q "the pool is empty" <<<"$notes" && grep -q "gds-csi pool discover" <<<"$notes"; then
  pass "NOTES (defaults): the empty pool is a warning that names pool discover"
else
  fail "NOTES (defaults) say nothing of the empty pool" "$notes"
fi
notes=$(bash scripts/chart-notes.sh -f deploy/values/gpu-nvme.yaml 2>"$tmp/err") || fail "chart-notes.sh -f" "$(cat "$tmp/err")"
if grep -q "gds-csi .* is installed" <<<"$notes" && ! grep -q "the pool is empty" <<<"$notes"; then
  pass "NOTES (deploy/values/gpu-nvme.yaml): no empty-pool warning"
else
  fail "NOTES (deploy/values/gpu-nvme.yaml)" "$notes"
fi

# --- the example values files -----------------------------------------------------------
# Each renders against the schema; the trial file turns off what needs a GPU node, the GPU
# file keeps the gate and names the filer.
for f in deploy/values/*.yaml; do
  if render -f "$f" >"$tmp/example.yaml" 2>"$tmp/err"; then
    pass "helm template -f $f"
  else
    fail "helm template -f $f" "$(cat "$tmp/err")"
  fi
done
render -f deploy/values/trial.yaml --set 'node.poolDevices={/dev/loop0}' >"$tmp/trial.yaml" 2>"$tmp/err" || fail "trial values" "$(cat "$tmp/err")"
if out=$(python3 - "$tmp/trial.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
ds = next(d for d in docs if d["kind"] == "DaemonSet")
spec = ds["spec"]["template"]["spec"]
bad = []
if spec.get("runtimeClassName"):
    bad.append(f"runtimeClassName {spec['runtimeClassName']}")
if spec.get("nodeSelector"):
    bad.append(f"nodeSelector {spec['nodeSelector']}")
paths = [v.get("hostPath", {}).get("path") for v in spec.get("volumes", [])]
if "/etc/cufile.json" in paths:
    bad.append("mounts /etc/cufile.json")
for sc in (d for d in docs if d["kind"] == "StorageClass"):
    if sc["parameters"].get("gdsPolicy") != "disabled":
        bad.append(f"{sc['metadata']['name']} gdsPolicy {sc['parameters'].get('gdsPolicy')}")
print("; ".join(bad))
sys.exit(1 if bad else 0)
PY
); then
  pass "deploy/values/trial.yaml: no runtime class, no GPU node selector, no cufile.json mount, GDS disabled on every class"
else
  fail "deploy/values/trial.yaml still needs a GPU node" "$out"
fi

# --- rendered manifests in sync --------------------------------------------------
if out=$(HELM=$HELM scripts/render-manifests.sh "$tmp/manifests" 2>&1); then
  if out=$(diff -ru deploy/manifests "$tmp/manifests" 2>&1); then
    pass "deploy/manifests/ matches a fresh render"
  else
    fail "deploy/manifests/ differs from a fresh render: run scripts/render-manifests.sh" "$out"
  fi
  if ! out=$(HELM=$HELM scripts/render-manifests.sh "$tmp/manifests2" 2>&1); then
    fail "scripts/render-manifests.sh (second render)" "$out"
  elif diff -r "$tmp/manifests" "$tmp/manifests2" >/dev/null; then
    pass "render is deterministic"
  else
    fail "render is deterministic"
  fi
else
  fail "scripts/render-manifests.sh" "$out"
fi

finish
