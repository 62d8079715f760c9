"""Handoff at a micro-batch boundary: seal, wait for the last batch, release with the offset.

Rule: a partition the ownership reports *revoking* is sealed in the sink (no plan under
this token may include it again — atomically, so it cannot race with a planner that read
the ownership a moment earlier). Once the last range planned under our token is committed
(the sink's offset reached the planned end), the worker releases the partition with that
committed offset as the handed-over position. If that never happens (a batch failed), the
partition is released after ``drain_timeout`` with the offset the sink *did* commit: the
next owner starts from the sink's offset anyway, and the fenced commit refuses the stale
batch should it arrive late, so nothing is lost or applied twice.

The controller is a plain object driven by :meth:`HandoffController.step`; the Spark job
runs it in a thread, the light worker calls it between batches. It takes ``now`` from the
caller (monotonic seconds) so tests can drive it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from kgroup.client import SidecarError
from kgroup_pipeline.fencing import FencedStore
from kgroup_pipeline.ownership import OwnedPartition, Ownership

log = logging.getLogger(__name__)


@dataclass
class HandoffController:
    ownership: Ownership
    store: FencedStore
    drain_timeout: float = 30.0
    released: list[tuple[int, int, str | None]] = field(default_factory=list)
    _since: dict[tuple[int, int], float] = field(default_factory=dict)

    def step(self, now: float, *, everything: bool = False) -> list[int]:
        """Release what is revoking (or, with ``everything``, all we hold) once drained.

        Returns the partitions released by this step.
        """
        try:
            view = self.ownership.assignment()
        except (OSError, SidecarError) as e:
            log.warning("ownership unavailable: %s", e)
            return []
        todo: list[OwnedPartition] = list(view.partitions) if everything else list(view.revoking)
        done: list[int] = []
        for p in todo:
            ident = (p.partition, p.token)
            first = self._since.setdefault(ident, now)
            seal = self.store.seal(p.partition, p.token)
            if seal.status == "fenced":
                # A newer token wrote the sink: we are already superseded. Give the lock back
                # with no position of ours (the sink holds the truth).
                position = None
            elif seal.drained or now - first >= self.drain_timeout:
                position = seal.offset
                if not seal.drained:
                    log.warning("partition %d: drain timeout, releasing at committed %s",
                                p.partition, position)
            else:
                continue
            try:
                ok = self.ownership.release(p.partition, p.token, position)
            except (OSError, SidecarError) as e:  # e.g. 503 "not released yet": next step
                log.info("release of partition %d not done yet: %s", p.partition, e)
                continue
            if ok:
                self.released.append((p.partition, p.token, position))
                done.append(p.partition)
                log.info("released partition %d (token %d) at %s", p.partition, p.token, position)
            self._since.pop(ident, None)
        return done
