"""The vocabulary between the sidecar's decision code and its drivers.

:class:`kgroup.core.member.converge.SidecarLogic` returns request chains: generators that
yield a request value (:class:`GetLease`, :class:`CreateLease`, :class:`ReplaceLease`,
:class:`DeleteLease`, :class:`Pause`) and receive the answer (:class:`Ok`,
:class:`Refused`, :class:`NoAnswer`). A driver maps each request onto a call of its API
server (the real one: ``kgroup_sidecar.runtime``; the simulated one:
``kgroup_sim.sidecar``) and each outcome onto an answer, and nothing more. Plain data.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

from kgroup.core.objects import Obj

__all__ = [
    "UNKNOWN",
    "Answer",
    "Chain",
    "CreateLease",
    "DeleteLease",
    "GetLease",
    "NoAnswer",
    "Ok",
    "Pause",
    "Refused",
    "ReplaceLease",
    "Request",
    "Scope",
    "Tick",
    "Unknown",
    "describe",
    "found",
]

Scope = frozenset[int] | None
"""The partitions a watch covers; None: every partition Lease of the group."""


@dataclass(frozen=True)
class GetLease:
    """Read a Lease (a quorum read). ``session``: on the member Lease's own lane."""

    name: str
    timeout: float
    session: bool = False


@dataclass(frozen=True)
class CreateLease:
    body: Obj
    timeout: float


@dataclass(frozen=True)
class ReplaceLease:
    """A conditional update: ``body.metadata.resourceVersion`` is the precondition."""

    body: Obj
    timeout: float


@dataclass(frozen=True)
class DeleteLease:
    name: str
    timeout: float
    session: bool = False


@dataclass(frozen=True)
class Pause:
    """Wait this long before the chain's next request (a retry back-off)."""

    seconds: float


Request = GetLease | CreateLease | ReplaceLease | DeleteLease | Pause


@dataclass(frozen=True)
class Ok:
    """The request succeeded: the object written or read (None: read found nothing)."""

    obj: Obj | None = None


@dataclass(frozen=True)
class Refused:
    """The API server answered with an error status (404, 409, 422, 500, ...)."""

    status: int
    why: str = ""


@dataclass(frozen=True)
class NoAnswer:
    """No answer (timeout, broken connection): the request may or may not have happened."""

    why: str = ""


Answer = Ok | Refused | NoAnswer
Chain = Generator[Request, Answer, None]


def describe(answer: Answer) -> str:
    if isinstance(answer, Refused):
        return f"HTTP {answer.status}" + (f" {answer.why}" if answer.why else "")
    if isinstance(answer, NoAnswer):
        return f"no answer {answer.why}".strip()
    return "ok"


@dataclass(frozen=True)
class Tick:
    chains: list[Chain]
    scope: Scope  # the partition watch's scope now (None: every partition Lease)
    wake_in: float | None  # seconds until the next tick is due without news (None: never)
    exit: str | None = None  # None: keep running; else why the sidecar stops



class Unknown:
    """A read without a usable answer: whether the object exists is unknown."""


UNKNOWN = Unknown()


def found(answer: Answer) -> Obj | Unknown | None:
    """A read's result: the object, None when it does not exist, UNKNOWN when unknown."""
    if isinstance(answer, Ok):
        return answer.obj
    if isinstance(answer, Refused) and answer.status == 404:
        return None
    return UNKNOWN

