"""Load-aware assignment over simulated time: skewed loads, noise, plans applied in turn.

The driver keeps what a caller of :func:`kgroup.core.operator.load_balance.plan_load_balance`
must keep between plans (the target and each partition's last-moved time) and plans on a
fixed period of simulated seconds, as an operator's loop would. Randomness comes only from
the ``random.Random`` passed in, so a seed replays a run. Used by the tests and by
bench/bench_load_assignor.py.

:class:`LoadFeed` is the other use: the apps' load reports in the whole simulation
(``SimConfig.load``), so the operator's load mode (``spec.balance.mode: load``) runs there
on the shipped decision code, fed through the member Leases' ``kgroup.dev/load`` as on a
cluster. :class:`ZipfLoad` draws a feed per seed (``SimConfig.load`` takes either): skewed
rates placed at random, and optionally a shift of the hot set at a simulated time.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kgroup.core.load import encode_load
from kgroup.core.operator.assignors import Assignee, get_assignor
from kgroup.core.operator.load_balance import LoadBalance, LoadPlan, plan_load_balance
from kgroup.core.ranges import parse_ranges

__all__ = ["Balancer", "LoadFeed", "ZipfLoad", "jitter", "moves_between", "zipf_loads"]


def zipf_loads(partitions: int, s: float, rng: random.Random) -> list[float]:
    """Loads ``1 / rank**s`` for ranks 1..N, placed on the partitions in random order."""
    loads = [1.0 / (rank**s) for rank in range(1, partitions + 1)]
    rng.shuffle(loads)
    return loads


def jitter(loads: Sequence[float], amount: float, rng: random.Random) -> list[float]:
    """Every load times an independent uniform factor in ``[1 - amount, 1 + amount]``."""
    return [x * rng.uniform(1.0 - amount, 1.0 + amount) for x in loads]


@dataclass
class Balancer:
    """A group's target and last-moved times, planned on a period of simulated time.

    Starts from the count-based sticky assignment, as a group running today would.
    """

    partitions: int
    members: list[Assignee]
    config: LoadBalance = field(default_factory=LoadBalance)
    target: dict[str, list[int]] = field(default_factory=dict)
    last_moved: dict[int, float] = field(default_factory=dict)
    now: float = 0.0
    moves: int = 0
    plans_that_moved: int = 0

    def __post_init__(self) -> None:
        if not self.target:
            self.target = get_assignor("sticky").assign(self.partitions, self.members, {}, {})

    def plan(self, loads: Sequence[float] | Mapping[int, float | None]) -> LoadPlan:
        """One plan at ``self.now``; the result becomes the target, moved ones are stamped."""
        by_partition = loads if isinstance(loads, Mapping) else dict(enumerate(loads))
        result = plan_load_balance(
            self.partitions,
            self.members,
            self.target,
            {},
            by_partition,
            self.last_moved,
            self.now,
            self.config,
        )
        for p in result.moved:
            self.last_moved[p] = self.now
        self.target = result.target
        self.moves += len(result.moved)
        self.plans_that_moved += bool(result.moved)
        return result

    def run(
        self, loads_at: Callable[[float], Sequence[float]], seconds: float, period: float = 20.0
    ) -> int:
        """Plan every ``period`` seconds for ``seconds``; the partitions moved meanwhile."""
        before = self.moves
        end = self.now + seconds
        while self.now < end:
            self.plan(loads_at(self.now))
            self.now += period
        return self.moves - before


@dataclass(frozen=True)
class LoadFeed:
    """What every simulated app reports: each partition's rate (events/s), times an
    independent uniform factor in ``[1 - noise, 1 + noise]`` drawn at each renewal.

    ``shifted``/``shift_at``: from ``shift_at`` (true simulated seconds) on, the rates are
    ``shifted`` instead (the hot set moved); None: the rates never change."""

    rates: tuple[float, ...]
    noise: float = 0.0
    shifted: tuple[float, ...] | None = None
    shift_at: float | None = None

    def __post_init__(self) -> None:
        if (self.shifted is None) != (self.shift_at is None):
            raise ValueError("shifted and shift_at go together")
        if self.shifted is not None and len(self.shifted) != len(self.rates):
            raise ValueError("shifted needs a rate per partition, as rates")

    def for_seed(self, seed: int, partitions: int) -> LoadFeed:
        """The feed of one run: this one, whatever the seed."""
        return self

    def rates_at(self, now: float) -> tuple[float, ...]:
        """The true rates (no noise) at ``now``."""
        if self.shifted is not None and self.shift_at is not None and now >= self.shift_at:
            return self.shifted
        return self.rates

    def summary(self, held: Iterable[int], rng: random.Random | Any,
                now: float = 0.0) -> str | None:
        """The ``kgroup.dev/load`` annotation of a member holding ``held`` at ``now``."""
        true = self.rates_at(now)
        rates = {p: true[p] * (rng.uniform(1 - self.noise, 1 + self.noise)
                               if self.noise else 1.0)
                 for p in sorted(held) if p < len(true)}
        return encode_load(rates, {})


@dataclass(frozen=True)
class ZipfLoad:
    """A :class:`LoadFeed` per seed: rates ``1 / rank**s`` placed on the partitions at
    random, noise ``noise``; with ``shift_at``, a second random placement of the same rates
    from then on (the hot set moves). The placements come from a generator of their own
    seeded by the run's seed, so they do not disturb the run's other draws."""

    s: float = 0.8
    noise: float = 0.0
    shift_at: float | None = None

    def for_seed(self, seed: int, partitions: int) -> LoadFeed:
        rng = random.Random(f"kgroup_sim.load/{seed}")
        rates = tuple(zipf_loads(partitions, self.s, rng))
        if self.shift_at is None:
            return LoadFeed(rates, self.noise)
        return LoadFeed(rates, self.noise, tuple(zipf_loads(partitions, self.s, rng)),
                        self.shift_at)


def moves_between(before: Mapping[str, str], after: Mapping[str, str], partitions: int) -> int:
    """Partitions whose target owner differs between two ``status.assignment`` maps."""
    def owners(target: Mapping[str, str]) -> dict[int, str]:
        return {p: m for m, ranges in target.items()
                for p in parse_ranges(ranges, limit=partitions)}
    old, new = owners(before), owners(after)
    return sum(1 for p, m in new.items() if old.get(p) != m)
