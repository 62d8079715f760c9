"""Deliberately broken member variants, to prove the checker can fail.

Rule of this module: each variant breaks exactly one rule of ``kgroup.core.member`` and
says which. A checker that never fails proves nothing.
"""

from __future__ import annotations

import dataclasses

from kgroup.core.member import Acquire, Action, Member, Snapshot

__all__ = ["NoAdoptionMember", "NoFencingMember", "NoTargetRevokesMember", "SameTokenMember"]


class NoFencingMember(Member):
    """BROKEN: ignores its fencing deadline (never fences, its view never expires), as a
    sidecar would that trusts its session until it hears otherwise."""

    @property
    def deadline(self) -> float | None:
        return None if super().deadline is None else 1e18


class SameTokenMember(Member):
    """BROKEN: acquires with the lock's current token instead of token + 1, so a new
    owner's token is not above the stale owner's."""

    def step(self, snap: Snapshot) -> list[Action]:
        return [
            dataclasses.replace(a, token=a.token - 1) if isinstance(a, Acquire) else a
            for a in super().step(snap)
        ]


class NoTargetRevokesMember(Member):
    """BROKEN (the core before it held on without a target): treats a status without
    epoch as an empty target and revokes everything, as if the group were deleted, so an
    emptied status moves every partition before the operator re-seeds it."""

    def step(self, snap: Snapshot) -> list[Action]:
        if snap.target is None:
            snap = dataclasses.replace(snap, group_deleted=True)
        return super().step(snap)


class NoAdoptionMember(Member):
    """BROKEN (the core before rule 2's adoption): a lock carrying its own live session
    that it does not know it holds is skipped for ever, so an acquisition reported failed
    but applied by the server afterwards leaves the partition stuck."""

    def _adopt(self, snap: Snapshot, session: str) -> list[Action]:
        return []
