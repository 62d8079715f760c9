"""The simulation kernel: one global simulated time, an event queue, and processes.

Rules of this module:

* Time is a float of *true* seconds, known only to the kernel. A process sees its own
  monotonic clock, ``offset + rate * t`` with a rate within ±1%: the cores under test get
  ``now`` from that clock only, exactly as they would from ``time.monotonic()``.
* Everything random comes from the run's one ``random.Random(seed)``, consumed in a
  deterministic order (events with equal times run in the order they were scheduled), so a
  seed replays the same trace on every machine and Python version with the same code.
* A process can be *paused* (a GC pause or a SIGSTOP: nothing it would do happens, its
  inputs queue up and are handled in order on resume; its monotonic clock keeps running,
  as CLOCK_MONOTONIC does), *crashed* (everything scheduled for it is dropped, forever)
  or *cut off* from the API server (its requests and their answers are lost; its client
  times out).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TIMEOUT", "Kernel", "Process", "Timeout"]


class Kernel:
    """The event queue and the run's random source."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.events = 0
        self.touched: list[Process] = []  # processes that ran code during the last event

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (max(t, self.now), self._seq, fn, args))

    def after(self, dt: float, fn: Callable[..., None], *args: Any) -> None:
        self.at(self.now + dt, fn, *args)

    def run_until(self, t: float, after_each: Callable[[], None]) -> None:
        """Run every event due before ``t``; ``after_each`` runs after every event."""
        q = self._queue
        while q and q[0][0] <= t:
            when, _, fn, args = heapq.heappop(q)
            self.now = when
            self.events += 1
            fn(*args)
            if self.touched:
                after_each()
                self.touched.clear()
        self.now = max(self.now, t)


@dataclass(frozen=True)
class Timeout:
    """The client gave up waiting: the request may or may not have been applied."""


TIMEOUT = Timeout()


@dataclass
class Process:
    """A simulated process (a sidecar with its app, or the operator)."""

    kernel: Kernel
    name: str
    offset: float = 0.0
    rate: float = 1.0
    alive: bool = True
    paused_until: float = -1.0
    cut_until: float = -1.0
    lose_answers: int = 0  # the next this many answers to this process are lost
    _inbox: list[tuple[Callable[..., None], tuple[Any, ...]]] = field(default_factory=list)

    # ---- clock ---------------------------------------------------------------------

    def clock(self) -> float:
        """This process's monotonic clock now."""
        return self.offset + self.rate * self.kernel.now

    def to_true(self, local: float) -> float:
        """The true time at which this process's clock reads ``local``."""
        return (local - self.offset) / self.rate

    # ---- faults --------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self.kernel.now < self.paused_until

    @property
    def cut(self) -> bool:
        return self.kernel.now < self.cut_until

    def pause(self, seconds: float) -> None:
        was = self.paused
        self.paused_until = max(self.paused_until, self.kernel.now + seconds)
        if not was:
            self.kernel.at(self.paused_until, self._resume)

    def _resume(self) -> None:
        if not self.alive:
            return
        if self.paused:  # extended meanwhile
            self.kernel.at(self.paused_until, self._resume)
            return
        inbox, self._inbox = self._inbox, []
        for fn, args in inbox:
            self.deliver(fn, *args)

    def crash(self) -> None:
        self.alive = False
        self._inbox.clear()

    # ---- dispatch ------------------------------------------------------------------

    def deliver(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn`` in this process now, or on resume if paused; never if crashed."""
        if not self.alive:
            return
        if self.paused or self._inbox:
            self._inbox.append((fn, args))
            return
        fn(*args)
        self.kernel.touched.append(self)

    def schedule(self, dt: float, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn`` in this process after ``dt`` true seconds (later if paused)."""
        self.kernel.after(dt, self.deliver, fn, *args)

    def rpc(
        self,
        request: Callable[[], Any],
        done: Callable[[Any], None],
        *,
        latency: Callable[[], float],
        timeout: float,
        drop: Callable[[], bool],
    ) -> None:
        """Send ``request`` to the API server; ``done(result | exception | TIMEOUT)``.

        The request reaches the server after a random latency unless this process is cut
        off then (or ``drop()`` says the network lost it); the answer comes back after
        another latency under the same conditions. With no answer by ``timeout`` the
        client sees TIMEOUT, whether or not the server applied the request.
        """
        state = {"answered": False}

        def answer(result: Any) -> None:
            if state["answered"]:
                return
            state["answered"] = True
            self.deliver(done, result)

        def arrive() -> None:
            if self.cut or drop():
                return
            try:
                result: Any = request()
            except Exception as exc:
                result = exc
            back = latency()

            def respond() -> None:
                if self.lose_answers > 0:
                    self.lose_answers -= 1
                    return
                if self.alive and not self.cut and not drop():
                    answer(result)

            self.kernel.after(back, respond)

        self.kernel.after(latency(), arrive)
        self.kernel.after(timeout, lambda: answer(TIMEOUT) if self.alive else None)
