"""The assignment view: the one class of the body of ``GET /v1/assignment``.

The sidecar's state machine renders it (:meth:`kgroup.core.member.reconcile.Member.view`)
and serves it as JSON (:meth:`View.to_json`); the app's client reads it back
(:meth:`View.from_json`) and counts its promise on the app's own clock around it
(:class:`kgroup.client.Assignment`); the pipeline reads it through the client, and its
static and scripted ownerships build it directly. Plain frozen data at the bottom of the
core: no I/O, no clock (docs/protocol.md says what each field means).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PartitionView", "View"]


@dataclass(frozen=True)
class PartitionView:
    """One partition the member holds: ``state`` is ``"active"`` (process it) or
    ``"revoking"`` (finish, then release with the position); ``position`` is what the
    previous owner handed over; ``revoke_deadline_seconds`` is left of the drain time of a
    revoking partition; ``sealed_by``: the partition is sealed (replaced by a reshape,
    read it to its seal marker and complete it), by that generation (what its seal marker
    records), None when open."""

    partition: int
    token: int
    state: str = "active"
    position: str | None = None
    revoke_deadline_seconds: float | None = None
    sealed_by: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "token": self.token,
            "state": self.state,
            "position": self.position,
            "revokeDeadlineSeconds": self.revoke_deadline_seconds,
            "sealedBy": self.sealed_by,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> PartitionView:
        return cls(
            partition=int(body["partition"]),
            token=int(body["token"]),
            state=str(body["state"]),
            position=body.get("position"),
            revoke_deadline_seconds=body.get("revokeDeadlineSeconds"),
            sealed_by=body.get("sealedBy"),
        )


@dataclass(frozen=True)
class View:
    """What the app sees: the member, its session, the view's version (a long-poll waits
    for it to move), the target epoch and the one acknowledged, whether the session is
    fenced, how long the promise holds from when it was computed, and the partitions."""

    member: str
    session: str | None
    version: int
    epoch: int | None
    acked_epoch: int | None
    fenced: bool
    valid_for_seconds: float
    partitions: tuple[PartitionView, ...]

    def to_json(self, *, partitions: bool = True) -> dict[str, Any]:
        """The API's JSON form (``partitions=False``: without the ``partitions`` key, for
        a writer that encodes them apart)."""
        head: dict[str, Any] = {
            "member": self.member,
            "session": self.session,
            "version": self.version,
            "epoch": self.epoch,
            "ackedEpoch": self.acked_epoch,
            "fenced": self.fenced,
            "validForSeconds": round(self.valid_for_seconds, 3),
        }
        if partitions:
            head["partitions"] = [p.to_json() for p in self.partitions]
        return head

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> View:
        """Lenient where the app must be safe: a missing ``fenced`` reads as fenced, a
        missing ``validForSeconds`` as no promise."""
        return cls(
            member=str(body.get("member", "")),
            session=body.get("session"),
            version=int(body.get("version", 0)),
            epoch=body.get("epoch"),
            acked_epoch=body.get("ackedEpoch"),
            fenced=bool(body.get("fenced", True)),
            valid_for_seconds=float(body.get("validForSeconds", 0.0)),
            partitions=tuple(PartitionView.from_json(p) for p in body.get("partitions") or []),
        )
