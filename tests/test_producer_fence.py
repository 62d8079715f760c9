"""The layout-following producer on a real redis-server: routing, the seal at a switch,
and the fence that refuses a producer that has not switched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from pipeline_fixtures import rclient, redis_url, stream

from kgroup.producer import (
    APPEND_LUA,
    SEAL_FIELD,
    FileLayout,
    LayoutBehind,
    LayoutProducer,
    Lineage,
    LineageError,
    SideWrite,
    Uniform,
    initial,
    layout_to_status,
    parse_seal,
    seals_key,
    stream_key,
)
from kgroup_pipeline.keys import StreamKeys, partition_for
from kgroup_pipeline.producer import main as producer_main

__all__ = ["rclient", "redis_url", "stream"]
KEYS = [f"c{i:05d}" for i in range(200)]


def entries(client: redis.Redis, stream: str, p: int) -> list[tuple[str, dict[str, str]]]:
    return cast("list[tuple[str, dict[str, str]]]", client.xrange(stream_key(stream, p)))


def events(keys: list[str]) -> list[dict[str, str | int]]:
    return [{"key": k, "n": i} for i, k in enumerate(keys)]


class Source:
    """A layout source a test moves by hand (the group's status.layout, in production)."""

    def __init__(self, lineage: Lineage) -> None:
        self.lineage = lineage

    def __call__(self) -> Lineage:
        return self.lineage


def no_wait(producer: LayoutProducer) -> LayoutProducer:
    producer.sleep = lambda s: None
    return producer


def test_a_group_of_one_generation_writes_where_crc32_mod_n_says(
        rclient: redis.Redis, stream: str) -> None:
    producer = LayoutProducer(rclient, stream, Source(initial(16)))
    sent = producer.send(KEYS, events(KEYS))
    assert sent.partitions == [partition_for(k, 16) for k in KEYS] and sent.refused == 0
    for p in range(16):
        assert [e["key"] for _, e in entries(rclient, stream, p)] == \
            [k for k in KEYS if partition_for(k, 16) == p]
    assert rclient.hgetall(seals_key(stream)) == {}


def test_a_switch_seals_every_replaced_partition_before_its_first_new_write(
        rclient: redis.Redis, stream: str) -> None:
    source = Source(initial(16))
    producer = LayoutProducer(rclient, stream, source)
    producer.send(KEYS, events(KEYS))
    source.lineage = source.lineage.reshape(Uniform(24))
    sent = producer.send(KEYS, events(KEYS))
    assert set(sent.partitions) <= set(range(16, 40)) and sent.generation == 2
    seals = rclient.hgetall(seals_key(stream))
    assert sorted(map(int, seals)) == list(range(16))
    first_new = min(entries(rclient, stream, p)[0][0] for p in set(sent.partitions))
    for p in range(16):
        generation, marker = parse_seal(str(seals[str(p)]))
        assert generation == 2
        last_id, last = entries(rclient, stream, p)[-1]
        assert (last_id, last) == (marker, {SEAL_FIELD: "2"})  # the marker ends it
        # sealed before any successor was written (stream ids are one clock)
        assert tuple(map(int, marker.split("-"))) < tuple(map(int, first_new.split("-")))
    # a second producer's seal changes nothing: one marker per partition
    LayoutProducer(rclient, stream, source).send(KEYS[:1], events(KEYS[:1]))
    assert rclient.hgetall(seals_key(stream)) == seals
    assert sum(SEAL_FIELD in e for p in range(16) for _, e in entries(rclient, stream, p)) == 16


def test_a_late_producer_is_refused_and_writes_to_the_successor_once_its_layout_moves(
        rclient: redis.Redis, stream: str) -> None:
    old = initial(16)
    new = old.reshape(Uniform(24))
    late_source = Source(old)
    late = no_wait(LayoutProducer(rclient, stream, late_source, layout_wait=0.2))
    late.send(KEYS, events(KEYS))
    LayoutProducer(rclient, stream, Source(new)).send(KEYS[:1], events(KEYS[:1]))  # switches
    lengths = {p: rclient.xlen(stream_key(stream, p)) for p in range(40)}
    with pytest.raises(LayoutBehind, match="sealed by generation 2"):
        late.send(KEYS, events(KEYS))
    assert {p: rclient.xlen(stream_key(stream, p)) for p in range(40)} == lengths
    late_source.lineage = new  # its layout source catches up
    sent = late.send(KEYS, events(KEYS))
    assert sent.generation == 2 and set(sent.partitions) <= set(range(16, 40))
    assert late.refusals >= 1
    for p in range(16):  # nothing behind any seal marker
        assert SEAL_FIELD in entries(rclient, stream, p)[-1][1]


def test_a_refused_batch_writes_nothing_not_even_its_side_writes(
        rclient: redis.Redis, stream: str) -> None:
    names = StreamKeys(stream)
    source = Source(initial(4))
    producer = LayoutProducer(rclient, stream, source)
    source.lineage = source.lineage.reshape(Uniform(2))
    producer.send(["a"], [{"key": "a"}])  # seals 0-3
    append = rclient.register_script(APPEND_LUA)
    before = rclient.xlen(stream_key(stream, 4))
    # one open partition (4) and one sealed (1) in the same batch: all refused
    keys = [seals_key(stream), stream_key(stream, 4), stream_key(stream, 1), names.meta]
    args: list[Any] = [2, 4, 1, 2, "key", "x", "n", 1, 1, 1, 1, "key", "y", 1,
                       "hincrby", 4, "written", 2]
    answer = append(keys=keys, args=args)
    assert answer[0] == "sealed" and answer[1] == "1" and parse_seal(answer[2])[0] == 2
    assert rclient.xlen(stream_key(stream, 4)) == before
    assert rclient.hget(names.meta, "written") is None
    # the same batch without the sealed partition goes through, side write included
    ok = append(keys=keys[:2] + keys[3:], args=[1, 4, 1, 2, "key", "x", "n", 1,
                                                1, "hincrby", 3, "written", 2])
    assert ok == ["ok", "1"] and rclient.hget(names.meta, "written") == "2"
    assert rclient.xlen(stream_key(stream, 4)) == before + 1


def test_an_unfenced_write_lands_behind_the_seal_which_is_what_the_fence_prevents(
        rclient: redis.Redis, stream: str) -> None:
    """The broken variant: a producer that writes with a plain XADD instead of the fenced
    script is not stopped by anything, and its event sits after the marker (the
    verifier counts it as past the seal: ``test_pipeline_reshape``)."""
    source = Source(initial(2))
    producer = LayoutProducer(rclient, stream, source)
    source.lineage = source.lineage.reshape(Uniform(2))
    producer.send(["a"], [{"key": "a"}])
    rclient.xadd(stream_key(stream, 0), {"key": "a", "n": 9})
    assert SEAL_FIELD not in entries(rclient, stream, 0)[-1][1]
    with pytest.raises(LayoutBehind):
        no_wait(LayoutProducer(rclient, stream, Source(initial(2)), layout_wait=0.05)).send(
            ["a", "b"], [{"key": "a"}, {"key": "b"}])


def test_bad_input_is_refused_with_a_clear_message(rclient: redis.Redis, stream: str) -> None:
    producer = LayoutProducer(rclient, stream, Source(initial(2)))
    with pytest.raises(ValueError, match="kgroup-seal"):
        producer.send(["a"], [{"key": "a", SEAL_FIELD: "1"}])
    with pytest.raises(ValueError, match="at least one field"):
        producer.send(["a"], [{}])
    with pytest.raises(ValueError, match="2 keys for 1 events"):
        producer.send(["a", "b"], [{"key": "a"}])
    with pytest.raises(ValueError, match="only hincrby and hset"):
        SideWrite("del", "k", "f", 1)
    with pytest.raises(ValueError, match="not a seal record"):
        parse_seal("1700-0")


def test_the_reference_producer_follows_a_layout_file(
        rclient: redis.Redis, redis_url: str, stream: str, tmp_path: Path) -> None:
    path = tmp_path / "layout.json"
    common = ["--redis", redis_url, "--stream", stream, "--partitions", "4", "--count", "200",
              "--rate", "0", "--keys", "50", "--layout-file", str(path)]
    assert producer_main([*common, "--seed", "1"]) == 0  # no file yet: crc32 % 4
    assert sum(rclient.xlen(stream_key(stream, p)) for p in range(4)) == 200
    source = FileLayout(str(path), 4)
    assert source() == initial(4)
    path.write_text(json.dumps(layout_to_status(initial(4).reshape(Uniform(6)))))
    assert source().latest.number == 2
    assert producer_main([*common, "--seed", "2"]) == 0
    assert sum(rclient.xlen(stream_key(stream, p)) for p in range(4, 10)) == 200
    assert all(SEAL_FIELD in entries(rclient, stream, p)[-1][1] for p in range(4))
    path.write_text('{"generation": 1')
    with pytest.raises(LineageError, match="not JSON"):
        source()
