"""What GitOps tools make of a real ConsumerGroup on the local control plane: a real
operator process, member stand-ins (``operator_harness.Members``), and the two readers run
for real by the Go checker (``kgroup_devtools.gitops``): kstatus' library and Argo CD's
health.lua under gopher-lua, the script read back from an ``argocd-cm`` ConfigMap made from
the shipped patch file. One group goes through three states:

- settled: kstatus Current, Argo CD Healthy, ``kubectl wait --for=condition=Ready``
  returns; after a spec change the operator writes the new ``observedGeneration``;
- rebalancing (a third member joins and never takes its partitions): InProgress,
  Progressing, ``kubectl wait --for=condition=Ready`` times out;
- degraded (its partitions stay unowned past drain timeout + lease duration, 8 + 3 s):
  Failed, Degraded, ``kubectl wait --for=condition=Stalled`` returns.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kgroup_devtools import gitops
from kubernetes import client
from operator_harness import GROUP, Members, OperatorProcess
from test_operator import (
    make_group,
    make_pods,
    members_factory,
    operator,
    patch_spec,
    status_where,
    target,
)

from kgroup_devcluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for

__all__ = ["members_factory", "operator"]
pytestmark = pytest.mark.cluster


def shipped_health_lua(cluster: Cluster, namespace: str, tmp_path: Path) -> Path:
    """health.lua as Argo CD would read it: the patch file applied as ``argocd-cm`` (here
    in the test's namespace), its key read back from the API server."""
    cluster.kubectl("-n", namespace, "create", "-f", str(gitops.ARGOCD_CM_PATCH))
    cm = json.loads(cluster.kubectl("-n", namespace, "get", "configmap", "argocd-cm",
                                    "-o", "json").stdout)
    script = cm["data"][gitops.ARGOCD_CM_KEY]
    assert script == gitops.HEALTH_LUA.read_text()
    path = tmp_path / "health.lua"
    path.write_text(script)
    return path


def read(cluster: Cluster, namespace: str, lua: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The group as ``kubectl get -o json`` returns it, and both readers' verdicts on it."""
    obj = json.loads(cluster.kubectl("-n", namespace, "get", f"cg/{GROUP}", "-o",
                                     "json").stdout)
    (verdict,) = gitops.verdicts(obj, lua=lua)
    return obj, verdict


def kubectl_wait(cluster: Cluster, namespace: str, condition: str, seconds: int) -> bool:
    out = cluster.kubectl("-n", namespace, "wait", f"--for=condition={condition}",
                          f"cg/{GROUP}", f"--timeout={seconds}s", check=False,
                          timeout=seconds + 60)
    return out.returncode == 0


def test_kstatus_argo_cd_and_kubectl_wait_follow_a_group_settled_rebalancing_degraded(
    cluster: Cluster, kube: client.ApiClient, namespace: str, operator: OperatorProcess,
    members_factory: Callable[..., Members], tmp_path: Path,
) -> None:
    lua = shipped_health_lua(cluster, namespace, tmp_path)
    make_pods(kube, namespace, "w-0", "w-1")
    uid = make_group(kube, namespace, partitions=6, handoff={"drainTimeoutSeconds": 8})
    members_factory(uid, converge=True).join("w-0", "w-1")

    # settled
    status_where(kube, namespace, "a Stable group", lambda s: s.get("phase") == "Stable"
                 and set(target(s)) == {"w-0", "w-1"}, timeout=60)
    assert kubectl_wait(cluster, namespace, "Ready", 30)
    obj, verdict = read(cluster, namespace, lua)
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"] == 1
    assert verdict["kstatus"] == {"status": "Current", "message": "Resource is Ready"}
    assert verdict["argocd"]["status"] == "Healthy", verdict
    # a spec change: the operator writes its generation as observed (until it does, kstatus
    # says InProgress: tests/test_gitops_health.py, case generation-not-observed)
    patch_spec(kube, namespace, {"source": {"stream": "orders-v2"}})

    def seen(generation: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
        obj, verdict = read(cluster, namespace, lua)
        return (obj, verdict) if obj["status"].get("observedGeneration") == generation else None

    found = wait_for("observedGeneration 2", lambda: seen(2), timeout=30)
    assert found is not None
    obj, verdict = found
    assert obj["metadata"]["generation"] == 2
    assert (verdict["kstatus"]["status"], verdict["argocd"]["status"]) == ("Current", "Healthy")
    epoch = int(obj["status"]["epoch"])

    # rebalancing: w-2 joins, is given partitions, never takes them
    make_pods(kube, namespace, "w-2")
    members_factory(uid, converge=False).join("w-2")
    status_where(kube, namespace, "a rebalance to w-2", lambda s: s.get("phase") ==
                 "Rebalancing" and int(s.get("epoch", 0)) > epoch and "w-2" in target(s))
    obj, verdict = read(cluster, namespace, lua)
    assert obj["status"]["phase"] == "Rebalancing", "the step took past the deadline"
    conds = {c["type"]: c for c in obj["status"]["conditions"]}
    assert conds["Reconciling"]["status"] == "True" and conds["Stalled"]["status"] == "False"
    assert verdict["kstatus"]["status"] == "InProgress", verdict
    assert verdict["argocd"] == {"status": "Progressing",
                                 "message": conds["Reconciling"]["message"]}
    assert not kubectl_wait(cluster, namespace, "Ready", 2)

    # degraded: w-2's partitions stay unowned past drain timeout + lease duration
    status_where(kube, namespace, "a Degraded group", lambda s: s.get("phase") == "Degraded",
                 timeout=60)
    obj, verdict = read(cluster, namespace, lua)
    conds = {c["type"]: c for c in obj["status"]["conditions"]}
    assert (conds["Stalled"]["status"], conds["Stalled"]["reason"]) == (
        "True", "PartitionsUnowned")
    assert conds["Reconciling"]["status"] == "False"
    assert verdict["kstatus"] == {"status": "Failed", "message": conds["Stalled"]["message"]}
    assert verdict["argocd"] == {"status": "Degraded", "message": conds["Stalled"]["message"]}
    assert kubectl_wait(cluster, namespace, "Stalled", 10)
    assert not kubectl_wait(cluster, namespace, "Ready", 2)
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
