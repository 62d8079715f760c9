"""Compact partition-range strings: ``[0, 1, 2, 5, 7, 8]`` <-> ``"0-2,5,7-8"``.

Status fields and annotations carry partition sets in this form so that ``kubectl get``
stays readable with thousands of partitions.

Rule: parsing is bounded. Whoever can write a status or an annotation controls the text,
so :func:`parse_ranges` never expands a range past ``limit`` (the group's
``spec.partitions``, at most :data:`MAX_PARTITIONS`): a text naming a partition at or
beyond it, or longer than any list of ``limit`` partitions can be, is refused before
anything is allocated (``"0-99999999"`` in a status once OOM-killed the operator and
the sidecar). :func:`clip_ranges` is the lenient reader for figures that only inform (a
member's stalled list): what lies beyond ``limit`` is dropped, never expanded.

:func:`format_sequence` and :func:`parse_sequence` are the ordered form (a partition
lineage's generation lists its partitions in hash order): ``"16,40-41,18-39"``, bounded
by a count of ids rather than a highest id.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

__all__ = ["MAX_PARTITIONS", "clip_ranges", "format_ranges", "format_sequence",
           "max_ranges_chars", "parse_ranges", "parse_sequence"]

MAX_PARTITIONS = 100_000
"""The most partitions a group may have (``spec.partitions``' bound in the CRD)."""


def format_ranges(partitions: Iterable[int]) -> str:
    """Sorted, de-duplicated, with runs of consecutive ids folded into ``a-b``."""
    return format_sequence(sorted(set(partitions)))


def max_ranges_chars(limit: int) -> int:
    """An upper bound of the length of any ranges text of distinct partitions below
    ``limit`` (each piece names at least one partition in at most 12 characters), with
    room for spaces: a longer text is not worth reading."""
    return 12 * max(0, limit) + 64


def _pieces(text: str, limit: int) -> list[tuple[int, int]]:
    """The ``(lo, hi)`` pieces of ``text``, each checked against ``limit``; nothing is
    expanded here."""
    if len(text) > max_ranges_chars(limit):
        raise ValueError(f"partition ranges of {len(text)} characters: longer than any list "
                         f"of {limit} partitions")
    return _split(text)


def _split(text: str) -> list[tuple[int, int]]:
    """The ``(lo, hi)`` pieces of ``text`` in its order (numbers of at most 9 digits)."""
    out: list[tuple[int, int]] = []
    for piece in text.split(","):
        piece = piece.strip()
        lo_text, sep, hi_text = piece.partition("-")
        lo_text, hi_text = lo_text.strip(), hi_text.strip()
        if not lo_text.isdigit() or (sep and not hi_text.isdigit()) or len(lo_text) > 9 \
                or len(hi_text) > 9:
            raise ValueError(f"bad partition range {piece!r}: expected N or N-M")
        lo = int(lo_text)
        hi = int(hi_text) if sep else lo
        if hi < lo:
            raise ValueError(f"bad partition range {piece!r}: need 0 <= N <= M")
        out.append((lo, hi))
    return out


def parse_ranges(text: str, *, limit: int = MAX_PARTITIONS) -> list[int]:
    """Inverse of :func:`format_ranges`; raises ValueError with the offending piece, for a
    partition at or beyond ``limit`` (naming it and the limit), or for a partition listed
    twice. Allocates at most ``limit`` ids whatever the text says."""
    text = text.strip()
    if not text:
        return []
    pieces = _pieces(text, limit)
    for _, hi in pieces:
        if hi >= limit:
            raise ValueError(f"partition {hi} is beyond the group's partitions "
                             f"(0-{limit - 1}): {_short(text)!r}")
    pieces.sort()
    for (_, hi), (lo, _) in pairwise(pieces):
        if lo <= hi:
            raise ValueError(f"partition range {_short(text)!r} lists a partition twice")
    out: list[int] = []
    for lo, hi in pieces:
        out.extend(range(lo, hi + 1))
    return out


def clip_ranges(text: str, *, limit: int) -> list[int] | None:
    """The partitions below ``limit`` that ``text`` names (sorted, duplicates folded;
    what lies beyond ``limit`` is dropped); None when ``text`` is malformed or too long."""
    text = text.strip()
    if not text:
        return []
    try:
        pieces = _pieces(text, limit)
    except ValueError:
        return None
    keep = sorted((lo, min(hi, limit - 1)) for lo, hi in pieces if lo < limit)
    out: list[int] = []
    for lo, hi in keep:
        start = max(lo, out[-1] + 1) if out else lo
        out.extend(range(start, hi + 1))
    return out


def format_sequence(partitions: Iterable[int]) -> str:
    """An ordered list of distinct ids, runs of ascending consecutive ids folded:
    ``[16, 40, 41, 18, 19]`` -> ``"16,40-41,18-19"``. Unlike :func:`format_ranges` the order
    is kept (it is meaningful: a generation's partitions in hash order)."""
    ids = list(partitions)
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def parse_sequence(text: str, *, most: int) -> list[int]:
    """Inverse of :func:`format_sequence`: the ids in the text's order. Ids may be any
    number of up to 9 digits; the text is refused (ValueError) when it names more than
    ``most`` ids, which is checked before anything is expanded, or an id twice."""
    text = text.strip()
    if not text:
        return []
    if len(text) > 20 * max(0, most) + 64:
        raise ValueError(f"partition list of {len(text)} characters: longer than any list "
                         f"of {most} partitions")
    pieces = _split(text)
    count = sum(hi - lo + 1 for lo, hi in pieces)
    if count > most:
        raise ValueError(f"partition list {_short(text)!r} names {count} partitions, more "
                         f"than {most}")
    out = [n for lo, hi in pieces for n in range(lo, hi + 1)]
    if len(set(out)) != len(out):
        raise ValueError(f"partition list {_short(text)!r} lists a partition twice")
    return out


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."
