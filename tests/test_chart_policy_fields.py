"""The Lease policies allow exactly the fields the code writes: no cluster, the
chart rendered with `helm` (tests/chart_render.py) and compared with kgroup.core.

Why: the worker policy lists, per transition, the annotations a worker may change on a
partition lock, and bounds a member Lease (duration, annotations, labels); the operator's
policy says what a lock it creates may carry. Written by hand in CEL, those lists would
drift from the codec; here they are derived from what `lease_codec` actually writes, so a
new annotation in the codec fails this test before a real sidecar meets a 403.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from chart_render import one, render

from kgroup import constants as C
from kgroup.core import health, lease_codec, load

NOW = datetime(2026, 1, 1, tzinfo=UTC)
GROUP: dict[str, Any] = {"metadata": {"name": "g", "uid": "u-1"}}


def _variable(policy: dict[str, Any], name: str) -> str:
    (expr,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == name]
    return str(expr)


def _lists(expr: str) -> list[set[str]]:
    """The string-list literals of a CEL expression, in order."""
    return [set(re.findall(r"'([^']*)'", body)) for body in re.findall(r"\[([^\]]*)\]", expr)]


def _worker_policy() -> dict[str, Any]:
    policy: dict[str, Any] = one(render(), "ValidatingAdmissionPolicy",
                                 "kg-kgroup-lease-ownership")
    return policy


def _changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def _held_lock() -> dict[str, Any]:
    lock = lease_codec.new_partition_lease(namespace="ns", group=GROUP, partition=3,
                                           duration=8, assigned="pod-b", assigned_uid="u-b")
    lock["metadata"]["resourceVersion"] = "41"
    held = lease_codec.acquired_partition_lease(lock, member="pod-b", session="s-b", token=41,
                                                duration=8, now=NOW, uid="u-b")
    held["metadata"]["resourceVersion"] = "42"
    held = lease_codec.marked_partition_lease(held, "pod-a", "u-a")
    return lease_codec.expiry_marked_partition_lease(held, "s-b")


def test_an_acquisition_changes_only_the_annotations_the_policy_lets_an_acquirer_change() -> None:
    acquire, _holder, nobody = _lists(_variable(_worker_policy(), "writableAnnotations"))
    last = _held_lock()
    taken = lease_codec.acquired_partition_lease(last, member="pod-a", session="s-a",
                                                 token=42, duration=8, now=NOW, uid="u-a")
    written = _changed(lease_codec.annotations_of(last), lease_codec.annotations_of(taken))
    assert written == acquire == {C.ANNOTATION_SESSION, C.ANNOTATION_TOKEN,
                                  C.ANNOTATION_EXPIRED_SESSION, C.ANNOTATION_HOLDER_UID}
    assert taken["metadata"]["labels"] == last["metadata"]["labels"]
    assert nobody == set()  # a worker neither holding nor acquiring changes none
    assert taken["metadata"]["ownerReferences"] == last["metadata"]["ownerReferences"]


def test_a_release_changes_only_the_annotations_the_policy_lets_a_holder_change() -> None:
    _acquire, holder, _nobody = _lists(_variable(_worker_policy(), "writableAnnotations"))
    last = _held_lock()
    released = lease_codec.released_partition_lease(last, token=41, position="7-0")
    written = _changed(lease_codec.annotations_of(last), lease_codec.annotations_of(released))
    assert written <= holder
    completed = lease_codec.released_partition_lease(last, token=41, position="7-0",
                                                     completed=True)
    written = _changed(lease_codec.annotations_of(last), lease_codec.annotations_of(completed))
    assert C.ANNOTATION_COMPLETED in written and written <= holder
    assert holder == {C.ANNOTATION_SESSION, C.ANNOTATION_EXPIRED_SESSION,
                      C.ANNOTATION_POSITION, C.ANNOTATION_POSITION_TOKEN,
                      C.ANNOTATION_COMPLETED}
    assert released["metadata"]["labels"] == last["metadata"]["labels"]
    # the holder uid is the acquirer's alone: a holder never changes it, and its writes are
    # judged against it (annotation names as the codec spells them)
    assert C.ANNOTATION_HOLDER_UID not in holder
    policy = _worker_policy()
    assert _variable(policy, "oldHolderUid") == (
        f"variables.oldAnnotations[?'{C.ANNOTATION_HOLDER_UID}'].orValue('')")
    text = yaml_text(policy)
    assert "variables.newHolderUid == variables.podUid" in text
    assert ("!variables.holderWrite || variables.oldHolderUid == '' || "
            "variables.oldHolderUid == variables.podUid") in text


def test_a_member_lease_as_the_sidecar_writes_it_fits_the_policys_bounds() -> None:
    policy = _worker_policy()
    (notes,) = _lists(_variable(policy, "memberAnnotations"))
    (labels,) = _lists(_variable(policy, "memberLabels"))
    body = lease_codec.new_member_lease(name="g-member-pod-a", namespace="ns", group=GROUP,
                                        member="pod-a", session="0123456789abcdef",
                                        duration=C.LEASE_DURATION_SECONDS[2], existing=None,
                                        now=NOW)
    body = lease_codec.renewed_member_lease(body, duration=C.LEASE_DURATION_SECONDS[2],
                                            epoch=7, now=NOW)
    health.annotate(body, "{}")
    load.annotate_load(body, "x")  # a renewal of a member whose app reports rates
    assert set(lease_codec.annotations_of(body)) == notes
    assert set(lease_codec.labels_of(body)) == labels
    assert [r["name"] for r in body["metadata"]["ownerReferences"]] == ["g"]
    assert not body["metadata"]["ownerReferences"][0].get("controller")
    text = yaml_text(policy)
    low, high = C.LEASE_DURATION_SECONDS[1], C.LEASE_DURATION_SECONDS[2]
    assert f"variables.newDuration >= {low} && variables.newDuration <= {high}" in text
    assert (f"'kgroup.dev/health' ? {health.MAX_SUMMARY_BYTES} : "
            f"k == 'kgroup.dev/load' ? {load.MAX_LOAD_BYTES} : 512") in text


def test_a_lock_as_the_operator_creates_it_is_free_with_only_its_mark() -> None:
    lock = lease_codec.new_partition_lease(namespace="ns", group=GROUP, partition=0,
                                           duration=8, assigned="pod-a", assigned_uid="u-a")
    assert set(lease_codec.annotations_of(lock)) == {C.ANNOTATION_ASSIGNED,
                                                      C.ANNOTATION_ASSIGNED_UID}
    assert "holderIdentity" not in lock["spec"] and lock["spec"]["leaseTransitions"] == 0
    (ref,) = lock["metadata"]["ownerReferences"]
    assert ref["controller"] is True and ref["blockOwnerDeletion"] is False
    text = yaml_text(one(render(), "ValidatingAdmissionPolicy", "kg-kgroup-operator-leases"))
    assert (f"variables.newAnnotations.all(k, k in ['{C.ANNOTATION_ASSIGNED}', "
            f"'{C.ANNOTATION_ASSIGNED_UID}'])") in text


def yaml_text(policy: dict[str, Any]) -> str:
    return " ".join(str(v["expression"]) for v in policy["spec"]["validations"])
