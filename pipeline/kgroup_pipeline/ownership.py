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
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from kgroup.client import Report, SidecarClient, SidecarError
from kgroup.core.ranges import format_ranges, parse_ranges
from kgroup.follower import AssignmentFollower

State = Literal["active", "revoking"]


@dataclass(frozen=True)
class OwnedPartition:
    partition: int
    token: int
    state: State = "active"
    position: str | None = None  # what the previous owner handed over, if anything


@dataclass(frozen=True)
class View:
    """One answer of the ownership: what this member holds right now."""

    partitions: tuple[OwnedPartition, ...]
    version: int = 0
    fenced: bool = False

    def active(self) -> list[OwnedPartition]:
        if self.fenced:
            return []
        return [p for p in self.partitions if p.state == "active"]

    def revoking(self) -> list[OwnedPartition]:
        return [p for p in self.partitions if p.state == "revoking"]


class Ownership(Protocol):
    def assignment(self) -> View: ...

    def release(self, partition: int, token: int, position: str | None) -> bool:
        """Hand the partition back at `position`; False if it was not ours (any more)."""
        ...


class StaticOwnership:
    """A fixed set of partitions under one token, never revoked (one worker, no Kubernetes)."""

    def __init__(self, partitions: list[int], *, token: int = 1) -> None:
        self.token = token
        self._held = {p: OwnedPartition(p, token) for p in sorted(partitions)}

    def assignment(self) -> View:
        return View(tuple(self._held.values()))

    def release(self, partition: int, token: int, position: str | None) -> bool:
        held = self._held.get(partition)
        if held is None or held.token != token:
            return False
        del self._held[partition]
        return True

    def spec(self) -> str:
        return f"static:{format_ranges(self._held)}@{self.token}"


class SidecarOwnership:
    """The sidecar's local API through :class:`kgroup.client.SidecarClient`.

    The client stops reporting partitions once the sidecar's promise
    (``validForSeconds``) has run out, so a worker cut off from its sidecar plans nothing
    rather than processing partitions it may no longer own.

    With ``follow`` (the light worker), :meth:`assignment` costs no request: a
    :class:`kgroup.follower.AssignmentFollower` keeps a long-poll open and the answer
    it holds is read (a plain request only before its first answer and right after a
    release, so a partition just released is never reported again).
    """

    def __init__(self, url: str, *, timeout: float = 5.0, follow: bool = False) -> None:
        self.url = url.rstrip("/")
        self.client = SidecarClient(self.url, timeout=timeout)
        self.follower = AssignmentFollower(self.url, timeout=timeout).start() if follow \
            else None

    def assignment(self) -> View:
        """Raises :class:`kgroup.client.SidecarError` when the sidecar cannot answer."""
        a = self.follower.latest() if self.follower is not None else None
        if a is None:
            a = self.follower.fetch(self.client) if self.follower is not None \
                else self.client.assignment()
        parts = tuple(
            OwnedPartition(p.partition, p.token,
                           "revoking" if p.state == "revoking" else "active", p.position)
            for p in a.partitions
        )
        return View(parts, a.version, a.expired)

    def release(self, partition: int, token: int, position: str | None) -> bool:
        try:
            return self.client.release(partition, token, position)
        except SidecarError as e:
            if e.status in (404, 409):
                return False
            raise
        finally:
            if self.follower is not None:
                self.follower.forget()

    def report_health(self, reports: list[Report]) -> None:
        """Per-partition position, lag, stall to the sidecar (``kgroup_pipeline.health``);
        an unreachable sidecar is not an error here (the next report will do)."""
        with contextlib.suppress(SidecarError):
            self.client.report_health(reports)

    def spec(self) -> str:
        return f"sidecar:{self.url}"


def view_to_wire(view: View, *, member: str) -> dict[str, Any]:
    return {
        "member": member, "session": member, "version": view.version, "epoch": view.version,
        "ackedEpoch": view.version, "fenced": view.fenced, "validForSeconds": 30.0,
        "partitions": [{"partition": p.partition, "token": p.token, "state": p.state,
                        "position": p.position, "revokeDeadlineSeconds": None}
                       for p in view.partitions],
    }


def ownership_from_spec(spec: str, *, follow: bool = False
                        ) -> StaticOwnership | SidecarOwnership:
    """``sidecar:<url>`` or ``static:<ranges>[@token]``; ``follow``: see
    :class:`SidecarOwnership`."""
    kind, _, rest = spec.partition(":")
    if kind == "sidecar":
        return SidecarOwnership(rest, follow=follow)
    if kind == "static":
        ranges, _, token = rest.partition("@")
        return StaticOwnership(parse_ranges(ranges), token=int(token or 1))
    raise ValueError(f"unknown ownership spec {spec!r} (sidecar:URL or static:RANGES@TOKEN)")
