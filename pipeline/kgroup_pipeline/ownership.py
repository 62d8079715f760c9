"""What the worker owns: partitions with their fencing token, state and handed-over position.

Rule: the pipeline asks an :class:`Ownership` and nothing else. In a pod that is the
sidecar's local HTTP API (docs/protocol.md, ``GET /v1/assignment`` and
``POST /v1/partitions/{n}/release``); in tests it is :class:`StaticOwnership` or the
scripted coordinator in :mod:`kgroup_pipeline.scripted`.

The PySpark source plans batches in a Python process of its own (not the driver's), so an
ownership must be re-creatable from a string: :func:`ownership_from_spec` parses
``sidecar:unix:///var/run/kgroup/sidecar.sock``, ``sidecar:http://127.0.0.1:8470`` or
``static:0-15@1`` (partitions, token).
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from kgroup.client import (
    Assignment,
    Partition,
    Report,
    SidecarClient,
    SidecarError,
    View,
    format_ranges,
    parse_ranges,
)
from kgroup.follower import AssignmentFollower

OwnedPartition = Partition
"""A partition the worker owns: the client's :class:`kgroup.client.Partition` (the wire
object of the sidecar's view); ``state`` is "active" or "revoking", ``position`` what the
previous owner handed over, if anything."""

NEVER = float("inf")


def lasting(partitions: tuple[OwnedPartition, ...], *, member: str, version: int = 0
         ) -> Assignment:
    """An answer whose promise never runs out: what a static or scripted ownership holds
    (the same :class:`kgroup.client.Assignment` a sidecar's answer is read into)."""
    return Assignment(View(member=member, session=member, version=version, epoch=version,
                           acked_epoch=version, fenced=False, valid_for_seconds=30.0,
                           partitions=partitions), NEVER)


class Ownership(Protocol):
    def assignment(self) -> Assignment:
        """What the member holds now: ``.active`` to process, ``.revoking`` to finish and
        release, ``.partitions`` both; all empty once the answer's promise ran out."""
        ...

    def release(self, partition: int, token: int, position: str | None) -> bool:
        """Hand the partition back at `position`; False if it was not ours (any more)."""
        ...

    def complete(self, partition: int, token: int, position: str) -> bool:
        """Hand back a sealed partition read to its end: `position` is its seal marker
        (a release that says so); False if it was not ours (any more)."""
        ...


class StaticOwnership:
    """A fixed set of partitions under one token, never revoked (one worker, no Kubernetes)."""

    def __init__(self, partitions: list[int], *, token: int = 1) -> None:
        self.token = token
        self._held = {p: OwnedPartition(p, token) for p in sorted(partitions)}
        self.completed: dict[int, str] = {}  # partition -> its seal marker

    def assignment(self) -> Assignment:
        return lasting(tuple(self._held.values()), member="static")

    def release(self, partition: int, token: int, position: str | None) -> bool:
        held = self._held.get(partition)
        if held is None or held.token != token:
            return False
        del self._held[partition]
        return True

    def complete(self, partition: int, token: int, position: str) -> bool:
        if not self.release(partition, token, position):
            return False
        self.completed[partition] = position
        return True

    def spec(self) -> str:
        return f"static:{format_ranges(self._held)}@{self.token}"


class SidecarOwnership:
    """The sidecar's local API through :class:`kgroup.client.SidecarClient`.

    The client stops reporting partitions once the sidecar's promise
    (``validForSeconds``) has run out, so a worker cut off from its sidecar plans nothing
    rather than processing partitions it may no longer own.

    With ``follow`` (the light worker, and both of the PySpark pipeline's processes that
    ask: the driver's hand-off loop and the source's planner), :meth:`assignment` costs no
    request: a
    :class:`kgroup.follower.AssignmentFollower` keeps a long-poll open and the answer
    it holds is read (a plain request only before its first answer and right after a
    release, so a partition just released is never reported again).

    With ``handoff`` too (the driver's hand-off loop, which only releases revoking
    partitions), the follower asks as :func:`kgroup.rebalance.handoff_wait` says: with
    nothing revoking, once per 30 s or at a change instead of every 2-3 s, so
    :meth:`assignment` may hold a spent promise then; :meth:`refresh` before a step that
    must see every partition held (the release of everything at shutdown).
    """

    def __init__(self, url: str, *, timeout: float = 5.0, follow: bool = False,
                 handoff: bool = False) -> None:
        self.url = url.rstrip("/")
        self.client = SidecarClient(self.url, timeout=timeout)
        self.follower = AssignmentFollower(self.url, timeout=timeout, handoff=handoff
                                           ).start() if follow else None

    def assignment(self) -> Assignment:
        """Raises :class:`kgroup.client.SidecarError` when the sidecar cannot answer."""
        a = self.follower.latest() if self.follower is not None else None
        if a is None:
            a = self.follower.fetch(self.client) if self.follower is not None \
                else self.client.assignment()
        return a

    def refresh(self) -> None:
        """Make the next :meth:`assignment` ask the sidecar when the followed answer's
        promise ran out (one request per promise, not per call)."""
        latest = self.follower.latest() if self.follower is not None else None
        if latest is not None and latest.expired:
            self.follower.forget()  # type: ignore[union-attr]

    def release(self, partition: int, token: int, position: str | None, *,
                completed: bool = False) -> bool:
        try:
            return self.client.release(partition, token, position, completed=completed)
        except SidecarError as e:
            if e.status in (404, 409):
                return False
            raise
        finally:
            if self.follower is not None:
                self.follower.forget()

    def complete(self, partition: int, token: int, position: str) -> bool:
        """Release a sealed partition read to its seal marker (``position``) as completed."""
        return self.release(partition, token, position, completed=True)

    def report_health(self, reports: list[Report]) -> None:
        """Per-partition position, lag, stall to the sidecar (``kgroup_pipeline.health``);
        an unreachable sidecar is not an error here (the next report will do)."""
        with contextlib.suppress(SidecarError):
            self.client.report_health(reports)

    def spec(self) -> str:
        return f"sidecar:{self.url}"

    def close(self) -> None:
        """Stop following (the long-poll in flight ends on its own; the thread is a daemon)."""
        if self.follower is not None:
            self.follower.stop()


def ownership_from_spec(spec: str, *, follow: bool = False, handoff: bool = False
                        ) -> StaticOwnership | SidecarOwnership:
    """``sidecar:<url>`` or ``static:<ranges>[@token]``; ``follow``, ``handoff``: see
    :class:`SidecarOwnership`."""
    kind, _, rest = spec.partition(":")
    if kind == "sidecar":
        return SidecarOwnership(rest, follow=follow, handoff=handoff)
    if kind == "static":
        ranges, _, token = rest.partition("@")
        return StaticOwnership(parse_ranges(ranges), token=int(token or 1))
    raise ValueError(f"unknown ownership spec {spec!r} (sidecar:URL or static:RANGES@TOKEN)")
