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
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

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
from kgroup_sim.kernel import TIMEOUT, Process
from kgroup_sim.store import Obj, Store, WriteError, lease_key

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
        self.world.set_scope(self, tick.scope)
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

    def app_observe(self) -> None:
        """The app reads the view: open the sink for new tokens, plan acknowledgements."""
        if self.member.version == self._observed_version:
            return  # the view can only have shrunk (deadline) since the last look
        self._observed_version = self.member.version
        view = self.member.view(self.proc.clock())
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

    def _app_ack(self, partition: int, token: int) -> None:
        if self.member.check_release(partition, token, self.proc.clock()) is not None:
            return
        self.writes += 1
        self.logic.app_release(partition, token, f"{partition}@{token}.{self.writes}")
        self.poke()

    def app_write_all(self) -> None:
        """Start a write under the token of every partition in the view."""
        view = self.member.view(self.proc.clock())
        for pv in view.partitions:
            self.writes += 1
            self.proc.schedule(self.world.write_latency(), self.world.sink_write,
                               f"{self.pod}/{view.session}", pv.partition, pv.token)

    def app_tick(self) -> None:
        """Periodic work: write under the token of one partition in the view."""
        view = self.member.view(self.proc.clock())
        if view.partitions:
            pv = view.partitions[self.world.kernel.rng.randrange(len(view.partitions))]
            self.writes += 1
            self.proc.schedule(self.world.write_latency(), self.world.sink_write,
                               f"{self.pod}/{view.session}", pv.partition, pv.token)
        self.proc.schedule(self.world.cfg.app_tick, self.app_tick)
