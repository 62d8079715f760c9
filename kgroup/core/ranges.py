"""Compact partition-range strings: ``[0, 1, 2, 5, 7, 8]`` <-> ``"0-2,5,7-8"``.

Status fields and annotations carry partition sets in this form so that ``kubectl get``
stays readable with thousands of partitions.
"""

from __future__ import annotations

from collections.abc import Iterable


def format_ranges(partitions: Iterable[int]) -> str:
    """Sorted, de-duplicated, with runs of consecutive ids folded into ``a-b``."""
    ids = sorted(set(partitions))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def parse_ranges(text: str) -> list[int]:
    """Inverse of :func:`format_ranges`; raises ValueError with the offending piece."""
    out: list[int] = []
    text = text.strip()
    if not text:
        return out
    for piece in text.split(","):
        piece = piece.strip()
        lo_text, sep, hi_text = piece.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if sep else lo
        except ValueError:
            raise ValueError(f"bad partition range {piece!r}: expected N or N-M") from None
        if lo < 0 or hi < lo:
            raise ValueError(f"bad partition range {piece!r}: need 0 <= N <= M")
        out.extend(range(lo, hi + 1))
    if len(out) != len(set(out)):
        raise ValueError(f"partition range {text!r} lists a partition twice")
    return sorted(out)
