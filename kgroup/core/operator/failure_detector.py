"""The operator as its groups' failure detector, without I/O: when a lock's holder is dead.

What it promises: a lock is marked expired (``kgroup.dev/expired-session``, which lets
its next owner take it) only once its holder's session is over — the holder's member
Lease gone, carrying another session, or seen unrenewed for a full lease duration on the
operator's own clock (:class:`~kgroup.core.locks.SessionTracker`: first sight starts the
clock) — and confirmed so on a quorum re-read of that member Lease just before the mark
(a renewal committed after that read reaches its holder after the holder's own fencing
deadline: ``kgroup.core.locks``). :class:`ExpiryRule` holds the rule (the simulation's
broken variants override its methods); :func:`expiries_to_mark` applies it to a group's
locks in one pass of :func:`kgroup.core.operator.decide.decide`, whose driver performs the
re-read and the marks (docs/design.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from kgroup.core.lease_codec import Obj
from kgroup.core.operator.lease_cache import GroupLeases

__all__ = ["Expiry", "ExpiryRule", "expiries_to_mark"]


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
        """Whether the driver re-reads the holder's member Lease before marking."""
        return True

    def confirm(self, leases: GroupLeases, member: str, session: str, fresh: Obj | None,
                now: float) -> bool:
        """After the quorum read (``fresh``; None: the Lease is gone): feed it to the cache,
        whose tracker restarts its clock on a changed marker, and ask again. A renewal
        learnt by any path since the decision counts."""
        leases.member_read(member, fresh, now)
        return self.session_over(leases, member, session, now)


def expiries_to_mark(sent: dict[int, tuple[str, str]], leases: GroupLeases, now: float,
                     rule: ExpiryRule) -> tuple[list[Expiry], float | None]:
    """The held locks whose holder's session is over and that carry no expiry mark of it
    yet, less those in flight for the lock as cached (``sent``: partition -> the session
    and lock resourceVersion of the mark sent, ``Memory.expiries_sent``; entries of locks
    no longer held by a live session are dropped); and the earliest future moment a
    held lock's session would be over (the next pass's deadline)."""
    out: list[Expiry] = []
    later: float | None = None
    # per holder session, asked once: (over?, when it would be); a group's 10,000 locks
    # have a few hundred sessions at most (asked per lock, this was 40 % of a pass)
    sessions: dict[tuple[str, str], tuple[bool, float | None]] = {}
    for p, lock in leases.partitions.items():  # the few expiries are sorted at the end
        if not lock.holder or lock.session is None or lock.expired == lock.session:
            sent.pop(p, None)
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
    return out, later
