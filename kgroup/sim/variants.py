"""Member variants for the simulation: deliberately broken ones, and a fix candidate.

Rule of this module: each variant changes exactly one rule of ``kgroup.core.member`` and
says which. The broken ones exist to prove the checker can fail (a checker that never
fails proves nothing); the fix candidate shows what the simulation finds once a known
core bug is out of the way, until the core itself is fixed.
"""

from __future__ import annotations

import dataclasses

from kgroup.core.member import Acquire, Action, Member, PartitionState, Snapshot, _Owned

__all__ = ["AdoptingMember", "NoFencingMember", "SameTokenMember"]


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


class AdoptingMember(Member):
    """FIX CANDIDATE for the orphaned-lock bug: an acquisition whose answer was lost
    (timeout) but which the API server applied leaves a lock held by this very session
    that ``Member`` neither owns nor releases (``step`` skips it as "an acquisition we are
    about to hear of" though none is in flight), so its epoch is never acknowledged and,
    if another member is targeted, that member waits forever. This variant adopts such a
    lock as owned (it is ours: our live session is on it, nobody can have taken it before
    our own deadline), after which the ordinary rules keep or release it."""

    def step(self, snap: Snapshot) -> list[Action]:
        if self.session is not None and not self._expired(snap.now):
            for p, lock in sorted(snap.locks.items()):
                if (
                    lock.holder == self.member
                    and lock.session == self.session
                    and p not in self.owned
                    and p not in self._acquiring
                ):
                    self.owned[p] = _Owned(lock.token, PartitionState.ACTIVE,
                                           lock.resource_version, lock.position)
                    self._bump()
        return super().step(snap)
