{{- /* Written from the exporter's collector registry by `make chart-files`: the collectors that are
off unless --collector.<name> switches them on, space-separated. */}}
{{- define "ccl.collectorsOffByDefault" -}}
lifecycle
{{- end }}
