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
{{- if and $existing (not (dig "metadata" "annotations" "meta.helm.sh/release-name" "" $existing)) -}}
{{- fail (printf "Secret %s/%s exists and was not made by Helm (cert-manager issued it for the Go operator's chart): keep certManager.enabled=auto or true so that cert-manager goes on issuing it, or delete the Secret and its Certificate before setting certManager.enabled=false" .root.Release.Namespace .secret) -}}
{{- end -}}
{{- if and $existing (index $existing.data "ca.crt") -}}
{{- dict "ca" (index $existing.data "ca.crt" | b64dec) "crt" (index $existing.data "tls.crt" | b64dec) "key" (index $existing.data "tls.key" | b64dec) | toJson -}}
{{- else -}}
{{- $ns := .root.Release.Namespace -}}
{{- $ca := genCA (printf "%s-ca" .service) 3650 -}}
{{- $names := list .service (printf "%s.%s" .service $ns) (printf "%s.%s.svc" .service $ns) (printf "%s.%s.svc.%s" .service $ns .root.Values.kubernetesClusterDomain) -}}
{{- $cert := genSignedCert (printf "%s.%s.svc" .service $ns) nil $names 3650 $ca -}}
{{- dict "ca" $ca.Cert "crt" $cert.Cert "key" $cert.Key | toJson -}}
{{- end -}}
{{- end -}}

{{- /*
The Go operator's chart (cso 0.4.x) and its values: a site swaps to this chart with `helm upgrade` and the values
file it has. Its keys are read where they mean something here, and a Go key that is set wins over this chart's
default (values.schema.json refuses those that cannot be honoured and names the key to use instead):
  controllerManager.manager.image.{repository,tag}, .imagePullPolicy -> image.*
  controllerManager.manager.source          -> source
  controllerManager.manager.resources       -> resources
  controllerManager.manager.args            -> after extraArgs (the last of a repeated flag wins, as in Go)
  controllerManager.manager.extraEnv        -> after extraEnv
  controllerManager.replicas                -> replicas
  controllerManager.serviceAccount.annotations -> serviceAccount.annotations
  controllerManager.rbac.additionalRules    -> with rbac.additionalRules
  clusterStackVariables.gitRepoName         -> clusterStackVariables.gitRepositoryName
  hookServerSvc.type, webhookService.type   -> the Services' type
*/}}
{{- define "cso.goValues" -}}
{{- .Values.controllerManager | default dict | toJson -}}
{{- end -}}

{{- define "cso.image" -}}
{{- $go := include "cso.goValues" . | fromJson -}}
{{- $repository := dig "manager" "image" "repository" "" $go | default .Values.image.repository -}}
{{- $tag := dig "manager" "image" "tag" "" $go | default .Values.image.tag | default .Chart.AppVersion -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}

{{- define "cso.imagePullPolicy" -}}
{{- dig "manager" "imagePullPolicy" "" (include "cso.goValues" . | fromJson) | default .Values.image.pullPolicy -}}
{{- end -}}

{{- define "cso.source" -}}
{{- dig "manager" "source" "" (include "cso.goValues" . | fromJson) | default .Values.source -}}
{{- end -}}

{{- define "cso.replicas" -}}
{{- dig "replicas" "" (include "cso.goValues" . | fromJson) | default .Values.replicas -}}
{{- end -}}

{{- define "cso.resources" -}}
{{- dig "manager" "resources" dict (include "cso.goValues" . | fromJson) | default .Values.resources | toYaml -}}
{{- end -}}

{{- define "cso.goArgs" -}}
{{- dig "manager" "args" list (include "cso.goValues" . | fromJson) | toJson -}}
{{- end -}}

{{- define "cso.goEnv" -}}
{{- dig "manager" "extraEnv" list (include "cso.goValues" . | fromJson) | toJson -}}
{{- end -}}

{{- define "cso.serviceAccountAnnotations" -}}
{{- $go := dig "serviceAccount" "annotations" dict (include "cso.goValues" . | fromJson) -}}
{{- merge (deepCopy $go) (.Values.serviceAccount.annotations | default dict) | toJson -}}
{{- end -}}

{{- define "cso.additionalRules" -}}
{{- $go := dig "rbac" "additionalRules" list (include "cso.goValues" . | fromJson) -}}
{{- concat .Values.rbac.additionalRules $go | uniq | toJson -}}
{{- end -}}

{{- define "cso.gitRepositoryName" -}}
{{- .Values.clusterStackVariables.gitRepoName | default .Values.clusterStackVariables.gitRepositoryName -}}
{{- end -}}

{{- /* The type of Service `<fullname>-<key>`: the Go chart's hookServerSvc.type / webhookService.type. */}}
{{- define "cso.serviceType" -}}
{{- dig "type" "ClusterIP" (index .root.Values .key | default dict) -}}
{{- end -}}

{{- /*
Whether cert-manager issues the serving certificates: certManager.enabled true or false, or "auto" (the
default): yes when this release's Certificate for the webhooks exists already, as after the Go chart (which
always used cert-manager) or an earlier install with certManager.enabled=true, so that a swap keeps the
Certificates, Issuer and Secrets it has; no on a fresh install, and no on a cluster without cert-manager's CRDs
(where Helm's lookup of a kind the API server does not serve fails the install). Prints "true" or "".
*/}}
{{- define "cso.certManager" -}}
{{- $mode := .Values.certManager.enabled -}}
{{- if eq (toString $mode) "auto" -}}
{{- if and (.Capabilities.APIVersions.Has "cert-manager.io/v1/Certificate") (lookup "cert-manager.io/v1" "Certificate" .Release.Namespace (printf "%s-serving-cert" (include "cso.fullname" .))) -}}
true
{{- end -}}
{{- else if $mode -}}
true
{{- end -}}
{{- end -}}

{{- /*
A Deployment's selector: the live one when the Deployment exists (a selector is immutable: the Go chart's has
four labels, an older install of this chart one), else `control-plane: <name>`. The pod template carries it too.
Takes dict {root, name}.
*/}}
{{- define "cso.deploymentSelector" -}}
{{- $live := lookup "apps/v1" "Deployment" .root.Release.Namespace .name -}}
{{- $selector := dict -}}
{{- if $live -}}
{{- $selector = $live.spec.selector.matchLabels | default dict -}}
{{- end -}}
{{- if not $selector -}}
{{- $selector = dict "control-plane" .name -}}
{{- end -}}
{{- $selector | toJson -}}
{{- end -}}

{{- /*
Refuses `crds.install=false` while the CRDs belong to this release without the keep policy (the Go chart
installed them as templates): Helm would delete them, and with them every ClusterStack, ClusterStackRelease and
ClusterAddon.
*/}}
{{- define "cso.crdsGuard" -}}
{{- if not .Values.crds.install -}}
{{- range $name := list "clusteraddons" "clusterstacks" "clusterstackreleases" -}}
{{- $crd := lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" (printf "%s.clusterstack.x-k8s.io" $name) -}}
{{- $annotations := dig "metadata" "annotations" dict ($crd | default dict) -}}
{{- if and (eq (get $annotations "meta.helm.sh/release-name") $.Release.Name) (eq (get $annotations "meta.helm.sh/release-namespace") $.Release.Namespace) (ne (get $annotations "helm.sh/resource-policy") "keep") -}}
{{- fail (printf "crds.install=false would delete CRD %s.clusterstack.x-k8s.io, which this release installed without helm.sh/resource-policy=keep (the Go chart's templates), and every object of its kind: upgrade once with crds.install=true (this chart keeps them), then set it false" $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
