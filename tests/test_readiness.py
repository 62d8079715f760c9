"""The readiness rule (kgroup.core.member.readiness): a pod is Ready once it holds its whole
target and has acknowledged the target's epoch; pure, no I/O."""

from __future__ import annotations

import pytest

from kgroup.core.assignment import PartitionView, View
from kgroup.core.member.readiness import readiness
from kgroup.core.member.view import Target


def view(held: dict[int, str] | None = None, *, acked: int | None = 3, session: str | None = "S",
         fenced: bool = False) -> View:
    parts = tuple(PartitionView(p, 1, state, None, None) for p, state in
                  sorted((held or {}).items()))
    return View(member="pod-a", session=session, version=1, epoch=acked, acked_epoch=acked,
                fenced=fenced or session is None, valid_for_seconds=0.0 if fenced else 5.0,
                partitions=parts)


T3 = Target(epoch=3, partitions=frozenset({0, 1}))


def test_ready_once_it_holds_its_whole_target_and_acknowledged_the_epoch() -> None:
    verdict = readiness(view({0: "active", 1: "active"}), T3, member=True, stopping=False)
    assert verdict.ready and "epoch 3" in verdict.reason


def test_a_member_with_an_empty_target_is_ready_once_it_acknowledged() -> None:
    empty = Target(epoch=3, partitions=frozenset())
    assert readiness(view(), empty, member=True, stopping=False).ready
    assert not readiness(view(acked=2), empty, member=True, stopping=False).ready


@pytest.mark.parametrize(("v", "target", "member", "stopping", "why"), [
    (view({0: "active", 1: "active"}), T3, True, True, "stopping"),
    (view(session=None), T3, True, False, "no session"),
    (view({0: "active", 1: "active"}, fenced=True), T3, True, False, "fenced"),
    (view(), None, True, False, "no target"),
    (view(), Target(epoch=0, partitions=frozenset()), True, False, "no target"),
    (view(acked=None), T3, False, False, "not a member of epoch 3"),
    (view({0: "active"}, acked=2), T3, True, False, "holds 1 of 2"),
    (view({0: "active", 1: "active", 2: "revoking"}, acked=2), T3, True, False, "draining 1"),
    (view({0: "active", 1: "active", 2: "active"}, acked=2), T3, True, False, "1 partition(s) out"),
    (view({0: "active", 1: "active"}, acked=2), T3, True, False, "epoch 3 not acknowledged"),
])
def test_not_ready_and_says_why(v: View, target: Target | None, member: bool, stopping: bool,
                                why: str) -> None:
    verdict = readiness(v, target, member=member, stopping=stopping)
    assert not verdict.ready
    assert why in verdict.reason


def test_the_first_pod_of_a_group_goes_from_not_a_member_to_ready() -> None:
    """Not admitted yet -> admitted with a target it does not hold -> holds it -> Ready."""
    assert not readiness(view(acked=None), T3, member=False, stopping=False).ready
    assert not readiness(view(acked=None), T3, member=True, stopping=False).ready
    assert readiness(view({0: "active", 1: "active"}), T3, member=True, stopping=False).ready


def test_an_epoch_that_leaves_its_partitions_alone_keeps_it_ready_before_its_ack() -> None:
    """Another member joined (epoch 4, this pod's {0, 1} untouched): Ready while the ack of
    epoch 4 is on its way; an epoch that changed its partitions waits for the ack."""
    held = view({0: "active", 1: "active"}, acked=3)
    t4 = Target(epoch=4, partitions=frozenset({0, 1}))
    verdict = readiness(held, t4, member=True, stopping=False,
                        acked_partitions=frozenset({0, 1}))
    assert verdict.ready and "as at epoch 3" in verdict.reason
    changed = readiness(held, t4, member=True, stopping=False,
                        acked_partitions=frozenset({0, 1, 2}))  # 2 moved away in epoch 4
    assert not changed.ready and "epoch 4 not acknowledged" in changed.reason
    new_pod = readiness(view(acked=None), Target(epoch=4, partitions=frozenset()),
                        member=True, stopping=False, acked_partitions=None)
    assert not new_pod.ready  # a new member: its first acknowledgement is waited for
