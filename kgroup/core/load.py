"""Per-partition load on the wire: what a member's renewal carries, what the operator reads.

The app reports, per owned partition, the events it processed per second (``rate``, in its
health report: :mod:`kgroup.core.health`) and how far behind it is (``lag``). The sidecar
carries them in the ``kgroup.dev/load`` annotation of the member-Lease renewal it writes
anyway, so load reports add no API write: writes still follow members, not partitions
nor traffic. The operator reads the annotation back with the Leases it already watches.

The encoding (:func:`encode_load`), compact JSON with sorted keys::

    {"lag":5120,"max":41.7,"p":"0-999","q":"<2 characters per partition>","rate":2310.5,"v":1}

- ``rate``: the member's processed events/s, summed over the partitions that reported one;
  ``lag``: the events behind, summed over the partitions that reported one (absent: none
  did).
- ``p``: the partitions with a rate, as compact ranges; ``q``: each one's rate, in the
  order of ``p``, as a 12-bit code in two characters of the URL-safe base64 alphabet, on
  a logarithmic scale below ``max`` (the member's largest partition rate, exact): code 0
  is zero, code ``c >= 1`` is ``max * 2 ** ((c - 4095) / 128)``. Each step is a factor
  ``2 ** (1/128)``, so a decoded rate is within 0.28 % of the reported one, over 32
  octaves below ``max``; a rate further below reads as the smallest code's.
- The text is at most :data:`MAX_LOAD_BYTES`; when the per-partition figures do not fit
  (several thousand partitions on one member, or scattered numbers whose ranges are long),
  ``p`` and ``q`` are left out and ``n`` says how many partitions reported: the reader
  spreads the member's rate evenly over the partitions it holds.

Size: 2 bytes per partition plus its share of the ranges and a header of about 60 bytes:
78 bytes for 10 consecutive partitions, 464 for 200, 2,066 for 1,000 (tests pin these).

Deterministic: the same reports give the same text, so a renewal with unchanged figures
carries no change. Pure: no clock, no I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kgroup.constants import ANNOTATION_LOAD
from kgroup.core.ranges import format_ranges, parse_ranges

__all__ = [
    "MAX_LOAD_BYTES",
    "MemberLoad",
    "annotate_load",
    "decode_rate",
    "encode_load",
    "encode_rate",
    "parse_load",
]

MAX_LOAD_BYTES = 8192
"""Upper bound of the ``kgroup.dev/load`` annotation's value. 1,000 partitions numbered
apart (every other one up to 10,000: 5-character ranges each) fit; beyond, only the
totals are carried."""
STEPS_PER_OCTAVE = 128
TOP_CODE = 4095  # 12 bits: two base64 characters
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_INDEX = {c: i for i, c in enumerate(_ALPHABET)}
VERSION = 1


def encode_rate(rate: float, top: float) -> int:
    """The 12-bit code of ``rate`` on the scale below ``top`` (``0 <= rate <= top``)."""
    if rate <= 0 or top <= 0:
        return 0
    below = round(STEPS_PER_OCTAVE * math.log2(top / rate))
    return max(1, TOP_CODE - below)


def decode_rate(code: int, top: float) -> float:
    """The rate a code stands for (:func:`encode_rate`'s inverse, within half a step)."""
    if code <= 0:
        return 0.0
    return float(top * 2.0 ** ((code - TOP_CODE) / STEPS_PER_OCTAVE))


_PAIRS = [a + b for a in _ALPHABET for b in _ALPHABET]  # code -> its two characters
_PER_LOG = STEPS_PER_OCTAVE / math.log(2)


def _codes(values: list[float], top: float) -> str:
    """:func:`encode_rate` of each value as two characters, in one pass (a renewal of
    1,000 partitions encodes 1,000 of them: per-item calls cost 5 us each)."""
    if top <= 0:
        return "AA" * len(values)
    log, log_top, per_log, pairs = math.log, math.log(top), _PER_LOG, _PAIRS
    return "".join([pairs[max(1, TOP_CODE - round(per_log * (log_top - log(v))))]
                    if v > 0 else "AA" for v in values])


def _figure(value: float) -> float:
    """A rate as written: six significant digits (the text stays short and stable)."""
    return float(f"{value:.6g}")


def encode_load(rates: Mapping[int, float], lags: Mapping[int, int]) -> str | None:
    """The annotation's value from the held partitions' reported rates (events/s, finite,
    >= 0) and lags (events); None when neither has anything."""
    if not rates and not lags:
        return None
    base: dict[str, Any] = {"v": VERSION}
    if lags:
        base["lag"] = sum(lags.values())
    if rates:
        top = max(rates.values())
        base["rate"] = _figure(sum(rates.values()))
        base["max"] = _figure(top)
        order = sorted(rates)
        codes = _codes([rates[p] for p in order], base["max"])
        full = dict(base, p=format_ranges(order), q=codes)
        text = json.dumps(full, separators=(",", ":"), sort_keys=True)
        if len(text.encode()) <= MAX_LOAD_BYTES:
            return text
        base["n"] = len(order)
    return json.dumps(base, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class MemberLoad:
    """A member's ``kgroup.dev/load`` read back."""

    rate: float | None = None  # events/s over its reporting partitions
    lag: int | None = None  # events behind, over its reporting partitions
    rates: Mapping[int, float] = field(default_factory=dict)  # per partition, when carried
    reporting: int = 0  # partitions with a rate (len(rates) when they are carried)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def parse_load(raw: str | None, *, partitions: int) -> MemberLoad | None:
    """The annotation read back; None when absent, malformed or of another version.
    Partition numbers at or above ``partitions`` are refused (a hostile or stale
    annotation cannot make the reader expand a huge range: any such number drops the
    per-partition figures); per-partition codes whose
    count does not match ``p`` are ignored, the totals kept."""
    if not raw:
        return None
    try:
        data: Any = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("v") != VERSION:
        return None
    rate, top = _number(data.get("rate")), _number(data.get("max"))
    lag_raw = data.get("lag")
    lag = lag_raw if isinstance(lag_raw, int) and not isinstance(lag_raw, bool) \
        and lag_raw >= 0 else None
    rates = _per_partition(data.get("p"), data.get("q"), top, partitions)
    n = data.get("n")
    reporting = len(rates) if rates else (
        n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0)
    return MemberLoad(rate=rate, lag=lag, rates=rates, reporting=reporting)


def _per_partition(ranges: Any, codes: Any, top: float | None, partitions: int
                   ) -> dict[int, float]:
    if not isinstance(ranges, str) or not isinstance(codes, str) or top is None:
        return {}
    try:  # a partition at or beyond ``partitions`` refuses the lot: codes align with p
        listed = parse_ranges(ranges, limit=partitions)
    except ValueError:
        return {}
    if len(codes) != 2 * len(listed):
        return {}
    out: dict[int, float] = {}
    for i, p in enumerate(listed):
        hi, lo = _INDEX.get(codes[2 * i]), _INDEX.get(codes[2 * i + 1])
        if hi is None or lo is None:
            return {}
        out[p] = decode_rate((hi << 6) | lo, top)
    return out


def annotate_load(body: dict[str, Any], text: str | None) -> None:
    """Put ``text`` on a member Lease body about to be written (or remove a stale one)."""
    md = body.setdefault("metadata", {})
    notes = dict(md.get("annotations") or {})
    if text is None:
        notes.pop(ANNOTATION_LOAD, None)
    else:
        notes[ANNOTATION_LOAD] = text
    md["annotations"] = notes
