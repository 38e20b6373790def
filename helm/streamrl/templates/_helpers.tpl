{{- /* The chart's name (nameOverride replaces it in names and the app.kubernetes.io/name label). */}}
{{- define "streamrl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /* Prefix of every object's name: fullnameOverride, else <release>-<name> (the release's name
alone when it already contains the chart's). */}}
{{- define "streamrl.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "streamrl.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "streamrl.labels" -}}
app.kubernetes.io/name: {{ include "streamrl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "streamrl.selector" -}}
app.kubernetes.io/name: {{ include "streamrl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "streamrl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "streamrl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- /* The operator's image (the CPU build): by digest when image.digest is set, else by tag. */}}
{{- define "streamrl.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- include "streamrl.taggedImage" . -}}
{{- end -}}
{{- end -}}

{{- /* <image.repository>:<image.tag, else appVersion>. */}}
{{- define "streamrl.taggedImage" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- /* Image of job roles on CPU: jobs.image, else the operator's (its digest too). */}}
{{- define "streamrl.jobImage" -}}
{{- default (include "streamrl.image" .) .Values.jobs.image -}}
{{- end -}}

{{- /* Image of job roles on CUDA: jobs.cudaImage, else the operator's repository and tag with -cuda
(docker/Dockerfile.cuda, README "Container images"); image.digest is the CPU image's, not this one's. */}}
{{- define "streamrl.jobCudaImage" -}}
{{- default (printf "%s-cuda" (include "streamrl.taggedImage" .)) .Values.jobs.cudaImage -}}
{{- end -}}

{{- /* Whether the cluster serves the Prometheus Operator's kinds (PodMonitor, PrometheusRule). */}}
{{- define "streamrl.hasPrometheusOperator" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end -}}
{{- end -}}
