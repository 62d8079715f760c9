{{/*
kgroup.sidecarContainer: the kgroup sidecar as one container list item, for a worker pod's
`initContainers` (native sidecar, the default) or `containers` (native: false).

  initContainers:
    {{- include "kgroup.sidecarContainer" (dict "root" $ "group" "orders") | nindent 4 }}

Keys: "root" (the chart context, required), "group" (the ConsumerGroup name, required),
optional "values" (this chart's values; from a chart that depends on kgroup pass
.Values.kgroup, and set kgroup.sidecar.image.tag since .Chart is then the parent's),
"native" (bool, default sidecar.native), "image" (default the sidecar image), "port"
(default sidecar.port), "resources" (default sidecar.resources).

Why a native sidecar (initContainer with restartPolicy: Always, Kubernetes >= 1.29): it is
started (and its startup probe passed) before the app, so the app never asks a sidecar that
is not listening; and at shutdown the kubelet stops it only after the app has exited, so
the app can release its partitions with their positions through a live sidecar, and the
sidecar then revokes what is left and deletes its session.

Why exec probes: the sidecar's API listens on 127.0.0.1 only (any pod on the network could
otherwise release partitions), and a kubelet httpGet probe connects to the pod IP, so the
probes run inside the container against loopback.

Settings per docs/protocol.md: KGROUP_GROUP, KGROUP_NAMESPACE and KGROUP_POD_NAME (the
downward API), KGROUP_LISTEN=127.0.0.1:<port>. The pod needs
serviceAccountName: <workerRbac.serviceAccountName> and a projected (pod-bound) token,
which is the default for pods.
*/}}
{{- define "kgroup.sidecarProbe" -}}
exec:
  command:
    - python3
    - -c
    - "import urllib.request; urllib.request.urlopen('http://127.0.0.1:{{ .port }}{{ .path }}', timeout=2)"
{{- end -}}

{{- define "kgroup.sidecarContainer" -}}
{{- $root := required "kgroup.sidecarContainer needs root" .root -}}
{{- $group := required "kgroup.sidecarContainer needs group (the ConsumerGroup name)" .group -}}
{{- $v := default $root.Values .values -}}
{{- $native := $v.sidecar.native -}}
{{- if hasKey . "native" }}{{ $native = .native }}{{ end -}}
{{- $port := default $v.sidecar.port .port -}}
{{- $tag := default $root.Chart.AppVersion $v.sidecar.image.tag -}}
{{- $image := default (printf "%s:%s" $v.sidecar.image.repository $tag) .image -}}
{{- $resources := default $v.sidecar.resources .resources -}}
- name: kgroup-sidecar
  image: {{ $image }}
  imagePullPolicy: {{ $v.sidecar.image.pullPolicy }}
  {{- if $native }}
  restartPolicy: Always
  {{- end }}
  command: ["kgroup-sidecar"]
  env:
    - name: KGROUP_GROUP
      value: {{ $group | quote }}
    - name: KGROUP_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    - name: KGROUP_POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: KGROUP_LISTEN
      value: {{ printf "127.0.0.1:%v" $port | quote }}
    - name: KGROUP_LOG_LEVEL
      value: {{ $v.sidecar.logLevel | quote }}
  startupProbe:
    {{- include "kgroup.sidecarProbe" (dict "port" $port "path" "/healthz") | nindent 4 }}
    periodSeconds: 1
    timeoutSeconds: 3
    failureThreshold: 60
  livenessProbe:
    {{- include "kgroup.sidecarProbe" (dict "port" $port "path" "/healthz") | nindent 4 }}
    periodSeconds: 10
    timeoutSeconds: 3
    failureThreshold: 3
  readinessProbe:
    {{- include "kgroup.sidecarProbe" (dict "port" $port "path" "/readyz") | nindent 4 }}
    periodSeconds: 5
    timeoutSeconds: 3
    failureThreshold: 2
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    runAsGroup: 10001
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    privileged: false
    capabilities:
      drop: ["ALL"]
    seccompProfile:
      type: RuntimeDefault
  resources:
    {{- toYaml $resources | nindent 4 }}
{{- end -}}
