"""Per-partition health end to end, and ``kgroup status``, on the real API server: a real
operator process, real sidecar processes (one per kwok pod), the app's reports through the
client, the CLI as a subprocess with ``--kubeconfig``."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_harness import GROUP
from test_operator import (
    get_status,
    make_group,
    make_pods,
    operator,
    patch_spec,
    status_where,
    stays,
)

from kgroup.client import Report, SidecarClient
from kgroup_devcluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for
from kgroup_testing.sidecar_harness import SidecarProcess

__all__ = ["operator"]
pytestmark = pytest.mark.cluster
KGROUP = Path(sys.executable).with_name("kgroup")
PODS = ("w-0", "w-1")


@pytest.fixture
def sidecars(cluster: Cluster, kube: client.ApiClient, operator: Any, namespace: str,
             tmp_path: Path) -> Iterator[dict[str, SidecarProcess]]:
    make_group(kube, namespace, partitions=6)
    make_pods(kube, namespace, *PODS)
    procs = {p: SidecarProcess(p, GROUP, namespace, str(cluster.kubeconfig), tmp_path).start()
             for p in PODS}
    try:
        yield procs
    finally:
        for sc in procs.values():
            sc.stop()
    for sc in procs.values():
        assert "Traceback" not in sc.log_text(), sc.log_text()[-4000:]


def kgroup_status(cluster: Cluster, namespace: str, *args: str) -> str:
    out = subprocess.run([str(KGROUP), "status", GROUP, "-n", namespace, "--kubeconfig",
                          str(cluster.kubeconfig), *args],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def condition(status: dict[str, Any], ctype: str) -> tuple[str, str]:
    c: dict[str, Any] = next(
        (c for c in status.get("conditions") or [] if c["type"] == ctype), {})
    return c.get("status", ""), c.get("reason", "")


def writes(sc: SidecarProcess) -> float:
    conn = SidecarClient(sc.url).address.connection(5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("kgroup_sidecar_api_writes_total{"))


def test_a_stalled_partition_reaches_the_status_an_event_and_the_cli(
        cluster: Cluster, kube: client.ApiClient, namespace: str,
        sidecars: dict[str, SidecarProcess]) -> None:
    status_where(kube, namespace, "Ready", lambda s: condition(s, "Ready")[0] == "True",
                 timeout=60)
    view = json.loads(kgroup_status(cluster, namespace, "-o", "json"))
    assert [r["state"] for r in view["partitions"]] == ["active"] * 6
    assert {r["owner"] for r in view["partitions"]} == set(PODS)
    assert all(r["token"] >= 1 for r in view["partitions"])
    assert sorted((m["name"], m["assigned"], m["owned"]) for m in view["members"]) == [
        ("w-0", 3, 3), ("w-1", 3, 3)]

    c = SidecarClient(sidecars["w-0"].url)
    held = c.assignment().partitions
    stuck = held[0]
    before = writes(sidecars["w-0"])
    t0 = time.monotonic()
    for i in range(200):  # traffic: 200 reports in a few seconds
        answer = c.report_health([
            Report(p.partition, p.token, f"{i}-0", lag=100 - p.partition,
                   stalled=p is stuck, reason="sink refused token" if p is stuck else "")
            for p in held])
        assert answer["accepted"] == len(held)
    st = status_where(kube, namespace, "Stalled",
                      lambda s: condition(s, "Stalled")[0] == "True", timeout=30)
    seconds = time.monotonic() - t0
    # the reports rode on the renewals (1 s apart): no write per report
    assert writes(sidecars["w-0"]) - before <= seconds / 1.0 + 2
    assert st["stalled"] == 1 and st["stalledPartitions"] == str(stuck.partition)
    assert condition(st, "Ready") == ("False", "PartitionsStalled")
    assert st["phase"] == "Degraded"
    events: Any = client.CoreV1Api(kube).list_namespaced_event(namespace)
    warnings = [e for e in events.items if e.reason == "PartitionsStalled"]
    assert warnings and warnings[0].type == "Warning"
    assert "w-0" in warnings[0].message and "sink refused token" in warnings[0].message

    # The stall reaches the status with the renewal that first carried it, whose position
    # may be an earlier report's; the last report (199-0) arrives with a later renewal.
    want = [str(stuck.partition), "w-0", "stalled", str(stuck.token), "199-0",
            str(100 - stuck.partition)]
    rows: list[list[str]] = []

    def last_report_shown() -> str:
        table = kgroup_status(cluster, namespace)
        rows.append(next(line.split() for line in table.splitlines()
                         if line.split()[:1] == [str(stuck.partition)]))
        return table if rows[-1] == want else ""
    table = wait_for("the stalled row with the last report", last_report_shown, timeout=15,
                     interval=0.5)
    assert all(row[:4] == want[:4] for row in rows)  # stalled, held by w-0, from the start
    assert ["Stalled", "True", "PartitionsStalled"] in [
        line.split()[:3] for line in table.splitlines()]
    print(table)

    c.report_health([Report(p.partition, p.token, "200-0", lag=0) for p in held])
    status_where(kube, namespace, "Ready again",
                 lambda s: condition(s, "Ready")[0] == "True" and s.get("stalled") == 0,
                 timeout=30)
    assert condition(get_status(kube, namespace), "Stalled") == ("False", "Progressing")


def test_status_cli_refuses_an_unknown_group_and_context(
        cluster: Cluster, namespace: str, crd: list[str]) -> None:
    out = subprocess.run([str(KGROUP), "status", "nope", "-n", namespace, "--kubeconfig",
                          str(cluster.kubeconfig)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip() == (f'kgroup status: error: consumergroup "nope" not found in '
                                  f'namespace "{namespace}"')
    # the same through kubectl's plugin mechanism (kubectl-kgroup on PATH)
    env = {**os.environ, "PATH": f"{KGROUP.parent}:{os.environ.get('PATH', '')}",
           "KUBECONFIG": str(cluster.kubeconfig)}
    out = subprocess.run([str(cluster.bin_dir / "kubectl"), "kgroup", "status", "nope", "-n",
                          namespace], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1 and "consumergroup \"nope\" not found" in out.stderr
    out = subprocess.run([str(KGROUP), "status", GROUP, "--context", "elsewhere",
                          "--kubeconfig", str(cluster.kubeconfig)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "context 'elsewhere' is not in the kubeconfig" in out.stderr


def test_status_watch_prints_again_when_the_group_changes(
        cluster: Cluster, kube: client.ApiClient, namespace: str,
        sidecars: dict[str, SidecarProcess]) -> None:
    status_where(kube, namespace, "Ready", lambda s: condition(s, "Ready")[0] == "True",
                 timeout=60)
    proc = subprocess.Popen([str(KGROUP), "status", GROUP, "-n", namespace, "--kubeconfig",
                             str(cluster.kubeconfig), "--watch", "--interval", "0.5",
                             "-o", "json"], stdout=subprocess.PIPE, text=True)
    views: list[dict[str, Any]] = []

    def read() -> None:
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line)
            if line == "}\n":  # the end of one pretty-printed document
                views.append(json.loads("".join(lines)))
                lines = []

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for("a first view", lambda: views, timeout=30)
        assert {r["owner"] for r in views[0]["partitions"]} == set(PODS)
        sidecars["w-1"].terminate()  # w-1 leaves: its partitions move to w-0
        wait_for("a view where w-0 owns everything", lambda: any(
            all(r["owner"] == "w-0" and r["state"] == "active" for r in v["partitions"])
            for v in views), timeout=60)
        assert len(views) >= 2 and all(a != b for a, b in itertools.pairwise(views))
    finally:
        proc.terminate()
        proc.wait(10)


def test_load_reports_ride_the_renewals_into_the_status_the_column_and_the_cli(
        cluster: Cluster, kube: client.ApiClient, namespace: str, operator: Any,
        sidecars: dict[str, SidecarProcess]) -> None:
    status_where(kube, namespace, "Ready", lambda s: condition(s, "Ready")[0] == "True",
                 timeout=60)
    assert "load" not in get_status(kube, namespace)  # no rate reported: no figures
    rates = {"w-0": 10.0, "w-1": 30.0}  # events/s per partition
    lags = {"w-0": 0, "w-1": 2000}  # w-1 is behind: 6,000 events, > 10 s of its 90/s
    clients = {pod: SidecarClient(sc.url) for pod, sc in sidecars.items()}
    held = {pod: c.assignment().partitions for pod, c in clients.items()}
    before = {pod: writes(sc) for pod, sc in sidecars.items()}
    t0 = time.monotonic()
    def report() -> None:
        for pod, c in clients.items():
            answer = c.report_health([Report(p.partition, p.token, "1-0", lag=lags[pod],
                                             rate=rates[pod]) for p in held[pod]])
            assert answer["accepted"] == 3

    for _ in range(50):  # traffic: 50 reports per member
        report()
    status_where(kube, namespace, "status.load",
                 lambda s: (s.get("load") or {}).get("rate") == 120.0, timeout=30)
    seconds = time.monotonic() - t0
    for pod, sc in sidecars.items():  # the reports rode on the renewals (1 s apart)
        assert writes(sc) - before[pod] <= seconds / 1.0 + 2

    def recommended(s: dict[str, Any]) -> bool:
        report()  # the app goes on reporting, as a working one does
        return (s.get("load") or {}).get("recommendedMembers") is not None

    # a member behind and no earlier reading: whether its lag grows is measured against
    # the next reading (30 s later); until then the group recommends nothing
    st = status_where(kube, namespace, "status.load.recommendedMembers", recommended,
                      timeout=75)
    load = st["load"]
    assert load["lag"] == 6000 and load["busiestOverMean"] == 1.5 and load["bound"] == 1.0
    # 120/s + 6,000 / 300 s = 140/s at 90/s (w-1 is behind: its rate is its capacity)
    assert load["recommendedMembers"] == 2 and load["measuredAt"].endswith("Z")
    assert {m["name"]: m["load"] for m in st["members"]} == {"w-0": 30.0, "w-1": 90.0}
    lease: Any = client.CoordinationV1Api(kube).read_namespaced_lease(
        f"{GROUP}-member-w-1", namespace)
    carried = json.loads(lease.metadata.annotations["kgroup.dev/load"])
    assert carried["rate"] == 90.0 and carried["lag"] == 6000

    # catch up within 30 s instead: 320/s; 4 or 5 members leave one with 2 of the 6
    # partitions (107/s > 90), so 6
    patch_spec(kube, namespace, {"sizing": {"catchUpSeconds": 30}})
    st = status_where(kube, namespace, "recommendation for 30 s",
                      lambda s: (s.get("load") or {}).get("recommendedMembers") == 6,
                      timeout=30)
    out = subprocess.run([str(cluster.bin_dir / "kubectl"), "--kubeconfig",
                          str(cluster.kubeconfig), "get", "cg", GROUP, "-n", namespace],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    header, row = out.splitlines()[:2]
    assert row.split()[header.split().index("RECOMMENDED")] == "6"
    wait_for("the operator's gauge", lambda: operator.metric("kgroup_recommended_members") == 6,
             timeout=10)
    assert operator.metric("kgroup_load_lag_events") == 6000
    table = kgroup_status(cluster, namespace)
    assert "recommended members 6" in table
    assert re.search(r"Load: 120(\.0)? events/s, lag 6000", table), table


def test_load_mode_moves_the_cold_partitions_off_the_hot_member_and_then_rests(
        kube: client.ApiClient, namespace: str, sidecars: dict[str, SidecarProcess]) -> None:
    st = status_where(kube, namespace, "Ready", lambda s: condition(s, "Ready")[0] == "True",
                      timeout=60)
    assert st["assignment"] == {"w-0": "0-2", "w-1": "3-5"}
    epoch = st["epoch"]
    patch_spec(kube, namespace, {"balance": {"mode": "load"}})
    hot = {0: 30.0}  # partition 0 carries 30/s, every other one 1/s: w-0 32, w-1 3
    for sc in sidecars.values():
        c = SidecarClient(sc.url)
        c.report_health([Report(p.partition, p.token, "1-0", lag=0,
                                rate=hot.get(p.partition, 1.0))
                         for p in c.assignment().partitions])
    st = status_where(kube, namespace, "a load rebalance, held and acknowledged",
                      lambda s: s.get("epoch", 0) > epoch
                      and condition(s, "Ready")[0] == "True", timeout=60)
    assert st["lastRebalance"]["reason"] == "load: busiest member 1.83x the mean, 1.71x after"
    # the hot partition stays; the cold ones went through the revoke-before-assign hand-off
    assert st["assignment"] == {"w-0": "0", "w-1": "1-5"}
    assert st["epoch"] == epoch + 1
    assert st["load"]["bound"] == pytest.approx(1.714, abs=1e-3)
    # one more refresh of the figures (30 s): nothing moves (w-0 alone is the bound)
    stays("no further rebalance",
          lambda: get_status(kube, namespace).get("epoch") == epoch + 1, seconds=35)
