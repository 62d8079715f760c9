"""Deterministic simulation of several members sharing one lock table, with faults.

Every member runs the real core (``Member`` + its own ``SessionTracker``) against an
in-memory store. Faults: watch lag (each member sees the store as it was up to 0.5 s
ago, and now and then its watch freezes for 1-4 s), write latency (a write commits up to
0.3 s after it was sent, its answer arrives up to 0.3 s later, some answers are lost),
long pauses (a member stops for 2-6 s, as with SIGSTOP, longer than the 3 s lease), apps
that acknowledge late, and targets that change every few seconds. After every tick the
safety promise is checked on the apps' views: no partition is reported owned by two
members, and the owner's token is the current one. (Removing the quorum read before a
takeover, or fencing 2 s late, makes seeds here fail.)
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from kgroup.core.locks import LeaseTiming, SessionTracker
from kgroup.core.member import (
    Acquire,
    Action,
    AppRelease,
    EndSession,
    Lock,
    Member,
    Release,
    Renew,
    Snapshot,
    StartSession,
    Target,
)

TIMING = LeaseTiming(duration=3, renew_interval=1)
DT = 0.1
PARTITIONS = 6


@dataclass
class Store:
    members: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> session, rv
    locks: dict[int, Lock] = field(default_factory=dict)
    rv: int = 0

    def next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)


@dataclass
class Node:
    name: str
    member: Member
    tracker: SessionTracker = field(default_factory=SessionTracker)
    paused_until: float = 0.0
    stalled: tuple[float, float] = (0.0, 0.0)  # watch frozen at [0] until [1]
    sessions: int = 0


class Sim:
    def __init__(self, seed: int, members: int = 3) -> None:
        self.rng = random.Random(seed)
        self.t = 0.0
        self.store = Store()
        for p in range(PARTITIONS):
            self.store.locks[p] = Lock(p, None, None, 0, self.store.next_rv())
        self.nodes = [Node(f"m{i}", Member(f"m{i}")) for i in range(members)]
        self.history: list[tuple[float, Store]] = []
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = 0
        self.target: dict[str, list[int]] = {}
        self.epoch = 0
        self.max_token = dict.fromkeys(range(PARTITIONS), 0)

    # -- plumbing -------------------------------------------------------------------
    def at(self, when: float, fn: Callable[[], None]) -> None:
        self.seq += 1
        self.events.append((when, self.seq, fn))

    def lagged(self, node: Node) -> Store:
        lag = 0.0 if self.rng.random() < 0.4 else self.rng.uniform(0, 0.5)
        since, until = node.stalled
        if self.t < until:
            lag = self.t - since
        elif self.rng.random() < DT / 20:  # the watch breaks: a stale view for 1-4 s
            node.stalled = (self.t, self.t + self.rng.uniform(1, 4))
        for when, state in reversed(self.history):
            if when <= self.t - lag:
                return state
        return self.history[0][1]

    def observe(self, node: Node) -> dict[int, Lock]:
        seen = self.lagged(node)
        for name in set(node.tracker.members()) - set(seen.members):
            node.tracker.forget(name)
        for name, (session, rv) in seen.members.items():
            node.tracker.observe(name, session, rv, TIMING.duration, self.t)
        return dict(seen.locks)

    def delay(self) -> float:
        """Network + API server time: often none at all (the tightest case), else <= 0.3 s."""
        return 0.0 if self.rng.random() < 0.4 else self.rng.uniform(0, 0.3)

    # -- executing one action -------------------------------------------------------
    def execute(self, node: Node, a: Action) -> None:
        sent = self.t
        commit = sent + self.delay()
        answer = commit + self.delay()
        lost_answer = self.rng.random() < 0.05
        m, s = node.member, self.store

        def reply(fn: Callable[[], None]) -> None:
            self.at(answer, lambda: self.deliver(node, fn))

        if isinstance(a, StartSession):
            node.sessions += 1
            session = f"{node.name}-s{node.sessions}"

            def start() -> None:
                s.members[node.name] = (session, s.next_rv())
                reply(lambda: m.session_started(session, sent_at=sent, timing=TIMING,
                                                now=self.t) if not lost_answer
                      else m.session_start_failed(now=self.t))

            self.at(commit, start)
        elif isinstance(a, Renew):
            def renew() -> None:
                current = s.members.get(node.name)
                if current is None or current[0] != a.session:
                    reply(lambda: m.renew_failed(a.session, now=self.t, session_lost=True,
                                                 retry_in=0.5))
                    return
                s.members[node.name] = (a.session, s.next_rv())
                reply(lambda: m.renewed(a.session, sent_at=sent, timing=TIMING, epoch=a.epoch,
                                        now=self.t) if not lost_answer
                      else m.renew_failed(a.session, now=self.t, session_lost=False,
                                          retry_in=0.5))

            self.at(commit, renew)
        elif isinstance(a, Acquire):
            def acquire() -> None:
                if a.verify_holder is not None:  # the quorum read of the holder's session,
                    holder = s.members.get(a.verify_holder)  # as runtime._holder_expired
                    if holder is None:
                        node.tracker.forget(a.verify_holder)
                    else:
                        node.tracker.observe(a.verify_holder, holder[0], holder[1],
                                             TIMING.duration, self.t)
                    if a.verify_session is not None and node.tracker.is_live(
                            a.verify_holder, a.verify_session, self.t):
                        reply(lambda: m.acquire_failed(a.partition, a.session, now=self.t))
                        return
                lock = s.locks[a.partition]
                if lock.resource_version != a.expected_rv:
                    reply(lambda: m.acquire_failed(a.partition, a.session, now=self.t))
                    return
                rv = s.next_rv()
                s.locks[a.partition] = Lock(a.partition, node.name, a.session, a.token, rv,
                                            lock.position, lock.position_token)
                reply(lambda: m.acquired(a.partition, a.session, token=a.token,
                                         resource_version=rv) if not lost_answer
                      else m.acquire_failed(a.partition, a.session, now=self.t))

            self.at(commit, acquire)
        elif isinstance(a, Release):
            def release() -> None:
                lock = s.locks[a.partition]
                if (lock.holder, lock.session, lock.token) != (node.name, a.session, a.token):
                    reply(lambda: m.release_failed(a.partition, a.session, now=self.t,
                                                   still_ours=False))
                    return
                s.locks[a.partition] = Lock(a.partition, None, None, lock.token, s.next_rv(),
                                            a.position or lock.position, lock.token)
                reply(lambda: m.released(a.partition, a.session))

            self.at(commit, release)
        elif isinstance(a, EndSession):
            def end() -> None:
                s.members.pop(node.name, None)

            self.at(commit, end)

    def deliver(self, node: Node, fn: Callable[[], None]) -> None:
        if self.t < node.paused_until:  # the process is stopped: it reads the answer later
            self.at(node.paused_until, lambda: self.deliver(node, fn))
        else:
            fn()

    # -- the world ------------------------------------------------------------------
    def retarget(self) -> None:
        names = [n.name for n in self.nodes]
        self.epoch += 1
        self.target = {n: [] for n in names}
        for p in range(PARTITIONS):
            self.target[self.rng.choice(names)].append(p)

    def tick(self) -> None:
        self.history.append((self.t, copy.deepcopy(self.store)))
        due = sorted(e for e in self.events if e[0] <= self.t)
        self.events = [e for e in self.events if e[0] > self.t]
        for _, _, fn in due:
            fn()
        if self.t == 0 or self.rng.random() < DT / 4:
            self.retarget()
        for node in self.nodes:
            if self.t < node.paused_until:
                continue
            if self.rng.random() < DT / 15:
                node.paused_until = self.t + self.rng.uniform(2, 6)
                continue
            locks = self.observe(node)
            view = node.member.view(self.t)
            acks = {p.partition: AppRelease(p.token, f"{node.name}@{self.t:.1f}")
                    for p in view.partitions
                    if p.state == "revoking" and self.rng.random() < 0.3}
            snap = Snapshot(self.t, TIMING, 2.0,
                            Target(self.epoch, frozenset(self.target[node.name])),
                            locks, node.tracker, acks)
            for action in node.member.step(snap):
                self.execute(node, action)
        self.check()
        self.t = round(self.t + DT, 6)

    def check(self) -> None:
        owners: dict[int, list[tuple[str, int]]] = {}
        for node in self.nodes:
            for pv in node.member.view(self.t).partitions:
                owners.setdefault(pv.partition, []).append((node.name, pv.token))
        for p, who in owners.items():
            assert len(who) == 1, f"t={self.t:.1f}: partition {p} owned by {who}"
            name, token = who[0]
            assert token == self.store.locks[p].token, (
                f"t={self.t:.1f}: {name} reports token {token} of {p}, current is "
                f"{self.store.locks[p].token}")
        for p, lock in self.store.locks.items():
            assert lock.token >= self.max_token[p]
            self.max_token[p] = lock.token


@pytest.mark.parametrize("seed", range(20))
def test_no_two_members_ever_report_one_partition(seed: int) -> None:
    sim = Sim(seed)
    for _ in range(1200):  # two simulated minutes
        sim.tick()
    assert sum(sim.max_token.values()) > PARTITIONS  # partitions did move
    assert sum(n.member.fence_count for n in sim.nodes) > 0  # pauses caused fencing


def test_members_converge_once_the_faults_stop() -> None:
    sim = Sim(seed=99)
    for _ in range(300):
        sim.tick()
    for node in sim.nodes:
        node.paused_until = 0.0
    sim.rng = random.Random(1)
    sim.retarget()
    target, epoch = dict(sim.target), sim.epoch
    sim.rng.random = lambda: 0.5  # type: ignore[method-assign]  # no new faults or targets
    for _ in range(200):
        sim.tick()
    for node in sim.nodes:
        view = node.member.view(sim.t)
        assert sorted(p.partition for p in view.partitions) == sorted(target[node.name])
        assert view.acked_epoch == epoch
