"""Pipeline throughput and latency: PySpark workers in local mode on 16 partitions.

Rule: timings live here, never in tests. A backlog of ``--events`` keyed events is
produced into a private redis-server first, then each consumer drains it from the start
(a fresh stream per consumer). Rows:

- raw XRANGE: redis-py reading every entry of the 16 stream keys (the ceiling for any
  Python reader on this Redis);
- read_range: the same reads turned into Arrow batches (the source's ``read()``);
- light worker: plan → read → aggregate → fenced commit, plain Python;
- PySpark worker: the job (source → mapInArrow → foreachBatch fenced sink), in this
  process; steady rate counts the batches after the first (the first one pays Python
  worker start-up);
- 1 and 3 PySpark drivers, warmed (``spark3``): each driver is a process of its own with
  its own SparkSession and JVM (``--master`` for each, as each pod has its own driver),
  owning a disjoint share by static ownership (``0-15``; or ``0-5``, ``6-10``,
  ``11-15``). Each driver first warms up on a private stream (two batches, so the Python
  workers exist), then waits for a gate; the backlog is released to all at once. The
  backlog is ``--driver-events`` (3 x ``--events``, so each of 3 drivers has several
  batches of 100,000 rows). The drain rate is backlog ÷ (gate → every partition's
  committed offset at its last id); the steady rate counts what all drivers committed
  from the moment each had committed its first batch to the moment the first of them
  was done (the common window; the first batch after the gate pays the query's start).
  The verifier must report the stream clean (nothing lost or duplicated).

Latency (``latency``), produce → committed in the sink: after the backlog, the same
drivers keep running while events are produced at ``--rate`` for ``--latency-seconds``.
The produce time of an event is the millisecond part of its stream id, set by Redis at
XADD (the EXEC of the producer's chunk, i.e. when it became readable). The commit time is
learned without touching the sink: a poller reads every partition's committed offset and
Redis ``TIME`` in one MULTI/EXEC (one instant of the same clock) every ~10 ms. An event is
committed by the first poll whose offset of its partition is at or past its id, and not
before the previous poll, so its commit time lies in (previous poll, that poll]. Reported
latencies use the later bound (an over-estimate by at most one poll gap, whose p50 and max
are reported with them); the earlier bound's p50 is reported too.

Prints a table and writes docs/bench/pipeline.json.

    .venv/bin/python bench/bench_pipeline.py [--events 300000] [--rate 5000]
        [--driver-events N] [--latency-seconds 30] [--no-spark] [--no-drivers]
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

from kgroup.core.ranges import parse_ranges
from kgroup_pipeline.keys import ZERO_ID, StreamKeys, parse_id
from kgroup_pipeline.light_worker import LightWorker
from kgroup_pipeline.ownership import StaticOwnership
from kgroup_pipeline.producer import produce
from kgroup_pipeline.range_reader import read_range
from kgroup_pipeline.redis_server import RedisServer
from kgroup_pipeline.verify import verify
from kgroup_pipeline.worker import build_session
from kgroup_pipeline.worker import run as run_worker

OUT = Path(__file__).resolve().parent.parent / "docs" / "bench" / "pipeline.json"
PARTS = 16
MAX_ROWS = 100_000
LATENCY_METHOD = ("produce time: the ms part of the Redis stream id (set at XADD); commit "
                  "time: a poller reading all committed offsets with Redis TIME in one "
                  "MULTI/EXEC every ~10 ms; latency = first poll showing the offset at or past "
                  "the id, minus the produce time (upper bound; the true commit lies after the "
                  "previous poll)")


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


def bench_spark(client: Any, url: str, stream: str, master: str,
                read_on: str = "tasks") -> dict[str, Any]:
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
                          stop=stop, quiet=True, spark=spark, max_rows=MAX_ROWS,
                          read_on=read_on)
    spark.stop()
    report = verify(client, stream)
    assert report.clean and report.caught_up
    hist = progress.history
    steady_rows = sum(r for _, r in hist[1:])
    steady_s = hist[-1][0] - hist[0][0] if len(hist) > 1 else float("nan")
    return {
        "stages": stage_breakdown(progress),
        "session_s": session_s,
        "first_batch_s": (progress.first_batch_at or t1) - t0,
        "rows": float(progress.rows),
        "batches": float(len(hist)),
        "overall_eps": progress.rows / ((hist[-1][0] if hist else t1) - t1),
        "steady_rows": float(steady_rows),
        "steady_eps": steady_rows / steady_s if steady_s else float("nan"),
    }


SPARK_STAGES = ("latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch",
                "commitOffsets", "triggerExecution")


def stage_breakdown(progress: Any) -> dict[str, Any]:
    """Mean milliseconds per steady batch (the first one left out): Spark's durationMs
    (latestOffset = our PLAN round, addBatch = the job + our sink) and the sink's own
    timers inside addBatch (job = df.toArrow: read + aggregate tasks; convert; commit)."""
    spark = progress.spark[1:] or progress.spark
    ours = progress.stages[1:] or progress.stages
    out: dict[str, Any] = {"batches": len(spark),
                           "rows_per_batch": sum(b["rows"] for b in ours) / max(1, len(ours))}
    for k in SPARK_STAGES:
        out[k] = sum(float(b.get(k, 0)) for b in spark) / max(1, len(spark))
    for k in ("job_s", "convert_s", "commit_s"):
        out[k[:-2] + "_ms"] = 1000 * sum(b[k] for b in ours) / max(1, len(ours))
    return out


def print_stages(st: dict[str, Any]) -> None:
    if not st:
        return
    print(f"per steady batch ({st['batches']} batches, {st['rows_per_batch']:.0f} rows), ms: "
          + ", ".join(f"{k} {st[k]:.0f}" for k in SPARK_STAGES)
          + f"; in addBatch: job {st['job_ms']:.0f}, convert {st['convert_ms']:.0f}, "
          f"commit {st['commit_ms']:.0f}")


def bench_startup(srv: RedisServer, *, master: str, extra: Sequence[str] = ()) -> dict[str, Any]:
    """Launch → first committed batch of the worker as a pod runs it
    (``python -m kgroup_pipeline.worker``), a small backlog waiting: the worker's own lines
    give session and query start; the first commit is seen in the sink (polled every 20 ms).
    """
    client = srv.client()
    stream = "startup"
    produce(client, stream=stream, partitions=PARTS, count=2000, keys=100, seed=3)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kgroup_pipeline.worker", "--redis", srv.url, "--stream",
         stream, "--static", "0-15", "--master", master, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        start_new_session=True)
    lines: list[tuple[float, str]] = []

    def collect() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic() - t0, line.strip()))

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    keys = StreamKeys(stream)
    try:
        wait_for("first commit", lambda: any(
            client.hget(keys.sink_partition(p), "batches") for p in range(PARTS)), 300,
            procs=[proc], step=0.02)
        first_s = time.monotonic() - t0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=5)

    def said(prefix: str) -> float | None:
        return next((t for t, line in lines if line.startswith(prefix)), None)

    return {"first_commit_s": first_s, "session_line_s": said("worker: session"),
            "query_line_s": said("worker: query started"),
            "lines": [f"{t:.1f}s {line}" for t, line in lines[:12]]}


# -- separate drivers: 1 or 3 processes, each its own SparkSession and JVM -----------------

SHARES = {1: ["0-15"], 3: ["0-5", "6-10", "11-15"]}
WARM_EVENTS = 4000


def redis_ms(client: Any) -> float:
    sec, usec = client.time()
    return int(sec) * 1000 + int(usec) / 1000


def wait_for(what: str, cond: Callable[[], bool], timeout: float, *,
             procs: Sequence[subprocess.Popen[Any]] = (), step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        dead = [p.args for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{what}: a driver exited early: {dead}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(step)


def child(argv: list[str]) -> int:
    """One driver: session, warm-up on a private stream, gate, run its share until stop."""
    ap = argparse.ArgumentParser(prog="bench_pipeline.py --child")
    for name in ("--redis", "--stream", "--share", "--master", "--name", "--out", "--trigger"):
        ap.add_argument(name, required=True)
    ap.add_argument("--async-progress", action="store_true")
    ap.add_argument("--read-on", default="tasks")
    args = ap.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    client = redis.Redis.from_url(args.redis, decode_responses=True)
    t0 = time.monotonic()
    spark = build_session(args.master, app=f"kgroup-bench-{args.name}")
    session_s = time.monotonic() - t0
    warm = f"{args.stream}-warm-{args.name}"
    warm_stop, stop = threading.Event(), threading.Event()

    def warm_up() -> None:
        for _ in range(2):  # two batches: the second one runs on started Python workers
            produce(client, stream=warm, partitions=PARTS, count=WARM_EVENTS, keys=200, seed=7)
            while not verify(client, warm).caught_up:
                time.sleep(0.1)
        warm_stop.set()

    def watch_stop() -> None:
        while not client.exists(f"bench:{args.stream}:stop"):
            time.sleep(0.1)
        stop.set()

    with tempfile.TemporaryDirectory(prefix="kgroup-bench-") as ckpt:
        threading.Thread(target=warm_up, daemon=True).start()
        run_worker(redis_url=args.redis, stream=warm, ownership="static:0-15@1",
                   master=args.master, checkpoint=f"{ckpt}/warm", stop=warm_stop, quiet=True,
                   spark=spark, max_rows=MAX_ROWS)
        warm_s = time.monotonic() - t0 - session_s
        client.incr(f"bench:{args.stream}:ready")
        while not client.exists(f"bench:{args.stream}:go"):
            time.sleep(0.01)
        threading.Thread(target=watch_stop, daemon=True).start()
        options: dict[str, Any] = {}  # only those given (a base tree may lack them)
        if args.async_progress:
            options["async_progress"] = True
        if args.read_on != "tasks":
            options["read_on"] = args.read_on
        progress = run_worker(redis_url=args.redis, stream=args.stream,
                              ownership=f"static:{args.share}@1", master=args.master,
                              checkpoint=f"{ckpt}/main", stop=stop, quiet=True, spark=spark,
                              max_rows=MAX_ROWS, trigger_seconds=float(args.trigger),
                              **options)
    spark.stop()
    Path(args.out).write_text(json.dumps({
        "share": args.share, "session_s": session_s, "warm_s": warm_s, "rows": progress.rows,
        "batches": progress.batches, "refused": progress.refused}))
    return 0


class Poller(threading.Thread):
    """Every partition's committed offset and event count, with Redis TIME, atomically."""

    def __init__(self, url: str, stream: str, interval: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.keys = StreamKeys(stream)
        self.interval = interval
        self.samples: list[tuple[float, list[tuple[int, int]], list[int]]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            pipe = self.client.pipeline(transaction=True)
            for n in range(PARTS):
                pipe.hmget(self.keys.sink_partition(n), ["offset", "events"])
            pipe.time()
            *parts, (sec, usec) = pipe.execute()
            self.samples.append((int(sec) * 1000 + int(usec) / 1000,
                                 [parse_id(o or ZERO_ID) for o, _ in parts],
                                 [int(e or 0) for _, e in parts]))
            time.sleep(self.interval)

    def first(self, ends: dict[int, tuple[int, int]], after: int = 0) -> int | None:
        """Index of the first sample (from `after`) at which every partition of `ends`
        has its committed offset at or past the given id."""
        for i in range(after, len(self.samples)):
            if all(self.samples[i][1][p] >= e for p, e in ends.items()):
                return i
        return None


def quantile(xs: Sequence[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def latencies(client: Any, stream: str, samples: Sequence[tuple[float, list[tuple[int, int]],
              list[int]]], since_ms: float) -> dict[str, float]:
    """Produce → commit of every event produced from `since_ms` (rule in the docstring)."""
    upper: list[float] = []
    lower: list[float] = []
    times = [t for t, _, _ in samples]
    gaps = [b - a for a, b in itertools.pairwise(t for t in times if t >= since_ms)]
    for p in range(PARTS):
        offsets = [s[1][p] for s in samples]
        cursor = f"{int(since_ms)}-0"
        while True:
            entries = client.xrange(StreamKeys(stream).partition(p), min=cursor, count=5000)
            if not entries:
                break
            cursor = "(" + entries[-1][0]
            for eid, _ in entries:
                ident = parse_id(eid)
                i = bisect.bisect_left(offsets, ident)
                if i >= len(samples):
                    raise RuntimeError(f"event {eid} of partition {p} never seen committed")
                upper.append(times[i] - ident[0])
                lower.append(max(0.0, times[i - 1] - ident[0]) if i else 0.0)
    return {"events": float(len(upper)), "p50_ms": quantile(upper, 0.5),
            "p95_ms": quantile(upper, 0.95), "max_ms": max(upper, default=float("nan")),
            "p50_lower_ms": quantile(lower, 0.5), "poll_gap_p50_ms": quantile(gaps, 0.5),
            "poll_gap_max_ms": max(gaps, default=float("nan"))}


def drivers(srv: RedisServer, *, workers: int, events: int, master: str, rate: float,
            seconds: float, tmp: str, trigger: float = 0.25,
            async_progress: bool = False, read_on: str = "tasks") -> dict[str, Any]:
    """Drain a backlog with `workers` warmed drivers, then produce at `rate` for latency."""
    client = srv.client()
    stream = f"d{workers}"
    backlog(client, stream, events)
    ends = {p: parse_id(i) for p, i in last_ids(client, stream).items()}
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    procs: list[subprocess.Popen[bytes]] = []
    outs = [f"{tmp}/{stream}-{i}.json" for i in range(workers)]
    t0 = time.monotonic()
    try:
        for i, share in enumerate(SHARES[workers]):
            with open(f"{tmp}/{stream}-{i}.log", "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, __file__, "--child", "--redis", srv.url, "--stream", stream,
                     "--share", share, "--master", master, "--name", str(i), "--out", outs[i],
                     "--trigger", str(trigger), "--read-on", read_on]
                    + (["--async-progress"] if async_progress else []),
                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        wait_for("drivers ready", lambda: int(client.get(f"bench:{stream}:ready") or 0) == workers,
                 600, procs=procs, step=0.2)
        ready_s = time.monotonic() - t0
        poller = Poller(srv.url, stream)
        poller.start()
        wait_for("poller", lambda: bool(poller.samples), 10)
        gate_ms = redis_ms(client)
        client.set(f"bench:{stream}:go", 1)
        wait_for("backlog drained", lambda: poller.first(ends) is not None, 600, procs=procs)
        drained = poller.first(ends)
        assert drained is not None
        shares = [parse_ranges(s) for s in SHARES[workers]]
        done = [poller.first({p: ends[p] for p in share}) for share in shares]
        first_done = min(i for i in done if i is not None)
        since_ms = redis_ms(client)
        produced = produce(client, stream=stream, partitions=PARTS, duration=seconds, rate=rate,
                           keys=1000, seed=43, chunk=max(1, int(rate / 100)))
        lat_ends = {p: parse_id(i) for p, i in last_ids(client, stream).items()}
        wait_for("latency events committed", lambda: poller.first(lat_ends, drained) is not None,
                 300, procs=procs)
        poller.done.set()
        poller.join()
        lat = latencies(client, stream, poller.samples, since_ms)
        client.set(f"bench:{stream}:stop", 1)
        for p in procs:
            p.wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    report = verify(client, stream)
    per = [json.loads(Path(o).read_text()) for o in outs]
    t_drain, _, ev_drain = poller.samples[drained]
    t_first, _, ev_first = poller.samples[first_done]
    drain_s = (t_drain - gate_ms) / 1000
    # steady: from the sample where every driver has committed its first backlog batch to
    # the one where the first driver is done (empty when a driver needed one batch only)
    started = max(next(i for i, (_, _, ev) in enumerate(poller.samples)
                       if sum(ev[p] for p in share) > 0) for share in shares)
    t_start, _, ev_start = poller.samples[started]
    steady_s = max(0.0, (t_first - t_start) / 1000)
    steady_rows = sum(ev_first) - sum(ev_start) if steady_s > 0 else 0
    return {
        "workers": workers, "master": master, "shares": SHARES[workers], "backlog": events,
        "drivers_ready_s": ready_s, "drain_s": drain_s, "drain_eps": sum(ev_drain) / drain_s,
        "steady_s": steady_s, "steady_rows": steady_rows,
        "steady_eps": steady_rows / steady_s if steady_s > 0 else float("nan"),
        "backlog_rows_per_worker": [sum(ev_drain[p] for p in share) for share in shares],
        "rows_per_worker": [d["rows"] for d in per],
        "batches_per_worker": [d["batches"] for d in per],
        "session_s": [round(d["session_s"], 1) for d in per],
        "warm_s": [round(d["warm_s"], 1) for d in per],
        "lost": report.total("lost"), "duplicated": report.total("duplicated"),
        "clean": report.clean and report.caught_up,
        "latency": {"rate": rate, "seconds": seconds,
                    "produced_eps": produced.events / produced.seconds, **lat},
    }


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--master", default="local[*]", help="every driver's master")
    ap.add_argument("--driver-events", type=int, default=None,
                    help="backlog of the 1- and 3-driver runs (default 3 x --events)")
    ap.add_argument("--rate", type=float, default=5000.0, help="events/s for the latency run")
    ap.add_argument("--latency-seconds", type=float, default=30.0)
    ap.add_argument("--no-spark", action="store_true")
    ap.add_argument("--no-drivers", action="store_true", help="skip the 1- and 3-driver runs")
    ap.add_argument("--workers", default="1,3", help="driver runs: 1, 3 or 1,3")
    ap.add_argument("--only-drivers", action="store_true",
                    help="skip the in-process PySpark row (the driver runs and latency only)")
    ap.add_argument("--trigger", type=float, default=0.25,
                    help="the drivers' trigger interval, seconds (latency run)")
    ap.add_argument("--async-progress", action="store_true",
                    help="the drivers write Spark's offset/commit logs in the background")
    ap.add_argument("--read-on", choices=("tasks", "driver"), default="tasks",
                    help="every PySpark worker's --read-on")
    ap.add_argument("--startup", action="store_true",
                    help="only the start-up run: launch -> first committed batch")
    args = ap.parse_args()
    if args.startup:
        with RedisServer() as srv:
            load = os.getloadavg()[0]
            st = bench_startup(srv, master=args.master,
                               extra=["--read-on", args.read_on] if args.read_on != "tasks"
                               else [])
        print("\n".join(st["lines"]))
        print(f"worker launch -> first committed batch {st['first_commit_s']:.1f}s (session "
              f"line at {st['session_line_s']}s, query started at {st['query_line_s']}s); "
              f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}")
        return 0
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    load_start = list(os.getloadavg())
    rows: list[dict[str, Any]] = []
    spark3: dict[str, Any] = {}
    latency: dict[str, Any] = {}
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
        spark: dict[str, Any] = {}
        if not args.no_spark and not args.only_drivers:
            backlog(client, "spark", args.events)
            spark = bench_spark(client, srv.url, "spark", args.master, args.read_on)
            rows.append({"consumer": "PySpark worker, steady", "events": spark["steady_rows"],
                         "seconds": spark["steady_rows"] / spark["steady_eps"],
                         "events_per_s": spark["steady_eps"]})
            rows.append({"consumer": "PySpark, from query start", "events": spark["rows"],
                         "seconds": spark["rows"] / spark["overall_eps"],
                         "events_per_s": spark["overall_eps"]})
        if not args.no_spark and not args.no_drivers:
            spark3, latency = bench_drivers(srv, args, rows)
    print(f"{'consumer':<30}{'events':>10}{'seconds':>10}{'events/s':>12}{'vs raw':>9}")
    for r in rows:
        r["ratio_to_raw"] = r["events_per_s"] / raw_eps
        print(f"{r['consumer']:<30}{int(r['events']):>10}{r['seconds']:>10.2f}"
              f"{r['events_per_s']:>12.0f}{r['ratio_to_raw']:>9.2f}")
    if spark:
        print(f"SparkSession start-up {spark['session_s']:.1f}s; first committed batch "
              f"{spark['first_batch_s']:.1f}s after launch; {int(spark['batches'])} batches")
        print_stages(spark["stages"])
    print_drivers(spark3, latency)
    meta = {"events": args.events, "partitions": PARTS, "master": args.master,
            "read_on": args.read_on,
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "load_avg_1m": os.getloadavg()[0], "load_avg": list(os.getloadavg()),
            "load_avg_start": load_start,
            "rate": args.rate, "latency_seconds": args.latency_seconds,
            "driver_events": args.driver_events or 3 * args.events}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"meta": meta, "results": rows, "spark": spark, "spark3": spark3,
                               "latency": latency}, indent=2) + "\n")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; wrote {OUT}")
    return 0


def bench_drivers(srv: RedisServer, args: argparse.Namespace,
                  rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The 1-driver and 3-driver runs: (spark3, latency) sections of the JSON."""
    runs: dict[int, dict[str, Any]] = {}
    events = args.driver_events or 3 * args.events
    with tempfile.TemporaryDirectory(prefix="kgroup-bench-drivers-") as tmp:
        for workers in (int(w) for w in args.workers.split(",")):
            try:
                runs[workers] = drivers(srv, workers=workers, events=events,
                                        master=args.master, rate=args.rate,
                                        seconds=args.latency_seconds, tmp=tmp,
                                        trigger=args.trigger,
                                        async_progress=args.async_progress,
                                        read_on=args.read_on)
            except (RuntimeError, TimeoutError, AssertionError, OSError) as exc:
                logs = sorted(Path(tmp).glob(f"d{workers}-*.log"))
                tail = logs[-1].read_text(errors="replace")[-800:] if logs else ""
                runs[workers] = {"fell_short": f"{type(exc).__name__}: {exc}", "log_tail": tail}
                print(f"{workers} driver(s) fell short: {exc}\n{tail}", file=sys.stderr)
    latency: dict[str, Any] = {"method": LATENCY_METHOD, "rate": args.rate,
                               "seconds": args.latency_seconds, "trigger_s": args.trigger,
                               "async_progress": args.async_progress, "read_on": args.read_on}
    for workers, r in runs.items():
        if "fell_short" in r:
            continue
        latency[f"workers_{workers}"] = r.pop("latency")
        rows.append({"consumer": f"{workers} PySpark driver{'s' if workers > 1 else ''}, "
                                 "warmed, drain", "events": r["backlog"],
                     "seconds": r["drain_s"], "events_per_s": r["drain_eps"]})
    spark3 = dict(runs.get(3, {}))
    spark3["single"] = runs.get(1, {})
    if "drain_eps" in spark3 and "drain_eps" in spark3["single"]:
        spark3["ratio_to_single"] = spark3["drain_eps"] / spark3["single"]["drain_eps"]
        spark3["steady_ratio_to_single"] = (spark3["steady_eps"]
                                            / spark3["single"]["steady_eps"])
    return spark3, latency


def print_drivers(spark3: dict[str, Any], latency: dict[str, Any]) -> None:
    for r in (spark3.get("single", {}), spark3):
        if "drain_eps" not in r:
            if "fell_short" in r:
                print(f"drivers fell short: {r['fell_short']}")
            continue
        print(f"{r['workers']} driver(s) {r['shares']} on {r['master']}: drain "
              f"{r['drain_eps']:.0f} events/s ({r['drain_s']:.2f}s), steady window "
              f"{r['steady_eps']:.0f} events/s ({r['steady_rows']} rows in {r['steady_s']:.2f}s); "
              f"backlog rows per driver {r['backlog_rows_per_worker']}; lost {r['lost']}, "
              f"duplicated {r['duplicated']}, clean {r['clean']}; session {r['session_s']}s, "
              f"warm-up {r['warm_s']}s")
    if "ratio_to_single" in spark3:
        print(f"3 drivers / 1 driver: drain x{spark3['ratio_to_single']:.2f}, steady window "
              f"x{spark3['steady_ratio_to_single']:.2f} ({os.cpu_count()} cores)")
    for key, lat in latency.items():
        if key.startswith("workers_"):
            print(f"latency produce -> commit, {key[8:]} driver(s), {lat['produced_eps']:.0f} "
                  f"events/s for {latency['seconds']:.0f}s ({int(lat['events'])} events): "
                  f"p50 {lat['p50_ms']:.0f} ms, p95 {lat['p95_ms']:.0f} ms, max "
                  f"{lat['max_ms']:.0f} ms (upper bounds; lower-bound p50 "
                  f"{lat['p50_lower_ms']:.0f} ms; poll gap p50 {lat['poll_gap_p50_ms']:.0f} ms, "
                  f"max {lat['poll_gap_max_ms']:.0f} ms)")


if __name__ == "__main__":
    raise SystemExit(main())
