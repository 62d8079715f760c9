"""The sidecar watches only the partition Leases it decides on (member.next_watch_scope,
Member.partitions_of_interest; runtime.on_list with a scope: tests/test_member_sidecar_cache.py).

The claim that makes the scoped watch safe: ``Member.step`` given only the locks of
``partitions_of_interest`` decides exactly what it decides given every lock of the group.
``test_a_member_fed_only_its_interest_decides_as_one_fed_everything`` checks it over
random histories (targets, other members' locks and sessions, app releases, failed and
unanswered acquisitions, fencing). Pure: nothing here talks to an API server."""

from __future__ import annotations

import dataclasses
import random

import pytest

from kgroup.core.locks import LeaseTiming
from kgroup.core.member.reconcile import (
    Acquire,
    Action,
    AppRelease,
    Lock,
    Member,
    Release,
    Renew,
    Snapshot,
    StartSession,
    Target,
)
from kgroup.core.member.watch_scope import MAX_SELECTED_PARTITIONS as MAX_SELECTED
from kgroup.core.member.watch_scope import SCOPE_NARROW_SLACK as NARROW_SLACK
from kgroup.core.member.watch_scope import next_watch_scope as next_scope
from kgroup_sidecar.kube import partition_selector

TIMING = LeaseTiming(duration=10, renew_interval=2)
ME = "pod-a"


# ---- next_scope and the selector -------------------------------------------------------

def test_the_scope_widens_at_once_when_the_interest_gains_a_partition() -> None:
    assert next_scope(frozenset({1, 2}), frozenset({1, 2, 3})) == frozenset({1, 2, 3})
    assert next_scope(frozenset(), frozenset({7})) == frozenset({7})


def test_the_scope_stays_while_the_interest_is_a_subset_of_it() -> None:
    current = frozenset(range(NARROW_SLACK + 2))
    assert next_scope(current, frozenset(range(5))) is current  # 10 <= 2 * 5 + slack
    assert next_scope(current, frozenset({1})) is current  # 10 <= 2 * 1 + slack


def test_the_scope_narrows_when_it_is_more_than_twice_the_interest() -> None:
    current = frozenset(range(2 * 4 + NARROW_SLACK + 1))
    assert next_scope(current, frozenset(range(4))) == frozenset(range(4))


def test_a_large_interest_watches_every_partition_and_a_small_one_narrows_again() -> None:
    big = frozenset(range(MAX_SELECTED + 1))
    assert next_scope(frozenset({1}), big) is None
    assert next_scope(None, big) is None
    assert next_scope(None, frozenset({3})) == frozenset({3})


def test_the_selector_names_the_group_the_role_and_the_partitions() -> None:
    assert partition_selector("orders", frozenset({10, 2})) == (
        "kgroup.dev/group=orders,kgroup.dev/role=partition,kgroup.dev/partition in (2,10)")
    assert partition_selector("orders", None) == "kgroup.dev/group=orders,kgroup.dev/role=partition"


# ---- the claim: interest is all the member reads --------------------------------------

class Cluster:
    """Random history around one member: other members hold, take and drop locks, sessions
    come and go, targets change, the app releases, writes succeed, fail or go unanswered."""

    def __init__(self, rng: random.Random, partitions: int) -> None:
        self.rng = rng
        self.partitions = partitions
        self.locks = {p: Lock(p, None, None, 0, f"rv{p}-0") for p in range(partitions)}
        self.target: Target | None = None
        self.app: dict[int, AppRelease] = {}
        self.epoch = 0
        self.rv = 0

    def set_lock(self, p: int, holder: str | None, session: str | None, token: int,
                 expired: str | None = None) -> str:
        self.rv += 1
        self.locks[p] = Lock(p, holder, session, token, f"rv-{self.rv}", expired=expired)
        return f"rv-{self.rv}"

    def snap(self, now: float, only: frozenset[int] | None) -> Snapshot:
        locks = self.locks if only is None else {
            p: lock for p, lock in self.locks.items() if p in only}
        if self.target is not None:  # the operator's marks: every targeted lock is ours
            locks = {p: dataclasses.replace(lock, assigned=ME)
                     if p in self.target.partitions else lock for p, lock in locks.items()}
        return Snapshot(now, TIMING, 5.0, self.target, dict(locks), dict(self.app))

    def churn(self, now: float) -> None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.25:
            self.epoch += 1
            self.target = Target(self.epoch, frozenset(
                rng.sample(range(self.partitions), rng.randint(0, self.partitions // 2))))
        elif roll < 0.55:
            p = rng.randrange(self.partitions)
            lock = self.locks[p]
            other = rng.choice(["b", "c"])
            if lock.holder != ME or rng.random() < 0.1:  # rarely, ours is taken
                self.set_lock(p, rng.choice([None, other]), rng.choice(["T1", "T2"]),
                              lock.token + 1)
        elif roll < 0.75:  # the operator marks a holder's session expired (or a stale one)
            p = rng.randrange(self.partitions)
            lock = self.locks[p]
            if lock.holder not in (None, ME) and lock.session is not None:
                self.set_lock(p, lock.holder, lock.session, lock.token,
                              rng.choice([lock.session, "T0"]))


def decide(member: Member, snap: Snapshot) -> tuple[list[Action], float | None]:
    actions = member.step(snap)
    return actions, member.next_wakeup(snap)


def report(m: Member, action: Action, fate: str, now: float, rv: str | None) -> None:
    """Tell ``m`` the outcome ``fate`` of ``action`` (the same for both members)."""
    if isinstance(action, StartSession):
        m.session_started("S1", sent_at=now, timing=TIMING, now=now)
    elif isinstance(action, Renew):  # AckEpoch too
        if fate == "ok":
            m.renewed(action.session, sent_at=now, timing=TIMING, epoch=action.epoch, now=now)
        else:
            m.renew_failed(action.session, now=now, session_lost=False, retry_in=0.5)
    elif isinstance(action, Acquire):
        if fate == "ok" and rv is not None:
            m.acquired(action.partition, action.session, token=action.token,
                       resource_version=rv)
        else:  # refused, or applied with the answer lost: reported failed either way
            m.acquire_failed(action.partition, action.session, now=now)
    elif isinstance(action, Release):
        if fate == "fail":
            m.release_failed(action.partition, action.session, now=now, still_ours=True)
        else:
            m.released(action.partition, action.session)


def carry_out(world: Cluster, action: Action, fate: str, now: float) -> str | None:
    """Apply ``action`` to the world as ``fate`` says; the new resourceVersion or None."""
    if isinstance(action, Acquire):
        current = world.locks[action.partition]
        if fate in ("ok", "unanswered") and current.resource_version == action.expected_rv:
            return world.set_lock(action.partition, ME, action.session, action.token)
    elif isinstance(action, Release) and fate != "fail":
        world.set_lock(action.partition, None, None, action.token)
        world.app.pop(action.partition, None)
    return None


@pytest.mark.parametrize("seed", range(80))
def test_a_member_fed_only_its_interest_decides_as_one_fed_everything(seed: int) -> None:
    rng = random.Random(seed)
    world = Cluster(rng, partitions=rng.choice([4, 12, 40]))
    full, scoped = Member(ME), Member(ME)
    now = 0.0
    for _ in range(150):
        now += rng.choice([0.05, 0.3, 1.0, 3.0])
        world.churn(now)
        if full.owned and rng.random() < 0.2:  # the app gives one back
            p = rng.choice(sorted(full.owned))
            world.app[p] = AppRelease(token=full.owned[p].token, position=f"{p}-{now}")
        interest = scoped.partitions_of_interest(world.target)
        assert interest == full.partitions_of_interest(world.target)
        a_full, wake_full = decide(full, world.snap(now, None))
        a_scoped, wake_scoped = decide(scoped, world.snap(now, interest))
        assert a_scoped == a_full, f"seed {seed} at {now}: decisions differ"
        assert wake_scoped == wake_full
        for action in a_full:
            fate = rng.choice(["ok", "ok", "ok", "fail", "unanswered"])
            rv = carry_out(world, action, fate, now)
            report(full, action, fate, now, rv)
            report(scoped, action, fate, now, rv)
    assert full.owned.keys() == scoped.owned.keys()
