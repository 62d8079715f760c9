"""Deliberately broken member variants, to prove the checker can fail.

Rule of this module: each variant breaks exactly one rule of ``kgroup.core.member`` and
says which. A checker that never fails proves nothing.
"""

from __future__ import annotations

import dataclasses

from kgroup.core.member import Acquire, Action, Member, Snapshot

__all__ = ["NoFencingMember", "SameTokenMember"]


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
