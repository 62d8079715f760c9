"""The pipeline's per-partition health report to its sidecar (``POST /v1/health``).

After each planning round the worker reports, per planned partition, its committed offset
(the position), its lag (entries in the partition's stream not yet processed: the
stream's length minus the events the sink committed, dead letters included; the stream is
never trimmed) and whether it is *stalled*: the fenced sink refused its token (a plan answered
``fenced``, or a commit ``stale-token``), so no work on the partition can succeed under
the token this member holds; and its *rate*: the events the sink committed per second,
smoothed over about :data:`RATE_WINDOW_SECONDS` (an exponentially weighted mean of the
rate between reports), for load-aware assignment and the group's size recommendation.
One Redis round trip and one local HTTP request every
``every`` seconds at most (sooner when a stall appears); no Kubernetes write: the sidecar
carries a summary on its member Lease's renewals (``kgroup.core.health``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from kgroup.client import Report
from kgroup_pipeline.fencing import FencedStore, Outcome, Plan

Send = Callable[[list[Report]], object]
RATE_WINDOW_SECONDS = 30.0
"""The smoothing time constant of a partition's reported rate."""


def smoothed_rate(previous: float | None, events: int, seconds: float,
                  window: float = RATE_WINDOW_SECONDS) -> float:
    """The rate after ``events`` more in ``seconds``: an exponentially weighted mean with
    time constant ``window`` (the first interval's rate when there is no previous one)."""
    now_rate = max(0, events) / seconds
    if previous is None:
        return now_rate
    alpha = 1.0 - math.exp(-seconds / window)
    return previous + alpha * (now_rate - previous)


class HealthReporter:
    def __init__(self, store: FencedStore, send: Send | None, *, every: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.send = send
        self.every = every
        self.clock = clock
        self.next_at = 0.0
        self.refused: dict[tuple[int, int], str] = {}  # (partition, token) -> why
        # partition -> (when, events committed then, smoothed rate or None)
        self.counted: dict[int, tuple[float, int, float | None]] = {}
        self.sent = 0

    def lags(self, partitions: Sequence[int]) -> dict[int, tuple[str | None, int]]:
        """partition -> (committed offset, lag), in one round trip."""
        return {p: (offset, lag) for p, (offset, lag, _) in self.figures(partitions).items()}

    def figures(self, partitions: Sequence[int]) -> dict[int, tuple[str | None, int, int]]:
        """partition -> (committed offset, lag, events committed), in one round trip."""
        keys = self.store.keys
        pipe = self.store.client.pipeline(transaction=False)
        for p in partitions:
            pipe.xlen(keys.partition(p))
            pipe.hmget(keys.sink_partition(p), ["offset", "events"])
        raw = pipe.execute()
        out: dict[int, tuple[str | None, int, int]] = {}
        for i, p in enumerate(partitions):
            length, (offset, events) = raw[2 * i], raw[2 * i + 1]
            out[p] = (offset, max(0, int(length) - int(events or 0)), int(events or 0))
        return out

    def rate(self, partition: int, events: int, now: float) -> float | None:
        """The partition's smoothed rate after a count of ``events`` committed at ``now``
        (None at its first count: nothing to compare with yet)."""
        seen = self.counted.get(partition)
        rate: float | None = None
        if seen is not None and now > seen[0]:
            rate = smoothed_rate(seen[2], events - seen[1], now - seen[0])
        elif seen is not None:
            rate = seen[2]
        self.counted[partition] = (now, events, rate)
        return rate

    def observe(self, plans: Sequence[Plan], outcomes: Sequence[Outcome] = (),
                tokens: dict[int, int] | None = None) -> list[Report] | None:
        """After a planning round (and its commits): report when due. -> what was sent."""
        new_stall = False
        for plan in plans:
            if plan.status == "fenced" and (plan.partition, plan.token) not in self.refused:
                self.refused[(plan.partition, plan.token)] = (
                    f"the fenced sink refused token {plan.token}: it holds a newer one")
                new_stall = True
        by_partition = {p.partition: p.token for p in plans} | (tokens or {})
        for out in outcomes:
            token = by_partition.get(out.partition)
            if out.status == "stale-token" and token is not None \
                    and (out.partition, token) not in self.refused:
                self.refused[(out.partition, token)] = (
                    f"the fenced sink refused token {token}: it holds {out.detail}")
                new_stall = True
        now = self.clock()
        if self.send is None or not plans or (now < self.next_at and not new_stall):
            return None
        self.next_at = now + self.every
        held = {(p.partition, p.token) for p in plans}
        self.refused = {k: v for k, v in self.refused.items() if k in held}
        figures = self.figures([p.partition for p in plans])
        self.counted = {p: c for p, c in self.counted.items() if p in figures}
        reports = []
        for p in plans:
            offset, lag, events = figures[p.partition]
            why = self.refused.get((p.partition, p.token))
            reports.append(Report(p.partition, p.token, offset, lag, why is not None, why or "",
                                  self.rate(p.partition, events, now)))
        self.send(reports)
        self.sent += 1
        return reports
