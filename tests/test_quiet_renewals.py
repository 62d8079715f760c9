"""A renewal that changes nothing costs the operator nothing: which Lease changes are
material (``GroupLeases.put``), when a timer wake-up plans and how often the Lease watch
reads (``kgroup.core.operator.wakeup``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kgroup import constants as C
from kgroup.core.operator.lease_cache import GroupLeases, health_key
from kgroup.core.operator.wakeup import (
    BUSY_READ_PAUSE,
    QUIET_AFTER,
    QUIET_READ_PAUSE,
    after_pass,
    on_timer,
    read_pause,
)

DURATION = 8


def member(pod: str, rv: int, *, session: str = "s1", epoch: str | None = "3",
           health: dict[str, Any] | None = None, duration: int = DURATION) -> dict[str, Any]:
    ann = {C.ANNOTATION_SESSION: session}
    if epoch is not None:
        ann[C.ANNOTATION_EPOCH] = epoch
    if health is not None:
        ann[C.ANNOTATION_HEALTH] = json.dumps(health, separators=(",", ":"), sort_keys=True)
    return {
        "metadata": {
            "name": f"g-member-{pod}", "resourceVersion": str(rv), "annotations": ann,
            "labels": {C.LABEL_GROUP: "g", C.LABEL_ROLE: C.ROLE_MEMBER, C.LABEL_MEMBER: pod},
        },
        "spec": {"holderIdentity": pod, "leaseDurationSeconds": duration,
                 "renewTime": f"2026-01-01T00:00:{rv % 60:02d}.000000Z"},
    }


def lock(n: int, rv: int, *, holder: str | None = "a", session: str | None = "s1",
         token: int = 1, assigned: str | None = "a", position: str | None = None
         ) -> dict[str, Any]:
    ann: dict[str, str] = {}
    if session:
        ann[C.ANNOTATION_SESSION] = session
    if assigned:
        ann[C.ANNOTATION_ASSIGNED] = assigned
    if position is not None:
        ann[C.ANNOTATION_POSITION] = json.dumps({"token": token, "position": position})
    return {
        "metadata": {
            "name": f"g-partition-{n}", "resourceVersion": str(rv), "annotations": ann,
            "labels": {C.LABEL_GROUP: "g", C.LABEL_ROLE: C.ROLE_PARTITION,
                       C.LABEL_PARTITION: str(n)},
        },
        "spec": {"holderIdentity": holder, "leaseTransitions": token},
    }


def lagging(lag: int, stalled: str = "", reason: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"stalledCount": len(stalled.split(",")) if stalled else 0,
                           "lag": lag, "partitions": {"0": [lag, f"{lag}-0"]}}
    if stalled:
        out["stalled"], out["reason"] = stalled, reason
    return out


def test_a_plain_renewal_is_not_material() -> None:
    g = GroupLeases()
    assert g.put(member("a", 10), now=0.0) is True  # first sight: a new member
    assert g.put(member("a", 11), now=2.0) is False
    assert g.put(member("a", 12), now=4.0) is False
    # ...yet the session's clock restarted: the tracker saw every renewal
    assert g.next_expiry(4.0) == pytest.approx(4.0 + DURATION)


def test_a_stale_or_replayed_event_is_not_material() -> None:
    g = GroupLeases()
    g.put(member("a", 10), now=0.0)
    g.put(member("a", 12, epoch="4"), now=1.0)
    assert g.put(member("a", 11, epoch="3"), now=2.0) is False
    assert g.members["a"].epoch == 4


@pytest.mark.parametrize("change", [
    {"epoch": "4"},  # an acknowledgement
    {"epoch": None},
    {"session": "s2"},  # a restarted member: a new session
    {"duration": 15},
])
def test_a_renewal_that_changes_a_field_is_material(change: dict[str, Any]) -> None:
    g = GroupLeases()
    g.put(member("a", 10), now=0.0)
    assert g.put(member("a", 11, **change), now=1.0) is True


def test_lag_and_positions_are_not_material_but_stalls_are() -> None:
    g = GroupLeases()
    g.put(member("a", 10, health=lagging(5)), now=0.0)
    assert g.put(member("a", 11, health=lagging(7)), now=1.0) is False  # lag moved
    assert g.put(member("a", 12, health=lagging(9, "0", "sink refused")), now=2.0) is True
    assert g.put(member("a", 13, health=lagging(3, "0", "sink refused")), now=3.0) is False
    assert g.put(member("a", 14, health=lagging(3, "0", "disk full")), now=4.0) is True
    assert g.put(member("a", 15, health=lagging(3)), now=5.0) is True  # recovered
    assert g.put(member("a", 16), now=6.0) is False  # no summary: no stall either way...
    # ...and the status reads the newest annotation (the cache kept every body)
    assert C.ANNOTATION_HEALTH not in g.bodies["g-member-a"]["metadata"]["annotations"]


def test_an_unreadable_health_annotation_counts_whole() -> None:
    assert health_key("{not json") == "{not json"
    assert health_key("[1]") == "[1]"
    assert health_key(None) is None


def test_a_renewal_of_a_session_seen_expired_is_material() -> None:
    """Past its expiry the member left the membership; its renewal brings it back."""
    g = GroupLeases()
    g.put(member("a", 10), now=0.0)
    assert g.put(member("a", 11), now=DURATION - 0.1) is False
    assert g.put(member("a", 12), now=2 * DURATION) is True


def test_a_lock_change_is_material_but_a_committed_position_is_not() -> None:
    g = GroupLeases()
    assert g.put(lock(0, 20, holder=None, session=None, token=0), now=0.0) is True
    assert g.put(lock(0, 21), now=1.0) is True  # acquired
    assert g.put(lock(0, 22, position="100-0"), now=2.0) is False
    assert g.put(lock(0, 23, position="200-0"), now=3.0) is False
    assert g.put(lock(0, 24, assigned="b", position="200-0"), now=4.0) is True  # marked
    assert g.put(lock(0, 25, holder="b", session="s9", token=2, assigned="b"), now=5.0) is True


def plan_deadlines(g: GroupLeases, now: float, *others: float | None) -> list[float | None]:
    return [*others, g.next_expiry(now)]


def test_a_timer_at_a_renewed_expiry_sleeps_on() -> None:
    g = GroupLeases()
    g.put(member("a", 10), now=0.0)
    g.put(member("b", 10), now=1.0)
    deadlines = plan_deadlines(g, 1.0, None)
    quiet = after_pass(g, deadlines, min(d for d in deadlines if d is not None), 1.0,
                       idle_recheck=300.0)
    assert quiet.other_at == pytest.approx(301.0)
    g.put(member("a", 11), now=5.0)  # renewed: expiry 8.0 -> 13.0
    assert on_timer(quiet, g, 8.0) == pytest.approx(9.0 - 8.0)  # b's expiry is next
    g.put(member("b", 11), now=6.0)
    assert on_timer(quiet, g, 8.0) == pytest.approx(13.0 - 8.0)


def test_a_timer_after_an_expiry_plans() -> None:
    g = GroupLeases()
    g.put(member("a", 10), now=0.0)
    g.put(member("b", 10), now=0.0)
    deadlines = plan_deadlines(g, 0.0)
    quiet = after_pass(g, deadlines, DURATION, 0.0, idle_recheck=300.0)
    g.put(member("b", 11), now=4.0)
    assert on_timer(quiet, g, DURATION) is None  # a's session ended: membership changed


@pytest.mark.parametrize("other", [3.0, None])
def test_a_timer_at_another_deadline_plans(other: float | None) -> None:
    """A window end (or any deadline but session expiry) and a rate limit's wake-up plan."""
    g = GroupLeases()
    g.put(member("a", 10), now=0.0)
    deadlines = plan_deadlines(g, 0.0, other)
    quiet = after_pass(g, deadlines, 3.0, 0.0, idle_recheck=300.0)
    assert quiet.other_at == pytest.approx(3.0)
    assert on_timer(quiet, g, 2.0) == pytest.approx(1.0)  # a timer before it: sleep on
    assert on_timer(quiet, g, 3.0) is None


def test_the_idle_recheck_still_plans() -> None:
    g = GroupLeases()
    g.put(member("a", 10), now=0.0)
    quiet = after_pass(g, plan_deadlines(g, 0.0), DURATION, 0.0, idle_recheck=300.0)
    for t in range(2, 300, 2):
        g.put(member("a", 10 + t), now=float(t))
    assert on_timer(quiet, g, 300.0) is None


def test_no_pass_seen_plans() -> None:
    assert on_timer(None, GroupLeases(), 0.0) is None


def test_the_lease_watch_reads_fast_while_the_group_moves_and_slowly_once_quiet() -> None:
    assert BUSY_READ_PAUSE < QUIET_READ_PAUSE <= 0.5  # the failover's extra delay stays small
    # never poked nor planned yet (a new group, an operator that just started): fast
    assert read_pause(None, False, 100.0) == BUSY_READ_PAUSE
    # poked or planned within QUIET_AFTER: fast, up to its very end
    assert read_pause(100.0, False, 100.0) == BUSY_READ_PAUSE
    assert read_pause(100.0, False, 100.0 + QUIET_AFTER - 0.01) == BUSY_READ_PAUSE
    # quiet for QUIET_AFTER: slow
    assert read_pause(100.0, False, 100.0 + QUIET_AFTER) == QUIET_READ_PAUSE
    assert read_pause(100.0, False, 10_000.0) == QUIET_READ_PAUSE
    # a Rebalancing status keeps it fast however long the hand-over's drain takes
    assert read_pause(100.0, True, 10_000.0) == BUSY_READ_PAUSE
