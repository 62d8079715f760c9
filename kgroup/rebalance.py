"""What the app is told by its sidecar, and the rules that turn answers into changes,
without I/O: one answer and how long its promise holds (:class:`Assignment`), one change
of what the member holds as Kafka's rebalance listener sees it (:class:`Rebalance`), and
what :mod:`kgroup.client`'s listeners (sync and async alike) and
:class:`kgroup.follower.AssignmentFollower` keep between two answers: the diff, the app's
own releases, how long the next long-poll may wait (:func:`follow_wait`), and when a failed
release is retried. :mod:`kgroup.client` performs the requests and re-exports these names.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from kgroup.core.assignment import PartitionView, View

__all__ = [
    "FOLLOW_MAX_WAIT",
    "FOLLOW_MIN_WAIT",
    "RELEASE_RETRY_SECONDS",
    "Assignment",
    "AsyncRebalanceListener",
    "Callback",
    "Partition",
    "Rebalance",
    "RebalanceListener",
    "ReleaseOutcome",
    "after_release_error",
    "follow_wait",
    "handoff_wait",
]


Partition = PartitionView
"""One partition of an answer (:class:`kgroup.core.assignment.PartitionView`)."""


@dataclass(frozen=True)
class Assignment:
    """One answer of ``GET /v1/assignment`` (``view``, the wire object the sidecar
    served), valid until ``valid_until`` on the client's clock: the send time of its
    request plus the answer's ``validForSeconds``."""

    view: View
    valid_until: float
    clock: Callable[[], float] = time.monotonic

    @classmethod
    def from_json(cls, body: dict[str, Any], *, sent_at: float,
                  clock: Callable[[], float] = time.monotonic) -> Assignment:
        view = View.from_json(body)
        return cls(view, sent_at + view.valid_for_seconds, clock)

    @property
    def member(self) -> str:
        return self.view.member

    @property
    def session(self) -> str | None:
        return self.view.session

    @property
    def version(self) -> int:
        return self.view.version

    @property
    def epoch(self) -> int | None:
        return self.view.epoch

    @property
    def acked_epoch(self) -> int | None:
        return self.view.acked_epoch

    @property
    def fenced(self) -> bool:
        return self.view.fenced

    @property
    def all_partitions(self) -> tuple[Partition, ...]:
        """Every partition of the answer, whether or not its promise still holds."""
        return self.view.partitions

    @property
    def expired(self) -> bool:
        return self.fenced or self.clock() >= self.valid_until

    @property
    def partitions(self) -> tuple[Partition, ...]:
        """Owned partitions (active and revoking); empty once the promise has run out."""
        return () if self.expired else self.all_partitions

    @property
    def active(self) -> tuple[Partition, ...]:
        return tuple(p for p in self.partitions if p.state == "active")

    @property
    def revoking(self) -> tuple[Partition, ...]:
        return tuple(p for p in self.partitions if p.state == "revoking")


Callback = Callable[[Partition], None]


@dataclass(frozen=True)
class Rebalance:
    """One change of what the member holds, as Kafka's ConsumerRebalanceListener sees it:
    ``assigned`` are new to the app (process them, from ``position``), ``revoked`` are
    to be finished and released with their position (``release``), ``lost`` are gone
    without a release (another owner may already have them: stop, do not commit). A
    partition the app released through the client (``release``, ``release_all``) leaves
    without being reported: the app already stopped on it."""

    assigned: tuple[Partition, ...]
    revoked: tuple[Partition, ...]
    lost: tuple[Partition, ...]
    assignment: Assignment | None  # the view after the change (None: sidecar unreachable)


RebalanceListener = Callable[[Rebalance], None]
AsyncRebalanceListener = Callable[[Rebalance], Awaitable[None] | None]
RELEASE_RETRY_SECONDS = 0.2
ReleaseOutcome = Literal["lost", "retry", "raise"]


def after_release_error(status: int, *, now: float, deadline: float) -> ReleaseOutcome:
    """``release_all``'s decision (sync and async clients alike) after a release failed
    with ``status``: ``"lost"`` when the partition was lost meanwhile (404, 409: reported
    False, no retry); ``"retry"`` when it is not released yet (503) or the sidecar was not
    reached (0), while ``now`` is before ``deadline``; else ``"raise"`` (the error stands)."""
    if status in (404, 409):
        return "lost"
    if status in (0, 503) and now < deadline:
        return "retry"
    return "raise"




def _per_partition(assigned: Callback, revoked: Callback, lost: Callback
                   ) -> RebalanceListener:
    def listener(change: Rebalance) -> None:
        for p in change.lost:
            lost(p)
        for p in change.assigned:
            assigned(p)
        for p in change.revoked:
            revoked(p)
    return listener


class _Releases:
    """The partitions the app released through this client, each under its token: one
    that leaves the view under that token went *with* a release, so it is not lost (the
    app stopped on it and committed before it released it). Noted when the release is
    sent (the view drops the partition while the release is being written, before the
    request returns); forgotten when the sidecar refuses it (404, 409: not released, so
    its leaving is a loss). Thread-safe: a listener's thread and the app's threads share
    it."""

    def __init__(self) -> None:
        self._tokens: dict[int, int] = {}
        self._lock = threading.Lock()

    def sent(self, partition: int, token: int) -> None:
        with self._lock:
            self._tokens[partition] = token  # tokens only grow: an older entry is spent

    def refused(self, partition: int, token: int) -> None:
        with self._lock:
            if self._tokens.get(partition) == token:
                del self._tokens[partition]

    def consume(self, partition: int, token: int) -> bool:
        """Whether the app released ``partition`` under ``token`` (the entry is dropped)."""
        with self._lock:
            if self._tokens.get(partition) != token:
                return False
            del self._tokens[partition]
            return True


def _diff(old: dict[int, Partition], new: dict[int, Partition], released: _Releases
          ) -> tuple[list[Partition], list[Partition], list[Partition]]:
    """-> (assigned, revoked, lost) between two views keyed by partition. A partition that
    left ``old`` (gone, or held again under another token) is lost unless the app released
    it under that token."""
    assigned, revoked, gone = [], [], []
    for n, p in sorted(new.items()):
        before = old.get(n)
        if before is None or before.token != p.token:
            if before is not None:
                gone.append(before)
            assigned.append(p)
            if p.state == "revoking":
                revoked.append(p)
        elif before.state != "revoking" and p.state == "revoking":
            revoked.append(p)
    gone.extend(p for n, p in sorted(old.items()) if n not in new)
    lost = [p for p in gone if not released.consume(p.partition, p.token)]
    return assigned, revoked, lost


FOLLOW_MAX_WAIT = 30.0
FOLLOW_MIN_WAIT = 1.0
"""The shortest a follower's long-poll waits. A steady view's promise grows only when the
sidecar renews, and no sidecar renews more often than once a second (the CRD's least
renew interval), so a sooner poll learns nothing new; at 0.1 s, a sidecar whose renewals
were late (starved of CPU: the one case where the promise runs low) was asked ten times a
second by each follower, work that delayed its renewal further."""
ANSWER_SLACK = 0.1  # what a poll's request may take beyond its wait


def follow_wait(current: Assignment | None, now: float, *, max_wait: float = FOLLOW_MAX_WAIT,
                min_wait: float = FOLLOW_MIN_WAIT) -> float:
    """How long the next long-poll may wait at ``now``, holding the answer ``current``:
    the one rule of every long-poll of :mod:`kgroup.client`'s clients (``listen``) and of
    :class:`kgroup.follower.AssignmentFollower`.

    A change answers at once; otherwise the answer's promise (``validForSeconds``) is
    counted from the poll's *send* time, so an answer that waited ``w`` leaves ``v - w``:
    a poll that waits all that is left of the current promise gets an answer already
    spent. Waiting half of what is left keeps the promises overlapping: with ``x`` left
    at an answer, the next one leaves ``v - x/2`` (a fixed point of ``2v/3``), above zero
    whenever the sidecar's ``v`` never drops below half its top (renewals every 2 s of an
    8 s lease: ``v`` moves between about 5 and 7 s). An answer that ran out while it still
    lists partitions (the sidecar or the app was paused) is asked again after
    ``min_wait`` (:data:`FOLLOW_MIN_WAIT`), so the app gets them back within a second of
    the sidecar's next renewal, without piling requests on a sidecar too starved to renew
    in time. With nothing listed, or fenced, there
    is no promise to keep: wait for a change as long as allowed."""
    if current is None or current.fenced or not current.all_partitions:
        return max_wait
    return min(max_wait, max(min_wait, (current.valid_until - now) / 2))


def handoff_wait(current: Assignment | None, now: float, *,
                 max_wait: float = FOLLOW_MAX_WAIT, min_wait: float = FOLLOW_MIN_WAIT) -> float:
    """:func:`follow_wait` for a follower that acts on *revoking* partitions only: a
    worker's hand-off loop, which releases what it is told is revoking and processes
    nothing (the PySpark driver's; its planner follows as usual). With nothing revoking
    it needs no promise: it waits for a change (a partition turning revoking bumps the
    view's version, which answers at once) as long as allowed, where :func:`follow_wait`
    would ask again every 2-3 s to keep the promise of partitions it does not process.
    While one is revoking, its promise is kept as :func:`follow_wait` keeps it."""
    if current is None or not any(p.state == "revoking" for p in current.all_partitions):
        return max_wait
    return follow_wait(current, now, max_wait=max_wait, min_wait=min_wait)


class _Listening:
    """What ``listen`` (sync and async alike) keeps between two answers, without I/O:
    the partitions the app was told it holds, the answer it holds them under, and the
    client's record of the app's own releases."""

    def __init__(self, released: _Releases, max_wait: float) -> None:
        self.held: dict[int, Partition] = {}
        self.current: Assignment | None = None
        self.released = released
        self.max_wait = max_wait

    def wait(self, now: float) -> float:
        return follow_wait(self.current, now, max_wait=self.max_wait)

    def give_up_after(self, now: float, wait: float, timeout: float) -> float:
        """How long the poll's request may take: while partitions are held under a
        promise, no longer than the promise (an answer later than that is spent anyway,
        and the app must hear at the deadline that it lost them, even from a sidecar
        paused mid-answer); else the wait plus the client's ``timeout``."""
        if self.held and self.current is not None and not self.current.expired:
            return max(wait + ANSWER_SLACK, self.current.valid_until - now)
        return wait + timeout

    def answered(self, answer: Assignment) -> Rebalance | None:
        self.current = answer
        return self._move({p.partition: p for p in answer.partitions}, answer)

    def unreachable(self) -> Rebalance | None:
        """No answer: what is held is lost once its promise ran out."""
        if self.current is None or self.current.expired:
            return self._move({}, None)
        return None

    def _move(self, new: dict[int, Partition], answer: Assignment | None) -> Rebalance | None:
        assigned, revoked, lost = _diff(self.held, new, self.released)
        self.held = new
        if assigned or revoked or lost:
            return Rebalance(tuple(assigned), tuple(revoked), tuple(lost), answer)
        return None
