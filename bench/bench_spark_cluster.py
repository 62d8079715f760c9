"""The same 16-partition PySpark workload in local mode and on a local standalone cluster.

Rule: timings live here, never in tests. One backlog of ``--events`` keyed events per run
(a fresh stream each), drained by the worker job with static ownership of all 16
partitions:

- local: ``local[2]`` (this machine's two cores, in the driver's JVM);
- cluster: ``spark://127.0.0.1:<port>``, a master and one worker offering 2 cores,
  the driver taking both (``spark.cores.max=2``, executors of 1 core and 512m each);
- two drivers: the way members share a cluster — two driver processes at once, one per
  half of the partitions, ``spark.cores.max=1`` each (``--no-two-drivers`` skips it).

Each run is a fresh process (a cold JVM, as a pod would have). Reported per mode: session
start-up (``getOrCreate``, on a cluster including executor registration), time from launch
to the first committed batch, and events/s in steady state (batches after the first) and
from query start. Prints a table and writes docs/bench/spark_cluster.json.

    .venv/bin/python bench/bench_spark_cluster.py [--events 300000] [--max-rows 25000] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "docs" / "bench" / "spark_cluster.json"
PARTS = 16


def one_run(redis_url: str, stream: str, master: str, cores_max: int,
            max_rows: int, owned: str = "0-15") -> dict[str, float]:
    """In this (fresh) process: session, drain the backlog, report."""
    import redis

    from kgroup.core.ranges import parse_ranges
    from kgroup_pipeline.verify import verify
    from kgroup_pipeline.worker import build_session
    from kgroup_pipeline.worker import run as run_worker

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    mine = set(parse_ranges(owned))
    t0 = time.monotonic()
    spark = build_session(master, cores_max=cores_max)
    session_s = time.monotonic() - t0
    # Touch the executors once so that "session" on a cluster includes their start.
    spark.sparkContext.parallelize(range(cores_max), cores_max).count()
    ready_s = time.monotonic() - t0
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if all(p.caught_up for p in verify(client, stream).partitions
                   if p.partition in mine):
                stop.set()
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()
    t1 = time.monotonic()
    progress = run_worker(redis_url=redis_url, stream=stream, ownership=f"static:{owned}@1",
                          master=master, checkpoint=tempfile.mkdtemp(prefix="kgroup-bench-"),
                          stop=stop, quiet=True, spark=spark, max_rows=max_rows)
    spark.stop()
    report = verify(client, stream)
    assert report.clean and all(p.caught_up for p in report.partitions if p.partition in mine)
    hist = progress.history
    steady_rows = sum(r for _, r in hist[1:])
    steady_s = hist[-1][0] - hist[0][0] if len(hist) > 1 else float("nan")
    return {
        "session_s": session_s,
        "first_job_ready_s": ready_s,
        "first_batch_s": (progress.first_batch_at or t1) - t0,
        "rows": float(progress.rows),
        "batches": float(len(hist)),
        "overall_eps": progress.rows / ((hist[-1][0] if hist else t1) - t1),
        "steady_eps": steady_rows / steady_s if steady_s else float("nan"),
    }


def run_child(redis_url: str, stream: str, master: str, cores_max: int,
              max_rows: int, owned: str = "0-15") -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", redis_url, stream, master, str(cores_max),
         str(max_rows), owned],
        capture_output=True, text=True, timeout=1200, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{master} run failed:\n{out.stderr[-4000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def two_drivers(client: Any, redis_url: str, master: str,
                args: argparse.Namespace) -> dict[str, Any]:
    """Two member drivers (partitions 0-7 and 8-15) sharing the cluster, 1 core each."""
    from kgroup_pipeline.producer import produce

    produce(client, stream="two", partitions=PARTS, count=args.events, keys=1000, seed=7)
    results: dict[str, dict[str, float]] = {}

    def member(owned: str) -> None:
        results[owned] = run_child(redis_url, "two", master, 1, args.max_rows, owned)

    t0 = time.monotonic()
    threads = [threading.Thread(target=member, args=(o,)) for o in ("0-7", "8-15")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(results) != 2:
        raise RuntimeError("a driver of the two-driver run failed")
    return {"wall_s": time.monotonic() - t0,
            "steady_eps_sum": sum(r["steady_eps"] for r in results.values()),
            "session_s": [round(r["session_s"], 1) for r in results.values()],
            "runs": results}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--max-rows", type=int, default=25_000, help="rows per micro-batch")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-two-drivers", action="store_true")
    ap.add_argument("--child", nargs=6, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # SIGTERM ends the run through `finally`, so the cluster is stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.child:
        url, stream, master, cores, max_rows, owned = args.child
        print(json.dumps(one_run(url, stream, master, int(cores), int(max_rows), owned)))
        return 0

    from kgroup_pipeline.producer import produce
    from kgroup_pipeline.redis_server import RedisServer
    from kgroup_pipeline.spark_cluster import SparkCluster

    rows: list[dict[str, Any]] = []
    two: dict[str, Any] = {}
    with RedisServer() as srv, tempfile.TemporaryDirectory(prefix="kgroup-spark-") as tmp:
        client = srv.client()
        cluster = SparkCluster(Path(tmp))
        t0 = time.monotonic()
        state = cluster.up(workers=1, cores=2, memory="1536m", port=0)
        cluster_up_s = time.monotonic() - t0
        try:
            for i in range(args.repeat):
                for mode, master in (("local[2]", "local[2]"), ("cluster", state.master_url)):
                    stream = f"b{i}{mode[:5].replace('[', '')}"
                    produce(client, stream=stream, partitions=PARTS, count=args.events,
                            keys=1000, seed=42 + i)
                    r = run_child(srv.url, stream, master, 2, args.max_rows)
                    rows.append({"mode": mode, "run": i, **r})
                    print(f"{mode:<9} run {i}: session {r['session_s']:.1f}s, executors ready "
                          f"{r['first_job_ready_s']:.1f}s, first batch {r['first_batch_s']:.1f}s, "
                          f"steady {r['steady_eps']:.0f} ev/s, overall {r['overall_eps']:.0f} "
                          f"ev/s ({int(r['batches'])} batches)", flush=True)
            if not args.no_two_drivers:
                two = two_drivers(client, srv.url, state.master_url, args)
        finally:
            cluster.down()

    def mean(mode: str, key: str) -> float:
        vals = [float(r[key]) for r in rows if r["mode"] == mode]
        return sum(vals) / len(vals)

    summary = {k: {m: mean(m, k) for m in ("local[2]", "cluster")}
               for k in ("session_s", "first_job_ready_s", "first_batch_s", "steady_eps",
                         "overall_eps")}
    ratio = summary["steady_eps"]["cluster"] / summary["steady_eps"]["local[2]"]
    print(f"cluster up (master + 1 worker registered): {cluster_up_s:.1f}s")
    print(f"{'':<22}{'local[2]':>12}{'cluster':>12}")
    for k, v in summary.items():
        print(f"{k:<22}{v['local[2]']:>12.1f}{v['cluster']:>12.1f}")
    print(f"steady events/s cluster / local = {ratio:.2f}")
    meta = {"events": args.events, "partitions": PARTS, "max_rows": args.max_rows,
            "repeat": args.repeat,
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "load_avg_1m": os.getloadavg()[0], "cluster_up_s": cluster_up_s,
            "cluster": "1 worker x 2 cores, driver cores.max=2, executors 1 core / 512m"}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    if two:
        print(f"cluster, two drivers (8 partitions each, cores.max=1 each): steady "
              f"{two['steady_eps_sum']:.0f} ev/s together, {two['wall_s']:.1f}s launch to "
              f"both caught up; sessions {two['session_s']}")
    OUT.write_text(json.dumps({"meta": meta, "runs": rows, "summary": summary,
                               "two_drivers": two,
                               "steady_ratio_cluster_to_local": ratio}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
