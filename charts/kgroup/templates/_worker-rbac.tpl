{{/*
kgroup.workerRbac: the ServiceAccount, Role and RoleBinding of kgroup worker pods in one
namespace. The Role is exactly what the sidecar needs in its own namespace: its session
and the partition locks (leases: get, list, watch, create, update, delete, the calls of
worker_sidecar/kgroup_sidecar/kube.py; no patch), the ConsumerGroup it serves (read-only),
and Events (create, and patch to count a repeat) on its own pod: fenced, partition lost,
handoff timed out. Nothing else: no pods, no secrets, no status. RBAC cannot name the Leases a
worker may write; the chart's ValidatingAdmissionPolicy (<release>-lease-ownership) does:
only its own member Lease, only locks marked for it (kgroup.dev/assigned) to acquire, only
locks it holds to release; every other Lease of the namespace (another application's
leader lock, the operator's leader Lease) is refused.

Usage (also from a chart that depends on kgroup):
  {{ include "kgroup.workerRbac" (dict "root" $ "namespace" "orders") }}
Optional keys: "serviceAccountName" (default .Values.workerRbac.serviceAccountName).
*/}}
{{- define "kgroup.workerRbac" -}}
{{- $root := .root -}}
{{- $ns := required "kgroup.workerRbac needs a namespace" .namespace -}}
{{- $sa := default $root.Values.workerRbac.serviceAccountName .serviceAccountName -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $sa }}
  namespace: {{ $ns }}
  labels:
    {{- include "kgroup.labels" $root | nindent 4 }}
    app.kubernetes.io/component: worker
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $sa }}
  namespace: {{ $ns }}
  labels:
    {{- include "kgroup.labels" $root | nindent 4 }}
    app.kubernetes.io/component: worker
rules:
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["get", "list", "watch", "create", "update", "delete"]
  - apiGroups: ["kgroup.dev"]
    resources: ["consumergroups"]
    verbs: ["get", "list", "watch"]
  - apiGroups: [""]
    resources: ["events"]
    verbs: ["create", "patch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $sa }}
  namespace: {{ $ns }}
  labels:
    {{- include "kgroup.labels" $root | nindent 4 }}
    app.kubernetes.io/component: worker
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ $sa }}
subjects:
  - kind: ServiceAccount
    name: {{ $sa }}
    namespace: {{ $ns }}
{{- end -}}
