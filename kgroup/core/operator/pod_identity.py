"""Which pod (uid) each member's assignment marks are for: pure, time passed in.

Members are pod names (the target, the Leases, the policy's ``pod-name``), but a name is
not a pod: a StatefulSet's pod re-created after a crash, or a bare pod someone creates
under a departed pod's name, has the same name and another uid. The operator's mark
carries the uid (``kgroup.dev/assigned-uid``) and the admission policy lets only the pod
whose pod-bound token carries that uid acquire the lock. This module decides, per member
name, the uid its marks name (docs/design.md, "The mark binds the pod's uid"):

* the name's *incumbent* is the pod the marks were last made for (first sight: the pod
  of that name seen now);
* while no pod of that name exists (a restart, within the restart grace), the marks keep
  the incumbent's uid: nobody can acquire, the partitions wait for the pod to return;
* a pod of that name with another uid is the incumbent's *successor* when it comes from
  the same workload (``PodObservation.workload``: the same StatefulSet, or a bare pod
  after a bare pod): the marks move to it at once (the restart grace's very case);
* any other pod of that name (a bare pod where a StatefulSet's pod was, another
  StatefulSet's) gets the marks only once the incumbent's restart grace, counted from
  when the incumbent was first seen gone, is over: within the grace the name is kept for
  the workload that owned it; after it, the pod is a member like any new one.

What this cannot know: the incumbent of a name before this operator process saw it (after
a restart the pod of that name seen first is adopted).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kgroup.core.operator.planner import PodObservation

__all__ = ["PodIdentities"]


@dataclass
class PodIdentities:
    """Per member name, the pod its marks are for (one operator process's memory)."""

    incumbents: dict[str, PodObservation] = field(default_factory=dict)
    vacated: dict[str, float] = field(default_factory=dict)  # name -> incumbent seen gone

    def resolve(
        self, names: Iterable[str], pods: Iterable[PodObservation], now: float,
        grace: Callable[[PodObservation], float],
    ) -> tuple[dict[str, str], float | None]:
        """The uid each of ``names`` is to be marked for (a name missing: no pod of that
        name known, the lock keeps the uid it has), and the earliest future moment a
        decision changes (a grace ending). ``grace(pod)``: the restart grace of a departed
        pod (``kgroup.core.rollout.restart_grace``)."""
        by_name: Mapping[str, PodObservation] = {p.name: p for p in pods if p.uid}
        wanted = set(names)
        for gone in set(self.incumbents) - wanted:
            self.incumbents.pop(gone, None)
            self.vacated.pop(gone, None)
        uids: dict[str, str] = {}
        later: float | None = None
        for name in sorted(wanted):
            now_pod = by_name.get(name)
            incumbent = self.incumbents.get(name)
            if incumbent is not None and (now_pod is None or now_pod.uid != incumbent.uid):
                self.vacated.setdefault(name, now)
            if now_pod is not None and (
                incumbent is None or now_pod.uid == incumbent.uid
                or now_pod.workload == incumbent.workload
                or now >= self.vacated[name] + grace(incumbent)
            ):
                self.incumbents[name] = incumbent = now_pod
                self.vacated.pop(name, None)
            if incumbent is None:
                continue
            uids[name] = incumbent.uid
            if now_pod is not None and now_pod.uid != incumbent.uid:
                end = self.vacated[name] + grace(incumbent)
                later = end if later is None else min(later, end)
        return uids, later
