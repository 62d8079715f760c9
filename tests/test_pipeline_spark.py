"""The PySpark job on a real local-mode Spark session (one per module) and a real redis-server."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pipeline_fixtures import rclient, redis_url, stream

from kgroup_pipeline.fencing import FencedStore
from kgroup_pipeline.light_worker import LightWorker
from kgroup_pipeline.ownership import OwnedPartition
from kgroup_pipeline.producer import produce
from kgroup_pipeline.scripted import ScriptedCoordinator, serve_sidecar
from kgroup_pipeline.verify import verify
from kgroup_pipeline.worker import Progress, build_session
from kgroup_pipeline.worker import run as run_worker

__all__ = ["rclient", "redis_url", "stream"]
pytestmark = pytest.mark.spark
PARTS = 16


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = build_session("local[2]", app="kgroup-pipeline-tests")
    yield session
    session.stop()


def wait_for(cond: Callable[[], bool], timeout: float = 180.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


class SparkWorker:
    """worker.run in a thread, stopped (drain + release) by `stop()`."""

    def __init__(self, spark: Any, *, redis_url: str, stream: str, ownership: str,
                 checkpoint: str | None = None, max_rows: int = 20_000,
                 read_on: str = "tasks") -> None:
        self.stop_event = threading.Event()
        self.progress: Progress | None = None
        self.error: BaseException | None = None

        def target() -> None:
            try:
                self.progress = run_worker(
                    redis_url=redis_url, stream=stream, ownership=ownership, master="",
                    checkpoint=checkpoint or tempfile.mkdtemp(prefix="kgroup-test-ckpt-"),
                    stop=self.stop_event, max_rows=max_rows, drain_timeout=20.0, spark=spark,
                    read_on=read_on)
            except BaseException as e:
                self.error = e

        self.thread = threading.Thread(target=target, name="spark-worker")
        self.thread.start()

    def stop(self) -> Progress:
        self.stop_event.set()
        self.thread.join(timeout=120)
        assert not self.thread.is_alive()
        assert self.error is None, self.error
        assert self.progress is not None
        return self.progress


def test_one_pyspark_worker_consumes_all_16_partitions_and_the_verifier_is_clean(
        spark: Any, rclient: redis.Redis, redis_url: str, stream: str) -> None:
    produce(rclient, stream=stream, partitions=PARTS, count=30_000, keys=500, bad_every=500,
            seed=11)
    worker = SparkWorker(spark, redis_url=redis_url, stream=stream, ownership="static:0-15@1")
    try:
        wait_for(lambda: worker.error is not None or verify(rclient, stream).caught_up,
                 what="catch-up")
    finally:
        progress = worker.stop()
    report = verify(rclient, stream)
    assert report.clean and report.caught_up
    assert report.total("committed") == report.total("produced") == 30_000 - 60
    assert report.total("out_of_order") == 0
    assert report.total("dead") == report.total("bad") == 60
    assert progress.rows == 30_000
    assert rclient.xlen(f"kgroup:{{{stream}}}:dead") == 60


def test_a_partition_moves_from_a_pyspark_worker_to_a_light_worker_mid_stream(
        spark: Any, rclient: redis.Redis, redis_url: str, stream: str) -> None:
    coord = ScriptedCoordinator(PARTS)
    coord.assign("a", list(range(PARTS)))
    server, url = serve_sidecar(coord, "a")
    producer = threading.Thread(
        target=produce, args=(redis.Redis.from_url(redis_url, decode_responses=True),),
        kwargs={"stream": stream, "partitions": PARTS, "count": 40_000, "rate": 4000.0,
                "keys": 400, "seed": 12})
    light_stop = threading.Event()
    light = LightWorker(client=redis.Redis.from_url(redis_url, decode_responses=True),
                        stream=stream, ownership=coord.ownership("b"), max_rows=2000)
    light_thread = threading.Thread(target=light.run, args=(light_stop,))
    producer.start()
    light_thread.start()
    worker = SparkWorker(spark, redis_url=redis_url, stream=stream, ownership=f"sidecar:{url}")
    try:
        wait_for(lambda: worker.error is not None
                 or verify(rclient, stream).total("committed") > 5000, what="progress")
        assert worker.error is None
        coord.move(3, "b")
        coord.move(7, "b")
        wait_for(lambda: coord.holder(3)[0] == "b" and coord.holder(7)[0] == "b",
                 what="handoff")
        producer.join()
        wait_for(lambda: verify(rclient, stream).caught_up, what="catch-up")
    finally:
        worker.stop()
        light_stop.set()
        light_thread.join(timeout=60)
        server.shutdown()
        server.server_close()
    report = verify(rclient, stream)
    assert report.clean, report
    assert report.total("committed") == 40_000
    assert report.total("out_of_order") == 0
    handed = {p: pos for m, p, tok, pos in coord.releases if m == "a" and tok == 1}
    assert handed.keys() >= {3, 7}
    # The driver's hand-off loop (every 0.2 s) and the source's planner (every trigger)
    # follow the sidecar through long-polls: a plain ask only to start each follower and
    # after each release (asking per step and per batch made hundreds here).
    assert coord.requests["poll"] > 0
    assert coord.requests["ask"] <= 2 + 2 * len(coord.releases), coord.requests
    for p in (3, 7):
        # b went on from exactly where a's last committed batch ended, under token 2.
        assert rclient.hget(f"kgroup:{{{stream}}}:sink:p:{p}", "token") == "2"
        assert int(rclient.hget(f"kgroup:{{{stream}}}:sink:p:{p}", "batches") or 0) >= 1
    assert light.stats.rows > 0


def test_the_worker_asks_its_sidecar_nothing_before_its_first_batch_is_done(
        spark: Any, rclient: redis.Redis, redis_url: str, stream: str) -> None:
    # The sidecar joins the group at its app's first ask, so the first ask must come from
    # a warm pipeline: the first batch plans nothing, and neither the source's planner
    # nor the driver's hand-off loop asks before it is done.
    produce(rclient, stream=stream, partitions=4, count=4000, keys=100, seed=14)
    coord = ScriptedCoordinator(4)
    coord.assign("a", [0, 1, 2, 3])
    server, url = serve_sidecar(coord, "a")
    worker = SparkWorker(spark, redis_url=redis_url, stream=stream, ownership=f"sidecar:{url}")
    try:
        wait_for(lambda: worker.error is not None or verify(rclient, stream).caught_up,
                 what="catch-up")
    finally:
        progress = worker.stop()
        server.shutdown()
        server.server_close()
    assert verify(rclient, stream).clean
    first_end, first_rows = progress.history[0]
    assert first_rows == 0, progress.history[:3]
    assert coord.first_asked_at is not None and coord.first_asked_at > first_end, (
        coord.first_asked_at, first_end)
    assert progress.rows == 4000


def test_a_batch_replayed_after_a_restart_under_a_stale_token_is_refused(
        spark: Any, rclient: redis.Redis, redis_url: str, stream: str, tmp_path: Path) -> None:
    produce(rclient, stream=stream, partitions=4, count=8000, keys=100, seed=13)
    checkpoint = str(tmp_path / "ckpt")
    worker = SparkWorker(spark, redis_url=redis_url, stream=stream, ownership="static:0-3@1",
                         checkpoint=checkpoint)
    try:
        wait_for(lambda: worker.error is not None or verify(rclient, stream).caught_up,
                 what="catch-up")
    finally:
        worker.stop()
    store = FencedStore(rclient, stream)
    offsets = {p: store.offset(p) for p in range(4)}
    # The last batch was committed in the sink but, as far as Spark knows, never finished:
    commits = sorted((tmp_path / "ckpt" / "commits").glob("[0-9]*"), key=lambda f: int(f.name))
    assert commits
    last = commits[-1]
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    # Meanwhile every partition went to another owner, which claimed it with token 2.
    plans = store.plan([OwnedPartition(p, 2) for p in range(4)], max_rows=1)
    assert {p.status for p in plans} == {"ok"}
    restarted = SparkWorker(spark, redis_url=redis_url, stream=stream,
                            ownership="static:0-3@1", checkpoint=checkpoint)
    try:
        wait_for(lambda: restarted.error is not None or store.refused()[0] > 0,
                 what="the replayed batch")
    finally:
        restarted.stop()
    assert {p: store.offset(p) for p in range(4)} == offsets
    report = verify(rclient, stream)
    assert report.clean and report.caught_up and report.zombie_refused >= 1
    assert report.total("committed") == 8000


def test_a_backlog_is_consumed_in_bounded_batches(
        spark: Any, rclient: redis.Redis, redis_url: str, stream: str) -> None:
    """Admission control: a backlog of 24,000 becomes batches of at most 4,000 rows."""
    produce(rclient, stream=stream, partitions=PARTS, count=24_000, keys=300, seed=14)
    worker = SparkWorker(spark, redis_url=redis_url, stream=stream, ownership="static:0-15@1",
                         max_rows=4000)
    try:
        wait_for(lambda: worker.error is not None or verify(rclient, stream).caught_up,
                 what="catch-up")
    finally:
        progress = worker.stop()
    sizes = [b["rows"] for b in progress.stages]
    assert sum(sizes) == 24_000 and max(sizes) <= 4000 and len(sizes) >= 6, sizes
    report = verify(rclient, stream)
    assert report.clean and report.caught_up


def test_the_low_latency_reader_on_the_driver_commits_bounded_batches_exactly_once(
        spark: Any, rclient: redis.Redis, redis_url: str, stream: str) -> None:
    """``--read-on driver``: no Python task per batch; the same sink, the same promises."""
    produce(rclient, stream=stream, partitions=PARTS, count=12_000, keys=300, bad_every=500,
            seed=16)
    worker = SparkWorker(spark, redis_url=redis_url, stream=stream, ownership="static:0-15@1",
                         max_rows=4000, read_on="driver")
    try:
        wait_for(lambda: worker.error is not None or verify(rclient, stream).caught_up,
                 what="catch-up")
    finally:
        progress = worker.stop()
    sizes = [b["rows"] for b in progress.stages]
    assert sum(sizes) == 12_000 and max(sizes) <= 4000 and len(sizes) >= 3, sizes
    report = verify(rclient, stream)
    assert report.clean and report.caught_up
    assert report.total("dead") == report.total("bad") == 24
    assert rclient.xlen(f"kgroup:{{{stream}}}:dead") == 24


def test_a_batch_is_read_again_with_the_same_rows_and_malformed_events_stay_rows(
        spark: Any, rclient: redis.Redis, redis_url: str, stream: str, tmp_path: Path) -> None:
    """A second action on the micro-batch recomputes it from the source (no cache): it must
    see the same rows (a retried task reads the same way: a range is fixed by its plan).
    A malformed event is a row with its error, never a failed task."""
    produce(rclient, stream=stream, partitions=4, count=6000, keys=50, bad_every=100, seed=15)
    seen: list[tuple[int, Any, Any]] = []

    def twice(df: Any, batch_id: int) -> None:
        if seen:
            return
        first = df.toArrow()
        if first.num_rows:  # the source's first batch plans nothing (it warms the query)
            seen.append((batch_id, first, df.toArrow()))

    query = (spark.readStream.format("kgroup").option("redis", redis_url)
             .option("stream", stream).option("ownership", "static:0-3@1")
             .option("maxRowsPerBatch", "2000").load()
             .writeStream.foreachBatch(twice)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        wait_for(lambda: bool(seen) or query.exception() is not None, what="a batch")
    finally:
        query.stop()
    assert query.exception() is None
    _, first, second = seen[0]
    order = [("partition", "ascending"), ("id", "ascending"), ("seq", "ascending"),
             ("key", "ascending")]
    assert first.num_rows == second.num_rows == 2000 + 4  # 500 events per range + 4 markers
    assert first.sort_by(order).equals(second.sort_by(order))
    assert first.column("error").null_count < first.num_rows - 4  # malformed rows are in it
