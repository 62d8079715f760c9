"""Reshapes on the data path: per-key order, losses and the pause a key sees.

No Kubernetes: a private redis-server, the reference producer following the layout
(``kgroup.producer``), light workers on the scripted coordinator, and the group's side of
a reshape played in-process (``kgroup_testing.reshape.Conductor``: assign only partitions
whose predecessors are completed, record completions). So the figures are the data
path's own (seal, drain, completion, successor start), not the sidecars' and operator's
hand-over times.

Events flow at ``--rate`` for the whole run; the layout goes through ``--sequence``, one
reshape every ``--interval`` seconds; workers start ``--lag`` seconds late (a backlog),
one crashes 0.5 s after the first reshape (or after the workers start), one joins after
the second, one leaves gracefully after the third (``--no-churn``: none of these).

The pause a key sees at a reshape: from its first event written to a successor to that
event's commit (the first time the successor's sink lists the key), polled every 20 ms;
it includes the wait for every predecessor to be completed. ``steady``: for comparison,
the latency of every 10th event of the first generation before the first reshape (from
its write to the sink's committed offset passing it, polled the same way).

    .venv/bin/python bench/bench_reshape_pipeline.py [--sequence 16,24,8,16] [--rate 2000]

``--no-wait`` is the broken variant (successors assigned at once): with a backlog
(``--lag 2``) the verifier reports keys out of order and the exit status is 1.

Prints the verifier's table, then one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from bisect import bisect_left
from collections.abc import Sequence
from typing import cast

import redis

from kgroup.producer import LayoutProducer, Uniform, initial, stream_key
from kgroup_pipeline.keys import StreamKeys, parse_id
from kgroup_pipeline.producer import Produced, produce
from kgroup_pipeline.redis_server import RedisServer
from kgroup_pipeline.scripted import ScriptedCoordinator
from kgroup_pipeline.verify import render, verify
from kgroup_testing.reshape import Conductor, Workers

STREAM = "bench"


class FirstSeen:
    """When each (partition, key) first appears in the sink, on this process' clock
    (seconds since the epoch, comparable with stream ids' milliseconds)."""

    def __init__(self, client: redis.Redis, conductor: Conductor) -> None:
        self.client, self.conductor = client, conductor
        self.names = StreamKeys(STREAM)
        self.seen: dict[tuple[int, str], float] = {}
        self.offsets: dict[int, list[tuple[float, tuple[int, int]]]] = {}
        """partition -> (when, committed offset) at every change seen."""
        self.partitions: set[int] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="first-seen", daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            self.partitions |= self.conductor.lineage.partitions
            parts = sorted(self.partitions)
            pipe = self.client.pipeline(transaction=False)
            for p in parts:
                pipe.hkeys(self.names.sink_count(p))
                pipe.hget(self.names.sink_partition(p), "offset")
            raw = pipe.execute()
            now = time.time()
            for i, p in enumerate(parts):
                for k in raw[2 * i]:
                    self.seen.setdefault((p, str(k)), now)
                if raw[2 * i + 1]:
                    offset = parse_id(str(raw[2 * i + 1]))
                    seen = self.offsets.setdefault(p, [])
                    if not seen or seen[-1][1] != offset:
                        seen.append((now, offset))
            self.stop.wait(0.02)


def entries(client: redis.Redis, partition: int) -> list[tuple[str, dict[str, str]]]:
    return cast("list[tuple[str, dict[str, str]]]",
                client.xrange(stream_key(STREAM, partition)))


def first_written(client: redis.Redis, partition: int) -> dict[str, float]:
    """key -> when its first event in the partition was written (its stream id's ms)."""
    out: dict[str, float] = {}
    for entry_id, fields in entries(client, partition):
        key = fields.get("key")
        if key is not None and key not in out:
            out[str(key)] = int(str(entry_id).split("-")[0]) / 1000
    return out


def steady_latencies(client: redis.Redis, first_seen: FirstSeen, partitions: list[int],
                     since: float, until: float) -> list[float]:
    """Every 10th event written in [since, until) to these partitions: from its write to the
    first time the sink's committed offset was seen at or past it."""
    out: list[float] = []
    for p in partitions:
        seen = first_seen.offsets.get(p, [])
        times, offsets = [t for t, _ in seen], [o for _, o in seen]
        for i, (entry_id, _) in enumerate(entries(client, p)):
            ident = parse_id(str(entry_id))
            written = ident[0] / 1000
            if i % 10 or not since <= written < until:
                continue
            j = bisect_left(offsets, ident)
            if j < len(offsets):
                out.append(max(0.0, times[j] - written))
    return out


def seal_cost(client: redis.Redis, count: int) -> float:
    """A switch ``count`` -> 2 x ``count`` on the data path: ms to seal the ``count``
    replaced partitions (one script call: a marker and a record each)."""
    old = initial(count)
    new = old.reshape(Uniform(2 * count))
    producer = LayoutProducer(client, "sealcost", lambda: old)
    keys = [f"k{i}" for i in range(4 * count)]
    producer.send(keys, [{"key": k} for k in keys])
    producer.layout = lambda: new
    t = time.perf_counter()
    producer.lineage  # noqa: B018  (reads the layout: seals what it replaced)
    return round((time.perf_counter() - t) * 1000, 1)


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def schedule(args: argparse.Namespace, counts: list[int]) -> list[tuple[float, str]]:
    steps = [(args.interval * (i + 1), f"reshape {c}") for i, c in enumerate(counts[1:])]
    steps += [(args.lag, "start")]
    if args.no_churn:
        return sorted(steps)
    if len(counts) > 1:
        steps.append((max(args.interval, args.lag) + 0.5, "crash w0"))
    if len(counts) > 2:
        steps.append((2 * args.interval + 0.5, "join w9"))
    if len(counts) > 3:
        steps.append((3 * args.interval + 0.5, "leave w1"))
    return sorted(steps)


def act(action: str, conductor: Conductor, workers: Workers, gen_of: dict[int, int]) -> None:
    """One step of the schedule; ``gen_of`` learns each new partition's generation."""
    verb, _, what = action.partition(" ")
    if verb == "start":
        for m in conductor.members:
            workers.start(m)
    elif verb == "reshape":
        conductor.reshape(int(what))
        gen_of.update({p: conductor.lineage.latest.number
                       for p in conductor.lineage.latest.partitions if p not in gen_of})
    elif verb == "crash":
        conductor.leave(what)
        workers.crash(what)
    elif verb == "join":
        conductor.join(what)
        workers.start(what)
    elif verb == "leave":  # its hand-back runs beside the group's side, as in a pod
        conductor.leave(what)
        threading.Thread(target=workers.leave, args=(what,), daemon=True).start()


def run(args: argparse.Namespace, url: str, client: redis.Redis) -> dict[str, object]:
    counts = [int(c) for c in args.sequence.split(",")]
    coord = ScriptedCoordinator(sum(counts) + 1)
    conductor = Conductor(coord, initial(counts[0]), [f"w{i}" for i in range(args.workers)],
                          wait=not args.no_wait)
    workers = Workers(url, STREAM, coord, max_rows=args.max_rows)
    first_seen = FirstSeen(redis.Redis.from_url(url, decode_responses=True), conductor)
    first_seen.thread.start()
    duration = args.interval * len(counts)
    produced: list[Produced] = []
    producer = threading.Thread(target=lambda: produced.append(produce(
        redis.Redis.from_url(url, decode_responses=True), stream=STREAM,
        layout=conductor.layout, duration=duration, rate=args.rate, keys=args.keys,
        seed=1, chunk=max(1, int(args.rate // 20)))))
    start, wall = time.monotonic(), time.time()
    producer.start()
    gen_of: dict[int, int] = {p: 1 for p in range(counts[0])}
    for at, action in schedule(args, counts):
        while time.monotonic() - start < at:
            conductor.step()
            time.sleep(0.02)
        act(action, conductor, workers, gen_of)
    while producer.is_alive():  # the group's side keeps going while events flow
        conductor.step()
        time.sleep(0.02)
    producer.join()
    deadline = time.monotonic() + args.settle
    while not (conductor.done() and verify(client, STREAM).caught_up):
        if time.monotonic() > deadline:
            break
        conductor.step()
        time.sleep(0.05)
    time.sleep(0.1)
    first_seen.stop.set()
    first_seen.thread.join()
    workers.stop_all()
    seconds = time.monotonic() - start
    report = verify(client, STREAM)
    print(render(report))
    by_gen: dict[int, list[float]] = {}
    for p, g in gen_of.items():
        for key, written in first_written(client, p).items():
            seen = first_seen.seen.get((p, key))
            if seen is not None:
                by_gen.setdefault(g, []).append(max(0.0, seen - written))
    by_gen.pop(1, None)  # a key's first event at start-up: no reshape in its way
    pauses = [x for xs in by_gen.values() for x in xs]
    steady = steady_latencies(client, first_seen, list(range(counts[0])), wall + args.lag + 1,
                              wall + args.interval - 0.2)
    return {
        "seal_1000_partitions_ms": seal_cost(client, 1000),
        "sequence": args.sequence, "rate": args.rate, "keys": args.keys,
        "produced": report.total("produced"), "committed": report.total("committed"),
        "lost": report.total("lost"), "duplicated": report.total("duplicated"),
        "keys_lost": report.keys_lost, "keys_duplicated": report.keys_duplicated,
        "keys_out_of_order": report.keys_out_of_order, "past_seal": report.total("past_seal"),
        "generations": report.generations, "caught_up": report.caught_up,
        "sealed_partitions": len(client.hgetall(StreamKeys(STREAM).seals)),
        "producer_refused": sum(p.refused for p in produced),
        "pause_p50_s": pct(pauses, 0.5), "pause_p99_s": pct(pauses, 0.99),
        "pause_max_s": pct(pauses, 1.0), "pause_samples": len(pauses),
        "steady_p50_s": pct(steady, 0.5) if steady else None,
        "steady_p99_s": pct(steady, 0.99) if steady else None,
        "pause_by_generation": {g: [pct(xs, 0.5), pct(xs, 0.99)]
                                for g, xs in sorted(by_gen.items())},
        "most_partitions_waiting": conductor.most_waiting,
        "seconds": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_reshape_pipeline")
    ap.add_argument("--sequence", default="16,24,8,16")
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=4.0, help="seconds between reshapes")
    ap.add_argument("--lag", type=float, default=0.0, help="workers start this late")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--max-rows", type=int, default=2000)
    ap.add_argument("--settle", type=float, default=120.0)
    ap.add_argument("--no-wait", action="store_true",
                    help="broken variant: successors assigned before their predecessors "
                         "are completed")
    ap.add_argument("--no-churn", action="store_true",
                    help="no crash, join or leave: the reshapes alone")
    args = ap.parse_args(argv)
    with RedisServer() as server:
        result = run(args, server.url, server.client())
    print(json.dumps(result))
    return 0 if result["lost"] == result["duplicated"] == result["keys_out_of_order"] == 0 \
        and result["caught_up"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
