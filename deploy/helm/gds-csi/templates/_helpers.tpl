{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "gds-csi.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name: the release name (plus the chart name when
     the release is not already called after it). */}}
{{- define "gds-csi.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The node plugin's state dir: unique per driver name unless set. The default
     driver name keeps /var/lib/gds-csi, so upgrades find their state. */}}
{{- define "gds-csi.stateDir" -}}
{{- if .Values.stateDir -}}
{{- .Values.stateDir -}}
{{- else if eq .Values.driverName "gds.csi.gds-csi.io" -}}
/var/lib/gds-csi
{{- else -}}
{{- printf "/var/lib/gds-csi-%s" .Values.driverName -}}
{{- end -}}
{{- end -}}

{{- define "gds-csi.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gds-csi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gds-csi
{{- end -}}

{{- define "gds-csi.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gds-csi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* repository with .Values.imageRegistry in front when set. Call with (list $ repository). */}}
{{- define "gds-csi.repository" -}}
{{- $root := index . 0 -}}{{- $repo := index . 1 -}}
{{- if $root.Values.imageRegistry -}}
{{- printf "%s/%s" (trimSuffix "/" $root.Values.imageRegistry) $repo -}}
{{- else -}}
{{- $repo -}}
{{- end -}}
{{- end -}}

{{- define "gds-csi.image" -}}
{{- printf "%s:%s" (include "gds-csi.repository" (list . .Values.image.repository)) (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* A sidecar's image. Call with (list $ .Values.sidecars.<name>.image). */}}
{{- define "gds-csi.sidecarImage" -}}
{{- $img := index . 1 -}}
{{- printf "%s:%s" (include "gds-csi.repository" (list (index . 0) $img.repository)) $img.tag -}}
{{- end -}}

{{- define "gds-csi.nodeServiceAccount" -}}
{{- default (printf "%s-node" (include "gds-csi.fullname" .)) .Values.serviceAccount.name.node -}}
{{- end -}}

{{/* node.hostNetwork: null means "only when NFS is enabled". */}}
{{- define "gds-csi.nodeHostNetwork" -}}
{{- if kindIs "invalid" .Values.node.hostNetwork -}}
{{- .Values.nfs.enabled -}}
{{- else -}}
{{- .Values.node.hostNetwork -}}
{{- end -}}
{{- end -}}

{{/* Fail early on values the driver would reject at runtime, and on a target
     cluster that lacks what the chart cannot do without. values.schema.json
     checks each value on its own; these need two values, or the cluster. */}}
{{- define "gds-csi.validate" -}}
{{- if .Values.nfs.enabled -}}
{{- if not .Values.nfs.server -}}
{{- fail "nfs.server is required when nfs.enabled is true" -}}
{{- end -}}
{{- if not .Values.nfs.share -}}
{{- fail "nfs.share is required when nfs.enabled is true" -}}
{{- end -}}
{{- end -}}
{{- if not (include "gds-csi.serves" (list . "storage.k8s.io/v1/CSIStorageCapacity")) -}}
{{- fail (printf "Kubernetes %s does not serve storage.k8s.io/v1 CSIStorageCapacity (Kubernetes >= 1.24): the scheduler places node-local volumes by it and external-provisioner 6.x publishes only v1" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if and .Values.seLinuxMount (semverCompare "<1.28.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "seLinuxMount=true needs Kubernetes >= 1.28 (SELinuxMountReadWriteOncePod on by default); the target is %s (without a cluster, pass helm template --kube-version)" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- with .Values.snapshots.class -}}
{{- if and $.Values.snapshots.enabled .create -}}
{{- $nfs := or .storeServer .storeShare .storePath .storeProto .storePort .storeVers -}}
{{- if and .storeDir $nfs -}}
{{- fail "snapshots.class: storeDir or the NFS store (storeServer, storeShare, ...), not both" -}}
{{- end -}}
{{- if not (or .storeDir .storeServer) -}}
{{- fail "snapshots.class needs a store: storeDir, or storeServer and storeShare (or snapshots.class.create=false)" -}}
{{- end -}}
{{- if and .storeServer (not .storeShare) -}}
{{- fail "snapshots.class.storeShare is required with storeServer" -}}
{{- end -}}
{{- if and (not .storeServer) $nfs (not .storeDir) -}}
{{- fail "snapshots.class: storeShare, storePath, storeProto, storePort and storeVers need storeServer" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" unless the target's API list says it does not serve a kind. Call
     with (list $ "group/version/Kind"). A cluster's discovery names every kind
     it serves (v1/Pod among them); a render without a cluster (helm template)
     knows only group/versions, and then the answer is "true". */}}
{{- define "gds-csi.serves" -}}
{{- $caps := (index . 0).Capabilities -}}
{{- if or (not ($caps.APIVersions.Has "v1/Pod")) ($caps.APIVersions.Has (index . 1)) -}}
true
{{- end -}}
{{- end -}}

{{/* "true" when the target serves storage.k8s.io/v1 VolumeAttributesClass
     (Kubernetes >= 1.34), which external-provisioner 6.x and external-resizer
     2.x use unless their VolumeAttributesClass gate is off. */}}
{{- define "gds-csi.volumeAttributesClass" -}}
{{- if and (semverCompare ">=1.34.0-0" .Capabilities.KubeVersion.Version) (include "gds-csi.serves" (list . "storage.k8s.io/v1/VolumeAttributesClass")) -}}
true
{{- end -}}
{{- end -}}

{{/* "true" when the target has RecoverVolumeExpansionFailure on by default
     (Kubernetes >= 1.32), which external-resizer 2.x needs with that gate on. */}}
{{- define "gds-csi.recoverExpansion" -}}
{{- if semverCompare ">=1.32.0-0" .Capabilities.KubeVersion.Version -}}
true
{{- end -}}
{{- end -}}

{{/*
--udev-rules-dir: the host's rules directories as the driver sees them (under
/host), with the host's /run/udev/rules.d (mounted at /run/udev) after /etc.
*/}}
{{- define "gds-csi.udevRulesDirs" -}}
{{- $dirs := list -}}
{{- range $i, $dir := .Values.node.udevRulesDirs -}}
{{- $dirs = append $dirs (printf "/host%s" $dir) -}}
{{- if eq $i 0 -}}{{- $dirs = append $dirs "/run/udev/rules.d" -}}{{- end -}}
{{- end -}}
{{- join "," $dirs -}}
{{- end -}}

{{/* The host directories mounted into the driver container for snapshot
     stores, as a JSON list: the chart class's storeDir, then
     snapshots.hostStoreDirs, each once; empty unless snapshots.enabled. */}}
{{- define "gds-csi.snapshotStoreDirs" -}}
{{- $dirs := list -}}
{{- if .Values.snapshots.enabled -}}
{{- if and .Values.snapshots.class.create .Values.snapshots.class.storeDir -}}
{{- $dirs = append $dirs (trimSuffix "/" .Values.snapshots.class.storeDir) -}}
{{- end -}}
{{- range .Values.snapshots.hostStoreDirs -}}
{{- $dirs = append $dirs (trimSuffix "/" .) -}}
{{- end -}}
{{- end -}}
{{- $dirs | uniq | toJson -}}
{{- end -}}
