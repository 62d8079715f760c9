"""Properties every assignment must have, checked on generated groups (hypothesis).

The sticky assignor's promises: complete, balanced (weighted: within one partition of
the exact share), minimal movement (equal to an independently brute-forced optimum on
small groups), deterministic, and a fixed point (feeding the result back changes
nothing, so the operator never bumps the epoch for a no-op).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from kgroup.core.operator.assignors import (
    Assignee,
    get_assignor,
    lower_bound_moves,
    moved_partitions,
)

STICKY = get_assignor("sticky")
RANGE = get_assignor("range")
NAMES = [f"m{i}" for i in range(12)]
Group = tuple[int, list[Assignee], dict[str, list[int]], dict[int, str]]


@st.composite
def groups(
    draw: st.DrawFn, *, max_partitions: int = 120, weighted: bool = False, min_members: int = 1
) -> Group:
    """(partitions, members, current, holders); current may name departed members."""
    n = draw(st.integers(min_value=1, max_value=max_partitions))
    ids = draw(st.lists(st.sampled_from(NAMES), min_size=min_members, max_size=8, unique=True))
    weights = st.integers(min_value=1, max_value=4) if weighted else st.just(1)
    members = [Assignee(i, draw(weights)) for i in ids]
    # current: each partition owned by one id (member or departed) or by nobody
    owners = draw(st.lists(st.sampled_from([None, *NAMES]), min_size=n, max_size=n))
    current: dict[str, list[int]] = {}
    for p, owner in enumerate(owners):
        if owner is not None:
            current.setdefault(owner, []).append(p)
    holder_of = draw(st.lists(st.sampled_from([None, *NAMES]), min_size=n, max_size=n))
    holders = {p: h for p, h in enumerate(holder_of) if h is not None}
    return n, members, current, holders


def prior_owner(
    members: Sequence[Assignee], current: Mapping[str, Sequence[int]], holders: Mapping[int, str]
) -> dict[int, str]:
    """The documented rule, restated: owner in current if a member, else holder if one."""
    ids = {m.id for m in members}
    prior = {p: h for p, h in holders.items() if h in ids}
    for mid, ps in current.items():
        if mid in ids:
            for p in ps:
                prior[p] = mid
    return prior


def moves_from_prior(prior: Mapping[int, str], result: Mapping[str, Sequence[int]]) -> int:
    return sum(1 for mid, ps in result.items() for p in ps if prior.get(p) != mid)


def brute_force_min_moves(n: int, members: Sequence[Assignee], prior: Mapping[int, str]) -> int:
    """Try every balanced quota vector; the best keeps sum(min(held, quota))."""
    total = sum(m.weight for m in members)
    held = {m.id: 0 for m in members}
    for mid in prior.values():
        held[mid] += 1
    choices = []
    for m in members:
        q, r = divmod(n * m.weight, total)
        choices.append([q, q + 1] if r else [q])
    best = -1
    for quotas in itertools.product(*choices):
        if sum(quotas) == n:
            best = max(best, sum(min(held[m.id], q) for m, q in zip(members, quotas, strict=True)))
    return n - best


def assert_complete(n: int, members: Sequence[Assignee], result: Mapping[str, list[int]]) -> None:
    assert set(result) == {m.id for m in members}
    flat = [p for ps in result.values() for p in ps]
    assert sorted(flat) == list(range(n)), "every partition exactly once"
    for ps in result.values():
        assert ps == sorted(ps)


def assert_balanced(n: int, members: Sequence[Assignee], result: Mapping[str, list[int]]) -> None:
    total = sum(m.weight for m in members)
    for m in members:
        share = Fraction(n * m.weight, total)
        assert abs(len(result[m.id]) - share) < 1, (m, len(result[m.id]), share)


@given(groups())
def test_sticky_assigns_every_partition_once_to_every_member(g: Group) -> None:
    n, members, current, holders = g
    assert_complete(n, members, STICKY.assign(n, members, current, holders))


@given(groups())
def test_sticky_is_balanced_within_one_with_equal_weights(g: Group) -> None:
    n, members, current, holders = g
    counts = [len(ps) for ps in STICKY.assign(n, members, current, holders).values()]
    assert max(counts) - min(counts) <= 1


@given(groups(weighted=True))
def test_sticky_weighted_is_within_one_of_the_exact_share(g: Group) -> None:
    n, members, current, holders = g
    result = STICKY.assign(n, members, current, holders)
    assert_complete(n, members, result)
    assert_balanced(n, members, result)


@settings(max_examples=300)
@given(groups(weighted=True, max_partitions=40))
def test_sticky_moves_exactly_the_brute_forced_minimum(g: Group) -> None:
    n, members, current, holders = g
    prior = prior_owner(members, current, holders)
    result = STICKY.assign(n, members, current, holders)
    bound = lower_bound_moves(n, members, current, holders)
    assert bound == brute_force_min_moves(n, members, prior)
    assert moves_from_prior(prior, result) == bound


@given(groups(weighted=True), st.randoms(use_true_random=False))
def test_sticky_ignores_member_order_and_dict_order(g: Group, rnd: random.Random) -> None:
    n, members, current, holders = g
    expected = STICKY.assign(n, members, current, holders)
    shuffled = members[:]
    rnd.shuffle(shuffled)
    cur_items = list(current.items())
    rnd.shuffle(cur_items)
    hold_items = list(holders.items())
    rnd.shuffle(hold_items)
    again = STICKY.assign(n, shuffled, dict(cur_items), dict(hold_items))
    assert again == expected
    assert list(again) == list(expected), "keys come out in one order too"


@given(groups(weighted=True))
def test_sticky_result_is_a_fixed_point(g: Group) -> None:
    n, members, current, holders = g
    first = STICKY.assign(n, members, current, holders)
    assert STICKY.assign(n, members, first, holders) == first
    assert STICKY.assign(n, members, first, {}) == first
    assert lower_bound_moves(n, members, first, holders) == 0


@given(groups(), st.sampled_from(["a-new", "m5-new", "z-new"]))
def test_a_join_only_moves_partitions_to_the_newcomer(g: Group, newcomer: str) -> None:
    n, members, current, holders = g
    stable = STICKY.assign(n, members, current, holders)
    joined = [*members, Assignee(newcomer)]
    after = STICKY.assign(n, joined, stable, {})
    for m in members:
        assert set(after[m.id]) <= set(stable[m.id]), "an old member only gives up"
    assert moved_partitions(stable, after) == len(after[newcomer])
    assert len(after[newcomer]) == lower_bound_moves(n, joined, stable, {})


@given(groups(min_members=2), st.data())
def test_a_leave_only_moves_the_leavers_partitions(g: Group, data: st.DataObject) -> None:
    n, members, current, holders = g
    stable = STICKY.assign(n, members, current, holders)
    leaver = data.draw(st.sampled_from(members))
    rest = [m for m in members if m != leaver]
    after = STICKY.assign(n, rest, stable, {})
    for m in rest:
        assert set(stable[m.id]) <= set(after[m.id]), "a survivor keeps everything"
    assert moved_partitions(stable, after) == len(stable[leaver.id])


@given(groups(weighted=True))
def test_range_gives_contiguous_blocks_in_member_id_order(g: Group) -> None:
    n, members, current, holders = g
    result = RANGE.assign(n, members, current, holders)
    assert_complete(n, members, result)
    flat = [p for mid in sorted(result) for p in result[mid]]
    assert flat == list(range(n)), "blocks follow sorted ids, each contiguous"
    counts = [len(result[mid]) for mid in sorted(result)]
    assert counts == sorted(counts, reverse=True), "the first members get the extras"
    assert max(counts) - min(counts) <= 1, "weights are ignored"


@given(groups())
def test_range_ignores_the_current_target(g: Group) -> None:
    n, members, current, holders = g
    assert RANGE.assign(n, members, current, holders) == RANGE.assign(n, members, {}, {})
