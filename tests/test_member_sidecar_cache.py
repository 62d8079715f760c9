"""The sidecar's lock cache never goes back in time (kgroup.core.lease_codec.supersedes,
SidecarLogic.on_list / on_event): a replayed watch event or a re-list read before our own
write is older than what we know and is dropped. Observations are fed to the shipped
``SidecarLogic`` directly; nothing here talks to an API server."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kgroup.core import lease_codec as objects
from kgroup.core.member.converge import SidecarLogic as Sidecar

ME = "pod-a"


def lease(p: int, *, token: int, rv: str, holder: str | None = None,
          session: str | None = None, uid: str = "u1") -> dict[str, Any]:
    notes = {"kgroup.dev/session": session} if session else {}
    spec: dict[str, Any] = {"leaseTransitions": token}
    if holder:
        spec["holderIdentity"] = holder
    return {"metadata": {"name": f"g-partition-{p}", "resourceVersion": rv, "uid": uid,
                         "annotations": notes,
                         "labels": {"kgroup.dev/role": "partition",
                                    "kgroup.dev/partition": str(p)}},
            "spec": spec}


def group_body() -> dict[str, Any]:
    return {"metadata": {"name": "g", "namespace": "ns", "resourceVersion": "1"},
            "spec": {"partitions": 4, "selector": {"matchLabels": {"app": "x"}}},
            "status": {"epoch": 1, "assignment": {ME: "0"}}}


def member_lease(member: str, session: str) -> dict[str, Any]:
    return {"metadata": {"name": f"g-member-{member}", "resourceVersion": "7",
                         "annotations": {"kgroup.dev/session": session},
                         "labels": {"kgroup.dev/role": "member", "kgroup.dev/member": member}},
            "spec": {"holderIdentity": member, "leaseDurationSeconds": 8}}


@pytest.fixture
def sidecar() -> Sidecar:
    return Sidecar(pod=ME, group="g", namespace="ns", clock=lambda: 0.0,
                   wall=lambda: datetime(2026, 1, 1, tzinfo=UTC), new_session=lambda: "S")


def test_a_relist_read_before_our_acquisition_does_not_replace_it(sidecar: Sidecar) -> None:
    """The bug of seeds 1376 / 2316: our acquisition's answer (token 3) is in the cache;
    a list read before it (token 2, free) arrives after it and must not replace it."""
    sidecar.on_list("partition", [lease(0, token=2, rv="100")])
    sidecar._store_partition(lease(0, token=3, rv="120", holder=ME, session="S"))
    sidecar.on_list("partition", [lease(0, token=2, rv="100"), lease(1, token=0, rv="90")])
    assert (sidecar.locks[0].token, sidecar.locks[0].holder) == (3, ME)
    assert sorted(sidecar.locks) == [0, 1]


def test_a_relist_still_drops_a_lease_that_no_longer_exists(sidecar: Sidecar) -> None:
    sidecar.on_list("partition", [lease(0, token=2, rv="100"), lease(1, token=0, rv="90")])
    sidecar.on_list("partition", [lease(1, token=0, rv="90")])
    assert sorted(sidecar.locks) == [1]


def test_a_replayed_event_with_the_same_token_and_an_older_version_is_dropped(
    sidecar: Sidecar,
) -> None:
    """Acquired (token 5, rv 200), then released (token 5, no holder, rv 210): a replay of
    the acquisition's event must not bring the holder back."""
    sidecar.on_event("partition", "MODIFIED", lease(0, token=5, rv="200", holder=ME, session="S"))
    sidecar.on_event("partition", "MODIFIED", lease(0, token=5, rv="210"))
    sidecar.on_event("partition", "MODIFIED", lease(0, token=5, rv="200", holder=ME, session="S"))
    assert (sidecar.locks[0].holder, sidecar.locks[0].resource_version) == (None, "210")


def test_an_event_with_a_lower_token_is_dropped_whatever_its_version(sidecar: Sidecar) -> None:
    sidecar.on_event("partition", "MODIFIED", lease(0, token=5, rv="200", holder=ME, session="S"))
    sidecar.on_event("partition", "MODIFIED", lease(0, token=4, rv="300", holder="b", session="T"))
    assert sidecar.locks[0].token == 5


def test_newer_events_replace_the_cache(sidecar: Sidecar) -> None:
    sidecar.on_event("partition", "MODIFIED", lease(0, token=5, rv="200", holder=ME, session="S"))
    sidecar.on_event("partition", "MODIFIED", lease(0, token=5, rv="9999"))  # longer number
    assert sidecar.locks[0].resource_version == "9999"
    sidecar.on_event("partition", "MODIFIED",
                     lease(0, token=6, rv="10000", holder="b", session="T"))
    assert (sidecar.locks[0].token, sidecar.locks[0].holder) == (6, "b")


def test_a_lease_created_again_replaces_the_old_one_despite_its_lower_token(
    sidecar: Sidecar,
) -> None:
    """The group was deleted and created again (new uid, token 0) while the DELETED event
    was lost: the newer object wins."""
    sidecar.on_event("partition", "MODIFIED", lease(0, token=5, rv="200", holder=ME, session="S"))
    sidecar.on_list("partition", [lease(0, token=0, rv="500", uid="u2")])
    assert (sidecar.locks[0].token, sidecar.locks[0].holder) == (0, None)
    sidecar.on_event("partition", "DELETED", lease(0, token=5, rv="250"))  # old incarnation
    assert 0 in sidecar.locks


@pytest.mark.parametrize(("new", "old", "expected"), [
    ("11", "9", True),       # integers, not strings: "11" > "9"
    ("9", "11", False),
    ("10", "10", True),      # the same version again: harmless
    ("abc", "10", True),     # not comparable: the newcomer wins, as with tokens alone
    ("010", "9", True),      # leading zero: not a valid resourceVersion, not compared
])
def test_resource_versions_compare_as_integers_only_when_they_are_valid(
    new: str, old: str, expected: bool,
) -> None:
    assert objects.supersedes(lease(0, token=1, rv=new), lease(0, token=1, rv=old)) is expected


# ---- scoped re-lists (the partition watch selects the member's interest) -------------

def test_a_scoped_relist_drops_what_left_the_scope_and_what_vanished_inside_it(
    sidecar: Sidecar,
) -> None:
    sidecar.on_list("partition", [lease(p, token=0, rv=str(10 + p)) for p in range(4)], None)
    assert sorted(sidecar.locks) == [0, 1, 2, 3]
    # scope {1, 2, 5}: 0 and 3 are no longer watched, 2 was deleted, 5 is new
    sidecar.on_list("partition", [lease(1, token=0, rv="11"), lease(5, token=0, rv="15")],
                    frozenset({1, 2, 5}))
    assert sorted(sidecar.locks) == [1, 5]
    assert sorted(sidecar.partition_leases) == [1, 5]


def test_a_scoped_relist_keeps_our_newer_write_inside_the_scope(sidecar: Sidecar) -> None:
    sidecar.on_list("partition", [lease(0, token=2, rv="100")], frozenset({0}))
    sidecar._store_partition(lease(0, token=3, rv="120", holder=ME, session="S"))
    sidecar.on_list("partition", [lease(0, token=2, rv="100")], frozenset({0, 1}))
    assert (sidecar.locks[0].token, sidecar.locks[0].holder) == (3, ME)


def test_the_sidecar_needs_no_member_watch_and_ignores_member_leases(sidecar: Sidecar) -> None:
    # the operator is the failure detector: the sidecar steps on the group and its
    # partition watch alone; another member's Lease, however delivered, changes nothing
    sidecar.on_list("group", [group_body()], None)
    sidecar.on_list("partition", [lease(0, token=1, rv="5", holder="b", session="T")], None)
    assert sidecar.snapshot().timing is not None  # synced without any member list
    sidecar.on_list("member", [], None)
    sidecar.on_event("partition", "MODIFIED", member_lease("b", "T"))
    assert sorted(sidecar.locks) == [0] and sidecar.locks[0].holder == "b"
