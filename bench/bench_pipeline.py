"""Pipeline throughput: one PySpark worker in local mode on 16 partitions, against raw reads.

Rule: timings live here, never in tests. A backlog of ``--events`` keyed events is
produced into a private redis-server first, then each consumer drains it from the start
(a fresh stream per consumer). Rows:

- raw XRANGE: redis-py reading every entry of the 16 stream keys (the ceiling for any
  Python reader on this Redis);
- read_range: the same reads turned into Arrow batches (the source's ``read()``);
- light worker: plan → read → aggregate → fenced commit, plain Python;
- PySpark worker: the job (source → mapInArrow → foreachBatch fenced sink); steady rate
  counts the batches after the first (the first one pays Python worker start-up).

Also: SparkSession start-up and time from launch to the first committed batch. Prints a
table and writes docs/bench/pipeline.json.

    .venv/bin/python bench/bench_pipeline.py [--events 300000] [--no-spark]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kgroup_pipeline.events import read_range
from kgroup_pipeline.light_worker import LightWorker
from kgroup_pipeline.ownership import StaticOwnership
from kgroup_pipeline.producer import produce
from kgroup_pipeline.redis_server import RedisServer
from kgroup_pipeline.verify import verify
from kgroup_pipeline.worker import build_session
from kgroup_pipeline.worker import run as run_worker

OUT = Path(__file__).resolve().parent.parent / "docs" / "bench" / "pipeline.json"
PARTS = 16


def backlog(client: Any, stream: str, events: int) -> None:
    produce(client, stream=stream, partitions=PARTS, count=events, keys=1000, seed=42)


def last_ids(client: Any, stream: str) -> dict[int, str]:
    return {p: client.xrevrange(f"kgroup:{{{stream}}}:p:{p}", count=1)[0][0]
            for p in range(PARTS)}


def bench_raw(client: Any, stream: str) -> tuple[int, float]:
    t0, n = time.monotonic(), 0
    for p in range(PARTS):
        cursor = "-"
        while True:
            entries = client.xrange(f"kgroup:{{{stream}}}:p:{p}", min=cursor, count=5000)
            if not entries:
                break
            n += len(entries)
            cursor = "(" + entries[-1][0]
    return n, time.monotonic() - t0


def bench_read_range(client: Any, stream: str) -> tuple[int, float]:
    ends = last_ids(client, stream)
    t0, n = time.monotonic(), 0
    for p in range(PARTS):
        for b in read_range(client, stream=stream, partition=p, token=1, from_id="0-0",
                            to_id=ends[p]):
            n += b.column("from_id").null_count  # event rows (the marker row has it)
    return n, time.monotonic() - t0


def bench_light(client: Any, stream: str) -> tuple[int, float]:
    worker = LightWorker(client=client, stream=stream, ownership=StaticOwnership(list(range(16))),
                         max_rows=100_000)
    t0 = time.monotonic()
    while worker.run_once():
        pass
    assert verify(client, stream).clean
    return worker.stats.rows, time.monotonic() - t0


def bench_spark(client: Any, url: str, stream: str, master: str) -> dict[str, float]:
    t0 = time.monotonic()
    spark = build_session(master)
    session_s = time.monotonic() - t0
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if verify(client, stream).caught_up:
                stop.set()
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()
    t1 = time.monotonic()
    progress = run_worker(redis_url=url, stream=stream, ownership="static:0-15@1",
                          master=master, checkpoint=tempfile.mkdtemp(prefix="kgroup-bench-"),
                          stop=stop, quiet=True, spark=spark, max_rows=100_000)
    spark.stop()
    report = verify(client, stream)
    assert report.clean and report.caught_up
    hist = progress.history
    steady_rows = sum(r for _, r in hist[1:])
    steady_s = hist[-1][0] - hist[0][0] if len(hist) > 1 else float("nan")
    return {
        "session_s": session_s,
        "first_batch_s": (progress.first_batch_at or t1) - t0,
        "rows": float(progress.rows),
        "batches": float(len(hist)),
        "overall_eps": progress.rows / ((hist[-1][0] if hist else t1) - t1),
        "steady_rows": float(steady_rows),
        "steady_eps": steady_rows / steady_s if steady_s else float("nan"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--no-spark", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    rows: list[dict[str, Any]] = []
    with RedisServer() as srv:
        client = srv.client()
        backlog(client, "raw", args.events)
        n, s = bench_raw(client, "raw")
        raw_eps = n / s
        rows.append({"consumer": "raw XRANGE (redis-py)", "events": n, "seconds": s,
                     "events_per_s": raw_eps})
        n, s = bench_read_range(client, "raw")
        rows.append({"consumer": "read_range -> Arrow", "events": n, "seconds": s,
                     "events_per_s": n / s})
        backlog(client, "light", args.events)
        n, s = bench_light(client, "light")
        rows.append({"consumer": "light worker (fenced)", "events": n, "seconds": s,
                     "events_per_s": n / s})
        spark: dict[str, float] = {}
        if not args.no_spark:
            backlog(client, "spark", args.events)
            spark = bench_spark(client, srv.url, "spark", args.master)
            rows.append({"consumer": "PySpark worker, steady", "events": spark["steady_rows"],
                         "seconds": spark["steady_rows"] / spark["steady_eps"],
                         "events_per_s": spark["steady_eps"]})
            rows.append({"consumer": "PySpark, from query start", "events": spark["rows"],
                         "seconds": spark["rows"] / spark["overall_eps"],
                         "events_per_s": spark["overall_eps"]})
    print(f"{'consumer':<28}{'events':>10}{'seconds':>10}{'events/s':>12}{'vs raw':>9}")
    for r in rows:
        r["ratio_to_raw"] = r["events_per_s"] / raw_eps
        print(f"{r['consumer']:<28}{int(r['events']):>10}{r['seconds']:>10.2f}"
              f"{r['events_per_s']:>12.0f}{r['ratio_to_raw']:>9.2f}")
    if spark:
        print(f"SparkSession start-up {spark['session_s']:.1f}s; first committed batch "
              f"{spark['first_batch_s']:.1f}s after launch; {int(spark['batches'])} batches")
    meta = {"events": args.events, "partitions": PARTS, "master": args.master,
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "load_avg_1m": os.getloadavg()[0]}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"meta": meta, "results": rows, "spark": spark}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
