"""kgroup's PySpark worker beside the spark-redis peer, on one Redis, in one run.

Rule: the peer (RedisLabs' spark-redis, Scala, ``format("redis")``) is never part of this
repository: its harness lives in the shared peers folder (``bench.py``, ``setup.sh``) and
its venv and jars outside the repo (``setup.sh`` with ``PEERS=~/.cache/kgroup/peers``).
When they are missing this bench says so and measures kgroup alone.

One redis-server; then, each in a child process of its own (a fresh JVM, as the peer's
harness does):

- raw XRANGE: redis-py reading the 16 stream keys in pages of 5,000 (median of 3), the
  ceiling for any Python reader of this Redis, as in ``bench_pipeline.py``; measured right
  before and right after the kgroup run (their mean is the "÷ raw" reference: on a shared
  machine the load changes by the minute), while the peer's harness measures its own right
  before its runs (printed beside its rows);
- kgroup: ``bench_pipeline.py``'s producer data (seed 42, 1,000 keys, 16 partitions, no
  malformed events), the whole backlog in Redis before the query starts, drained by one
  worker (source → fenced sink, admission control ``--max-rows`` per batch) on ``--master``;
  the verifier must find nothing lost or duplicated;
- spark-redis: the peer's own harness, ``--modes steady`` on this Redis (same generator and
  seed, its own keys): the backlog arrives in waves of ``--max-rows`` (it has no per-batch
  limit), read with ``stream.read.block`` 0 (its tuned setting).

Both report the same steady figure: rows of the batches after the first ÷ the sum of those
batches' Spark ``triggerExecution`` (the first batch pays the query's start). For kgroup the
wall-clock rate of the same batches (trigger waits included) is printed beside it.

    .venv/bin/python bench/bench_peer.py [--events 400000] [--master local[*]]
        [--peer-masters local[1],local[2]] [--no-peer]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pipeline import PARTS, backlog, bench_raw, stage_breakdown

from kgroup_pipeline.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "bench" / "peer.json"
PEERS = Path(os.environ.get("KGROUP_PEERS", Path.home() / ".cache" / "kgroup" / "peers"))


def peer_dir() -> Path | None:
    """The shared peers folder's spark-redis harness (beside the checkout or a level up)."""
    for base in (ROOT.parent, ROOT.parent.parent):
        d = base / "shared" / "peers" / "spark-redis"
        if (d / "bench.py").exists():
            return d
    return None


def kgroup_child(argv: list[str]) -> int:
    """One kgroup run: session, drain the backlog already in Redis, print one JSON line."""
    ap = argparse.ArgumentParser(prog="bench_peer.py --kgroup-child")
    ap.add_argument("--redis", required=True)
    ap.add_argument("--stream", required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--max-rows", type=int, required=True)
    args = ap.parse_args(argv)
    from kgroup_pipeline.verify import verify
    from kgroup_pipeline.worker import build_session, run

    client = redis.Redis.from_url(args.redis, decode_responses=True)
    t0 = time.monotonic()
    spark = build_session(args.master, app="kgroup-bench-peer")
    session_s = time.monotonic() - t0
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if verify(client, args.stream).caught_up:
                stop.set()
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="kgroup-bench-peer-") as ckpt:
        progress = run(redis_url=args.redis, stream=args.stream, ownership="static:0-15@1",
                       master=args.master, checkpoint=ckpt, stop=stop, quiet=True, spark=spark,
                       max_rows=args.max_rows)
    spark.stop()
    report = verify(client, args.stream)
    later = progress.spark[1:]
    rows = sum(b["rows"] for b in progress.stages[1:])
    trigger_ms = sum(float(b.get("triggerExecution", 0)) for b in later)
    hist = progress.history
    print(json.dumps({
        "master": args.master, "session_s": session_s, "rows": progress.rows,
        "batches": len(hist), "steady_rows": rows,
        "steady_eps": rows * 1000 / trigger_ms if trigger_ms else None,
        "steady_wall_eps": rows / (hist[-1][0] - hist[0][0]) if len(hist) > 1 else None,
        "lost": report.total("lost"), "duplicated": report.total("duplicated"),
        "clean": report.clean and report.caught_up, "stages": stage_breakdown(progress),
        "load_avg": list(os.getloadavg())}), flush=True)
    return 0


def run_kgroup(url: str, stream: str, master: str, max_rows: int) -> dict[str, Any]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    out = subprocess.run(
        [sys.executable, __file__, "--kgroup-child", "--redis", url, "--stream", stream,
         "--master", master, "--max-rows", str(max_rows)],
        capture_output=True, text=True, env=env, timeout=900, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            return dict(json.loads(line))
    return {"error": f"rc={out.returncode}", "log_tail": out.stderr[-2000:]}


def run_peer(port: int, events: int, masters: str, waves: int, python: Path, jars: Path,
             harness: Path) -> dict[str, Any]:
    cmd = [str(python), str(harness / "bench.py"), "--redis-port", str(port),
           "--events", str(events), "--keys", str(PARTS), "--masters", masters,
           "--modes", "steady", "--read-blocks", "0", "--waves", str(waves),
           "--raw-reps", "3", "--jars", str(jars)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False,
                         env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
    try:
        return dict(json.loads(out.stdout))
    except json.JSONDecodeError:
        return {"error": f"rc={out.returncode}", "log_tail": out.stderr[-2000:]}


def main() -> int:
    if sys.argv[1:2] == ["--kgroup-child"]:
        return kgroup_child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=400_000)
    ap.add_argument("--max-rows", type=int, default=100_000,
                    help="kgroup's rows per batch; the peer's wave size (events / waves)")
    ap.add_argument("--master", default="local[*]", help="kgroup's master")
    ap.add_argument("--peer-masters", default="local[1],local[2]")
    ap.add_argument("--peer-python", type=Path, default=PEERS / "spark-redis-venv/bin/python")
    ap.add_argument("--peer-jars", type=Path, default=PEERS / "spark-redis-jars")
    ap.add_argument("--no-peer", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    harness = peer_dir()
    peer_ready = (not args.no_peer and harness is not None and args.peer_python.exists()
                  and any(args.peer_jars.glob("*.jar")))
    if not peer_ready and not args.no_peer:
        print(f"peer not set up (harness {harness}, venv {args.peer_python}, jars "
              f"{args.peer_jars}): measuring kgroup alone; set it up with PEERS={PEERS} "
              "bash <shared>/peers/spark-redis/setup.sh", file=sys.stderr)
    result: dict[str, Any] = {"events": args.events, "partitions": PARTS,
                              "load_avg_start": list(os.getloadavg())}
    with RedisServer() as srv:
        client = srv.client()
        backlog(client, "raw", args.events)

        def raw_median() -> float:
            rates = [n / s for n, s in (bench_raw(client, "raw") for _ in range(3))]
            return float(statistics.median(rates))

        backlog(client, "kg", args.events)
        before = raw_median()  # raw beside each consumer: the load here changes by minutes
        result["kgroup"] = run_kgroup(srv.url, "kg", args.master, args.max_rows)
        after = raw_median()
        client.delete(*[f"kgroup:{{{s}}}:p:{p}" for p in range(PARTS) for s in ("raw", "kg")])
        result["raw_xrange_eps"] = statistics.mean((before, after))
        result["raw_xrange_before_after_kgroup"] = [before, after]
        if peer_ready:
            assert harness is not None
            result["peer"] = run_peer(srv.port, args.events, args.peer_masters,
                                      max(1, args.events // args.max_rows), args.peer_python,
                                      args.peer_jars, harness)
    result["load_avg_end"] = list(os.getloadavg())
    report(result)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT}")
    return 0


def report(r: dict[str, Any]) -> None:
    raw = r["raw_xrange_eps"]
    kg = r["kgroup"]
    print(f"{'consumer':<46}{'steady events/s':>16}{'÷ raw':>8}")
    print(f"{'raw XRANGE (redis-py), beside kgroup':<46}{raw:>16.0f}{1:>8.2f}   (before "
          f"{r['raw_xrange_before_after_kgroup'][0]:.0f}, after "
          f"{r['raw_xrange_before_after_kgroup'][1]:.0f}; median of 3 each)")
    if kg.get("steady_eps"):
        print(f"{'kgroup PySpark worker, ' + kg['master']:<46}{kg['steady_eps']:>16.0f}"
              f"{kg['steady_eps'] / raw:>8.2f}")
        print(f"  (wall clock {kg['steady_wall_eps']:.0f} events/s; {kg['batches']} batches; "
              f"lost {kg['lost']}, duplicated {kg['duplicated']}, clean {kg['clean']}; "
              f"load {kg['load_avg'][0]:.1f})")
    else:
        print(f"kgroup failed: {kg}")
    peer = r.get("peer", {})
    peer_raw = peer.get("raw_xrange", {}).get("eps_median")
    for run in peer.get("runs", []):
        eps = run.get("steady_eps")
        if not eps:
            print(f"spark-redis {run.get('master')} failed: {run.get('error')}")
            continue
        name = f"spark-redis 3.0.0, block 0, {run['master']}"
        own = f" ({eps / peer_raw:.2f} x the raw beside it)" if peer_raw else ""
        print(f"{name:<46}{eps:>16.0f}{eps / raw:>8.2f}{own}"
              + (f"   kgroup ÷ this: {kg['steady_eps'] / eps:.2f}" if kg.get("steady_eps")
                 else ""))
    if peer_raw:
        print(f"  (raw XRANGE beside the peer, by its harness just before its runs: "
              f"{peer_raw:.0f})")
    if "error" in peer:
        print(f"peer failed: {peer['error']}\n{peer.get('log_tail', '')}")
    print(f"load average at start {r['load_avg_start'][0]:.2f}, at end {r['load_avg_end'][0]:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
