{{/* The prefix of every object's name, as config/default's namePrefix. */}}
{{- define "lockwarden.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "lockwarden.labels" -}}
app.kubernetes.io/name: {{ include "lockwarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The manager pods' labels, which the Deployment, the PodDisruptionBudget,
the anti-affinity and the metrics Service select on. */}}
{{- define "lockwarden.selectorLabels" -}}
control-plane: controller-manager
{{- end -}}
