"""Deploys and drains of kgroup workers on the real node, as a user does them.

The chart installed with e2e/values-real-node.yaml, the example ConsumerGroup, and the
workers of examples/: the StatefulSet (worker-statefulset.yaml) rolled with `kubectl
rollout restart`, and the Deployment (worker-deployment.yaml) with the PodDisruptionBudget
of worker-pdb.yaml, evicted through the Eviction API (policy/v1) as `kubectl drain` does.
Events flow through Redis the whole time; at the end the verifier finds nothing lost or
duplicated and the sidecars' audit shows no overlapping owners.

Each test has its own namespace, release and group, and waits for conditions, never a
fixed time. What the partition moves of a rollout are is the assignor's business (and
changes with it): these tests print them and assert only what must hold, and what kgroup
promises: a StatefulSet's rollout moves no partition.
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
from kubernetes.client.exceptions import ApiException

from kgroup.core.ranges import parse_ranges
from kgroup_devcluster.cluster import Cluster
from kgroup_devcluster.images import ensure_on_node
from kgroup_devcluster.pytest_plugin import wait_for
from kgroup_devcluster.real_group import GROUP, RealGroup
from kgroup_devcluster.real_node import example_pdb
from kgroup_devcluster.stack import apply
from kgroup_pipeline.keys import StreamKeys
from kgroup_pipeline.redis_server import RedisServer
from kgroup_pipeline.verify import render, verify
from kgroup_testing.sidecar_harness import (
    handoff_figures,
    ownership_intervals,
    read_audit,
    safety_violations,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STREAM = "orders"
PARTITIONS = 12
REPLICAS = 3
TIMEOUT = 240.0
DRAIN = 6  # the light worker's drain timeout (s)
FAST: dict[str, Any] = {"stabilizationWindowSeconds": 1,
                        "lease": {"durationSeconds": 6, "renewIntervalSeconds": 2},
                        "handoff": {"drainTimeoutSeconds": 10}}


@dataclass
class Workers:
    group: RealGroup
    producing: threading.Event = field(default_factory=threading.Event)
    runs: int = 0
    errors: list[str] = field(default_factory=list)

    def produce(self) -> None:
        while self.producing.is_set():
            done = subprocess.run(
                [sys.executable, "-m", "kgroup_pipeline.producer", "--redis",
                 self.group.redis_url, "--stream", STREAM, "--partitions", str(PARTITIONS),
                 "--rate", "300", "--count", "300", "--keys", "200"],
                capture_output=True, text=True, check=False)
            self.runs += 1
            if done.returncode != 0:
                self.errors.append(done.stderr[-2000:])

    def audit(self) -> list[dict[str, Any]]:
        assert self.group.audit is not None
        return read_audit(sorted(self.group.audit.glob("*.jsonl")))

    def check_clean(self) -> None:
        """Stop producing; the workers catch up; nothing lost or duplicated; no overlap."""
        self.producing.clear()
        assert self.errors == [], self.errors[:3]
        assert self.runs > 3
        r = redis.Redis.from_url(self.group.redis_url, decode_responses=True)
        deadline = time.monotonic() + 120
        while not (report := verify(r, STREAM)).caught_up and time.monotonic() < deadline:
            time.sleep(0.5)
        print(render(report))
        assert report.caught_up and report.clean, render(report)
        assert report.total("produced") > 0
        assert safety_violations(self.audit()) == []


@pytest.fixture
def workers(cluster: Cluster, kube: client.ApiClient, crd: list[str],
            request: pytest.FixtureRequest) -> Iterator[Workers]:
    """A release, a group of PARTITIONS and REPLICAS workers of the kind the test names
    (`@pytest.mark.parametrize("workers", ["StatefulSet"], indirect=True)`), Stable,
    with events flowing."""
    kind = getattr(request, "param", "Deployment")
    ensure_on_node(cluster.state_dir)
    namespace = f"deploys-{secrets.token_hex(3)}"
    with RedisServer() as server:
        g = RealGroup(cluster, kube, namespace, release=f"kgroup-{secrets.token_hex(2)}",
                      redis_url=f"redis://127.0.0.1:{server.port}/0",
                      audit=REPO / ".state" / "e2e" / namespace / "audit", kind=kind)
        g.install()
        w = Workers(g)
        producer = threading.Thread(target=w.produce, daemon=True)
        try:
            g.apply(partitions=PARTITIONS, replicas=REPLICAS, stream=STREAM,
                    command=["python3", "-m", "kgroup_pipeline.light_worker",
                             "--drain-timeout", str(DRAIN)], **FAST)
            w.producing.set()
            producer.start()
            g.wait_settled(REPLICAS, timeout=TIMEOUT)
            yield w
        finally:
            w.producing.clear()
            if producer.is_alive():
                producer.join(timeout=60)
            g.uninstall()
            g.delete_namespace()


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


@pytest.mark.parametrize("workers", ["StatefulSet"], indirect=True)
def test_a_statefulset_rollout_restart_completes_with_the_verifier_clean(
        workers: Workers) -> None:
    g = workers.group
    before = {p.metadata.name: p.metadata.uid for p in g.pods()}
    assert sorted(before) == [f"orders-worker-{i}" for i in range(REPLICAS)]
    settled = g.settled(REPLICAS)
    assert settled is not None
    t0 = time.monotonic()
    g.kubectl("rollout", "restart", g.workload)
    g.kubectl("rollout", "status", g.workload, "--timeout=400s", timeout=420)
    status = g.wait_settled(REPLICAS, timeout=TIMEOUT)
    t1 = time.monotonic()
    after = {p.metadata.name: p.metadata.uid for p in g.pods()}
    # every pod replaced, under its own name again; every partition owned by one of them
    assert sorted(after) == sorted(before) == sorted(status["assignment"])
    assert not set(after.values()) & set(before.values())
    assert status["unowned"] == 0
    assert g.holders() == {p: m for m, r in status["assignment"].items()
                           for p in parse_ranges(r)}
    figures = handoff_figures(ownership_intervals(workers.audit(), now=t1), PARTITIONS, t0, t1)
    print(f"StatefulSet rollout of {REPLICAS} x {PARTITIONS} partitions: {figures}, "
          f"epochs {settled['epoch']} -> {status['epoch']}")
    # each pod came back under its name within statefulSetRestartGraceSeconds (30 s) and
    # took its own partitions back: no move, no rebalance (the group's target untouched)
    assert figures["moves"] == 0, figures
    assert (status["epoch"], status["assignment"]) == (settled["epoch"], settled["assignment"])
    workers.check_clean()


@pytest.mark.parametrize("workers", ["StatefulSet"], indirect=True)
def test_a_statefulset_scaled_down_hands_the_removed_pods_partitions_out_without_the_grace(
        workers: Workers) -> None:
    """The removed pod's name never comes back (its ordinal is beyond the StatefulSet's
    replicas), so the operator does not wait for the restart grace: set to an hour here,
    far beyond this test's timeout, it would keep the partitions unowned."""
    g = workers.group
    g.kubectl("patch", "consumergroup", GROUP, "--type", "merge", "-p",
              json.dumps({"spec": {"statefulSetRestartGraceSeconds": 3600}}))
    before = g.wait_settled(REPLICAS, timeout=TIMEOUT)
    removed = f"orders-worker-{REPLICAS - 1}"
    owned = sorted(p for p, h in g.holders().items() if h == removed)
    assert owned and removed in before["assignment"]
    g.kubectl("scale", g.workload, f"--replicas={REPLICAS - 1}")
    status = g.wait_settled(REPLICAS - 1, timeout=TIMEOUT)
    assert removed not in status["assignment"] and status["unowned"] == 0
    holders = g.holders()
    assert all(holders[p] not in (None, removed) for p in owned), holders
    workers.check_clean()


def _pdb(g: RealGroup) -> Any:
    return client.PolicyV1Api(g.api).read_namespaced_pod_disruption_budget(
        "orders-worker", g.namespace)


def _budget(g: RealGroup, allowed: int) -> Any:
    """The PDB's status, once the disruption controller has seen its spec and allows
    `allowed` disruptions."""
    s = (pdb := _pdb(g)).status
    if s and (s.observed_generation or 0) >= pdb.metadata.generation \
            and s.disruptions_allowed == allowed:
        return s
    return None


def _evict(g: RealGroup, pod: str) -> None:
    g.core.create_namespaced_pod_eviction(pod, g.namespace, client.V1Eviction(
        metadata=client.V1ObjectMeta(name=pod, namespace=g.namespace)))


def test_an_evicted_worker_hands_over_within_its_grace_and_the_budget_refuses_a_second(
        workers: Workers) -> None:
    g = workers.group
    pdb = example_pdb()
    pdb["metadata"]["namespace"] = g.namespace
    apply(g.cluster, [pdb])
    budget = wait_for("the PDB to allow one disruption", lambda: _budget(g, 1), timeout=60)
    assert (budget.current_healthy, budget.desired_healthy) == (REPLICAS, REPLICAS - 1)

    pods = g.pods()
    victim, other = pods[0].metadata.name, pods[1].metadata.name
    grace = pods[0].spec.termination_grace_period_seconds
    assert grace == 45  # the example's
    owned = sorted(p for p, h in g.holders().items() if h == victim)
    assert owned
    # a position to hand over: the sink has committed each of them (else None is right)
    sink = redis.Redis.from_url(g.redis_url, decode_responses=True)
    wait_for("a committed offset for each of the victim's partitions", lambda: all(
        sink.hget(StreamKeys(STREAM).sink_partition(p), "offset") for p in owned),
        timeout=60)
    t0 = time.monotonic()
    _evict(g, victim)

    # A second eviction now would leave fewer than REPLICAS - 1 workers Ready: refused.
    with pytest.raises(ApiException) as refused:
        _evict(g, other)
    at_refusal = [p for p in g.pods() if p.metadata.name not in {q.metadata.name for q in pods}]
    assert refused.value.status == 429, refused.value.body
    assert "disruption budget" in str(refused.value.body)
    assert not any(_ready(p) for p in at_refusal), "the replacement was Ready already"
    still: Any = g.core.read_namespaced_pod(other, g.namespace)
    assert still.metadata.deletion_timestamp is None

    # The victim's app drained and released every partition with its position (the
    # SIGTERM path), well within its termination grace, and others took them over there.
    def handed_over() -> dict[int, str | None]:
        h = g.holders()
        done = all(h.get(p) not in (None, victim) for p in owned)
        return {p: h[p] for p in owned} if done else {}
    new_owners = wait_for("the victim's partitions owned elsewhere", handed_over,
                          timeout=grace)
    took = time.monotonic() - t0

    # A sidecar appends its audit line once it learns its write was applied: the Lease
    # may show the new owner before its audit file does (a moment after the answer, or
    # longer when the answer was lost and the acquisition is adopted from the watch).
    def acquisitions_audited() -> list[dict[str, Any]]:
        audit = workers.audit()
        seen = {(r["member"], r["partition"]) for r in audit
                if r["event"] == "acquire" and r["mono"] >= t0}
        return audit if all((o, p) in seen for p, o in new_owners.items()) else []
    audit = wait_for("the new owners' acquisitions in their audit", acquisitions_audited,
                     timeout=30)
    releases = {r["partition"]: r for r in audit if r["member"] == victim
                and r["event"] == "release" and r["mono"] >= t0}
    assert sorted(releases) == owned
    assert {r["reason"] for r in releases.values()} == {"app"}, releases
    assert all(r["position"] is not None for r in releases.values())
    assert max(r["mono"] for r in releases.values()) - t0 < grace
    for p, owner in new_owners.items():  # the next owner starts where the victim stopped
        acquired = [r for r in audit if r["member"] == owner and r["event"] == "acquire"
                    and r["partition"] == p and r["mono"] >= t0]
        assert acquired and acquired[0]["position"] == releases[p]["position"]
    # its member Lease goes last, once its partitions are released (they may be owned
    # elsewhere before it is gone: a leave is handed out at once)
    wait_for("the victim's session ended", lambda: any(
        r["member"] == victim and r["event"] == "session-end" for r in workers.audit()),
        timeout=grace)
    print(f"evicted {victim}: {len(owned)} partitions released (reason app) and owned "
          f"elsewhere {took:.2f} s after the eviction (grace {grace} s): {new_owners}")

    # Once the replacement owns its share, the budget allows the next eviction again.
    g.wait_settled(REPLICAS, timeout=TIMEOUT)
    wait_for("the PDB to allow one disruption again", lambda: _budget(g, 1), timeout=60)
    workers.check_clean()
