"""Deliberately broken variants of the SHIPPED decision code, to prove the checker fails.

Rule of this module: each variant is a subclass of the code that ships
(:class:`kgroup.core.member.reconcile.Member` or :class:`kgroup.core.member.converge.SidecarLogic`)
that overrides exactly one decision and says which. Nothing here restates a driver: the
simulation runs the shipped logic with one decision swapped. A checker that never fails
proves nothing; tests/test_simulation.py shows each variant failing where the shipped
code passes.

Member variants (``SimConfig.member_factory``): broken rules of the member state machine.
Sidecar-logic regressions (``SimConfig.regressions``, by name): bugs the simulation once
found in the sidecar's runtime, fixed since, brought back.
Failure-detector variants (``SimConfig.expiry_rule``): subclasses of the operator's
:class:`kgroup.core.operator.decide.ExpiryRule` that mark a lock's holder session expired
when it is not (the operator is the group's failure detector since no sidecar watches
another member's Lease).
Pod-identity variants (``SimConfig.identities``): subclasses of the operator's
:class:`kgroup.core.operator.pod_identity.PodIdentities` that mark a name's locks for a pod that
is not the one the restart grace keeps them for.
Layout variants (``SimConfig.layout``): subclasses of the operator's
:class:`kgroup.core.operator.reshape.Layout` (its seam: ``Layouts(layout_class)``, which
the operator's ``Memory.layouts`` holds) that assign what a reshape must keep waiting.
Balance variants (``SimConfig.balance``, :data:`BALANCES`): the load-aware planner set up
through its public seam, ``spec.balance``, with the settings that make it what it is
switched off; the planner's code is the shipped one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from functools import cached_property

from kgroup.core import lease_codec as codec
from kgroup.core.locks import LeaseTiming, LockState
from kgroup.core.member.app_presence import AppState
from kgroup.core.member.converge import SidecarLogic
from kgroup.core.member.reconcile import Acquire, Action, Lock, Member, Release, Snapshot
from kgroup.core.member.requests import Scope
from kgroup.core.objects import Obj
from kgroup.core.operator.decide import ExpiryRule
from kgroup.core.operator.lease_cache import GroupLeases
from kgroup.core.operator.planner import PodObservation
from kgroup.core.operator.pod_identity import PodIdentities
from kgroup.core.operator.reshape import Layout
from kgroup.crd_models import BalanceSettings

__all__ = [
    "BALANCES",
    "LOAD_WINDOWS",
    "REGRESSIONS",
    "AcquireTimeoutFails",
    "DeafToSilence",
    "EarlyExpiry",
    "FixedRequestTimeout",
    "MarkerCompareExpiry",
    "NameOnlyIdentities",
    "NoAdoptionMember",
    "NoAppGate",
    "NoFencingMember",
    "NoMarkMember",
    "NoRereadExpiry",
    "NoTargetRevokesMember",
    "NoUidMember",
    "SameTokenMember",
    "SkipsTheWait",
    "StaleRelist",
    "TokenOnlyCache",
    "TransitionsTokenMember",
    "logic_with",
]


# ---- the member state machine -----------------------------------------------------------


class NoFencingMember(Member):
    """BROKEN: ignores its fencing deadline (never fences, its view never expires), as a
    sidecar would that trusts its session until it hears otherwise."""

    @property
    def deadline(self) -> float | None:
        return None if super().deadline is None else 1e18


class SameTokenMember(Member):
    """BROKEN: acquires with the lock's current token instead of the resourceVersion it
    replaces, so a new owner's token is not above the stale owner's."""

    def step(self, snap: Snapshot) -> list[Action]:
        return [
            dataclasses.replace(a, token=snap.locks[a.partition].token)
            if isinstance(a, Acquire) else a
            for a in super().step(snap)
        ]


class TransitionsTokenMember(Member):
    """BROKEN (the token before kgroup.dev/token): acquires with the lock's token + 1, as
    when the token was ``leaseTransitions``. Tokens grow while the Lease lives, but start
    again from 1 when it is deleted and created again (by hand, or with its group): the
    fenced sink, which remembers the higher ones, refuses every new owner."""

    def step(self, snap: Snapshot) -> list[Action]:
        return [
            dataclasses.replace(a, token=snap.locks[a.partition].token + 1)
            if isinstance(a, Acquire) else a
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

    def adopt(self, snap: Snapshot, session: str) -> list[Action]:
        return []


class NoMarkMember(Member):
    """BROKEN: takes a lock held by another member's session without the operator's
    expiry mark (as soon as the target names it), as a member would that trusts the
    target alone. The chart's admission policy refuses such a write; the simulation runs
    it with ``SimConfig.expiry_admission=False`` to show the protocol needs the mark."""

    def lock_state(self, lock: Lock, session: str) -> LockState:
        state = super().lock_state(lock, session)
        return LockState.TAKEABLE if state is LockState.HELD else state


class NoUidMember(Member):
    """BROKEN: does not know its pod's uid (as without ``KGROUP_POD_UID``) and takes a
    lock marked for its name whatever the mark's uid. The chart's admission policy refuses
    such a write; the simulation runs it with ``SimConfig.uid_admission=False`` to show
    the protocol needs the uid in the mark."""

    @property
    def uid(self) -> str | None:
        return None

    @uid.setter
    def uid(self, value: str | None) -> None:
        pass


# ---- the operator's pod identities --------------------------------------------------------


class NameOnlyIdentities(PodIdentities):
    """BROKEN: a name's marks follow whatever pod holds the name now, as an operator would
    that binds the mark to the name alone (or to the uid without asking whose pod it is):
    a bare pod created under a departed StatefulSet pod's name is marked at once."""

    def resolve(self, names: Iterable[str], pods: Iterable[PodObservation], now: float,
                grace: Callable[[PodObservation], float]) -> tuple[dict[str, str], float | None]:
        pods = list(pods)
        uids, _ = super().resolve(names, pods, now, grace)
        wanted = set(uids) | set(names)
        return {**uids, **{p.name: p.uid for p in pods if p.uid and p.name in wanted}}, None


# ---- the operator's layout ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SkipsTheWait(Layout):
    """BROKEN: every partition of every generation kept that is not completed is
    assignable at once, so a reshape's successors are given Leases, marked and taken
    while their predecessors are still being read (the wait skipped). Caught by the
    ``reshape-order`` check."""

    @cached_property
    def assignable(self) -> tuple[int, ...]:
        lineage = self.lineage
        return tuple(sorted(p for p in lineage.partitions if p not in lineage.completed))


# ---- the operator's failure detector ------------------------------------------------------


class NoRereadExpiry(ExpiryRule):
    """BROKEN: marks a lock's holder session expired on the cache alone, without the
    quorum re-read of the holder's member Lease: a renewal the watch has not delivered yet
    (lost, late, a stream being re-listed) does not save a live holder."""

    def reread(self) -> bool:
        return False


class EarlyExpiry(ExpiryRule):
    """BROKEN: counts a session over after half the lease duration unrenewed instead of a
    full one (the holder fences only at duration - margin), as a detector would that
    measures from the holder's renewTime or trusts a shortened timeout."""

    def expires_at(self, leases: GroupLeases, member: str, session: str) -> float | None:
        expiry = super().expires_at(leases, member, session)
        lease = leases.members.get(member)
        if expiry is None or lease is None:
            return expiry
        return expiry - lease.duration / 2


class MarkerCompareExpiry(ExpiryRule):
    """BROKEN (the sidecar's ``holder-marker-compare``, moved with the rule to the
    operator): the quorum re-read compares the fresh marker with the cache's *current*
    one (which a watch event may have moved on during the read) instead of feeding the
    read to the tracker and asking it whether the session is live."""

    def confirm(self, leases: GroupLeases, member: str, session: str, fresh: Obj | None,
                now: float) -> bool:
        lease = codec.parse_member_lease(fresh).value if fresh is not None else None
        if lease is not None and lease.session == session \
                and lease.marker != leases.tracker.marker_of(member):
            leases.member_read(member, fresh, now)
            return False
        return True


# ---- the sidecar's decisions above the member ---------------------------------------------


class AcquireTimeoutFails(SidecarLogic):
    """BROKEN (``acquire-timeout-fails``): an acquisition without answer is reported
    failed, though the server may have applied it."""

    def reread_unanswered_acquisition(self) -> bool:
        return False


class StaleRelist(SidecarLogic):
    """BROKEN (``stale-relist``): a partition re-list replaces the cache wholesale (a list
    read before our own acquisition, delivered after it, wins), and a release trusts that
    cache, giving the lock up unwritten."""

    def on_list(self, kind: str, items: list[Obj], scope: Scope = None) -> None:
        if kind == "partition":
            self.partition_leases.clear()
            self.locks.clear()
        super().on_list(kind, items, scope)

    def cache_behind(self, lock: Lock | None, action: Release) -> bool:
        return False


class TokenOnlyCache(SidecarLogic):
    """BROKEN (``token-only-cache``): the lock cache compares tokens only, so a replayed
    older version with the same token overwrites a newer one."""

    def supersedes(self, new: Obj, cached: Obj) -> bool:
        a = codec.parse_partition_lease(new).value
        b = codec.parse_partition_lease(cached).value
        return a is None or b is None or a.token >= b.token


class FixedRequestTimeout(SidecarLogic):
    """BROKEN (``fixed-request-timeout``): requests time out after 0.4 x the lease
    duration and a failed renewal is retried after min(1 s, renew / 2), so one lost
    renewal answer fences a member with the default 15 s / 5 s lease."""

    def request_timeout(self) -> float:
        duration = self.timing.duration if self.timing is not None else 15.0
        return max(0.5, 0.4 * duration)

    def renew_retry(self, timing: LeaseTiming) -> float:
        return min(1.0, timing.renew_interval / 2)


class NoAppGate(SidecarLogic):
    """Joins without its app and never leaves for its silence: the sidecar before owned
    meant consumed (``app_state`` says nothing of the app). Caught by the app-join check
    (a slow app's partitions are held before it asked) and the silent-owner check."""

    def app_state(self) -> AppState | None:
        return None


class DeafToSilence(SidecarLogic):
    """Never takes its app for gone once it joined: a hung app's partitions stay with it.
    Caught by the silent-owner check."""

    def app_state(self) -> AppState | None:
        state = super().app_state()
        if state is None or not self.app.joined:
            return state
        return AppState(taking_part=True, seen=state.seen)


REGRESSIONS: dict[str, type[SidecarLogic]] = {
    "acquire-timeout-fails": AcquireTimeoutFails,
    "no-app-gate": NoAppGate,
    "deaf-to-silence": DeafToSilence,
    "fixed-request-timeout": FixedRequestTimeout,
    "stale-relist": StaleRelist,
    "token-only-cache": TokenOnlyCache,
}


def logic_with(names: Iterable[str]) -> type[SidecarLogic]:
    """The shipped logic with the named regressions brought back (none: the shipped one)."""
    chosen = tuple(REGRESSIONS[n] for n in sorted(set(names)))
    if not chosen:
        return SidecarLogic
    if len(chosen) == 1:
        return chosen[0]
    return type("+".join(c.__name__ for c in chosen), chosen, {})


# ---- the load-aware planner's settings ------------------------------------------------------


BALANCES: dict[str, BalanceSettings] = {
    # spec.balance.mode load with the documented defaults (tolerance 0.15, margin 0.05,
    # dwellSeconds 60)
    "real": BalanceSettings(mode="load"),
    # BROKEN (with LOAD_WINDOWS): no hysteresis: no band (tolerance 0, margin 0: any
    # member above the mean with a gain to make triggers a rebalance), no dwell time (a
    # partition may move at every plan), and planning on the latest report alone (no
    # mean, so no measured noise to widen the band), so noise in the reports moves
    # partitions back and forth
    "no-hysteresis": BalanceSettings(mode="load", tolerance=0, margin=0, dwell_seconds=0),
    # BROKEN (with LOAD_WINDOWS): the shipped band and dwell time, but the operator plans
    # on each member's latest report alone, so noise re-drawn at every renewal reaches
    # the planner whole
    "no-smoothing": BalanceSettings(mode="load"),
}
"""``spec.balance`` for load-mode runs, by name (``python -m kgroup_sim --balance``)."""

LOAD_WINDOWS: dict[str, int] = {"no-hysteresis": 1, "no-smoothing": 1}
"""The operator's load window (``GroupLeases.load_window_reports``) of the balances that
change it; the others keep the shipped
:data:`~kgroup.core.operator.load_window.LOAD_WINDOW_REPORTS`."""
