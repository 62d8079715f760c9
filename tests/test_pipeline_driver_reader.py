"""The low-latency source mode (``readOn=driver``) without Spark: a real redis-server.

The reader plans, reads and aggregates in one process; these tests check what the task
reader promises holds for it too: a backlog becomes bounded batches (admission control),
a batch Spark replays (``readBetweenOffsets``) is read with the same rows, malformed
events become dead letters of the batch, and nothing new means no batch.
"""

from __future__ import annotations

import pickle
from typing import Any

import pyarrow as pa
import redis
from pipeline_fixtures import rclient, redis_url, stream

from kgroup_pipeline.fencing import FencedStore
from kgroup_pipeline.producer import produce
from kgroup_pipeline.range_reader import results_from_rows
from kgroup_pipeline.source import KgroupDriverStreamReader, KgroupStreamSource
from kgroup_pipeline.verify import verify

__all__ = ["rclient", "redis_url", "stream"]
PARTS = 16


def reader(redis_url: str, stream: str, max_rows: int) -> KgroupDriverStreamReader:
    # the keys as Spark hands them over (options are case-insensitive, lower-cased)
    return KgroupDriverStreamReader({"redis": redis_url, "stream": stream,
                                     "ownership": f"static:0-{PARTS - 1}@1",
                                     "maxrowsperbatch": str(max_rows), "readon": "driver"})


def table(batches: Any) -> pa.Table:
    order = [("partition", "ascending"), ("kind", "ascending"), ("key", "ascending")]
    return pa.Table.from_batches(list(batches)).sort_by(order)


def test_a_backlog_becomes_bounded_batches_each_replayed_with_the_same_rows(
        rclient: redis.Redis, redis_url: str, stream: str) -> None:
    produce(rclient, stream=stream, partitions=PARTS, count=24_000, keys=300, bad_every=400,
            seed=21)
    r = reader(redis_url, stream, 4000)
    store = FencedStore(rclient, stream)
    # the first batch plans nothing and asks nothing: it warms the query (docs/design.md)
    rows, start = r.read(r.initialOffset())
    assert list(rows) == [] and start["p"] == {} and start != r.initialOffset()
    sizes: list[int] = []
    for _ in range(20):
        rows, end = r.read(start)
        if end == start:
            assert list(rows) == []
            break
        first = table(rows)
        assert first.equals(table(r.readBetweenOffsets(start, end)))  # a replay: same rows
        results = results_from_rows(first.to_pylist())
        sizes.append(sum(res.events for res in results))  # dead letters included
        assert {o.status for o in store.commit(results)} == {"committed"}
        before, start = start, end
    assert sum(sizes) == 24_000 and max(sizes) <= 4000 and len(sizes) >= 6, sizes
    report = verify(rclient, stream)
    assert report.clean and report.caught_up
    assert report.total("dead") == report.total("bad") == 60
    # caught up: nothing new is no batch (the same offset object back)
    rows, end = r.read(start)
    assert end is start and list(rows) == []
    # Spark may pickle the reader for a replay in a task: no live connection goes along
    copy = pickle.loads(pickle.dumps(r))
    assert table(copy.readBetweenOffsets(before, start)).equals(first)


def test_the_source_hands_spark_the_driver_reader_only_when_asked() -> None:
    """Spark falls back to simpleStreamReader when streamReader is not implemented."""
    from pyspark.errors import PySparkNotImplementedError
    from pyspark.sql.datasource import CaseInsensitiveDict
    from pyspark.sql.datasource_internal import _streamReader

    def source(**options: str) -> KgroupStreamSource:  # options as Spark passes them
        return KgroupStreamSource(CaseInsensitiveDict(
            redis="redis://127.0.0.1:1/0", stream="s", ownership="static:0@1", **options))

    on_driver = source(readOn="driver")
    assert on_driver.schema() == source(output="aggregates").schema() != source().schema()
    wrapped = _streamReader(on_driver, None)  # type: ignore[arg-type]
    assert isinstance(wrapped.simple_reader, KgroupDriverStreamReader)  # type: ignore[attr-defined]
    try:
        source().simpleStreamReader(None)  # type: ignore[arg-type]
    except PySparkNotImplementedError:
        raise AssertionError("simpleStreamReader must exist") from None
    tasks = _streamReader(source(), None)  # type: ignore[arg-type]
    assert type(tasks).__name__ == "KgroupStreamReader"
