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
{{ include "ccl.commonLabels" . }}
{{- end }}

{{/* What every object carries besides its selector labels. */}}
{{- define "ccl.commonLabels" -}}
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
{{- include "ccl.imageRef" (dict "repository" $repository "tag" $tag "digest" $digest) }}
{{- end }}

{{/* repository@digest when there is a digest, else repository:tag. */}}
{{- define "ccl.imageRef" -}}
{{- if .digest }}
{{- printf "%s@%s" .repository .digest }}
{{- else }}
{{- printf "%s:%s" .repository .tag }}
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
was read on; the NCCL Inspector's counters also get ccl_rule_partition, the hash of the node's
name modulo 8, which the in-job rate groups (ccl-health-job-nodes-0 to -7) split the fleet by.
The same relabelings as manifests/base/podmonitor.yaml (tests/test_helm_chart.py).
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
metricRelabelings:
  - sourceLabels: [node]
    modulus: 8
    targetLabel: ccl_rule_partition
    action: hashmod
  - sourceLabels: [__name__, ccl_rule_partition]
    regex: "ccl_nccl_collective_[a-z_]+_total;(.*)|.*"
    targetLabel: ccl_rule_partition
    replacement: "$1"
    action: replace
  {{- with .metricRelabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* ---- Lifecycle hooks and the admission webhook ---- */}}

{{/*
Whether the lifecycle collector runs: lifecycle.enabled, which also installs its RBAC. The
collector switch collectors.lifecycle is unset by default; set, it must say the same.
*/}}
{{- define "ccl.lifecycleEnabled" -}}
{{- $switch := .Values.collectors.lifecycle }}
{{- if and (kindIs "bool" $switch) (ne $switch .Values.lifecycle.enabled) }}
{{- fail (printf "collectors.lifecycle=%v contradicts lifecycle.enabled=%v: the lifecycle hooks are switched by lifecycle.enabled, which also installs the RBAC they write with; leave collectors.lifecycle unset" $switch .Values.lifecycle.enabled) }}
{{- end }}
{{- if .Values.lifecycle.enabled }}true{{ end }}
{{- end }}

{{/* The webhook's object names: ccl-webhook like the overlay, <fullnameOverride>-webhook with one. */}}
{{- define "ccl.webhookName" -}}
{{- if .Values.fullnameOverride }}
{{- printf "%s-webhook" (include "ccl.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- print "ccl-webhook" }}
{{- end }}
{{- end }}

{{/* The MutatingWebhookConfiguration (cluster-wide, so named after the project). */}}
{{- define "ccl.webhookConfigurationName" -}}
{{- if .Values.fullnameOverride }}
{{- include "ccl.webhookName" . }}
{{- else }}
{{- print "ccl-health-webhook" }}
{{- end }}
{{- end }}

{{/* What selects the webhook's pods (Deployment, Service, PodDisruptionBudget, NetworkPolicy, monitor). */}}
{{- define "ccl.webhookSelectorLabels" -}}
app.kubernetes.io/name: ccl-webhook
{{- end }}

{{/* Every webhook object: its selector labels and the chart's other labels. */}}
{{- define "ccl.webhookLabels" -}}
{{ include "ccl.webhookSelectorLabels" . }}
{{ include "ccl.commonLabels" . }}
{{- end }}

{{/* The Secret with the webhook's serving certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "ccl.webhookTlsSecret" -}}
{{- default (printf "%s-tls" (include "ccl.webhookName" .)) .Values.webhook.tls.secretName }}
{{- end }}

{{/* The DNS name the webhook's certificate is for, and the API server and Prometheus call. */}}
{{- define "ccl.webhookHost" -}}
{{- printf "%s.%s.svc" (include "ccl.webhookName" .) .Release.Namespace }}
{{- end }}

{{/*
An image of the webhook's (webhook.image, webhook.preflight.image): each field it leaves empty
is the exporter's (image.*); the exporter's digest only when neither repository nor tag is its own.
Call with (dict "root" $ "own" <image values>).
*/}}
{{- define "ccl.ownOrExporterImage" -}}
{{- $exporter := .root.Values.image }}
{{- $repository := default $exporter.repository .own.repository }}
{{- $tag := default .root.Chart.AppVersion (default $exporter.tag .own.tag) }}
{{- $digest := .own.digest }}
{{- if not (or .own.repository .own.tag) }}
{{- $digest = default $exporter.digest .own.digest }}
{{- end }}
{{- include "ccl.imageRef" (dict "repository" $repository "tag" $tag "digest" $digest) }}
{{- end }}

{{/*
The webhook's caBundle without cert-manager: webhook.caBundle as PEM or its base64, checked to be
a certificate.
*/}}
{{- define "ccl.webhookCaBundle" -}}
{{- $given := trim .Values.webhook.caBundle }}
{{- $pem := ternary $given (b64dec (regexReplaceAll "\\s" $given "")) (hasPrefix "-----BEGIN" $given) }}
{{- if not (hasPrefix "-----BEGIN CERTIFICATE-----" (trim $pem)) }}
{{- fail "webhook.caBundle must be the CA certificate that signed the webhook's certificate, PEM (--set-file webhook.caBundle=ca.crt) or its base64; it is needed when webhook.certManager.enabled is false" }}
{{- end }}
{{- printf "%s\n" (trim $pem) | b64enc }}
{{- end }}

{{/*
The CEL condition of the webhook's matchConditions: a container requests or limits one of the
GPU resources (nvidia.com/gpu and webhook.gpuResources).
*/}}
{{- define "ccl.requestsGpuExpression" -}}
{{- $names := uniq (prepend .Values.webhook.gpuResources "nvidia.com/gpu") }}
{{- $sections := list }}
{{- range $section := list "limits" "requests" }}
{{- $tests := list }}
{{- range $names }}
{{- $tests = append $tests (printf "'%s' in c.resources.%s" . $section) }}
{{- end }}
{{- $any := join " || " $tests }}
{{- if gt (len $tests) 1 }}
{{- $any = printf "(%s)" $any }}
{{- end }}
{{- $sections = append $sections (printf "(has(c.resources.%s) && %s)" $section $any) }}
{{- end }}
{{- printf "object.spec.containers.exists(c, has(c.resources) && (%s))" (join " || " $sections) }}
{{- end }}
