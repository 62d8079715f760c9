"""Partition assignors: from members and the current target to the next target.

Rule of this module: an assignor is a pure, deterministic function of its inputs. The
same members (in any order), the same ``current`` target and the same lock ``holders``
(in any dict order) always give the same result, and it reads no clock and does no I/O.
The operator relies on this to never bump the epoch when nothing changed: feeding a
result back as ``current`` returns it unchanged.

Two assignors:

``sticky`` (the default)
    A member that stays keeps what it has, and the number of partitions that change
    owner is the minimum that balance allows (:func:`lower_bound_moves`). Balance: every
    member's count is the floor or the ceiling of its exact share ``N * w / W``; with equal
    weights that is ±1 partition. A partition's *prior owner* is its owner in ``current``
    if that owner is still a member, else its actual lock holder if the holder is a member
    (so a group whose target was lost is re-seeded from who really holds what, and nothing
    moves).

``range``
    Contiguous blocks in sorted member-id order, as Runnel does: the first ``N % M``
    members get one partition more. Weights are ignored, and nothing is sticky: a join
    or a leave shifts every block after it. Kept for groups that want contiguity.

Speed: the work is O(N + M log M) with no per-partition loop over members, so 100,000
partitions over 1,000 members is a fraction of a second in pure Python (bench/).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Protocol

__all__ = [
    "ASSIGNORS",
    "Assignee",
    "Assignor",
    "RangeAssignor",
    "StickyAssignor",
    "get_assignor",
    "lower_bound_moves",
    "moved_partitions",
]


@dataclass(frozen=True)
class Assignee:
    """A group member as an assignor sees it: its id (the pod name) and its relative
    capacity. The member itself, its state machine, is
    :class:`kgroup.core.member.reconcile.Member`."""

    id: str
    weight: int = 1


class Assignor(Protocol):
    """Computes the next target assignment; see the module docstring for the rules."""

    name: str

    def assign(
        self,
        partitions: int,
        members: Sequence[Assignee],
        current: Mapping[str, Sequence[int]],
        holders: Mapping[int, str],
    ) -> dict[str, list[int]]:
        """Every member is a key (maybe with ``[]``); each list is sorted."""
        ...


def _check(partitions: int, members: Sequence[Assignee]) -> list[Assignee]:
    """Validate the inputs every assignor shares; return members sorted by id."""
    if partitions < 0:
        raise ValueError(f"partitions must be >= 0, got {partitions}")
    ordered = sorted(members, key=lambda m: m.id)
    for prev, nxt in pairwise(ordered):
        if prev.id == nxt.id:
            raise ValueError(f"member {nxt.id!r} is listed twice")
    for m in ordered:
        if m.weight < 1:
            raise ValueError(f"member {m.id!r} has weight {m.weight}; weights must be >= 1")
    return ordered


def _prior_owners(
    partitions: int,
    member_ids: set[str],
    current: Mapping[str, Sequence[int]],
    holders: Mapping[int, str],
) -> list[str | None]:
    """Per partition, the member that counts as holding it now (or None).

    ``current`` wins over ``holders``. A malformed ``current`` that lists one partition
    under two members gives it to the smaller member id (deterministic, never raises);
    partitions outside ``0..partitions-1`` are ignored.
    """
    owner: list[str | None] = [None] * partitions
    for member in sorted(current, reverse=True):  # smallest id written last, so it wins
        if member not in member_ids:
            continue
        for p in current[member]:
            if 0 <= p < partitions:
                owner[p] = member
    for p, holder in holders.items():
        if 0 <= p < partitions and owner[p] is None and holder in member_ids:
            owner[p] = holder
    return owner


def _holdings(ordered: Sequence[Assignee], owner: Sequence[str | None]) -> dict[str, list[int]]:
    """Member id -> the partitions it holds now, ascending."""
    held: dict[str, list[int]] = {m.id: [] for m in ordered}
    for p, member in enumerate(owner):
        if member is not None:
            held[member].append(p)
    return held


def _quotas(
    partitions: int, ordered: Sequence[Assignee], held_count: Mapping[str, int]
) -> dict[str, int]:
    """Balanced target counts that keep as many current holdings as possible.

    Every member gets ``floor(N*w/W)``; the ``E`` leftover partitions go, one each, to
    members whose exact share is fractional. Among those, a member that already holds
    more than its floor comes first (giving it the extra saves a move), then the one that
    holds more, ties by id. With equal weights this is simply "holds more first".
    """
    total_weight = sum(m.weight for m in ordered)
    quota: dict[str, int] = {}
    candidates: list[Assignee] = []
    for m in ordered:
        q, rem = divmod(partitions * m.weight, total_weight)
        quota[m.id] = q
        if rem:
            candidates.append(m)
    extras = partitions - sum(quota.values())

    def preference(m: Assignee) -> tuple[bool, int, str]:
        h = held_count[m.id]
        return (h <= quota[m.id], -h, m.id)

    candidates.sort(key=preference)
    for m in candidates[:extras]:
        quota[m.id] += 1
    return quota


def lower_bound_moves(
    partitions: int,
    members: Sequence[Assignee],
    current: Mapping[str, Sequence[int]],
    holders: Mapping[int, str],
) -> int:
    """The fewest owner changes any balanced assignment needs from this state.

    A partition keeps its owner only if its prior owner is a member and keeps it within
    its quota, so at most ``sum(min(held_i, quota_i))`` partitions stay; the quota vector
    that maximises that sum is the one :func:`_quotas` picks. Partitions with no prior
    owner always count as moved (they get a new owner).
    """
    ordered = _check(partitions, members)
    if not ordered:
        return 0
    owner = _prior_owners(partitions, {m.id for m in ordered}, current, holders)
    counts = {m.id: 0 for m in ordered}
    for member in owner:
        if member is not None:
            counts[member] += 1
    quota = _quotas(partitions, ordered, counts)
    kept = sum(min(counts[member], quota[member]) for member in counts)
    return partitions - kept


class StickyAssignor:
    """Minimum movement, balanced, deterministic (see the module docstring)."""

    name = "sticky"

    def assign(
        self,
        partitions: int,
        members: Sequence[Assignee],
        current: Mapping[str, Sequence[int]],
        holders: Mapping[int, str],
    ) -> dict[str, list[int]]:
        ordered = _check(partitions, members)
        if not ordered:
            return {}
        owner = _prior_owners(partitions, {m.id for m in ordered}, current, holders)
        held = _holdings(ordered, owner)
        quota = _quotas(partitions, ordered, {member: len(ps) for member, ps in held.items()})

        # 1. Everyone keeps its lowest-numbered partitions up to its quota; the
        #    highest-numbered ones above quota are given up first.
        free: list[int] = [p for p, member in enumerate(owner) if member is None]
        result: dict[str, list[int]] = {}
        for m in ordered:
            mine = held[m.id]
            q = quota[m.id]
            if len(mine) > q:
                free.extend(mine[q:])
                mine = mine[:q]
            result[m.id] = mine
        free.sort()

        # 2. Free partitions, ascending, fill members below quota in id order (each
        #    member gets a run of the pool, which keeps its ranges compact).
        pos = 0
        for m in ordered:
            mine = result[m.id]
            need = quota[m.id] - len(mine)
            if need > 0:
                mine = mine + free[pos : pos + need]
                mine.sort()
                result[m.id] = mine
                pos += need
        assert pos == len(free), "quotas must add up to the partition count"
        return result


class RangeAssignor:
    """Contiguous blocks by sorted member id (Runnel); weights are ignored."""

    name = "range"

    def assign(
        self,
        partitions: int,
        members: Sequence[Assignee],
        current: Mapping[str, Sequence[int]],
        holders: Mapping[int, str],
    ) -> dict[str, list[int]]:
        ordered = _check(partitions, members)
        if not ordered:
            return {}
        size, extra = divmod(partitions, len(ordered))
        result: dict[str, list[int]] = {}
        start = 0
        for i, m in enumerate(ordered):
            n = size + (1 if i < extra else 0)
            result[m.id] = list(range(start, start + n))
            start += n
        return result


ASSIGNORS: dict[str, Assignor] = {"sticky": StickyAssignor(), "range": RangeAssignor()}


def get_assignor(name: str) -> Assignor:
    """The assignor called `name` (``sticky`` or ``range``); ValueError otherwise."""
    try:
        return ASSIGNORS[name]
    except KeyError:
        known = ", ".join(sorted(ASSIGNORS))
        raise ValueError(f"unknown assignor {name!r}: expected one of {known}") from None


def moved_partitions(
    before: Mapping[str, Sequence[int]], after: Mapping[str, Sequence[int]]
) -> int:
    """Partitions whose owner differs between two assignments.

    A partition that gains an owner counts (it was unassigned before), and so does one
    that loses its owner; a partition listed under no member in either counts not at all.
    """
    old: dict[int, str] = {}
    for member, ps in before.items():
        for p in ps:
            old[p] = member
    moved = 0
    seen: set[int] = set()
    for member, ps in after.items():
        for p in ps:
            seen.add(p)
            if old.get(p) != member:
                moved += 1
    moved += sum(1 for p in old if p not in seen)
    return moved
