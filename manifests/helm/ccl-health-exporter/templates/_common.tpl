{{/*
Names. Objects are called "ccl-exporter" like the kustomize base (fullnameOverride changes
that). The app name label is fixed: the PodMonitor makes it the scrape job, and the rules
select up{job="ccl-exporter"}.
*/}}
{{- define "ccl.appName" -}}
ccl-exporter
{{- end }}

{{- define "ccl.fullname" -}}
{{- default "ccl-exporter" .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ccl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ccl.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* What selects the exporter's pods (DaemonSet, Service, NetworkPolicy, monitors). */}}
{{- define "ccl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ccl.appName" . }}
{{- end }}

{{/* Every object: the selector labels, the base's part-of, and Helm's standard labels. */}}
{{- define "ccl.labels" -}}
{{ include "ccl.selectorLabels" . }}
app.kubernetes.io/part-of: ccl-health-exporter
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The exporter image, or the probe image (torch) when idle-time probes are on. */}}
{{- define "ccl.image" -}}
{{- $repository := .Values.image.repository }}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- $digest := .Values.image.digest }}
{{- if .Values.probes.enabled }}
{{- $repository = default $repository .Values.probes.image.repository }}
{{- $tag = default (printf "%s-probe" $tag) .Values.probes.image.tag }}
{{- $digest = .Values.probes.image.digest }}
{{- end }}
{{- if $digest }}
{{- printf "%s@%s" $repository $digest }}
{{- else }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}
{{- end }}

{{/* Where web.configSecret is mounted; serve reads web-config.yml from it. */}}
{{- define "ccl.webConfigDir" -}}
/etc/ccl-exporter/web
{{- end }}

{{/*
What a PodMonitor's and a ServiceMonitor's endpoint share, from their values. honorLabels:
the exporter's NCCL and GPU-pod series carry the TRAINING pod's namespace/pod; without it
Prometheus would rename them exported_namespace/exported_pod. Every series gets the node it
was read on.
*/}}
{{- define "ccl.scrapeEndpoint" -}}
interval: {{ .interval }}
scrapeTimeout: {{ .scrapeTimeout }}
{{- with .scheme }}
scheme: {{ . }}
{{- end }}
{{- with .tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
honorLabels: true
relabelings:
  - sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: node
    action: replace
  {{- with .relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
