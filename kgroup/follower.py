"""The app's latest assignment without a request per batch: a long-poll kept open.

An app that asks ``GET /v1/assignment`` before each batch (to know what it owns, and that
the promise still holds) costs its sidecar a request per batch, many per second when idle.
:class:`AssignmentFollower` keeps one ``GET /v1/assignment?since=V&wait=S`` open instead
(a thread of its own, one kept-alive connection): a change answers at once, and an answer
at least every :func:`follow_wait` renews the promise. The app reads :meth:`latest` as
often as it likes. The rules of :mod:`kgroup.client` hold here too: an answer's promise
is counted from its request's send time on the app's clock, and the long-poll waits as
:func:`kgroup.client.follow_wait` says (re-exported here), like the client's ``listen``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kgroup.client import (
    DEFAULT_URL,
    FOLLOW_MAX_WAIT,
    FOLLOW_MIN_WAIT,
    Assignment,
    SidecarClient,
    SidecarError,
    follow_wait,
)
from kgroup.rebalance import handoff_wait

__all__ = ["FOLLOW_MAX_WAIT", "FOLLOW_MIN_WAIT", "AssignmentFollower", "follow_wait",
           "handoff_wait"]

FOLLOW_RETRY_SECONDS = 0.5


class AssignmentFollower:
    """The member's latest assignment, kept by a thread with one long-poll at a time.

    What the app asks per batch (``latest``) costs no request: changes arrive as the
    long-poll answers them, and the promise is renewed by an answer at least every
    :func:`follow_wait` (about 2 s while partitions are held; 30 s with none). An
    answer is counted from its send time as always, so ``latest().partitions`` is empty
    once its promise ran out, whether or not the thread still reaches the sidecar.
    Answers are kept in send order: one sent before :meth:`forget` (e.g. before a release
    the app just made) never replaces what is asked after it.

    ``handoff``: the follower of a loop that only releases revoking partitions (it
    processes none): it waits as :func:`kgroup.rebalance.handoff_wait` says, so with
    nothing revoking it asks once per ``max_wait`` (or at a change), not every 2-3 s;
    ``latest()`` may then hold an answer whose promise ran out (``.partitions`` empty),
    which such a loop must not read as "nothing held" (:meth:`forget` first to ask)."""

    def __init__(self, url: str = DEFAULT_URL, *, timeout: float = 5.0,
                 max_wait: float = FOLLOW_MAX_WAIT,
                 clock: Callable[[], float] = time.monotonic, handoff: bool = False) -> None:
        self.client = SidecarClient(url, timeout=timeout, clock=clock)
        self.clock = clock
        self.max_wait = max_wait
        self.wait_rule = handoff_wait if handoff else follow_wait
        self._latest: Assignment | None = None
        self._sent = float("-inf")  # send time of _latest, or of the last forget()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.polls = 0

    def start(self) -> AssignmentFollower:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kgroup-follower",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the poll in flight (the thread is a daemon: it never holds up exit)."""
        self._stop.set()

    def latest(self) -> Assignment | None:
        """The newest answer (check ``.partitions``: empty once its promise ran out); None
        before the first, or after :meth:`forget` until the next."""
        with self._lock:
            return self._latest

    def offer(self, answer: Assignment, sent_at: float) -> None:
        """An answer of a request sent at ``sent_at``: kept unless a later one is held."""
        with self._lock:
            if sent_at >= self._sent:
                self._latest, self._sent = answer, sent_at

    def forget(self) -> None:
        """Drop what is held and every answer to a request sent before now."""
        with self._lock:
            self._latest, self._sent = None, self.clock()

    def fetch(self, client: SidecarClient) -> Assignment:
        """A plain ``GET /v1/assignment`` through ``client``, offered here too."""
        sent = self.clock()
        answer = client.assignment()
        self.offer(answer, sent)
        return answer

    def _run(self) -> None:
        while not self._stop.is_set():
            current = self.latest()
            sent = self.clock()
            try:
                if current is None:
                    answer = self.client.assignment()
                else:
                    answer = self.client.wait_for_change(
                        current.version, self.wait_rule(current, sent, max_wait=self.max_wait))
            except SidecarError:
                self._stop.wait(FOLLOW_RETRY_SECONDS)
                continue
            self.polls += 1
            self.offer(answer, sent)
        self.client.close()
