"""The operator's lock requests in flight, admitted by urgency.

A pass of a large group hands over thousands of lock writes (10,000 creates for an empty
group; a join's rebalance re-marks every moved lock) and the API server takes
:data:`~kgroup_operator.kube.LOCK_WRITES_IN_FLIGHT` of them at a time. A first-come queue
made a crashed member's expiry marks wait behind a whole slice of creates and a target's
marks. Here a waiting request is admitted by its :class:`Urgency`, then in the order it
came: expiry marks (failover waits for them), then assignment marks (each lets its owner
start at once: the locks of an empty group created before the first target wait for
theirs; at 10 members x 10,000 partitions marks queued after the creates kept the members
idle until every lock existed, Stable from empty in 94 s, marks first 78 s), then creates.
A request
is asked, once admitted, whether it is still wanted (a mark superseded by a newer
target's mark of the same lock is dropped without a write).

Written by hand: asyncio's ``Semaphore`` admits in arrival order only, and a
``PriorityQueue`` of work items would need workers of its own; this is one heap of
futures.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import heapq
import itertools
from collections.abc import AsyncIterator

__all__ = ["LockGate", "Urgency"]


class Urgency(enum.IntEnum):
    """Lower is admitted first."""

    EXPIRY = 0  # a crashed member's locks: their new owners wait for each (failover)
    MARK = 1  # an existing lock's assignment mark (and the re-read after a refused one)
    CREATE = 2  # a lock that does not exist yet (created with its owner's mark, if any)
    DELETE = 3  # a retired partition's Lease (retention: nobody waits for it)


class LockGate:
    """At most ``slots`` holders at once; waiters admitted by urgency, then arrival."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("a gate needs at least one slot")
        self.free = slots
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot (cancelled ones excluded)."""
        return sum(1 for _, _, fut in self._waiting if not fut.done())

    async def acquire(self, urgency: Urgency) -> None:
        if self.free > 0:  # free slots only while nobody waits (release hands them on)
            self.free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (int(urgency), next(self._order), fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # admitted as the waiter was cancelled: hand the slot on
            raise

    def release(self) -> None:
        while self._waiting:
            _, _, fut = heapq.heappop(self._waiting)
            if not fut.done():  # a cancelled waiter's future is done: skipped
                fut.set_result(None)
                return
        self.free += 1

    @contextlib.asynccontextmanager
    async def slot(self, urgency: Urgency) -> AsyncIterator[None]:
        await self.acquire(urgency)
        try:
            yield
        finally:
            self.release()
