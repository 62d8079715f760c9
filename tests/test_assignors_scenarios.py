"""Movement over whole scenarios: scale-up, scale-down, rolling restart, random churn.

Each step feeds the previous target back in (as the operator does) and checks that the
sticky assignor moved exactly the lower bound and the result stayed balanced. Run with
``-s`` to see the table; the same numbers are in the report of bench/bench_assignor.py.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from kgroup.core.operator.assignors import (
    Assignee,
    get_assignor,
    lower_bound_moves,
    moved_partitions,
)

PARTITIONS = 64


def scale_up() -> Iterator[list[str]]:
    for n in range(1, 11):
        yield [f"w{i}" for i in range(n)]


def scale_down() -> Iterator[list[str]]:
    for n in range(10, 0, -1):
        yield [f"w{i}" for i in range(n)]


def rolling_restart() -> Iterator[list[str]]:
    names = [f"w{i}-old" for i in range(5)]
    yield names[:]
    for i in range(5):  # one at a time: the old pod goes, then its replacement joins
        names.remove(f"w{i}-old")
        yield names[:]
        names.append(f"w{i}-new")
        yield names[:]


def random_churn() -> Iterator[list[str]]:
    rnd = random.Random(848)
    names = [f"w{i}" for i in range(6)]
    serial = 6
    yield names[:]
    for _ in range(30):
        if len(names) > 1 and rnd.random() < 0.5:
            names.remove(rnd.choice(names))
        else:
            names.append(f"w{serial}")
            serial += 1
        yield names[:]


SCENARIOS = {
    "scale-up 1->10": scale_up,
    "scale-down 10->1": scale_down,
    "rolling restart x5": rolling_restart,
    "random churn": random_churn,
}


def run(name: str, assignor_name: str) -> tuple[int, int]:
    """Total (moved, lower bound) over the scenario's steps; asserts balance each step."""
    assignor = get_assignor(assignor_name)
    target: dict[str, list[int]] = {}
    total_moved = total_bound = 0
    for ids in SCENARIOS[name]():
        members = [Assignee(i) for i in ids]
        bound = lower_bound_moves(PARTITIONS, members, target, {})
        nxt = assignor.assign(PARTITIONS, members, target, {})
        counts = [len(ps) for ps in nxt.values()]
        assert max(counts) - min(counts) <= 1
        assert sum(counts) == PARTITIONS
        moved = moved_partitions(target, nxt)
        assert moved >= bound, "nothing beats the lower bound"
        total_moved += moved
        total_bound += bound
        target = nxt
    return total_moved, total_bound


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_sticky_moves_only_the_lower_bound_over_a_scenario(name: str) -> None:
    moved, bound = run(name, "sticky")
    range_moved, _ = run(name, "range")
    print(
        f"\n{name:20} sticky moved {moved:4} (lower bound {bound:4}); range moved {range_moved:4}"
    )
    assert moved == bound
    assert range_moved >= moved


def test_range_moves_more_than_sticky_on_a_rolling_restart() -> None:
    moved, _ = run("rolling restart x5", "sticky")
    range_moved, _ = run("rolling restart x5", "range")
    assert range_moved > moved
