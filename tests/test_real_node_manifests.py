"""examples/worker-deployment.yaml adapted to the local real node (kgroup_devcluster.real_node):
only placement, API address, pull policy and Redis change; the sidecar stays the chart's."""

from __future__ import annotations

import yaml

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
    assert a_pod["volumes"] == o_pod["volumes"]
    assert adapted[0]["data"]["KGROUP_STREAM"] == original[0]["data"]["KGROUP_STREAM"]
