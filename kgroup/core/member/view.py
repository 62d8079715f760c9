"""The vocabulary of the member state machine (:mod:`kgroup.core.member.reconcile`).

What it observes (:class:`Snapshot` with :class:`~kgroup.core.locks.Lock`, :class:`Target`,
:class:`AppRelease`) and what it decides (the actions, executed in order by the adapter).
What the app sees is :class:`kgroup.core.assignment.View`, shared with the client and the
pipeline. Plain frozen data: no I/O, no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from kgroup.core.locks import LeaseTiming, Lock
from kgroup.core.member.app_presence import AppState


class PartitionState(enum.Enum):
    ACTIVE = "active"  # process it
    REVOKING = "revoking"  # finish in-flight work, take no new work, then acknowledge
    RELEASING = "releasing"  # release write in flight; not shown to the app


@dataclass(frozen=True)
class Target:
    epoch: int
    partitions: frozenset[int]
    # sealed partitions -> the generation that replaced them (``group_spec.sealed_by``):
    # shown to the app that holds one, which may seal it when no producer has
    sealed_by: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class AppRelease:
    """The app acknowledged (or asked for) the release of a partition."""

    token: int
    position: str | None
    completed: bool = False  # the partition is sealed and ``position`` is its seal marker


@dataclass(frozen=True)
class Snapshot:
    now: float
    timing: LeaseTiming | None  # None until the ConsumerGroup was seen
    drain_timeout: float
    target: Target | None  # None: the status has no epoch (hold what we have)
    locks: Mapping[int, Lock]
    app_releases: Mapping[int, AppRelease] = field(default_factory=dict)
    group_deleted: bool = False  # the ConsumerGroup is gone: revoke everything
    # the app's part (kgroup.core.member.app_presence); None: the sidecar has no app gate
    app: AppState | None = None


# ---- actions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StartSession:
    """Create (or take over) the member Lease with a fresh session id; report
    ``session_started`` with the time the write was sent."""

    timing: LeaseTiming


@dataclass(frozen=True)
class Renew:
    """Update the member Lease (renewTime, duration, acknowledged epoch)."""

    session: str
    timing: LeaseTiming
    epoch: int | None


@dataclass(frozen=True)
class AckEpoch(Renew):
    """A renewal that records a newly acknowledged epoch (held == target(epoch))."""


@dataclass(frozen=True)
class Acquire:
    """Conditional update of the partition Lease (``expected_rv`` its precondition):
    holder = us, token = ``token``, the expiry mark cleared. ``takeover``: the lock is
    held by another member's session that the operator marked expired."""

    partition: int
    session: str
    token: int
    expected_rv: str
    takeover: bool = False


@dataclass(frozen=True)
class Revoke:
    """Informational: the partition turned revoking (the app view changed)."""

    partition: int
    token: int
    deadline: float


@dataclass(frozen=True)
class Release:
    """Conditional update clearing the holder; ``position`` None keeps the old one."""

    partition: int
    session: str
    token: int
    expected_rv: str
    position: str | None
    reason: str
    completed: bool = False  # also record the partition completed (read to its seal)


@dataclass(frozen=True)
class Fence:
    """The session is over: every partition in ``partitions`` is lost; ownership ended at
    ``until`` (the deadline), whenever this action is executed."""

    session: str
    partitions: tuple[tuple[int, int], ...]  # (partition, token)
    until: float


@dataclass(frozen=True)
class Lost:
    """One partition was taken by another session (we must have been seen as dead)."""

    partition: int
    session: str
    token: int


@dataclass(frozen=True)
class Adopted:
    """Informational: a lock carrying our session was found and is now held (an
    acquisition reported failed was applied after all); the adapter audits it as an
    acquisition."""

    partition: int
    session: str
    token: int
    position: str | None


@dataclass(frozen=True)
class EndSession:
    """Shutdown finished releasing: delete the member Lease."""

    session: str


Action = (
    StartSession | Renew | Acquire | Adopted | Revoke | Release | Fence | Lost | EndSession
)
