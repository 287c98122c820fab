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
{{- /* The election timings, by client-go's rules, which the manager checks
again at start (checkLeaderElection): caught here, a bad combination fails
the render instead of crash-looping the manager. */ -}}
{{- if $v.leaderElection.enable -}}
{{- $lease := include "lockwarden.durationNs" $v.leaderElection.leaseDuration | float64 -}}
{{- $renew := include "lockwarden.durationNs" $v.leaderElection.renewDeadline | float64 -}}
{{- $retry := include "lockwarden.durationNs" $v.leaderElection.retryPeriod | float64 -}}
{{- if or (le $lease 0.0) (le $renew 0.0) (le $retry 0.0) -}}
{{- fail "leaderElection.leaseDuration, renewDeadline and retryPeriod must be above 0" -}}
{{- end -}}
{{- if ge $renew $lease -}}
{{- fail (printf "leaderElection.renewDeadline (%s) must be below leaderElection.leaseDuration (%s), so the leader stops leading before a standby may take over" $v.leaderElection.renewDeadline $v.leaderElection.leaseDuration) -}}
{{- end -}}
{{- if ge (mulf $retry 1.2) $renew -}}
{{- fail (printf "leaderElection.retryPeriod (%s) times 1.2 must be below leaderElection.renewDeadline (%s), so the leader gets to retry a failed renewal" $v.leaderElection.retryPeriod $v.leaderElection.renewDeadline) -}}
{{- end -}}
{{- end -}}
{{- if and $v.rbac.namespaced (empty $v.rbac.watchNamespaces) -}}
{{- fail "rbac.namespaced needs rbac.watchNamespaces: the namespaces the manager watches and writes, e.g. --set 'rbac.watchNamespaces={team-a,team-b}'" -}}
{{- end -}}
{{- if and (not $v.rbac.namespaced) $v.rbac.watchNamespaces -}}
{{- fail "rbac.watchNamespaces is set but rbac.namespaced is false: set rbac.namespaced=true to watch only those namespaces, with Roles in each instead of a ClusterRole" -}}
{{- end -}}
{{- if ne (len $v.rbac.watchNamespaces) (len (uniq $v.rbac.watchNamespaces)) -}}
{{- fail "rbac.watchNamespaces names a namespace twice" -}}
{{- end -}}
{{- range $v.manager.extraArgs -}}
{{- $flag := regexReplaceAll "=.*$" . "" -}}
{{- if has $flag (list "--leader-elect" "--metrics-bind-address" "--health-probe-bind-address" "--redis-sentinel-addrs" "--redis-sentinel-master" "--redis-cluster-addrs" "--redis-ca-file" "--metrics-cert-path" "--uninstall" "--check" "--watch-namespaces") -}}
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
none. admission.mutatingPolicyVersion other than auto decides (for
rendered-manifest pipelines that know their cluster). With auto, the
cluster's API decides: v1 where it serves
admissionregistration.k8s.io/v1 MutatingAdmissionPolicy, else v1beta1 where
it serves that, else none. `helm template` without a cluster knows no
kinds (its API versions name none, not even v1/Pod, unless given with
--api-versions): there the Kubernetes version decides (--kube-version),
v1 from 1.36, where the API is GA and on; none before, since 1.34-1.35
serve v1beta1 only with its feature gate, off by default (pass
--api-versions admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy,
or set the value, for a cluster that has it on). */}}
{{- define "lockwarden.mutatingPolicyVersion" -}}
{{- $v := .Values.admission.mutatingPolicyVersion -}}
{{- $api := .Capabilities.APIVersions -}}
{{- if ne $v "auto" -}}
{{- $v -}}
{{- else if $api.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" -}}
v1
{{- else if $api.Has "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy" -}}
v1beta1
{{- else if $api.Has "v1/Pod" -}}
none
{{- else if semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version -}}
v1
{{- else -}}
none
{{- end -}}
{{- end -}}

{{/* A Go duration (values.schema.json's pattern: 15s, 1m30s, 500ms, 1.5h)
in nanoseconds, as a float. */}}
{{- define "lockwarden.durationNs" -}}
{{- $units := dict "ns" 1.0 "us" 1000.0 "µs" 1000.0 "ms" 1000000.0 "s" 1000000000.0 "m" 60000000000.0 "h" 3600000000000.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h)" . -1 -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" . | float64 -}}
{{- $unit := regexReplaceAll "^[0-9]+(\\.[0-9]+)?" . "" -}}
{{- $total = addf $total (mulf $number (get $units $unit)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* One manager per cluster. Every lockwarden install, by this chart or
by kustomize (config/default), has the ValidatingAdmissionPolicy
<prefix>-manager-writes, labelled app.kubernetes.io/part-of: lockwarden.
If one exists that is not this release's (by Helm's ownership
annotations), another manager already reconciles every lock of the
cluster, and a second would grant them too, with its own leader election:
the install is refused. `helm template` has no cluster and looks up
nothing. A kustomize install taken over as the README says carries this
release's annotations, and passes. */}}
{{- define "lockwarden.onePerCluster" -}}
{{- $policies := lookup "admissionregistration.k8s.io/v1" "ValidatingAdmissionPolicy" "" "" -}}
{{- range ($policies.items | default list) -}}
{{- if and (eq (dig "metadata" "labels" "app.kubernetes.io/part-of" "" .) "lockwarden") (hasSuffix "-manager-writes" .metadata.name) -}}
{{- $release := dig "metadata" "annotations" "meta.helm.sh/release-name" "" . -}}
{{- $namespace := dig "metadata" "annotations" "meta.helm.sh/release-namespace" "" . -}}
{{- if not (and (eq $release $.Release.Name) (eq $namespace $.Release.Namespace)) -}}
{{- if $release -}}
{{- fail (printf "lockwarden is already installed in this cluster, by release %s in namespace %s (its ValidatingAdmissionPolicy %s): one manager per cluster, since a second one would grant every lock too. Upgrade that release (helm upgrade %s -n %s), or uninstall it first." $release $namespace .metadata.name $release $namespace) -}}
{{- else -}}
{{- fail (printf "lockwarden is already installed in this cluster, without Helm (its ValidatingAdmissionPolicy %s, from kubectl apply -k or make deploy): one manager per cluster, since a second one would grant every lock too. Remove that install first, or take it over into this release as the README says (Moving a kustomize install to Helm)." .metadata.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* How the manager reaches Redis, shared by the manager's container and
the test pod's (`manager --check`), so `helm test` checks what the manager
uses: the flags naming Redis, the environment (the URL and username from
the Redis Secret; the password files' paths come from the manager's
ConfigMap), and the Secrets' files. */}}
{{- define "lockwarden.redisArgs" -}}
{{- $redis := .Values.redis -}}
{{- if eq $redis.mode "sentinel" }}
- --redis-sentinel-addrs={{ join "," $redis.sentinel.addrs }}
- --redis-sentinel-master={{ $redis.sentinel.masterName }}
{{- else if eq $redis.mode "cluster" }}
- --redis-cluster-addrs={{ join "," $redis.cluster.addrs }}
{{- end }}
{{- if $redis.tls.enable }}
- --redis-tls
{{- end }}
{{- if $redis.tls.caSecret.name }}
- --redis-ca-file=/etc/lockwarden/redis-ca/ca.crt
{{- end }}
{{- end -}}

{{- define "lockwarden.redisEnv" -}}
{{- $redis := .Values.redis -}}
{{- if eq $redis.mode "standalone" }}
- name: REDIS_URL
  valueFrom:
    secretKeyRef: {name: {{ $redis.secretName }}, key: url}
{{- end }}
- name: REDIS_USERNAME
  valueFrom:
    secretKeyRef: {name: {{ $redis.secretName }}, key: username, optional: true}
{{- with $redis.sentinel.username }}
- name: REDIS_SENTINEL_USERNAME
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "lockwarden.redisVolumeMounts" -}}
{{- $redis := .Values.redis -}}
- name: redis-password
  mountPath: /etc/lockwarden/redis
  readOnly: true
{{- if $redis.sentinel.passwordSecret.name }}
- name: redis-sentinel-password
  mountPath: /etc/lockwarden/redis-sentinel
  readOnly: true
{{- end }}
{{- if $redis.tls.caSecret.name }}
- name: redis-ca
  mountPath: /etc/lockwarden/redis-ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "lockwarden.redisVolumes" -}}
{{- $redis := .Values.redis -}}
- name: redis-password
  secret:
    secretName: {{ $redis.secretName }}
    items:
    - {key: password, path: password}
{{- with $redis.sentinel.passwordSecret }}
{{- if .name }}
- name: redis-sentinel-password
  secret:
    secretName: {{ .name }}
    items:
    - {key: {{ .key }}, path: password}
{{- end }}
{{- end }}
{{- with $redis.tls.caSecret }}
{{- if .name }}
- name: redis-ca
  secret:
    secretName: {{ .name }}
    items:
    - {key: {{ .key }}, path: ca.crt}
{{- end }}
{{- end }}
{{- end -}}
