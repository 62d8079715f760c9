"""A simulated operator around the real ``kgroup.core.group`` and ``kgroup.core.status``.

Rule of this module: mirror ``kgroup_operator.controller.GroupController.reconcile``
(membership from pods and live sessions, the stabiliser and the assignor through
``GroupPlanner.plan``, partition Leases created when missing, status aggregated and written
with the read ``resourceVersion``, a 409 answered by a re-read) with the I/O replaced.
The operator's memory (planner, caches, session tracker) lives in one incarnation: an
operator restart builds a new one that knows only what it lists from the store.
Hand edits of the status are not simulated, so the hand-edit correction is not mirrored.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from kgroup.api import ConsumerGroupStatus, LastRebalance
from kgroup.core.group import (
    GroupPlanner,
    LockObservation,
    PodObservation,
    current_members,
    live_holders,
)
from kgroup.core.locks import SessionTracker
from kgroup.core.ranges import parse_ranges
from kgroup.core.status import MemberLeaseObservation, aggregate_status, format_timestamp
from kgroup.sim.kernel import Process
from kgroup.sim.store import (
    GroupObj,
    MemberLeaseObj,
    PartitionLeaseObj,
    PodObj,
    Stored,
    WriteError,
)

if TYPE_CHECKING:
    from kgroup.sim.world import World

__all__ = ["SimOperator"]

EPOCH_WALL = datetime(2026, 1, 1, tzinfo=UTC)
STATUS_MIN_INTERVAL = 1.0


class SimOperator:
    """One incarnation of the operator (the active replica)."""

    def __init__(self, world: World, proc: Process) -> None:
        self.world = world
        self.proc = proc
        self.planner = GroupPlanner()
        self.tracker = SessionTracker()
        self.group: GroupObj | None = None
        self.members: dict[str, MemberLeaseObj] = {}
        self.partitions: dict[int, PartitionLeaseObj] = {}
        self.pods: dict[str, PodObj] = {}
        self.synced: set[str] = set()
        self.requested: set[int] = set()
        self.last_target_change = proc.clock()
        self.last_write = -1e9
        self.sent_status: dict[str, Any] | None = None
        self.written_status: dict[str, Any] | None = None
        self.busy = False
        self._due = False
        self._gen = 0

    # ---- observations ----------------------------------------------------------------

    def on_list(self, stream: str, items: list[tuple[str, Stored]]) -> None:
        if stream == "lease":
            self.members.clear()
            self.partitions.clear()
            seen = set()
            for key, obj in items:
                self._apply(key, obj)
                if isinstance(obj, MemberLeaseObj):
                    seen.add(obj.member)
            for gone in self.tracker.members():
                if gone not in seen:
                    self.tracker.forget(gone)
        elif stream == "pod":
            self.pods = {o.name: o for _, o in items if isinstance(o, PodObj)}
        else:
            for key, obj in items:
                self._apply(key, obj)
        self.synced.add(stream)
        self.poke()

    def on_event(self, stream: str, key: str, obj: Stored | None) -> None:
        kind, _, name = key.partition("/")
        if obj is not None:
            self._apply(key, obj)
        elif kind == "member":
            self.members.pop(name, None)
            self.tracker.forget(name)
        elif kind == "partition":
            self.partitions.pop(int(name), None)
        elif kind == "pod":
            self.pods.pop(name, None)
        self.poke()

    def _apply(self, key: str, obj: Stored) -> None:
        # world.World.put_lease / put_pod: keep the newest resourceVersion seen
        if isinstance(obj, GroupObj):
            if self.group is None or obj.rv >= self.group.rv:
                self.group = obj
        elif isinstance(obj, MemberLeaseObj):
            old = self.members.get(obj.member)
            if old is not None and obj.rv < old.rv:
                return
            self.members[obj.member] = obj
            self.tracker.observe(obj.member, obj.session, str(obj.rv), obj.duration,
                                 self.proc.clock())
        elif isinstance(obj, PartitionLeaseObj):
            oldp = self.partitions.get(obj.partition)
            if oldp is not None and obj.rv < oldp.rv:
                return
            self.partitions[obj.partition] = obj
        elif isinstance(obj, PodObj):
            oldpod = self.pods.get(obj.name)
            if oldpod is None or obj.rv >= oldpod.rv:
                self.pods[obj.name] = obj

    # ---- the loop --------------------------------------------------------------------

    def poke(self) -> None:
        if not self._due and not self.busy:
            self._due = True
            self.proc.schedule(self.world.loop_latency(), self._run)

    def _run(self) -> None:
        self._due = False
        if self.busy:
            return
        delay = self.reconcile()
        if delay is not None and not self.busy:
            self._gen += 1
            self.proc.schedule(max(0.0, delay) / self.proc.rate, self._wake, self._gen)

    def _wake(self, gen: int) -> None:
        if gen == self._gen:
            self.poke()

    def reconcile(self) -> float | None:
        """One pass; returns seconds (this clock) until the next deadline, or None."""
        if self.synced < {"group", "lease", "pod"} or self.group is None:
            return 0.5
        spec = self.world.spec
        body = self.group
        now = self.proc.clock()
        wall = EPOCH_WALL + timedelta(seconds=now)
        status = ConsumerGroupStatus.model_validate(body.status)
        target = {m: parse_ranges(r) for m, r in status.assignment.items()}
        live = {
            m: lease.session
            for m, lease in self.members.items()
            if self.tracker.is_live(m, lease.session, now)
        }
        labels = dict(spec.selector.match_labels)
        pods = [PodObservation(name=p.name, labels=labels, ready=p.ready)
                for p in self.pods.values()]
        members = current_members(selector=spec.selector, pods=pods, live_sessions=live)
        locks = [LockObservation(p, o.holder, o.session) for p, o in self.partitions.items()]
        holders = live_holders(locks, live)
        decision = self.planner.plan(spec=spec, target=target, epoch=status.epoch,
                                     members=members, holders=holders, now=now)
        self._ensure_partition_leases()
        epoch, new_target = status.epoch, target
        last_rebalance: LastRebalance | None = None
        if decision.target is not None:
            epoch, new_target = decision.epoch, decision.target
            last_rebalance = LastRebalance(epoch=epoch, reason=decision.reason,
                                           moved=decision.moved,
                                           started_at=format_timestamp(wall))
        last_change = max(self.last_target_change, self.planner.last_membership_change)
        new_status, _ = aggregate_status(
            spec=spec, generation=1, previous=status, epoch=epoch, target=new_target,
            members=members,
            member_leases={m: MemberLeaseObservation(m, v.session,
                                                     None if v.epoch is None else str(v.epoch))
                           for m, v in self.members.items()},
            holders=holders, last_change_at=last_change, now=now, wall=wall,
            last_rebalance=last_rebalance,
        )
        wire = new_status.to_wire()
        expiries = [
            t for m, lease in self.members.items()
            if (t := self.tracker.expires_at(m, lease.session)) is not None and t > now
        ]
        deadlines = [decision.next_check, min(expiries, default=None)]
        if new_status.unowned and new_status.phase != "Degraded":
            deadlines.append(last_change + spec.handoff.drain_timeout_seconds
                             + spec.lease.duration_seconds + 0.01)
        server = body.status
        baseline = self.sent_status if server == self.written_status else server
        if wire == baseline and decision.target is None:
            return _next(deadlines, now)
        wait = self.last_write + STATUS_MIN_INTERVAL - now
        if wait > 0:
            return wait
        self._write(body, wire, changed_target=decision.target is not None, now=now)
        return None

    def _write(self, body: GroupObj, wire: dict[str, Any], *, changed_target: bool,
               now: float) -> None:
        self.busy = True
        store = self.world.store
        new = GroupObj(0, wire)

        def written(result: Any) -> None:
            self.busy = False
            if isinstance(result, GroupObj):
                self.last_write = self.proc.clock()
                self._apply("group", result)
                self.sent_status = wire
                self.written_status = result.status
                if changed_target:
                    self.last_target_change = now
                    self.world.count("epoch-bump")
                self.poke()
                return

            if not (isinstance(result, WriteError) and result.status == 409):
                self._retry_in(5.0)  # the controller: "reconcile failed; retrying" in 5 s
                return

            def fresh(obj: Any) -> None:
                if isinstance(obj, GroupObj):
                    self._apply("group", obj)
                self.poke()

            self.world.request(self.proc, lambda: store.get("group"), fresh)

        self.world.request(self.proc, lambda: store.update("group", new, expected_rv=body.rv),
                           written)

    def _ensure_partition_leases(self) -> None:
        store = self.world.store
        for p in range(self.world.spec.partitions):
            if p in self.partitions or p in self.requested:
                continue
            self.requested.add(p)
            obj = PartitionLeaseObj(0, p, None, None, 0, None, None)

            def created(result: Any, p: int = p) -> None:
                if isinstance(result, PartitionLeaseObj) or (
                    isinstance(result, WriteError) and result.status == 409
                ):
                    return
                self.requested.discard(p)  # the controller retries a failed pass in 5 s
                self._retry_in(5.0)

            self.world.request(self.proc, functools.partial(store.create, f"partition/{p}", obj),
                               created)

    def _retry_in(self, seconds: float) -> None:
        self._gen += 1
        self.proc.schedule(seconds, self._wake, self._gen)


def _next(deadlines: list[float | None], now: float) -> float | None:
    future = [d for d in deadlines if d is not None]
    return (min(future) - now) if future else None
