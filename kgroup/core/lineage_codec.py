"""A partition lineage's wire form: the compact mapping a status field carries
(:func:`encode`) and its strict reader (:func:`decode`), over :mod:`kgroup.core.lineage`
(``docs/reshape.md``). Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from itertools import groupby
from typing import TypeVar

from kgroup.core.lineage import (
    MAX_GENERATIONS,
    Generation,
    Lineage,
    LineageError,
    Placement,
    State,
)
from kgroup.core.ranges import MAX_PARTITIONS, format_ranges, format_sequence, parse_sequence

__all__ = ["decode", "encode"]

_T = TypeVar("_T")

_WIDTH = re.compile(r"\s*(\d{1,20})(?:/(\d{1,20}))?(?:\*(\d{1,6}))?\s*")


def _format_widths(widths: tuple[Fraction, ...]) -> str:
    parts = []
    for w, run in groupby(widths):
        k = len(list(run))
        parts.append(str(w) + (f"*{k}" if k > 1 else ""))
    return ",".join(parts)


def _parse_widths(text: str, where: str) -> tuple[Fraction, ...]:
    if len(text) > 48 * MAX_PARTITIONS:
        raise LineageError(f"{where}: widths of {len(text)} characters are too long")
    out: list[Fraction] = []
    for piece in text.split(","):
        m = _WIDTH.fullmatch(piece)
        if not m:
            raise LineageError(f"{where}: bad width {piece.strip()!r}: expected A/B or "
                               f"A/B*COUNT")
        num, den, times = int(m[1]), int(m[2] or 1), int(m[3] or 1)
        if den == 0 or times == 0:
            raise LineageError(f"{where}: bad width {piece.strip()!r}: zero denominator or "
                               f"count")
        if len(out) + times > MAX_PARTITIONS:
            raise LineageError(f"{where}: more than {MAX_PARTITIONS} widths")
        out.extend([Fraction(num, den)] * times)
    return tuple(out)


def encode(lineage: Lineage) -> dict[str, object]:
    """The lineage as a status field: per generation its partitions in hash order and
    (range placement) their widths run-length folded; the partitions by state."""
    gens: list[dict[str, object]] = []
    for g in lineage.generations:
        doc: dict[str, object] = {"generation": g.number, "placement": str(g.placement),
                                  "partitions": format_sequence(g.partitions)}
        if g.placement is Placement.RANGE:
            doc["widths"] = _format_widths(g.widths)
        gens.append(doc)
    by_state: dict[State, list[int]] = {s: [] for s in State}
    for p in lineage.partitions:
        by_state[lineage.state(p)].append(p)
    states = {str(s): format_ranges(ps) for s, ps in by_state.items() if ps}
    return {"nextPartition": lineage.next_partition, "generations": gens, "states": states}


def _fields(doc: object, where: str, required: set[str], optional: set[str]
            ) -> Mapping[str, object]:
    if not isinstance(doc, Mapping):
        raise LineageError(f"{where}: expected a mapping, got {type(doc).__name__}")
    unknown = set(doc) - required - optional
    if unknown:
        raise LineageError(f"{where}: unknown fields {sorted(map(str, unknown))}")
    if required - set(doc):
        raise LineageError(f"{where}: missing fields {sorted(required - set(doc))}")
    return doc


def _typed(value: object, kind: type[_T], where: str) -> _T:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise LineageError(f"{where}: expected {kind.__name__}, got {value!r:.40}")
    return value


def _sequence(text: object, where: str, most: int) -> list[int]:
    try:
        return parse_sequence(_typed(text, str, where), most=most)
    except LineageError:
        raise
    except ValueError as exc:
        raise LineageError(f"{where}: {exc}") from None


def decode(doc: object) -> Lineage:
    """Inverse of :func:`encode`; raises :class:`LineageError` naming the field and the
    rule for anything that is not a lineage (nothing is expanded past the bounds first)."""
    top = _fields(doc, "lineage", {"nextPartition", "generations", "states"}, set())
    raw_gens = _typed(top["generations"], list, "lineage.generations")
    if not 1 <= len(raw_gens) <= MAX_GENERATIONS:
        raise LineageError(f"lineage.generations: 1 to {MAX_GENERATIONS} generations, not "
                           f"{len(raw_gens)}")
    gens: list[Generation] = []
    for k, raw in enumerate(raw_gens):
        where = f"lineage.generations[{k}]"
        g = _fields(raw, where, {"generation", "placement", "partitions"}, {"widths"})
        number = _typed(g["generation"], int, f"{where}.generation")
        placement_text = _typed(g["placement"], str, f"{where}.placement")
        if placement_text not in set(Placement):
            raise LineageError(f"{where}.placement: {placement_text!r:.40} is neither modulo "
                               f"nor range")
        placement = Placement(placement_text)
        partitions = tuple(_sequence(g["partitions"], f"{where}.partitions", MAX_PARTITIONS))
        widths: tuple[Fraction, ...] = ()
        if placement is Placement.RANGE:
            if "widths" not in g:
                raise LineageError(f"{where}: a range generation needs widths")
            widths = _parse_widths(_typed(g["widths"], str, f"{where}.widths"),
                                   f"{where}.widths")
        elif "widths" in g:
            raise LineageError(f"{where}: a modulo generation has no widths")
        gens.append(Generation(number, placement, partitions, widths))
    states = _fields(top["states"], "lineage.states", set(), {str(s) for s in State})
    known = len({p for g in gens for p in g.partitions})
    listed = {State(s): set(_sequence(v, f"lineage.states.{s}", known))
              for s, v in states.items()}
    lineage = Lineage(tuple(gens), frozenset(listed.get(State.COMPLETED, ())),
                      _typed(top["nextPartition"], int, "lineage.nextPartition"))
    for s in State:
        want = {p for p in lineage.partitions if lineage.state(p) is s}
        have = listed.get(s, set())
        if want != have:
            raise LineageError(f"lineage.states.{s}: lists {format_ranges(have) or 'none'}, "
                               f"but the generations make {format_ranges(want) or 'none'} {s}")
    return lineage
