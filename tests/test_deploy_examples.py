"""examples/worker-statefulset.yaml and worker-pdb.yaml against the Deployment example and the
chart's named template (pure: files and `helm template`)."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from chart_render import one, parent_chart, render

from kgroup.core.objects import Obj
from kgroup_devcluster.real_node import (
    EXAMPLE,
    PDB_EXAMPLE,
    STATEFULSET_EXAMPLE,
    example_pdb,
    example_workers,
)


def docs(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_statefulset_runs_the_deployments_pod_with_a_headless_service() -> None:
    dep = one(docs(EXAMPLE), "Deployment")
    ss_docs = docs(STATEFULSET_EXAMPLE)
    ss = one(ss_docs, "StatefulSet")
    # the same pod: sidecar, probes, app, security, grace (a drift here is a bug)
    assert ss["spec"]["template"] == dep["spec"]["template"]
    assert ss["spec"]["selector"] == dep["spec"]["selector"]
    assert ss["spec"]["replicas"] == dep["spec"]["replicas"]
    assert one(ss_docs, "ConfigMap") == one(docs(EXAMPLE), "ConfigMap")
    service = one(ss_docs, "Service")
    assert ss["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == ss["spec"]["selector"]["matchLabels"]
    assert ss["spec"]["podManagementPolicy"] == "Parallel"
    assert ss["spec"]["updateStrategy"] == {"type": "RollingUpdate"}


def test_the_statefulset_lands_on_the_real_node_like_the_deployment() -> None:
    kw: Obj = dict(api_port=40123, redis_url="redis://127.0.0.1:7001/0", stream="s",
                   replicas=2, small_requests=True)
    dep = one(example_workers(**kw), "Deployment")
    adapted = example_workers(path=STATEFULSET_EXAMPLE, **kw)
    ss = one(adapted, "StatefulSet")
    assert ss["spec"]["replicas"] == 2
    assert ss["spec"]["template"] == dep["spec"]["template"]
    assert one(adapted, "Service") == one(docs(STATEFULSET_EXAMPLE), "Service")


def test_the_pdb_takes_one_worker_at_a_time_and_only_from_a_healthy_group() -> None:
    pdb = example_pdb()
    assert pdb == one(docs(PDB_EXAMPLE), "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "IfHealthyBudget"
    for path in (EXAMPLE, STATEFULSET_EXAMPLE):  # it selects the workers of both examples
        labels = one(docs(path), "StatefulSet" if path == STATEFULSET_EXAMPLE
                     else "Deployment")["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


PDB_TEMPLATE = """\
{{ include "kgroup.workerPodDisruptionBudget" (dict "root" $ "name" "orders-worker" \
"matchLabels" (dict "app" "orders-worker")) }}
"""


def test_the_charts_named_template_renders_the_example_pdb(tmp_path: Path) -> None:
    parent = parent_chart(tmp_path, PDB_TEMPLATE)
    rendered = one(render(chart=parent, namespace="orders"), "PodDisruptionBudget")
    assert rendered["metadata"]["namespace"] == "orders"
    assert rendered["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    example = copy.deepcopy(example_pdb())
    assert rendered["spec"] == example["spec"]
    assert rendered["metadata"]["name"] == example["metadata"]["name"]


def test_the_named_template_needs_a_name_and_takes_another_budget(tmp_path: Path) -> None:
    parent = parent_chart(tmp_path, PDB_TEMPLATE.replace(
        '"root" $', '"root" $ "maxUnavailable" 2 "namespace" "x"'))
    rendered = one(render(chart=parent), "PodDisruptionBudget")
    assert (rendered["spec"]["maxUnavailable"], rendered["metadata"]["namespace"]) == (2, "x")
