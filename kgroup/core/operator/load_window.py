"""The load reports one member Lease carried lately, so the operator plans on their mean.

Rule of this module: pure (``now`` is the caller's monotonic seconds); no I/O.

Why: a renewal's ``kgroup.dev/load`` is one sample of each partition's rate. An app that
reports raw rates (or smooths them less than the reference pipeline's 30 s) hands the
operator noise, and a plan on one noisy sample per partition moves partitions for noise:
in the simulation, ±20 % re-drawn at every renewal on 4 partitions per member made about
one seed in six rebalance again once settled, each time at 1.20-1.26x the mean, right at
the trigger. So the operator keeps each member's last :data:`LOAD_WINDOW_REPORTS`
reports (none older than :data:`LOAD_WINDOW_MAX_SECONDS`) and the figures use their
mean: the noise's spread divided by about 5.7 (±20 % uniform, 11.5 % standard deviation,
becomes about 2 %), whatever the renew interval (32 reports are 64 s at the default 2 s;
at 5 s the 120 s bound leaves 24). What noise is left is measured (the reports' spread)
and widens the balance's band (:meth:`kgroup.core.operator.load_status.GroupLoad.noise`).
The lag is not averaged: the latest is what is behind now.

What it costs: no write and no request (the samples are the renewals the operator
already watches). Memory: the distinct annotations of one window per member, at most
:data:`LOAD_WINDOW_REPORTS` (an unchanged annotation is one run with a count), so at most
32 x the annotation's size (at most 8 KiB) per member. CPU: each distinct annotation is
parsed once per take of the figures (every 30 s), not on arrival.

A renewal counts once: a re-list or a replayed event of the same resourceVersion is no
new sample (the caller says whether the write is new).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["LOAD_WINDOW_MAX_SECONDS", "LOAD_WINDOW_REPORTS", "LoadWindow", "Sample"]

LOAD_WINDOW_REPORTS = 32
"""How many of a member's latest reports count."""

LOAD_WINDOW_MAX_SECONDS = 120.0
"""No report older than this counts (a member renewing rarely has fewer)."""

Sample = tuple[str, int]
"""A raw ``kgroup.dev/load`` annotation and how many renewals in a row carried it."""


@dataclass
class _Run:
    raw: str  # the annotation
    count: int  # renewals in a row that carried it
    last: float  # when the last of them was seen


@dataclass
class LoadWindow:
    """One member Lease's latest load annotations, oldest first."""

    reports: int = LOAD_WINDOW_REPORTS
    max_seconds: float = LOAD_WINDOW_MAX_SECONDS
    _runs: deque[_Run] = field(default_factory=deque, repr=False)
    _count: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.reports < 1:
            raise ValueError(f"a load window keeps at least the latest report, not {self.reports}")

    def add(self, raw: str, now: float) -> None:
        """A new write of the Lease carrying ``raw``; the oldest reports beyond the count,
        and runs last seen before ``max_seconds``, go."""
        if self._runs and self._runs[-1].raw == raw:
            self._runs[-1].count += 1
            self._runs[-1].last = now
        else:
            self._runs.append(_Run(raw, 1, now))
        self._count += 1
        while self._runs and (self._runs[0].last < now - self.max_seconds
                              or self._count - self._runs[0].count >= self.reports):
            self._count -= self._runs.popleft().count
        if self._count > self.reports:  # the oldest run loses its oldest reports
            self._runs[0].count -= self._count - self.reports
            self._count = self.reports

    def samples(self) -> Sequence[Sample]:
        """The annotations in the window with their counts, oldest first (the last is the
        Lease's current one)."""
        return tuple((r.raw, r.count) for r in self._runs)
