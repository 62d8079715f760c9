"""The partition watch's scope: which partition Leases a member's adapter watches.

A member's step reads the locks of its partitions of interest only
(:meth:`kgroup.core.member.reconcile.Member.partitions_of_interest`), so an adapter may
watch just those; :func:`next_watch_scope` says when to re-select, and a member's watch
traffic grows with its own share, not with the group. Pure.
"""

from __future__ import annotations

MAX_SELECTED_PARTITIONS = 2000
"""Beyond this many partitions of interest an adapter watches every partition Lease of
the group. A label selector of 2,000 five-digit values is about 9 KB (a 10 KB URL):
kube-apiserver takes up to 1 MiB of request line and headers, and answers it like a
short one (docs/design.md, "Each sidecar watches only the partition
Leases it decides on")."""
SCOPE_NARROW_SLACK = 8
"""How much larger than twice the interest a scope may be before it is narrowed."""


def next_watch_scope(current: frozenset[int] | None,
                     interest: frozenset[int]) -> frozenset[int] | None:
    """The partition watch's next scope (None: every partition of the group), or
    ``current`` itself when it needs no re-selection.

    Widen at once when the interest has a partition the scope lacks (a new target must be
    seen before it can be acquired); narrow only when the scope holds more than twice the
    interest (plus slack), so the releases after a rebalance cost one re-list, not one
    per release, and a steady member never re-selects."""
    want = None if len(interest) > MAX_SELECTED_PARTITIONS else interest
    if want is None:
        return None
    if current is None:
        return want  # the interest fits a selector again: narrow
    if not want <= current or len(current) > 2 * len(want) + SCOPE_NARROW_SLACK:
        return want
    return current
