"""The whole of kgroup as a user meets it, on the local control plane.

`helm install` the chart (operator, RBAC, admission policy), `kubectl apply` a
ConsumerGroup and a worker Deployment (kgroup-sidecar as a native sidecar + the light
worker as the app), and the local runner runs every pod's containers as processes with
pod-bound tokens — the operator as its chart's service account, the sidecars as the
worker service account, under the admission policy. Events flow through Redis while the
test scales 3 → 5 → 2, deletes a pod, SIGKILLs a pod's processes and restarts the
operator; at the end the verifier finds nothing lost or duplicated, the sidecars' audit
trail shows no overlap of active ownership, and `helm uninstall` leaves only the CRD.

The tests in this module are steps of one scenario and run in file order.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
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
import yaml
from kubernetes import client

from kgroup_devcluster import stack
from kgroup_devcluster.cluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for
from kgroup_pipeline.redis_server import RedisServer
from kgroup_pipeline.verify import render, verify
from kgroup_testing.sidecar_harness import read_audit, safety_violations

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
GROUP = "orders"
STREAM = "orders"
PARTITIONS = 12
APP_LABEL = "orders-worker"


@dataclass
class Env:
    cluster: Cluster
    namespace: str
    release: str
    redis: RedisServer
    runner: subprocess.Popen[bytes]
    state: Path
    core: client.CoreV1Api
    apps: client.AppsV1Api
    watcher: stack.GroupWatcher
    killed_at: dict[str, float] = field(default_factory=dict)
    producing: threading.Event = field(default_factory=threading.Event)
    producer: threading.Thread | None = None
    produced_runs: int = 0
    producer_errors: list[str] = field(default_factory=list)

    # -- reading the group ------------------------------------------------------------
    def group(self) -> dict[str, Any]:
        return {"status": self.watcher.status()}

    def stable_with(self, members: int) -> Any:
        return self.watcher.stable_with(members)

    def worker_pods(self) -> list[str]:
        pods: Any = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"app={APP_LABEL}")
        return sorted(p.metadata.name for p in pods.items
                      if p.metadata.deletion_timestamp is None)

    def runner_state(self) -> dict[str, Any]:
        return stack.runner_state(self.state)

    def scale(self, replicas: int) -> None:
        self.apps.patch_namespaced_deployment_scale(
            f"{APP_LABEL}", self.namespace, {"spec": {"replicas": replicas}})

    def kubectl(self, *args: str) -> str:
        out = self.cluster.kubectl("-n", self.namespace, *args, check=False)
        assert out.returncode == 0, out.stderr
        return str(out.stdout)


def _produce(env: Env, redis_url: str) -> None:
    """Keep producing events (a few hundred a second) until `env.producing` is cleared."""
    while env.producing.is_set():
        done = subprocess.run(
            [sys.executable, "-m", "kgroup_pipeline.producer", "--redis", redis_url,
             "--stream", STREAM, "--partitions", str(PARTITIONS), "--rate", "400",
             "--count", "400", "--keys", "200"],
            capture_output=True, text=True)
        env.produced_runs += 1
        if done.returncode != 0:
            env.producer_errors.append(done.stderr[-2000:])


@pytest.fixture(scope="module")
def env(cluster: Cluster, kube: client.ApiClient, crd: list[str]) -> Iterator[Env]:
    namespace = f"e2e-{secrets.token_hex(3)}"
    release = f"kgroup-{secrets.token_hex(2)}"
    core = client.CoreV1Api(kube)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    wait_for("the default ServiceAccount",
             lambda: any(sa.metadata.name == "default" for sa in
                         _items(core.list_namespaced_service_account(namespace))))
    state = REPO / ".state" / "e2e" / namespace
    state.mkdir(parents=True, exist_ok=True)
    redis_server = RedisServer().start()
    stack.helm_install(cluster, release=release, namespace=namespace)
    runner = stack.start_runner(namespace=namespace, state_dir=state)
    e = Env(cluster=cluster, namespace=namespace, release=release, redis=redis_server,
            runner=runner, state=state, core=core,
            apps=client.AppsV1Api(kube),
            watcher=stack.GroupWatcher(kube, namespace, GROUP))
    try:
        yield e
    finally:
        e.producing.clear()
        if e.producer is not None:
            e.producer.join(timeout=30)
        runner.send_signal(signal.SIGTERM)
        try:
            runner.wait(timeout=40)
        except subprocess.TimeoutExpired:
            runner.kill()
        cluster.helm("uninstall", release, "--namespace", namespace, check=False)
        core.delete_namespace(namespace)
        redis_server.stop()


def test_operator_runs_as_its_service_account(env: Env) -> None:
    state = wait_for("the operator pod's processes",
                     lambda: [k for k in env.runner_state() if "operator" in k], timeout=90)
    pod = state[0].split("/", 1)[1]
    kubeconfig = env.state / "pods" / f"{env.namespace}_{pod}" / "kubeconfig"
    user = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]
    assert user.get("token") and "client-certificate-data" not in user
    # the processes really run: the operator's log shows it started
    log = Path(env.runner_state()[state[0]]["containers"]["operator"]["log"])
    wait_for("the operator to log", lambda: log.exists() and log.stat().st_size > 0)


def test_group_becomes_stable_with_every_partition_owned(env: Env) -> None:
    redis_url = f"redis://127.0.0.1:{env.redis.port}/0"
    stack.apply(env.cluster, stack.manifests(stack.GroupSpec(
        name=GROUP, app_label=APP_LABEL, partitions=PARTITIONS, replicas=3,
        app_command=["python", "-m", "kgroup_pipeline.light_worker", "--drain-timeout", "6"],
        stream=STREAM, redis_url=redis_url), env.namespace))
    env.producing.set()
    env.producer = threading.Thread(target=_produce, args=(env, redis_url), daemon=True)
    env.producer.start()
    status = wait_for("Stable with 3 members", lambda: env.stable_with(3), timeout=120)
    assigned = sorted(p for m in status["members"] for p in _ranges(m["assigned"]))
    assert assigned == list(range(PARTITIONS))
    assert sorted(status["assignment"]) == env.worker_pods()


def test_only_the_sidecar_holds_an_api_token(env: Env) -> None:
    """The app container must not hold the worker's token. The pods turn automount off
    and mount a projected token into the sidecar alone; the runner, like the kubelet,
    gives the app process no credentials at all (its environment, read from /proc)."""
    workers = {k: v for k, v in env.runner_state().items()
               if k.split("/", 1)[1] in env.worker_pods()}
    assert workers
    for key, pod in workers.items():
        for name, c in pod["containers"].items():
            environ = Path(f"/proc/{c['pid']}/environ").read_bytes().split(b"\0")
            has = any(v.startswith(b"KUBECONFIG=") for v in environ)
            assert has == (name == "kgroup-sidecar"), (key, name)


def test_kubectl_get_and_describe_tell_who_owns_what(env: Env) -> None:
    table = env.kubectl("get", "cg", GROUP)
    header = table.splitlines()[0].split()
    for column in ("PHASE", "EPOCH", "PARTITIONS", "MEMBERS", "UNOWNED", "AGE"):
        assert column in header
    row = dict(zip(header, table.splitlines()[1].split(), strict=False))
    assert row["PHASE"] == "Stable" and row["MEMBERS"] == "3" and row["UNOWNED"] == "0"
    described = env.kubectl("describe", "cg", GROUP)
    for pod in env.worker_pods():
        assert pod in described


def test_kgroup_status_shows_the_lag_the_workers_report(env: Env) -> None:
    """The light workers report per-partition position and lag through their sidecars;
    the sidecars carry them on their member Lease renewals; ``kgroup status`` shows them,
    and no partition is stalled."""
    kgroup = Path(sys.executable).with_name("kgroup")

    def view() -> dict[str, Any] | None:
        out = subprocess.run([str(kgroup), "status", GROUP, "-n", env.namespace,
                              "--kubeconfig", str(env.cluster.kubeconfig), "-o", "json"],
                             capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        doc: dict[str, Any] = json.loads(out.stdout)
        rows = doc["partitions"]
        reported = all(r["lag"] is not None and r["position"] for r in rows)
        return doc if reported and all(r["state"] == "active" for r in rows) else None

    doc: Any = wait_for("every partition's lag reported", view, timeout=60)
    assert len(doc["partitions"]) == PARTITIONS
    assert all(r["lag"] >= 0 for r in doc["partitions"])
    assert sorted(m["name"] for m in doc["members"]) == env.worker_pods()
    assert all(m["stalled"] == 0 and m["lag"] is not None for m in doc["members"])
    assert doc["stalled"] == 0


def test_scaling_up_and_down_rebalances(env: Env) -> None:
    before = env.stable_with(3)
    assert before is not None
    env.scale(5)
    after = wait_for("Stable with 5 members", lambda: env.stable_with(5), timeout=120)
    assert after["epoch"] > before["epoch"], json.dumps([before, after], indent=1)
    moved = after["lastRebalance"]["moved"]
    assert moved <= PARTITIONS - 2 * 2  # the 3 stayers keep at least 2 of their 4 each
    env.scale(2)
    wait_for("Stable with 2 members", lambda: env.stable_with(2), timeout=120)


def test_a_deleted_pod_is_replaced_and_its_partitions_move(env: Env) -> None:
    victim = env.worker_pods()[0]
    env.core.delete_namespaced_pod(victim, env.namespace)
    wait_for("a replacement pod, Stable again",
             lambda: victim not in (env.stable_with(2) or {}).get("assignment", {victim: 1})
             and env.stable_with(2), timeout=120)


def test_a_sigkilled_pod_loses_its_partitions_and_comes_back(env: Env) -> None:
    before = env.stable_with(2)
    assert before is not None
    victim = env.worker_pods()[0]
    containers = env.runner_state()[f"{env.namespace}/{victim}"]["containers"]
    env.killed_at[victim] = time.monotonic()
    for c in containers.values():
        if c["pid"]:
            os.kill(c["pid"], signal.SIGKILL)
    # the runner restarts the containers (a new session), the group settles again
    wait_for("Stable again after SIGKILL",
             lambda: (s := env.stable_with(2)) and s["epoch"] >= before["epoch"]
             and env.runner_state()[f"{env.namespace}/{victim}"]["containers"]
             ["kgroup-sidecar"]["restarts"] >= 1, timeout=120)


def test_restarting_the_operator_moves_no_partition(env: Env) -> None:
    before = env.stable_with(2)
    assert before is not None
    pods: Any = env.core.list_namespaced_pod(
        env.namespace, label_selector="app.kubernetes.io/component=operator")
    assert pods.items, "no operator pod"
    for pod in pods.items:
        env.core.delete_namespaced_pod(pod.metadata.name, env.namespace)
    wait_for("a new operator pod running",
             lambda: any("operator" in k and not any(p.metadata.name in k for p in pods.items)
                         for k in env.runner_state()), timeout=90)
    after = wait_for("Stable after the operator restart", lambda: env.stable_with(2))
    assert after["epoch"] == before["epoch"]
    assert after["assignment"] == before["assignment"]


def test_nothing_lost_nothing_duplicated_no_overlapping_owners(env: Env) -> None:
    # events flowed through every fault above; when those went fast, the producer keeps
    # going until it has produced more than ten batches of 400 (how fast the earlier tests
    # ran is not what this test is about)
    wait_for("more than ten producer runs", lambda: env.produced_runs > 10, timeout=120)
    env.producing.clear()
    assert env.producer is not None
    env.producer.join(timeout=60)
    assert env.producer_errors == [], env.producer_errors[:3]
    assert env.produced_runs > 10
    r = redis.Redis.from_url(f"redis://127.0.0.1:{env.redis.port}/0", decode_responses=True)
    deadline = time.monotonic() + 120
    while not (report := verify(r, STREAM)).caught_up and time.monotonic() < deadline:
        time.sleep(0.5)
    if not report.caught_up:
        from kgroup_pipeline.keys import StreamKeys
        k = StreamKeys(STREAM)
        sinks = {n: (r.hgetall(k.sink_partition(n)), r.xrevrange(k.partition(n), count=1))
                 for n in range(3)}
        owned = {pod: _sidecar_view(env, pod) for pod in env.worker_pods()}
        pytest.fail("workers did not catch up:\n" + render(report) + f"\nsinks {sinks}\n"
                    f"sidecars {owned}\n" + json.dumps(env.group().get("status"), indent=1))
    print(render(report))
    assert report.clean, render(report)
    assert report.total("produced") > 0 and report.total("out_of_order") == 0
    audit = read_audit(sorted((env.state / "audit").glob("*.jsonl")))
    assert any(rec["event"] == "acquire" for rec in audit)
    assert safety_violations(audit, ended_at=env.killed_at) == []


def test_helm_uninstall_leaves_only_the_crd(env: Env) -> None:
    env.kubectl("delete", "consumergroup", GROUP, "--wait=true")
    env.kubectl("delete", "deployment", APP_LABEL, "--wait=true")
    out = env.cluster.helm("uninstall", env.release, "--namespace", env.namespace, check=False)
    assert out.returncode == 0, out.stderr
    selector = f"app.kubernetes.io/instance={env.release}"
    wait_for("the chart's objects to go", lambda: not env.core.list_namespaced_pod(
        env.namespace, label_selector=selector).items, timeout=60)
    left = env.cluster.kubectl(
        "get", "deployments,serviceaccounts,roles,rolebindings,services,clusterroles,"
        "clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings",
        "-A", "-l", selector, "-o", "name", check=False)
    assert left.returncode == 0 and left.stdout.strip() == "", left.stdout
    wait_for("the group's Leases to be garbage-collected", lambda: not client.CoordinationV1Api(
        env.core.api_client).list_namespaced_lease(
            env.namespace, label_selector=f"kgroup.dev/group={GROUP}").items, timeout=60)
    crd = env.cluster.kubectl("get", "crd", "consumergroups.kgroup.dev", "-o", "name", check=False)
    assert crd.returncode == 0


def _items(listing: Any) -> list[Any]:
    return list(listing.items)


def _sidecar_view(env: Env, pod: str) -> Any:
    from kgroup.client import SidecarAddress
    url = env.runner_state()[f"{env.namespace}/{pod}"]["sidecar"]
    conn = SidecarAddress.parse(url).connection(5)
    try:
        conn.request("GET", "/v1/assignment")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def _ranges(text: str) -> list[int]:
    from kgroup.core.ranges import parse_ranges
    return parse_ranges(text)
