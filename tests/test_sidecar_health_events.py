"""The sidecar's stall Event: posted once when a held partition turns stalled, again only
after it recovered and stalled anew (``kgroup_sidecar.health.SidecarHealth.on_stalled``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from kgroup.core.health import PartitionHealth, Report
from kgroup_sidecar.health import SidecarHealth


def test_a_stall_is_announced_once_per_stall() -> None:
    held = {0: 7, 1: 7}
    now = [0.0]
    health = SidecarHealth(identity=("ns", "g", "w-0"), held=lambda: held,
                           clock=lambda: now[0], stall_after=120,
                           registry=CollectorRegistry())
    seen: list[PartitionHealth] = []
    health.on_stalled = seen.append

    def report(partition: int, stalled: bool) -> None:
        assert health.book.report(Report(partition, 7, "1-0", lag=5, stalled=stalled,
                                         reason="sink refused token 7"), held, now[0]) is None

    report(0, False)
    health.summary()
    assert seen == []
    report(0, True)
    report(1, True)
    health.summary()
    health.summary()  # still stalled: no second Event
    assert [(h.partition, h.reason) for h in seen] == [(0, "sink refused token 7"),
                                                       (1, "sink refused token 7")]
    report(0, False)
    health.summary()
    report(0, True)
    health.summary()
    assert [h.partition for h in seen] == [0, 1, 0]
