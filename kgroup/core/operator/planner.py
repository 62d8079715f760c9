"""The operator's decisions: who is a member, when to rebalance, and what the target is.

Rule of this module: it is pure. It reads no clock (every time is a ``now`` in seconds on
the caller's monotonic clock), does no I/O and imports neither kopf nor the Kubernetes
client. The operator feeds it what it observed and writes back what it returns; a
deterministic simulation can feed it the same way.

The decisions, in the order the operator takes them:

1. **Membership** (:func:`current_members`): pods matching the selector that are
   running, ready and not terminating, *and* whose member Lease carries a session the
   observer still considers live (that liveness is measured by
   :class:`kgroup.core.locks.SessionTracker` on the operator's own clock; this module
   only receives its verdict as ``live_sessions``).
2. **Stabilisation** (:class:`GroupPlanner`, the rule in :func:`window_end`): the first
   join after no member joined for ``stabilizationWindowSeconds`` is acted upon at once
   (the leading edge); joins that follow within the window are batched until
   membership has been quiet for the window, or at the latest
   ``stabilizationMaxDelaySeconds`` after the first pending change, so a burst of joins
   costs one or two rebalances and constant churn cannot starve the group. Two kinds of
   change never wait for the window: a departed member that held partitions (they would
   wait for an owner; unless its session is live and its pod merely turned unready: that
   waits the window, so an app container's restart moves nothing) and a change that moves
   nothing (a rollout's new pod joining to wait, a member with nothing leaving). A member
   that left (pod gone or session expired) keeps its target while its name may come back
   (:func:`kgroup.core.operator.rollout.restart_grace`): a pod that comes back under the same name
   in that time finds its partitions untouched and no epoch bump happened.
3. **Target** (:meth:`GroupPlanner.plan`): the assignor computes the next target from
   the current one and the live lock holders; during a Deployment's rollout, a departed
   old pod's partitions go whole to a new pod (:func:`kgroup.core.operator.rollout.replacements`).
   The epoch is bumped *only* when the target changed; an unchanged target is never
   rewritten. A paused group's target is frozen. A group with no target yet (a fresh
   group, or one migrated from an older operator) is seeded from the live lock holders,
   so nothing that is held moves.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kgroup.core.operator.assignors import Assignee, get_assignor, moved_partitions
from kgroup.core.operator.load_balance import (
    LoadBalance,
    busiest_ratio,
    effective_loads,
    plan_load_balance,
)
from kgroup.core.operator.rollout import Replacements, replacements, restart_grace
from kgroup.crd_models import ConsumerGroupSpec, LabelSelector

__all__ = [
    "Decision",
    "GroupPlanner",
    "GroupTarget",
    "LockObservation",
    "PodObservation",
    "balance_config",
    "correct_hand_edit",
    "current_members",
    "eligible_pods",
    "live_holders",
    "normalize_target",
    "rebalance_reason",
    "window_end",
]

GroupTarget = dict[str, list[int]]
"""The group's target: member id (pod name) -> the partitions targeted to it, ascending.
One member's share as that member sees it is :class:`kgroup.core.member.view.Target`."""


@dataclass(frozen=True)
class PodObservation:
    """What the operator needs to know about one pod.

    ``owner_kind``: the kind of its controller (``ReplicaSet``, ``StatefulSet``, ...; ""
    for a bare pod). ``workload``: what a rollout replaces pods of, ``Deployment/<name>``
    for a Deployment's pods (whatever their ReplicaSet), else ``<kind>/<name>`` of the
    controller ("" for a bare pod). ``revision``: the pod template's revision
    (``pod-template-hash`` or ``controller-revision-hash``; "" when unknown). ``uid``: the
    pod object's uid ("" when unknown), what the assignment mark binds
    (:mod:`kgroup.core.operator.pod_identity`). ``sidecar``: the pod has a kgroup sidecar
    container (``kgroup.core.operator.status.pods_without_sidecar``).
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    running: bool = True
    ready: bool = True
    terminating: bool = False
    owner_kind: str = ""
    workload: str = ""
    revision: str = ""
    uid: str = ""
    sidecar: bool = True


@dataclass(frozen=True)
class LockObservation:
    """One partition Lease as last seen: its holder and the holder's session id."""

    partition: int
    holder: str | None
    session: str | None


def eligible_pods(selector: LabelSelector, pods: Iterable[PodObservation]) -> set[str]:
    """Names of pods matching `selector` that are running, ready and not terminating."""
    return {
        p.name
        for p in pods
        if p.running and p.ready and not p.terminating and selector.matches(dict(p.labels))
    }


def current_members(
    *,
    selector: LabelSelector,
    pods: Iterable[PodObservation],
    live_sessions: Mapping[str, str],
) -> set[str]:
    """The group's members now: eligible pods whose member session is live.

    `live_sessions` maps a member id to the session id the observer considers live.
    """
    return {name for name in eligible_pods(selector, pods) if name in live_sessions}


def live_holders(
    locks: Iterable[LockObservation], live_sessions: Mapping[str, str]
) -> dict[int, str]:
    """Partition -> holder, for locks whose holder's live session is the one on the lock.

    A lock whose holder has no live session, or a live session with another id, is free
    (docs/protocol.md, "A lock is held while ...").
    """
    out: dict[int, str] = {}
    for lock in locks:
        if lock.holder and lock.session and live_sessions.get(lock.holder) == lock.session:
            out[lock.partition] = lock.holder
    return out


def normalize_target(target: Mapping[str, Sequence[int]]) -> GroupTarget:
    """A canonical copy: every list sorted and de-duplicated, keys kept (also empty ones)."""
    return {m: sorted(set(ps)) for m, ps in sorted(target.items())}


def _covered(target: Mapping[str, Sequence[int]]) -> set[int]:
    return {p for ps in target.values() for p in ps}


def _names(prefix: str, names: Iterable[str]) -> str:
    ordered = sorted(names)
    noun = "member" if len(ordered) == 1 else "members"
    return f"{noun} {prefix}: {', '.join(ordered)}"


def rebalance_reason(
    *,
    before: Mapping[str, Sequence[int]],
    after: Mapping[str, Sequence[int]],
    partitions: int,
    seeded: bool = False,
    assignor: str = "",
) -> str:
    """A human sentence for why the target changed, e.g. ``member joined: x``."""
    parts: list[str] = []
    if seeded:
        parts.append("seeded from current lock holders")
    joined = set(after) - set(before)
    left = set(before) - set(after)
    if joined and not seeded:
        parts.append(_names("joined", joined))
    if left:
        parts.append(_names("left", left))
    old = len(_covered(before))
    if before and old < partitions:
        parts.append(f"partitions grew {old}\u2192{partitions}")
    if not parts and assignor:
        parts.append(f"spec changed: assignor {assignor}")
    if not parts:
        parts.append("rebalanced")
    return "; ".join(parts)


@dataclass(frozen=True)
class Decision:
    """What :meth:`GroupPlanner.plan` decided.

    ``target`` is None when the target stays as it is (nothing to write for it).
    ``next_check`` is when (on the caller's clock) the planner wants to be asked again
    even if nothing is observed in between (end of a window, a grace period), or None.
    """

    target: GroupTarget | None = None
    epoch: int = 0
    reason: str = ""
    moved: int = 0
    next_check: float | None = None


@dataclass
class GroupPlanner:
    """Per-group memory of the stabiliser and of departed members; one per group.

    The planner remembers only timings (when membership last changed, when a change first
    became pending, when each member left) and the pods it last saw (a departed member's
    pod says whether its name can come back and which revision it ran). The target and
    epoch themselves always come from the group's status, so an operator restart loses
    nothing that matters: at worst a pending join waits one more window.
    """

    _observed: frozenset[str] | None = None
    _changed_at: float = 0.0
    _pending_since: float | None = None
    _pending_quiet: float = 0.0  # how long no member had joined when the change began
    _joined_at: float = 0.0  # when (caller's clock) membership last gained a member
    _join_quiet: float = 0.0  # how long no member had joined before that
    _departed: dict[str, float] = field(default_factory=dict)
    _pods: dict[str, PodObservation] = field(default_factory=dict)  # last seen, by name
    _present: frozenset[str] | None = None  # names of the pods that exist (None: unknown)
    # partition -> when (caller's clock) its target owner last changed: the dwell time of
    # load balancing (lost on a restart: at worst one early move)
    _last_moved: dict[int, float] = field(default_factory=dict)

    @property
    def last_membership_change(self) -> float:
        """When (caller's clock) the effective membership was last seen to change."""
        return self._changed_at

    def plan(
        self,
        *,
        spec: ConsumerGroupSpec,
        target: Mapping[str, Sequence[int]],
        epoch: int,
        members: set[str],
        holders: Mapping[int, str],
        now: float,
        spec_changed: bool = False,
        pods: Iterable[PodObservation] | None = None,
        sessions: Collection[str] | None = None,
        kept_ordinals: Mapping[str, range] | None = None,
        loads: Mapping[int, float] | None = None,
        load_noise: float = 0.0,
    ) -> Decision:
        """Decide whether the target changes now; see the module docstring.

        `spec_changed`: the spec was edited since the last call (not merely first seen).
        Then a target that is not the assignor's fixed point (say, after ``assignor``
        changed from sticky to range) is recomputed at once. It is never set on first
        sight, so an operator restart recomputes nothing that membership does not call for.
        `pods`: every pod observed now (None: unknown; then no pod's kind or revision is
        known and ``restartGraceSeconds`` applies to every departed member). `sessions`:
        the members whose session is live (None: unknown). `kept_ordinals`: the ordinals
        each StatefulSet keeps now (see :func:`kgroup.core.operator.rollout.restart_grace`; None:
        unknown). `loads`: per partition, events/s as reported (``spec.balance.mode`` load
        only; see :meth:`_load_step`); `load_noise`: how far they may be off (widens the
        balance's dead zone: :class:`~kgroup.core.operator.load_balance.LoadBalance`).
        A departed member whose
        session is live and whose pod is still there, not terminating, only turned
        unready (its app container restarting, a flapping probe): its departure waits
        for the window, as joins do, rather than moving its partitions at once.
        """
        current = normalize_target(target)
        self._see(pods, current)
        effective, grace_deadline = self._effective_members(spec, current, members, now,
                                                            kept_ordinals)
        quiet = self._see_membership(effective, now)
        if spec.paused:
            self._pending_since = None
            return Decision(epoch=epoch, next_check=grace_deadline)

        membership_pending = effective != set(current)
        covered = _covered(current)
        structure_pending = bool(effective) and (
            covered != set(range(spec.partitions)) or spec_changed
        )
        if not membership_pending and not structure_pending:
            self._pending_since = None
            if spec.balance.mode == "load":
                return self._load_step(spec, current, epoch, holders, loads or {}, now,
                                       grace_deadline, load_noise)
            return Decision(epoch=epoch, next_check=grace_deadline)

        rollout = replacements(current=current, members=effective, pods=self._pods)
        if membership_pending:
            due = self._window_due(spec, current, effective, rollout, sessions, quiet, now)
            if due is not None:
                return Decision(epoch=epoch, next_check=_earliest(due, grace_deadline))

        after = self._assign(spec, effective, rollout, holders, loads or {}, now, load_noise)
        self._pending_since = None
        if after == current:
            return Decision(epoch=epoch, next_check=grace_deadline)
        self._stamp(current, after, now)
        return _new_target(spec, current, after, epoch=epoch, holders=holders,
                           spec_changed=spec_changed, next_check=grace_deadline)

    def _see_membership(self, effective: set[str], now: float) -> float:
        """Note a change of the effective membership (when it changed, when it last gained
        a member); returns how long no member has joined (at a join: how long none had
        before it)."""
        if self._observed is None or effective != self._observed:
            if self._observed is None or effective - self._observed:  # a join
                self._join_quiet = 0.0 if self._observed is None else now - self._joined_at
                self._joined_at = now
            self._observed = frozenset(effective)
            self._changed_at = now
        return self._join_quiet if self._joined_at == now else now - self._joined_at

    def _window_due(self, spec: ConsumerGroupSpec, current: GroupTarget, effective: set[str],
                    rollout: Replacements, sessions: Collection[str] | None, quiet: float,
                    now: float) -> float | None:
        """A membership change pending (noted from now on): the end of its stabilisation
        window while the change waits for it, None when it is planned now (a departed
        member held partitions, or only a rollout's waiting pods joined)."""
        if self._pending_since is None:
            self._pending_since = now
            self._pending_quiet = quiet
        left = set(current) - effective
        joined = effective - set(current)
        flaps = {m for m in left if self._flapping(m, sessions)}
        urgent = any(current[m] for m in left - flaps) or (
            joined <= rollout.waiting and not flaps)
        due = window_end(spec, changed_at=self._changed_at,
                         pending_since=self._pending_since,
                         quiet_before=0.0 if flaps else self._pending_quiet)
        if not urgent and now < due:
            return due
        return None

    def _assign(self, spec: ConsumerGroupSpec, effective: set[str], rollout: Replacements,
                holders: Mapping[int, str], loads: Mapping[int, float], now: float,
                noise: float = 0.0) -> GroupTarget:
        """The next target by the group's assignor (or load-aware planning); a rollout's
        waiting members get nothing."""
        ids = [Assignee(id=m) for m in sorted(effective - rollout.waiting)]
        if spec.balance.mode == "load":
            assigned = plan_load_balance(spec.partitions, ids, rollout.current, dict(holders),
                                         loads, self._last_moved, now,
                                         balance_config(spec, noise)).target
        else:
            assigned = get_assignor(spec.assignor).assign(spec.partitions, ids,
                                                          rollout.current, dict(holders))
        return normalize_target({**assigned, **{m: [] for m in rollout.waiting}})

    def _load_step(self, spec: ConsumerGroupSpec, current: GroupTarget, epoch: int,
                   holders: Mapping[int, str], loads: Mapping[int, float], now: float,
                   next_check: float | None, noise: float = 0.0) -> Decision:
        """Membership settled, ``spec.balance.mode`` load: move partitions for load
        (:func:`~kgroup.core.operator.load_balance.plan_load_balance`, with its hysteresis
        and dwell time), only once every partition is held by its target member (a
        hand-off in flight finishes first; its moves are not judged on half-moved load).
        Members with an empty target (a rollout's new pod waiting) stay as they are."""
        none = Decision(epoch=epoch, next_check=next_check)
        if any(holders.get(p) != m for m, ps in current.items() for p in ps):
            return none
        ids = [Assignee(id=m) for m in sorted(current) if current[m]]
        if not ids:
            return none
        result = plan_load_balance(spec.partitions, ids, current, dict(holders), loads,
                                   self._last_moved, now, balance_config(spec, noise))
        after = normalize_target({**{m: [] for m in current}, **result.target})
        if not result.moved or after == current:
            return none
        self._stamp(current, after, now)
        load = effective_loads(spec.partitions, loads)
        return Decision(
            target=after, epoch=epoch + 1, moved=moved_partitions(current, after),
            reason=(f"load: busiest member {busiest_ratio(current, load, ids):.2f}x the mean, "
                    f"{busiest_ratio(after, load, ids):.2f}x after"),
            next_check=next_check)

    def _stamp(self, before: GroupTarget, after: GroupTarget, now: float) -> None:
        """Remember when each partition whose target owner changed moved (the dwell); a
        partition's first owner is no move (a new group balances its load at once)."""
        owner = {p: m for m, ps in before.items() for p in ps}
        for m, ps in after.items():
            for p in ps:
                if owner.get(p, m) != m:
                    self._last_moved[p] = now

    def _flapping(self, member: str, sessions: Collection[str] | None) -> bool:
        """Departed with its session live and its pod there, not terminating: unready."""
        pod = self._pods.get(member)
        return (sessions is not None and member in sessions and pod is not None
                and not pod.terminating and self._present is not None
                and member in self._present)

    def _see(self, pods: Iterable[PodObservation] | None, current: GroupTarget) -> None:
        """Remember the pods seen now, and the last sight of departed targeted members."""
        if pods is None:
            return
        seen = {p.name: p for p in pods}
        self._present = frozenset(seen)
        keep = {m: p for m, p in self._pods.items() if m in current and m not in seen}
        self._pods = {**keep, **seen}

    def _effective_members(
        self, spec: ConsumerGroupSpec, current: GroupTarget, members: set[str], now: float,
        kept_ordinals: Mapping[str, range] | None = None,
    ) -> tuple[set[str], float | None]:
        """Members plus departed targeted members still within their restart grace."""
        for m in members:
            self._departed.pop(m, None)
        for m in current:
            if m not in members:
                self._departed.setdefault(m, now)
        for m in list(self._departed):
            if m not in current:
                del self._departed[m]
        graced: set[str] = set()
        deadline: float | None = None
        for m, left_at in self._departed.items():
            present = self._present is None or m in self._present
            grace = restart_grace(spec, self._pods.get(m), present=present,
                                  kept_ordinals=kept_ordinals, name=m)
            if grace > 0 and now < left_at + grace:
                graced.add(m)
                deadline = _earliest(deadline, left_at + grace)
        return members | graced, deadline


def balance_config(spec: ConsumerGroupSpec, noise: float = 0.0) -> LoadBalance:
    """The knobs of load balancing from ``spec.balance``, and the loads' measured
    ``noise`` (:class:`~kgroup.core.operator.load_balance.LoadBalance`)."""
    b = spec.balance
    return LoadBalance(tolerance=b.tolerance, margin=b.margin,
                       dwell_seconds=float(b.dwell_seconds), count_slack=b.count_slack,
                       noise=noise)


def _new_target(spec: ConsumerGroupSpec, current: GroupTarget, after: GroupTarget, *, epoch: int,
                holders: Mapping[int, str], spec_changed: bool,
                next_check: float | None) -> Decision:
    """The decision to write ``after`` as the next epoch's target: why, and how many
    partitions move (from the lock holders when the first target is seeded from them)."""
    seeded = not current and epoch == 0 and bool(holders)
    before: Mapping[str, Sequence[int]] = current
    if seeded:
        before = _by_member(holders)
    return Decision(
        target=after,
        epoch=epoch + 1,
        reason=rebalance_reason(
            before=current,
            after=after,
            partitions=spec.partitions,
            seeded=seeded,
            assignor=spec.assignor if spec_changed else "",
        ),
        moved=moved_partitions(before, after),
        next_check=next_check,
    )


def window_end(
    spec: ConsumerGroupSpec, *, changed_at: float, pending_since: float, quiet_before: float
) -> float:
    """The stabilisation window: when (caller's clock) a pending membership change may
    become a new target. ``changed_at``: the membership last changed; ``pending_since``:
    the membership first differed from the target's members; ``quiet_before``: how long no
    member had joined when that pending change began. A change after a window without a
    join is due at once (the leading edge: a lone join is not delayed, also right after a
    leave, which acted at once and batches nothing); otherwise the window restarts with
    every change (``stabilizationWindowSeconds``, so a burst of joins is batched) but never
    delays a pending change more than ``stabilizationMaxDelaySeconds``.
    The one place that says so (:meth:`GroupPlanner.plan` adds the changes that never
    wait: a departure with partitions, a change that moves nothing)."""
    window = spec.stabilization_window_seconds
    if quiet_before >= window:
        return pending_since
    return min(changed_at + window, pending_since + spec.stabilization_max_delay_seconds)


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _by_member(holders: Mapping[int, str]) -> GroupTarget:
    out: GroupTarget = {}
    for p, m in sorted(holders.items()):
        out.setdefault(m, []).append(p)
    return out


def correct_hand_edit(
    *,
    written_target: Mapping[str, Sequence[int]],
    written_epoch: int,
    seen_target: Mapping[str, Sequence[int]],
    seen_epoch: int,
) -> Decision | None:
    """If someone else changed the target or epoch we wrote, the correction to write.

    Members may already have acted on the edited target under its epoch, so the
    correction restores our target under a *new* epoch above both, which makes every
    member re-converge and re-acknowledge. None when the status still says what we wrote.
    """
    if normalize_target(written_target) == normalize_target(seen_target) and (
        written_epoch == seen_epoch
    ):
        return None
    return Decision(
        target=normalize_target(written_target),
        epoch=max(written_epoch, seen_epoch) + 1,
        reason="status edited by hand; target restored",
        moved=moved_partitions(normalize_target(seen_target), normalize_target(written_target)),
    )
