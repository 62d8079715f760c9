"""The events of ``bench/bench_load.py``: each partition's input written to real Redis
Streams at its own rate, the group's backlog read from them, and the verifier's count over
everything produced at the end.

Rule: what is produced goes through the project's producer (``EventWriter``: the stream and
its ledger in one fenced script call) and what is checked through its verifier
(``kgroup_pipeline.verify``), so ``lost`` and ``duplicated`` are the verifier's numbers,
not the benchmark's.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from kgroup_pipeline.keys import StreamKeys
from kgroup_pipeline.producer import EventWriter
from kgroup_pipeline.verify import Report, verify

STREAM = "load"
KEYS_PER_PARTITION = 16
TICK = 0.25  # seconds between two writes (each partition's due events in one call)
CHUNK = 1000  # events per script call at most (a tick late on a starved machine: several)


class Feed:
    """Writes each partition's input, ``rates()`` events/s per partition (read at every
    tick, so a change of rates applies within a tick), to its stream: keys picked among
    the ones the layout routes to that partition, the fraction of an event carried to the
    next tick, a tick's events in fenced calls of at most :data:`CHUNK` with the ledger.
    A call Redis fails is counted in ``errors`` and not tried again: the verifier counts
    what the ledger says was produced, which is what the streams hold either way."""

    def __init__(self, client: redis.Redis, partitions: int,
                 rates: Callable[[], Sequence[float]], *, seed: int = 1,
                 stream: str = STREAM) -> None:
        self.writer = EventWriter(client, stream=stream, partitions=partitions, seed=seed)
        self.rates = rates
        self.rng = random.Random(seed)
        self.pools: list[list[str]] = [[] for _ in range(partitions)]
        i = 0
        while min(len(p) for p in self.pools) < KEYS_PER_PARTITION:
            key = f"c{i:05d}"
            pool = self.pools[self.writer.partition_of(key)]
            if len(pool) < KEYS_PER_PARTITION:
                pool.append(key)
            i += 1
        self.carry = [0.0] * partitions
        self.produced = 0
        self.errors = 0  # writes Redis failed (their events dropped, or written with the ledger)

    def step(self, dt: float) -> int:
        """The events due over ``dt`` seconds, written; -> how many."""
        keys: list[str] = []
        for p, rate in enumerate(self.rates()):
            self.carry[p] += rate * dt
            n = int(self.carry[p])
            self.carry[p] -= n
            keys += [self.rng.choice(self.pools[p]) for _ in range(n)]
        self.rng.shuffle(keys)
        written = 0
        for i in range(0, len(keys), CHUNK):
            try:
                written += self.writer.write(keys[i:i + CHUNK]).events
            except redis.RedisError:
                self.errors += 1  # the writer reads its seqs from the ledger again
        self.produced += written
        return written

    def run(self, stop: threading.Event) -> None:
        last = time.monotonic()
        while not stop.wait(TICK):
            now = time.monotonic()
            self.step(now - last)
            last = now


def backlog(client: redis.Redis, partitions: int, stream: str = STREAM) -> int:
    """Entries written and not yet committed, over every partition (the stream is never
    trimmed: its length minus the sink's committed events), in one round trip."""
    keys = StreamKeys(stream)
    pipe = client.pipeline(transaction=False)
    for p in range(partitions):
        pipe.xlen(keys.partition(p))
        pipe.hget(keys.sink_partition(p), "events")
    raw = pipe.execute()
    return sum(max(0, int(raw[2 * i]) - int(raw[2 * i + 1] or 0)) for i in range(partitions))


def figures(report: Report) -> dict[str, Any]:
    """The verifier's report as the benchmark's JSON states it."""
    return {"lost": report.total("lost"), "duplicated": report.total("duplicated"),
            "keys_lost": report.keys_lost, "keys_duplicated": report.keys_duplicated,
            "keys_out_of_order": report.keys_out_of_order,
            "produced": report.total("produced"), "verified": report.total("committed"),
            "pending": report.total("pending"), "caught_up": report.caught_up,
            "clean": report.clean and report.ordered,
            "zombie_refused": report.zombie_refused, "replay_refused": report.replay_refused}


def verification(client: redis.Redis, *, wait: float, stream: str = STREAM) -> dict[str, Any]:
    """Once the producer has stopped: the verifier's count over everything produced, after
    every partition has caught up (or ``wait`` seconds: what is not caught up then is
    ``pending``, and ``caught_up`` is false)."""
    deadline = time.monotonic() + wait
    report = verify(client, stream)
    while not report.caught_up and time.monotonic() < deadline:
        time.sleep(1.0)
        report = verify(client, stream)
    return figures(report)
