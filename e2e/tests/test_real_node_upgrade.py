"""An upgrade from the previous release to this tree, on the real node, with events flowing.

The previous release is commit 34ed52a (kgroup_devcluster.previous.PREVIOUS: the last
commit of main before the work that numbered releases, from 2026-11-27 20:14 on; it writes
0.1.0's Lease format and has no injector). It is installed as its users installed it: its
own chart and e2e values, its images built from its own docker/ files (tagged `:34ed52a`),
in a namespace of its own (the operator's, as `kgroup-system` would be), and its
example's worker Deployment, the sidecar written out, in the workers' namespace. Then, as
CHANGELOG.md's Upgrade says, while the producer keeps writing:

1. `helm upgrade` to this tree's chart with the sidecar injector on (its webhook at
   https://127.0.0.1:<port>/inject, scoped to the workers' namespace by a label): CRD,
   operator, injector and admission policies together. The previous release's sidecars
   keep their locks and renew under the new operator and policies: no partition moves,
   none is fenced.
2. The workers scaled down by one, then up again, still of the previous release: the
   removed worker's partitions go to the other old sidecars, and the added one takes its
   share. Old sidecars must still acquire under the new operator and policies (else a
   released partition waits for a new pod: a window where no pod may acquire).
3. The workers roll to this release's sidecar through the label alone: the Deployment
   applied as examples/worker-deployment-injected.yaml writes it (the app and
   `kgroup.dev/group: orders`; docs/adopting.md "With Helm"), the app's image unchanged
   (the app is the user's; the previous release's light worker here). The injector adds
   this release's sidecar to each new pod; the test's only addition is its instrument,
   the audit volume (`sidecar.kgroup.dev/audit-volume`). One rollout, `maxSurge: 1,
   maxUnavailable: 0`; old and new sidecars share the group while it runs.

Checked from the sidecars' audit and the verifier: nothing lost or duplicated, no overlap
of owners, no sidecar fenced, moves ÷ partitions ≤ 1 for the rollout, no partition
unowned longer than one handoff (the group's drain timeout) at any time of the upgrade,
and both versions' sidecars holding partitions at one moment of the rollout.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from test_real_node_deploys import DRAIN, FAST, PARTITIONS, REPLICAS, STREAM, TIMEOUT, Workers

from kgroup_devcluster import previous
from kgroup_devcluster.cluster import Cluster
from kgroup_devcluster.images import ensure_on_node, project_version
from kgroup_devcluster.pytest_plugin import CRD_DIR, wait_for
from kgroup_devcluster.real_group import APP, RealGroup
from kgroup_devcluster.real_node import example_group, example_workers
from kgroup_devcluster.runner import free_port
from kgroup_devcluster.stack import apply, helm_install
from kgroup_pipeline.redis_server import RedisServer
from kgroup_testing.sidecar_harness import Interval, handoff_figures, ownership_intervals

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ONE_HANDOFF = float(FAST["handoff"]["drainTimeoutSeconds"])  # s: the longest a move may pause
MAX_MOVES_PER_PARTITION = 1.0  # for the rollout
VERSION = project_version()  # this tree's: its images' tag
PREVIOUS = previous.commit()  # 34ed52a unless $KGROUP_PREVIOUS names another commit
OLD_TAG = previous.tag(PREVIOUS)  # its images' tag
LIGHT_WORKER = ["python3", "-m", "kgroup_pipeline.light_worker", "--drain-timeout", str(DRAIN)]
INJECTED_EXAMPLE = REPO / "examples" / "worker-deployment-injected.yaml"
AUDIT_VOLUME = "kgroup-audit"
MARK = "kgroup.dev/e2e-upgrade"  # the workers' namespace: the only one the injector sees


@dataclass
class Upgrade:
    workers: Workers
    old: Path  # the previous release's tree
    mark: str  # the value of MARK on the workers' namespace

    @property
    def group(self) -> RealGroup:
        g: RealGroup = self.workers.group
        return g

    def old_docs(self) -> list[dict[str, Any]]:
        """The previous release's worker ConfigMap and Deployment (its example, the sidecar
        written out), on the real node, with its images and the audit."""
        g = self.group
        docs = example_workers(api_port=g.cluster.ports["apiserver"], redis_url=g.redis_url,
                               stream=STREAM, replicas=REPLICAS, command=LIGHT_WORKER,
                               small_requests=True, audit_dir=g.audit,
                               path=self.old / "examples" / "worker-deployment.yaml")
        for d in docs:
            d["metadata"]["namespace"] = g.namespace
            if d["kind"] != "Deployment":
                continue
            pod = d["spec"]["template"]["spec"]
            for c in pod.get("initContainers", []) + pod["containers"]:
                c["image"] = f"{c['image'].rpartition(':')[0]}:{OLD_TAG}"
        return docs

    def injected_docs(self) -> list[dict[str, Any]]:
        """This release's injected example (the app and the label), on the real node, with
        the previous release's app image and the audit volume: what the injector turns
        into this release's sidecar."""
        g = self.group
        assert g.audit is not None
        docs = example_workers(api_port=g.cluster.ports["apiserver"], redis_url=g.redis_url,
                               stream=STREAM, replicas=REPLICAS, command=LIGHT_WORKER,
                               small_requests=True, path=INJECTED_EXAMPLE)
        for d in docs:
            d["metadata"]["namespace"] = g.namespace
            if d["kind"] != "Deployment":
                continue
            template = d["spec"]["template"]
            assert not any(c["name"] == "kgroup-sidecar" for c in template["spec"]["containers"])
            template["metadata"].setdefault("annotations", {})[
                "sidecar.kgroup.dev/audit-volume"] = AUDIT_VOLUME
            template["spec"]["volumes"].append({"name": AUDIT_VOLUME, "hostPath": {
                "path": str(g.audit), "type": "Directory"}})
            for c in template["spec"]["containers"]:
                c["image"] = f"{c['image'].rpartition(':')[0]}:{OLD_TAG}"
        return docs

    def injector_settings(self) -> list[str]:
        """helm arguments: the injector on, called at 127.0.0.1 (the operator's pod IP on
        the real node) and sent only the workers' namespace."""
        port = free_port()
        return ["--set", "injector.enabled=true", "--set", f"injector.port={port}",
                "--set", f"injector.url=https://127.0.0.1:{port}/inject",
                "--set-string",
                f"injector.namespaceSelector.matchLabels.{MARK.replace('.', chr(92) + '.')}"
                f"={self.mark}"]

    def injector_ready(self) -> bool:
        """The injector's CA is in its webhook configuration and it injects: a dry-run pod
        with the label comes back with the sidecar."""
        g = self.group
        hooks: Any = client.AdmissionregistrationV1Api(g.api).list_mutating_webhook_configuration(
            label_selector=f"app.kubernetes.io/instance={g.release}")
        if not any(w.client_config.ca_bundle for h in hooks.items for w in h.webhooks or []):
            return False
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"probe-{secrets.token_hex(2)}",
                                         labels={"kgroup.dev/group": "orders"}),
            spec=client.V1PodSpec(containers=[client.V1Container(name="app", image="app")]))
        try:
            out: Any = g.core.create_namespaced_pod(g.namespace, pod, dry_run="All")
        except client.ApiException:
            return False
        return any(c.name == "kgroup-sidecar" for c in out.spec.init_containers or [])


def _restore_crd(cluster: Cluster) -> None:
    """This tree's CRD again (the session's `crd` fixture applied it; the old chart
    replaced it), whatever happened to the upgrade."""
    for f in sorted(CRD_DIR.glob("*.yaml")):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f),
                        check=False)


@pytest.fixture
def upgrade(cluster: Cluster, kube: client.ApiClient, crd: list[str]) -> Iterator[Upgrade]:
    """The previous release installed, its group Stable with events flowing."""
    ensure_on_node(cluster.state_dir)
    previous.ensure_on_node(cluster.state_dir, PREVIOUS)
    old = previous.tree(PREVIOUS)
    namespace = f"upgrade-{secrets.token_hex(3)}"
    mark = secrets.token_hex(4)
    with RedisServer() as server:
        g = RealGroup(cluster, kube, namespace, release=f"kgroup-{secrets.token_hex(2)}",
                      redis_url=f"redis://127.0.0.1:{server.port}/0",
                      audit=REPO / ".state" / "e2e" / namespace / "audit",
                      release_namespace=f"{namespace}-kgroup")
        w = Workers(g)
        up = Upgrade(w, old, mark)
        producer = threading.Thread(target=w.produce, daemon=True)
        try:
            g.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
                name=namespace, labels={MARK: mark})))
            g.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
                name=g.operator_namespace)))
            helm_install(cluster, release=g.release, namespace=g.operator_namespace,
                         workers=namespace, real_node=True, chart=old / "charts" / "kgroup",
                         values=old / "e2e" / "values-real-node.yaml",
                         settings=["--set", f"operator.image.tag={OLD_TAG}"])
            assert g.audit is not None
            g.audit.mkdir(parents=True, exist_ok=True)
            g.audit.chmod(0o1777)
            group = example_group(redis_url=g.redis_url, stream=STREAM, partitions=PARTITIONS,
                                  path=old / "examples" / "consumergroup.yaml", **FAST)
            group["metadata"]["namespace"] = namespace
            apply(cluster, [group, *up.old_docs()])
            w.producing.set()
            producer.start()
            g.wait_settled(REPLICAS, timeout=TIMEOUT)
            yield up
        finally:
            w.producing.clear()
            if producer.is_alive():
                producer.join(timeout=60)
            g.uninstall()
            g.delete_namespace()
            _restore_crd(cluster)


def _images(g: RealGroup) -> dict[str, str]:
    """Each live worker pod's sidecar image."""
    return {p.metadata.name: next(c.image for c in p.spec.init_containers
                                  if c.name == "kgroup-sidecar") for p in g.pods()}


def _operator_image(g: RealGroup) -> set[str]:
    return {c.image for p in g.operator_ready() for c in p.spec.containers}


def _mixed(intervals: list[Interval], old: set[str], t0: float, t1: float) -> float:
    """The longest time in [t0, t1] during which one old sidecar and one new sidecar
    (members not in `old`) both held a partition (0: never at once)."""
    olds = [iv for iv in intervals if iv.member in old]
    news = [iv for iv in intervals if iv.member not in old]
    best = 0.0
    for a in olds:
        for b in news:
            best = max(best, min(a.end, b.end, t1) - max(a.start, b.start, t0))
    return best


def _acquired(records: list[dict[str, Any]], t0: float, t1: float) -> dict[int, str]:
    """Partition -> the member whose acquisition of it came last in [t0, t1)."""
    return {r["partition"]: r["member"] for r in sorted(records, key=lambda r: r["mono"])
            if r["event"] == "acquire" and t0 <= r["mono"] < t1}


def test_an_upgrade_from_the_previous_release_loses_nothing_and_moves_each_partition_once(
        upgrade: Upgrade) -> None:
    g, w = upgrade.group, upgrade.workers
    old_image = f"ghcr.io/kgroup/kgroup-sidecar:{OLD_TAG}"
    assert set(_images(g).values()) == {old_image}
    old_pods = set(_images(g))

    # 1. the chart: CRD, operator, injector and policies of this tree; the old sidecars go on
    started = time.monotonic()
    helm_install(g.cluster, release=g.release, namespace=g.operator_namespace,
                 workers=g.namespace, real_node=True, settings=upgrade.injector_settings())
    new_operator = f"ghcr.io/kgroup/kgroup-operator:{VERSION}"
    wait_for("this release's operator Ready", lambda: _operator_image(g) == {new_operator},
             timeout=TIMEOUT)
    wait_for("the injector injecting", upgrade.injector_ready, timeout=TIMEOUT)
    g.wait_settled(REPLICAS, timeout=TIMEOUT)
    now = time.monotonic()
    chart = handoff_figures(ownership_intervals(w.audit(), now=now), PARTITIONS, started, now)

    # 2. the previous release's sidecars still acquire under the new operator and policies:
    # one worker fewer (its partitions go to the other two), then one more (it takes its
    # share), all of the previous release
    t_down = time.monotonic()
    before = g.holders()
    g.kubectl("scale", f"deployment/{APP}", f"--replicas={REPLICAS - 1}")
    g.wait_settled(REPLICAS - 1, timeout=TIMEOUT)
    (removed,) = old_pods - set(_images(g))
    t_up = time.monotonic()
    g.kubectl("scale", f"deployment/{APP}", f"--replicas={REPLICAS}")
    g.wait_settled(REPLICAS, timeout=TIMEOUT)
    (added,) = set(_images(g)) - old_pods
    assert set(_images(g).values()) == {old_image}
    old_pods |= {added}
    t0 = time.monotonic()
    audit = w.audit()
    down, up = _acquired(audit, t_down, t_up), _acquired(audit, t_up, t0)
    assert sorted(down) == sorted(p for p, h in before.items() if h == removed), down
    assert set(down.values()) <= old_pods - {removed}, down
    assert up and set(up.values()) == {added}, up

    # 3. the workers roll to this release's sidecar through the label alone, the app's
    # image unchanged
    apply(g.cluster, upgrade.injected_docs())
    g.kubectl("rollout", "status", f"deployment/{APP}", "--timeout=300s", timeout=320)
    status = g.wait_settled(REPLICAS, timeout=TIMEOUT)
    t1 = time.monotonic()
    assert set(_images(g).values()) == {f"ghcr.io/kgroup/kgroup-sidecar:{VERSION}"}
    assert all(p.metadata.annotations.get("sidecar.kgroup.dev/injected") for p in g.pods())
    assert not set(status["assignment"]) & old_pods

    audit = w.audit()
    intervals = ownership_intervals(audit, now=t1)
    rollout = handoff_figures(intervals, PARTITIONS, t0, t1)
    whole = handoff_figures(intervals, PARTITIONS, started, t1)
    mixed = _mixed(intervals, old_pods, t0, t1)
    fences = [r for r in audit if r["event"] == "fence"]
    print(f"upgrade {OLD_TAG} -> {VERSION}, {REPLICAS} workers x {PARTITIONS} "
          f"partitions: chart upgrade {chart} in {t_down - started:.1f} s; the previous "
          f"release's sidecars acquired {len(down)} (scale down) and {len(up)} (scale up) "
          f"under it; rollout {rollout} in {t1 - t0:.1f} s, both versions holding "
          f"partitions for {mixed:.1f} s of it; the whole upgrade {whole}; {len(fences)} "
          f"fences; {t1 - started:.1f} s from the chart upgrade to the last pod rolled")
    assert fences == [], fences[:3]
    assert chart["moves"] == 0 and chart["max_unowned"] == 0, chart
    assert rollout["moves_per_partition"] <= MAX_MOVES_PER_PARTITION, rollout
    assert whole["longest_pause_s"] <= ONE_HANDOFF, whole
    assert mixed > 0, "no moment with sidecars of both versions holding partitions"
    w.check_clean()
