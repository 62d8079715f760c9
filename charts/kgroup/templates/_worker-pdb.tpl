{{/*
kgroup.workerPodDisruptionBudget: a PodDisruptionBudget for the worker pods of one group,
as examples/worker-pdb.yaml (docs/deploy.md, "Evictions and drains"). Voluntary
disruptions (kubectl drain, node upgrades, the cluster autoscaler) then take one worker at
a time, and only while the others are Ready, i.e. hold their whole target: a drain waits for
each handover. Keep unhealthyPodEvictionPolicy IfHealthyBudget: a rebalance makes the
members that gain partitions briefly unready, and AlwaysAllow would let a drain evict them.

Usage (from a chart that depends on kgroup):
  {{ include "kgroup.workerPodDisruptionBudget" (dict "root" $ "name" "orders-worker" "matchLabels" (dict "app" "orders-worker")) }}
Optional keys: "namespace" (default the release's), "maxUnavailable" (default 1).
*/}}
{{- define "kgroup.workerPodDisruptionBudget" -}}
{{- $root := .root -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ required "kgroup.workerPodDisruptionBudget needs a name" .name }}
  namespace: {{ default $root.Release.Namespace .namespace }}
  labels:
    {{- include "kgroup.labels" $root | nindent 4 }}
    app.kubernetes.io/component: worker
spec:
  maxUnavailable: {{ default 1 .maxUnavailable }}
  selector:
    matchLabels:
      {{- required "kgroup.workerPodDisruptionBudget needs matchLabels" .matchLabels | toYaml | nindent 6 }}
  unhealthyPodEvictionPolicy: IfHealthyBudget
{{- end -}}
