"""One ConsumerGroup's reconcile loop: observe, decide with the pure core, write status.

Rules of this module:

* Decisions come from :mod:`kgroup.core.group` and :mod:`kgroup.core.status`; this module
  only gathers observations from the :class:`~kgroup_operator.world.World` cache and
  performs the writes they call for.
* Target and epoch are written together in one status update carrying the read
  ``resourceVersion``. A 409 means someone else wrote first: re-read and recompute,
  never overwrite blindly.
* Quiet steady state: a status write happens only when the aggregated status differs
  from the last one written, and at most once per ``status_min_interval`` per group.
* The loop sleeps until poked by a watch event or until the next deadline (end of a
  stabilisation window, a session's expiry on our clock, the rate limit), never polls.
* The target is always read back from the group's status, so a restart or a fail-over
  moves nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from urllib3.exceptions import HTTPError

from kgroup.api import ConsumerGroupSpec, ConsumerGroupStatus, LabelSelector, LastRebalance
from kgroup.core.group import (
    Decision,
    GroupPlanner,
    correct_hand_edit,
    current_members,
    eligible_pods,
    live_holders,
)
from kgroup.core.ranges import parse_ranges
from kgroup.core.status import Problem, aggregate_status, format_timestamp

from .kube import Conflict, Kube
from .metrics import Metrics
from .settings import OperatorSettings
from .world import GroupKey, World, newer

log = logging.getLogger(__name__)

IDLE_RECHECK = 300.0
"""Upper bound on a sleep with no deadline: a cheap in-memory re-evaluation."""


def _normal(status: dict[str, Any] | None) -> dict[str, Any]:
    try:
        return ConsumerGroupStatus.model_validate(status or {}).to_wire()
    except ValidationError:
        return {"invalid": status}


class GroupController:
    """The reconcile loop of one group; created on first sight, cancelled on deletion."""

    def __init__(
        self,
        key: GroupKey,
        *,
        world: World,
        kube: Kube,
        metrics: Metrics,
        settings: OperatorSettings,
    ) -> None:
        self.key = key
        self.world = world
        self.kube = kube
        self.metrics = metrics
        self.settings = settings
        self.body: dict[str, Any] | None = None
        self.poked = asyncio.Event()
        self.planner = GroupPlanner()
        self.started_at = time.monotonic()
        self.last_target_change = self.started_at
        self.last_write = -1e9
        self.sent_status: dict[str, Any] | None = None  # what we computed and sent
        self.written_status: dict[str, Any] | None = None  # what the server stored
        self.written_rv: str | None = None
        self.reported: set[tuple[str, str]] = set()
        self.requested_leases: set[int] = set()
        self.task: asyncio.Task[None] | None = None
        self.noticed_rv: str | None = None
        self.planned_generation: int | None = None  # spec generation the target reflects
        self.selector: LabelSelector | None = None

    def update(self, body: dict[str, Any]) -> None:
        """A fresher body of the group (watch event or write response); pokes the loop."""
        rv = body.get("metadata", {}).get("resourceVersion")
        old_rv = (self.body or {}).get("metadata", {}).get("resourceVersion")
        if self.body is None or newer(rv, old_rv):
            self.body = body
            try:
                self.selector = LabelSelector.model_validate(body.get("spec", {})["selector"])
            except (KeyError, ValidationError):
                self.selector = None
        self.poke()

    def poke(self) -> None:
        self.poked.set()

    def start(self) -> None:
        self.task = asyncio.create_task(self.run(), name=f"kgroup:{self.key[0]}/{self.key[1]}")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task

    async def run(self) -> None:
        delay: float | None = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.poked.wait(), timeout=delay)
            self.poked.clear()
            try:
                delay = await self.reconcile()
            except asyncio.CancelledError:
                raise
            except (ApiException, HTTPError, OSError) as exc:
                log.warning("reconcile of %s/%s: API unavailable (%s); retrying", *self.key,
                            type(exc).__name__)
                delay = 2.0
            except Exception:
                log.exception("reconcile of %s/%s failed; retrying", *self.key)
                delay = 5.0
            if delay is None:
                delay = IDLE_RECHECK
            delay = max(0.0, delay)

    # -- one pass -------------------------------------------------------------------------

    async def reconcile(self) -> float | None:
        """One pass; returns seconds until the next deadline (None: none)."""
        if not self.world.synced or self.body is None:
            return 0.5
        body = self.body
        namespace, name = self.key
        now = time.monotonic()
        wall = datetime.now(UTC)
        try:
            spec = ConsumerGroupSpec.model_validate(body.get("spec") or {})
        except ValidationError as exc:
            await self._problems(body, [Problem("InvalidSpec", str(exc)[:500])])
            return None
        raw_status = body.get("status") or {}
        status, target, hand_problem = self._read_status(raw_status)
        problems: list[Problem] = []  # persistent: shown in conditions, one Event each
        notices: list[Problem] = []  # one-off: an Event only

        decision: Decision | None = None
        rv = body.get("metadata", {}).get("resourceVersion")
        if (
            self.written_status is not None
            and self.written_rv is not None
            and rv != self.written_rv
            and newer(rv, self.written_rv)
            and _normal(raw_status) != self.written_status
        ):
            notices.append(
                Problem("StatusEditedByHand", "status was changed by someone else; corrected")
            )
            written = self._written_target()
            if written is not None:
                decision = correct_hand_edit(
                    written_target=written[0],
                    written_epoch=written[1],
                    seen_target=target,
                    seen_epoch=status.epoch,
                )
        elif hand_problem is not None:
            notices.append(hand_problem)

        leases = self.world.group(self.key)
        pods = list(self.world.pods.get(namespace, {}).values())
        live = leases.live_sessions(now)
        members = current_members(selector=spec.selector, pods=pods, live_sessions=live)
        holders = live_holders(leases.locks(), live)
        if not any(spec.selector.matches(dict(p.labels)) for p in pods):
            problems.append(
                Problem(
                    "SelectorMatchesNothing",
                    f"no pod in {namespace} matches {spec.selector.to_label_selector_string()}",
                )
            )
        elif not eligible_pods(spec.selector, pods):
            pass  # pods exist but none is running and ready yet: Pending says it

        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s/%s: members %s", namespace, name, sorted(members))
        generation = body.get("metadata", {}).get("generation")
        if decision is None:
            decision = self.planner.plan(
                spec=spec,
                target=target,
                epoch=status.epoch,
                members=members,
                holders=holders,
                now=now,
                spec_changed=(
                    self.planned_generation is not None and generation != self.planned_generation
                ),
            )
        if decision.target is None:
            self.planned_generation = generation
        await self._ensure_partition_leases(body, spec)

        epoch, new_target = status.epoch, target
        last_rebalance: LastRebalance | None = None
        if decision.target is not None:
            epoch, new_target = decision.epoch, decision.target
            last_rebalance = LastRebalance(
                epoch=epoch,
                reason=decision.reason,
                moved=decision.moved,
                started_at=format_timestamp(wall),
            )
        last_change = max(self.last_target_change, self.planner.last_membership_change)
        new_status, seen = aggregate_status(
            spec=spec,
            generation=generation,
            previous=status,
            epoch=epoch,
            target=new_target,
            members=members,
            member_leases=leases.member_observations(),
            holders=holders,
            last_change_at=last_change,
            now=now,
            wall=wall,
            extra_problems=problems,
            last_rebalance=last_rebalance,
        )
        self.metrics.observed(self.key, unowned=new_status.unowned, members=len(members))
        wire = new_status.to_wire()

        deadlines = [
            decision.next_check,
            leases.next_expiry(now),
            (last_change + spec.handoff.drain_timeout_seconds + spec.lease.duration_seconds + 0.01)
            if new_status.unowned and new_status.phase != "Degraded"
            else None,
        ]
        server = _normal(raw_status)
        baseline = self.sent_status if server == self.written_status else server
        unchanged = wire == baseline
        if notices and rv != self.noticed_rv:
            self.noticed_rv = rv
            for notice in notices:
                log.warning("%s/%s: %s: %s", *self.key, notice.reason, notice.message)
                await self.kube.post_event(
                    body, type_="Warning", reason=notice.reason, message=notice.message
                )
        if unchanged and decision.target is None:
            await self._problems(body, seen)
            return _next(deadlines, now)
        # The rate limit holds back aggregate-only writes; a new target is already paced by
        # the stabilisation window and must not wait behind a member-count update.
        wait = self.last_write + self.settings.status_min_interval - now
        if wait > 0 and decision.target is None:
            return wait
        try:
            stored = await self.kube.replace_status(body, wire)
        except Conflict:
            log.info("status of %s/%s changed under us; re-reading", namespace, name)
            fresh = await self.kube.get_group(namespace, name)
            if fresh is not None:
                self.body = fresh
            return 0.0
        self.last_write = time.monotonic()
        self.planned_generation = generation
        self.metrics.status_written(self.key)
        self.body = stored
        self.sent_status = wire
        self.written_status = _normal(stored.get("status"))
        self.written_rv = stored.get("metadata", {}).get("resourceVersion")
        if decision.target is not None:
            log.info("%s/%s: epoch %d: %s (%d moved)", namespace, name, epoch, decision.reason,
                     decision.moved)
            self.last_target_change = now
            self.metrics.rebalanced(self.key, decision.moved)
            await self.kube.post_event(
                stored,
                type_="Normal",
                reason="RebalanceStarted",
                message=f"epoch {epoch}: {decision.reason} ({decision.moved} partitions move)",
            )
        done = new_status.last_rebalance
        before = status.last_rebalance
        if (
            done is not None
            and done.completed_at is not None
            and (before is None or before.epoch != done.epoch or before.completed_at is None)
        ):
            self.metrics.completed(self.key, done.duration_seconds or 0.0)
            await self.kube.post_event(
                stored,
                type_="Normal",
                reason="RebalanceCompleted",
                message=f"epoch {done.epoch} settled in {done.duration_seconds}s",
            )
        await self._problems(stored, seen)
        return _next(deadlines, now)

    # -- helpers ---------------------------------------------------------------------------

    def _read_status(
        self, raw: dict[str, Any]
    ) -> tuple[ConsumerGroupStatus, dict[str, list[int]], Problem | None]:
        """The status as written, with its target parsed; unreadable → empty + problem."""
        try:
            status = ConsumerGroupStatus.model_validate(raw)
            target = {m: parse_ranges(r) for m, r in status.assignment.items()}
            return status, target, None
        except (ValidationError, ValueError) as exc:
            return (
                ConsumerGroupStatus(),
                {},
                Problem("StatusEditedByHand", f"status is unreadable: {str(exc)[:300]}"),
            )

    def _written_target(self) -> tuple[dict[str, list[int]], int] | None:
        if self.written_status is None or "invalid" in self.written_status:
            return None
        st = ConsumerGroupStatus.model_validate(self.written_status)
        return {m: parse_ranges(r) for m, r in st.assignment.items()}, st.epoch

    async def _ensure_partition_leases(self, body: dict[str, Any], spec: ConsumerGroupSpec) -> None:
        """Create the free lock Lease of every partition 0..N-1 not seen yet."""
        known = self.world.group(self.key).partitions
        uid = body.get("metadata", {}).get("uid", "")
        for p in range(spec.partitions):
            if p in known or p in self.requested_leases:
                continue
            await self.kube.create_partition_lease(
                namespace=self.key[0],
                group=self.key[1],
                uid=uid,
                partition=p,
                duration=spec.lease.duration_seconds,
            )
            self.requested_leases.add(p)

    async def _problems(self, body: dict[str, Any], problems: list[Problem]) -> None:
        """One Warning Event per problem when it first appears."""
        current = {(p.reason, p.message) for p in problems}
        for reason, message in sorted(current - self.reported):
            log.warning("%s/%s: %s: %s", *self.key, reason, message)
            await self.kube.post_event(body, type_="Warning", reason=reason, message=message)
        self.reported = current


def _next(deadlines: list[float | None], now: float) -> float | None:
    future = [d for d in deadlines if d is not None]
    return (min(future) - now) if future else None
