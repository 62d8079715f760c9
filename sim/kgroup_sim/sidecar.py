"""The simulated sidecar: the shipped :class:`kgroup.core.member.converge.SidecarLogic`
driven on the simulated API server, and the app beside it.

Rule of this module: decide nothing about Kubernetes. Like ``kgroup_sidecar.runtime`` it
feeds watch lists and events to the logic, ticks it on every change and at its wake-up,
and maps each request of a chain onto the store (through the world's faulty network: a
request or its answer may be lost, late or cut off; a lost answer is ``NoAnswer``). The
regressions of ``kgroup_sim.variants`` are subclasses of the logic itself.

The simulated app polls the view (``Member.view`` on this process's clock, as the client
does), opens the fenced sink with every token it is handed, writes under it while the
partition is in its view, and acknowledges a revocation after a random delay, or never
(the drain timeout then releases it).

With the app's part on (``SimConfig.app_timeout`` > 0) the app is a follower as
``kgroup.follower`` is: it starts after a delay (a slow start-up, as a Spark session's),
keeps a long-poll open, is served every view it reads and calls again at once (takes it
up), and reports each partition's health at every tick into the sidecar's health book.
A sealed partition (a reshape replaced it: ``Reshapes.sealed``, :mod:`kgroup_sim.reshapes`)
is drained: from the time the app first sees it active and sealed, it reads the
partition's backlog (``Reshapes.backlog``, simulated seconds; an empty one at once), then
hands it back as completed with the seal's position, the release a real app makes with
``"completed": true`` (``check_release`` then ``SidecarLogic.app_release``, as the
sidecar's HTTP API does).

Faults of the app: it falls **silent** for a while (no call, no poll: hung), or goes
**blind** (it keeps polling but believes it lost its partitions, as the old ``listen``
did: it processes and reports nothing any more).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from kgroup.core.health import HealthBook, Report
from kgroup.core.member.converge import SidecarLogic
from kgroup.core.member.journal import Event
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
from kgroup_sim.kernel import TIMEOUT, Process
from kgroup_sim.store import Store, WriteError, lease_key

if TYPE_CHECKING:
    from kgroup_sim.world import World

__all__ = ["GROUP", "NAMESPACE", "SimSidecar", "answer_of", "perform"]

GROUP = "sim"
NAMESPACE = "sim"
WALL_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
MemberFactory = Callable[[str], Member]


def perform(store: Store, request: Request, caller_uid: str | None = None) -> Obj | None:
    """A request as the API server would serve it (raises WriteError when refused);
    ``caller_uid``: the uid of the caller's pod (its pod-bound token's)."""
    if isinstance(request, GetLease):
        return store.get(lease_key(request.name))
    if isinstance(request, CreateLease):
        return store.create(lease_key(request.body["metadata"]["name"]), request.body)
    if isinstance(request, ReplaceLease):
        return store.update(lease_key(request.body["metadata"]["name"]), request.body,
                            caller_uid=caller_uid)
    if isinstance(request, DeleteLease):
        store.delete(lease_key(request.name))
        return None
    raise TypeError(f"not a request to the API server: {request!r}")


def answer_of(result: Any) -> Answer:
    """What the client sees: the object, the refusal's status, or no answer at all."""
    if result is TIMEOUT:
        return NoAnswer("timeout")
    if isinstance(result, WriteError):
        return Refused(result.status)
    if isinstance(result, Exception):
        raise result  # a bug in the simulation, not a fault to simulate
    return Ok(result)


class SimSidecar:
    """One incarnation of a member pod: its sidecar process and its app."""

    def __init__(self, world: World, proc: Process, *, logic: type[SidecarLogic],
                 factory: MemberFactory) -> None:
        self.world = world
        self.proc = proc
        self.pod = proc.name
        self.logic = logic(
            pod=self.pod, group=GROUP, namespace=NAMESPACE, clock=proc.clock,
            wall=lambda: WALL_EPOCH + timedelta(seconds=proc.clock()),
            new_session=lambda: f"{self.pod}.{world.new_id()}", journal=self,
            termination_grace=world.cfg.termination_grace, member=factory(self.pod),
            app_timeout=world.cfg.app_timeout,
        )
        self.key = 0  # the world's incarnation number
        self.uid: str | None = None  # its pod's uid (the world sets it once the pod exists)
        self._step_due = False
        self._wake_gen = 0
        # the app
        self.opened: set[tuple[int, int, str]] = set()
        self.ack_planned: set[tuple[int, int]] = set()
        self.writes = 0
        self._observed_version = -1
        self.draining: set[tuple[int, int]] = set()  # (partition, token) read to its seal
        # the app's part (SimConfig.app_timeout > 0)
        self.app_up = False  # started (asked for its assignment)
        self.app_silent = False  # hung: no call at all
        self.app_blind = False  # polls on, but processes and reports nothing
        self.health = HealthBook(silent_after=(world.cfg.app_timeout or None)
                                 if world.cfg.report_silence else None)
        # (partition, token) -> when the app last processed it (on this process's clock)
        self.processed: dict[tuple[int, int], float] = {}
        feed = world.load_feed
        if feed is not None:  # the app's load reports, on the renewals (kgroup.dev/load)
            self.logic.load_summary = lambda: feed.summary(
                self.member.held_tokens(proc.clock()), world.kernel.rng, world.kernel.now)

    @property
    def member(self) -> Member:
        return self.logic.member

    # ---- observations -----------------------------------------------------------------

    def on_list(self, stream: str, items: list[Obj], scope: frozenset[int] | None = None
                ) -> None:
        self.logic.on_list(stream, items, scope)
        self.poke()

    def on_event(self, stream: str, event_type: str, obj: Obj) -> None:
        self.logic.on_event(stream, event_type, obj)
        self.poke()

    def record(self, event: Event) -> None:
        """The logic's reports: traced; fencings and lost locks counted."""
        if event.kind in ("fence", "lost"):
            self.world.count(event.kind)
        if self.world.cfg.verbose and event.kind != "resolved":
            self.world.trace(self.pod, f"{event.kind} {event.fields()}")

    # ---- the loop -----------------------------------------------------------------------

    def poke(self) -> None:
        if not self._step_due:
            self._step_due = True
            self.proc.schedule(self.world.loop_latency(), self.step)

    def begin_shutdown(self) -> None:
        if self.logic.begin_shutdown():
            self.poke()

    def step(self) -> None:
        self._step_due = False
        tick = self.logic.tick()
        for chain in tick.chains:
            self._drive(chain, None)
        self.world.watches.set_scope(self, tick.scope)
        self.app_observe()
        if tick.exit is not None:
            self.world.sidecar_exited(self)
            return
        if tick.wake_in is not None:
            self._wake_gen += 1
            self.proc.schedule(tick.wake_in / self.proc.rate, self._wake, self._wake_gen)

    def _wake(self, gen: int) -> None:
        if gen == self._wake_gen:
            self.poke()

    def _drive(self, chain: Chain, answer: Answer | None) -> None:
        """Advance a request chain by one answer; its next request goes out now."""
        try:
            request = chain.send(answer)  # type: ignore[arg-type]
        except StopIteration:
            self.app_observe()
            self.poke()
            return
        if self.world.cfg.verbose:
            self.world.trace(self.pod, request)
        if isinstance(request, Pause):
            self.proc.schedule(request.seconds / self.proc.rate, self._drive, chain, Ok())
            return
        store = self.world.store
        uid = self.uid if self.world.cfg.uid_admission else None
        self.world.request(self.proc, lambda: perform(store, request, uid),
                           lambda result: self._drive(chain, answer_of(result)),
                           timeout=request.timeout)

    # ---- the app ---------------------------------------------------------------------

    @property
    def gated(self) -> bool:
        return self.logic.app.gated

    def app_start(self) -> None:
        """The app is up (its session, its imports): its follower's first long-poll."""
        self.app_up = True
        self.logic.app.poll_opened(self.proc.clock())
        self._observed_version = -1
        self.poke()

    def app_fall_silent(self, seconds: float) -> None:
        if not self.app_up or self.app_silent:
            return
        self.app_silent = True
        self.logic.app.poll_closed(self.proc.clock())
        self.proc.schedule(seconds, self.app_wake)

    def app_wake(self) -> None:
        self.app_silent = False
        self.app_start()

    def app_go_blind(self) -> None:
        """The old ``listen``'s failure: an app that reported health, then believes it lost
        everything and keeps polling. (An app that never reports and stops working while it
        polls is not told apart from a working one: docs/design.md, "Owned means consumed".)"""
        if not self.health.ever_reported:
            self.proc.schedule(1.0, self.app_go_blind)
            return
        self.app_blind = True

    def _app_serves(self) -> bool:
        """The app's follower got an answer: it is served the view and polls again at once
        (the new poll is a call: what it was served is taken up). False: no app to serve."""
        if not self.gated:
            return True
        if not self.app_up or self.app_silent:
            return False
        now = self.proc.clock()
        view = self.member.view(now)
        self.logic.app.served(((p.partition, p.token) for p in view.partitions),
                              key=view.partitions)
        self.logic.app.poll_closed(now)
        if self.logic.app.poll_opened(now):
            self.poke()
        return not self.app_blind

    def app_observe(self) -> None:
        """The app reads the view: open the sink for new tokens, plan acknowledgements."""
        if self.member.version == self._observed_version:
            return  # the view can only have shrunk (deadline) since the last look
        if not self._app_serves():
            return  # not up, silent (it reads nothing), or blind (reads, does nothing)
        self._observed_version = self.member.version
        view = self.member.view(self.proc.clock())
        self._drain_sealed()
        for pv in view.partitions:
            key = (pv.partition, pv.token, view.session or "")
            if key not in self.opened:
                self.opened.add(key)
                self.world.sink_open(f"{self.pod}/{view.session}", pv.partition, pv.token)
            if pv.state == "revoking" and (pv.partition, pv.token) not in self.ack_planned:
                self.ack_planned.add((pv.partition, pv.token))
                delay = self.world.ack_delay()
                if delay is not None:
                    self.proc.schedule(delay, self._app_ack, pv.partition, pv.token)

    def _drain_sealed(self) -> None:
        """Start reading each active sealed partition of the view to its seal."""
        sealed = self.world.reshapes.sealed
        if not sealed:
            return
        for pv in self.member.view(self.proc.clock()).partitions:
            key = (pv.partition, pv.token)
            if pv.state != "active" or pv.partition not in sealed or key in self.draining:
                continue
            self.draining.add(key)
            backlog = self.world.reshapes.backlog[pv.partition]
            if backlog == float("inf"):
                continue  # no seal marker ever reached (SimConfig.seal_drain None)
            self.world.trace(self.pod, f"app drains p{pv.partition} token {pv.token} "
                                       f"({backlog:.3f}s to its seal)")
            self.proc.schedule(backlog, self._app_complete, pv.partition, pv.token)

    def _app_complete(self, partition: int, token: int) -> None:
        """Read to the seal: release the partition as completed, its position the seal's."""
        if self.gated and (not self.app_up or self.app_silent or self.app_blind):
            self.draining.discard((partition, token))  # taken up again when it reads
            return
        if self.member.check_release(partition, token, self.proc.clock()) is not None:
            return  # lost, fenced or released meanwhile: its next owner reads it
        self.world.trace(self.pod, f"app completes p{partition} token {token}")
        self.logic.app_release(partition, token, f"seal:{partition}", completed=True)
        self.poke()

    def _app_ack(self, partition: int, token: int) -> None:
        if self.member.check_release(partition, token, self.proc.clock()) is not None:
            return
        self.writes += 1
        self.logic.app_release(partition, token, f"{partition}@{token}.{self.writes}")
        self.poke()

    def app_write_all(self) -> None:
        """Start a write under the token of every partition in the view."""
        if self.gated and (not self.app_up or self.app_silent or self.app_blind):
            return  # an app that reads no view writes under none of its tokens
        view = self.member.view(self.proc.clock())
        for pv in view.partitions:
            self.writes += 1
            self.proc.schedule(self.world.write_latency(), self.world.sink_write,
                               f"{self.pod}/{view.session}", pv.partition, pv.token)

    def app_tick(self) -> None:
        """Periodic work: write under the token of one partition in the view (and, with the
        app's part on, report every partition's health)."""
        view = self.member.view(self.proc.clock())
        if self.gated and (not self.app_up or self.app_silent or self.app_blind):
            view = dataclasses.replace(view, partitions=())
        elif self.gated and view.partitions:
            now = self.proc.clock()
            held = self.member.held_tokens(now)
            self.health.report_all([Report(p.partition, p.token, position=str(self.writes),
                                           lag=0) for p in view.partitions], held, now)
            self.logic.app.called(now)
            for p in view.partitions:
                self.processed[(p.partition, p.token)] = now
        if view.partitions:
            self._drain_sealed()
            pv = view.partitions[self.world.kernel.rng.randrange(len(view.partitions))]
            self.writes += 1
            self.proc.schedule(self.world.write_latency(), self.world.sink_write,
                               f"{self.pod}/{view.session}", pv.partition, pv.token)
        self.proc.schedule(self.world.cfg.app_tick, self.app_tick)
