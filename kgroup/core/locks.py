"""Lock rules: session tracking on the observer's clock, lock state, self-fencing deadline.

The shape is client-go's ``tools/leaderelection``, adapted to locks that are *not* renewed
one by one (a partition Lease is valid while its holder's session, the member Lease, is).

Clock assumptions (read these before changing anything here):

* Every time in this module is a float of seconds on the *caller's own* monotonic clock,
  passed in as ``now``. Nothing here reads a clock.
* An observer acts only on times it measured itself. A member Lease's ``renewTime`` (or
  its ``resourceVersion``) is a *renewal marker*: it only signals "something changed".
  It is never compared with the observer's clock, so skew between machines does not
  matter; only the *rate* of the clocks matters, and the fencing margin absorbs that.
* A session is live while ``observed_at + duration > now``, where ``observed_at`` is the
  observer's time when it last saw the marker change (or first saw the session: first
  sight starts the clock, so a session seen for the first time always gets a full duration).
* The holder itself fences at ``last_renew_sent + duration - margin``, measured from when
  the last *confirmed* renewal was sent. Any observer saw that renewal after it was sent,
  so the observer's expiry is later than the holder's deadline by at least ``margin``.
  A confirmation that arrives after the deadline does not rescue the session.

Who observes (docs/design.md, "The operator is the failure detector"): only the operator
tracks sessions (:class:`SessionTracker`, fed by its watch of every member Lease). A
sidecar watches no other member's Lease: it learns that a lock's holder is gone from the
lock itself, whose *expiry mark* (annotation ``kgroup.dev/expired-session``) the operator
sets to the lock's session once it saw that session over. A lock held by another member is
takeable iff its expiry mark equals its session (:func:`lock_state`); the chart's
admission policy refuses any other takeover.

Watch streams may lag. Before marking a lock whose holder's session it believes expired,
the operator must re-read the holder's member Lease (a quorum GET) and feed it to the
tracker: a renewal committed before that read resets the clock, and one committed after
it can only be confirmed to the holder after the holder's own deadline, so it has fenced
already. The mark is a conditional write (the lock's resourceVersion as read), so it never
lands on a lock that changed meanwhile; session ids are never reused, so a mark stays true
for as long as the lock carries that session.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

DEFAULT_MARGIN_FRACTION = 0.2
"""Self-fencing margin as a fraction of the lease duration (20%): the holder stops
claiming ownership this long before any observer may consider its session expired. It
absorbs clock-rate differences and the time between an observer's check and its write."""


@dataclass(frozen=True)
class Lock:
    """A partition Lease as read (``kgroup.core.lease_codec.parse_partition_lease``): what
    the member's state machine and the operator's cache observe of a partition lock."""

    partition: int
    holder: str | None
    session: str | None
    token: int
    resource_version: str
    position: str | None = None
    position_token: int | None = None
    assigned: str | None = None  # the operator's mark: the only member that may acquire it
    assigned_uid: str | None = None  # the uid of the pod the mark is for (None: none marked)
    holder_uid: str | None = None  # the uid of the holder's pod (None: an older sidecar's)
    # the operator's expiry mark: the session it saw over (takeable when it is ``session``)
    expired: str | None = None


@dataclass(frozen=True)
class LeaseTiming:
    """Session timing of a group; the constructor refuses an unsafe configuration.

    ``renew_interval`` must be shorter than ``duration - margin``: otherwise a holder
    would fence itself between two regular renewals.
    """

    duration: float
    renew_interval: float
    margin: float | None = None

    def __post_init__(self) -> None:
        if self.duration <= 0:
            raise ValueError(f"lease duration must be > 0 (got {self.duration})")
        if self.renew_interval <= 0:
            raise ValueError(f"renew interval must be > 0 (got {self.renew_interval})")
        if not 0 <= self.effective_margin < self.duration:
            raise ValueError(
                f"fencing margin must be in [0, duration) (got {self.effective_margin})"
            )
        if self.renew_interval >= self.duration - self.effective_margin:
            raise ValueError(
                f"unsafe lease timing: renew interval {self.renew_interval}s must be shorter "
                f"than duration - margin = {self.duration}s - {self.effective_margin:g}s"
            )

    @property
    def effective_margin(self) -> float:
        if self.margin is None:
            return DEFAULT_MARGIN_FRACTION * self.duration
        return self.margin


def fencing_deadline(last_renew_sent: float, duration: float, margin: float | None = None) -> float:
    """When a holder must consider its session (and every lock it holds) lost.

    ``last_renew_sent`` is when the last *confirmed* renewal was sent, on the holder's
    monotonic clock; ``margin`` defaults to 20% of ``duration``.
    """
    if margin is None:
        margin = DEFAULT_MARGIN_FRACTION * duration
    return last_renew_sent + duration - margin


@dataclass(frozen=True)
class _SessionRecord:
    session: str
    marker: str
    duration: float
    observed_at: float


class SessionTracker:
    """What this observer has seen of every member's session, timed on its own clock."""

    def __init__(self) -> None:
        self._records: dict[str, _SessionRecord] = {}

    def observe(self, member: str, session: str, marker: str, duration: float, now: float) -> None:
        """Record a member Lease as seen at ``now``.

        The clock restarts when the session id or the renewal marker changed, or when the
        member is seen for the first time; an unchanged marker leaves it running.
        """
        old = self._records.get(member)
        if old is not None and old.session == session and old.marker == marker:
            if old.duration != duration:
                self._records[member] = _SessionRecord(session, marker, duration, old.observed_at)
            return
        self._records[member] = _SessionRecord(session, marker, duration, now)

    def forget(self, member: str) -> None:
        """The member Lease was deleted: its session is over."""
        self._records.pop(member, None)

    def members(self) -> list[str]:
        return sorted(self._records)

    def session_of(self, member: str) -> str | None:
        record = self._records.get(member)
        return record.session if record else None

    def marker_of(self, member: str) -> str | None:
        record = self._records.get(member)
        return record.marker if record else None

    def expires_at(self, member: str, session: str) -> float | None:
        """When this observer will consider ``session`` unrenewed for a full duration, or
        None when the member Lease is gone or carries another session."""
        record = self._records.get(member)
        if record is None or record.session != session:
            return None
        return record.observed_at + record.duration

    def is_live(self, member: str, session: str, now: float) -> bool:
        expiry = self.expires_at(member, session)
        return expiry is not None and now < expiry


class LockState(enum.IntEnum):
    """The state of a partition lock to a member that wants it, ordered by how free it is:
    only FREE and TAKEABLE may be acquired."""

    # HELD: the holder's session is the lock's and the operator has not marked it over.
    HELD = 0
    # TAKEABLE: the operator marked the lock's session expired (kgroup.dev/expired-session
    # equals kgroup.dev/session): the holder has fenced itself by now.
    TAKEABLE = 1
    # FREE: no holder (or a holder without a session: nothing to be live).
    FREE = 2


def lock_state(*, holder: str | None, session: str | None, expired: str | None) -> LockState:
    """Classify a partition lock held by ``holder`` under ``session`` whose expiry mark is
    ``expired`` (the member's own older session is FREE to it: :mod:`kgroup.core.member.reconcile`
    decides that before asking here)."""
    if not holder or session is None:
        return LockState.FREE
    if expired == session:
        return LockState.TAKEABLE
    return LockState.HELD
