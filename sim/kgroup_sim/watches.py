"""The watches of a simulated run: each observer's streams of the store's changes, their
faults and re-lists.

One stream per resource type per observer, delivered in order with random delays (a real
watch never reorders; separate streams may). Faults, during the fault phase only: an event
lost (the observer catches up at its next re-list, as after a real watch's 410), a replay
of the last few events (a watch resumed from an older resourceVersion: duplicates, and old
versions after newer ones), a stream broken while its process is cut off (re-listed when
the network heals). A sidecar's partition stream may be scoped to the partitions its logic
chose (``SimConfig.scoped_watch``, the runtime's scoped partition watch).

The draws come from the run's random stream (``World.rng``) in the order of the store's
commits and of the watches: another order would change every pinned seed's run
(scripts/sim_trace_hashes.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kgroup.core import lease_codec as codec
from kgroup.core.objects import Obj
from kgroup_sim.kernel import Process
from kgroup_sim.store import streams_of

if TYPE_CHECKING:
    from kgroup_sim.sidecar import SimSidecar
    from kgroup_sim.world import World

__all__ = ["Event", "Watch", "Watches"]

Event = tuple[str, Obj]  # (event type, object)


@dataclass
class Watch:
    proc: Process
    target: Any  # SimSidecar | SimOperator: on_event / on_list
    streams: tuple[str, ...]
    last: dict[str, float] = field(default_factory=dict)
    recent: dict[str, list[Event]] = field(default_factory=dict)
    broken: set[str] = field(default_factory=set)
    # A sidecar's partition watch sees the partition Leases of its scope only (the
    # scope its logic decides; None: all of them). The operator's is not scoped.
    scoped: bool = False
    scope: frozenset[int] | None = frozenset()

    def sees(self, stream: str, obj: Obj) -> bool:
        if not self.scoped or stream != "partition" or self.scope is None:
            return True
        lock = codec.parse_partition_lease(obj).value
        return lock is not None and lock.partition in self.scope


def _resource_of(stream: str) -> str:
    return {"group": "consumergroups", "pod": "pods"}.get(stream, "leases")


class Watches:
    """Every watch of one run, kept for its :class:`~kgroup_sim.world.World`."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.all: list[Watch] = []
        self._scoped: dict[int, Watch] = {}

    def watch(self, proc: Process, target: Any, streams: tuple[str, ...], *,
              scoped: bool = False) -> None:
        w = Watch(proc, target, streams, scoped=scoped)
        self.all.append(w)
        if scoped:
            self._scoped[id(target)] = w
        for stream in streams:
            self._relist(w, stream)
        world = self.world
        world.kernel.after(world.rng.uniform(*world.cfg.relist), self._periodic_relist, w)

    def fan_out(self, streams: tuple[str, ...], event: Event) -> None:
        """A commit of the store, on the streams it belongs to: to every watch of one."""
        world = self.world
        for w in self.all:
            stream = next((s for s in streams if s in w.streams), None)
            if stream is None or not w.proc.alive:
                continue
            if w.proc.cut:
                w.broken.add(stream)
                continue
            if world.faulty and world.rng.random() < world.cfg.event_loss:
                world.count("lost-event")
                continue
            self._send(w, stream, [event])
            recent = w.recent.setdefault(stream, [])
            recent.append(event)
            del recent[:-4]
            if world.faulty and world.rng.random() < world.cfg.event_replay:
                world.count("replayed-events")
                self._send(w, stream, recent[-world.rng.randint(1, len(recent)):])

    def set_scope(self, sc: SimSidecar, scope: frozenset[int] | None) -> None:
        """The sidecar's partition watch follows its logic's scope: a new one re-lists."""
        w = self._scoped.get(id(sc))
        if w is None or scope == w.scope:
            return
        w.scope = scope
        self.world.count("scope-change")
        if w.proc.cut:
            w.broken.add("partition")  # re-listed when the cut heals, as any broken stream
        else:
            self._relist(w, "partition")

    def _send(self, w: Watch, stream: str, events: list[Event]) -> None:
        kernel = self.world.kernel
        for event_type, obj in events:
            if not w.sees(stream, obj):
                continue
            t = max(w.last.get(stream, 0.0), kernel.now + self.world.message_latency())
            w.last[stream] = t
            kernel.at(t, w.proc.deliver, w.target.on_event, stream, event_type, obj)

    def _relist(self, w: Watch, stream: str) -> None:
        if not w.proc.alive:
            return
        world = self.world
        items = [o for k, o in world.store.list(_resource_of(stream))
                 if stream in streams_of(k, o) and w.sees(stream, o)]
        t = max(w.last.get(stream, 0.0), world.kernel.now + world.message_latency())
        w.last[stream] = t
        scope = w.scope if w.scoped and stream == "partition" else None
        world.kernel.at(t, w.proc.deliver, w.target.on_list, stream, items, scope)

    def _periodic_relist(self, w: Watch) -> None:
        if not w.proc.alive:
            return
        if not w.proc.cut:
            for stream in w.streams:
                w.broken.discard(stream)
                self._relist(w, stream)
        world = self.world
        world.kernel.after(world.rng.uniform(*world.cfg.relist), self._periodic_relist, w)
