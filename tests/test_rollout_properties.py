"""Rollouts through the planner, generated (hypothesis): each partition moves once.

A Deployment's rollout with ``maxUnavailable: 0`` and a surge of 1..3: new-revision pods
join (up to the surge ahead of the leaves), old ones leave, the operator observing each
step alone or several in one pass, at any spacing against the window. Whatever the order,
each partition changes owner exactly once (old owner -> new owner), every rebalance of a
pure join or leave stays at the lower bound, and the end is balanced (+-1).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kgroup.core.operator.assignors import Assignee, lower_bound_moves
from kgroup.core.operator.planner import GroupPlanner, PodObservation
from kgroup.crd_models import ConsumerGroupSpec

Target = dict[str, list[int]]


def pod(name: str, rev: str, *, terminating: bool = False) -> PodObservation:
    return PodObservation(name=name, labels={"app": "w"}, owner_kind="ReplicaSet",
                          workload="Deployment/w", revision=rev, terminating=terminating)


def spec(partitions: int, window: int) -> ConsumerGroupSpec:
    return ConsumerGroupSpec.model_validate({
        "partitions": partitions, "selector": {"matchLabels": {"app": "w"}},
        "stabilizationWindowSeconds": window})


def owners(target: Target) -> dict[int, str]:
    return {p: m for m, ps in target.items() for p in ps}


class Group:
    """The planner fed like the operator feeds it; the target written back."""

    def __init__(self, partitions: int, window: int) -> None:
        self.spec = spec(partitions, window)
        self.planner = GroupPlanner()
        self.target: Target = {}
        self.epoch = 0
        self.now = 0.0
        self.pods: dict[str, PodObservation] = {}
        self.history: list[Target] = []

    def members(self) -> set[str]:
        return {n for n, p in self.pods.items() if not p.terminating}

    def step(self, dt: float) -> int | None:
        """One operator pass ``dt`` after the last; the moves of a new target, if any."""
        self.now += dt
        d = self.planner.plan(spec=self.spec, target=self.target, epoch=self.epoch,
                              members=self.members(), holders={}, now=self.now,
                              pods=list(self.pods.values()))
        if d.target is None:
            return None
        assert d.epoch == self.epoch + 1
        self.target, self.epoch = d.target, d.epoch
        self.history.append(d.target)
        return d.moved

    def settle(self) -> None:
        for _ in range(40):
            self.step(1.0)


rollouts = st.tuples(
    st.integers(min_value=1, max_value=64),  # partitions
    st.integers(min_value=1, max_value=7),  # replicas
    st.integers(min_value=1, max_value=3),  # maxSurge
    st.sampled_from([0, 1, 5]),  # stabilizationWindowSeconds
    st.lists(st.sampled_from([0.0, 0.05, 0.5, 2.0, 6.0]), min_size=64, max_size=64),  # gaps
)


@settings(max_examples=300, deadline=None)
@given(rollouts)
def test_a_rollout_moves_each_partition_exactly_once(
    case: tuple[int, int, int, int, list[float]],
) -> None:
    partitions, replicas, surge, window, gaps = case
    g = Group(partitions, window)
    old = [f"a{i}" for i in range(replicas)]
    new = [f"b{i}" for i in range(replicas)]
    g.pods = {n: pod(n, "1") for n in old}
    g.settle()
    start = owners(g.target)
    assert sorted(start) == list(range(partitions))
    g.history = []
    gap = iter(gaps)
    joined = left = 0
    while left < replicas:
        # the Deployment controller: a new pod while the surge allows, else an old one goes
        # once the new ones are in (maxUnavailable 0: an old pod leaves only after a join)
        if joined < replicas and joined - left < surge:
            g.pods[new[joined]] = pod(new[joined], "2")
            joined += 1
        else:
            name = old[left]
            g.pods[name] = pod(name, "1", terminating=True)
            left += 1
        dt = next(gap, 0.5)
        if dt > 0:  # 0: the next step lands in the same operator pass
            g.step(dt)
    for name in old:
        del g.pods[name]
    g.settle()
    end = owners(g.target)
    assert set(g.target) == set(new)
    assert sorted(end) == list(range(partitions))
    changes = {p: 0 for p in range(partitions)}
    before = start
    for target in g.history:
        after = owners(target)
        for p in range(partitions):
            if after.get(p) != before.get(p):
                changes[p] += 1
        before = after
    assert set(changes.values()) == {1}, changes
    counts = [len(ps) for ps in g.target.values()]
    assert max(counts) - min(counts) <= 1


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=64), st.sampled_from([0, 1, 5]),
       st.lists(st.tuples(st.booleans(), st.sampled_from([0.05, 0.5, 2.0, 6.0])),
                min_size=1, max_size=20))
def test_pure_joins_and_leaves_of_one_revision_move_the_lower_bound(
    partitions: int, window: int, steps: list[tuple[bool, float]],
) -> None:
    """Scale up and down with one revision: every rebalance moves exactly the lower bound
    and the settled target is balanced; nothing waits (no other revision holds)."""
    g = Group(partitions, window)
    g.pods = {"a0": pod("a0", "1")}
    g.settle()
    serial = 1
    for join, dt in steps:
        members = sorted(g.members())
        if join or len(members) == 1:
            g.pods[f"a{serial}"] = pod(f"a{serial}", "1")
            serial += 1
        else:
            del g.pods[members[len(members) // 2]]
        before = {m: list(ps) for m, ps in g.target.items()}
        members_now = g.members()
        moved = g.step(dt)
        if moved is not None:
            bound = lower_bound_moves(partitions, [Assignee(m) for m in members_now], before, {})
            assert moved == bound
    g.settle()
    assert set(g.target) == g.members()
    counts = [len(ps) for ps in g.target.values()]
    assert max(counts) - min(counts) <= 1
