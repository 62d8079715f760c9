"""Producer of keyed events, with its own ledger, for tests, benchmarks and demos.

Rule: the stream and the ledger never disagree. Each chunk of events is written with its
ledger update (per-key last seq and amount total, per-partition counts, per partition and
key counts) in one fenced script call (``kgroup.producer``: refused whole when a partition
it touches is sealed, then routed again by the newer layout), so a producer killed at any
instant leaves a ledger that matches the stream.

An event is a Redis stream entry with fields ``key`` (customer id), ``amount`` (integer
cents), ``event`` (unique id) and ``seq`` (per-key sequence number, from 1, no gaps). With
``bad_every=N`` every Nth event is malformed instead (no ``amount`` or a non-numeric one,
no ``seq``): it takes no seq and is counted in the ledger as bad.

    python -m kgroup_pipeline.producer --redis URL --stream NAME --partitions 16 \
        --rate 5000 --duration 30 --keys 1000 [--layout-file layout.json]

``--layout-file``: the group's ``status.layout`` as JSON, read again when it changes (no
file: ``crc32 % --partitions``); the producer follows it (``kgroup.producer``).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis

from kgroup.producer import FileLayout, LayoutProducer, Lineage, SideWrite, initial, route
from kgroup_pipeline.keys import StreamKeys


@dataclass
class Produced:
    events: int = 0
    bad: int = 0
    seconds: float = 0.0
    refused: int = 0  # chunks a seal refused (written again by the newer layout)
    generations: set[int] = field(default_factory=set)


def _ledger(names: StreamKeys, keys: list[str], seqs: dict[str, int],
            amounts: list[int | None]) -> Callable[[Sequence[int]], list[SideWrite]]:
    """The ledger's writes for one chunk, given the partition each event was routed to:
    per key its last seq and amount total, per partition its well-formed and malformed
    counts, per partition and key its well-formed count."""
    def side(parts: Sequence[int]) -> list[SideWrite]:
        totals: Counter[str] = Counter()
        good: Counter[int] = Counter()
        bad: Counter[int] = Counter()
        per_key: Counter[tuple[int, str]] = Counter()
        for key, part, amount in zip(keys, parts, amounts, strict=True):
            if amount is None:
                bad[part] += 1
                continue
            totals[key] += amount
            good[part] += 1
            per_key[part, key] += 1
        out = [SideWrite("hset", names.produced_seq, k, seqs[k]) for k in sorted(totals)]
        out += [SideWrite("hincrby", names.produced_total, k, a) for k, a in totals.items()]
        out += [SideWrite("hincrby", names.produced_count, str(p), c) for p, c in good.items()]
        out += [SideWrite("hincrby", names.produced_bad, str(p), c) for p, c in bad.items()]
        out += [SideWrite("hincrby", names.produced_keys(p), k, c)
                for (p, k), c in per_key.items()]
        return out
    return side


class EventWriter:
    """Writes one event per given key, with its ledger, in one fenced script call: the
    part of :func:`produce` for a caller that paces and picks keys itself (e.g. a
    benchmark giving each partition its own rate picks keys :meth:`partition_of` routes
    there). Keys are placed by ``layout()`` or by ``crc32 % partitions``, as in
    :func:`produce`; seqs continue from the ledger's. A write that fails (a Redis error:
    it may or may not have been applied, the ledger with it) makes the writer read the
    seqs from the ledger again before its next write, so seqs never get a gap."""

    def __init__(self, client: redis.Redis, *, stream: str, partitions: int | None = None,
                 layout: Callable[[], Lineage] | None = None, seed: int | None = None) -> None:
        self.names = StreamKeys(stream)
        if layout is None:
            if partitions is None:
                raise ValueError("give partitions or layout")
            stored = client.hget(self.names.meta, "partitions")
            if stored is not None and int(stored) != partitions:
                raise ValueError(f"stream {stream} has {int(stored)} partitions, "
                                 f"not {partitions}")
            client.hset(self.names.meta, "partitions", partitions)
            fixed = initial(partitions)
            layout = lambda: fixed  # noqa: E731
        self.layout: Callable[[], Lineage] = layout
        self.producer = LayoutProducer(client, stream, layout)
        self.rng = random.Random(seed)
        self.run = uuid.uuid4().hex[:8]
        self.n = 0
        self.client = client
        self.seqs: dict[str, int] = {}
        self.stale = True  # the seqs are to be read from the ledger before a write

    def partition_of(self, key: str) -> int:
        """The partition the current layout writes ``key`` to."""
        return route(self.layout(), key)

    def write(self, keys: Sequence[str], bad_every: int = 0) -> Produced:
        """One event per key (every ``bad_every``-th malformed), all or nothing."""
        if self.stale:
            self.seqs = {str(k): int(v) for k, v in
                         self.client.hgetall(self.names.produced_seq).items()}
            self.stale = False
        events: list[dict[str, str | int]] = []
        amounts: list[int | None] = []
        for key in keys:
            self.n += 1
            fields: dict[str, str | int]
            if bad_every and self.n % bad_every == 0:
                fields = {"key": key, "event": f"{self.run}-{self.n}"}
                if (self.n // bad_every) % 2:
                    fields["amount"] = "12x"
                amounts.append(None)
            else:
                self.seqs[key] = self.seqs.get(key, 0) + 1
                amount = self.rng.randint(1, 10_000)
                fields = {"key": key, "amount": amount, "event": f"{self.run}-{self.n}",
                          "seq": self.seqs[key]}
                amounts.append(amount)
            events.append(fields)
        self.stale = True  # until the write is known to be applied
        sent = self.producer.send(list(keys), events,
                                  _ledger(self.names, list(keys), self.seqs, amounts))
        self.stale = False
        bad = sum(a is None for a in amounts)
        return Produced(events=len(amounts) - bad, bad=bad, refused=sent.refused,
                        generations={sent.generation})


def produce(
    client: redis.Redis,
    *,
    stream: str,
    partitions: int | None = None,
    layout: Callable[[], Lineage] | None = None,
    count: int | None = None,
    duration: float | None = None,
    rate: float = 0.0,
    keys: int = 1000,
    bad_every: int = 0,
    seed: int | None = None,
    chunk: int = 500,
    stop: Callable[[], bool] | None = None,
) -> Produced:
    """Write events until `count` or `duration` is reached (or `stop()` says so); `rate`
    0 means as fast as possible. Keys are placed by ``layout()``, the group's partition
    lineage read at every chunk (``kgroup.producer``: it seals what a new generation
    replaced and is fenced by the seals), or by ``crc32 % partitions`` (one generation)."""
    if count is None and duration is None:
        raise ValueError("give count or duration")
    writer = EventWriter(client, stream=stream, partitions=partitions, layout=layout,
                         seed=seed)
    rng = writer.rng
    key_names = [f"c{i:05d}" for i in range(keys)]
    out = Produced()
    start = time.monotonic()
    n = 0
    while True:
        elapsed = time.monotonic() - start
        if (count is not None and n >= count) or (duration is not None and elapsed >= duration) \
                or (stop is not None and stop()):
            break
        size = chunk if count is None else min(chunk, count - n)
        if rate > 0:
            ahead = (n + size) / rate - elapsed
            if ahead > 0:
                time.sleep(ahead)
        n += size
        sent = writer.write([key_names[rng.randrange(keys)] for _ in range(size)], bad_every)
        out.bad += sent.bad
        out.events += sent.events
        out.refused += sent.refused
        out.generations |= sent.generations
    out.seconds = time.monotonic() - start
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kgroup_pipeline.producer")
    ap.add_argument("--redis", default=os.environ.get("KGROUP_REDIS_URL"))
    ap.add_argument("--stream", required=True)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--rate", type=float, default=5000.0, help="events/s, 0 = unlimited")
    ap.add_argument("--duration", type=float, default=None, help="seconds")
    ap.add_argument("--count", type=int, default=None, help="events (instead of --duration)")
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--bad-every", type=int, default=0, help="every Nth event is malformed")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--layout-file", default=None,
                    help="the group's status.layout as JSON (re-read when it changes)")
    args = ap.parse_args(argv)
    if not args.redis:
        ap.error("--redis or KGROUP_REDIS_URL is required")
    if args.count is None and args.duration is None:
        args.duration = 30.0
    client = redis.Redis.from_url(args.redis, decode_responses=True)
    layout = FileLayout(args.layout_file, args.partitions) if args.layout_file else None
    out = produce(client, stream=args.stream, partitions=None if layout else args.partitions,
                  layout=layout, count=args.count,
                  duration=args.duration, rate=args.rate, keys=args.keys,
                  bad_every=args.bad_every, seed=args.seed)
    rate = out.events / out.seconds if out.seconds else 0.0
    print(f"produced {out.events} events + {out.bad} malformed to {args.stream} "
          f"in {out.seconds:.1f}s ({rate:.0f}/s); generations {sorted(out.generations)}, "
          f"{out.refused} chunks refused by a seal", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
