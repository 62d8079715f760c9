"""The sidecar's asyncio driver: runs :class:`kgroup.core.member.converge.SidecarLogic`.

It decides nothing. Watch lists and events go into the logic; every change sets
``dirty``; the loop then calls ``tick()``, starts each request chain it returns as a task,
hands the watch scope to the Kubernetes adapter, and waits for the next change or the
tick's wake-up. A chain's requests are mapped onto Kubernetes calls one by one: an HTTP
error is answered as ``Refused(status)``, a timeout or broken connection as ``NoAnswer``.
What the logic reports goes to the logs, metrics, audit file and the app's waiting
release requests. The simulation (``kgroup_sim.sidecar``) drives the same logic.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kgroup.core.assignment import View
from kgroup.core.member import journal as ev
from kgroup.core.member.converge import SidecarLogic
from kgroup.core.member.readiness import Readiness, readiness
from kgroup.core.member.reconcile import Member
from kgroup.core.member.requests import (
    Answer,
    Chain,
    CreateLease,
    DeleteLease,
    GetLease,
    NoAnswer,
    Ok,
    Pause,
    Refused,
    ReplaceLease,
    Request,
)
from kgroup.core.objects import Obj
from kgroup_sidecar.audit import AuditLog
from kgroup_sidecar.events import EventPoster
from kgroup_sidecar.health import SidecarHealth
from kgroup_sidecar.kube import KubeAdapter, status_of
from kgroup_sidecar.metrics import Metrics
from kgroup_sidecar.probe_files import ProbeFiles
from kgroup_sidecar.settings import Settings

log = logging.getLogger(__name__)


class Sidecar:
    """One sidecar process: the logic, its Kubernetes adapter, its app's waiters."""

    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = Metrics(namespace=settings.namespace, group=settings.group,
                               member=settings.pod_name)
        self.audit = AuditLog(settings.audit_file, settings.pod_name)
        self.logic = SidecarLogic(
            pod=settings.pod_name, group=settings.group, namespace=settings.namespace,
            clock=clock, wall=lambda: datetime.now(UTC),
            new_session=lambda: secrets.token_hex(8), journal=self,
            termination_grace=settings.termination_grace_seconds, uid=settings.pod_uid,
            app_timeout=settings.app_timeout_seconds,
        )
        self.health = SidecarHealth(identity=self.metrics.identity, held=self.held,
                                    clock=clock, stall_after=settings.stall_after_seconds,
                                    registry=self.metrics.registry,
                                    observed=self.logic.app.stalls,
                                    silent_after=settings.app_timeout_seconds or None)
        self.health.on_stalled = lambda h: self.post_event(
            "Warning", "PartitionStalled",
            f"partition {h.partition} (token {h.token}) makes no progress: "
            f"{h.reason or 'no reason given'}")
        self.logic.health_summary = self.health.summary
        self.logic.load_summary = self.health.load
        self.release_waiters: dict[tuple[int, int], list[asyncio.Future[bool]]] = {}
        self.kube: KubeAdapter | None = None
        # Events on this pod (main sets it; None in tests and the swarm: nothing posted)
        self.events: EventPoster | None = None
        # The exec probes' files (main sets it when KGROUP_PROBE_DIR is set)
        self.probe_files: ProbeFiles | None = None
        self.dirty = asyncio.Event()
        self.changed = asyncio.Event()
        self._published = -1
        self._ready: bool | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def member(self) -> Member:
        return self.logic.member

    def held(self) -> dict[int, int]:
        """partition -> token of what the member holds now (active or revoking)."""
        return self.member.held_tokens(self.clock())

    # ---- observations ---------------------------------------------------------------

    def on_list(self, kind: str, items: list[Obj], scope: frozenset[int] | None = None) -> None:
        self.logic.on_list(kind, items, scope)
        self.dirty.set()

    def on_event(self, kind: str, event_type: str, obj: Obj) -> None:
        self.logic.on_event(kind, event_type, obj)
        self.dirty.set()

    # ---- what the logic reports -----------------------------------------------------

    def record(self, event: ev.Event) -> None:
        match event:
            case ev.Warned(message=message):
                log.warning("%s", message)
            case ev.SessionStarted(session=session):
                log.info("session %s started", session)
                self.audit.write("session", session=session)
            case ev.SessionStartFailed(why=why):
                log.warning("could not start a session: %s", why)
            case ev.RenewFailed(why=why, lost=lost):
                self.metrics.renew_failed()
                log.warning("renewal failed: %s%s", why, " (session lost)" if lost else "")
            case ev.Acquired():
                self.metrics.acquired()
                log.info("acquired partition %d (token %d)%s", event.partition, event.token,
                         ": a write reported failed was applied" if event.adopted else "")
                self.audit.write("acquire", session=event.session, partition=event.partition,
                                 token=event.token, position=event.position)
            case ev.AcquireFailed(partition=partition, why=why):
                log.info("acquisition of partition %d failed: %s", partition, why)
            case ev.Lost(session=session, partition=partition, token=token):
                self.metrics.lost_partition()
                self.audit.write("lost", session=session, partition=partition, token=token)
                log.error("partition %d (token %d) was taken by another session", partition,
                          token)
                self.post_event("Warning", "PartitionLost",
                                f"partition {partition} (token {token}) was taken by "
                                "another session while this pod held it")
            case ev.Fenced(session=session, until=until, partitions=partitions):
                self.metrics.fenced()
                log.warning("session %s fenced: %d partition(s) lost", session, len(partitions))
                given_up = ", ".join(f"{p} (token {t})" for p, t in sorted(partitions))
                self.post_event("Warning", "Fenced",
                                f"session {session} could not renew its member Lease in time: "
                                f"{len(partitions)} partition(s) given up: {given_up or '-'}")
                self.audit.write("fence", session=session, until=until, partitions=partitions)
            case ev.Revoking(partition=partition, token=token):
                log.info("partition %d revoking (token %d)", partition, token)
            case ev.Releasing():
                if event.reason == "drain-timeout":
                    log.warning("partition %d (token %d): the app did not release it within "
                                "the drain timeout; released without a new position",
                                event.partition, event.token)
                    self.post_event("Warning", "HandoffTimedOut",
                                    f"partition {event.partition} (token {event.token}): the "
                                    "app did not release it within the drain timeout; released "
                                    "without a new position (the next owner resumes from the "
                                    "last one)")
                self.audit.write("release", session=event.session, partition=event.partition,
                                 token=event.token, position=event.position,
                                 reason=event.reason)
            case ev.Released(partition=partition, token=token, position=position):
                self.metrics.released()
                log.info("released partition %d (token %d, position %s)", partition, token,
                         position)
            case ev.ReleaseFailed(partition=partition, why=why):
                log.info("release of partition %d failed: %s", partition, why)
            case ev.EndSessionFailed(why=why):
                log.warning("could not delete the member Lease: %s", why)
            case ev.SessionEnded(session=session):
                self.audit.write("session-end", session=session)
            case ev.Resolved(partition=partition, token=token, ok=ok):
                for future in self.release_waiters.pop((partition, token), []):
                    if not future.done():
                        future.set_result(ok)

    def post_event(self, type_: str, reason: str, message: str) -> None:
        """An Event on this pod (best effort, in the background); nothing without a poster."""
        if self.events is not None:
            self.events.post_soon(type_, reason, message)

    # ---- the loop -------------------------------------------------------------------

    def publish(self) -> None:
        view = self.member.view(self.clock())
        self.metrics.publish(view)
        verdict = self.readiness(view)
        if verdict.ready != self._ready:
            # The exec probe can only say the ``ready`` file is missing ("find: ... No such
            # file" in the pod's Events): the log says why, once per change.
            self._ready = verdict.ready
            log.info("%s: %s", "ready" if verdict.ready else "not ready", verdict.reason)
        if self.probe_files is not None:
            self.probe_files.set_ready(verdict.ready)
        if self.member.version != self._published:
            self._published = self.member.version
            self.changed.set()
            self.changed = asyncio.Event()

    def readiness(self, view: View | None = None) -> Readiness:
        """``GET /readyz``: Ready once the app has taken up the whole target, held and its
        epoch acknowledged (``kgroup.core.member.readiness``); ``view``: the member's view
        now, if at hand."""
        now = self.clock()
        return readiness(view or self.member.view(now), self.logic.target,
                         member=self.logic.in_target, stopping=self.member.shutting_down,
                         acked_partitions=self.member.acked_partitions,
                         app=self.logic.app, now=now)

    # ---- the app's part (kgroup.core.member.app_presence) -----------------------------

    def app_called(self, *, asked: bool = False, poll: bool = False) -> None:
        """A call of the app arrived (``asked``: GET /v1/assignment; ``poll``: a long-poll
        of it, open until :meth:`app_poll_closed`). A call that lets the app join again or
        takes a partition up steps the loop at once (a session start, the readiness)."""
        app, now = self.logic.app, self.clock()
        if poll:
            changes = app.poll_opened(now)
        elif asked:
            changes = app.asked(now)
        else:
            changes = app.called(now)
        if changes:
            self.dirty.set()

    def app_poll_closed(self) -> None:
        self.logic.app.poll_closed(self.clock())

    def app_served(self, view: View) -> None:
        """An answer served ``view`` to the app: its partitions are seen."""
        self.logic.app.served(((p.partition, p.token) for p in view.partitions),
                              key=view.partitions)

    def begin_shutdown(self) -> None:
        if self.logic.begin_shutdown():
            log.info("SIGTERM: revoking every partition, then ending the session")
            self.dirty.set()

    async def run(self, kube: KubeAdapter) -> None:
        self.kube = kube
        kube.start()
        while True:
            self.dirty.clear()
            tick = self.logic.tick()
            for chain in tick.chains:
                self._spawn(self._drive(chain))
            kube.set_partition_scope(tick.scope)
            self.publish()
            if tick.exit is not None:
                if tick.exit != "session ended":
                    log.warning("%s: exiting with partitions still held", tick.exit)
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.dirty.wait(), tick.wake_in)
        kube.stop()
        for task in list(self._tasks):
            task.cancel()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drive(self, chain: Chain) -> None:
        """Run one request chain: each request becomes a call, each outcome an answer."""
        try:
            answer: Answer | None = None
            while True:
                try:
                    request = chain.send(answer)  # type: ignore[arg-type]
                except StopIteration:
                    return
                answer = await self.perform(request)
        finally:
            self.publish()
            self.dirty.set()

    async def perform(self, request: Request) -> Answer:
        kube = self.kube
        assert kube is not None
        try:
            if isinstance(request, Pause):
                await asyncio.sleep(request.seconds)
                return Ok()
            if isinstance(request, GetLease):
                return Ok(await kube.get_lease(request.name, timeout=request.timeout,
                                               session=request.session))
            if isinstance(request, CreateLease):
                return Ok(await kube.create_lease(request.body, timeout=request.timeout))
            if isinstance(request, ReplaceLease):
                return Ok(await kube.replace_lease(request.body, timeout=request.timeout))
            if isinstance(request, DeleteLease):
                await kube.delete_lease(request.name, timeout=request.timeout,
                                        session=request.session)
                return Ok()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            status = status_of(exc)
            if status is not None:
                return Refused(status, str(getattr(exc, "reason", "") or ""))
            text = str(exc).splitlines()[0] if str(exc) else ""
            return NoAnswer(f"{type(exc).__name__} {text}"[:200])
        raise TypeError(f"unknown request {request!r}")

    # ---- app requests ---------------------------------------------------------------

    async def app_release(self, partition: int, token: int, position: str | None,
                          timeout: float, completed: bool = False) -> bool:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.release_waiters.setdefault((partition, token), []).append(future)
        self.logic.app_release(partition, token, position, completed)
        self.dirty.set()
        return await asyncio.wait_for(future, timeout)
