"""A small micro-batch's job, per reader, beside a JVM-only job of the same moment.

Rule: timings live here, never in tests. One local session and a private redis-server;
the kgroup source (per-key aggregates, 16 partitions) with ``readOn`` = each of
``--read-on`` in turn, one query each; ``--events`` new events every half second. In
``foreachBatch`` the batch's job (``df.toArrow()``: for ``tasks`` the read + aggregate
tasks in Python workers, for ``driver`` a JVM-only scan of what the planner process read)
is timed, and right after it ``spark.range(10).toArrow()`` (a JVM-only one-task job) as
the control: on a shared machine the control shows what the load did to that batch.

    .venv/bin/python bench/bench_batch_cost.py [--read-on tasks,driver] [--batches 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

from kgroup_pipeline.producer import produce
from kgroup_pipeline.redis_server import RedisServer
from kgroup_pipeline.worker import build_session


def one(spark: Any, url: str, client: Any, read_on: str, batches: int,
        events: int) -> list[tuple[int, float, float]]:
    stream = f"cost-{read_on}"
    out: list[tuple[int, float, float]] = []

    def timed(df: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        rows = df.toArrow().num_rows
        t1 = time.perf_counter()
        spark.range(0, 10, 1, 1).toArrow()
        out.append((rows, (t1 - t0) * 1000, (time.perf_counter() - t1) * 1000))

    query = (spark.readStream.format("kgroup").option("redis", url).option("stream", stream)
             .option("ownership", "static:0-15@1").option("output", "aggregates")
             .option("readOn", read_on)
             .option("splits", str(spark.sparkContext.defaultParallelism)).load()
             .writeStream.foreachBatch(timed)
             .option("checkpointLocation", tempfile.mkdtemp(prefix="kgroup-cost-"))
             .trigger(processingTime="100 milliseconds").start())
    try:
        deadline, seed = time.monotonic() + 300, 0
        while len(out) < batches + 2 and time.monotonic() < deadline:
            seed += 1
            produce(client, stream=stream, partitions=16, count=events, keys=1000, seed=seed)
            time.sleep(0.5)
    finally:
        query.stop()
    return out[2:]  # the first two start the Python processes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--read-on", default="tasks,driver")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--events", type=int, default=3000, help="new events per half second")
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with RedisServer() as srv:
        spark = build_session("local[*]", app="kgroup-bench-batch-cost")
        try:
            for read_on in args.read_on.split(","):
                load = os.getloadavg()[0]
                got = one(spark, srv.url, srv.client(), read_on, args.batches, args.events)
                for rows, job, control in got:
                    print(f"{read_on:6s} rows {rows:5d}  job {job:7.1f} ms  "
                          f"control {control:7.1f} ms")
                if got:
                    print(f"{read_on}: {len(got)} batches, job p50 "
                          f"{statistics.median(g[1] for g in got):.0f} ms, control p50 "
                          f"{statistics.median(g[2] for g in got):.0f} ms; load average "
                          f"{load:.1f} -> {os.getloadavg()[0]:.1f}")
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
