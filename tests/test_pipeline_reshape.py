"""Reshapes on the pipeline (real redis-server, light workers, no Kubernetes): producers
seal and follow the layout, workers read a sealed partition to its marker and report it
completed, and the verifier checks every key's sequence across generations.

The group's side (which partition is assignable: ``Lineage.is_assignable``, and
completions recorded with ``Lineage.complete``) is played by
``kgroup_testing.reshape.Conductor`` on the scripted coordinator, as the operator will do
it from the workers' completed releases.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import redis
from pipeline_fixtures import rclient, redis_url, stream

from kgroup.core.lineage import State
from kgroup.producer import LayoutBehind, LayoutProducer, Uniform, initial, stream_key
from kgroup_pipeline.fencing import FencedStore
from kgroup_pipeline.keys import StreamKeys
from kgroup_pipeline.light_worker import LightWorker
from kgroup_pipeline.ownership import OwnedPartition, StaticOwnership, ownership_from_spec
from kgroup_pipeline.producer import produce
from kgroup_pipeline.range_reader import aggregate, read_range
from kgroup_pipeline.scripted import ScriptedCoordinator, serve_sidecar
from kgroup_pipeline.verify import Report, render, verify
from kgroup_testing.reshape import Conductor, Workers

__all__ = ["rclient", "redis_url", "stream"]


def wait_for(cond: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_an_empty_sealed_partition_completes_at_once_and_a_marker_is_no_event(
        rclient: redis.Redis, stream: str) -> None:
    conductor_lineage = initial(4)
    produce(rclient, stream=stream, layout=lambda: conductor_lineage, count=40, keys=1, seed=3)
    conductor_lineage = conductor_lineage.reshape(Uniform(2))
    produce(rclient, stream=stream, layout=lambda: conductor_lineage, count=1, keys=1, seed=4)
    empty = [p for p in range(4) if rclient.xlen(stream_key(stream, p)) == 1]
    assert len(empty) == 3  # one key: three partitions hold only their marker
    own = StaticOwnership(list(range(4)))
    worker = LightWorker(client=rclient, stream=stream, ownership=own)
    for _ in range(3):
        worker.run_once()
    assert sorted(own.completed) == list(range(4))
    seals = rclient.hgetall(f"kgroup:{{{stream}}}:seals")
    assert all(own.completed[p] == str(seals[str(p)]).split("/")[1] for p in range(4))
    report = verify(rclient, stream)
    assert [p.state for p in report.partitions[:4]] == ["completed"] * 4
    assert report.total("dead") == 0  # a marker is no dead letter
    full = next(p for p in range(4) if p not in empty)
    rows = aggregate(read_range(rclient, stream=stream, partition=full, token=1,
                                from_id="0-0", to_id="+"))
    assert rows[0].events == 41 and sum(k.count for k in rows[0].keys) == 40


def test_planning_stops_at_the_seal_and_an_event_behind_it_is_lost_and_counted(
        rclient: redis.Redis, stream: str) -> None:
    """The broken variant of the producer: a write past the seal (a plain XADD that
    bypasses the fenced script) is never read, and the verifier catches it."""
    lineage = initial(2)
    produce(rclient, stream=stream, layout=lambda: lineage, count=20, keys=4, seed=5)
    lineage = lineage.reshape(Uniform(2))
    produce(rclient, stream=stream, layout=lambda: lineage, count=1, keys=4, seed=6)
    names = f"kgroup:{{{stream}}}"
    p = next(p for p in (0, 1) if rclient.hlen(f"{names}:produced:keys:{p}"))
    key = next(iter(rclient.hgetall(f"{names}:produced:keys:{p}")))
    seq = int(rclient.hincrby(f"{names}:produced:seq", key, 1))
    rclient.xadd(stream_key(stream, p), {"key": key, "amount": 1, "event": "x", "seq": seq})
    rclient.hincrby(f"{names}:produced:keys:{p}", key, 1)
    rclient.hincrby(f"{names}:produced:count", str(p), 1)
    rclient.hincrby(f"{names}:produced:total", key, 1)
    store = FencedStore(rclient, stream)
    plan = store.plan([OwnedPartition(p, 1)], max_rows=1000)[0]
    marker = str(rclient.hget(f"{names}:seals", str(p))).split("/")[1]
    assert plan.status == "ok" and plan.to_id == plan.seal == marker
    own = StaticOwnership([0, 1, 2, 3])
    worker = LightWorker(client=rclient, stream=stream, ownership=own)
    wait_for(lambda: worker.run_once() >= 0 and len(own.completed) == 2, what="completion")
    wait_for(lambda: worker.run_once() >= 0 and verify(rclient, stream).caught_up)
    report = verify(rclient, stream)
    assert report.partitions[p].past_seal == 1 and report.partitions[p].lost == 1
    assert report.keys_lost == 1 and not report.clean


def reshaping_run(redis_url: str, rclient: redis.Redis, stream: str, *, wait: bool,
                  crash: bool) -> tuple[Report, Conductor, list[int]]:
    """Events flow at 2,000/s for 6 s through 16 -> 24 (at 2 s) -> 8 (at 4 s). Three
    workers consume what the conductor assigns; they start at 2.5 s, so the first
    generation has a backlog when it is sealed (a lagging group). With ``crash``, a
    worker dies (its session expires) while draining the first generation, and the
    others take its partitions over. -> the verifier's report, the conductor, and the
    sealed partitions the crashed worker held when it died."""
    coord = ScriptedCoordinator(64)
    conductor = Conductor(coord, initial(16), ["a", "b", "c"], wait=wait)
    workers = Workers(redis_url, stream, coord, max_rows=100)
    held_at_crash: list[int] = []
    produced = threading.Thread(target=produce, kwargs=dict(
        client=redis.Redis.from_url(redis_url, decode_responses=True), stream=stream,
        layout=conductor.layout, duration=6.0, rate=2000, keys=300, seed=11, chunk=100))
    produced.start()
    started = time.monotonic()
    try:
        for at, action in ((2.0, "24"), (2.5, "start"), (2.6, "crash"), (4.0, "8")):
            while time.monotonic() - started < at:
                conductor.step()
                time.sleep(0.02)
            if action == "start":
                for m in conductor.members:
                    workers.start(m)
            elif action == "crash" and crash:
                conductor.leave("a")
                held_at_crash = [p for p in workers.crash("a")
                                 if conductor.lineage.state(p) is State.SEALED]
            elif action.isdigit():
                conductor.reshape(int(action))
        while produced.is_alive():
            conductor.step()
            time.sleep(0.02)
        produced.join()

        def settled() -> bool:
            conductor.step()
            return conductor.done() and verify(rclient, stream).caught_up
        wait_for(settled, timeout=90.0, what="every sealed partition completed")
    finally:
        workers.stop_all()
    return verify(rclient, stream), conductor, held_at_crash


def test_16_to_24_to_8_keeps_every_key_in_order_with_nothing_lost_or_duplicated(
        redis_url: str, rclient: redis.Redis, stream: str) -> None:
    report, conductor, held_at_crash = reshaping_run(redis_url, rclient, stream, wait=True,
                                                     crash=True)
    print(render(report))
    assert held_at_crash  # the crashed worker was draining sealed partitions: taken over
    assert set(held_at_crash) <= set(conductor.coord.completed)
    latest = conductor.lineage.latest  # generations 1 and 2 completed and retired
    assert latest.number == 3 and latest.partitions == tuple(range(40, 48))
    assert len(conductor.lineage.generations) == 1
    assert report.generations == 3
    assert report.total("produced") == report.total("committed") > 8_000
    assert report.clean and report.ordered, render(report)
    assert report.keys_lost == report.keys_duplicated == report.keys_out_of_order == 0
    assert report.total("past_seal") == 0
    states = {p.partition: p.state for p in report.partitions}
    assert all(states[p] == "completed" for p in range(40))  # generations 1 and 2
    assert all(states.get(p, "open") == "open" for p in range(40, 48))


def test_successors_read_before_their_predecessors_completed_break_key_order(
        redis_url: str, rclient: redis.Redis, stream: str) -> None:
    """The broken variant of the group's side: every partition assigned at once."""
    report, _, _ = reshaping_run(redis_url, rclient, stream, wait=False, crash=False)
    assert report.keys_out_of_order > 0, render(report)
    assert not report.ordered


def test_the_spark_sources_planner_hands_back_a_partition_read_to_its_seal(
        redis_url: str, rclient: redis.Redis, stream: str) -> None:
    """The PySpark source's planner (no JVM: its planning and reading are plain Python)
    stops each range at the seal and reports the partition completed once the sink
    committed the marker."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from kgroup_pipeline.source import KgroupStreamReader

    lineage = initial(2)
    produce(rclient, stream=stream, layout=lambda: lineage, count=50, keys=20, seed=8)
    lineage = lineage.reshape(Uniform(2))
    produce(rclient, stream=stream, layout=lambda: lineage, count=10, keys=20, seed=9)
    reader = KgroupStreamReader({"redis": redis_url, "stream": stream,
                                 "ownership": "static:0-1@1"})
    store = FencedStore(rclient, stream)
    warm = reader.latestOffset(reader.initialOffset(), ReadMaxRows(10_000))
    assert warm["p"] == {}  # the first batch plans nothing: it warms the query
    offset = reader.latestOffset(warm, ReadMaxRows(10_000))
    ranges = [(int(p), e["token"], e["from"], e["to"], e["limit"])
              for p, e in offset["p"].items()]
    seals = rclient.hgetall(f"kgroup:{{{stream}}}:seals")
    assert {r[3] for r in ranges} == {str(v).split("/")[1] for v in seals.values()}
    store.commit(aggregate(reader.read_ranges(rclient, ranges)))
    assert reader.latestOffset(offset, ReadMaxRows(10_000)) == offset  # nothing new to plan
    ownership = reader._ownership
    assert isinstance(ownership, StaticOwnership)
    assert sorted(ownership.completed) == [0, 1]



def test_a_sink_written_before_the_cross_partition_check_keeps_its_order_record(
        rclient: redis.Redis, stream: str) -> None:
    """Upgrade: a sink that recorded a key's last seq only per partition continues from
    it (the key's last seq across partitions falls back to the partition's own)."""
    produce(rclient, stream=stream, partitions=1, count=10, keys=1, seed=12)
    store = FencedStore(rclient, stream)
    names = StreamKeys(stream)
    (plan,) = store.plan([OwnedPartition(0, 1)], max_rows=5)
    (first,) = aggregate(read_range(rclient, stream=stream, partition=0, token=1,
                                    from_id=plan.from_id, to_id=plan.to_id, limit=5))
    assert [o.status for o in store.commit([first])] == ["committed"]
    rclient.delete(names.key_last)  # as a sink of the release before wrote it
    (plan,) = store.plan([OwnedPartition(0, 1)], max_rows=100)
    rest = aggregate(read_range(rclient, stream=stream, partition=0, token=1,
                                from_id=plan.from_id, to_id=plan.to_id))
    assert [o.status for o in store.commit(rest)] == ["committed"]
    assert rclient.hgetall(names.key_ooo) == {} and store.committed(0)["ooo"] == "0"
    report = verify(rclient, stream)
    assert report.clean and report.ordered and report.total("committed") == 10


def test_completion_reaches_a_sidecar_as_a_release_that_says_completed(
        rclient: redis.Redis, stream: str) -> None:
    """Through the sidecar's HTTP API (the scripted one): the worker's completion is
    ``POST /v1/partitions/{n}/release`` with ``"completed": true`` and the marker."""
    coord = ScriptedCoordinator(4)
    coord.assign("m", [0, 1, 2, 3])
    server, url = serve_sidecar(coord, "m")
    try:
        lineage = initial(4)
        produce(rclient, stream=stream, layout=lambda: lineage, count=40, keys=8, seed=13)
        lineage = lineage.reshape(Uniform(2))
        produce(rclient, stream=stream, layout=lambda: lineage, count=1, keys=8, seed=14)
        worker = LightWorker(client=rclient, stream=stream,
                             ownership=ownership_from_spec(f"sidecar:{url}"))
        wait_for(lambda: worker.run_once() >= 0 and len(coord.completed) == 4,
                 what="four completions")
    finally:
        server.shutdown()
        server.server_close()
    seals = rclient.hgetall(StreamKeys(stream).seals)
    assert coord.completed == {p: str(seals[str(p)]).split("/")[1] for p in range(4)}
    assert verify(rclient, stream).ordered


def test_with_the_layout_a_worker_seals_what_no_producer_sealed_and_completes_it(
        rclient: redis.Redis, stream: str) -> None:
    """A reshape with no producer running: nobody writes, so nobody seals. A worker given
    the layout seals the partitions it holds that the layout calls sealed (fencing any
    producer still on the old layout) and completes them; without it, it never does."""
    lineage = initial(4)
    produce(rclient, stream=stream, layout=lambda: lineage, count=40, keys=8, seed=15)
    reshaped = lineage.reshape(Uniform(2))
    blind = StaticOwnership([0, 1, 2, 3])
    worker = LightWorker(client=rclient, stream=stream, ownership=blind)
    for _ in range(5):
        worker.run_once()
    assert blind.completed == {} and rclient.hlen(StreamKeys(stream).seals) == 0
    sighted = StaticOwnership([0, 1, 2, 3], token=2)
    worker = LightWorker(client=rclient, stream=stream, ownership=sighted,
                         layout=lambda: reshaped)
    wait_for(lambda: worker.run_once() >= 0 and len(sighted.completed) == 4,
             what="four completions")
    assert sorted(worker.sealer.sealed) == [0, 1, 2, 3]
    with pytest.raises(LayoutBehind):  # a producer still on the old layout is fenced
        LayoutProducer(rclient, stream, lambda: lineage, layout_wait=0.05,
                       sleep=lambda s: None).send(["k"], [{"key": "k"}])
    report = verify(rclient, stream)
    assert report.clean and report.ordered and report.total("committed") == 40
