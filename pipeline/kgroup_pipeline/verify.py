"""The verifier: what the producer wrote against what the sink committed.

Rule: the producer's ledger (per key: last seq, which is also the count since seqs start
at 1 without gaps, and the amount total; per partition and key: the count written there)
is compared with the sink's per-key results, twice:

- per partition, key by key: a key whose sink count there is above its produced count was
  *duplicated*; below it, *lost*, but only once the partition is caught up (its committed
  offset is the last id of its stream, or for a sealed partition its seal marker): before
  that the difference is merely *pending*;
- per key across every partition and generation (a reshape moves a key to a successor):
  counts and amount totals summed over partitions against the ledger's; a key's order is
  the sink's own check at commit (its first seq in a range must follow its last committed
  seq in any partition, ``sink:key:ooo``), so a successor read before its predecessor
  was completed shows as keys out of order.

Entries written after a partition's seal marker (``past_seal``: a producer that bypassed
the fenced write) are never read, so they are lost, and are counted on their own too.
Zombie and replay refusals are reported as they are: refusals are the fence working, not
errors.

    python -m kgroup_pipeline.verify --redis URL --stream NAME [--wait 60]

Exit 0: clean; 1: a loss or duplicate (or totals / dead letters disagree, or events past
a seal), or a key out of order; 2: not caught up within ``--wait``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from kgroup.producer import parse_seal
from kgroup_pipeline.keys import StreamKeys


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
    past_seal: int = 0  # entries written after the partition's seal marker: a broken fence
    caught_up: bool = True
    state: str = "open"  # open | sealed (a reshape replaced it) | completed (read to its seal)


@dataclass
class Report:
    partitions: list[PartitionReport] = field(default_factory=list)
    zombie_refused: int = 0
    replay_refused: int = 0
    keys: int = 0
    keys_lost: int = 0  # keys with fewer events committed than produced (all caught up)
    keys_duplicated: int = 0  # keys with more events committed than produced
    keys_out_of_order: int = 0  # keys whose committed seqs did not follow each other
    keys_total_mismatch: int = 0  # keys whose count is right but whose amount total is not
    generations: int = 1  # the highest generation that sealed a partition (1: none)

    def total(self, name: str) -> int:
        return sum(int(getattr(p, name)) for p in self.partitions)

    @property
    def caught_up(self) -> bool:
        return all(p.caught_up for p in self.partitions)

    @property
    def clean(self) -> bool:
        return (self.total("lost") == 0 and self.total("duplicated") == 0
                and self.keys_lost == 0 and self.keys_duplicated == 0
                and self.keys_total_mismatch == 0 and self.total("past_seal") == 0
                and all(p.dead == p.bad for p in self.partitions if p.caught_up))

    @property
    def ordered(self) -> bool:
        return self.keys_out_of_order == 0


def _ints(raw: Mapping[Any, Any]) -> dict[str, int]:
    return {str(k): int(v) for k, v in raw.items()}


def _partition(client: redis.Redis, k: StreamKeys, n: int, bad: int, seal: str | None,
               produced: dict[str, int], counts: dict[str, int]) -> PartitionReport:
    pr = PartitionReport(n, bad=bad)
    sink = client.hgetall(k.sink_partition(n))
    if seal is None:
        last = client.xrevrange(k.partition(n), count=1)
        pr.caught_up = not last or sink.get("offset") == last[0][0]
    else:
        marker = parse_seal(seal)[1]
        pr.caught_up = sink.get("offset") == marker
        pr.state = "completed" if sink.get("completed") == marker else "sealed"
        pr.past_seal = len(client.xrange(k.partition(n), min="(" + marker) or [])
    pr.dead = int(sink.get("dead", 0))
    pr.out_of_order = int(sink.get("ooo", 0))
    for key in set(produced) | set(counts):
        want, got = produced.get(key, 0), counts.get(key, 0)
        pr.produced += want
        pr.committed += got
        if got > want:
            pr.duplicated += got - want
        elif got < want:
            if pr.caught_up:
                pr.lost += want - got
            else:
                pr.pending += want - got
    return pr


def verify(client: redis.Redis, stream: str) -> Report:
    """Per partition (per key within it, by the producer's per-partition ledger) and per
    key across every partition and generation: lost, duplicated, pending, out of order."""
    k = StreamKeys(stream)
    seals = {int(p): str(v) for p, v in client.hgetall(k.seals).items()}
    produced_count = _ints(client.hgetall(k.produced_count))
    bad = {int(p): int(v) for p, v in client.hgetall(k.produced_bad).items()}
    legacy = int(client.hget(k.meta, "partitions") or 0)
    parts = sorted(set(range(legacy)) | {int(p) for p in produced_count} | set(bad)
                   | set(seals))
    produced_seq = _ints(client.hgetall(k.produced_seq))
    produced_total = _ints(client.hgetall(k.produced_total))
    report = Report(keys=len(produced_seq))
    committed: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for n in parts:
        produced = _ints(client.hgetall(k.produced_keys(n)))
        counts = _ints(client.hgetall(k.sink_count(n)))
        committed.update(counts)
        total.update(_ints(client.hgetall(k.sink_total(n))))
        report.partitions.append(_partition(client, k, n, bad.get(n, 0), seals.get(n),
                                            produced, counts))
    for key in set(produced_seq) | set(committed):
        want, got = produced_seq.get(key, 0), committed[key]
        if got > want:
            report.keys_duplicated += 1
        elif got < want and report.caught_up:
            report.keys_lost += 1
        elif got == want and produced_total.get(key, 0) != total[key]:
            report.keys_total_mismatch += 1
    report.keys_out_of_order = sum(1 for v in client.hvals(k.key_ooo) if int(v) > 0)
    report.generations = max((parse_seal(v)[0] for v in seals.values()), default=1)
    z, r = client.mget([k.zombie_refused, k.replay_refused])
    report.zombie_refused, report.replay_refused = int(z or 0), int(r or 0)
    return report


def render(report: Report) -> str:
    cols = ["produced", "committed", "lost", "duplicated", "pending", "out_of_order",
            "bad", "dead", "past_seal"]
    lines = ["part " + " ".join(f"{c:>12}" for c in cols) + "  caught_up  state"]
    for p in report.partitions:
        lines.append(f"{p.partition:>4} " + " ".join(f"{getattr(p, c):>12}" for c in cols)
                     + f"  {'yes' if p.caught_up else 'no':>9}  {p.state}")
    lines.append(" all " + " ".join(f"{report.total(c):>12}" for c in cols)
                 + f"  {'yes' if report.caught_up else 'no':>9}")
    lines.append(f"keys={report.keys} keys_lost={report.keys_lost} "
                 f"keys_duplicated={report.keys_duplicated} "
                 f"keys_out_of_order={report.keys_out_of_order} "
                 f"keys_total_mismatch={report.keys_total_mismatch} "
                 f"generations={report.generations}")
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
    if not report.ordered:
        print(f"FAIL: {report.keys_out_of_order} keys out of order", file=sys.stderr)
        return 1
    if not report.caught_up:
        print("INCOMPLETE: not every partition is caught up", file=sys.stderr)
        return 2
    print("OK: nothing lost, nothing duplicated, every key in order", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
