"""Reading and writing the group's Lease objects (raw JSON dicts, camelCase as on the wire).

Reading is forgiving: a malformed annotation or label is treated as absent, and the
caller logs a warning once per object and key. Writing always starts from the last body
read (or written) so the ``resourceVersion`` in it makes every update conditional.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kgroup.constants import (
    ANNOTATION_EPOCH,
    ANNOTATION_POSITION,
    ANNOTATION_POSITION_TOKEN,
    ANNOTATION_SESSION,
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
)
from kgroup.core.member import Lock

Obj = dict[str, Any]


def micro_time(when: datetime | None = None) -> str:
    """A metav1.MicroTime string."""
    return (when or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def meta(obj: Obj) -> Obj:
    result: Obj = obj.get("metadata") or {}
    return result


def annotations_of(obj: Obj) -> dict[str, str]:
    result: dict[str, str] = meta(obj).get("annotations") or {}
    return result


def labels(obj: Obj) -> dict[str, str]:
    result: dict[str, str] = meta(obj).get("labels") or {}
    return result


def role(obj: Obj) -> str | None:
    return labels(obj).get(LABEL_ROLE)


@dataclass(frozen=True)
class Parsed:
    value: Any
    problems: tuple[str, ...] = ()


def parse_partition_lease(obj: Obj) -> Parsed:
    """-> Parsed(Lock | None): None when the partition label is not a number."""
    problems: list[str] = []
    try:
        partition = int(labels(obj).get(LABEL_PARTITION, ""))
    except ValueError:
        return Parsed(None, (f"label {LABEL_PARTITION} is not a partition number",))
    spec = obj.get("spec") or {}
    notes = annotations_of(obj)
    session = notes.get(ANNOTATION_SESSION) or None
    position_token: int | None = None
    if ANNOTATION_POSITION_TOKEN in notes:
        try:
            position_token = int(notes[ANNOTATION_POSITION_TOKEN])
        except ValueError:
            problems.append(f"annotation {ANNOTATION_POSITION_TOKEN} is not an integer")
    token = spec.get("leaseTransitions") or 0
    lock = Lock(
        partition=partition,
        holder=spec.get("holderIdentity") or None,
        session=session,
        token=int(token),
        resource_version=str(meta(obj).get("resourceVersion", "")),
        position=notes.get(ANNOTATION_POSITION),
        position_token=position_token,
    )
    return Parsed(lock, tuple(problems))


@dataclass(frozen=True)
class MemberLease:
    member: str
    session: str | None
    marker: str
    duration: float
    epoch: int | None


def parse_member_lease(obj: Obj) -> Parsed:
    """-> Parsed(MemberLease | None)."""
    problems: list[str] = []
    spec = obj.get("spec") or {}
    member = labels(obj).get(LABEL_MEMBER) or spec.get("holderIdentity")
    if not member:
        return Parsed(None, ("member Lease names no member",))
    notes = annotations_of(obj)
    epoch: int | None = None
    if ANNOTATION_EPOCH in notes:
        try:
            epoch = int(notes[ANNOTATION_EPOCH])
        except ValueError:
            problems.append(f"annotation {ANNOTATION_EPOCH} is not an integer")
    duration = spec.get("leaseDurationSeconds")
    if not isinstance(duration, int) or duration <= 0:
        problems.append("spec.leaseDurationSeconds is missing")
        duration = 15
    parsed = MemberLease(
        member=str(member),
        session=notes.get(ANNOTATION_SESSION) or None,
        marker=str(meta(obj).get("resourceVersion", "")),
        duration=float(duration),
        epoch=epoch,
    )
    return Parsed(parsed, tuple(problems))


def owner_reference(group: Obj) -> Obj:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": meta(group)["name"],
        "uid": meta(group)["uid"],
    }


def new_member_lease(
    *, name: str, namespace: str, group: Obj, member: str, session: str, duration: float,
    existing: Obj | None,
) -> Obj:
    """The body that starts a session: create (``existing`` None) or take over our Lease."""
    now = micro_time()
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
        "acquireTime": now,
        "renewTime": now,
    }
    return body


def renewed_member_lease(last: Obj, *, duration: float, epoch: int | None) -> Obj:
    body = copy.deepcopy(last)
    body.setdefault("spec", {})["renewTime"] = micro_time()
    body["spec"]["leaseDurationSeconds"] = math.ceil(duration)
    notes = dict(annotations_of(body))
    if epoch is None:
        notes.pop(ANNOTATION_EPOCH, None)
    else:
        notes[ANNOTATION_EPOCH] = str(epoch)
    body["metadata"]["annotations"] = notes
    return body


def acquired_partition_lease(
    last: Obj, *, member: str, session: str, token: int, duration: float
) -> Obj:
    now = micro_time()
    body = copy.deepcopy(last)
    spec = body.setdefault("spec", {})
    spec.update(
        holderIdentity=member,
        leaseTransitions=token,
        acquireTime=now,
        renewTime=now,
        leaseDurationSeconds=math.ceil(duration),
    )
    notes = dict(annotations_of(body))
    notes[ANNOTATION_SESSION] = session
    body["metadata"]["annotations"] = notes
    return body


def released_partition_lease(last: Obj, *, token: int, position: str | None) -> Obj:
    """Holder cleared; ``position`` None keeps the previous position annotations."""
    body = copy.deepcopy(last)
    spec = body.setdefault("spec", {})
    spec.pop("holderIdentity", None)
    spec.pop("renewTime", None)
    notes = dict(annotations_of(body))
    notes.pop(ANNOTATION_SESSION, None)
    if position is not None:
        notes[ANNOTATION_POSITION] = position
        notes[ANNOTATION_POSITION_TOKEN] = str(token)
    body["metadata"]["annotations"] = notes
    return body


def resource_version_number(obj: Obj) -> int | None:
    """The object's resourceVersion as an integer, or None when it is not one.

    Kubernetes calls resourceVersion opaque, but since v1.35 (KEP-5504, client-go's
    ``CompareResourceVersion``) versions of objects of one resource compare as integers:
    a positive decimal without leading zeros, larger = newer. Every etcd-backed API server
    has always produced such numbers; anything else is treated as not comparable.
    """
    rv = meta(obj).get("resourceVersion")
    if not isinstance(rv, str) or not rv.isdigit() or rv.startswith("0"):
        return None
    return int(rv)


def supersedes(new: Obj, cached: Obj) -> bool:
    """Whether ``new`` (a partition Lease from a watch event, a list or an answer) may
    replace ``cached`` in the lock cache: never go back in time.

    * Another object (uid differs: the Lease was deleted and created again): the newer
      resourceVersion wins; if the versions do not compare, the newcomer does.
    * The same object: a lower token is older, always (tokens only grow). With the same
      token, the higher resourceVersion is newer (a replayed watch event, or a list read
      before our own write and delivered after it, carries a lower one). Without
      comparable versions the newcomer wins, as with tokens alone.
    """
    new_uid, old_uid = meta(new).get("uid"), meta(cached).get("uid")
    new_rv, old_rv = resource_version_number(new), resource_version_number(cached)
    if new_uid and old_uid and new_uid != old_uid:
        return new_rv is None or old_rv is None or new_rv > old_rv
    new_lock, old_lock = parse_partition_lease(new).value, parse_partition_lease(cached).value
    if new_lock is None or old_lock is None:
        return True
    if new_lock.token != old_lock.token:
        return bool(new_lock.token > old_lock.token)
    return new_rv is None or old_rv is None or new_rv >= old_rv


def is_partition(obj: Obj) -> bool:
    return role(obj) == ROLE_PARTITION


def is_member(obj: Obj) -> bool:
    return role(obj) == ROLE_MEMBER
