"""The group's load as the operator reads it: member Leases' ``kgroup.dev/load`` in,
``status.load`` and each member's ``load`` out.

Rule of this module: pure (``now`` is the caller's monotonic seconds, ``wall`` the time
stamped into the status); no I/O.

What is read (:func:`group_load`): each member's annotation (:mod:`kgroup.core.load`);
a partition's rate counts only while the member that reports it holds it now (as a
stalled partition does: a report from the previous owner says nothing of the new one).
A member whose annotation carries only totals (its partitions did not fit) has its rate
spread evenly over the partitions it holds. A partition nobody reports counts at the
mean of those reported (``effective_loads``), so a new partition is typical until
measured.

How often (:class:`LoadTracker`): the figures change with every renewal, and writing
them into the status each time would make the status follow the members' renewals. The
operator takes them at most once per :data:`LOAD_REFRESH_SECONDS`, or at once when a
member starts or stops reporting or the sizing settings change (and the status write's
own rate limit applies), so a group whose apps report load costs one status
write per 30 s at most, whatever its members and partitions; a group without load
reports has no ``status.load`` and no extra pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from kgroup.core.load import MemberLoad, parse_load
from kgroup.core.operator.load_balance import effective_loads
from kgroup.core.operator.sizing import busiest_share, member_capacity, recommend_members
from kgroup.core.operator.status import MemberLeaseObservation, format_timestamp
from kgroup.crd_models import ConsumerGroupSpec, ConsumerGroupStatus, LoadStatus

__all__ = [
    "LOAD_REFRESH_SECONDS",
    "GroupLoad",
    "LoadTracker",
    "group_load",
    "load_settings",
    "load_status",
    "measure_load",
]

LOAD_REFRESH_SECONDS = 30.0
"""The status's load figures are taken at most this often."""


@dataclass(frozen=True)
class GroupLoad:
    """What the members report, restricted to what they hold now."""

    partition_rates: dict[int, float]  # events/s of each reported partition
    member_rates: dict[str, float]  # events/s of each reporting member
    member_lags: dict[str, int]  # events behind, of each member reporting a lag
    lag: int | None  # the group's; None: nobody reported one


def group_load(member_leases: Mapping[str, MemberLeaseObservation],
               holders: Mapping[int, str], partitions: int) -> GroupLoad | None:
    """The members' reports read back; None when no member reports a rate or a lag."""
    parsed: dict[str, MemberLoad] = {}
    for name, lease in member_leases.items():
        ml = parse_load(lease.load_annotation, partitions=partitions)
        if ml is not None and (ml.rate is not None or ml.lag is not None):
            parsed[name] = ml
    if not parsed:
        return None
    held: dict[str, list[int]] = {}
    for p, member in holders.items():
        if member in parsed and 0 <= p < partitions:
            held.setdefault(member, []).append(p)
    rates: dict[int, float] = {}
    member_rates: dict[str, float] = {}
    member_lags: dict[str, int] = {}
    for name, ml in sorted(parsed.items()):
        mine = held.get(name, [])
        if ml.rates:
            own = {p: ml.rates[p] for p in mine if p in ml.rates}
            rates.update(own)
            # the exact total while it still holds all it reported (codes are 0.28 % steps)
            exact = len(own) == len(ml.rates) and ml.rate is not None
            member_rates[name] = ml.rate if exact and ml.rate is not None \
                else sum(own.values())
        elif ml.rate is not None:
            rates.update({p: ml.rate / len(mine) for p in mine})
            member_rates[name] = ml.rate
        if ml.lag is not None:
            member_lags[name] = ml.lag
    lag = sum(member_lags.values()) if member_lags else None
    return GroupLoad(rates, member_rates, member_lags, lag)


def _figure(value: float) -> float:
    """Four significant digits: the status changes when the load does, not with noise in
    the last digit."""
    return float(f"{value:.4g}")


def load_status(load: GroupLoad, members: Sequence[str], partitions: int, *,
                catch_up_seconds: float, wall: datetime, count_balanced: bool = True,
                known_capacity: float | None = None) -> tuple[LoadStatus, dict[str, float]]:
    """``status.load`` and each current member's load (events/s) from what they report;
    ``known_capacity``: the capacity per member used last time
    (:func:`~kgroup.core.operator.sizing.member_capacity`)."""
    rate = sum(load.member_rates.values())
    loads = effective_loads(partitions, load.partition_rates)
    current = sorted(set(members))
    per_member = {m: _figure(load.member_rates[m]) for m in current if m in load.member_rates}
    busiest = bound = None
    if current:
        mean = rate / len(current)
        top = max((load.member_rates.get(m, 0.0) for m in current), default=0.0)
        busiest = _figure(top / mean) if mean > 0 else 1.0
        bound = _figure(busiest_share(len(current), loads, count_balanced=False))
    capacity = member_capacity({m: load.member_rates[m] for m in current
                                if m in load.member_rates}, load.member_lags,
                                known_capacity)
    recommended = recommend_members(rate=rate, lag=load.lag or 0, capacity=capacity,
                                    loads=loads, catch_up_seconds=catch_up_seconds,
                                    count_balanced=count_balanced)
    status = LoadStatus(rate=_figure(rate), lag=load.lag, busiest_over_mean=busiest,
                        bound=bound, recommended_members=recommended,
                        capacity=None if capacity is None else _figure(capacity),
                        measured_at=format_timestamp(wall))
    return status, per_member


Taken = tuple[LoadStatus, dict[str, float], dict[int, float]]
"""status.load, each member's load, each reported partition's rate."""


def measure_load(member_leases: Mapping[str, MemberLeaseObservation],
                 holders: Mapping[int, str], spec: ConsumerGroupSpec, members: Iterable[str],
                 wall: datetime, known_capacity: float | None = None) -> Taken | None:
    """The load figures from one pass's observations; None: no reports."""
    load = group_load(member_leases, holders, spec.partitions)
    if load is None:
        return None
    status, per_member = load_status(
        load, sorted(members), spec.partitions, catch_up_seconds=spec.sizing.catch_up_seconds,
        wall=wall, count_balanced=spec.balance.mode == "count",
        known_capacity=known_capacity)
    return status, per_member, load.partition_rates


def load_settings(spec: ConsumerGroupSpec, member_leases: Mapping[str, MemberLeaseObservation]
                  ) -> object:
    """What, when it changes, makes the figures due at once: the sizing settings and which
    members report load (a member that starts reporting is counted without waiting for
    the next refresh)."""
    return spec.sizing, frozenset(m for m, o in member_leases.items() if o.load_annotation)


@dataclass
class LoadTracker:
    """The load figures last taken, kept between passes (the operator's memory)."""

    interval: float = LOAD_REFRESH_SECONDS
    next_at: float = -math.inf
    status: LoadStatus | None = None
    members: dict[str, float] = field(default_factory=dict)
    settings: object = None
    # each partition's rate as last reported by its holder, kept while a moved partition
    # waits for its new holder's first report (load balancing plans on these)
    rates: dict[int, float] = field(default_factory=dict)
    taken_at: float | None = None  # when the figures were last taken (the caller's clock)

    def capacity(self) -> float | None:
        """The capacity per member the last figures used (remembered while the members
        are not behind: :func:`~kgroup.core.operator.sizing.member_capacity`)."""
        return self.status.capacity if self.status is not None else None

    def refresh(self, now: float, measure: Callable[[], Taken | None],
                settings: object = None) -> None:
        """Take the figures again (``measure``) when they are due, or when ``settings``
        (what the figures are computed with, e.g. the spec's catch-up time) changed; while
        the group reports no load, at every pass (load reports that start wake the loop:
        the first figures come at once)."""
        if self.status is not None and now < self.next_at and settings == self.settings:
            return
        self.next_at = now + self.interval
        self.taken_at = now
        self.settings = settings
        taken = measure()
        if taken is None:
            self.status, self.members, self.rates = None, {}, {}
            return
        self.status, self.members = taken[0], taken[1]
        self.rates = {**self.rates, **taken[2]}

    def deadline(self) -> float | None:
        """When to look again for the next figures (None: the group reports no load)."""
        return self.next_at if self.status is not None else None

    def apply(self, status: ConsumerGroupStatus) -> ConsumerGroupStatus:
        """``status`` with the figures last taken."""
        if self.status is None:
            return status
        rows = [row.model_copy(update={"load": self.members.get(row.name)})
                for row in status.members]
        return status.model_copy(update={"load": self.status, "members": rows})
