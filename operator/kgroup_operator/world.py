"""What the operator has observed: pods, kgroup Leases and member sessions, in memory.

Rule: this cache is fed by watch events (kopf handlers) plus one initial listing at
start-up; nothing here polls. Each object keeps the newest ``resourceVersion`` seen, so a
late, stale event never overwrites a fresher read. Session liveness is judged by
:class:`kgroup.core.locks.SessionTracker` on *this process's* monotonic clock: a member
Lease's ``renewTime`` is only a renewal marker, never compared with our clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kgroup import constants as C
from kgroup.core.group import LockObservation, PodObservation
from kgroup.core.locks import SessionTracker
from kgroup.core.status import MemberLeaseObservation

GroupKey = tuple[str, str]  # (namespace, group name)


def newer(new_rv: str | None, old_rv: str | None) -> bool:
    """True unless `new_rv` is known to be older than `old_rv` (integers compared)."""
    if not new_rv or not old_rv:
        return True
    try:
        return int(new_rv) >= int(old_rv)
    except ValueError:
        return True


def pod_observation(body: Mapping[str, Any]) -> PodObservation:
    """``ready`` means the *app's* containers are ready, not the pod's Ready condition:
    the kgroup sidecar's readiness probe answers Ready only once the pod holds its target
    (``kgroup.core.readiness``), which needs the pod to be a member first; waiting for the
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
    return PodObservation(
        name=meta.get("name", ""),
        labels=dict(meta.get("labels") or {}),
        running=status.get("phase") == "Running",
        ready=ready,
        terminating=bool(meta.get("deletionTimestamp")),
    )


@dataclass(frozen=True)
class LeaseView:
    """The fields of a kgroup Lease the operator reads."""

    name: str
    role: str
    member: str | None
    partition: int | None
    holder: str | None
    session: str | None
    epoch_annotation: str | None
    marker: str
    duration: float | None
    resource_version: str | None


def lease_view(body: Mapping[str, Any]) -> LeaseView:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    partition: int | None = None
    try:
        partition = int(labels[C.LABEL_PARTITION])
    except (KeyError, ValueError):
        partition = None
    renew = spec.get("renewTime") or spec.get("renew_time")
    rv = meta.get("resourceVersion") or meta.get("resource_version")
    duration = spec.get("leaseDurationSeconds") or spec.get("lease_duration_seconds")
    holder = spec.get("holderIdentity") or spec.get("holder_identity")
    return LeaseView(
        name=meta.get("name", ""),
        role=labels.get(C.LABEL_ROLE, ""),
        member=labels.get(C.LABEL_MEMBER) or holder,
        partition=partition,
        holder=holder,
        session=annotations.get(C.ANNOTATION_SESSION),
        epoch_annotation=annotations.get(C.ANNOTATION_EPOCH),
        marker=str(renew or rv or ""),
        duration=float(duration) if duration else None,
        resource_version=rv,
    )


@dataclass
class GroupLeases:
    """Every kgroup Lease of one group, and the sessions seen on its member Leases."""

    members: dict[str, LeaseView] = field(default_factory=dict)  # by member id
    partitions: dict[int, LeaseView] = field(default_factory=dict)  # by partition
    tracker: SessionTracker = field(default_factory=SessionTracker)

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

    def locks(self) -> list[LockObservation]:
        return [LockObservation(p, v.holder, v.session) for p, v in self.partitions.items()]

    def member_observations(self) -> dict[str, MemberLeaseObservation]:
        return {
            m: MemberLeaseObservation(m, v.session, v.epoch_annotation)
            for m, v in self.members.items()
        }


@dataclass
class World:
    """The whole cache: pods by namespace, Leases by group."""

    pods: dict[str, dict[str, PodObservation]] = field(default_factory=dict)
    pod_versions: dict[tuple[str, str], str | None] = field(default_factory=dict)
    groups: dict[GroupKey, GroupLeases] = field(default_factory=dict)
    synced: bool = False

    def put_pod(
        self, namespace: str, body: Mapping[str, Any]
    ) -> tuple[PodObservation | None, PodObservation]:
        """Store a pod; returns (previous observation, new one)."""
        obs = pod_observation(body)
        rv = (body.get("metadata") or {}).get("resourceVersion")
        key = (namespace, obs.name)
        bucket = self.pods.setdefault(namespace, {})
        old = bucket.get(obs.name)
        if old is not None and not newer(rv, self.pod_versions.get(key)):
            return old, old
        bucket[obs.name] = obs
        self.pod_versions[key] = rv
        return old, obs

    def drop_pod(self, namespace: str, name: str) -> PodObservation | None:
        self.pod_versions.pop((namespace, name), None)
        return self.pods.get(namespace, {}).pop(name, None)

    def group(self, key: GroupKey) -> GroupLeases:
        return self.groups.setdefault(key, GroupLeases())

    def put_lease(self, namespace: str, body: Mapping[str, Any], now: float) -> GroupKey | None:
        """Store a kgroup Lease (and observe its session); returns its group's key."""
        labels = (body.get("metadata") or {}).get("labels") or {}
        group = labels.get(C.LABEL_GROUP)
        if not group:
            return None
        key = (namespace, group)
        view = lease_view(body)
        leases = self.group(key)
        if view.role == C.ROLE_MEMBER and view.member:
            old = leases.members.get(view.member)
            if old is not None and not newer(view.resource_version, old.resource_version):
                return key
            leases.members[view.member] = view
            if view.session:
                leases.tracker.observe(
                    view.member, view.session, view.marker, view.duration or 15.0, now
                )
        elif view.role == C.ROLE_PARTITION and view.partition is not None:
            oldp = leases.partitions.get(view.partition)
            if oldp is not None and not newer(view.resource_version, oldp.resource_version):
                return key
            leases.partitions[view.partition] = view
        return key

    def drop_lease(self, namespace: str, body: Mapping[str, Any]) -> GroupKey | None:
        labels = (body.get("metadata") or {}).get("labels") or {}
        group = labels.get(C.LABEL_GROUP)
        if not group:
            return None
        key = (namespace, group)
        view = lease_view(body)
        leases = self.group(key)
        if view.role == C.ROLE_MEMBER and view.member:
            current = leases.members.get(view.member)
            if current is not None and current.name == view.name:
                del leases.members[view.member]
                leases.tracker.forget(view.member)
        elif view.role == C.ROLE_PARTITION and view.partition is not None:
            leases.partitions.pop(view.partition, None)
        return key
