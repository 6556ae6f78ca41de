{{/* Names, labels and the agent's configuration file. */}}

{{- define "warmpath.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "warmpath.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "warmpath.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "warmpath.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "warmpath.selectorLabels" -}}
app.kubernetes.io/name: {{ include "warmpath.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "warmpath.labels" -}}
{{ include "warmpath.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "warmpath.serviceAccountName" -}}
{{- default (include "warmpath.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "warmpath.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Secrets: the chart's own, or the user's existingSecret. */}}
{{- define "warmpath.adminSecretName" -}}
{{- default (printf "%s-admin" (include "warmpath.fullname" .)) .Values.admin.existingSecret -}}
{{- end -}}

{{- define "warmpath.clusterSecretName" -}}
{{- default (printf "%s-cluster-key" (include "warmpath.fullname" .)) .Values.cluster.existingSecret -}}
{{- end -}}

{{- define "warmpath.gossipServiceName" -}}
{{- printf "%s-gossip" (include "warmpath.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "warmpath.clusterId" -}}
{{- default .Release.Name .Values.cluster.id -}}
{{- end -}}

{{/*
A generated secret value: the one already in the cluster (kept across upgrades), else a new
random one. `helm template` has no cluster, so it always generates.
*/}}
{{- define "warmpath.keepOrGenerate" -}}
{{- $existing := lookup "v1" "Secret" .namespace .name -}}
{{- if and $existing $existing.data (hasKey $existing.data .key) -}}
{{- index $existing.data .key -}}
{{- else -}}
{{- randAlphaNum .length | b64enc -}}
{{- end -}}
{{- end -}}

{{/* A listen address on every interface, and this pod's advertised address, for a port. */}}
{{- define "warmpath.any" -}}
{{- if eq .root.Values.ipFamily "IPv6" }}[::]:{{ .port }}{{ else }}0.0.0.0:{{ .port }}{{ end -}}
{{- end -}}
{{- define "warmpath.advertise" -}}
{{- if eq .root.Values.ipFamily "IPv6" }}[$(POD_IP)]:{{ .port }}{{ else }}$(POD_IP):{{ .port }}{{ end -}}
{{- end -}}

{{/* Paths inside the container. */}}
{{- define "warmpath.configDir" -}}/etc/warmpath/config{{- end -}}
{{- define "warmpath.adminTokenFile" -}}/etc/warmpath/admin/token{{- end -}}
{{- define "warmpath.clusterKeyFile" -}}/etc/warmpath/cluster/key{{- end -}}
{{- define "warmpath.hostCgroup" -}}/run/warmpath/cgroup{{- end -}}

{{/* The agent's configuration file (docs/config.md, version 1). */}}
{{- define "warmpath.config" -}}
{{- $c := dict "version" 1 -}}
{{- if not (has .Values.ipFamily (list "IPv4" "IPv6")) -}}
{{- fail (printf "ipFamily: %v: must be IPv4 or IPv6" .Values.ipFamily) -}}
{{- end -}}
{{- $_ := set $c "listen" (list (include "warmpath.any" (dict "root" . "port" (int .Values.ports.proxy)))) -}}
{{- $_ := set $c "admin" (include "warmpath.any" (dict "root" . "port" (int .Values.ports.admin))) -}}
{{- $_ := set $c "adminTokenFile" (include "warmpath.adminTokenFile" .) -}}
{{- $_ := set $c "cacheSaltKeyFile" (include "warmpath.clusterKeyFile" .) -}}
{{- with .Values.config.proxy }}{{ $_ := set $c "proxy" . }}{{ end -}}
{{- $_ := set $c "pools" .Values.pools -}}
{{- with .Values.config.tenants }}{{ $_ := set $c "tenants" . }}{{ end -}}
{{- with .Values.config.telemetry }}{{ $_ := set $c "telemetry" . }}{{ end -}}
{{- $_ := set $c "kubernetes" .Values.kubernetes -}}
{{- toYaml $c -}}
{{- end -}}
