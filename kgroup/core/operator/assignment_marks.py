"""The assignment marks a pass decided, as request chains (``kgroup.core.operator.
lock_requests``), without I/O.

A mark (``kgroup.dev/assigned``: the only member allowed to acquire the lock) is one merge
patch conditional on the lock as decided on. It is dropped unsent when a later pass
superseded it or the lock moved on before its turn (the request's ``wanted``); refused
because the lock changed, the lock is re-read into the cache and the group decided again;
not answered, the group is decided again after the API server's retry pause. Each mark is
reported to the memory (:meth:`~kgroup.core.operator.decide.Memory.mark_sent` /
``mark_failed``), so no pass sends it twice and a failed one is decided again. The drivers
(``kgroup_operator.controller``, ``kgroup_sim.control``) only perform the requests.
"""

from __future__ import annotations

from collections.abc import Callable

from kgroup.constants import partition_lease_name
from kgroup.core.operator.decide import Mark, Memory
from kgroup.core.operator.lease_cache import GroupLeases
from kgroup.core.operator.lock_requests import (
    Chain,
    Lane,
    MarkAssigned,
    NoAnswer,
    Ok,
    Superseded,
    Then,
    reread,
)

__all__ = ["mark_chains"]


def mark_chains(marks: list[Mark], *, group: str, leases: GroupLeases, memory: Memory,
                clock: Callable[[], float]) -> list[Chain]:
    """One chain per mark, each reported in flight to ``memory`` at once."""
    for mark in marks:
        memory.mark_sent(mark)
    return [_mark(group, mark, leases, memory, clock) for mark in marks]


def _mark(group: str, mark: Mark, leases: GroupLeases, memory: Memory,
          clock: Callable[[], float]) -> Chain:
    sent = (mark.member, mark.uid, mark.seen_rv)

    def current() -> bool:  # not superseded by a later pass
        return memory.marks_sent.get(mark.partition) == sent

    def wanted() -> bool:  # asked as its turn comes: superseded, or the lock moved on
        lock = leases.partitions.get(mark.partition)
        return current() and lock is not None and lock.resource_version == mark.seen_rv

    name = partition_lease_name(group, mark.partition)
    settled = False
    try:
        answer = yield MarkAssigned(name, mark.partition, mark.member, mark.uid,
                                    mark.seen_rv, wanted)
        settled = True
        if isinstance(answer, Ok):
            if answer.obj is not None:
                leases.put(answer.obj, clock())
            return Then()
        if isinstance(answer, Superseded):
            if not current():
                return Then()  # a later pass's mark replaced it
            memory.mark_failed(mark)
            return Then(decide=True)  # the lock moved on: decide again on it as cached
        memory.mark_failed(mark)
        if isinstance(answer, NoAnswer):
            return Then(retry=True)
        return (yield from reread(name, leases, clock, lane=Lane.MARK))  # refused: it changed
    finally:
        if not settled:  # the chain was closed before its answer
            memory.mark_failed(mark)
