"""The light worker's capacity (``--max-rate``): a throttled worker really falls behind,
shares its budget with the partitions that have a backlog, and still hands a revoked
partition over at once (real redis-server, no JVM)."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from pipeline_fixtures import rclient, redis_url, stream

from kgroup_pipeline.light_worker import LightWorker, Throttle, share
from kgroup_pipeline.ownership import StaticOwnership
from kgroup_pipeline.producer import EventWriter, produce
from kgroup_pipeline.scripted import ScriptedCoordinator
from kgroup_pipeline.verify import verify

__all__ = ["rclient", "redis_url", "stream"]


def test_share_is_even_gives_what_one_does_not_need_to_the_others_and_at_least_one() -> None:
    assert share([100, 100], 50) == [25, 25]
    assert share([3, 100, 0], 50) == [3, 47, 0]  # 3 is all the first has; none for nothing
    assert share([5, 5, 5], 100) == [5, 5, 5]  # never more than a partition has
    assert share([9, 9, 9, 9], 2) == [1, 1, 1, 1]  # each planned range is read
    assert share([], 10) == []


def test_the_throttle_waits_for_a_batch_holds_one_second_and_carries_debt() -> None:
    now = [0.0]
    t = Throttle(100.0, clock=lambda: now[0])
    assert t.batch == 10
    now[0] = 0.05
    assert t.available() == 0  # 5 tokens: less than a batch
    now[0] = 0.2
    assert t.available() == 20
    now[0] = 60.0
    assert t.available() == 100  # idle for a minute: one second's worth, no more
    t.spend(130)  # a batch took more than the bucket held
    now[0] = 60.2
    assert t.available() == 0  # -30 + 20: the debt is paid back first
    now[0] = 60.5
    assert t.available() == 20
    with pytest.raises(ValueError):
        Throttle(0.0)


def run_for(worker: LightWorker, seconds: float) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join(timeout=30)


def test_a_throttled_worker_processes_its_rate_mostly_from_the_partition_with_a_backlog(
        rclient: redis.Redis, stream: str) -> None:
    writer = EventWriter(rclient, stream=stream, partitions=4, seed=1)
    hot = [k for k in (f"k{i}" for i in range(200)) if writer.partition_of(k) == 0][:5]
    cold = [k for k in (f"k{i}" for i in range(200)) if writer.partition_of(k) == 1][:5]
    writer.write([hot[i % len(hot)] for i in range(3000)])
    writer.write([cold[i % len(cold)] for i in range(20)])
    worker = LightWorker(client=rclient, stream=stream,
                         ownership=StaticOwnership([0, 1, 2, 3]), max_rate=200.0)
    run_for(worker, 3.0)
    report = verify(rclient, stream)
    done = {p.partition: p.committed for p in report.partitions}
    # 3 s at 200/s, the bucket starting empty: about 600, never the 3,020 waiting
    assert 350 <= report.total("committed") <= 700, done
    assert done[1] == 20 and done[0] >= 330  # the cold one done, the rest to the hot one
    assert report.total("duplicated") == 0 and report.total("pending") > 2000
    # the next owner (token 2) resumes where it stopped, at full speed
    unthrottled = LightWorker(client=rclient, stream=stream,
                              ownership=StaticOwnership([0, 1, 2, 3], token=2))
    unthrottled.run_once()
    report = verify(rclient, stream)
    assert report.caught_up and report.clean and report.total("committed") == 3020


def test_a_throttled_worker_behind_hands_a_revoked_partition_over_at_once(
        rclient: redis.Redis, stream: str) -> None:
    produce(rclient, stream=stream, partitions=2, count=4000, keys=50, seed=5)
    coord = ScriptedCoordinator(2)
    coord.assign("a", [0, 1])
    worker = LightWorker(client=rclient, stream=stream, ownership=coord.ownership("a"),
                         max_rate=100.0, drain_timeout=30.0)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        time.sleep(1.0)
        moved = time.monotonic()
        coord.move(1, "b")
        while coord.holder(1)[0] != "b":
            assert time.monotonic() - moved < 5.0, "the release waited (drain timeout 30 s)"
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(timeout=30)
    b = LightWorker(client=rclient, stream=stream, ownership=coord.ownership("b"))
    b.run_once()
    report = verify(rclient, stream)
    part1 = next(p for p in report.partitions if p.partition == 1)
    assert part1.caught_up and part1.lost == 0 and part1.duplicated == 0
    assert part1.committed == part1.produced > 1500


def test_a_redis_timeout_ends_a_batch_not_the_worker_and_loses_nothing(
        rclient: redis.Redis, stream: str, redis_url: str) -> None:
    produce(rclient, stream=stream, partitions=2, count=3000, keys=30, seed=6)
    impatient = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=0.3)
    worker = LightWorker(client=impatient, stream=stream, ownership=StaticOwnership([0, 1]),
                         max_rate=1000.0)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        time.sleep(0.5)
        rclient.client_pause(1500, all=True)  # Redis answers nobody for 1.5 s
        deadline = time.monotonic() + 30
        while not verify(rclient, stream).caught_up:
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert worker.stats.redis_errors >= 1
    report = verify(rclient, stream)
    assert report.clean and report.total("committed") == 3000


def test_a_failed_write_leaves_no_gap_in_the_seqs(
        rclient: redis.Redis, stream: str, redis_url: str) -> None:
    impatient = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=0.3)
    writer = EventWriter(impatient, stream=stream, partitions=2, seed=2)
    writer.write(["a", "b", "a"])
    rclient.client_pause(1000, all=True)
    with pytest.raises(redis.RedisError):
        writer.write(["a", "b"])  # applied later or never: the writer cannot know
    time.sleep(1.2)
    writer.write(["a", "b", "b"])
    worker = LightWorker(client=rclient, stream=stream, ownership=StaticOwnership([0, 1]))
    worker.run_once()
    report = verify(rclient, stream)
    assert report.caught_up and report.clean and report.keys_lost == 0, report
    assert report.total("committed") in (6, 8)
