"""The operator's leader election, decided without I/O: exactly one replica is active.

client-go's shape and clock rule. A standby acts only on times it measured itself: it
keeps the holder's ``renewTime`` as a renewal marker and the time (its own monotonic
clock, passed in) when it saw that marker change (:class:`kgroup.core.locks.SessionTracker`,
the rule the failure detector uses for member Leases). Only when the marker stayed
unchanged for a full lease duration does it take the Lease, with a resourceVersion
precondition. The leader renews every third of the duration and stops itself if it could
not renew within two thirds of it, so it is gone before any standby may take over.

The adapter (``kgroup_operator.leader``) reads the Lease, asks :meth:`Election.after_read`
what to write, and makes exactly that call: one read per attempt, then at most one write.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kgroup.core.locks import SessionTracker


@dataclass(frozen=True)
class LeaderLease:
    """What the decision needs of a read leader Lease."""

    holder: str | None
    renew_time: str | None  # the renewal marker: only its changes count, never its value
    duration: float | None
    transitions: int


class Write(enum.Enum):
    """The one call an attempt makes after its read."""

    NONE = "none"  # someone else holds it, live on our clock: wait
    CREATE = "create"  # no Lease yet
    REPLACE = "replace"  # free, ours, or unrenewed for a duration: take it (precondition)


@dataclass(frozen=True)
class Attempt:
    write: Write
    transitions: int = 0  # the leaseTransitions to write


class Election:
    """One replica's view of the leader Lease: what to write after each read, when to
    renew, when to give up."""

    def __init__(self, identity: str, duration: float) -> None:
        self.identity = identity
        self.duration = duration
        self._seen = SessionTracker()  # one record: the leader Lease's holder and marker
        self._last_renewed: float | None = None

    @property
    def retry_interval(self) -> float:
        """Between two attempts of a standby, and between two renewals of the leader."""
        return self.duration / 3

    def after_read(self, lease: LeaderLease | None, now: float) -> Attempt:
        """The write that follows a read of the Lease (None: it does not exist) at ``now``."""
        if lease is None:
            return Attempt(Write.CREATE, 0)
        holder = lease.holder
        if holder and holder != self.identity:
            self._seen.observe("leader", holder, lease.renew_time or "",
                               float(lease.duration or self.duration), now)
            if self._seen.is_live("leader", holder, now):
                return Attempt(Write.NONE)
        transitions = lease.transitions + (0 if holder == self.identity else 1)
        return Attempt(Write.REPLACE, transitions)

    def acquired(self, now: float) -> None:
        """The create or replace succeeded: we lead from ``now``."""
        self._last_renewed = now

    def renewed(self, now: float) -> None:
        self._last_renewed = now

    def must_stop(self, now: float) -> bool:
        """No renewal succeeded within two thirds of the duration: stop leading now, before
        a standby that saw the last renewal may take over (after a full duration)."""
        return self._last_renewed is not None and now - self._last_renewed > self.duration * 2 / 3
