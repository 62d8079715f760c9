"""Fencing tokens (kgroup.core.tokens, kgroup.core.lease_codec): an acquisition's token is
the resourceVersion it replaced, carried in kgroup.dev/token; leaseTransitions counts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kgroup.core import lease_codec as codec
from kgroup.core.tokens import acquisition_token, resource_version_number

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def lease(rv: str, notes: dict[str, str] | None = None, transitions: int = 0,
          uid: str = "u1") -> dict[str, Any]:
    return {"metadata": {"name": "g-partition-3", "resourceVersion": rv, "uid": uid,
                         "annotations": notes or {},
                         "labels": {"kgroup.dev/role": "partition", "kgroup.dev/partition": "3"}},
            "spec": {"leaseTransitions": transitions, "leaseDurationSeconds": 15}}


@pytest.mark.parametrize(("rv", "token"), [("1", 1), ("18446744073709551615", 2**64 - 1),
                                           ("", None), ("0", None), ("012", None),
                                           ("12a", None), ("-5", None)])
def test_only_an_etcd_revision_gives_a_token(rv: str, token: int | None) -> None:
    assert acquisition_token(rv) == token == resource_version_number(rv)


def test_an_acquisition_writes_the_replaced_version_as_token_and_counts_itself() -> None:
    last = lease("4711", {"kgroup.dev/token": "300"}, transitions=2)
    body = codec.acquired_partition_lease(last, member="pod-a", session="S", token=4711,
                                          duration=15, now=NOW)
    assert body["metadata"]["resourceVersion"] == "4711"  # the precondition...
    assert body["metadata"]["annotations"]["kgroup.dev/token"] == "4711"  # ...is the token
    assert body["spec"]["leaseTransitions"] == 3  # the acquisition count
    lock = codec.parse_partition_lease({**body, "metadata": {**body["metadata"],
                                                              "resourceVersion": "4712"}}).value
    assert (lock.holder, lock.session, lock.token) == ("pod-a", "S", 4711)


def test_a_release_keeps_the_token() -> None:
    held = lease("90", {"kgroup.dev/token": "80", "kgroup.dev/session": "S"}, transitions=1)
    released = codec.released_partition_lease(held, token=80, position="7-0")
    assert released["metadata"]["annotations"]["kgroup.dev/token"] == "80"
    assert codec.parse_partition_lease(released).value.token == 80


def test_a_lock_from_before_the_annotation_reads_leaseTransitions() -> None:
    # taken by a sidecar of an older version: its token was leaseTransitions, far below
    # any resourceVersion token, so an upgrade never makes a token go backwards
    lock = codec.parse_partition_lease(lease("5000", transitions=3)).value
    assert lock.token == 3 and acquisition_token(lock.resource_version) == 5000 > 3


def test_a_garbled_token_is_named_and_read_as_absent() -> None:
    parsed = codec.parse_partition_lease(lease("50", {"kgroup.dev/token": "x"}, transitions=2))
    assert parsed.value.token == 2
    assert parsed.problems == ("annotation kgroup.dev/token is not a resourceVersion",)


def test_a_lease_created_again_has_a_higher_version_than_every_token_of_the_old_one() -> None:
    old = lease("700", {"kgroup.dev/token": "650"}, transitions=9, uid="u1")
    again = lease("900", transitions=0, uid="u2")  # deleted, created by the operator again
    assert codec.supersedes(again, old)  # the cache takes the new Lease...
    new_token = acquisition_token(codec.parse_partition_lease(again).value.resource_version)
    assert new_token is not None and new_token > codec.parse_partition_lease(old).value.token
