"""examples/worker-deployment.yaml adapted to the local real node (kgroup_devcluster.real_node):
only placement, API address, pull policy and Redis change; the sidecar stays the chart's."""

from __future__ import annotations

from pathlib import Path

import yaml
from test_chart_sidecar import app_pod, no_interpreter

from kgroup_devcluster.real_node import EXAMPLE, example_workers


def test_the_example_lands_on_the_real_node_with_loopback_addresses_only() -> None:
    docs = example_workers(api_port=40123, redis_url="redis://127.0.0.1:7001/0",
                           stream="s", replicas=2)
    config, dep = docs
    assert config["data"] == {"KGROUP_REDIS_URL": "redis://127.0.0.1:7001/0",
                              "KGROUP_STREAM": "s"}
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "Default")
    assert pod["nodeSelector"] == {"kgroup.dev/node": "real"}
    assert pod["tolerations"][0]["effect"] == "NoSchedule"
    (side,) = pod["initContainers"]
    env = {e["name"]: e.get("value") for e in side["env"]}
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == (
        "127.0.0.1", "40123")
    assert env["KGROUP_LISTEN"].startswith("unix://")  # no port to collide on the node
    assert {c["imagePullPolicy"] for c in pod["initContainers"] + pod["containers"]} == {
        "Never"}


def test_only_those_fields_differ_from_the_example() -> None:
    original = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    adapted = example_workers(api_port=1, redis_url="redis://127.0.0.1:1/0")
    o_pod = original[1]["spec"]["template"]["spec"]
    a_pod = adapted[1]["spec"]["template"]["spec"]
    assert set(a_pod) - set(o_pod) == {"hostNetwork", "dnsPolicy", "nodeSelector",
                                       "tolerations"}
    assert a_pod["containers"][0]["command"] == o_pod["containers"][0]["command"]
    o_side, a_side = o_pod["initContainers"][0], a_pod["initContainers"][0]
    assert "httpGet" in o_side["readinessProbe"] and "exec" in a_side["readinessProbe"]
    assert a_pod["volumes"] == o_pod["volumes"]
    assert adapted[0]["data"]["KGROUP_STREAM"] == original[0]["data"]["KGROUP_STREAM"]


def test_on_the_real_node_the_sidecar_is_the_charts_with_exec_probes(tmp_path: Path) -> None:
    """A hostNetwork pod has no port of its own: the adapted sidecar is exactly what the
    chart renders with sidecar.probes.mode=exec (plus the API address and pull policy)."""
    adapted = example_workers(api_port=40123, redis_url="redis://127.0.0.1:1/0")
    (side,) = adapted[1]["spec"]["template"]["spec"]["initContainers"]
    rendered = app_pod(tmp_path, "  sidecar: {probes: {mode: exec}, image: {tag: '0.1.0'}}\n"
                       )["spec"]["initContainers"][0]
    side = dict(side, imagePullPolicy=rendered["imagePullPolicy"], env=[
        e for e in side["env"] if not e["name"].startswith("KUBERNETES_SERVICE_")])
    assert side == rendered
    assert "ports" not in side
    for key in ("startupProbe", "readinessProbe"):
        assert no_interpreter(side[key]["exec"]["command"])
    assert "livenessProbe" not in side  # the sidecar's watchdog (no runc exec)
