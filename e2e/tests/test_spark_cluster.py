"""The PySpark worker on a Spark standalone cluster, with real sidecars on the real API server.

A master and one worker (2 cores) run on 127.0.0.1 (:mod:`kgroup_pipeline.spark_cluster`,
own state dir). Two members, each a real ``kgroup-sidecar`` and a worker process whose
driver connects to the cluster (``KGROUP_SPARK_MASTER``, ``spark.cores.max=1`` each so
both drivers hold an executor at once). The test plays the operator (ScriptedTarget):
8 partitions split 4/4, events flow, then a rebalance swaps two partitions each way while
events keep arriving. The end: the verifier finds nothing lost or duplicated and every key
in order, moved partitions were committed under the new owner's token, the sidecars'
audit shows no overlap, and every listening socket of the cluster, its executors and the
drivers is on loopback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kubernetes import client

from kgroup.client import SidecarClient
from kgroup_devcluster.cluster import Cluster
from kgroup_pipeline.producer import produce
from kgroup_pipeline.redis_server import RedisServer
from kgroup_pipeline.spark_cluster import (
    SparkCluster,
    descendants,
    is_loopback,
    listening_sockets,
    master_json,
)
from kgroup_pipeline.verify import render, verify
from kgroup_testing.sidecar_harness import (
    ScriptedTarget,
    SidecarProcess,
    read_audit,
    safety_violations,
    wait_until,
)

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.slow]
GROUP = "orders"
STREAM = "orders"
PARTS = 8
FIRST, SECOND = 2000, 2000  # events before and during the rebalance


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[SparkCluster]:
    sc = SparkCluster(tmp_path / "spark")
    sc.up(workers=1, cores=2, memory="1536m", port=0)
    try:
        yield sc
    finally:
        sc.down()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


class Member:
    """A sidecar and the PySpark worker (driver on the cluster) of one pod."""

    def __init__(self, pod: str, *, namespace: str, kubeconfig: str, workdir: Path) -> None:
        self.pod = pod
        self.sidecar = SidecarProcess(pod=pod, group=GROUP, namespace=namespace,
                                      kubeconfig=kubeconfig, workdir=workdir, grace=60.0)
        self.log = workdir / f"worker-{pod}.log"
        self.worker: subprocess.Popen[bytes] | None = None

    def start_worker(self, *, redis_url: str, master: str) -> None:
        env = {**os.environ, "KGROUP_REDIS_URL": redis_url, "KGROUP_STREAM": STREAM,
               "KGROUP_SIDECAR_URL": self.sidecar.url, "KGROUP_SPARK_MASTER": master,
               "KGROUP_SPARK_CORES_MAX": "1", "KGROUP_SPARK_EXECUTOR_MEMORY": "512m",
               "NO_PROXY": "127.0.0.1,localhost"}
        with self.log.open("wb") as out:
            self.worker = subprocess.Popen(
                [sys.executable, "-m", "kgroup_pipeline.worker", "--drain-timeout", "40",
                 "--max-rows", "5000"],
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def worker_alive(self) -> bool:
        return self.worker is not None and self.worker.poll() is None

    def worker_log(self) -> str:
        return self.log.read_text(errors="replace")[-5000:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.worker is not None and self.worker.poll() is None:
            self.worker.kill()
            self.worker.wait(30)
        self.sidecar.stop()


def converged(members: dict[str, Member], target: dict[str, list[int]], epoch: int) -> bool:
    for pod, parts in target.items():
        a = SidecarClient(members[pod].sidecar.url).assignment()
        if a.acked_epoch != epoch or sorted(p.partition for p in a.active) != parts:
            return False
    return True


def test_two_members_on_the_standalone_cluster_hand_off_mid_stream_losing_nothing(
        cluster: Cluster, kube: client.ApiClient, crd: list[str], namespace: str,
        tmp_path: Path, spark_cluster: SparkCluster, redis_server: RedisServer) -> None:
    state = spark_cluster.load()
    assert state is not None
    rc = redis.Redis.from_url(redis_server.url, decode_responses=True)
    target = ScriptedTarget(kube, namespace, GROUP)
    target.create(partitions=PARTS, duration=10, renew=2, drain=60)
    members = {pod: Member(pod, namespace=namespace, kubeconfig=str(cluster.kubeconfig),
                           workdir=tmp_path) for pod in ("pod-a", "pod-b")}
    producer: threading.Thread | None = None
    try:
        for m in members.values():
            m.sidecar.start()
        first = {"pod-a": [0, 1, 2, 3], "pod-b": [4, 5, 6, 7]}
        epoch = target.assign(first)
        wait_until("both sidecars hold their first target",
                   lambda: converged(members, first, epoch), timeout=60)
        produce(rc, stream=STREAM, partitions=PARTS, count=FIRST, keys=200, seed=21)
        for m in members.values():
            m.start_worker(redis_url=redis_server.url, master=state.master_url)

        def both_running() -> bool:
            assert all(m.worker_alive() for m in members.values()), [
                m.worker_log() for m in members.values()]
            apps = master_json(state.ui_url).get("activeapps", [])
            return len(apps) == 2 and all(int(a.get("cores", 0)) == 1 for a in apps)

        wait_until("both drivers run on the cluster with one core each", both_running,
                   timeout=240, interval=0.5)
        wait_until("the first events committed by both members",
                   lambda: verify(rc, STREAM).caught_up, timeout=240, interval=0.5)
        # Every socket of the cluster, its executors and the drivers is on loopback.
        roots = [p.pid for p in state.procs] + [m.worker.pid for m in members.values()
                                                if m.worker is not None]
        pids = roots + [d.pid for d in descendants(roots)]
        sockets = listening_sockets(pids)
        assert len(sockets) >= 6, sockets  # master, worker, 2 executors, 2 drivers at least
        assert [s for s in sockets if not is_loopback(s[1])] == []

        producer = threading.Thread(target=produce, args=(
            redis.Redis.from_url(redis_server.url, decode_responses=True),), kwargs={
            "stream": STREAM, "partitions": PARTS, "count": SECOND, "keys": 200,
            "seed": 22, "rate": 200.0})
        producer.start()
        second = {"pod-a": [0, 1, 6, 7], "pod-b": [2, 3, 4, 5]}  # 2, 3 → b; 6, 7 → a
        epoch = target.assign(second)
        wait_until("the workers hand the moved partitions over",
                   lambda: converged(members, second, epoch), timeout=120, interval=0.5)
        producer.join(timeout=120)
        assert not producer.is_alive()
        wait_until("every partition caught up", lambda: verify(rc, STREAM).caught_up,
                   timeout=240, interval=0.5)
        # Pod termination: the worker and its sidecar get SIGTERM together; the sidecar
        # revokes everything, the worker seals, drains and releases at committed offsets.
        for m in members.values():
            assert m.worker is not None and m.sidecar.proc is not None
            m.worker.send_signal(signal.SIGTERM)
            m.sidecar.proc.send_signal(signal.SIGTERM)
        for m in members.values():
            assert m.worker is not None and m.sidecar.proc is not None
            assert m.worker.wait(120) == 0, m.worker_log()
            assert m.sidecar.proc.wait(60) == 0, m.sidecar.log_text()[-3000:]
    finally:
        if producer is not None:
            producer.join(timeout=120)
        for m in members.values():
            m.stop()
    report = verify(rc, STREAM)
    print(render(report))
    assert report.clean and report.caught_up, render(report)
    assert report.total("committed") == report.total("produced") == FIRST + SECOND
    assert report.total("lost") == report.total("duplicated") == 0
    assert report.total("out_of_order") == 0
    # the moved partitions went on under the new owner's token: a token is the
    # resourceVersion its acquisition replaced, so every token taken at the move is above
    # every token of the first assignment, which the unmoved partitions still carry
    tokens = {p: int(str(rc.hget(f"kgroup:{{{STREAM}}}:sink:p:{p}", "token"))) for p in range(8)}
    assert min(tokens[p] for p in (2, 3, 6, 7)) > max(tokens[p] for p in (0, 1, 4, 5)), tokens
    audit = read_audit([m.sidecar.audit_file for m in members.values()])
    assert safety_violations(audit) == []
    for m in members.values():
        log = m.worker_log()
        assert "session on spark://127.0.0.1:" in log, log
        assert "Traceback" not in m.sidecar.log_text()
