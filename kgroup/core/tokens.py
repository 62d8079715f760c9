"""Where a partition's fencing token comes from: the resourceVersion an acquisition
replaced.

An acquisition is a conditional update of the partition Lease whose precondition is the
resourceVersion read just before it; its token is that resourceVersion, as an integer,
written into the ``kgroup.dev/token`` annotation by the same update. etcd's revision is
global to the cluster and only grows, so every later acquisition of the partition (of
the same Lease, of a Lease deleted and created again, or after the ConsumerGroup was
deleted and applied again) has read a higher one, and one precondition admits exactly
one conditional update: tokens of a partition never go backwards and never repeat. The
admission policy holds workers to it (the annotation must equal the replaced object's
resourceVersion at an acquisition, and stay unchanged otherwise).

The one way back: restoring etcd from a snapshot brings old revisions back; restore with
``etcdutl snapshot restore --bump-revision`` (docs/design.md).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import Any

__all__ = ["acquisition_token", "resource_version_number"]


def resource_version_number(rv: Any) -> int | None:
    """A resourceVersion as an integer, or None when it is not one.

    Kubernetes calls resourceVersion opaque, but since v1.35 (KEP-5504, client-go's
    ``CompareResourceVersion``) versions of objects of one resource compare as integers:
    a positive decimal without leading zeros, larger = newer. Every etcd-backed API server
    has always produced such numbers; anything else is treated as not comparable.
    """
    if not isinstance(rv, str) or not rv.isdigit() or rv.startswith("0"):
        return None
    return int(rv)


def acquisition_token(expected_rv: str) -> int | None:
    """The fencing token of an acquisition whose precondition is ``expected_rv`` (None:
    the resourceVersion is not a number, so no token can be derived: do not acquire)."""
    return resource_version_number(expected_rv)
