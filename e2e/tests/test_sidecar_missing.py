"""A pod labelled with a group that runs without the kgroup sidecar, on the real API
server: a real operator process, kwok pods (no injector: a labelled pod is created bare,
as it is when the injector fails open), the group's status, its Event, ``kgroup status``
and ``kubectl get -o wide`` as a person reads them."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from operator_harness import GROUP
from test_operator import (
    APP,
    condition,
    event_reasons,
    get_status,
    make_group,
    make_pods,
    operator,
    status_where,
)
from test_status_cli import kgroup_status

from kgroup import constants as C
from kgroup_devcluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for

__all__ = ["operator"]
pytestmark = pytest.mark.cluster

LABELS = {"app": APP, C.LABEL_GROUP: GROUP}


def message(status: dict[str, Any], ctype: str) -> str:
    return next(str(c["message"]) for c in status.get("conditions") or []
                if c["type"] == ctype)


def test_a_labelled_pod_without_the_sidecar_is_reported_until_it_is_gone(
        cluster: Cluster, kube: client.ApiClient, operator: Any, namespace: str) -> None:
    core = client.CoreV1Api(kube)
    make_group(kube, namespace, partitions=2)
    # the same labels with a sidecar container: not reported
    core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name="with-sidecar", labels=LABELS),
        spec=client.V1PodSpec(node_selector={"type": "kwok"}, containers=[
            client.V1Container(name="main", image="example.invalid/worker:1"),
            client.V1Container(name=C.SIDECAR_CONTAINER, image="example.invalid/sc:1")])))
    # the injector's label alone (the selector does not match it): still the group's pod
    make_pods(kube, namespace, "bare", labels={C.LABEL_GROUP: GROUP})

    st = status_where(kube, namespace, "SidecarMissing on the group",
                      lambda s: condition(s, "SidecarMissing")[0] == "True", timeout=60)
    assert condition(st, "SidecarMissing") == ("True", "PodsWithoutSidecar")
    assert "taking no part in it: bare (" in message(st, "SidecarMissing")
    assert st["sidecarMissing"] == {"count": 1, "pods": ["bare"]}
    # no member at all: nothing consumes until the pod is replaced
    assert condition(st, "Stalled") == ("True", "SidecarMissing")
    # the Event is posted as before
    wait_for("the SidecarMissing Event",
             lambda: "SidecarMissing" in event_reasons(kube, namespace), timeout=30)

    table = kgroup_status(cluster, namespace)
    assert ("Without the sidecar: 1 pod labelled with the group (bare), taking no part "
            "in it; delete it to have it re-created with the sidecar") in table.splitlines()
    assert any(line.split()[:3] == ["SidecarMissing", "True", "PodsWithoutSidecar"]
               for line in table.splitlines())
    wide = cluster.kubectl("get", "consumergroup", GROUP, "-n", namespace, "-o", "wide")
    header, row = wide.stdout.splitlines()[:2]
    at = header.index("WITHOUT-SIDECAR")  # cells are aligned; an absent value is blank
    assert row[at:].split()[0] == "1", wide.stdout

    core.delete_namespaced_pod("bare", namespace, grace_period_seconds=0)
    st = status_where(kube, namespace, "SidecarMissing cleared",
                      lambda s: condition(s, "SidecarMissing")[0] == "False", timeout=60)
    assert condition(st, "SidecarMissing") == ("False", "AllPodsHaveSidecar")
    assert "sidecarMissing" not in st
    assert condition(st, "Stalled")[0] == "False"
    assert "Without the sidecar" not in kgroup_status(cluster, namespace)
    assert get_status(kube, namespace).get("sidecarMissing") is None
