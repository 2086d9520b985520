{{/*
Names. Objects are named after the release, as prometheus-node-exporter's and dcgm-exporter's
charts name theirs: the release name when it contains the chart's name ("ccl-health-exporter"),
else <release>-ccl-health-exporter, at most 63 characters; fullnameOverride replaces it. So two
releases never share an object name, cluster-scoped objects included. The app name label is
fixed: the PodMonitor makes it the scrape job, and the rules select up{job="ccl-exporter"}.
*/}}
{{- define "ccl.appName" -}}
ccl-exporter
{{- end }}

{{- define "ccl.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains .Chart.Name .Release.Name }}
{{- include "ccl.fit" (dict "name" .Release.Name "room" 63) }}
{{- else }}
{{- include "ccl.fit" (dict "name" (printf "%s-%s" .Release.Name .Chart.Name) "room" 63) }}
{{- end }}
{{- end }}

{{/*
A name cut to `room` characters; a name that had to be cut ends in 5 characters of its hash, so
that two long release names that start alike still give two names. Call with (dict "name" "room").
*/}}
{{- define "ccl.fit" -}}
{{- if le (len .name) (int .room) }}
{{- .name }}
{{- else }}
{{- printf "%s-%s" (trunc (int (sub .room 6)) .name | trimSuffix "-") (sha256sum .name | trunc 5) }}
{{- end }}
{{- end }}

{{/*
The fullname with a suffix ("lifecycle", "webhook", ...), within 63 characters with the suffix
kept. Call with (dict "root" $ "suffix" "x").
*/}}
{{- define "ccl.suffixedName" -}}
{{- printf "%s-%s" (include "ccl.fit" (dict "name" (include "ccl.fullname" .root) "room" (sub 62 (len .suffix)))) .suffix }}
{{- end }}

{{- define "ccl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ccl.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
What selects the exporter's pods (DaemonSet, Service, NetworkPolicy, monitors): the app name
and the release, so that a second release's selectors never take this one's pods.
*/}}
{{- define "ccl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ccl.appName" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Every object: the selector labels, the base's part-of, Helm's standard labels, commonLabels. */}}
{{- define "ccl.labels" -}}
{{ include "ccl.selectorLabels" . }}
{{ include "ccl.commonLabels" . }}
{{- end }}

{{/* What every object carries besides its selector labels. */}}
{{- define "ccl.commonLabels" -}}
app.kubernetes.io/part-of: ccl-health-exporter
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
A monitor's or a rule's own labels: additionalLabels, over the deprecated `labels` (the name
before additionalLabels; still read, NOTES.txt says to move). Call with the values of the
monitor or rule.
*/}}
{{- define "ccl.additionalLabels" -}}
{{- $merged := merge (deepCopy (default dict .additionalLabels)) (default dict .labels) }}
{{- with $merged }}
{{- toYaml . }}
{{- end }}
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
What web.tls and web.basicAuth say about the web configuration in web.configSecret, which the
chart cannot read: they describe that file, so they need it.
*/}}
{{- define "ccl.webChecks" -}}
{{- $web := .Values.web }}
{{- if and (or $web.tls.enabled $web.basicAuth.enabled) (not $web.configSecret) }}
{{- fail "web.tls.enabled and web.basicAuth.enabled say what web-config.yml in web.configSecret turns on: set web.configSecret (the Secret holding that file) too" }}
{{- end }}
{{- if and (ne $web.tls.clientAuthType "NoClientCert") (not $web.tls.enabled) }}
{{- fail (printf "web.tls.clientAuthType %s is a TLS setting: set web.tls.enabled too" $web.tls.clientAuthType) }}
{{- end }}
{{- end }}

{{/* "true" when the exporter refuses TLS clients without a certificate, as kubelet's probes are. */}}
{{- define "ccl.clientCertificateRequired" -}}
{{- if and .Values.web.tls.enabled (has .Values.web.tls.clientAuthType (list "RequireAndVerifyClientCert" "RequireAnyClientCert" "RequireClientCert")) }}true{{ end }}
{{- end }}

{{/*
A liveness or readiness probe: the chart's handler for the web configuration and the timings
from values. The handler is an httpGet of `path` (HTTPS with web.tls.enabled: kubelet does not
verify the certificate and sends no credentials, and /healthz and /readyz need none), or, when
the exporter requires client certificates, a tcpSocket probe: kubelet cannot present one, so
an HTTPS probe would fail its handshake (what dcgm-exporter's chart does too). A handler in the
values (httpGet, tcpSocket, exec, grpc) replaces the chart's. Call with
(dict "root" $ "probe" <values> "path" "/healthz").
*/}}
{{- define "ccl.probe" -}}
{{- $probe := .probe }}
{{- if or $probe.httpGet $probe.tcpSocket $probe.exec $probe.grpc }}
{{- toYaml $probe }}
{{- else }}
{{- if include "ccl.clientCertificateRequired" .root }}
tcpSocket:
  port: metrics
{{- else }}
httpGet:
  path: {{ .path }}
  port: metrics
  {{- if .root.Values.web.tls.enabled }}
  scheme: HTTPS
  {{- end }}
{{- end }}
{{- with $probe }}
{{ toYaml . }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The scheme a monitor scrapes with: its own (lowercase: the Prometheus Operator accepts only
lowercase before v0.87), else https with web.tls.enabled. Call with (dict "root" $ "monitor" <values>).
*/}}
{{- define "ccl.scrapeScheme" -}}
{{- lower (default (ternary "https" "" .root.Values.web.tls.enabled) .monitor.scheme) }}
{{- end }}

{{/*
Checks that a monitor can scrape the exporter as web.* configures it: https with TLS, a client
certificate when one is required, credentials with basic auth; a PodMonitor's TLS from Secrets
or ConfigMaps only (it has no file fields: the files would have to be in the Prometheus pod).
Call with (dict "root" $ "monitor" <values> "kind" "PodMonitor"|"ServiceMonitor" "key" "podMonitor"|"serviceMonitor").
*/}}
{{- define "ccl.monitorChecks" -}}
{{- include "ccl.webChecks" .root }}
{{- $web := .root.Values.web }}
{{- $scheme := include "ccl.scrapeScheme" . }}
{{- $tls := default dict .monitor.tlsConfig }}
{{- if and $web.tls.enabled (ne $scheme "https") }}
{{- fail (printf "web.tls.enabled: the exporter serves HTTPS, but %s.scheme is %s; leave it empty or set https" .key $scheme) }}
{{- end }}
{{- if and (not $web.tls.enabled) (eq $scheme "https") $web.configSecret }}
{{- fail (printf "%s.scheme is https but web.tls.enabled is false: set web.tls.enabled when web-config.yml has tls_server_config (the probes follow it too)" .key) }}
{{- end }}
{{- if and $web.tls.enabled (not $tls) }}
{{- fail (printf "web.tls.enabled: set %s.tlsConfig, or Prometheus cannot verify the exporter: the CA that signed its certificate (ca) and a name in that certificate (serverName; Prometheus connects to the pod's IP address), or insecureSkipVerify" .key) }}
{{- end }}
{{- if eq .kind "PodMonitor" }}
{{- range $field := list "caFile" "certFile" "keyFile" }}
{{- if hasKey $tls $field }}
{{- fail (printf "podMonitor.tlsConfig.%s: a PodMonitor's TLS takes Secrets and ConfigMaps only (ca, cert, keySecret), not files in the Prometheus pod; use those, or a ServiceMonitor" $field) }}
{{- end }}
{{- end }}
{{- end }}
{{- if include "ccl.clientCertificateRequired" .root }}
{{- if not (and (or $tls.cert $tls.certFile) (or $tls.keySecret $tls.keyFile)) }}
{{- fail (printf "web.tls.clientAuthType is %s: %s.tlsConfig needs the client certificate and key Prometheus presents (cert and keySecret)" .root.Values.web.tls.clientAuthType .key) }}
{{- end }}
{{- end }}
{{- if and $web.basicAuth.enabled (not .monitor.basicAuth) }}
{{- fail (printf "web.basicAuth.enabled: /metrics needs credentials; set %s.basicAuth (username and password from a Secret)" .key) }}
{{- end }}
{{- end }}

{{/*
What a PodMonitor's and a ServiceMonitor's endpoint share, from their values. honorLabels:
the exporter's NCCL and GPU-pod series carry the TRAINING pod's namespace/pod; without it
Prometheus would rename them exported_namespace/exported_pod. Every series gets the node it
was read on; the NCCL Inspector's counters also get ccl_rule_partition, the hash of the node's
name modulo 8, which the in-job rate groups (ccl-health-job-nodes-0 to -7) split the fleet by.
The same relabelings as manifests/base/podmonitor.yaml (tests/test_helm_chart.py).
Call with (dict "root" $ "monitor" <values> "kind" ... "key" ...).
*/}}
{{- define "ccl.scrapeEndpoint" -}}
{{- include "ccl.monitorChecks" . }}
{{- $monitor := .monitor }}
interval: {{ $monitor.interval }}
scrapeTimeout: {{ $monitor.scrapeTimeout }}
{{- with include "ccl.scrapeScheme" . }}
scheme: {{ . }}
{{- end }}
{{- with $monitor.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $monitor.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
honorLabels: true
relabelings:
  - sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: node
    action: replace
  {{- with $monitor.relabelings }}
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
  {{- with $monitor.metricRelabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* The monitor in use (the PodMonitor's values unless only the ServiceMonitor is on), and its kind. */}}
{{- define "ccl.activeMonitorKey" -}}
{{- ternary "serviceMonitor" "podMonitor" (and .Values.serviceMonitor.enabled (not .Values.podMonitor.enabled)) }}
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

{{/*
The webhook's object names (ServiceAccount, Deployment, Service, PodDisruptionBudget,
NetworkPolicy, monitor, Certificate, and the cluster-wide MutatingWebhookConfiguration):
<fullname>-webhook, the fullname fitted to 44 characters so that the longest name made from
it, <webhook name>-selfsigned, stays within 63.
*/}}
{{- define "ccl.webhookName" -}}
{{- printf "%s-webhook" (include "ccl.fit" (dict "name" (include "ccl.fullname" .) "room" 44)) }}
{{- end }}

{{/* What selects the webhook's pods (Deployment, Service, PodDisruptionBudget, NetworkPolicy, monitor). */}}
{{- define "ccl.webhookSelectorLabels" -}}
app.kubernetes.io/name: ccl-webhook
app.kubernetes.io/instance: {{ .Release.Name }}
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
