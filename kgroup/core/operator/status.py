"""Status aggregation: from what the operator observed to the ConsumerGroup's status.

Rule of this module: pure, like :mod:`kgroup.core.operator.planner` — no clock (``now`` is the
caller's monotonic seconds, ``wall`` the timestamp to write), no I/O, no Kubernetes
imports. Aggregating the same observations twice gives an identical status, which is what
lets the operator skip a status write when nothing changed (quiet steady state).

Phase, first match wins:

- ``Paused``: ``spec.paused``.
- ``Pending``: the group has no member.
- ``Degraded``: partitions stayed unowned for longer than drain timeout + lease duration
  after the last change (the liveness promise's outer bound), or a problem such as a
  malformed member annotation.
- ``Rebalancing``: a targeted member has not acknowledged the epoch, a targeted
  partition is not yet owned by its target member, or the membership differs from the
  target's members (a change waiting for the stabilisation window).
- ``Stable``: otherwise.

Conditions follow the Kubernetes API conventions: ``reason`` is CamelCase, ``message``
is for people, and ``lastTransitionTime`` changes only when the condition's status does.
``Ready``, ``Rebalancing``, ``Degraded`` and ``Stalled`` describe the group; ``Reconciling``
and ``Stalled`` also follow the conventions kstatus reads (sigs.k8s.io/cli-utils,
pkg/kstatus/status), so GitOps tools (Flux, kpt, Argo CD through
``gitops/argocd/kgroup.dev/ConsumerGroup/health.lua``) read the phase from them:

- ``Stalled=True`` (kstatus: Failed): partitions reported stalled by their owner's app,
  or the group is degraded while it has members (phase ``Degraded``, or a paused group
  with the same problems): partitions unowned past the deadline, a malformed member
  annotation, a lock's name taken. A group without members is waiting, not failed: it
  stays ``Stalled=False`` (reason ``NoMembers``) whatever its Degraded condition says,
  unless pods labelled with it run without the sidecar (reason ``SidecarMissing``: the
  members it waits for are those pods, and they never join until replaced).
- ``Reconciling=True`` (kstatus: InProgress): exactly the phase ``Rebalancing``, so never
  together with ``Stalled=True`` (kstatus takes the first of the two it meets in the
  list); its reason and message are the Rebalancing condition's.
- otherwise ``Ready`` decides: True is Current, False is InProgress (Pending, or
  partitions briefly unowned).

``SidecarMissing`` (True: reason ``PodsWithoutSidecar``, naming the pods, at most
five; ``status.sidecarMissing`` counts them and lists the first ten by name): running
pods labelled ``kgroup.dev/group=<group>`` that have no kgroup sidecar container. It
changes neither the phase nor Ready: the members work on, partitions all owned, and the
pod is a lost replica, not a failure of the group (Argo CD reads it as Degraded;
kstatus has no word for a working group short of a replica, docs/design.md).

``status.observedGeneration`` is the spec generation the status was computed from:
kstatus reads a status whose ``observedGeneration`` lags ``metadata.generation`` as
InProgress.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from kgroup import constants as C
from kgroup.core.health import parse_summary
from kgroup.core.operator.planner import PodObservation
from kgroup.core.ranges import format_ranges
from kgroup.crd_models import (
    SIDECAR_MISSING_LISTED,
    Condition,
    ConsumerGroupSpec,
    ConsumerGroupStatus,
    LastRebalance,
    MemberStatus,
    Phase,
    SidecarMissingStatus,
)

_Verdict = tuple[Literal["True", "False"], str, str]

__all__ = [
    "MemberLeaseObservation",
    "Problem",
    "aggregate_status",
    "format_timestamp",
    "parse_acknowledged_epoch",
    "parse_timestamp",
    "pods_without_sidecar",
    "stalled_partitions",
]


@dataclass(frozen=True)
class MemberLeaseObservation:
    """One member Lease as last seen: its session id and raw ``kgroup.dev/epoch``."""

    member: str
    session: str | None
    epoch_annotation: str | None
    health_annotation: str | None = None  # raw kgroup.dev/health (kgroup.core.health)
    load_annotation: str | None = None  # raw kgroup.dev/load (kgroup.core.load)
    # the load annotations of the last window with their renewal counts, oldest first
    # (kgroup.core.operator.load_window); empty: only ``load_annotation`` counts
    load_samples: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Problem:
    """Something wrong in the observed state, reported as an Event and a condition."""

    reason: str  # CamelCase, e.g. "BadMemberAnnotation"
    message: str


def parse_acknowledged_epoch(member: str, raw: str | None) -> tuple[int, Problem | None]:
    """The epoch a member acknowledged; absent is 0, malformed is 0 plus a problem."""
    if raw is None or raw == "":
        return 0, None
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if value < 0:
        return 0, Problem(
            "BadMemberAnnotation",
            f"member {member}: kgroup.dev/epoch={raw!r} is not a non-negative integer",
        )
    return value, None


def format_timestamp(wall: datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, second precision (metav1.Time)."""
    return wall.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def stalled_partitions(
    member_leases: Mapping[str, MemberLeaseObservation],
    holders: Mapping[int, str],
    partitions: int,
) -> tuple[list[int], str]:
    """The partitions reported stalled by the member that holds them now, and a message
    naming them with each reporting member's reason (``kgroup.core.health``)."""
    stalled: list[int] = []
    reasons: list[str] = []
    for name in sorted(member_leases):
        summary = parse_summary(member_leases[name].health_annotation, partitions=partitions)
        if summary is None:
            continue
        mine = [p for p in summary.stalled if holders.get(p) == name]
        if mine:
            stalled.extend(mine)
            reasons.append(f"{name} ({format_ranges(mine)}): {summary.reason or 'stalled'}")
    if not stalled:
        return [], ""
    more = " ..." if len(reasons) > 3 else ""
    return sorted(stalled), (f"{len(stalled)} partitions stalled: {format_ranges(stalled)}; "
                             + "; ".join(reasons[:3]) + more)


def pods_without_sidecar(group: str, pods: Iterable[PodObservation]) -> list[str]:
    """The names, sorted, of the pods labelled ``kgroup.dev/group=<group>`` that run
    (phase Running, not terminating) without a kgroup sidecar container: created while the
    injector was off or failing open, or labelled after their creation. Such a pod never
    joins the group; it idles unless it is replaced. A pod the selector matches but that
    does not carry the label is not counted: nothing says it is meant to have a sidecar."""
    return sorted(p.name for p in pods
                  if not p.sidecar and p.running and not p.terminating
                  and p.labels.get(C.LABEL_GROUP) == group)


def _sidecar_missing(bare: Sequence[str]) -> tuple[_Verdict, SidecarMissingStatus | None]:
    """The SidecarMissing condition's verdict and ``status.sidecarMissing`` (absent when
    every labelled pod has the sidecar)."""
    if not bare:
        return ("False", "AllPodsHaveSidecar",
                "every running pod labelled with the group has the kgroup sidecar"), None
    shown = ", ".join(bare[:_NAMED]) + (f" and {len(bare) - _NAMED} more"
                                        if len(bare) > _NAMED else "")
    one = len(bare) == 1
    them = "it" if one else "them"
    return (("True", "PodsWithoutSidecar",
             f"{len(bare)} {'pod' if one else 'pods'} labelled with the group "
             f"{'runs' if one else 'run'} without the {C.SIDECAR_CONTAINER} container, "
             f"taking no part in it: {shown} (delete {them} to have {them} re-created "
             "with the sidecar)"),
            SidecarMissingStatus(count=len(bare), pods=list(bare[:SIDECAR_MISSING_LISTED])))


_NAMED = 5
"""The SidecarMissing condition's message names at most this many pods."""


def _phase(
    *,
    spec: ConsumerGroupSpec,
    members: set[str],
    unowned_too_long: bool,
    problems: Sequence[Problem],
    rebalancing: bool,
) -> Phase:
    if spec.paused:
        return "Paused"
    if not members:
        return "Pending"
    if unowned_too_long or problems:
        return "Degraded"
    if rebalancing:
        return "Rebalancing"
    return "Stable"


def aggregate_status(
    *,
    spec: ConsumerGroupSpec,
    generation: int | None,
    previous: ConsumerGroupStatus,
    epoch: int,
    target: Mapping[str, Sequence[int]],
    members: set[str],
    member_leases: Mapping[str, MemberLeaseObservation],
    holders: Mapping[int, str],
    last_change_at: float,
    now: float,
    wall: datetime,
    extra_problems: Sequence[Problem] = (),
    last_rebalance: LastRebalance | None = None,
    assignable: Collection[int] | None = None,
    bare_pods: Sequence[str] = (),
) -> tuple[ConsumerGroupStatus, list[Problem]]:
    """The status to write, and every problem seen (for Events).

    `holders` are the *live* lock holders (see :func:`kgroup.core.operator.planner.live_holders`);
    `last_change_at` is when, on the caller's clock, the target or the membership last
    changed; `last_rebalance` replaces ``previous.last_rebalance`` when a new epoch is
    being written in the same update. `assignable`: the partitions the group may assign
    now (its layout's, ``kgroup.core.operator.reshape``); None: 0..spec.partitions-1.
    `bare_pods`: the pods labelled with the group that run without the sidecar
    (:func:`pods_without_sidecar`).
    """
    problems: list[Problem] = list(extra_problems)
    counted = range(spec.partitions) if assignable is None else frozenset(assignable)
    owned = _owned_counts(holders, counted)
    unowned = len(counted) - sum(owned.values())
    names = sorted(set(target) | members)
    acked, bad_annotations = _acknowledged(names, member_leases)
    problems.extend(bad_annotations)

    misplaced, unacked, rebalancing = _progress(target, members, holders, acked, epoch,
                                                counted)
    patience = spec.handoff.drain_timeout_seconds + spec.lease.duration_seconds
    unowned_too_long = unowned > 0 and now - last_change_at > patience
    stalled, stalled_message = stalled_partitions(member_leases, holders,
                                                  max(counted, default=-1) + 1)
    if stalled:
        problems.append(Problem("PartitionsStalled", stalled_message))
    phase = _phase(spec=spec, members=members, unowned_too_long=unowned_too_long,
                   problems=problems, rebalancing=rebalancing)
    rebalance = _completed_rebalance(last_rebalance or previous.last_rebalance, epoch=epoch,
                                     rebalancing=rebalancing, wall=wall)
    conditions = _conditions(
        previous=previous.conditions,
        generation=generation,
        wall=wall,
        phase=phase,
        unowned=unowned,
        unowned_too_long=unowned_too_long,
        unacked=unacked,
        misplaced=misplaced,
        joined=sorted(members - set(target)),
        left=sorted(set(target) - members),
        problem=next((pr for pr in problems), None),  # the first: what Degraded shows
        epoch=epoch,
        stalled_message=stalled_message,
        has_members=bool(members),
        bare_pods=bare_pods,
    )
    status = ConsumerGroupStatus(
        observed_generation=generation,
        epoch=epoch,
        phase=phase,
        member_count=len(members),
        unowned=unowned,
        stalled=len(stalled),
        stalled_partitions=format_ranges(stalled),
        assignment={m: format_ranges(ps) for m, ps in sorted(target.items())},
        members=_member_rows(names, target=target, owned=owned, acked=acked),
        last_rebalance=rebalance,
        sidecar_missing=_sidecar_missing(bare_pods)[1],
        conditions=conditions,
    )
    return status, problems


def _progress(target: Mapping[str, Sequence[int]], members: set[str],
              holders: Mapping[int, str], acked: Mapping[str, int], epoch: int,
              counted: Collection[int]) -> tuple[int, list[str], bool]:
    """How far the group is from its target: the counted partitions held by another
    member than the target's (or by none), the target's members that have not
    acknowledged ``epoch``, and whether it is still rebalancing."""
    misplaced = sum(1 for m, ps in target.items() for p in ps
                    if holders.get(p) != m and p in counted)
    unacked = sorted(m for m in target if acked.get(m, 0) < epoch)
    # a member that joined (or left) and is not yet in (out of) the target: the new target
    # is still waiting for the stabilisation window, so the group is not settled
    membership_pending = members != set(target)
    return misplaced, unacked, bool(unacked) or misplaced > 0 or membership_pending


def _owned_counts(holders: Mapping[int, str], counted: Collection[int]) -> dict[str, int]:
    """Member -> how many of the counted partitions it holds live."""
    owned: dict[str, int] = {}
    for p, m in holders.items():
        if p in counted:
            owned[m] = owned.get(m, 0) + 1
    return owned


def _member_rows(names: Sequence[str], *, target: Mapping[str, Sequence[int]],
                 owned: Mapping[str, int], acked: Mapping[str, int]) -> list[MemberStatus]:
    """``status.members``: one row per member, in the target or running."""
    return [
        MemberStatus(
            name=name,
            assigned=format_ranges(target.get(name, [])),
            assigned_count=len(target.get(name, [])),
            owned_count=owned.get(name, 0),
            acknowledged_epoch=acked[name],
        )
        for name in names
    ]


def _acknowledged(
    names: Sequence[str], member_leases: Mapping[str, MemberLeaseObservation]
) -> tuple[dict[str, int], list[Problem]]:
    """Member -> the epoch it acknowledged (0 when absent or malformed), and a problem per
    malformed annotation."""
    acked: dict[str, int] = {}
    problems: list[Problem] = []
    for name in names:
        lease = member_leases.get(name)
        value, problem = parse_acknowledged_epoch(name, lease.epoch_annotation if lease else None)
        acked[name] = value
        if problem is not None:
            problems.append(problem)
    return acked, problems


def _completed_rebalance(
    rebalance: LastRebalance | None, *, epoch: int, rebalancing: bool, wall: datetime
) -> LastRebalance | None:
    """The last rebalance, marked completed at ``wall`` (with its duration) once the group
    settled at its epoch; unchanged otherwise."""
    if (
        rebalance is not None
        and rebalance.completed_at is None
        and rebalance.epoch == epoch
        and not rebalancing
    ):
        started = parse_timestamp(rebalance.started_at or "")
        rebalance = rebalance.model_copy(
            update={
                "completed_at": format_timestamp(wall),
                "duration_seconds": (
                    round((wall - started).total_seconds(), 3) if started else None
                ),
            }
        )
    return rebalance


def _conditions(
    *,
    previous: Sequence[Condition],
    generation: int | None,
    wall: datetime,
    phase: Phase,
    unowned: int,
    unowned_too_long: bool,
    unacked: Sequence[str],
    misplaced: int,
    joined: Sequence[str],
    left: Sequence[str],
    problem: Problem | None,
    epoch: int,
    stalled_message: str = "",
    has_members: bool = True,
    bare_pods: Sequence[str] = (),
) -> list[Condition]:
    rebalancing = bool(unacked) or misplaced > 0 or bool(joined) or bool(left)
    ready = _ready(phase=phase, stalled_message=stalled_message, rebalancing=rebalancing,
                   unowned=unowned, epoch=epoch)
    rebal = _rebalancing(rebalancing=rebalancing, unacked=unacked, misplaced=misplaced,
                         joined=joined, left=left, epoch=epoch)
    degraded = _degraded(unowned=unowned, unowned_too_long=unowned_too_long, problem=problem)
    sidecar_missing, _ = _sidecar_missing(bare_pods)
    stall = _stalled(stalled_message=stalled_message, degraded=degraded,
                     has_members=has_members, sidecar_missing=sidecar_missing)
    reconciling = _reconciling(phase=phase, stall=stall, rebal=rebal)
    return _with_transitions(
        (
            ("Ready", ready),
            ("Rebalancing", rebal),
            ("Degraded", degraded),
            ("Stalled", stall),
            ("Reconciling", reconciling),
            ("SidecarMissing", sidecar_missing),
        ),
        previous=previous,
        generation=generation,
        wall=wall,
    )


def _ready(*, phase: Phase, stalled_message: str, rebalancing: bool, unowned: int,
           epoch: int) -> _Verdict:
    """The Ready condition's verdict."""
    if phase == "Pending":
        return ("False", "NoMembers", "no member pod is running, ready and in session")
    if stalled_message:
        return ("False", "PartitionsStalled", stalled_message)
    if phase == "Degraded":
        return ("False", "Degraded", "the group is degraded; see the Degraded condition")
    if rebalancing:
        return ("False", "Rebalancing", f"moving to epoch {epoch}")
    if unowned:
        return ("False", "PartitionsUnowned", f"{unowned} partitions have no live owner")
    return ("True", "AllPartitionsOwned", f"every partition is owned at epoch {epoch}")


def _rebalancing(*, rebalancing: bool, unacked: Sequence[str], misplaced: int,
                 joined: Sequence[str], left: Sequence[str], epoch: int) -> _Verdict:
    """The Rebalancing condition's verdict: what a rebalance waits for."""
    if not rebalancing:
        return ("False", "Settled", f"every member acknowledged epoch {epoch}")
    waiting = ", ".join(unacked[:5]) + (" ..." if len(unacked) > 5 else "")
    msg = f"epoch {epoch}: {misplaced} partitions not yet with their target member"
    if unacked:
        msg += f"; not acknowledged by {waiting}"
    rebal: _Verdict = ("True", "EpochNotAcknowledged" if unacked else "PartitionsMoving", msg)
    if not unacked and not misplaced:
        change = "; ".join(
            f"{what}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
            for what, names in (("joined", joined), ("left", left)) if names)
        rebal = ("True", "MembershipChanging",
                 f"membership changed ({change}); a new target follows the "
                 "stabilisation window")
    return rebal


def _degraded(*, unowned: int, unowned_too_long: bool, problem: Problem | None) -> _Verdict:
    """The Degraded condition's verdict."""
    if unowned_too_long:
        return (
            "True",
            "PartitionsUnowned",
            f"{unowned} partitions unowned for longer than drain timeout + lease duration",
        )
    if problem is not None:
        return ("True", problem.reason, problem.message)
    return ("False", "Healthy", "no problem seen")


def _stalled(*, stalled_message: str, degraded: _Verdict, has_members: bool,
             sidecar_missing: _Verdict = ("False", "", "")) -> _Verdict:
    """The Stalled condition's verdict (kstatus' Failed). Pods without the sidecar stall
    a group only while it has no member at all: then nothing consumes, and nothing will
    until they are replaced. Beside members, the group works on without them."""
    if stalled_message:
        return ("True", "PartitionsStalled", stalled_message)
    if degraded[0] == "True" and has_members:
        return degraded
    if sidecar_missing[0] == "True" and not has_members:
        return ("True", "SidecarMissing", f"no member: {sidecar_missing[2]}")
    if degraded[0] == "True":
        return ("False", "NoMembers", "no member: the group waits for members, it is not "
                "stalled (see the Ready condition)")
    return ("False", "Progressing", "no partition reported stalled, no problem seen")


def _reconciling(*, phase: Phase, stall: _Verdict, rebal: _Verdict) -> _Verdict:
    """kstatus' Reconciling: the phase Rebalancing (then Stalled is False: a stall or
    another problem makes the phase Degraded), with what the rebalance waits for."""
    if phase == "Rebalancing":
        return rebal
    if stall[0] == "True":
        return ("False", "Stalled", "the group cannot make progress by itself; "
                "see the Stalled condition")
    if phase == "Paused":
        return ("False", "Paused", "spec.paused: the target assignment is frozen")
    if phase == "Pending":
        return ("False", "NoMembers", "no member to assign partitions to")
    return ("False", "Settled", rebal[2])


def _with_transitions(
    verdicts: Sequence[tuple[str, _Verdict]],
    *,
    previous: Sequence[Condition],
    generation: int | None,
    wall: datetime,
) -> list[Condition]:
    """The conditions of these verdicts, in order; each keeps its previous
    ``lastTransitionTime`` while its status is unchanged."""
    before = {c.type: c for c in previous}
    out: list[Condition] = []
    for ctype, (status, reason, message) in verdicts:
        old = before.get(ctype)
        since = (
            old.last_transition_time
            if old is not None and old.status == status and old.last_transition_time
            else format_timestamp(wall)
        )
        out.append(
            Condition(
                type=ctype,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=since,
                observed_generation=generation,
            )
        )
    return out
