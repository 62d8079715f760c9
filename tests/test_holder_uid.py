"""A lock's holder is a pod, not a name: the acquisition writes the
holder's pod uid (``kgroup.dev/holder-uid``), and the holder's later writes (release,
position) are judged against it. Pure: the codec as the sidecar calls it, and the
simulation's store (``kgroup_sim.store``), which refuses what the chart's admission policy
refuses (the policy itself on a real API server: e2e/tests/test_admission_privilege.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kgroup import constants as C
from kgroup.core import lease_codec as codec
from kgroup_sim.store import Store, WriteError, lease_key

NOW = datetime(2026, 1, 1, tzinfo=UTC)
GROUP: dict[str, Any] = {"metadata": {"name": "g", "uid": "g-uid"}}
OLD, NEW = "uid-old", "uid-new"  # two pods of the name "pod-a": the first, the re-created
KEY = lease_key("g-partition-0")


def _store(*, holder_admission: bool = True, marked: str = OLD) -> Store:
    store = Store(lambda *_: None, holder_admission=holder_admission)
    store.create(KEY, codec.new_partition_lease(namespace="ns", group=GROUP, partition=0,
                                                duration=8, assigned="pod-a",
                                                assigned_uid=marked))
    return store


def _take(store: Store, uid: str | None, caller: str) -> dict[str, Any]:
    last = store.get(KEY)
    assert last is not None
    body = codec.acquired_partition_lease(last, member="pod-a", session=f"s-{caller}",
                                          token=int(last["metadata"]["resourceVersion"]),
                                          duration=8, now=NOW, uid=uid)
    return store.update(KEY, body, caller_uid=caller)


def _release(store: Store, caller: str, position: str | None = "42") -> dict[str, Any]:
    last = store.get(KEY)
    assert last is not None
    lock = codec.parse_partition_lease(last).value
    body = codec.released_partition_lease(last, token=lock.token, position=position)
    return store.update(KEY, body, caller_uid=caller)


def test_an_acquisition_writes_the_holders_uid_and_a_release_keeps_it() -> None:
    store = _store()
    taken = _take(store, OLD, OLD)
    assert codec.annotations_of(taken)[C.ANNOTATION_HOLDER_UID] == OLD
    assert codec.parse_partition_lease(taken).value.holder_uid == OLD
    released = _release(store, OLD)
    assert "holderIdentity" not in released["spec"]
    assert codec.annotations_of(released)[C.ANNOTATION_HOLDER_UID] == OLD  # who held it last


def test_a_sidecar_without_its_uid_writes_the_marks_uid() -> None:
    """Without KGROUP_POD_UID the mark's uid is written: the policy lets only that pod
    acquire, so it is the caller's; a mark without a uid gives none (and the policy
    refuses that acquisition anyway)."""
    store = _store()
    assert codec.annotations_of(_take(store, None, OLD))[C.ANNOTATION_HOLDER_UID] == OLD
    bare = codec.new_partition_lease(namespace="ns", group=GROUP, partition=0, duration=8,
                                     assigned="pod-a")
    bare["metadata"]["resourceVersion"] = "1"
    stale = codec.acquired_partition_lease(
        {**bare, "metadata": {**bare["metadata"], "annotations": {
            **codec.annotations_of(bare), C.ANNOTATION_HOLDER_UID: "someone"}}},
        member="pod-a", session="s", token=1, duration=8, now=NOW)
    assert C.ANNOTATION_HOLDER_UID not in codec.annotations_of(stale)


def test_a_pod_re_created_under_the_holders_name_may_not_release_its_lock() -> None:
    """pod-a (uid-old) holds the lock; a pod of the same name (uid-new) writes the release
    and the position as the sidecar would: refused, the lock still held by uid-old, whose
    own release is then allowed."""
    store = _store()
    _take(store, OLD, OLD)
    for position in ("42", None):
        with pytest.raises(WriteError) as refused:
            _release(store, NEW, position)
        assert refused.value.status == 403
        assert f"uid {NEW}) may not write a lock held by the pod of that name with uid {OLD}" \
            in str(refused.value)
    assert store.refused == 2
    still = codec.parse_partition_lease(store.get(KEY) or {}).value
    assert (still.holder, still.holder_uid, still.position) == ("pod-a", OLD, None)
    assert "holderIdentity" not in _release(store, OLD)["spec"]


def test_with_the_rule_off_the_re_created_pod_releases_the_old_pods_lock() -> None:
    """The broken variant: the store without the holder-uid rule (as the policy was before
    this rule) commits the re-created pod's release and position."""
    store = _store(holder_admission=False)
    _take(store, OLD, OLD)
    released = _release(store, NEW)
    assert "holderIdentity" not in released["spec"]
    assert codec.annotations_of(released)[C.ANNOTATION_POSITION] == "42"
    assert store.refused == 0


def test_an_acquisition_with_another_holder_uid_is_refused() -> None:
    store = _store()
    with pytest.raises(WriteError) as refused:
        _take(store, "uid-forged", OLD)
    assert refused.value.status == 403 and "holder uid" in str(refused.value)


def test_a_lock_taken_by_an_older_sidecar_is_the_holders_by_name_until_retaken() -> None:
    """No kgroup.dev/holder-uid (acquired before this rule): any pod of the holder's name
    may still release it; the next acquisition writes the uid."""
    store = _store()
    taken = _take(store, OLD, OLD)
    legacy = {**taken, "metadata": {**taken["metadata"], "annotations": {
        k: v for k, v in codec.annotations_of(taken).items() if k != C.ANNOTATION_HOLDER_UID}}}
    store.objects[KEY] = legacy  # as an older sidecar left it
    assert "holderIdentity" not in _release(store, NEW)["spec"]
