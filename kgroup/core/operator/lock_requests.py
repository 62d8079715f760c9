"""The vocabulary between the operator's lock writes and their drivers.

The pass's writes to the group's locks are request chains built by the core (the creates
of missing locks: :func:`kgroup.core.operator.lock_creation.creation_chains`; the expiry
marks: :func:`kgroup.core.operator.failure_detector.expiry_chains`; the assignment marks:
:func:`kgroup.core.operator.assignment_marks.mark_chains`; the deletes of retired
partitions' Leases: :func:`kgroup.core.operator.retention.deletion_chains`): generators
that yield a request (:class:`CreateLease`, :class:`ReadLease`, :class:`MarkExpired`,
:class:`MarkAssigned`, :class:`DeleteLease`), receive its answer (:class:`Ok`,
:class:`Refused`, :class:`NoAnswer`, :class:`Superseded`) and end with :class:`Then`:
more chains to run side by side, or whether to decide again now or after the API
server's retry pause. A driver maps each request onto a call of its API server (the real
one: ``kgroup_operator.controller``; the simulated one: ``kgroup_sim.control``) and each
outcome onto an answer, and nothing more: the sequencing (the quorum re-read before an
expiry mark, the read back of a lock name a create found taken) lives here once.
Plain data, and the step both mark chains end with when a mark is refused
(:func:`reread`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Generator
from dataclasses import dataclass

from kgroup.core.objects import Obj
from kgroup.core.operator.lease_cache import GroupLeases

__all__ = [
    "Answer",
    "Chain",
    "CreateLease",
    "DeleteLease",
    "Lane",
    "LockRequest",
    "MarkAssigned",
    "MarkExpired",
    "NoAnswer",
    "Ok",
    "ReadLease",
    "Refused",
    "Superseded",
    "Then",
    "reread",
]


class Lane(enum.IntEnum):
    """The write a read is for: a driver that ranks its requests (the controller's lock
    gate) ranks the read with those writes."""

    EXPIRY = 0  # the holder's member Lease before an expiry mark, a lock after a refused one
    MARK = 1  # a lock after its refused assignment mark
    CREATE = 2  # the Lease holding a lock's name after a create refused with 409


@dataclass(frozen=True)
class ReadLease:
    """A quorum read of one Lease of the group (``Ok(None)``: it does not exist), ranked
    with the writes of its ``lane``."""

    name: str
    lane: Lane = Lane.EXPIRY


@dataclass(frozen=True)
class MarkExpired:
    """A merge patch of lock ``partition`` (Lease ``name``)'s expiry mark to ``session``,
    conditional on the lock still being at ``seen_rv`` (``Refused`` when it changed or is
    gone)."""

    name: str
    partition: int
    session: str
    seen_rv: str


@dataclass(frozen=True)
class MarkAssigned:
    """A merge patch of lock ``partition`` (Lease ``name``)'s assignment mark to ``member``
    (its pod ``uid``), conditional on the lock still being at ``seen_rv``; ``wanted`` is asked as
    the write's turn comes (a driver that queues writes asks it then; the answer is
    :class:`Superseded` and nothing is sent when it says no)."""

    name: str
    partition: int
    member: str
    uid: str | None
    seen_rv: str
    wanted: Callable[[], bool]


@dataclass(frozen=True)
class DeleteLease:
    """A delete of lock ``partition`` (Lease ``name``) with preconditions: its
    resourceVersion still ``seen_rv`` and, when known, its uid ``uid`` (``Refused`` when it
    changed or is gone)."""

    name: str
    partition: int
    seen_rv: str
    uid: str | None = None


@dataclass(frozen=True)
class CreateLease:
    """A create of lock ``partition`` (Lease ``name``) as ``body``
    (``lease_codec.new_partition_lease``); ``Refused(409)`` when the name is taken."""

    name: str
    partition: int
    body: Obj


LockRequest = ReadLease | MarkExpired | MarkAssigned | DeleteLease | CreateLease


@dataclass(frozen=True)
class Ok:
    """The request succeeded: the Lease written or read (None: the read found nothing)."""

    obj: Obj | None = None


@dataclass(frozen=True)
class Refused:
    """The API server refused the write (409: the lock changed since it was read; 404: it
    is gone)."""

    status: int


@dataclass(frozen=True)
class NoAnswer:
    """No usable answer (timeout, broken connection, a server error): the request may or
    may not have happened."""

    why: str = ""


@dataclass(frozen=True)
class Superseded:
    """Not sent: the write's ``wanted`` said no as its turn came."""


Answer = Ok | Refused | NoAnswer | Superseded


@dataclass(frozen=True)
class Then:
    """How a chain ended: ``chains`` to run next, side by side; ``decide``: the group's
    loop plans again now (on what the chain fed the cache); ``retry``: it plans again after
    the API server's retry pause (``API_RETRY_SECONDS``); ``note``: a line for the log."""

    chains: tuple[Chain, ...] = ()
    decide: bool = False
    retry: bool = False
    note: str = ""


Chain = Generator[LockRequest, Answer, Then]


def reread(name: str, leases: GroupLeases, clock: Callable[[], float], *,
           lane: Lane = Lane.EXPIRY) -> Chain:
    """A mark refused because lock ``name`` changed (or is gone): the lock re-read into
    ``leases`` and the group decided again on it; the read not answered, decided again
    after the retry pause. A chain's tail: ``return (yield from reread(...))``."""
    fresh = yield ReadLease(name, lane)
    if not isinstance(fresh, Ok):
        return Then(retry=True)
    if fresh.obj is not None:
        leases.put(fresh.obj, clock())
    return Then(decide=True)
