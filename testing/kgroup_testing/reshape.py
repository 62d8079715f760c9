"""A reshaping group without Kubernetes: light workers on the scripted coordinator, and the
group's side of a reshape played in-process.

Rule: :class:`Conductor` does what the operator is to do from ``status.layout``: it keeps
the lineage (what producers read), records a partition completed when a worker released
it as completed (``Lineage.complete``, only for a sealed partition whose predecessors are
all completed), and gives every assignable partition (``Lineage.is_assignable``) with no
holder to a live member, round-robin. ``wait=False`` is the broken variant: every
partition is assigned at once, successors before their predecessors are completed.

:class:`Workers` runs one :class:`kgroup_pipeline.light_worker.LightWorker` thread per
member and lets a test or a benchmark add one, stop one gracefully (it hands its
partitions back), or crash one (its session expires, nothing handed back).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import redis

from kgroup.core.lineage import Lineage, State, Uniform
from kgroup_pipeline.light_worker import LightWorker
from kgroup_pipeline.scripted import ScriptedCoordinator


class Conductor:
    def __init__(self, coord: ScriptedCoordinator, lineage: Lineage, members: list[str],
                 *, wait: bool = True) -> None:
        self.coord, self.lineage, self.members, self.wait = coord, lineage, members, wait
        self.turn = 0
        self.lock = threading.Lock()
        self.most_waiting = 0
        """The most partitions seen waiting at once (not assignable, not completed)."""

    def layout(self) -> Lineage:
        return self.lineage

    def reshape(self, count: int) -> None:
        with self.lock:
            self.lineage = self.lineage.reshape(Uniform(count))

    def join(self, member: str) -> None:
        with self.lock:
            self.members.append(member)

    def leave(self, member: str) -> None:
        with self.lock:
            self.members.remove(member)

    def step(self) -> None:
        with self.lock:
            lineage = self.lineage
            for p in sorted(self.coord.completed):
                if p in lineage.partitions and lineage.state(p) is State.SEALED \
                        and lineage.is_assignable(p):
                    lineage = lineage.complete(p)
            self.lineage = lineage = lineage.retire()
            waiting = lineage.partitions - lineage.completed - lineage.assignable()
            self.most_waiting = max(self.most_waiting, len(waiting))
            for p in sorted(lineage.partitions - lineage.completed):
                if p in self.coord.completed or self.coord.holder(p)[0] is not None:
                    continue
                if (self.wait and p in waiting) or not self.members:
                    continue
                self.coord.assign(self.members[self.turn % len(self.members)], [p])
                self.turn += 1

    def done(self) -> bool:
        """Every partition a reshape replaced is completed."""
        return all(self.lineage.state(p) is not State.SEALED for p in self.lineage.partitions)


@dataclass
class Workers:
    redis_url: str
    stream: str
    coord: ScriptedCoordinator
    max_rows: int = 400
    stops: dict[str, threading.Event] = field(default_factory=dict)
    threads: dict[str, threading.Thread] = field(default_factory=dict)

    def start(self, member: str) -> None:
        stop = threading.Event()
        worker = LightWorker(client=redis.Redis.from_url(self.redis_url, decode_responses=True),
                             stream=self.stream, ownership=self.coord.ownership(member),
                             max_rows=self.max_rows, idle_wait=0.01)

        def loop() -> None:
            while not stop.is_set():
                if worker.run_once() == 0:
                    time.sleep(0.01)
        thread = threading.Thread(target=loop, name=f"worker-{member}", daemon=True)
        thread.start()
        self.stops[member], self.threads[member] = stop, thread

    def crash(self, member: str) -> list[int]:
        """Stop the member's loop and expire its session: -> the partitions it held."""
        held = [p.partition for p in self.coord.view(member).partitions]
        self.stops[member].set()
        self.coord.expire(member)
        return held

    def leave(self, member: str) -> None:
        """Stop the member's loop, then hand everything back at its committed offsets."""
        self.stops[member].set()
        self.threads[member].join(timeout=10)
        worker = LightWorker(client=redis.Redis.from_url(self.redis_url, decode_responses=True),
                             stream=self.stream, ownership=self.coord.ownership(member))
        worker.shutdown()

    def stop_all(self) -> None:
        for stop in self.stops.values():
            stop.set()
        for thread in self.threads.values():
            thread.join(timeout=10)
