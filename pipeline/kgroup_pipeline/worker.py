"""The PySpark job: read what the pod owns, aggregate per key, commit fenced, hand off.

Rule: Spark computes; the sink's fenced transaction decides. Each micro-batch runs the
kgroup source (ranges of owned partitions), a per-range aggregation in the same task
(``mapInArrow``: a key lives in one partition, so no shuffle), and a ``foreachBatch`` sink
that commits every range's output with its offset in one fenced Lua call
(:mod:`kgroup_pipeline.fencing`). A handoff thread watches the ownership and releases a
revoking partition once the last batch that read it is committed. On SIGTERM the worker
seals everything, lets the running batch finish, releases every partition at its
committed offset, stops the query and exits 0.

    python -m kgroup_pipeline.worker --redis URL --stream NAME --sidecar http://127.0.0.1:8470
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from kgroup.client import SidecarError
from kgroup_pipeline.fencing import FencedStore
from kgroup_pipeline.handoff import HandoffController
from kgroup_pipeline.keys import StreamKeys
from kgroup_pipeline.ownership import Ownership, SidecarOwnership, ownership_from_spec
from kgroup_pipeline.range_reader import RESULT_DDL, results_from_rows
from kgroup_pipeline.worker_cli import add_source_arguments, ownership_spec, stop_on_signals

log = logging.getLogger("kgroup_pipeline.worker")


def spark_env() -> None:
    """Loopback only, and the workers run this very interpreter (the venv's) unless
    ``KGROUP_PYSPARK_PYTHON`` names another one (e.g. the executors' image's python)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = os.environ.get("KGROUP_PYSPARK_PYTHON") or sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


# The driver JVM of a pod with a core or two: C1 only (the tiered C2 compiler's threads
# compete with start-up and with the Python workers for the pod's cores; the hot path is
# Python, not JVM code) and the serial collector (a small heap, no GC threads to start).
# KGROUP_SPARK_JAVA_OPTIONS replaces them ("" for the JVM's defaults).
JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def build_session(master: str = "local[*]", app: str = "kgroup-pipeline", *,
                  executor_cores: int = 1, executor_memory: str = "512m",
                  cores_max: int = 1) -> Any:
    """A session on `master`; on a cluster (``spark://...``) the executors are sized
    explicitly and get this package and ``kgroup`` as a zip through ``addPyFile``
    (:mod:`kgroup_pipeline.spark_cluster`), so they never rely on the driver's files."""
    spark_env()
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.python.worker.reuse", "true")
               .config("spark.sql.streaming.schemaInference", "false"))
    java_options = os.environ.get("KGROUP_SPARK_JAVA_OPTIONS", JAVA_OPTIONS)
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    on_cluster = not master.startswith("local")
    if on_cluster:
        from kgroup_pipeline.spark_cluster import cluster_conf

        for key, value in cluster_conf(executor_cores=executor_cores,
                                       executor_memory=executor_memory,
                                       cores_max=cores_max).items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if on_cluster:
        from kgroup_pipeline.spark_cluster import pyfiles_zip

        spark.sparkContext.addPyFile(str(pyfiles_zip()))
    from kgroup_pipeline.source import KgroupStreamSource

    spark.dataSource.register(KgroupStreamSource)
    return spark


@dataclass
class Progress:
    batches: int = 0
    rows: int = 0
    refused: int = 0
    first_batch_at: float | None = None
    last_at: float = field(default_factory=time.monotonic)
    quiet: bool = False
    history: list[tuple[float, int]] = field(default_factory=list)  # (monotonic end, rows)
    # per batch: seconds in the job (df.toArrow: read + aggregate tasks), in turning its
    # rows into results, in the fenced commit; and Spark's own durationMs of each batch
    stages: list[dict[str, float]] = field(default_factory=list)
    spark: list[dict[str, Any]] = field(default_factory=list)


class FencedBatchSink:
    """The foreachBatch function: commit each range's output fenced, print one line."""

    def __init__(self, *, redis_url: str, stream: str, quiet: bool = False) -> None:
        self.client = redis.Redis.from_url(redis_url, decode_responses=True)
        self.store = FencedStore(self.client, stream)
        self.keys = StreamKeys(stream)
        self.progress = Progress(quiet=quiet)

    def __call__(self, df: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        table = df.toArrow()
        t1 = time.perf_counter()
        results = results_from_rows(table.to_pylist())
        t2 = time.perf_counter()
        outcomes = self.store.commit(results)
        t3 = time.perf_counter()
        rows = sum(r.events for r, o in zip(results, outcomes, strict=True)
                   if o.status == "committed")
        refused = [o for o in outcomes if o.status != "committed"]
        now = time.monotonic()
        p = self.progress
        if p.first_batch_at is None:
            p.first_batch_at = now
        elapsed, p.last_at = max(now - p.last_at, 1e-6), now
        p.batches += 1
        p.rows += rows
        p.refused += len(refused)
        p.history.append((now, rows))
        p.stages.append({"batch": batch_id, "rows": rows, "job_s": t1 - t0,
                         "convert_s": t2 - t1, "commit_s": t3 - t2})
        if not p.quiet:
            print(f"batch={batch_id} partitions={len(results)} rows={rows} "
                  f"events/s={rows / elapsed:.0f} lag={self.lag([r.partition for r in results])}"
                  + (f" refused={[(o.partition, o.status) for o in refused]}" if refused else ""),
                  flush=True)

    def lag(self, partitions: list[int]) -> int:
        """Events produced but not yet committed, over the given partitions."""
        if not partitions:
            return 0
        names = [str(n) for n in partitions]
        good = self.client.hmget(self.keys.produced_count, names)
        bad = self.client.hmget(self.keys.produced_bad, names)
        pipe = self.client.pipeline(transaction=False)
        for n in partitions:
            pipe.hget(self.keys.sink_partition(n), "events")
        done = pipe.execute()
        return sum(int(g or 0) + int(b or 0) - int(d or 0)
                   for g, b, d in zip(good, bad, done, strict=True))


def start_query(spark: Any, *, redis_url: str, stream: str, ownership: str, checkpoint: str,
                sink: FencedBatchSink, trigger_seconds: float = 0.25,
                max_rows: int = 100_000, fused: bool = True,
                async_progress: bool = False, read_on: str = "tasks") -> Any:
    from kgroup_pipeline.source import aggregate_arrow

    reader = (spark.readStream.format("kgroup")
              .option("redis", redis_url).option("stream", stream)
              .option("ownership", ownership).option("maxRowsPerBatch", str(max_rows))
              .option("splits", str(spark.sparkContext.defaultParallelism))
              .option("readOn", read_on))
    if fused or read_on == "driver":
        results = reader.option("output", "aggregates").load()
    else:
        results = reader.load().mapInArrow(aggregate_arrow, RESULT_DDL)
    writer = results.writeStream.foreachBatch(sink)
    if async_progress:
        # Spark writes its offset and commit logs in the background (the sink's fenced
        # offsets are the truth, so a log that lags only means a refused replay after a
        # restart). Spark admits only some sinks for this; foreachBatch needs its override.
        writer = (writer.option("asyncProgressTrackingEnabled", "true")
                  .option("_asyncProgressTrackingOverrideSinkSupportCheck", "true")
                  .option("asyncProgressTrackingCheckpointIntervalMs", "1000"))
    return (writer
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=f"{int(trigger_seconds * 1000)} milliseconds")
            .start())


def _warm(batches: Any) -> Any:
    """Runs in each Python worker of the warm-up job: the source's imports, once."""
    import kgroup_pipeline.source  # noqa: F401  (pyarrow, numpy, redis, the reader)

    yield from batches


def warm_up(spark: Any) -> threading.Thread:
    """Start the Python workers the first batch's tasks will reuse (and import the source
    in them) on a thread of its own, while the query is being started."""
    n = spark.sparkContext.defaultParallelism

    def job() -> None:
        try:
            spark.range(0, n, 1, n).mapInArrow(_warm, "id long").collect()
        except Exception as e:
            log.warning("warm-up failed: %s", e)

    thread = threading.Thread(target=job, name="kgroup-warm-up", daemon=True)
    thread.start()
    return thread


def wait_unless_stopped(thread: threading.Thread, stop: threading.Event,
                        timeout: float, step: float = 0.2) -> bool:
    """Join ``thread`` for at most ``timeout`` seconds, but return as soon as ``stop`` is
    set: a pod told to stop during its warm-up does not wait for it. True when the thread
    finished, False when stopped or timed out."""
    deadline = time.monotonic() + timeout
    while thread.is_alive() and not stop.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        thread.join(min(step, remaining))
    return not thread.is_alive()


def held(handoff: HandoffController) -> bool:
    """Whether anything is still held, asked anew when the hand-off follower's answer is
    spent (it keeps no promise while nothing is revoking): the shutdown's release of
    everything must see every partition, not an empty spent answer."""
    if isinstance(handoff.ownership, SidecarOwnership):
        handoff.ownership.refresh()
    try:
        return bool(handoff.ownership.assignment().partitions)
    except (OSError, SidecarError):
        return False  # the sidecar is gone: nothing left to hand back through it


def run(*, redis_url: str, stream: str, ownership: str, master: str, checkpoint: str,
        stop: threading.Event, trigger_seconds: float = 0.25, max_rows: int = 100_000,
        drain_timeout: float = 30.0, quiet: bool = False, spark: Any = None,
        executor_cores: int = 1, executor_memory: str = "512m", cores_max: int = 1,
        fused: bool = True, warm: bool = True, async_progress: bool = False,
        read_on: str = "tasks") -> Progress:
    """Run until `stop`; then seal, drain, release everything and stop the query.

    With `spark` given (tests share one session per module) the session is left running.
    """
    started = time.monotonic()
    own_session = spark is None
    if spark is None:
        spark = build_session(master, executor_cores=executor_cores,
                              executor_memory=executor_memory, cores_max=cores_max)
        if not quiet:
            print(f"worker: session on {master} {time.monotonic() - started:.1f}s after launch",
                  flush=True)
        if warm and read_on == "tasks":
            wait_unless_stopped(warm_up(spark), stop, timeout=120.0)
    if stop.is_set():
        # Stopped before the query started: it never asked its sidecar, so it holds
        # nothing and has nothing to hand back.
        if own_session:
            spark.stop()
        return Progress()
    sink = FencedBatchSink(redis_url=redis_url, stream=stream, quiet=quiet)
    query = start_query(spark, redis_url=redis_url, stream=stream, ownership=ownership,
                        checkpoint=checkpoint, sink=sink, trigger_seconds=trigger_seconds,
                        max_rows=max_rows, fused=fused, async_progress=async_progress,
                        read_on=read_on)
    if not quiet:
        print(f"worker: query started {time.monotonic() - started:.1f}s after launch", flush=True)
    owned: Ownership | None = None
    try:
        # Nothing is asked of the sidecar until the query's first batch (which plans
        # nothing: KgroupStreamReader.latestOffset) is done. The sidecar joins the group
        # at the app's first ask, so a new pod takes partitions once its pipeline is warm.
        while query.lastProgress is None and not stop.wait(0.2):
            if query.exception() is not None:
                raise RuntimeError(f"streaming query failed: {query.exception()}")
        if not stop.is_set():
            if not quiet:
                print(f"worker: warm {time.monotonic() - started:.1f}s after launch",
                      flush=True)
            # The hand-off loop steps every 0.2 s: it follows the sidecar (one long-poll
            # kept open) rather than asking at each step, and only for revoking
            # partitions (the planner keeps the promise of what is processed): with none
            # revoking its long-poll waits for a change, not for the promise to run low.
            owned = ownership_from_spec(ownership, follow=True, handoff=True)
        handoff = HandoffController(owned, sink.store, drain_timeout) if owned else None
        while handoff is not None and not stop.wait(0.2):
            if query.exception() is not None:
                raise RuntimeError(f"streaming query failed: {query.exception()}")
            handoff.step(time.monotonic())
        deadline = time.monotonic() + drain_timeout
        while handoff is not None and time.monotonic() < deadline and held(handoff):
            handoff.step(time.monotonic(), everything=True)
            time.sleep(0.1)
    finally:
        sink.progress.spark = [
            {"batch": p["batchId"], "rows": p["numInputRows"], **p["durationMs"]}
            for p in (query.recentProgress or []) if p.get("numInputRows")]
        query.stop()
        if isinstance(owned, SidecarOwnership):
            owned.close()
        if own_session:
            spark.stop()
    if sink.progress.first_batch_at is not None and not quiet:
        print(f"worker: first batch {sink.progress.first_batch_at - started:.1f}s after launch; "
              f"{sink.progress.batches} batches, {sink.progress.rows} rows", flush=True)
    return sink.progress


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kgroup_pipeline.worker")
    add_source_arguments(ap)
    ap.add_argument("--master", default=os.environ.get("KGROUP_SPARK_MASTER", "local[*]"))
    ap.add_argument("--executor-cores", type=int,
                    default=int(os.environ.get("KGROUP_SPARK_EXECUTOR_CORES", "1")),
                    help="on a cluster: cores per executor")
    ap.add_argument("--executor-memory",
                    default=os.environ.get("KGROUP_SPARK_EXECUTOR_MEMORY", "512m"),
                    help="on a cluster: memory per executor")
    ap.add_argument("--cores-max", type=int,
                    default=int(os.environ.get("KGROUP_SPARK_CORES_MAX", "1")),
                    help="on a cluster: cores this driver takes at most (spark.cores.max)")
    ap.add_argument("--checkpoint", default=None, help="checkpoint dir (default: a temp dir)")
    ap.add_argument("--trigger", type=float, default=0.25, help="trigger interval, seconds")
    ap.add_argument("--max-rows", type=int, default=100_000, help="rows per micro-batch")
    ap.add_argument("--drain-timeout", type=float, default=30.0)
    ap.add_argument("--async-progress", action="store_true",
                    help="Spark's offset/commit logs written in the background (experimental)")
    ap.add_argument("--read-on", choices=("tasks", "driver"), default="tasks",
                    help="driver: plan, read and aggregate in the source's planner process "
                         "(no Python task per batch: lower latency, one core for reads)")
    ap.add_argument("--no-warm-up", action="store_true",
                    help="do not start the Python workers while the query starts")
    args = ap.parse_args(argv)
    spec = ownership_spec(ap, args)
    stop = stop_on_signals()
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="kgroup-ckpt-")
    run(redis_url=args.redis, stream=args.stream, ownership=spec, master=args.master,
        checkpoint=checkpoint, stop=stop, trigger_seconds=args.trigger,
        max_rows=args.max_rows, drain_timeout=args.drain_timeout,
        executor_cores=args.executor_cores, executor_memory=args.executor_memory,
        cores_max=args.cores_max, warm=not args.no_warm_up, async_progress=args.async_progress,
        read_on=args.read_on)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
