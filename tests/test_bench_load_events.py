"""The event side of bench/bench_load.py (bench/load_stream.py) on a real redis-server: the
feed writes each partition's rate, the backlog is what is not committed yet, and the
bench's verification step is the verifier's count, so a sink entry deleted or doubled
shows as lost or duplicated (no cluster: a light worker with static ownership consumes)."""

from __future__ import annotations

import sys
from pathlib import Path

import redis
from pipeline_fixtures import rclient, redis_url, stream

from kgroup_pipeline.keys import StreamKeys
from kgroup_pipeline.light_worker import LightWorker
from kgroup_pipeline.ownership import StaticOwnership

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from load_stream import Feed, backlog, verification

__all__ = ["rclient", "redis_url", "stream"]
PARTS = 8
RATES = [40.0, 20.0, 10.0, 5.0, 2.5, 1.25, 0.5, 0.0]


def fed(client: redis.Redis, stream: str) -> Feed:
    feed = Feed(client, PARTS, lambda: RATES, seed=3, stream=stream)
    for _ in range(8):
        feed.step(0.25)  # two seconds of input
    return feed


def consume(client: redis.Redis, stream: str) -> None:
    worker = LightWorker(client=client, stream=stream, ownership=StaticOwnership(
        list(range(PARTS))))
    worker.run_once()


def test_the_feed_writes_each_partitions_rate_with_its_ledger(
        rclient: redis.Redis, stream: str) -> None:
    feed = fed(rclient, stream)
    keys = StreamKeys(stream)
    per = {int(p): int(n) for p, n in rclient.hgetall(keys.produced_count).items()}
    assert per == {p: int(2 * r) for p, r in enumerate(RATES) if int(2 * r)}
    assert feed.produced == sum(per.values()) == rclient.xlen(keys.partition(0)) + sum(
        rclient.xlen(keys.partition(p)) for p in range(1, PARTS))
    assert backlog(rclient, PARTS, stream) == feed.produced
    consume(rclient, stream)
    assert backlog(rclient, PARTS, stream) == 0


def test_the_verification_step_counts_everything_produced_and_finds_nothing_wrong(
        rclient: redis.Redis, stream: str) -> None:
    feed = fed(rclient, stream)
    consume(rclient, stream)
    out = verification(rclient, wait=5, stream=stream)
    assert out["produced"] == out["verified"] == feed.produced > 150
    assert out["lost"] == out["duplicated"] == out["pending"] == 0
    assert out["caught_up"] and out["clean"]


def test_a_doubled_sink_entry_is_reported_duplicated(rclient: redis.Redis, stream: str) -> None:
    fed(rclient, stream)
    consume(rclient, stream)
    sink = StreamKeys(stream).sink_count(0)
    key = next(iter(rclient.hgetall(sink)))
    rclient.hincrby(sink, key, 1)
    out = verification(rclient, wait=5, stream=stream)
    assert out["duplicated"] == 1 and out["lost"] == 0 and out["keys_duplicated"] == 1
    assert not out["clean"]


def test_a_deleted_sink_entry_is_reported_lost(rclient: redis.Redis, stream: str) -> None:
    fed(rclient, stream)
    consume(rclient, stream)
    sink = StreamKeys(stream).sink_count(1)
    key, count = next(iter(rclient.hgetall(sink).items()))
    rclient.hdel(sink, key)
    out = verification(rclient, wait=5, stream=stream)
    assert out["lost"] == int(count) > 0 and out["duplicated"] == 0
    assert out["keys_lost"] == 1 and not out["clean"]


def test_events_never_consumed_are_pending_and_not_caught_up(
        rclient: redis.Redis, stream: str) -> None:
    feed = fed(rclient, stream)
    consume(rclient, stream)
    feed.step(1.0)  # more input, no consumer left
    out = verification(rclient, wait=1.5, stream=stream)
    assert out["pending"] == backlog(rclient, PARTS, stream) > 0
    assert not out["caught_up"] and out["lost"] == 0
