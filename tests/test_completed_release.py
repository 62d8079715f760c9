"""A release that records its partition completed (read to its seal marker): the lock's
body (``kgroup.core.lease_codec``) and the member's release action carrying the flag
(``kgroup.core.member.reconcile``), pure."""

from __future__ import annotations

import pytest

from kgroup.core import lease_codec as codec
from kgroup.core.member.group_spec import partition_bound
from kgroup.core.member.reconcile import AppRelease, Member, Release, Target
from tests.test_member import World, acquire_all, joined, of


def _held(notes: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"name": "g-partition-3", "resourceVersion": "9", "annotations": notes,
                         "labels": {"kgroup.dev/role": "partition",
                                    "kgroup.dev/partition": "3"}},
            "spec": {"holderIdentity": "pod-a", "leaseTransitions": 1}}


def test_a_completed_release_records_its_token_in_the_same_write() -> None:
    body = codec.released_partition_lease(_held({"kgroup.dev/session": "s"}), token=7,
                                          position="1700-3", completed=True)
    notes = body["metadata"]["annotations"]
    assert "holderIdentity" not in body["spec"]
    assert (notes["kgroup.dev/position"], notes["kgroup.dev/position-token"],
            notes["kgroup.dev/completed"]) == ("1700-3", "7", "7")
    assert codec.completed_token(body) == 7


def test_an_ordinary_release_writes_no_completion_and_clears_an_old_one() -> None:
    plain = codec.released_partition_lease(_held({}), token=7, position="1700-3")
    assert "kgroup.dev/completed" not in plain["metadata"]["annotations"]
    assert codec.completed_token(plain) is None
    old = _held({"kgroup.dev/completed": "5", "kgroup.dev/position-token": "5"})
    again = codec.released_partition_lease(old, token=7, position="1800-0")
    assert codec.completed_token(again) is None


def test_a_completion_needs_the_seal_marker() -> None:
    with pytest.raises(ValueError, match="seal marker"):
        codec.released_partition_lease(_held({}), token=7, position=None, completed=True)


@pytest.mark.parametrize("notes", [
    {"kgroup.dev/completed": "5", "kgroup.dev/position-token": "6"},  # a later release
    {"kgroup.dev/completed": "x", "kgroup.dev/position-token": "x"},
    {"kgroup.dev/position-token": "5"},
])
def test_a_stale_or_malformed_completion_is_not_read_as_one(notes: dict[str, str]) -> None:
    assert codec.completed_token(_held(notes)) is None


def _releasing(completed: bool) -> tuple[Member, Release]:
    w = World()
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    w.app[0] = AppRelease(token=100, position="1700-3", completed=completed)
    [rel] = of(m.step(w.snap(0.5)), Release)
    assert isinstance(rel, Release)
    return m, rel


def test_the_apps_completed_release_becomes_a_completed_release_action() -> None:
    _, rel = _releasing(True)
    assert (rel.partition, rel.token, rel.position, rel.completed) == (0, 100, "1700-3", True)
    _, plain = _releasing(False)
    assert plain.completed is False


def test_a_retried_release_keeps_the_completion() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    m = joined(w)
    acquire_all(m, w, 0.1)
    w.app[0] = AppRelease(token=100, position="1700-3", completed=True)
    [first] = of(m.step(w.snap(0.5)), Release)
    assert isinstance(first, Release)
    m.release_failed(0, first.session, now=0.6, still_ours=True)
    retries = [r for t in (0.7, 2.0, 4.0, 6.0) for r in of(m.step(w.snap(t)), Release)]
    assert retries and all(isinstance(r, Release) and r.completed for r in retries)


@pytest.mark.parametrize(("status", "bound"), [
    ({}, 4),
    ({"layout": {"generation": 2, "nextPartition": 6}}, 6),
    ({"layout": {"nextPartition": "6"}}, 4),  # not a number: spec.partitions
    ({"layout": {"nextPartition": 2}}, 4),  # below spec.partitions: not a layout's
    ({"layout": {"nextPartition": 10**10}}, 4),  # beyond nine digits
    ({"layout": []}, 4),
])
def test_a_sidecar_reads_targets_up_to_the_layouts_next_partition(
        status: dict[str, object], bound: int) -> None:
    assert partition_bound(status, 4) == bound
