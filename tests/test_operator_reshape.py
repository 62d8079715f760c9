"""The group's side of a reshape (kgroup.core.operator.reshape): the layout the operator
keeps in ``status.layout`` and the partitions it lets the planner assign. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pytest

from kgroup.core.lineage import State, Uniform
from kgroup.core.operator.planner import GroupPlanner
from kgroup.core.operator.reshape import Layout, Layouts, layout_of, premature
from kgroup.crd_models import ConsumerGroupSpec, ReshapeChange

NOTHING = frozenset[int]()


def reported(*done: int) -> Any:
    return frozenset(done).__contains__


def spec(partitions: int) -> ConsumerGroupSpec:
    return ConsumerGroupSpec.model_validate({
        "partitions": partitions, "selector": {"matchLabels": {"app": "w"}},
        "stabilizationWindowSeconds": 0})


def shrunk() -> Layout:
    """A group of 4 partitions (no status.layout) patched to 2."""
    before = layout_of(4, None, reported())
    return layout_of(2, before.status, reported())


def test_a_group_without_a_layout_keeps_partitions_zero_to_n_as_its_slots() -> None:
    layout = layout_of(4, None, reported())
    assert layout.assignable == (0, 1, 2, 3)
    assert layout.status == {"generation": 1, "nextPartition": 4, "generations": [
        {"generation": 1, "placement": "modulo", "partitions": "0-3"}],
        "states": {"open": "0-3"}}
    s = spec(4)
    assert layout.slot_spec(s) is s
    assert layout.to_slots({"a": [0, 2], "b": [1, 3]}) == {"a": [0, 2], "b": [1, 3]}
    assert layout.problem is None


def test_a_shrink_appends_a_generation_and_its_successors_wait() -> None:
    layout = shrunk()
    lineage = layout.lineage
    assert layout.status["generation"] == 2
    assert lineage.latest.partitions == (4, 5)
    assert [lineage.state(p) for p in (0, 3, 4)] == [State.SEALED, State.SEALED, State.OPEN]
    assert layout.assignable == (0, 1, 2, 3)  # the sealed ones, until read to their end
    assert layout.space == 6


def test_completions_free_the_successors_and_retire_the_old_generation() -> None:
    status = shrunk().status
    partly = layout_of(2, status, reported(0, 1, 2))
    assert partly.assignable == (3,)  # a modulo generation's successors wait for all four
    done = layout_of(2, partly.status, reported(3))  # 0-2 are recorded in the status now
    assert done.assignable == (4, 5)
    assert done.status == {"generation": 2, "nextPartition": 6, "generations": [
        {"generation": 2, "placement": "range", "partitions": "4-5", "widths": "1/2*2"}],
        "states": {"open": "4-5"}}


def test_a_completion_the_lineage_does_not_accept_is_ignored() -> None:
    status = shrunk().status
    early = layout_of(2, status, reported(4, 5))  # open partitions: no completion
    assert early.assignable == (0, 1, 2, 3)
    assert early.lineage.completed == NOTHING


def test_later_reshapes_wait_only_for_their_own_predecessors() -> None:
    two = layout_of(2, layout_of(2, shrunk().status, reported(0, 1, 2, 3)).status, reported())
    four = layout_of(4, two.status, reported())
    assert four.lineage.latest.partitions == (6, 7, 8, 9)
    assert four.assignable == (4, 5)
    half = layout_of(4, four.status, reported(4))
    assert half.assignable == (5, 6, 7)  # 6 and 7 succeed 4 alone; 8 and 9 wait for 5


def test_the_status_layout_is_read_back_and_a_bad_one_is_repaired() -> None:
    layouts = Layouts()
    first = layouts.derive(2, shrunk().status, reported())
    assert first.assignable == (0, 1, 2, 3)
    bad = layouts.derive(2, {"generation": 9}, reported())
    assert bad.problem is not None and "status.layout is not a layout" in bad.problem
    assert bad.lineage == first.lineage
    wiped = layouts.derive(2, None, reported())  # removed by hand: the last one is kept
    assert wiped.lineage == first.lineage and wiped.problem is None


def test_a_reshape_the_lineage_refuses_waits_and_says_why() -> None:
    layout = layout_of(1, None, reported())
    for n in (2, 3, 4, 5, 6, 7, 8):
        layout = layout_of(n, layout.status, reported())
    assert layout.problem is None and len(layout.lineage.generations) == 8
    stuck = layout_of(9, layout.status, reported())
    assert stuck.problem is not None and "spec.partitions 9 waits" in stuck.problem
    assert len(stuck.lineage.latest.partitions) == 8


@dataclass(frozen=True)
class SkipsTheWait(Layout):
    """Broken variant: every partition not completed is assignable at once."""

    @cached_property
    def assignable(self) -> tuple[int, ...]:
        lineage = self.lineage
        return tuple(sorted(p for p in lineage.partitions if p not in lineage.completed))


def _planned(layout: Layout) -> dict[str, list[int]]:
    """The planner over the layout's slots, as ``decide`` calls it."""
    decision = layout.decision_from_slots(GroupPlanner().plan(
        spec=layout.slot_spec(spec(2)), target={}, epoch=0, members={"a", "b"},
        holders={}, now=0.0), {})
    assert decision.target is not None
    return decision.target


def test_the_planner_never_assigns_a_successor_before_its_predecessors() -> None:
    layout = shrunk()
    target = _planned(layout)
    assert sorted(p for ps in target.values() for p in ps) == [0, 1, 2, 3]
    assert premature(layout.lineage, target) == []
    done = layout_of(2, layout.status, reported(0, 1, 2, 3))
    assert sorted(p for ps in _planned(done).values() for p in ps) == [4, 5]


def test_the_check_catches_the_variant_that_skips_the_wait() -> None:
    broken = SkipsTheWait(shrunk().lineage)
    target = _planned(broken)
    assert premature(broken.lineage, target) == [4, 5]


@pytest.mark.parametrize("target", [{"a": [4]}, {"a": [0, 9]}])
def test_premature_names_what_may_not_be_assigned(target: dict[str, list[int]]) -> None:
    assert premature(shrunk().lineage, target) == [p for p in target["a"] if p >= 4]


def test_a_target_naming_completed_partitions_is_written_without_them() -> None:
    layout = layout_of(2, shrunk().status, reported(0, 1, 2))
    current = {"a": [0, 1], "b": [2, 3]}
    planner = GroupPlanner()
    kept = layout.decision_from_slots(planner.plan(
        spec=layout.slot_spec(spec(2)), target=layout.to_slots(current), epoch=3,
        members={"a", "b"}, holders={}, now=0.0), current)
    assert (kept.target, kept.epoch) == ({"a": [], "b": [3]}, 4)
    assert kept.reason == "partitions read to their end: 0-2"
    same = layout_of(4, None, reported())
    untouched = same.decision_from_slots(planner.plan(
        spec=spec(4), target={"a": [0, 1], "b": [2, 3]}, epoch=3, members={"a", "b"},
        holders={}, now=1.0), {"a": [0, 1], "b": [2, 3]})
    assert untouched.target is None and untouched.epoch == 3


def test_a_pass_that_changes_nothing_reuses_what_was_derived() -> None:
    layouts = Layouts()
    status = shrunk().status
    first = layouts.derive(2, status, reported())
    assert layouts.derive(2, dict(status), reported()) is first
    later = layouts.derive(2, dict(status), reported(0))
    assert later is not first and later.lineage.completed == {0}
    assert layouts.derive(2, dict(later.status), reported(0)) is later  # its own write echoed


@pytest.mark.parametrize("done", [(), (0,), (0, 1, 2), (0, 1, 2, 3)])
def test_the_slots_are_exactly_the_lineages_assignable_partitions(done: tuple[int, ...]) -> None:
    layout = layout_of(2, shrunk().status, reported(*done))
    assert layout.assignable == tuple(sorted(layout.lineage.assignable()))
    four = layout_of(4, layout_of(2, layout.status, reported(0, 1, 2, 3)).status, reported())
    halfway = layout_of(4, four.status, reported(4))
    assert halfway.assignable == tuple(sorted(halfway.lineage.assignable()))


# -- spec.reshape.policy ---------------------------------------------------------------------

def test_generations_is_the_default_policy() -> None:
    assert spec(4).reshape.policy == "Generations"
    grown = layout_of(6, layout_of(4, None, reported()).status, reported())
    assert grown.lineage.latest.number == 2 and grown.assignable == (0, 1, 2, 3)


def test_append_grows_one_modulo_generation_and_assigns_the_new_partitions_at_once() -> None:
    four = layout_of(4, None, reported())
    six = layout_of(6, four.status, reported(), policy="Append")
    assert six.problem is None
    assert six.assignable == (0, 1, 2, 3, 4, 5)
    assert six.status == {"generation": 1, "nextPartition": 6, "generations": [
        {"generation": 1, "placement": "modulo", "partitions": "0-5"}],
        "states": {"open": "0-5"}}
    s = spec(6)
    assert six.slot_spec(s) is s  # the planner sees 0..5 as they are
    assert sorted(p for ps in _planned(six).values() for p in ps) == [0, 1, 2, 3, 4, 5]


def test_append_refuses_a_shrink_keeps_the_layout_and_says_why() -> None:
    four = layout_of(4, None, reported())
    two = layout_of(2, four.status, reported(), policy="Append")
    assert two.lineage == four.lineage and two.assignable == (0, 1, 2, 3)
    assert two.problem is not None
    assert "Append only grows" in two.problem and "Generations" in two.problem


@pytest.mark.parametrize("retired", [False, True])
def test_append_after_a_generations_reshape_waits_and_says_why(retired: bool) -> None:
    ranges = shrunk()  # 4 modulo -> 2 ranges, under way
    if retired:
        ranges = layout_of(2, ranges.status, reported(0, 1, 2, 3))
        assert len(ranges.lineage.generations) == 1
    grown = layout_of(3, ranges.status, reported(), policy="Append")
    assert grown.lineage == ranges.lineage
    assert grown.problem is not None and "one modulo generation" in grown.problem


def test_load_rates_reach_the_planner_by_slot_and_waiting_partitions_weigh_nothing() -> None:
    """spec.balance.mode load: status.load's rates are per partition; the planner works
    on slots, so a rate must follow its partition to its slot, and a partition that is
    not assignable (completed, or waiting) has none."""
    layout = layout_of(2, layout_of(2, shrunk().status, reported(0, 1, 2)).status,
                       reported())
    assert layout.assignable == (3,)  # 0-2 completed, 4 and 5 wait for 3
    assert layout.loads_to_slots({0: 9.0, 3: 5.0, 4: 7.0}) == {0: 5.0}
    done = layout_of(2, layout.status, reported(3))
    assert done.assignable == (4, 5)
    assert done.loads_to_slots({3: 1.0, 4: 7.0, 5: 2.0}) == {0: 7.0, 1: 2.0}


# --- spec.reshape.change: one split or one merge ------------------------------------------

def change(generation: int, *, split: int | None = None,
           merge: tuple[int, int] | None = None) -> ReshapeChange:
    return ReshapeChange.model_validate({"generation": generation, "split": split,
                                         "merge": list(merge) if merge else None})


def ranged() -> Layout:
    """4 partitions reshaped to 4 ranges (generation 2: 4-7), every modulo one read."""
    two = layout_of(4, layout_of(4, None, reported()).lineage.reshape(Uniform(4)),
                    reported())
    return layout_of(4, two.status, reported(0, 1, 2, 3))


def test_a_split_makes_one_generation_once_and_its_halves_wait_for_it() -> None:
    base = ranged()
    assert base.lineage.latest.partitions == (4, 5, 6, 7) and base.assignable == (4, 5, 6, 7)
    split = layout_of(5, base.status, reported(), change=change(3, split=5))
    assert split.problem is None
    assert split.lineage.latest.number == 3
    assert split.lineage.latest.partitions == (4, 8, 9, 6, 7)
    assert split.lineage.predecessors(8) == (5,) == split.lineage.predecessors(9)
    # the halves wait for 5 only: the unrelated 4, 6, 7 carry on, 5 is read to its seal
    assert split.assignable == (4, 5, 6, 7)
    # the next pass reads the status it wrote: the change is history, not applied again
    again = layout_of(5, split.status, reported(), change=change(3, split=5))
    assert again.lineage.latest.number == 3 and again.problem is None
    done = layout_of(5, again.status, reported(5), change=change(3, split=5))
    assert done.assignable == (4, 6, 7, 8, 9)


def test_a_merge_of_neighbours_waits_for_both() -> None:
    merged = layout_of(3, ranged().status, reported(), change=change(3, merge=(6, 7)))
    assert merged.problem is None
    assert merged.lineage.latest.partitions == (4, 5, 8)
    assert merged.lineage.predecessors(8) == (6, 7)
    assert layout_of(3, merged.status, reported(6), change=change(3, merge=(6, 7))) \
        .assignable == (4, 5, 7)
    assert layout_of(3, merged.status, reported(6, 7), change=change(3, merge=(6, 7))) \
        .assignable == (4, 5, 8)


@pytest.mark.parametrize(("partitions", "spec_change", "expected"), [
    (4, change(3, split=5), "it leaves 5 partitions, but spec.partitions is 4; set "
                            "spec.partitions: 5 with it"),
    (5, change(4, split=5), "the newest generation is 2; a change makes generation 3"),
    (3, change(3, merge=(4, 6)), "not adjacent"),
    (5, change(3, split=1), "partition 1 is not in the newest generation"),
])
def test_a_change_that_cannot_apply_waits_says_why_and_does_nothing_else(
        partitions: int, spec_change: ReshapeChange, expected: str) -> None:
    base = ranged()
    layout = layout_of(partitions, base.status, reported(), change=spec_change)
    assert layout.problem is not None and expected in layout.problem, layout.problem
    assert layout.problem.startswith("spec.reshape.change (")
    # neither the change nor a uniform reshape to spec.partitions
    assert layout.lineage.latest.number == 2 and layout.assignable == (4, 5, 6, 7)


def test_a_modulo_group_splits_only_after_a_uniform_reshape() -> None:
    modulo = layout_of(4, None, reported()).status
    layout = layout_of(5, modulo, reported(), change=change(2, split=1))
    assert layout.problem is not None and "its first reshape must be uniform" in layout.problem
    assert layout.lineage.latest.number == 1 and layout.assignable == (0, 1, 2, 3)


def test_a_change_kept_in_the_spec_does_not_stop_a_later_uniform_reshape() -> None:
    split = layout_of(5, ranged().status, reported(5), change=change(3, split=5))
    settled = layout_of(5, split.status, reported(5), change=change(3, split=5))
    assert settled.assignable == (4, 6, 7, 8, 9)
    grown = layout_of(10, settled.status, reported(), change=change(3, split=5))
    assert grown.problem is None and grown.lineage.latest.number == 4
    assert len(grown.lineage.latest.partitions) == 10
