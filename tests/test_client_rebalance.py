"""The app client's rebalance listener, shutdown helper, health reports and async session,
against a real sidecar HTTP server fed by a scripted core (tests/test_client.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kgroup.client import (
    AsyncSidecarClient,
    Rebalance,
    Report,
    SidecarClient,
)
from kgroup.rebalance import after_release_error
from tests.test_client import Scripted, raw, scripted, wait

__all__ = ["scripted"]


def test_the_listener_is_called_once_per_rebalance_with_every_partition(
        scripted: Scripted) -> None:
    scripted.set(target=[0, 1, 2], epoch=1)
    c = SidecarClient(scripted.url)
    calls: list[Rebalance] = []
    stop = threading.Event()

    def on_rebalance(change: Rebalance) -> None:
        calls.append(change)
        for p in change.revoked:
            c.release(p.partition, p.token, f"pos-{p.partition}")

    # the sidecar takes the three locks before the listener starts: one call with all three
    wait("held", lambda: len(c.assignment().partitions) == 3)
    t = threading.Thread(target=c.listen, args=(on_rebalance,),
                         kwargs={"stop": stop, "wait": 1.0}, daemon=True)
    t.start()
    wait("first call", lambda: calls)
    assert [p.partition for p in calls[0].assigned] == [0, 1, 2]
    assert calls[0].revoked == () and calls[0].lost == ()
    scripted.set(target=[0], epoch=2)
    wait("released", lambda: scripted.released.get(1) == "pos-1"
         and scripted.released.get(2) == "pos-2")
    stop.set()
    t.join(5)
    revoking = [c for c in calls if c.revoked]
    assert len(revoking) == 1 and [p.partition for p in revoking[0].revoked] == [1, 2]


def test_release_all_gives_everything_back_with_the_apps_positions(
        scripted: Scripted) -> None:
    scripted.set(target=[0, 1, 3], epoch=1)
    c = SidecarClient(scripted.url)
    wait("held", lambda: len(c.assignment().partitions) == 3)
    out = c.release_all({0: "10-0", 3: "30-0"})
    assert out == {0: True, 1: True, 3: True}
    assert scripted.released == {0: "10-0", 1: None, 3: "30-0"}  # 1: its handed-over one


@pytest.mark.parametrize(("status", "now", "outcome"), [
    (404, 0.0, "lost"), (409, 0.0, "lost"), (404, 99.0, "lost"),  # lost: done, no retry
    (503, 0.0, "retry"), (0, 9.9, "retry"),  # not released yet / unreachable: again
    (503, 10.0, "raise"), (0, 11.0, "raise"),  # ... until the deadline
    (400, 0.0, "raise"), (500, 0.0, "raise"),  # anything else stands at once
])
def test_release_all_retries_only_the_not_yet_released_until_the_deadline(
        status: int, now: float, outcome: str) -> None:
    assert after_release_error(status, now=now, deadline=10.0) == outcome


def test_health_reports_reach_the_metrics_and_the_summary(scripted: Scripted) -> None:
    scripted.set(target=[0, 1], epoch=1)
    c = SidecarClient(scripted.url)
    a = wait("held", lambda: (v := c.assignment()) and len(v.partitions) == 2 and v)
    t0, t1 = (p.token for p in a.partitions)
    answer = c.report_health([Report(0, t0, "5-0", lag=12),
                              Report(1, t1, "7-0", lag=0, stalled=True,
                                     reason="sink refused token"),
                              Report(3, 1, "1-0", lag=1)])
    assert answer["accepted"] == 2
    assert answer["refused"] == [{"partition": 3,
                                  "error": "partition 3 is not held by this member"}]
    status, text = raw(scripted, "/metrics")
    assert status == 200
    st = scripted.sc.settings
    who = {"group_namespace": st.namespace, "group": st.group, "member": st.pod_name}
    samples = {(smp.name, smp.labels["partition"]): smp.value
               for fam in text_string_to_metric_families(text) for smp in fam.samples
               if smp.name.startswith("kgroup_sidecar_partition_")
               and {k: smp.labels.get(k) for k in who} == who}
    assert samples[("kgroup_sidecar_partition_lag", "0")] == 12.0
    assert samples[("kgroup_sidecar_partition_stalled", "1")] == 1.0
    assert samples[("kgroup_sidecar_partition_stalled", "0")] == 0.0
    assert scripted.sc.health.summary() == (
        '{"lag":12,"partitions":{"0":[12,"5-0"],"1":[0,"7-0"]},'
        '"reason":"sink refused token","stalled":"1","stalledCount":1}')
    status, body = raw(scripted, "/v1/health", "POST", b'{"partitions": [{"partition": 0}]}')
    assert status == 400 and "token must be an integer" in body["error"]


def test_the_async_client_uses_one_session_and_reports_rebalances(scripted: Scripted) -> None:
    scripted.set(target=[2], epoch=1)

    async def scenario() -> tuple[int, list[Rebalance], dict[int, bool]]:
        async with AsyncSidecarClient(scripted.url) as c:
            calls: list[Rebalance] = []
            stop = asyncio.Event()

            async def on_rebalance(change: Rebalance) -> None:
                calls.append(change)
                stop.set()

            await c.listen(on_rebalance, stop=stop, wait=1.0)
            for _ in range(5):
                await c.assignment()
            a = await c.assignment()
            await c.report_health([Report(p.partition, p.token, None, 3) for p in a.partitions])
            released = await c.release_all({2: "2-2"})
            return c.sessions_opened, calls, released

    opened, calls, released = asyncio.run(scenario())
    assert opened == 1
    assert [p.partition for p in calls[0].assigned] == [2]
    assert released == {2: True} and scripted.released[2] == "2-2"


def test_the_listener_reports_partitions_lost_when_the_promise_runs_out(
        scripted: Scripted) -> None:
    scripted.set(target=[0], epoch=1)
    c = SidecarClient(scripted.url)
    calls: list[Any] = []
    stop = threading.Event()
    t = threading.Thread(target=c.listen, args=(calls.append,),
                         kwargs={"stop": stop, "wait": 1.0}, daemon=True)
    t.start()
    wait("assigned", lambda: calls)
    scripted.renewals_fail = True
    wait("lost", lambda: any(ch.lost for ch in calls))
    stop.set()
    t.join(5)
    assert [p.partition for ch in calls for p in ch.lost] == [0]
