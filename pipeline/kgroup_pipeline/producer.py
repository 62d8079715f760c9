"""Producer of keyed events, with its own ledger, for tests, benchmarks and demos.

Rule: the stream and the ledger never disagree. Each chunk of events is written with its
ledger update (per-key last seq and amount total, per-partition counts) in one MULTI/EXEC
transaction, so a producer killed at any instant leaves a ledger that matches the stream.

An event is a Redis stream entry with fields ``key`` (customer id), ``amount`` (integer
cents), ``event`` (unique id) and ``seq`` (per-key sequence number, from 1, no gaps). With
``bad_every=N`` every Nth event is malformed instead (no ``amount`` or a non-numeric one,
no ``seq``): it takes no seq and is counted in the ledger as bad.

    python -m kgroup_pipeline.producer --redis URL --stream NAME --partitions 16 \
        --rate 5000 --duration 30 --keys 1000
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass

import redis

from kgroup_pipeline.keys import StreamKeys, partition_for


@dataclass
class Produced:
    events: int = 0
    bad: int = 0
    seconds: float = 0.0


def produce(
    client: redis.Redis,
    *,
    stream: str,
    partitions: int,
    count: int | None = None,
    duration: float | None = None,
    rate: float = 0.0,
    keys: int = 1000,
    bad_every: int = 0,
    seed: int | None = None,
    chunk: int = 500,
) -> Produced:
    """Write events until `count` or `duration` is reached; `rate` 0 means as fast as possible."""
    if count is None and duration is None:
        raise ValueError("give count or duration")
    names = StreamKeys(stream)
    stored = client.hget(names.meta, "partitions")
    if stored is not None and int(stored) != partitions:
        raise ValueError(f"stream {stream} has {int(stored)} partitions, not {partitions}")
    client.hset(names.meta, "partitions", partitions)
    rng = random.Random(seed)
    run = uuid.uuid4().hex[:8]
    key_names = [f"c{i:05d}" for i in range(keys)]
    key_part = {k: partition_for(k, partitions) for k in key_names}
    seqs: dict[str, int] = {str(k): int(v) for k, v in client.hgetall(names.produced_seq).items()}
    out = Produced()
    start = time.monotonic()
    n = 0
    while True:
        elapsed = time.monotonic() - start
        if count is not None and n >= count:
            break
        if duration is not None and elapsed >= duration:
            break
        size = chunk if count is None else min(chunk, count - n)
        if rate > 0:
            ahead = (n + size) / rate - elapsed
            if ahead > 0:
                time.sleep(ahead)
        pipe = client.pipeline(transaction=True)
        totals: Counter[str] = Counter()
        good: Counter[int] = Counter()
        bad: Counter[int] = Counter()
        touched: set[str] = set()
        for _ in range(size):
            n += 1
            key = key_names[rng.randrange(keys)]
            part = key_part[key]
            fields: dict[str, str | int]
            if bad_every and n % bad_every == 0:
                fields = {"key": key, "event": f"{run}-{n}"}
                if (n // bad_every) % 2:
                    fields["amount"] = "12x"
                bad[part] += 1
            else:
                seq = seqs.get(key, 0) + 1
                seqs[key] = seq
                amount = rng.randint(1, 10_000)
                fields = {"key": key, "amount": amount, "event": f"{run}-{n}", "seq": seq}
                totals[key] += amount
                good[part] += 1
                touched.add(key)
            pipe.xadd(names.partition(part), fields)  # type: ignore[arg-type]
        if touched:
            pipe.hset(names.produced_seq, mapping={k: seqs[k] for k in touched})
        for key, amount in totals.items():
            pipe.hincrby(names.produced_total, key, amount)
        for part, c in good.items():
            pipe.hincrby(names.produced_count, str(part), c)
        for part, c in bad.items():
            pipe.hincrby(names.produced_bad, str(part), c)
        pipe.execute()
        out.events += sum(good.values())
        out.bad += sum(bad.values())
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
    args = ap.parse_args(argv)
    if not args.redis:
        ap.error("--redis or KGROUP_REDIS_URL is required")
    if args.count is None and args.duration is None:
        args.duration = 30.0
    client = redis.Redis.from_url(args.redis, decode_responses=True)
    out = produce(client, stream=args.stream, partitions=args.partitions, count=args.count,
                  duration=args.duration, rate=args.rate, keys=args.keys,
                  bad_every=args.bad_every, seed=args.seed)
    rate = out.events / out.seconds if out.seconds else 0.0
    print(f"produced {out.events} events + {out.bad} malformed to {args.stream} "
          f"in {out.seconds:.1f}s ({rate:.0f}/s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
