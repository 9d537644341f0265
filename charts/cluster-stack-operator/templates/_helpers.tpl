{{- define "cso.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "cso.labels" -}}
app.kubernetes.io/name: cluster-stack-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
cluster.x-k8s.io/provider: cluster-stack-operator
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "cso.selector" -}}
control-plane: {{ include "cso.fullname" . }}-controller-manager
{{- end -}}

{{- /* Labels every manager pod has, whichever shard it runs. */}}
{{- define "cso.podLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller-manager
{{- end -}}

{{- /* What the Services select: the default Deployment's pods (as before shards), or the pods of every shard,
which all serve webhooks, hooks and metrics. */}}
{{- define "cso.serviceSelector" -}}
{{- if .Values.shards -}}
{{ include "cso.podLabels" . }}
{{- else -}}
{{ include "cso.selector" . }}
{{- end -}}
{{- end -}}

{{- define "cso.variablesSecret" -}}
{{- default (printf "%s-cluster-stack-variables" (include "cso.fullname" .)) .Values.existingVariablesSecret -}}
{{- end -}}

{{/*
A serving certificate for service <name> as a dict {ca, crt, key} (PEM): the one in Secret <secret> if it
exists (so upgrades keep it), else a new self-signed CA and certificate.
*/}}
{{- define "cso.servingCert" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .secret -}}
{{- if and $existing (index $existing.data "ca.crt") -}}
{{- dict "ca" (index $existing.data "ca.crt" | b64dec) "crt" (index $existing.data "tls.crt" | b64dec) "key" (index $existing.data "tls.key" | b64dec) | toJson -}}
{{- else -}}
{{- $ns := .root.Release.Namespace -}}
{{- $ca := genCA (printf "%s-ca" .service) 3650 -}}
{{- $names := list .service (printf "%s.%s" .service $ns) (printf "%s.%s.svc" .service $ns) (printf "%s.%s.svc.cluster.local" .service $ns) -}}
{{- $cert := genSignedCert (printf "%s.%s.svc" .service $ns) nil $names 3650 $ca -}}
{{- dict "ca" $ca.Cert "crt" $cert.Cert "key" $cert.Key | toJson -}}
{{- end -}}
{{- end -}}
