"""The operator's Lease watch (its own aiohttp client) sends the token the ``kubernetes``
client read from the kubeconfig: a pod's service-account token is stored under
``BearerToken``, and a watch without it lists as ``system:anonymous`` (403)."""

from __future__ import annotations

from kubernetes import client
from kubernetes.config.kube_config import KubeConfigLoader

from kgroup_operator.lease_watch import Http


def configuration(user: dict[str, str]) -> client.Configuration:
    cfg = client.Configuration()
    KubeConfigLoader(config_dict={
        "current-context": "pod",
        "contexts": [{"name": "pod", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": user}],
    }).load_and_set(cfg)  # type: ignore[no-untyped-call]
    return cfg


def test_a_kubeconfig_token_is_sent() -> None:
    assert Http(configuration({"token": "tok"})).headers()["Authorization"] == "Bearer tok"


def test_no_token_sends_no_header() -> None:
    assert "Authorization" not in Http(configuration({})).headers()
