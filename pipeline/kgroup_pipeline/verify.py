"""The verifier: what the producer wrote against what the sink committed.

Rule: the producer's ledger (per key: last seq, which is also the count since seqs start
at 1 without gaps, and the amount total) is compared with the sink's per-key results.
A key whose sink count is above the produced count was *duplicated*; below it, *lost* —
but only once the partition is caught up (its committed offset is the last id of its
stream): before that the difference is merely *pending*. Out-of-order is the sink's own
counter (a key's seq was not last+1). Zombie and replay refusals are reported as they are:
refusals are the fence working, not errors.

    python -m kgroup_pipeline.verify --redis URL --stream NAME [--wait 60]

Exit 0: clean; 1: a loss or duplicate (or totals / dead letters disagree); 2: not caught
up within ``--wait``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field

import redis

from kgroup_pipeline.keys import StreamKeys, partition_for


@dataclass
class PartitionReport:
    partition: int
    produced: int = 0
    bad: int = 0
    committed: int = 0
    dead: int = 0
    lost: int = 0
    duplicated: int = 0
    pending: int = 0
    out_of_order: int = 0
    total_mismatch: int = 0
    caught_up: bool = True


@dataclass
class Report:
    partitions: list[PartitionReport] = field(default_factory=list)
    zombie_refused: int = 0
    replay_refused: int = 0

    def total(self, name: str) -> int:
        return sum(int(getattr(p, name)) for p in self.partitions)

    @property
    def caught_up(self) -> bool:
        return all(p.caught_up for p in self.partitions)

    @property
    def clean(self) -> bool:
        return (self.total("lost") == 0 and self.total("duplicated") == 0
                and self.total("total_mismatch") == 0
                and all(p.dead == p.bad for p in self.partitions if p.caught_up))


def verify(client: redis.Redis, stream: str) -> Report:
    k = StreamKeys(stream)
    parts = int(client.hget(k.meta, "partitions") or 0)
    produced_seq = {str(key): int(v) for key, v in client.hgetall(k.produced_seq).items()}
    produced_total = {str(key): int(v) for key, v in client.hgetall(k.produced_total).items()}
    bad = {int(p): int(v) for p, v in client.hgetall(k.produced_bad).items()}
    by_part: dict[int, list[str]] = defaultdict(list)
    for key in produced_seq:
        by_part[partition_for(key, parts)].append(key)
    report = Report()
    for n in range(parts):
        pr = PartitionReport(n, bad=bad.get(n, 0))
        sink = client.hgetall(k.sink_partition(n))
        last = client.xrevrange(k.partition(n), count=1)
        pr.caught_up = not last or sink.get("offset") == last[0][0]
        pr.dead = int(sink.get("dead", 0))
        pr.out_of_order = int(sink.get("ooo", 0))
        counts = {str(key): int(v) for key, v in client.hgetall(k.sink_count(n)).items()}
        totals = {str(key): int(v) for key, v in client.hgetall(k.sink_total(n)).items()}
        for key in set(by_part[n]) | set(counts):
            want, got = produced_seq.get(key, 0), counts.get(key, 0)
            pr.produced += want
            pr.committed += got
            if got > want:
                pr.duplicated += got - want
            elif got < want:
                if pr.caught_up:
                    pr.lost += want - got
                else:
                    pr.pending += want - got
            elif produced_total.get(key, 0) != totals.get(key, 0):
                pr.total_mismatch += 1
        report.partitions.append(pr)
    z, r = client.mget([k.zombie_refused, k.replay_refused])
    report.zombie_refused, report.replay_refused = int(z or 0), int(r or 0)
    return report


def render(report: Report) -> str:
    cols = ["produced", "committed", "lost", "duplicated", "pending", "out_of_order",
            "bad", "dead", "total_mismatch"]
    lines = ["part " + " ".join(f"{c:>12}" for c in cols) + "  caught_up"]
    for p in report.partitions:
        lines.append(f"{p.partition:>4} " + " ".join(f"{getattr(p, c):>12}" for c in cols)
                     + f"  {'yes' if p.caught_up else 'no'}")
    lines.append(" all " + " ".join(f"{report.total(c):>12}" for c in cols)
                 + f"  {'yes' if report.caught_up else 'no'}")
    lines.append(f"zombie_refused={report.zombie_refused} replay_refused={report.replay_refused}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kgroup_pipeline.verify")
    ap.add_argument("--redis", default=os.environ.get("KGROUP_REDIS_URL"))
    ap.add_argument("--stream", required=True)
    ap.add_argument("--wait", type=float, default=0.0, help="seconds to wait for catch-up")
    args = ap.parse_args(argv)
    if not args.redis:
        ap.error("--redis or KGROUP_REDIS_URL is required")
    client = redis.Redis.from_url(args.redis, decode_responses=True)
    deadline = time.monotonic() + args.wait
    report = verify(client, args.stream)
    while not report.caught_up and time.monotonic() < deadline:
        time.sleep(0.5)
        report = verify(client, args.stream)
    print(render(report))
    if not report.clean:
        print("FAIL: lost or duplicated events", file=sys.stderr)
        return 1
    if not report.caught_up:
        print("INCOMPLETE: not every partition is caught up", file=sys.stderr)
        return 2
    print("OK: nothing lost, nothing duplicated", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
