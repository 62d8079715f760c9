"""One ConsumerGroup's reconcile loop: the kopf side's driver of
:func:`kgroup.core.operator.decide.decide`.

Rules of this module: it decides nothing. It gathers the observation from the
:class:`~kgroup.core.operator.lease_cache.Cache`, performs the plan (create partition Leases,
post Events, write the status with the read ``resourceVersion``), reports the outcomes
back to the memory, and sleeps until poked by a watch event or until the plan's next
deadline, never polling. A 409 on the status write re-reads the group and decides again.
The lock writes are the core's request chains, performed by this module's dispatcher
``_drive``/``_perform``: the creates first
(``kgroup.core.operator.lock_creation.creation_chains``: a create refused with 409 reads
the Lease holding the name back, a squatter is a problem in the status; one refused
otherwise or not answered ends the pass, decided again after the retry pause), then,
after the status write succeeded (or at once when the pass writes none), the expiry marks
(``kgroup.core.operator.failure_detector.expiry_chains``: each holder's member Lease
re-read first) and the assignment marks
(``kgroup.core.operator.assignment_marks.mark_chains``: a mark no longer wanted at its
turn is dropped); a mark refused because the lock changed re-reads the lock and decides
again; each stored mark goes into the cache at once. A pass awaits its creates (the
slice) and its status write, not its marks: those run behind it (``writes``) in the lock
gate's order (a crash's expiry marks first, then assignment marks, then the next slice's
creates), and a mark a later pass superseded is dropped when its turn comes. The
retired partitions' Leases the plan names are deleted behind them, last
(``kgroup.core.operator.retention``: each delete conditional on the Lease's
resourceVersion as read). The memory knows what is in flight (``requested_leases``,
``marks_sent``, ``expiries_sent``), so no pass sends it twice.
With ``spec.autoscaling``, the target's Scale is read at most every
:data:`SCALE_READ_SECONDS` (and after each change), and a change the plan asks for is
written through the scale subresource before the pass's other writes, followed by an
Event; a refused or failed scale write is a problem in the status, never a failed pass.
The simulated operator (``kgroup_sim.control``) drives the same decisions and chains and,
like this loop, awaits only its status write before the next pass may run (its simulated
requests have no pool to queue in, so it does not await its creates either).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from kgroup.apiclient import ApiError
from kgroup.core.lease_codec import not_older
from kgroup.core.operator import lock_requests
from kgroup.core.operator.assignment_marks import mark_chains
from kgroup.core.operator.autoscale import ScaleChange
from kgroup.core.operator.decide import (
    API_RETRY_SECONDS,
    FAILED_PASS_RETRY_SECONDS,
    IDLE_RECHECK,
    Event,
    ExpiryRule,
    Memory,
    Observation,
    Plan,
    decide,
    written,
)
from kgroup.core.operator.failure_detector import expiry_chains
from kgroup.core.operator.lease_cache import Cache, GroupKey
from kgroup.core.operator.lock_creation import creation_chains
from kgroup.core.operator.lock_requests import (
    Answer,
    Chain,
    CreateLease,
    DeleteLease,
    Lane,
    LockRequest,
    MarkAssigned,
    MarkExpired,
    NoAnswer,
    Ok,
    ReadLease,
    Refused,
    Then,
)
from kgroup.core.operator.retention import Deletion, deletion_chains
from kgroup.core.operator.wakeup import Quiet, after_pass, on_timer, pass_pause, read_pause
from kgroup.crd_models import ConsumerGroupSpec, LabelSelector

from .kube import API_ERRORS, Conflict, Kube, Superseded
from .lock_gate import Urgency
from .metrics import Metrics
from .settings import OperatorSettings

log = logging.getLogger(__name__)

SCALE_READ_SECONDS = 30.0
"""``spec.autoscaling``'s target's Scale is read at most this often (the recommendation
it is compared with changes at most every 30 s)."""

_URGENCY = {Lane.EXPIRY: Urgency.EXPIRY, Lane.MARK: Urgency.MARK, Lane.CREATE: Urgency.CREATE}
"""The lock gate's rank of a read, by the write it is for."""

FAILURES_UNHEALTHY = 3
"""Passes of one group failing in a row (not for the API server) that make the operator's
liveness probe fail: a restart is the one repair left to a process that cannot plan."""


class GroupController:
    """The reconcile loop of one group; created on first sight, cancelled on deletion."""

    def __init__(
        self,
        key: GroupKey,
        *,
        cache: Cache,
        kube: Kube,
        metrics: Metrics,
        settings: OperatorSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.key = key
        self.clock = clock
        self.cache = cache
        self.kube = kube
        self.metrics = metrics
        self.settings = settings
        self.body: dict[str, Any] | None = None
        self.poked = asyncio.Event()
        self.memory = Memory(started_at=clock())
        self.task: asyncio.Task[None] | None = None
        self.selector: LabelSelector | None = None
        self.rule = ExpiryRule()
        self.leases_listed = False  # set by the group's Lease watch after its listing
        self.active_at: float | None = None  # the last poke or pass (the watch's pace)
        self.hurry: Callable[[], None] = lambda: None  # ends the Lease watch's pause
        self.failures = 0  # passes in a row that failed for a reason other than the API
        self.last_error = ""
        self.quiet: Quiet | None = None  # what the last pass saw (None: plan at the timer)
        self.writes: set[asyncio.Task[bool]] = set()  # marks and expiry marks in flight
        self.decide_seconds = 0.0  # how long the last decision held the loop
        # spec.autoscaling's target: (kind, name) last read, when, its Scale, the problem
        self.scale_ref: tuple[str, str] | None = None
        self.scale_read_at = -1e9
        self.scale: dict[str, Any] | None = None
        self.scale_problem: str | None = None

    def update(self, body: dict[str, Any]) -> None:
        """A fresher body of the group (watch event or write response); pokes the loop."""
        if self.body is None or not_older(body, self.body):
            self.body = body
            try:
                self.selector = LabelSelector.model_validate(body.get("spec", {})["selector"])
            except (KeyError, ValidationError):
                self.selector = None
        self.poke()

    def poke(self) -> None:
        self.active_at = self.clock()
        self.poked.set()
        self.hurry()

    def read_pause(self) -> float:
        """The pause of the group's Lease watch between reads (its ``pause``): short while
        the group moves, longer once it is quiet
        (:func:`~kgroup.core.operator.wakeup.read_pause`)."""
        status = (self.body or {}).get("status") or {}
        rebalancing = isinstance(status, dict) and status.get("phase") == "Rebalancing"
        return read_pause(self.active_at, rebalancing, self.clock())

    def problem(self) -> str | None:
        """Why this group's loop cannot do its job (None: it can): its task ended, or its
        last :data:`FAILURES_UNHEALTHY` passes failed (a bug, not the API server)."""
        if self.task is not None and self.task.done() and not self.task.cancelled():
            exc = self.task.exception()
            return f"{self.key[0]}/{self.key[1]}: loop ended ({exc!r})"
        if self.failures >= FAILURES_UNHEALTHY:
            return (f"{self.key[0]}/{self.key[1]}: {self.failures} passes failed in a row "
                    f"(last: {self.last_error})")
        return None

    def start(self) -> None:
        self.task = asyncio.create_task(self.run(), name=f"kgroup:{self.key[0]}/{self.key[1]}")

    async def stop(self) -> None:
        for write in list(self.writes):
            write.cancel()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        await self.drained()

    async def drained(self) -> None:
        """Until no mark or expiry mark of this group is in flight."""
        while self.writes:
            await asyncio.gather(*list(self.writes), return_exceptions=True)

    def _behind(self, name: str, chains: Iterable[Chain]) -> None:
        """``chains`` (lock writes) run behind the pass; when one asked for the retry pause,
        or they failed, it is logged and the group decided again :data:`API_RETRY_SECONDS`
        later (an exception not from the API is counted as a failed pass's would be)."""
        task = asyncio.create_task(self._drive_all(chains),
                                   name=f"kgroup:{self.key[0]}/{self.key[1]}:{name}")
        self.writes.add(task)
        task.add_done_callback(self._written)

    def _written(self, task: asyncio.Task[bool]) -> None:
        self.writes.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            if not task.result():
                return
            log.warning("lock writes of %s/%s: API unavailable; deciding again", *self.key)
        elif isinstance(exc, API_ERRORS):
            log.warning("lock writes of %s/%s: API unavailable (%s); deciding again",
                        *self.key, type(exc).__name__)
        else:
            log.error("lock writes of %s/%s failed; deciding again", *self.key, exc_info=exc)
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {str(exc)[:200]}"
        asyncio.get_running_loop().call_later(API_RETRY_SECONDS, self.poke)

    async def run(self) -> None:
        """Plan when poked (a material change: ``kgroup.core.operator.lease_cache``) or when a
        deadline is due; a timer that finds nothing due (the earliest session expiry it
        waited for was renewed meanwhile) only sleeps on (``kgroup.core.operator.wakeup``)."""
        delay: float | None = 0.0
        while True:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation
            # that arrives as the poke does, and stop() then waits a whole IDLE_RECHECK
            try:
                async with asyncio.timeout(delay):
                    await self.poked.wait()
            except TimeoutError:
                more = on_timer(self.quiet, self.cache.group(self.key), self.clock())
                if more is not None:
                    delay = more
                    continue
            self.poked.clear()
            self.quiet = None
            try:
                delay = await self.reconcile()
                self.active_at = self.clock()
                self.failures = 0
            except asyncio.CancelledError:
                raise
            except API_ERRORS as exc:
                self.quiet = None
                log.warning("reconcile of %s/%s: API unavailable (%s); retrying", *self.key,
                            type(exc).__name__)
                delay = API_RETRY_SECONDS  # not a failure of ours: a restart would not help
            except Exception as exc:
                self.quiet = None
                log.exception("reconcile of %s/%s failed; retrying", *self.key)
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {str(exc)[:200]}"
                delay = FAILED_PASS_RETRY_SECONDS
            if delay is None:
                delay = IDLE_RECHECK
            delay = max(0.0, delay)
            pause = pass_pause(self.decide_seconds)
            if pause > 0:  # let the writes in flight and the watches run (wakeup.pass_pause)
                await asyncio.sleep(pause)
                delay = max(0.0, delay - pause)

    # -- one pass -------------------------------------------------------------------------

    async def reconcile(self) -> float | None:
        """One pass; returns seconds until the next deadline (None: none)."""
        namespace, name = self.key
        await self._read_scale()
        obs = Observation(
            body=self.body, leases=self.cache.group(self.key),
            pods=list(self.cache.pods.get(namespace, {}).values()),
            synced=self.cache.synced and self.leases_listed,
            kept_ordinals=self.cache.kept_ordinals(namespace),
            replicas=_replicas(self.scale), scale_problem=self.scale_problem,
        )
        started = time.perf_counter()
        plan = decide(obs, self.memory, self.clock(), wall=datetime.now(UTC),
                      status_min_interval=self.settings.status_min_interval, rule=self.rule)
        self.decide_seconds = time.perf_counter() - started
        self.metrics.planned(self.key)
        self.quiet = after_pass(
            obs.leases, plan.deadlines, None if plan.wait is None else plan.now + plan.wait,
            plan.now, idle_recheck=IDLE_RECHECK)
        body = self.body
        if body is None:
            return plan.wait
        if plan.scale is not None and await self._scale(body, plan.scale):
            self.poke()  # the next pass shows the change in the status
        # the slice's creates, awaited: the next slice's pass follows once they are done
        if await self._drive_all(creation_chains(
                plan.create_partitions, group=body, namespace=namespace,
                duration=plan.lease_duration, owners=plan.owners, uids=plan.uids,
                ledger=self.memory, now=plan.now)):
            self.quiet = None  # a create refused or not answered: the pass ends there
            log.warning("lock creates of %s/%s: refused or not answered; retrying", *self.key)
            return API_RETRY_SECONDS
        if plan.new_status is not None:
            self.metrics.observed(self.key, unowned=plan.new_status.unowned,
                                  members=plan.members, partitions=_partitions(body),
                                  stalled=plan.new_status.stalled)
            self.metrics.loaded(self.key, plan.new_status.load)
        await self._post(body, plan.events)
        if plan.status is None:
            self._send_marks(plan)
            return plan.wait
        try:
            stored = await self.kube.replace_status(body, plan.status)
        except Conflict:
            self.quiet = None
            log.info("status of %s/%s changed under us; re-reading", namespace, name)
            fresh = await self.kube.get_group(namespace, name)
            if fresh is not None:
                self.body = fresh
            return 0.0
        self.metrics.status_written(self.key)
        self.body = stored
        events = written(self.memory, plan, stored, self.clock())
        decision = plan.decision
        if decision is not None and decision.target is not None:
            log.info("%s/%s: epoch %d: %s (%d moved)", namespace, name, decision.epoch,
                     decision.reason, decision.moved)
            self.metrics.rebalanced(self.key, decision.moved)
        done = plan.new_status.last_rebalance if plan.new_status else None
        if any(e.reason == "RebalanceCompleted" for e in events) and done is not None:
            self.metrics.completed(self.key, done.duration_seconds or 0.0)
        await self._post(stored, events)
        self._send_marks(plan)
        return plan.wait

    async def _read_scale(self) -> None:
        """Read spec.autoscaling's target's Scale when due (``self.scale``; None: no
        autoscaling, or the target is missing, then ``self.scale_problem`` says so)."""
        spec = self.memory.spec_of((self.body or {}).get("spec") or {})
        if not isinstance(spec, ConsumerGroupSpec) or spec.autoscaling is None:
            self.scale_ref, self.scale, self.scale_problem = None, None, None
            return
        ref = spec.autoscaling.scale_target_ref
        key = (ref.kind, ref.name)
        now = self.clock()
        if key == self.scale_ref and now < self.scale_read_at + SCALE_READ_SECONDS:
            return
        self.scale_ref, self.scale_read_at = key, now
        try:
            self.scale = await self.kube.read_scale(self.key[0], ref.kind, ref.name)
        except ApiError as exc:
            if exc.status not in (401, 403):
                raise
            self.scale = None
            self.scale_problem = (f"cannot read the scale of {ref.kind} {ref.name}: "
                                  f"{exc.status} {exc.reason} (the chart grants get, patch "
                                  f"and update on deployments/scale and statefulsets/scale)")
            return
        self.scale_problem = None if self.scale is not None else (
            f"spec.autoscaling.scaleTargetRef: {ref.kind} {ref.name} not found in "
            f"{self.key[0]}")

    async def _scale(self, body: dict[str, Any], change: ScaleChange) -> bool:
        """Write ``change`` through the target's scale subresource, conditional on the
        Scale as read; an Event once written. False: not written (read again next pass)."""
        ref = self.scale_ref
        seen = (self.scale or {}).get("metadata", {}).get("resourceVersion")
        if ref is None or seen is None:
            return False
        kind, target = ref
        self.scale_read_at = -1e9  # read again at the next pass, whatever happens
        try:
            stored = await self.kube.patch_scale(self.key[0], kind, target,
                                                 replicas=change.replicas, seen_rv=str(seen))
        except API_ERRORS as exc:
            why = f"{exc.status} {exc.reason}" if isinstance(exc, ApiError) \
                else type(exc).__name__
            self.scale_problem = f"cannot set the replicas of {kind} {target}: {why}"
            log.warning("%s/%s: %s", *self.key, self.scale_problem)
            return False
        if stored is None:  # changed since read, or gone: the next pass reads it again
            return False
        self.scale, self.scale_problem = stored, None
        self.memory.scaled(change, self.clock(), datetime.now(UTC))
        log.info("%s/%s: %s %s: %d -> %d replicas (%s)", *self.key, kind, target,
                 change.previous, change.replicas, change.reason)
        await self.kube.post_event(
            body, type_="Normal", reason="Scaled",
            message=f"{kind} {target}: {change.previous} -> {change.replicas} replicas: "
                    f"{change.reason}")
        return True

    def _send_marks(self, plan: Plan) -> None:
        """The plan's expiry marks, then its assignment marks, then its deletes of retired
        partitions' Leases, behind the pass."""
        if plan.expiries:  # in flight from now: no later pass sends them again
            self._behind("expiries", expiry_chains(
                plan.expiries, group=self.key[1], leases=self.cache.group(self.key),
                rule=self.rule, ledger=self.memory, clock=self.clock))
        if plan.marks:
            self._behind("marks", mark_chains(
                plan.marks, group=self.key[1], leases=self.cache.group(self.key),
                memory=self.memory, clock=self.clock))
        if plan.deletions:
            self._behind("deletions", deletion_chains(
                plan.deletions, ledger=self.memory, gone=self._gone))

    def _gone(self, deletion: Deletion) -> None:
        """A retired partition's Lease was deleted: out of the cache at once (its watch
        event follows)."""
        leases = self.cache.group(self.key)
        body = leases.bodies.get(deletion.name)
        if body is not None:
            leases.drop(body)

    # -- the dispatcher: lock-request chains (kgroup.core.operator.lock_requests) ----------

    async def _drive_all(self, chains: Iterable[Chain]) -> bool:
        """``chains`` side by side; whether one asked for the retry pause (the caller
        decides again after it). The first failure is raised once all are done."""
        results = await asyncio.gather(*(self._drive(c) for c in chains),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return any(results)

    async def _drive(self, chain: Chain) -> bool:
        """One chain: each request performed, each outcome its answer; then what it ended
        with (the loop poked now, more chains); whether it or a chain it started asked for
        the retry pause."""
        answer: Answer | None = None
        try:
            while True:
                try:
                    request = chain.send(answer)  # type: ignore[arg-type]
                except StopIteration as stop:
                    then: Then = stop.value
                    break
                answer = await self._perform(request)
        finally:
            chain.close()  # a chain left unfinished reports its writes failed
        if then.note:
            log.info("%s/%s: %s", *self.key, then.note)
        if then.decide:
            self.poke()
        retry = then.retry and not then.decide
        return await self._drive_all(then.chains) or retry

    async def _perform(self, request: LockRequest) -> Answer:
        """One request as a call of the API server; its outcome as the answer."""
        namespace, name = self.key
        try:
            if isinstance(request, ReadLease):
                return Ok(await self.kube.get_lease(namespace, request.name,
                                                    _URGENCY[request.lane]))
            if isinstance(request, CreateLease):
                stored = await self.kube.create_partition_lease(namespace=namespace,
                                                                body=request.body)
            elif isinstance(request, MarkExpired):
                stored = await self.kube.mark_partition_expired(
                    namespace=namespace, group=name, partition=request.partition,
                    session=request.session, seen_rv=request.seen_rv)
            elif isinstance(request, DeleteLease):
                try:
                    deleted = await self.kube.delete_partition_lease(
                        namespace=namespace, name=request.name, seen_rv=request.seen_rv,
                        uid=request.uid)
                except ApiError as exc:
                    if exc.status != 403:
                        raise
                    log.warning("%s/%s: delete of Lease %s forbidden: %s", *self.key,
                                request.name, str(exc.body or exc.reason)[:500])
                    return Refused(403)
                return Ok() if deleted else Refused(409)
            elif isinstance(request, MarkAssigned):
                stored = await self.kube.mark_partition_lease(
                    namespace=namespace, group=name, partition=request.partition,
                    member=request.member, uid=request.uid, seen_rv=request.seen_rv,
                    wanted=request.wanted)
            else:
                raise TypeError(f"unknown request {request!r}")
        except Superseded:
            return lock_requests.Superseded()
        except API_ERRORS as exc:
            return NoAnswer(type(exc).__name__)
        return Ok(stored) if stored is not None else Refused(409)  # 409 or 404: changed

    async def _post(self, body: dict[str, Any], events: list[Event]) -> None:
        for event in events:
            if event.type == "Warning":
                log.warning("%s/%s: %s: %s", *self.key, event.reason, event.message)
            await self.kube.post_event(body, type_=event.type, reason=event.reason,
                                       message=event.message)


def _replicas(scale: dict[str, Any] | None) -> int | None:
    """A Scale's ``spec.replicas`` (0 is left out of the wire form); None: no Scale."""
    if scale is None:
        return None
    value = (scale.get("spec") or {}).get("replicas", 0)
    return value if isinstance(value, int) else None


def _partitions(body: dict[str, Any]) -> int | None:
    count = body.get("spec", {}).get("partitions")
    return count if isinstance(count, int) else None
