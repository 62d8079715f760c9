"""The PySpark streaming source: the partitions this pod owns, as planned ranges.

Rule: an offset is ``{"n": <plan number>, "p": {"<partition>": {"from", "to", "token",
"rows"}}}`` and every entry is self-contained, so :meth:`partitions` never consults the
live ownership: after a restart Spark replays a planned-but-uncommitted batch with the
ranges (and tokens) it was planned with, and the fenced sink refuses whatever is stale.

Planning (:meth:`KgroupStreamReader.latestOffset`) asks the :class:`Ownership` what is
*active*, and runs the fenced ``PLAN`` script (:mod:`kgroup_pipeline.fencing`): it claims
each partition for its token, starts at the sink's committed offset (the truth; the
handed-over position only for a partition the sink has never seen), skips partitions
that are revoking, sealed or fenced, and caps each range for admission control. When
nothing is new it returns ``start`` itself, or Spark would run an empty batch. ``n``
grows with each non-empty plan so a range re-planned after a refusal still differs from
``start``. A range never passes a partition's seal marker (a reshape replaced it); once
the sink's committed offset is the marker, the plan answers ``completed`` and the planner
hands the partition back as completed (:mod:`kgroup_pipeline.completion`), as the light
worker does.

Spark calls the planner in a Python process of its own and pickles the reader for
``read()``: Redis connections are made lazily and never pickled. ``read()`` yields pyarrow
RecordBatches (much faster than tuples); each row carries its partition and token. The
ranges of a batch are packed into ``splits`` tasks (option; the job passes Spark's default
parallelism), whole ranges only, so each range is read in stream order by one task.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import redis
from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from kgroup.client import SidecarError
from kgroup.producer import Sealer
from kgroup_pipeline.completion import Completer
from kgroup_pipeline.fencing import FencedStore
from kgroup_pipeline.health import HealthReporter
from kgroup_pipeline.ownership import Ownership, ownership_from_spec
from kgroup_pipeline.range_reader import (
    RESULT_DDL,
    SOURCE_DDL,
    aggregate,
    read_range,
    results_to_arrow,
)

log = logging.getLogger(__name__)
UNLIMITED_ROWS = 200_000  # ReadAllAvailable still needs a bound for one range
ROWS_PER_TASK = 10_000  # a smaller batch is read by fewer tasks (each costs a round trip)


Range = tuple[int, int, str, str, int]  # partition, token, from (excl.), to (incl.), limit


class RangesPartition(InputPartition):
    """One Spark task's share of a batch: whole ranges, never a split of one (order)."""

    def __init__(self, ranges: list[Range]) -> None:
        super().__init__(ranges)
        self.ranges = ranges


def split_ranges(entries: dict[str, dict[str, Any]], splits: int) -> list[list[Range]]:
    """Spread the planned ranges over at most `splits` tasks, balanced by rows.

    A task per stream partition costs far more in Spark's per-task overhead than it gains
    in parallelism on a pod's few cores, so ranges are packed (largest first, each to the
    least loaded task). A range is never split: one task reads it in stream order.
    """
    bins: list[tuple[int, list[Range]]] = [(0, []) for _ in range(max(1, splits))]
    for p, e in sorted(entries.items(), key=lambda kv: (-int(kv[1].get("rows", 0)), int(kv[0]))):
        i = min(range(len(bins)), key=lambda j: bins[j][0])
        load, ranges = bins[i]
        ranges.append((int(p), int(e["token"]), str(e["from"]), str(e["to"]),
                       int(e.get("limit", 0)) or UNLIMITED_ROWS))
        bins[i] = (load + int(e.get("rows", 0)), ranges)
    return [sorted(r) for _, r in bins if r]


class KgroupStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.redis_url = options["redis"]
        self.stream = options["stream"]
        self.ownership_spec = options["ownership"]
        self.max_rows = int(options.get("maxrowsperbatch", "50000"))
        self.splits = int(options.get("splits", "2"))
        self.aggregated = options.get("output", "events") == "aggregates"
        self._store: FencedStore | None = None
        self._ownership: Ownership | None = None
        self._health: HealthReporter | None = None
        self._completion: Completer | None = None
        self._sealer: Sealer | None = None
        # The first batch plans nothing and asks the sidecar nothing: it pays the query's
        # first-time costs (planning, code generation, the sink's first call) before the
        # first ask, which is when the sidecar joins the group for this app.
        self._warmed = False

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_store"] = state["_ownership"] = state["_health"] = None
        state["_completion"] = state["_sealer"] = None
        return state

    def _planner(self) -> tuple[FencedStore, Ownership]:
        if self._store is None or self._ownership is None:
            client = redis.Redis.from_url(self.redis_url, decode_responses=True)
            self._store = FencedStore(client, self.stream)
            # Followed, not asked per batch: at a trigger every 0.25 s a plain ask per
            # latestOffset cost the sidecar 4 requests a second, CPU it lacks on a busy
            # node (its request is a few percent of the pod's), where a late renewal fences.
            self._ownership = ownership_from_spec(self.ownership_spec, follow=True)
        return self._store, self._ownership

    def initialOffset(self) -> dict[str, Any]:
        return {"n": 0, "p": {}}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if not self._warmed:
            self._warmed = True
            return {"n": int(start.get("n", 0)) + 1, "p": {}}
        store, ownership = self._planner()
        try:
            active = ownership.assignment().active
        except (OSError, SidecarError) as e:  # no answer: plan nothing, ask again next time
            log.warning("ownership unavailable: %s", e)
            return start
        if not active:
            return start
        total = UNLIMITED_ROWS if isinstance(limit, ReadAllAvailable) else self.max_rows
        if isinstance(limit, ReadMaxRows):
            total = limit.max_rows
        # what the sidecar's view calls sealed (a reshape replaced it) is sealed in the
        # stream if no producer has, so it can be read to its seal and completed
        sealed = {p.partition: p.sealed_by for p in active if p.sealed_by is not None}
        if sealed:
            if self._sealer is None:
                self._sealer = Sealer(store.client, self.stream)
            self._sealer.seal(sealed)
        plans = store.plan(active, max_rows=max(1, total // len(active)))
        self._reporter(store, ownership).observe(plans)
        # a sealed partition whose committed offset reached its marker: hand it back as
        # completed (the sink committed it, so this planner's answer is final)
        if self._completion is None:
            self._completion = Completer(ownership)
        self._completion.step(plans)
        entries = {str(p.partition): {"from": p.from_id, "to": p.to_id, "token": p.token,
                                      "rows": p.rows, "limit": p.limit}
                   for p in sorted(plans, key=lambda p: p.partition)
                   if p.status == "ok" and p.rows > 0}
        if not entries:
            return start
        return {"n": int(start.get("n", 0)) + 1, "p": entries}

    def _reporter(self, store: FencedStore, ownership: Ownership) -> HealthReporter:
        if self._health is None:
            self._health = HealthReporter(store, getattr(ownership, "report_health", None))
        return self._health

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if start == end:
            return []
        entries = end.get("p", {})
        rows = sum(int(e.get("rows", 0)) for e in entries.values())
        tasks = min(self.splits, max(1, -(-rows // ROWS_PER_TASK)))
        return [RangesPartition(r) for r in split_ranges(entries, tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangesPartition)
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        try:
            yield from self.read_ranges(client, partition.ranges)
        finally:
            client.close()

    def read_ranges(self, client: redis.Redis, ranges: list[Range]) -> Iterator[pa.RecordBatch]:
        for part, token, from_id, to_id, limit in ranges:
            batches = read_range(client, stream=self.stream, partition=part, token=token,
                                 from_id=from_id, to_id=to_id, limit=limit)
            if self.aggregated:
                results = aggregate(batches)
                if results:
                    yield results_to_arrow(results)
            else:
                yield from batches

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the sink's fenced transaction is the commit that counts."""


class KgroupDriverStreamReader(SimpleDataSourceStreamReader):
    """``option("readOn", "driver")``: plan, read and aggregate in the source's planner
    process (Spark's simple stream reader), so a batch runs no Python task at all.

    A micro-batch then costs one planner round trip plus a JVM-only job over the results
    Spark cached (no Python worker, no pickled reader per task): the low-latency mode for
    small batches. One process reads every range, so a backlog drains on one core (the
    task reader spreads ranges over ``splits`` Python workers). The offsets, the ranges
    and the admission cap are the task reader's own: ``read(start)`` plans like
    ``latestOffset`` (``ReadMaxRows(maxRowsPerBatch)``), and a batch Spark replays after a
    restart (``readBetweenOffsets``) re-reads the same ranges, which the sink refuses if
    they are stale. The output is always the per-key aggregates (``RESULT_DDL``).
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.planner = KgroupStreamReader({**options, "output": "aggregates"})
        self._client: redis.Redis | None = None

    def __getstate__(self) -> dict[str, Any]:  # a replay after a restart may run in a task
        return {**self.__dict__, "_client": None}

    def initialOffset(self) -> dict[str, Any]:
        return self.planner.initialOffset()

    def read(self, start: dict[str, Any]) -> tuple[Iterator[pa.RecordBatch], dict[str, Any]]:
        end = self.planner.latestOffset(start, ReadMaxRows(self.planner.max_rows))
        if end is start or end == start:
            return iter(()), start
        return self.readBetweenOffsets(start, end), end

    def readBetweenOffsets(self, start: dict[str, Any],
                           end: dict[str, Any]) -> Iterator[pa.RecordBatch]:
        if self._client is None:
            self._client = redis.Redis.from_url(self.planner.redis_url, decode_responses=True)
        ranges = [r for task in split_ranges(end.get("p", {}), 1) for r in task]
        # read now: Spark's cache copies the iterator (copy.copy), a generator cannot be
        return iter(list(self.planner.read_ranges(self._client, ranges)))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the sink's fenced transaction is the commit that counts."""


class KgroupStreamSource(DataSource):
    """``spark.readStream.format("kgroup").option("redis", ...).option("stream", ...)
    .option("ownership", "sidecar:http://127.0.0.1:8470")``; ``option("readOn",
    "driver")`` for :class:`KgroupDriverStreamReader` (aggregates only)."""

    @classmethod
    def name(cls) -> str:
        return "kgroup"

    def _on_driver(self) -> bool:
        return self.options.get("readon", "tasks") == "driver"

    def schema(self) -> str:
        aggregates = self.options.get("output", "events") == "aggregates" or self._on_driver()
        return RESULT_DDL if aggregates else SOURCE_DDL

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if self._on_driver():  # Spark then asks simpleStreamReader
            raise PySparkNotImplementedError(errorClass="NOT_IMPLEMENTED",
                                             messageParameters={"feature": "streamReader"})
        return KgroupStreamReader(dict(self.options))

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return KgroupDriverStreamReader(dict(self.options))


def aggregate_arrow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow: one Spark task = one planned range; per-key results out (RESULT_SCHEMA)."""
    results = aggregate(batches)
    if results:
        yield results_to_arrow(results)
