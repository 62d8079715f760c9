"""Where a producer writes, and what it must seal first: routing over a partition lineage.

A producer places a key in its partition of the lineage's newest generation
(:func:`route`: the key's crc32 by the generation's placement, so a group whose only
generation is modulo keeps ``crc32 % N`` and nothing moves for it). When the layout
advances to a new generation, the partitions it replaced must be *sealed* (a marker
appended to each, after which the stream refuses any write) **before** the producer's
first write to the new generation: then, once any event of a key is in a successor, every
predecessor of that successor is sealed, and a producer that has not switched yet is
refused there instead of adding an older-layout event behind the key's newer ones.

Sealing is idempotent (the second seal of a partition changes nothing), so every producer
seals what its layout says is sealed (:func:`to_seal`), whoever was first. A refused write
names the generation that sealed the partition; :func:`after_refusal` says whether the
producer's layout already knows it (write again with the newest routing) or is behind
(wait for the layout source to reach that generation).

The group's layout is published in its status as ``status.layout``
(:func:`layout_to_status`): the lineage's wire form (``kgroup.core.lineage_codec.encode``) with
the newest generation's number beside it, for printer columns and for a reader that
only wants to know whether the layout moved. A group without it (made before lineage) is
one modulo generation of ``spec.partitions`` (:func:`layout_from_status`).

Pure: no I/O, no clock. The Redis side is ``kgroup.producer``.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from kgroup.core.layout_status import layout_from_status, layout_to_status
from kgroup.core.lineage import Lineage, LineageError, State, key_hash

__all__ = ["Refusal", "after_refusal", "layout_from_status", "layout_to_status", "newer",
           "route", "route_all", "sealing_generation", "to_seal"]


def route(lineage: Lineage, key: str) -> int:
    """The partition a producer writes ``key``'s next event to: the newest generation's."""
    return lineage.partition_of(key_hash(key))


def route_all(lineage: Lineage, keys: Iterable[str]) -> list[int]:
    """:func:`route` of each key, in order."""
    latest = lineage.latest
    return [latest.partition_of(key_hash(k)) for k in keys]


def sealing_generation(lineage: Lineage, partition: int) -> int:
    """The number of the generation that replaced ``partition`` (the first kept generation
    after it appeared that does not list it): what its seal marker records."""
    seen = False
    for gen in lineage.generations:
        if partition in gen:
            seen = True
        elif seen:
            return gen.number
    raise LineageError(f"partition {partition} is open or in no kept generation: nothing "
                       f"replaced it")


def to_seal(lineage: Lineage) -> tuple[int, ...]:
    """The partitions a producer must have sealed before its first write under this
    layout: every partition replaced and not yet completed (a completed one was sealed
    and read to its seal, and sealing it again would change nothing)."""
    return tuple(sorted(p for p in lineage.partitions if lineage.state(p) is State.SEALED))


def newer(current: Lineage | None, candidate: Lineage) -> Lineage:
    """The layout to route by when the source answers ``candidate``: a source that went
    back (a stale cache, a lagging replica) never moves a producer to an older generation,
    whose partitions may be sealed. Same generation: ``candidate`` (it may know more
    completions)."""
    if current is not None and candidate.latest.number < current.latest.number:
        return current
    return candidate


class Refusal(StrEnum):
    """What a producer does after the stream refused a write into a sealed partition."""

    REROUTE = "reroute"
    """The layout already replaced the partition: route the events again by it."""
    WAIT = "wait"
    """The layout is older than the seal (another producer switched first): read the
    layout source again until it reaches the sealing generation, then route again."""


def after_refusal(lineage: Lineage, partition: int, sealed_by: int) -> Refusal:
    """``partition`` refused a write, sealed by generation ``sealed_by``."""
    if sealed_by > lineage.latest.number or partition in lineage.latest:
        return Refusal.WAIT
    return Refusal.REROUTE
