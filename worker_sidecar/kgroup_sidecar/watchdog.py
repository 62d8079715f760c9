"""The sidecar's own liveness check: a thread that ends the process when the event loop
stops turning, so the kubelet restarts the container (its restartPolicy) with no probe.

Why: where the chart's probes are exec probes (``sidecar.probes.mode: exec``, hostNetwork
pods), each probe is a ``runc exec`` that costs the container 17-30 ms of CPU whatever it
runs; a liveness probe every 30 s was a quarter of those execs. In that mode the chart
renders no liveness probe: this watchdog is the liveness check, in every mode (with http
probes the kubelet's ``/livez`` probe judges too).

How: the sidecar's heartbeat task on the loop (``kgroup_sidecar.app``, the one that
touches the probe files) calls :meth:`LoopWatchdog.beat` every 5 s; a daemon thread
wakes every :data:`CHECK_SECONDS` and, when the last beat is older than ``limit``
(:data:`DEFAULT_LIMIT_SECONDS`, ``KGROUP_WATCHDOG_SECONDS``), writes every thread's stack
to stderr (where the loop is stuck) and exits the process with :data:`EXIT_STATUS` at
once (``os._exit``: a stuck loop runs no cleanup). A loop that
blocks in a call, deadlocks or spins in Python code is seen: the thread still gets the
interpreter every few milliseconds. Not seen while it lasts: a process stopped as a whole
(SIGSTOP, a cgroup freeze) stops this thread too; its readiness fails (the ``ready``
file goes stale) and its session fences, and the watchdog exits it when it runs again if
the loop is still behind. The limit (60 s) is the old exec liveness probe's earliest
verdict (a file stale after 30 s, two failures 30 s apart): a loop starved of CPU on a
busy node is not killed sooner than before.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

DEFAULT_LIMIT_SECONDS = 60.0
CHECK_SECONDS = 5.0
EXIT_STATUS = 3


def _exit_now(status: int) -> None:
    sys.stderr.flush()
    os._exit(status)


class LoopWatchdog:
    """``beat()`` from the loop; ``start()`` the thread that judges the beats."""

    def __init__(self, limit: float = DEFAULT_LIMIT_SECONDS, *,
                 check_every: float = CHECK_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 exit: Callable[[int], None] = _exit_now) -> None:
        self.limit = limit
        self.check_every = check_every
        self.clock = clock
        self.exit = exit
        self.last_beat = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        self.last_beat = self.clock()

    def stuck_for(self) -> float | None:
        """Seconds since the last beat when that is over the limit, else None."""
        behind = self.clock() - self.last_beat
        return behind if behind > self.limit else None

    def check(self) -> bool:
        """One verdict: exits (through ``exit``) and returns True when the loop is stuck."""
        behind = self.stuck_for()
        if behind is None:
            return False
        log.critical("the event loop has not turned for %.0f s (limit %.0f s): exiting so "
                     "that the container is restarted; every thread's stack follows",
                     behind, self.limit)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        self.exit(EXIT_STATUS)
        return True

    def start(self) -> LoopWatchdog:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="kgroup-watchdog",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.check_every):
            if self.check():
                return
