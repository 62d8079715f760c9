"""A simulated API store: a few object kinds, resourceVersions, conditional updates.

Rule of this module: it behaves like the Kubernetes API server where kgroup relies on
it, and no further. Every committed write gets a new, globally increasing
``resourceVersion``; an update carrying another ``resourceVersion`` than the stored one is
refused (409 Conflict), never merged; a create of an existing object is refused (409
AlreadyExists); an update or delete of a missing object is refused (404). Nothing here
knows time, delays or faults: the simulation decides *when* a request reaches the store
and whether its answer ever reaches the caller. Every commit is reported to one hook, from
which the simulation fans out watch events and runs its store-level checks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GroupObj",
    "MemberLeaseObj",
    "PartitionLeaseObj",
    "PodObj",
    "Store",
    "Stored",
    "WriteError",
    "stream_of",
]


@dataclass(frozen=True)
class GroupObj:
    """The ConsumerGroup; the spec is fixed per run, only the status (wire form) changes."""

    rv: int
    status: dict[str, Any]


@dataclass(frozen=True)
class MemberLeaseObj:
    """A member Lease (the session). Its renewal marker is its resourceVersion."""

    rv: int
    member: str
    session: str
    duration: float
    epoch: int | None  # the kgroup.dev/epoch annotation


@dataclass(frozen=True)
class PartitionLeaseObj:
    """A partition Lease (the lock); ``token`` is ``spec.leaseTransitions``."""

    rv: int
    partition: int
    holder: str | None
    session: str | None
    token: int
    position: str | None
    position_token: int | None


@dataclass(frozen=True)
class PodObj:
    """What the operator needs of a member pod."""

    rv: int
    name: str
    ready: bool


Stored = GroupObj | MemberLeaseObj | PartitionLeaseObj | PodObj


def stream_of(key: str) -> str:
    """The watch stream an object belongs to: one per resource type, as in Kubernetes."""
    kind = key.split("/", 1)[0]
    return "lease" if kind in ("member", "partition") else kind


class WriteError(Exception):
    """A refused write: ``status`` is the HTTP status (404 or 409)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


CommitHook = Callable[[str, "Stored | None", "Stored | None"], None]


class Store:
    """Objects by key (``group``, ``member/<pod>``, ``partition/<n>``, ``pod/<pod>``)."""

    def __init__(self, on_commit: CommitHook) -> None:
        self.objects: dict[str, Stored] = {}
        self.rv = 0
        self.writes = 0
        self._on_commit = on_commit

    def get(self, key: str) -> Stored | None:
        return self.objects.get(key)

    def list(self, stream: str) -> list[tuple[str, Stored]]:
        return [(k, o) for k, o in self.objects.items() if stream_of(k) == stream]

    def _commit(self, key: str, obj: Stored | None) -> Stored | None:
        old = self.objects.get(key)
        self.writes += 1
        if obj is None:
            del self.objects[key]
            self._on_commit(key, old, None)
            return None
        self.rv += 1
        new = dataclasses.replace(obj, rv=self.rv)
        self.objects[key] = new
        self._on_commit(key, old, new)
        return new

    def create(self, key: str, obj: Stored) -> Stored:
        if key in self.objects:
            raise WriteError(409, f"{key} already exists")
        new = self._commit(key, obj)
        assert new is not None
        return new

    def update(self, key: str, obj: Stored, *, expected_rv: int) -> Stored:
        """Replace ``key`` if its resourceVersion is still ``expected_rv``."""
        old = self.objects.get(key)
        if old is None:
            raise WriteError(404, f"{key} not found")
        if old.rv != expected_rv:
            raise WriteError(409, f"{key}: resourceVersion {expected_rv} is not {old.rv}")
        new = self._commit(key, obj)
        assert new is not None
        return new

    def delete(self, key: str) -> None:
        if key not in self.objects:
            raise WriteError(404, f"{key} not found")
        self._commit(key, None)
