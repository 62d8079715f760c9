"""The light worker: the pipeline's semantics in plain Python (no JVM).

Rule: same Ownership, same fenced plan/commit scripts, same range reading and per-key
aggregation, same handoff as the PySpark job — only the execution engine differs. It runs
one batch at a time: plan (claims partitions, fixes each range) → read → aggregate →
commit (fenced) → completion step (a sealed partition read to its seal marker is handed
back as completed, ``kgroup_pipeline.completion``) → handoff step. Tests use it for quick
semantic checks; scale and chaos runs use it where a JVM per pod would be too heavy.

``--max-rate N`` (``max_rate``) caps what it processes at N events/s on average (a token
bucket holding at most one second's worth; 0, the default: no cap), so a benchmark can
give each member a capacity and a member with more input than that really falls behind.
Each batch then reads at most what the bucket holds, shared evenly over the partitions
with something to read (each at least one entry: a planned range is always read and
committed, so a handoff never waits for a range nobody reads).

A Redis error in a batch (a timeout, ``BUSY`` while a long script runs, a lost
connection) does not stop the worker: it waits :data:`REDIS_RETRY_SECONDS` and plans
again from the sink's committed offset (``Stats.redis_errors`` counts them).

    python -m kgroup_pipeline.light_worker --redis URL --stream NAME --sidecar http://127.0.0.1:8470
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis

from kgroup.client import SidecarError
from kgroup.producer import FileLayout, Lineage, Sealer
from kgroup_pipeline.completion import Completer
from kgroup_pipeline.fencing import FencedStore
from kgroup_pipeline.handoff import HandoffController
from kgroup_pipeline.health import HealthReporter
from kgroup_pipeline.ownership import Ownership, ownership_from_spec
from kgroup_pipeline.range_reader import aggregate, read_range
from kgroup_pipeline.worker_cli import add_source_arguments, ownership_spec, stop_on_signals


class Throttle:
    """At most ``rate`` events/s on average: a token bucket of at most ``rate`` tokens (one
    second's worth) that may go into debt, so what a batch took beyond its share is paid
    back by the batches after it."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError(f"a rate above 0 events/s, not {rate}")
        self.rate = rate
        self.clock = clock
        self.tokens = 0.0
        self.at = clock()
        self.batch = max(1, int(rate / 10))  # about ten batches a second while behind

    def available(self) -> int:
        """Whole tokens now (0 until a batch's worth has accrued: no one-row batches)."""
        now = self.clock()
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now
        return int(self.tokens) if self.tokens >= self.batch else 0

    def spend(self, events: int) -> None:
        self.tokens -= events


def share(wants: Sequence[int], budget: int) -> list[int]:
    """``budget`` shared over ``wants``: evenly, what one does not need going to the others,
    and each nonzero want given at least 1 (the total may then exceed ``budget``)."""
    out = [0] * len(wants)
    left = budget
    open_ = [i for i, w in enumerate(wants) if w > 0]
    while open_ and left > 0:
        each = max(1, left // len(open_))
        for i in open_:
            give = min(each, wants[i] - out[i], left)
            out[i] += give
            left -= give
        open_ = [i for i in open_ if out[i] < wants[i]]
    return [max(o, 1 if w > 0 else 0) for o, w in zip(out, wants, strict=True)]


log = logging.getLogger(__name__)
REDIS_RETRY_SECONDS = 1.0
"""After a Redis error (a timeout, ``BUSY``, a lost connection) the loop waits this long and
plans again: whatever the failed batch did or did not commit, the next plan starts from
the sink's committed offset, so nothing is lost or read twice."""


@dataclass
class Stats:
    batches: int = 0
    rows: int = 0
    refused: int = 0
    redis_errors: int = 0  # batches a Redis error ended (tried again: the sink is fenced)


class LightWorker:
    def __init__(self, *, client: redis.Redis, stream: str, ownership: Ownership,
                 max_rows: int = 20_000, drain_timeout: float = 30.0,
                 idle_wait: float = 0.05, log_every: float = 0.0,
                 layout: Callable[[], Lineage] | None = None, max_rate: float = 0.0) -> None:
        """``layout``: the group's partition layout; with it, the worker seals a partition
        it holds that the layout calls sealed (``kgroup.producer.Sealer``), so a reshape
        completes with no producer running. Without it, the sidecar's view says which held
        partitions are sealed (``PartitionView.sealed_by``), and the worker seals those.
        ``max_rate``: at most this many events/s on average (0: no cap; :class:`Throttle`)."""
        self.store = FencedStore(client, stream)
        self.stream = stream
        self.ownership = ownership
        self.max_rows = max_rows
        self.idle_wait = idle_wait
        self.log_every = log_every
        self.handoff = HandoffController(ownership, self.store, drain_timeout)
        self.completion = Completer(ownership)
        self.sealer = Sealer(client, stream, layout)
        self.stats = Stats()
        self.health = HealthReporter(self.store, getattr(ownership, "report_health", None))
        self.throttle = Throttle(max_rate) if max_rate > 0 else None

    def run_once(self) -> int:
        """One batch over every active partition; returns the rows it committed."""
        try:
            active = self.ownership.assignment().active
        except (OSError, SidecarError):
            active = ()  # the sidecar did not answer: own nothing until it does
        if self.sealer.layout is not None and active:
            self.sealer.step(p.partition for p in active)
        elif active:
            self.sealer.seal({p.partition: p.sealed_by for p in active
                              if p.sealed_by is not None})
        budget = self.max_rows if self.throttle is None else min(self.max_rows,
                                                                  self.throttle.available())
        if budget == 0:  # throttled: no reading until a batch's worth has accrued
            active = ()
        # unthrottled: each partition its even share; throttled: the plans say what each
        # has (up to the whole budget) and share() divides the budget by that
        each = budget if self.throttle is not None else budget // max(1, len(active))
        plans = self.store.plan(active, max_rows=max(1, each))
        wants = [p.rows if p.status == "ok" else 0 for p in plans]
        limits = wants if self.throttle is None else share(wants, budget)
        results = []
        for plan, limit in zip(plans, limits, strict=True):
            if limit == 0:
                continue
            results += aggregate(read_range(
                self.store.client, stream=self.stream, partition=plan.partition,
                token=plan.token, from_id=plan.from_id, to_id=plan.to_id,
                limit=limit if self.throttle is not None else plan.limit))
        if self.throttle is not None:
            self.throttle.spend(sum(r.events + len(r.dead) for r in results))
        rows = 0
        outcomes = self.store.commit(results)
        self.health.observe(plans, outcomes)
        for res, out in zip(results, outcomes, strict=True):
            if out.status == "committed":
                rows += res.events
            else:
                self.stats.refused += 1
        if results:
            self.stats.batches += 1
            self.stats.rows += rows
        self.completion.step(plans)
        self.handoff.step(time.monotonic())
        return rows

    def run(self, stop: threading.Event) -> Stats:
        """Until `stop` is set; then hand every partition back at its committed offset."""
        last_log = time.monotonic()
        while not stop.is_set():
            try:
                rows = self.run_once()
            except redis.RedisError as e:  # e.g. a timeout, or BUSY while a script runs
                self.stats.redis_errors += 1
                log.warning("batch not done, Redis answered %s: %s; again in %.1f s",
                            type(e).__name__, e, REDIS_RETRY_SECONDS)
                stop.wait(REDIS_RETRY_SECONDS)
                continue
            if self.log_every and time.monotonic() - last_log >= self.log_every:
                last_log = time.monotonic()
                print(f"light-worker batches={self.stats.batches} rows={self.stats.rows} "
                      f"refused={self.stats.refused} redis_errors={self.stats.redis_errors}",
                      file=sys.stderr, flush=True)
            if rows == 0:
                stop.wait(self.idle_wait)
        self.shutdown()
        return self.stats

    def shutdown(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if not self.ownership.assignment().partitions:
                    return
            except (OSError, SidecarError):
                return
            self.handoff.step(time.monotonic(), everything=True)
            time.sleep(self.idle_wait)  # the ownership may answer from memory: no spin


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kgroup_pipeline.light_worker")
    add_source_arguments(ap)
    ap.add_argument("--max-rows", type=int, default=20_000)
    ap.add_argument("--drain-timeout", type=float, default=30.0)
    ap.add_argument("--max-rate", type=float, default=0.0,
                    help="process at most this many events/s on average (0: no cap)")
    ap.add_argument("--layout-file", default=None,
                    help="the group's status.layout as JSON: seal held partitions it calls "
                         "sealed")
    args = ap.parse_args(argv)
    spec = ownership_spec(ap, args)
    stop = stop_on_signals()
    worker = LightWorker(client=redis.Redis.from_url(args.redis, decode_responses=True),
                         stream=args.stream, ownership=ownership_from_spec(spec, follow=True),
                         max_rows=args.max_rows, drain_timeout=args.drain_timeout, log_every=5.0,
                         layout=FileLayout(args.layout_file, 1) if args.layout_file else None,
                         max_rate=args.max_rate)
    stats = worker.run(stop)
    print(f"light-worker stopped: batches={stats.batches} rows={stats.rows}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
