"""examples/ as they run on the local real node: the user's manifests plus what a node
without a pod network needs, nothing else.

The chart's own objects take `e2e/values-real-node.yaml`; the worker Deployment of
`examples/worker-deployment.yaml` is the user's, so the same settings are added here, each
one a field a user of such a node would add by hand (the example's header lists them):
hostNetwork with the node's resolver, the API server on loopback for the sidecar, the
real node's label and taint, images that are never pulled, and where Redis is.
Pure: manifests in, manifests out (``kubectl apply`` is the caller's).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from .cluster import REPO

Obj = dict[str, Any]
EXAMPLE = REPO / "examples" / "worker-deployment.yaml"
NODE_LABEL = "kgroup.dev/node"
NODE_VALUE = "real"


def example_workers(*, api_port: int, redis_url: str, stream: str | None = None,
                    replicas: int | None = None, path: Path = EXAMPLE) -> list[Obj]:
    """The example's ConfigMap and Deployment, placed on the real node."""
    docs: list[Obj] = [copy.deepcopy(d) for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            doc["data"]["KGROUP_REDIS_URL"] = redis_url
            if stream is not None:
                doc["data"]["KGROUP_STREAM"] = stream
        elif doc["kind"] == "Deployment":
            if replicas is not None:
                doc["spec"]["replicas"] = replicas
            pod = doc["spec"]["template"]["spec"]
            pod["hostNetwork"] = True
            pod["dnsPolicy"] = "Default"
            pod["nodeSelector"] = {NODE_LABEL: NODE_VALUE}
            pod["tolerations"] = [{"key": NODE_LABEL, "operator": "Equal",
                                   "value": NODE_VALUE, "effect": "NoSchedule"}]
            for c in pod.get("initContainers", []) + pod["containers"]:
                c["imagePullPolicy"] = "Never"
                if c["name"] == "kgroup-sidecar":
                    c["env"] += [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                                 {"name": "KUBERNETES_SERVICE_PORT", "value": str(api_port)}]
    return docs
