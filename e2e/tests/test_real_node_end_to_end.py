"""kgroup as a user runs it, in real containers on the real node.

`helm install` of charts/kgroup with e2e/values-real-node.yaml (the operator in its own
image, hostNetwork, API server on loopback), `kubectl apply` of examples/consumergroup.yaml
and examples/worker-deployment.yaml (adapted by kgroup_devcluster.real_node: placement on
the real node, small requests, an audit file per sidecar), the images built by
`make images` from docker/ and loaded into the node's containerd. The kubelet enforces the
chart's securityContext, probes (readiness = ownership) and pod-bound tokens; Events flow
through Redis (a redis-server on 127.0.0.1, reached by the hostNetwork pods) while the test
scales, deletes a pod, SIGKILLs a container, kills a whole pod's containers, rolls the
Deployment and restarts the operator. At the end the verifier finds nothing lost or
duplicated, the sidecars' audit shows no overlapping owners, and `helm uninstall` leaves
only the CRD.

The tests in this module are steps of one scenario and run in file order; each waits for a
condition, never a fixed time.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from kubernetes import client

from kgroup_devcluster.cluster import Cluster
from kgroup_devcluster.images import ensure_on_node
from kgroup_devcluster.pytest_plugin import wait_for
from kgroup_devcluster.real_group import APP, GROUP, OPERATOR, RealGroup
from kgroup_pipeline.redis_server import RedisServer
from kgroup_pipeline.verify import render, verify
from kgroup_testing.sidecar_harness import read_audit, safety_violations

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STREAM = "orders"
PARTITIONS = 12
TIMEOUT = 180.0  # a real pod: image unpacked already, Python + kubernetes client start


@dataclass
class Env:
    group: RealGroup
    redis: RedisServer
    killed_at: dict[str, float] = field(default_factory=dict)
    producing: threading.Event = field(default_factory=threading.Event)
    producer: threading.Thread | None = None
    produced_runs: int = 0
    producer_errors: list[str] = field(default_factory=list)

    @property
    def redis_url(self) -> str:
        return self.group.redis_url

    def settled(self, members: int) -> dict[str, Any] | None:
        return self.group.settled(members)


def _produce(env: Env) -> None:
    while env.producing.is_set():
        done = subprocess.run(
            [sys.executable, "-m", "kgroup_pipeline.producer", "--redis", env.redis_url,
             "--stream", STREAM, "--partitions", str(PARTITIONS), "--rate", "300",
             "--count", "300", "--keys", "200"], capture_output=True, text=True)
        env.produced_runs += 1
        if done.returncode != 0:
            env.producer_errors.append(done.stderr[-2000:])


@pytest.fixture(scope="module")
def env(cluster: Cluster, kube: client.ApiClient, crd: list[str]) -> Iterator[Env]:
    ensure_on_node(cluster.state_dir)  # make images: built (cached by content) and loaded
    namespace = f"real-{secrets.token_hex(3)}"
    redis_server = RedisServer().start()
    group = RealGroup(cluster, kube, namespace, release=f"kgroup-{secrets.token_hex(2)}",
                      redis_url=f"redis://127.0.0.1:{redis_server.port}/0",
                      audit=REPO / ".state" / "e2e" / namespace / "audit")
    group.install()
    e = Env(group=group, redis=redis_server)
    try:
        yield e
    finally:
        e.producing.clear()
        if e.producer is not None:
            e.producer.join(timeout=30)
        group.uninstall()
        group.delete_namespace()
        redis_server.stop()


def test_the_operator_runs_in_a_real_container_locked_down(env: Env) -> None:
    pod = wait_for("the operator pod Ready on the real node", env.group.operator_ready,
                   timeout=TIMEOUT)[0]
    status = pod.status.container_statuses[0]
    assert status.container_id.startswith("containerd://")
    assert status.image.endswith("kgroup-operator:0.1.0")
    # the kubelet enforces the chart's securityContext: uid 10001, no capabilities
    out = env.group.kubectl("exec", pod.metadata.name, "--", "python3", "-c",
                            "import os; print(os.getuid(), open('/proc/self/status').read()"
                            ".split('CapEff:')[1].split()[0])")
    assert out.split() == ["10001", "0000000000000000"]


def test_group_becomes_stable_with_every_partition_owned_and_pods_ready(env: Env) -> None:
    env.group.apply(partitions=PARTITIONS, replicas=3, stream=STREAM,
                    command=["python3", "-m", "kgroup_pipeline.light_worker",
                             "--drain-timeout", "6"],
                    stabilizationWindowSeconds=1,
                    lease={"durationSeconds": 6, "renewIntervalSeconds": 2},
                    handoff={"drainTimeoutSeconds": 10})
    env.producing.set()
    env.producer = threading.Thread(target=_produce, args=(env,), daemon=True)
    env.producer.start()
    status = env.group.wait_settled(3, timeout=TIMEOUT)
    assert sorted(status["assignment"]) == [p.metadata.name for p in env.group.pods()]
    # the pod-bound token the kubelet projected is what the sidecar authenticates with
    pod = env.group.pods()[0].metadata.name
    token = env.group.kubectl("exec", pod, "-c", "kgroup-sidecar", "--", "python3", "-c",
                              "print(open('/var/run/secrets/kubernetes.io/serviceaccount/"
                              "token').read())").strip()
    review = env.group.cluster.kubectl(
        "create", "-f", "-", "-o", "jsonpath={.status.user.extra}", input=json.dumps(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
             "spec": {"token": token}}))
    assert pod in review.stdout, review.stdout


def test_kgroup_status_shows_the_lag_the_workers_report(env: Env) -> None:
    """The workers in real containers report per-partition position and lag to their
    sidecars over the shared Unix socket; ``kgroup status`` reads them from the member
    Leases."""
    kgroup = Path(sys.executable).with_name("kgroup")

    def view() -> dict[str, Any] | None:
        out = subprocess.run([str(kgroup), "status", GROUP, "-n", env.group.namespace,
                              "--kubeconfig", str(env.group.cluster.kubeconfig), "-o",
                              "json"], capture_output=True, text=True, timeout=60, check=True)
        doc: dict[str, Any] = json.loads(out.stdout)
        rows = doc["partitions"]
        reported = all(r["lag"] is not None and r["position"] for r in rows)
        return doc if reported and all(r["state"] == "active" for r in rows) else None

    doc: Any = wait_for("every partition's lag reported", view, timeout=60)
    assert len(doc["partitions"]) == PARTITIONS and doc["stalled"] == 0
    assert all(m["lag"] is not None and m["stalled"] == 0 for m in doc["members"])


def test_scaling_up_and_down_is_paced_by_readiness(env: Env) -> None:
    before = env.settled(3)
    assert before is not None
    env.group.kubectl("scale", f"deployment/{APP}", "--replicas=4")
    after = env.group.wait_settled(4, timeout=TIMEOUT)
    assert after["epoch"] > before["epoch"]
    env.group.kubectl("scale", f"deployment/{APP}", "--replicas=2")
    env.group.wait_settled(2, timeout=TIMEOUT)


def test_a_deleted_pod_hands_over_and_is_replaced(env: Env) -> None:
    victim = env.group.pods()[0].metadata.name
    env.group.core.delete_namespaced_pod(victim, env.group.namespace)
    wait_for("a replacement pod, Stable again", lambda: (s := env.settled(2))
             and victim not in s["assignment"], timeout=TIMEOUT)


@pytest.mark.parametrize("container", ["worker", "kgroup-sidecar"])
def test_a_sigkilled_container_is_restarted_by_the_kubelet(env: Env, container: str) -> None:
    victim = env.group.pods()[0].metadata.name
    restarts = env.group.kill_container(victim, container)
    if container == "kgroup-sidecar":
        env.killed_at[victim] = time.monotonic()
    wait_for(f"{container} restarted by the kubelet and the group Stable", lambda: (
        env.group.container(victim, container).restart_count > restarts and env.settled(2)),
        timeout=TIMEOUT)


def test_killing_all_of_a_pods_containers_at_once(env: Env) -> None:
    victim = env.group.pods()[-1].metadata.name
    restarts = {c: env.group.container(victim, c).restart_count
                for c in ("worker", "kgroup-sidecar")}
    env.killed_at[victim] = time.monotonic()
    for c in restarts:
        env.group.kill_container(victim, c)
    wait_for("both containers restarted and the group Stable", lambda: all(
        env.group.container(victim, c).restart_count > n for c, n in restarts.items())
        and env.settled(2), timeout=TIMEOUT)


def test_rollout_restart_replaces_every_worker(env: Env) -> None:
    old = {p.metadata.name for p in env.group.pods()}
    env.group.kubectl("rollout", "restart", f"deployment/{APP}")
    env.group.kubectl("rollout", "status", f"deployment/{APP}", "--timeout=300s", timeout=320)
    status = env.group.wait_settled(2, timeout=TIMEOUT)
    assert not old & set(status["assignment"]) and status["unowned"] == 0


def test_restarting_the_operator_moves_no_partition(env: Env) -> None:
    before = env.settled(2)
    assert before is not None
    old = tuple(p.metadata.name for p in env.group.pods(OPERATOR))
    for name in old:
        env.group.core.delete_namespaced_pod(name, env.group.namespace)
    wait_for("a new operator pod Ready", lambda: env.group.operator_ready(other_than=old),
             timeout=TIMEOUT)
    after = env.group.wait_settled(2, timeout=TIMEOUT)
    assert (after["epoch"], after["assignment"]) == (before["epoch"], before["assignment"])


def test_nothing_lost_nothing_duplicated_no_overlapping_owners(env: Env) -> None:
    env.producing.clear()
    assert env.producer is not None
    env.producer.join(timeout=60)
    assert env.producer_errors == [], env.producer_errors[:3]
    assert env.produced_runs > 10
    r = redis.Redis.from_url(env.redis_url, decode_responses=True)
    deadline = time.monotonic() + 120
    while not (report := verify(r, STREAM)).caught_up and time.monotonic() < deadline:
        time.sleep(0.5)
    print(render(report))
    assert report.caught_up and report.clean, render(report)
    assert report.total("produced") > 0 and report.total("out_of_order") == 0
    assert env.group.audit is not None
    audit = read_audit(sorted(env.group.audit.glob("*.jsonl")))
    assert any(rec["event"] == "acquire" for rec in audit)
    assert safety_violations(audit, ended_at=env.killed_at) == []


def test_helm_uninstall_leaves_only_the_crd(env: Env) -> None:
    env.group.kubectl("delete", "consumergroup", GROUP, "--wait=true")
    env.group.kubectl("delete", "deployment", APP, "--wait=true")
    out = env.group.cluster.helm("uninstall", env.group.release, "--namespace",
                                 env.group.namespace, check=False)
    assert out.returncode == 0, out.stderr
    selector = f"app.kubernetes.io/instance={env.group.release}"
    wait_for("the chart's pods to go", lambda: not env.group.pods(selector), timeout=TIMEOUT)
    left = env.group.cluster.kubectl(
        "get", "deployments,serviceaccounts,roles,rolebindings,services,clusterroles,"
        "clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings",
        "-A", "-l", selector, "-o", "name", check=False)
    assert left.returncode == 0 and left.stdout.strip() == "", left.stdout
    wait_for("the group's Leases to be garbage-collected", lambda: not client.CoordinationV1Api(
        env.group.core.api_client).list_namespaced_lease(
            env.group.namespace, label_selector=f"kgroup.dev/group={GROUP}").items, timeout=60)
    crd = env.group.cluster.kubectl("get", "crd", "consumergroups.kgroup.dev", "-o", "name",
                              check=False)
    assert crd.returncode == 0
