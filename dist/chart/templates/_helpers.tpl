{{/* The chart's name: app.kubernetes.io/name. */}}
{{- define "lockwarden.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object's name, as config/default's namePrefix
("lockwarden" for a release named lockwarden): fullnameOverride, or the
release's name, followed by the chart's unless it already contains it, as
most charts name their objects. Cluster-scoped objects carry it too, so two
releases never share a name. At most 28 characters, so that the longest
name made from it (<fullname>-controller-manager-metrics-service) is a
valid Service name; longer is refused rather than cut, since a cut name
could collide. */}}
{{- define "lockwarden.fullname" -}}
{{- $name := "" -}}
{{- if .Values.fullnameOverride -}}
{{- $name = .Values.fullnameOverride -}}
{{- else if contains (include "lockwarden.name" .) .Release.Name -}}
{{- $name = .Release.Name -}}
{{- else -}}
{{- $name = printf "%s-%s" .Release.Name (include "lockwarden.name" .) -}}
{{- end -}}
{{- if gt (len $name) 28 -}}
{{- fail (printf "the names' prefix %q is %d characters, above 28: names made from it (%s-controller-manager-metrics-service) must fit in 63. Set fullnameOverride to 28 characters or fewer." $name (len $name) $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* The manager's ServiceAccount. */}}
{{- define "lockwarden.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-controller-manager" (include "lockwarden.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "lockwarden.labels" -}}
app.kubernetes.io/name: {{ include "lockwarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: lockwarden
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The manager pods' labels that the Deployment, the PodDisruptionBudget,
the anti-affinity, the metrics Service and the NetworkPolicy select on: this
operator's name and this release's instance, so no other operator's pods,
nor another release's, are ever selected. */}}
{{- define "lockwarden.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lockwarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: manager
{{- end -}}

{{/* The manager image: repository, then the tag (the chart's appVersion by
default) and the digest, which pins the image whatever the tag says. */}}
{{- define "lockwarden.image" -}}
{{- $image := .Values.manager.image -}}
{{- $ref := printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) -}}
{{- with $image.digest -}}
{{- $ref = printf "%s@%s" $ref . -}}
{{- end -}}
{{- $ref -}}
{{- end -}}

{{/* The metrics Service's name, which the metrics certificate names. */}}
{{- define "lockwarden.metricsServiceName" -}}
{{- include "lockwarden.fullname" . }}-controller-manager-metrics-service
{{- end -}}

{{/* The Secret cert-manager writes the metrics certificate to. */}}
{{- define "lockwarden.metricsCertSecret" -}}
{{- include "lockwarden.fullname" . }}-metrics-server-cert
{{- end -}}

{{/* Where the manager reads the metrics certificate. */}}
{{- define "lockwarden.metricsCertPath" -}}
/tmp/k8s-metrics-server/metrics-certs
{{- end -}}

{{/* Guard rails: combinations the chart refuses, each with what to change.
Included by the Deployment's template, so `helm template` and `helm install`
fail before anything is applied. */}}
{{- define "lockwarden.validate" -}}
{{- $v := .Values -}}
{{- if and (gt (int $v.manager.replicas) 1) (not $v.leaderElection.enable) -}}
{{- fail (printf "manager.replicas=%d with leaderElection.enable=false would run %d managers granting the same locks at once: enable leader election, or set manager.replicas=1" (int $v.manager.replicas) (int $v.manager.replicas)) -}}
{{- end -}}
{{- if lt (int $v.manager.replicas) 1 -}}
{{- fail "manager.replicas must be at least 1: with none, nobody renews the locks held in Redis" -}}
{{- end -}}
{{- if and $v.metrics.serviceMonitor.enable (not $v.metrics.enable) -}}
{{- fail "metrics.serviceMonitor.enable needs metrics.enable: there is no metrics endpoint to scrape" -}}
{{- end -}}
{{- if and $v.metrics.prometheusRule.enable (not $v.metrics.enable) -}}
{{- fail "metrics.prometheusRule.enable needs metrics.enable: its alerts read the manager's metrics" -}}
{{- end -}}
{{- if and $v.metrics.certManager.enable (not (and $v.metrics.enable $v.metrics.secure)) -}}
{{- fail "metrics.certManager.enable needs metrics.enable and metrics.secure: the certificate is for the HTTPS metrics endpoint" -}}
{{- end -}}
{{- if and $v.metrics.serviceMonitor.enable $v.metrics.secure (not $v.metrics.certManager.enable) (not $v.metrics.serviceMonitor.insecureSkipVerify) -}}
{{- fail "metrics.serviceMonitor on the HTTPS endpoint needs a certificate Prometheus can verify: set metrics.certManager.enable=true, or metrics.serviceMonitor.insecureSkipVerify=true to scrape the manager's self-signed certificate" -}}
{{- end -}}
{{- if and $v.networkPolicy.enable (not $v.metrics.enable) -}}
{{- fail "networkPolicy.enable admits scrapers to the metrics port: it needs metrics.enable" -}}
{{- end -}}
{{- $mode := $v.redis.mode -}}
{{- if eq $mode "sentinel" -}}
{{- if or (empty $v.redis.sentinel.addrs) (empty $v.redis.sentinel.masterName) -}}
{{- fail "redis.mode=sentinel needs redis.sentinel.addrs (host:port of each Sentinel) and redis.sentinel.masterName" -}}
{{- end -}}
{{- else if eq $mode "cluster" -}}
{{- if empty $v.redis.cluster.addrs -}}
{{- fail "redis.mode=cluster needs redis.cluster.addrs (host:port of some nodes of the Redis Cluster)" -}}
{{- end -}}
{{- end -}}
{{- if and (ne $mode "sentinel") (or $v.redis.sentinel.addrs $v.redis.sentinel.masterName $v.redis.sentinel.username $v.redis.sentinel.passwordSecret.name) -}}
{{- fail (printf "redis.sentinel.* is set but redis.mode is %s: set redis.mode=sentinel" $mode) -}}
{{- end -}}
{{- if and (ne $mode "cluster") $v.redis.cluster.addrs -}}
{{- fail (printf "redis.cluster.addrs is set but redis.mode is %s: set redis.mode=cluster" $mode) -}}
{{- end -}}
{{- if and (eq $mode "standalone") $v.redis.tls.enable -}}
{{- fail "redis.tls.enable is for Sentinel and Cluster; in standalone mode TLS comes from the Secret's url: rediss://" -}}
{{- end -}}
{{- range $v.manager.extraArgs -}}
{{- $flag := regexReplaceAll "=.*$" . "" -}}
{{- if has $flag (list "--leader-elect" "--metrics-bind-address" "--health-probe-bind-address" "--redis-sentinel-addrs" "--redis-sentinel-master" "--redis-cluster-addrs" "--redis-ca-file" "--metrics-cert-path" "--uninstall") -}}
{{- fail (printf "manager.extraArgs may not set %s: the chart sets it from its values (see the chart's README)" $flag) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The manager pods' scheduling: node selector, affinity, tolerations,
spread and priority, shared by the Deployment and the uninstall hook. */}}
{{- define "lockwarden.podPlacement" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.manager.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.manager.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.manager.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The API version of the gating MutatingAdmissionPolicy: v1, v1beta1, or
none when the cluster serves neither. With admission.mutatingPolicyVersion
auto, the cluster's discovery decides; `helm template` without a cluster
(whose API versions name no kinds) renders v1. */}}
{{- define "lockwarden.mutatingPolicyVersion" -}}
{{- $v := .Values.admission.mutatingPolicyVersion -}}
{{- if ne $v "auto" -}}
{{- $v -}}
{{- else if not (.Capabilities.APIVersions.Has "v1/Pod") -}}
v1
{{- else if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" -}}
v1
{{- else if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy" -}}
v1beta1
{{- else -}}
none
{{- end -}}
{{- end -}}
