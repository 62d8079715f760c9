"""Leader election on a coordination Lease: exactly one operator replica is active.

The decisions (when a standby may take the Lease, when the leader must stop) are
:class:`kgroup.core.operator.leader_election.Election`'s, on the monotonic clock this adapter passes
in; here are the calls (:class:`kgroup.apiclient.ApiClient`). An attempt is one read, then
at most one write (a create, or a replace with the read's resourceVersion as
precondition); a renewal is one read and one replace, conditional the same way.

The Lease carries kgroup's labels (``kgroup.dev/role=operator-leader``): the chart's
admission policy lets the operator write no Lease without them (a Lease left unlabelled by
an older version is labelled at the next write).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kgroup.apiclient import LEASES, ApiClient, ApiError
from kgroup.constants import LABEL_ROLE, MANAGED_BY, ROLE_LEADER
from kgroup.core.objects import Obj
from kgroup.core.operator.leader_election import Election, LeaderLease, Write

from .kube import API_ERRORS

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 5.0
"""Seconds one read or write of the leader Lease may take."""

LABELS = {LABEL_ROLE: ROLE_LEADER, MANAGED_BY: "kgroup-operator"}
"""The leader Lease's labels (no kgroup.dev/group: it is no group's Lease)."""


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _with(lease: Obj, **spec: Any) -> Obj:
    """A read Lease with ``spec`` changed and kgroup's labels added, for a replace (its
    resourceVersion kept: the replace is conditional on the read)."""
    new = copy.deepcopy(lease)
    meta = new.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **LABELS}
    new["spec"] = {**(new.get("spec") or {}), **spec}
    return new


def _why(exc: BaseException) -> str:
    return f"{exc.status} {exc.reason}" if isinstance(exc, ApiError) else type(exc).__name__


class LeaseElector:
    """Acquire, hold and release one leader Lease."""

    def __init__(
        self, api: ApiClient, *, namespace: str, name: str, identity: str, duration: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self.clock = clock
        self.election = Election(identity, duration)

    def _body(self, rv: str | None, transitions: int) -> Obj:
        now = _now_micro()
        meta: Obj = {"name": self.name, "namespace": self.namespace, "labels": dict(LABELS)}
        if rv:
            meta["resourceVersion"] = rv
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, int(self.duration)),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }

    async def _read(self) -> Obj | None:
        return await self.api.get(LEASES, self.namespace, self.name, timeout=REQUEST_TIMEOUT)

    async def _try_acquire(self) -> bool:
        """One attempt: one read, then the write the election decides; True when we hold
        the Lease now."""
        lease = await self._read()
        now = self.clock()
        if lease is None:
            attempt = self.election.after_read(None, now)
        else:
            spec = lease.get("spec") or {}
            seen = LeaderLease(spec.get("holderIdentity"), spec.get("renewTime"),
                               spec.get("leaseDurationSeconds"),
                               int(spec.get("leaseTransitions") or 0))
            attempt = self.election.after_read(seen, now)
        if attempt.write is Write.NONE:
            return False
        try:
            if attempt.write is Write.CREATE:
                await self.api.create(LEASES, self.namespace, self._body(None, 0),
                                      timeout=REQUEST_TIMEOUT)
            else:
                assert lease is not None
                rv = lease["metadata"]["resourceVersion"]
                await self.api.replace(LEASES, self.namespace,
                                       self._body(rv, attempt.transitions),
                                       timeout=REQUEST_TIMEOUT)
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        self.election.acquired(now)
        return True

    async def acquire(self) -> None:
        """Wait until this replica is the leader."""
        while True:
            try:
                if await self._try_acquire():
                    log.info(
                        "leader Lease %s/%s acquired by %s",
                        self.namespace,
                        self.name,
                        self.identity,
                    )
                    return
            except API_ERRORS as exc:
                log.warning("leader election: %s", _why(exc))
            await asyncio.sleep(self.election.retry_interval)

    async def _renew(self) -> bool:
        lease = await self._read()
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return False
        # conditional on the read: a 409 (written since) is a failed renewal, retried
        await self.api.replace(LEASES, self.namespace, _with(lease, renewTime=_now_micro()),
                               timeout=REQUEST_TIMEOUT)
        return True

    async def hold(self, stop: asyncio.Event) -> None:
        """Renew until `stop` is set; set it ourselves when leadership is lost."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.election.retry_interval)
                return
            except TimeoutError:
                pass
            try:
                if await self._renew():
                    self.election.renewed(self.clock())
                else:
                    log.error("leader Lease taken by another replica; stopping")
                    stop.set()
                    return
            except API_ERRORS as exc:
                log.warning("leader Lease renewal failed: %s", _why(exc))
            if self.election.must_stop(self.clock()):
                log.error("could not renew the leader Lease in time; stopping")
                stop.set()
                return

    async def release(self) -> None:
        try:
            lease = await self._read()
            if lease is not None and (lease.get("spec") or {}).get(
                    "holderIdentity") == self.identity:
                await self.api.replace(LEASES, self.namespace,
                                       _with(lease, holderIdentity=None, renewTime=None,
                                             acquireTime=None),
                                       timeout=REQUEST_TIMEOUT)
        except Exception as exc:  # best effort: a standby takes over after a duration
            log.warning("could not release the leader Lease: %s", exc)
