"""``status.layout``: a group's partition lineage as its ConsumerGroup status carries it.

The operator writes it (``kgroup.core.operator.reshape``); producers and tools read it
(``kgroup.core.routing``, ``kgroup.producer``). It is the lineage's wire form
(``kgroup.core.lineage_codec.encode``) with the newest generation's number beside it, for
printer columns and for a reader that only wants to know whether the layout moved. A
group without it (made before lineage) is one modulo generation of ``spec.partitions``.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping

from kgroup.core.lineage import Lineage, LineageError, initial
from kgroup.core.lineage_codec import decode, encode

__all__ = ["layout_from_status", "layout_to_status"]


def layout_to_status(lineage: Lineage) -> dict[str, object]:
    """``status.layout``: ``generation`` (the newest) and the lineage's wire form."""
    return {"generation": lineage.latest.number, **encode(lineage)}


def layout_from_status(layout: object, partitions: int) -> Lineage:
    """The lineage of ``status.layout``; absent (``None``: a group made before lineage,
    or whose operator has not written it yet), one modulo generation of ``partitions``
    (``spec.partitions``), which places keys as such a group always did. Raises
    :class:`LineageError` naming the field and the rule."""
    if layout is None:
        return initial(partitions)
    if not isinstance(layout, Mapping):
        raise LineageError(f"status.layout: expected a mapping, got {type(layout).__name__}")
    rest = {k: v for k, v in layout.items() if k != "generation"}
    number = layout.get("generation")
    if type(number) is not int:
        raise LineageError(f"status.layout.generation: expected int, got {number!r:.40}")
    lineage = decode(rest)
    if lineage.latest.number != number:
        raise LineageError(f"status.layout.generation is {number}, but its newest generation "
                           f"is {lineage.latest.number}")
    return lineage
