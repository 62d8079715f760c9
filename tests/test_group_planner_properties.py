"""Planner properties over random membership histories (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kgroup.core.operator.planner import GroupPlanner
from kgroup.crd_models import ConsumerGroupSpec

NAMES = [f"m{i}" for i in range(6)]
histories = st.lists(
    st.tuples(st.frozensets(st.sampled_from(NAMES)), st.floats(min_value=0.0, max_value=3.0)),
    min_size=1,
    max_size=25,
)


def spec() -> ConsumerGroupSpec:
    return ConsumerGroupSpec.model_validate(
        {
            "partitions": 12,
            "selector": {"matchLabels": {"app": "w"}},
            "stabilizationWindowSeconds": 2,
            "stabilizationMaxDelaySeconds": 10,
        }
    )


def run(history: list[tuple[frozenset[str], float]]) -> tuple[dict[str, list[int]], int, int]:
    """Feed the history, then hold the last membership for a long quiet time."""
    planner, s = GroupPlanner(), spec()
    target: dict[str, list[int]] = {}
    epoch, now, bumps = 0, 0.0, 0
    last = history[-1][0]
    steps = [*history, *[(last, 1.0)] * 15]
    for members, dt in steps:
        now += dt
        d = planner.plan(
            spec=s, target=target, epoch=epoch, members=set(members), holders={}, now=now
        )
        if d.target is not None:
            assert d.target != target  # an unchanged target is never rewritten
            assert d.epoch == epoch + 1  # one bump per change
            target, epoch, bumps = d.target, d.epoch, bumps + 1
    return target, epoch, bumps


@settings(max_examples=200, deadline=None)
@given(histories)
def test_a_quiet_membership_is_always_reached_by_the_target(
    history: list[tuple[frozenset[str], float]],
) -> None:
    target, _, _ = run(history)
    assert set(target) == set(history[-1][0])
    if target:
        assert sorted(p for ps in target.values() for p in ps) == list(range(12))


@settings(max_examples=200, deadline=None)
@given(histories)
def test_the_epoch_counts_exactly_the_target_changes(
    history: list[tuple[frozenset[str], float]],
) -> None:
    _, epoch, bumps = run(history)
    assert epoch == bumps


@settings(max_examples=100, deadline=None)
@given(st.frozensets(st.sampled_from(NAMES), min_size=1), st.integers(min_value=1, max_value=50))
def test_a_settled_group_never_changes_again(members: frozenset[str], ticks: int) -> None:
    planner, s = GroupPlanner(), spec()
    target: dict[str, list[int]] = {}
    epoch = 0
    for t in range(5):
        d = planner.plan(
            spec=s, target=target, epoch=epoch, members=set(members), holders={}, now=float(t * 3)
        )
        if d.target is not None:
            target, epoch = d.target, d.epoch
    for t in range(ticks):
        d = planner.plan(
            spec=s, target=target, epoch=epoch, members=set(members), holders={}, now=100.0 + t
        )
        assert d.target is None
