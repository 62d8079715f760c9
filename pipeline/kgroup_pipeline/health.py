"""The pipeline's per-partition health report to its sidecar (``POST /v1/health``).

After each planning round the worker reports, per planned partition, its committed offset
(the position), its lag (entries in the partition's stream not yet processed: the
stream's length minus the events the sink committed, dead letters included; the stream is
never trimmed) and whether it is *stalled*: the fenced sink refused its token (a plan answered
``fenced``, or a commit ``stale-token``), so no work on the partition can succeed under
the token this member holds. One Redis round trip and one local HTTP request every
``every`` seconds at most (sooner when a stall appears); no Kubernetes write: the sidecar
carries a summary on its member Lease's renewals (``kgroup.core.health``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from kgroup.client import Report
from kgroup_pipeline.fencing import FencedStore, Outcome, Plan

Send = Callable[[list[Report]], object]


class HealthReporter:
    def __init__(self, store: FencedStore, send: Send | None, *, every: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.send = send
        self.every = every
        self.clock = clock
        self.next_at = 0.0
        self.refused: dict[tuple[int, int], str] = {}  # (partition, token) -> why
        self.sent = 0

    def lags(self, partitions: Sequence[int]) -> dict[int, tuple[str | None, int]]:
        """partition -> (committed offset, lag), in one round trip."""
        keys = self.store.keys
        pipe = self.store.client.pipeline(transaction=False)
        for p in partitions:
            pipe.xlen(keys.partition(p))
            pipe.hmget(keys.sink_partition(p), ["offset", "events"])
        raw = pipe.execute()
        out: dict[int, tuple[str | None, int]] = {}
        for i, p in enumerate(partitions):
            length, (offset, events) = raw[2 * i], raw[2 * i + 1]
            out[p] = (offset, max(0, int(length) - int(events or 0)))
        return out

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
        figures = self.lags([p.partition for p in plans])
        reports = []
        for p in plans:
            offset, lag = figures[p.partition]
            why = self.refused.get((p.partition, p.token))
            reports.append(Report(p.partition, p.token, offset, lag, why is not None, why or ""))
        self.send(reports)
        self.sent += 1
        return reports
