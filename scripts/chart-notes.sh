#!/usr/bin/env bash
# What `helm install` prints after installing (the chart's NOTES.txt) for the values given,
# without a cluster: Helm renders NOTES.txt only on install, so a copy of the chart renders
# it as a template of its own.
#
#   bash scripts/chart-notes.sh [helm template flags, e.g. -f deploy/values/trial.yaml]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/scripts/lib.sh"
install_helm >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$ROOT/deploy/helm/gds-csi" "$tmp/chart"
# Templates cannot read templates/ through .Files: the copy sits at the chart's root.
mv "$tmp/chart/templates/NOTES.txt" "$tmp/chart/notes.txt"
cat >"$tmp/chart/templates/notes-preview.yaml" <<'YAML'
notes: {{ tpl (.Files.Get "notes.txt") . | toJson }}
YAML
"$HELM" template gds-csi "$tmp/chart" --namespace gds-csi --kube-version "${KUBE_VERSION:-1.34.3}" \
  --show-only templates/notes-preview.yaml "$@" |
  python3 -c 'import sys, yaml; print(next(d for d in yaml.safe_load_all(sys.stdin) if d)["notes"])'
