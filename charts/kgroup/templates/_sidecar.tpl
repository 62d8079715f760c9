{{/*
kgroup.sidecarContainer: the kgroup sidecar as one container list item, for a worker pod's
`initContainers` (native sidecar, the default) or `containers` (native: false).

  initContainers:
    {{- include "kgroup.sidecarContainer" (dict "root" $ "group" "orders") | nindent 4 }}

Keys: "root" (the chart context, required), "group" (the ConsumerGroup name, required),
optional "values" (this chart's values; from a chart that depends on kgroup pass
.Values.kgroup, and set kgroup.sidecar.image.tag since .Chart is then the parent's),
"native" (bool, default sidecar.native), "image" (default the sidecar image), "listen"
(default sidecar.listen), "resources" (default sidecar.resources).

Why a native sidecar (initContainer with restartPolicy: Always, Kubernetes >= 1.29): it is
started (and its startup probe passed) before the app, so the app never asks a sidecar that
is not listening; and at shutdown the kubelet stops it only after the app has exited, so
the app can release its partitions with their positions through a live sidecar, and the
sidecar then revokes what is left and deletes its session. Its readiness counts for the
pod's Ready condition.

Where it listens (sidecar.listen): by default a Unix socket in an emptyDir shared with the
app; the pod then also needs, from the templates below,
  volumes:        {{ include "kgroup.sidecarVolume" (dict "root" $) }}
  (always: it holds the sidecar's token volume too)
  app container:  volumeMounts: {{ include "kgroup.sidecarVolumeMount" (dict "root" $) }}
                  env:          {{ include "kgroup.sidecarUrlEnv" (dict "root" $) }}
(the mount and env render a list item, or nothing when sidecar.listen is loopback TCP).

Probes (sidecar.probes.mode), none of which starts an interpreter:
- http (the default): the kubelet's httpGet on a port of the pod's IP (KGROUP_PROBE_LISTEN,
  a container port named kgroup-probe) that serves only /livez and /readyz: nothing there
  can change the sidecar's state, and the API itself stays on its socket.
- exec: for pods without a network of their own (hostNetwork: two pods of one node cannot
  own one port). The sidecar keeps two files in its socket's emptyDir (KGROUP_PROBE_DIR,
  kgroup_sidecar.probe_files): `alive`, touched every 5 s by its event loop, and `ready`,
  present while Ready; the kubelet runs `find <file> -mmin +N -exec false {} +`, which
  fails when the file is missing or older than N minutes (alive: 30 s, ready: 15 s), as
  the startup and readiness probes. No liveness probe: each exec costs the container
  17-30 ms of CPU in runc, and the sidecar's own watchdog (kgroup_sidecar.watchdog)
  exits it when its event loop has not turned for 60 s, so the kubelet restarts it.
Liveness fails when the sidecar's event loop is stuck (no answer, or the watchdog's exit).
Readiness means ownership: 200 once the pod holds its whole target and has acknowledged
the group's epoch (docs/protocol.md), so a rollout is paced by it.

Settings per docs/protocol.md: KGROUP_GROUP, KGROUP_NAMESPACE, KGROUP_POD_NAME and
KGROUP_POD_UID (the downward API; the uid ties the sidecar's Events to its pod),
KGROUP_LISTEN, KGROUP_APP_TIMEOUT_SECONDS, KGROUP_LOG_LEVEL, KGROUP_LOG_FORMAT; KGROUP_PROBE_LISTEN (http probes) or
KGROUP_PROBE_DIR (exec probes); KGROUP_METRICS_LISTEN and a port named kgroup-metrics when
sidecar.metrics.enabled (docs/operations.md);
KUBERNETES_SERVICE_HOST/PORT when kubernetesApi.host is set; KGROUP_AUDIT_FILE and the
mount of the pod's volume sidecar.auditVolume at /var/run/kgroup-audit when that is set
(the pod must have the volume).
The pod needs serviceAccountName: <workerRbac.serviceAccountName>,
automountServiceAccountToken: false, and the volumes of kgroup.sidecarVolume (which
include the sidecar's token, kgroup.sidecarTokenVolume): only the sidecar holds an API
token (a projected one, bound to the pod, at the standard service-account path, so the
in-cluster configuration reads it unchanged); the app container gets none.
*/}}
{{/* One probe: "mode" http (httpGet "path" on the kgroup-probe port) or exec ("file"
alive or ready in "dir", stale after "minutes"). */}}
{{- define "kgroup.sidecarProbe" -}}
{{- if eq .mode "exec" -}}
exec:
  command: ["find", {{ printf "%s/%s" .dir .file | quote }}, "-mmin", {{ .minutes | quote }}, "-exec", "false", "{}", "+"]
{{- else -}}
httpGet:
  path: {{ .path }}
  port: kgroup-probe
{{- end -}}
{{- end -}}

{{/* The socket directory of a unix:// listen address, or "" for loopback TCP. */}}
{{- define "kgroup.sidecarSocketDir" -}}
{{- if hasPrefix "unix://" . -}}
{{- dir (trimPrefix "unix://" .) -}}
{{- end -}}
{{- end -}}

{{- define "kgroup.sidecarListen" -}}
{{- $v := default .root.Values .values -}}
{{- default $v.sidecar.listen .listen -}}
{{- end -}}

{{/* The emptyDir holding the sidecar's socket, as a `volumes` list item. */}}
{{- define "kgroup.sidecarVolume" -}}
{{- if include "kgroup.sidecarSocketDir" (include "kgroup.sidecarListen" .) }}
- name: kgroup-sidecar
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end }}
{{ include "kgroup.sidecarTokenVolume" . }}
{{- end -}}

{{/*
The sidecar's API token, as a `volumes` list item (rendered by kgroup.sidecarVolume too):
what the kubelet's automount would give every container (a projected token bound to the
pod, the cluster's CA, the namespace), mounted at the standard service-account path into
the sidecar alone. The pod sets automountServiceAccountToken: false, so the app container
holds no API token: a compromised app (the code that parses the stream's data) cannot act
as the worker.
*/}}
{{- define "kgroup.sidecarTokenVolume" -}}
- name: kgroup-sidecar-token
  projected:
    defaultMode: 0444
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3607
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
      - downwardAPI:
          items:
            - path: namespace
              fieldRef:
                apiVersion: v1
                fieldPath: metadata.namespace
{{- end -}}

{{/* Its mount, as a `volumeMounts` list item (the sidecar and the app containers). */}}
{{- define "kgroup.sidecarVolumeMount" -}}
{{- $dir := include "kgroup.sidecarSocketDir" (include "kgroup.sidecarListen" .) -}}
{{- if $dir -}}
- name: kgroup-sidecar
  mountPath: {{ $dir }}
{{- end -}}
{{- end -}}

{{/* KGROUP_SIDECAR_URL of the app container, as an `env` list item. */}}
{{- define "kgroup.sidecarUrlEnv" -}}
{{- $listen := include "kgroup.sidecarListen" . -}}
- name: KGROUP_SIDECAR_URL
  value: {{ ternary $listen (printf "http://%s" $listen) (hasPrefix "unix://" $listen) | quote }}
{{- end -}}

{{/* KUBERNETES_SERVICE_HOST/PORT env items when kubernetesApi.host is set. */}}
{{- define "kgroup.kubernetesApiEnv" -}}
{{- with .kubernetesApi.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ . | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ $.kubernetesApi.port | quote }}
{{- end }}
{{- end -}}

{{- define "kgroup.sidecarContainer" -}}
{{- $root := required "kgroup.sidecarContainer needs root" .root -}}
{{- $group := required "kgroup.sidecarContainer needs group (the ConsumerGroup name)" .group -}}
{{- $v := default $root.Values .values -}}
{{- $native := $v.sidecar.native -}}
{{- if hasKey . "native" }}{{ $native = .native }}{{ end -}}
{{- $listen := include "kgroup.sidecarListen" . -}}
{{- $tag := default $root.Chart.AppVersion $v.sidecar.image.tag -}}
{{- $image := default (printf "%s:%s" $v.sidecar.image.repository $tag) .image -}}
{{- $resources := default $v.sidecar.resources .resources -}}
{{- $mode := $v.sidecar.probes.mode -}}
{{- $socketDir := include "kgroup.sidecarSocketDir" $listen -}}
{{- if and (eq $mode "exec") (not $socketDir) -}}
{{- fail "sidecar.probes.mode=exec keeps its files in the socket's volume: sidecar.listen must be unix:///dir/file.sock" -}}
{{- end -}}
{{- $probeDir := printf "%s/probe" $socketDir -}}
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
    - name: KGROUP_POD_UID
      valueFrom:
        fieldRef:
          fieldPath: metadata.uid
    - name: KGROUP_LISTEN
      value: {{ $listen | quote }}
    - name: KGROUP_APP_TIMEOUT_SECONDS
      value: {{ $v.sidecar.appTimeoutSeconds | quote }}
    - name: KGROUP_LOG_LEVEL
      value: {{ $v.sidecar.logLevel | quote }}
    - name: KGROUP_LOG_FORMAT
      value: {{ $v.sidecar.logFormat | quote }}
    {{- $podIp := or (eq $mode "http") (and $v.sidecar.metrics.enabled (not $v.sidecar.metrics.host)) }}
  {{- if $podIp }}
    - name: KGROUP_POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
  {{- end }}
  {{- if eq $mode "http" }}
    - name: KGROUP_PROBE_LISTEN
      value: {{ printf "$(KGROUP_POD_IP):%v" $v.sidecar.probes.port | quote }}
  {{- else }}
    - name: KGROUP_PROBE_DIR
      value: {{ $probeDir | quote }}
  {{- end }}
  {{- if $v.sidecar.metrics.enabled }}
    - name: KGROUP_METRICS_LISTEN
      value: {{ printf "%s:%v" (default "$(KGROUP_POD_IP)" $v.sidecar.metrics.host) $v.sidecar.metrics.port | quote }}
  {{- end }}
    {{- include "kgroup.kubernetesApiEnv" $v | nindent 4 }}
  {{- with $v.sidecar.auditVolume }}
    - name: KGROUP_AUDIT_FILE
      value: "/var/run/kgroup-audit/$(KGROUP_POD_NAME).jsonl"
  {{- end }}
  {{- if or (eq $mode "http") $v.sidecar.metrics.enabled }}
  ports:
    {{- if eq $mode "http" }}
    - name: kgroup-probe
      containerPort: {{ $v.sidecar.probes.port }}
      protocol: TCP
    {{- end }}
    {{- if $v.sidecar.metrics.enabled }}
    - name: kgroup-metrics
      containerPort: {{ $v.sidecar.metrics.port }}
      protocol: TCP
    {{- end }}
  {{- end }}
  {{- $alive := dict "mode" $mode "path" "/livez" "dir" $probeDir "file" "alive" "minutes" "+0.5" }}
  {{- $ready := dict "mode" $mode "path" "/readyz" "dir" $probeDir "file" "ready" "minutes" "+0.25" }}
  startupProbe:
    {{- include "kgroup.sidecarProbe" $alive | nindent 4 }}
    periodSeconds: 1
    timeoutSeconds: 3
    failureThreshold: 60
  {{- if eq $mode "http" }}
  livenessProbe:
    {{- include "kgroup.sidecarProbe" $alive | nindent 4 }}
    periodSeconds: 10
    timeoutSeconds: 5
    failureThreshold: 3
  {{- end }}
  {{- /* exec: no liveness probe (each runc exec costs the container 17-30 ms of CPU): the
  sidecar's watchdog exits it when its event loop has not turned for 60 s, and the kubelet
  restarts it (kgroup_sidecar.watchdog) */}}
  readinessProbe:
    {{- include "kgroup.sidecarProbe" $ready | nindent 4 }}
    {{- $timing := deepCopy $v.sidecar.readinessProbe }}
    {{- if not $timing.periodSeconds }}
    {{- /* http: 2 s (a request answered from memory); exec: 15 s (17-30 ms of CPU each) */}}
    {{- $_ := set $timing "periodSeconds" (ternary 15 2 (eq $mode "exec")) }}
    {{- end }}
    {{- toYaml $timing | nindent 4 }}
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
  volumeMounts:
    - name: kgroup-sidecar-token
      mountPath: /var/run/secrets/kubernetes.io/serviceaccount
      readOnly: true
    {{- with include "kgroup.sidecarVolumeMount" . }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with $v.sidecar.auditVolume }}
    - name: {{ . }}
      mountPath: /var/run/kgroup-audit
    {{- end }}
{{- end -}}
