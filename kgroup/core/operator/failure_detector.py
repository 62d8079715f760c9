"""The operator as its groups' failure detector, without I/O: when a lock's holder is dead.

What it promises: a lock is marked expired (``kgroup.dev/expired-session``, which lets
its next owner take it) only once its holder's session is over — the holder's member
Lease gone, carrying another session, or seen unrenewed for a full lease duration on the
operator's own clock (:class:`~kgroup.core.locks.SessionTracker`: first sight starts the
clock) — and confirmed so on a quorum re-read of that member Lease just before the mark
(a renewal committed after that read reaches its holder after the holder's own fencing
deadline: ``kgroup.core.locks``). :class:`ExpiryRule` holds the rule (the simulation's
broken variants override its methods); :func:`expiries_to_mark` applies it to a group's
locks in one pass of :func:`kgroup.core.operator.decide.decide`; :func:`expiry_chains`
turns the pass's expiries into request chains (``kgroup.core.operator.lock_requests``):
per holder session one quorum read of its member Lease, :meth:`ExpiryRule.confirm`, then
each confirmed lock's conditional mark. The drivers (``kgroup_operator.controller``,
``kgroup_sim.control``) only perform the requests (docs/design.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from kgroup.constants import member_lease_name, partition_lease_name
from kgroup.core.objects import Obj
from kgroup.core.operator.lease_cache import GroupLeases
from kgroup.core.operator.lock_requests import (
    Chain,
    MarkExpired,
    NoAnswer,
    Ok,
    ReadLease,
    Then,
    reread,
)

__all__ = ["Expiry", "ExpiryLedger", "ExpiryRule", "expiries_to_mark", "expiry_chains"]


@dataclass(frozen=True)
class Expiry:
    """Mark partition Lease ``partition`` with the expiry of ``session`` (its holder
    ``member``'s, seen over); ``seen_rv``: the lock's resourceVersion as read, the
    precondition of the merge patch."""

    partition: int
    member: str
    session: str
    seen_rv: str


class ExpiryRule:
    """The failure detector's decisions (a broken variant overrides one: kgroup_sim).

    A lock's holder session is over when the holder's member Lease is gone, carries
    another session, or was seen unrenewed for a full lease duration on the operator's own
    clock (:class:`~kgroup.core.locks.SessionTracker`: first sight starts the clock). The
    cache's view may lag, so a lock is marked only after :meth:`confirm` on a quorum read
    of the holder's member Lease (locks.py: a renewal committed after that read reaches
    the holder after its own fencing deadline)."""

    def expires_at(self, leases: GroupLeases, member: str, session: str) -> float | None:
        """When ``session`` counts as over unrenewed on our clock (None: over already,
        its member Lease is gone or carries another session)."""
        lease = leases.members.get(member)
        if lease is None or lease.session != session:
            return None
        return leases.tracker.expires_at(member, session)

    def session_over(self, leases: GroupLeases, member: str, session: str, now: float) -> bool:
        expiry = self.expires_at(leases, member, session)
        return expiry is None or now >= expiry

    def reread(self) -> bool:
        """Whether the driver re-reads the holder's member Lease before marking: always,
        in kgroup. A public seam: the simulation's ``NoRereadExpiry`` answers False to
        show that the cache alone expires live holders (sim/kgroup_sim/variants.py)."""
        return True

    def confirm(self, leases: GroupLeases, member: str, session: str, fresh: Obj | None,
                now: float) -> bool:
        """After the quorum read (``fresh``; None: the Lease is gone): feed it to the cache,
        whose tracker restarts its clock on a changed marker, and ask again. A renewal
        learnt by any path since the decision counts."""
        leases.member_read(member, fresh, now)
        return self.session_over(leases, member, session, now)


def expiries_to_mark(sent: Mapping[int, tuple[str, str]], leases: GroupLeases, now: float,
                     rule: ExpiryRule) -> tuple[list[Expiry], float | None, list[int]]:
    """The held locks whose holder's session is over and that carry no expiry mark of it
    yet, less those in flight for the lock as cached (``sent``: partition -> the session
    and lock resourceVersion of the mark sent, ``Memory.expiries_sent``); the earliest
    future moment a held lock's session would be over (the next pass's deadline); and the
    entries of ``sent`` to forget (their lock is no longer held, or marked already)."""
    out: list[Expiry] = []
    settled: list[int] = []
    later: float | None = None
    # per holder session, asked once: (over?, when it would be); a group's 10,000 locks
    # have a few hundred sessions at most (asked per lock, this was 40 % of a pass)
    sessions: dict[tuple[str, str], tuple[bool, float | None]] = {}
    for p, lock in leases.partitions.items():  # the few expiries are sorted at the end
        if not lock.holder or lock.session is None or lock.expired == lock.session:
            if p in sent:
                settled.append(p)
            continue
        key = (lock.holder, lock.session)
        seen = sessions.get(key)
        if seen is None:
            over = rule.session_over(leases, lock.holder, lock.session, now)
            seen = sessions[key] = (over, None if over else
                                    rule.expires_at(leases, lock.holder, lock.session))
        if not seen[0]:
            expiry = seen[1]
            if expiry is not None and (later is None or expiry < later):
                later = expiry
            continue
        if sent.get(p) == (lock.session, lock.resource_version):
            continue
        out.append(Expiry(p, lock.holder, lock.session, lock.resource_version))
    out.sort(key=lambda e: e.partition)
    return out, later, settled


class ExpiryLedger(Protocol):
    """What is in flight (the operator's ``Memory``): an expiry sent is not decided again
    until the lock changes or it failed."""

    def expiry_sent(self, expiry: Expiry) -> None: ...

    def expiry_failed(self, expiry: Expiry) -> None: ...


def expiry_chains(expiries: list[Expiry], *, group: str, leases: GroupLeases,
                  rule: ExpiryRule, ledger: ExpiryLedger,
                  clock: Callable[[], float]) -> list[Chain]:
    """The pass's expiry marks as request chains, one per holder session (in the order of
    (member, session)), each reported in flight to ``ledger`` at once. A chain re-reads the
    holder's member Lease (a quorum read, when :meth:`ExpiryRule.reread`), lets
    :meth:`ExpiryRule.confirm` feed it to ``leases`` and ask again, and ends with one chain
    per confirmed lock (:func:`_mark_expired`); a renewed session, or a read without an
    answer, fails the holder's expiries and ends with deciding again."""
    holders: dict[tuple[str, str], list[Expiry]] = {}
    for e in expiries:
        ledger.expiry_sent(e)
        holders.setdefault((e.member, e.session), []).append(e)
    return [_holder(group, member, session, locks, leases, rule, ledger, clock)
            for (member, session), locks in sorted(holders.items())]


def _holder(group: str, member: str, session: str, locks: list[Expiry], leases: GroupLeases,
            rule: ExpiryRule, ledger: ExpiryLedger, clock: Callable[[], float]) -> Chain:
    settled = False
    try:
        if rule.reread():
            answer = yield ReadLease(member_lease_name(group, member))
            if not isinstance(answer, Ok):
                return Then(retry=True)
            over = rule.confirm(leases, member, session, answer.obj, clock())
        else:
            over = rule.session_over(leases, member, session, clock())
        if not over:
            return Then(decide=True, note=f"session {session} of {member} was renewed "
                                          f"(quorum read): not expired")
        settled = True
        return Then(chains=tuple(_mark_expired(group, e, leases, ledger, clock)
                                 for e in locks),
                    note=f"session {session} of {member} is over: marking {len(locks)} "
                         f"lock(s) expired")
    finally:
        if not settled:  # renewed, not answered, or the chain was closed
            for e in locks:
                ledger.expiry_failed(e)


def _mark_expired(group: str, e: Expiry, leases: GroupLeases, ledger: ExpiryLedger,
                  clock: Callable[[], float]) -> Chain:
    """One lock's expiry mark, conditional on its resourceVersion as read; refused (the lock
    changed or is gone): the lock re-read into ``leases`` and the group decided again."""
    settled = False
    try:
        lock = partition_lease_name(group, e.partition)
        answer = yield MarkExpired(lock, e.partition, e.session, e.seen_rv)
        if isinstance(answer, Ok):
            settled = True
            if answer.obj is not None:
                leases.put(answer.obj, clock())
            return Then()
        if isinstance(answer, NoAnswer):
            return Then(retry=True)
        ledger.expiry_failed(e)
        settled = True
        return (yield from reread(lock, leases, clock))
    finally:
        if not settled:
            ledger.expiry_failed(e)
