"""How many members a group needs, from measured rates: the recommendation in the status.

Rule of this module: pure (no clock, no I/O); the same figures give the same answer.

The rule, in the shape of the Flink Kubernetes operator's autoscaler rather than KEDA's
lag threshold (``replicas = lag / lagThreshold`` knows nothing of how fast a member
works, so a threshold right for one app is wrong for the next):

    demand   = arrival + (backlog + deficit * startSeconds) / catchUpSeconds   (events/s)
    needed   = ceil(demand / capacity)                                         (members)

then the smallest count ``m`` from ``needed`` up to the partitions whose busiest member
keeps up: ``demand * ratio(m) / m <= capacity``, where ``ratio(m)`` is the busiest
member's share over the mean that ``m`` members can do no better than
(:func:`busiest_share`): with count balance, ``ceil(N/m) / (N/m)`` (so 8 members of 64
partitions beat 9, which leave one member 8 partitions where the mean is 7.1), and never
below the pigeonhole bound of
:func:`~kgroup.core.operator.load_balance.load_bound` (a hot partition alone may
exceed a member's share). So the count "divides the load well"; and it is never more
than the partitions (a member beyond them would hold nothing). When no count keeps up (a
hot partition alone is more than one member can process), the answer is the smallest
count beyond which more members do not lower the busiest member's load: more would cost
pods and help nothing (the partition must be split: docs/reshape.md). It used to be the
partitions, which an autoscaler following the recommendation took as "as many as
allowed" whenever a catching-up partition's rate briefly exceeded the measured capacity.

**The backlog is counted as it will be when the members asked for have started**: the
``deficit`` (arrival minus what the group processes now, 0 while it keeps up) adds to
the backlog for ``startSeconds`` more, the time new pods take to start and take their
partitions (:data:`START_SECONDS` until the operator has seen a scale-up's pods join:
then how long that took, :attr:`~kgroup.core.operator.autoscale.Autoscaler.start_seconds`).
Sized on today's backlog alone, a group that grows after a step falls further behind
while its new pods start, and the next look asks for more (4 -> 11 -> 13 on the model
group of ``tests/test_sizing_dynamics.py``, where the second look asked for 13 at once).

**Capacity** (:func:`member_capacity`), events/s one member can process, is measured from
the members' rates: a member that is *behind* (its lag is more than
:data:`BEHIND_SECONDS` of its own rate) is working as fast as it can, so its rate is its
capacity, and the largest such rate is taken, of the members whose partitions did not
change since the last figures (a member that just took partitions over reports a rate
still ramping up to them: behind, it would pass for a slow one, and the capacity right
after each scale-up fell to a third). When no such member is behind, no member has
shown its limit now: the capacity is the larger of the busiest member's rate (a lower
bound) and the capacity known from before (``known``: the operator keeps the capacity it
last used, :class:`~kgroup.core.operator.load_status.LoadTracker`). Without that memory
the capacity would fall with the input (each member's rate does), the recommendation
would stay at the present size, and a group could never be sized down. A remembered
capacity that is too high (the app became slower) sizes the group too small for a
while: its members fall behind, and their rates replace it. No rate at all and nothing
known: no recommendation (None).

**The input rate is the arrival rate** (:func:`arrival_rates`), not the processed rate:
a member that is behind processes at its capacity whatever arrives, so after a step of
the input its processed rate understates the demand (sized from it, a group grew one
member per look while it fell further behind), and while a backlog drains every member
works at capacity, above the input (sized from it, a group that was catching up asked
for more members the more it had: 8 then 18 in the benchmark). What arrives on a
member's partitions is what it processed plus what its lag grew by: ``rate + d lag / dt``,
with ``d lag / dt`` the change of its reported lag between two takes of the figures (30 s
apart: the difference is the mean growth over those 30 s, which smooths the input's
noise without delaying a step by more than one take), negative while a backlog drains,
the sum never below 0. The difference is only meaningful over the same partitions: a
member whose partitions did not change is estimated alone; the members whose partitions
changed hands (joined, left, or moved partitions among themselves) are estimated as one
pool when between them they held the same partitions at both takes (their summed lag
changed only by arrivals and work), and the pool's arrival is shared in proportion to
their processed rates. Otherwise (a partition unheld at one take, a member without a
lag, the first take) a member keeping up stands for what arrives (its lag is not
growing much); one behind takes the arrival its partitions had at the last take, and
when there was none (the first figures), the group has no recommendation yet: its
processed rate says nothing of what arrives, and during a drain it would ask for the
members a backlog needs on top of those already catching it up.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "BEHIND_SECONDS",
    "MIN_GROWTH_SECONDS",
    "START_SECONDS",
    "Reading",
    "arrival_rates",
    "busiest_share",
    "is_behind",
    "member_capacity",
    "recommend_members",
]

BEHIND_SECONDS = 10.0
"""A member whose lag is more than this many seconds of its own rate is behind: it is
working at its capacity."""


START_SECONDS = 60.0
"""How long new members are taken to need to start and take their partitions, until a
scale-up has been seen (a pod's start, the sidecar's session, the revoke-before-assign
hand-off)."""


MIN_GROWTH_SECONDS = 10.0
"""Two takes closer than this give no lag growth (a take out of turn, when a member
starts reporting or the settings change, would divide the lag's jitter by a second)."""


@dataclass(frozen=True)
class Reading:
    """One member's figures at one take: its processed rate (events/s), its lag (events;
    None: not reported) and the partitions it held."""

    rate: float
    lag: int | None
    partitions: frozenset[int]


def arrival_rates(before: Mapping[str, Reading] | None, now: Mapping[str, Reading],
                  seconds: float | None) -> dict[str, float | None]:
    """Events/s arriving on each member's partitions (every member of ``now``): its rate
    plus its lag's growth since ``before``, taken ``seconds`` earlier, never below 0; a
    member whose partitions changed is estimated in a pool with the others whose
    partitions changed. None: no growth can be measured for it (no earlier reading, no
    lag, or its pool did not hold the same partitions at both takes)."""
    out: dict[str, float | None] = dict.fromkeys(now)
    if before is None or seconds is None or seconds < MIN_GROWTH_SECONDS:
        return out
    pool: list[str] = []
    for m, r in now.items():
        b = before.get(m)
        if b is not None and b.partitions == r.partitions:
            if r.lag is not None and b.lag is not None:
                out[m] = max(0.0, r.rate + (r.lag - b.lag) / seconds)
        else:
            pool.append(m)
    gone = [m for m, b in before.items()
            if m not in now or now[m].partitions != b.partitions]
    if not pool:
        return out
    held_now = frozenset().union(*(now[m].partitions for m in pool))
    held_before = frozenset().union(*(before[m].partitions for m in gone))
    lags_now = [now[m].lag for m in pool]
    lags_before = [before[m].lag for m in gone]
    if held_now != held_before or not held_now or None in lags_now or None in lags_before:
        return out
    rate = sum(now[m].rate for m in pool)
    grown = sum(v for v in lags_now if v is not None) - sum(
        v for v in lags_before if v is not None)
    arrival = max(0.0, rate + grown / seconds)
    for m in pool:
        share = now[m].rate / rate if rate > 0 else len(now[m].partitions) / len(held_now)
        out[m] = arrival * share
    return out


def is_behind(rate: float, lag: int | None) -> bool:
    """A member with this rate and lag is behind: working at its capacity."""
    return rate > 0 and (lag or 0) > BEHIND_SECONDS * rate


def member_capacity(rates: Mapping[str, float], lags: Mapping[str, int | None],
                    known: float | None = None,
                    settled: Collection[str] | None = None) -> float | None:
    """Events/s one member can process: the largest rate of a member that is behind (of
    the ``settled`` ones, when given: those whose partitions did not change since the
    last figures), else the largest rate or ``known`` (the capacity known from before),
    whichever is larger (a lower bound); None when no member processed anything and
    nothing is known."""
    behind = [r for m, r in rates.items() if is_behind(r, lags.get(m))
              and (settled is None or m in settled)]
    if behind:
        return max(behind)
    top = max(max(rates.values(), default=0.0), known or 0.0)
    return top if top > 0 else None


def busiest_share(members: int, loads: Sequence[float], *, count_balanced: bool) -> float:
    """The busiest of ``members`` members' load over the mean that no assignment beats:
    the pigeonhole bound of :func:`~kgroup.core.operator.load_balance.load_bound` (equal
    weights), and, when partitions are placed by count (``count_balanced``), at least
    ``ceil(N/m) / (N/m)`` (equal partitions)."""
    return _Shares(loads).busiest(members, count_balanced=count_balanced)


class _Shares:
    """:func:`busiest_share` for many member counts over the same loads: the loads sorted
    once with prefix sums, so each count costs O(N / m) (``load_bound`` recomputes sums)."""

    def __init__(self, loads: Sequence[float]) -> None:
        self.n = len(loads)
        self.total = float(sum(loads))
        self.prefix = [0.0]
        for value in sorted(loads, reverse=True):
            self.prefix.append(self.prefix[-1] + value)

    def busiest(self, m: int, *, count_balanced: bool) -> float:
        if m <= 0 or self.n == 0:
            raise ValueError("busiest_share needs at least one member and one partition")
        share = 1.0
        mean = self.total / m
        if mean > 0:  # not "total > 0": a denormal total over m members underflows to 0
            j = 0
            while j * m < self.n:  # of the j*m + 1 heaviest, some member holds j + 1
                top = j * m
                share = max(share, (self.prefix[top + 1] - self.prefix[top - j]) / mean)
                j += 1
        if count_balanced:
            share = max(share, math.ceil(self.n / m) * m / self.n)
        return share


def recommend_members(*, rate: float, lag: int, capacity: float | None,
                      loads: Sequence[float], catch_up_seconds: float,
                      count_balanced: bool = True, processed: float | None = None,
                      start_seconds: float = 0.0) -> int | None:
    """The members needed to keep up with ``rate`` (events/s arriving, the whole group:
    :func:`arrival_rates`) and work off ``lag`` (events) within ``catch_up_seconds``, at
    ``capacity`` events/s per member, over ``loads`` (per partition: their count is the
    ceiling); the backlog taken as it will be after ``start_seconds`` more at the group's
    ``processed`` rate (None: as it is now). None: no capacity known."""
    if not (math.isfinite(rate) and rate >= 0) or lag < 0:
        raise ValueError(f"rate and lag must be finite and >= 0, got {rate} and {lag}")
    if not catch_up_seconds > 0:
        raise ValueError(f"catch_up_seconds must be > 0, got {catch_up_seconds}")
    partitions = len(loads)
    if capacity is None or capacity <= 0 or partitions == 0:
        return None
    deficit = 0.0 if processed is None else max(0.0, rate - processed)
    demand = rate + (lag + deficit * max(0.0, start_seconds)) / catch_up_seconds
    needed = max(1, math.ceil(demand / capacity - 1e-9))
    shares = _Shares(loads)
    best, best_at = math.inf, partitions
    for m in range(min(needed, partitions), partitions + 1):
        busiest = demand * shares.busiest(m, count_balanced=count_balanced) / m
        if busiest <= capacity * (1 + 1e-9):
            return m
        if busiest < best * (1 - 1e-9):
            best, best_at = busiest, m
    # no count keeps up (a partition alone is more than a member can do): the smallest
    # count beyond which more members do not lower the busiest member's load
    return best_at
