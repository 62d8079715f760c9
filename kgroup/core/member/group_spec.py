"""What a sidecar reads of its ConsumerGroup's spec: the lease timing, the drain timeout and
the partition count.

The operator validates the whole spec with the pydantic models of :mod:`kgroup.crd_models`; a
sidecar needs three integers, so it reads just those, with the same defaults and bounds
(``kgroup.constants``; ``tests/test_member_spec.py`` checks that both readers agree).
Importing pydantic and building the models cost a sidecar about 10 MB of its 40 MB
(docs/design.md, "Where a sidecar's memory goes").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kgroup.constants import DRAIN_TIMEOUT_SECONDS, LEASE_DURATION_SECONDS, RENEW_INTERVAL_SECONDS
from kgroup.core.locks import LeaseTiming
from kgroup.core.ranges import MAX_PARTITIONS, max_ranges_chars, parse_ranges


def _field(section: Any, key: str, path: str, bounds: tuple[int, int, int]) -> int:
    default, low, high = bounds
    if not isinstance(section, Mapping):
        raise ValueError(f"{path.split('.')[0]}: not an object")
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{path}: {value!r} is not an integer")
    if not low <= value <= high:
        raise ValueError(f"{path}: {value} is not between {low} and {high}")
    return value


def member_spec(raw_spec: Mapping[str, Any]) -> tuple[LeaseTiming, float]:
    """(lease timing, drain timeout in seconds) of a raw ``spec``; ``ValueError`` names the
    first unusable field (out of bounds, not an integer, or an unsafe timing)."""
    lease = raw_spec.get("lease") or {}
    handoff = raw_spec.get("handoff") or {}
    duration = _field(lease, "durationSeconds", "lease.durationSeconds", LEASE_DURATION_SECONDS)
    renew = _field(lease, "renewIntervalSeconds", "lease.renewIntervalSeconds",
                   RENEW_INTERVAL_SECONDS)
    drain = _field(handoff, "drainTimeoutSeconds", "handoff.drainTimeoutSeconds",
                   DRAIN_TIMEOUT_SECONDS)
    return LeaseTiming(duration=duration, renew_interval=renew), float(drain)


def spec_partitions(raw_spec: Mapping[str, Any]) -> int:
    """``spec.partitions``, the bound every target range is parsed against; ``ValueError``
    when it is missing, not an integer or outside 1..MAX_PARTITIONS (the CRD's bounds)."""
    value = raw_spec.get("partitions")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"partitions: {value!r} is not an integer")
    if not 1 <= value <= MAX_PARTITIONS:
        raise ValueError(f"partitions: {value} is not between 1 and {MAX_PARTITIONS}")
    return value


_MAX_NUMBER = 999_999_999  # partition numbers have at most nine digits (kgroup.core.lineage)


def partition_bound(status: Mapping[str, Any], partitions: int) -> int:
    """Every partition number of the group is below this: ``status.layout.nextPartition``
    once the operator keeps a layout (a reshape numbers its new partitions upwards, so a
    target may name numbers at or beyond ``spec.partitions``), else ``partitions``
    (``spec.partitions``). A malformed value is not trusted: ``partitions``."""
    layout = status.get("layout")
    bound = layout.get("nextPartition") if isinstance(layout, Mapping) else None
    if type(bound) is int and partitions <= bound <= _MAX_NUMBER + 1:
        return bound
    return partitions


def sealed_by(status: Mapping[str, Any], bound: int) -> dict[int, int]:
    """The sealed partitions of ``status.layout`` (replaced by a reshape, not yet read to
    their seal), each with the number of the generation that replaced it: what its seal
    marker records (``kgroup.core.routing.sealing_generation``), so the app that holds one
    can seal it when no producer has (``kgroup.producer.Sealer``). Read from the layout's
    ranges alone (at most 8 generations, no key-hash widths decoded); ``bound`` is
    :func:`partition_bound`. Anything malformed reads as nothing sealed: the operator
    corrects its status, and a partition sealed late only waits longer."""
    layout = status.get("layout")
    if not isinstance(layout, Mapping):
        return {}
    states, generations = layout.get("states"), layout.get("generations")
    if not isinstance(states, Mapping) or not isinstance(generations, list) \
            or len(generations) < 2 or not isinstance(states.get("sealed"), str):
        return {}
    longest = max_ranges_chars(bound) + 1
    try:
        sealed = set(parse_ranges(states["sealed"][:longest], limit=bound))
        kept = [(int(g["generation"]), set(parse_ranges(str(g["partitions"])[:longest],
                                                        limit=bound)))
                for g in generations[:8]]
    except (ValueError, TypeError, KeyError):
        return {}
    out: dict[int, int] = {}
    for i, (_, members) in enumerate(kept):
        for p in members & sealed:
            later = next((n for n, after in kept[i + 1:] if p not in after), None)
            if later is not None and p not in out:
                out[p] = later
    return out
