"""The one reader and writer of kgroup's Lease objects (raw JSON dicts, camelCase as on
the wire), shared by the sidecar, the operator and the simulation.

Names, labels, annotations, tokens and the order of resourceVersions live here and
nowhere else. Reading is forgiving: a malformed annotation or label is treated as absent
and named in ``Parsed.problems`` (the caller logs it once). Writing always starts from the
last body read (or written), so the ``resourceVersion`` in it makes every update
conditional. Pure: no clock is read; writers that stamp a time take it as ``now``.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kgroup.constants import (
    ANNOTATION_ASSIGNED,
    ANNOTATION_ASSIGNED_UID,
    ANNOTATION_COMPLETED,
    ANNOTATION_EPOCH,
    ANNOTATION_EXPIRED_SESSION,
    ANNOTATION_HOLDER_UID,
    ANNOTATION_POSITION,
    ANNOTATION_POSITION_TOKEN,
    ANNOTATION_SESSION,
    ANNOTATION_TOKEN,
    API_GROUP,
    API_VERSION,
    KIND,
    LABEL_GROUP,
    LABEL_MEMBER,
    LABEL_PARTITION,
    LABEL_ROLE,
    MANAGED_BY,
    ROLE_MEMBER,
    ROLE_PARTITION,
    partition_lease_name,
)
from kgroup.core.locks import Lock
from kgroup.core.objects import Obj
from kgroup.core.tokens import resource_version_number

DEFAULT_DURATION = 15
"""A member Lease without ``leaseDurationSeconds`` is read with this duration."""

__all__ = [
    "MemberLease",
    "PackedLeases",
    "Parsed",
    "acquired_partition_lease",
    "annotations_of",
    "assigned_of",
    "assignment_patch",
    "completed_token",
    "expired_of",
    "expiry_marked_partition_lease",
    "expiry_patch",
    "group_of",
    "is_member",
    "is_partition",
    "labels_of",
    "marked_partition_lease",
    "meta",
    "micro_time",
    "new_member_lease",
    "new_partition_lease",
    "not_older",
    "parse_member_lease",
    "parse_partition_lease",
    "released_partition_lease",
    "renewed_member_lease",
    "resource_version_number",
    "slim",
    "supersedes",
]


# ---- reading ----------------------------------------------------------------------------


def micro_time(when: datetime) -> str:
    """A metav1.MicroTime string."""
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def meta(obj: Obj) -> Obj:
    result: Obj = obj.get("metadata") or {}
    return result


def slim(obj: Obj) -> Obj:
    """``obj`` as a cache keeps it: without ``metadata.managedFields``, which nothing of
    kgroup reads and which is half of a lock's JSON and more than half of its parsed size
    (10.6 KB of Python objects per lock with it, 4.6 KB without: a sidecar watching a
    group's 10,000 locks whole kept 100 MB of it). A shallow copy: ``obj`` is not changed.
    A write built from the slim copy (a PUT) leaves the server's managedFields as they are:
    an update without them keeps the stored ones."""
    md = obj.get("metadata")
    if not isinstance(md, dict) or "managedFields" not in md:
        return obj
    return {**obj, "metadata": {k: v for k, v in md.items() if k != "managedFields"}}


class PackedLeases(Mapping[int, Obj]):
    """Lease bodies by partition, kept as compact JSON text (:func:`slim` first) and
    decoded when read: a member keeps its locks whole only for the PUTs it builds from
    them (acquisition, release: rare), and a decoded lock is ≈ 4.2 KB of Python objects
    where its text is ≈ 0.9 KB (at 1,000 partitions per member, 4 MB of the sidecar's
    RSS). Each read decodes a fresh copy: a caller may change it."""

    __slots__ = ("_texts",)

    def __init__(self) -> None:
        self._texts: dict[int, str] = {}

    def __getitem__(self, partition: int) -> Obj:
        return _decoded(self._texts[partition])

    def __iter__(self) -> Iterator[int]:
        return iter(self._texts)

    def __len__(self) -> int:
        return len(self._texts)

    def __contains__(self, partition: object) -> bool:
        return partition in self._texts

    def __setitem__(self, partition: int, obj: Obj) -> None:
        self._texts[partition] = json.dumps(slim(obj), separators=(",", ":"))

    def pop(self, partition: int, default: Obj | None = None) -> Obj | None:
        text = self._texts.pop(partition, None)
        return default if text is None else _decoded(text)

    def clear(self) -> None:
        self._texts.clear()


def _decoded(text: str) -> Obj:
    obj: Obj = json.loads(text)
    return obj


def annotations_of(obj: Obj) -> dict[str, str]:
    result: dict[str, str] = meta(obj).get("annotations") or {}
    return result


def labels_of(obj: Obj) -> dict[str, str]:
    result: dict[str, str] = meta(obj).get("labels") or {}
    return result


def group_of(obj: Obj) -> str | None:
    """The ConsumerGroup a kgroup Lease belongs to (its group label), or None."""
    return labels_of(obj).get(LABEL_GROUP) or None


def is_partition(obj: Obj) -> bool:
    return labels_of(obj).get(LABEL_ROLE) == ROLE_PARTITION


def is_member(obj: Obj) -> bool:
    return labels_of(obj).get(LABEL_ROLE) == ROLE_MEMBER


@dataclass(frozen=True)
class Parsed:
    value: Any
    problems: tuple[str, ...] = ()


def parse_partition_lease(obj: Obj) -> Parsed:
    """-> Parsed(Lock | None): None when the partition label is not a number."""
    problems: list[str] = []
    try:
        partition = int(labels_of(obj).get(LABEL_PARTITION, ""))
    except ValueError:
        return Parsed(None, (f"label {LABEL_PARTITION} is not a partition number",))
    spec = obj.get("spec") or {}
    notes = annotations_of(obj)
    position_token: int | None = None
    if ANNOTATION_POSITION_TOKEN in notes:
        try:
            position_token = int(notes[ANNOTATION_POSITION_TOKEN])
        except ValueError:
            problems.append(f"annotation {ANNOTATION_POSITION_TOKEN} is not an integer")
    token = int(spec.get("leaseTransitions") or 0)  # a lock last taken before kgroup.dev/token
    if ANNOTATION_TOKEN in notes:
        number = resource_version_number(notes[ANNOTATION_TOKEN])
        if number is None:
            problems.append(f"annotation {ANNOTATION_TOKEN} is not a resourceVersion")
        else:
            token = number
    lock = Lock(
        partition=partition,
        holder=spec.get("holderIdentity") or None,
        session=notes.get(ANNOTATION_SESSION) or None,
        token=token,
        resource_version=str(meta(obj).get("resourceVersion", "")),
        position=notes.get(ANNOTATION_POSITION),
        position_token=position_token,
        assigned=notes.get(ANNOTATION_ASSIGNED) or None,
        assigned_uid=notes.get(ANNOTATION_ASSIGNED_UID) or None,
        holder_uid=notes.get(ANNOTATION_HOLDER_UID) or None,
        expired=notes.get(ANNOTATION_EXPIRED_SESSION) or None,
    )
    return Parsed(lock, tuple(problems))


def assigned_of(obj: Obj) -> str | None:
    """The member a partition Lease is marked for (``kgroup.dev/assigned``), or None."""
    return annotations_of(obj).get(ANNOTATION_ASSIGNED) or None


def expired_of(obj: Obj) -> str | None:
    """The session a partition Lease's expiry mark names (``kgroup.dev/expired-session``)."""
    return annotations_of(obj).get(ANNOTATION_EXPIRED_SESSION) or None


@dataclass(frozen=True)
class MemberLease:
    """A member Lease as read: ``marker`` (its resourceVersion) changes with every write,
    so a changed marker means the session was renewed (never a time comparison)."""

    member: str
    session: str | None
    marker: str
    duration: float
    epoch: int | None
    epoch_annotation: str | None  # raw, for the status's "bad annotation" report
    name: str = ""


def parse_member_lease(obj: Obj) -> Parsed:
    """-> Parsed(MemberLease | None)."""
    problems: list[str] = []
    spec = obj.get("spec") or {}
    member = labels_of(obj).get(LABEL_MEMBER) or spec.get("holderIdentity")
    if not member:
        return Parsed(None, ("member Lease names no member",))
    notes = annotations_of(obj)
    raw_epoch = notes.get(ANNOTATION_EPOCH)
    epoch: int | None = None
    if raw_epoch is not None:
        try:
            epoch = int(raw_epoch)
        except ValueError:
            problems.append(f"annotation {ANNOTATION_EPOCH} is not an integer")
    duration = spec.get("leaseDurationSeconds")
    if not isinstance(duration, int) or duration <= 0:
        problems.append("spec.leaseDurationSeconds is missing")
        duration = DEFAULT_DURATION
    parsed = MemberLease(
        member=str(member),
        session=notes.get(ANNOTATION_SESSION) or None,
        marker=str(meta(obj).get("resourceVersion", "")),
        duration=float(duration),
        epoch=epoch,
        epoch_annotation=raw_epoch,
        name=str(meta(obj).get("name", "")),
    )
    return Parsed(parsed, tuple(problems))


# ---- resourceVersion order --------------------------------------------------------------


def not_older(new: Obj, old: Obj) -> bool:
    """Whether ``new`` may replace ``old`` (two reads of one object) in a cache: True
    unless its resourceVersion is known to be lower. The operator's caches use this."""
    new_rv = resource_version_number(meta(new).get("resourceVersion"))
    old_rv = resource_version_number(meta(old).get("resourceVersion"))
    return new_rv is None or old_rv is None or new_rv >= old_rv


def supersedes(new: Obj, cached: Obj) -> bool:
    """Whether ``new`` (a partition Lease from a watch event, a list or an answer) may
    replace ``cached`` in a lock cache: never go back in time.

    * Another object (uid differs: the Lease was deleted and created again): the newer
      resourceVersion wins; if the versions do not compare, the newcomer does.
    * The same object: a lower token is older, always (tokens only grow). With the same
      token, :func:`not_older` decides (a replayed watch event, or a list read before our
      own write and delivered after it, carries a lower resourceVersion).
    """
    new_uid, old_uid = meta(new).get("uid"), meta(cached).get("uid")
    if new_uid and old_uid and new_uid != old_uid:
        new_rv = resource_version_number(meta(new).get("resourceVersion"))
        old_rv = resource_version_number(meta(cached).get("resourceVersion"))
        return new_rv is None or old_rv is None or new_rv > old_rv
    new_lock, old_lock = parse_partition_lease(new).value, parse_partition_lease(cached).value
    if new_lock is None or old_lock is None:
        return True
    if new_lock.token != old_lock.token:
        return bool(new_lock.token > old_lock.token)
    return not_older(new, cached)


# ---- writing ----------------------------------------------------------------------------


def owner_reference(group: Obj, *, controller: bool = False) -> Obj:
    ref: Obj = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": meta(group)["name"],
        "uid": meta(group).get("uid", ""),
    }
    if controller:
        ref.update(controller=True, blockOwnerDeletion=False)
    return ref


def new_partition_lease(*, namespace: str, group: Obj, partition: int, duration: int,
                        assigned: str | None = None, assigned_uid: str | None = None) -> Obj:
    """A free lock for ``partition`` (no holder, no token, ``leaseTransitions`` 0): the
    operator's, marked for ``assigned`` (its target owner) when there is one, and for its
    pod's uid ``assigned_uid`` when the operator knows it."""
    name = meta(group)["name"]
    body: Obj = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": partition_lease_name(name, partition),
            "namespace": namespace,
            "labels": {
                LABEL_GROUP: name,
                LABEL_ROLE: ROLE_PARTITION,
                LABEL_PARTITION: str(partition),
                MANAGED_BY: "kgroup-operator",
            },
            "ownerReferences": [owner_reference(group, controller=True)],
        },
        "spec": {"leaseTransitions": 0, "leaseDurationSeconds": duration},
    }
    if assigned:
        body["metadata"]["annotations"] = {
            k: v for k, v in _mark(assigned, assigned_uid).items() if v}
    return body


def _mark(member: str, uid: str | None) -> dict[str, str | None]:
    # a mark without a uid removes the previous one (JSON merge patch: null deletes)
    return {ANNOTATION_ASSIGNED: member, ANNOTATION_ASSIGNED_UID: uid or None}


def assignment_patch(member: str, uid: str | None, resource_version: str) -> Obj:
    """The operator's one write when a partition's target owner (or its pod's uid)
    changes: a JSON merge patch that sets the mark (member and uid; no uid known: the uid
    removed) and touches nothing else (holder, token, positions stay), conditional on
    ``resource_version`` (the lock as the operator decided on it: a mark decided on a
    stale view is refused with 409 and decided again on the lock as it is)."""
    return {"metadata": {"resourceVersion": resource_version,
                         "annotations": _mark(member, uid)}}


def marked_partition_lease(last: Obj, member: str, uid: str | None = None) -> Obj:
    """``last`` with :func:`assignment_patch` applied (what the API server stores)."""
    body = copy.deepcopy(last)
    notes = {**annotations_of(last), ANNOTATION_ASSIGNED: member}
    notes.pop(ANNOTATION_ASSIGNED_UID, None)
    if uid:
        notes[ANNOTATION_ASSIGNED_UID] = uid
    body.setdefault("metadata", {})["annotations"] = notes
    return body


def expiry_patch(session: str, resource_version: str) -> Obj:
    """The operator's write when it saw a lock's holder session over: a JSON merge patch
    setting the expiry mark to ``session``, conditional on ``resource_version`` (the lock as
    read: a patch carrying ``metadata.resourceVersion`` is refused with 409 when the
    stored one differs), so it never lands on a lock that changed meanwhile."""
    return {"metadata": {"resourceVersion": resource_version,
                         "annotations": {ANNOTATION_EXPIRED_SESSION: session}}}


def expiry_marked_partition_lease(last: Obj, session: str) -> Obj:
    """``last`` with :func:`expiry_patch` applied (what the API server stores)."""
    body = copy.deepcopy(last)
    body.setdefault("metadata", {})["annotations"] = {**annotations_of(last),
                                                      ANNOTATION_EXPIRED_SESSION: session}
    return body


def new_member_lease(
    *, name: str, namespace: str, group: Obj, member: str, session: str, duration: float,
    existing: Obj | None, now: datetime,
) -> Obj:
    """The body that starts a session: create (``existing`` None) or take over our Lease."""
    stamp = micro_time(now)
    body: Obj = copy.deepcopy(existing) if existing else {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
    }
    md = body.setdefault("metadata", {})
    md["labels"] = {
        **(md.get("labels") or {}),
        LABEL_GROUP: meta(group)["name"],
        LABEL_ROLE: ROLE_MEMBER,
        LABEL_MEMBER: member,
        MANAGED_BY: "kgroup-sidecar",
    }
    notes = dict(md.get("annotations") or {})
    notes[ANNOTATION_SESSION] = session
    notes.pop(ANNOTATION_EPOCH, None)
    md["annotations"] = notes
    md["ownerReferences"] = [owner_reference(group)]
    body["spec"] = {
        "holderIdentity": member,
        "leaseDurationSeconds": math.ceil(duration),
        "acquireTime": stamp,
        "renewTime": stamp,
    }
    return body


def renewed_member_lease(last: Obj, *, duration: float, epoch: int | None,
                         now: datetime) -> Obj:
    body = copy.deepcopy(last)
    body.setdefault("spec", {})["renewTime"] = micro_time(now)
    body["spec"]["leaseDurationSeconds"] = math.ceil(duration)
    notes = dict(annotations_of(body))
    if epoch is None:
        notes.pop(ANNOTATION_EPOCH, None)
    else:
        notes[ANNOTATION_EPOCH] = str(epoch)
    body["metadata"]["annotations"] = notes
    return body


def acquired_partition_lease(
    last: Obj, *, member: str, session: str, token: int, duration: float, now: datetime,
    uid: str | None = None,
) -> Obj:
    """``last`` taken by ``member``: ``token`` (kgroup.core.tokens: ``last``'s own
    resourceVersion, the write's precondition) in ``kgroup.dev/token``, the expiry mark
    removed, the holder's pod uid in ``kgroup.dev/holder-uid``: ``uid`` (the sidecar's
    ``KGROUP_POD_UID``), or when it is not known the mark's uid (``kgroup.dev/assigned-uid``:
    the admission policy lets only the pod of that uid acquire, and requires the holder uid
    to be the caller's); ``leaseTransitions``
    counts acquisitions of this Lease object (one more), as client-go's leader election does."""
    stamp = micro_time(now)
    body = copy.deepcopy(last)
    spec = body.setdefault("spec", {})
    spec.update(
        holderIdentity=member,
        leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1,
        acquireTime=stamp,
        renewTime=stamp,
        leaseDurationSeconds=math.ceil(duration),
    )
    notes = dict(annotations_of(body))
    notes[ANNOTATION_SESSION] = session
    notes[ANNOTATION_TOKEN] = str(token)
    notes.pop(ANNOTATION_EXPIRED_SESSION, None)  # a new session starts unmarked
    holder_uid = uid or notes.get(ANNOTATION_ASSIGNED_UID)
    if holder_uid:
        notes[ANNOTATION_HOLDER_UID] = holder_uid
    else:  # no uid to bind (a mark without one): the policy refuses this acquisition
        notes.pop(ANNOTATION_HOLDER_UID, None)
    body["metadata"]["annotations"] = notes
    return body


def released_partition_lease(last: Obj, *, token: int, position: str | None,
                             completed: bool = False) -> Obj:
    """Holder cleared; ``position`` None keeps the previous position annotations. The
    holder uid stays (the pod that last held it; the next acquisition replaces it).
    ``completed`` (with a position: the seal marker): the partition was read to its seal,
    recorded as ``kgroup.dev/completed`` = ``token`` in the same write; any other release
    removes a completion an earlier release recorded."""
    if completed and position is None:
        raise ValueError("a completed release needs its position (the seal marker)")
    body = copy.deepcopy(last)
    spec = body.setdefault("spec", {})
    spec.pop("holderIdentity", None)
    spec.pop("renewTime", None)
    notes = dict(annotations_of(body))
    notes.pop(ANNOTATION_SESSION, None)
    notes.pop(ANNOTATION_EXPIRED_SESSION, None)
    if position is not None:
        notes[ANNOTATION_POSITION] = position
        notes[ANNOTATION_POSITION_TOKEN] = str(token)
    if completed:
        notes[ANNOTATION_COMPLETED] = str(token)
    else:
        notes.pop(ANNOTATION_COMPLETED, None)
    body["metadata"]["annotations"] = notes
    return body


def completed_token(obj: Obj) -> int | None:
    """The token of the release that recorded the partition completed, or None: absent,
    not a number, or no longer the release the position is from (a later release wrote
    another position)."""
    notes = annotations_of(obj)
    value = notes.get(ANNOTATION_COMPLETED)
    if value is None or value != notes.get(ANNOTATION_POSITION_TOKEN) or \
            not value.isdecimal():
        return None
    return int(value)
