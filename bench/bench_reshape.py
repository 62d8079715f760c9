"""Reshapes with the whole group side: per-key order, losses and the pause a key sees.

On the local control plane: the real operator (a subprocess scoped to the stage's
namespace), a real ``kgroup-sidecar`` process per worker (``real_sidecars.RealSidecars``
without its tiny app), light workers as the sidecars' apps (``SidecarOwnership``: they
read their assignment from the sidecar and hand a sealed partition back with
``completed``), a private redis-server, and the reference producer following the
group's ``status.layout`` (polled from the API server every 0.1 s). The benchmark only
changes ``spec.partitions`` (``spec.reshape.policy`` Generations, the default); the
operator, the sidecars and the workers do the rest.

Events flow at ``--rate`` for the whole run; ``spec.partitions`` goes through
``--sequence``, one change every ``--interval`` seconds. The pause a key sees at a
reshape is measured as in ``bench_reshape_pipeline.py`` (from its first event written
to a successor to the first time the successor's sink lists the key), and so includes
the operator's and sidecars' hand-over: the completion recorded on the Lease, the
operator's next pass, the successor's Lease created and marked, the sidecar's
acquisition, the worker's next plan.

    .venv/bin/python bench/bench_reshape.py [--sequence 16,24,8,16] [--rate 2000]

Prints the verifier's table, then one JSON object on its last line; exit 1 on any loss,
duplicate or key out of order.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

import redis
from bench_reshape_pipeline import STREAM, FirstSeen, first_written, pct, steady_latencies
from real_sidecars import RealSidecars
from stage import Stage, machine, wait_until

from kgroup import constants as C
from kgroup.core.layout_status import layout_from_status
from kgroup.producer import Lineage, initial
from kgroup_pipeline.keys import StreamKeys
from kgroup_pipeline.light_worker import LightWorker
from kgroup_pipeline.ownership import SidecarOwnership
from kgroup_pipeline.producer import Produced, produce
from kgroup_pipeline.redis_server import RedisServer
from kgroup_pipeline.verify import render, verify


class StatusLayout:
    """The group's ``status.layout``, polled from the API server; ``lineage`` is the
    latest decoded (what a producer's watch would hold), never older than the last."""

    def __init__(self, st: Stage, partitions: int) -> None:
        self.st = st
        self.lineage: Lineage = initial(partitions)
        self.generation_of: dict[int, int] = {p: 1 for p in range(partitions)}
        self.most_waiting = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="layout", daemon=True)

    def __call__(self) -> Lineage:
        return self.lineage

    def run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                raw = self.st.status().get("layout")
            except Exception:  # the API server busy: the next poll
                continue
            if raw is None:
                continue
            lineage = layout_from_status(raw, len(self.lineage.latest.partitions))
            if lineage.latest.number < self.lineage.latest.number:
                continue
            self.lineage = lineage
            for p in lineage.latest.partitions:
                self.generation_of.setdefault(p, lineage.latest.number)
            waiting = len(lineage.partitions - lineage.completed - lineage.assignable())
            self.most_waiting = max(self.most_waiting, waiting)


class Workers:
    """One light worker per sidecar, each in a thread of this process."""

    def __init__(self, url: str, ports: dict[str, int], max_rows: int) -> None:
        self.stop = threading.Event()
        self.threads = []
        for pod, port in ports.items():
            worker = LightWorker(client=redis.Redis.from_url(url, decode_responses=True),
                                 stream=STREAM, max_rows=max_rows, idle_wait=0.01,
                                 ownership=SidecarOwnership(f"http://127.0.0.1:{port}"))
            self.threads.append(threading.Thread(target=self._loop, args=(worker,),
                                                 name=f"worker-{pod}", daemon=True))
        self.errors = 0
        for t in self.threads:
            t.start()

    def _loop(self, worker: LightWorker) -> None:
        while not self.stop.is_set():
            try:
                if worker.run_once() == 0:
                    time.sleep(0.01)
            except Exception:  # a sidecar answer lost: the next batch
                self.errors += 1
                time.sleep(0.1)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)


def run(args: argparse.Namespace, st: Stage, url: str, client: redis.Redis) -> dict[str, Any]:
    counts = [int(c) for c in args.sequence.split(",")]
    pods = [f"w{i}" for i in range(args.workers)]
    st.create_group(partitions=counts[0], window=0, duration=6, renew=2, drain=10)
    st.start_operator()
    st.pods(pods)
    sidecars = RealSidecars(st, pods, args.base_port, app=False)
    layout = StatusLayout(st, counts[0])
    workers: Workers | None = None
    try:
        workers = Workers(url, dict(sidecars.ports), args.max_rows)
        wait_until("the group stable", lambda: st.stable_with(len(pods)), timeout=120)
        layout.thread.start()
        first_seen = FirstSeen(redis.Redis.from_url(url, decode_responses=True), layout)
        first_seen.thread.start()
        duration = args.interval * len(counts)
        produced: list[Produced] = []
        producer = threading.Thread(target=lambda: produced.append(produce(
            redis.Redis.from_url(url, decode_responses=True), stream=STREAM,
            layout=layout, duration=duration, rate=args.rate, keys=args.keys,
            seed=1, chunk=max(1, int(args.rate // 20)))))
        start, wall = time.monotonic(), time.time()
        producer.start()
        for i, count in enumerate(counts[1:], start=1):
            while time.monotonic() - start < args.interval * i:
                time.sleep(0.05)
            st.custom.patch_namespaced_custom_object(
                C.API_GROUP, C.API_VERSION, st.ns, C.PLURAL, st.group,
                {"spec": {"partitions": count}})
        producer.join()
        deadline = time.monotonic() + args.settle

        def done() -> bool:
            lin = layout.lineage
            return len(lin.generations) == 1 and verify(client, STREAM).caught_up

        while not done() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.1)
        first_seen.stop.set()
        first_seen.thread.join()
        seconds = time.monotonic() - start
    finally:
        layout.stop.set()
        if workers is not None:
            workers.close()
        sidecars.close()
    report = verify(client, STREAM)
    print(render(report))
    by_gen: dict[int, list[float]] = {}
    for p, g in layout.generation_of.items():
        for key, written in first_written(client, p).items():
            seen = first_seen.seen.get((p, key))
            if seen is not None:
                by_gen.setdefault(g, []).append(max(0.0, seen - written))
    by_gen.pop(1, None)  # a key's first event at start-up: no reshape in its way
    pauses = [x for xs in by_gen.values() for x in xs]
    steady = steady_latencies(client, first_seen, list(range(counts[0])), wall + 1,
                              wall + args.interval - 0.2)
    return {
        "sequence": args.sequence, "rate": args.rate, "keys": args.keys,
        "workers": args.workers, "interval_s": args.interval,
        "produced": report.total("produced"), "committed": report.total("committed"),
        "lost": report.total("lost"), "duplicated": report.total("duplicated"),
        "keys_lost": report.keys_lost, "keys_duplicated": report.keys_duplicated,
        "keys_out_of_order": report.keys_out_of_order, "past_seal": report.total("past_seal"),
        "generations": report.generations, "caught_up": report.caught_up,
        "generations_kept_at_end": len(layout.lineage.generations),
        "sealed_partitions": len(client.hgetall(StreamKeys(STREAM).seals)),
        "producer_refused": sum(p.refused for p in produced),
        "pause_p50_s": pct(pauses, 0.5), "pause_p99_s": pct(pauses, 0.99),
        "pause_max_s": pct(pauses, 1.0), "pause_samples": len(pauses),
        "steady_p50_s": pct(steady, 0.5) if steady else None,
        "steady_p99_s": pct(steady, 0.99) if steady else None,
        "pause_by_generation": {g: [pct(xs, 0.5), pct(xs, 0.99)]
                                for g, xs in sorted(by_gen.items())},
        "most_partitions_waiting": layout.most_waiting,
        "worker_errors": workers.errors if workers is not None else None,
        "seconds": round(seconds, 1),
        "machine": machine(st.cluster),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_reshape")
    ap.add_argument("--sequence", default="16,24,8,16")
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=20.0,
                    help="seconds between changes of spec.partitions")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--max-rows", type=int, default=2000)
    ap.add_argument("--settle", type=float, default=300.0)
    ap.add_argument("--base-port", type=int, default=18470)
    args = ap.parse_args(argv)
    st = Stage("bench-reshape")
    try:
        with RedisServer() as server:
            result = run(args, st, server.url, server.client())
    finally:
        try:
            st.close()
        except Exception as exc:  # the control plane gone first: the figures still stand
            print(f"closing the stage: {exc!r}", file=sys.stderr)
    print(json.dumps(result))
    return 0 if result["lost"] == result["duplicated"] == result["keys_out_of_order"] == 0 \
        and result["caught_up"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
