"""A held partition's seal in the sidecar's view: the sidecar reads which partitions a
reshape sealed from ``status.layout`` (``group_spec.sealed_by``), the state machine shows
it on the held ones (``PartitionView.sealed_by``, ``sealedBy`` on the wire) and wakes a
long-poll when it changes, and the light worker seals what its view calls sealed, so a
reshape completes with no producer running and no layout file."""

from __future__ import annotations

import dataclasses
import random

import redis
from pipeline_fixtures import rclient, redis_url, stream
from test_member import World, acquire_all, joined

from kgroup.client import Assignment
from kgroup.core.assignment import PartitionView, View
from kgroup.core.layout_status import layout_to_status
from kgroup.core.lineage import Change, Lineage, LineageError, Merge, Split, State, Uniform, initial
from kgroup.core.member.group_spec import sealed_by
from kgroup.core.member.reconcile import Target
from kgroup.core.routing import sealing_generation
from kgroup.producer import LayoutBehind, LayoutProducer
from kgroup_pipeline.keys import StreamKeys
from kgroup_pipeline.light_worker import LightWorker
from kgroup_pipeline.ownership import StaticOwnership, lasting
from kgroup_pipeline.producer import produce
from kgroup_pipeline.verify import verify

__all__ = ["rclient", "redis_url", "stream"]


def status_of(lineage: Lineage) -> dict[str, object]:
    return {"layout": layout_to_status(lineage)}


def expected(lineage: Lineage) -> dict[int, int]:
    return {p: sealing_generation(lineage, p) for p in lineage.partitions
            if lineage.state(p) is State.SEALED}


def test_the_sealed_partitions_and_their_generations_read_from_the_status() -> None:
    one = initial(4)
    assert sealed_by(status_of(one), 4) == {}
    two = one.reshape(Uniform(2))
    assert sealed_by(status_of(two), 6) == {0: 2, 1: 2, 2: 2, 3: 2}
    done = two.complete(0).complete(1)
    assert sealed_by(status_of(done), 6) == {2: 2, 3: 2}


def test_over_random_reshape_chains_it_agrees_with_the_producers_rule() -> None:
    """The sidecar reads ranges only; the producer (``sealing_generation``) decodes the
    whole lineage: they must name the same generation for every sealed partition."""
    for seed in range(40):
        rng = random.Random(seed)
        lineage = initial(rng.randint(1, 6)).reshape(Uniform(rng.randint(1, 8)))
        for _ in range(rng.randint(1, 5)):
            try:
                opened = sorted(lineage.latest.partitions)
                pick = rng.choice(opened)
                changes: list[Change] = [
                    Split(pick), Uniform(rng.randint(1, 8)),
                    Merge(pick, opened[min(len(opened) - 1, opened.index(pick) + 1)])]
                lineage = lineage.reshape(rng.choice(changes))
            except LineageError:
                pass
            for p in sorted(lineage.partitions):
                if rng.random() < 0.3 and lineage.is_assignable(p) \
                        and lineage.state(p) is State.SEALED:
                    lineage = lineage.complete(p)
            lineage = lineage.retire()
        status = status_of(lineage)
        assert sealed_by(status, lineage.next_partition) == expected(lineage), seed


def test_a_malformed_layout_reads_as_nothing_sealed() -> None:
    good = layout_to_status(initial(4).reshape(Uniform(2)))
    for bad in ("x", {"states": "x"}, {**good, "states": {"sealed": "0-9999"}},
                {**good, "generations": [{"generation": "two"}] * 2},
                {**good, "generations": "0-3"}):
        assert sealed_by({"layout": bad}, 6) == {}, bad


def test_the_view_shows_a_held_partitions_seal_and_a_change_moves_its_version() -> None:
    w = World(partitions=3)
    w.target = Target(1, frozenset({0, 1}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    before = m.view(0.2)
    assert [p.sealed_by for p in before.partitions] == [None, None]
    w.target = Target(1, frozenset({0, 1}), sealed_by={1: 2, 2: 2})
    m.step(w.snap(0.3))
    after = m.view(0.3)
    assert after.version > before.version  # a long-poll wakes
    assert {p.partition: p.sealed_by for p in after.partitions} == {0: None, 1: 2}
    # a seal on a partition it does not hold shows nothing and wakes nobody
    w.target = Target(1, frozenset({0, 1}), sealed_by={1: 2})
    m.step(w.snap(0.4))
    assert m.view(0.4).version == after.version


def test_the_wire_form_carries_it_and_an_older_sidecar_reads_as_open() -> None:
    view = View("pod-a", "S1", 3, 1, 1, False, 5.0,
                (PartitionView(4, 7, sealed_by=2), PartitionView(5, 7)))
    body = view.to_json()
    assert [p["sealedBy"] for p in body["partitions"]] == [2, None]
    assert View.from_json(body) == view
    del body["partitions"][0]["sealedBy"]
    assert View.from_json(body).partitions[0].sealed_by is None


class SidecarSaysSealed(StaticOwnership):
    """What a sidecar's view says after a reshape: the held partitions, sealed by a
    generation."""

    def __init__(self, partitions: list[int], by: dict[int, int], token: int) -> None:
        super().__init__(partitions, token=token)
        self.by = by

    def assignment(self) -> Assignment:
        held = super().assignment().partitions
        return lasting(tuple(dataclasses.replace(p, sealed_by=self.by.get(p.partition))
                             for p in held), member="static")


def test_the_light_worker_seals_what_its_view_calls_sealed_and_completes_it(
        rclient: redis.Redis, stream: str) -> None:
    lineage = initial(4)
    produce(rclient, stream=stream, layout=lambda: lineage, count=40, keys=8, seed=15)
    reshaped = lineage.reshape(Uniform(2))
    ownership = SidecarSaysSealed([0, 1, 2, 3], expected(reshaped), token=2)
    worker = LightWorker(client=rclient, stream=stream, ownership=ownership)
    for _ in range(50):
        worker.run_once()
        if len(ownership.completed) == 4:
            break
    assert sorted(ownership.completed) == [0, 1, 2, 3]
    assert sorted(worker.sealer.sealed) == [0, 1, 2, 3]
    assert rclient.hlen(StreamKeys(stream).seals) == 4
    try:  # a producer still on the old layout is fenced
        LayoutProducer(rclient, stream, lambda: lineage, layout_wait=0.05,
                       sleep=lambda s: None).send(["k"], [{"key": "k"}])
        raise AssertionError("a write into a sealed partition went through")
    except LayoutBehind:
        pass
    report = verify(rclient, stream)
    assert report.clean and report.ordered and report.total("committed") == 40


def test_the_spark_sources_planner_seals_what_its_view_calls_sealed_and_completes_it(
        redis_url: str, rclient: redis.Redis, stream: str) -> None:
    """The PySpark source's planner (plain Python, no JVM) with no producer running
    since the reshape: it seals what the sidecar's view calls sealed, reads to the seal
    and hands the partitions back completed."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from kgroup_pipeline.fencing import FencedStore
    from kgroup_pipeline.range_reader import aggregate
    from kgroup_pipeline.source import KgroupStreamReader

    lineage = initial(2)
    produce(rclient, stream=stream, layout=lambda: lineage, count=50, keys=20, seed=8)
    reshaped = lineage.reshape(Uniform(2))
    reader = KgroupStreamReader({"redis": redis_url, "stream": stream,
                                 "ownership": "static:0-1@1"})
    store = FencedStore(rclient, stream)
    ownership = SidecarSaysSealed([0, 1], expected(reshaped), token=1)
    reader._store, reader._ownership = store, ownership
    offset = reader.latestOffset(reader.initialOffset(), ReadMaxRows(10_000))  # warm-up
    for _ in range(5):
        end = reader.latestOffset(offset, ReadMaxRows(10_000))
        ranges = [(int(p), e["token"], e["from"], e["to"], e["limit"])
                  for p, e in end["p"].items()] if end is not offset else []
        store.commit(aggregate(reader.read_ranges(rclient, ranges)))
        offset = end
    assert sorted(ownership.completed) == [0, 1]
    assert rclient.hlen(StreamKeys(stream).seals) == 2
    report = verify(rclient, stream)
    assert report.clean and report.ordered and report.total("committed") == 50
