"""When a worker pod is Ready: the rule behind the sidecar's ``GET /readyz``.

Rule of this module: it is pure (no clock, no I/O); the sidecar feeds it its app view, the
group's target as it last saw it, and whether it is stopping.

A pod is Ready once **its app has taken up its whole target**: the sidecar holds the
target, has acknowledged the current epoch, and the app has been served every partition
the pod holds and has called again since (``kgroup.core.member.app_presence``). So a
Deployment's rollout (maxSurge / maxUnavailable) is paced by consumption, not by
ownership alone: a new pod counts as available only when its app works on what the
operator gave it, and an old pod is taken down only then. In order, the pod is *not*
Ready while:

1. it is stopping (SIGTERM: it hands everything over);
2. its app has not asked for its assignment yet (it is still starting: the sidecar opens
   no session before), or has stopped taking part (silent past the app timeout);
3. it has no live session, or is fenced (its view is empty);
4. the group has no target yet (no epoch, or epoch 0: the operator has not computed one);
5. it is not a member of the current target: the operator has not admitted it yet. The
   operator's membership therefore must not wait for the pod's Ready condition (that
   would never come); it reads the app containers' readiness instead
   (``kgroup_operator.world.pod_observation``);
6. it still drains a revoked partition, or holds less or more than its target;
7. its app has not taken up every partition it holds;
8. it has not yet written the target's epoch as acknowledged on its member Lease, and
   that epoch changed its partitions. An epoch that leaves this pod's partitions as they
   were at its last acknowledgement (another member joined or left) keeps it Ready while
   its acknowledgement is on its way: with the chart's ``failureThreshold: 1``, every
   rebalance would otherwise turn every pod of the group unready for a probe period,
   and a Deployment counts an unready old pod as unavailable during a rollout.

The first pod of a group goes 2 → 5 → 6 → 7 → Ready as its app asks, the operator admits
it, it takes the locks and its app takes them up. A member whose target is empty (more
pods than partitions) is Ready as soon as it has acknowledged the epoch (and its app takes
part): it holds its whole, empty, target.
"""

from __future__ import annotations

from dataclasses import dataclass

from kgroup.core.assignment import View
from kgroup.core.member.app_presence import AppPresence
from kgroup.core.member.view import Target

__all__ = ["Readiness", "readiness"]


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str  # why not Ready (or "holds its target of epoch E" when Ready)


def readiness(view: View, target: Target | None, *, member: bool, stopping: bool,
              acked_partitions: frozenset[int] | None = None,
              app: AppPresence | None = None, now: float = 0.0) -> Readiness:
    """Is this pod Ready? ``member``: the pod's name is a key of the target assignment
    (every member is one, with an empty range when it gets no partition).
    ``acked_partitions``: the target partitions of the epoch this session last wrote as
    acknowledged (None: none yet; :attr:`kgroup.core.member.reconcile.Member.acked_partitions`).
    ``app``: the app's part, at ``now`` (None, or a presence without timeout: no app gate)."""
    if stopping:
        return Readiness(False, "stopping: handing its partitions over")
    if app is not None and app.gated and not app.joined:
        return Readiness(False, "waiting for its app to ask for its assignment "
                                "(GET /v1/assignment)")
    if app is not None and not app.taking_part(now):
        return Readiness(False, f"its app has not called the sidecar for {app.timeout:g}s "
                                "or more: left the group until it calls again")
    if view.session is None:
        return Readiness(False, "no session yet")
    if view.fenced:
        return Readiness(False, "fenced: its session lapsed")
    if target is None or target.epoch <= 0:
        return Readiness(False, "the group has no target yet")
    if not member:
        return Readiness(False, f"not a member of epoch {target.epoch} yet")
    active = {p.partition for p in view.partitions if p.state == "active"}
    revoking = len(view.partitions) - len(active)
    if revoking:
        return Readiness(False, f"draining {revoking} revoked partition(s)")
    extra = len(active - target.partitions)
    if extra:
        return Readiness(False, f"holds {extra} partition(s) outside its target")
    if active != target.partitions:
        return Readiness(False, f"holds {len(active)} of {len(target.partitions)} "
                                "targeted partition(s)")
    if app is not None:
        waiting = app.not_taken_up({p.partition: p.token for p in view.partitions})
        if waiting:
            return Readiness(False, f"its app has not taken up {len(waiting)} of its "
                                    f"{len(view.partitions)} partition(s) yet")
    if view.acked_epoch != target.epoch and acked_partitions != target.partitions:
        return Readiness(False, f"epoch {target.epoch} not acknowledged yet")
    if view.acked_epoch != target.epoch:
        return Readiness(True, f"holds its target of epoch {target.epoch} (its partitions "
                               f"as at epoch {view.acked_epoch}, acknowledgement on its way)")
    return Readiness(True, f"holds its target of epoch {target.epoch}")
