"""How soon a PySpark worker commits partitions granted to it after it joined.

Rule: timings live here, never in tests. A rollout hands an old pod's partitions to a new
pod whose app has just joined (asked its sidecar for the first time); what those
partitions then wait for is the new app's next batches. This measures that wait without
Kubernetes: a scripted sidecar (:mod:`kgroup_pipeline.scripted`, the local API a real
sidecar serves) serves a worker process (``python -m kgroup_pipeline.worker``, a cold JVM
as in a pod) that owns nothing at first; ``--grant-after`` seconds after the worker's
first ask the sidecar grants it every partition, while events flow into a real
redis-server. Reported per run: launch to first ask, grant to the first commit of every
granted partition (the slowest), and the worker's own start-up lines.

    .venv/bin/python bench/bench_first_batch.py [--runs 3] [--grant-after 1.8] [--master local[1]]

The last line is one JSON object: ``runs`` (each with ``first_ask_s`` and
``grant_to_commit_s``) and their median.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import redis

from kgroup_pipeline.keys import StreamKeys
from kgroup_pipeline.producer import produce
from kgroup_pipeline.redis_server import RedisServer
from kgroup_pipeline.scripted import ScriptedCoordinator, serve_sidecar

PARTS = 4


def one_run(redis_url: str, stream: str, *, grant_after: float, master: str,
            rate: float, timeout: float) -> dict[str, Any]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    stop = threading.Event()
    producer = threading.Thread(
        target=lambda: produce(client, stream=stream, partitions=PARTS,
                               duration=timeout * 3, rate=rate, seed=1, stop=stop.is_set),
        daemon=True)
    producer.start()
    coord = ScriptedCoordinator(PARTS)
    server, url = serve_sidecar(coord, "new")
    launched = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kgroup_pipeline.worker", "--redis", redis_url,
         "--stream", stream, "--sidecar", url, "--master", master, "--drain-timeout", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
    lines: list[str] = []
    assert proc.stdout is not None
    out = proc.stdout
    threading.Thread(target=lambda: lines.extend(line.rstrip() for line in out),
                     daemon=True).start()
    try:
        deadline = launched + timeout
        while coord.first_asked_at is None:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the worker never asked: {lines[-5:]}")
            time.sleep(0.02)
        first_ask = coord.first_asked_at - launched
        time.sleep(grant_after)
        coord.assign("new", list(range(PARTS)))
        granted = time.monotonic()
        keys = StreamKeys(stream)
        first: dict[int, float] = {}
        while len(first) < PARTS and time.monotonic() < granted + timeout:
            for p in range(PARTS):
                if p not in first and int(client.hget(keys.sink_partition(p), "events") or 0):
                    first[p] = time.monotonic() - granted
            time.sleep(0.02)
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=60)
        server.shutdown()
        server.server_close()
    return {"first_ask_s": round(first_ask, 2),
            "grant_to_commit_s": round(max(first.values()), 2) if len(first) == PARTS else None,
            "worker": [line for line in lines if line.startswith("worker:")]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--grant-after", type=float, default=1.8,
                    help="seconds between the worker's first ask and the grant")
    ap.add_argument("--master", default="local[1]")
    ap.add_argument("--rate", type=float, default=400.0, help="events/s")
    ap.add_argument("--timeout", type=float, default=180.0)
    args = ap.parse_args(argv)
    runs = []
    with RedisServer() as srv:
        for i in range(args.runs):
            run = one_run(srv.url, f"first-batch-{i}", grant_after=args.grant_after,
                          master=args.master, rate=args.rate, timeout=args.timeout)
            print(f"run {i + 1}: first ask {run['first_ask_s']} s after launch, grant to "
                  f"first commit {run['grant_to_commit_s']} s", flush=True)
            runs.append(run)
    waits = [r["grant_to_commit_s"] for r in runs if r["grant_to_commit_s"] is not None]
    print(json.dumps({
        "machine": {"nproc": os.cpu_count(), "load_average": os.getloadavg(),
                    "python": platform.python_version()},
        "grant_after_s": args.grant_after, "master": args.master, "runs": runs,
        "grant_to_commit_p50_s": statistics.median(waits) if waits else None,
        "missing": len(runs) - len(waits)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
