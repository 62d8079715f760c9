"""What the operator knows of pods and of every group's Leases, fed by watch events.

:class:`Cache` is the kopf operator's whole cache (``kgroup_operator.handlers`` feeds it,
``kgroup_operator.groups`` and ``kgroup_operator.controller`` read it); the Leases of each
group live in a :class:`GroupLeases`, which the simulated operator (``kgroup_sim.control``)
keeps as well. Pure: the caller passes ``now`` (its own monotonic clock).

Rule: the cache is fed by watch events plus one initial listing at start-up; nothing here
polls. It holds the Leases of ConsumerGroups that exist only (``Cache.known``): a worker
may create member Leases naming any group, and thousands naming groups that do not exist
must not grow the one operator's memory; the Leases of a group that appears later are
listed when it does (``kgroup_operator.groups.GroupLoops.group_seen``).
Each object keeps the newest ``resourceVersion`` seen (``lease_codec.not_older``), so a
late, stale event never overwrites a fresher read. Session liveness is judged by
:class:`~kgroup.core.locks.SessionTracker` on the observer's clock: a member Lease's
marker is its resourceVersion (every write changes it), never a time to compare.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kgroup import constants as C
from kgroup.core import lease_codec as codec
from kgroup.core.lease_codec import MemberLease
from kgroup.core.locks import Lock, SessionTracker
from kgroup.core.objects import Obj
from kgroup.core.operator.injection import has_sidecar
from kgroup.core.operator.load_window import LOAD_WINDOW_REPORTS, LoadWindow
from kgroup.core.operator.planner import LockObservation, PodObservation
from kgroup.core.operator.status import MemberLeaseObservation

__all__ = [
    "Cache",
    "GroupKey",
    "GroupLeases",
    "health_key",
    "material_lock_change",
    "material_member_change",
    "pod_observation",
    "says_no_stall",
]


def pod_observation(body: Mapping[str, Any]) -> PodObservation:
    """``ready`` means the *app's* containers are ready, not the pod's Ready condition:
    the kgroup sidecar's readiness probe answers Ready only once the pod holds its target
    (``kgroup.core.member.readiness``), which needs the pod to be a member first; waiting for the
    pod's Ready condition would never admit a new pod. The sidecar (a native sidecar lives
    in ``initContainerStatuses``; a plain one is named ``kgroup-sidecar``) is left out.
    A pod with no container statuses yet falls back to its Ready condition."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    apps = [c for c in status.get("containerStatuses") or []
            if c.get("name") != C.SIDECAR_CONTAINER]
    if apps:
        ready = all(bool(c.get("ready")) for c in apps)
    else:
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
    labels = dict(meta.get("labels") or {})
    kind, workload, revision = _controller(meta, labels)
    return PodObservation(
        name=meta.get("name", ""),
        labels=labels,
        running=status.get("phase") == "Running",
        ready=ready,
        terminating=bool(meta.get("deletionTimestamp")),
        owner_kind=kind,
        workload=workload,
        revision=revision,
        uid=str(meta.get("uid") or ""),
        sidecar=has_sidecar(body),
    )


def _controller(meta: Mapping[str, Any], labels: Mapping[str, str]) -> tuple[str, str, str]:
    """(controller kind, workload, revision) from the pod's controller ownerReference and
    its revision label. A Deployment's ReplicaSet is named ``<deployment>-<pod-template-
    hash>``, so its pods' workload is the Deployment whatever the revision; a
    StatefulSet's revision is its ``controller-revision-hash`` label."""
    ref = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
    if ref is None:
        return "", "", ""
    kind, name = str(ref.get("kind", "")), str(ref.get("name", ""))
    if kind == "ReplicaSet":
        revision = labels.get("pod-template-hash", "")
        if revision and name.endswith(f"-{revision}"):
            return kind, f"Deployment/{name[: -len(revision) - 1]}", revision
        return kind, f"{kind}/{name}", revision
    return kind, f"{kind}/{name}", labels.get("controller-revision-hash", "")


@dataclass
class GroupLeases:
    """Every kgroup Lease of one group, and the sessions seen on its member Leases."""

    members: dict[str, MemberLease] = field(default_factory=dict)  # by member id
    partitions: dict[int, Lock] = field(default_factory=dict)  # by partition
    bodies: dict[str, Obj] = field(default_factory=dict)  # by Lease name: version order
    tracker: SessionTracker = field(default_factory=SessionTracker)
    # by member Lease name: (raw kgroup.dev/health, its health_key), parsed once per change
    _health: dict[str, tuple[str | None, Any]] = field(default_factory=dict, repr=False)
    # locks() as last built; None once a lock changed (a pass at 10,000 partitions spent a
    # fifth of its time rebuilding it)
    _locks: tuple[LockObservation, ...] | None = field(default=None, repr=False)
    # how many of a member's latest load reports count (kgroup.core.operator.load_window);
    # a documented seam: the simulation's no-smoothing variant sets 1 (the latest alone)
    load_window_reports: int = LOAD_WINDOW_REPORTS
    # by member Lease name: its load annotations of the last window (the figures' mean)
    _loads: dict[str, LoadWindow] = field(default_factory=dict, repr=False)

    def put(self, body: Obj, now: float) -> bool:
        """A Lease from a watch event or a list (ignored when older than the cached one).

        Returns whether the change is *material*: whether it can change what the operator
        plans or writes (:func:`material_member_change`, :func:`material_lock_change`). A
        member's renewal whose only news is its marker (resourceVersion, renewTime) and
        its lag or load figures is not (load reports that start or stop are): it only
        restarts the session's clock in the tracker, and the group's loop is not woken (it
        still wakes at the earliest session expiry, and every 30 s for the load figures)."""
        name = str(codec.meta(body).get("name", ""))
        old = self.bodies.get(name)
        if old is not None and not codec.not_older(body, old):
            return False
        body = codec.slim(body)
        renewed = self._renewal(old, body, name) if old is not None else None
        if renewed is not None or codec.is_member(body):
            ml = renewed or codec.parse_member_lease(body).value
            if ml is None:
                return False
            previous = self.members.get(ml.member)
            was_live = (previous is not None and previous.session is not None
                        and self.tracker.is_live(ml.member, previous.session, now))
            raw_health = codec.annotations_of(body).get(C.ANNOTATION_HEALTH)
            old_raw, old_health = self._health.get(name, (None, None))
            health = old_health if raw_health == old_raw else health_key(raw_health)
            self._health[name] = (raw_health, health)
            # load reports that start or stop: the status's load figures appear or go
            load_news = old is not None and (C.ANNOTATION_LOAD in codec.annotations_of(body)) \
                != (C.ANNOTATION_LOAD in codec.annotations_of(old))
            self._window_load(name, old, body, now)
            self.bodies[name] = body
            self.members[ml.member] = ml
            if ml.session:
                self.tracker.observe(ml.member, ml.session, ml.marker, ml.duration, now)
            return load_news or material_member_change(previous, ml, was_live=was_live,
                                                       old_health=old_health,
                                                       new_health=health)
        if codec.is_partition(body):
            lock = codec.parse_partition_lease(body).value
            if lock is None:
                return False
            self.bodies[name] = body
            previous_lock = self.partitions.get(lock.partition)
            self.partitions[lock.partition] = lock
            if previous_lock is None or (previous_lock.holder, previous_lock.session) != (
                    lock.holder, lock.session):
                self._locks = None
            return material_lock_change(previous_lock, lock)
        return False

    def _window_load(self, name: str, old: Obj | None, body: Obj, now: float) -> None:
        """A new write's load annotation joins the Lease's window (a replay of the same
        resourceVersion is no new sample); a Lease without one has no window."""
        raw = codec.annotations_of(body).get(C.ANNOTATION_LOAD)
        if not raw:
            self._loads.pop(name, None)
            return
        version = codec.meta(body).get("resourceVersion")
        if old is None or version is None or codec.meta(old).get("resourceVersion") != version:
            self._loads.setdefault(name, LoadWindow(self.load_window_reports)).add(raw, now)

    def _renewal(self, old: Obj, body: Obj, name: str) -> MemberLease | None:
        """The cached member Lease with ``body``'s marker, when ``body`` differs from the
        cached ``old`` body at most where a renewal does (its resourceVersion, renewTime,
        health, managedFields): every field :func:`~kgroup.core.lease_codec.parse_member_lease`
        reads is compared, so the result is what parsing would give, without building it
        from scratch on each of the 500 renewals/s of a 1,000-member group. None: parse."""
        labels, old_labels = codec.labels_of(body), codec.labels_of(old)
        if labels != old_labels or labels.get(C.LABEL_ROLE) != C.ROLE_MEMBER:
            return None
        cached = self.members.get(labels.get(C.LABEL_MEMBER) or
                                  str((body.get("spec") or {}).get("holderIdentity") or ""))
        if cached is None or cached.name != name:
            return None
        spec, old_spec = body.get("spec") or {}, old.get("spec") or {}
        notes, old_notes = codec.annotations_of(body), codec.annotations_of(old)
        if (spec.get("holderIdentity") != old_spec.get("holderIdentity")
                or spec.get("leaseDurationSeconds") != old_spec.get("leaseDurationSeconds")
                or notes.get(C.ANNOTATION_SESSION) != old_notes.get(C.ANNOTATION_SESSION)
                or notes.get(C.ANNOTATION_EPOCH) != old_notes.get(C.ANNOTATION_EPOCH)):
            return None
        marker = str(codec.meta(body).get("resourceVersion", ""))
        return MemberLease(cached.member, cached.session, marker, cached.duration,
                           cached.epoch, cached.epoch_annotation, cached.name)

    def drop(self, body: Obj) -> None:
        """A Lease's DELETED event."""
        name = str(codec.meta(body).get("name", ""))
        self.bodies.pop(name, None)
        self._health.pop(name, None)
        self._loads.pop(name, None)
        if codec.is_member(body):
            ml = codec.parse_member_lease(body).value
            if ml is not None and (current := self.members.get(ml.member)) is not None \
                    and current.name == ml.name:
                del self.members[ml.member]
                self.tracker.forget(ml.member)
        elif codec.is_partition(body):
            lock = codec.parse_partition_lease(body).value
            if lock is not None and self.partitions.pop(lock.partition, None) is not None:
                self._locks = None

    def member_read(self, member: str, fresh: Obj | None, now: float) -> None:
        """A quorum read of ``member``'s Lease before an expiry mark (``fresh`` None: it
        is gone) enters like a watch event: a changed marker restarts the session's clock."""
        if fresh is not None:
            self.put(fresh, now)
            return
        cached = self.members.get(member)
        if cached is not None and cached.name in self.bodies:
            self.drop(self.bodies[cached.name])
        self.tracker.forget(member)

    def relist(self, bodies: Iterable[Obj], now: float) -> None:
        """A re-list of the group's Leases: authoritative on which exist."""
        listed = list(bodies)
        names = {str(codec.meta(b).get("name", "")) for b in listed}
        for gone in [b for n, b in self.bodies.items() if n not in names]:
            self.drop(gone)
        for body in listed:
            self.put(body, now)
        for member in self.tracker.members():
            if member not in self.members:
                self.tracker.forget(member)

    def live_sessions(self, now: float) -> dict[str, str]:
        out: dict[str, str] = {}
        for member, lease in self.members.items():
            if lease.session and self.tracker.is_live(member, lease.session, now):
                out[member] = lease.session
        return out

    def next_expiry(self, now: float) -> float | None:
        """The earliest future moment a live session would expire unrenewed."""
        times = [
            t
            for member, lease in self.members.items()
            if lease.session
            and (t := self.tracker.expires_at(member, lease.session)) is not None
            and t > now
        ]
        return min(times, default=None)

    def locks(self) -> tuple[LockObservation, ...]:
        """Each lock's (partition, holder, session), built again only after one of those
        changed."""
        if self._locks is None:
            self._locks = tuple(LockObservation(p, v.holder, v.session)
                                for p, v in self.partitions.items())
        return self._locks

    def member_observations(self) -> dict[str, MemberLeaseObservation]:
        out: dict[str, MemberLeaseObservation] = {}
        for m, v in self.members.items():
            notes = codec.annotations_of(self.bodies.get(v.name) or {})
            window = self._loads.get(v.name)
            out[m] = MemberLeaseObservation(m, v.session, v.epoch_annotation,
                                            notes.get(C.ANNOTATION_HEALTH),
                                            notes.get(C.ANNOTATION_LOAD),
                                            tuple(window.samples()) if window else ())
        return out


def health_key(raw: str | None) -> Any:
    """What of a ``kgroup.dev/health`` annotation can change the status: the stalled
    partitions, their count and the reason (``kgroup.core.operator.status.stalled_partitions``);
    not the lag figures and positions, which change with every renewal and are not in the
    status. No stall is the same as no annotation; one that does not read as a JSON object
    is kept whole."""
    if not raw or says_no_stall(raw):
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return raw
    if not isinstance(data, dict):
        return raw
    key = (data.get("stalled") or None, data.get("stalledCount") or None,
           data.get("reason") or None)
    return None if key == (None, None, None) else key  # no stall: as no annotation


_NO_STALL_ENDS = (',"stalled":"","stalledCount":0}', ',"stalledCount":0}', '{"stalledCount":0}')


def says_no_stall(raw: str) -> bool:
    """Whether a ``kgroup.dev/health`` text says *no stall* in the sidecar's own encoding
    (``kgroup.core.health.encode_summary``: compact JSON, sorted keys, so ``stalled`` then
    ``stalledCount`` come last), read without parsing it: a member's renewal carries up
    to 4 KiB of it, changed at every renewal (lags and positions), and decoding it cost
    the operator more than the rest of the renewal.

    True only if: no backslash (so every ``"`` is JSON's own, not one inside a string);
    no ``"reason":`` key anywhere; the text ends with ``"stalledCount":0}`` (the last
    member of the outer object: its value, whatever came before); and ``"stalled":``
    appears only as the outer object's member just before it, with ``""``. For a JSON
    object that is exactly :func:`health_key` ``None``; a malformed text that passes
    reads as no stall, as the status reads any malformed one
    (``kgroup.core.health.parse_summary``)."""
    if "\\" in raw or '"reason":' in raw:
        return False
    if raw.endswith(_NO_STALL_ENDS[0]):
        return raw.count('"stalled":') == 1
    return raw.endswith(_NO_STALL_ENDS[1:]) and '"stalled":' not in raw


def material_member_change(previous: MemberLease | None, new: MemberLease, *, was_live: bool,
                           old_health: Any, new_health: Any) -> bool:
    """Whether a member Lease's new version can change the plan: a member first seen, a
    new session, duration or acknowledged epoch (any field but the renewal marker), a
    session that was expired to this observer and is renewed (it is live again: a
    membership change), or a change of its stalled partitions (``old_health`` and
    ``new_health`` are :func:`health_key` values). A plain renewal is not."""
    if previous is None or (new.session is not None and not was_live):
        return True
    if _fields(previous, "marker") != _fields(new, "marker"):
        return True
    return bool(old_health != new_health)


def material_lock_change(previous: Lock | None, new: Lock) -> bool:
    """Whether a partition Lease's new version can change the plan: anything but its
    resourceVersion and its committed position (holder, session, token, assignment mark,
    and whatever else the lock carries)."""
    if previous is None:
        return True
    quiet = ("resource_version", "position", "position_token")
    return _fields(previous, *quiet) != _fields(new, *quiet)


def _fields(obj: Any, *leave_out: str) -> dict[str, Any]:
    """A dataclass's fields but ``leave_out`` (``dataclasses.replace`` is ten times slower,
    and this runs on every watch event)."""
    out = dict(vars(obj))
    for name in leave_out:
        out.pop(name, None)
    return out


GroupKey = tuple[str, str]  # (namespace, group name)

@dataclass
class Cache:
    """The whole cache: pods by namespace, Leases by group."""

    pods: dict[str, dict[str, PodObservation]] = field(default_factory=dict)
    pod_bodies: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    groups: dict[GroupKey, GroupLeases] = field(default_factory=dict)
    known: set[GroupKey] = field(default_factory=set)  # the ConsumerGroups that exist
    # namespace -> StatefulSet name -> the ordinals it keeps (its spec as last seen)
    statefulsets: dict[str, dict[str, range]] = field(default_factory=dict)
    synced: bool = False

    def put_statefulset(self, namespace: str, body: Mapping[str, Any]) -> bool:
        """Store the ordinals a StatefulSet keeps (``spec.ordinals.start``, ``spec.replicas``);
        True if they changed."""
        spec = body.get("spec") or {}
        replicas = spec.get("replicas")
        start = (spec.get("ordinals") or {}).get("start") or 0
        kept = range(start, start + (1 if replicas is None else int(replicas)))
        name = str((body.get("metadata") or {}).get("name", ""))
        bucket = self.statefulsets.setdefault(namespace, {})
        changed = bucket.get(name) != kept
        bucket[name] = kept
        return changed

    def drop_statefulset(self, namespace: str, name: str) -> None:
        """A deleted StatefulSet keeps no pod: none of its names comes back."""
        self.statefulsets.setdefault(namespace, {})[name] = range(0)

    def kept_ordinals(self, namespace: str) -> dict[str, range]:
        """Per workload (``StatefulSet/<name>``, as pods name it), the ordinals kept."""
        return {f"StatefulSet/{name}": kept
                for name, kept in self.statefulsets.get(namespace, {}).items()}

    def put_pod(
        self, namespace: str, body: Mapping[str, Any]
    ) -> tuple[PodObservation | None, PodObservation]:
        """Store a pod; returns (previous observation, new one)."""
        obs = pod_observation(body)
        key = (namespace, obs.name)
        bucket = self.pods.setdefault(namespace, {})
        old = bucket.get(obs.name)
        seen = self.pod_bodies.get(key)
        if old is not None and seen is not None and not codec.not_older(dict(body), dict(seen)):
            return old, old
        bucket[obs.name] = obs
        self.pod_bodies[key] = {"metadata": {
            "resourceVersion": (body.get("metadata") or {}).get("resourceVersion")}}
        return old, obs

    def drop_pod(self, namespace: str, name: str) -> PodObservation | None:
        self.pod_bodies.pop((namespace, name), None)
        return self.pods.get(namespace, {}).pop(name, None)

    def group(self, key: GroupKey) -> GroupLeases:
        return self.groups.setdefault(key, GroupLeases())

    def group_added(self, key: GroupKey) -> bool:
        """The ConsumerGroup ``key`` exists; True if it was not known (its Leases are then
        to be listed: those seen before were ignored)."""
        if key in self.known:
            return False
        self.known.add(key)
        return True

    def group_removed(self, key: GroupKey) -> None:
        """The ConsumerGroup ``key`` is gone: its Leases are forgotten and ignored."""
        self.known.discard(key)
        self.groups.pop(key, None)

    def put_lease(self, namespace: str, body: Mapping[str, Any], now: float) -> GroupKey | None:
        """Store a kgroup Lease (and observe its session); returns its group's key when the
        change is material (``GroupLeases.put``: a plain renewal is not), else None (also
        when the Lease names no group or one that does not exist: nothing is kept)."""
        group = codec.group_of(dict(body))
        if not group or (namespace, group) not in self.known:
            return None
        key = (namespace, group)
        return key if self.group(key).put(dict(body), now) else None

    def drop_lease(self, namespace: str, body: Mapping[str, Any]) -> GroupKey | None:
        group = codec.group_of(dict(body))
        if not group or (namespace, group) not in self.groups:
            return None
        key = (namespace, group)
        self.group(key).drop(dict(body))
        return key
