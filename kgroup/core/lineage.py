"""Partition lineage: a group's partitions over generations of key-hash layouts.

A key is placed by its 32-bit hash (:func:`key_hash`, the crc32 the reference producer
uses). A *generation* is the group's partitions at one layout; a change of layout (a
*reshape*) makes a new generation, and the partitions it replaces are *sealed*: producers
write a key's later events to the new generation only. So one key's events lie first in
one partition of generation g, then in one of g+1, and per-key order holds only if the
successor is read after its predecessors are read to the end.

Placements:

- ``range``: the hash space ``[0, 2**32)`` is cut into contiguous ranges, one per
  partition, in hash order. Each partition's share is a fraction (its *width*); the cut
  below a partition is ``floor(sum of the widths before it * 2**32)``, so a partition's
  hashes are found by bisection, with no table per key.
- ``modulo``: ``hash % N`` (what a group made before lineage places keys by:
  ``kgroup_pipeline.keys.partition_for``). Only the first generation may be modulo; its
  first reshape must be uniform, and each successor has as predecessors every residue its
  range contains: all N of them unless the range is narrower than N hashes.

Changes (:class:`Uniform`, :class:`Split`, :class:`Merge`): N -> M even ranges, one range
cut in two halves, or two adjacent ranges joined. A partition whose range is unchanged
keeps its number (it is *carried* into the new generation); every other partition of the
new generation gets a new number from ``next_partition``. Numbers are never reused, so a
partition's fencing-token history stays its own.

States (:class:`State`): a partition of the newest generation is *open*; one no longer in
it is *sealed* until it is *completed* (read to its end). Rules:

- :meth:`Lineage.predecessors` of a partition are the partitions of the generation before
  the one it first appears in whose keys can hash into its range; a carried partition
  has none there.
- **A partition is assignable only when every predecessor is completed** (and it is not
  completed itself): :meth:`Lineage.is_assignable`. Only an assignable sealed partition
  can be completed, so completion runs down the lineage in order.
- Retirement (:meth:`Lineage.retire`): the oldest generation is dropped once every one of
  its partitions that the next generation does not carry is completed. Its successors'
  waits are then all over, so forgetting those partitions changes no answer of
  :meth:`Lineage.is_assignable`.

The compact wire form for a status is :mod:`kgroup.core.lineage_codec`'s
(``docs/reshape.md``). Pure: no I/O, no clock.
"""

from __future__ import annotations

import zlib
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from fractions import Fraction
from functools import cached_property
from itertools import accumulate, pairwise
from math import lcm
from typing import TypeVar

from kgroup.core.ranges import MAX_PARTITIONS, format_ranges

__all__ = ["HASH_SPACE", "MAX_GENERATIONS", "MAX_PARTITION_NUMBER", "Change", "Generation",
           "Lineage", "LineageError", "Merge", "Placement", "Split", "State", "Uniform",
           "initial", "key_hash", "partition_of", "reshape"]

HASH_BITS = 32
HASH_SPACE = 1 << HASH_BITS
"""Key hashes are in ``[0, HASH_SPACE)``."""

MAX_GENERATIONS = 8
"""The most generations a lineage keeps: a reshape beyond it waits for the oldest to be
read to the end and retired (a bound on the status' size)."""

MAX_PARTITION_NUMBER = 999_999_999
"""Partition numbers only grow; they stay within nine digits (what range strings parse)."""

_T = TypeVar("_T")


class LineageError(ValueError):
    """A change the lineage refuses, or a wire form that is not a lineage; the message
    says which rule and which partition."""


def key_hash(key: str) -> int:
    """The 32-bit hash of an event key: crc32 of its UTF-8 bytes, as the producer's."""
    return zlib.crc32(key.encode())


class Placement(StrEnum):
    MODULO = "modulo"
    """``hash % N``: partition numbers 0..N-1, a group's first generation only."""
    RANGE = "range"
    """Contiguous hash ranges, one per partition, in hash order."""


class State(StrEnum):
    OPEN = "open"
    """In the newest generation: producers write to it."""
    SEALED = "sealed"
    """Replaced by a reshape: producers no longer write to it; not yet read to its end."""
    COMPLETED = "completed"
    """Sealed and read to its end: its successors need not wait for it."""


_MAX_SCALE = 1 << 48
"""Widths are fractions over a common denominator at most this: a partition owns at least
one of the 2**32 hashes, and every split halves a share of an N-way uniform layout, so
real denominators stay near 2**34; a finer text is refused before any arithmetic."""


def _grid(widths: Iterable[Fraction], where: str) -> tuple[int, tuple[int, ...]]:
    """Widths as integers over their common denominator: ``(scale, starts)``, the start
    of each share and then their sum, each times ``scale``."""
    ws = tuple(widths)
    scale = 1
    for den in {w.denominator for w in ws}:
        scale = lcm(scale, den)
        if scale > _MAX_SCALE:
            raise LineageError(f"{where}: widths finer than 1/2**48")
    return scale, tuple(accumulate((w.numerator * (scale // w.denominator) for w in ws),
                                   initial=0))


@dataclass(frozen=True)
class Generation:
    """One layout: ``partitions`` in hash order (modulo: partition n takes ``hash % N ==
    n``) and, for range placement, each one's share of the hash space."""

    number: int
    placement: Placement
    partitions: tuple[int, ...]
    widths: tuple[Fraction, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.partitions)
        if self.number < 1:
            raise LineageError(f"generation {self.number}: generations are numbered from 1")
        if not 1 <= n <= MAX_PARTITIONS:
            raise LineageError(f"generation {self.number} has {n} partitions: need 1 to "
                               f"{MAX_PARTITIONS}")
        if len(set(self.partitions)) != n:
            raise LineageError(f"generation {self.number} lists a partition twice")
        if any(not 0 <= p <= MAX_PARTITION_NUMBER for p in self.partitions):
            raise LineageError(f"generation {self.number}: partition numbers are 0 to "
                               f"{MAX_PARTITION_NUMBER}")
        if self.placement is Placement.MODULO:
            if self.widths:
                raise LineageError(f"generation {self.number} is modulo: it has no widths")
            if self.partitions != tuple(range(n)):
                raise LineageError(f"generation {self.number} is modulo: its partitions "
                                   f"must be 0-{n - 1} in order")
            return
        if len(self.widths) != n:
            raise LineageError(f"generation {self.number} has {n} partitions but "
                               f"{len(self.widths)} widths")
        if any(w <= 0 for w in self.widths):
            raise LineageError(f"generation {self.number}: every width must be positive")
        scale, starts = self._grid
        if starts[-1] != scale:
            raise LineageError(f"generation {self.number}: widths add up to "
                               f"{Fraction(starts[-1], scale)}, not 1")
        cuts = self.cuts
        for i, (lo, hi) in enumerate(pairwise(cuts)):
            if hi <= lo:
                raise LineageError(f"generation {self.number}: partition "
                                   f"{self.partitions[i]} owns no hash (width "
                                   f"{self.widths[i]})")

    @cached_property
    def _grid(self) -> tuple[int, tuple[int, ...]]:
        return _grid(self.widths, f"generation {self.number}")

    @cached_property
    def cuts(self) -> tuple[int, ...]:
        """Range placement: the first hash of each partition, then :data:`HASH_SPACE`."""
        scale, starts = self._grid
        return tuple((n << HASH_BITS) // scale for n in starts)

    @cached_property
    def _index(self) -> dict[int, int]:
        return {p: i for i, p in enumerate(self.partitions)}

    def __contains__(self, partition: object) -> bool:
        return partition in self._index

    def bounds(self, partition: int) -> tuple[Fraction, Fraction]:
        """Range placement: the exact share ``[lo, hi)`` of the hash space (0..1)."""
        i = self._index[partition]
        scale, starts = self._grid
        return Fraction(starts[i], scale), Fraction(starts[i + 1], scale)

    def same_range(self, partition: int, other: Generation) -> bool:
        """Range placement: does ``partition`` have the same share here as in ``other``."""
        i, j = self._index[partition], other._index[partition]
        (scale, starts), (o_scale, o_starts) = self._grid, other._grid
        return starts[i] * o_scale == o_starts[j] * scale and \
            starts[i + 1] * o_scale == o_starts[j + 1] * scale

    def span(self, partition: int) -> tuple[int, int]:
        """Range placement: the hashes ``[lo, hi)`` the partition owns."""
        i = self._index[partition]
        return self.cuts[i], self.cuts[i + 1]

    def partition_of(self, key_hash: int) -> int:
        """The one partition of this generation a key of this hash goes to."""
        if not 0 <= key_hash < HASH_SPACE:
            raise ValueError(f"key hash {key_hash} is outside [0, 2**32)")
        if self.placement is Placement.MODULO:
            return self.partitions[key_hash % len(self.partitions)]
        return self.partitions[bisect_right(self.cuts, key_hash) - 1]

    def overlapping(self, lo: int, hi: int) -> tuple[int, ...]:
        """The partitions of this generation that a key hashed into ``[lo, hi)`` can be in,
        in hash order (modulo: ascending)."""
        n = len(self.partitions)
        if self.placement is Placement.MODULO:
            if hi - lo >= n:
                return self.partitions
            return tuple(sorted((lo + i) % n for i in range(hi - lo)))
        first = bisect_right(self.cuts, lo) - 1
        last = bisect_left(self.cuts, hi) - 1
        return self.partitions[first:last + 1]


@dataclass(frozen=True)
class Uniform:
    """N -> ``count`` even ranges (the only change a modulo generation takes)."""

    count: int


@dataclass(frozen=True)
class Split:
    """Cut ``partition``'s range into two halves."""

    partition: int


@dataclass(frozen=True)
class Merge:
    """Join two partitions whose ranges are adjacent."""

    left: int
    right: int


Change = Uniform | Split | Merge


@dataclass(frozen=True)
class Lineage:
    """The kept generations (oldest first, numbered consecutively), the completed
    partitions, and the next fresh partition number."""

    generations: tuple[Generation, ...]
    completed: frozenset[int] = frozenset()
    next_partition: int = 0

    def __post_init__(self) -> None:
        gens = self.generations
        if not 1 <= len(gens) <= MAX_GENERATIONS:
            raise LineageError(f"a lineage keeps 1 to {MAX_GENERATIONS} generations, not "
                               f"{len(gens)}")
        for older, newer in pairwise(gens):
            if newer.number != older.number + 1:
                raise LineageError(f"generation {newer.number} follows generation "
                                   f"{older.number}: generations must be consecutive")
            if newer.placement is Placement.MODULO:
                raise LineageError(f"generation {newer.number} is modulo: only the first "
                                   f"generation may be")
        seen: set[int] = set()
        for older, newer in pairwise(gens):
            seen.update(older.partitions)
            top_seen = max(seen)
            for p in newer.partitions:
                if p in older:
                    if older.placement is Placement.MODULO or \
                            not newer.same_range(p, older):
                        raise LineageError(f"partition {p} is in generations {older.number} "
                                           f"and {newer.number} with different ranges")
                elif p in seen:
                    raise LineageError(f"partition {p} reappears in generation "
                                       f"{newer.number}: numbers are never reused")
                elif p <= top_seen:
                    raise LineageError(f"partition {p} is new in generation {newer.number} "
                                       f"but not above every number before it")
        everything = self._generation_of_first.keys()
        top = max(everything)
        if self.next_partition <= top or self.next_partition > MAX_PARTITION_NUMBER + 1:
            raise LineageError(f"next partition {self.next_partition} must be above every "
                               f"partition ({top}) and at most {MAX_PARTITION_NUMBER + 1}")
        strangers = self.completed - everything
        if strangers:
            raise LineageError(f"completed partitions {format_ranges(strangers)} are in no "
                               f"kept generation")
        open_done = self.completed & set(gens[-1].partitions)
        if open_done:
            raise LineageError(f"partitions {format_ranges(open_done)} are completed but "
                               f"open (in the newest generation)")
        for p in sorted(self.completed):
            waiting = [q for q in self.predecessors(p) if q not in self.completed]
            if waiting:
                raise LineageError(f"partition {p} is completed but its predecessors "
                                   f"{format_ranges(waiting)} are not")

    # -- reading -------------------------------------------------------------------------

    @property
    def latest(self) -> Generation:
        return self.generations[-1]

    @cached_property
    def _generation_of_first(self) -> dict[int, int]:
        """Partition -> index (in ``generations``) of the first generation it is in."""
        out: dict[int, int] = {}
        for i, gen in enumerate(self.generations):
            for p in gen.partitions:
                out.setdefault(p, i)
        return out

    @cached_property
    def _generation_of_last(self) -> dict[int, int]:
        return {p: i for i, gen in enumerate(self.generations) for p in gen.partitions}

    @cached_property
    def partitions(self) -> frozenset[int]:
        """Every partition of a kept generation."""
        return frozenset(self._generation_of_first)

    def _known(self, partition: int) -> None:
        if partition not in self._generation_of_first:
            raise LineageError(f"partition {partition} is in no kept generation")

    def predecessors(self, partition: int) -> tuple[int, ...]:
        """The partitions a key of ``partition`` may have had its earlier events in: of the
        generation before its first, those whose keys can hash into its range."""
        self._known(partition)
        memo = self._predecessors
        if partition not in memo:
            i = self._generation_of_first[partition]
            memo[partition] = () if i == 0 else self.generations[i - 1].overlapping(
                *self.generations[i].span(partition))
        return memo[partition]

    @cached_property
    def _predecessors(self) -> dict[int, tuple[int, ...]]:
        """Filled as asked (a modulo generation's successors may each have many)."""
        return {}

    def successors(self, partition: int) -> tuple[int, ...]:
        """The new partitions of the generation after ``partition``'s last that list it as a
        predecessor (none while it is open)."""
        self._known(partition)
        i = self._generation_of_last[partition]
        if i + 1 == len(self.generations):
            return ()
        gen, after = self.generations[i], self.generations[i + 1]
        if gen.placement is Placement.RANGE:
            # what ``after`` carries has its old range, apart from this one's
            return tuple(sorted(after.overlapping(*gen.span(partition))))
        n = len(gen.partitions)
        return tuple(sorted(q for q in after.partitions
                            for lo, hi in [after.span(q)]
                            if hi - lo >= n or (partition - lo) % n < hi - lo))

    def state(self, partition: int) -> State:
        self._known(partition)
        if partition in self.latest:
            return State.OPEN
        return State.COMPLETED if partition in self.completed else State.SEALED

    def is_assignable(self, partition: int) -> bool:
        """May a member be given ``partition``: it is not completed, and every predecessor
        is (so no key has an unread earlier event anywhere)."""
        return partition not in self.completed and all(
            q in self.completed for q in self.predecessors(partition))

    def assignable(self) -> frozenset[int]:
        return frozenset(p for p in self.partitions if self.is_assignable(p))

    def partition_of(self, key_hash: int) -> int:
        """Where producers write a key of this hash now: the newest generation."""
        return self.latest.partition_of(key_hash)

    # -- changes -------------------------------------------------------------------------

    def reshape(self, change: Change) -> Lineage:
        """A new generation from ``change``; what it replaces is sealed."""
        if len(self.generations) == MAX_GENERATIONS:
            raise LineageError(f"{MAX_GENERATIONS} generations are kept: the oldest must be "
                               f"read to its end and retired before another reshape")
        latest = self.latest
        if latest.placement is Placement.MODULO and not isinstance(change, Uniform):
            raise LineageError(f"generation {latest.number} places keys by hash % "
                               f"{len(latest.partitions)}: its first reshape must be uniform")
        widths: list[Fraction]
        if isinstance(change, Uniform):
            if not 1 <= change.count <= MAX_PARTITIONS:
                raise LineageError(f"a generation has 1 to {MAX_PARTITIONS} partitions, not "
                                   f"{change.count}")
            widths = [Fraction(1, change.count)] * change.count
        elif isinstance(change, Split):
            i = self._open_index(change.partition)
            lo, hi = latest.span(change.partition)
            if hi - lo < 2:
                raise LineageError(f"partition {change.partition} owns {hi - lo} hash: too "
                                   f"few to split")
            half = latest.widths[i] / 2
            widths = [*latest.widths[:i], half, half, *latest.widths[i + 1:]]
        else:
            i, j = sorted((self._open_index(change.left), self._open_index(change.right)))
            if j != i + 1:
                raise LineageError(f"partitions {change.left} and {change.right} are not "
                                   f"adjacent: only adjacent ranges merge")
            widths = [*latest.widths[:i], latest.widths[i] + latest.widths[j],
                      *latest.widths[j + 1:]]
        return self._with_generation(widths)

    def _open_index(self, partition: int) -> int:
        if partition not in self.latest:
            raise LineageError(f"partition {partition} is not in the newest generation "
                               f"({self.latest.number})")
        return self.latest.partitions.index(partition)

    def _with_generation(self, widths: list[Fraction]) -> Lineage:
        latest = self.latest
        scale, starts = _grid(widths, "the reshape")
        carried: dict[tuple[int, int], int] = {}
        up = 1
        if latest.placement is Placement.RANGE:
            old_scale, old_starts = latest._grid
            common = lcm(scale, old_scale)
            up, old_up = common // scale, common // old_scale
            carried = {(lo * old_up, hi * old_up): p
                       for p, (lo, hi) in zip(latest.partitions, pairwise(old_starts),
                                              strict=True)}
        numbers: list[int] = []
        fresh = self.next_partition
        for lo, hi in pairwise(starts):
            if (lo * up, hi * up) in carried:
                numbers.append(carried[lo * up, hi * up])
            else:
                numbers.append(fresh)
                fresh += 1
        if fresh == self.next_partition:
            raise LineageError("the reshape changes no range")
        if fresh > MAX_PARTITION_NUMBER + 1:
            raise LineageError(f"partition numbers would pass {MAX_PARTITION_NUMBER}")
        gen = Generation(latest.number + 1, Placement.RANGE, tuple(numbers), tuple(widths))
        return replace(self, generations=(*self.generations, gen), next_partition=fresh)

    def complete(self, partition: int) -> Lineage:
        """``partition`` has been read to its end (it must be sealed and assignable)."""
        state = self.state(partition)
        if state is not State.SEALED:
            raise LineageError(f"partition {partition} is {state}: only a sealed partition "
                               f"is completed")
        if not self.is_assignable(partition):
            waiting = [q for q in self.predecessors(partition) if q not in self.completed]
            raise LineageError(f"partition {partition} cannot be completed before its "
                               f"predecessors {format_ranges(waiting)}")
        return self._with_completed(self.completed | {partition})

    def _with_completed(self, completed: frozenset[int]) -> Lineage:
        """The same generations with ``completed``, built without checking them again (a
        completion changes no generation, and :meth:`complete` checked its rule): what
        was derived from the generations is shared, so a completion re-derives nothing."""
        new = object.__new__(type(self))
        object.__setattr__(new, "generations", self.generations)
        object.__setattr__(new, "completed", completed)
        object.__setattr__(new, "next_partition", self.next_partition)
        for name in ("_generation_of_first", "_generation_of_last", "partitions",
                     "_predecessors"):
            if name in self.__dict__:
                new.__dict__[name] = self.__dict__[name]
        return new

    def _retiring(self) -> tuple[int, frozenset[int]]:
        """How many of the oldest generations retire, and the partitions that go with
        them: a generation retires when every partition the next one does not carry is
        completed (so never the newest)."""
        count, out = 0, set[int]()
        for older, newer in pairwise(self.generations):
            gone = {p for p in older.partitions if p not in newer}
            if not gone <= self.completed:
                break
            count, out = count + 1, out | gone
        return count, frozenset(out)

    def retirable(self) -> frozenset[int]:
        """The partitions :meth:`retire` drops (their Leases and streams may go too)."""
        return self._retiring()[1]

    def retire(self) -> Lineage:
        """Drop the retiring generations: their partitions' numbers stay used (never
        reissued: ``next_partition`` stays), their records go."""
        count, gone = self._retiring()
        if not count:
            return self
        return replace(self, generations=self.generations[count:],
                       completed=self.completed - gone)


def initial(count: int, placement: Placement = Placement.MODULO) -> Lineage:
    """Generation 1 of ``count`` partitions, 0..count-1. Modulo is how every group made
    before lineage places keys (``crc32 % count``); a new group may start with ranges."""
    if not 1 <= count <= MAX_PARTITIONS:
        raise LineageError(f"a generation has 1 to {MAX_PARTITIONS} partitions, not {count}")
    widths = (Fraction(1, count),) * count if placement is Placement.RANGE else ()
    return Lineage((Generation(1, placement, tuple(range(count)), widths),),
                   next_partition=count)


def reshape(lineage: Lineage, change: Change) -> Lineage:
    return lineage.reshape(change)


def partition_of(key_hash: int, generation: Generation) -> int:
    return generation.partition_of(key_hash)
