"""The reshapes of a simulated run (``SimConfig.reshape``): the admin's spec changes, the
producer's seals and their backlogs, and when each reshape ended.

``spec.partitions`` is changed to each size in turn at times drawn from the seed during
the fault phase, whatever else happens then. The simulated producer seals what a layout
replaces as soon as the store holds the layout; each sealed partition gets a backlog drawn
from the seed (``SimConfig.seal_drain``, empty with ``SimConfig.seal_empty``), which each
owner reads from its take-up (a crashed owner's successor reads it again) before it hands
the partition back as completed with the seal's position, through the sidecar's release as
a real app does (:mod:`kgroup_sim.sidecar`). Checked: no successor acquired before its
predecessors completed (``reshape-order``, :mod:`kgroup_sim.checks`), and each reshape
ends (the layout settled: one generation, or the newest fully assignable) within
:meth:`Reshapes.bound` of its change, or of the end of the faults if it came during them
(``reshape-end``).

Bookkeeping only: the layouts are the operator's, made by the shipped code
(:mod:`kgroup.core.operator.reshape`, driven by :mod:`kgroup_sim.control`) and read back
here with the shipped codec (:func:`kgroup.core.layout_status.layout_from_status`). The
draws come from random streams of their own, so a run without reshapes draws as before.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from kgroup.core.layout_status import layout_from_status
from kgroup.core.lineage import Lineage, LineageError
from kgroup_sim.control import GROUP_KEY

if TYPE_CHECKING:
    from kgroup_sim.world import World

__all__ = ["Reshapes"]


class Reshapes:
    """One run's reshapes, kept for its :class:`~kgroup_sim.world.World`."""

    def __init__(self, world: World) -> None:
        self.world = world
        # the layout last committed (its wire form, decoded), when each sealed partition
        # was sealed and its backlog (own random stream: the draws do not shift the
        # others), each spec change's time and when the layout settled after it
        self._layout_seen: tuple[Any, Lineage | None] = (None, None)
        self.sealed: dict[int, float] = {}
        self.backlog: dict[int, float] = {}
        self._drain_rng = random.Random(f"{world.seed}/seal-drain")
        self.times: list[float] = []
        self.ends: list[float | None] = []

    def schedule(self) -> None:
        """Each size of ``SimConfig.reshape`` at its time drawn from the seed within
        ``SimConfig.reshape_window``, and the check every half second."""
        w = self.world
        lo, hi = w.cfg.reshape_window
        draws = random.Random(f"{w.seed}/reshape")
        times = sorted(draws.uniform(lo, hi) * w.cfg.fault_time for _ in w.cfg.reshape)
        for at, size in zip(times, w.cfg.reshape, strict=True):
            w.kernel.at(at, self.reshape_to, size)
        w.kernel.after(0.5, self._check)

    def layout_committed(self, layout: Any) -> None:
        """A status was committed: a layout of more than one generation teaches the
        checker the lineage, and the producer seals what it replaced."""
        if layout is None or layout == self._layout_seen[0]:
            return
        w = self.world
        lineage: Lineage | None = None
        if isinstance(layout, dict) and len(layout.get("generations") or ()) > 1:
            try:
                lineage = layout_from_status(layout, w.spec.partitions)
            except LineageError:
                lineage = None
        self._layout_seen = (layout, lineage)
        if lineage is None:
            return
        w.checker.layout_seen(lineage)
        latest = set(lineage.latest.partitions)
        for gen in lineage.generations[:-1]:
            for p in gen.partitions:
                if p not in latest and p not in self.sealed:
                    self.sealed[p] = w.kernel.now
                    self.backlog[p] = self._draw_backlog()
                    w.trace("producer", f"sealed p{p} (backlog {self.backlog[p]:.3f}s)")

    def _draw_backlog(self) -> float:
        cfg = self.world.cfg
        if cfg.seal_drain is None:
            return float("inf")  # nobody reads to the seal
        if self._drain_rng.random() < cfg.seal_empty:
            return 0.0
        return self._drain_rng.uniform(*cfg.seal_drain)

    def reshape_to(self, partitions: int) -> None:
        """An admin changes spec.partitions (kubectl patch): a reshape."""
        w = self.world
        w.count("reshape")
        w.trace("fault", f"reshape: spec.partitions {w.spec.partitions} -> {partitions}")
        group = w.store.get(GROUP_KEY)
        w.spec = w.spec.model_copy(update={"partitions": partitions})
        self.times.append(w.kernel.now)
        self.ends.append(None)
        if group is None:
            return  # deleted: applied again with the new spec by whoever re-applies it
        md = {**group["metadata"], "generation": group["metadata"]["generation"] + 1}
        w.store.update(GROUP_KEY, {**group, "metadata": md, "spec": w.spec.to_wire()})

    def settled(self) -> str | None:
        """Why the stored layout has not settled (a reshape under way), or None: it has
        the spec's size and one generation, or its newest one fully assignable."""
        w = self.world
        layout = w.status().get("layout")
        try:
            lineage = layout_from_status(layout, w.spec.partitions)
        except LineageError as exc:
            return f"status.layout does not decode: {exc}"
        latest = lineage.latest.partitions
        if len(latest) != w.spec.partitions:
            return (f"newest generation {lineage.latest.number} has {len(latest)} "
                    f"partitions, spec {w.spec.partitions}")
        if len(lineage.generations) > 1 and not all(map(lineage.is_assignable, latest)):
            waiting = [p for p in latest if not lineage.is_assignable(p)]
            return (f"{len(waiting)} of generation {lineage.latest.number}'s partitions "
                    f"wait for predecessors ({len(lineage.generations)} generations kept)")
        return None

    def bound(self) -> float:
        """How long a reshape may take once faults stopped: the usual bound
        (:meth:`World.bound <kgroup_sim.world.World.bound>`), plus per reshape (a chain
        drains generation after generation) the longest backlog, a stabilisation delay
        and two lease durations for the completion to be recorded and the successors'
        Leases created, marked and taken."""
        w = self.world
        s = w.spec
        drain = w.cfg.seal_drain[1] if w.cfg.seal_drain is not None else 0.0
        step = (drain + s.stabilization_max_delay_seconds + 2 * s.lease.duration_seconds
                + w.cfg.app_tick + 2.0)
        return w.bound() + len(w.cfg.reshape) * step

    def durations(self) -> list[tuple[float, float | None]]:
        """Each spec change's time and how long until the layout settled after it (None:
        not settled)."""
        return [(t, None if e is None else e - t)
                for t, e in zip(self.times, self.ends, strict=True)]

    def _check(self) -> None:
        """Every half second: record when the layout settled after each reshape, and fail
        one that has not within its bound."""
        w = self.world
        now = w.kernel.now
        if self.ends and None in self.ends:
            why = self.settled()
            if why is None:
                self.ends = [now if e is None else e for e in self.ends]
            else:
                last = max(self.times[-1], w.cfg.fault_time)
                if now > last + self.bound() and not any(
                        v.kind == "reshape-end" for v in w.checker.violations):
                    w.checker.fail("reshape-end", now, (
                        f"reshape to {w.spec.partitions} partitions at "
                        f"{self.times[-1]:.3f} not ended {self.bound():.1f}s "
                        f"after {last:.3f}: {why}"))
        w.kernel.after(0.5, self._check)
