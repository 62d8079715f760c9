"""Who replaces whom: restart grace by pod kind, and rollout-aware hand-over.

Rule of this module: it is pure (no clock, no I/O);
:class:`kgroup.core.operator.planner.GroupPlanner` feeds it the pods it last saw and the
current target.

Two decisions live here, both about *which pod's name can come back* and *which pod
replaces which*:

* **Restart grace** (:func:`restart_grace`). A departed member keeps its target while a
  pod may still come back under its name: a StatefulSet's pod (recreated under the same
  name: ``statefulSetRestartGraceSeconds``, default 30 s, or ``restartGraceSeconds`` if
  larger) unless its ordinal is outside the ordinals its StatefulSet now keeps (scaled
  down: that name does not come back, so its partitions are handed out at once; the
  StatefulSet's ``spec.replicas`` and ``spec.ordinals.start`` as the operator last saw
  them, unknown = the grace applies), a bare pod, or any pod that still exists and is
  not terminating (a container restarting in place) for ``restartGraceSeconds``
  (default 0). A pod of any other controller (a Deployment's ReplicaSet, a Job) that is
  terminating or deleted never comes back under its name, so its partitions are handed
  out at once, whatever the grace.
* **Replacements during a rollout** (:func:`replacements`). While the members of one
  Deployment span two revisions, a member of a revision that holds nothing waits (it is in
  the target with nothing) as long as members of another revision hold partitions; when
  one of those leaves, its partitions go whole to one waiting member. Each partition then
  moves once per rollout (old owner -> new owner) instead of twice (old owner -> the
  survivors at the leave -> a new pod at its join), and balance holds at the end because
  each new pod took exactly one leaver's share. StatefulSets are left to the restart grace
  (the new pod comes back under the old name and gets its own partitions back).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kgroup.crd_models import ConsumerGroupSpec

__all__ = ["Replacements", "replacements", "restart_grace", "statefulset_ordinal"]

_ORDINAL = re.compile(r"-(0|[1-9][0-9]*)$")


class PodObservation(Protocol):
    """What a rollout needs of a pod (the planner's ``PodObservation`` has it): the planner
    imports this module, this module imports nothing of the planner."""

    @property
    def name(self) -> str: ...
    @property
    def terminating(self) -> bool: ...
    @property
    def owner_kind(self) -> str: ...
    @property
    def workload(self) -> str: ...
    @property
    def revision(self) -> str: ...


def statefulset_ordinal(pod_name: str) -> int | None:
    """The ordinal of a StatefulSet's pod (``<statefulset>-<ordinal>``), None if none."""
    m = _ORDINAL.search(pod_name)
    return int(m.group(1)) if m else None


def restart_grace(spec: ConsumerGroupSpec, pod: PodObservation | None, *, present: bool,
                  kept_ordinals: Mapping[str, range] | None = None,
                  name: str | None = None) -> int:
    """Seconds a departed member keeps its target. ``pod``: the member's pod as last seen
    (None: never seen by this operator); ``present``: the pod still exists;
    ``kept_ordinals``: per StatefulSet workload (``StatefulSet/<name>``), the ordinals of
    the pods it keeps now (``range(start, start + replicas)``); a workload missing from it
    is unknown. ``name``: the member's name, for a pod this operator never saw (it
    departed before the operator started): a name ``<statefulset>-<ordinal>`` of a
    StatefulSet that keeps that ordinal is that StatefulSet's pod, and comes back."""
    if pod is None and name is not None and _kept_by_a_statefulset(name, kept_ordinals):
        return max(spec.restart_grace_seconds, spec.stateful_set_restart_grace_seconds)
    if pod is not None and pod.owner_kind == "StatefulSet":
        kept = (kept_ordinals or {}).get(pod.workload)
        ordinal = statefulset_ordinal(pod.name)
        if kept is not None and ordinal is not None and ordinal not in kept:
            return 0  # scaled down (or the StatefulSet deleted): the name never comes back
        return max(spec.restart_grace_seconds, spec.stateful_set_restart_grace_seconds)
    if pod is not None and pod.owner_kind and (not present or pod.terminating):
        return 0  # a controller's pod on its way out: the name never comes back
    return spec.restart_grace_seconds


def _kept_by_a_statefulset(name: str, kept_ordinals: Mapping[str, range] | None) -> bool:
    ordinal = statefulset_ordinal(name)
    if ordinal is None or not kept_ordinals:
        return False
    kept = kept_ordinals.get(f"StatefulSet/{name[:-len(str(ordinal)) - 1]}")
    return kept is not None and ordinal in kept


@dataclass(frozen=True)
class Replacements:
    """``waiting``: members that get nothing now (their Deployment's other revision still
    holds partitions). ``current``: the current target with each paired leaver's
    partitions moved to its replacement (the leaver's key removed). ``paired``:
    replacement -> the leaver it replaces."""

    waiting: frozenset[str] = frozenset()
    current: dict[str, list[int]] = field(default_factory=dict)
    paired: dict[str, str] = field(default_factory=dict)


def _rolls(pod: PodObservation | None) -> bool:
    return pod is not None and pod.workload.startswith("Deployment/") and bool(pod.revision)


def replacements(
    *,
    current: Mapping[str, Sequence[int]],
    members: set[str],
    pods: Mapping[str, PodObservation],
) -> Replacements:
    """Pair the Deployment pods that hold nothing with departed members of another revision
    of the same Deployment (see the module docstring). ``current``: the current target
    (may name departed members); ``members``: the effective members; ``pods``: the last
    observation of each member and departed member by name. Deterministic: candidates and
    leavers are paired in name order."""
    out = {m: list(ps) for m, ps in current.items()}
    leavers = sorted(m for m, ps in current.items()
                     if m not in members and ps and _rolls(pods.get(m)))
    holders = [m for m in members if current.get(m) and _rolls(pods.get(m))]
    waiting: set[str] = set()
    paired: dict[str, str] = {}
    for m in sorted(members):
        pod = pods.get(m)
        if current.get(m) or pod is None or not _rolls(pod):
            continue

        def other(x: str, pod: PodObservation = pod) -> bool:
            o = pods[x]
            return o.workload == pod.workload and o.revision != pod.revision

        leaver = next((x for x in leavers if x not in paired.values() and other(x)), None)
        if leaver is not None:
            paired[m] = leaver
            out[m] = out.pop(leaver)
        elif any(other(x) for x in holders):
            waiting.add(m)
    return Replacements(waiting=frozenset(waiting), current=out, paired=paired)
