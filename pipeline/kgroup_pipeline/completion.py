"""Completion: a sealed partition read to its seal marker is handed back as completed.

Rule: a reshape seals the partitions it replaces (``kgroup.producer``: a marker entry, the
stream's last for ever). The fenced sink's ``PLAN`` answers ``completed`` once the
committed offset is that marker, so everything written before the seal is processed and
committed. The worker then releases the partition *as completed*, with the marker as its
final position (``Ownership.complete``: through the sidecar, ``POST
/v1/partitions/{n}/release`` with ``"completed": true``); the group records the partition
completed, and its successors become assignable once all their predecessors are. An empty
sealed partition (only its marker) completes after one range that reads the marker.

A release refused as "not ours any more" (404/409) is dropped: the new owner completes it
in turn. One that is not done yet (the sidecar's 503, or no answer) is tried again at the
next step. Plain object, no clock: the light worker calls :meth:`Completer.step` after
each planning round; the Spark source would do the same from its planner.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from kgroup.client import SidecarError
from kgroup_pipeline.fencing import Plan
from kgroup_pipeline.ownership import Ownership

log = logging.getLogger(__name__)


@dataclass
class Completer:
    ownership: Ownership
    completed: list[tuple[int, int, str]] = field(default_factory=list)
    """(partition, token, seal marker) of every completion this worker reported."""

    def step(self, plans: Sequence[Plan]) -> list[int]:
        """Report each plan answered ``completed``; -> the partitions reported by this step."""
        done: list[int] = []
        for plan in plans:
            if plan.status != "completed":
                continue
            try:
                ok = self.ownership.complete(plan.partition, plan.token, plan.seal)
            except (OSError, SidecarError) as e:
                log.info("completion of partition %d not reported yet: %s", plan.partition, e)
                continue
            if ok:
                self.completed.append((plan.partition, plan.token, plan.seal))
                done.append(plan.partition)
                log.info("partition %d read to its seal %s: completed", plan.partition,
                         plan.seal)
        return done
