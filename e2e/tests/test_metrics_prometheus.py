"""Metrics, checked with Prometheus' own tools against real processes on the real API server.

A group of two members on kwok pods: a real ``kgroup-operator`` leader and a standby, and
two real ``kgroup-sidecar`` processes serving their metrics on their own loopback ports
(``KGROUP_METRICS_LISTEN``). Then:

- ``promtool check metrics`` on every endpoint: operator leader, operator standby, each
  sidecar's metrics port and its local API's ``/metrics``;
- a real Prometheus (Debian's ``prometheus``, scripts/setup.sh) on 127.0.0.1 with its own
  config and data directory, scraping all of them every second, and PromQL through its
  HTTP API: owned partitions per member, the fencing token per partition, leader/standby;
- log levels on the same processes: ``KGROUP_LOG_LEVEL=WARNING`` with
  ``KGROUP_LOG_FORMAT=json`` hides every INFO line of a sidecar and of an operator (which
  takes over as leader meanwhile) and writes only JSON objects.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from operator_harness import OperatorProcess

from kgroup import constants as C
from kgroup.client import Report, SidecarClient
from kgroup_devcluster.cluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for
from kgroup_testing.sidecar_harness import SidecarProcess

pytestmark = pytest.mark.cluster

GROUP = "orders"
PODS = ("w-0", "w-1")
PARTITIONS = 4
# urllib without any proxy from the environment: everything here is on 127.0.0.1
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> str:
    try:
        with OPENER.open(url, timeout=3) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: scripts/setup.sh installs Debian's prometheus",
                    pytrace=False)
    return found


def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), "check", "metrics"], input=text, text=True,
                          capture_output=True, check=False, timeout=60)


class Prometheus:
    """One prometheus server on 127.0.0.1:<free port>, config and TSDB under ``workdir``."""

    def __init__(self, workdir: Path, jobs: dict[str, list[str]]) -> None:
        self.port = free_port()
        self.workdir = workdir
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}
                               for job, targets in jobs.items()],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Prometheus:
        log = (self.workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [tool("prometheus"), f"--config.file={self.workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        wait_for("prometheus ready", lambda: get(f"http://127.0.0.1:{self.port}/-/ready") != "",
                 timeout=60)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = (f"http://127.0.0.1:{self.port}/api/v1/query?"
               + urllib.parse.urlencode({"query": promql}))
        body = json.loads(get(url) or '{"status": "unreachable"}')
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


def by_label(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {r["metric"][label]: float(r["value"][1]) for r in result}


def make_pods(core: client.CoreV1Api, namespace: str) -> dict[str, str]:
    """Kwok pods of the group (Running and Ready); their uids by name."""
    uids = {}
    for name in PODS:
        pod: Any = core.create_namespaced_pod(namespace, client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels={"app": GROUP}),
            spec=client.V1PodSpec(node_selector={"type": "kwok"}, containers=[
                client.V1Container(name="main", image="example.invalid/worker:1")])))
        uids[name] = str(pod.metadata.uid)

    def running() -> bool:
        pods: Any = core.list_namespaced_pod(namespace)
        return all(p.status.phase == "Running" for p in pods.items if p.metadata.name in PODS)

    wait_for("pods running", running, timeout=90)
    return uids


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def processes() -> Iterator[list[Any]]:
    started: list[Any] = []
    yield started
    for p in reversed(started):
        p.stop()


def test_promtool_and_prometheus_read_every_endpoint_and_log_levels_hold(
        cluster: Cluster, kube: client.ApiClient, crd: list[str], namespace: str,
        workdir: Path, processes: list[Any]) -> None:
    core = client.CoreV1Api(kube)
    uids = make_pods(core, namespace)
    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        C.API_GROUP, C.API_VERSION, namespace, C.PLURAL,
        {"apiVersion": f"{C.API_GROUP}/{C.API_VERSION}", "kind": C.KIND,
         "metadata": {"name": GROUP},
         "spec": {"partitions": PARTITIONS, "selector": {"matchLabels": {"app": GROUP}},
                  "lease": {"durationSeconds": 6, "renewIntervalSeconds": 2},
                  "stabilizationWindowSeconds": 1}})
    (workdir / "leader").mkdir()
    (workdir / "standby").mkdir()
    leader = OperatorProcess(cluster, namespace, workdir / "leader",
                             env={"KGROUP_LOG_FORMAT": "json"})
    leader.start()
    processes.append(leader)
    wait_for("the leader", lambda: "kgroup_operator_leader 1.0" in leader.metrics(), timeout=60)
    standby = OperatorProcess(cluster, namespace, workdir / "standby",
                              env={"KGROUP_LOG_LEVEL": "WARNING", "KGROUP_LOG_FORMAT": "json"})
    standby.start()
    processes.append(standby)
    wait_for("the standby's metrics", lambda: "kgroup_operator_leader 0.0" in standby.metrics(),
             timeout=60)

    sidecars = {}
    for pod in PODS:
        env = {"KGROUP_METRICS_LISTEN": f"127.0.0.1:{free_port()}", "KGROUP_POD_UID": uids[pod]}
        if pod == "w-1":
            env |= {"KGROUP_LOG_LEVEL": "WARNING", "KGROUP_LOG_FORMAT": "json"}
        sc = SidecarProcess(pod=pod, group=GROUP, namespace=namespace,
                            kubeconfig=str(cluster.kubeconfig), workdir=workdir, env=env)
        processes.append(sc.start())
        sidecars[pod] = (sc, f"http://{env['KGROUP_METRICS_LISTEN']}/metrics")

    def stable() -> bool:
        body: Any = client.CustomObjectsApi(kube).get_namespaced_custom_object(
            C.API_GROUP, C.API_VERSION, namespace, C.PLURAL, GROUP)
        st = body.get("status") or {}
        return st.get("phase") == "Stable" and st.get("unowned") == 0 \
            and set(st.get("assignment") or {}) == set(PODS)

    wait_for("a Stable group with every partition owned", stable, timeout=120)

    # 1. promtool on every endpoint of the real processes
    endpoints = {"operator leader": f"http://127.0.0.1:{leader.metrics_port}/metrics",
                 "operator standby": f"http://127.0.0.1:{standby.metrics_port}/metrics"}
    for pod, (sc, url) in sidecars.items():
        endpoints[f"sidecar {pod}"] = url
        endpoints[f"sidecar {pod} local API"] = f"{sc.url}/metrics"
    for what, url in endpoints.items():
        text = get(url)
        assert "# TYPE" in text, f"{what}: no exposition at {url}"
        checked = promtool_check(text)
        print(f"promtool check metrics ({what}): rc={checked.returncode} "
              f"{(checked.stdout + checked.stderr).strip() or 'no problems'}")
        assert checked.returncode == 0, f"{what}: {checked.stdout}{checked.stderr}"

    # 2. a real Prometheus scraping them all
    prom_dir = workdir / "prometheus"
    prom_dir.mkdir()
    prom = Prometheus(prom_dir, {
        "kgroup-operator": [f"127.0.0.1:{leader.metrics_port}",
                            f"127.0.0.1:{standby.metrics_port}"],
        "kgroup-sidecar": [url.split("/")[2] for _, url in sidecars.values()],
    }).start()
    processes.append(prom)
    wait_for("every target up", lambda: sorted(
        float(r["value"][1]) for r in prom.query("up")) == [1.0] * 4, timeout=60)
    owned_q = (f'count by (member) (kgroup_sidecar_partition_token{{group="{GROUP}",'
               f'group_namespace="{namespace}"}})')
    wait_for("owned partitions per member", lambda: sum(
        by_label(prom.query(owned_q), "member").values()) == PARTITIONS, timeout=30)
    owned = by_label(prom.query(owned_q), "member")
    print(f"PromQL {owned_q} -> {owned}")
    assert owned == {"w-0": 2.0, "w-1": 2.0}
    per_partition = prom.query(f'kgroup_sidecar_partition_token{{group="{GROUP}"}}')
    owners = {r["metric"]["partition"]: r["metric"]["member"] for r in per_partition}
    print(f"PromQL kgroup_sidecar_partition_token -> owner by partition {owners}")
    assert sorted(owners) == [str(p) for p in range(PARTITIONS)]
    # lag per partition, as the apps report it through the client (no API write)
    for sc, _ in sidecars.values():
        app = SidecarClient(sc.url)
        view = app.assignment()
        answer = app.report_health([Report(p.partition, p.token, None, lag=100 + p.partition)
                                    for p in view.partitions])
        assert answer["refused"] == [], answer
    lag_q = f'max by (partition) (kgroup_sidecar_partition_lag{{group="{GROUP}"}})'
    want = {str(p): 100.0 + p for p in range(PARTITIONS)}
    wait_for("lag per partition in Prometheus",
             lambda: by_label(prom.query(lag_q), "partition") == want, timeout=30)
    print(f"PromQL {lag_q} -> {by_label(prom.query(lag_q), 'partition')}")
    leaders = by_label(prom.query("kgroup_operator_leader"), "instance")
    assert leaders == {f"127.0.0.1:{leader.metrics_port}": 1.0,
                       f"127.0.0.1:{standby.metrics_port}": 0.0}
    members = prom.query(f'kgroup_members{{group="{GROUP}"}}')
    assert [(r["metric"]["instance"], r["value"][1]) for r in members] == [
        (f"127.0.0.1:{leader.metrics_port}", "2")]
    assert prom.query('process_resident_memory_bytes{job="kgroup-sidecar"}')

    # 3. log levels and formats on the same real processes; the standby takes over first,
    #    so its INFO lines ("leader Lease acquired", kopf's start-up) were really produced
    leader.stop()
    wait_for("the standby took over", lambda: standby.metric("kgroup_members") == 2,
             timeout=60)
    assert "kgroup_operator_leader 1.0" in standby.metrics()
    loud_operator = json_lines(leader.log_text())  # INFO, JSON: every line an object
    assert any(r["severity"] == "info" and "leader Lease" in r["message"]
               for r in loud_operator), loud_operator[:5]
    quiet_operator = json_lines(standby.log_text())
    assert all(r["severity"] not in {"debug", "info"} for r in quiet_operator), quiet_operator
    w0_log = sidecars["w-0"][0].log_file.read_text()
    assert " INFO kgroup_sidecar" in w0_log and "acquired partition" in w0_log
    quiet_sidecar = json_lines(sidecars["w-1"][0].log_file.read_text())
    assert all(r["severity"] not in {"debug", "info"} for r in quiet_sidecar), quiet_sidecar
    sys.stdout.write(f"standby JSON lines: {len(quiet_operator)}, "
                     f"w-1 JSON lines: {len(quiet_sidecar)}\n")
