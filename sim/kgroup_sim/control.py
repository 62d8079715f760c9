"""The simulated operator: the shipped :func:`kgroup.core.operator.decide.decide` driven on
the simulated API server.

Rule of this module: decide nothing. Like ``kgroup_operator.controller`` it keeps the
caches (a :class:`~kgroup.core.operator.lease_cache.GroupLeases`, pods, the group), runs one pass
when poked or at the plan's deadline, and performs the plan: the status written with the
read ``resourceVersion`` (a 409 re-reads the group), and the lock writes as the core's
request chains, performed by this module's dispatcher ``_drive``/``_perform`` as the
controller's performs them: the partition Leases created
(``kgroup.core.operator.lock_creation.creation_chains``: a 409 reads the name's Lease
back), the expiry and assignment marks written after the status
(``kgroup.core.operator.failure_detector.expiry_chains`` and
``kgroup.core.operator.assignment_marks.mark_chains``; a conditional merge patch is one
atomic read-modify-write at the store, as the API server applies it). Events counted,
outcomes reported back to the memory (by the chains themselves). One pass at a time, as
the controller awaits its status write; its creates and marks run behind the pass (the
controller awaits its creates in its lock pool; here there is no pool to queue in). The
operator's memory lives in one incarnation: an operator restart builds a new one that
knows only what it lists from the store.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from kgroup.core import lease_codec as codec
from kgroup.core.objects import Obj
from kgroup.core.operator.assignment_marks import mark_chains
from kgroup.core.operator.decide import (
    API_RETRY_SECONDS,
    IDLE_RECHECK,
    Expiry,
    Mark,
    Memory,
    Observation,
    Plan,
    decide,
    written,
)
from kgroup.core.operator.failure_detector import expiry_chains
from kgroup.core.operator.lease_cache import GroupLeases, pod_observation
from kgroup.core.operator.lock_creation import creation_chains
from kgroup.core.operator.lock_requests import (
    Answer,
    Chain,
    CreateLease,
    LockRequest,
    MarkAssigned,
    MarkExpired,
    NoAnswer,
    Ok,
    ReadLease,
    Refused,
    Superseded,
    Then,
)
from kgroup.core.operator.planner import PodObservation
from kgroup.core.operator.reshape import Layouts
from kgroup.core.operator.wakeup import Quiet, after_pass, on_timer
from kgroup_sim.kernel import Process
from kgroup_sim.store import WriteError, lease_key

if TYPE_CHECKING:
    from kgroup_sim.world import World

__all__ = ["GROUP_KEY", "SimOperator"]

EPOCH_WALL = datetime(2026, 1, 1, tzinfo=UTC)
STATUS_MIN_INTERVAL = 1.0
GROUP_KEY = "consumergroups/sim"


class SimOperator:
    """One incarnation of the operator (the active replica)."""

    def __init__(self, world: World, proc: Process) -> None:
        self.world = world
        self.proc = proc
        self.memory = self._memory(proc.clock())
        self.leases = GroupLeases(load_window_reports=world.cfg.load_window)
        self.group: Obj | None = None
        self.pods: dict[str, PodObservation] = {}
        self.pod_bodies: dict[str, Obj] = {}
        self.synced: set[str] = set()
        self.rule = world.cfg.expiry_rule()
        self.busy = False
        self._due = False
        self._gen = 0
        self.quiet: Quiet | None = None  # what the last pass saw (kgroup.core.operator.wakeup)

    def _memory(self, now: float) -> Memory:
        """A new memory of the group, with the configured pod identities and layouts (the
        shipped classes, or the broken variants of kgroup_sim.variants)."""
        cfg = self.world.cfg
        return Memory(started_at=now, identities=cfg.identities(),
                      layouts=Layouts(cfg.layout))

    # ---- observations ----------------------------------------------------------------

    def on_list(self, stream: str, items: list[Obj], scope: Any = None) -> None:
        if stream == "lease":
            self.leases.relist(items, self.proc.clock())
        elif stream == "pod":
            self.pods, self.pod_bodies = {}, {}
            for obj in items:
                self._put_pod(obj)
        else:
            if not items and self.group is not None:  # deleted while we did not watch
                self.group = None
                self.memory = self._memory(self.proc.clock())
            for obj in items:
                self._put_group(obj)
        self.synced.add(stream)
        self.poke()

    def on_event(self, stream: str, event_type: str, obj: Obj) -> None:
        if stream == "lease":
            if event_type == "DELETED":
                self.leases.drop(obj)
            elif not self.leases.put(obj, self.proc.clock()):
                return  # a plain renewal: the tracker saw it, the loop sleeps on
        elif stream == "pod":
            if event_type == "DELETED":
                name = codec.meta(obj)["name"]
                self.pods.pop(name, None)
                self.pod_bodies.pop(name, None)
            else:
                self._put_pod(obj)
        elif event_type != "DELETED":
            self._put_group(obj)
        elif self.group is not None and codec.meta(obj).get("uid") == \
                codec.meta(self.group).get("uid"):
            # As the controller's group_deleted: this group's memory ends with it.
            self.group = None
            self.memory = self._memory(self.proc.clock())
        self.poke()

    def _put_group(self, obj: Obj) -> None:
        if self.group is None or codec.not_older(obj, self.group):
            self.group = obj

    def _put_pod(self, obj: Obj) -> None:
        name = codec.meta(obj)["name"]
        old = self.pod_bodies.get(name)
        if old is None or codec.not_older(obj, old):
            self.pod_bodies[name] = obj
            self.pods[name] = pod_observation(obj)

    # ---- the loop --------------------------------------------------------------------

    def poke(self) -> None:
        if not self._due and not self.busy:
            self._due = True
            self.proc.schedule(self.world.loop_latency(), self._run)

    def _run(self) -> None:
        self._due = False
        if self.busy:
            return
        self._after(self.reconcile())

    def _after(self, delay: float | None, *, failed: bool = False) -> None:
        """The controller's loop: sleep until poked or ``delay`` (this clock) passed; after a
        failed request the timer plans whatever the last pass saw."""
        if failed:
            self.quiet = None
        self._gen += 1
        wait = IDLE_RECHECK if delay is None else max(0.0, delay)
        self.proc.schedule(wait / self.proc.rate, self._wake, self._gen)

    def _wake(self, gen: int) -> None:
        """The timer: plan if anything is due (``kgroup.core.operator.wakeup``), else sleep on."""
        if gen != self._gen:
            return
        more = on_timer(self.quiet, self.leases, self.proc.clock())
        if more is None:
            self.poke()
        else:
            self._gen += 1
            self.proc.schedule(more / self.proc.rate, self._wake, self._gen)

    def reconcile(self) -> float | None:
        """One pass; returns seconds (this clock) until the next deadline, or None."""
        now = self.proc.clock()
        obs = Observation(body=self.group, leases=self.leases, pods=list(self.pods.values()),
                          synced=self.synced >= {"group", "lease", "pod"})
        plan = decide(obs, self.memory, now, wall=EPOCH_WALL + timedelta(seconds=now),
                      status_min_interval=STATUS_MIN_INTERVAL, rule=self.rule)
        self.quiet = after_pass(obs.leases, plan.deadlines,
                                None if plan.wait is None else now + plan.wait, now,
                                idle_recheck=IDLE_RECHECK)
        body = self.group
        if body is None:
            return plan.wait
        self._create(body, plan)
        if plan.status is None:
            self._expire(body, plan.expiries)
            self._mark(body, plan.marks)
            return plan.wait
        self._write(body, plan)
        return None  # the write's outcome schedules the next pass

    def _create(self, body: Obj, plan: Plan) -> None:
        """The plan's lock creates: the core's chains (one per lock), driven."""
        for chain in creation_chains(
                plan.create_partitions, group=body, namespace=codec.meta(body)["namespace"],
                duration=plan.lease_duration, owners=plan.owners, uids=plan.uids,
                ledger=self.memory, now=plan.now):
            self._drive(chain, None)

    def _mark(self, body: Obj, marks: list[Mark]) -> None:
        """The plan's assignment marks: the core's chains (one per mark), driven."""
        for chain in mark_chains(marks, group=codec.meta(body)["name"], leases=self.leases,
                                 memory=self.memory, clock=self.proc.clock):
            self._drive(chain, None)

    def _expire(self, body: Obj, expiries: list[Expiry]) -> None:
        """The plan's expiry marks: the core's chains (one per holder session), driven."""
        for chain in expiry_chains(expiries, group=codec.meta(body)["name"],
                                   leases=self.leases, rule=self.rule, ledger=self.memory,
                                   clock=self.proc.clock):
            self._drive(chain, None)

    # ---- the dispatcher: lock requests on the simulated API server ---------------------

    def _drive(self, chain: Chain, answer: Answer | None) -> None:
        """Advance a lock-request chain by one answer; its next request goes out now, or
        what it ended with is done (more chains driven, the loop poked or retried)."""
        try:
            request = chain.send(answer)  # type: ignore[arg-type]
        except StopIteration as stop:
            then: Then = stop.value
            for child in then.chains:
                self._drive(child, None)
            if then.decide:
                self.poke()
            elif then.retry:
                self._after(API_RETRY_SECONDS, failed=True)
            return
        if isinstance(request, MarkAssigned) and not request.wanted():
            self._drive(chain, Superseded())  # its turn is now: no queue to wait in
            return
        self.world.request(self.proc, self._perform(request),
                           lambda result: self._drive(chain, _answer(result)))

    def _perform(self, request: LockRequest) -> Callable[[], Obj | None]:
        """A request as the API server serves it (a conditional merge patch is one atomic
        read-modify-write at the store; WriteError when refused)."""
        store = self.world.store
        if isinstance(request, ReadLease):
            return functools.partial(store.get, lease_key(request.name))
        key = lease_key(request.name)
        if isinstance(request, CreateLease):
            return functools.partial(store.create, key, request.body)
        if isinstance(request, MarkExpired):
            self.world.count("expiry-mark")
            change: Callable[[Obj], Obj] = functools.partial(
                codec.expiry_marked_partition_lease, session=request.session)
        elif isinstance(request, MarkAssigned):
            self.world.count("mark")
            change = functools.partial(codec.marked_partition_lease, member=request.member,
                                       uid=request.uid)
        else:
            raise TypeError(f"unknown request {request!r}")

        def patch() -> Obj | None:
            current = store.get(key)
            if current is None:
                raise WriteError(404, f"{key} not found")
            if codec.meta(current).get("resourceVersion") != request.seen_rv:
                raise WriteError(409, f"{key} changed since {request.seen_rv}")
            return store.update(key, change(current))

        return patch

    def _write(self, body: Obj, plan: Plan) -> None:
        self.busy = True
        store = self.world.store
        new = {**body, "status": plan.status}

        def done(result: Any) -> None:
            self.busy = False
            if isinstance(result, dict):
                self._put_group(result)
                events = written(self.memory, plan, result, self.proc.clock())
                self._expire(result, plan.expiries)
                self._mark(result, plan.marks)
                if plan.decision is not None and plan.decision.target is not None:
                    self.world.count("epoch-bump")
                for event in events:
                    self.world.trace("operator", event)
                self._after(plan.wait)
                return
            if not (isinstance(result, WriteError) and result.status == 409):
                # no answer, or refused otherwise: the controller's "API unavailable"
                self._after(API_RETRY_SECONDS, failed=True)
                return

            def fresh(obj: Any) -> None:
                if isinstance(obj, dict):
                    self._put_group(obj)
                    self.poke()
                else:
                    self._after(API_RETRY_SECONDS, failed=True)

            self.world.request(self.proc, lambda: store.get(GROUP_KEY), fresh)

        self.world.request(self.proc, lambda: store.update(GROUP_KEY, new), done)


def _answer(result: Any) -> Answer:
    """What the client sees: the object, the refusal's status, or no answer at all."""
    if isinstance(result, WriteError):
        return Refused(result.status)
    if isinstance(result, dict) or result is None:
        return Ok(result)
    return NoAnswer(str(result))
