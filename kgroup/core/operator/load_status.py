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
from kgroup.core.operator.sizing import (
    MIN_GROWTH_SECONDS,
    START_SECONDS,
    Reading,
    arrival_rates,
    busiest_share,
    is_behind,
    member_capacity,
    recommend_members,
)
from kgroup.core.operator.status import MemberLeaseObservation, format_timestamp
from kgroup.crd_models import ConsumerGroupSpec, ConsumerGroupStatus, LoadStatus

__all__ = [
    "LOAD_REFRESH_SECONDS",
    "SETTINGS_TAKE_GAP",
    "GroupLoad",
    "History",
    "LoadTracker",
    "ParsedLoads",
    "group_load",
    "load_settings",
    "load_status",
    "measure_load",
    "member_arrivals",
    "take_load",
]

LOAD_REFRESH_SECONDS = 30.0
"""The status's load figures are taken at most this often, but for a change of what they
are computed with (:func:`load_settings`)."""

SETTINGS_TAKE_GAP = 5.0
"""A change of what the figures are computed with (a member that starts reporting, the
sizing settings) takes them anew, but not within this many seconds of the last take.
Without the gap, while a group of 200 members started, each new reporter made the next
pass take the figures (many passes a second, each reading every member's window: up to a
second of CPU at 200 members) and the operator created locks at a fifth of its pace
(``bench/bench_cost.py``: 2,263 of 10,000 at 61 s; 6,778 when only a group's first
report made them due; with this gap all 10,000 at 58.9 s, Stable at 61.2 s,
docs/benchmarks.md)."""

NOISE_SIGMAS = 2.0
"""How many standard errors of a member's measured rate widen the balance's band
(:meth:`GroupLoad.noise`): a rebalance starts only on an imbalance that is that sure."""


@dataclass(frozen=True)
class GroupLoad:
    """What the members report, restricted to what they hold now."""

    partition_rates: dict[int, float]  # events/s of each reported partition
    member_rates: dict[str, float]  # events/s of each reporting member
    member_lags: dict[str, int]  # events behind, of each member reporting a lag
    lag: int | None  # the group's; None: nobody reported one
    # the partitions each reporting member holds now
    member_partitions: dict[str, frozenset[int]] = field(default_factory=dict)
    # the standard error of each reporting member's mean rate over its window (events/s)
    member_errors: dict[str, float] = field(default_factory=dict)

    def noise(self, members: Sequence[str]) -> float:
        """How far the busiest member's measured share may be off, as a fraction of the
        mean member's load: :data:`NOISE_SIGMAS` standard errors of the noisiest member
        (0 when the reports agree or no member carries load)."""
        current = [m for m in members if m in self.member_rates]
        rate = sum(self.member_rates[m] for m in current)
        if not current or rate <= 0:
            return 0.0
        worst = max((self.member_errors.get(m, 0.0) for m in current), default=0.0)
        return NOISE_SIGMAS * worst / (rate / len(current))

    def readings(self) -> dict[str, Reading]:
        """Each reporting member's figures, for the next take's lag growth."""
        return {m: Reading(self.member_rates.get(m, 0.0), self.member_lags.get(m),
                           self.member_partitions.get(m, frozenset()))
                for m in sorted(set(self.member_rates) | set(self.member_lags))}


class ParsedLoads:
    """Each distinct ``kgroup.dev/load`` annotation parsed once while it stays in some
    member's window, not once per take: the parses of one take are kept for the next
    (:meth:`rotate`; a report stays in its window about 64 s, so two or three takes).
    Parsing was three quarters of a take's CPU under cProfile; a whole take with full
    windows measured 1.6-3.2 s at 200 and 1,000 members at load 5-7
    (``bench/bench_decide.py --load``).
    Memory: the annotations of two takes' windows at most."""

    def __init__(self) -> None:
        self._before: dict[str, MemberLoad | None] = {}
        self._now: dict[str, MemberLoad | None] = {}
        self._partitions: int | None = None

    def rotate(self, partitions: int) -> None:
        """A new take over ``partitions`` (another count reads annotations anew)."""
        self._before = self._now if partitions == self._partitions else {}
        self._now, self._partitions = {}, partitions

    def __call__(self, raw: str | None, partitions: int) -> MemberLoad | None:
        if raw is None or partitions != self._partitions:
            return parse_load(raw, partitions=partitions)
        if raw in self._now:
            return self._now[raw]
        ml = self._before[raw] if raw in self._before else parse_load(raw,
                                                                       partitions=partitions)
        self._now[raw] = ml
        return ml


def _parse(raw: str | None, partitions: int) -> MemberLoad | None:
    return parse_load(raw, partitions=partitions)


def group_load(member_leases: Mapping[str, MemberLeaseObservation],
               holders: Mapping[int, str], partitions: int,
               parse: Callable[[str | None, int], MemberLoad | None] = _parse
               ) -> GroupLoad | None:
    """The members' reports read back; None when no member reports a rate or a lag.
    Rates are the mean over the reports of the member Lease's window
    (:mod:`kgroup.core.operator.load_window`; without a window, its current annotation
    alone); the lag is the latest report's. ``parse``: how an annotation is read (a
    :class:`ParsedLoads` keeps the parses between takes)."""
    parsed: dict[str, list[tuple[MemberLoad, int]]] = {}
    for name, lease in member_leases.items():
        ml = parse(lease.load_annotation, partitions)
        if ml is not None and (ml.rate is not None or ml.lag is not None):
            parsed[name] = _window(lease, ml, partitions, parse)
    if not parsed:
        return None
    held: dict[str, list[int]] = {}
    for p, member in holders.items():
        if member in parsed and 0 <= p < partitions:
            held.setdefault(member, []).append(p)
    rates: dict[int, float] = {}
    member_rates: dict[str, float] = {}
    member_lags: dict[str, int] = {}
    errors: dict[str, float] = {}
    for name, samples in sorted(parsed.items()):
        own, total, error = _mean_rates(samples, held.get(name, []))
        rates.update(own)
        errors[name] = error
        if total is not None:
            member_rates[name] = total
        lag = samples[-1][0].lag
        if lag is not None:
            member_lags[name] = lag
    lag = sum(member_lags.values()) if member_lags else None
    return GroupLoad(rates, member_rates, member_lags, lag,
                     {m: frozenset(held.get(m, ())) for m in parsed}, errors)


def _window(lease: MemberLeaseObservation, latest: MemberLoad, partitions: int,
            parse: Callable[[str | None, int], MemberLoad | None]
            ) -> list[tuple[MemberLoad, int]]:
    """The window's reports read back with their counts, oldest first, ending with the
    current one (``latest``); reports that do not read are left out."""
    samples = list(lease.load_samples)
    if not samples or samples[-1][0] != lease.load_annotation:
        return [(latest, 1)]
    out = [(ml, n) for raw, n in samples[:-1]
           if (ml := parse(raw, partitions)) is not None]
    return [*out, (latest, samples[-1][1])]


def _sample_rates(ml: MemberLoad, mine: Sequence[int]) -> tuple[dict[int, float], float | None]:
    """One report's rates of the partitions the member holds now, and its total."""
    if ml.rates:
        own = {p: ml.rates[p] for p in mine if p in ml.rates}
        # the exact total while it still holds all it reported (codes are 0.28 % steps)
        exact = len(own) == len(ml.rates) and ml.rate is not None
        return own, ml.rate if exact and ml.rate is not None else sum(own.values())
    if ml.rate is not None:
        return ({p: ml.rate / len(mine) for p in mine}, ml.rate)
    return {}, None


def _mean_rates(samples: Sequence[tuple[MemberLoad, int]], mine: Sequence[int]
                ) -> tuple[dict[int, float], float | None, float]:
    """Each held partition's rate and the member's total, averaged over the reports
    weighted by how many renewals carried each (a partition over the reports that
    carry it; the total, when some report lacks a partition, their sum); and the
    standard error of that total: the partitions' sample variances
    over their counts, summed (0 while a partition has fewer than two reports or they
    agree)."""
    sums: dict[int, float] = {}
    squares: dict[int, float] = {}
    weights: dict[int, int] = {}
    total = 0.0
    total_weight = 0
    for ml, n in samples:
        own, rate = _sample_rates(ml, mine)
        for p, r in own.items():
            sums[p] = sums.get(p, 0.0) + n * r
            squares[p] = squares.get(p, 0.0) + n * r * r
            weights[p] = weights.get(p, 0) + n
        if rate is not None:
            total += n * rate
            total_weight += n
    own_mean = {p: sums[p] / weights[p] for p in sums}
    reports = sum(n for _, n in samples)
    if any(w != reports for w in weights.values()):
        # a partition taken over lately is in the later reports only: the mean of the
        # reports' totals would count it at 0 in the earlier ones
        total, total_weight = sum(own_mean.values()), 1
    variance = 0.0
    for p, n in weights.items():
        if n > 1:
            spread = max(0.0, squares[p] - n * own_mean[p] ** 2) / (n - 1)
            variance += spread / n
    return own_mean, (total / total_weight if total_weight else None), math.sqrt(variance)


def _figure(value: float) -> float:
    """Four significant digits: the status changes when the load does, not with noise in
    the last digit."""
    return float(f"{value:.4g}")


def arrival_loads(load: GroupLoad, arrivals: Mapping[str, float]) -> dict[int, float]:
    """Each reported partition's arrival rate: its processed rate scaled by its holder's
    arrival over processed (spread evenly over the holder's partitions when it processed
    nothing)."""
    out = dict(load.partition_rates)
    for m, arrival in arrivals.items():
        mine = sorted(load.member_partitions.get(m, ()))
        if not mine:
            continue
        rate = sum(load.partition_rates.get(p, 0.0) for p in mine)
        for p in mine:
            out[p] = (load.partition_rates.get(p, 0.0) * arrival / rate if rate > 0
                      else arrival / len(mine))
    return out


@dataclass(frozen=True)
class History:
    """What the next take of the figures needs from the earlier ones."""

    readings: Mapping[str, Reading]  # each member's, at the take growth is measured from
    seconds: float | None  # since then (None: too recent to measure growth)
    arrivals: Mapping[int, float]  # each partition's arrival rate as last estimated


def member_arrivals(load: GroupLoad, history: History | None) -> dict[str, float] | None:
    """Each reporting member's arrival rate (events/s:
    :func:`~kgroup.core.operator.sizing.arrival_rates`); where no growth is measured, the
    processed rate of a member keeping up, the last arrivals of the partitions of one
    behind; None when one behind has neither (the first figures)."""
    readings = load.readings()
    measured = arrival_rates(None if history is None else history.readings, readings,
                             None if history is None else history.seconds)
    out: dict[str, float] = {}
    for m, r in readings.items():
        arrival = measured[m]
        if arrival is None:
            if not is_behind(r.rate, r.lag):
                arrival = r.rate
            elif history is not None and r.partitions \
                    and all(p in history.arrivals for p in r.partitions):
                arrival = sum(history.arrivals[p] for p in r.partitions)
            else:
                return None
        out[m] = arrival
    return out


Taken = tuple[LoadStatus, dict[str, float], dict[int, float], dict[str, Reading],
              dict[int, float], float]
"""status.load, each member's load, each reported partition's rate, each member's
reading (the next take's lag growth starts from it), each reported partition's arrival
rate, the noise allowance of the balance's band (:meth:`GroupLoad.noise`)."""


def take_load(load: GroupLoad, members: Sequence[str], partitions: int, *,
              catch_up_seconds: float, wall: datetime, count_balanced: bool = True,
              known_capacity: float | None = None, history: History | None = None,
              start_seconds: float | None = None) -> Taken:
    """The figures of one take (:func:`load_status`'s, and what the next take needs);
    ``start_seconds``: how long new members take to start, as last seen (None:
    :data:`~kgroup.core.operator.sizing.START_SECONDS`)."""
    rate = sum(load.member_rates.values())
    arrivals = member_arrivals(load, history)
    known = arrival_loads(load, arrivals or {})
    loads = effective_loads(partitions, known)
    current = sorted(set(members))
    per_member = {m: _figure(load.member_rates[m]) for m in current if m in load.member_rates}
    busiest = bound = None
    if current:
        mean = rate / len(current)
        top = max((load.member_rates.get(m, 0.0) for m in current), default=0.0)
        busiest = _figure(top / mean) if mean > 0 else 1.0
        bound = _figure(busiest_share(len(current), loads, count_balanced=False))
    settled = None if history is None else {
        m for m, r in load.readings().items()
        if m in history.readings and history.readings[m].partitions == r.partitions}
    capacity = member_capacity({m: load.member_rates[m] for m in current
                                if m in load.member_rates}, load.member_lags,
                               known_capacity, settled)
    arrival = None if arrivals is None else sum(arrivals.values())
    recommended = None if arrival is None else recommend_members(
        rate=arrival, lag=load.lag or 0, capacity=capacity, loads=loads,
        catch_up_seconds=catch_up_seconds, count_balanced=count_balanced, processed=rate,
        start_seconds=START_SECONDS if start_seconds is None else start_seconds)
    status = LoadStatus(rate=_figure(rate), arrival=None if arrival is None else _figure(arrival),
                        lag=load.lag, busiest_over_mean=busiest,
                        bound=bound, recommended_members=recommended,
                        capacity=None if capacity is None else _figure(capacity),
                        measured_at=format_timestamp(wall))
    return (status, per_member, load.partition_rates, load.readings(),
            known if arrivals is not None else {}, load.noise(current))


def load_status(load: GroupLoad, members: Sequence[str], partitions: int, *,
                catch_up_seconds: float, wall: datetime, count_balanced: bool = True,
                known_capacity: float | None = None, history: History | None = None
                ) -> tuple[LoadStatus, dict[str, float]]:
    """``status.load`` and each current member's load (events/s) from what they report;
    ``known_capacity``: the capacity per member used last time
    (:func:`~kgroup.core.operator.sizing.member_capacity`); ``history``: what the earlier
    takes left (the lags' growth: the arrival rate)."""
    taken = take_load(load, members, partitions, catch_up_seconds=catch_up_seconds,
                      wall=wall, count_balanced=count_balanced,
                      known_capacity=known_capacity, history=history)
    return taken[0], taken[1]


Measure = Callable[[History | None], Taken | None]
"""Takes the figures, given what the earlier takes left."""


def measure_load(member_leases: Mapping[str, MemberLeaseObservation],
                 holders: Mapping[int, str], spec: ConsumerGroupSpec, members: Iterable[str],
                 wall: datetime, known_capacity: float | None = None,
                 history: History | None = None, start_seconds: float | None = None,
                 parsed: ParsedLoads | None = None) -> Taken | None:
    """The load figures from one pass's observations; None: no reports. ``parsed``: the
    annotations the last take parsed (:attr:`LoadTracker.parsed`), read again."""
    if parsed is not None:
        parsed.rotate(spec.partitions)
    load = group_load(member_leases, holders, spec.partitions, parsed or _parse)
    if load is None:
        return None
    return take_load(
        load, sorted(members), spec.partitions, catch_up_seconds=spec.sizing.catch_up_seconds,
        wall=wall, count_balanced=spec.balance.mode == "count",
        known_capacity=known_capacity, history=history, start_seconds=start_seconds)


def load_settings(spec: ConsumerGroupSpec, member_leases: Mapping[str, MemberLeaseObservation]
                  ) -> object:
    """What, when it changes, makes the figures due before the next refresh (at most
    every :data:`SETTINGS_TAKE_GAP`): the sizing settings and which members report load
    (a member that starts reporting is counted within seconds)."""
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
    # the members' readings the lag growth is measured from, and when they were taken
    readings: dict[str, Reading] | None = None
    readings_at: float | None = None
    # each partition's arrival rate as last estimated (a member behind whose growth
    # cannot be measured takes its partitions')
    arrivals: dict[int, float] = field(default_factory=dict)
    # how much the balance's band widens for the reports' noise, as last measured
    # (GroupLoad.noise; 0: the reports agree, or none)
    noise: float = 0.0
    # the annotations parsed at the last take, read again at the next
    parsed: ParsedLoads = field(default_factory=ParsedLoads, repr=False)
    # when a take held back by SETTINGS_TAKE_GAP is due (None: none is)
    pending_at: float | None = None

    def capacity(self) -> float | None:
        """The capacity per member the last figures used (remembered while the members
        are not behind: :func:`~kgroup.core.operator.sizing.member_capacity`)."""
        return self.status.capacity if self.status is not None else None

    def refresh(self, now: float, measure: Measure, settings: object = None) -> None:
        """Take the figures again (``measure``) when they are due, or when ``settings``
        (what the figures are computed with, e.g. the spec's catch-up time) changed, but
        not within :data:`SETTINGS_TAKE_GAP` of the last take (:meth:`deadline` says when
        then); while the group reports no load, at every pass (load reports that start
        wake the loop: the first figures come at once). The lags' growth is measured from
        the readings of the last take at least :data:`MIN_GROWTH_SECONDS` old (a take
        sooner keeps them)."""
        if self.status is not None and now < self.next_at:
            if settings == self.settings:
                return
            if self.taken_at is not None and now < self.taken_at + SETTINGS_TAKE_GAP:
                self.pending_at = self.taken_at + SETTINGS_TAKE_GAP
                return
        self.pending_at = None
        self.next_at = now + self.interval
        self.taken_at = now
        self.settings = settings
        age = None if self.readings_at is None else now - self.readings_at
        ripe = age is not None and age >= MIN_GROWTH_SECONDS
        history = None if self.readings is None else History(
            self.readings, age if ripe else None, self.arrivals)
        taken = measure(history)
        if taken is None:
            self.status, self.members, self.rates = None, {}, {}
            self.readings = self.readings_at = None
            self.arrivals = {}
            self.noise = 0.0
            return
        self.status, self.members, self.noise = taken[0], taken[1], taken[5]
        self.rates = {**self.rates, **taken[2]}
        if ripe or self.readings is None:
            self.readings, self.readings_at = taken[3], now
        self.arrivals = {**self.arrivals, **taken[4]}

    def deadline(self) -> float | None:
        """When to look again for the next figures (None: the group reports no load)."""
        if self.status is None:
            return None
        return self.next_at if self.pending_at is None else min(self.next_at, self.pending_at)

    def apply(self, status: ConsumerGroupStatus) -> ConsumerGroupStatus:
        """``status`` with the figures last taken."""
        if self.status is None:
            return status
        rows = [row.model_copy(update={"load": self.members.get(row.name)})
                for row in status.members]
        return status.model_copy(update={"load": self.status, "members": rows})
