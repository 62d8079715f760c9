"""The pipeline's health report: lag from the stream and the fenced sink, a stall when the
sink refuses the token (real redis-server, no cluster)."""

from __future__ import annotations

import redis
from pipeline_fixtures import rclient, redis_url, stream

from kgroup.core.health import Report
from kgroup_pipeline.fencing import FencedStore
from kgroup_pipeline.health import HealthReporter, smoothed_rate
from kgroup_pipeline.light_worker import LightWorker
from kgroup_pipeline.ownership import OwnedPartition, StaticOwnership
from kgroup_pipeline.producer import produce

__all__ = ["rclient", "redis_url", "stream"]
PARTS = 4


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lag_is_what_the_stream_holds_beyond_what_the_sink_committed(
        rclient: redis.Redis, stream: str) -> None:
    produce(rclient, stream=stream, partitions=PARTS, count=2000, keys=50, bad_every=97, seed=3)
    sent: list[list[Report]] = []
    clock = Clock()
    worker = LightWorker(client=rclient, stream=stream,
                         ownership=StaticOwnership(list(range(PARTS))), max_rows=400)
    worker.health = HealthReporter(worker.store, sent.append, every=2.0, clock=clock)
    lengths = {p: int(rclient.xlen(worker.store.keys.partition(p))) for p in range(PARTS)}
    worker.run_once()  # 100 rows per partition committed, then the lag reported
    first = {r.partition: r for r in sent[0]}
    assert {p: r.lag for p, r in first.items()} == {p: n - 100 for p, n in lengths.items()}
    assert all(not r.stalled and r.token == 1 for r in first.values())
    assert all(r.rate is None for r in first.values())  # one count: no rate yet
    worker.run_once()
    assert len(sent) == 1  # at most one report per 2 s
    clock.now = 2.0
    worker.run_once()
    second = {r.partition: r for r in sent[1]}
    assert {p: r.lag for p, r in second.items()} == {p: n - 300 for p, n in lengths.items()}
    assert all(r.position not in (None, "0-0") for r in second.values())
    # 200 more committed per partition in the 2 s since the first count
    assert {p: r.rate for p, r in second.items()} == {p: 100.0 for p in range(PARTS)}
    while any(r.lag for r in sent[-1]):
        clock.now += 2.0
        worker.run_once()
    assert [r.lag for r in sent[-1]] == [0] * PARTS  # caught up: dead letters count as done


def test_a_token_refused_by_the_fenced_sink_is_reported_stalled_at_once(
        rclient: redis.Redis, stream: str) -> None:
    produce(rclient, stream=stream, partitions=PARTS, count=200, keys=10, seed=4)
    store = FencedStore(rclient, stream)
    store.plan([OwnedPartition(1, 5)], max_rows=10)  # a member under token 5 was here
    sent: list[list[Report]] = []
    clock = Clock()
    reporter = HealthReporter(store, sent.append, every=60.0, clock=clock)
    reporter.observe(store.plan([OwnedPartition(0, 3)], max_rows=10))
    assert [r.stalled for r in sent[0]] == [False]
    plans = store.plan([OwnedPartition(0, 3), OwnedPartition(1, 3)], max_rows=10)
    assert [p.status for p in plans] == ["ok", "fenced"]
    reporter.observe(plans)  # not due for 60 s, but a new stall is sent now
    assert [(r.partition, r.stalled) for r in sent[1]] == [(0, False), (1, True)]
    assert sent[1][1].reason == "the fenced sink refused token 3: it holds a newer one"
    reporter.observe(plans)
    assert len(sent) == 2  # the same stall is not sent again before it is due


def test_the_rate_is_smoothed_over_about_the_window() -> None:
    assert smoothed_rate(None, 50, 2.0) == 25.0
    assert smoothed_rate(10.0, 0, 0.5, window=30.0) < 10.0  # a quiet moment lowers it a bit
    assert smoothed_rate(10.0, 0, 0.5, window=30.0) > 9.8
    steady = 0.0
    for _ in range(60):  # a step to 100/s, counted every second for a minute
        steady = smoothed_rate(steady, 100, 1.0, window=30.0)
    assert 85.0 < steady < 87.0  # 1 - e^-2 of the step after two time constants
