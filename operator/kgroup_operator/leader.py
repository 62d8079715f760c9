"""Leader election on a coordination Lease: exactly one operator replica is active.

The decisions (when a standby may take the Lease, when the leader must stop) are
:class:`kgroup.core.operator.leader_election.Election`'s, on the monotonic clock this adapter passes
in; here are the calls. An attempt is one read, then at most one write (a create, or a
replace with the read's resourceVersion as precondition); a renewal is one read and one
replace.

The Lease carries kgroup's labels (``kgroup.dev/role=operator-leader``): the chart's
admission policy lets the operator write no Lease without them (a Lease left unlabelled by
an older version is labelled at the next write).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kgroup.constants import LABEL_ROLE, MANAGED_BY, ROLE_LEADER
from kgroup.core.operator.leader_election import Election, LeaderLease, Write

log = logging.getLogger(__name__)


LABELS = {LABEL_ROLE: ROLE_LEADER, MANAGED_BY: "kgroup-operator"}
"""The leader Lease's labels (no kgroup.dev/group: it is no group's Lease)."""


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _labelled(lease: Any) -> Any:
    """A read Lease (client model) with kgroup's labels added, for a replace."""
    lease.metadata.labels = {**(lease.metadata.labels or {}), **LABELS}
    return lease


class LeaseElector:
    """Acquire, hold and release one leader Lease."""

    def __init__(
        self, api: client.ApiClient, *, namespace: str, name: str, identity: str, duration: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.coord = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self.clock = clock
        self.election = Election(identity, duration)

    def _body(self, rv: str | None, transitions: int) -> dict[str, Any]:
        now = _now_micro()
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace,
                                "labels": dict(LABELS)}
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

    def _try_acquire(self) -> bool:
        """One attempt (blocking): one read, then the write the election decides; True when
        we hold the Lease now."""
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            lease = None
        now = self.clock()
        if lease is None:
            attempt = self.election.after_read(None, now)
        else:
            spec = lease.spec
            assert spec is not None and lease.metadata is not None
            seen = LeaderLease(spec.holder_identity, str(spec.renew_time),
                               spec.lease_duration_seconds, int(spec.lease_transitions or 0))
            attempt = self.election.after_read(seen, now)
        if attempt.write is Write.NONE:
            return False
        try:
            if attempt.write is Write.CREATE:
                self.coord.create_namespaced_lease(self.namespace, cast(Any, self._body(None, 0)))
            else:
                assert lease is not None and lease.metadata is not None
                self.coord.replace_namespaced_lease(
                    self.name,
                    self.namespace,
                    cast(Any, self._body(lease.metadata.resource_version, attempt.transitions)),
                )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        self.election.acquired(now)
        return True

    async def acquire(self) -> None:
        """Wait until this replica is the leader."""
        while True:
            try:
                if await asyncio.to_thread(self._try_acquire):
                    log.info(
                        "leader Lease %s/%s acquired by %s",
                        self.namespace,
                        self.name,
                        self.identity,
                    )
                    return
            except ApiException as exc:
                log.warning("leader election: %s", exc.reason)
            await asyncio.sleep(self.election.retry_interval)

    def _renew(self) -> bool:
        lease = self.coord.read_namespaced_lease(self.name, self.namespace)
        if lease.spec is None or lease.spec.holder_identity != self.identity:
            return False
        lease.spec.renew_time = datetime.now(UTC)
        self.coord.replace_namespaced_lease(self.name, self.namespace, _labelled(lease))
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
                if await asyncio.to_thread(self._renew):
                    self.election.renewed(self.clock())
                else:
                    log.error("leader Lease taken by another replica; stopping")
                    stop.set()
                    return
            except ApiException as exc:
                log.warning("leader Lease renewal failed: %s", exc.reason)
            if self.election.must_stop(self.clock()):
                log.error("could not renew the leader Lease in time; stopping")
                stop.set()
                return

    async def release(self) -> None:
        def call() -> None:
            try:
                lease = self.coord.read_namespaced_lease(self.name, self.namespace)
                if lease.spec is not None and lease.spec.holder_identity == self.identity:
                    lease.spec.holder_identity = None
                    lease.spec.renew_time = None
                    lease.spec.acquire_time = None
                    self.coord.replace_namespaced_lease(self.name, self.namespace,
                                                        _labelled(lease))
            except Exception as exc:  # best effort: a standby takes over after a duration
                log.warning("could not release the leader Lease: %s", exc)

        await asyncio.to_thread(call)
