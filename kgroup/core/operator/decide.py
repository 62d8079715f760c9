"""The operator's decisions for one group, without I/O: ``decide(observation, memory, now)``.

Used by the kopf adapter (``kgroup_operator.controller``) and by the simulated operator
(``kgroup_sim.control``); neither decides anything itself. One pass:

* membership from pods and live sessions, the window and the assignor through
  :class:`~kgroup.core.operator.planner.GroupPlanner` (the window rule itself:
  :func:`kgroup.core.operator.planner.window_end`), a hand-edited status corrected;
* the partition Leases to create, the aggregated status, whether to write it (only when
  it differs from what was last written, at most once per ``status_min_interval``
  unless the target changes: a new target is already paced by the window), the Events
  to post, and when to look again (end of a window, a session's expiry, the rate limit).

The driver performs the :class:`Plan` and reports back: :func:`written` after the status
write succeeded (it returns the Events that belong after the write); a 409 is answered by
re-reading the group and deciding again. The lock writes are the core's request chains,
each reporting to the memory itself. Creates (``Plan.create_partitions``, before the
status write): :func:`~kgroup.core.operator.lock_creation.creation_chains`, each in
flight from :meth:`Memory.create_sent`, then :meth:`Memory.lease_created` (a 409 reads
the name's Lease back: a squatter is ``LeaseNameTaken``) or :meth:`Memory.create_failed`.
Assignment marks (``Plan.marks``: the ``kgroup.dev/assigned`` annotation
that names the only member allowed to acquire a lock) are written after the status write
succeeded, or at once when the pass writes no status, each reported with
:meth:`Memory.mark_sent` / :meth:`Memory.mark_failed`; every pass compares the marks with
the target again, so a lost write, a restart or a hand edit of a mark is repaired.
Expiry marks (``Plan.expiries``: the ``kgroup.dev/expired-session`` annotation; the operator
is the group's failure detector, docs/design.md): a lock whose holder's session is over on
the operator's own clock (:class:`ExpiryRule`) is marked so its next owner may take it.
:func:`~kgroup.core.operator.failure_detector.expiry_chains` turns them into request
chains the driver performs: grouped by holder, each holder's member Lease re-read (a
quorum GET, fed to the cache), :meth:`ExpiryRule.confirm` asked again, each confirmed mark
a merge patch conditional on the lock's resourceVersion as read; each reported with
:meth:`Memory.expiry_sent` / :meth:`Memory.expiry_failed`.
Deletes (``Plan.deletions``): the Leases of retired partitions that are free and record
their completion (:func:`~kgroup.core.operator.retention.retired_leases`, by the lineage
``status.layout`` holds as stored), as request chains
(:func:`~kgroup.core.operator.retention.deletion_chains`), each conditional on the Lease's
resourceVersion as read and reported with :meth:`Memory.deletion_sent` /
:meth:`Memory.deletion_failed`.
Clocks: ``now`` is the caller's monotonic clock, ``wall`` the time stamped into the
status. The memory lives as long as the operator process: a restart starts from what it
lists (the target is always read back from the status).

Over 600 lines, and kept so: :class:`Memory`, the steps of :func:`decide` and the
:class:`Changes` they return are one unit (each step reads the memory and says what it
changes; only :func:`decide` applies it). Apart, the memory's fields would be written
from two modules; what could leave without that (the failure detector, the lock writes'
request chains, the load and reshape rules) already lives in its own module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from kgroup.core import lease_codec as codec
from kgroup.core.objects import Obj
from kgroup.core.operator.autoscale import Autoscaler, Saved, ScaleChange, ScaleSettings
from kgroup.core.operator.failure_detector import Expiry, ExpiryRule, expiries_to_mark
from kgroup.core.operator.lease_cache import GroupLeases
from kgroup.core.operator.load_status import LoadTracker, load_settings, measure_load
from kgroup.core.operator.lock_creation import squatter
from kgroup.core.operator.planner import (
    Decision,
    GroupPlanner,
    PodObservation,
    correct_hand_edit,
    current_members,
    live_holders,
)
from kgroup.core.operator.pod_identity import PodIdentities
from kgroup.core.operator.reshape import Layout, Layouts, completions_on
from kgroup.core.operator.retention import Deletion, retired_leases
from kgroup.core.operator.rollout import restart_grace
from kgroup.core.operator.status import (
    Problem,
    aggregate_status,
    format_timestamp,
    parse_timestamp,
    pods_without_sidecar,
)
from kgroup.core.ranges import parse_ranges
from kgroup.crd_models import (
    AutoscalingStatus,
    ConsumerGroupSpec,
    ConsumerGroupStatus,
    LastRebalance,
)

__all__ = [
    "API_RETRY_SECONDS",
    "CREATES_PER_PASS",
    "FAILED_PASS_RETRY_SECONDS",
    "IDLE_RECHECK",
    "Event",
    "Expiry",
    "ExpiryRule",
    "Mark",
    "Memory",
    "Observation",
    "Plan",
    "decide",
    "expiries_to_mark",
    "problem_events",
    "written",
]

IDLE_RECHECK = 300.0
"""Upper bound on a sleep with no deadline: a cheap in-memory re-evaluation."""
API_RETRY_SECONDS = 2.0
"""Next pass after the API server did not answer (or refused a create)."""
FAILED_PASS_RETRY_SECONDS = 5.0
"""Next pass after a pass failed for any other reason."""
NOT_SYNCED_RETRY_SECONDS = 0.5
"""Next pass while the caches have not listed everything yet."""
SQUAT_RECHECK = 30.0
"""A lock whose name another object holds is tried again this often (one create, one read)."""
CREATES_PER_PASS = 500
"""Lock creates one pass hands over at most; the next pass follows at once. An empty
group's thousands of locks are so created in slices, each carrying the target owner's mark
as of its pass: the locks created once the first target is decided need no separate mark
(one write per lock instead of a create and a mark), and no pass holds a stale target for
long."""
LEASE_CREATE_RECHECK = 5.0
"""A partition Lease created but not yet shown by the synced cache is created again after
this long (deleted before the watch showed it; a create of an existing one is a 409)."""


@dataclass(frozen=True)
class Observation:
    """What the operator's caches hold for one group now."""

    body: Obj | None  # the ConsumerGroup as last seen (None: not seen yet)
    leases: GroupLeases
    pods: list[PodObservation]
    synced: bool
    # per StatefulSet workload (``StatefulSet/<name>``) of the namespace, the ordinals it
    # keeps now (``range(start, start + replicas)``); missing: unknown (restart grace)
    kept_ordinals: Mapping[str, range] = field(default_factory=dict)
    # spec.autoscaling's target as read through its scale subresource: its replicas (None:
    # not read), or why it could not be read
    replicas: int | None = None
    scale_problem: str | None = None


@dataclass
class Memory:
    """What one operator process remembers of one group between passes."""

    started_at: float
    planner: GroupPlanner = field(default_factory=GroupPlanner)
    last_target_change: float = 0.0
    last_write: float = -1e9
    sent_status: dict[str, Any] | None = None  # what we computed and sent
    written_status: dict[str, Any] | None = None  # what the server stored
    written_rv: str | None = None
    reported: set[tuple[str, str]] = field(default_factory=set)
    # partition -> when its Lease's create was sent; dropped once the cache shows the Lease,
    # so a Lease deleted later (by hand) is created again
    requested_leases: dict[int, float] = field(default_factory=dict)
    noticed_rv: str | None = None
    # marks in flight or written, whose lock the cache has not seen change since:
    # partition -> (member, its pod's uid, the lock's resourceVersion when decided)
    marks_sent: dict[int, tuple[str, str | None, str]] = field(default_factory=dict)
    identities: PodIdentities = field(default_factory=PodIdentities)  # the marks' uids
    # expiry marks in flight or written, whose lock the cache has not seen change since:
    # partition -> (the session marked, the lock's resourceVersion when it was decided)
    expiries_sent: dict[int, tuple[str, str]] = field(default_factory=dict)
    # deletes of retired partitions' Leases in flight or done, whose Lease the cache has not
    # seen go or change since: partition -> the Lease's resourceVersion when decided
    deletions_sent: dict[int, str] = field(default_factory=dict)
    planned_generation: int | None = None  # spec generation the target reflects
    # partition -> why the name its lock must have is held by someone else's Lease
    squatted: dict[int, str] = field(default_factory=dict)
    load: LoadTracker = field(default_factory=LoadTracker)  # status.load as last taken
    layouts: Layouts = field(default_factory=Layouts)  # status.layout, read and derived
    autoscaler: Autoscaler = field(default_factory=Autoscaler)  # spec.autoscaling's memory
    autoscaler_restored: bool = False  # from status.autoscaling, once per process
    last_scale_time: str | None = None  # status.autoscaling.lastScaleTime
    # parses of the last spec and status seen (bodies are never mutated: identity suffices)
    _spec: tuple[Any, ConsumerGroupSpec | ValidationError] | None = None
    _status: tuple[Any, tuple[ConsumerGroupStatus, dict[str, list[int]], Problem | None,
                              dict[str, Any]]] | None = None
    _status_partitions: int = 0

    def __post_init__(self) -> None:
        self.last_target_change = self.started_at

    def spec_of(self, raw: Any) -> ConsumerGroupSpec | ValidationError:
        if self._spec is None or self._spec[0] is not raw:
            try:
                parsed: ConsumerGroupSpec | ValidationError = \
                    ConsumerGroupSpec.model_validate(raw)
            except ValidationError as exc:
                parsed = exc
            self._spec = (raw, parsed)
        return self._spec[1]

    def status_of(self, raw: dict[str, Any], partitions: int) -> tuple[
            ConsumerGroupStatus, dict[str, list[int]], Problem | None, dict[str, Any]]:
        """(status, its target, a problem reading it, its normal wire form); a target
        naming a partition at or beyond ``partitions`` is a problem, never expanded."""
        if self._status is None or self._status[0] is not raw \
                or self._status_partitions != partitions:
            self._status = (raw, (*_read_status(raw, partitions), _normal(raw)))
            self._status_partitions = partitions
        return self._status[1]

    def create_sent(self, partition: int, now: float) -> None:
        """A partition Lease's create is on its way (handed over at ``now``): not asked
        for again until the cache shows it, or :data:`LEASE_CREATE_RECHECK` later."""
        self.requested_leases[partition] = now

    def create_failed(self, partition: int, now: float) -> None:
        """The create handed over at ``now`` was refused or not answered: the next pass
        asks again."""
        if self.requested_leases.get(partition) == now:
            del self.requested_leases[partition]

    def lease_created(self, partition: int, now: float, *, existing: Obj | None = None,
                      group: str = "") -> None:
        """A partition Lease's create sent at ``now`` was answered: not asked for again
        until the cache showed it, or :data:`LEASE_CREATE_RECHECK` later (:data:`SQUAT_RECHECK`
        when its name is taken). ``existing``: the Lease that already had the name (a 409),
        a problem (``LeaseNameTaken``) unless it is this group's lock of ``partition``."""
        self.requested_leases[partition] = now
        squat = squatter(existing, group, partition) if existing is not None else None
        if squat is None:
            self.squatted.pop(partition, None)
        else:
            self.squatted[partition] = squat

    def scaled(self, change: ScaleChange, now: float, wall: datetime) -> None:
        """The plan's :class:`~kgroup.core.operator.autoscale.ScaleChange` was written."""
        self.autoscaler.scaled(now, change)
        self.last_scale_time = format_timestamp(wall)

    def mark_sent(self, mark: Mark) -> None:
        """The mark's write is sent: not asked for again until the lock changes."""
        self.marks_sent[mark.partition] = (mark.member, mark.uid, mark.seen_rv)

    def mark_failed(self, mark: Mark) -> None:
        """The mark's write was refused (409: the lock changed since ``seen_rv``; the driver
        re-reads it) or not answered: the next pass decides again."""
        if self.marks_sent.get(mark.partition) == (mark.member, mark.uid, mark.seen_rv):
            del self.marks_sent[mark.partition]

    def expiry_sent(self, expiry: Expiry) -> None:
        """The expiry's re-read or mark is on its way: not decided again until the lock
        changes (or :meth:`expiry_failed`)."""
        self.expiries_sent[expiry.partition] = (expiry.session, expiry.seen_rv)

    def expiry_failed(self, expiry: Expiry) -> None:
        """The session proved live on the re-read, or the read or the write failed: the
        next pass decides again (on the tracker the re-read fed)."""
        if self.expiries_sent.get(expiry.partition) == (expiry.session, expiry.seen_rv):
            del self.expiries_sent[expiry.partition]

    def deletion_sent(self, deletion: Deletion) -> None:
        """The delete is on its way: not decided again until the Lease changes."""
        self.deletions_sent[deletion.partition] = deletion.seen_rv

    def deletion_failed(self, deletion: Deletion) -> None:
        """The delete was refused (the Lease changed or is gone) or not answered: the next
        pass decides again."""
        if self.deletions_sent.get(deletion.partition) == deletion.seen_rv:
            del self.deletions_sent[deletion.partition]


@dataclass(frozen=True)
class Mark:
    """Mark partition Lease ``partition`` as assigned to ``member``'s pod ``uid`` (one merge
    patch of the ``kgroup.dev/assigned`` and ``kgroup.dev/assigned-uid`` annotations; uid
    None: not known, the uid annotation removed); ``seen_rv``: the lock's resourceVersion
    seen, the patch's precondition (409 when the lock changed since)."""

    partition: int
    member: str
    seen_rv: str
    uid: str | None = None


@dataclass(frozen=True)
class Event:
    """A core/v1 Event to post about the group."""

    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Plan:
    wait: float | None  # seconds until the next pass (None: no deadline)
    now: float = 0.0  # the pass's clock reading
    create_partitions: list[int] = field(default_factory=list)
    owners: dict[int, str] = field(default_factory=dict)  # target owners: new locks' marks
    uids: dict[str, str] = field(default_factory=dict)  # member -> its pod's uid for marks
    marks: list[Mark] = field(default_factory=list)  # write after the status write
    expiries: list[Expiry] = field(default_factory=list)  # re-read, then mark (after marks)
    deletions: list[Deletion] = field(default_factory=list)  # retired partitions' Leases
    lease_duration: int = 15  # of the partition Leases to create
    events: list[Event] = field(default_factory=list)  # post now (before any write)
    status: dict[str, Any] | None = None  # write this status (rv precondition: the body's)
    scale: ScaleChange | None = None  # the target's replicas to set (then Memory.scaled)
    # for `written` and the metrics:
    decision: Decision | None = None
    previous: ConsumerGroupStatus | None = None
    new_status: ConsumerGroupStatus | None = None
    problems: list[Problem] = field(default_factory=list)
    generation: int | None = None
    members: int = 0
    deadlines: list[float | None] = field(default_factory=list)


def _normal(status: dict[str, Any] | None) -> dict[str, Any]:
    try:
        return ConsumerGroupStatus.model_validate(status or {}).to_wire()
    except ValidationError:
        return {"invalid": status}


def _read_status(raw: dict[str, Any], partitions: int) -> tuple[
        ConsumerGroupStatus, dict[str, list[int]], Problem | None]:
    """The status as written, with its target parsed (bounded by ``partitions``: a range
    beyond them is refused, never expanded); unreadable -> empty + problem."""
    try:
        status = ConsumerGroupStatus.model_validate(raw)
    except ValidationError as exc:
        return (ConsumerGroupStatus(), {},
                Problem("StatusEditedByHand", f"status is unreadable: {str(exc)[:300]}"))
    target: dict[str, list[int]] = {}
    for m, r in status.assignment.items():
        try:
            target[m] = parse_ranges(r, limit=partitions)
        except ValueError as exc:
            # keep the epoch (a new target must go above it); the target is planned again
            # from the live lock holders, as for an empty status
            return (status.model_copy(update={"assignment": {}}), {},
                    Problem("StatusEditedByHand",
                            f"status.assignment is unusable ({m[:63]}: {str(exc)[:200]}); "
                            "planned again from the lock holders"))
    return status, target, None


def _written_target(memory: Memory, partitions: int) -> tuple[dict[str, list[int]], int] | None:
    if memory.written_status is None or "invalid" in memory.written_status:
        return None
    st = ConsumerGroupStatus.model_validate(memory.written_status)
    try:
        return {m: parse_ranges(r, limit=partitions) for m, r in st.assignment.items()}, \
            st.epoch
    except ValueError:
        return None


def _next(deadlines: list[float | None], now: float) -> float | None:
    future = [d for d in deadlines if d is not None]
    return (min(future) - now) if future else None


def marks_to_write(memory: Memory, owners: dict[int, str], leases: GroupLeases,
                   uids: Mapping[str, str] | None = None) -> tuple[list[Mark], list[int]]:
    """The existing locks whose mark differs from their target owner or from the uid of
    its pod (``uids``, :class:`~kgroup.core.operator.pod_identity.PodIdentities`; a member missing
    from it: no pod known, a lock marked for it keeps its uid), less those already sent
    for the lock as it is cached (an answer or watch event still to come); and the
    partitions whose sent mark is to be forgotten (their lock is gone). A partition
    without an owner in the target keeps its mark (nobody is targeted to acquire it). A
    mark without a uid (an older operator wrote it) is rewritten with one."""
    marks: list[Mark] = []
    gone: list[int] = []
    for p, member in owners.items():  # the few marks are sorted, not the 10,000 owners
        lock = leases.partitions.get(p)
        if lock is None:
            if p in memory.marks_sent:
                gone.append(p)
            continue
        uid = (uids or {}).get(member)
        if uid is None and lock.assigned == member:
            continue
        if lock.assigned == member and lock.assigned_uid == uid:
            continue
        if memory.marks_sent.get(p) == (member, uid, lock.resource_version):
            continue
        marks.append(Mark(p, member, lock.resource_version, uid))
    marks.sort(key=lambda m: m.partition)
    return marks, gone


def problem_events(memory: Memory, problems: list[Problem]) -> list[Event]:
    """One Warning Event per problem when it first appears; the problems are remembered
    as reported."""
    current = {(p.reason, p.message) for p in problems}
    events = [Event("Warning", reason, message)
              for reason, message in sorted(current - memory.reported)]
    memory.reported = current
    return events


@dataclass
class Changes:
    """What one pass changes in the memory's own fields, applied once at the pass's end
    (:meth:`apply`). The memory's parts with rules and state of their own (the planner,
    the load tracker, the autoscaler, the pod identities, the layouts) change themselves
    as the steps use them."""

    planned_generation: tuple[int | None] | None = None  # (generation,): the target settled
    requested_leases: dict[int, float] = field(default_factory=dict)  # creates in flight
    squatted: dict[int, str] = field(default_factory=dict)  # lock names held by others
    noticed_rv: tuple[str | None] | None = None  # (rv,): its one-off notices were posted
    marks_gone: list[int] = field(default_factory=list)  # sent marks of locks now gone
    expiries_settled: list[int] = field(default_factory=list)  # of locks no longer held
    deletions_settled: list[int] = field(default_factory=list)  # of Leases gone or changed

    def apply(self, memory: Memory) -> None:
        if self.planned_generation is not None:
            memory.planned_generation = self.planned_generation[0]
        memory.requested_leases = self.requested_leases
        memory.squatted = self.squatted
        if self.noticed_rv is not None:
            memory.noticed_rv = self.noticed_rv[0]
        for p in self.marks_gone:
            memory.marks_sent.pop(p, None)
        for p in self.expiries_settled:
            memory.expiries_sent.pop(p, None)
        for p in self.deletions_settled:
            memory.deletions_sent.pop(p, None)


@dataclass(frozen=True)
class Reading:
    """The group's body as read in a pass: its layout, status and target, the status as
    the server holds it (normal wire form), one-off notices, and the target a hand edit
    of the status is corrected back to (None: none)."""

    layout: Layout
    status: ConsumerGroupStatus
    target: dict[str, list[int]]
    server: dict[str, Any]
    notices: list[Problem]
    correction: Decision | None


@dataclass(frozen=True)
class Membership:
    """Who is in the group now: live sessions, members, live lock holders, and the
    persistent problems seen on the way."""

    live: dict[str, str]
    members: set[str]
    holders: dict[int, str]
    problems: list[Problem]


@dataclass(frozen=True)
class Creates:
    """The locks to create this pass, when to look again for those in flight, and the
    creates in flight and squatted names that remain (:class:`Changes`)."""

    partitions: list[int]
    recheck: float | None
    requested: dict[int, float]
    squatted: dict[int, str]


def decide(obs: Observation, memory: Memory, now: float, *, wall: datetime,
           status_min_interval: float, rule: ExpiryRule | None = None) -> Plan:
    """One pass over one group: what to create, write, mark and post, and when to look
    again. ``rule``: the failure detector's (:class:`ExpiryRule`, a variant in kgroup_sim).
    The steps read the memory and return what they change (:class:`Changes`, applied
    once at the end)."""
    if not obs.synced or obs.body is None:
        return Plan(wait=NOT_SYNCED_RETRY_SECONDS)
    body, leases = obs.body, obs.leases
    spec = memory.spec_of(body.get("spec") or {})
    if isinstance(spec, ValidationError):
        return Plan(wait=None, events=problem_events(
            memory, [Problem("InvalidSpec", str(spec)[:500])]))
    generation, rv = codec.meta(body).get("generation"), codec.meta(body).get("resourceVersion")
    read = _read_group(body, spec, memory, leases)
    seen = _membership(obs, spec, now)
    decision = _plan_target(obs, memory, spec, read, seen, now, wall)
    creates = _lease_creates(memory, leases, read.layout, now)
    changes = Changes(planned_generation=(generation,) if decision.target is None else None,
                      requested_leases=creates.requested, squatted=creates.squatted)
    scale_problems = ([Problem("ScaleTargetUnavailable", obs.scale_problem)]
                      if spec.autoscaling is not None and obs.scale_problem is not None else [])
    problems = seen.problems + scale_problems + _squat_problems(creates.squatted)

    epoch, new_target = read.status.epoch, read.target
    last_rebalance: LastRebalance | None = None
    if decision.target is not None:
        epoch, new_target = decision.epoch, decision.target
        last_rebalance = LastRebalance(epoch=epoch, reason=decision.reason,
                                       moved=decision.moved, started_at=format_timestamp(wall))
    last_change = max(memory.last_target_change, memory.planner.last_membership_change)
    new_status, reported = aggregate_status(
        spec=spec, generation=generation, previous=read.status, epoch=epoch,
        target=new_target, members=seen.members, member_leases=leases.member_observations(),
        holders=seen.holders, last_change_at=last_change, now=now, wall=wall,
        extra_problems=problems, last_rebalance=last_rebalance,
        assignable=read.layout.assignable,
        bare_pods=pods_without_sidecar(str(codec.meta(body).get("name", "")), obs.pods),
    )
    new_status = memory.load.apply(new_status)
    scale, scale_wait, new_status = _autoscale(obs, memory, spec, read.status, new_status, now,
                                               len(seen.members), decision, wall)
    wire = {**new_status.to_wire(), "layout": read.layout.status}
    expiries, next_lock_expiry, changes.expiries_settled = expiries_to_mark(
        memory.expiries_sent, leases, now, rule or ExpiryRule())
    # when unowned partitions become "unowned too long" (the Degraded condition): a moment
    # to wake for only while it is ahead. Once passed, this pass has reported it, whatever
    # the phase shows (Pending and Paused outrank Degraded): a past deadline here made
    # every pass of a group without members ask to run again at once
    unowned_too_long_at = (last_change + spec.handoff.drain_timeout_seconds
                           + spec.lease.duration_seconds + 0.01)
    deadlines = [
        next_lock_expiry,
        decision.next_check,
        leases.next_expiry(now),
        unowned_too_long_at if new_status.unowned and unowned_too_long_at > now else None,
        creates.recheck, memory.load.deadline(),
        None if scale_wait is None else now + scale_wait,
    ]
    owners = {p: m for m, ps in new_target.items() for p in ps
              if read.layout.is_assignable(p)}
    uids, identity_change = memory.identities.resolve(
        set(owners.values()), obs.pods, now,
        lambda pod: restart_grace(spec, pod, present=False, kept_ordinals=obs.kept_ordinals,
                                  name=pod.name))
    deadlines.append(identity_change)
    marks, changes.marks_gone = marks_to_write(memory, owners, leases, uids)
    deletions, changes.deletions_settled = _deletions(memory, leases,
                                                      str(codec.meta(body).get("name", "")))
    plan = Plan(wait=_next(deadlines, now), now=now, create_partitions=creates.partitions,
                owners=owners, uids=uids, marks=marks, expiries=expiries, deletions=deletions,
                lease_duration=spec.lease.duration_seconds, decision=decision,
                previous=read.status, new_status=new_status, problems=reported,
                generation=generation, members=len(seen.members), deadlines=deadlines,
                scale=scale)
    if read.notices and rv != memory.noticed_rv:
        changes.noticed_rv = (rv,)
        plan.events.extend(Event("Warning", n.reason, n.message) for n in read.notices)
    changes.apply(memory)
    return _write_or_wait(plan, memory, wire, read.server, status_min_interval)


def _read_group(body: Obj, spec: ConsumerGroupSpec, memory: Memory,
                leases: GroupLeases) -> Reading:
    """The layout (``status.layout``, the completions the Leases report), the status and
    its target, and whether someone else changed the status since our write (corrected
    back to our target) or it cannot be used."""
    md = codec.meta(body)
    raw_status = body.get("status") or {}
    layout = memory.layouts.derive(spec.partitions, raw_status.get("layout"),
                                   completions_on(leases.bodies, str(md.get("name"))),
                                   spec.reshape.policy, spec.reshape.change)
    status, target, hand_problem, server = memory.status_of(raw_status, layout.space)
    notices: list[Problem] = []  # one-off: an Event only
    correction: Decision | None = None
    rv = md.get("resourceVersion")
    if (
        memory.written_status is not None
        and memory.written_rv is not None
        and rv != memory.written_rv
        and codec.not_older(body, {"metadata": {"resourceVersion": memory.written_rv}})
        and server != memory.written_status
    ):
        notices.append(
            Problem("StatusEditedByHand", "status was changed by someone else; corrected"))
        written_target = _written_target(memory, layout.space)
        if written_target is not None:
            correction = correct_hand_edit(
                written_target=written_target[0], written_epoch=written_target[1],
                seen_target=target, seen_epoch=status.epoch,
            )
    elif hand_problem is not None:
        notices.append(hand_problem)
    if layout.problem is not None:
        notices.append(Problem("LayoutNotApplied", layout.problem))
    return Reading(layout, status, target, server, notices, correction)


def _membership(obs: Observation, spec: ConsumerGroupSpec, now: float) -> Membership:
    """The live sessions, the members (selected pods with a live session), the live lock
    holders; a selector that matches no pod is a problem."""
    live = obs.leases.live_sessions(now)
    members = current_members(selector=spec.selector, pods=obs.pods, live_sessions=live)
    holders = live_holders(obs.leases.locks(), live)
    problems: list[Problem] = []  # persistent: shown in conditions, one Event each
    if not any(spec.selector.matches(dict(p.labels)) for p in obs.pods):
        md = codec.meta(obs.body or {})
        problems.append(Problem(
            "SelectorMatchesNothing",
            f"no pod in {md.get('namespace')} matches "
            f"{spec.selector.to_label_selector_string()}",
        ))
    return Membership(live, members, holders, problems)


def _plan_target(obs: Observation, memory: Memory, spec: ConsumerGroupSpec, read: Reading,
                 seen: Membership, now: float, wall: datetime) -> Decision:
    """The load taken when due (``status.load``), then the decision: the correction of a
    hand edit, else the planner's over the layout's slots (a new target, or none:
    ``decision.target`` None)."""
    layout, generation = read.layout, codec.meta(obs.body or {}).get("generation")
    member_leases = obs.leases.member_observations()
    memory.load.refresh(now, lambda history: measure_load(
        member_leases, seen.holders, spec, seen.members, wall, memory.load.capacity(), history,
        memory.autoscaler.start_seconds, memory.load.parsed),
        load_settings(spec, member_leases))
    if read.correction is not None:
        return read.correction
    return layout.decision_from_slots(memory.planner.plan(
        spec=layout.slot_spec(spec), target=layout.to_slots(read.target),
        epoch=read.status.epoch, members=seen.members,
        holders=layout.holders_to_slots(seen.holders), now=now, pods=obs.pods,
        sessions=seen.live.keys(), kept_ordinals=obs.kept_ordinals,
        spec_changed=(memory.planned_generation is not None
                      and generation != memory.planned_generation),
        loads=(layout.loads_to_slots(memory.load.rates)
               if spec.balance.mode == "load" else None),
        load_noise=memory.load.noise,
    ), read.target)


def _lease_creates(memory: Memory, leases: GroupLeases, layout: Layout,
                   now: float) -> Creates:
    """Whatever is missing from the synced cache is created: never created yet, or deleted
    (kubectl delete lease, or the group deleted and applied again). A create the watch has
    not shown yet is not repeated until LEASE_CREATE_RECHECK has passed (a squatted name:
    SQUAT_RECHECK); at most CREATES_PER_PASS a pass."""
    requested = {p: t for p, t in memory.requested_leases.items() if p not in leases.partitions}
    squatted = {p: why for p, why in memory.squatted.items()
                if p not in leases.partitions and layout.is_assignable(p)}

    def again(p: int) -> float:
        return SQUAT_RECHECK if p in squatted else LEASE_CREATE_RECHECK

    create = [p for p in layout.assignable if p not in leases.partitions
              and now >= requested.get(p, -again(p)) + again(p)]
    more_to_create = len(create) > CREATES_PER_PASS
    create = create[:CREATES_PER_PASS]
    recheck = min((t + again(p) for p, t in requested.items()
                   if p not in create), default=None)
    if more_to_create:
        recheck = now  # the next slice: the pass after this one's creates are done
    return Creates(create, recheck, requested, squatted)


def _deletions(memory: Memory, leases: GroupLeases, group: str) -> tuple[list[Deletion],
                                                                         list[int]]:
    """The retired partitions' Leases to delete (by the lineage the status holds as read),
    and the deletes in flight to forget: their Lease is gone or changed since."""
    settled = [p for p, rv in memory.deletions_sent.items()
               if (lock := leases.partitions.get(p)) is None or lock.resource_version != rv]
    return retired_leases(memory.layouts.persisted, leases.bodies, group, leases.partitions,
                          memory.deletions_sent), settled


def _squat_problems(squatted: dict[int, str]) -> list[Problem]:
    """``LeaseNameTaken`` for the first squatted lock name, counting the others."""
    if not squatted:
        return []
    why = sorted(squatted.items())[0][1]
    if len(squatted) > 1:
        why = f"{why} (and {len(squatted) - 1} more partitions' locks)"
    return [Problem("LeaseNameTaken", why)]


def _write_or_wait(plan: Plan, memory: Memory, wire: dict[str, Any],
                   server: dict[str, Any], status_min_interval: float) -> Plan:
    """Whether the pass writes the status: only when it differs from what was last written
    (or a new target), at most once per ``status_min_interval`` unless the target changes;
    with nothing to write, the problems' Events are posted now."""
    decision, now = plan.decision, plan.now
    assert decision is not None
    baseline = memory.sent_status if server == memory.written_status else server
    if wire == baseline and decision.target is None:
        plan.events.extend(problem_events(memory, plan.problems))
        return plan
    # The rate limit holds back aggregate-only writes; a new target is already paced by
    # the stabilisation window and must not wait behind a member-count update.
    wait = memory.last_write + status_min_interval - now
    if wait > 0 and decision.target is None:
        plan.wait = wait
        return plan
    plan.status = wire
    return plan


def _autoscale(obs: Observation, memory: Memory, spec: ConsumerGroupSpec,
               previous: ConsumerGroupStatus, status: ConsumerGroupStatus, now: float,
               members: int, decision: Decision, wall: datetime
               ) -> tuple[ScaleChange | None, float | None, ConsumerGroupStatus]:
    """``spec.autoscaling``: the recommendation last taken fed to the autoscaler, its
    change (if any), when to look again, and ``status`` with ``status.autoscaling`` (the
    last change as ``previous`` shows it until this process makes one, and what a
    restarted process resumes from: :class:`~kgroup.core.operator.autoscale.Saved`)."""
    auto = spec.autoscaling
    if auto is None:
        return None, None, status
    settings = ScaleSettings(min_members=auto.min_members, max_members=auto.max_members,
                             scale_down_delay_seconds=auto.scale_down_delay_seconds,
                             scale_down_tolerance=auto.scale_down_tolerance,
                             partitions=spec.partitions)
    scaler = memory.autoscaler
    before = previous.autoscaling or AutoscalingStatus()
    if not memory.autoscaler_restored:
        memory.autoscaler_restored = True
        scaler.restore(_saved(before, now, wall), replicas=obs.replicas, settings=settings)
    if memory.load.status is not None and memory.load.taken_at is not None:
        scaler.observe(memory.load.taken_at, memory.load.status.recommended_members, settings)
    rebalancing = decision.target is not None or status.phase == "Rebalancing"
    change, wait = scaler.decide(now, replicas=obs.replicas, settings=settings,
                                 rebalancing=rebalancing, members=members)
    last = scaler.last_change
    saved = scaler.saved(obs.replicas, settings)
    shown = AutoscalingStatus(
        desired_members=scaler.samples[-1][1] if scaler.samples else None,
        replicas=obs.replicas,
        last_scale_time=memory.last_scale_time or before.last_scale_time,
        last_scale_replicas=saved.last_change_replicas,
        reason=before.reason if last is None
        else f"{last.previous} -> {last.replicas}: {last.reason}",
        scale_down_since=None if saved.below_since is None else _precise(
            wall - timedelta(seconds=now - saved.below_since)),
        scale_down_to=saved.below_peak, scale_down_from=saved.below_replicas,
        scale_up_seen=None if saved.above_at is None else _precise(
            wall - timedelta(seconds=now - saved.above_at)),
        scale_up_to=saved.above_value, scale_up_from=saved.above_replicas)
    return change, wait, status.model_copy(update={"autoscaling": shown})


def _precise(wall: datetime) -> str:
    """RFC 3339 in UTC to the microsecond (a restarted operator resumes the scale-down
    delay where it was)."""
    return wall.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _saved(shown: AutoscalingStatus, now: float, wall: datetime) -> Saved:
    """``status.autoscaling`` as :meth:`Autoscaler.restore` takes it, its times on the
    caller's clock (``now`` is ``wall``). ``lastScaleTime`` has whole seconds: the change
    is taken as made at the end of its second (the settling wait is never cut short)."""
    def clock(text: str | None, slack: float = 0.0) -> float | None:
        at = None if text is None else parse_timestamp(text)
        return None if at is None else now - (wall - at).total_seconds() + slack

    return Saved(below_since=clock(shown.scale_down_since), below_peak=shown.scale_down_to,
                 below_replicas=shown.scale_down_from,
                 last_change_at=clock(shown.last_scale_time, 1.0),
                 last_change_replicas=shown.last_scale_replicas,
                 above_at=clock(shown.scale_up_seen), above_value=shown.scale_up_to,
                 above_replicas=shown.scale_up_from)


def written(memory: Memory, plan: Plan, stored: Obj, now: float) -> list[Event]:
    """The status write of ``plan`` succeeded with ``stored``: remember it; the Events to
    post about the stored object (a rebalance started or completed, new problems)."""
    assert plan.status is not None and plan.decision is not None
    memory.last_write = now
    memory.planned_generation = plan.generation
    memory.sent_status = plan.status
    memory.written_status = _normal(stored.get("status"))
    memory.written_rv = codec.meta(stored).get("resourceVersion")
    events: list[Event] = []
    decision = plan.decision
    if decision.target is not None:
        memory.last_target_change = plan.now
        events.append(Event("Normal", "RebalanceStarted",
                            f"epoch {decision.epoch}: {decision.reason} "
                            f"({decision.moved} partitions move)"))
    done = plan.new_status.last_rebalance if plan.new_status else None
    before = plan.previous.last_rebalance if plan.previous else None
    if (
        done is not None
        and done.completed_at is not None
        and (before is None or before.epoch != done.epoch or before.completed_at is None)
    ):
        events.append(Event("Normal", "RebalanceCompleted",
                            f"epoch {done.epoch} settled in {done.duration_seconds}s"))
    events.extend(problem_events(memory, plan.problems))
    plan.wait = _next(plan.deadlines, now)
    return events
