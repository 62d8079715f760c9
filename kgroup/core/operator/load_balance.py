"""Load-aware sticky assignment: balance what members *do*, not how many partitions they hold.

Rule of this module: pure. No clock (``now`` and every last-moved time are seconds on the
caller's clock), no I/O, deterministic: the same inputs, in any dict order, give the same
plan. The operator's planner calls it when ``spec.balance.mode`` is load
(:class:`kgroup.core.operator.planner.GroupPlanner`; docs/load-balancing.md, "The
wiring").

Why a separate planner that runs *after* the sticky rules, not a mode inside
:class:`~kgroup.core.operator.assignors.StickyAssignor`: the sticky assignor promises
exact count balance (floor or ceiling of the fair share) and to be a fixed point of its
own output, and the operator relies on both. A load-balanced target is deliberately *not*
count-balanced (the member holding a hot partition should hold few others), so fed back
to the sticky assignor it would be "repaired" towards equal counts, and the two would
undo each other on every pass. Load balancing also needs inputs the count assignors do not
have (loads, last-moved times, ``now``) and returns more (which partitions moved, so the
caller can stamp them). So :func:`plan_load_balance` is its own function with two steps:

1. **Membership** (:func:`_settle_membership`), the sticky rules: a partition keeps its
   prior owner (the owner in ``current`` if still a member, else its lock holder if a
   member); a member above its count cap sheds its highest-numbered partitions; a
   *joiner* (a member holding nothing) gets ``floor`` of its fair count, as the sticky
   assignor would give it, from the orphans first and then from the members with the
   largest surplus over their fair count (highest-numbered first); the remaining orphans
   go heaviest first to the least utilised member under its cap. Members that stay keep
   everything within their cap, so a join or a leave moves only what it must.
2. **Load** (:func:`_refine_load`), a Schmitt trigger. Utilisation is ``load / weight``,
   the mean is ``total load / total weight``. Nothing moves while the busiest member is
   within the band, at or below ``(1 + tolerance + margin) * mean``. Above it, a descent is tried:
   repeatedly, the most utilised member above the mean that can be helped makes the
   single move (one of its partitions to a member under its count cap) or swap (one
   partition each way, counts unchanged) that lowers the larger of the two members'
   utilisations the most, if that gain is more than a quarter of ``margin * mean`` (no
   crumbs). A partition moved less than ``dwell_seconds`` ago (by ``last_moved``) is not
   a candidate; one moved earlier in the same descent may move again (only where it ends
   up counts). The descent is kept only if it lowers the busiest member's utilisation by
   more than ``margin * mean``; otherwise nothing moves.
   The descent goes down to the mean, not just under the trigger: a rebalance lands at
   ``max(1 + tolerance, bound)`` or better (measured, not proven: a greedy descent can
   stop at a local optimum), so the members sit well inside the band afterwards and noise
   has ``tolerance + margin`` of room before anything moves again. A group can therefore
   rest anywhere up to ``1 + tolerance + margin``: that dead zone is the hysteresis.

Why it cannot oscillate. Let the potential be the members' utilisations sorted in
descending order, compared lexicographically. Every step moves load between a member
``i`` and a member ``r`` with ``u_r < u_i`` and leaves both strictly below ``u_i``; the
entries above ``u_i`` are untouched and one fewer entry equals ``u_i``, so the sorted
vector strictly decreases. Under constant loads every plan that moves anything therefore
lowers the potential, in this plan and in every later one (dwell only delays candidates),
and the state space is finite: the moves stop, and no assignment is ever revisited. Once
the busiest member is within the band, nothing moves at all until the loads change.
Under noisy loads the potential is re-measured each time, so the guarantee is the band:
a settled group has its members near the mean, and a re-drawn load moves something only
if noise alone lifts a member ``tolerance + margin`` above the mean *and* moving would
lower the busiest by more than the margin (a hot partition that alone sets the maximum
makes every such plan worthless, so it moves nothing). The dwell time caps every partition at one
move per ``dwell_seconds`` whatever the loads do. This is a bound on noise, not a proof:
the tests and bench/bench_load_assignor.py measure it (±20 % noise on every partition,
re-drawn every 20 s) and show tolerance 0, margin 0, dwell 0 moving all the time.

The count bound. A member never *receives* a partition in the load step while it holds
``cap = ceil(count_slack * N * w / W)`` or more (default slack 2: at most twice its fair
count, rounded up); the membership step sheds above the cap. So zero-load partitions,
which no load move wants, stay where the sticky rules put them and cannot pile up on one
member. The only lower count bound after the membership step is one partition, for a
member whose fair count is at least one (an empty member would be taken for a joiner on
the next pass and handed a share back): the member holding the hottest partition may hold
little else, and that is the point.

Unmeasured partitions. A partition absent from ``loads`` (or ``None``) counts at the
mean of the measured ones, so a new partition is treated as typical until measured; if
nothing is measured every partition counts as 1.0, and the plan degrades to count
balance within the band. Loads must be finite and >= 0.

Dwell binds the load step only: the membership step moves what it must (a departed
member's partitions need an owner now), and stamps them like any move.

Speed: each step is O(M + N log N) (the swap search bisects the receiver's sorted loads),
and a plan takes at most ``STEP_LIMIT * (N + 1)`` steps (a guard; the potential ends the
descent long before); meant for groups of up to thousands of partitions.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kgroup.core.operator.assignors import Assignee, _check, _holdings, _prior_owners

__all__ = [
    "LoadBalance",
    "LoadPlan",
    "busiest_ratio",
    "count_caps",
    "effective_loads",
    "load_bound",
    "min_moves_lower_bound",
    "plan_load_balance",
]


@dataclass(frozen=True)
class LoadBalance:
    """The knobs of load-aware assignment (see the module docstring).

    ``tolerance``: the balance a rebalance reaches: busiest <= (1 + tolerance) x mean, or
    the bound. ``margin``: the dead zone above it; nothing moves until busiest >
    (1 + tolerance + margin) x mean, and a rebalance must lower the busiest by more than
    margin x mean. ``dwell_seconds``: a partition moved within this time does not move.
    ``count_slack``: a member holds at most ceil(count_slack x its fair count).
    ``noise``: how far the measured loads may be off (a fraction of the mean member's
    load, from the reports' spread: :meth:`kgroup.core.operator.load_status.GroupLoad.noise`);
    it widens the dead zone and the gain a rebalance must make by as much.
    """

    tolerance: float = 0.15
    margin: float = 0.05
    dwell_seconds: float = 60.0
    count_slack: float = 2.0
    noise: float = 0.0

    def __post_init__(self) -> None:
        for name in ("tolerance", "margin", "dwell_seconds", "noise"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if not (math.isfinite(self.count_slack) and self.count_slack >= 1):
            raise ValueError(f"count_slack must be >= 1, got {self.count_slack}")


@dataclass(frozen=True)
class LoadPlan:
    """The next target and what changed owner to reach it.

    ``target``: every member a key, each list sorted. ``moved``: the partitions whose
    owner differs from their prior owner, ascending; the caller stamps them with ``now``
    as their last-moved time. ``membership_moves`` of them were made by the membership
    step, the rest by the load step.
    """

    target: dict[str, list[int]]
    moved: tuple[int, ...]
    membership_moves: int


def effective_loads(partitions: int, loads: Mapping[int, float | None]) -> list[float]:
    """Per partition, its load, unmeasured ones at the mean of the measured (else 1.0)."""
    measured: dict[int, float] = {}
    for p, value in loads.items():
        if value is None or not 0 <= p < partitions:
            continue
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"partition {p} has load {value}; loads must be finite and >= 0")
        measured[p] = float(value)
    fill = sum(measured.values()) / len(measured) if measured else 1.0
    return [measured.get(p, fill) for p in range(partitions)]


def count_caps(partitions: int, members: Sequence[Assignee], count_slack: float) -> dict[str, int]:
    """Member id -> the most partitions it may hold: ceil(slack x N x w / W), at least 1."""
    ordered = _check(partitions, members)
    total_weight = sum(m.weight for m in ordered)
    return {
        m.id: max(1, math.ceil(count_slack * partitions * m.weight / total_weight - 1e-9))
        for m in ordered
    }


def busiest_ratio(
    target: Mapping[str, Sequence[int]], loads: Sequence[float], members: Sequence[Assignee]
) -> float:
    """The busiest member's utilisation over the mean (1.0 when there is no load)."""
    weight = {m.id: m.weight for m in members}
    total = sum(loads)
    if total <= 0 or not weight:
        return 1.0
    mean = total / sum(weight.values())
    if mean <= 0:  # a total so small that the mean underflows: nothing to balance
        return 1.0
    busiest = max(sum(loads[p] for p in target.get(member, ())) / w for member, w in weight.items())
    return busiest / mean


def load_bound(loads: Sequence[float], members: Sequence[Assignee]) -> float:
    """A lower bound on :func:`busiest_ratio` that *every* assignment meets.

    Pigeonhole: of the ``j*M + 1`` heaviest partitions, some member holds at least
    ``j + 1``, so its load is at least the sum of the ``j + 1`` lightest of them; dividing
    by the largest weight keeps it a bound for weighted members. ``j = 0`` is the heaviest
    single partition, ``j = 1`` the classic ``p_M + p_(M+1)``. Never below 1.0.
    """
    ordered = _check(len(loads), members)
    total = sum(loads)
    if not ordered or total <= 0:
        return 1.0
    mean = total / sum(m.weight for m in ordered)
    if mean <= 0:  # underflow, as in busiest_ratio
        return 1.0
    w_max = max(m.weight for m in ordered)
    heavy = sorted(loads, reverse=True)
    m = len(ordered)
    best = 1.0
    j = 0
    while j * m < len(heavy):
        top = j * m  # index of the (j*M + 1)-th heaviest
        best = max(best, sum(heavy[top - j : top + 1]) / w_max / mean)
        j += 1
    return best


def min_moves_lower_bound(
    target: Mapping[str, Sequence[int]],
    loads: Sequence[float],
    members: Sequence[Assignee],
    limit: float,
) -> int:
    """The fewest partitions any planner must move so the busiest ratio is <= ``limit``.

    Each member above ``limit x mean x w`` must give away partitions worth at least its
    excess, and fewest when it gives its heaviest; the sum over those members is a lower
    bound (a move leaves exactly one member). It ignores the receivers, so the true
    minimum may be higher; ``moves / this`` >= 1 measures a planner's waste.
    """
    total = sum(loads)
    if total <= 0:
        return 0
    mean = total / sum(m.weight for m in members)
    if mean <= 0:  # the mean underflows: nothing to balance (as busiest_ratio says)
        return 0
    need = 0
    for m in members:
        mine = sorted((loads[p] for p in target.get(m.id, ())), reverse=True)
        excess = sum(mine) - limit * mean * m.weight
        shed = 0.0
        for value in mine:
            if excess - shed <= 1e-12 * total:
                break
            shed += value
            need += 1
    return need


def plan_load_balance(
    partitions: int,
    members: Sequence[Assignee],
    current: Mapping[str, Sequence[int]],
    holders: Mapping[int, str],
    loads: Mapping[int, float | None],
    last_moved: Mapping[int, float],
    now: float,
    config: LoadBalance | None = None,
) -> LoadPlan:
    """The next target: the sticky rules for membership, then load refinement.

    ``loads``: per partition, e.g. events/s (see :func:`effective_loads` for missing
    ones). ``last_moved``: per partition, when it last changed owner (absent: long ago).
    Feeding the returned target back with the same loads and the moved partitions stamped
    at ``now`` moves nothing more until a dwell time has passed.
    """
    cfg = config or LoadBalance()
    ordered = _check(partitions, members)
    if not ordered:
        return LoadPlan({}, (), 0)
    load = effective_loads(partitions, loads)
    caps = count_caps(partitions, ordered, cfg.count_slack)
    prior = _prior_owners(partitions, {m.id for m in ordered}, current, holders)
    owner = _settle_membership(partitions, ordered, prior, load, caps)
    membership_moved = {p for p in range(partitions) if owner[p] != prior[p]}
    eligible = [now - last_moved.get(p, -math.inf) >= cfg.dwell_seconds for p in range(partitions)]
    _refine_load(ordered, owner, load, caps, eligible, cfg)
    target = _holdings(ordered, owner)
    moved = tuple(p for p in range(partitions) if owner[p] != prior[p])
    return LoadPlan(target, moved, len(membership_moved))


def _surplus_key(m: Assignee, count: int, partitions: int, total_weight: int) -> int:
    """count - fair count, scaled by W to stay an exact integer."""
    return count * total_weight - partitions * m.weight


def _settle_membership(
    partitions: int,
    ordered: Sequence[Assignee],
    prior: Sequence[str | None],
    load: Sequence[float],
    caps: Mapping[str, int],
) -> list[str | None]:
    """Step 1, the sticky rules with a count cap; returns the owner of every partition."""
    owner = list(prior)
    held = _holdings(ordered, owner)
    # Above the cap: shed the highest-numbered, as the sticky assignor does.
    for m in ordered:
        for p in held[m.id][caps[m.id] :]:
            owner[p] = None
        held[m.id] = held[m.id][: caps[m.id]]
    pool = [p for p in range(partitions) if owner[p] is None]
    total_weight = sum(m.weight for m in ordered)

    # Joiners get floor of their fair count: orphans first (heaviest first, so the
    # joiner starts with real work), then the largest surplus gives its highest-numbered.
    pool.sort(key=lambda p: (-load[p], p))
    for joiner in [m for m in ordered if not held[m.id]]:
        want = min(partitions * joiner.weight // total_weight, caps[joiner.id])
        while len(held[joiner.id]) < want:
            if pool:
                p = pool.pop(0)
            else:
                donors = [m for m in ordered if m.id != joiner.id and held[m.id]]
                donor = max(
                    donors,
                    key=lambda m: (
                        _surplus_key(m, len(held[m.id]), partitions, total_weight),
                        m.id,
                    ),
                )
                p = held[donor.id].pop()
            owner[p] = joiner.id
            held[joiner.id].append(p)

    # Remaining orphans: heaviest first to the least utilised member under its cap.
    member_load = {m.id: sum(load[p] for p in held[m.id]) for m in ordered}
    for p in pool:
        open_members = [m for m in ordered if len(held[m.id]) < caps[m.id]]
        to = min(open_members, key=lambda m: (member_load[m.id] / m.weight, len(held[m.id]), m.id))
        owner[p] = to.id
        held[to.id].append(p)
        member_load[to.id] += load[p]
    return owner


STEP_FRACTION = 0.25
"""A descent step must gain more than this fraction of the margin (no crumbs)."""
STEP_LIMIT = 4
"""At most this many descent steps per partition and plan: a guard, never reached."""
RESOLUTION = 1e-9
"""Gains at or below this fraction of the mean are rounding, not balance: a swap of a hot
partition for a cold one that leaves the busiest exactly where it was can show a gain of
a few ulps, and with margin 0 such "gains" would swap back and forth forever."""


@dataclass(frozen=True)
class _Move:
    gain: float
    give: int  # partition leaving the busiest member
    take: int | None  # partition coming back (a swap), or None
    to: str


def _refine_load(
    ordered: Sequence[Assignee],
    owner: list[str | None],
    load: Sequence[float],
    caps: Mapping[str, int],
    eligible: Sequence[bool],
    cfg: LoadBalance,
) -> None:
    """Step 2, in place on ``owner``: a descent, kept only if it lowers the busiest enough."""
    total = sum(load)
    if total <= 0:
        return
    weight = {m.id: m.weight for m in ordered}
    mean = total / sum(weight.values())
    held = _holdings(ordered, owner)
    member_load = {member: sum(load[p] for p in ps) for member, ps in held.items()}

    def busiest() -> float:
        return max(member_load[m.id] / m.weight for m in ordered)

    before = busiest()
    band = cfg.margin + cfg.noise  # the dead zone above the tolerance, and the gain needed
    if before <= (1 + cfg.tolerance + band) * mean:
        return
    step_gain = max(cfg.margin * STEP_FRACTION, RESOLUTION) * mean
    keep = {m.id: min(1, (len(load) * m.weight) // sum(weight.values())) for m in ordered}
    moves: list[tuple[str, _Move]] = []
    for _ in range(STEP_LIMIT * len(load) + STEP_LIMIT):
        move: tuple[str, _Move] | None = None
        for m in sorted(ordered, key=lambda m: (-member_load[m.id] / m.weight, m.id)):
            if member_load[m.id] / m.weight <= mean:
                break
            found = _best_move(m.id, held, member_load, weight, load, caps, eligible, keep)
            if found is not None and found.gain > step_gain:
                move = (m.id, found)
                break
        if move is None:
            break
        src, mv = move
        delta = load[mv.give] - (load[mv.take] if mv.take is not None else 0.0)
        held[src].remove(mv.give)
        held[mv.to].append(mv.give)
        if mv.take is not None:
            held[mv.to].remove(mv.take)
            held[src].append(mv.take)
        member_load[src] -= delta
        member_load[mv.to] += delta
        moves.append(move)
    after = busiest()
    if before - after <= max(band, RESOLUTION) * mean:
        return  # not worth it: noise, or nothing that moves can help
    for src, mv in moves:
        owner[mv.give] = mv.to
        if mv.take is not None:
            owner[mv.take] = src


def _best_move(
    busiest: str,
    held: Mapping[str, list[int]],
    member_load: Mapping[str, float],
    weight: Mapping[str, int],
    load: Sequence[float],
    caps: Mapping[str, int],
    eligible: Sequence[bool],
    keep: Mapping[str, int],
) -> _Move | None:
    """The move or swap off ``busiest`` that lowers max(u_busiest, u_receiver) the most.

    Ties go to a single move over a swap (fewer moves), then receiver id, then partition.
    A single move never takes the last partition of a member whose fair count is at least
    one (``keep``): the membership step would see it empty, take it for a joiner and hand
    it a share, undoing this plan on the next pass.
    """
    w_b = weight[busiest]
    l_b = member_load[busiest]
    u_b = l_b / w_b
    gives = sorted((p for p in held[busiest] if eligible[p]), key=lambda p: (load[p], p))
    if not gives:
        return None
    best: _Move | None = None
    best_key: tuple[float, int, str, int, int] | None = None

    def consider(delta: float, give: int, take: int | None, to: str) -> None:
        nonlocal best, best_key
        if delta <= 0:
            return
        w_r = weight[to]
        after = max((l_b - delta) / w_b, (member_load[to] + delta) / w_r)
        gain = u_b - after
        key = (-gain, 0 if take is None else 1, to, give, -1 if take is None else take)
        if best_key is None or key < best_key:
            best, best_key = _Move(gain, give, take, to), key

    for to in sorted(held):
        if to == busiest:
            continue
        w_r = weight[to]
        l_r = member_load[to]
        if l_r / w_r >= u_b:
            continue
        # The shift that equalises the two: (l_b - x)/w_b == (l_r + x)/w_r.
        ideal = (l_b * w_r - l_r * w_b) / (w_b + w_r)
        if len(held[to]) < caps[to] and len(held[busiest]) > keep[busiest]:
            i = bisect_left([load[p] for p in gives], ideal)
            for j in (i - 1, i):
                if 0 <= j < len(gives):
                    consider(load[gives[j]], gives[j], None, to)
        takes = sorted((q for q in held[to] if eligible[q]), key=lambda q: (load[q], q))
        take_loads = [load[q] for q in takes]
        for p in gives:
            # want load[p] - load[q] close to ideal, so load[q] close to load[p] - ideal
            i = bisect_left(take_loads, load[p] - ideal)
            for j in (i - 1, i):
                if 0 <= j < len(takes):
                    consider(load[p] - take_loads[j], p, takes[j], to)
    return best
