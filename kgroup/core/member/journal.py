"""What the sidecar's decision code reports as it happens: one class per event.

:class:`kgroup.core.member.converge.SidecarLogic` hands each to its journal; the runtime
(``kgroup_sidecar.runtime``) turns it into logs, metrics, audit lines, pod Events and
answers to the app's waiting release requests, the simulation into its trace. ``kind`` is
the event's name in the trace and the tests; :meth:`Event.fields` its data in order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol


@dataclass(frozen=True)
class Event:
    kind: ClassVar[str]

    def fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class Warned(Event):
    kind: ClassVar[str] = "warning"
    message: str


@dataclass(frozen=True)
class SessionStarted(Event):
    kind: ClassVar[str] = "session"
    session: str


@dataclass(frozen=True)
class SessionStartFailed(Event):
    kind: ClassVar[str] = "session-start-failed"
    why: str


@dataclass(frozen=True)
class RenewFailed(Event):
    kind: ClassVar[str] = "renew-failed"
    why: str
    lost: bool  # the session is over (its member Lease is gone or carries another)


@dataclass(frozen=True)
class Fenced(Event):
    kind: ClassVar[str] = "fence"
    session: str
    until: float
    partitions: list[list[int]]  # [partition, token] of each lock given up


@dataclass(frozen=True)
class Lost(Event):
    kind: ClassVar[str] = "lost"
    session: str
    partition: int
    token: int


@dataclass(frozen=True)
class Revoking(Event):
    kind: ClassVar[str] = "revoke"
    partition: int
    token: int


@dataclass(frozen=True)
class Acquired(Event):
    kind: ClassVar[str] = "acquired"
    session: str
    partition: int
    token: int
    position: str | None
    adopted: bool  # a write reported failed that the server applied


@dataclass(frozen=True)
class AcquireFailed(Event):
    kind: ClassVar[str] = "acquire-failed"
    partition: int
    why: str


@dataclass(frozen=True)
class Releasing(Event):
    """A release is about to be written (``reason``: the app's, or ``drain-timeout``)."""

    kind: ClassVar[str] = "release"
    session: str
    partition: int
    token: int
    position: str | None
    reason: str


@dataclass(frozen=True)
class Released(Event):
    kind: ClassVar[str] = "released"
    partition: int
    token: int
    position: str | None


@dataclass(frozen=True)
class ReleaseFailed(Event):
    kind: ClassVar[str] = "release-failed"
    partition: int
    why: str


@dataclass(frozen=True)
class EndSessionFailed(Event):
    kind: ClassVar[str] = "end-session-failed"
    why: str


@dataclass(frozen=True)
class SessionEnded(Event):
    kind: ClassVar[str] = "session-end"
    session: str


@dataclass(frozen=True)
class Resolved(Event):
    """The app's waiting release request for ``(partition, token)`` is answered."""

    kind: ClassVar[str] = "resolved"
    partition: int
    token: int
    ok: bool


class Journal(Protocol):
    """Where the logic reports what happened (audit file, metrics, logs, app waiters)."""

    def record(self, event: Event) -> None: ...
