"""What the operator has observed: pods and every group's kgroup Leases, in memory.

Rule: this cache is fed by watch events (kopf handlers) plus one initial listing at
start-up; nothing here polls. It holds the Leases of ConsumerGroups that exist only
(``known``): a worker may create member Leases naming any group, and thousands naming
groups that do not exist must not grow the one operator's memory; the Leases of a group
that appears later are listed when it does (``GroupLoops.group_seen``). The Leases of
each group live in a :class:`kgroup.core.operator.lease_cache.GroupLeases` (shared with the
simulation); pods keep the newest ``resourceVersion`` seen, so a late, stale event never
overwrites a fresher read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kgroup.core import lease_codec as codec
from kgroup.core.operator.lease_cache import GroupLeases, pod_observation
from kgroup.core.operator.planner import PodObservation

GroupKey = tuple[str, str]  # (namespace, group name)

__all__ = ["Cache", "GroupKey", "GroupLeases", "pod_observation"]


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
