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
     driver name keeps the historical /var/lib/gds-csi, so upgrades find their state. */}}
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

{{/* Fail early on values the driver would reject at runtime. */}}
{{- define "gds-csi.validate" -}}
{{- if not (has .Values.logFormat (list "text" "json")) -}}
{{- fail (printf "logFormat must be text or json, got %q" .Values.logFormat) -}}
{{- end -}}
{{- range $name, $sc := dict "nvme" .Values.storageClasses.nvme "nvmeWhole" .Values.storageClasses.nvmeWhole -}}
{{- if not (has $sc.fsType (list "ext4" "xfs")) -}}
{{- fail (printf "storageClasses.%s.fsType must be ext4 or xfs, got %q" $name $sc.fsType) -}}
{{- end -}}
{{- end -}}
{{- range $name, $sc := dict "nvme" .Values.storageClasses.nvme "nvmeWhole" .Values.storageClasses.nvmeWhole "nfs" .Values.storageClasses.nfs -}}
{{- if not (has $sc.gdsPolicy (list "required" "preferred" "disabled")) -}}
{{- fail (printf "storageClasses.%s.gdsPolicy must be required, preferred or disabled, got %q" $name $sc.gdsPolicy) -}}
{{- end -}}
{{- end -}}
{{- if not (has .Values.nfs.onDelete (list "delete" "retain" "archive")) -}}
{{- fail (printf "nfs.onDelete must be delete, retain or archive, got %q" .Values.nfs.onDelete) -}}
{{- end -}}
{{- if .Values.nfs.enabled -}}
{{- if not .Values.nfs.server -}}
{{- fail "nfs.server is required when nfs.enabled is true" -}}
{{- end -}}
{{- if not .Values.nfs.share -}}
{{- fail "nfs.share is required when nfs.enabled is true" -}}
{{- end -}}
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
