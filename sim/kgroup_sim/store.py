"""A simulated API store: wire-form objects (dicts), resourceVersions, conditional writes.

Rule of this module: it behaves like the Kubernetes API server where kgroup relies on
it, and no further. Objects are the same JSON dicts the real API server serves (Leases
read and written by ``kgroup.core.lease_codec``), keyed ``<resource>/<name>`` with
resource ``leases``, ``consumergroups`` or ``pods``. Every committed write gets a new,
globally increasing ``metadata.resourceVersion`` (a decimal string) and keeps the
object's ``uid`` (a create gets a new one); an update carrying another resourceVersion
than the stored one is refused (409 Conflict), never merged; a create of an existing
object is refused (409 AlreadyExists); an update or delete of a missing object is refused
(404). Like the chart's admission policy, an acquisition of a partition lock (a new holder,
or the holder's new session) by a member the lock is not marked for
(``kgroup.dev/assigned``), or by a pod of that name whose uid is not the mark's
(``kgroup.dev/assigned-uid``: the caller's uid, as a pod-bound token carries it, comes with
the request), is refused (403), and so is a takeover of a lock held by another
session unless the operator marked that session expired (``kgroup.dev/expired-session``);
an acquisition must write the caller's uid in ``kgroup.dev/holder-uid``, and a write of the
holder (release, position) by a pod whose uid is not the lock's holder uid (a pod
re-created under the holder's name) is refused (403).
Nothing here knows time, delays or faults: the simulation decides *when* a request reaches
the store and whether its answer ever reaches the caller. Every commit is
reported to one hook, from which the simulation fans out watch events and runs its
store-level checks. Stored dicts are never mutated: a write stores a new dict.
"""

from __future__ import annotations

from collections.abc import Callable

from kgroup.core.lease_codec import is_member, is_partition, parse_partition_lease
from kgroup.core.objects import Obj

__all__ = ["Store", "WriteError", "lease_key", "streams_of"]



def lease_key(name: str) -> str:
    return f"leases/{name}"


def streams_of(key: str, obj: Obj) -> tuple[str, ...]:
    """The watch streams an object belongs to: ``group``, ``pod``, and for a Lease both
    ``lease`` (every kgroup Lease, as the operator watches them) and ``member`` or
    ``partition`` (the sidecar's two Lease watches)."""
    resource = key.split("/", 1)[0]
    if resource == "consumergroups":
        return ("group",)
    if resource == "pods":
        return ("pod",)
    return ("lease", "member" if is_member(obj) else "partition")


class WriteError(Exception):
    """A refused write: ``status`` is the HTTP status (403, 404 or 409)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def unassigned_acquisition(old: Obj, new: Obj, *, expiry: bool = True,
                           caller_uid: str | None = None) -> str | None:
    """Why the admission policy refuses this partition-lock update, or None: the lock's
    holder (or the holder's session) changes to a member it is not marked for, or to one
    whose pod (``caller_uid``; None: not checked) is not the mark's, or (with ``expiry``)
    the lock is taken from another holder whose session carries no expiry mark."""
    if not is_partition(new) or not is_partition(old):
        return None
    before, after = parse_partition_lease(old).value, parse_partition_lease(new).value
    if before is None or after is None or not after.holder:
        return None
    if (after.holder, after.session) == (before.holder, before.session):
        return None
    if before.assigned != after.holder:
        return f"{after.holder} may not take a lock assigned to {before.assigned or 'nobody'}"
    if caller_uid is not None and before.assigned_uid != caller_uid:
        return (f"{after.holder} (uid {caller_uid}) may not take a lock assigned to the pod "
                f"of that name with uid {before.assigned_uid}")
    if caller_uid is not None and after.holder_uid != caller_uid:
        return (f"{after.holder} (uid {caller_uid}) must write its uid as the holder uid, "
                f"not {after.holder_uid}")
    if expiry and before.holder and before.holder != after.holder and before.session \
            and before.expired != before.session:
        return (f"{after.holder} may not take a lock held by {before.holder} under session "
                f"{before.session} that the operator has not marked expired")
    return None


def foreign_holder_write(old: Obj, new: Obj, caller_uid: str | None) -> str | None:
    """Why the admission policy refuses this partition-lock update as a holder write from
    another pod, or None: the lock's holder writes it (release, position; not an
    acquisition) from a pod (``caller_uid``; None: not checked) other than the one whose uid
    the lock carries (``kgroup.dev/holder-uid``; none: an older sidecar's, by name)."""
    if caller_uid is None or not is_partition(new) or not is_partition(old):
        return None
    before, after = parse_partition_lease(old).value, parse_partition_lease(new).value
    if before is None or after is None or not before.holder:
        return None
    if after.holder and (after.holder, after.session) != (before.holder, before.session):
        return None  # an acquisition: unassigned_acquisition judges it
    if before.holder_uid is None or before.holder_uid == caller_uid:
        return None
    return (f"{before.holder} (uid {caller_uid}) may not write a lock held by the pod of that "
            f"name with uid {before.holder_uid}")


CommitHook = Callable[[str, "Obj | None", "Obj | None"], None]


class Store:
    def __init__(self, on_commit: CommitHook, *, expiry_admission: bool = True,
                 holder_admission: bool = True) -> None:
        self.expiry_admission = expiry_admission
        self.holder_admission = holder_admission  # False: the holder-uid rule is off
        self.objects: dict[str, Obj] = {}
        self.rv = 0
        self.uids = 0
        self.writes = 0
        self.refused = 0  # writes the admission rule refused
        self._on_commit = on_commit

    def get(self, key: str) -> Obj | None:
        return self.objects.get(key)

    def list(self, resource: str) -> list[tuple[str, Obj]]:
        prefix = resource + "/"
        return [(k, o) for k, o in self.objects.items() if k.startswith(prefix)]

    def _commit(self, key: str, obj: Obj | None, uid: str = "") -> Obj | None:
        old = self.objects.get(key)
        self.writes += 1
        if obj is None:
            del self.objects[key]
            self._on_commit(key, old, None)
            return None
        self.rv += 1
        md = dict(obj.get("metadata") or {})
        md["resourceVersion"] = str(self.rv)
        md["uid"] = uid or (old or {}).get("metadata", {}).get("uid", "")
        new = {**obj, "metadata": md}
        self.objects[key] = new
        self._on_commit(key, old, new)
        return new

    def create(self, key: str, obj: Obj) -> Obj:
        if key in self.objects:
            raise WriteError(409, f"{key} already exists")
        self.uids += 1
        new = self._commit(key, obj, uid=f"uid-{self.uids}")
        assert new is not None
        return new

    def update(self, key: str, obj: Obj, *, caller_uid: str | None = None) -> Obj:
        """Replace ``key`` if its resourceVersion is still the one ``obj`` carries;
        ``caller_uid``: the uid of the pod writing (None: the operator, an admin)."""
        old = self.objects.get(key)
        if old is None:
            raise WriteError(404, f"{key} not found")
        expected = (obj.get("metadata") or {}).get("resourceVersion")
        stored = old["metadata"]["resourceVersion"]
        if expected is not None and expected != stored:
            raise WriteError(409, f"{key}: resourceVersion {expected} is not {stored}")
        refused = unassigned_acquisition(old, obj, expiry=self.expiry_admission,
                                         caller_uid=caller_uid)
        if refused is None and self.holder_admission:
            refused = foreign_holder_write(old, obj, caller_uid)
        if refused is not None:
            self.refused += 1
            raise WriteError(403, f"{key}: {refused}")
        new = self._commit(key, obj)
        assert new is not None
        return new

    def delete(self, key: str) -> None:
        if key not in self.objects:
            raise WriteError(404, f"{key} not found")
        self._commit(key, None)
