"""The group's side of a reshape: its layout kept in the status, and what may be assigned.

Each pass the operator derives the group's layout (:func:`layout_of`) from what it read:

1. the lineage in ``status.layout`` (``kgroup.core.layout_status``; absent:
   one modulo generation of ``spec.partitions``, how every group made before lineage
   places keys);
2. the completions the sidecars recorded on the partition Leases (a release with
   ``completed``: ``kgroup.dev/completed``, ``lease_codec.completed_token``), applied with
   ``Lineage.complete``: only a sealed partition whose predecessors are all completed
   counts; any other completion is ignored (an open partition's, a stale one's);
3. the generations whose replaced partitions are all completed, retired
   (``Lineage.retire``: their Leases are no longer created or assigned);
4. when ``spec.partitions`` differs from the newest generation's size, what
   ``spec.reshape.policy`` says: ``Generations`` (the default), a new generation, a
   uniform reshape (N -> M even key-hash ranges) whose replaced partitions are sealed;
   ``Append``, one modulo generation grown in place (:func:`appended`: N..M-1 added and
   assignable at once, keys re-hashed by ``crc32 % M``; no shrink).
   A reshape the lineage refuses (eight generations kept, the oldest not read to its end)
   waits, and says why.

The result's :attr:`Layout.assignable` is what the planner may hand out: the open
partitions whose predecessors are all completed and the sealed ones whose predecessors
are, until they are completed (``Lineage.is_assignable``). The planner and its assignors
number partitions 0..N-1, so the planning runs over *slots* (:meth:`Layout.to_slots`: the
i-th assignable partition is slot i) and its target is turned back into partitions
(:meth:`Layout.from_slots`). A group whose layout is one modulo generation of
``spec.partitions`` has partitions 0..N-1 as its slots: nothing changes for it.

The class of the layouts derived is a seam (``layout_class`` of :func:`layout_of` and
:class:`Layouts`, :class:`Layout` by default): a subclass may change one rule, as the
simulation's broken variant that skips the wait does (``kgroup_sim.variants``), and the
operator's pass (``decide``, through ``Memory.layouts``) then runs with it.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from kgroup.constants import partition_lease_name
from kgroup.core.layout_status import layout_from_status, layout_to_status
from kgroup.core.lease_codec import completed_token
from kgroup.core.lineage import (
    Change,
    Lineage,
    LineageError,
    Merge,
    Placement,
    Split,
    Uniform,
    initial,
)
from kgroup.core.objects import Obj
from kgroup.core.operator.planner import Decision
from kgroup.core.ranges import format_ranges
from kgroup.crd_models import ConsumerGroupSpec, ReshapeChange, ReshapePolicy

__all__ = ["Layout", "Layouts", "appended", "changed", "completions_on", "layout_of", "premature"]


@dataclass(frozen=True)
class Layout:
    """The group's lineage after this pass, and what follows from it."""

    lineage: Lineage
    problem: str | None = None  # why the status' layout or the spec's change is not applied

    @cached_property
    def assignable(self) -> tuple[int, ...]:
        """The partitions a member may be given now, ascending (the planner's slots):
        ``Lineage.is_assignable``, with the check of a predecessor tuple shared by many
        partitions made once (after a modulo generation every successor has all N)."""
        lineage = self.lineage
        done = lineage.completed
        if len(lineage.generations) == 1:
            return tuple(sorted(lineage.partitions))
        checked: dict[int, bool] = {}  # id of a predecessor tuple the lineage keeps
        out = []
        for p in sorted(lineage.partitions):
            if p in done:
                continue
            preds = lineage.predecessors(p)
            ok = checked.get(id(preds))
            if ok is None:
                ok = checked[id(preds)] = all(q in done for q in preds)
            if ok:
                out.append(p)
        return tuple(out)

    @cached_property
    def _slot(self) -> dict[int, int]:
        return {p: i for i, p in enumerate(self.assignable)}

    @property
    def space(self) -> int:
        """Every partition number of the layout is below this (the readers' bound)."""
        return self.lineage.next_partition

    def is_assignable(self, partition: int) -> bool:
        return partition in self._slot

    @cached_property
    def status(self) -> dict[str, object]:
        """``status.layout`` as the operator writes it."""
        return layout_to_status(self.lineage)

    def slot_spec(self, spec: ConsumerGroupSpec) -> ConsumerGroupSpec:
        """``spec`` as the planner sees it: one partition per slot."""
        if len(self.assignable) == spec.partitions:
            return spec
        return spec.model_copy(update={"partitions": len(self.assignable)})

    def decision_from_slots(self, decision: Decision,
                            target: Mapping[str, Sequence[int]]) -> Decision:
        """The planner's decision (over slots) with its target in partitions. When the
        planner keeps ``target`` (the current one, in partitions) but it names partitions
        no longer assignable (read to their end), the target without them, under a new
        epoch: what is left is exactly what the planner saw."""
        if decision.target is not None:
            return replace(decision, target=self.from_slots(decision.target))
        kept = self.from_slots(self.to_slots(target))
        gone = sorted({p for ps in target.values() for p in ps}
                      - {p for ps in kept.values() for p in ps})
        if not gone:
            return decision
        return replace(decision, target=kept, epoch=decision.epoch + 1, moved=0,
                       reason=f"partitions read to their end: {format_ranges(gone)}")

    def to_slots(self, target: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
        """A target (or holders' view) in partitions -> in slots; a partition that is not
        assignable has no slot and is left out."""
        slot = self._slot
        return {m: [slot[p] for p in ps if p in slot] for m, ps in target.items()}

    def holders_to_slots(self, holders: Mapping[int, str]) -> dict[int, str]:
        slot = self._slot
        return {slot[p]: m for p, m in holders.items() if p in slot}

    def loads_to_slots(self, loads: Mapping[int, float]) -> dict[int, float]:
        """Per-partition rates (``status.load``'s) -> per slot; the rates of partitions
        that are not assignable are left out."""
        slot = self._slot
        return {slot[p]: r for p, r in loads.items() if p in slot}

    def from_slots(self, target: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
        """A target in slots -> in partitions (raises IndexError for a slot beyond)."""
        parts = self.assignable
        return {m: sorted(parts[i] for i in ss) for m, ss in target.items()}


def premature(lineage: Lineage, target: Mapping[str, Sequence[int]]) -> list[int]:
    """The checked rule: the partitions ``target`` gives a member although some
    predecessor is not completed (or that are completed themselves, or unknown to the
    lineage). Empty for every target the operator writes."""
    return sorted(p for ps in target.values() for p in ps
                  if p not in lineage.partitions or not lineage.is_assignable(p))


def _completed(lineage: Lineage, reported: Callable[[int], bool]) -> Lineage:
    """``lineage`` with every reported completion that it accepts: a sealed partition
    whose predecessors are all completed. Ascending order completes a chain in one go
    (a partition's predecessors always have lower numbers)."""
    latest = lineage.latest
    sealed = sorted({p for g in lineage.generations[:-1] for p in g.partitions
                     if p not in latest and p not in lineage.completed})
    for p in sealed:
        if reported(p) and lineage.is_assignable(p):
            lineage = lineage.complete(p)
    return lineage


def completions_on(bodies: Mapping[str, Obj], group: str) -> Callable[[int], bool]:
    """Does partition ``p``'s Lease (among ``bodies``, by name) record a completion."""
    def reported(p: int) -> bool:
        body = bodies.get(partition_lease_name(group, p))
        return body is not None and completed_token(body) is not None
    return reported


def appended(lineage: Lineage, partitions: int) -> tuple[Lineage, str | None]:
    """``spec.reshape.policy: Append``: ``lineage`` grown to ``partitions`` in place, and
    None; or ``lineage`` unchanged and why not. Only one modulo generation grows so
    (``crc32 % N`` -> ``crc32 % M``, partitions N..M-1 added, all open and assignable at
    once: keys re-hashed, per-key order not kept); a shrink would cut partitions off
    unread, and a layout of ranges has no ``% M`` to grow to."""
    latest = lineage.latest
    count = len(latest.partitions)
    if partitions < count:
        return lineage, (f"spec.partitions {partitions} waits: spec.reshape.policy Append "
                         f"only grows (generation {latest.number} has {count}); set "
                         f"spec.reshape.policy: Generations to shrink through a reshape")
    if len(lineage.generations) != 1 or latest.placement is not Placement.MODULO:
        return lineage, (f"spec.partitions {partitions} waits: spec.reshape.policy Append "
                         f"grows one modulo generation only, and status.layout has "
                         f"{len(lineage.generations)} generation(s), the newest placed by "
                         f"{latest.placement.value}; set spec.reshape.policy: Generations")
    return initial(partitions), None


def changed(lineage: Lineage, partitions: int,
            change: ReshapeChange) -> tuple[Lineage, str | None]:
    """``spec.reshape.change`` on ``lineage`` whose newest generation is older than the
    change's: ``lineage`` with the split or merge as a new generation, and None; or
    ``lineage`` unchanged and why it waits. It applies only to the generation just before
    its own (a change written for another is not guessed at), and only when
    ``spec.partitions`` says the count it leaves: a change of ``spec.partitions`` alone is
    a uniform reshape, so the two must agree or neither is done."""
    latest = lineage.latest
    what = (f"split {change.split}" if change.split is not None
            else f"merge {change.merge[0]} + {change.merge[1]}" if change.merge else "nothing")
    head = f"spec.reshape.change ({what}, generation {change.generation}) waits: "
    if latest.number != change.generation - 1:
        return lineage, (f"{head}the newest generation is {latest.number}; a change "
                         f"makes generation {latest.number + 1}")
    step: Change
    if change.split is not None:
        step, count = Split(change.split), len(latest.partitions) + 1
    elif change.merge:
        step, count = Merge(change.merge[0], change.merge[1]), len(latest.partitions) - 1
    else:
        return lineage, f"{head}it names no split and no merge"
    if partitions != count:
        return lineage, (f"{head}it leaves {count} partitions, but spec.partitions is "
                         f"{partitions}; set spec.partitions: {count} with it")
    try:
        return lineage.reshape(step), None
    except LineageError as exc:
        return lineage, f"{head}{exc}"


def layout_of(partitions: int, status_layout: object, reported: Callable[[int], bool],
              last: Lineage | None = None, policy: ReshapePolicy = "Generations",
              change: ReshapeChange | None = None,
              layout_class: type[Layout] = Layout) -> Layout:
    """The layout for this pass: ``partitions`` is ``spec.partitions``, ``status_layout``
    the status' ``layout`` as read (None when absent; or already decoded, a
    :class:`Lineage` or the :class:`LineageError` decoding it raised), ``reported(p)``:
    partition ``p``'s Lease records a completion; ``last`` the lineage this operator
    last derived for the group (used when the status has no layout or one that does not
    decode: it is written again); ``policy`` is ``spec.reshape.policy``: what a change of
    ``spec.partitions`` does (a new generation, or :func:`appended`); ``change`` is
    ``spec.reshape.change``, a split or merge (:func:`changed`): while it is newer than the
    newest generation it decides the pass, and ``spec.partitions`` is only checked
    against it; ``layout_class`` the class of the result (:class:`Layout`, or a subclass
    changing one of its rules)."""
    problem: str | None = None
    if status_layout is None and last is not None:
        lineage = last  # not written yet, or removed by hand: written again
    elif isinstance(status_layout, Lineage):
        lineage = status_layout
    elif isinstance(status_layout, LineageError):
        problem = f"status.layout is not a layout ({status_layout}); written again"
        lineage = last if last is not None else initial(partitions)
    else:
        try:
            lineage = layout_from_status(status_layout, partitions)
        except LineageError as exc:
            problem = f"status.layout is not a layout ({exc}); written again"
            lineage = last if last is not None else initial(partitions)
    lineage = _completed(lineage, reported).retire()
    if change is not None and lineage.latest.number < change.generation:
        lineage, refused = changed(lineage, partitions, change)
        return layout_class(lineage, problem or refused)
    if len(lineage.latest.partitions) != partitions and policy == "Append":
        lineage, refused = appended(lineage, partitions)
        problem = problem or refused
    elif len(lineage.latest.partitions) != partitions:
        try:
            lineage = lineage.reshape(Uniform(partitions))
        except LineageError as exc:
            problem = (f"spec.partitions {partitions} waits: {exc} (generation "
                       f"{lineage.latest.number} has {len(lineage.latest.partitions)})")
    return layout_class(lineage, problem)


class Layouts:
    """One group's layouts across passes: the status' layout decoded once per change (a
    decode of 2,000 partitions takes 0.1 s; the layout the operator derived itself is
    never decoded back), and the last layout derived, kept while nothing changes it.
    ``layout_class``: the class of the layouts derived (:class:`Layout`; a subclass
    changes one rule for every pass of the operator that keeps these)."""

    def __init__(self, layout_class: type[Layout] = Layout) -> None:
        self.layout_class = layout_class
        self._read: tuple[Any, Lineage | LineageError] | None = None
        self._layout: Layout | None = None
        self.last: Lineage | None = None
        # the lineage status.layout held as read by the last derive (None: absent, or not
        # a layout): what the server stored, which retention goes by (retention.py)
        self.persisted: Lineage | None = None

    def derive(self, partitions: int, status_layout: object,
               reported: Callable[[int], bool],
               policy: ReshapePolicy = "Generations",
               change: ReshapeChange | None = None) -> Layout:
        decoded: object = None
        if status_layout is not None:
            if self._read is None or self._read[0] != status_layout:
                try:
                    read: Lineage | LineageError = layout_from_status(status_layout, partitions)
                except LineageError as exc:
                    read = exc
                self._read = (status_layout, read)
            decoded = self._read[1]
        self.persisted = decoded if isinstance(decoded, Lineage) else None
        layout = layout_of(partitions, decoded, reported, self.last, policy, change,
                           self.layout_class)
        kept = self._layout
        if kept is not None and kept.lineage is layout.lineage and \
                kept.problem == layout.problem:
            layout = kept  # nothing changed: what was derived from it stays
        self._layout, self.last = layout, layout.lineage
        if layout.lineage is not decoded:  # what the status will say: not decoded again
            self._read = (layout.status, layout.lineage)
        return layout
