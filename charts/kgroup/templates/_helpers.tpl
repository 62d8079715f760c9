{{/*
Names and labels shared by every template of the chart.
*/}}

{{- define "kgroup.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kgroup.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kgroup.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object; call with the root context. */}}
{{- define "kgroup.labels" -}}
helm.sh/chart: {{ include "kgroup.chart" . }}
app.kubernetes.io/name: {{ include "kgroup.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kgroup
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of the operator pods. */}}
{{- define "kgroup.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kgroup.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "kgroup.operator.fullname" -}}
{{- printf "%s-operator" (include "kgroup.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kgroup.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (include "kgroup.operator.fullname" .) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kgroup.operator.image" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) -}}
{{- end -}}

{{- define "kgroup.sidecar.image" -}}
{{- printf "%s:%s" .Values.sidecar.image.repository (default .Chart.AppVersion .Values.sidecar.image.tag) -}}
{{- end -}}

{{/* True (non-empty) when the leader-election RBAC must be rendered. */}}
{{- define "kgroup.operator.leaderElection" -}}
{{- if and .Values.operator.enabled (or .Values.operator.leaderElection.enabled (gt (int .Values.operator.replicas) 1)) -}}
true
{{- end -}}
{{- end -}}

{{/*
The service-account names the admission policy checks, as a JSON list of strings.
*/}}
{{- define "kgroup.workerServiceAccountNames" -}}
{{- $names := list .Values.workerRbac.serviceAccountName -}}
{{- range .Values.admissionPolicy.additionalServiceAccountNames -}}
{{- $names = append $names . -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end -}}

{{/*
The operator's exec probe: GET http://127.0.0.1:<healthPort>/healthz from inside the
container; a refused connection (a standby replica, kopf not started) passes.
*/}}
{{- define "kgroup.operator.probe" -}}
- python3
- -c
- |
  import urllib.request
  urllib.request.urlopen("http://127.0.0.1:{{ .Values.operator.healthPort }}/healthz", timeout=3)
{{- end -}}

{{/*
The operator's readiness probe: the liveness probe's check, then (with the injector) a TLS
handshake with the webhook at KGROUP_INJECTOR_HOST:KGROUP_INJECTOR_PORT (the pod's IP; the
certificate is not verified here: the point is that the server is up with one loaded).
*/}}
{{- define "kgroup.operator.readyProbe" -}}
- python3
- -c
- |
  import os, socket, ssl, urllib.request
  urllib.request.urlopen("http://127.0.0.1:{{ .Values.operator.healthPort }}/healthz", timeout=3)
  if os.environ.get("KGROUP_INJECTOR") == "true":
      ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
      ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
      addr = (os.environ["KGROUP_INJECTOR_HOST"], int(os.environ["KGROUP_INJECTOR_PORT"]))
      with socket.create_connection(addr, timeout=3) as s, ctx.wrap_socket(s):
          pass
{{- end -}}

{{/*
The injector's sidecar values as JSON (KGROUP_INJECTOR_SIDECAR): what
kgroup.sidecarContainer renders from, with the image resolved
(kgroup.core.operator.injection.defaults_from_values reads it).
*/}}
{{- define "kgroup.injectorSidecarValues" -}}
{{- dict "sidecar" .Values.sidecar "image" (include "kgroup.sidecar.image" .) "kubernetesApi" .Values.kubernetesApi "serviceAccountName" .Values.workerRbac.serviceAccountName | toJson -}}
{{- end -}}
