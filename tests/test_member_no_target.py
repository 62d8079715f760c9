"""A status without epoch is not an empty target (kgroup.core.member.reconcile rule 3): the member
holds what it has until a target appears, and revokes everything only on shutdown or when
the group is deleted."""

from __future__ import annotations

import dataclasses

from test_member import TIMING, World, acquire_all, joined, of

from kgroup.core.member.reconcile import AckEpoch, Acquire, Member, Release, Revoke, Target


def holding(w: World) -> Member:
    """A member that holds partitions 0 and 1 under epoch 1 and acknowledged it."""
    w.target = Target(1, frozenset({0, 1}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    assert of(m.step(w.snap(0.2)), AckEpoch)
    m.renewed("S1", sent_at=0.2, timing=TIMING, epoch=1, now=0.3)
    assert isinstance(m, Member)
    return m


def test_a_status_without_epoch_revokes_nothing_and_keeps_the_partitions_active() -> None:
    w = World()
    m = holding(w)
    w.target = None
    acts = m.step(w.snap(1.0))
    assert of(acts, Revoke) == [] and of(acts, Release) == []
    assert [(p.partition, p.state) for p in m.view(1.0).partitions] == [
        (0, "active"), (1, "active")]
    # long after any drain timeout, still held and active
    assert of(m.step(w.snap(7.0)), Release) == []
    assert [p.state for p in m.view(7.0).partitions] == ["active", "active"]


def test_a_status_without_epoch_acquires_nothing_and_acknowledges_nothing() -> None:
    w = World()
    m = holding(w)
    w.target = None
    w.set_lock(2, None, None, 0)
    acts = m.step(w.snap(1.0))
    assert of(acts, Acquire) == [] and of(acts, AckEpoch) == []


def test_a_reseeded_target_from_the_holders_moves_nothing() -> None:
    w = World()
    m = holding(w)
    w.target = None
    m.step(w.snap(1.0))
    w.target = Target(5, frozenset({0, 1}))  # the operator seeds the status from holders
    acts = m.step(w.snap(1.5))
    assert of(acts, Revoke) == [] and of(acts, Release) == [] and of(acts, Acquire) == []
    assert [a.epoch for a in of(acts, AckEpoch)] == [5]


def test_epoch_0_the_operators_status_before_any_target_holds_too() -> None:
    """After an emptied status the restarted operator writes epoch 0 with an empty
    assignment while its stabilisation window runs; that is no target either."""
    w = World()
    m = holding(w)
    w.target = Target(0, frozenset())
    acts = m.step(w.snap(1.0))
    assert of(acts, Revoke) == [] and of(acts, Release) == [] and of(acts, AckEpoch) == []
    assert [p.state for p in m.view(1.0).partitions] == ["active", "active"]


def test_a_member_holding_nothing_acknowledges_epoch_0() -> None:
    w = World()
    w.target = Target(0, frozenset())
    m = joined(w)
    assert [a.epoch for a in of(m.step(w.snap(0.1)), AckEpoch)] == [0]


def test_a_deleted_group_revokes_everything() -> None:
    w = World()
    m = holding(w)
    w.target = None
    snap = dataclasses.replace(w.snap(1.0), group_deleted=True)
    assert sorted(r.partition for r in of(m.step(snap), Revoke)) == [0, 1]


def test_shutdown_without_a_target_still_revokes_everything() -> None:
    w = World()
    m = holding(w)
    w.target = None
    m.begin_shutdown()
    assert sorted(r.partition for r in of(m.step(w.snap(1.0)), Revoke)) == [0, 1]
