"""How many members a group needs, from measured rates: the recommendation in the status.

Rule of this module: pure (no clock, no I/O); the same figures give the same answer.

The rule, in the shape of the Flink Kubernetes operator's autoscaler rather than KEDA's
lag threshold (``replicas = lag / lagThreshold`` knows nothing of how fast a member
works, so a threshold right for one app is wrong for the next):

    demand   = input rate + backlog / catchUpSeconds            (events/s)
    needed   = ceil(demand / capacity)                           (members)

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

**Capacity** (:func:`member_capacity`), events/s one member can process, is measured from
the members' rates: a member that is *behind* (its lag is more than
:data:`BEHIND_SECONDS` of its own rate) is working as fast as it can, so its rate is its
capacity, and the largest such rate is taken. When no member is behind, no member has
shown its limit now: the capacity is the larger of the busiest member's rate (a lower
bound) and the capacity known from before (``known``: the operator keeps the capacity it
last used, :class:`~kgroup.core.operator.load_status.LoadTracker`). Without that memory
the capacity would fall with the input (each member's rate does), the recommendation
would stay at the present size, and a group could never be sized down. A remembered
capacity that is too high (the app became slower) sizes the group too small for a
while: its members fall behind, and their rates replace it. No rate at all and nothing
known: no recommendation (None).

The input rate is the processed rate: while a group falls behind it processes less than
arrives, and the difference shows as a growing backlog, which the second term answers
within ``catchUpSeconds``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["BEHIND_SECONDS", "busiest_share", "member_capacity", "recommend_members"]

BEHIND_SECONDS = 10.0
"""A member whose lag is more than this many seconds of its own rate is behind: it is
working at its capacity."""


def member_capacity(rates: Mapping[str, float], lags: Mapping[str, int | None],
                    known: float | None = None) -> float | None:
    """Events/s one member can process: the largest rate of a member that is behind, else
    the largest rate or ``known`` (the capacity known from before), whichever is larger
    (a lower bound); None when no member processed anything and nothing is known."""
    behind = [r for m, r in rates.items()
              if r > 0 and (lags.get(m) or 0) > BEHIND_SECONDS * r]
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
                      count_balanced: bool = True) -> int | None:
    """The members needed to keep up with ``rate`` (events/s, the whole group) and work
    off ``lag`` (events) within ``catch_up_seconds``, at ``capacity`` events/s per member,
    over ``loads`` (per partition: their count is the ceiling). None: no capacity known."""
    if not (math.isfinite(rate) and rate >= 0) or lag < 0:
        raise ValueError(f"rate and lag must be finite and >= 0, got {rate} and {lag}")
    if not catch_up_seconds > 0:
        raise ValueError(f"catch_up_seconds must be > 0, got {catch_up_seconds}")
    partitions = len(loads)
    if capacity is None or capacity <= 0 or partitions == 0:
        return None
    demand = rate + lag / catch_up_seconds
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
